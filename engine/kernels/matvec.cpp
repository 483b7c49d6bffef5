#include "engine/kernels/matvec.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "engine/gguf/dequantize.h"
#include "engine/kernels/cpu_features.h"
#include "engine/kernels/isa_kernels.h"

namespace kvchat::kernels {
namespace {

// Weight bytes below which a product runs inline: waking a worker costs about as much as streaming
// this much from cache, and the tiny models call these ~35 times per token.
constexpr std::int64_t kParallelMinWeightBytes = 256 * 1024;
// Threads claim rows under guided scheduling (ThreadPool::parallel_for_guided), in blocks of weight
// bytes between these bounds. Each block starts a new stream that the hardware prefetcher must ramp
// up on, so long blocks read faster (on the target class 2 MiB blocks stream 3-5 % faster than
// 256 KiB ones); blocks shrinking toward the end let the threads finish together, and claiming as
// they go lets the others take over when a core is busy with something else.
constexpr std::int64_t kMinBlockBytes = 256 * 1024;
constexpr std::int64_t kMaxBlockBytes = 2048 * 1024;
// Blocks are whole multiples of this many rows, so that two threads never write the same cache line
// of the output.
constexpr std::int64_t kRowGrain = 16;

// An IEEE half weight (GGUF F16). bf16 weights are plain std::uint16_t; this type only tells the
// portable loads which 16-bit format a row holds. Read through memcpy: the storage is the caller's
// std::uint16_t array.
struct F16Weight {
  std::uint16_t bits;
};

inline std::uint16_t bits_of(const F16Weight* w) {
  std::uint16_t bits;
  std::memcpy(&bits, w, sizeof bits);
  return bits;
}

inline float load_weight(const float* w) { return *w; }
inline float load_weight(const std::uint16_t* w) {
  const std::uint32_t bits = static_cast<std::uint32_t>(*w) << 16;
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}
inline float load_weight(const F16Weight* w) { return f16_to_f32(bits_of(w)); }

// ---------------------------------------------------------------------------------------------
// Portable fallbacks (any x86-64 or other processor). Four partial sums per row keep the adds
// independent without needing a vector unit.

template <typename Weight>
float dot_portable(const Weight* w, const float* x, std::int64_t cols) {
  float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
  std::int64_t c = 0;
  for (; c + 4 <= cols; c += 4) {
    s0 += load_weight(w + c) * x[c];
    s1 += load_weight(w + c + 1) * x[c + 1];
    s2 += load_weight(w + c + 2) * x[c + 2];
    s3 += load_weight(w + c + 3) * x[c + 3];
  }
  for (; c < cols; ++c) s0 += load_weight(w + c) * x[c];
  return (s0 + s1) + (s2 + s3);
}

template <typename Weight>
void matmul_rows_portable(const Weight* weight, const float* x, float* y, std::int64_t n, std::int64_t rows,
                          std::int64_t cols, const float* bias, std::int64_t row_begin, std::int64_t row_end) {
  for (std::int64_t r = row_begin; r < row_end; ++r) {
    const Weight* w = weight + r * cols;
    const float b = bias ? bias[r] : 0.f;
    for (std::int64_t i = 0; i < n; ++i) y[i * rows + r] = dot_portable(w, x + i * cols, cols) + b;
  }
}

// ---------------------------------------------------------------------------------------------

// Rows per block for the bounds above: (min, max), whole multiples of kRowGrain.
std::pair<std::int64_t, std::int64_t> block_rows_for(std::int64_t row_bytes) {
  auto rows_for = [&](std::int64_t bytes) { return std::max(kRowGrain, bytes / row_bytes / kRowGrain * kRowGrain); };
  return {rows_for(kMinBlockBytes), rows_for(kMaxBlockBytes)};
}

template <typename Weight>
void check_args(const char* function, const Weight* weight, const float* x, const float* y, std::int64_t n,
                std::int64_t rows, std::int64_t cols) {
  const auto fail = [&](const std::string& what) { throw std::invalid_argument(std::string(function) + ": " + what); };
  if (n < 0) fail("negative vector count n=" + std::to_string(n));
  if (rows < 0) fail("negative rows=" + std::to_string(rows));
  if (cols < 0) fail("negative cols=" + std::to_string(cols));
  if (n == 0 || rows == 0) return;
  if (y == nullptr) fail("null output for " + std::to_string(n) + "x" + std::to_string(rows));
  if (cols > 0 && (weight == nullptr || x == nullptr)) {
    fail(std::string("null ") + (weight == nullptr ? "weight" : "input") + " for rows=" + std::to_string(rows) +
         " cols=" + std::to_string(cols));
  }
}

template <typename Weight>
void matmul_rows(const Weight* weight, const float* x, float* y, std::int64_t n, std::int64_t rows, std::int64_t cols,
                 const float* bias, std::int64_t row_begin, std::int64_t row_end) {
#if KVCHAT_HAVE_AVX2_KERNELS
  // Several vectors (a short prompt): the row-exact AVX-512 kernel is also the faster one, and its rows equal decode
  // steps.
  if (use_avx512_kernels() && n > 1 && cols >= avx512::kExactMinColumns) {
    avx512::matmul_rows_exact(weight, x, y, n, rows, cols, bias, row_begin, row_end);
    return;
  }
  if (use_avx2_kernels()) {
    avx2::matmul_rows(weight, x, y, n, rows, cols, bias, row_begin, row_end);
    return;
  }
#endif
  matmul_rows_portable(weight, x, y, n, rows, cols, bias, row_begin, row_end);
}

// As matmul_rows, every row of Y equal to the matvec of its vector alone (the portable loop already is).
template <typename Weight>
void matmul_rows_exact(const Weight* weight, const float* x, float* y, std::int64_t n, std::int64_t rows,
                       std::int64_t cols, const float* bias, std::int64_t row_begin, std::int64_t row_end) {
#if KVCHAT_HAVE_AVX2_KERNELS
  if (use_avx512_kernels() && n > 1 && cols >= avx512::kExactMinColumns) {
    avx512::matmul_rows_exact(weight, x, y, n, rows, cols, bias, row_begin, row_end);
    return;
  }
  if (use_avx2_kernels()) {
    if (n == 1)
      avx2::matmul_rows(weight, x, y, n, rows, cols, bias, row_begin, row_end);
    else
      avx2::matmul_rows_exact(weight, x, y, n, rows, cols, bias, row_begin, row_end);
    return;
  }
#endif
  matmul_rows_portable(weight, x, y, n, rows, cols, bias, row_begin, row_end);
}

template <typename Weight>
void matmul_dispatch(const char* function, const Weight* weight, const float* x, float* y, std::int64_t n,
                     std::int64_t rows, std::int64_t cols, const float* bias) {
  check_args(function, weight, x, y, n, rows, cols);
  if (n == 0 || rows == 0) return;
  if (cols == 0) {
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t r = 0; r < rows; ++r) y[i * rows + r] = bias ? bias[r] : 0.f;
    return;
  }
  // One captured pointer keeps the std::function in its small-object buffer (no allocation per call).
  struct Problem {
    const Weight* weight;
    const float* x;
    float* y;
    std::int64_t n, rows, cols;
    const float* bias;
  } const problem{weight, x, y, n, rows, cols, bias};
  for_row_blocks(rows, cols * static_cast<std::int64_t>(sizeof(Weight)),
                 [p = &problem](std::int64_t begin, std::int64_t end) {
                   matmul_rows(p->weight, p->x, p->y, p->n, p->rows, p->cols, p->bias, begin, end);
                 });
}

}  // namespace

void for_row_blocks(std::int64_t rows, std::int64_t row_bytes,
                    const std::function<void(std::int64_t begin, std::int64_t end)>& body) {
  if (rows <= 0) return;
  row_bytes = std::max<std::int64_t>(row_bytes, 1);
  ThreadPool& pool = current_thread_pool();
  if (rows * row_bytes < kParallelMinWeightBytes || pool.size() == 1) {
    body(0, rows);
    return;
  }
  // Threads claim blocks of rows as they go rather than a fixed half each: when another process
  // holds one core, the other threads take over its share instead of waiting for it.
  const auto [min_rows, max_rows] = block_rows_for(row_bytes);
  pool.parallel_for_guided(rows, body, min_rows, max_rows);
}

float dot_f32(const float* a, const float* b, std::int64_t n) {
#if KVCHAT_HAVE_AVX2_KERNELS
  if (use_avx2_kernels()) return avx2::dot_f32(a, b, n);
#endif
  return dot_portable(a, b, n);
}

float dot_f16(const std::uint16_t* w, const float* x, std::int64_t n) {
  const auto* halves = reinterpret_cast<const F16Weight*>(w);
#if KVCHAT_HAVE_AVX2_KERNELS
  if (use_avx2_kernels()) return avx2::dot_f16(w, x, n);
#endif
  return dot_portable(halves, x, n);
}

void matvec_f32(const float* weight, const float* x, float* y, std::int64_t rows, std::int64_t cols,
                const float* bias) {
  matmul_dispatch("matvec_f32", weight, x, y, 1, rows, cols, bias);
}

void matvec_bf16(const std::uint16_t* weight, const float* x, float* y, std::int64_t rows, std::int64_t cols,
                 const float* bias) {
  matmul_dispatch("matvec_bf16", weight, x, y, 1, rows, cols, bias);
}

void matmul_f32_small(const float* weight, const float* x, float* y, std::int64_t n, std::int64_t rows,
                      std::int64_t cols, const float* bias) {
  matmul_dispatch("matmul_f32_small", weight, x, y, n, rows, cols, bias);
}

void matmul_bf16_small(const std::uint16_t* weight, const float* x, float* y, std::int64_t n, std::int64_t rows,
                       std::int64_t cols, const float* bias) {
  matmul_dispatch("matmul_bf16_small", weight, x, y, n, rows, cols, bias);
}

namespace {

// Several products that read the same n input vectors, as one parallel job: the threads stream every
// matrix's rows in one pass (one dispatch and one barrier instead of one per matrix). Each output row is
// the matvec of its vector alone, whatever n is.
template <typename Weight>
void shared_input_dispatch(const char* function, const SharedInputProduct<Weight>* products, int count, const float* x,
                           std::int64_t n, std::int64_t cols) {
  std::int64_t total_rows = 0;
  for (int i = 0; i < count; ++i) {
    check_args(function, products[i].weight, x, products[i].y, n, products[i].rows, cols);
    total_rows += products[i].rows;
  }
  if (n == 0) return;
  if (cols == 0) {
    for (int i = 0; i < count; ++i)
      matmul_dispatch(function, products[i].weight, x, products[i].y, n, products[i].rows, cols, products[i].bias);
    return;
  }
  struct Problem {
    const SharedInputProduct<Weight>* products;
    int count;
    const float* x;
    std::int64_t n, cols;
  } const problem{products, count, x, n, cols};
  for_row_blocks(total_rows, cols * static_cast<std::int64_t>(sizeof(Weight)),
                 [p = &problem](std::int64_t begin, std::int64_t end) {
                   // Map the block of the concatenated rows onto each product it overlaps.
                   std::int64_t offset = 0;
                   for (int i = 0; i < p->count && offset < end; ++i) {
                     const SharedInputProduct<Weight>& product = p->products[i];
                     const std::int64_t first = std::max(begin, offset), last = std::min(end, offset + product.rows);
                     if (first < last)
                       matmul_rows_exact(product.weight, p->x, product.y, p->n, product.rows, p->cols, product.bias,
                                         first - offset, last - offset);
                     offset += product.rows;
                   }
                 });
}

}  // namespace

void matvec_f32_shared_input(const SharedInputProduct<float>* products, int count, const float* x, std::int64_t cols) {
  shared_input_dispatch("matvec_f32_shared_input", products, count, x, 1, cols);
}

void matvec_bf16_shared_input(const SharedInputProduct<std::uint16_t>* products, int count, const float* x,
                              std::int64_t cols) {
  shared_input_dispatch("matvec_bf16_shared_input", products, count, x, 1, cols);
}

void matmul_f32_shared_input_exact(const SharedInputProduct<float>* products, int count, const float* x, std::int64_t n,
                                   std::int64_t cols) {
  shared_input_dispatch("matmul_f32_shared_input_exact", products, count, x, n, cols);
}

void matmul_bf16_shared_input_exact(const SharedInputProduct<std::uint16_t>* products, int count, const float* x,
                                    std::int64_t n, std::int64_t cols) {
  shared_input_dispatch("matmul_bf16_shared_input_exact", products, count, x, n, cols);
}

}  // namespace kvchat::kernels
