#include "engine/model/weight_dtype.h"

#include <stdexcept>

namespace kvchat {

const char* to_string(WeightDtype dtype) { return dtype == WeightDtype::BFloat16 ? "bf16" : "f32"; }

WeightDtype weight_dtype_from_string(const std::string& text) {
  if (text == "f32" || text == "float32" || text == "fp32") return WeightDtype::Float32;
  if (text == "bf16" || text == "bfloat16") return WeightDtype::BFloat16;
  throw std::invalid_argument("unknown weight dtype '" + text + "' (expected f32 or bf16)");
}

}  // namespace kvchat
