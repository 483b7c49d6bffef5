// The AVX-512 version of the row-exact products over several vectors (matvec.h: matmul_*_shared_input_exact, what a
// batch of sequences and a verified draft run). This file alone is compiled for AVX-512 F/BW/VL (matvec.cpp calls
// it after use_avx512_kernels() said yes).
//
// Every vector's sum is the one-vector matvec's (matvec_avx2.cpp's dot_row_avx2) to the bit: that kernel keeps
// eight 8-lane accumulators, accumulator j taking columns 8j .. 8j + 7 of every 64. Here 512-bit accumulator j holds
// the 256-bit accumulators 2j (low half) and 2j + 1 (high half), so every lane adds the same products in the same
// order; the halves are taken apart for the same tail, tree and horizontal sum. What changes is the work per
// product: one 512-bit weight load and widening serves eight vectors, and the multiply-adds run at full width.
#include <algorithm>
#include <cstdint>

#include "engine/kernels/isa_kernels.h"
#include "engine/kernels/vector_math_avx2.h"

#if KVCHAT_HAVE_AVX2_KERNELS
#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__)
#error "matvec_avx512.cpp is compiled with the AVX-512 flags (engine/CMakeLists.txt)"
#endif

namespace kvchat::kernels::avx512 {
namespace {

// As load8 (vector_math_avx2.h), sixteen weights; matvec_avx2.cpp's prefetch distances.
inline __m512 load16(const float* w) { return _mm512_loadu_ps(w); }
inline __m512 load16(const std::uint16_t* w) {
  const __m512i widened = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(widened, 16));
}
template <typename Weight>
constexpr std::int64_t kAheadBytes = sizeof(Weight) == 4 ? 4096 : 8192;
template <typename Weight>
inline void prefetch_ahead(const Weight* w) {
  const char* line = reinterpret_cast<const char*>(w) + kAheadBytes<Weight>;
  for (std::size_t offset = 0; offset < 64 * sizeof(Weight); offset += 64) _mm_prefetch(line + offset, _MM_HINT_T0);
}

// Adds the 64-column chunks [begin, end) of row w to each of Count vectors' four accumulators in `state`, PerPass
// accumulators at a time (a pass over those columns each, the row from L1 after the first), so that Count x PerPass
// sums stay in registers and each weight load serves every vector. (Two rows at a time, sharing each load of the
// vectors, measured slower here.)
template <int Count, int PerPass, typename Weight>
inline void accumulate(const Weight* w, const float* x, std::int64_t ldx, std::int64_t begin, std::int64_t end,
                       __m512 (*state)[4]) {
  static_assert(4 % PerPass == 0, "the four accumulators split into whole passes");
  for (int first = 0; first < 4; first += PerPass) {
    __m512 acc[Count][PerPass];
    for (int k = 0; k < Count; ++k)
      for (int a = 0; a < PerPass; ++a) acc[k][a] = state[k][first + a];
    for (std::int64_t c = begin; c < end; c += 64) {
      if (first == 0) prefetch_ahead(w + c);
      for (int a = 0; a < PerPass; ++a) {
        const std::int64_t column = c + 16 * (first + a);
        const __m512 weight = load16(w + column);
        for (int k = 0; k < Count; ++k)
          acc[k][a] = _mm512_fmadd_ps(weight, _mm512_loadu_ps(x + k * ldx + column), acc[k][a]);
      }
    }
    for (int k = 0; k < Count; ++k)
      for (int a = 0; a < PerPass; ++a) state[k][first + a] = acc[k][a];
  }
}

// The end of dot_row_avx2 for each vector: its eight 256-bit accumulators out of the four 512-bit ones, then
// finish_dot_row (vector_math_avx2.h), the one-vector matvec's own end.
template <int Count, typename Weight>
inline void finish(const Weight* w, std::int64_t cols, const float* x, std::int64_t ldx, __m512 (*state)[4],
                   float* out) {
  for (int k = 0; k < Count; ++k) {
    __m256 a[8];
    for (int j = 0; j < 4; ++j) {
      a[2 * j] = _mm512_castps512_ps256(state[k][j]);
      a[2 * j + 1] = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(state[k][j]), 1));
    }
    out[k] = finish_dot_row(a, w, x + k * ldx, cols);
  }
}

// As matvec_avx2.cpp: when a group's activations pass kL1Bytes, a block's rows take a segment of columns each before
// the next segment, so that the activations stay in L1 for all of the block's rows. The block and segment sizes are
// measured (8192x2048 bf16, two threads): 64 rows x 1,024 columns beat 16 x 1,024 and 32 x 512 for 8 to 64 vectors
// (DESIGN's tuning table).
constexpr std::int64_t kBlockRows = 64;
constexpr std::int64_t kSegmentColumns = 1024;
constexpr std::int64_t kL1Bytes = 32 * 1024;

template <int Count, int PerPass, typename Weight>
void rows_group(const Weight* weight, const float* x, float* y, std::int64_t rows, std::int64_t cols, const float* bias,
                std::int64_t row_begin, std::int64_t row_end) {
  const std::int64_t chunked = cols / 64 * 64;
  const bool segmented = Count * cols * static_cast<std::int64_t>(sizeof(float)) > kL1Bytes;
  const std::int64_t segment = segmented ? kSegmentColumns : std::max<std::int64_t>(chunked, 64);
  const std::int64_t block_rows = segmented ? kBlockRows : 1;
  __m512 state[kBlockRows][Count][4];
  for (std::int64_t block = row_begin; block < row_end; block += block_rows) {
    const std::int64_t count = std::min(block_rows, row_end - block);
    for (std::int64_t r = 0; r < count; ++r)
      for (int k = 0; k < Count; ++k)
        for (__m512& a : state[r][k]) a = _mm512_setzero_ps();
    for (std::int64_t begin = 0; begin < chunked; begin += segment) {
      const std::int64_t end = std::min(chunked, begin + segment);
      for (std::int64_t r = 0; r < count; ++r)
        accumulate<Count, PerPass>(weight + (block + r) * cols, x, cols, begin, end, state[r]);
    }
    for (std::int64_t r = 0; r < count; ++r) {
      float sums[Count];
      finish<Count>(weight + (block + r) * cols, cols, x, cols, state[r], sums);
      const float b = bias ? bias[block + r] : 0.f;
      for (int k = 0; k < Count; ++k) y[k * rows + block + r] = sums[k] + b;
    }
  }
}

// Up to eight vectors per pass over the rows: eight take two accumulators per pass (16 sums in registers), four or
// fewer all four.
constexpr int kGroup = 8;

template <typename Weight>
void rows_exact(const Weight* weight, const float* x, float* y, std::int64_t n, std::int64_t rows, std::int64_t cols,
                const float* bias, std::int64_t row_begin, std::int64_t row_end) {
  for (std::int64_t i = 0; i < n; i += kGroup) {
    const float* group_x = x + i * cols;
    float* group_y = y + i * rows;
    switch (std::min<std::int64_t>(kGroup, n - i)) {
      case 1: rows_group<1, 4>(weight, group_x, group_y, rows, cols, bias, row_begin, row_end); break;
      case 2: rows_group<2, 4>(weight, group_x, group_y, rows, cols, bias, row_begin, row_end); break;
      case 3: rows_group<3, 4>(weight, group_x, group_y, rows, cols, bias, row_begin, row_end); break;
      case 4: rows_group<4, 4>(weight, group_x, group_y, rows, cols, bias, row_begin, row_end); break;
      case 5: rows_group<5, 2>(weight, group_x, group_y, rows, cols, bias, row_begin, row_end); break;
      case 6: rows_group<6, 2>(weight, group_x, group_y, rows, cols, bias, row_begin, row_end); break;
      case 7: rows_group<7, 2>(weight, group_x, group_y, rows, cols, bias, row_begin, row_end); break;
      default: rows_group<8, 2>(weight, group_x, group_y, rows, cols, bias, row_begin, row_end); break;
    }
  }
}

}  // namespace

void matmul_rows_exact(const float* weight, const float* x, float* y, std::int64_t n, std::int64_t rows,
                       std::int64_t cols, const float* bias, std::int64_t row_begin, std::int64_t row_end) {
  rows_exact(weight, x, y, n, rows, cols, bias, row_begin, row_end);
}

void matmul_rows_exact(const std::uint16_t* weight, const float* x, float* y, std::int64_t n, std::int64_t rows,
                       std::int64_t cols, const float* bias, std::int64_t row_begin, std::int64_t row_end) {
  rows_exact(weight, x, y, n, rows, cols, bias, row_begin, row_end);
}

}  // namespace kvchat::kernels::avx512
#endif  // KVCHAT_HAVE_AVX2_KERNELS
