#pragma once
// Options shared by the commands that run a model: --model DIR | --random-weights CONFIG.json
// [--weights-seed N], --threads N, --dtype f32|bf16; and the sampling options.
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "app/cli/cli_command.h"
#include "engine/model_config.h"
#include "engine/model_loader.h"
#include "engine/text/tokenizer.h"

namespace kvchat::cli {

struct ModelSource {
  std::string description;                     // the directory, or "random <config>"
  std::shared_ptr<const LlamaModel> model;
  std::shared_ptr<const Tokenizer> tokenizer;  // null for random weights
  ChatFormatter formatter = ChatFormatter::plain();
};

// The value options above plus `extra`.
std::set<std::string> with_model_options(std::set<std::string> extra);
// `dtype` overrides --dtype (the bench sweeps several).
ModelSource open_model_source(const ArgParser& parser, std::optional<WeightDtype> dtype = std::nullopt);
// --threads: 0 (all cores) up to engine max_compute_threads(); anything else is a UsageError.
int threads_from_option(const ArgParser& parser);
// --temperature --top-k --top-p --min-p --repeat-penalty --seed (validated ranges).
SamplingParams sampling_from_options(const ArgParser& parser);
// "on", "naive" or "off"; anything else is a UsageError.
KvCacheMode cache_mode_from_option(const std::string& text);

}  // namespace kvchat::cli
