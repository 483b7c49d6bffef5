#include "engine/linear.h"

#include <algorithm>

#include "engine/compute_options.h"
#include "engine/kernels/bf16.h"
#include "engine/kernels/matvec.h"

namespace kvchat {

// The streaming kernels take the rows kGroupRows at a time, one pass over W each.
constexpr std::int64_t kGroupRows = 4;

at::Tensor Linear::forward(const at::Tensor& x) const {
  const std::int64_t rows = x.size(0), in = weight.size(1), out = weight.size(0);
  const bool bf16 = weight.scalar_type() == at::kBFloat16;
  if (fast_kernels_enabled() && rows <= kStreamingRows && weight.is_contiguous()) {
    at::Tensor input = x.contiguous();
    at::Tensor output = at::empty({rows, out}, at::kFloat);
    const float* bias_data = bias.defined() ? bias.data_ptr<float>() : nullptr;
    // Groups of up to kGroupRows rows share one pass over W.
    for (std::int64_t first = 0; first < rows; first += kGroupRows) {
      const std::int64_t n = std::min(kGroupRows, rows - first);
      const float* in_rows = input.data_ptr<float>() + first * in;
      float* out_rows = output.data_ptr<float>() + first * out;
      if (bf16) {
        const auto* w = reinterpret_cast<const std::uint16_t*>(weight.data_ptr<at::BFloat16>());
        if (n == 1) kernels::matvec_bf16(w, in_rows, out_rows, out, in, bias_data);
        else kernels::matmul_bf16_small(w, in_rows, out_rows, n, out, in, bias_data);
      } else {
        const float* w = weight.data_ptr<float>();
        if (n == 1) kernels::matvec_f32(w, in_rows, out_rows, out, in, bias_data);
        else kernels::matmul_f32_small(w, in_rows, out_rows, n, out, in, bias_data);
      }
    }
    return output;
  }
  at::Tensor w = weight;
  if (bf16) {
    // Prefill: widen bf16 weights to f32 chunk by chunk for sgemm (LibTorch's own bf16 matmul is ~40x
    // slower), into a buffer kept by the thread: a fresh one per product would cost a page fault and a
    // zero fill per 4 KiB, about a second per prefill chunk of a 1B model.
    thread_local at::Tensor widened;
    if (!widened.defined() || widened.numel() < out * in) widened = at::empty({out * in}, at::kFloat);
    w = widened.narrow(0, 0, out * in).view({out, in});
    if (fast_kernels_enabled() && weight.is_contiguous())
      kernels::bf16_to_f32(reinterpret_cast<const std::uint16_t*>(weight.data_ptr<at::BFloat16>()), w.data_ptr<float>(),
                           weight.numel());
    else
      w.copy_(weight);
  }
  return bias.defined() ? at::linear(x, w, bias) : at::linear(x, w);
}

}  // namespace kvchat
