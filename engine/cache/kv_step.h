#pragma once
// What every KvCache::append does with a step's keys and values before storing them (kv_cache.cpp), shared by
// the cache implementations.
#include <ATen/ATen.h>

#include <cstdint>

#include "engine/cache/kv_cache.h"

namespace kvchat {

// Throws unless k and v are a step of `layer`: [kv_heads, T, head_dim] f32, or rows already in the shape's dtype.
void check_kv_step(const KvCacheShape& shape, std::int64_t layer, const at::Tensor& k, const at::Tensor& v);
// k as the cache stores it, [kv_heads, T, row_elements()] of storage_type(): f32 values encoded in the cache's
// dtype; rows already stored as they are.
at::Tensor kv_step_as_stored(const at::Tensor& k, const KvCacheShape& shape);

}  // namespace kvchat
