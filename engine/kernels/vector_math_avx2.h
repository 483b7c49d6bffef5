#pragma once
// Vector math shared by the AVX2 and AVX-512 kernel files (attention's softmax, the SwiGLU activation, the
// quantized products' block scales and sums). Only for the *_avx2.cpp / *_avx512.cpp files, which alone are
// compiled with those instruction sets (engine/CMakeLists.txt). Everything here has internal linkage: an
// out-of-line copy compiled in one of those files must never be the one that code of another instruction set
// (or the portable code) ends up calling.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "engine/kernels/bf16.h"
#include "engine/kernels/block_types.h"
#include "engine/kernels/cpu_features.h"
#include "engine/kernels/x86_intrinsics.h"

#if KVCHAT_HAVE_AVX2_KERNELS
#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "vector_math_avx2.h is for the *_avx2.cpp / *_avx512.cpp files, compiled with AVX2, FMA and F16C"
#endif

namespace kvchat::kernels {
namespace {

// a * b + c rounded once. Written out where two kernels must sum a tail alike: left to the compiler, `c += a * b`
// in a loop may become one multiply-add, or a vector of products rounded each and then added, depending on the
// instruction set a file is compiled for.
inline float fused_multiply_add(float a, float b, float c) {
  return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
}

// The sum of a vector's 4 floats.
inline float horizontal_sum(__m128 v) {
  const __m128 pairs = _mm_add_ps(v, _mm_movehl_ps(v, v));
  return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_shuffle_ps(pairs, pairs, 1)));
}

// The sum of a vector's 8 floats.
inline float horizontal_sum(__m256 v) {
  return horizontal_sum(_mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)));
}

// A matrix row's weights as f32 (f32 rows, and bf16 rows kept as std::uint16_t): the one at w, or eight from w on.
inline float load1(const float* w) { return *w; }
inline float load1(const std::uint16_t* w) { return bf16_to_float(*w); }
inline __m256 load8(const float* w) { return _mm256_loadu_ps(w); }
inline __m256 load8(const std::uint16_t* w) {
  const __m256i widened = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(widened, 16));
}

// The end of the one-vector matvec's dot product of row w and x (matvec_avx2.cpp's dot_row_avx2), given its eight
// accumulators with every whole 64-column chunk added (accumulator j: columns 8j .. 8j + 7 of each): the 8-column
// tail into accumulator 0, the tree, the horizontal sum and the scalar tail. Every kernel whose rows must equal that
// matvec to the bit (the row-exact products of a batch or a verified draft, AVX2 and AVX-512) ends through this one.
// Other weight types take their own load1/load8 overloads (found by argument-dependent lookup).
template <typename Weight>
inline float finish_dot_row(__m256 (&acc)[8], const Weight* w, const float* x, std::int64_t cols) {
  for (std::int64_t c = cols / 64 * 64; c + 8 <= cols; c += 8)
    acc[0] = _mm256_fmadd_ps(load8(w + c), _mm256_loadu_ps(x + c), acc[0]);
  const __m256 sum = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[1], acc[5])),
                                   _mm256_add_ps(_mm256_add_ps(acc[2], acc[6]), _mm256_add_ps(acc[3], acc[7])));
  float result = horizontal_sum(sum);
  for (std::int64_t t = cols / 8 * 8; t < cols; ++t) result = fused_multiply_add(load1(w + t), x[t], result);
  return result;
}

// An IEEE half stored at `at` (a GGUF block scale; any alignment), as a float.
inline float load_f16_scale(const std::uint8_t* at) {
  std::uint16_t bits;
  std::memcpy(&bits, at, 2);
  return _cvtsh_ss(bits);
}

// 16 bytes of nibbles as 32 bytes in element order: low nibbles (elements 0-15), then high (16-31).
inline __m256i nibbles32(const std::uint8_t* at) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(at));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), _mm256_set1_epi8(0x0F));
}

// 32 bits as 32 bytes: 0x10 where bit j is set, in byte j (the fifth bits of Q5_0/Q5_1).
inline __m256i fifth_bits32(const std::uint8_t* at) {
  std::uint32_t bits;
  std::memcpy(&bits, at, 4);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0x0000000000000000));
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}

// A block of 32 (SmallBlockLayout, block_types.h): its 32 quants in element order as bytes, Q8_0's
// signed ones or the 4- and 5-bit types' unsigned ones (0..31, before their offset).
template <GgufType kType>
inline __m256i small_block_quants(const std::uint8_t* block) {
  using Layout = SmallBlockLayout<kType>;
  if constexpr (kType == GgufType::Q8_0) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + Layout::kQuantsAt));
  } else {
    const __m256i quants = nibbles32(block + Layout::kQuantsAt);
    if constexpr (Layout::kFifthBitsAt >= 0) return _mm256_or_si256(quants, fifth_bits32(block + Layout::kFifthBitsAt));
    return quants;
  }
}

// Eight consecutive blocks' f16 fields at `offset` (a scale d, or a min m) as eight floats. Built in
// registers: eight 2-byte stores read back as 16 bytes would miss store forwarding.
template <GgufType kType>
inline __m256 eight_block_halves(const std::uint8_t* row, int offset) {
  auto half_at = [&](int k) {
    std::uint16_t bits;
    std::memcpy(&bits, row + SmallBlockLayout<kType>::kBytes * k + offset, 2);
    return static_cast<short>(bits);
  };
  return _mm256_cvtph_ps(
      _mm_setr_epi16(half_at(0), half_at(1), half_at(2), half_at(3), half_at(4), half_at(5), half_at(6), half_at(7)));
}

// exp(x) for 8 floats: range reduction x = k ln2 + r, a degree-6 polynomial for exp(r) on
// |r| <= ln2/2, and 2^k through the exponent bits. Relative error about 2e-7; inputs below -87
// (softmax tails) give 0, inputs above 88.37 give exp(88.37) (finite).
inline __m256 exp8(__m256 x) {
  const __m256 max_input = _mm256_set1_ps(88.3762626647949f);
  const __m256 min_input = _mm256_set1_ps(-87.3365447505531f);
  const __m256 underflow = _mm256_cmp_ps(x, min_input, _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, min_input), max_input);
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // r = x - k ln2, with ln2 split in two for accuracy.
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500E-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507E-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073E-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894E-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459E-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201E-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  const __m256 result = _mm256_mul_ps(p, _mm256_castsi256_ps(exponent));
  return _mm256_andnot_ps(underflow, result);
}

// Attention (attention_avx2.cpp, attention_avx512.cpp).

inline float hsum8(__m256 a) {
  const __m128 folded = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 pairs = _mm_add_ps(folded, _mm_movehl_ps(folded, folded));
  return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_shuffle_ps(pairs, pairs, 1)));
}

inline float hmax8(__m256 a) {
  const __m128 folded = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 pairs = _mm_max_ps(folded, _mm_movehl_ps(folded, folded));
  return _mm_cvtss_f32(_mm_max_ss(pairs, _mm_shuffle_ps(pairs, pairs, 1)));
}

// [sum(a[0]), sum(a[1]), ..., sum(a[7])]: eight horizontal sums in one vector.
inline __m256 hsum8x8(const __m256 a[8]) {
  const __m256 pairs01 = _mm256_hadd_ps(a[0], a[1]), pairs23 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 pairs45 = _mm256_hadd_ps(a[4], a[5]), pairs67 = _mm256_hadd_ps(a[6], a[7]);
  // Per 128-bit lane: the sums of four elements of a[0..3] and of a[4..7], low lane and high lane apart.
  const __m256 quads0123 = _mm256_hadd_ps(pairs01, pairs23), quads4567 = _mm256_hadd_ps(pairs45, pairs67);
  return _mm256_add_ps(_mm256_permute2f128_ps(quads0123, quads4567, 0x20),
                       _mm256_permute2f128_ps(quads0123, quads4567, 0x31));
}

// Rows read ahead of the current one: each head's keys and values are short streams (a few KiB to a
// few hundred) that the hardware prefetcher is slow to pick up. 16 rows was the best of 0, 4, 8, 16, 32 and
// 64 for both instruction sets (DESIGN's tuning table).
constexpr std::int64_t kAttentionPrefetchRows = 16;

// The row's softmax up to its normalisation: row[t] = exp(row[t] - max); returns 1 / sum(row).
inline float softmax_weights(float* row, std::int64_t n) {
  __m256 top8 = _mm256_set1_ps(-INFINITY);
  std::int64_t t = 0;
  for (; t + 8 <= n; t += 8) top8 = _mm256_max_ps(top8, _mm256_loadu_ps(row + t));
  float top = hmax8(top8);
  for (; t < n; ++t) top = std::max(top, row[t]);
  const __m256 top_v = _mm256_set1_ps(top);
  __m256 sum8 = _mm256_setzero_ps();
  t = 0;
  for (; t + 8 <= n; t += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(row + t), top_v));
    _mm256_storeu_ps(row + t, e);
    sum8 = _mm256_add_ps(sum8, e);
  }
  float sum = hsum8(sum8);
  for (; t < n; ++t) sum += row[t] = std::exp(row[t] - top);
  return 1.f / sum;
}

// The 8 scales and 8 mins of a Q4_K/Q5_K super-block (see k_quant_scale_and_min in engine/gguf) as
// bytes: scales in the low 8 bytes, mins in the high 8. Unpacked in vector registers: dwords
// (u0, u2, u1, u2) and (u0, u0, u1, u1) of the 12 packed bytes, shifted and masked (unpacking them in
// general-purpose registers and moving the four words across was measurably slower: DESIGN's tuning table). Reads 16
// bytes, uses 12: a super-block's quants follow its scales.
inline __m128i k_quant_scales_and_mins(const std::uint8_t* packed) {
  const __m128i u = _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed));
  const __m128i first = _mm_shuffle_epi32(u, _MM_SHUFFLE(2, 1, 2, 0)),
                second = _mm_shuffle_epi32(u, _MM_SHUFFLE(1, 1, 0, 0));
  return _mm_or_si128(
      _mm_and_si128(_mm_srlv_epi32(first, _mm_setr_epi32(0, 0, 0, 4)),
                    _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f)),
      _mm_and_si128(_mm_srlv_epi32(second, _mm_setr_epi32(0, 2, 0, 2)), _mm_setr_epi32(0, 0x30303030, 0, 0x30303030)));
}

// sum over a Q4_K/Q5_K super-block's sub-blocks of min * (sum of the activation bytes under it), as four
// 32-bit partial sums: the mins from k_quant_scales_and_mins, the byte sums of each 32 (int16).
inline __m128i k_quant_min_sums(__m128i scales_and_mins, const std::int16_t* byte_sums32) {
  return _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_srli_si128(scales_and_mins, 8)),
                        _mm_loadu_si128(reinterpret_cast<const __m128i*>(byte_sums32)));
}

// Q6_K's -32 offset against one-byte activations: -32 * sc * (sum of the bytes of each group of 16), as
// eight 32-bit partial sums, from the 16 group scales (int16) and byte sums (int16).
inline __m256i q6_k_offsets(__m256i group_scales, const std::int16_t* byte_sums16) {
  const __m256i weighted =
      _mm256_madd_epi16(group_scales, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(byte_sums16)));
  return _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(weighted, 5));
}

// The unsigned 6-bit quants (0..63) of one half (128 elements) of a Q6_K super-block, as four vectors of
// 32: element l + 32k takes a nibble of low byte l (k even) or l + 32 (k odd), the low one for k < 2,
// and bits 2k..2k+1 of top byte l.
inline void q6_k_half_quants(const std::uint8_t* block, int half, __m256i quants[4]) {
  const __m256i low_mask = _mm256_set1_epi8(0x0F), top_mask = _mm256_set1_epi8(0x30);
  const __m256i top = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 128 + 32 * half));
  const __m256i low_a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 64 * half));
  const __m256i low_b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 64 * half + 32));
  quants[0] = _mm256_or_si256(_mm256_and_si256(low_a, low_mask), _mm256_and_si256(_mm256_slli_epi16(top, 4), top_mask));
  quants[1] = _mm256_or_si256(_mm256_and_si256(low_b, low_mask), _mm256_and_si256(_mm256_slli_epi16(top, 2), top_mask));
  quants[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(low_a, 4), low_mask), _mm256_and_si256(top, top_mask));
  quants[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(low_b, 4), low_mask),
                              _mm256_and_si256(_mm256_srli_epi16(top, 2), top_mask));
}

// kernel(std::integral_constant<int, width>{}) for a width from 1 to kWidest known only at run time.
template <int kWidest, typename Kernel>
inline void with_width(int width, const Kernel& kernel) {
  if (width == kWidest) {
    kernel(std::integral_constant<int, kWidest>{});
  } else if constexpr (kWidest > 1) {
    with_width<kWidest - 1>(width, kernel);
  }
}

// The loops of an IntegerRowDots: `count` vectors split into as few groups of at most kWidest as there can be,
// of sizes that differ by at most one, and each group against every row of the tile in turn, through
// kernel(std::integral_constant<int, width>, std::bool_constant<prefetch>, row, vectors, sums) -- a generic lambda
// that calls the instruction set's kernel template for that width. The kernels are templates on their vector
// count, whose accumulators must stay in registers: past their widest group, a wider one spills and costs more
// than another pass over the row (nine vectors go as five and four, not eight and one, which would unpack each row
// a second time for one vector). A group's bytes stay in L1 while the tile's rows pass (the tile stays in L2): the
// vectors taken one row at a time re-read every vector's bytes from L2 for each row, which bounded a prompt's
// products by L2 rather than arithmetic. Where a row takes several groups, the first reads the tile from memory
// and prefetches as decode does (`prefetch`).
template <int kWidest, typename Kernel>
inline void for_row_tile(const RowTile& tile, const QuantizedActivations* x, int count, const Kernel& kernel) {
  const int groups = (count + kWidest - 1) / kWidest;
  for (int group = 0, first = 0; group < groups; ++group) {
    const int width = count / groups + (group < count % groups ? 1 : 0);
    with_width<kWidest>(width, [&](auto constant_width) {
      constexpr int kWidth = decltype(constant_width)::value;
      const auto rows = [&](auto prefetch) {
        for (std::int64_t r = 0; r < tile.row_count; ++r) {
          float sums[kWidth];
          kernel(constant_width, prefetch, tile.rows + r * tile.row_bytes, x + first, sums);
          const float bias = tile.bias ? tile.bias[r] : 0.f;
          for (int v = 0; v < kWidth; ++v) tile.y[(first + v) * tile.y_stride + r] = sums[v] + bias;
        }
      };
      if (groups > 1 && group == 0)
        rows(std::true_type{});
      else
        rows(std::false_type{});
    });
    first += width;
  }
}

}  // namespace
}  // namespace kvchat::kernels
#endif  // KVCHAT_HAVE_AVX2_KERNELS
