#pragma once
// One weight matrix and its product: y = x W^T (+ b). The matrix stays in the type it is kept in: an
// f32 or bf16 tensor, or the blocks of a GGUF type (F16 or a quantization such as Q8_0 or Q4_K) as the
// file stores them, usually still inside the memory-mapped file. Compute and results are f32.
// forward_into() picks the implementation by the number of rows: the weight-streaming kernels for a few
// rows (decode, short chunks), LibTorch's GEMM for a prefill chunk (quantized rows are decoded to f32
// a block of rows at a time for it, never the whole model); with the kernels off, always the latter.
#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "engine/kernels/quantized_matvec.h"

namespace kvchat {

// A matrix as a GGUF file stores it: rows of whole blocks of one type.
struct QuantizedMatrix {
  kernels::QuantizedMatrixView view;  // view.data is null when the Linear holds a tensor instead
  std::shared_ptr<const void> owner;  // keeps view.data alive: the mapped file, or a buffer of copied rows
};

struct Linear {
  at::Tensor weight;          // [out, in] f32 or bf16; undefined when `quantized` holds the matrix
  QuantizedMatrix quantized;  // the matrix in a GGUF type
  at::Tensor bias;            // [out] f32, or undefined
  // A GGUF BF16 matrix where the processor has AVX-512 BF16: its rows repacked for vdpbf16ps (int32 words,
  // kernels/bf16_packed.h), and with the kernels on its products take their input rounded to bf16, as llama.cpp
  // multiplies such a matrix by bf16 activations. Every path (a decode step, a batch's rows, a prompt) sums each
  // output in the same order, so a prompt's logits equal its tokens decoded one by one. Undefined otherwise.
  at::Tensor bf16_packed;

  bool is_quantized() const { return quantized.view.data != nullptr; }
  const float* bias_data() const { return bias.defined() ? bias.data_ptr<float>() : nullptr; }  // null: none
  std::int64_t out_features() const;
  std::int64_t in_features() const;
  std::int64_t bytes() const;     // of the matrix and the bias
  const void* data() const;       // the matrix's first byte
  std::string type_name() const;  // "f32", "bf16", or the GGUF type's name ("Q4_K", "F16", ...)

  // y [rows, out] = x [rows, in] W^T (+ b), over row buffers.
  void forward_into(const float* x, std::int64_t rows, float* y) const;
  // Whether the products take the repacked bf16 rows and round their input (bf16_packed, with the kernels on).
  bool rounds_input_to_bf16() const;
  // Repacks a bf16 matrix's rows into bf16_packed where the processor can use them (else leaves it undefined).
  // `packed_rows`, if given, is told each range of the weight's bytes once it is packed (a mapped file's pages can
  // then go back while the rest is packed, so a large matrix is not held twice).
  void pack_bf16_rows(const std::function<void(const void* data, std::size_t bytes)>& packed_rows = {});
  // Up to how many rows of x forward_into() takes the weight-streaming kernels (when the kernels are on).
  std::int64_t streaming_rows() const;
  // Row `row` as f32 into out[in].
  void row_into(std::int64_t row, float* out) const;
  // Rows first .. first + count - 1 as a matrix of their own over the same storage (no copy): the parts of a
  // fused matrix (Phi-3's qkv_proj, gate_up_proj). Without a bias.
  Linear rows(std::int64_t first, std::int64_t count) const;
};

// y_i [rows, out_i] = x W_i^T (+ b_i) for matrices that share their input x [rows, in] and all round it to bf16
// (rounds_input_to_bf16): x packed once, each matrix's tiles split over the current pool's threads.
void bf16_packed_forward(const std::pair<const Linear*, float*>* products, std::size_t count, const float* x,
                         std::int64_t rows);

// Up to this many rows of x the weight-streaming kernels beat LibTorch's GEMM on f32 weights, which
// only pays off once each weight is reused enough.
constexpr std::int64_t kStreamingRows = 8;
// bf16 and GGUF-typed weights reach the GEMM only after a pass that widens every weight to f32 in
// memory, a cost the streaming kernels (which read each weight once per chunk of rows) do not pay; they
// stay ahead up to about this many rows, beyond which the GEMM pulls ahead (the measurements are in
// DESIGN.md's table of tuning constants).
constexpr std::int64_t kWidenedStreamingRows = 64;

}  // namespace kvchat
