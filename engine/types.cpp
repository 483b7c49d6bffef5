#include "engine/types.h"

#include <stdexcept>

namespace kvchat {

const char* to_string(KvCacheMode mode) {
  switch (mode) {
    case KvCacheMode::Contiguous: return "on";
    case KvCacheMode::Naive: return "naive";
    case KvCacheMode::Off: return "off";
  }
  return "?";
}

KvCacheMode kv_cache_mode_from_string(const std::string& text) {
  if (text == "on" || text == "contiguous") return KvCacheMode::Contiguous;
  if (text == "naive") return KvCacheMode::Naive;
  if (text == "off") return KvCacheMode::Off;
  throw std::invalid_argument("unknown kv cache mode '" + text + "' (expected on, naive or off)");
}

const char* to_string(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::F32: return "f32";
    case KvDtype::BF16: return "bf16";
    case KvDtype::F16: return "f16";
    case KvDtype::Q8_0: return "q8_0";
  }
  return "?";
}

KvDtype kv_dtype_from_string(const std::string& text) {
  if (text == "f32" || text == "float32") return KvDtype::F32;
  if (text == "bf16" || text == "bfloat16") return KvDtype::BF16;
  if (text == "f16" || text == "float16") return KvDtype::F16;
  if (text == "q8_0" || text == "q8") return KvDtype::Q8_0;
  throw std::invalid_argument("unknown kv cache dtype '" + text + "' (expected f32, bf16, f16 or q8_0)");
}

const char* to_string(StopReason reason) {
  switch (reason) {
    case StopReason::Eos: return "eos";
    case StopReason::MaxTokens: return "max_tokens";
    case StopReason::ContextFull: return "context_full";
    case StopReason::Stopped: return "stopped";
  }
  return "?";
}

const char* to_string(SpeculativeMode mode) {
  switch (mode) {
    case SpeculativeMode::None: return "none";
    case SpeculativeMode::Lookup: return "lookup";
    case SpeculativeMode::DraftModel: return "draft";
  }
  return "?";
}

SpeculativeMode speculative_mode_from_string(const std::string& text) {
  if (text == "none" || text == "off") return SpeculativeMode::None;
  if (text == "lookup") return SpeculativeMode::Lookup;
  if (text == "draft") return SpeculativeMode::DraftModel;
  throw std::invalid_argument("unknown speculative decoding mode '" + text + "' (expected none, lookup or draft)");
}

}  // namespace kvchat
