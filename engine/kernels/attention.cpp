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

// Rows read ahead of the current one: each head's keys and values are short streams (a few KiB to a
// few hundred) that the hardware prefetcher is slow to pick up. The 1B shape's 16 layers at 2,048
// positions, from memory, one thread: the AVX-512 version 10-15 % faster with 16 rows than with none in
// three interleaved runs (4, 8, 32 and 64 rows, one run each: no better); the AVX2 one 11.3-11.7 ms
// -> 8.4-9.3 ms.
constexpr std::int64_t kPrefetchRows = 16;

// The row's softmax up to its normalisation: row[t] = exp(row[t] - max); returns 1 / sum(row).
KVCHAT_ISA_AVX2 inline float softmax_weights_avx2(float* row, std::int64_t n) {
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
      for (int i = 0; i < 8; ++i)
        for (std::int64_t d = 0; d < head_dim; d += 16)
          _mm_prefetch(reinterpret_cast<const char*>(key + (i + kPrefetchRows) * row_stride + d), _MM_HINT_T0);
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
    const float inverse = softmax_weights_avx2(row, n);
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
            _mm_prefetch(reinterpret_cast<const char*>(value + kPrefetchRows * row_stride + 8 * k), _MM_HINT_T0);
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

// ---------------------------------------------------------------------------------------------
// AVX-512 version, for head_dim a multiple of 16. The AVX2 version reads each value row once per query
// of the group and each key row once per query, and a query's eight scores end in a horizontal
// reduction of eight chains; here 32 registers let two queries share each key load, and up to four
// queries take each value row in one pass. The weighted sum adds the positions in the same order as the
// AVX2 version (one FMA per position and lane, then the 1/sum); the scores' dot products add their
// 16-lane partial sums in another order.

// [sum(a[0]), ..., sum(a[7])] for eight vectors of 16.
KVCHAT_ISA_AVX512 inline __m256 hsum16x8(const __m512 a[8]) {
  __m256 halves[8];
  for (int i = 0; i < 8; ++i)
    halves[i] = _mm256_add_ps(_mm512_castps512_ps256(a[i]),
                              _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a[i]), 1)));
  return hsum8x8(halves);
}

// Scores of kQueries (1 or 2) consecutive queries against keys [0, n): scores[j * n + t].
template <int kQueries>
KVCHAT_ISA_AVX512 void scores_avx512(const float* q, const float* keys, std::int64_t n, std::int64_t row_stride,
                                     std::int64_t head_dim, float scale, float* scores) {
  const __m256 scale_v = _mm256_set1_ps(scale);
  std::int64_t t = 0;
  for (; t + 8 <= n; t += 8) {
    __m512 acc[kQueries][8];
    for (auto& query : acc)
      for (__m512& a : query) a = _mm512_setzero_ps();
    const float* key = keys + t * row_stride;
    for (int i = 0; i < 8; ++i)
      for (std::int64_t d = 0; d < head_dim; d += 16)
        _mm_prefetch(reinterpret_cast<const char*>(key + (i + kPrefetchRows) * row_stride + d), _MM_HINT_T0);
    for (std::int64_t d = 0; d < head_dim; d += 16) {
      __m512 query_part[kQueries];
      for (int j = 0; j < kQueries; ++j) query_part[j] = _mm512_loadu_ps(q + j * head_dim + d);
      for (int i = 0; i < 8; ++i) {
        const __m512 key_part = _mm512_loadu_ps(key + i * row_stride + d);
        for (int j = 0; j < kQueries; ++j) acc[j][i] = _mm512_fmadd_ps(query_part[j], key_part, acc[j][i]);
      }
    }
    for (int j = 0; j < kQueries; ++j) _mm256_storeu_ps(scores + j * n + t, _mm256_mul_ps(hsum16x8(acc[j]), scale_v));
  }
  for (; t < n; ++t) {
    const float* key = keys + t * row_stride;
    for (int j = 0; j < kQueries; ++j) {
      __m512 acc = _mm512_setzero_ps();
      for (std::int64_t d = 0; d < head_dim; d += 16)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + j * head_dim + d), _mm512_loadu_ps(key + d), acc);
      scores[j * n + t] = _mm512_reduce_add_ps(acc) * scale;
    }
  }
}

// out[j][16 kChunks dims from `dim`] = inverse[j] * sum_s weights[j * n + s] * values[s][same dims], for
// kQueries queries: kQueries * kChunks accumulators, each value part loaded once for all of them.
template <int kQueries, int kChunks>
KVCHAT_ISA_AVX512 void weighted_values_avx512(const float* weights, const float* inverse, const float* values,
                                              std::int64_t n, std::int64_t row_stride, std::int64_t head_dim,
                                              std::int64_t dim, float* out) {
  __m512 acc[kQueries][kChunks];
  for (auto& query : acc)
    for (__m512& a : query) a = _mm512_setzero_ps();
  const float* value = values + dim;
  for (std::int64_t s = 0; s < n; ++s, value += row_stride) {
    __m512 value_part[kChunks];
    for (int c = 0; c < kChunks; ++c)
      _mm_prefetch(reinterpret_cast<const char*>(value + kPrefetchRows * row_stride + 16 * c), _MM_HINT_T0);
    for (int c = 0; c < kChunks; ++c) value_part[c] = _mm512_loadu_ps(value + 16 * c);
    for (int j = 0; j < kQueries; ++j) {
      const __m512 weight = _mm512_set1_ps(weights[j * n + s]);
      for (int c = 0; c < kChunks; ++c) acc[j][c] = _mm512_fmadd_ps(weight, value_part[c], acc[j][c]);
    }
  }
  for (int j = 0; j < kQueries; ++j)
    for (int c = 0; c < kChunks; ++c)
      _mm512_storeu_ps(out + j * head_dim + dim + 16 * c, _mm512_mul_ps(acc[j][c], _mm512_set1_ps(inverse[j])));
}

template <int kQueries>
KVCHAT_ISA_AVX512 void weighted_values_avx512(int chunks, const float* weights, const float* inverse,
                                              const float* values, std::int64_t n, std::int64_t row_stride,
                                              std::int64_t head_dim, std::int64_t dim, float* out) {
  switch (chunks) {
    case 1: return weighted_values_avx512<kQueries, 1>(weights, inverse, values, n, row_stride, head_dim, dim, out);
    case 2: return weighted_values_avx512<kQueries, 2>(weights, inverse, values, n, row_stride, head_dim, dim, out);
    case 3: return weighted_values_avx512<kQueries, 3>(weights, inverse, values, n, row_stride, head_dim, dim, out);
    default: return weighted_values_avx512<kQueries, 4>(weights, inverse, values, n, row_stride, head_dim, dim, out);
  }
}

constexpr int kMaxQueriesPerPass = 4, kMaxChunksPerPass = 4;
constexpr std::int64_t kMaxGroupOnStack = 64;

KVCHAT_ISA_AVX512 void attention_avx512(const float* q, const float* keys, const float* values, std::int64_t n,
                                        std::int64_t row_stride, std::int64_t group, std::int64_t head_dim, float scale,
                                        float* scores, float* out) {
  std::int64_t j = 0;
  for (; j + 2 <= group; j += 2)
    scores_avx512<2>(q + j * head_dim, keys, n, row_stride, head_dim, scale, scores + j * n);
  if (j < group) scores_avx512<1>(q + j * head_dim, keys, n, row_stride, head_dim, scale, scores + j * n);
  float inverse[kMaxGroupOnStack];
  for (j = 0; j < group; ++j) inverse[j] = softmax_weights_avx2(scores + j * n, n);
  const std::int64_t chunks = head_dim / 16;
  for (j = 0; j < group; j += kMaxQueriesPerPass) {
    const std::int64_t queries = std::min<std::int64_t>(kMaxQueriesPerPass, group - j);
    for (std::int64_t chunk = 0; chunk < chunks; chunk += kMaxChunksPerPass) {
      const int pass_chunks = static_cast<int>(std::min<std::int64_t>(kMaxChunksPerPass, chunks - chunk));
      const float* weights = scores + j * n;
      float* result = out + j * head_dim;
      const std::int64_t dim = 16 * chunk;
      switch (queries) {
        case 1:
          weighted_values_avx512<1>(pass_chunks, weights, inverse + j, values, n, row_stride, head_dim, dim, result);
          break;
        case 2:
          weighted_values_avx512<2>(pass_chunks, weights, inverse + j, values, n, row_stride, head_dim, dim, result);
          break;
        case 3:
          weighted_values_avx512<3>(pass_chunks, weights, inverse + j, values, n, row_stride, head_dim, dim, result);
          break;
        default:
          weighted_values_avx512<4>(pass_chunks, weights, inverse + j, values, n, row_stride, head_dim, dim, result);
          break;
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
  if (use_avx512_kernels() && head_dim % 16 == 0 && group <= kMaxGroupOnStack) {
    attention_avx512(q, keys, values, n, row_stride, group, head_dim, scale, scores, out);
    return;
  }
  if (use_avx2_kernels()) {
    attention_avx2(q, keys, values, n, row_stride, group, head_dim, scale, scores, out);
    return;
  }
#endif
  attention_portable(q, keys, values, n, row_stride, group, head_dim, scale, scores, out);
}

}  // namespace kvchat::kernels
