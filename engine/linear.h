#pragma once
// One weight matrix and its product: y = x W^T (+ b). The weights stay in the dtype they are kept in
// (f32 or bf16); compute and the result are f32. forward() picks the implementation by the number of
// rows: the weight-streaming kernels for a few rows (decode, short chunks), LibTorch's GEMM for a
// prefill chunk.
#include <ATen/ATen.h>

namespace kvchat {

struct Linear {
  at::Tensor weight;  // [out, in]
  at::Tensor bias;    // [out] or undefined
  at::Tensor forward(const at::Tensor& x) const;  // x [T, in] f32 -> [T, out] f32
};

// Up to this many rows of x the weight-streaming kernels beat LibTorch's GEMM, which only pays off
// once each weight is reused enough.
constexpr std::int64_t kStreamingRows = 8;

}  // namespace kvchat
