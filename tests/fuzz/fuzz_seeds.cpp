// Writes the seed corpora of the fuzz targets from the reference fixtures (read only, never changed):
//   fuzz_seeds SHARED_DIR OUT_DIR [FAMILIES_DIR]   ->   OUT_DIR/<target>/<seed>
// FAMILIES_DIR (the repository's tests/fixtures/families) adds the family fixtures' tokenizers.
// Real files are used as they are where they are small; large ones are cut down to a small but still
// valid file of the same kind (a 1,000-token vocabulary, a few tensors), because libFuzzer mutates small
// inputs far faster and finds the same parser paths in them.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "gguf/gguf_builder.h"

namespace fs = std::filesystem;
using nlohmann::ordered_json;
using namespace kvchat::test;

namespace {

constexpr std::size_t kVocabularyKept = 1000;
constexpr std::uint64_t kTensorBytesKept = 96 * 1024;
const std::string kSeparator(1, '\0');  // fuzz_input.h: parts are separated by a NUL byte

struct Seeds {
  fs::path shared, out;
  void write(const std::string& target, const std::string& name, const std::string& bytes) const {
    fs::create_directories(out / target);
    write_file_bytes((out / target / name).string(), bytes);
  }
  std::string read(const std::string& relative) const { return read_file_bytes((shared / relative).string()); }
  ordered_json json(const std::string& relative) const { return ordered_json::parse(read(relative)); }
};

// --- tokenizer.json: the ids below kVocabularyKept and the merges among them ---
// nlohmann::json, not ordered_json: an ordered object finds a key by a linear search, and a 128k-token
// vocabulary would take minutes to parse. Key order means nothing in a vocabulary.
std::string small_tokenizer(nlohmann::json tokenizer) {
  nlohmann::json& model = tokenizer["model"];
  std::set<std::string> kept;
  nlohmann::json vocab = nlohmann::json::object();
  for (auto& [token, id] : model["vocab"].items())
    if (id.get<std::int64_t>() < static_cast<std::int64_t>(kVocabularyKept)) {
      vocab[token] = id;
      kept.insert(token);
    }
  model["vocab"] = vocab;
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& merge : model["merges"]) {
    std::string left, right;
    if (merge.is_string()) {
      const std::string text = merge.get<std::string>();
      const auto space = text.find(' ');
      left = text.substr(0, space), right = text.substr(space + 1);
    } else {
      left = merge[0].get<std::string>(), right = merge[1].get<std::string>();
    }
    if (kept.count(left) && kept.count(right) && kept.count(left + right)) merges.push_back(merge);
  }
  model["merges"] = merges;
  return tokenizer.dump();
}

const std::vector<std::string> kTokenizerTexts = {"Hello world",
                                                  "Once upon a time, Lily went to the park.\n",
                                                  "<s>[INST] hi [/INST]",
                                                  "<|begin_of_text|><|eot_id|> caf\xC3\xA9 \xF0\x9F\x98\x80",
                                                  "  leading\tand 12345 trailing  ",
                                                  "cafe\xCC\x81 \xEF\xAC\x81ne<|im_end|>\n<|user|>\nHi",
                                                  ""};

// A tokenizer.json alone, and with its tokenizer_config.json and each of kTokenizerTexts: name, name_text0, ...
void write_tokenizer_seeds(const Seeds& seeds, const std::string& name, const std::string& tokenizer,
                           const std::string& config) {
  seeds.write("tokenizer", name, tokenizer);
  for (std::size_t i = 0; i < kTokenizerTexts.size(); ++i)
    seeds.write("tokenizer", name + "_text" + std::to_string(i),
                tokenizer + kSeparator + config + kSeparator + kTokenizerTexts[i]);
}

// The family fixtures' real tokenizers, already cut to a few hundred tokens: Qwen's NFC normalizer, Gemma's and
// Phi-3's SentencePiece rules (Phi-3's "legacy": false), Mistral's Tekken.
void family_tokenizer_seeds(const Seeds& seeds, const fs::path& families) {
  std::vector<fs::path> folders;
  for (const auto& entry : fs::directory_iterator(families))
    if (fs::exists(entry.path() / "tokenizer.json")) folders.push_back(entry.path());
  std::sort(folders.begin(), folders.end());
  for (const fs::path& folder : folders)
    write_tokenizer_seeds(seeds, folder.filename().string(), read_file_bytes((folder / "tokenizer.json").string()),
                          read_file_bytes((folder / "tokenizer_config.json").string()));
}

void tokenizer_seeds(const Seeds& seeds) {
  write_tokenizer_seeds(seeds, "stories260K", seeds.read("models/stories260K/tokenizer.json"),
                        seeds.read("models/stories260K/tokenizer_config.json"));
  for (const char* name : {"llama2", "llama3"}) {
    const std::string folder = std::string("fixtures/tokenizers/") + name;
    write_tokenizer_seeds(seeds, std::string(name) + "_small",
                          small_tokenizer(nlohmann::json::parse(seeds.read(folder + "/tokenizer.json"))),
                          seeds.read(folder + "/tokenizer_config.json"));
  }
}

// --- chat templates: every fixture's template with one of its conversations ---
void chat_template_seeds(const Seeds& seeds) {
  std::vector<fs::path> fixtures;
  for (const auto& folder : {"fixtures/chat_templates", "fixtures/chat_templates/tool_use"})
    for (const auto& entry : fs::directory_iterator(seeds.shared / folder))
      if (entry.path().extension() == ".json") fixtures.push_back(entry.path());
  std::sort(fixtures.begin(), fixtures.end());
  for (const fs::path& path : fixtures) {
    const ordered_json fixture = ordered_json::parse(read_file_bytes(path.string()));
    const std::string source = fixture["template"].get<std::string>();
    seeds.write("chat_template", path.stem().string(), source);
    int written = 0;
    for (const auto& conversation : fixture.value("cases", ordered_json::array())) {
      if (!conversation.contains("messages") || ++written > 3) continue;
      const ordered_json context = {{"messages", conversation["messages"]},
                                    {"add_generation_prompt", conversation.value("add_generation_prompt", false)}};
      seeds.write("chat_template", path.stem().string() + "_" + std::to_string(written),
                  source + kSeparator + context.dump());
    }
  }
  const ordered_json llama3 = seeds.json("fixtures/tokenizers/llama3/tokenizer_config.json");
  if (llama3.contains("chat_template") && llama3["chat_template"].is_string())
    seeds.write("chat_template", "llama3_tokenizer_config", llama3["chat_template"].get<std::string>());
}

// --- config.json (+ generation_config.json) ---
void model_config_seeds(const Seeds& seeds) {
  for (const auto& entry : fs::directory_iterator(seeds.shared / "fixtures/configs"))
    seeds.write("model_config", entry.path().stem().string(), read_file_bytes(entry.path().string()));
  seeds.write("model_config", "stories260K", seeds.read("models/stories260K/config.json"));
  seeds.write("model_config", "stories260K_generation",
              seeds.read("models/stories260K/config.json") + kSeparator +
                  seeds.read("models/stories260K/generation_config.json"));
}

// --- safetensors: small files with the fixture model's tensor names, and an index over two shards ---
std::string safetensors_file(const std::vector<std::pair<std::string, std::string>>& tensors) {
  static const std::map<std::string, std::size_t> sizes = {{"F32", 4}, {"F16", 2},  {"BF16", 2}, {"I64", 8},
                                                           {"U8", 1},  {"BOOL", 1}, {"F64", 8}};
  ordered_json header = {{"__metadata__", {{"format", "pt"}}}};
  std::uint64_t offset = 0;
  std::size_t index = 0;
  for (const auto& [name, dtype] : tensors) {
    const std::vector<std::int64_t> shape = index % 3 == 0   ? std::vector<std::int64_t>{2, 3}
                                            : index % 3 == 1 ? std::vector<std::int64_t>{4}
                                                             : std::vector<std::int64_t>{};
    std::uint64_t bytes = sizes.at(dtype);
    for (std::int64_t dim : shape) bytes *= static_cast<std::uint64_t>(dim);
    header[name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    ++index;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data section starts 8-aligned, as writers do
  std::string file;
  append_le<std::uint64_t>(file, text.size());
  file += text;
  for (std::uint64_t i = 0; i < offset; ++i) file += static_cast<char>(i * 37);
  return file;
}

void safetensors_seeds(const Seeds& seeds) {
  const std::string model = seeds.read("models/stories260K/model.safetensors");
  std::uint64_t header_length = 0;
  std::memcpy(&header_length, model.data(), 8);
  const ordered_json header = ordered_json::parse(model.substr(8, header_length));
  std::vector<std::string> names;
  for (const auto& [name, entry] : header.items())
    if (name != "__metadata__") names.push_back(name);
  seeds.write("safetensors", "stories260K_header", model.substr(0, 8 + header_length));
  std::vector<std::pair<std::string, std::string>> tensors;
  const char* dtypes[] = {"F32", "F16", "BF16"};
  for (std::size_t i = 0; i < names.size() && i < 12; ++i) tensors.emplace_back(names[i], dtypes[i % 3]);
  seeds.write("safetensors", "stories260K_names", safetensors_file(tensors));
  seeds.write("safetensors", "all_dtypes",
              safetensors_file(
                  {{"a", "F32"}, {"b", "F16"}, {"c", "BF16"}, {"d", "I64"}, {"e", "U8"}, {"f", "BOOL"}, {"g", "F64"}}));
  ordered_json index = {{"metadata", {{"total_size", 1045000}}}, {"weight_map", ordered_json::object()}};
  for (std::size_t i = 0; i < names.size(); ++i)
    index["weight_map"][names[i]] = i % 2 ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
  seeds.write("safetensors", "index", index.dump(2));
}

// --- GGUF: small models with a few tensors of each type, and vocabularies cut to kVocabularyKept ---
struct RawEntry {
  std::string key;
  std::uint32_t type = 0;
  std::size_t value_at = 0;  // offset of the value inside the entry
};

RawEntry raw_entry(const std::string& entry) {
  RawEntry raw;
  std::uint64_t key_length = 0;
  std::memcpy(&key_length, entry.data(), 8);
  raw.key = entry.substr(8, key_length);
  std::memcpy(&raw.type, entry.data() + 8 + key_length, 4);
  raw.value_at = 12 + key_length;
  return raw;
}

// The first `keep` elements of an array entry (strings or fixed-size numbers), or those `keep_string` accepts.
template <typename Keep>
std::string cut_array(const std::string& entry, std::size_t keep, Keep keep_string) {
  const RawEntry raw = raw_entry(entry);
  std::uint32_t element_type = 0;
  std::uint64_t count = 0;
  std::memcpy(&element_type, entry.data() + raw.value_at, 4);
  std::memcpy(&count, entry.data() + raw.value_at + 4, 8);
  std::size_t at = raw.value_at + 12;
  std::string elements;
  std::uint64_t kept = 0;
  for (std::uint64_t i = 0; i < count; ++i) {
    std::size_t size = 4;
    if (element_type == 8) {
      std::uint64_t length = 0;
      std::memcpy(&length, entry.data() + at, 8);
      size = 8 + length;
      if (kept < keep && keep_string(entry.substr(at + 8, length))) elements += entry.substr(at, size), ++kept;
    } else if (kept < keep) {
      elements += entry.substr(at, size), ++kept;
    }
    at += size;
  }
  std::string out = entry.substr(0, raw.value_at + 4);
  append_le<std::uint64_t>(out, kept);
  return out + elements;
}

void cut_vocabulary(GgufPieces& pieces) {
  std::set<std::string> tokens;
  std::vector<std::string> metadata;
  for (const std::string& entry : pieces.metadata) {
    const RawEntry raw = raw_entry(entry);
    if (raw.key == "tokenizer.ggml.tokens") {
      metadata.push_back(cut_array(entry, kVocabularyKept, [&](const std::string& token) {
        tokens.insert(token);
        return true;
      }));
    } else if (raw.key == "tokenizer.ggml.scores" || raw.key == "tokenizer.ggml.token_type") {
      metadata.push_back(cut_array(entry, kVocabularyKept, [](const std::string&) { return true; }));
    } else if (raw.key.size() > 9 && raw.key.compare(raw.key.size() - 9, 9, "_token_id") == 0 &&
               (raw.type == 4 || raw.type == 5)) {
      std::uint32_t id = 0;
      std::memcpy(&id, entry.data() + raw.value_at, 4);
      if (id < kVocabularyKept) metadata.push_back(entry);  // ids past the cut would only be refused
    } else {
      metadata.push_back(entry);
    }
  }
  // Merges only among kept tokens ("left right" -> left + right), after the tokens are known.
  for (std::string& entry : metadata)
    if (raw_entry(entry).key == "tokenizer.ggml.merges")
      entry = cut_array(entry, SIZE_MAX, [&](const std::string& merge) {
        const auto space = merge.find(' ');
        return space != std::string::npos && tokens.count(merge.substr(0, space)) &&
               tokens.count(merge.substr(space + 1)) && tokens.count(merge.substr(0, space) + merge.substr(space + 1));
      });
  pieces.metadata = metadata;
}

// token_embd.weight (which the config needs) and then the others in file order, while they fit the budget.
void keep_few_tensors(GgufPieces& pieces) {
  std::vector<GgufTensorInfo> tensors;
  std::string data;
  auto sorted = pieces.tensors;
  std::sort(sorted.begin(), sorted.end(),
            [](const GgufTensorInfo& a, const GgufTensorInfo& b) { return a.offset < b.offset; });
  std::stable_partition(pieces.tensors.begin(), pieces.tensors.end(),
                        [](const GgufTensorInfo& t) { return t.name == "token_embd.weight"; });
  for (const GgufTensorInfo& tensor : pieces.tensors) {
    // A tensor's bytes run to the next tensor's offset (or the end of the data).
    auto next = std::upper_bound(sorted.begin(), sorted.end(), tensor.offset,
                                 [](std::uint64_t offset, const GgufTensorInfo& t) { return offset < t.offset; });
    const std::uint64_t end = next == sorted.end() ? pieces.data.size() : next->offset;
    if (data.size() + (end - tensor.offset) > kTensorBytesKept && !tensors.empty()) continue;
    GgufTensorInfo kept = tensor;
    data.append((pieces.alignment - data.size() % pieces.alignment) % pieces.alignment, '\0');
    kept.offset = data.size();
    data += pieces.data.substr(tensor.offset, end - tensor.offset);
    tensors.push_back(kept);
  }
  pieces.tensors = tensors;
  pieces.data = data;
}

void gguf_seeds(const Seeds& seeds) {
  for (const auto& entry : fs::directory_iterator(seeds.shared / "fixtures/gguf")) {
    if (entry.path().extension() != ".gguf") continue;
    GgufPieces pieces = split_gguf(read_file_bytes(entry.path().string()));
    cut_vocabulary(pieces);
    keep_few_tensors(pieces);
    seeds.write("gguf", entry.path().stem().string(), pieces.bytes());
  }
  // One file as it is: a whole model, every tensor.
  seeds.write("gguf", "stories260K-Q4_0-whole", seeds.read("fixtures/gguf/stories260K-Q4_0.gguf"));
}

// --- remote_stream: streamed replies as the servers known send them, cut into pieces at NUL bytes ---
void remote_stream_seeds(const Seeds& seeds) {
  const std::string head = R"(data: {"id":"c1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,)";
  const std::string role = head + R"("delta":{"role":"assistant"}}]})";
  auto content = [&head](const std::string& text) {
    return head + R"("delta":{"content":")" + text + R"("},"finish_reason":null}]})";
  };
  const std::string finish = R"(data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]})";
  const std::string usage = R"(data: {"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3,)"
                            R"("prompt_tokens_details":{"cached_tokens":8}}})";
  const std::string llama_timings =
      R"(data: {"choices":[{"delta":{},"finish_reason":"length"}],"timings":{"prompt_n":12,"prompt_ms":35.5,)"
      R"("prompt_per_second":338.0,"predicted_n":3,"predicted_ms":20.1,"predicted_per_second":149.2,"cache_n":8}})";
  const std::string kvchat_timings =
      R"(data: {"choices":[{"delta":{},"finish_reason":"stop"}],"timings":{"ttft_ms":12.5,)"
      R"("prefill_tokens_per_second":900,"decode_tokens_per_second":80.5,"cached_tokens":4}})";
  const std::string done = "data: [DONE]";
  const std::string nl = "\n\n";
  seeds.write("remote_stream", "openai",
              role + nl + content("Once") + nl + content(" upon") + nl + finish + nl + usage + nl + done + nl);
  seeds.write("remote_stream", "llama_cpp_pieces",
              content("Hello") + "\r\n\r\n" + content(" wor") + kSeparator + content("ld") + "\r" + kSeparator +
                  "\n\r\n" + llama_timings + "\r\n\r\n" + done + "\r\n\r\n");
  seeds.write("remote_stream", "kvchat_serve",
              ": keep-alive\n\n" + content("caf\xC3" + kSeparator + "\xA9") + nl + kvchat_timings + nl + done + nl);
  seeds.write("remote_stream", "error_event",
              content("partial") + nl + R"(data: {"error":{"message":"the model crashed","code":500}})" + nl);
  seeds.write("remote_stream", "error_body", R"({"error":{"message":"incorrect API key provided","type":"auth"}})");
  seeds.write("remote_stream", "detail_body", R"({"detail":[{"loc":["body","model"],"msg":"field required"}]})");
  seeds.write("remote_stream", "models", R"({"object":"list","data":[{"id":"stories260K","object":"model"}]})");
  seeds.write("remote_stream", "escapes", content("\\u001b]52;c;aGk=\\u0007\\u009b2J") + nl + done + nl);
}

// --- openai_request: request bodies as the SDKs and kvchat's remote backend send them ---
void openai_request_seeds(const Seeds& seeds) {
  seeds.write(
      "openai_request", "chat",
      R"({"model":"stories260K","messages":[{"role":"system","content":"Be brief."},{"role":"user",)"
      R"("content":"Once"}],"temperature":0,"max_tokens":40,"stream":true,"stream_options":{"include_usage":true}})");
  seeds.write("openai_request", "remote_backend",
              R"({"model":"m","messages":[{"role":"user","content":"Hi"}],"stream":true,"max_tokens":256,)"
              R"("temperature":0.7,"top_p":0.9,"seed":42,"top_k":40,"min_p":0.05,"repetition_penalty":1.1,)"
              R"("repeat_penalty":1.1,"repeat_last_n":64})");
  seeds.write(
      "openai_request", "sdk_defaults",
      R"({"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"Hi"}]},)"
      R"({"role":"assistant","content":"Hello","refusal":null}],"frequency_penalty":0,"presence_penalty":0,)"
      R"("n":1,"logit_bias":{},"tools":[],"response_format":{"type":"text"},"logprobs":true,"top_logprobs":3})");
  seeds.write("openai_request", "completion_ids", R"({"prompt":[[1,403,407]],"max_tokens":8,"logprobs":2,"stop":["
"]})");
  seeds.write("openai_request", "completion_text",
              R"({"prompt":["Once upon a time"],"temperature":1.5,"seed":18446744073709551615})");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    spdlog::error("usage: fuzz_seeds SHARED_DIR OUT_DIR [FAMILIES_DIR]");
    return 2;
  }
  const Seeds seeds{argv[1], argv[2]};
  safetensors_seeds(seeds);
  model_config_seeds(seeds);
  tokenizer_seeds(seeds);
  if (argc == 4) family_tokenizer_seeds(seeds, argv[3]);
  chat_template_seeds(seeds);
  gguf_seeds(seeds);
  remote_stream_seeds(seeds);
  openai_request_seeds(seeds);
  for (const auto& target : fs::directory_iterator(seeds.out)) {
    std::size_t count = 0;
    for ([[maybe_unused]] const auto& file : fs::directory_iterator(target.path())) ++count;
    spdlog::info("{}: {} seeds", target.path().filename().string(), count);
  }
  return 0;
}
