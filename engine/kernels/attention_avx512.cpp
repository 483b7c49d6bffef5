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

// How one stored row's values are read: 16 values from dimension d as f32 (exactly the values the row stands for, so
// every format gives the f32 kernel's arithmetic over the decoded rows), and the byte offset of dimension d.
struct F32Format {
  __m512 load(const std::uint8_t* row, std::int64_t d) const {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + d);
  }
  static std::int64_t offset(std::int64_t d) { return 4 * d; }
};
struct Bf16Format {
  __m512 load(const std::uint8_t* row, std::int64_t d) const {
    const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * d));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
  }
  static std::int64_t offset(std::int64_t d) { return 2 * d; }
};
struct F16Format {
  __m512 load(const std::uint8_t* row, std::int64_t d) const {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * d)));
  }
  static std::int64_t offset(std::int64_t d) { return 2 * d; }
};
// q8_0 rows of head_dim bytes then an f16 scale per block of 32 (head_dim a multiple of 32 here): byte x scale,
// exact in f32 as the portable decoder computes it.
struct Q8Format {
  std::int64_t head_dim;
  __m512 load(const std::uint8_t* row, std::int64_t d) const {
    std::uint16_t scale_bits;
    std::memcpy(&scale_bits, row + head_dim + 2 * (d / 32), 2);
    const __m512 scale = _mm512_cvtph_ps(_mm256_set1_epi16(static_cast<short>(scale_bits)));
    const __m512i bytes = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + d)));
    return _mm512_mul_ps(scale, _mm512_cvtepi32_ps(bytes));
  }
  static std::int64_t offset(std::int64_t d) { return d; }
};

// Where row t is: one after another (the contiguous cache), or in the blocks of a paged cache. The kernels take a
// row's address once and read all its dimensions from it, so the layout changes no arithmetic.
template <typename Format>
struct ContiguousRows {
  const std::uint8_t* base;
  std::int64_t row_bytes;
  Format format;
  const std::uint8_t* row(std::int64_t t) const { return base + t * row_bytes; }
  // An address to prefetch, a few rows ahead (a prefetch past the end does not fault).
  const std::uint8_t* ahead(std::int64_t t) const { return row(t); }
};
template <typename Format>
struct PagedRows {
  const std::uint8_t* const* blocks;
  std::int64_t first, last;  // positions of rows 0 and n - 1
  std::int64_t shift, offset, row_bytes;
  Format format;
  const std::uint8_t* row(std::int64_t t) const {
    const std::int64_t position = first + t;
    return blocks[position >> shift] + offset + (position & ((std::int64_t{1} << shift) - 1)) * row_bytes;
  }
  // Clamped: the block table ends with the last row.
  const std::uint8_t* ahead(std::int64_t t) const { return row(std::min(t, last - first)); }
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
    const std::uint8_t* key_rows[8];
    for (int i = 0; i < 8; ++i) {
      key_rows[i] = keys.row(t + i);
      const std::uint8_t* ahead = keys.ahead(t + i + kAttentionPrefetchRows);
      for (std::int64_t d = 0; d < head_dim; d += 16)
        _mm_prefetch(reinterpret_cast<const char*>(ahead + keys.format.offset(d)), _MM_HINT_T0);
    }
    for (std::int64_t d = 0; d < head_dim; d += 16) {
      __m512 query_part[kQueries];
      for (int j = 0; j < kQueries; ++j) query_part[j] = _mm512_loadu_ps(q + j * head_dim + d);
      for (int i = 0; i < 8; ++i) {
        const __m512 key_part = keys.format.load(key_rows[i], d);
        for (int j = 0; j < kQueries; ++j) acc[j][i] = _mm512_fmadd_ps(query_part[j], key_part, acc[j][i]);
      }
    }
    for (int j = 0; j < kQueries; ++j) _mm256_storeu_ps(scores + j * n + t, _mm256_mul_ps(hsum16x8(acc[j]), scale_v));
  }
  for (; t < n; ++t) {
    const std::uint8_t* key_row = keys.row(t);
    for (int j = 0; j < kQueries; ++j) {
      __m512 acc = _mm512_setzero_ps();
      for (std::int64_t d = 0; d < head_dim; d += 16)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + j * head_dim + d), keys.format.load(key_row, d), acc);
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
    const std::uint8_t* ahead = values.ahead(s + kAttentionPrefetchRows);
    for (int c = 0; c < kChunks; ++c)
      _mm_prefetch(reinterpret_cast<const char*>(ahead + values.format.offset(dim + 16 * c)), _MM_HINT_T0);
    const std::uint8_t* value_row = values.row(s);
    for (int c = 0; c < kChunks; ++c) value_part[c] = values.format.load(value_row, dim + 16 * c);
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

// The kernel over rows of any format, in the layout `layout` makes of (format, base or blocks).
template <template <typename> class Layout, typename Make>
bool attention_any_format(KvDtype dtype, std::int64_t head_dim, const Make& layout, const float* q, std::int64_t n,
                          std::int64_t group, float scale, float* scores, float* out) {
  const auto run = [&](auto format) {
    const Layout<decltype(format)> keys = layout(format, /*values=*/false), values = layout(format, /*values=*/true);
    attention_rows(q, keys, values, n, group, head_dim, scale, scores, out);
    return true;
  };
  switch (dtype) {
    case KvDtype::F32: return run(F32Format{});
    case KvDtype::BF16: return run(Bf16Format{});
    case KvDtype::F16: return run(F16Format{});
    case KvDtype::Q8_0: return head_dim % 32 == 0 && run(Q8Format{head_dim});
  }
  return false;
}

}  // namespace

void attention_decode_head(const float* q, const float* keys, const float* values, std::int64_t n,
                           std::int64_t row_stride, std::int64_t group, std::int64_t head_dim, float scale,
                           float* scores, float* out) {
  const std::int64_t row_bytes = row_stride * 4;
  attention_rows(q, ContiguousRows<F32Format>{reinterpret_cast<const std::uint8_t*>(keys), row_bytes, {}},
                 ContiguousRows<F32Format>{reinterpret_cast<const std::uint8_t*>(values), row_bytes, {}}, n, group,
                 head_dim, scale, scores, out);
}

bool attention_decode_head_stored(const float* q, const StoredKvRows& keys, const StoredKvRows& values, std::int64_t n,
                                  std::int64_t group, std::int64_t head_dim, float scale, float* scores, float* out) {
  const auto layout = [&](auto format, bool value_rows) {
    const StoredKvRows& rows = value_rows ? values : keys;
    return ContiguousRows<decltype(format)>{rows.data, rows.row_bytes, format};
  };
  return attention_any_format<ContiguousRows>(keys.dtype, head_dim, layout, q, n, group, scale, scores, out);
}

bool attention_decode_head_paged(const float* q, const PagedKvRows& keys, const PagedKvRows& values, std::int64_t n,
                                 std::int64_t group, std::int64_t head_dim, float scale, float* scores, float* out) {
  const std::int64_t shift = paged_block_shift(keys.block_tokens);
  if (shift < 0 || n < 1) return false;
  const auto layout = [&](auto format, bool value_rows) {
    const PagedKvRows& rows = value_rows ? values : keys;
    return PagedRows<decltype(format)>{rows.blocks,    rows.first, rows.first + n - 1, shift, rows.offset,
                                       rows.row_bytes, format};
  };
  return attention_any_format<PagedRows>(keys.dtype, head_dim, layout, q, n, group, scale, scores, out);
}

}  // namespace kvchat::kernels::avx512
#endif  // KVCHAT_HAVE_AVX2_KERNELS
