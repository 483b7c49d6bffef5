#pragma once
// Matrix products over weights kept as a GGUF file stores them (F16, BF16, F32 or a block
// quantization: Q8_0, Q4_0, Q4_K, Q6_K, ...), for decode and short chunks. Each row is read from memory
// once. The block types multiply their stored integers by the input rounded to integers, once per
// product (integer_dot.h, activation_quantization.h: the product is W x^, x^ the rounded input, with
// the error bounds stated there); F16 has an f32 kernel; the others decode a row into a small
// per-thread buffer and take its f32 dot product. Never a whole matrix in f32.
//
// Threading, argument checks and the small-problem rule are those of matvec.h.
#include <cstdint>

#include "engine/gguf/gguf_types.h"
#include "engine/kernels/activation_quantization.h"

namespace kvchat::kernels {

// Rows of whole blocks of `type`, row r at data + r * row_bytes. Not owned.
struct QuantizedMatrixView {
  GgufType type = GgufType::F32;
  const std::uint8_t* data = nullptr;
  std::int64_t rows = 0, cols = 0;
  std::int64_t row_bytes = 0;
};

// Y[i, r] = dot(row r of W, X[i]) (+ bias[r]) for n input vectors X [n, cols] -> Y [n, rows].
// Throws std::invalid_argument for a type that cannot be decoded, or cols not a whole number of blocks.
void matmul_quantized(const QuantizedMatrixView& weight, const float* x, float* y, std::int64_t n,
                      const float* bias = nullptr);

// How products with weights of `type` round their input (activation_quantization.h; the type's record in
// block_types.h): one byte per value with a scale per block of 32 for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, per
// super-block of 256 for the K-quants, none for F32/F16/BF16 (and the types the products do not take). The
// prefill GEMM rounds its input the same way (round_activations) to compute the same products.
ActivationRounding activation_rounding(GgufType type);

// Rows [first, first + count) decoded to f32 into out [count, cols] (the prefill GEMM's blocks of
// rows): the type's row decoder (block_types.h: AVX2 for the common types, engine/gguf's exact one for the
// others). The values are those of dequantize, except that a K-quant's d*sc*q - dmin*m may round once
// instead of twice.
void dequantize_rows(const QuantizedMatrixView& weight, std::int64_t first, std::int64_t count, float* out);

// Several products with one input vector (q/k/v, gate/up), as one parallel job; the matrices may be of
// different types (a Q4_K_M file keeps some attn_v in Q6_K next to Q4_K q and k).
struct SharedInputQuantizedProduct {
  QuantizedMatrixView weight;
  float* y;
  const float* bias;  // may be null
};
void matvec_quantized_shared_input(const SharedInputQuantizedProduct* products, int count, const float* x);

}  // namespace kvchat::kernels
