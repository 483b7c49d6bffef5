#pragma once
// Matrix-vector products for batch-1 decode. Decode reads every weight once per token, so these are
// written to stream the weight matrix at memory bandwidth: each thread of the current pool takes a
// contiguous block of rows and reads it as one linear stream (row after row, eight independent FMA
// accumulators, software prefetch ahead of the loads).
//
// All functions: W is row-major [rows, cols] (leading dimension = cols), accumulation is in float32,
// `bias` (optional, [rows]) is added to every output row. Outputs must not overlap the inputs.
// Problems smaller than a few hundred KiB of weights run inline on the calling thread, so tiny models
// pay no dispatch cost. Negative sizes or null buffers throw std::invalid_argument.
#include <cstdint>
#include <functional>

#include "engine/kernels/bf16.h"
#include "engine/kernels/thread_pool.h"

namespace kvchat::kernels {

// Runs body(begin, end) over the rows [0, rows) of a weight matrix of row_bytes per row: inline when
// the matrix is small (waking a worker costs about as much as streaming it) or the pool has one
// thread, else in guided blocks of rows claimed by the current pool's threads.
void for_row_blocks(std::int64_t rows, std::int64_t row_bytes,
                    const std::function<void(std::int64_t begin, std::int64_t end)>& body);

// sum_c a[c] * b[c] in float32.
float dot_f32(const float* a, const float* b, std::int64_t n);
// sum_c w[c] * x[c] in float32 for a row of IEEE halves (GGUF F16), widened exactly: the bf16 row loop.
float dot_f16(const std::uint16_t* w, const float* x, std::int64_t n);

// y[r] = sum_c W[r, c] * x[c] (+ bias[r])
void matvec_f32(const float* weight, const float* x, float* y, std::int64_t rows, std::int64_t cols,
                const float* bias = nullptr);
// The same with bfloat16 weights (widened exactly to float32 on load).
void matvec_bf16(const std::uint16_t* weight, const float* x, float* y, std::int64_t rows, std::int64_t cols,
                 const float* bias = nullptr);

// A few input vectors at once, reading W once: X [n, cols] row-major -> Y [n, rows] row-major,
// Y[i, r] = sum_c W[r, c] * X[i, c] (+ bias[r]). Meant for short chunks (a handful of tokens).
void matmul_f32_small(const float* weight, const float* x, float* y, std::int64_t n, std::int64_t rows,
                      std::int64_t cols, const float* bias = nullptr);
void matmul_bf16_small(const std::uint16_t* weight, const float* x, float* y, std::int64_t n, std::int64_t rows,
                       std::int64_t cols, const float* bias = nullptr);

// Several matrix-vector products with one input: y_i = W_i x (+ b_i), all W_i [rows_i, cols]. Run as one
// parallel job (one dispatch, one barrier), e.g. the q/k/v or gate/up projections of a decode step.
template <typename Weight>
struct SharedInputProduct {
  const Weight* weight;
  float* y;
  std::int64_t rows;
  const float* bias;  // may be null
};
void matvec_f32_shared_input(const SharedInputProduct<float>* products, int count, const float* x, std::int64_t cols);
void matvec_bf16_shared_input(const SharedInputProduct<std::uint16_t>* products, int count, const float* x,
                              std::int64_t cols);
// The same for n input vectors X [n, cols] (each y_i then [n, rows_i]), the matrices read once, and every output
// row equal to the bits the one-vector products above give for its vector: a forward over several rows
// (verified draft tokens, a batch of sequences) then computes each row as a decode step does.
void matmul_f32_shared_input_exact(const SharedInputProduct<float>* products, int count, const float* x, std::int64_t n,
                                   std::int64_t cols);
void matmul_bf16_shared_input_exact(const SharedInputProduct<std::uint16_t>* products, int count, const float* x,
                                    std::int64_t n, std::int64_t cols);

}  // namespace kvchat::kernels
