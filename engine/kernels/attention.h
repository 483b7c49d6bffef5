#pragma once
// Decode-step attention for one KV head: the queries of its group (one position each) against the
// head's cached keys and values. Written out so that a decode step needs no LibTorch call and no
// allocation for attention.
#include <cstdint>

#include "engine/types.h"

namespace kvchat::kernels {

// q: [group, head_dim]; keys, values: n rows of head_dim floats, `row_stride` floats apart;
// scores: scratch of [group, n]; out: [group, head_dim].
// out[j] = sum_t softmax_t(scale * q[j] . keys[t]) * values[t]  (all positions t < n are visible).
void attention_decode_head(const float* q, const float* keys, const float* values, std::int64_t n,
                           std::int64_t row_stride, std::int64_t group, std::int64_t head_dim, float scale,
                           float* scores, float* out);

// As attention_decode_head, with Gemma 2's soft-capped scores: scale * q . k becomes cap * tanh(scale * q . k / cap)
// before the softmax. Portable code: only that family's attention takes it.
void attention_decode_head_softcapped(const float* q, const float* keys, const float* values, std::int64_t n,
                                      std::int64_t row_stride, std::int64_t group, std::int64_t head_dim, float scale,
                                      float softcap, float* scores, float* out);

// Keys or values as the KV cache stores them (kv_rows.h): row t is the row_bytes bytes at data + t * row_bytes.
struct StoredKvRows {
  const std::uint8_t* data = nullptr;
  std::int64_t row_bytes = 0;
  KvDtype dtype = KvDtype::F32;
};

// attention_decode_head over stored rows, reading each value as the f32 value it stands for: the result is, to the
// bit, attention_decode_head's over the decoded rows. Returns false (and computes nothing) where no kernel reads
// these rows directly: the caller decodes them (decode_kv_rows) and calls attention_decode_head.
bool attention_decode_head_stored(const float* q, const StoredKvRows& keys, const StoredKvRows& values, std::int64_t n,
                                  std::int64_t group, std::int64_t head_dim, float scale, float* scores, float* out);

// Rows in the blocks of a paged KV cache: row t (position first + t) is the row_bytes bytes at
// blocks[(first + t) / block_tokens] + offset + ((first + t) % block_tokens) * row_bytes.
struct PagedKvRows {
  const std::uint8_t* const* blocks = nullptr;
  std::int64_t block_tokens = 0;
  std::int64_t offset = 0;  // bytes from a block's start to the row of its first position
  std::int64_t first = 0;
  std::int64_t row_bytes = 0;
  KvDtype dtype = KvDtype::F32;
};
// log2(block_tokens) for a power of two; -1 otherwise (the paged kernel takes positions apart with a shift).
std::int64_t paged_block_shift(std::int64_t block_tokens);

// attention_decode_head_stored over paged rows: to the bit the result over the same rows stored one after another
// (a row's address changes, not its arithmetic). False (nothing computed) where no kernel reads blocks: the caller
// gathers them (gather_paged_kv_rows) and calls attention_decode_head.
bool attention_decode_head_paged(const float* q, const PagedKvRows& keys, const PagedKvRows& values, std::int64_t n,
                                 std::int64_t group, std::int64_t head_dim, float scale, float* scores, float* out);
// n paged rows decoded into n x head_dim f32 values (contiguous).
void gather_paged_kv_rows(const PagedKvRows& rows, std::int64_t n, std::int64_t head_dim, float* values);

}  // namespace kvchat::kernels
