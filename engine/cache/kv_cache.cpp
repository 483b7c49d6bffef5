#include "engine/cache/kv_cache.h"

#include "engine/cache/huge_page_buffer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace kvchat {

namespace {
void check_step(const KvCacheShape& shape, std::int64_t layer, const at::Tensor& k, const at::Tensor& v) {
  if (layer < 0 || layer >= shape.layers)
    throw std::out_of_range("kv cache: layer " + std::to_string(layer) + " out of range");
  if (k.dim() != 3 || k.size(0) != shape.kv_heads || k.size(2) != shape.head_dim || !k.sizes().equals(v.sizes()))
    throw std::invalid_argument("kv cache: step K/V must be [kv_heads, T, head_dim]");
}
}  // namespace

void KvCache::write_rows(std::int64_t, std::int64_t, const float*, const float*) {
  throw std::logic_error("kv cache: write_rows on a cache without direct rows");
}

NaiveKvCache::NaiveKvCache(const KvCacheShape& shape) : KvCache(shape) {
  auto empty = at::empty({shape.kv_heads, 0, shape.head_dim}, at::TensorOptions().dtype(shape.dtype));
  keys_.assign(shape.layers, empty);
  values_.assign(shape.layers, empty);
}

std::pair<at::Tensor, at::Tensor> NaiveKvCache::append(std::int64_t layer, const at::Tensor& k, const at::Tensor& v) {
  check_step(shape_, layer, k, v);
  // Only committed positions are kept: a forward interrupted half way leaves no trace.
  keys_[layer] = at::cat({keys_[layer].narrow(1, 0, size_), k.to(shape_.dtype)}, 1);
  values_[layer] = at::cat({values_[layer].narrow(1, 0, size_), v.to(shape_.dtype)}, 1);
  return {keys_[layer], values_[layer]};
}

std::pair<at::Tensor, at::Tensor> NaiveKvCache::view(std::int64_t layer, std::int64_t n) const {
  return {keys_.at(layer).narrow(1, 0, n), values_.at(layer).narrow(1, 0, n)};
}

void NaiveKvCache::truncate(std::int64_t n) {
  n = std::clamp<std::int64_t>(n, 0, size_);
  for (std::int64_t layer = 0; layer < shape_.layers; ++layer) {
    keys_[layer] = keys_[layer].narrow(1, 0, n).clone();
    values_[layer] = values_[layer].narrow(1, 0, n).clone();
  }
  size_ = n;
}

ContiguousKvCache::ContiguousKvCache(const KvCacheShape& shape, std::int64_t initial_capacity) : KvCache(shape) {
  keys_.resize(shape.layers);
  values_.resize(shape.layers);
  reserve(std::min(initial_capacity, shape.max_tokens));
}

void ContiguousKvCache::reserve(std::int64_t tokens) {
  if (tokens <= capacity_) return;
  if (tokens > shape_.max_tokens)
    throw std::length_error("kv cache: " + std::to_string(tokens) + " tokens exceed the context limit of " +
                            std::to_string(shape_.max_tokens));
  // Geometric growth: amortised O(1) copies per token; capped at the context limit.
  std::int64_t new_capacity = std::max<std::int64_t>(tokens, std::max<std::int64_t>(capacity_ * 2, 16));
  new_capacity = std::min(new_capacity, shape_.max_tokens);
  for (std::int64_t layer = 0; layer < shape_.layers; ++layer) {
    at::Tensor keys = empty_on_huge_pages({shape_.kv_heads, new_capacity, shape_.head_dim}, shape_.dtype);
    at::Tensor values = empty_on_huge_pages({shape_.kv_heads, new_capacity, shape_.head_dim}, shape_.dtype);
    if (size_ > 0) {
      keys.narrow(1, 0, size_).copy_(keys_[layer].narrow(1, 0, size_));
      values.narrow(1, 0, size_).copy_(values_[layer].narrow(1, 0, size_));
    }
    keys_[layer] = keys;
    values_[layer] = values;
  }
  if (capacity_ > 0) spdlog::debug("kv cache grown from {} to {} tokens", capacity_, new_capacity);
  capacity_ = new_capacity;
}

std::pair<at::Tensor, at::Tensor> ContiguousKvCache::append(std::int64_t layer, const at::Tensor& k,
                                                            const at::Tensor& v) {
  check_step(shape_, layer, k, v);
  const std::int64_t steps = k.size(1);
  reserve(size_ + steps);
  keys_[layer].narrow(1, size_, steps).copy_(k);
  values_[layer].narrow(1, size_, steps).copy_(v);
  return {keys_[layer].narrow(1, 0, size_ + steps), values_[layer].narrow(1, 0, size_ + steps)};
}

bool ContiguousKvCache::prepare_rows(std::int64_t tokens) {
  if (shape_.dtype != at::kFloat) return false;
  reserve(size_ + tokens);
  return true;
}

KvLayerRows ContiguousKvCache::layer_rows(std::int64_t layer) const {
  // [kv_heads, capacity, head_dim], contiguous: heads are capacity rows apart.
  return {keys_[layer].data_ptr<float>(), values_[layer].data_ptr<float>(), capacity_ * shape_.head_dim};
}

void ContiguousKvCache::write_rows(std::int64_t layer, std::int64_t position, const float* k, const float* v) {
  const std::int64_t head_dim = shape_.head_dim, head_stride = capacity_ * head_dim;
  float* keys = keys_[layer].data_ptr<float>();
  float* values = values_[layer].data_ptr<float>();
  for (std::int64_t head = 0; head < shape_.kv_heads; ++head) {
    const std::int64_t slot = head * head_stride + position * head_dim;
    std::copy_n(k + head * head_dim, head_dim, keys + slot);
    std::copy_n(v + head * head_dim, head_dim, values + slot);
  }
}

std::pair<at::Tensor, at::Tensor> ContiguousKvCache::view(std::int64_t layer, std::int64_t n) const {
  return {keys_.at(layer).narrow(1, 0, n), values_.at(layer).narrow(1, 0, n)};
}

void ContiguousKvCache::truncate(std::int64_t n) { size_ = std::clamp<std::int64_t>(n, 0, size_); }

std::unique_ptr<KvCache> make_kv_cache(KvCacheMode mode, const KvCacheShape& shape) {
  switch (mode) {
    case KvCacheMode::Contiguous: return std::make_unique<ContiguousKvCache>(shape);
    case KvCacheMode::Naive: return std::make_unique<NaiveKvCache>(shape);
    case KvCacheMode::Off: return nullptr;
  }
  return nullptr;
}

}  // namespace kvchat
