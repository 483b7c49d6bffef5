// The AVX2 integer dot products (integer_dot.h). Weights stay integers: unsigned ones (nibbles, K-quant
// quants) go straight into _mm256_maddubs_epi16 against the activations' signed bytes; Q8_0's signed ones
// take the sign of the weight onto the activations first (|w| * sign(w) q).
// - Blocks of 32 (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) against one byte per activation with a scale per block:
//   see small_block_dot.
// - Super-blocks of 256 (Q4_K, Q5_K, Q6_K) against one byte per activation: the pair sums are weighted
//   by the sub-block scales, so a whole super-block adds up in exact 32-bit lanes (at most
//   8 * 63 * 2 * 2 * 63 * 128 < 2^28) and is converted once; mins and Q6_K's -32 go through the
//   activations' byte sums.
// Block layouts: engine/gguf/gguf_types.cpp.
#include <cstring>

#include "engine/kernels/block_types.h"
#include "engine/kernels/integer_dot.h"
#include "engine/kernels/vector_math_avx2.h"

#if KVCHAT_HAVE_AVX2_KERNELS

namespace kvchat::kernels::avx2 {
namespace {

// Bytes read ahead of the current block: each thread reads its rows as one linear stream, and a
// software prefetch keeps enough misses in flight (as for the f32/bf16 kernels).
constexpr std::int64_t kPrefetchBytes = 1024;

inline __m256i load256(const void* at) { return _mm256_loadu_si256(static_cast<const __m256i*>(at)); }

// A type with blocks of 32 (SmallBlockLayout), eight blocks at a time: each block's eight exact 32-bit
// sums of quant * byte (_mm256_maddubs_epi16, the pairs added by _mm256_madd_epi16; pair sums at most
// 2 * 128 * 127, so no saturation), converted and scaled by d * s, s the activations' scale. The eight
// blocks' f16 scales are gathered and converted together, and each block's factor taken out of them
// with one permute. Q8_0's signed quants go in as |w| times the bytes carrying w's sign (a quant of
// -128 gives |w| = 128 as an unsigned byte). The 4- and 5-bit types' unsigned quants go in as they are:
// Q4_0/Q5_0's offset (8, 16) and Q4_1/Q5_1's min m apply through the activations' block sums,
// -offset * d * s * sum byte or m * s * sum byte, eight blocks at once. (The offset's term is rounded
// apart from the quants'; the error stays within f32 rounding of sum |q| |byte|.) A row's last blocks
// (fewer than eight) go one at a time.
// One pass over the row serves kVectors activation vectors: 1 (decode) or several (a prompt's rows, a speculative
// check's): the quants, |w| and the weights' scales are made once for all of them, and each vector's sums take the
// same steps in the same order, so a several-vector result is bit-identical to the one-vector one.
template <GgufType kType, int kVectors>
void small_block_dot_vectors(const std::uint8_t* row, const QuantizedActivations* x, std::int64_t blocks, float* out) {
  using Layout = SmallBlockLayout<kType>;
  constexpr bool kSigned = kType == GgufType::Q8_0;
  __m256 acc0[kVectors], acc1[kVectors], offsets[kVectors];
  float tail[kVectors];
  for (int v = 0; v < kVectors; ++v) {
    acc0[v] = acc1[v] = offsets[v] = _mm256_setzero_ps();
    tail[v] = 0.f;
  }
  // The exact sums of one block against vector v's bytes of block b, as eight f32 lanes.
  auto block_sums = [&](__m256i w, __m256i magnitudes, int v, std::int64_t b) {
    const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[v].blocks.bytes + 32 * b));
    const __m256i pairs =
        kSigned ? _mm256_maddubs_epi16(magnitudes, _mm256_sign_epi8(bytes, w)) : _mm256_maddubs_epi16(w, bytes);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
  };
  std::int64_t b = 0;
  for (; b + 8 <= blocks; b += 8, row += 8 * Layout::kBytes) {
    for (int line = 0; line < 8 * Layout::kBytes; line += 64)
      _mm_prefetch(reinterpret_cast<const char*>(row) + kPrefetchBytes + line, _MM_HINT_T0);
    const __m256 weight_scales = eight_block_halves<kType>(row, 0);
    __m256 factors[kVectors];
    for (int v = 0; v < kVectors; ++v) {
      const __m256 activation_scales = _mm256_loadu_ps(x[v].blocks.scales + b);
      factors[v] = _mm256_mul_ps(weight_scales, activation_scales);
      if constexpr (!kSigned) {
        const __m256 sums = _mm256_cvtepi32_ps(
            _mm256_cvtepi16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[v].blocks.sums32 + b))));
        if constexpr (Layout::kMin)
          offsets[v] =
              _mm256_fmadd_ps(eight_block_halves<kType>(row, 2), _mm256_mul_ps(activation_scales, sums), offsets[v]);
        else
          offsets[v] = _mm256_fnmadd_ps(
              factors[v], _mm256_mul_ps(sums, _mm256_set1_ps(static_cast<float>(Layout::kOffset))), offsets[v]);
      }
    }
    for (int k = 0; k < 8; ++k) {
      const __m256i w = small_block_quants<kType>(row + k * Layout::kBytes);
      const __m256i magnitudes = kSigned ? _mm256_sign_epi8(w, w) : w;
      const __m256i lane = _mm256_set1_epi32(k);
      for (int v = 0; v < kVectors; ++v) {
        __m256& acc = k % 2 == 0 ? acc0[v] : acc1[v];
        acc = _mm256_fmadd_ps(block_sums(w, magnitudes, v, b + k), _mm256_permutevar8x32_ps(factors[v], lane), acc);
      }
    }
  }
  for (; b < blocks; ++b, row += Layout::kBytes) {
    const __m256i w = small_block_quants<kType>(row);
    const __m256i magnitudes = kSigned ? _mm256_sign_epi8(w, w) : w;
    const float scale = load_f16_scale(row), min_scale = Layout::kMin ? load_f16_scale(row + 2) : 0.f;
    for (int v = 0; v < kVectors; ++v) {
      const float factor = scale * x[v].blocks.scales[b];
      acc0[v] = _mm256_fmadd_ps(block_sums(w, magnitudes, v, b), _mm256_set1_ps(factor), acc0[v]);
      if constexpr (Layout::kMin)
        tail[v] += min_scale * x[v].blocks.scales[b] * static_cast<float>(x[v].blocks.sums32[b]);
      else if constexpr (!kSigned)
        tail[v] -= factor * static_cast<float>(Layout::kOffset * x[v].blocks.sums32[b]);
    }
  }
  for (int v = 0; v < kVectors; ++v)
    out[v] = horizontal_sum(_mm256_add_ps(_mm256_add_ps(acc0[v], acc1[v]), offsets[v])) + tail[v];
}

template <GgufType kType>
float small_block_dot(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks) {
  float out;
  small_block_dot_vectors<kType, 1>(row, &x, blocks, &out);
  return out;
}

// Shuffles that broadcast 16-bit word j of each 128-bit lane (a sub-block's scale).
inline __m256i word_broadcast(int j) { return _mm256_set1_epi16(static_cast<short>((2 * j) | ((2 * j + 1) << 8))); }

// Pair `pair`'s 64 quants of a Q4_K/Q5_K super-block: sub-block 2p in `low`, 2p+1 in `high` (32 each).
// Q5_K's fifth bits (`high_bits`, the block's 32 bytes of them): bit 2p of byte l for low-nibble element
// l, bit 2p+1 for the high-nibble one, moved to bit 4.
template <bool kFifthBits>
inline void q4_q5_k_pair_quants(const std::uint8_t* block, __m256i high_bits, int pair, __m256i& low, __m256i& high) {
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
float q4_q5_k_dot(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks) {
  constexpr int kBlockBytes = kFifthBits ? 176 : 144;
  __m256 acc = _mm256_setzero_ps();
  __m128 mins_acc = _mm_setzero_ps();
  for (std::int64_t s = 0; s < blocks; ++s, row += kBlockBytes) {
    for (int ahead = 0; ahead < kBlockBytes; ahead += 64)
      _mm_prefetch(reinterpret_cast<const char*>(row) + kPrefetchBytes + ahead, _MM_HINT_T0);
    const __m128i packed_scales = k_quant_scales_and_mins(row + 4);
    const __m256i scales = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(packed_scales));
    const float x_scale = x.super_blocks.scales[s];
    mins_acc = _mm_fmadd_ps(_mm_cvtepi32_ps(k_quant_min_sums(packed_scales, x.super_blocks.sums32 + 8 * s)),
                            _mm_set1_ps(load_f16_scale(row + 2) * x_scale), mins_acc);
    __m256i high_bits = _mm256_setzero_si256();
    if constexpr (kFifthBits) high_bits = load256(row + 16);
    const std::int8_t* bytes = x.super_blocks.bytes + 256 * s;
    __m256i sum = _mm256_setzero_si256();
    for (int pair = 0; pair < 4; ++pair, bytes += 64) {
      __m256i low, high;
      q4_q5_k_pair_quants<kFifthBits>(row, high_bits, pair, low, high);
      const __m256i low_products = _mm256_maddubs_epi16(low, load256(bytes));
      const __m256i high_products = _mm256_maddubs_epi16(high, load256(bytes + 32));
      sum =
          _mm256_add_epi32(sum, _mm256_madd_epi16(low_products, _mm256_shuffle_epi8(scales, word_broadcast(2 * pair))));
      sum = _mm256_add_epi32(
          sum, _mm256_madd_epi16(high_products, _mm256_shuffle_epi8(scales, word_broadcast(2 * pair + 1))));
    }
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(load_f16_scale(row) * x_scale), acc);
  }
  return horizontal_sum(acc) - horizontal_sum(mins_acc);
}

// Shuffle indices that pick, for vector k of a Q6_K half, the scale of its low 128-bit lane's group (2k)
// and of its high one's (2k+1) out of q6_k_half_scales.
inline void q6_k_group_scale_index(__m256i (&index)[4]) {
  for (int k = 0; k < 4; ++k)
    index[k] = _mm256_setr_m128i(_mm_set1_epi16(static_cast<short>((4 * k) | ((4 * k + 1) << 8))),
                                 _mm_set1_epi16(static_cast<short>((4 * k + 2) | ((4 * k + 3) << 8))));
}

// Half `half`'s eight 16-bit scales (of the super-block's sixteen in `scales`) in both 128-bit lanes.
// Two calls with constant immediates: a computed one does not fold at -O1.
inline __m256i q6_k_half_scales(__m256i scales, int half) {
  return half == 0 ? _mm256_permute2x128_si256(scales, scales, 0x00) : _mm256_permute2x128_si256(scales, scales, 0x11);
}

// Q6_K against one-byte activations: per super-block d * x_scale * sum over groups of 16 of
// sc * (sum(q b) - 32 sum(b)), exact in 32 bits; the quants (0..63) from q6_k_half_quants.
float q6_k_dot(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks) {
  __m256i group_scale[4];
  q6_k_group_scale_index(group_scale);
  __m256 acc = _mm256_setzero_ps();
  for (std::int64_t s = 0; s < blocks; ++s, row += 210) {
    for (int ahead = 0; ahead < 256; ahead += 64)
      _mm_prefetch(reinterpret_cast<const char*>(row) + kPrefetchBytes + ahead, _MM_HINT_T0);
    const __m256i scales = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 192)));
    // -32 * sum over the groups of sc * (sum of their bytes).
    __m256i sum = q6_k_offsets(scales, x.super_blocks.sums16 + 16 * s);
    const std::int8_t* bytes = x.super_blocks.bytes + 256 * s;
    for (int half = 0; half < 2; ++half) {
      const __m256i half_scales = q6_k_half_scales(scales, half);
      __m256i quants[4];
      q6_k_half_quants(row, half, quants);
      for (int k = 0; k < 4; ++k, bytes += 32)
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(quants[k], load256(bytes)),
                                                      _mm256_shuffle_epi8(half_scales, group_scale[k])));
    }
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(load_f16_scale(row + 208) * x.super_blocks.scales[s]),
                          acc);
  }
  return horizontal_sum(acc);
}

// The K-quant products for kVectors activation vectors at once (a prompt's rows, a speculative check's): the
// weights' unpacking done once for all of them, each vector's sums by exactly the steps of the one-vector
// kernel above, so that each result is bit-identical to that kernel's.
template <bool kFifthBits, int kVectors>
void q4_q5_k_dot_vectors(const std::uint8_t* row, const QuantizedActivations* x, std::int64_t blocks, float* out) {
  constexpr int kBlockBytes = kFifthBits ? 176 : 144;
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
      mins_acc[v] = _mm_fmadd_ps(_mm_cvtepi32_ps(k_quant_min_sums(packed_scales, x[v].super_blocks.sums32 + 8 * s)),
                                 _mm_set1_ps(dmin * x[v].super_blocks.scales[s]), mins_acc[v]);
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
        const std::int8_t* bytes = x[v].super_blocks.bytes + 256 * s + 64 * pair;
        sum[v] = _mm256_add_epi32(sum[v], _mm256_madd_epi16(_mm256_maddubs_epi16(low, load256(bytes)), low_scale));
        sum[v] =
            _mm256_add_epi32(sum[v], _mm256_madd_epi16(_mm256_maddubs_epi16(high, load256(bytes + 32)), high_scale));
      }
    }
    for (int v = 0; v < kVectors; ++v)
      acc[v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[v]), _mm256_set1_ps(d * x[v].super_blocks.scales[s]), acc[v]);
  }
  for (int v = 0; v < kVectors; ++v) out[v] = horizontal_sum(acc[v]) - horizontal_sum(mins_acc[v]);
}

template <int kVectors>
void q6_k_dot_vectors(const std::uint8_t* row, const QuantizedActivations* x, std::int64_t blocks, float* out) {
  __m256i group_scale[4];
  q6_k_group_scale_index(group_scale);
  __m256 acc[kVectors];
  for (__m256& a : acc) a = _mm256_setzero_ps();
  for (std::int64_t s = 0; s < blocks; ++s, row += 210) {
    for (int ahead = 0; ahead < 256; ahead += 64)
      _mm_prefetch(reinterpret_cast<const char*>(row) + kPrefetchBytes + ahead, _MM_HINT_T0);
    const __m256i scales = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 192)));
    __m256i sum[kVectors];
    for (int v = 0; v < kVectors; ++v) sum[v] = q6_k_offsets(scales, x[v].super_blocks.sums16 + 16 * s);
    for (int half = 0; half < 2; ++half) {
      const __m256i half_scales = q6_k_half_scales(scales, half);
      __m256i quants[4];
      q6_k_half_quants(row, half, quants);
      for (int k = 0; k < 4; ++k) {
        const __m256i group = _mm256_shuffle_epi8(half_scales, group_scale[k]);
        for (int v = 0; v < kVectors; ++v)
          sum[v] = _mm256_add_epi32(
              sum[v], _mm256_madd_epi16(_mm256_maddubs_epi16(quants[k], load256(x[v].super_blocks.bytes + 256 * s +
                                                                                128 * half + 32 * k)),
                                        group));
      }
    }
    const float d = load_f16_scale(row + 208);
    for (int v = 0; v < kVectors; ++v)
      acc[v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[v]), _mm256_set1_ps(d * x[v].super_blocks.scales[s]), acc[v]);
  }
  for (int v = 0; v < kVectors; ++v) out[v] = horizontal_sum(acc[v]);
}

}  // namespace

template <GgufType kType>
float dot_small_block(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks) {
  return small_block_dot<kType>(row, x, blocks);
}

#define KVCHAT_INSTANTIATE(type) \
  template float dot_small_block<GgufType::type>(const std::uint8_t*, const QuantizedActivations&, std::int64_t);
KVCHAT_SMALL_BLOCK_TYPES(KVCHAT_INSTANTIATE)
#undef KVCHAT_INSTANTIATE

float dot_q4_k(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks) {
  return q4_q5_k_dot<false>(row, x, blocks);
}
float dot_q5_k(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks) {
  return q4_q5_k_dot<true>(row, x, blocks);
}
float dot_q6_k(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks) {
  return q6_k_dot(row, x, blocks);
}

// Four vectors at a time: with the unpacked weights, what the 16 registers hold. These kernels prefetch
// (into L1) whatever the group.
constexpr int kWidestGroup = 4;

// Each as for_row_tile calls it: the kernel template for the group's width.
void dots_small_block_q8_0(const RowTile& tile, const QuantizedActivations* x, std::int64_t blocks, int count) {
  for_row_tile<kWidestGroup>(
      tile, x, count, [&](auto width, auto, const std::uint8_t* row, const QuantizedActivations* group, float* sums) {
        small_block_dot_vectors<GgufType::Q8_0, decltype(width)::value>(row, group, blocks, sums);
      });
}
void dots_q4_k(const RowTile& tile, const QuantizedActivations* x, std::int64_t blocks, int count) {
  for_row_tile<kWidestGroup>(
      tile, x, count, [&](auto width, auto, const std::uint8_t* row, const QuantizedActivations* group, float* sums) {
        q4_q5_k_dot_vectors<false, decltype(width)::value>(row, group, blocks, sums);
      });
}
void dots_q5_k(const RowTile& tile, const QuantizedActivations* x, std::int64_t blocks, int count) {
  for_row_tile<kWidestGroup>(
      tile, x, count, [&](auto width, auto, const std::uint8_t* row, const QuantizedActivations* group, float* sums) {
        q4_q5_k_dot_vectors<true, decltype(width)::value>(row, group, blocks, sums);
      });
}
void dots_q6_k(const RowTile& tile, const QuantizedActivations* x, std::int64_t blocks, int count) {
  for_row_tile<kWidestGroup>(
      tile, x, count, [&](auto width, auto, const std::uint8_t* row, const QuantizedActivations* group, float* sums) {
        q6_k_dot_vectors<decltype(width)::value>(row, group, blocks, sums);
      });
}

}  // namespace kvchat::kernels::avx2
#endif  // KVCHAT_HAVE_AVX2_KERNELS
