// The AVX2 + FMA kernels of matvec.h (this file alone is compiled for AVX2, FMA and F16C; matvec.cpp calls
// it after use_avx2_kernels() said yes).
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "engine/kernels/isa_kernels.h"
#include "engine/kernels/vector_math_avx2.h"

#if KVCHAT_HAVE_AVX2_KERNELS
namespace kvchat::kernels::avx2 {
namespace {

// Rows up to this long are computed four at a time (see dot4_avx2).
constexpr std::int64_t kShortRowColumns = 256;
// The bytes of input vectors a product over several of them (a prompt) takes at a time.
constexpr std::int64_t kVectorChunkBytes = 256 * 1024;

// An IEEE half weight (GGUF F16): tells the loads (and the prefetch distance) that a row holds halves
// rather than bf16 values (plain std::uint16_t). Read through memcpy: the storage is the caller's
// std::uint16_t array.
struct F16Weight {
  std::uint16_t bits;
};

inline std::uint16_t bits_of(const F16Weight* w) {
  std::uint16_t bits;
  std::memcpy(&bits, w, sizeof bits);
  return bits;
}

// ---------------------------------------------------------------------------------------------
// AVX2 + FMA kernels.
//
// Each thread walks its rows one after another, so it reads its block of W as a single linear
// stream; measured on the target class (Zen, 2 cores) this beats interleaving 2 or 4 rows (several
// streams 8-32 KiB apart) by 10-25 %, because the hardware prefetcher follows one stream best. x is
// re-read per row, but it sits in L1/L2. Eight independent accumulators cover the FMA latency, and a
// software prefetch a few KiB ahead keeps enough misses in flight to reach the read bandwidth.

template <typename Weight>
struct Prefetch;
template <>
struct Prefetch<float> {
  static constexpr std::int64_t kAheadBytes = 4096;
};
template <>
struct Prefetch<std::uint16_t> {
  static constexpr std::int64_t kAheadBytes = 8192;
};
// F16 as bf16: through this loop the F16 rows read a larger share of a contiguous read than with two
// accumulators and 2 KiB ahead (DESIGN's tuning table).
template <>
struct Prefetch<F16Weight> {
  static constexpr std::int64_t kAheadBytes = 8192;
};

// The f32 and bf16 loads are vector_math_avx2.h's; F16 rows add theirs.
using kernels::load1;
using kernels::load8;
inline float load1(const F16Weight* w) { return _cvtsh_ss(bits_of(w)); }
inline __m256 load8(const F16Weight* w) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
}

// Prefetches the cache lines holding the 64 weights that the main loop reads kAheadBytes from now.
template <typename Weight>
inline void prefetch_ahead(const Weight* w) {
  const char* line = reinterpret_cast<const char*>(w) + Prefetch<Weight>::kAheadBytes;
  for (std::size_t offset = 0; offset < 64 * sizeof(Weight); offset += 64) _mm_prefetch(line + offset, _MM_HINT_T0);
}

// Horizontal sums of four vectors -> one 128-bit vector [sum(a), sum(b), sum(c), sum(d)].
inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 ab = _mm256_hadd_ps(a, b);
  const __m256 cd = _mm256_hadd_ps(c, d);
  const __m256 abcd = _mm256_hadd_ps(ab, cd);
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

// dot(W row, x).
template <typename Weight>
inline float dot_row_avx2(const Weight* w, std::int64_t cols, const float* x) {
  __m256 acc[8];
  for (__m256& a : acc) a = _mm256_setzero_ps();
  std::int64_t c = 0;
  for (; c + 64 <= cols; c += 64) {
    prefetch_ahead(w + c);
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(load8(w + c + 8 * j), _mm256_loadu_ps(x + c + 8 * j), acc[j]);
  }
  return finish_dot_row(acc, w, x, cols);
}

// Four consecutive rows against one vector: out[k] = dot(W[row + k], x). For short rows (tiny
// models), where the matrix is in cache and the per-row reduction would dominate: the four
// horizontal sums share one reduction.
template <typename Weight>
inline __m128 dot4_avx2(const Weight* w0, std::int64_t cols, const float* x) {
  const Weight* w1 = w0 + cols;
  const Weight* w2 = w1 + cols;
  const Weight* w3 = w2 + cols;
  __m256 a0 = _mm256_setzero_ps(), b0 = _mm256_setzero_ps();
  __m256 a1 = _mm256_setzero_ps(), b1 = _mm256_setzero_ps();
  __m256 a2 = _mm256_setzero_ps(), b2 = _mm256_setzero_ps();
  __m256 a3 = _mm256_setzero_ps(), b3 = _mm256_setzero_ps();
  std::int64_t c = 0;
  for (; c + 16 <= cols; c += 16) {
    const __m256 xa = _mm256_loadu_ps(x + c);
    const __m256 xb = _mm256_loadu_ps(x + c + 8);
    a0 = _mm256_fmadd_ps(load8(w0 + c), xa, a0);
    b0 = _mm256_fmadd_ps(load8(w0 + c + 8), xb, b0);
    a1 = _mm256_fmadd_ps(load8(w1 + c), xa, a1);
    b1 = _mm256_fmadd_ps(load8(w1 + c + 8), xb, b1);
    a2 = _mm256_fmadd_ps(load8(w2 + c), xa, a2);
    b2 = _mm256_fmadd_ps(load8(w2 + c + 8), xb, b2);
    a3 = _mm256_fmadd_ps(load8(w3 + c), xa, a3);
    b3 = _mm256_fmadd_ps(load8(w3 + c + 8), xb, b3);
  }
  if (c + 8 <= cols) {
    const __m256 xa = _mm256_loadu_ps(x + c);
    a0 = _mm256_fmadd_ps(load8(w0 + c), xa, a0);
    a1 = _mm256_fmadd_ps(load8(w1 + c), xa, a1);
    a2 = _mm256_fmadd_ps(load8(w2 + c), xa, a2);
    a3 = _mm256_fmadd_ps(load8(w3 + c), xa, a3);
    c += 8;
  }
  __m128 sums = hsum4(_mm256_add_ps(a0, b0), _mm256_add_ps(a1, b1), _mm256_add_ps(a2, b2), _mm256_add_ps(a3, b3));
  if (c < cols) {
    float t0 = 0.f, t1 = 0.f, t2 = 0.f, t3 = 0.f;
    for (; c < cols; ++c) {
      t0 += load1(w0 + c) * x[c];
      t1 += load1(w1 + c) * x[c];
      t2 += load1(w2 + c) * x[c];
      t3 += load1(w3 + c) * x[c];
    }
    sums = _mm_add_ps(sums, _mm_setr_ps(t0, t1, t2, t3));
  }
  return sums;
}

// dot(W row, x_k) for four vectors x_0..x_3 at stride `ldx`: each weight load feeds four FMAs.
template <typename Weight>
inline void dot_row_x4_avx2(const Weight* w, std::int64_t cols, const float* x, std::int64_t ldx, float* out) {
  __m256 acc[4][2];
  for (auto& pair : acc) pair[0] = pair[1] = _mm256_setzero_ps();
  std::int64_t c = 0;
  for (; c + 16 <= cols; c += 16) {
    if ((c & 63) == 0) prefetch_ahead(w + c);
    const __m256 w0 = load8(w + c);
    const __m256 w1 = load8(w + c + 8);
    for (int k = 0; k < 4; ++k) {
      acc[k][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + k * ldx + c), acc[k][0]);
      acc[k][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + k * ldx + c + 8), acc[k][1]);
    }
  }
  for (; c + 8 <= cols; c += 8) {
    const __m256 w0 = load8(w + c);
    for (int k = 0; k < 4; ++k) acc[k][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + k * ldx + c), acc[k][0]);
  }
  for (int k = 0; k < 4; ++k) out[k] = horizontal_sum(_mm256_add_ps(acc[k][0], acc[k][1]));
  for (; c < cols; ++c) {
    const float weight = load1(w + c);
    for (int k = 0; k < 4; ++k) out[k] += weight * x[k * ldx + c];
  }
}

// Short rows (up to kShortRowColumns) four at a time with dot4_avx2, for each of n vectors, from row_begin while
// four remain; returns the first row left (row_begin when the rows are not short). Both the matvec and the
// row-exact products start so, which keeps their bits equal.
template <typename Weight>
std::int64_t short_rows_avx2(const Weight* weight, const float* x, float* y, std::int64_t n, std::int64_t rows,
                             std::int64_t cols, const float* bias, std::int64_t row_begin, std::int64_t row_end) {
  std::int64_t r = row_begin;
  if (cols > kShortRowColumns) return r;
  for (; r + 4 <= row_end; r += 4) {
    const Weight* w = weight + r * cols;
    for (std::int64_t i = 0; i < n; ++i) {
      __m128 sums = dot4_avx2(w, cols, x + i * cols);
      if (bias) sums = _mm_add_ps(sums, _mm_loadu_ps(bias + r));
      _mm_storeu_ps(y + i * rows + r, sums);
    }
  }
  return r;
}

// Rows [row_begin, row_end) of Y = X W^T for n vectors; n == 1 is the matvec. With several vectors
// the row is read from memory once and re-read from L1/L2 for each group of four.
template <typename Weight>
void matmul_rows_avx2_chunk(const Weight* weight, const float* x, float* y, std::int64_t n, std::int64_t rows,
                            std::int64_t cols, const float* bias, std::int64_t row_begin, std::int64_t row_end) {
  std::int64_t r = short_rows_avx2(weight, x, y, n, rows, cols, bias, row_begin, row_end);
  for (; r < row_end; ++r) {
    const Weight* w = weight + r * cols;
    const float b = bias ? bias[r] : 0.f;
    std::int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
      float sums[4];
      dot_row_x4_avx2(w, cols, x + i * cols, cols, sums);
      for (int k = 0; k < 4; ++k) y[(i + k) * rows + r] = sums[k] + b;
    }
    for (; i < n; ++i) y[i * rows + r] = dot_row_avx2(w, cols, x + i * cols) + b;
  }
}

// dot(W row, x_k) for Count (at most four) vectors at stride `ldx`, each summed exactly as dot_row_avx2 sums one:
// the same eight accumulators (accumulator j takes columns 8j .. 8j + 7 of every 64, then j = 0 the 8-column
// tail), the same tree and scalar tail, so products over several rows equal their one-row products to the bit
// (verified drafts, a batch of sequences). The eight accumulators of several vectors do not fit the registers:
// they live in `state` [Count][8] between calls, and each call adds the 64-column chunks [begin, end) to them,
// PerPass accumulators at a time (a pass over the row's columns there, from L1 after the first), so that each
// weight load serves every vector and Count x PerPass independent sums stay in registers.
template <int Count, int PerPass, typename Weight>
inline void accumulate_exact_avx2(const Weight* w, const float* x, std::int64_t ldx, std::int64_t begin,
                                  std::int64_t end, __m256 (*state)[8]) {
  static_assert(8 % PerPass == 0, "the eight accumulators split into whole passes");
  for (int first = 0; first < 8; first += PerPass) {
    __m256 acc[Count][PerPass];
    for (int k = 0; k < Count; ++k)
      for (int a = 0; a < PerPass; ++a) acc[k][a] = state[k][first + a];
    for (std::int64_t c = begin; c < end; c += 64) {
      if (first == 0) prefetch_ahead(w + c);
      for (int a = 0; a < PerPass; ++a) {
        const std::int64_t column = c + 8 * (first + a);
        const __m256 weight = load8(w + column);
        for (int k = 0; k < Count; ++k)
          acc[k][a] = _mm256_fmadd_ps(weight, _mm256_loadu_ps(x + k * ldx + column), acc[k][a]);
      }
    }
    for (int k = 0; k < Count; ++k)
      for (int a = 0; a < PerPass; ++a) state[k][first + a] = acc[k][a];
  }
}

// The end of dot_row_avx2 for each vector's accumulators in `state` (every 64-column chunk added).
template <int Count, typename Weight>
inline void finish_exact_avx2(const Weight* w, std::int64_t cols, const float* x, std::int64_t ldx, __m256 (*state)[8],
                              float* out) {
  for (int k = 0; k < Count; ++k) out[k] = finish_dot_row(state[k], w, x + k * ldx, cols);
}

// Vectors per group (eight in one pass would need eight loads of x per weight: the load ports bind), rows per
// block and columns per segment: when a group's activations pass kExactL1Bytes, a block's rows take a segment of
// columns each before the next segment, so the activations there (at most 4 x 1,024 floats, 16 KiB) stay in L1
// for all of the block's rows instead of coming from L2 for every row (what bound long rows, such as the down
// projection's 8,192 columns). Smaller ones go row by row, the rows one stream, as the matvec reads them.
constexpr int kExactGroup = 4;
constexpr std::int64_t kExactBlockRows = 16;
constexpr std::int64_t kExactSegmentColumns = 1024;
constexpr std::int64_t kExactL1Bytes = 16 * 1024;

// Rows [row_begin, row_end) of Y = X W^T for Count vectors at X (stride cols), Y rows at stride `rows`.
template <int Count, int PerPass, typename Weight>
void exact_rows_group_avx2(const Weight* weight, const float* x, float* y, std::int64_t rows, std::int64_t cols,
                           const float* bias, std::int64_t row_begin, std::int64_t row_end) {
  const std::int64_t chunked = cols / 64 * 64;
  const bool segmented = Count * cols * static_cast<std::int64_t>(sizeof(float)) > kExactL1Bytes;
  const std::int64_t segment = segmented ? kExactSegmentColumns : std::max<std::int64_t>(chunked, 64);
  const std::int64_t block_rows = segmented ? kExactBlockRows : 1;
  __m256 state[kExactBlockRows][Count][8];
  for (std::int64_t block = row_begin; block < row_end; block += block_rows) {
    const std::int64_t count = std::min(block_rows, row_end - block);
    for (std::int64_t r = 0; r < count; ++r)
      for (int k = 0; k < Count; ++k)
        for (__m256& a : state[r][k]) a = _mm256_setzero_ps();
    for (std::int64_t begin = 0; begin < chunked; begin += segment) {
      const std::int64_t end = std::min(chunked, begin + segment);
      for (std::int64_t r = 0; r < count; ++r)
        accumulate_exact_avx2<Count, PerPass>(weight + (block + r) * cols, x, cols, begin, end, state[r]);
    }
    for (std::int64_t r = 0; r < count; ++r) {
      float sums[Count];
      finish_exact_avx2<Count>(weight + (block + r) * cols, cols, x, cols, state[r], sums);
      const float b = bias ? bias[block + r] : 0.f;
      for (int k = 0; k < Count; ++k) y[k * rows + block + r] = sums[k] + b;
    }
  }
}

template <typename Weight>
void exact_rows_avx2(const Weight* weight, const float* x, float* y, std::int64_t count, std::int64_t rows,
                     std::int64_t cols, const float* bias, std::int64_t row_begin, std::int64_t row_end) {
  switch (count) {
    case 1: return exact_rows_group_avx2<1, 8>(weight, x, y, rows, cols, bias, row_begin, row_end);
    case 2: return exact_rows_group_avx2<2, 4>(weight, x, y, rows, cols, bias, row_begin, row_end);
    case 3: return exact_rows_group_avx2<3, 2>(weight, x, y, rows, cols, bias, row_begin, row_end);
    default: return exact_rows_group_avx2<4, 2>(weight, x, y, rows, cols, bias, row_begin, row_end);
  }
}

// Rows [row_begin, row_end) of Y = X W^T for n vectors, every Y[i] equal to the matvec of X[i] alone (n == 1 of
// matmul_rows_avx2_chunk): short rows four at a time with dot4_avx2 as the matvec does, longer ones in groups of
// kExactGroup vectors through exact_rows_avx2.
template <typename Weight>
void matmul_rows_exact_avx2(const Weight* weight, const float* x, float* y, std::int64_t n, std::int64_t rows,
                            std::int64_t cols, const float* bias, std::int64_t row_begin, std::int64_t row_end) {
  std::int64_t r = short_rows_avx2(weight, x, y, n, rows, cols, bias, row_begin, row_end);
  if (r == row_end) return;
  for (std::int64_t i = 0; i < n; i += kExactGroup)
    exact_rows_avx2(weight, x + i * cols, y + i * rows, std::min<std::int64_t>(kExactGroup, n - i), rows, cols, bias, r,
                    row_end);
}

// As above for any n: the vectors a chunk at a time (a multiple of four, about kVectorChunkBytes of x),
// so that the chunk stays in L2 while the block's rows pass instead of coming from memory for each row.
template <typename Weight>
void matmul_rows_avx2(const Weight* weight, const float* x, float* y, std::int64_t n, std::int64_t rows,
                      std::int64_t cols, const float* bias, std::int64_t row_begin, std::int64_t row_end) {
  const std::int64_t chunk =
      std::max<std::int64_t>(4, kVectorChunkBytes / (4 * std::max<std::int64_t>(cols, 1)) / 4 * 4);
  for (std::int64_t first = 0; first < n; first += chunk)
    matmul_rows_avx2_chunk(weight, x + first * cols, y + first * rows, std::min(chunk, n - first), rows, cols, bias,
                           row_begin, row_end);
}

}  // namespace

float dot_f32(const float* a, const float* b, std::int64_t n) { return dot_row_avx2(a, n, b); }

float dot_f16(const std::uint16_t* w, const float* x, std::int64_t n) {
  return dot_row_avx2(reinterpret_cast<const F16Weight*>(w), n, x);
}

void matmul_rows(const float* weight, const float* x, float* y, std::int64_t n, std::int64_t rows, std::int64_t cols,
                 const float* bias, std::int64_t row_begin, std::int64_t row_end) {
  matmul_rows_avx2(weight, x, y, n, rows, cols, bias, row_begin, row_end);
}

void matmul_rows(const std::uint16_t* weight, const float* x, float* y, std::int64_t n, std::int64_t rows,
                 std::int64_t cols, const float* bias, std::int64_t row_begin, std::int64_t row_end) {
  matmul_rows_avx2(weight, x, y, n, rows, cols, bias, row_begin, row_end);
}

void matmul_rows_exact(const float* weight, const float* x, float* y, std::int64_t n, std::int64_t rows,
                       std::int64_t cols, const float* bias, std::int64_t row_begin, std::int64_t row_end) {
  matmul_rows_exact_avx2(weight, x, y, n, rows, cols, bias, row_begin, row_end);
}

void matmul_rows_exact(const std::uint16_t* weight, const float* x, float* y, std::int64_t n, std::int64_t rows,
                       std::int64_t cols, const float* bias, std::int64_t row_begin, std::int64_t row_end) {
  matmul_rows_exact_avx2(weight, x, y, n, rows, cols, bias, row_begin, row_end);
}

}  // namespace kvchat::kernels::avx2
#endif  // KVCHAT_HAVE_AVX2_KERNELS
