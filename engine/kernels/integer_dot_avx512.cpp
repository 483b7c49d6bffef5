// The AVX-512 integer dot products (integer_dot.h), for processors with AVX-512 F/BW/VL.
//
// Why a second x86 kernel: the AVX2 ones multiply each weight twice (_mm256_maddubs_epi16 against
// the activations' high byte, then the low one) and weight the two 16-bit pair sums by 254 and 1; on
// two cores that holds Q4_K decode to about a quarter of the memory bandwidth. Here the activations
// come as one 16-bit integer each (QuantizedActivations::values = 254 high + low, |v| <= 32385; the
// K-quant mins take scaled_block_sums, made once per product), the
// weights are widened to 16 bits, and _mm512_madd_epi16 gives, per block of 32, sixteen exact 32-bit
// sums of two products: one multiply for 32 weights, in registers twice as wide. Each block's sum
// is converted to f32 once and scaled by the weight's and the activations' scales, as in the AVX2
// kernels; the sums are the same exact integers, so the results differ from theirs only in the order
// of the f32 additions.
//
// Bounds: a quant is at most 63 (Q6_K, unsigned) or 128 in magnitude (Q8_0), so a pair sum is at most
// 2 * 128 * 32385 < 2^24. Block layouts: engine/gguf/dequantize.cpp.
#include <cstring>

#include "engine/kernels/integer_dot.h"
#include "engine/kernels/isa_attributes.h"
#include "engine/kernels/vector_math_avx2.h"

#if KVCHAT_HAVE_AVX2_KERNELS
#include <immintrin.h>

namespace kvchat::kernels {
namespace {

// As in the AVX2 kernels: each thread reads its rows as one linear stream, and a software prefetch
// keeps enough misses in flight. These kernels go through a block about twice as fast, so they look
// further ahead: one core streaming Q8_0 rows, 27.0 G weights/s at 1 KiB ahead, 32.2 at 4 KiB.
constexpr std::int64_t kPrefetchBytes = 4096;

KVCHAT_ISA_AVX512 inline __m256i load256(const void* at) { return _mm256_loadu_si256(static_cast<const __m256i*>(at)); }

// Sixteen 32-bit sums of two products each: 32 weights (16-bit) times the 32 activations from `values`.
KVCHAT_ISA_AVX512 inline __m512 block_products(__m512i weights, const std::int16_t* values) {
  return _mm512_cvtepi32_ps(_mm512_madd_epi16(weights, _mm512_loadu_si512(values)));
}

// Lane indices for _mm512_permutexvar_ps: element `low` in lanes 0-7, element `high` in lanes 8-15 (the
// factors of two blocks whose sums fold_pair put side by side).
KVCHAT_ISA_AVX512 inline __m512i two_lane_groups(int low, int high) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(low)), _mm256_set1_epi32(high), 1);
}

// Two blocks' sixteen 32-bit sums each, folded to eight each: the first block's in lanes 0-7, the
// second's in lanes 8-15, so that one conversion and one FMA serve both.
KVCHAT_ISA_AVX512 inline __m512i fold_pair(__m512i first, __m512i second) {
  return _mm512_add_epi32(_mm512_shuffle_i64x2(first, second, 0x44), _mm512_shuffle_i64x2(first, second, 0xEE));
}

// 16 bytes of nibbles as 32 bytes in element order: low nibbles (elements 0-15), then high (16-31).
KVCHAT_ISA_AVX512 inline __m256i nibbles32(const std::uint8_t* at) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(at));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), _mm256_set1_epi8(0x0F));
}

// Q8_0, eight blocks at a time: their f16 scales gathered and converted together and multiplied by the
// activations' (one vector of eight factors), and each two blocks' 16 sums folded to 8 side by side, so
// one conversion and one FMA serve two blocks.
KVCHAT_ISA_AVX512 float dot_q8_0(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks) {
  __m512i pair_factor_index[4];
  for (int pair = 0; pair < 4; ++pair) pair_factor_index[pair] = two_lane_groups(2 * pair, 2 * pair + 1);
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  std::int64_t b = 0;
  for (; b + 8 <= blocks; b += 8, row += 8 * 34) {
    std::uint16_t d[8];
    for (int k = 0; k < 8; ++k) std::memcpy(d + k, row + 34 * k, 2);
    const __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i*>(d));
    const __m512 factors = _mm512_castps256_ps512(_mm256_mul_ps(_mm256_cvtph_ps(halves), _mm256_loadu_ps(x.scales + b)));
    for (int pair = 0; pair < 4; ++pair) {
      const std::uint8_t* first = row + 68 * pair;
      _mm_prefetch(reinterpret_cast<const char*>(first) + kPrefetchBytes, _MM_HINT_T0);
      const __m512i sums0 = _mm512_madd_epi16(_mm512_cvtepi8_epi16(load256(first + 2)),
                                              _mm512_loadu_si512(x.values + 32 * (b + 2 * pair)));
      const __m512i sums1 = _mm512_madd_epi16(_mm512_cvtepi8_epi16(load256(first + 36)),
                                              _mm512_loadu_si512(x.values + 32 * (b + 2 * pair + 1)));
      __m512& acc = pair % 2 == 0 ? acc0 : acc1;
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(fold_pair(sums0, sums1)),
                            _mm512_permutexvar_ps(pair_factor_index[pair], factors), acc);
    }
  }
  for (; b < blocks; ++b, row += 34) {
    const __m512 p0 = block_products(_mm512_cvtepi8_epi16(load256(row + 2)), x.values + 32 * b);
    acc0 = _mm512_fmadd_ps(p0, _mm512_set1_ps(load_f16_scale(row) * x.scales[b]), acc0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

// Q4_0: d * (q - 8), the offset taken off the bytes before they are widened.
KVCHAT_ISA_AVX512 float dot_q4_0(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks) {
  const __m256i eight = _mm256_set1_epi8(8);
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  std::int64_t b = 0;
  for (; b + 2 <= blocks; b += 2, row += 36) {
    _mm_prefetch(reinterpret_cast<const char*>(row) + kPrefetchBytes, _MM_HINT_T0);
    const __m512 p0 = block_products(_mm512_cvtepi8_epi16(_mm256_sub_epi8(nibbles32(row + 2), eight)), x.values + 32 * b);
    const __m512 p1 =
        block_products(_mm512_cvtepi8_epi16(_mm256_sub_epi8(nibbles32(row + 20), eight)), x.values + 32 * b + 32);
    acc0 = _mm512_fmadd_ps(p0, _mm512_set1_ps(load_f16_scale(row) * x.scales[b]), acc0);
    acc1 = _mm512_fmadd_ps(p1, _mm512_set1_ps(load_f16_scale(row + 18) * x.scales[b + 1]), acc1);
  }
  if (b < blocks) {
    const __m512 p0 = block_products(_mm512_cvtepi8_epi16(_mm256_sub_epi8(nibbles32(row + 2), eight)), x.values + 32 * b);
    acc0 = _mm512_fmadd_ps(p0, _mm512_set1_ps(load_f16_scale(row) * x.scales[b]), acc0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

// Q4_K / Q5_K: per sub-block (d * sc * x_scale) * sum(q v) - (dmin * m * x_scale) * sum(v). Byte l of
// a pair's 32 holds element l of its low sub-block (low nibble) and of its high one: widening the 32
// bytes to 16-bit words first leaves both nibbles in each word, so one mask and one shift give the two
// sub-blocks' weights in element order. Q5_K's fifth bits: bit 2p of byte l for the low sub-block of
// pair p, bit 2p+1 for the high one (widened the same way, once per super-block).
template <bool kFifthBits>
KVCHAT_ISA_AVX512 float dot_q4_q5_k(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks) {
  constexpr int kBlockBytes = kFifthBits ? 176 : 144, kNibblesAt = kFifthBits ? 48 : 16;
  const __m512i low_mask = _mm512_set1_epi16(0x0F), fifth = _mm512_set1_epi16(0x10);
  // Pair p's two factors, each across 8 lanes: [f_2p x 8, f_2p+1 x 8].
  __m512i pair_factor_index[4];
  for (int pair = 0; pair < 4; ++pair) pair_factor_index[pair] = two_lane_groups(2 * pair, 2 * pair + 1);
  const __m512i d_then_dmin = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  __m512 mins_acc = _mm512_setzero_ps();  // lanes 8-15 (0-7 gather the factors, unused)
  for (std::int64_t s = 0; s < blocks; ++s, row += kBlockBytes) {
    for (int ahead = 0; ahead < kBlockBytes; ahead += 64)
      _mm_prefetch(reinterpret_cast<const char*>(row) + kPrefetchBytes + ahead, _MM_HINT_T0);
    const __m128i packed_scales = k_quant_scales_and_mins(row + 4);
    // d and dmin, the two halves at the block's start, converted together.
    std::uint32_t halves;
    std::memcpy(&halves, row, 4);
    const __m512 d_and_dmin = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(halves))));
    // The 8 scales and 8 mins widened together: lanes 0-7 become each sub-block's factor d * sc * x_scale,
    // lanes 8-15 its min term dmin * m * (x_scale * sum of its values), summed over the row in mins_acc.
    const __m512 activation_factors = _mm512_castpd_ps(
        _mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(_mm256_loadu_ps(x.scales + 8 * s))),
                           _mm256_castps_pd(_mm256_loadu_ps(x.scaled_block_sums + 8 * s)), 1));
    const __m512 factors = _mm512_mul_ps(_mm512_mul_ps(_mm512_permutexvar_ps(d_then_dmin, d_and_dmin),
                                                       _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(packed_scales))),
                                         activation_factors);
    mins_acc = _mm512_add_ps(mins_acc, factors);
    __m512i high_bits = _mm512_setzero_si512();
    if constexpr (kFifthBits) high_bits = _mm512_cvtepu8_epi16(load256(row + 16));
    const std::int16_t* values = x.values + 256 * s;
    for (int pair = 0; pair < 4; ++pair, values += 64) {
      const __m512i words = _mm512_cvtepu8_epi16(load256(row + kNibblesAt + 32 * pair));
      __m512i low = _mm512_and_si512(words, low_mask);
      __m512i high = _mm512_srli_epi16(words, 4);
      if constexpr (kFifthBits) {
        const __m512i bits = _mm512_srli_epi16(high_bits, 2 * pair);
        low = _mm512_or_si512(low, _mm512_and_si512(_mm512_slli_epi16(bits, 4), fifth));
        high = _mm512_or_si512(high, _mm512_and_si512(_mm512_slli_epi16(bits, 3), fifth));
      }
      // The two sub-blocks' 16 sums each folded to 8 and put side by side: one conversion and one FMA.
      const __m512i low_sums = _mm512_madd_epi16(low, _mm512_loadu_si512(values));
      const __m512i high_sums = _mm512_madd_epi16(high, _mm512_loadu_si512(values + 32));
      __m512& acc = pair % 2 == 0 ? acc0 : acc1;
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(fold_pair(low_sums, high_sums)),
                            _mm512_permutexvar_ps(pair_factor_index[pair], factors), acc);
    }
  }
  const __m256 mins = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(mins_acc), 1));
  return _mm512_reduce_add_ps(_mm512_sub_ps(_mm512_add_ps(acc0, acc1), _mm512_zextps256_ps512(mins)));
}

// Q6_K: per group of 16, (d * sc * x_scale) * (sum(q v) - 32 sum(v)), the quants from
// q6_k_half_quants. They stay unsigned (0..63) and the -32 goes through the groups' activation sums, once per super-block; a block of 32 is two groups, whose factors sit in the low
// and the high 8 lanes of its product vector.
KVCHAT_ISA_AVX512 float dot_q6_k(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks) {
  // Block b's two group factors, each across 8 lanes; and each group's activation scale (block g / 2).
  __m512i block_factor_index[8];
  for (int b = 0; b < 8; ++b) block_factor_index[b] = two_lane_groups(2 * b, 2 * b + 1);
  const __m512i group_block = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps(), offsets = _mm512_setzero_ps();
  for (std::int64_t s = 0; s < blocks; ++s, row += 210) {
    for (int ahead = 0; ahead < 256; ahead += 64)
      _mm_prefetch(reinterpret_cast<const char*>(row) + kPrefetchBytes + ahead, _MM_HINT_T0);
    const __m512 group_scales =
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 192))));
    const __m512 x_scales = _mm512_permutexvar_ps(group_block, _mm512_castps256_ps512(_mm256_loadu_ps(x.scales + 8 * s)));
    const __m512 group_factors = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(load_f16_scale(row + 208)), group_scales), x_scales);
    offsets = _mm512_fmadd_ps(group_factors, _mm512_cvtepi32_ps(_mm512_loadu_si512(x.sums + 16 * s)), offsets);
    const std::int16_t* values = x.values + 256 * s;
    for (int half = 0; half < 2; ++half) {
      __m256i quants[4];
      q6_k_half_quants(row, half, quants);
      for (int k = 0; k < 4; ++k) {
        const int block = 4 * half + k;
        __m512& acc = k % 2 == 0 ? acc0 : acc1;
        acc = _mm512_fmadd_ps(block_products(_mm512_cvtepu8_epi16(quants[k]), values + 32 * block),
                              _mm512_permutexvar_ps(block_factor_index[block], group_factors), acc);
      }
    }
  }
  return _mm512_reduce_add_ps(_mm512_fnmadd_ps(_mm512_set1_ps(32.f), offsets, _mm512_add_ps(acc0, acc1)));
}

}  // namespace

IntegerRowDot avx512_integer_row_dot(GgufType type) {
  switch (type) {
    case GgufType::Q8_0: return dot_q8_0;
    case GgufType::Q4_0: return dot_q4_0;
    case GgufType::Q4_K: return dot_q4_q5_k<false>;
    case GgufType::Q5_K: return dot_q4_q5_k<true>;
    case GgufType::Q6_K: return dot_q6_k;
    default: return nullptr;  // Q4_1, Q5_0, Q5_1: the AVX2 kernels
  }
}

}  // namespace kvchat::kernels
#endif  // KVCHAT_HAVE_AVX2_KERNELS
