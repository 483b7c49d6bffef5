#include "engine/kernels/attention.h"

#include <algorithm>
#include <cmath>

#include "engine/kernels/cpu_features.h"
#include "engine/kernels/isa_attributes.h"
#include "engine/kernels/vector_math_avx2.h"


namespace kvchat::kernels {
namespace {

// ---------------------------------------------------------------------------------------------
// Portable version.

KVCHAT_ISA_BASELINE void attention_portable(const float* q, const float* keys, const float* values, std::int64_t n,
                                            std::int64_t row_stride, std::int64_t group, std::int64_t head_dim,
                                            float scale, float* scores, float* out) {
  for (std::int64_t j = 0; j < group; ++j) {
    const float* query = q + j * head_dim;
    float* row = scores + j * n;
    float top = -INFINITY;
    for (std::int64_t t = 0; t < n; ++t) {
      const float* key = keys + t * row_stride;
      float dot = 0.f;
      for (std::int64_t d = 0; d < head_dim; ++d) dot += query[d] * key[d];
      row[t] = dot * scale;
      top = std::max(top, row[t]);
    }
    float sum = 0.f;
    for (std::int64_t t = 0; t < n; ++t) sum += row[t] = std::exp(row[t] - top);
    const float inverse = 1.f / sum;
    float* result = out + j * head_dim;
    std::fill(result, result + head_dim, 0.f);
    for (std::int64_t t = 0; t < n; ++t) {
      const float weight = row[t] * inverse;
      const float* value = values + t * row_stride;
      for (std::int64_t d = 0; d < head_dim; ++d) result[d] += weight * value[d];
    }
  }
}

#if KVCHAT_HAVE_AVX2_KERNELS
// ---------------------------------------------------------------------------------------------
// AVX2 + FMA version.

KVCHAT_ISA_AVX2 inline float hsum8(__m256 a) {
  const __m128 folded = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 pairs = _mm_add_ps(folded, _mm_movehl_ps(folded, folded));
  return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_shuffle_ps(pairs, pairs, 1)));
}

KVCHAT_ISA_AVX2 inline float hmax8(__m256 a) {
  const __m128 folded = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 pairs = _mm_max_ps(folded, _mm_movehl_ps(folded, folded));
  return _mm_cvtss_f32(_mm_max_ss(pairs, _mm_shuffle_ps(pairs, pairs, 1)));
}

// [sum(a[0]), sum(a[1]), ..., sum(a[7])]: eight horizontal sums in one vector.
KVCHAT_ISA_AVX2 inline __m256 hsum8x8(const __m256 a[8]) {
  const __m256 pairs01 = _mm256_hadd_ps(a[0], a[1]), pairs23 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 pairs45 = _mm256_hadd_ps(a[4], a[5]), pairs67 = _mm256_hadd_ps(a[6], a[7]);
  // Per 128-bit lane: the sums of four elements of a[0..3] and of a[4..7], low lane and high lane apart.
  const __m256 quads0123 = _mm256_hadd_ps(pairs01, pairs23), quads4567 = _mm256_hadd_ps(pairs45, pairs67);
  return _mm256_add_ps(_mm256_permute2f128_ps(quads0123, quads4567, 0x20),
                       _mm256_permute2f128_ps(quads0123, quads4567, 0x31));
}

KVCHAT_ISA_AVX2 float dot_avx2(const float* a, const float* b, std::int64_t size) {
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

KVCHAT_ISA_AVX2 void attention_avx2(const float* q, const float* keys, const float* values, std::int64_t n,
                                    std::int64_t row_stride, std::int64_t group, std::int64_t head_dim, float scale,
                                    float* scores, float* out) {
  // Scores, eight keys at a time when head_dim is a multiple of 8: eight dot products share one
  // horizontal reduction (a per-key reduction costs more than the dot itself for small heads).
  std::int64_t t = 0;
  if (head_dim % 8 == 0) {
    const __m256 scale_v = _mm256_set1_ps(scale);
    for (; t + 8 <= n; t += 8) {
      const float* key = keys + t * row_stride;
      for (std::int64_t j = 0; j < group; ++j) {
        const float* query = q + j * head_dim;
        __m256 acc[8];
        for (__m256& a : acc) a = _mm256_setzero_ps();
        for (std::int64_t d = 0; d < head_dim; d += 8) {
          const __m256 query_part = _mm256_loadu_ps(query + d);
          for (int i = 0; i < 8; ++i) acc[i] = _mm256_fmadd_ps(query_part, _mm256_loadu_ps(key + i * row_stride + d), acc[i]);
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
    // Softmax over the row.
    __m256 top8 = _mm256_set1_ps(-INFINITY);
    t = 0;
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
    const float inverse = 1.f / sum;
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
          for (int k = 0; k < 8; ++k) acc[k] = _mm256_fmadd_ps(w, _mm256_loadu_ps(value + 8 * k), acc[k]);
        }
        for (int k = 0; k < 8; ++k) _mm256_storeu_ps(result + d0 + 8 * k, _mm256_mul_ps(acc[k], inverse_v));
      } else if (vectors == 1) {  // head_dim 8 (tiny models): four chains over the positions hide the FMA latency
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        std::int64_t s = 0;
        for (; s + 4 <= n; s += 4)
          for (int k = 0; k < 4; ++k)
            acc[k] = _mm256_fmadd_ps(_mm256_set1_ps(row[s + k]), _mm256_loadu_ps(values + (s + k) * row_stride + d0), acc[k]);
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
          for (std::int64_t k = 0; k < vectors; ++k) acc[k] = _mm256_fmadd_ps(w, _mm256_loadu_ps(value + 8 * k), acc[k]);
        }
        for (std::int64_t k = 0; k < vectors; ++k) _mm256_storeu_ps(result + d0 + 8 * k, _mm256_mul_ps(acc[k], inverse_v));
      }
      for (std::int64_t d = d0 + 8 * vectors; d < d0 + width; ++d) {
        float acc = 0.f;
        for (std::int64_t s = 0; s < n; ++s) acc += row[s] * values[s * row_stride + d];
        result[d] = acc * inverse;
      }
    }
  }
}
#endif

}  // namespace

void attention_decode_head(const float* q, const float* keys, const float* values, std::int64_t n,
                           std::int64_t row_stride, std::int64_t group, std::int64_t head_dim, float scale,
                           float* scores, float* out) {
#if KVCHAT_HAVE_AVX2_KERNELS
  if (use_avx2_kernels()) {
    attention_avx2(q, keys, values, n, row_stride, group, head_dim, scale, scores, out);
    return;
  }
#endif
  attention_portable(q, keys, values, n, row_stride, group, head_dim, scale, scores, out);
}

}  // namespace kvchat::kernels
