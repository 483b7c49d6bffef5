#include "engine/kernels/attention.h"

#include <algorithm>
#include <cmath>

#include "engine/kernels/cpu_features.h"
#include "engine/kernels/isa_kernels.h"
#include "engine/kernels/kv_rows.h"

namespace kvchat::kernels {
namespace {

// ---------------------------------------------------------------------------------------------
// Portable version.

// softcap > 0: scores become softcap * tanh(score / softcap).
void attention_portable(const float* q, const float* keys, const float* values, std::int64_t n, std::int64_t row_stride,
                        std::int64_t group, std::int64_t head_dim, float scale, float* scores, float* out,
                        float softcap = 0.f) {
  for (std::int64_t j = 0; j < group; ++j) {
    const float* query = q + j * head_dim;
    float* row = scores + j * n;
    float top = -INFINITY;
    for (std::int64_t t = 0; t < n; ++t) {
      const float* key = keys + t * row_stride;
      float dot = 0.f;
      for (std::int64_t d = 0; d < head_dim; ++d) dot += query[d] * key[d];
      row[t] = softcap > 0.f ? softcap * std::tanh(dot * scale / softcap) : dot * scale;
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

}  // namespace

void attention_decode_head(const float* q, const float* keys, const float* values, std::int64_t n,
                           std::int64_t row_stride, std::int64_t group, std::int64_t head_dim, float scale,
                           float* scores, float* out) {
#if KVCHAT_HAVE_AVX2_KERNELS
  if (use_avx512_kernels() && head_dim % 16 == 0 && group <= avx512::kMaxAttentionGroup) {
    avx512::attention_decode_head(q, keys, values, n, row_stride, group, head_dim, scale, scores, out);
    return;
  }
  if (use_avx2_kernels()) {
    avx2::attention_decode_head(q, keys, values, n, row_stride, group, head_dim, scale, scores, out);
    return;
  }
#endif
  attention_portable(q, keys, values, n, row_stride, group, head_dim, scale, scores, out);
}

bool attention_decode_head_stored(const float* q, const StoredKvRows& keys, const StoredKvRows& values, std::int64_t n,
                                  std::int64_t group, std::int64_t head_dim, float scale, float* scores, float* out) {
#if KVCHAT_HAVE_AVX2_KERNELS
  // Only where attention_decode_head itself would take the AVX-512 kernel: the same arithmetic, other loads.
  if (use_avx512_kernels() && head_dim % 16 == 0 && group <= avx512::kMaxAttentionGroup)
    return avx512::attention_decode_head_stored(q, keys, values, n, group, head_dim, scale, scores, out);
#endif
  (void)q, (void)keys, (void)values, (void)n, (void)group, (void)head_dim, (void)scale, (void)scores, (void)out;
  return false;
}

std::int64_t paged_block_shift(std::int64_t block_tokens) {
  if (block_tokens < 1 || (block_tokens & (block_tokens - 1)) != 0) return -1;
  std::int64_t shift = 0;
  while ((std::int64_t{1} << shift) < block_tokens) ++shift;
  return shift;
}

bool attention_decode_head_paged(const float* q, const PagedKvRows& keys, const PagedKvRows& values, std::int64_t n,
                                 std::int64_t group, std::int64_t head_dim, float scale, float* scores, float* out) {
#if KVCHAT_HAVE_AVX2_KERNELS
  if (use_avx512_kernels() && head_dim % 16 == 0 && group <= avx512::kMaxAttentionGroup &&
      keys.block_tokens == values.block_tokens && keys.dtype == values.dtype)
    return avx512::attention_decode_head_paged(q, keys, values, n, group, head_dim, scale, scores, out);
#endif
  (void)q, (void)keys, (void)values, (void)n, (void)group, (void)head_dim, (void)scale, (void)scores, (void)out;
  return false;
}

void gather_paged_kv_rows(const PagedKvRows& rows, std::int64_t n, std::int64_t head_dim, float* values) {
  // A block's rows are consecutive: decoded a run at a time.
  for (std::int64_t t = 0; t < n;) {
    const std::int64_t position = rows.first + t, within = position % rows.block_tokens;
    const std::int64_t count = std::min(rows.block_tokens - within, n - t);
    decode_kv_rows(rows.dtype, rows.blocks[position / rows.block_tokens] + rows.offset + within * rows.row_bytes, count,
                   rows.row_bytes, head_dim, values + t * head_dim);
    t += count;
  }
}

void attention_decode_head_softcapped(const float* q, const float* keys, const float* values, std::int64_t n,
                                      std::int64_t row_stride, std::int64_t group, std::int64_t head_dim, float scale,
                                      float softcap, float* scores, float* out) {
  attention_portable(q, keys, values, n, row_stride, group, head_dim, scale, scores, out, softcap);
}

}  // namespace kvchat::kernels
