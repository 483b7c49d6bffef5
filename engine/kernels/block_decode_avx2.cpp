// The AVX2 row decoders of the prefill GEMM (integer_dot.h): whole rows to f32 as engine/gguf's dequantize
// computes them, except that a K-quant's d*sc*q - dmin*m may round once instead of twice (this file alone is
// compiled for AVX2, FMA and F16C). The block types' decode products multiply integers (integer_dot.h), F16's
// is matvec.h's dot_f16. Block layouts are those of engine/gguf/gguf_types.cpp, which documents them.
#include <cstdint>

#include "engine/gguf/dequantize.h"
#include "engine/kernels/integer_dot.h"
#include "engine/kernels/vector_math_avx2.h"

#if KVCHAT_HAVE_AVX2_KERNELS
namespace kvchat::kernels::avx2 {
namespace {

// The low 8 signed bytes of v as 8 floats.
inline __m256 widen_signed(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }
// The low 8 unsigned bytes of v as 8 floats.
inline __m256 widen_unsigned(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)); }

inline void store16(__m128i q, __m256 scale, float* out, bool is_signed) {
  const __m128i upper = _mm_srli_si128(q, 8);
  _mm256_storeu_ps(out, _mm256_mul_ps(is_signed ? widen_signed(q) : widen_unsigned(q), scale));
  _mm256_storeu_ps(out + 8, _mm256_mul_ps(is_signed ? widen_signed(upper) : widen_unsigned(upper), scale));
}

// Q4_K, and Q5_K with its fifth bits (bit 2p of byte l for the low-nibble element l of pair p, bit
// 2p+1 for the high one).
template <bool kFifthBits>
void decode_q4_q5_k(const std::uint8_t* row, float* out, std::int64_t blocks) {
  constexpr int kBlockBytes = kFifthBits ? 176 : 144, kNibblesAt = kFifthBits ? 48 : 16;
  const __m128i low_mask = _mm_set1_epi8(0x0F), sixteen = _mm_set1_epi8(16);
  for (std::int64_t b = 0; b < blocks; ++b, row += kBlockBytes) {
    const float d = load_f16_scale(row), dmin = load_f16_scale(row + 2);
    const std::uint8_t* q = row + kNibblesAt;
    for (int pair = 0; pair < 4; ++pair, q += 32, out += 64) {
      int scale1, min1, scale2, min2;
      k_quant_scale_and_min(2 * pair, row + 4, scale1, min1);
      k_quant_scale_and_min(2 * pair + 1, row + 4, scale2, min2);
      const __m256 d1 = _mm256_set1_ps(d * static_cast<float>(scale1)),
                   m1 = _mm256_set1_ps(dmin * static_cast<float>(min1));
      const __m256 d2 = _mm256_set1_ps(d * static_cast<float>(scale2)),
                   m2 = _mm256_set1_ps(dmin * static_cast<float>(min2));
      const __m128i low_bit = _mm_set1_epi8(static_cast<char>(1 << (2 * pair)));
      const __m128i high_bit = _mm_set1_epi8(static_cast<char>(2 << (2 * pair)));
      for (int half = 0; half < 2; ++half) {
        const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16 * half));
        __m128i low = _mm_and_si128(packed, low_mask);
        __m128i high = _mm_and_si128(_mm_srli_epi16(packed, 4), low_mask);
        if constexpr (kFifthBits) {
          const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 16 + 16 * half));
          low = _mm_or_si128(low, _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(bits, low_bit), low_bit), sixteen));
          high = _mm_or_si128(high, _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(bits, high_bit), high_bit), sixteen));
        }
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

}  // namespace

void decode_q8_0(const std::uint8_t* row, float* out, std::int64_t blocks) {
  for (std::int64_t b = 0; b < blocks; ++b, row += 34, out += 32) {
    const __m256 d = _mm256_set1_ps(load_f16_scale(row));
    store16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2)), d, out, true);
    store16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 18)), d, out + 16, true);
  }
}

void decode_q4_0(const std::uint8_t* row, float* out, std::int64_t blocks) {
  const __m128i low_mask = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
  for (std::int64_t b = 0; b < blocks; ++b, row += 18, out += 32) {
    const __m256 d = _mm256_set1_ps(load_f16_scale(row));
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2));
    store16(_mm_sub_epi8(_mm_and_si128(packed, low_mask), eight), d, out, true);
    store16(_mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(packed, 4), low_mask), eight), d, out + 16, true);
  }
}

void decode_q4_k(const std::uint8_t* row, float* out, std::int64_t blocks) { decode_q4_q5_k<false>(row, out, blocks); }

void decode_q5_k(const std::uint8_t* row, float* out, std::int64_t blocks) { decode_q4_q5_k<true>(row, out, blocks); }

// Q6_K: x = (d * sc) * (q - 32), the quants from q6_k_half_quants (vector_math_avx2.h), which the dot
// kernels share: vector k of half h holds elements 128h + 32k .. +31, two groups of 16 with their scales.
void decode_q6_k(const std::uint8_t* row, float* out, std::int64_t blocks) {
  const __m256i bias = _mm256_set1_epi8(32);
  for (std::int64_t b = 0; b < blocks; ++b, row += 210) {
    const auto* sc = reinterpret_cast<const std::int8_t*>(row + 192);
    const float d = load_f16_scale(row + 208);
    for (int half = 0; half < 2; ++half, out += 128) {
      __m256i quants[4];
      q6_k_half_quants(row, half, quants);
      for (int k = 0; k < 4; ++k) {
        const __m256i q = _mm256_sub_epi8(quants[k], bias);
        const int group = 8 * half + 2 * k;
        store16(_mm256_castsi256_si128(q), _mm256_set1_ps(d * static_cast<float>(sc[group])), out + 32 * k, true);
        store16(_mm256_extracti128_si256(q, 1), _mm256_set1_ps(d * static_cast<float>(sc[group + 1])),
                out + 32 * k + 16, true);
      }
    }
  }
}

void decode_f16(const std::uint8_t* row, float* out, std::int64_t count) {
  const auto* w = reinterpret_cast<const std::uint16_t*>(row);
  std::int64_t c = 0;
  for (; c + 8 <= count; c += 8)
    _mm256_storeu_ps(out + c, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + c))));
  for (; c < count; ++c) out[c] = _cvtsh_ss(w[c]);
}

}  // namespace kvchat::kernels::avx2
#endif  // KVCHAT_HAVE_AVX2_KERNELS
