// bf16_gemm.h's kernel: vdpbf16ps over packed panels (as a BLAS packs them), a tile of 12 prompt rows by 32 weight
// rows in 24 accumulators. This file alone is compiled with AVX-512 BF16 (engine/CMakeLists.txt); bf16_gemm.cpp
// calls it after cpu_has_avx512_bf16() said yes.
//
// Packed input: per group of 12 rows, [pair][12] 32-bit words, a word holding a row's values 2p (low half) and
// 2p + 1 (high half), so one broadcast gives a row's pair to all sixteen lanes. Packed weights, per panel of 256
// columns and 32 rows: [pair][32] words, two 512-bit loads per pair. vdpbf16ps then adds, per lane (weight row),
// x[2p] w[2p] + x[2p + 1] w[2p + 1] to the row's f32 sum.
#include "engine/kernels/x86_intrinsics.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "engine/kernels/bf16.h"

#if defined(__GNUC__) && defined(__x86_64__)
#if !defined(__AVX512F__) || !defined(__AVX512BF16__)
#error "bf16_gemm_avx512.cpp is compiled with the AVX-512 BF16 flags (engine/CMakeLists.txt)"
#endif

namespace kvchat::kernels::avx512 {
namespace {

constexpr int kGroupRows = 12;             // prompt rows per tile (24 accumulators with two 16-lane weight vectors)
constexpr int kTileColumns = 32;           // weight rows per tile
constexpr std::int64_t kPanelPairs = 128;  // 256 columns: a panel of weights is 16 KiB, in L1

std::uint32_t pair_word(const float* row, std::int64_t cols, std::int64_t pair) {
  const std::int64_t k = 2 * pair;
  const std::uint32_t low = k < cols ? float_to_bf16(row[k]) : 0u;
  const std::uint32_t high = k + 1 < cols ? float_to_bf16(row[k + 1]) : 0u;
  return low | (high << 16);
}
std::uint32_t pair_word(const std::uint16_t* row, std::int64_t cols, std::int64_t pair) {
  const std::int64_t k = 2 * pair;
  const std::uint32_t low = k < cols ? row[k] : 0u;
  const std::uint32_t high = k + 1 < cols ? row[k + 1] : 0u;
  return low | (high << 16);
}

// 16 x 16 words: rows[i] lane j -> out[j] lane i.
void transpose16(__m512i rows[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(rows[2 * i], rows[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(rows[2 * i], rows[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    rows[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    rows[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    rows[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    rows[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int i : {0, 1, 2, 3, 8, 9, 10, 11}) {
    t[i] = _mm512_shuffle_i32x4(rows[i], rows[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_i32x4(rows[i], rows[i + 4], 0xDD);
  }
  for (int i = 0; i < 8; ++i) {
    rows[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    rows[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xDD);
  }
}

// Sixteen pair words of a row from pair `pair` on: straight from memory where the row has them all.
template <typename Value>
__m512i row_words(const Value* row, std::int64_t cols, std::int64_t pair) {
  if (row == nullptr) return _mm512_setzero_si512();
  if (2 * (pair + 16) <= cols) {
    if constexpr (sizeof(Value) == 4)  // 32 floats to 32 bf16 in order (low half: the first sixteen)
      return reinterpret_cast<__m512i>(
          _mm512_cvtne2ps_pbh(_mm512_loadu_ps(row + 2 * pair + 16), _mm512_loadu_ps(row + 2 * pair)));
    else
      return _mm512_loadu_si512(row + 2 * pair);
  }
  alignas(64) std::uint32_t words[16];
  for (int i = 0; i < 16; ++i) words[i] = pair_word(row, cols, pair + i);
  return _mm512_load_si512(words);
}

// Pairs 0 .. pairs - 1 of 16 rows (null: a zero row), transposed: out[p * stride + i] for row i, `lanes` rows
// stored (masked).
template <typename Value>
void pack_transposed(const Value* const rows[16], std::int64_t cols, std::int64_t first_pair, std::int64_t pairs,
                     std::uint32_t* out, std::int64_t stride, int lanes) {
  const __mmask16 mask = static_cast<__mmask16>((1u << lanes) - 1u);
  for (std::int64_t p = 0; p < pairs; p += 16) {
    __m512i block[16];
    for (int i = 0; i < 16; ++i) block[i] = row_words(rows[i], cols, first_pair + p);
    transpose16(block);
    const std::int64_t count = std::min<std::int64_t>(16, pairs - p);
    for (std::int64_t j = 0; j < count; ++j) _mm512_mask_storeu_epi32(out + (p + j) * stride, mask, block[j]);
  }
}

template <int Rows>
inline void tile(const std::uint32_t* a, const std::uint32_t* b, std::int64_t pairs, float* c, std::int64_t ldc,
                 bool first, __mmask16 mask0, __mmask16 mask1) {
  __m512 sum0[Rows], sum1[Rows];
#pragma GCC unroll 12
  for (int i = 0; i < Rows; ++i) {
    sum0[i] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask0, c + i * ldc);
    sum1[i] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask1, c + i * ldc + 16);
  }
  for (std::int64_t p = 0; p < pairs; ++p) {
    const __m512bh w0 = reinterpret_cast<__m512bh>(_mm512_load_si512(b + p * kTileColumns));
    const __m512bh w1 = reinterpret_cast<__m512bh>(_mm512_load_si512(b + p * kTileColumns + 16));
#pragma GCC unroll 12
    for (int i = 0; i < Rows; ++i) {
      const __m512bh x = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(a[p * Rows + i])));
      sum0[i] = _mm512_dpbf16_ps(sum0[i], x, w0);
      sum1[i] = _mm512_dpbf16_ps(sum1[i], x, w1);
    }
  }
#pragma GCC unroll 12
  for (int i = 0; i < Rows; ++i) {
    _mm512_mask_storeu_ps(c + i * ldc, mask0, sum0[i]);
    _mm512_mask_storeu_ps(c + i * ldc + 16, mask1, sum1[i]);
  }
}

}  // namespace

void bf16_gemm_pack_input(const float* x, std::int64_t rows, std::int64_t cols, std::int64_t first_row,
                          std::int64_t count, std::uint32_t* packed) {
  const std::int64_t pairs = (cols + 1) / 2;
  for (std::int64_t group = first_row; group < first_row + count; group += kGroupRows) {
    const float* row_of[16] = {};
    for (int i = 0; i < kGroupRows; ++i)
      if (group + i < rows) row_of[i] = x + (group + i) * cols;
    pack_transposed(row_of, cols, 0, pairs, packed + group * pairs, kGroupRows, kGroupRows);
  }
}

void bf16_gemm_rows(const std::uint32_t* packed, std::int64_t rows, std::int64_t cols, const std::uint16_t* w,
                    std::int64_t out, float* y, std::int64_t ldy, float* scratch) {
  const std::int64_t pairs = (cols + 1) / 2;
  const std::int64_t groups = (rows + kGroupRows - 1) / kGroupRows;
  const std::int64_t full_groups = rows / kGroupRows;
  alignas(64) thread_local std::uint32_t panel[kPanelPairs * kTileColumns];
  // The last group's rows past `rows` have no room in y: that group's sums go to the caller's scratch.
  const std::int64_t tail_columns = (out + kTileColumns - 1) / kTileColumns * kTileColumns;
  float* tail_store = scratch;
  for (std::int64_t first_pair = 0; first_pair < pairs; first_pair += kPanelPairs) {
    const std::int64_t panel_pairs = std::min(kPanelPairs, pairs - first_pair);
    for (std::int64_t column = 0; column < out; column += kTileColumns) {
      const std::int64_t width = std::min<std::int64_t>(kTileColumns, out - column);
      for (int half = 0; half < 2; ++half) {
        const std::uint16_t* row_of[16] = {};
        for (int i = 0; i < 16; ++i)
          if (half * 16 + i < width) row_of[i] = w + (column + half * 16 + i) * cols;
        pack_transposed(row_of, cols, first_pair, panel_pairs, panel + half * 16, kTileColumns, 16);
      }
      const auto mask0 = static_cast<__mmask16>(width >= 16 ? 0xffffu : (1u << width) - 1u);
      const auto mask1 = static_cast<__mmask16>(width >= 32 ? 0xffffu : width > 16 ? (1u << (width - 16)) - 1u : 0u);
      const bool first = first_pair == 0;
      for (std::int64_t group = 0; group < groups; ++group) {
        const std::uint32_t* a = packed + group * kGroupRows * pairs + first_pair * kGroupRows;
        if (group < full_groups)
          tile<kGroupRows>(a, panel, panel_pairs, y + group * kGroupRows * ldy + column, ldy, first, mask0, mask1);
        else
          tile<kGroupRows>(a, panel, panel_pairs, tail_store + column, tail_columns, first, mask0, mask1);
      }
    }
  }
  for (std::int64_t row = full_groups * kGroupRows; row < rows; ++row)
    std::memcpy(y + row * ldy, tail_store + (row - full_groups * kGroupRows) * tail_columns,
                static_cast<std::size_t>(out) * sizeof(float));
}

}  // namespace kvchat::kernels::avx512

#endif
