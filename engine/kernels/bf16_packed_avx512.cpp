// bf16_packed.h's kernels. This file alone is compiled with AVX-512 BF16 (engine/CMakeLists.txt); bf16_packed.cpp
// calls it after cpu_has_avx512_bf16() said yes.
#include "engine/kernels/x86_intrinsics.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "engine/kernels/bf16.h"

#if defined(__GNUC__) && defined(__x86_64__)
#if !defined(__AVX512F__) || !defined(__AVX512BF16__)
#error "bf16_packed_avx512.cpp is compiled with the AVX-512 BF16 flags (engine/CMakeLists.txt)"
#endif

namespace kvchat::kernels::avx512 {
namespace {

constexpr int kGroupRows = 12;             // input rows per tile (24 accumulators with two 16-lane weight vectors)
constexpr int kTileColumns = 32;           // weight rows per tile
constexpr std::int64_t kPanelPairs = 128;  // 256 columns: a tile's panel of weights is 16 KiB, in L1

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
    const __m512bh w0 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b + p * kTileColumns));
    const __m512bh w1 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b + p * kTileColumns + 16));
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

// One input row (its pair words in order) against `Tiles` tiles at once (2 x Tiles independent sums in flight): the
// same sums, pair after pair from zero, as tile() makes for every row of a group.
template <int Tiles>
inline void one_row(const std::uint32_t* a, const std::uint32_t* b, std::int64_t tile_words, std::int64_t pairs,
                    float* y, const __mmask16* masks) {
  __m512 sum[2 * Tiles];
#pragma GCC unroll 8
  for (int j = 0; j < 2 * Tiles; ++j) sum[j] = _mm512_setzero_ps();
  for (std::int64_t p = 0; p < pairs; ++p) {
    const __m512bh x = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(a[p])));
#pragma GCC unroll 4
    for (int j = 0; j < Tiles; ++j) {
      const std::uint32_t* w = b + j * tile_words + p * kTileColumns;
      sum[2 * j] = _mm512_dpbf16_ps(sum[2 * j], x, reinterpret_cast<__m512bh>(_mm512_loadu_si512(w)));
      sum[2 * j + 1] = _mm512_dpbf16_ps(sum[2 * j + 1], x, reinterpret_cast<__m512bh>(_mm512_loadu_si512(w + 16)));
    }
  }
#pragma GCC unroll 4
  for (int j = 0; j < Tiles; ++j) {
    _mm512_mask_storeu_ps(y + j * kTileColumns, masks[2 * j], sum[2 * j]);
    _mm512_mask_storeu_ps(y + j * kTileColumns + 16, masks[2 * j + 1], sum[2 * j + 1]);
  }
}

void tile_masks(std::int64_t width, __mmask16& mask0, __mmask16& mask1) {
  mask0 = static_cast<__mmask16>(width >= 16 ? 0xffffu : (1u << width) - 1u);
  mask1 = static_cast<__mmask16>(width >= 32 ? 0xffffu : width > 16 ? (1u << (width - 16)) - 1u : 0u);
}

}  // namespace

void bf16_pack_matrix(const std::uint16_t* w, std::int64_t rows, std::int64_t cols, std::int64_t first_tile,
                      std::int64_t tiles, std::uint32_t* packed) {
  const std::int64_t pairs = (cols + 1) / 2;
  for (std::int64_t tile_index = first_tile; tile_index < first_tile + tiles; ++tile_index)
    for (int half = 0; half < 2; ++half) {
      const std::uint16_t* row_of[16] = {};
      for (int i = 0; i < 16; ++i) {
        const std::int64_t row = tile_index * kTileColumns + half * 16 + i;
        if (row < rows) row_of[i] = w + row * cols;
      }
      pack_transposed(row_of, cols, 0, pairs, packed + tile_index * pairs * kTileColumns + half * 16, kTileColumns, 16);
    }
}

void bf16_pack_input(const float* x, std::int64_t rows, std::int64_t cols, std::int64_t first_row, std::int64_t count,
                     std::uint32_t* packed) {
  const std::int64_t pairs = (cols + 1) / 2;
  if (rows == 1) {  // a decode step's row: its pair words in order, read by one_row()
    for (std::int64_t p = 0; p < pairs; p += 16) {
      const auto lanes = static_cast<__mmask16>(pairs - p >= 16 ? 0xffffu : (1u << (pairs - p)) - 1u);
      _mm512_mask_storeu_epi32(packed + p, lanes, row_words(x, cols, p));
    }
    return;
  }
  for (std::int64_t group = first_row; group < first_row + count; group += kGroupRows) {
    const float* row_of[16] = {};
    for (int i = 0; i < kGroupRows; ++i)
      if (group + i < rows) row_of[i] = x + (group + i) * cols;
    pack_transposed(row_of, cols, 0, pairs, packed + group * pairs, kGroupRows, kGroupRows);
  }
}

void bf16_packed_products(const std::uint32_t* input, std::int64_t rows, std::int64_t cols, const std::uint32_t* matrix,
                          std::int64_t out, std::int64_t first_tile, std::int64_t tiles, float* y, std::int64_t ldy,
                          float* scratch) {
  const std::int64_t pairs = (cols + 1) / 2, tile_words = pairs * kTileColumns;
  if (rows == 1) {
    // A decode step: its sums go to scratch (a tile's 32 columns at a time), then the real columns to y.
    for (std::int64_t t = first_tile; t < first_tile + tiles; t += 4) {
      const int count = static_cast<int>(std::min<std::int64_t>(4, first_tile + tiles - t));
      __mmask16 masks[8];
      for (int j = 0; j < 4; ++j) tile_masks(0xffff, masks[2 * j], masks[2 * j + 1]);
      const std::uint32_t* b = matrix + t * tile_words;
      float* sums = scratch + (t - first_tile) * kTileColumns;
      switch (count) {
        case 4: one_row<4>(input, b, tile_words, pairs, sums, masks); break;
        case 3: one_row<3>(input, b, tile_words, pairs, sums, masks); break;
        case 2: one_row<2>(input, b, tile_words, pairs, sums, masks); break;
        default: one_row<1>(input, b, tile_words, pairs, sums, masks); break;
      }
    }
    const std::int64_t first_column = first_tile * kTileColumns;
    const std::int64_t columns = std::min(out, (first_tile + tiles) * kTileColumns) - first_column;
    std::memcpy(y + first_column, scratch, static_cast<std::size_t>(columns) * sizeof(float));
    return;
  }
  const std::int64_t groups = (rows + kGroupRows - 1) / kGroupRows, full_groups = rows / kGroupRows;
  // The last group's rows past `rows` have no room in y: that group's sums go to scratch.
  const std::int64_t scratch_columns = tiles * kTileColumns;
  for (std::int64_t first_pair = 0; first_pair < pairs; first_pair += kPanelPairs) {
    const std::int64_t panel_pairs = std::min(kPanelPairs, pairs - first_pair);
    const bool first = first_pair == 0;
    for (std::int64_t t = first_tile; t < first_tile + tiles; ++t) {
      const std::uint32_t* b = matrix + t * tile_words + first_pair * kTileColumns;
      __mmask16 mask0, mask1;
      tile_masks(std::min<std::int64_t>(kTileColumns, out - t * kTileColumns), mask0, mask1);
      const std::int64_t column = t * kTileColumns;
      for (std::int64_t group = 0; group < groups; ++group) {
        const std::uint32_t* a = input + group * kGroupRows * pairs + first_pair * kGroupRows;
        if (group < full_groups)
          tile<kGroupRows>(a, b, panel_pairs, y + group * kGroupRows * ldy + column, ldy, first, mask0, mask1);
        else
          tile<kGroupRows>(a, b, panel_pairs, scratch + (t - first_tile) * kTileColumns, scratch_columns, first, mask0,
                           mask1);
      }
    }
  }
  const std::int64_t first_column = first_tile * kTileColumns;
  const std::int64_t columns = std::min(out, (first_tile + tiles) * kTileColumns) - first_column;
  for (std::int64_t row = full_groups * kGroupRows; row < rows; ++row)
    std::memcpy(y + row * ldy + first_column, scratch + (row - full_groups * kGroupRows) * scratch_columns,
                static_cast<std::size_t>(columns) * sizeof(float));
}

}  // namespace kvchat::kernels::avx512

#endif
