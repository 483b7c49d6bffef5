// The AVX-512 versions of attention_decode_head and attention_decode_head_stored (attention.h), for head_dim a
// multiple of 16 (this file alone
// is compiled for AVX-512 F/BW/VL; attention.cpp calls it after use_avx512_kernels() said yes).
#include <algorithm>
#include <cstdint>
#include <cstring>

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

// Key and value rows as the kernels read them: 16 values of row t from dimension d as f32 (exactly the values the
// rows stand for, so every loader gives the f32 kernel's arithmetic over the decoded rows), and an address in row t
// to prefetch.
struct F32Rows {
  const float* base;
  std::int64_t stride;  // floats
  __m512 load(std::int64_t t, std::int64_t d) const { return _mm512_loadu_ps(base + t * stride + d); }
  const char* address(std::int64_t t, std::int64_t d) const {
    return reinterpret_cast<const char*>(base + t * stride + d);
  }
};
struct Bf16Rows {
  const std::uint8_t* base;
  std::int64_t row_bytes;
  __m512 load(std::int64_t t, std::int64_t d) const {
    const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + t * row_bytes + 2 * d));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
  }
  const char* address(std::int64_t t, std::int64_t d) const {
    return reinterpret_cast<const char*>(base + t * row_bytes + 2 * d);
  }
};
struct F16Rows {
  const std::uint8_t* base;
  std::int64_t row_bytes;
  __m512 load(std::int64_t t, std::int64_t d) const {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + t * row_bytes + 2 * d)));
  }
  const char* address(std::int64_t t, std::int64_t d) const {
    return reinterpret_cast<const char*>(base + t * row_bytes + 2 * d);
  }
};
// q8_0 rows of head_dim bytes then an f16 scale per block of 32 (head_dim a multiple of 32 here): byte x scale,
// exact in f32 as the portable decoder computes it.
struct Q8Rows {
  const std::uint8_t* base;
  std::int64_t row_bytes, head_dim;
  __m512 load(std::int64_t t, std::int64_t d) const {
    const std::uint8_t* row = base + t * row_bytes;
    std::uint16_t scale_bits;
    std::memcpy(&scale_bits, row + head_dim + 2 * (d / 32), 2);
    const __m512 scale = _mm512_cvtph_ps(_mm256_set1_epi16(static_cast<short>(scale_bits)));
    const __m512i bytes = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + d)));
    return _mm512_mul_ps(scale, _mm512_cvtepi32_ps(bytes));
  }
  const char* address(std::int64_t t, std::int64_t d) const {
    return reinterpret_cast<const char*>(base + t * row_bytes + d);
  }
};

// Scores of kQueries (1 or 2) consecutive queries against keys [0, n): scores[j * n + t].
template <int kQueries, typename Rows>
void scores_avx512(const float* q, const Rows& keys, std::int64_t n, std::int64_t head_dim, float scale,
                   float* scores) {
  const __m256 scale_v = _mm256_set1_ps(scale);
  std::int64_t t = 0;
  for (; t + 8 <= n; t += 8) {
    __m512 acc[kQueries][8];
    for (auto& query : acc)
      for (__m512& a : query) a = _mm512_setzero_ps();
    for (int i = 0; i < 8; ++i)
      for (std::int64_t d = 0; d < head_dim; d += 16)
        _mm_prefetch(keys.address(t + i + kAttentionPrefetchRows, d), _MM_HINT_T0);
    for (std::int64_t d = 0; d < head_dim; d += 16) {
      __m512 query_part[kQueries];
      for (int j = 0; j < kQueries; ++j) query_part[j] = _mm512_loadu_ps(q + j * head_dim + d);
      for (int i = 0; i < 8; ++i) {
        const __m512 key_part = keys.load(t + i, d);
        for (int j = 0; j < kQueries; ++j) acc[j][i] = _mm512_fmadd_ps(query_part[j], key_part, acc[j][i]);
      }
    }
    for (int j = 0; j < kQueries; ++j) _mm256_storeu_ps(scores + j * n + t, _mm256_mul_ps(hsum16x8(acc[j]), scale_v));
  }
  for (; t < n; ++t) {
    for (int j = 0; j < kQueries; ++j) {
      __m512 acc = _mm512_setzero_ps();
      for (std::int64_t d = 0; d < head_dim; d += 16)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + j * head_dim + d), keys.load(t, d), acc);
      scores[j * n + t] = _mm512_reduce_add_ps(acc) * scale;
    }
  }
}

// out[j][16 kChunks dims from `dim`] = inverse[j] * sum_s weights[j * n + s] * values[s][same dims], for
// kQueries queries: kQueries * kChunks accumulators, each value part loaded once for all of them.
template <int kQueries, int kChunks, typename Rows>
void weighted_values_avx512(const float* weights, const float* inverse, const Rows& values, std::int64_t n,
                            std::int64_t head_dim, std::int64_t dim, float* out) {
  __m512 acc[kQueries][kChunks];
  for (auto& query : acc)
    for (__m512& a : query) a = _mm512_setzero_ps();
  for (std::int64_t s = 0; s < n; ++s) {
    __m512 value_part[kChunks];
    for (int c = 0; c < kChunks; ++c)
      _mm_prefetch(values.address(s + kAttentionPrefetchRows, dim + 16 * c), _MM_HINT_T0);
    for (int c = 0; c < kChunks; ++c) value_part[c] = values.load(s, dim + 16 * c);
    for (int j = 0; j < kQueries; ++j) {
      const __m512 weight = _mm512_set1_ps(weights[j * n + s]);
      for (int c = 0; c < kChunks; ++c) acc[j][c] = _mm512_fmadd_ps(weight, value_part[c], acc[j][c]);
    }
  }
  for (int j = 0; j < kQueries; ++j)
    for (int c = 0; c < kChunks; ++c)
      _mm512_storeu_ps(out + j * head_dim + dim + 16 * c, _mm512_mul_ps(acc[j][c], _mm512_set1_ps(inverse[j])));
}

template <int kQueries, typename Rows>
void weighted_values_avx512(int chunks, const float* weights, const float* inverse, const Rows& values, std::int64_t n,
                            std::int64_t head_dim, std::int64_t dim, float* out) {
  switch (chunks) {
    case 1: return weighted_values_avx512<kQueries, 1>(weights, inverse, values, n, head_dim, dim, out);
    case 2: return weighted_values_avx512<kQueries, 2>(weights, inverse, values, n, head_dim, dim, out);
    case 3: return weighted_values_avx512<kQueries, 3>(weights, inverse, values, n, head_dim, dim, out);
    default: return weighted_values_avx512<kQueries, 4>(weights, inverse, values, n, head_dim, dim, out);
  }
}

constexpr int kMaxQueriesPerPass = 4, kMaxChunksPerPass = 4;

// The kernel over any rows: scores, softmax, then the weighted values, up to four queries per pass.
template <typename Rows>
void attention_rows(const float* q, const Rows& keys, const Rows& values, std::int64_t n, std::int64_t group,
                    std::int64_t head_dim, float scale, float* scores, float* out) {
  std::int64_t j = 0;
  for (; j + 2 <= group; j += 2) scores_avx512<2>(q + j * head_dim, keys, n, head_dim, scale, scores + j * n);
  if (j < group) scores_avx512<1>(q + j * head_dim, keys, n, head_dim, scale, scores + j * n);
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
        case 1: weighted_values_avx512<1>(pass_chunks, weights, inverse + j, values, n, head_dim, dim, result); break;
        case 2: weighted_values_avx512<2>(pass_chunks, weights, inverse + j, values, n, head_dim, dim, result); break;
        case 3: weighted_values_avx512<3>(pass_chunks, weights, inverse + j, values, n, head_dim, dim, result); break;
        default: weighted_values_avx512<4>(pass_chunks, weights, inverse + j, values, n, head_dim, dim, result); break;
      }
    }
  }
}

}  // namespace

void attention_decode_head(const float* q, const float* keys, const float* values, std::int64_t n,
                           std::int64_t row_stride, std::int64_t group, std::int64_t head_dim, float scale,
                           float* scores, float* out) {
  attention_rows(q, F32Rows{keys, row_stride}, F32Rows{values, row_stride}, n, group, head_dim, scale, scores, out);
}

bool attention_decode_head_stored(const float* q, const StoredKvRows& keys, const StoredKvRows& values, std::int64_t n,
                                  std::int64_t group, std::int64_t head_dim, float scale, float* scores, float* out) {
  switch (keys.dtype) {
    case KvDtype::F32:
      attention_rows(q, F32Rows{reinterpret_cast<const float*>(keys.data), keys.row_bytes / 4},
                     F32Rows{reinterpret_cast<const float*>(values.data), values.row_bytes / 4}, n, group, head_dim,
                     scale, scores, out);
      return true;
    case KvDtype::BF16:
      attention_rows(q, Bf16Rows{keys.data, keys.row_bytes}, Bf16Rows{values.data, values.row_bytes}, n, group,
                     head_dim, scale, scores, out);
      return true;
    case KvDtype::F16:
      attention_rows(q, F16Rows{keys.data, keys.row_bytes}, F16Rows{values.data, values.row_bytes}, n, group, head_dim,
                     scale, scores, out);
      return true;
    case KvDtype::Q8_0:
      if (head_dim % 32 != 0) return false;
      attention_rows(q, Q8Rows{keys.data, keys.row_bytes, head_dim}, Q8Rows{values.data, values.row_bytes, head_dim}, n,
                     group, head_dim, scale, scores, out);
      return true;
  }
  return false;
}

}  // namespace kvchat::kernels::avx512
#endif  // KVCHAT_HAVE_AVX2_KERNELS
