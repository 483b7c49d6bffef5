#pragma once
// Exact f32 values of GGUF tensor data. Each type is decoded with the same float operations as the
// format's reference decoder (f16 scales widened exactly, then d*q, or d*sc*q - dmin*m, in f32 in that
// order), so the results are bit-identical to it. Plain portable C++; no torch.
#include <cstdint>
#include <vector>

#include "engine/gguf/gguf_file.h"
#include "engine/gguf/gguf_types.h"

namespace kvchat {

// Exact conversions of 16-bit float bit patterns (every f16 and bf16 value is an f32 value).
float f16_to_f32(std::uint16_t bits);
float bf16_to_f32(std::uint16_t bits);

// Q4_K and Q5_K: 8 sub-blocks of 32, each with a 6-bit scale and a 6-bit min, packed into 12 bytes:
// sub-blocks 0-3 keep theirs in the low 6 bits of bytes 0-3 (scale) and 4-7 (min); sub-blocks 4-7
// keep their low 4 bits in the nibbles of bytes 8-11 and their top 2 bits in the top bits of
// bytes 0-3 (scale) and 4-7 (min). Inline: the decode kernels call it per sub-block.
inline void k_quant_scale_and_min(int sub_block, const std::uint8_t* packed, int& scale, int& min) {
  const int j = sub_block;
  if (j < 4) {
    scale = packed[j] & 63;
    min = packed[j + 4] & 63;
  } else {
    scale = (packed[j + 4] & 0x0F) | ((packed[j - 4] >> 6) << 4);
    min = (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4);
  }
}

// Decodes `n_elements` values of `type` (a whole number of blocks) starting at `blocks` into `out`.
// Throws ModelError naming the type when it is not dequantizable (see GgufTypeInfo::dequantizable()),
// std::invalid_argument when n_elements is not a whole number of blocks.
void dequantize(GgufType type, const void* blocks, std::int64_t n_elements, float* out);

// Rows [first_row, first_row + n_rows) of `tensor` (a row is ne[0] values; higher dims are flattened
// into rows) into `out`, which holds n_rows * tensor.row_length() floats. Throws ModelError naming
// the tensor for an unsupported type, std::out_of_range for rows outside the tensor.
void dequantize_rows(const GgufTensor& tensor, std::int64_t first_row, std::int64_t n_rows, float* out);

// The whole tensor.
std::vector<float> dequantize_tensor(const GgufTensor& tensor);

}  // namespace kvchat
