#pragma once
// Options shared by the commands that run a model: --model DIR|FILE.gguf | --random-weights CONFIG.json
// [--weights-seed N], --threads N, --dtype NAME; and the sampling options.
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "app/cli/cli_command.h"
#include "engine/gguf/gguf_types.h"
#include "engine/model/model_config.h"
#include "engine/model/model_loader.h"
#include "engine/text/tokenizer.h"

namespace kvchat::cli {

// --long-context, for the commands that open a model file or folder.
constexpr const char* kLongContextUsage =
    "--long-context: a LongRoPE model (Phi-3, Phi-4-mini) opened for its whole context, the long factors for every\n"
    "position (as llama.cpp does for a context past the original one); without it, the short factors within the\n"
    "original context (what transformers computes there). Refused for other models.\n";

// --long-context given: LoadOptions::LongContext::Required, else Off.
inline LoadOptions::LongContext long_context_from_option(const ArgParser& parser) {
  return parser.has("long-context") ? LoadOptions::LongContext::Required : LoadOptions::LongContext::Off;
}

struct ModelSource {
  std::string description;    // the directory, or "random <config>"
  std::string weight_format;  // a GGUF file's own ("Q4_K_M", ...); empty otherwise
  std::shared_ptr<const LlamaModel> model;
  std::shared_ptr<const Tokenizer> tokenizer;  // null for random weights
  ChatFormatter formatter = ChatFormatter::plain();
};

// How weights are kept, as --dtype names it: f32/bf16 (a directory's or random weights, converted on load)
// or a GGUF block type (random weights made directly in that type; a model file keeps its own types).
struct WeightStorage {
  std::string name;  // lower case: "f32", "bf16", "q8_0", "q4_k", ...
  WeightDtype dtype = WeightDtype::Float32;
  std::optional<GgufType> gguf_type;  // set for the GGUF types
};

// Case-insensitive: f32 (float32, fp32), bf16 (bfloat16), f16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k,
// q6_k. Anything else is a UsageError listing the accepted names.
WeightStorage weight_storage_from_string(const std::string& text);

// The bench's --dtype list (default f32); a GGUF type with --model is a UsageError.
std::vector<WeightStorage> weight_storages_from_option(const ArgParser& parser);
// The bench's --kernels: "on" (default) or "off"; anything else is a UsageError.
std::string kernels_from_option(const ArgParser& parser);

// The value options above plus `extra`.
std::set<std::string> with_model_options(std::set<std::string> extra);
// `storage` overrides --dtype (the bench sweeps several). A GGUF type with --model is a UsageError.
ModelSource open_model_source(const ArgParser& parser, std::optional<WeightStorage> storage = std::nullopt);
// --threads: 0 (all cores) up to engine max_compute_threads(); anything else is a UsageError.
int threads_from_option(const ArgParser& parser);
// --temperature --top-k --top-p --min-p --repeat-penalty --seed (validated ranges).
SamplingParams sampling_from_options(const ArgParser& parser);
// --speculative none|lookup|draft, --draft-tokens K and --draft-model PATH (speculative decoding: the same
// tokens, sooner). The draft model itself is loaded by load_draft_model, after the model.
SpeculativeConfig speculative_from_options(const ArgParser& parser);
void load_draft_model(const ArgParser& parser, SpeculativeConfig& speculative, const LlamaModel& target);
constexpr const char* kSpeculativeUsage =
    "--speculative lookup: propose up to --draft-tokens K (default 8) tokens from earlier text that matches the\n"
    "last few and check them in one pass; the reply is token for token what it would be without.\n"
    "--speculative draft --draft-model DIR|FILE.gguf: a smaller model of the same tokenizer proposes them.\n";
// "on", "naive" or "off"; anything else is a UsageError.
KvCacheMode cache_mode_from_option(const std::string& text);
// --kv-dtype: "f32", "bf16", "f16" or "q8_0"; anything else is a UsageError.
KvDtype kv_dtype_from_option(const std::string& text);
constexpr const char* kKvDtypeUsage =
    "--kv-dtype f32|bf16|f16|q8_0: how the KV cache stores keys and values (f32, the default, is exact; the others\n"
    "round each key and value once, on every path, so the cache still changes no token; q8_0 holds about a quarter\n"
    "of f32's bytes per token).\n";

}  // namespace kvchat::cli
