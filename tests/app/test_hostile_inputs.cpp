// Hostile model folders, chat templates, GGUF files, arguments and remote servers, end to end through kvchat-cli: each
// case runs the real program under 2 GiB of address space and a CPU limit (common/hostile_case.h) and
// must end with its specific error and a normal exit, or, where the input is legitimate, work, within
// 2 s of CPU. `kvchat-cli serve` under the same limits meets hostile clients (endless chunked bodies,
// impossible lengths, slow headers, connections left half-sent) and sizes it cannot start; the local
// server's key meets a settings folder left by an older version. Conversations and databases:
// test_hostile_conversations.cpp.
#include <sys/resource.h>
#include <sys/stat.h>

#include <QFile>
#include <QSettings>
#include <QTemporaryDir>
#include <QtTest>
#include "common/test_suite.h"

#include <atomic>
#include <filesystem>
#include <functional>
#include <thread>

#include "app/server/local_server.h"
#include "common/hostile_case.h"
#include "common/model_folder_copy.h"
#include "common/raw_http.h"
#include "common/scripted_server.h"
#include "common/tiny_llama3_chat_model.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_hostile_inputs {

using json = nlohmann::ordered_json;
using kvchat::test::LimitedCliResult;
using kvchat::test::run_case;

// Changes one file of a copy of stories260K.
using ModelEdit = std::function<void(const std::string& model)>;
// What a hostile OpenAI-compatible server answers.
using ServerScript = std::function<void(kvchat::test::ScriptedConnection&)>;

}  // namespace app_test_hostile_inputs

Q_DECLARE_METATYPE(app_test_hostile_inputs::ModelEdit)
Q_DECLARE_METATYPE(app_test_hostile_inputs::ServerScript)

namespace app_test_hostile_inputs {

namespace {

const QString kTemplateRequest = QStringLiteral(R"({"messages": [{"role": "user", "content": "hi"}]})");

std::string repeated(const std::string& text, int times) {
  std::string out;
  out.reserve(text.size() * static_cast<std::size_t>(times));
  for (int i = 0; i < times; ++i) out += text;
  return out;
}

void edit_json(const std::string& path, const std::function<void(json&)>& edit) {
  json value = kvchat::test::read_json_file(path);
  edit(value);
  kvchat::test::write_json_file(path, value);
}

ModelEdit set_config(const char* field, json value) {
  return [=](const std::string& model) { edit_json(model + "/config.json", [&](json& c) { c[field] = value; }); };
}

ModelEdit add_tensor(const std::string& name, const json& shape, std::int64_t end) {
  return [=](const std::string& model) {
    const std::string path = model + "/model.safetensors";
    auto parts = kvchat::test::read_safetensors(path);
    json header = json::parse(parts.header);
    header[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {0, end}}};
    parts.header = header.dump();
    kvchat::test::write_safetensors(path, parts);
  };
}

// The header text with a second entry for a name it already has (a JSON parser keeps only one of them).
void duplicate_tensor_name(const std::string& model) {
  const std::string path = model + "/model.safetensors";
  auto parts = kvchat::test::read_safetensors(path);
  std::string header = parts.header.substr(0, parts.header.find_last_not_of(' ') + 1);
  header.pop_back();  // the closing brace
  parts.header = header + R"(,"model.norm.weight":{"dtype":"F32","shape":[64],"data_offsets":[0,256]}})";
  kvchat::test::write_safetensors(path, parts);
}

// Every data byte 0xFF: each f32 weight is a NaN.
void nan_weights(const std::string& model) {
  const std::string path = model + "/model.safetensors";
  auto parts = kvchat::test::read_safetensors(path);
  parts.data.assign(parts.data.size(), '\xff');
  kvchat::test::write_safetensors(path, parts);
}

ModelEdit replace_with_fifo(const std::string& file) {
  return [=](const std::string& model) {
    std::filesystem::remove(model + "/" + file);
    QCOMPARE(mkfifo((model + "/" + file).c_str(), 0600), 0);
  };
}

ModelEdit tokenizer_id(bool added_token, std::int64_t id) {
  return [=](const std::string& model) {
    edit_json(model + "/tokenizer.json", [&](json& t) {
      if (added_token) {
        t["added_tokens"].push_back({{"id", id},
                                     {"content", "<big>"},
                                     {"single_word", false},
                                     {"lstrip", false},
                                     {"rstrip", false},
                                     {"normalized", false},
                                     {"special", true}});
      } else {
        t["model"]["vocab"]["zzbig"] = id;
      }
    });
  };
}

// `kvchat-cli serve` as a hostile client meets it: under the limits of run_limited_cli (2 GiB of address
// space, a CPU budget), started and stopped by the test.
class LimitedServer {
 public:
  bool start(const QStringList& arguments) {
    process_.setChildProcessModifier([] {
      const rlimit address_space{kvchat::test::kChildAddressSpaceBytes, kvchat::test::kChildAddressSpaceBytes};
      const rlimit cpu{60, 60};
      if (!kvchat::test::kSanitizedBuild) setrlimit(RLIMIT_AS, &address_space);
      setrlimit(RLIMIT_CPU, &cpu);
    });
    process_.setProcessChannelMode(QProcess::MergedChannels);  // the log is on stderr
    cpu_before_ = kvchat::test::children_cpu_seconds();
    process_.start(QString::fromStdString(kvchat::test::build_dir()) + "/kvchat-cli",
                   QStringList{"serve", "--port", "0"} + arguments);
    if (!process_.waitForStarted(30000)) return false;
    const std::string marker = "listening on http://127.0.0.1:";
    while (log_.find(marker) == std::string::npos) {
      if (process_.state() == QProcess::NotRunning || !process_.waitForReadyRead(60000)) return false;
      log_ += process_.readAll().toStdString();
    }
    port_ = std::stoi(log_.substr(log_.find(marker) + marker.size()));
    return port_ > 0;
  }
  ~LimitedServer() {
    if (process_.state() != QProcess::NotRunning) {
      process_.kill();
      process_.waitForFinished(10000);
    }
  }
  // SIGTERM: true when the server then ends by itself with exit code 0.
  bool stop() {
    process_.terminate();
    const bool finished = process_.waitForFinished(30000);
    log_ += process_.readAll().toStdString();
    cpu_seconds_ = kvchat::test::children_cpu_seconds() - cpu_before_;
    return finished && process_.exitStatus() == QProcess::NormalExit && process_.exitCode() == 0;
  }
  int port() const { return port_; }
  const std::string& log() const { return log_; }
  double cpu_seconds() const { return cpu_seconds_; }

 private:
  QProcess process_;
  std::string log_;
  int port_ = 0;
  double cpu_before_ = 0.0;
  double cpu_seconds_ = 0.0;
};

void llama3_tokenizer(const std::string& model) {
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
    std::filesystem::remove(model + "/" + file);
    std::filesystem::copy_file(kvchat::test::shared_path(std::string("fixtures/tokenizers/llama3/") + file),
                               model + "/" + file);
  }
}

}  // namespace

class HostileInputsTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void initTestCase();
  void chat_templates_data();
  void chat_templates();
  void template_arithmetic_in_chat();
  void model_folders_data();
  void model_folders();
  void arguments_data();
  void arguments();
  void random_weights_of_a_billion_layers();
  void gguf_files();
  void remote_servers_data();
  void remote_servers();
  void server_under_hostile_clients();
  void server_threads_that_cannot_start();
  void server_key_in_an_older_settings_folder();
  void gguf_metadata_that_disagrees_with_the_file();
  void a_reply_as_long_as_an_int_allows();
  void a_tokenizer_smaller_than_the_model();

 private:
  QString model_copy(const QString& name) const;
  QString setup_template_folder(const std::string& chat_template) const;

  QTemporaryDir dir_;
  std::string plain_reply_;  // generate's output with the unchanged model
};

void HostileInputsTest::initTestCase() {
  QVERIFY(dir_.isValid());
  const LimitedCliResult plain = run_case("unchanged model", {"generate", "--model", model_copy("plain"), "--prompt",
                                                              "Once upon", "--max-new-tokens", "4"});
  KVCHAT_EXPECT_SUCCESS(plain);
  QVERIFY(!plain.out.empty());
  plain_reply_ = plain.out;
}

QString HostileInputsTest::model_copy(const QString& name) const {
  return QString::fromStdString(kvchat::test::copy_reference_model("stories260K", dir_.filePath(name).toStdString()));
}

// The "template" folder: stories260K's tokenizer_config.json with `chat_template` set.
QString HostileInputsTest::setup_template_folder(const std::string& chat_template) const {
  const QString model = dir_.filePath("template");
  if (!QFileInfo::exists(model)) model_copy("template");
  edit_json(model.toStdString() + "/tokenizer_config.json", [&](json& c) { c["chat_template"] = chat_template; });
  return model;
}

void HostileInputsTest::chat_templates_data() {
  QTest::addColumn<QString>("chat_template");
  QTest::addColumn<int>("exit_code");
  QTest::addColumn<QStringList>("expected");  // stdout on success, stderr fragments on failure
  const std::string int_min = "(-9223372036854775807 - 1)";
  QTest::newRow("int min % -1") << QString::fromStdString("{{ " + int_min + " % -1 }}") << 0 << QStringList{"0"};
  QTest::newRow("int min // -1") << QString::fromStdString("{{ " + int_min + " // -1 }}") << 1
                                 << QStringList{"1:31: integer overflow (Python integers are unbounded"};
  QTest::newRow("100,000 parentheses")
      << QString::fromStdString("{{ " + repeated("(", 100000) + "1" + repeated(")", 100000) + " }}") << 1
      << QStringList{"chat_template: 1:260: expression nested too deeply (more than 256 levels"};
  QTest::newRow("100,000 brackets") << QString::fromStdString("{{ " + repeated("[", 100000) + " }}") << 1
                                    << QStringList{"chat_template: 1:100005: unexpected '}', expected ']'"};
  QTest::newRow("20,000 nested for")
      << QString::fromStdString(repeated("{% for i in [1] %}", 20000) + repeated("{% endfor %}", 20000)) << 1
      << QStringList{"chat_template: 1:4612: statements nested too deeply (more than 256 levels"};
  QTest::newRow("10,000-term ~ chain") << QString::fromStdString("{{ 'a'" + repeated(" ~ 'a'", 9999) + " }}") << 1
                                       << QStringList{"chat_template: 1:1538: expression nested too deeply"};
  QTest::newRow("list nested 100,000 deep")
      << "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = [ns.l] %}{% endfor %}{{ ns.l }}" << 1
      << QStringList{"1:73: lists and dicts nested more than 256 levels deep"};
  QTest::newRow("60,000 chained namespaces")
      << "{% set ns = namespace(n=none) %}{% for i in range(60000) %}{% set ns.n = namespace(n=ns.n) %}{% endfor %}ok"
      << 0 << QStringList{"ok"};
  QTest::newRow("nested range(100000) loops")
      << "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}" << 1
      << QStringList{"render budget exceeded: more than 10000000 evaluation steps"};
  QTest::newRow("'x' * 10**12") << "{{ 'x' * 10**12 }}" << 1
                                << QStringList{
                                       "1:8: render budget exceeded: a string of 1000000000000 bytes is over "
                                       "the limit of 16777216 bytes"};
  QTest::newRow("doubling loop")
      << "{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}"
      << 1 << QStringList{"1:76: render budget exceeded: a string of 33554432 bytes is over the limit"};
  QTest::newRow("[1] * 10**9") << "{{ [1] * 10**9 }}" << 1
                               << QStringList{"1:8: render budget exceeded: a list of ", "over the limit of 16777216"};
  QTest::newRow("tojson(indent=10**9)")
      << "{{ {'a': 1} | tojson(indent=10**9) }}" << 1
      << QStringList{"render budget exceeded: a string of 1000000000 bytes is over the limit of 16777216 bytes"};
  QTest::newRow("40,000 statements") << QString::fromStdString(repeated("{% set x = 1 %}", 40000) + "{{ x }}") << 0
                                     << QStringList{"1"};
  QTest::newRow("substring search") << "{% set a = 'a' * 8000000 %}{% set b = 'a' * 4000000 ~ 'b' %}{{ b in a }}" << 0
                                    << QStringList{"False"};
}

void HostileInputsTest::chat_templates() {
  QFETCH(QString, chat_template);
  QFETCH(int, exit_code);
  QFETCH(QStringList, expected);
  const QString model = setup_template_folder(chat_template.toStdString());
  const LimitedCliResult result =
      run_case(QTest::currentDataTag(), {"render", "--tokenizer", model}, kTemplateRequest.toStdString());
  if (exit_code == 0) {
    KVCHAT_EXPECT_SUCCESS(result);
    QCOMPARE(QString::fromStdString(result.out), expected.first());
  } else {
    // The 10^7-step budget itself takes over a second of CPU to use up; the doubling loop builds and
    // copies strings up to the 16 MiB limit (~1 s of CPU on a quiet 2-core machine, start-up included).
    const bool heavy = QTest::currentDataTag() == QStringLiteral("nested range(100000) loops") ||
                       QTest::currentDataTag() == QStringLiteral("doubling loop");
    const std::string problem = kvchat::test::failure_mismatch(
        result, exit_code, expected, heavy ? kvchat::test::kHeavyCaseCpuSeconds : kvchat::test::kMaxCaseCpuSeconds);
    QVERIFY2(problem.empty(), problem.c_str());
  }
}

// chat renders the folder's template for every turn: the same arithmetic works there or fails clearly.
void HostileInputsTest::template_arithmetic_in_chat() {
  const QString db = dir_.filePath("template-chat.sqlite3");
  QString model = setup_template_folder("{{ (-9223372036854775807 - 1) % -1 }}");
  LimitedCliResult result = run_case(
      "chat: int min % -1", {"chat", "--model", model, "--db", db, "--message", "hi", "--max-new-tokens", "2"});
  KVCHAT_EXPECT_SUCCESS(result);
  QVERIFY2(result.err.find("[2 prompt tokens:") != std::string::npos, result.err.c_str());  // BOS and "0"
  model = setup_template_folder("{{ (-9223372036854775807 - 1) // -1 }}");
  result = run_case("chat: int min // -1", {"chat", "--model", model, "--db", db, "--message", "hi"});
  KVCHAT_EXPECT_FAILURE(result, 1, QStringList{"integer overflow (Python integers are unbounded"});
}

void HostileInputsTest::model_folders_data() {
  QTest::addColumn<ModelEdit>("edit");
  QTest::addColumn<int>("exit_code");  // 0: works, and generates what the unchanged model does
  QTest::addColumn<QStringList>("fragments");
  QTest::newRow("max_position_embeddings 10^7")
      << set_config("max_position_embeddings", 10'000'000) << 0 << QStringList{};
  for (const std::int64_t positions : {std::int64_t{100'000'000}, std::int64_t{1'000'000'000'000}})
    QTest::newRow(("max_position_embeddings " + std::to_string(positions)).c_str())
        << set_config("max_position_embeddings", positions) << 1
        << QStringList{QStringLiteral("config.json: field 'max_position_embeddings' is %1, more than the 16777216 "
                                      "positions kvchat accepts")
                           .arg(positions)};
  QTest::newRow("vocab id 100,000,000") << tokenizer_id(false, 100'000'000) << 1
                                        << QStringList{
                                               "tokenizer.json: model.vocab entry 'zzbig': id 100000000 is too "
                                               "large for 513 tokens (ids must be below 2050)"};
  QTest::newRow("added token id 5*10^8") << tokenizer_id(true, 500'000'000) << 1
                                         << QStringList{
                                                "tokenizer.json: added token '<big>': id 500000000 is too large "
                                                "for 516 tokens (ids must be below 2056)"};
  for (const char* file : {"model.safetensors", "config.json"})
    QTest::newRow((std::string("FIFO ") + file).c_str())
        << replace_with_fifo(file) << 1 << QStringList{QStringLiteral("/%1: not a regular file").arg(file)};
  QTest::newRow("FIFO tokenizer.json") << replace_with_fifo("tokenizer.json") << 1
                                       << QStringList{"/tokenizer.json': not a regular file"};
  QTest::newRow("duplicate tensor name") << ModelEdit(duplicate_tensor_name) << 1
                                         << QStringList{"tensor 'model.norm.weight' is listed twice in the header"};
  QTest::newRow("unused [2^62, 2^62] tensor")
      << add_tensor("unused.weight", json::array({std::uint64_t{1} << 62, std::uint64_t{1} << 62}), 256) << 1
      << QStringList{"tensor 'unused.weight': shape has more elements than a file can hold"};
  QTest::newRow("100,000 dimensions") << add_tensor("unused.weight", json(std::vector<int>(100000, 1)), 4) << 1
                                      << QStringList{"tensor 'unused.weight': shape has 100000 dimensions (at most 8)"};
  QTest::newRow("NaN weights") << ModelEdit(nan_weights) << 1
                               << QStringList{
                                      "the model produced NaN or infinite logits at position 2: its weights "
                                      "are corrupt or out of range"};
  QTest::newRow("Llama-3 tokenizer") << ModelEdit(llama3_tokenizer) << 1
                                     << QStringList{
                                            "/tokenizer.json has token ids up to 128255 but the model's "
                                            "vocabulary (vocab_size in ",
                                            "/config.json) has 512 ids"};
}

void HostileInputsTest::model_folders() {
  QFETCH(ModelEdit, edit);
  QFETCH(int, exit_code);
  QFETCH(QStringList, fragments);
  const QString model = model_copy("folder");
  edit(model.toStdString());
  const LimitedCliResult result = run_case(
      QTest::currentDataTag(), {"generate", "--model", model, "--prompt", "Once upon", "--max-new-tokens", "4"});
  if (exit_code == 0) {
    KVCHAT_EXPECT_SUCCESS(result);
    QCOMPARE(result.out, plain_reply_);
    return;
  }
  // Loading a 128k-token tokenizer.json (9 MB) before comparing it with the weights takes over a second.
  const bool heavy = QTest::currentDataTag() == QStringLiteral("Llama-3 tokenizer");
  const std::string problem = kvchat::test::failure_mismatch(
      result, exit_code, fragments, heavy ? kvchat::test::kHeavyCaseCpuSeconds : kvchat::test::kMaxCaseCpuSeconds);
  QVERIFY2(problem.empty(), problem.c_str());
  QVERIFY2(result.err.size() < 1024, result.err.substr(0, 2000).c_str());  // the bad file is named, not dumped
}

void HostileInputsTest::arguments_data() {
  QTest::addColumn<QStringList>("arguments");
  QTest::addColumn<QStringList>("fragments");  // every case is a usage error: exit code 2
  const QStringList generate = {"generate", "--prompt-ids", "1,2", "--max-new-tokens", "2", "--model"};
  for (const char* threads : {"1000000000", "1000"})
    QTest::newRow((std::string("--threads ") + threads).c_str())
        << generate + QStringList{"MODEL", "--threads", threads}
        << QStringList{"--threads must be from 0 (all cores) to "};
  for (const char* temperature : {"nan", "inf"})
    QTest::newRow((std::string("--temperature ") + temperature).c_str())
        << generate + QStringList{"MODEL", "--temperature", temperature}
        << QStringList{QStringLiteral("option --temperature expects a finite number, got '%1'").arg(temperature)};
  // The sizes of the server: at 100,000 it would start as many threads and never answer.
  const QStringList serve = {"serve", "--port", "0", "--model", "MODEL"};
  QTest::newRow("serve --parallel 100000")
      << serve + QStringList{"--parallel", "100000"} << QStringList{"--parallel must be from 1 to 64, got 100000"};
  QTest::newRow("serve --max-queue 100000")
      << serve + QStringList{"--max-queue", "100000"} << QStringList{"--max-queue must be from 0 to 256, got 100000"};
  QTest::newRow("serve --max-body-mib 100000") << serve + QStringList{"--max-body-mib", "100000"}
                                               << QStringList{"--max-body-mib must be from 1 to 256, got 100000"};
  QTest::newRow("serve --header-timeout-s 0") << serve + QStringList{"--header-timeout-s", "0"}
                                              << QStringList{"--header-timeout-s must be from 1 to 3600, got 0"};
  QTest::newRow("serve --cors-origin evil")
      << serve + QStringList{"--cors-origin", "evil"} << QStringList{"--cors-origin takes * or origins such as"};
}

void HostileInputsTest::arguments() {
  QFETCH(QStringList, arguments);
  QFETCH(QStringList, fragments);
  arguments.replaceInStrings(QStringLiteral("MODEL"), kvchat::test::shared_path("models/stories260K").c_str());
  KVCHAT_EXPECT_FAILURE(run_case(QTest::currentDataTag(), arguments), 2, fragments);
}

void HostileInputsTest::random_weights_of_a_billion_layers() {
  const std::string config = dir_.filePath("billion-layers.json").toStdString();
  json value = kvchat::test::read_json_file(kvchat::test::shared_path("models/stories260K/config.json"));
  value["num_hidden_layers"] = 1'000'000'000;
  kvchat::test::write_json_file(config, value);
  const LimitedCliResult result = run_case(
      "10^9 layers",
      {"generate", "--random-weights", QString::fromStdString(config), "--prompt-ids", "1,2", "--max-new-tokens", "2"});
  KVCHAT_EXPECT_FAILURE(result, 1, QStringList{"the weights of this config need 168800 GiB, more than this machine's"});
}

// Truncated, empty, a FIFO and a directory named .gguf, for generate (a model) and tokenize (a tokenizer).
void HostileInputsTest::gguf_files() {
  const std::string whole =
      kvchat::test::read_file_bytes(kvchat::test::shared_path("fixtures/gguf/stories260K-F32.gguf"));
  const QString truncated = dir_.filePath("truncated.gguf");
  kvchat::test::write_file_bytes(truncated.toStdString(), whole.substr(0, 5000));
  const QString empty = dir_.filePath("empty.gguf");
  kvchat::test::write_file_bytes(empty.toStdString(), {});
  const QString fifo = dir_.filePath("fifo.gguf");
  QCOMPARE(mkfifo(fifo.toLocal8Bit().constData(), 0600), 0);
  const QString directory = dir_.filePath("directory/x.gguf");
  QVERIFY(QDir().mkpath(directory));

  const QString past_the_end =
      "metadata 'tokenizer.ggml.tokens' at offset 4997: string value of 5 bytes runs past the end of the file (5000 "
      "bytes)";
  const struct {
    QString path;
    QString as_model;
    QString as_tokenizer;
  } cases[] = {
      {truncated, past_the_end, past_the_end},
      {empty, "empty.gguf is not a GGUF file (it does not start with the GGUF magic) and not a model directory",
       "empty.gguf is not a GGUF file (it does not start with the GGUF magic) and not a tokenizer folder"},
      {fifo, "fifo.gguf is neither a model directory nor a GGUF file",
       "fifo.gguf is neither a tokenizer folder nor a GGUF file"},
      {directory, "x.gguf/config.json: file not found", "no tokenizer.json in '" + directory + "'"},
  };
  for (const auto& c : cases) {
    const std::string name = QFileInfo(c.path).fileName().toStdString();
    LimitedCliResult result = run_case("generate " + name, {"generate", "--model", c.path, "--prompt-ids", "1,2"});
    KVCHAT_EXPECT_FAILURE(result, 1, QStringList{c.as_model});
    result = run_case("tokenize " + name, {"tokenize", "--tokenizer", c.path, "--text", "hi"});
    KVCHAT_EXPECT_FAILURE(result, 1, QStringList{c.as_tokenizer});
  }
}

// kvchat-cli chat --backend against servers that answer with JSON nested 100,000 deep, never stop, never
// end a line, send a gzip bomb or impossible figures: each turn ends with its reason (or, for the figures,
// works without them), within the CPU and memory limits.
void HostileInputsTest::remote_servers_data() {
  using kvchat::test::ScriptedConnection;
  QTest::addColumn<ServerScript>("script");
  QTest::addColumn<bool>("name_the_model");  // false: the model is asked of /models
  QTest::addColumn<int>("exit_code");
  QTest::addColumn<QStringList>("fragments");
  const std::string deep = repeated("[", 100000) + repeated("]", 100000);
  const std::string keep_alives = ": keep-alive\n" + repeated("\n", 4096);
  QTest::newRow("event nested 100,000 deep") << ServerScript([deep](ScriptedConnection& c) {
    if (c.send_head("200 OK")) c.send(R"(data: {"error":{"code":1},"detail":)" + deep + "}\n\n");
  }) << true << 1 << QStringList{"sent no text: the server sent an event of JSON nested more than 64 levels deep"};
  QTest::newRow("/models nested 100,000 deep") << ServerScript([deep](ScriptedConnection& c) {
    if (c.send_head("200 OK", "Content-Type: application/json\r\n")) c.send(R"({"detail":)" + deep + "}");
  }) << false << 1 << QStringList{"answered /models with JSON nested more than 64 levels deep"};
  QTest::newRow("endless reply") << ServerScript([](ScriptedConnection& c) {
    if (!c.send_head("200 OK")) return;
    while (c.send(kvchat::test::content_event(repeated("x", 1000)))) {
    }
  }) << true << 1 << QStringList{"the reply passed 65 KiB of text, more than the requested tokens can make"};
  QTest::newRow("endless keep-alives") << ServerScript([keep_alives](ScriptedConnection& c) {
    if (!c.send_head("200 OK")) return;
    while (c.send(keep_alives)) {
    }
  }) << true << 1 << QStringList{"the server sent more than 4112 KiB for one reply of at most 65 KiB of text"};
  QTest::newRow("line without end") << ServerScript([](ScriptedConnection& c) {
    if (!c.send_head("200 OK") || !c.send("data: {\"choices\":[{\"delta\":{\"content\":\"")) return;
    while (c.send(repeated("x", 65536))) {
    }
  }) << true << 1 << QStringList{"the server sent more than 1 MiB without a line break"};
  QTest::newRow("gzip bomb") << ServerScript([keep_alives](ScriptedConnection& c) {
    kvchat::test::send_gzip_bomb(c, keep_alives);
  }) << true << 1 << QStringList{"the server sent more than 4112 KiB for one reply of at most 65 KiB of text"};
  QTest::newRow("usage 1e300") << ServerScript([](ScriptedConnection& c) {
    if (c.send_head("200 OK"))
      c.send(kvchat::test::content_event("Hi") +
             R"(data: {"choices":[{"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":1e300}})"
             "\n\ndata: [DONE]\n\n");
  }) << true << 0 << QStringList{"the server's figures are not used: usage.prompt_tokens is 1e+300, not a token count"};
}

void HostileInputsTest::remote_servers() {
  QFETCH(ServerScript, script);
  QFETCH(bool, name_the_model);
  QFETCH(int, exit_code);
  QFETCH(QStringList, fragments);
  kvchat::test::ScriptedServer server;
  QVERIFY(server.start(script));
  QStringList arguments = {"chat",      "--backend", server.base_url(),  "--db", dir_.filePath("remote.sqlite3"),
                           "--message", "Hi",        "--max-new-tokens", "4"};
  if (name_the_model)
    arguments << "--remote-model"
              << "m";
  const LimitedCliResult result = run_case(QTest::currentDataTag(), arguments);
  if (exit_code == 0) {
    KVCHAT_EXPECT_SUCCESS(result);
    for (const QString& fragment : fragments)
      QVERIFY2(result.err.find(fragment.toStdString()) != std::string::npos, result.err.c_str());
  } else {
    KVCHAT_EXPECT_FAILURE(result, exit_code, fragments);
  }
}

// One server, a 1 MiB body limit and one second for headers and for bodies, against clients that would hold
// it: each is answered while it is still sending, and the server stops on SIGTERM.
void HostileInputsTest::server_under_hostile_clients() {
  LimitedServer server;
  QVERIFY2(server.start({"--model", kvchat::test::shared_path("models/stories260K").c_str(), "--threads", "1",
                         "--max-body-mib", "1", "--header-timeout-s", "1", "--body-timeout-s", "1"}),
           server.log().c_str());
  const std::string post =
      "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n";
  {
    kvchat::test::RawHttpConnection endless(server.port());
    QVERIFY(endless.send(post + "Transfer-Encoding: chunked\r\n\r\n"));
    QVERIFY2(endless.send_until_answered("10000\r\n" + std::string(0x10000, 'a') + "\r\n", std::size_t(30) << 20,
                                         std::chrono::milliseconds(0)),
             "30 MB of chunks were read without an answer");
    const kvchat::test::RawResponse refused = endless.read_response();
    QCOMPARE(refused.status, 413);
    QCOMPARE(refused.error_code(), std::string("request_too_large"));
  }
  const std::vector<std::pair<std::string, int>> lengths = {{"-1", 400}, {"18446744073709551616", 413}};
  for (const auto& [length, status] : lengths) {
    kvchat::test::RawHttpConnection connection(server.port());
    QVERIFY(connection.send(post + "Content-Length: " + length + "\r\n\r\n"));
    QVERIFY2(connection.send_until_answered("a", 3000, std::chrono::milliseconds(20)), length.c_str());
    QCOMPARE(connection.read_response().status, status);
  }
  {
    kvchat::test::RawHttpConnection slow(server.port());
    QVERIFY(slow.send("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "));
    QVERIFY(slow.send_until_answered("a", 3000, std::chrono::milliseconds(20)));
    const kvchat::test::RawResponse refused = slow.read_response();
    QCOMPARE(refused.status, 408);
    QCOMPARE(refused.json()["error"]["message"].get<std::string>(),
             std::string("the request's headers did not arrive within 1 s"));
  }
  {
    // More half-sent requests than the server takes connections (1 running + 16 queued + 32), kept alive a
    // byte at a time.
    std::vector<std::unique_ptr<kvchat::test::RawHttpConnection>> half_sent;
    for (int i = 0; i < 60; ++i) {
      half_sent.push_back(std::make_unique<kvchat::test::RawHttpConnection>(server.port()));
      QVERIFY(half_sent.back()->send("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "));
    }
    std::atomic<bool> answered{false};
    std::atomic<bool> gave_up{false};
    std::thread trickle([&] {
      for (int round = 0; round < 600 && !answered.load(); ++round) {
        for (auto& connection : half_sent) connection->send("a");
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      gave_up.store(!answered.load());
    });
    kvchat::test::RawHttpConnection probe(server.port());
    QVERIFY(probe.send("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"));
    const int status = probe.read_response().status;
    answered.store(true);
    trickle.join();
    QCOMPARE(status, 200);
    QVERIFY2(!gave_up.load(), "/health was answered only once the half-sent requests stopped");
  }
  QVERIFY2(server.stop(), server.log().c_str());
  qInfo("serve under hostile clients: %.2f s CPU", server.cpu_seconds());
  QVERIFY2(server.cpu_seconds() <= kvchat::test::kHeavyCaseCpuSeconds, server.log().c_str());
}

// Sizes whose threads do not fit in 2 GiB of address space (64 + 256 + 32 connections' threads, 8 MiB of
// stack each): a clear error before the server listens, not an abort after it said it listens.
void HostileInputsTest::server_threads_that_cannot_start() {
  if (kvchat::test::kSanitizedBuild) QSKIP("no address-space cap in a sanitized build");
  rlimit stack{};
  if (getrlimit(RLIMIT_STACK, &stack) != 0 || stack.rlim_cur < (rlim_t{8} << 20))
    QSKIP("threads' stacks are smaller than 8 MiB here: the sizes would fit");
  const LimitedCliResult result = run_case("serve --parallel 64 --max-queue 256",
                                           {"serve", "--port", "0", "--threads", "1", "--parallel", "64", "--max-queue",
                                            "256", "--model", kvchat::test::shared_path("models/stories260K").c_str()});
  KVCHAT_EXPECT_FAILURE(result, 1, QStringList{"kvchat-cli serve: error: cannot start the server's 356 threads ("});
  QVERIFY2(result.err.find("listening on") == std::string::npos, result.err.c_str());
}

// A settings folder as an older version left it: the local server's key in the settings file, and a key
// file that anyone may read. Reading the settings moves the key into the key file, owner-only; where the
// key file cannot be written (a folder in its place) the key stays where it was rather than being lost.
void HostileInputsTest::server_key_in_an_older_settings_folder() {
  QTemporaryDir dir;
  const QString ini_path = dir.filePath("kvchat.ini");
  const QString key_path = dir.filePath("kvchat-server-api-key");
  auto write = [](const QString& path, const QByteArray& bytes) {
    QFile file(path);
    QVERIFY(file.open(QIODevice::WriteOnly | QIODevice::Truncate));
    file.write(bytes);
  };
  write(ini_path, "[local_server]\nenabled=true\napi_key=sk-older-789\n");
  write(key_path, "");
  QVERIFY(::chmod(QFile::encodeName(key_path).constData(), 0644) == 0);
  {
    QSettings ini(ini_path, QSettings::IniFormat);
    QCOMPARE(kvchat::app::LocalServerSettings::load(ini).api_key, QString("sk-older-789"));
  }
  QFile ini_file(ini_path);
  QVERIFY(ini_file.open(QIODevice::ReadOnly));
  QVERIFY(!ini_file.readAll().contains("sk-older-789"));
  QFile key_file(key_path);
  QVERIFY(key_file.open(QIODevice::ReadOnly));
  QCOMPARE(key_file.readAll(), QByteArray("sk-older-789"));
  struct stat status {};
  QCOMPARE(::stat(QFile::encodeName(key_path).constData(), &status), 0);
  QCOMPARE(status.st_mode & 0777, 0600u);

  QVERIFY(QFile::remove(key_path));
  QVERIFY(QDir().mkpath(key_path));
  write(ini_path, "[local_server]\nenabled=true\napi_key=sk-older-789\n");
  {
    QSettings ini(ini_path, QSettings::IniFormat);
    QCOMPARE(kvchat::app::LocalServerSettings::load(ini).api_key, QString("sk-older-789"));
    QCOMPARE(ini.value("local_server/api_key").toString(), QString("sk-older-789"));
  }
}

namespace {

// `bytes` with the first occurrence of `from` (a metadata key and what follows it) replaced by `to`, of the
// same length so every offset stays where it was.
std::string patched(std::string bytes, const std::string& from, const std::string& to) {
  const std::size_t at = bytes.find(from);
  if (at == std::string::npos || from.size() != to.size()) return {};
  return bytes.replace(at, from.size(), to);
}

}  // namespace

// A GGUF file whose metadata disagrees with its tensors, or lacks the RMSNorm epsilon: a load error naming
// the problem, never a model that runs on part of the file or a guessed epsilon.
void HostileInputsTest::gguf_metadata_that_disagrees_with_the_file() {
  const std::string whole =
      kvchat::test::read_file_bytes(kvchat::test::shared_path("fixtures/gguf/stories260K-F32.gguf"));
  std::string block_count_value = "llama.block_count";
  block_count_value += std::string("\x04\x00\x00\x00\x05\x00\x00\x00", 8);  // uint32 5
  std::string two_blocks = block_count_value;
  two_blocks[two_blocks.size() - 4] = '\x02';
  const struct {
    const char* name;
    std::string bytes;
    QString error;
  } cases[] = {
      {"block_count 2 of 5 layers", patched(whole, block_count_value, two_blocks),
       "belongs to a layer past the 2 layers the metadata's block_count declares"},
      {"no RMSNorm epsilon", patched(whole, "layer_norm_rms_epsilon", "layer_norm_rms_epsiloN"),
       "metadata llama.attention.layer_norm_rms_epsilon (the RMSNorm epsilon) is missing"},
  };
  for (const auto& c : cases) {
    QVERIFY2(!c.bytes.empty(), c.name);
    const QString path = dir_.filePath(QString(c.name).replace(' ', '-') + ".gguf");
    kvchat::test::write_file_bytes(path.toStdString(), c.bytes);
    KVCHAT_EXPECT_FAILURE(run_case(c.name, {"generate", "--model", path, "--prompt-ids", "1,2"}), 1,
                          QStringList{c.error});
  }
}

// --max-new-tokens at INT_MAX: the reply stops at the model's context (512 positions), and nothing is sized
// by the requested count (it was a bare std::bad_alloc).
void HostileInputsTest::a_reply_as_long_as_an_int_allows() {
  const LimitedCliResult result = run_case(
      "--max-new-tokens 2147483647", {"generate", "--model", kvchat::test::shared_path("models/stories260K").c_str(),
                                      "--prompt-ids", "1,2", "--max-new-tokens", "2147483647", "--json"});
  KVCHAT_EXPECT_SUCCESS(result);
  const json out = json::parse(result.out);
  QVERIFY2(out["stats"]["generated_tokens"].get<int>() <= 510, result.out.c_str());
}

// A tokenizer that ends at id 517 for a model of 1000 rows: every reply decodes (ids without text are
// never sampled) instead of failing half way.
void HostileInputsTest::a_tokenizer_smaller_than_the_model() {
  const std::string model =
      kvchat::test::make_tiny_llama3_chat_model(dir_.filePath("small-tokenizer").toStdString(), 517);
  const LimitedCliResult result =
      run_case("tokenizer of 517 ids, model of 1000",
               {"chat", "--model", QString::fromStdString(model), "--db", dir_.filePath("small-tokenizer.sqlite3"),
                "--kv-snapshots", "off", "--message", "Tell me a story", "--max-new-tokens", "48"});
  KVCHAT_EXPECT_SUCCESS(result);
}

KVCHAT_TEST_GUILESS_MAIN(HostileInputsTest)

}  // namespace app_test_hostile_inputs

#include "test_hostile_inputs.moc"
