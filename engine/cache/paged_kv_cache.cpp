#include "engine/cache/paged_kv_cache.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "engine/cache/kv_step.h"
#include "engine/kernels/kv_rows.h"

namespace kvchat {

PagedKvCache::PagedKvCache(KvBlockPool& pool) : KvCache(pool.shape()), pool_(&pool), table_(pool) {
  for (std::int64_t layer = 0; layer < shape_.layers; ++layer)
    if (shape_.window(layer) > 0)
      throw std::invalid_argument("PagedKvCache: layer " + std::to_string(layer) +
                                  " has a sliding window, which the paged cache does not drop yet");
}

bool PagedKvCache::accepts(const KvCacheShape& shape) {
  for (std::int64_t layer = 0; layer < shape.layers; ++layer)
    if (shape.window(layer) > 0) return false;
  return true;
}

void PagedKvCache::catch_up() const {
  if (table_.size() < size_) table_.commit(size_ - table_.size());
}

std::pair<at::Tensor, at::Tensor> PagedKvCache::append(std::int64_t layer, const at::Tensor& k, const at::Tensor& v) {
  check_kv_step(shape_, layer, k, v);
  catch_up();
  const std::int64_t steps = k.size(1);
  // The first layer of a forward makes room for all of them; the step's positions count once committed.
  prepare(steps);
  const std::int64_t row_bytes = shape_.row_bytes();
  const at::Tensor stored[2] = {kv_step_as_stored(k, shape_).contiguous(), kv_step_as_stored(v, shape_).contiguous()};
  for (int part = 0; part < 2; ++part) {
    const auto* rows = static_cast<const std::uint8_t*>(stored[part].data_ptr());
    for (std::int64_t head = 0; head < shape_.kv_heads; ++head)
      for (std::int64_t step = 0; step < steps; ++step)
        std::memcpy(table_.row(layer, KvBlockPool::Part(part), head, size_ + step),
                    rows + (head * steps + step) * row_bytes, static_cast<std::size_t>(row_bytes));
  }
  return {gather(layer, KvBlockPool::Part::Keys, size_ + steps),
          gather(layer, KvBlockPool::Part::Values, size_ + steps)};
}

void PagedKvCache::prepare(std::int64_t tokens) {
  if (!table_.prepare(tokens))
    throw std::length_error("PagedKvCache: the block pool has no room for " + std::to_string(tokens) +
                            " more positions (" + std::to_string(pool_->blocks_free()) + " free blocks)");
}

bool PagedKvCache::prepare_rows(std::int64_t tokens) {
  catch_up();
  prepare(tokens);
  block_starts_.clear();
  for (const KvBlockPool::BlockId block : table_.blocks()) block_starts_.push_back(pool_->block_data(block));
  return true;
}

KvLayerRows PagedKvCache::layer_rows(std::int64_t layer) const {
  if (layer < 0 || layer >= shape_.layers) throw std::out_of_range("PagedKvCache::layer_rows: no such layer");
  KvLayerRows rows;
  rows.head_stride = pool_->head_bytes();
  rows.row_bytes = shape_.row_bytes();
  rows.dtype = shape_.dtype;
  rows.blocks = block_starts_.data();
  rows.block_tokens = pool_->block_tokens();
  rows.keys_offset = pool_->part_offset(layer, KvBlockPool::Part::Keys);
  rows.values_offset = pool_->part_offset(layer, KvBlockPool::Part::Values);
  return rows;
}

void PagedKvCache::write_rows(std::int64_t layer, std::int64_t position, const float* k, const float* v) {
  const std::int64_t head_dim = shape_.head_dim;
  for (std::int64_t head = 0; head < shape_.kv_heads; ++head) {
    kernels::encode_kv_rows(shape_.dtype, k + head * head_dim, 1, head_dim,
                            table_.row(layer, KvBlockPool::Part::Keys, head, position));
    kernels::encode_kv_rows(shape_.dtype, v + head * head_dim, 1, head_dim,
                            table_.row(layer, KvBlockPool::Part::Values, head, position));
  }
}

at::Tensor PagedKvCache::gather(std::int64_t layer, KvBlockPool::Part part, std::int64_t positions) const {
  at::Tensor out =
      at::empty({shape_.kv_heads, positions, shape_.row_elements()}, at::TensorOptions().dtype(shape_.storage_type()));
  auto* bytes = static_cast<std::uint8_t*>(out.data_ptr());
  const std::int64_t row_bytes = shape_.row_bytes(), block_tokens = pool_->block_tokens();
  const KvBlockTable& table = table_;
  // A block's rows of one head are contiguous: copied a block at a time.
  for (std::int64_t head = 0; head < shape_.kv_heads; ++head)
    for (std::int64_t first = 0; first < positions; first += block_tokens) {
      const std::int64_t count = std::min(block_tokens, positions - first);
      std::memcpy(bytes + (head * positions + first) * row_bytes, table.row(layer, part, head, first),
                  static_cast<std::size_t>(count * row_bytes));
    }
  return out;
}

std::pair<at::Tensor, at::Tensor> PagedKvCache::view(std::int64_t layer, std::int64_t n) const {
  if (layer < 0 || layer >= shape_.layers || n < 0 || n > size_)
    throw std::out_of_range("PagedKvCache::view: layer or length out of range");
  catch_up();
  return {gather(layer, KvBlockPool::Part::Keys, n), gather(layer, KvBlockPool::Part::Values, n)};
}

std::int64_t PagedKvCache::truncate(std::int64_t n) {
  n = std::clamp<std::int64_t>(n, 0, size_);
  catch_up();
  table_.truncate(n);
  size_ = n;
  return n;
}

std::int64_t PagedKvCache::capacity() const {
  return static_cast<std::int64_t>(table_.blocks().size()) * pool_->block_tokens();
}

std::unique_ptr<PagedKvCache> PagedKvCache::fork() const {
  catch_up();
  auto copy = std::make_unique<PagedKvCache>(*pool_);
  copy->table_ = table_.fork();
  copy->size_ = size_;
  return copy;
}

}  // namespace kvchat
