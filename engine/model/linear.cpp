#include "engine/model/linear.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <stdexcept>

#include "engine/compute/compute_options.h"
#include "engine/gguf/dequantize.h"
#include "engine/kernels/activation_quantization.h"
#include "engine/kernels/bf16.h"
#include "engine/kernels/matvec.h"

namespace kvchat {

// The streaming kernels take the rows kGroupRows at a time, one pass over W each.
constexpr std::int64_t kGroupRows = 4;
// A prefill product decodes a quantized matrix into f32 blocks of about this many bytes for sgemm: the
// whole matrix at once would be an lm_head of a gigabyte.
constexpr std::int64_t kDecodedBlockBytes = 32 << 20;

namespace {

// f32 scratch kept by the thread: a fresh buffer per product would cost a page fault and a zero fill
// per 4 KiB, about a second per prefill chunk of a 1B model.
float* thread_buffer(std::int64_t floats) {
  thread_local at::Tensor buffer;
  if (!buffer.defined() || buffer.numel() < floats) buffer = at::empty({floats}, at::kFloat);
  return buffer.data_ptr<float>();
}

void streaming_forward(const Linear& linear, const float* input, std::int64_t rows, float* output) {
  const std::int64_t in = linear.in_features(), out = linear.out_features();
  const float* bias_data = linear.bias_data();
  if (linear.is_quantized()) {
    kernels::matmul_quantized(linear.quantized.view, input, output, rows, bias_data);
    return;
  }
  const bool bf16 = linear.weight.scalar_type() == at::kBFloat16;
  // Groups of up to kGroupRows rows share one pass over W.
  for (std::int64_t first = 0; first < rows; first += kGroupRows) {
    const std::int64_t n = std::min(kGroupRows, rows - first);
    const float* in_rows = input + first * in;
    float* out_rows = output + first * out;
    if (bf16) {
      const auto* w = reinterpret_cast<const std::uint16_t*>(linear.weight.data_ptr<at::BFloat16>());
      if (n == 1)
        kernels::matvec_bf16(w, in_rows, out_rows, out, in, bias_data);
      else
        kernels::matmul_bf16_small(w, in_rows, out_rows, n, out, in, bias_data);
    } else {
      const float* w = linear.weight.data_ptr<float>();
      if (n == 1)
        kernels::matvec_f32(w, in_rows, out_rows, out, in, bias_data);
      else
        kernels::matmul_f32_small(w, in_rows, out_rows, n, out, in, bias_data);
    }
  }
}

// Prefill over a quantized matrix: blocks of rows decoded to f32 (in parallel), each block one sgemm.
// With the fast kernels on, the input is rounded as the decode kernels round it (a block type's
// products are W x^ on every path), so a prompt and the same tokens decoded one by one agree.
void quantized_gemm_forward(const Linear& linear, const at::Tensor& input, at::Tensor& output) {
  const kernels::QuantizedMatrixView& w = linear.quantized.view;
  at::Tensor x = input;
  const kernels::ActivationRounding rounding = kernels::activation_rounding(w.type);
  if (fast_kernels_enabled() && rounding != kernels::ActivationRounding::None) {
    x = at::empty_like(input, at::MemoryFormat::Contiguous);
    const at::Tensor contiguous = input.contiguous();
    kernels::round_activations(rounding, contiguous.data_ptr<float>(), x.size(0), x.size(1), x.data_ptr<float>());
  }
  const std::int64_t block_rows = std::clamp<std::int64_t>(kDecodedBlockBytes / (w.cols * 4), 1, w.rows);
  float* decoded = thread_buffer(block_rows * w.cols);
  for (std::int64_t first = 0; first < w.rows; first += block_rows) {
    const std::int64_t count = std::min(block_rows, w.rows - first);
    at::parallel_for(0, count, 16, [&](std::int64_t begin, std::int64_t end) {
      kernels::dequantize_rows(w, first + begin, end - begin, decoded + begin * w.cols);
    });
    at::Tensor block = at::from_blob(decoded, {count, w.cols}, at::kFloat);
    output.narrow(1, first, count).copy_(at::linear(x, block));
  }
  if (linear.bias.defined()) output.add_(linear.bias);
}

}  // namespace

std::int64_t Linear::out_features() const { return is_quantized() ? quantized.view.rows : weight.size(0); }
std::int64_t Linear::in_features() const { return is_quantized() ? quantized.view.cols : weight.size(1); }

std::int64_t Linear::bytes() const {
  const std::int64_t matrix =
      is_quantized() ? quantized.view.rows * quantized.view.row_bytes : static_cast<std::int64_t>(weight.nbytes());
  return matrix + (bias.defined() ? static_cast<std::int64_t>(bias.nbytes()) : 0);
}

const void* Linear::data() const { return is_quantized() ? quantized.view.data : weight.data_ptr(); }

std::string Linear::type_name() const {
  if (is_quantized()) return to_string(quantized.view.type);
  return weight.scalar_type() == at::kBFloat16 ? "bf16" : "f32";
}

std::int64_t Linear::streaming_rows() const {
  return is_quantized() || weight.scalar_type() == at::kBFloat16 ? kWidenedStreamingRows : kStreamingRows;
}

void Linear::forward_into(const float* x, std::int64_t rows, float* y) const {
  if (fast_kernels_enabled() && rows <= streaming_rows() && (is_quantized() || weight.is_contiguous()))
    return streaming_forward(*this, x, rows, y);
  const at::Tensor input = at::from_blob(const_cast<float*>(x), {rows, in_features()}, at::kFloat);
  at::Tensor output = at::from_blob(y, {rows, out_features()}, at::kFloat);
  if (is_quantized()) return quantized_gemm_forward(*this, input, output);
  at::Tensor w = weight;
  if (weight.scalar_type() == at::kBFloat16) {
    // Prefill: widen bf16 weights to f32 for sgemm (LibTorch's own bf16 matmul is much slower).
    const std::int64_t out = weight.size(0), in = weight.size(1);
    w = at::from_blob(thread_buffer(out * in), {out, in}, at::kFloat);
    if (fast_kernels_enabled() && weight.is_contiguous())
      kernels::bf16_to_f32(reinterpret_cast<const std::uint16_t*>(weight.data_ptr<at::BFloat16>()), w.data_ptr<float>(),
                           weight.numel());
    else
      w.copy_(weight);
  }
  if (bias.defined())
    at::linear_out(output, input, w, bias);
  else
    at::linear_out(output, input, w);
}

void Linear::row_into(std::int64_t row, float* out) const {
  if (is_quantized()) {
    dequantize(quantized.view.type, quantized.view.data + row * quantized.view.row_bytes, quantized.view.cols, out);
  } else if (!weight.is_contiguous()) {
    const at::Tensor values = weight[row].to(at::kFloat).contiguous();
    std::copy(values.data_ptr<float>(), values.data_ptr<float>() + values.numel(), out);
  } else if (weight.scalar_type() == at::kBFloat16) {
    kernels::bf16_to_f32(reinterpret_cast<const std::uint16_t*>(weight.data_ptr<at::BFloat16>()) + row * weight.size(1),
                         out, weight.size(1));
  } else {
    const float* values = weight.data_ptr<float>() + row * weight.size(1);
    std::copy(values, values + weight.size(1), out);
  }
}

Linear Linear::rows(std::int64_t first, std::int64_t count) const {
  if (first < 0 || count <= 0 || first + count > out_features())
    throw std::out_of_range("Linear::rows: rows " + std::to_string(first) + " + " + std::to_string(count) +
                            " outside a matrix of " + std::to_string(out_features()));
  Linear part;
  if (!is_quantized()) {
    part.weight = weight.narrow(0, first, count);  // rows of a row-major matrix: still contiguous
    return part;
  }
  part.quantized = quantized;
  part.quantized.view.data = quantized.view.data + first * quantized.view.row_bytes;
  part.quantized.view.rows = count;
  return part;
}

}  // namespace kvchat
