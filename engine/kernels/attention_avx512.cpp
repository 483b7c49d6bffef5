// The AVX-512 version of attention_decode_head (attention.h), for head_dim a multiple of 16 (this file alone
// is compiled for AVX-512 F/BW/VL; attention.cpp calls it after use_avx512_kernels() said yes).
#include <algorithm>
#include <cstdint>

#include "engine/kernels/isa_kernels.h"
#include "engine/kernels/vector_math_avx2.h"

#if KVCHAT_HAVE_AVX2_KERNELS
#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__)
#error "attention_avx512.cpp is compiled with the AVX-512 flags (engine/CMakeLists.txt)"
#endif

namespace kvchat::kernels::avx512 {
namespace {

// ---------------------------------------------------------------------------------------------
// AVX-512 version, for head_dim a multiple of 16. The AVX2 version reads each value row once per query
// of the group and each key row once per query, and a query's eight scores end in a horizontal
// reduction of eight chains; here 32 registers let two queries share each key load, and up to four
// queries take each value row in one pass. The weighted sum adds the positions in the same order as the
// AVX2 version (one FMA per position and lane, then the 1/sum); the scores' dot products add their
// 16-lane partial sums in another order.

// [sum(a[0]), ..., sum(a[7])] for eight vectors of 16.
inline __m256 hsum16x8(const __m512 a[8]) {
  __m256 halves[8];
  for (int i = 0; i < 8; ++i)
    halves[i] = _mm256_add_ps(_mm512_castps512_ps256(a[i]),
                              _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a[i]), 1)));
  return hsum8x8(halves);
}

// Scores of kQueries (1 or 2) consecutive queries against keys [0, n): scores[j * n + t].
template <int kQueries>
void scores_avx512(const float* q, const float* keys, std::int64_t n, std::int64_t row_stride, std::int64_t head_dim,
                   float scale, float* scores) {
  const __m256 scale_v = _mm256_set1_ps(scale);
  std::int64_t t = 0;
  for (; t + 8 <= n; t += 8) {
    __m512 acc[kQueries][8];
    for (auto& query : acc)
      for (__m512& a : query) a = _mm512_setzero_ps();
    const float* key = keys + t * row_stride;
    for (int i = 0; i < 8; ++i)
      for (std::int64_t d = 0; d < head_dim; d += 16)
        _mm_prefetch(reinterpret_cast<const char*>(key + (i + kAttentionPrefetchRows) * row_stride + d), _MM_HINT_T0);
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
void weighted_values_avx512(const float* weights, const float* inverse, const float* values, std::int64_t n,
                            std::int64_t row_stride, std::int64_t head_dim, std::int64_t dim, float* out) {
  __m512 acc[kQueries][kChunks];
  for (auto& query : acc)
    for (__m512& a : query) a = _mm512_setzero_ps();
  const float* value = values + dim;
  for (std::int64_t s = 0; s < n; ++s, value += row_stride) {
    __m512 value_part[kChunks];
    for (int c = 0; c < kChunks; ++c)
      _mm_prefetch(reinterpret_cast<const char*>(value + kAttentionPrefetchRows * row_stride + 16 * c), _MM_HINT_T0);
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
void weighted_values_avx512(int chunks, const float* weights, const float* inverse, const float* values, std::int64_t n,
                            std::int64_t row_stride, std::int64_t head_dim, std::int64_t dim, float* out) {
  switch (chunks) {
    case 1: return weighted_values_avx512<kQueries, 1>(weights, inverse, values, n, row_stride, head_dim, dim, out);
    case 2: return weighted_values_avx512<kQueries, 2>(weights, inverse, values, n, row_stride, head_dim, dim, out);
    case 3: return weighted_values_avx512<kQueries, 3>(weights, inverse, values, n, row_stride, head_dim, dim, out);
    default: return weighted_values_avx512<kQueries, 4>(weights, inverse, values, n, row_stride, head_dim, dim, out);
  }
}

constexpr int kMaxQueriesPerPass = 4, kMaxChunksPerPass = 4;

}  // namespace

void attention_decode_head(const float* q, const float* keys, const float* values, std::int64_t n,
                           std::int64_t row_stride, std::int64_t group, std::int64_t head_dim, float scale,
                           float* scores, float* out) {
  std::int64_t j = 0;
  for (; j + 2 <= group; j += 2)
    scores_avx512<2>(q + j * head_dim, keys, n, row_stride, head_dim, scale, scores + j * n);
  if (j < group) scores_avx512<1>(q + j * head_dim, keys, n, row_stride, head_dim, scale, scores + j * n);
  float inverse[kMaxAttentionGroup];
  for (j = 0; j < group; ++j) inverse[j] = softmax_weights(scores + j * n, n);
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

}  // namespace kvchat::kernels::avx512
#endif  // KVCHAT_HAVE_AVX2_KERNELS
