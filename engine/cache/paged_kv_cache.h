#pragma once
// A KvCache over a KvBlockPool: a sequence's keys and values live in the pool's blocks through its own block
// table, so that sequences forked from it share their common prefix block for block (copy-on-write when one
// writes into a shared block). A decode step (and a batched one) writes its rows in place and the attention reads
// them in their blocks (prepare_rows, layer_rows, write_rows: no allocation, no copy); append() serves the general
// path and returns the layer's rows gathered into one tensor. Every layer keeps every position: a model with
// sliding-window layers is refused.
#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "engine/cache/kv_block_pool.h"
#include "engine/cache/kv_cache.h"

namespace kvchat {

class PagedKvCache final : public KvCache {
 public:
  // The pool must outlive the cache. Throws std::invalid_argument for a shape that is not the pool's, or one
  // with sliding-window layers.
  explicit PagedKvCache(KvBlockPool& pool);
  // Whether a cache of `shape` can be paged (no sliding-window layer): what the constructor requires of the pool's.
  static bool accepts(const KvCacheShape& shape);

  // Throws std::length_error when the pool has no block left for the step (nothing is written then).
  std::pair<at::Tensor, at::Tensor> append(std::int64_t layer, const at::Tensor& k, const at::Tensor& v) override;
  std::pair<at::Tensor, at::Tensor> view(std::int64_t layer, std::int64_t n) const override;
  std::int64_t truncate(std::int64_t n) override;
  std::int64_t capacity() const override;
  // Throws std::length_error when the pool has no block left for the step (nothing is taken then).
  bool prepare_rows(std::int64_t tokens) override;
  KvLayerRows layer_rows(std::int64_t layer) const override;
  void write_rows(std::int64_t layer, std::int64_t position, const float* k, const float* v) override;

  // A cache holding this one's committed positions in the same blocks.
  std::unique_ptr<PagedKvCache> fork() const;
  const KvBlockTable& table() const { return table_; }

 private:
  // The table counts what commit() counted (KvCache::commit is not virtual).
  void catch_up() const;
  at::Tensor gather(std::int64_t layer, KvBlockPool::Part part, std::int64_t positions) const;

  // Makes positions size() .. size() + tokens - 1 writable, or throws std::length_error.
  void prepare(std::int64_t tokens);

  KvBlockPool* pool_;
  mutable KvBlockTable table_;
  std::vector<const std::uint8_t*> block_starts_;  // the table's blocks' data, as of the last prepare_rows
};

}  // namespace kvchat
