#pragma once
// Dot products of one row of quantized weights with the activations rounded to integers
// (activation_quantization.h): the weights' integers times the activations' integers, summed exactly
// in 32-bit integers, then scaled in f32. The result is sum_i w_i * x^_i, w_i the exactly dequantized
// weight and x^_i the rounded activation, up to f32 rounding of the scaled terms; so, against the exact
// product with x,
//   |error| <= sum over activation blocks b of 0.51 * scale_b * sum_{i in b} |w_i|   (rounding of x)
//            + about 1e-6 * sum_i |w_i x^_i|                                        (f32 accumulation).
// The types with blocks of 32 (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) take one byte per activation with a scale
// per block (BlockBytes: about 1/250 of the block's largest |x| per unit of |w|, llama.cpp's Q8_0
// activations). Q4_K, Q5_K, Q6_K (super-blocks of 256) take one byte per activation with one scale per
// super-block (SuperBlockBytes), so their sub-block scales apply in integers and each super-block is
// scaled once: about 1/250 of the super-block's largest |x| per unit of |w|, llama.cpp's Q8_K. Each type
// has a portable kernel (integer_dot_portable.cpp), an AVX2 one computing the same integer sums
// (integer_dot_avx2.cpp) and an AVX-512 VNNI one (integer_dot_avx512.cpp); the block-type table
// (block_types.h) says which a type has and picks among them.
#include <cstdint>

#include "engine/gguf/gguf_types.h"
#include "engine/kernels/activation_quantization.h"
#include "engine/kernels/cpu_features.h"

namespace kvchat::kernels {

// dot(row, x^) for a row of `blocks` blocks of the type.
using IntegerRowDot = float (*)(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks);

// Consecutive rows of a matrix, `row_bytes` apart, and where their products go: row r's product with vector v
// to y[v * y_stride + r], plus bias[r] where there is a bias.
struct RowTile {
  const std::uint8_t* rows = nullptr;
  std::int64_t row_bytes = 0, row_count = 0;
  float* y = nullptr;
  std::int64_t y_stride = 0;
  const float* bias = nullptr;
};

// The products of a tile's rows with `count` >= 1 activation vectors x[0..count-1], each bit-identical to what
// the same instruction set's IntegerRowDot gives: a prompt's products and a speculative check's rows read each
// row once for a group of vectors and share the weights' unpacking among them (for_row_tile, vector_math_avx2.h).
using IntegerRowDots = void (*)(const RowTile& tile, const QuantizedActivations* x, std::int64_t blocks, int count);

// A row of `blocks` blocks decoded to f32 (the prefill GEMM's blocks of rows).
using RowDecoder = void (*)(const std::uint8_t* row, float* out, std::int64_t blocks);

// The kernel for `type` (AVX-512, else AVX2, unless switched off; else the portable one), or null for a type
// whose products stay in f32 (F32, F16, BF16): block_types.h's choice for the type.
IntegerRowDot integer_row_dot(GgufType type);
// Its several-vector twin, or null where there is none: the caller takes the vectors one by one.
IntegerRowDots integer_row_dots(GgufType type);

// Each instruction set's kernels, named for the block-type table (block_types.cpp). dot_small_block serves
// every type of KVCHAT_SMALL_BLOCK_TYPES (block_types.h), which each file instantiates.
namespace portable {
template <GgufType kType>
float dot_small_block(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks);
float dot_q4_k(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks);
float dot_q5_k(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks);
float dot_q6_k(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks);
}  // namespace portable

#if KVCHAT_HAVE_AVX2_KERNELS
// For a processor with AVX2, FMA and F16C (integer_dot_avx2.cpp, block_decode_avx2.cpp).
namespace avx2 {
template <GgufType kType>
float dot_small_block(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks);
float dot_q4_k(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks);
float dot_q5_k(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks);
float dot_q6_k(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks);
void dots_small_block_q8_0(const RowTile& tile, const QuantizedActivations* x, std::int64_t blocks, int count);
void dots_q4_k(const RowTile& tile, const QuantizedActivations* x, std::int64_t blocks, int count);
void dots_q5_k(const RowTile& tile, const QuantizedActivations* x, std::int64_t blocks, int count);
void dots_q6_k(const RowTile& tile, const QuantizedActivations* x, std::int64_t blocks, int count);
// Row decoders: the values of engine/gguf's exact decoders, except that a K-quant's d*sc*q - dmin*m may
// round once instead of twice.
void decode_q8_0(const std::uint8_t* row, float* out, std::int64_t blocks);
void decode_q4_0(const std::uint8_t* row, float* out, std::int64_t blocks);
void decode_q4_k(const std::uint8_t* row, float* out, std::int64_t blocks);
void decode_q5_k(const std::uint8_t* row, float* out, std::int64_t blocks);
void decode_q6_k(const std::uint8_t* row, float* out, std::int64_t blocks);
void decode_f16(const std::uint8_t* row, float* out, std::int64_t count);
}  // namespace avx2

// For a processor with AVX-512 F/BW/VL and VNNI (integer_dot_avx512.cpp).
namespace avx512 {
template <GgufType kType>
float dot_small_block(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks);
float dot_q4_k(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks);
float dot_q5_k(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks);
float dot_q6_k(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks);
void dots_small_block_q8_0(const RowTile& tile, const QuantizedActivations* x, std::int64_t blocks, int count);
void dots_q4_k(const RowTile& tile, const QuantizedActivations* x, std::int64_t blocks, int count);
void dots_q5_k(const RowTile& tile, const QuantizedActivations* x, std::int64_t blocks, int count);
void dots_q6_k(const RowTile& tile, const QuantizedActivations* x, std::int64_t blocks, int count);
}  // namespace avx512
#endif  // KVCHAT_HAVE_AVX2_KERNELS

}  // namespace kvchat::kernels
