// The AVX2 + FMA version of attention_decode_head (attention.h) (this file alone is compiled for AVX2, FMA and
// F16C; attention.cpp calls it after use_avx2_kernels() said yes).
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "engine/kernels/isa_kernels.h"
#include "engine/kernels/vector_math_avx2.h"

#if KVCHAT_HAVE_AVX2_KERNELS
namespace kvchat::kernels::avx2 {
namespace {

float dot_avx2(const float* a, const float* b, std::int64_t size) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  std::int64_t d = 0;
  for (; d + 16 <= size; d += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d + 8), _mm256_loadu_ps(b + d + 8), acc1);
  }
  for (; d + 8 <= size; d += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc0);
  float result = hsum8(_mm256_add_ps(acc0, acc1));
  for (; d < size; ++d) result += a[d] * b[d];
  return result;
}

}  // namespace

void attention_decode_head(const float* q, const float* keys, const float* values, std::int64_t n,
                           std::int64_t row_stride, std::int64_t group, std::int64_t head_dim, float scale,
                           float* scores, float* out) {
  // Scores, eight keys at a time when head_dim is a multiple of 8: eight dot products share one
  // horizontal reduction (a per-key reduction costs more than the dot itself for small heads).
  std::int64_t t = 0;
  if (head_dim % 8 == 0) {
    const __m256 scale_v = _mm256_set1_ps(scale);
    for (; t + 8 <= n; t += 8) {
      const float* key = keys + t * row_stride;
      for (int i = 0; i < 8; ++i)
        for (std::int64_t d = 0; d < head_dim; d += 16)
          _mm_prefetch(reinterpret_cast<const char*>(key + (i + kAttentionPrefetchRows) * row_stride + d), _MM_HINT_T0);
      for (std::int64_t j = 0; j < group; ++j) {
        const float* query = q + j * head_dim;
        __m256 acc[8];
        for (__m256& a : acc) a = _mm256_setzero_ps();
        for (std::int64_t d = 0; d < head_dim; d += 8) {
          const __m256 query_part = _mm256_loadu_ps(query + d);
          for (int i = 0; i < 8; ++i)
            acc[i] = _mm256_fmadd_ps(query_part, _mm256_loadu_ps(key + i * row_stride + d), acc[i]);
        }
        _mm256_storeu_ps(scores + j * n + t, _mm256_mul_ps(hsum8x8(acc), scale_v));
      }
    }
  }
  for (; t < n; ++t) {  // the rest, each key row read once for the whole group
    const float* key = keys + t * row_stride;
    for (std::int64_t j = 0; j < group; ++j) scores[j * n + t] = dot_avx2(q + j * head_dim, key, head_dim) * scale;
  }
  for (std::int64_t j = 0; j < group; ++j) {
    float* row = scores + j * n;
    const float inverse = softmax_weights(row, n);
    // Weighted sum of the value rows, up to 64 dimensions at a time in registers (8 vectors of 8);
    // the last few dimensions of a head_dim that is not a multiple of 8 one by one.
    float* result = out + j * head_dim;
    const __m256 inverse_v = _mm256_set1_ps(inverse);
    for (std::int64_t d0 = 0; d0 < head_dim; d0 += 64) {
      const std::int64_t width = std::min<std::int64_t>(64, head_dim - d0);
      const std::int64_t vectors = width / 8;
      if (vectors == 8) {
        __m256 acc[8];
        for (__m256& a : acc) a = _mm256_setzero_ps();
        for (std::int64_t s = 0; s < n; ++s) {
          const __m256 w = _mm256_set1_ps(row[s]);
          const float* value = values + s * row_stride + d0;
          for (int k = 0; k < 8; k += 2)
            _mm_prefetch(reinterpret_cast<const char*>(value + kAttentionPrefetchRows * row_stride + 8 * k),
                         _MM_HINT_T0);
          for (int k = 0; k < 8; ++k) acc[k] = _mm256_fmadd_ps(w, _mm256_loadu_ps(value + 8 * k), acc[k]);
        }
        for (int k = 0; k < 8; ++k) _mm256_storeu_ps(result + d0 + 8 * k, _mm256_mul_ps(acc[k], inverse_v));
      } else if (vectors == 1) {  // head_dim 8 (tiny models): four chains over the positions hide the FMA latency
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        std::int64_t s = 0;
        for (; s + 4 <= n; s += 4)
          for (int k = 0; k < 4; ++k)
            acc[k] = _mm256_fmadd_ps(_mm256_set1_ps(row[s + k]), _mm256_loadu_ps(values + (s + k) * row_stride + d0),
                                     acc[k]);
        for (; s < n; ++s)
          acc[0] = _mm256_fmadd_ps(_mm256_set1_ps(row[s]), _mm256_loadu_ps(values + s * row_stride + d0), acc[0]);
        const __m256 sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        _mm256_storeu_ps(result + d0, _mm256_mul_ps(sum, inverse_v));
      } else if (vectors > 0) {  // small heads (e.g. head_dim 16 or 32)
        __m256 acc[8];
        for (std::int64_t k = 0; k < vectors; ++k) acc[k] = _mm256_setzero_ps();
        for (std::int64_t s = 0; s < n; ++s) {
          const __m256 w = _mm256_set1_ps(row[s]);
          const float* value = values + s * row_stride + d0;
          for (std::int64_t k = 0; k < vectors; ++k)
            acc[k] = _mm256_fmadd_ps(w, _mm256_loadu_ps(value + 8 * k), acc[k]);
        }
        for (std::int64_t k = 0; k < vectors; ++k)
          _mm256_storeu_ps(result + d0 + 8 * k, _mm256_mul_ps(acc[k], inverse_v));
      }
      for (std::int64_t d = d0 + 8 * vectors; d < d0 + width; ++d) {
        float acc = 0.f;
        for (std::int64_t s = 0; s < n; ++s) acc += row[s] * values[s * row_stride + d];
        result[d] = acc * inverse;
      }
    }
  }
}

}  // namespace kvchat::kernels::avx2
#endif  // KVCHAT_HAVE_AVX2_KERNELS
