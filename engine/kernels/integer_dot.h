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
// has an AVX2 kernel and a portable twin computing the same integer sums (integer_dot_portable.cpp), and
// an AVX-512 VNNI one (integer_dot_avx512.cpp).
#include <cstdint>

#include "engine/gguf/gguf_types.h"
#include "engine/kernels/activation_quantization.h"
#include "engine/kernels/cpu_features.h"

namespace kvchat::kernels {

// The types with blocks of 32 values (engine/gguf/dequantize.cpp documents them), each block an f16 scale
// d first: its bytes, where its 16 bytes of nibbles (or Q8_0's 32 signed quants) start, where its 32 fifth
// bits are (Q5_0/Q5_1), the offset taken off each quant (w = d * (q - offset)) and whether an f16 min m
// follows the scale (w = d * q + m).
template <GgufType kType>
struct SmallBlockLayout;
template <>
struct SmallBlockLayout<GgufType::Q8_0> {
  static constexpr int kBytes = 34, kQuantsAt = 2, kFifthBitsAt = -1, kOffset = 0;
  static constexpr bool kMin = false;
};
template <>
struct SmallBlockLayout<GgufType::Q4_0> {
  static constexpr int kBytes = 18, kQuantsAt = 2, kFifthBitsAt = -1, kOffset = 8;
  static constexpr bool kMin = false;
};
template <>
struct SmallBlockLayout<GgufType::Q4_1> {
  static constexpr int kBytes = 20, kQuantsAt = 4, kFifthBitsAt = -1, kOffset = 0;
  static constexpr bool kMin = true;
};
template <>
struct SmallBlockLayout<GgufType::Q5_0> {
  static constexpr int kBytes = 22, kQuantsAt = 6, kFifthBitsAt = 2, kOffset = 16;
  static constexpr bool kMin = false;
};
template <>
struct SmallBlockLayout<GgufType::Q5_1> {
  static constexpr int kBytes = 24, kQuantsAt = 8, kFifthBitsAt = 4, kOffset = 0;
  static constexpr bool kMin = true;
};

// dot(row, x^) for a row of `blocks` blocks of the type.
using IntegerRowDot = float (*)(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks);

// The kernel for `type` (AVX-512, else AVX2, unless switched off; else the portable twin), or null for a type whose
// products stay in f32 (F32, F16, BF16, and those without an integer kernel).
IntegerRowDot integer_row_dot(GgufType type);

// dot(row, x^) for four activation vectors x[0..3] at once, out[v] bit-identical to what integer_row_dot(type)
// gives for x[v] (a prompt's products read each row once for several vectors; this also shares the
// weights' unpacking among them). Null where there is none: the caller takes the vectors one by one.
using IntegerRowDot4 = void (*)(const std::uint8_t* row, const QuantizedActivations* x, std::int64_t blocks,
                                float* out);
IntegerRowDot4 integer_row_dot4(GgufType type);

// The portable twins, also for tests.
IntegerRowDot portable_integer_row_dot(GgufType type);
// The AVX2 kernels (x86-64 builds only; for a processor with AVX2, FMA and F16C).
IntegerRowDot avx2_integer_row_dot(GgufType type);
// The AVX-512 kernels (x86-64 builds only; for a processor with AVX-512 F/BW/VL and VNNI), or null
// without VNNI.
IntegerRowDot avx512_integer_row_dot(GgufType type);
// The four-vector kernels (the K-quants), AVX-512 VNNI and AVX2, or null.
IntegerRowDot4 avx512_integer_row_dot4(GgufType type);
IntegerRowDot4 avx2_integer_row_dot4(GgufType type);

// A row of `blocks` blocks decoded to f32 (the prefill GEMM's blocks of rows).
using RowDecoder = void (*)(const std::uint8_t* row, float* out, std::int64_t blocks);

#if KVCHAT_HAVE_AVX2_KERNELS
// The AVX2 row decoders (block_decode_avx2.cpp): the values of engine/gguf's dequantize, except that a
// K-quant's d*sc*q - dmin*m may round once instead of twice.
namespace avx2 {
void decode_q8_0(const std::uint8_t* row, float* out, std::int64_t blocks);
void decode_q4_0(const std::uint8_t* row, float* out, std::int64_t blocks);
void decode_q4_k(const std::uint8_t* row, float* out, std::int64_t blocks);
void decode_q5_k(const std::uint8_t* row, float* out, std::int64_t blocks);
void decode_q6_k(const std::uint8_t* row, float* out, std::int64_t blocks);
void decode_f16(const std::uint8_t* row, float* out, std::int64_t count);
}  // namespace avx2
#endif

}  // namespace kvchat::kernels
