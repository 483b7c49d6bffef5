#include "engine/kernels/quantized_matvec.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/gguf/dequantize.h"
#include "engine/kernels/cpu_features.h"
#include "engine/kernels/isa_attributes.h"
#include "engine/kernels/matvec.h"

#if KVCHAT_HAVE_AVX2_KERNELS
#include <immintrin.h>
#endif

namespace kvchat::kernels {
namespace {

// dot(row, x) for one row of `blocks` blocks of a type.
using RowDot = float (*)(const std::uint8_t* row, const float* x, std::int64_t blocks);

#if KVCHAT_HAVE_AVX2_KERNELS
// ---------------------------------------------------------------------------------------------
// AVX2 kernels (every type of the Q4_K_M / Q5_K_M / Q6_K / Q8_0 / Q4_0 files, and F16). A block's
// integers are widened to f32 in registers and multiplied by x; the block's
// scale multiplies the block's sum once (sum d*q_j*x_j = d * sum q_j*x_j). Block layouts are those of
// engine/gguf/dequantize.cpp, which documents them.

// Bytes read ahead of the current block: the rows are one linear stream per thread, and a software
// prefetch keeps enough misses in flight (as for the f32/bf16 kernels).
constexpr std::int64_t kPrefetchBytes = 1024;

KVCHAT_ISA_AVX2 inline float load_f16_scale(const std::uint8_t* at) {
  std::uint16_t bits;
  std::memcpy(&bits, at, 2);
  return _cvtsh_ss(bits);
}

KVCHAT_ISA_AVX2 inline float horizontal_sum(__m256 v) {
  const __m128 folded = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 pairs = _mm_add_ps(folded, _mm_movehl_ps(folded, folded));
  return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_shuffle_ps(pairs, pairs, 1)));
}

// The low 8 signed bytes of v as 8 floats.
KVCHAT_ISA_AVX2 inline __m256 widen_signed(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }
// The low 8 unsigned bytes of v as 8 floats.
KVCHAT_ISA_AVX2 inline __m256 widen_unsigned(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)); }

// sum_j q_j x_j over 16 bytes of (signed or unsigned) integers and 16 floats.
template <bool Signed>
KVCHAT_ISA_AVX2 inline __m256 dot16(__m128i q, const float* x, __m256 acc) {
  const __m128i upper = _mm_srli_si128(q, 8);
  const __m256 a = Signed ? widen_signed(q) : widen_unsigned(q);
  const __m256 b = Signed ? widen_signed(upper) : widen_unsigned(upper);
  acc = _mm256_fmadd_ps(a, _mm256_loadu_ps(x), acc);
  return _mm256_fmadd_ps(b, _mm256_loadu_ps(x + 8), acc);
}

KVCHAT_ISA_AVX2 inline __m256 sum16(const float* x, __m256 acc) {
  return _mm256_add_ps(acc, _mm256_add_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8)));
}

// Q8_0: f16 d, 32 signed bytes.
KVCHAT_ISA_AVX2 float dot_q8_0_avx2(const std::uint8_t* row, const float* x, std::int64_t blocks) {
  __m256 acc = _mm256_setzero_ps();
  for (std::int64_t b = 0; b < blocks; ++b, row += 34, x += 32) {
    _mm_prefetch(reinterpret_cast<const char*>(row) + kPrefetchBytes, _MM_HINT_T0);
    const auto* q = reinterpret_cast<const __m128i*>(row + 2);
    __m256 sum = dot16<true>(_mm_loadu_si128(q), x, _mm256_setzero_ps());
    sum = dot16<true>(_mm_loadu_si128(q + 1), x + 16, sum);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(load_f16_scale(row)), sum, acc);
  }
  return horizontal_sum(acc);
}

// Q4_0: f16 d, 16 bytes of nibbles (low: elements 0-15, high: 16-31), x = d * (q - 8).
KVCHAT_ISA_AVX2 float dot_q4_0_avx2(const std::uint8_t* row, const float* x, std::int64_t blocks) {
  const __m128i low_mask = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
  __m256 acc = _mm256_setzero_ps();
  for (std::int64_t b = 0; b < blocks; ++b, row += 18, x += 32) {
    _mm_prefetch(reinterpret_cast<const char*>(row) + kPrefetchBytes, _MM_HINT_T0);
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2));
    const __m128i low = _mm_sub_epi8(_mm_and_si128(packed, low_mask), eight);
    const __m128i high = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(packed, 4), low_mask), eight);
    __m256 sum = dot16<true>(low, x, _mm256_setzero_ps());
    sum = dot16<true>(high, x + 16, sum);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(load_f16_scale(row)), sum, acc);
  }
  return horizontal_sum(acc);
}

// Q4_1: f16 d, f16 m, 16 bytes of nibbles; x = d * q + m, so a block's dot product is
// d * sum(q x) + m * sum(x).
KVCHAT_ISA_AVX2 float dot_q4_1_avx2(const std::uint8_t* row, const float* x, std::int64_t blocks) {
  const __m128i low_mask = _mm_set1_epi8(0x0F);
  __m256 acc = _mm256_setzero_ps();
  for (std::int64_t b = 0; b < blocks; ++b, row += 20, x += 32) {
    _mm_prefetch(reinterpret_cast<const char*>(row) + kPrefetchBytes, _MM_HINT_T0);
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 4));
    __m256 sum = dot16<false>(_mm_and_si128(packed, low_mask), x, _mm256_setzero_ps());
    sum = dot16<false>(_mm_and_si128(_mm_srli_epi16(packed, 4), low_mask), x + 16, sum);
    const __m256 x_sum = sum16(x + 16, sum16(x, _mm256_setzero_ps()));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(load_f16_scale(row)), sum, acc);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(load_f16_scale(row + 2)), x_sum, acc);
  }
  return horizontal_sum(acc);
}

// 16 bits of `bits` (from bit 0) as 16 bytes: 0x10 where the bit is set, else 0 (the fifth bits of
// Q5_0/Q5_1 quants).
KVCHAT_ISA_AVX2 inline __m128i fifth_bits(std::uint32_t bits) {
  const __m128i spread = _mm_shuffle_epi8(_mm_cvtsi32_si128(static_cast<int>(bits)),
                                          _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
  const __m128i bit = _mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128);
  return _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(spread, bit), bit), _mm_set1_epi8(0x10));
}

// Q5_0 (f16 d, 4 bytes of fifth bits, 16 bytes of nibbles; x = d * (q - 16)) and Q5_1 (f16 d, f16 m,
// fifth bits, nibbles; x = d * q + m).
template <bool WithMin>
KVCHAT_ISA_AVX2 float dot_q5_avx2(const std::uint8_t* row, const float* x, std::int64_t blocks) {
  constexpr int kHeader = WithMin ? 4 : 2, kBlockBytes = WithMin ? 24 : 22;
  const __m128i low_mask = _mm_set1_epi8(0x0F), sixteen = _mm_set1_epi8(16);
  __m256 acc = _mm256_setzero_ps();
  for (std::int64_t b = 0; b < blocks; ++b, row += kBlockBytes, x += 32) {
    _mm_prefetch(reinterpret_cast<const char*>(row) + kPrefetchBytes, _MM_HINT_T0);
    std::uint32_t high_bits;
    std::memcpy(&high_bits, row + kHeader, 4);
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + kHeader + 4));
    __m128i low = _mm_or_si128(_mm_and_si128(packed, low_mask), fifth_bits(high_bits));
    __m128i high = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(packed, 4), low_mask), fifth_bits(high_bits >> 16));
    __m256 sum;
    if constexpr (WithMin) {
      sum = dot16<false>(high, x + 16, dot16<false>(low, x, _mm256_setzero_ps()));
      acc = _mm256_fmadd_ps(_mm256_set1_ps(load_f16_scale(row + 2)), sum16(x + 16, sum16(x, _mm256_setzero_ps())), acc);
    } else {
      low = _mm_sub_epi8(low, sixteen);
      high = _mm_sub_epi8(high, sixteen);
      sum = dot16<true>(high, x + 16, dot16<true>(low, x, _mm256_setzero_ps()));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(load_f16_scale(row)), sum, acc);
  }
  return horizontal_sum(acc);
}

// F16 rows: eight halves at a time through the F16C converter.
KVCHAT_ISA_AVX2 float dot_f16_avx2(const std::uint8_t* row, const float* x, std::int64_t count) {
  const auto* w = reinterpret_cast<const std::uint16_t*>(row);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  std::int64_t c = 0;
  for (; c + 16 <= count; c += 16) {
    _mm_prefetch(reinterpret_cast<const char*>(w + c) + 2 * kPrefetchBytes, _MM_HINT_T0);
    acc0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + c))),
                           _mm256_loadu_ps(x + c), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + c + 8))),
                           _mm256_loadu_ps(x + c + 8), acc1);
  }
  float result = horizontal_sum(_mm256_add_ps(acc0, acc1));
  for (; c < count; ++c) result += _cvtsh_ss(w[c]) * x[c];
  return result;
}

// Q4_K: super-blocks of 256: f16 d, f16 dmin, 12 bytes of scales/mins, 128 bytes of nibbles; each 64
// elements share 32 bytes (low nibbles: one sub-block, high: the next). x = d*sc*q - dmin*m, so a
// sub-block's dot product is d*sc * sum(q x) - dmin*m * sum(x).
// Q5_K: the same with 32 bytes of fifth bits between the scales and the nibbles: bit 2p of byte l is
// the fifth bit of low-nibble element l of pair p, bit 2p+1 that of high-nibble element l.
template <bool FifthBits>
KVCHAT_ISA_AVX2 float dot_q4_q5_k_avx2(const std::uint8_t* row, const float* x, std::int64_t blocks) {
  constexpr int kBlockBytes = FifthBits ? 176 : 144, kNibblesAt = FifthBits ? 48 : 16;
  const __m128i low_mask = _mm_set1_epi8(0x0F), sixteen = _mm_set1_epi8(16);
  __m256 acc = _mm256_setzero_ps();
  for (std::int64_t b = 0; b < blocks; ++b, row += kBlockBytes) {
    for (int ahead = 0; ahead < kBlockBytes; ahead += 64)
      _mm_prefetch(reinterpret_cast<const char*>(row) + kPrefetchBytes + ahead, _MM_HINT_T0);
    const float d = load_f16_scale(row), dmin = load_f16_scale(row + 2);
    const std::uint8_t* scales = row + 4;
    __m128i high_bits0 = _mm_setzero_si128(), high_bits1 = _mm_setzero_si128();
    if constexpr (FifthBits) {
      high_bits0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 16));
      high_bits1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 32));
    }
    const std::uint8_t* q = row + kNibblesAt;
    for (int pair = 0; pair < 4; ++pair, q += 32, x += 64) {
      int scale1, min1, scale2, min2;
      k_quant_scale_and_min(2 * pair, scales, scale1, min1);
      k_quant_scale_and_min(2 * pair + 1, scales, scale2, min2);
      const __m128i low_bit = _mm_set1_epi8(static_cast<char>(1 << (2 * pair)));
      const __m128i high_bit = _mm_set1_epi8(static_cast<char>(2 << (2 * pair)));
      // The quant: a nibble, plus 16 where its fifth bit is set (Q5_K only).
      auto quant = [&](__m128i nibbles, __m128i bits, __m128i bit) {
        nibbles = _mm_and_si128(nibbles, low_mask);
        if constexpr (!FifthBits) return nibbles;
        return _mm_or_si128(nibbles, _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(bits, bit), bit), sixteen));
      };
      const __m128i packed0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
      const __m128i packed1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16));
      __m256 low = dot16<false>(quant(packed0, high_bits0, low_bit), x, _mm256_setzero_ps());
      low = dot16<false>(quant(packed1, high_bits1, low_bit), x + 16, low);
      __m256 high = dot16<false>(quant(_mm_srli_epi16(packed0, 4), high_bits0, high_bit), x + 32, _mm256_setzero_ps());
      high = dot16<false>(quant(_mm_srli_epi16(packed1, 4), high_bits1, high_bit), x + 48, high);
      const __m256 low_sum = sum16(x + 16, sum16(x, _mm256_setzero_ps()));
      const __m256 high_sum = sum16(x + 48, sum16(x + 32, _mm256_setzero_ps()));
      acc = _mm256_fmadd_ps(_mm256_set1_ps(d * static_cast<float>(scale1)), low, acc);
      acc = _mm256_fnmadd_ps(_mm256_set1_ps(dmin * static_cast<float>(min1)), low_sum, acc);
      acc = _mm256_fmadd_ps(_mm256_set1_ps(d * static_cast<float>(scale2)), high, acc);
      acc = _mm256_fnmadd_ps(_mm256_set1_ps(dmin * static_cast<float>(min2)), high_sum, acc);
    }
  }
  return horizontal_sum(acc);
}

// Q6_K: super-blocks of 256: 128 bytes of low nibbles, 64 bytes of 2-bit tops, 16 signed scales (one
// per 16 elements), f16 d; x = d*sc*(q - 32). Each half of 128 elements: element l + 32k (k = 0..3)
// takes a nibble of low byte l (k even) or l + 32 (k odd) (low nibble for k < 2) and bits 2k..2k+1 of
// top byte l.
KVCHAT_ISA_AVX2 float dot_q6_k_avx2(const std::uint8_t* row, const float* x, std::int64_t blocks) {
  const __m128i low_mask = _mm_set1_epi8(0x0F), top_mask = _mm_set1_epi8(0x30), bias = _mm_set1_epi8(32);
  __m256 acc = _mm256_setzero_ps();
  for (std::int64_t b = 0; b < blocks; ++b, row += 210) {
    for (int ahead = 0; ahead < 256; ahead += 64)
      _mm_prefetch(reinterpret_cast<const char*>(row) + kPrefetchBytes + ahead, _MM_HINT_T0);
    const std::uint8_t* ql = row;
    const std::uint8_t* qh = row + 128;
    const auto* sc = reinterpret_cast<const std::int8_t*>(row + 192);
    const float d = load_f16_scale(row + 208);
    for (int half = 0; half < 2; ++half, ql += 64, qh += 32, sc += 8, x += 128) {
      for (int l0 = 0; l0 < 32; l0 += 16) {
        const int is = l0 / 16;
        const __m128i low_a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(ql + l0));
        const __m128i low_b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(ql + 32 + l0));
        const __m128i top = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qh + l0));
        const __m128i q[4] = {
            _mm_or_si128(_mm_and_si128(low_a, low_mask), _mm_and_si128(_mm_slli_epi16(top, 4), top_mask)),
            _mm_or_si128(_mm_and_si128(low_b, low_mask), _mm_and_si128(_mm_slli_epi16(top, 2), top_mask)),
            _mm_or_si128(_mm_and_si128(_mm_srli_epi16(low_a, 4), low_mask), _mm_and_si128(top, top_mask)),
            _mm_or_si128(_mm_and_si128(_mm_srli_epi16(low_b, 4), low_mask),
                         _mm_and_si128(_mm_srli_epi16(top, 2), top_mask)),
        };
        for (int k = 0; k < 4; ++k) {
          const __m256 sum = dot16<true>(_mm_sub_epi8(q[k], bias), x + l0 + 32 * k, _mm256_setzero_ps());
          acc = _mm256_fmadd_ps(_mm256_set1_ps(d * static_cast<float>(sc[is + 2 * k])), sum, acc);
        }
      }
    }
  }
  return horizontal_sum(acc);
}

// ---------------------------------------------------------------------------------------------
// Row decoders for the prefill GEMM (whole rows to f32, as engine/gguf's dequantize computes them;
// a K-quant's d*sc*q - dmin*m may round once instead of twice).

using RowDecoder = void (*)(const std::uint8_t* row, float* out, std::int64_t blocks);

KVCHAT_ISA_AVX2 inline void store16(__m128i q, __m256 scale, float* out, bool is_signed) {
  const __m128i upper = _mm_srli_si128(q, 8);
  _mm256_storeu_ps(out, _mm256_mul_ps(is_signed ? widen_signed(q) : widen_unsigned(q), scale));
  _mm256_storeu_ps(out + 8, _mm256_mul_ps(is_signed ? widen_signed(upper) : widen_unsigned(upper), scale));
}

KVCHAT_ISA_AVX2 void decode_q8_0_avx2(const std::uint8_t* row, float* out, std::int64_t blocks) {
  for (std::int64_t b = 0; b < blocks; ++b, row += 34, out += 32) {
    const __m256 d = _mm256_set1_ps(load_f16_scale(row));
    store16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2)), d, out, true);
    store16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 18)), d, out + 16, true);
  }
}

KVCHAT_ISA_AVX2 void decode_q4_0_avx2(const std::uint8_t* row, float* out, std::int64_t blocks) {
  const __m128i low_mask = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
  for (std::int64_t b = 0; b < blocks; ++b, row += 18, out += 32) {
    const __m256 d = _mm256_set1_ps(load_f16_scale(row));
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2));
    store16(_mm_sub_epi8(_mm_and_si128(packed, low_mask), eight), d, out, true);
    store16(_mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(packed, 4), low_mask), eight), d, out + 16, true);
  }
}

KVCHAT_ISA_AVX2 void decode_q4_k_avx2(const std::uint8_t* row, float* out, std::int64_t blocks) {
  const __m128i low_mask = _mm_set1_epi8(0x0F);
  for (std::int64_t b = 0; b < blocks; ++b, row += 144) {
    const float d = load_f16_scale(row), dmin = load_f16_scale(row + 2);
    const std::uint8_t* q = row + 16;
    for (int pair = 0; pair < 4; ++pair, q += 32, out += 64) {
      int scale1, min1, scale2, min2;
      k_quant_scale_and_min(2 * pair, row + 4, scale1, min1);
      k_quant_scale_and_min(2 * pair + 1, row + 4, scale2, min2);
      const __m256 d1 = _mm256_set1_ps(d * static_cast<float>(scale1)), m1 = _mm256_set1_ps(dmin * static_cast<float>(min1));
      const __m256 d2 = _mm256_set1_ps(d * static_cast<float>(scale2)), m2 = _mm256_set1_ps(dmin * static_cast<float>(min2));
      for (int half = 0; half < 2; ++half) {
        const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16 * half));
        const __m128i low = _mm_and_si128(packed, low_mask);
        const __m128i high = _mm_and_si128(_mm_srli_epi16(packed, 4), low_mask);
        float* low_out = out + 16 * half;
        float* high_out = out + 32 + 16 * half;
        _mm256_storeu_ps(low_out, _mm256_sub_ps(_mm256_mul_ps(d1, widen_unsigned(low)), m1));
        _mm256_storeu_ps(low_out + 8, _mm256_sub_ps(_mm256_mul_ps(d1, widen_unsigned(_mm_srli_si128(low, 8))), m1));
        _mm256_storeu_ps(high_out, _mm256_sub_ps(_mm256_mul_ps(d2, widen_unsigned(high)), m2));
        _mm256_storeu_ps(high_out + 8, _mm256_sub_ps(_mm256_mul_ps(d2, widen_unsigned(_mm_srli_si128(high, 8))), m2));
      }
    }
  }
}

KVCHAT_ISA_AVX2 void decode_f16_avx2(const std::uint8_t* row, float* out, std::int64_t count) {
  const auto* w = reinterpret_cast<const std::uint16_t*>(row);
  std::int64_t c = 0;
  for (; c + 8 <= count; c += 8)
    _mm256_storeu_ps(out + c, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + c))));
  for (; c < count; ++c) out[c] = _cvtsh_ss(w[c]);
}
#endif  // KVCHAT_HAVE_AVX2_KERNELS

// The fused kernel for a type, or null: then rows are decoded into a buffer first.
RowDot fused_row_dot(GgufType type) {
#if KVCHAT_HAVE_AVX2_KERNELS
  if (use_avx2_kernels()) {
    switch (type) {
      case GgufType::Q8_0: return dot_q8_0_avx2;
      case GgufType::Q4_0: return dot_q4_0_avx2;
      case GgufType::Q4_K: return dot_q4_q5_k_avx2<false>;
      case GgufType::Q6_K: return dot_q6_k_avx2;
      case GgufType::Q5_K: return dot_q4_q5_k_avx2<true>;
      case GgufType::Q4_1: return dot_q4_1_avx2;
      case GgufType::Q5_0: return dot_q5_avx2<false>;
      case GgufType::Q5_1: return dot_q5_avx2<true>;
      case GgufType::F16: return dot_f16_avx2;
      default: break;
    }
  }
#endif
  (void)type;
  return nullptr;
}

RowDecoder fast_row_decoder(GgufType type) {
#if KVCHAT_HAVE_AVX2_KERNELS
  if (use_avx2_kernels()) {
    switch (type) {
      case GgufType::Q8_0: return decode_q8_0_avx2;
      case GgufType::Q4_0: return decode_q4_0_avx2;
      case GgufType::Q4_K: return decode_q4_k_avx2;
      case GgufType::F16: return decode_f16_avx2;
      default: break;
    }
  }
#endif
  (void)type;
  return nullptr;
}

void check_view(const char* function, const QuantizedMatrixView& w, std::int64_t n, const float* x, const float* y) {
  const auto fail = [&](const std::string& what) { throw std::invalid_argument(std::string(function) + ": " + what); };
  const GgufTypeInfo* info = find_gguf_type(static_cast<std::uint32_t>(w.type));
  if (info == nullptr || !info->dequantizable) fail("weights of a type that cannot be decoded");
  if (n < 0 || w.rows < 0 || w.cols < 0) fail("negative size");
  if (w.cols % info->block_size != 0) fail(std::to_string(w.cols) + " columns are not a whole number of blocks");
  if (w.row_bytes != w.cols / info->block_size * info->block_bytes) fail("row_bytes does not match the type");
  if (n > 0 && w.rows > 0 && (y == nullptr || (w.cols > 0 && (w.data == nullptr || x == nullptr))))
    fail("null buffer");
}

// Rows [begin, end) of Y = X W^T for n vectors (Y's row stride is w.rows). One vector: the fused
// kernel. Several: each row is decoded once into a buffer the thread keeps (it stays in L1/L2) and
// multiplied by every vector in f32, unless only the fused kernel is fast for the type.
void quantized_rows(const QuantizedMatrixView& w, const float* x, float* y, std::int64_t n, const float* bias,
                    std::int64_t begin, std::int64_t end) {
  const GgufTypeInfo& info = gguf_type_info(w.type);
  const std::int64_t blocks = w.cols / info.block_size;
  const RowDot dot = fused_row_dot(w.type);
  const RowDecoder decoder = fast_row_decoder(w.type);
  if (dot && (n == 1 || !decoder)) {
    for (std::int64_t r = begin; r < end; ++r) {
      const std::uint8_t* row = w.data + r * w.row_bytes;
      const float b = bias ? bias[r] : 0.f;
      for (std::int64_t i = 0; i < n; ++i) y[i * w.rows + r] = dot(row, x + i * w.cols, blocks) + b;
    }
    return;
  }
  thread_local std::vector<float> decoded;
  if (decoded.size() < static_cast<std::size_t>(w.cols)) decoded.resize(static_cast<std::size_t>(w.cols));
  for (std::int64_t r = begin; r < end; ++r) {
    const std::uint8_t* row = w.data + r * w.row_bytes;
    if (decoder) decoder(row, decoded.data(), blocks);
    else dequantize(w.type, row, w.cols, decoded.data());
    const float b = bias ? bias[r] : 0.f;
    for (std::int64_t i = 0; i < n; ++i) y[i * w.rows + r] = dot_f32(decoded.data(), x + i * w.cols, w.cols) + b;
  }
}

}  // namespace

void matmul_quantized(const QuantizedMatrixView& weight, const float* x, float* y, std::int64_t n,
                      const float* bias) {
  check_view("matmul_quantized", weight, n, x, y);
  if (n == 0 || weight.rows == 0) return;
  struct Problem {
    const QuantizedMatrixView* weight;
    const float* x;
    float* y;
    std::int64_t n;
    const float* bias;
  } const problem{&weight, x, y, n, bias};
  for_row_blocks(weight.rows, weight.row_bytes, [p = &problem](std::int64_t begin, std::int64_t end) {
    quantized_rows(*p->weight, p->x, p->y, p->n, p->bias, begin, end);
  });
}

void dequantize_rows(const QuantizedMatrixView& weight, std::int64_t first, std::int64_t count, float* out) {
  check_view("dequantize_rows", weight, count, out, out);
  if (first < 0 || count < 0 || first + count > weight.rows) throw std::invalid_argument("dequantize_rows: rows outside the matrix");
  const std::int64_t blocks = weight.cols / gguf_type_info(weight.type).block_size;
  const RowDecoder decoder = fast_row_decoder(weight.type);
  for (std::int64_t r = 0; r < count; ++r) {
    const std::uint8_t* row = weight.data + (first + r) * weight.row_bytes;
    if (decoder) decoder(row, out + r * weight.cols, blocks);
    else dequantize(weight.type, row, weight.cols, out + r * weight.cols);
  }
}

void matvec_quantized_shared_input(const SharedInputQuantizedProduct* products, int count, const float* x) {
  std::int64_t total_rows = 0, total_bytes = 0;
  for (int i = 0; i < count; ++i) {
    check_view("matvec_quantized_shared_input", products[i].weight, 1, x, products[i].y);
    if (products[i].weight.cols != products[0].weight.cols)
      throw std::invalid_argument("matvec_quantized_shared_input: the products' column counts differ");
    total_rows += products[i].weight.rows;
    total_bytes += products[i].weight.rows * products[i].weight.row_bytes;
  }
  if (total_rows == 0) return;
  struct Problem {
    const SharedInputQuantizedProduct* products;
    int count;
    const float* x;
  } const problem{products, count, x};
  // Blocks are sized by the average row: the products' rows differ in bytes only by their types.
  for_row_blocks(total_rows, total_bytes / total_rows, [p = &problem](std::int64_t begin, std::int64_t end) {
    std::int64_t offset = 0;
    for (int i = 0; i < p->count && offset < end; ++i) {
      const SharedInputQuantizedProduct& product = p->products[i];
      const std::int64_t first = std::max(begin, offset), last = std::min(end, offset + product.weight.rows);
      if (first < last) quantized_rows(product.weight, p->x, product.y, 1, product.bias, first - offset, last - offset);
      offset += product.weight.rows;
    }
  });
}

}  // namespace kvchat::kernels
