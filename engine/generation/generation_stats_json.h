#pragma once
// GenerationStats as JSON (kvchat-cli output, benchmarks). Field names are the public format.
#include <nlohmann/json.hpp>

#include "engine/types.h"

namespace kvchat {

nlohmann::ordered_json generation_stats_to_json(const GenerationStats& stats);

}  // namespace kvchat
