#include "engine/model/linear.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "engine/compute/compute_options.h"
#include "engine/gguf/dequantize.h"
#include "engine/kernels/activation_quantization.h"
#include "engine/kernels/bf16.h"
#include "engine/kernels/bf16_packed.h"
#include "engine/kernels/matvec.h"
#include "engine/kernels/thread_pool.h"

namespace kvchat {

// The streaming kernels take the rows kGroupRows at a time, one pass over W each.
constexpr std::int64_t kGroupRows = 4;
// A prefill product decodes a quantized matrix into f32 blocks of about this many bytes for sgemm: the
// whole matrix at once would be an lm_head of a gigabyte.
constexpr std::int64_t kDecodedBlockBytes = 32 << 20;
// A prompt's product on the engine's threads widens or decodes blocks of W's rows, one sgemm each, at most this many
// bytes as f32 (bounding each thread's buffer, e.g. for an lm_head over every prompt row).
constexpr std::int64_t kGemmBlockBytes = 64 << 20;

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

// C [m, n] (row stride ldc) = A [m, k] B^T with B [n, k], both row-major, through the BLAS that LibTorch calls
// (found at run time; null where it has no C interface). Runs on the calling thread while OpenBLAS has one thread.
using RowMajorGemm = void (*)(const float* a, const float* b, float* c, std::int64_t m, std::int64_t n, std::int64_t k,
                              std::int64_t ldc);
RowMajorGemm blas_gemm() {
  using Sgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*, int);
  static const auto sgemm = reinterpret_cast<Sgemm>(dlsym(RTLD_DEFAULT, "cblas_sgemm"));
  if (!sgemm) return nullptr;
  return
      [](const float* a, const float* b, float* c, std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t ldc) {
        constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;  // CBLAS's enumerations
        sgemm(kRowMajor, kNoTrans, kTrans, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0f, a,
              static_cast<int>(k), b, static_cast<int>(k), 0.0f, c, static_cast<int>(ldc));
      };
}

// A prompt's product y [rows, out] = x W^T (+ b) on the engine's own threads. They claim blocks of W's rows; each
// multiplies the prompt by its block with a single-threaded sgemm that writes the block's columns of y in place,
// after widening (bf16) or decoding (a GGUF type) the block into a buffer of its own, small enough to stay in cache.
// Before, OpenBLAS's threads ran the product and spun in sched_yield through the rest of the forward beside the
// engine's threads, and a bf16 matrix was widened whole (through memory) before it (DESIGN: dense prompts).
void blocked_gemm_forward(const Linear& linear, RowMajorGemm gemm, const float* x, std::int64_t rows, float* y) {
  const std::int64_t in = linear.in_features(), out = linear.out_features();
  const bool quantized = linear.is_quantized();
  // A block type's products take its rounded input on every path (a prompt and its decode steps agree).
  const kernels::ActivationRounding rounding =
      quantized ? kernels::activation_rounding(linear.quantized.view.type) : kernels::ActivationRounding::None;
  std::vector<float> rounded;
  if (rounding != kernels::ActivationRounding::None) {
    rounded.resize(static_cast<std::size_t>(rows * in));
    kernels::round_activations(rounding, x, rows, in, rounded.data());
    x = rounded.data();
  }
  kernels::ThreadPool& pool = kernels::current_thread_pool();
  const std::int64_t threads = pool.size();
  // Every block's sgemm packs all the prompt's rows again (as large as W itself for a feed-forward's down
  // product), so the blocks are as few as keep the threads finishing together: two per thread, whatever the
  // cache sizes (widening a block through memory costs less than packing the prompt again; DESIGN: dense prompts).
  std::int64_t block = (out + 2 * threads - 1) / (2 * threads);
  block = std::min(block, std::max<std::int64_t>(kGemmBlockBytes / (in * 4), 1));
  block = std::max<std::int64_t>((block + 15) / 16 * 16, 16);
  const float* bias = linear.bias_data();
  pool.parallel_for_blocks(
      out,
      [&](std::int64_t begin, std::int64_t end) {
        const std::int64_t count = end - begin;
        const float* weights = nullptr;
        if (quantized) {
          float* decoded = thread_buffer(count * in);
          kernels::dequantize_rows(linear.quantized.view, begin, count, decoded);
          weights = decoded;
        } else if (linear.weight.scalar_type() == at::kBFloat16) {
          float* widened = thread_buffer(count * in);
          kernels::bf16_to_f32(
              reinterpret_cast<const std::uint16_t*>(linear.weight.data_ptr<at::BFloat16>()) + begin * in, widened,
              count * in);
          weights = widened;
        } else {
          weights = linear.weight.data_ptr<float>() + begin * in;
        }
        gemm(x, weights, y + begin, rows, count, in, out);
        if (bias)
          for (std::int64_t r = 0; r < rows; ++r)
            for (std::int64_t c = begin; c < end; ++c) y[r * out + c] += bias[c];
      },
      block);
}

// Prefill over a quantized matrix: blocks of rows decoded to f32 (in parallel), each block one sgemm.
// With the fast kernels on, the input is rounded as the decode kernels round it (a block type's
// products are W x^ on every path), so a prompt and the same tokens decoded one by one agree.
// (The path with the kernels off, and where the BLAS has no C interface.)
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

bool Linear::rounds_input_to_bf16() const {
  return bf16_packed.defined() && fast_kernels_enabled() && kernels::bf16_packed_available();
}

void Linear::pack_bf16_rows(const std::function<void(const void* data, std::size_t bytes)>& packed_rows) {
  if (is_quantized() || weight.scalar_type() != at::kBFloat16 || !weight.is_contiguous() ||
      !kernels::bf16_packed_available())
    return;
  const std::int64_t out = out_features(), in = in_features();
  bf16_packed = at::empty({kernels::bf16_packed_matrix_words(out, in)}, at::kInt);
  const auto* rows = reinterpret_cast<const std::uint16_t*>(weight.data_ptr<at::BFloat16>());
  auto* packed = reinterpret_cast<std::uint32_t*>(bf16_packed.data_ptr<std::int32_t>());
  const std::int64_t tiles = (out + kernels::kBf16TileRows - 1) / kernels::kBf16TileRows;
  // Blocks of 64 tiles (2,048 rows), each handed to packed_rows once done.
  kernels::current_thread_pool().parallel_for_blocks(
      tiles,
      [&](std::int64_t begin, std::int64_t end) {
        kernels::bf16_pack_matrix(rows, out, in, begin, end - begin, packed);
        if (packed_rows) {
          const std::int64_t first = begin * kernels::kBf16TileRows;
          const std::int64_t last = std::min(out, end * kernels::kBf16TileRows);
          packed_rows(rows + first * in, static_cast<std::size_t>((last - first) * in) * sizeof(std::uint16_t));
        }
      },
      64);
}

void bf16_packed_forward(const std::pair<const Linear*, float*>* products, std::size_t count, const float* x,
                         std::int64_t rows) {
  const std::int64_t in = products[0].first->in_features();
  thread_local std::vector<std::uint32_t> input;
  input.resize(static_cast<std::size_t>(kernels::bf16_packed_input_words(rows, in)));
  std::uint32_t* packed_input = input.data();
  kernels::ThreadPool& pool = kernels::current_thread_pool();
  const std::int64_t groups = (rows + kernels::kBf16InputGroupRows - 1) / kernels::kBf16InputGroupRows;
  if (groups == 1) {
    kernels::bf16_pack_input(x, rows, in, 0, rows, packed_input);
  } else {
    pool.parallel_for(groups, [&](std::int64_t begin, std::int64_t end) {
      const std::int64_t first = begin * kernels::kBf16InputGroupRows;
      kernels::bf16_pack_input(x, rows, in, first, std::min(end * kernels::kBf16InputGroupRows, rows) - first,
                               packed_input);
    });
  }
  const std::int64_t threads = pool.size();
  for (std::size_t i = 0; i < count; ++i) {
    const Linear& linear = *products[i].first;
    float* y = products[i].second;
    const std::int64_t out = linear.out_features();
    const std::int64_t tiles = (out + kernels::kBf16TileRows - 1) / kernels::kBf16TileRows;
    const auto* matrix = reinterpret_cast<const std::uint32_t*>(linear.bf16_packed.data_ptr<std::int32_t>());
    const float* bias = linear.bias_data();
    // Two blocks of tiles per thread, so that the threads finish together.
    const std::int64_t block = std::max<std::int64_t>((tiles + 2 * threads - 1) / (2 * threads), 1);
    pool.parallel_for_blocks(
        tiles,
        [&](std::int64_t begin, std::int64_t end) {
          float* scratch = thread_buffer(kernels::bf16_products_scratch_floats(end - begin));
          kernels::bf16_packed_products(packed_input, rows, in, matrix, out, begin, end - begin, y, out, scratch);
          if (bias) {
            const std::int64_t first = begin * kernels::kBf16TileRows;
            const std::int64_t last = std::min(out, end * kernels::kBf16TileRows);
            for (std::int64_t r = 0; r < rows; ++r)
              for (std::int64_t c = first; c < last; ++c) y[r * out + c] += bias[c];
          }
        },
        block);
  }
}

void Linear::forward_into(const float* x, std::int64_t rows, float* y) const {
  if (rounds_input_to_bf16()) {
    const std::pair<const Linear*, float*> product{this, y};
    return bf16_packed_forward(&product, 1, x, rows);
  }
  if (fast_kernels_enabled() && rows <= streaming_rows() && (is_quantized() || weight.is_contiguous()))
    return streaming_forward(*this, x, rows, y);
  if (fast_kernels_enabled() && (is_quantized() || weight.is_contiguous()))
    if (const RowMajorGemm gemm = blas_gemm()) return blocked_gemm_forward(*this, gemm, x, rows, y);
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
