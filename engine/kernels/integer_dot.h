#pragma once
// Dot products of one row of quantized weights with the activations rounded to integers
// (activation_quantization.h): the weights' integers times the activations' integers, summed exactly
// in 32-bit integers per block of 32, then scaled once per block in f32. The result is
// sum_i w_i * x^_i, w_i the exactly dequantized weight and x^_i the rounded activation, up to f32
// rounding of the per-block terms; so, against the exact product with x,
//   |error| <= sum over activation blocks b of 0.51 * scale_b * sum_{i in b} |w_i|   (rounding of x:
//              about 1/129000 of the block's largest |x| per unit of |w|)
//            + about 1e-6 * sum_i |w_i x^_i|                                        (f32 accumulation).
// Types: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 (blocks of 32), Q4_K, Q5_K, Q6_K (super-blocks of 256). Each
// has an AVX2 kernel and a portable twin computing the same terms (integer_dot_portable.cpp); Q8_0, Q4_0,
// Q4_K, Q5_K and Q6_K also an AVX-512 one (integer_dot_avx512.cpp: the same integer sums, one multiply
// per weight instead of two).
#include <cstdint>

#include "engine/gguf/gguf_types.h"
#include "engine/kernels/activation_quantization.h"

namespace kvchat::kernels {

// dot(row, x^) for a row of `blocks` blocks of the type.
using IntegerRowDot = float (*)(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks);

// The kernel for `type` (AVX-512, else AVX2, unless switched off; else the portable twin), or null for a type whose
// products stay in f32 (F32, F16, BF16, and those without an integer kernel).
IntegerRowDot integer_row_dot(GgufType type);

// The portable twins, also for tests.
IntegerRowDot portable_integer_row_dot(GgufType type);
// The AVX2 kernels (x86-64 builds only; for a processor with AVX2, FMA and F16C).
IntegerRowDot avx2_integer_row_dot(GgufType type);
// The AVX-512 kernels (x86-64 builds only; for a processor with AVX-512 F/BW/VL), or null for a type
// that has none (Q4_1, Q5_0, Q5_1 keep the AVX2 ones). They read QuantizedActivations::values.
IntegerRowDot avx512_integer_row_dot(GgufType type);

}  // namespace kvchat::kernels
