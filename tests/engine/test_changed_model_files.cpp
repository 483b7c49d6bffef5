// Model files are memory-mapped: a file truncated or rewritten after loading must become a clear
// error at the next turn (it used to kill the process with SIGBUS, or silently change the weights),
// and a SIGBUS that still happens inside a mapping must be reported, naming the file, before the
// process ends.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include <QtTest/QtTest>
#include "common/test_suite.h"

#include "common/test_paths.h"
#include "engine/generation/session.h"
#include "engine/gguf/gguf_file.h"
#include "engine/model/model_loader.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace engine_test_changed_model_files {

namespace fs = std::filesystem;
using kvchat::GenerationConfig;
using kvchat::KvCacheMode;
using kvchat::LoadedModel;
using kvchat::ModelError;
using kvchat::Session;

namespace {

// The error of one short greedy turn ("" when it runs).
std::string turn_error(const LoadedModel& loaded) {
  Session session(loaded.model, KvCacheMode::Contiguous);
  GenerationConfig config;
  config.max_new_tokens = 4;
  try {
    session.generate({1, 403, 407}, config);
  } catch (const ModelError& error) {
    return error.what();
  }
  return "";
}

std::string copy_of(const std::string& source, const fs::path& into) {
  fs::copy(source, into, fs::copy_options::recursive);
  return into.string();
}

#define COMPARE_STR(actual, expected) QCOMPARE(QString::fromStdString(actual), QString::fromStdString(expected))

}  // namespace

class ChangedModelFilesTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  // Each way a file changes, for a safetensors folder, a sharded bf16 folder and a GGUF file.
  void a_changed_file_fails_the_next_turn() {
    QTemporaryDir dir;
    const fs::path root(dir.path().toStdString());
    struct Case {
      std::string source, weights_file;
    };
    const Case cases[] = {
        {kvchat::test::shared_path("models/stories260K"), "model.safetensors"},
        {kvchat::test::shared_path("models/tiny-llama3-random"), "model-00002-of-00002.safetensors"},
        {kvchat::test::shared_path("fixtures/gguf/stories260K-Q8_0.gguf"), ""},
    };
    int index = 0;
    for (const Case& c : cases) {
      const fs::path copy = root / ("model" + std::to_string(index++) + (c.weights_file.empty() ? ".gguf" : ""));
      copy_of(c.source, copy);
      const std::string file = c.weights_file.empty() ? copy.string() : (copy / c.weights_file).string();
      const auto size = fs::file_size(file);
      {
        const LoadedModel loaded = kvchat::load_model(copy.string());
        COMPARE_STR(turn_error(loaded), "");
        QVERIFY(::truncate(file.c_str(), static_cast<off_t>(size / 2)) == 0);
        COMPARE_STR(turn_error(loaded),
                    "the model file " + file + " changed on disk after it was loaded (its size changed from " +
                        std::to_string(size) + " to " + std::to_string(size / 2) + " bytes); load the model again");
      }
      // Same size, written again: the weights would change under the mapping.
      fs::remove_all(copy);
      copy_of(c.source, copy);
      {
        const LoadedModel loaded = kvchat::load_model(copy.string());
        const timespec times[2] = {{0, UTIME_OMIT}, {1000000000, 0}};
        QVERIFY(::utimensat(AT_FDCWD, file.c_str(), times, 0) == 0);
        COMPARE_STR(
            turn_error(loaded),
            "the model file " + file + " changed on disk after it was loaded (it was modified); load the model again");
        // Replaced by a new file under the same name (what a download or a copy over it does).
        fs::copy_file(file, file + ".new");
        fs::rename(file + ".new", file);
        COMPARE_STR(turn_error(loaded), "the model file " + file +
                                            " changed on disk after it was loaded (it was replaced by another file); "
                                            "load the model again");
        fs::remove(file);
        QVERIFY(turn_error(loaded).find("(it is gone (No such file or directory))") != std::string::npos);
      }
      fs::remove_all(copy);
    }
  }

  // A file truncated while its mapping is read: the process ends with SIGBUS, as before, but says why.
  void a_bus_error_in_a_mapping_is_reported() {
    QTemporaryDir dir;
    const std::string path = dir.filePath("model.gguf").toStdString();
    fs::copy_file(kvchat::test::shared_path("fixtures/gguf/stories260K-Q8_0.gguf"), path);
    const std::string report = dir.filePath("stderr.txt").toStdString();
    const pid_t child = fork();
    if (child == 0) {
      const int fd = ::open(report.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, STDERR_FILENO);
      kvchat::GgufFile file(path);
      const kvchat::GgufTensor* last = &file.tensors().back();
      if (::truncate(path.c_str(), 4096) != 0) _exit(3);
      volatile std::uint8_t byte = last->data[0];  // past the new end of the file
      (void)byte;
      _exit(0);
    }
    int status = 0;
    QCOMPARE(waitpid(child, &status, 0), child);
    QVERIFY(WIFSIGNALED(status));
    QCOMPARE(WTERMSIG(status), SIGBUS);
    QFile text(QString::fromStdString(report));
    QVERIFY(text.open(QIODevice::ReadOnly));
    COMPARE_STR(text.readAll().toStdString(),
                "kvchat: fatal: the model file " + path +
                    " was truncated or rewritten while it was in use (SIGBUS reading its memory mapping). The program "
                    "must stop; start it again and load the model again.\n");
  }
};

KVCHAT_TEST_GUILESS_MAIN(ChangedModelFilesTest)

}  // namespace engine_test_changed_model_files

#include "test_changed_model_files.moc"
