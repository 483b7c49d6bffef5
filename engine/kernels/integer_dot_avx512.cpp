// The AVX-512 integer dot products (integer_dot.h), for processors with AVX-512 F/BW/VL and VNNI.
//
// The types with blocks of 32 (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, one byte per activation with a scale per
// block): see dot_q8_0 and dot_nibble_blocks below.
//
// The K-quants (one byte per activation, a scale per super-block): see the second section below.
// Block layouts: engine/gguf/gguf_types.cpp.
#include <cstring>

#include "engine/kernels/block_types.h"
#include "engine/kernels/cpu_features.h"
#include "engine/kernels/integer_dot.h"
#include "engine/kernels/vector_math_avx2.h"

#if KVCHAT_HAVE_AVX2_KERNELS
#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__) || !defined(__AVX512VNNI__)
#error "integer_dot_avx512.cpp is compiled with the AVX-512 flags and VNNI (engine/CMakeLists.txt)"
#endif

namespace kvchat::kernels::avx512 {
namespace {

// As in the AVX2 kernels: each thread reads its rows as one linear stream, and a software prefetch
// keeps enough misses in flight. These kernels go through a block about twice as fast, so they look
// further ahead, and into L2: 16 KiB ahead, the best of the distances and targets tried (DESIGN's tuning
// table). The K-quant kernels below found the same.
constexpr std::int64_t kPrefetchBytes = 16384;

inline __m256i load256(const void* at) { return _mm256_loadu_si256(static_cast<const __m256i*>(at)); }

// Lane indices for _mm512_permutexvar_ps: element `low` in lanes 0-7, element `high` in lanes 8-15 (the
// factors of two blocks whose sums share a register).
inline __m512i two_lane_groups(int low, int high) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(low)), _mm256_set1_epi32(high), 1);
}

// A row's blocks from `first` on (fewer than eight: what the kernels below leave), through the AVX2 kernel.
template <GgufType kType>
inline float avx2_tail(const std::uint8_t* rest, const QuantizedActivations& x, std::int64_t first,
                       std::int64_t blocks) {
  if (first == blocks) return 0.f;
  QuantizedActivations from_first = x;
  from_first.blocks = {x.blocks.bytes + 32 * first, x.blocks.scales + first, x.blocks.sums16 + 2 * first,
                       x.blocks.sums32 + first};
  return avx2::dot_small_block<kType>(rest, from_first, blocks - first);
}

// Q8_0 against one-byte activations (AVX-512 VNNI), eight blocks at a time: two blocks' 64 quants in one
// register, |w| times the bytes carrying w's sign through vpdpbusd (sixteen exact 32-bit sums of four
// products, the first block's in lanes 0-7, the second's in 8-15; |byte| <= 127, so negating cannot
// overflow; a quant of -128 gives |w| = 128 as an unsigned byte), so one conversion and one FMA serve
// two blocks. The eight blocks' f16 scales are gathered and converted together and multiplied by the
// activations' scales. A row's last blocks (fewer than eight) go through the AVX2 kernel.
// One pass over a row serves kVectors activation vectors: 1 (decode: the row streams from memory, prefetched) or up
// to 5 (a prompt's rows, a speculative check's; the first group of a row prefetches it too): the quants, |w|, w's sign
// mask and the weights' eight scales are made once for all of them, and each vector's sums take the same steps in the
// same order, so a several-vector result is bit-identical to the one-vector one.
template <int kVectors, bool kPrefetch = true>
void q8_0_dot_vectors(const std::uint8_t* row, const QuantizedActivations* x, std::int64_t blocks, float* out) {
  __m512i pair_factor_index[4];
  for (int pair = 0; pair < 4; ++pair) pair_factor_index[pair] = two_lane_groups(2 * pair, 2 * pair + 1);
  const __m512i zero = _mm512_setzero_si512();
  __m512 acc0[kVectors], acc1[kVectors];
  for (int v = 0; v < kVectors; ++v) acc0[v] = acc1[v] = _mm512_setzero_ps();
  const std::uint8_t* const start = row;
  std::int64_t b = 0;
  for (; b + 8 <= blocks; b += 8, row += 8 * 34) {
    const __m256 weight_scales = eight_block_halves<GgufType::Q8_0>(row, 0);
    __m512 factors[kVectors];
    for (int v = 0; v < kVectors; ++v)
      factors[v] = _mm512_castps256_ps512(_mm256_mul_ps(weight_scales, _mm256_loadu_ps(x[v].blocks.scales + b)));
    for (int pair = 0; pair < 4; ++pair) {
      const std::uint8_t* first = row + 68 * pair;
      if constexpr (kPrefetch) _mm_prefetch(reinterpret_cast<const char*>(first) + kPrefetchBytes, _MM_HINT_T1);
      const __m512i quants = _mm512_inserti64x4(_mm512_castsi256_si512(load256(first + 2)), load256(first + 36), 1);
      const __mmask64 negative = _mm512_movepi8_mask(quants);
      const __m512i magnitudes = _mm512_abs_epi8(quants);
      for (int v = 0; v < kVectors; ++v) {
        const __m512i bytes = _mm512_loadu_si512(x[v].blocks.bytes + 32 * (b + 2 * pair));
        const __m512i signed_bytes = _mm512_mask_sub_epi8(bytes, negative, zero, bytes);
        const __m512i sums = _mm512_dpbusd_epi32(zero, magnitudes, signed_bytes);
        __m512& acc = pair % 2 == 0 ? acc0[v] : acc1[v];
        acc =
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), _mm512_permutexvar_ps(pair_factor_index[pair], factors[v]), acc);
      }
    }
  }
  for (int v = 0; v < kVectors; ++v)
    out[v] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[v], acc1[v])) +
             avx2_tail<GgufType::Q8_0>(start + 34 * b, x[v], b, blocks);
}

float dot_q8_0(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks) {
  float out;
  q8_0_dot_vectors<1>(row, &x, blocks, &out);
  return out;
}

// Q4_0, Q4_1, Q5_0, Q5_1 read eight blocks (144 to 192 bytes) as three 64-byte registers and take every
// field out of them with word permutes (vpermt2w; every field of these layouts starts at an even byte):
// a pair of blocks' 32 nibble bytes as [first, first, second, second] 128-bit lanes, which a shift by 0
// or 4 and a mask make 64 quants in element order; the eight f16 scales (and mins) into one 128-bit
// vector. Loading each block's fields on its own took twice the instructions: these kernels were bound by
// them (two cores: 48 % of the bandwidth for Q4_0 against 78 % for Q4_K).
template <GgufType kType>
struct NibbleGroupIndices {
  using Layout = SmallBlockLayout<kType>;
  static constexpr int kGroupBytes = 8 * Layout::kBytes;  // at most 192: three registers
  static_assert(kGroupBytes > 128 && kGroupBytes <= 192 && Layout::kBytes % 2 == 0 && Layout::kQuantsAt % 2 == 0);
  // The register pair (r, r + 1) that holds pair p's nibbles, and the word indices into it.
  static constexpr int first_register(int pair) {
    const int r = (2 * pair * Layout::kBytes + Layout::kQuantsAt) / 64;
    return r > 1 ? 1 : r;
  }
  struct Words {
    short index[32];
  };
  static constexpr Words pair_words(int pair) {
    Words words{};
    for (int j = 0; j < 32; ++j) {
      const int block = 2 * pair + j / 16, byte = block * Layout::kBytes + Layout::kQuantsAt + 2 * (j % 8);
      words.index[j] = static_cast<short>((byte - 64 * first_register(pair)) / 2);
    }
    return words;
  }
  // An f16 field at `offset` of each block into words 0-7: from registers 0 and 1, then (for the
  // fields past byte 128) from register 2 over the first result.
  static constexpr Words field_words(int offset, bool from_third) {
    Words words{};
    for (int k = 0; k < 8; ++k) {
      const int byte = k * Layout::kBytes + offset;
      words.index[k] =
          static_cast<short>(from_third ? (byte >= 128 ? 32 + (byte - 128) / 2 : k) : (byte < 128 ? byte / 2 : 0));
    }
    return words;
  }
  static constexpr bool needs_third(int offset) { return 7 * Layout::kBytes + offset >= 128; }
};

template <GgufType kType>
inline __m512i load_words(const typename NibbleGroupIndices<kType>::Words& words) {
  return _mm512_loadu_si512(words.index);
}

// Eight blocks' f16 fields at `offset` as eight floats, from the group's registers.
template <GgufType kType>
inline __m256 group_field(const __m512i (&group)[3], __m512i first_index, __m512i third_index, int offset) {
  __m512i words = _mm512_permutex2var_epi16(group[0], first_index, group[1]);
  if (NibbleGroupIndices<kType>::needs_third(offset)) words = _mm512_permutex2var_epi16(words, third_index, group[2]);
  return _mm256_cvtph_ps(_mm512_castsi512_si128(words));
}

// The kernel (AVX-512 VNNI): unsigned quants (0..31) through vpdpbusd against the bytes; each block's
// offset (Q4_0's 8, Q5_0's 16) or min (Q4_1/Q5_1's m) against the activations' block sums, eight blocks
// at once: d * s * sum q byte - offset * d * s * sum byte, or + m * s * sum byte. The offset's term is
// rounded apart from the quants' (it is exact in llama.cpp's sign trick, which costs three instructions
// per pair more); the error stays within f32 rounding of sum |q| |byte| instead of sum |q - offset| |byte|.
template <GgufType kType>
float dot_nibble_blocks(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks) {
  using Layout = SmallBlockLayout<kType>;
  using Indices = NibbleGroupIndices<kType>;
  static constexpr typename Indices::Words kPairWords[4] = {Indices::pair_words(0), Indices::pair_words(1),
                                                            Indices::pair_words(2), Indices::pair_words(3)};
  static constexpr
      typename Indices::Words kScaleWords[2] = {Indices::field_words(0, false), Indices::field_words(0, true)};
  static constexpr
      typename Indices::Words kMinWords[2] = {Indices::field_words(2, false), Indices::field_words(2, true)};
  const ActivationBytes& in = x.blocks;
  __m512i pair_index[4], pair_factor_index[4];
  for (int pair = 0; pair < 4; ++pair) {
    pair_index[pair] = load_words<kType>(kPairWords[pair]);
    pair_factor_index[pair] = two_lane_groups(2 * pair, 2 * pair + 1);
  }
  const __m512i scale_index[2] = {load_words<kType>(kScaleWords[0]), load_words<kType>(kScaleWords[1])};
  const __m512i min_index[2] = {load_words<kType>(kMinWords[0]), load_words<kType>(kMinWords[1])};
  const __m512i nibble_shift = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4), low_mask = _mm512_set1_epi8(0x0F);
  const __mmask64 last_register =
      _cvtu64_mask64(Indices::kGroupBytes == 192 ? ~0ull : (1ull << (Indices::kGroupBytes - 128)) - 1);
  const __m512i zero = _mm512_setzero_si512();
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  __m256 offsets = _mm256_setzero_ps();
  std::int64_t b = 0;
  for (; b + 8 <= blocks; b += 8, row += Indices::kGroupBytes) {
    _mm_prefetch(reinterpret_cast<const char*>(row) + kPrefetchBytes, _MM_HINT_T1);
    _mm_prefetch(reinterpret_cast<const char*>(row) + kPrefetchBytes + 64, _MM_HINT_T1);
    _mm_prefetch(reinterpret_cast<const char*>(row) + kPrefetchBytes + 128, _MM_HINT_T1);
    // The last register only as far as the group goes (masked bytes are not read: no fault past a row).
    const __m512i group[3] = {_mm512_loadu_si512(row), _mm512_loadu_si512(row + 64),
                              _mm512_maskz_loadu_epi8(last_register, row + 128)};
    const __m256 activation_scales = _mm256_loadu_ps(in.scales + b);
    const __m256 d = group_field<kType>(group, scale_index[0], scale_index[1], 0);
    const __m256 factors = _mm256_mul_ps(d, activation_scales);
    const __m256 block_sums =
        _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in.sums32 + b))));
    if constexpr (Layout::kMin) {
      const __m256 m = group_field<kType>(group, min_index[0], min_index[1], 2);
      offsets = _mm256_fmadd_ps(m, _mm256_mul_ps(activation_scales, block_sums), offsets);
    } else {
      offsets = _mm256_fnmadd_ps(
          factors, _mm256_mul_ps(block_sums, _mm256_set1_ps(static_cast<float>(Layout::kOffset))), offsets);
    }
    const __m512 factors512 = _mm512_castps256_ps512(factors);
    for (int pair = 0; pair < 4; ++pair) {
      const int r = Indices::first_register(pair);
      const __m512i nibbles = _mm512_permutex2var_epi16(group[r], pair_index[pair], group[r + 1]);
      __m512i quants = _mm512_and_si512(_mm512_srlv_epi64(nibbles, nibble_shift), low_mask);
      if constexpr (Layout::kFifthBitsAt >= 0) {
        std::uint32_t low, high;
        std::memcpy(&low, row + 2 * pair * Layout::kBytes + Layout::kFifthBitsAt, 4);
        std::memcpy(&high, row + (2 * pair + 1) * Layout::kBytes + Layout::kFifthBitsAt, 4);
        quants = _mm512_mask_add_epi8(quants, _cvtu64_mask64(low | std::uint64_t{high} << 32), quants,
                                      _mm512_set1_epi8(0x10));
      }
      const __m512i sums = _mm512_dpbusd_epi32(zero, quants, _mm512_loadu_si512(in.bytes + 32 * (b + 2 * pair)));
      __m512& acc = pair % 2 == 0 ? acc0 : acc1;
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), _mm512_permutexvar_ps(pair_factor_index[pair], factors512), acc);
    }
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + horizontal_sum(offsets) +
         avx2_tail<kType>(row, x, b, blocks);
}

// ---------------------------------------------------------------------------------------------
// The K-quants against one-byte activations (one scale per super-block), with AVX-512 VNNI: vpdpbusd
// multiplies 64 unsigned quants by 64 signed bytes into sixteen 32-bit sums of four products each (at
// most 4 * 63 * 128 < 2^15, so two such vectors pack to 16-bit words without saturating), and vpdpwssd
// weights those words by the sub-block scales and adds them up: a super-block ends as one vector of
// exact 32-bit sums, converted to f32 once.

// They prefetch as the kernels above (kPrefetchBytes into L2): one core streaming Q4_K rows from
// memory, 16 KiB into L2 gave 4-10 % more than 4 KiB into L1 in three runs of four, the same in the
// fourth. (Loading a Q4_K pair group's 64 bytes whole, with the activations stored in its nibbles'
// order, ran 10 % faster in cache but no faster from memory, where decode reads them, so it was not kept.)

// Word indices for _mm512_permutexvar_epi16 that place 16-bit scales under the words of
// _mm512_packs_epi32(a, b): 128-bit lane L holds a's 32-bit lanes 4L..4L+3, then b's. `a_low`, `a_high`:
// the scale of a's lanes 0-7 and 8-15 (likewise for b), for lane groups of 8; Q6_K's groups of 4 lanes
// are handled by its own table.
inline __m512i packed_scale_index(int a_low, int a_high, int b_low, int b_high) {
  alignas(64) std::int16_t index[32];
  for (int lane = 0; lane < 4; ++lane)
    for (int k = 0; k < 8; ++k)
      index[8 * lane + k] = static_cast<std::int16_t>(lane < 2 ? (k < 4 ? a_low : b_low) : (k < 4 ? a_high : b_high));
  return _mm512_load_si512(index);
}

// Q4_K / Q5_K: d * x_scale * sum(sc * sum(q b)) - dmin * x_scale * sum(m * sum(b)). Pair p's 32 bytes
// hold sub-block 2p in their low nibbles and 2p+1 in their high ones: broadcast to both halves of a
// 512-bit register and shifted by 0 and 4, they give the pair's 64 quants in element order. Q5_K's fifth
// bits: bit 2p of byte l for element l of sub-block 2p, bit 2p+1 for sub-block 2p+1 (`high_bits`: the
// block's 32 bytes of them in both halves).
template <bool kFifthBits>
inline __m512i q4_q5_k_pair_quants(const std::uint8_t* block, __m512i high_bits, int pair) {
  const __m512i low_mask = _mm512_set1_epi8(0x0F), fifth = _mm512_set1_epi8(0x10);
  const __m512i nibble_shift = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
  __m512i quants = _mm512_and_si512(
      _mm512_srlv_epi64(_mm512_broadcast_i64x4(load256(block + (kFifthBits ? 48 : 16) + 32 * pair)), nibble_shift),
      low_mask);
  if constexpr (kFifthBits) {
    const __m512i bit_shift = _mm512_setr_epi64(2 * pair, 2 * pair, 2 * pair, 2 * pair, 2 * pair + 1, 2 * pair + 1,
                                                2 * pair + 1, 2 * pair + 1);
    quants =
        _mm512_or_si512(quants, _mm512_and_si512(_mm512_slli_epi64(_mm512_srlv_epi64(high_bits, bit_shift), 4), fifth));
  }
  return quants;
}

template <bool kFifthBits>
float q4_q5_k_dot(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks) {
  constexpr int kBlockBytes = kFifthBits ? 176 : 144;
  // Pairs 2g and 2g+1 packed together: sub-blocks 4g (low lanes of the first), 4g+1, 4g+2, 4g+3.
  const __m512i scale_index[2] = {packed_scale_index(0, 1, 2, 3), packed_scale_index(4, 5, 6, 7)};
  __m512 acc = _mm512_setzero_ps();
  __m128 mins_acc = _mm_setzero_ps();
  for (std::int64_t s = 0; s < blocks; ++s, row += kBlockBytes) {
    for (int ahead = 0; ahead < kBlockBytes; ahead += 64)
      _mm_prefetch(reinterpret_cast<const char*>(row) + kPrefetchBytes + ahead, _MM_HINT_T1);
    const __m128i packed_scales = k_quant_scales_and_mins(row + 4);
    const __m512i scale_words = _mm512_castsi128_si512(_mm_cvtepu8_epi16(packed_scales));
    std::uint32_t halves;
    std::memcpy(&halves, row, 4);
    // d * x_scale and dmin * x_scale.
    const __m128 factors =
        _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(halves))), _mm_set1_ps(x.super_blocks.scales[s]));
    mins_acc = _mm_fmadd_ps(_mm_cvtepi32_ps(k_quant_min_sums(packed_scales, x.super_blocks.sums32 + 8 * s)),
                            _mm_shuffle_ps(factors, factors, 0x55), mins_acc);
    __m512i high_bits = _mm512_setzero_si512();
    if constexpr (kFifthBits) high_bits = _mm512_broadcast_i64x4(load256(row + 16));
    const std::int8_t* bytes = x.super_blocks.bytes + 256 * s;
    __m512i sum = _mm512_setzero_si512();
    for (int group = 0; group < 2; ++group) {
      __m512i products[2];
      for (int half = 0; half < 2; ++half) {
        const int pair = 2 * group + half;
        const __m512i quants = q4_q5_k_pair_quants<kFifthBits>(row, high_bits, pair);
        products[half] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), quants, _mm512_loadu_si512(bytes + 64 * pair));
      }
      sum = _mm512_dpwssd_epi32(sum, _mm512_packs_epi32(products[0], products[1]),
                                _mm512_permutexvar_epi16(scale_index[group], scale_words));
    }
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_broadcastss_ps(factors), acc);
  }
  return _mm512_reduce_add_ps(acc) - horizontal_sum(mins_acc);
}

// The same products for kVectors activation vectors at once (a prompt's rows, a speculative check's): the
// weights' unpacking (scales, quants, the scales' word order) is done once for all of them, and each
// vector's sums take exactly the steps of q4_q5_k_dot in the same order, so each result is bit-identical
// to that kernel's. Up to five vectors keep their accumulators and pointers in registers. A row's first group
// of vectors reads it from memory, and prefetches as decode does (kPrefetch); the next groups find it in cache.
template <bool kFifthBits, int kVectors, bool kPrefetch>
void q4_q5_k_dot_vectors(const std::uint8_t* row, const QuantizedActivations* x, std::int64_t blocks, float* out) {
  constexpr int kBlockBytes = kFifthBits ? 176 : 144;
  const __m512i scale_index[2] = {packed_scale_index(0, 1, 2, 3), packed_scale_index(4, 5, 6, 7)};
  __m512 acc[kVectors];
  __m128 mins_acc[kVectors];
  for (int v = 0; v < kVectors; ++v) {
    acc[v] = _mm512_setzero_ps();
    mins_acc[v] = _mm_setzero_ps();
  }
  for (std::int64_t s = 0; s < blocks; ++s, row += kBlockBytes) {
    if constexpr (kPrefetch)
      for (int ahead = 0; ahead < kBlockBytes; ahead += 64)
        _mm_prefetch(reinterpret_cast<const char*>(row) + kPrefetchBytes + ahead, _MM_HINT_T1);
    const __m128i packed_scales = k_quant_scales_and_mins(row + 4);
    const __m512i scale_words = _mm512_castsi128_si512(_mm_cvtepu8_epi16(packed_scales));
    const __m512i group_scales[2] = {_mm512_permutexvar_epi16(scale_index[0], scale_words),
                                     _mm512_permutexvar_epi16(scale_index[1], scale_words)};
    std::uint32_t halves;
    std::memcpy(&halves, row, 4);
    const __m128 d_and_dmin = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(halves)));
    __m512i high_bits = _mm512_setzero_si512();
    if constexpr (kFifthBits) high_bits = _mm512_broadcast_i64x4(load256(row + 16));
    __m512i quants[4];
    for (int pair = 0; pair < 4; ++pair) quants[pair] = q4_q5_k_pair_quants<kFifthBits>(row, high_bits, pair);
    for (int v = 0; v < kVectors; ++v) {
      const __m128 factors = _mm_mul_ps(d_and_dmin, _mm_set1_ps(x[v].super_blocks.scales[s]));
      mins_acc[v] = _mm_fmadd_ps(_mm_cvtepi32_ps(k_quant_min_sums(packed_scales, x[v].super_blocks.sums32 + 8 * s)),
                                 _mm_shuffle_ps(factors, factors, 0x55), mins_acc[v]);
      const std::int8_t* bytes = x[v].super_blocks.bytes + 256 * s;
      __m512i sum = _mm512_setzero_si512();
      for (int group = 0; group < 2; ++group) {
        const __m512i first =
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), quants[2 * group], _mm512_loadu_si512(bytes + 128 * group));
        const __m512i second = _mm512_dpbusd_epi32(_mm512_setzero_si512(), quants[2 * group + 1],
                                                   _mm512_loadu_si512(bytes + 128 * group + 64));
        sum = _mm512_dpwssd_epi32(sum, _mm512_packs_epi32(first, second), group_scales[group]);
      }
      acc[v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_broadcastss_ps(factors), acc[v]);
    }
  }
  for (int v = 0; v < kVectors; ++v) out[v] = _mm512_reduce_add_ps(acc[v]) - horizontal_sum(mins_acc[v]);
}

// Q6_K: d * x_scale * sum over groups of 16 of sc * (sum(q b) - 32 sum(b)). Half h's 64 low bytes give
// elements 0-63 of the half in their low nibbles and 64-127 in their high ones, each 32 taking two of
// the 32 top bytes' bit pairs: elements 32k..32k+31 bits 2k..2k+1.
// Word indices for _mm512_permutexvar_epi16 that place half h's group scales under the packed words of
// its two products: lane L holds group 8h + L (first products) and 8h + 4 + L (second).
inline __m512i q6_k_scale_index(int half) {
  alignas(64) std::int16_t index[32];
  for (int lane = 0; lane < 4; ++lane)
    for (int k = 0; k < 8; ++k) index[8 * lane + k] = static_cast<std::int16_t>(8 * half + lane + (k < 4 ? 0 : 4));
  return _mm512_load_si512(index);
}

// Half h's 128 unsigned quants (0..63) in two 512-bit vectors: `first` elements 0-63, `second` 64-127.
inline void q6_k_half_quants_512(const std::uint8_t* block, int half, __m512i& first, __m512i& second) {
  const __m512i low_mask = _mm512_set1_epi8(0x0F), top_mask = _mm512_set1_epi8(0x30);
  // Top bits of elements 0-31 (bits 0-1) and 32-63 (bits 2-3) moved to bits 4-5; of 64-95 (bits 4-5)
  // and 96-127 (bits 6-7) likewise.
  const __m512i first_top_shift = _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2);
  const __m512i second_top_shift = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);
  const __m512i low = _mm512_loadu_si512(block + 64 * half);
  const __m512i top = _mm512_broadcast_i64x4(load256(block + 128 + 32 * half));
  first = _mm512_or_si512(_mm512_and_si512(low, low_mask),
                          _mm512_and_si512(_mm512_sllv_epi64(top, first_top_shift), top_mask));
  second = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi64(low, 4), low_mask),
                           _mm512_and_si512(_mm512_srlv_epi64(top, second_top_shift), top_mask));
}

float q6_k_dot(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks) {
  const __m512i scale_index[2] = {q6_k_scale_index(0), q6_k_scale_index(1)};
  __m512 acc = _mm512_setzero_ps();
  for (std::int64_t s = 0; s < blocks; ++s, row += 210) {
    for (int ahead = 0; ahead < 256; ahead += 64)
      _mm_prefetch(reinterpret_cast<const char*>(row) + kPrefetchBytes + ahead, _MM_HINT_T1);
    const __m256i scales = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 192)));
    const __m512i scale_words = _mm512_castsi256_si512(scales);
    // -32 * sum over the groups of sc * (sum of their bytes).
    __m512i sum = _mm512_zextsi256_si512(q6_k_offsets(scales, x.super_blocks.sums16 + 16 * s));
    const std::int8_t* bytes = x.super_blocks.bytes + 256 * s;
    for (int half = 0; half < 2; ++half, bytes += 128) {
      __m512i first, second;
      q6_k_half_quants_512(row, half, first, second);
      const __m512i first_products = _mm512_dpbusd_epi32(_mm512_setzero_si512(), first, _mm512_loadu_si512(bytes));
      const __m512i second_products =
          _mm512_dpbusd_epi32(_mm512_setzero_si512(), second, _mm512_loadu_si512(bytes + 64));
      sum = _mm512_dpwssd_epi32(sum, _mm512_packs_epi32(first_products, second_products),
                                _mm512_permutexvar_epi16(scale_index[half], scale_words));
    }
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(load_f16_scale(row + 208) * x.super_blocks.scales[s]),
                          acc);
  }
  return _mm512_reduce_add_ps(acc);
}

// q6_k_dot for kVectors activation vectors at once, as q4_q5_k_dot_vectors: the quants and the scales' word
// order made once, each vector's steps those of q6_k_dot; the first group of vectors prefetches.
template <int kVectors, bool kPrefetch>
void q6_k_dot_vectors(const std::uint8_t* row, const QuantizedActivations* x, std::int64_t blocks, float* out) {
  const __m512i scale_index[2] = {q6_k_scale_index(0), q6_k_scale_index(1)};
  __m512 acc[kVectors];
  for (__m512& a : acc) a = _mm512_setzero_ps();
  for (std::int64_t s = 0; s < blocks; ++s, row += 210) {
    if constexpr (kPrefetch)
      for (int ahead = 0; ahead < 256; ahead += 64)
        _mm_prefetch(reinterpret_cast<const char*>(row) + kPrefetchBytes + ahead, _MM_HINT_T1);
    const __m256i scales = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 192)));
    const __m512i scale_words = _mm512_castsi256_si512(scales);
    const float d = load_f16_scale(row + 208);
    __m512i quants[2][2], half_scales[2];
    for (int half = 0; half < 2; ++half) {
      q6_k_half_quants_512(row, half, quants[half][0], quants[half][1]);
      half_scales[half] = _mm512_permutexvar_epi16(scale_index[half], scale_words);
    }
    for (int v = 0; v < kVectors; ++v) {
      __m512i sum = _mm512_zextsi256_si512(q6_k_offsets(scales, x[v].super_blocks.sums16 + 16 * s));
      const std::int8_t* bytes = x[v].super_blocks.bytes + 256 * s;
      for (int half = 0; half < 2; ++half, bytes += 128) {
        const __m512i first_products =
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), quants[half][0], _mm512_loadu_si512(bytes));
        const __m512i second_products =
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), quants[half][1], _mm512_loadu_si512(bytes + 64));
        sum = _mm512_dpwssd_epi32(sum, _mm512_packs_epi32(first_products, second_products), half_scales[half]);
      }
      acc[v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(d * x[v].super_blocks.scales[s]), acc[v]);
    }
  }
  for (int v = 0; v < kVectors; ++v) out[v] = _mm512_reduce_add_ps(acc[v]);
}

}  // namespace

// Q8_0's own kernel, the 4- and 5-bit types' shared one.
template <GgufType kType>
float dot_small_block(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks) {
  if constexpr (kType == GgufType::Q8_0)
    return dot_q8_0(row, x, blocks);
  else
    return dot_nibble_blocks<kType>(row, x, blocks);
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

// The widest groups whose accumulators and pointers stay in the 32 vector and 16 general registers (wider ones
// spill, and cost more than another pass over the row from L1).
constexpr int kWidestGroup = 5;

// Each as for_row_tile calls it: the kernel template for the group's width, prefetching or not.
void dots_small_block_q8_0(const RowTile& tile, const QuantizedActivations* x, std::int64_t blocks, int count) {
  for_row_tile<kWidestGroup>(
      tile, x, count,
      [&](auto width, auto prefetch, const std::uint8_t* row, const QuantizedActivations* group, float* sums) {
        q8_0_dot_vectors<decltype(width)::value, decltype(prefetch)::value>(row, group, blocks, sums);
      });
}
void dots_q4_k(const RowTile& tile, const QuantizedActivations* x, std::int64_t blocks, int count) {
  for_row_tile<kWidestGroup>(
      tile, x, count,
      [&](auto width, auto prefetch, const std::uint8_t* row, const QuantizedActivations* group, float* sums) {
        q4_q5_k_dot_vectors<false, decltype(width)::value, decltype(prefetch)::value>(row, group, blocks, sums);
      });
}
void dots_q5_k(const RowTile& tile, const QuantizedActivations* x, std::int64_t blocks, int count) {
  for_row_tile<kWidestGroup>(
      tile, x, count,
      [&](auto width, auto prefetch, const std::uint8_t* row, const QuantizedActivations* group, float* sums) {
        q4_q5_k_dot_vectors<true, decltype(width)::value, decltype(prefetch)::value>(row, group, blocks, sums);
      });
}
void dots_q6_k(const RowTile& tile, const QuantizedActivations* x, std::int64_t blocks, int count) {
  for_row_tile<kWidestGroup>(
      tile, x, count,
      [&](auto width, auto prefetch, const std::uint8_t* row, const QuantizedActivations* group, float* sums) {
        q6_k_dot_vectors<decltype(width)::value, decltype(prefetch)::value>(row, group, blocks, sums);
      });
}

}  // namespace kvchat::kernels::avx512
#endif  // KVCHAT_HAVE_AVX2_KERNELS
