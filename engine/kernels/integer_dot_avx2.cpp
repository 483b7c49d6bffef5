// The AVX2 integer dot products (integer_dot.h). Weights stay integers: unsigned ones (nibbles, K-quant
// quants) go straight into _mm256_maddubs_epi16 against the activations' signed bytes; Q8_0's signed
// ones take the sign of the weight onto the activations first (|w| * sign(w) q).
// - Q8_0 takes the activations' high bytes alone (one byte per activation in blocks of 32).
// - Two bytes per activation (Q4_0, Q4_1, Q5_0, Q5_1): the 16-bit pair sums are weighted
//   (_mm256_madd_epi16) by 254 and 1 and added: each block of 32 ends as eight exact 32-bit partial
//   sums, converted to f32 once and scaled by the weight's and the activations' scales. Weight offsets
//   (Q4_0's -8, Q5_0's -16, Q4_1/Q5_1's m) use the activations' block sums, once per block. Bounds:
//   |pair sum| <= 2 * 128 * 127 (no saturation), |32-bit lane| <= 2^30.
// - One byte per activation (Q4_K, Q5_K, Q6_K): the pair sums are weighted by the sub-block scales, so
//   a whole super-block adds up in exact 32-bit lanes (at most 8 * 63 * 2 * 2 * 63 * 128 < 2^28) and is
//   converted once; mins and Q6_K's -32 go through the activations' byte sums.
// Block layouts: engine/gguf/dequantize.cpp.
#include <cstring>

#include "engine/kernels/integer_dot.h"
#include "engine/kernels/isa_attributes.h"
#include "engine/kernels/vector_math_avx2.h"

#if KVCHAT_HAVE_AVX2_KERNELS
#include <immintrin.h>

namespace kvchat::kernels {
namespace {

// Bytes read ahead of the current block: each thread reads its rows as one linear stream, and a
// software prefetch keeps enough misses in flight (as for the f32/bf16 kernels).
constexpr std::int64_t kPrefetchBytes = 1024;


KVCHAT_ISA_AVX2 inline __m256i load256(const void* at) { return _mm256_loadu_si256(static_cast<const __m256i*>(at)); }

// Eight 32-bit partial sums of w * (254 high + low) over 32 elements: unsigned weights u (at most
// 128) times the activations' two signed bytes, the 16-bit pair sums weighted by high_factor (254 times
// a sub-block scale) and low_factor (the scale).
KVCHAT_ISA_AVX2 inline __m256i dot_unsigned(__m256i u, __m256i high, __m256i low, __m256i high_factor, __m256i low_factor) {
  return _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(u, high), high_factor),
                          _mm256_madd_epi16(_mm256_maddubs_epi16(u, low), low_factor));
}

KVCHAT_ISA_AVX2 inline __m256i plain_high_factor() { return _mm256_set1_epi16(kActivationRadix); }
KVCHAT_ISA_AVX2 inline __m256i plain_low_factor() { return _mm256_set1_epi16(1); }

// The activations' two bytes from `element` on.
KVCHAT_ISA_AVX2 inline __m256i high_at(const QuantizedActivations& x, std::int64_t element) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.high + element));
}
KVCHAT_ISA_AVX2 inline __m256i low_at(const QuantizedActivations& x, std::int64_t element) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.low + element));
}

// 16 bytes of nibbles as 32 bytes: low nibbles (elements 0-15), then high nibbles (16-31).
KVCHAT_ISA_AVX2 inline __m256i nibbles32(const std::uint8_t* at) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(at));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), _mm256_set1_epi8(0x0F));
}

// 32 bits as 32 bytes: 0x10 where the bit is set (the fifth bits of Q5_0/Q5_1).
KVCHAT_ISA_AVX2 inline __m256i fifth_bits32(const std::uint8_t* at) {
  std::uint32_t bits;
  std::memcpy(&bits, at, 4);
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)),
                                             _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                               0x0101010101010101, 0x0000000000000000));
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}

// Q8_0 against the high bytes alone: each block's eight exact 32-bit sums (q8_0_high_byte_sums) scaled
// by d * (254 * s).
KVCHAT_ISA_AVX2 float dot_q8_0(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks) {
  const __m256 radix = _mm256_set1_ps(static_cast<float>(kActivationRadix));
  auto factor = [&](const std::uint8_t* block, std::int64_t b) {
    return _mm256_mul_ps(_mm256_set1_ps(load_f16_scale(block) * x.scales[b]), radix);
  };
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  std::int64_t b = 0;
  for (; b + 2 <= blocks; b += 2, row += 68) {
    _mm_prefetch(reinterpret_cast<const char*>(row) + kPrefetchBytes, _MM_HINT_T0);
    acc0 = _mm256_fmadd_ps(factor(row, b), _mm256_cvtepi32_ps(q8_0_high_byte_sums(row + 2, x.high + 32 * b)), acc0);
    acc1 = _mm256_fmadd_ps(factor(row + 34, b + 1), _mm256_cvtepi32_ps(q8_0_high_byte_sums(row + 36, x.high + 32 * b + 32)), acc1);
  }
  if (b < blocks) acc0 = _mm256_fmadd_ps(factor(row, b), _mm256_cvtepi32_ps(q8_0_high_byte_sums(row + 2, x.high + 32 * b)), acc0);
  return horizontal_sum(_mm256_add_ps(acc0, acc1));
}

// Q4_0, Q4_1, Q5_0, Q5_1: unsigned quants, the offset (-8 for Q4_0, -16 for Q5_0) or the min (m)
// through the block's activation sum.
template <int kHeader, bool kFifthBits, bool kMin, int kOffset>
KVCHAT_ISA_AVX2 float dot_small_block(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks) {
  constexpr int kBlockBytes = kHeader + (kFifthBits ? 4 : 0) + 16;
  __m256 acc = _mm256_setzero_ps();
  float offsets = 0.f;
  for (std::int64_t b = 0; b < blocks; ++b, row += kBlockBytes) {
    _mm_prefetch(reinterpret_cast<const char*>(row) + kPrefetchBytes, _MM_HINT_T0);
    __m256i quants = nibbles32(row + kBlockBytes - 16);
    if constexpr (kFifthBits) quants = _mm256_or_si256(quants, fifth_bits32(row + kHeader));
    const float d = load_f16_scale(row) * x.scales[b];
    const __m256i products = dot_unsigned(quants, high_at(x, 32 * b), low_at(x, 32 * b), plain_high_factor(), plain_low_factor());
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(products), acc);
    const auto q_sum = static_cast<float>(std::int64_t{x.sums[2 * b]} + x.sums[2 * b + 1]);
    if constexpr (kMin) offsets += load_f16_scale(row + 2) * x.scales[b] * q_sum;
    if constexpr (kOffset != 0) offsets -= d * static_cast<float>(kOffset) * q_sum;
  }
  return horizontal_sum(acc) + offsets;
}

// Shuffles that broadcast 16-bit word j of each 128-bit lane (a sub-block's scale).
KVCHAT_ISA_AVX2 inline __m256i word_broadcast(int j) {
  return _mm256_set1_epi16(static_cast<short>((2 * j) | ((2 * j + 1) << 8)));
}

// Pair `pair`'s 64 quants of a Q4_K/Q5_K super-block: sub-block 2p in `low`, 2p+1 in `high` (32 each).
// Q5_K's fifth bits (`high_bits`, the block's 32 bytes of them): bit 2p of byte l for low-nibble element
// l, bit 2p+1 for the high-nibble one, moved to bit 4.
template <bool kFifthBits>
KVCHAT_ISA_AVX2 inline void q4_q5_k_pair_quants(const std::uint8_t* block, __m256i high_bits, int pair, __m256i& low,
                                                __m256i& high) {
  const __m256i low_mask = _mm256_set1_epi8(0x0F), fifth = _mm256_set1_epi8(0x10);
  const __m256i packed = load256(block + (kFifthBits ? 48 : 16) + 32 * pair);
  low = _mm256_and_si256(packed, low_mask);
  high = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low_mask);
  if constexpr (kFifthBits) {
    const __m256i bits = _mm256_srli_epi16(high_bits, 2 * pair);
    low = _mm256_or_si256(low, _mm256_and_si256(_mm256_slli_epi16(bits, 4), fifth));
    high = _mm256_or_si256(high, _mm256_and_si256(_mm256_slli_epi16(bits, 3), fifth));
  }
}

// Q4_K / Q5_K against one-byte activations (one scale per super-block): per super-block
// d * x_scale * sum(sc * sum(q b)) - dmin * x_scale * sum(m * sum(b)), the sums exact 32-bit integers.
// The unsigned quants (at most 31) go straight into _mm256_maddubs_epi16 against the signed bytes (pair
// sums at most 2 * 31 * 128), and _mm256_madd_epi16 weights them by the sub-block's scale. Q5_K's fifth
// bits: bit 2p of byte l for low-nibble element l of pair p, bit 2p+1 for the high-nibble one.
template <bool kFifthBits>
KVCHAT_ISA_AVX2 float dot_q4_q5_k(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks) {
  constexpr int kBlockBytes = kFifthBits ? 176 : 144;
  __m256 acc = _mm256_setzero_ps();
  __m128 mins_acc = _mm_setzero_ps();
  for (std::int64_t s = 0; s < blocks; ++s, row += kBlockBytes) {
    for (int ahead = 0; ahead < kBlockBytes; ahead += 64)
      _mm_prefetch(reinterpret_cast<const char*>(row) + kPrefetchBytes + ahead, _MM_HINT_T0);
    const __m128i packed_scales = k_quant_scales_and_mins(row + 4);
    const __m256i scales = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(packed_scales));
    const float x_scale = x.byte_scales[s];
    mins_acc = _mm_fmadd_ps(_mm_cvtepi32_ps(k_quant_min_sums(packed_scales, x.byte_sums32 + 8 * s)),
                            _mm_set1_ps(load_f16_scale(row + 2) * x_scale), mins_acc);
    __m256i high_bits = _mm256_setzero_si256();
    if constexpr (kFifthBits) high_bits = load256(row + 16);
    const std::int8_t* bytes = x.bytes + 256 * s;
    __m256i sum = _mm256_setzero_si256();
    for (int pair = 0; pair < 4; ++pair, bytes += 64) {
      __m256i low, high;
      q4_q5_k_pair_quants<kFifthBits>(row, high_bits, pair, low, high);
      const __m256i low_products = _mm256_maddubs_epi16(low, load256(bytes));
      const __m256i high_products = _mm256_maddubs_epi16(high, load256(bytes + 32));
      sum = _mm256_add_epi32(sum, _mm256_madd_epi16(low_products, _mm256_shuffle_epi8(scales, word_broadcast(2 * pair))));
      sum = _mm256_add_epi32(sum, _mm256_madd_epi16(high_products, _mm256_shuffle_epi8(scales, word_broadcast(2 * pair + 1))));
    }
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(load_f16_scale(row) * x_scale), acc);
  }
  return horizontal_sum(acc) - horizontal_sum(mins_acc);
}

// Shuffle indices that pick, for vector k of a Q6_K half, the scale of its low 128-bit lane's group (2k)
// and of its high one's (2k+1) out of q6_k_half_scales.
KVCHAT_ISA_AVX2 inline void q6_k_group_scale_index(__m256i (&index)[4]) {
  for (int k = 0; k < 4; ++k)
    index[k] = _mm256_setr_m128i(_mm_set1_epi16(static_cast<short>((4 * k) | ((4 * k + 1) << 8))),
                                 _mm_set1_epi16(static_cast<short>((4 * k + 2) | ((4 * k + 3) << 8))));
}

// Half `half`'s eight 16-bit scales (of the super-block's sixteen in `scales`) in both 128-bit lanes.
// Two calls with constant immediates: a computed one does not fold at -O1.
KVCHAT_ISA_AVX2 inline __m256i q6_k_half_scales(__m256i scales, int half) {
  return half == 0 ? _mm256_permute2x128_si256(scales, scales, 0x00) : _mm256_permute2x128_si256(scales, scales, 0x11);
}

// Q6_K against one-byte activations: per super-block d * x_scale * sum over groups of 16 of
// sc * (sum(q b) - 32 sum(b)), exact in 32 bits; the quants (0..63) from q6_k_half_quants.
KVCHAT_ISA_AVX2 float dot_q6_k(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks) {
  __m256i group_scale[4];
  q6_k_group_scale_index(group_scale);
  __m256 acc = _mm256_setzero_ps();
  for (std::int64_t s = 0; s < blocks; ++s, row += 210) {
    for (int ahead = 0; ahead < 256; ahead += 64)
      _mm_prefetch(reinterpret_cast<const char*>(row) + kPrefetchBytes + ahead, _MM_HINT_T0);
    const __m256i scales = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 192)));
    // -32 * sum over the groups of sc * (sum of their bytes).
    __m256i sum = q6_k_offsets(scales, x.byte_sums16 + 16 * s);
    const std::int8_t* bytes = x.bytes + 256 * s;
    for (int half = 0; half < 2; ++half) {
      const __m256i half_scales = q6_k_half_scales(scales, half);
      __m256i quants[4];
      q6_k_half_quants(row, half, quants);
      for (int k = 0; k < 4; ++k, bytes += 32)
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(quants[k], load256(bytes)),
                                                      _mm256_shuffle_epi8(half_scales, group_scale[k])));
    }
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(load_f16_scale(row + 208) * x.byte_scales[s]), acc);
  }
  return horizontal_sum(acc);
}

// The K-quant products for four activation vectors at once (a prompt's rows): the weights' unpacking done
// once for the four, each vector's sums by exactly the steps of the one-vector kernel above, so that each
// result is bit-identical to that kernel's.
template <bool kFifthBits>
KVCHAT_ISA_AVX2 void dot4_q4_q5_k(const std::uint8_t* row, const QuantizedActivations* x, std::int64_t blocks,
                                  float* out) {
  constexpr int kBlockBytes = kFifthBits ? 176 : 144, kVectors = 4;
  __m256 acc[kVectors];
  __m128 mins_acc[kVectors];
  for (int v = 0; v < kVectors; ++v) {
    acc[v] = _mm256_setzero_ps();
    mins_acc[v] = _mm_setzero_ps();
  }
  for (std::int64_t s = 0; s < blocks; ++s, row += kBlockBytes) {
    for (int ahead = 0; ahead < kBlockBytes; ahead += 64)
      _mm_prefetch(reinterpret_cast<const char*>(row) + kPrefetchBytes + ahead, _MM_HINT_T0);
    const __m128i packed_scales = k_quant_scales_and_mins(row + 4);
    const __m256i scales = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(packed_scales));
    const float d = load_f16_scale(row), dmin = load_f16_scale(row + 2);
    for (int v = 0; v < kVectors; ++v)
      mins_acc[v] = _mm_fmadd_ps(_mm_cvtepi32_ps(k_quant_min_sums(packed_scales, x[v].byte_sums32 + 8 * s)),
                                 _mm_set1_ps(dmin * x[v].byte_scales[s]), mins_acc[v]);
    __m256i high_bits = _mm256_setzero_si256();
    if constexpr (kFifthBits) high_bits = load256(row + 16);
    __m256i sum[kVectors];
    for (__m256i& v : sum) v = _mm256_setzero_si256();
    for (int pair = 0; pair < 4; ++pair) {
      __m256i low, high;
      q4_q5_k_pair_quants<kFifthBits>(row, high_bits, pair, low, high);
      const __m256i low_scale = _mm256_shuffle_epi8(scales, word_broadcast(2 * pair));
      const __m256i high_scale = _mm256_shuffle_epi8(scales, word_broadcast(2 * pair + 1));
      for (int v = 0; v < kVectors; ++v) {
        const std::int8_t* bytes = x[v].bytes + 256 * s + 64 * pair;
        sum[v] = _mm256_add_epi32(sum[v], _mm256_madd_epi16(_mm256_maddubs_epi16(low, load256(bytes)), low_scale));
        sum[v] = _mm256_add_epi32(sum[v], _mm256_madd_epi16(_mm256_maddubs_epi16(high, load256(bytes + 32)), high_scale));
      }
    }
    for (int v = 0; v < kVectors; ++v)
      acc[v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[v]), _mm256_set1_ps(d * x[v].byte_scales[s]), acc[v]);
  }
  for (int v = 0; v < kVectors; ++v) out[v] = horizontal_sum(acc[v]) - horizontal_sum(mins_acc[v]);
}

KVCHAT_ISA_AVX2 void dot4_q6_k(const std::uint8_t* row, const QuantizedActivations* x, std::int64_t blocks,
                               float* out) {
  constexpr int kVectors = 4;
  __m256i group_scale[4];
  q6_k_group_scale_index(group_scale);
  __m256 acc[kVectors];
  for (__m256& a : acc) a = _mm256_setzero_ps();
  for (std::int64_t s = 0; s < blocks; ++s, row += 210) {
    for (int ahead = 0; ahead < 256; ahead += 64)
      _mm_prefetch(reinterpret_cast<const char*>(row) + kPrefetchBytes + ahead, _MM_HINT_T0);
    const __m256i scales = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 192)));
    __m256i sum[kVectors];
    for (int v = 0; v < kVectors; ++v) sum[v] = q6_k_offsets(scales, x[v].byte_sums16 + 16 * s);
    for (int half = 0; half < 2; ++half) {
      const __m256i half_scales = q6_k_half_scales(scales, half);
      __m256i quants[4];
      q6_k_half_quants(row, half, quants);
      for (int k = 0; k < 4; ++k) {
        const __m256i group = _mm256_shuffle_epi8(half_scales, group_scale[k]);
        for (int v = 0; v < kVectors; ++v)
          sum[v] = _mm256_add_epi32(
              sum[v], _mm256_madd_epi16(_mm256_maddubs_epi16(quants[k], load256(x[v].bytes + 256 * s + 128 * half + 32 * k)), group));
      }
    }
    const float d = load_f16_scale(row + 208);
    for (int v = 0; v < kVectors; ++v)
      acc[v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[v]), _mm256_set1_ps(d * x[v].byte_scales[s]), acc[v]);
  }
  for (int v = 0; v < kVectors; ++v) out[v] = horizontal_sum(acc[v]);
}

}  // namespace

IntegerRowDot4 avx2_integer_row_dot4(GgufType type) {
  switch (type) {
    case GgufType::Q4_K: return dot4_q4_q5_k<false>;
    case GgufType::Q5_K: return dot4_q4_q5_k<true>;
    case GgufType::Q6_K: return dot4_q6_k;
    default: return nullptr;
  }
}

IntegerRowDot avx2_integer_row_dot(GgufType type) {
  switch (type) {
    case GgufType::Q8_0: return dot_q8_0;
    case GgufType::Q4_0: return dot_small_block<2, false, false, 8>;
    case GgufType::Q4_1: return dot_small_block<4, false, true, 0>;
    case GgufType::Q5_0: return dot_small_block<2, true, false, 16>;
    case GgufType::Q5_1: return dot_small_block<4, true, true, 0>;
    case GgufType::Q4_K: return dot_q4_q5_k<false>;
    case GgufType::Q5_K: return dot_q4_q5_k<true>;
    case GgufType::Q6_K: return dot_q6_k;
    default: return nullptr;
  }
}

}  // namespace kvchat::kernels
#endif  // KVCHAT_HAVE_AVX2_KERNELS
