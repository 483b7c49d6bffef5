#pragma once
// How a model's weight matrices are kept in memory. Compute is always f32: a bf16 matrix is widened
// as it is read (decode) or a block at a time (prefill).
#include <string>

namespace kvchat {

enum class WeightDtype { Float32, BFloat16 };

const char* to_string(WeightDtype dtype);
WeightDtype weight_dtype_from_string(const std::string& text);  // "f32"/"float32", "bf16"/"bfloat16"

}  // namespace kvchat
