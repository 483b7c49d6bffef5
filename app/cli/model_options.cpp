#include "app/cli/model_options.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <utility>

#include "engine/compute/compute_options.h"
#include "engine/compute/process_setup.h"
#include "engine/generation/draft.h"
#include "engine/model/llama_model.h"

namespace kvchat::cli {

namespace {

// The GGUF types random weights can be made in, by their --dtype names.
const std::pair<const char*, GgufType> kGgufStorage[] = {
    {"f16", GgufType::F16},   {"q8_0", GgufType::Q8_0}, {"q4_0", GgufType::Q4_0},
    {"q4_1", GgufType::Q4_1}, {"q5_0", GgufType::Q5_0}, {"q5_1", GgufType::Q5_1},
    {"q4_k", GgufType::Q4_K}, {"q5_k", GgufType::Q5_K}, {"q6_k", GgufType::Q6_K},
};

std::string accepted_storage_names() {
  std::string names = "f32, bf16";
  for (const auto& [name, type] : kGgufStorage) names += std::string(", ") + name;
  return names;
}

}  // namespace

WeightStorage weight_storage_from_string(const std::string& text) {
  std::string lower = text;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const auto& [name, type] : kGgufStorage)
    if (lower == name) return WeightStorage{name, WeightDtype::Float32, type};
  try {
    const WeightDtype dtype = weight_dtype_from_string(lower);
    return WeightStorage{to_string(dtype), dtype, std::nullopt};
  } catch (const std::invalid_argument&) {
    throw UsageError("unknown weight dtype '" + text + "' (accepted: " + accepted_storage_names() + ")");
  }
}

std::vector<WeightStorage> weight_storages_from_option(const ArgParser& parser) {
  std::vector<WeightStorage> storages;
  for (const std::string& name : split_list(parser.value_or("dtype", "f32"))) {
    storages.push_back(weight_storage_from_string(name));
    if (storages.back().gguf_type && parser.has("model"))
      throw UsageError("--dtype " + storages.back().name +
                       " is for --random-weights only: a model keeps its own types (a GGUF file its stored ones)");
  }
  return storages;
}

std::string kernels_from_option(const ArgParser& parser) {
  std::string kernels = parser.value_or("kernels", "on");
  if (kernels != "on" && kernels != "off") throw UsageError("--kernels must be on or off");
  return kernels;
}

std::set<std::string> with_model_options(std::set<std::string> extra) {
  extra.insert({"model", "random-weights", "weights-seed", "threads", "dtype"});
  return extra;
}

ModelSource open_model_source(const ArgParser& parser, std::optional<WeightStorage> storage_override) {
  const int threads = threads_from_option(parser);
  const WeightStorage storage =
      storage_override ? *storage_override : weight_storage_from_string(parser.value_or("dtype", "f32"));
  const WeightDtype dtype = storage.dtype;
  ModelSource source;
  auto model_dir = parser.value("model");
  auto random_config = parser.value("random-weights");
  if (model_dir && random_config) throw UsageError("give --model or --random-weights, not both");
  if (model_dir && storage.gguf_type)
    throw UsageError("--dtype " + storage.name +
                     " is for --random-weights only: a model keeps its own types "
                     "(a GGUF file its stored ones, a directory f32 or bf16)");
  if (model_dir) {
    LoadedModel loaded = load_model(*model_dir, LoadOptions{dtype, threads, long_context_from_option(parser)});
    source.description = *model_dir;
    if (loaded.format == "gguf") source.weight_format = loaded.weight_format;
    source.model = loaded.model;
    source.tokenizer = loaded.tokenizer;
    source.formatter = loaded.formatter;
  } else if (random_config) {
    set_compute_threads(threads);
    ModelConfig config = ModelConfig::from_file(*random_config);
    if (parser.has("long-context")) config.use_longrope_long_context();
    const long long seed = parser.int64_or("weights-seed", 0);
    source.description = "random weights of " + *random_config;
    if (storage.gguf_type) {
      source.model = std::make_shared<LlamaModel>(
          config, random_quantized_model_weights(config, static_cast<std::uint64_t>(seed), *storage.gguf_type));
    } else {
      source.model = LlamaModel::random(config, static_cast<std::uint64_t>(seed), dtype);
    }
    release_freed_memory();  // the f32 tensors the random weights were made from
    spdlog::info("random model of {} ({}): {:.1f} MiB of weights ({})", *random_config, storage.name,
                 source.model->weight_bytes() / 1048576.0, source.model->weight_types());
  } else {
    throw UsageError("missing --model DIR|FILE.gguf or --random-weights CONFIG.json");
  }
  return source;
}

KvCacheMode cache_mode_from_option(const std::string& text) {
  try {
    return kv_cache_mode_from_string(text);
  } catch (const std::invalid_argument& error) {
    throw UsageError(error.what());
  }
}

KvDtype kv_dtype_from_option(const std::string& text) {
  try {
    return kv_dtype_from_string(text);
  } catch (const std::invalid_argument& error) {
    throw UsageError(error.what());
  }
}

int threads_from_option(const ArgParser& parser) {
  const int threads = parser.int_or("threads", 0);
  if (threads < 0 || threads > max_compute_threads())
    throw UsageError("--threads must be from 0 (all cores) to " + std::to_string(max_compute_threads()) +
                     " (4x this machine's cores)");
  return threads;
}

SamplingParams sampling_from_options(const ArgParser& parser) {
  SamplingParams sampling;
  sampling.temperature = static_cast<float>(parser.double_or("temperature", 0.0));
  sampling.top_k = parser.int_or("top-k", 0);
  sampling.top_p = static_cast<float>(parser.double_or("top-p", 1.0));
  sampling.min_p = static_cast<float>(parser.double_or("min-p", 0.0));
  sampling.repetition_penalty = static_cast<float>(parser.double_or("repeat-penalty", 1.0));
  sampling.seed = static_cast<std::uint64_t>(parser.int64_or("seed", 0));
  if (sampling.temperature < 0) throw UsageError("--temperature must be >= 0");
  if (sampling.top_k < 0) throw UsageError("--top-k must be >= 0");
  if (!(sampling.top_p > 0 && sampling.top_p <= 1)) throw UsageError("--top-p must be in (0, 1]");
  if (!(sampling.min_p >= 0 && sampling.min_p <= 1)) throw UsageError("--min-p must be in [0, 1]");
  if (!(sampling.repetition_penalty > 0)) throw UsageError("--repeat-penalty must be > 0");
  return sampling;
}

SpeculativeConfig speculative_from_options(const ArgParser& parser) {
  SpeculativeConfig speculative;
  try {
    speculative.mode = speculative_mode_from_string(parser.value_or("speculative", "none"));
  } catch (const std::invalid_argument& error) {
    throw UsageError(std::string("--speculative: ") + error.what());
  }
  speculative.draft_tokens = parser.int_or("draft-tokens", speculative.draft_tokens);
  if (speculative.draft_tokens < 1 || speculative.draft_tokens > kMaxDraftTokens)
    throw UsageError("--draft-tokens must be between 1 and " + std::to_string(kMaxDraftTokens));
  const bool draft = speculative.mode == SpeculativeMode::DraftModel;
  if (draft != bool(parser.value("draft-model")))
    throw UsageError(draft ? "--speculative draft needs --draft-model DIR|FILE.gguf"
                           : "--draft-model is for --speculative draft");
  return speculative;
}

void load_draft_model(const ArgParser& parser, SpeculativeConfig& speculative, const LlamaModel& target) {
  if (speculative.mode != SpeculativeMode::DraftModel) return;
  const std::string path = *parser.value("draft-model");
  speculative.draft_model = load_model(path).model;
  const std::int64_t draft_vocabulary = speculative.draft_model->config().vocab_size;
  if (draft_vocabulary != target.config().vocab_size)
    throw UsageError("--draft-model " + path + " has a vocabulary of " + std::to_string(draft_vocabulary) +
                     " ids, the model " + std::to_string(target.config().vocab_size) +
                     ": a draft model must share the model's tokenizer");
  spdlog::info("draft model {}: {} layers, hidden {}, {:.1f} MiB of weights ({})", path,
               speculative.draft_model->config().num_hidden_layers, speculative.draft_model->config().hidden_size,
               speculative.draft_model->weight_bytes() / 1048576.0, speculative.draft_model->weight_types());
}

}  // namespace kvchat::cli
