#include "engine/cache/kv_cache.h"
#include "engine/cache/kv_step.h"

#include "engine/cache/huge_page_buffer.h"
#include "engine/kernels/kv_rows.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

namespace kvchat {

void check_kv_step(const KvCacheShape& shape, std::int64_t layer, const at::Tensor& k, const at::Tensor& v) {
  if (layer < 0 || layer >= shape.layers)
    throw std::out_of_range("kv cache: layer " + std::to_string(layer) + " out of range");
  if (k.dim() != 3 || k.size(0) != shape.kv_heads || !k.sizes().equals(v.sizes()) || k.scalar_type() != v.scalar_type())
    throw std::invalid_argument("kv cache: step K/V must be [kv_heads, T, head_dim]");
  const bool values = k.scalar_type() == at::kFloat && k.size(2) == shape.head_dim;
  const bool stored = k.scalar_type() == shape.storage_type() && k.size(2) == shape.row_elements();
  if (!values && !stored)
    throw std::invalid_argument("kv cache: step K/V must be [kv_heads, T, head_dim] f32 or rows of the cache's dtype");
}

at::Tensor kv_step_as_stored(const at::Tensor& k, const KvCacheShape& shape) {
  if (k.scalar_type() == shape.storage_type() && k.size(2) == shape.row_elements()) return k;
  const at::Tensor values = k.contiguous();
  at::Tensor stored =
      at::empty({k.size(0), k.size(1), shape.row_elements()}, at::TensorOptions().dtype(shape.storage_type()));
  kernels::encode_kv_rows(shape.dtype, values.data_ptr<float>(), k.size(0) * k.size(1), shape.head_dim,
                          stored.data_ptr());
  return stored;
}

at::ScalarType KvCacheShape::storage_type() const {
  switch (dtype) {
    case KvDtype::F32: return at::kFloat;
    case KvDtype::BF16: return at::kBFloat16;
    case KvDtype::F16: return at::kHalf;
    case KvDtype::Q8_0: return at::kByte;
  }
  throw std::invalid_argument("kv cache: unknown dtype");
}

std::int64_t KvCacheShape::row_bytes() const { return kernels::kv_row_bytes(dtype, head_dim); }

std::int64_t KvCacheShape::row_elements() const {
  return row_bytes() / static_cast<std::int64_t>(c10::elementSize(storage_type()));
}

at::Tensor stored_kv_to_float(const at::Tensor& stored, const KvCacheShape& shape) {
  if (shape.dtype == KvDtype::F32) return stored;
  const at::Tensor rows = stored.contiguous();
  at::Tensor values = at::empty({stored.size(0), stored.size(1), shape.head_dim}, at::kFloat);
  kernels::decode_kv_rows(shape.dtype, rows.data_ptr(), stored.size(0) * stored.size(1), shape.row_bytes(),
                          shape.head_dim, values.data_ptr<float>());
  return values;
}

std::int64_t KvCache::held_positions(std::int64_t layer) const {
  const std::int64_t window = shape_.window(layer);
  return window > 0 ? std::min(size_, window) : size_;
}

std::int64_t KvCacheShape::bytes_for(std::int64_t tokens) const {
  std::int64_t positions = 0;
  for (std::int64_t layer = 0; layer < layers; ++layer) {
    const std::int64_t layer_window = window(layer);
    positions += layer_window > 0 ? std::min(tokens, layer_window) : tokens;
  }
  return 2 * kv_heads * row_bytes() * positions;
}

bool KvCache::holds_every_position() const {
  for (std::int64_t layer = 0; layer < shape_.layers; ++layer)
    if (first_position(layer) > 0) return false;
  return true;
}

void KvCache::write_rows(std::int64_t, std::int64_t, const float*, const float*) {
  throw std::logic_error("kv cache: write_rows on a cache without direct rows");
}

NaiveKvCache::NaiveKvCache(const KvCacheShape& shape) : KvCache(shape) {
  auto empty = at::empty({shape.kv_heads, 0, shape.row_elements()}, at::TensorOptions().dtype(shape.storage_type()));
  keys_.assign(shape.layers, empty);
  values_.assign(shape.layers, empty);
}

std::pair<at::Tensor, at::Tensor> NaiveKvCache::append(std::int64_t layer, const at::Tensor& k, const at::Tensor& v) {
  check_kv_step(shape_, layer, k, v);
  // Only committed positions are kept: a forward interrupted half way leaves no trace.
  keys_[layer] = at::cat({keys_[layer].narrow(1, 0, size_), kv_step_as_stored(k, shape_)}, 1);
  values_[layer] = at::cat({values_[layer].narrow(1, 0, size_), kv_step_as_stored(v, shape_)}, 1);
  return {keys_[layer], values_[layer]};
}

std::pair<at::Tensor, at::Tensor> NaiveKvCache::view(std::int64_t layer, std::int64_t n) const {
  return {keys_.at(layer).narrow(1, 0, n), values_.at(layer).narrow(1, 0, n)};
}

std::int64_t NaiveKvCache::truncate(std::int64_t n) {
  n = std::clamp<std::int64_t>(n, 0, size_);
  for (std::int64_t layer = 0; layer < shape_.layers; ++layer) {
    keys_[layer] = keys_[layer].narrow(1, 0, n).clone();
    values_[layer] = values_[layer].narrow(1, 0, n).clone();
  }
  size_ = n;
  return n;
}

ContiguousKvCache::ContiguousKvCache(const KvCacheShape& shape, std::int64_t initial_capacity) : KvCache(shape) {
  layers_.resize(static_cast<std::size_t>(shape.layers));
  for (std::int64_t layer = 0; layer < shape.layers; ++layer) layers_[layer].window = shape.window(layer);
  reserve(std::min(initial_capacity, shape.max_tokens));
}

void ContiguousKvCache::reallocate(LayerBuffer& layer, std::int64_t capacity, std::int64_t keep_from) {
  at::Tensor keys = empty_on_huge_pages({shape_.kv_heads, capacity, shape_.row_elements()}, shape_.storage_type());
  at::Tensor values = empty_on_huge_pages({shape_.kv_heads, capacity, shape_.row_elements()}, shape_.storage_type());
  const std::int64_t kept = size_ - keep_from;
  if (kept > 0) {
    keys.narrow(1, 0, kept).copy_(layer.keys.narrow(1, keep_from - layer.first, kept));
    values.narrow(1, 0, kept).copy_(layer.values.narrow(1, keep_from - layer.first, kept));
  }
  layer.keys = keys;
  layer.values = values;
  layer.capacity = capacity;
  layer.first = keep_from;
}

void ContiguousKvCache::reserve(std::int64_t tokens) {
  if (tokens <= full_capacity_) return;
  if (tokens > shape_.max_tokens)
    throw std::length_error("kv cache: " + std::to_string(tokens) + " tokens exceed the context limit of " +
                            std::to_string(shape_.max_tokens));
  // Geometric growth: amortised O(1) copies per token; capped at the context limit.
  std::int64_t new_capacity = std::max<std::int64_t>(tokens, std::max<std::int64_t>(full_capacity_ * 2, 16));
  new_capacity = std::min(new_capacity, shape_.max_tokens);
  for (LayerBuffer& layer : layers_)
    if (layer.window == 0) reallocate(layer, new_capacity, 0);
  if (full_capacity_ > 0) spdlog::debug("kv cache grown from {} to {} tokens", full_capacity_, new_capacity);
  full_capacity_ = new_capacity;
}

void ContiguousKvCache::make_window_room(LayerBuffer& layer, std::int64_t tokens) {
  // Position size() + tokens - 1, the last to be written, sees back to size() + tokens - window; the first new
  // one to size() - window + 1, which bounds what must be kept.
  const std::int64_t keep_from = std::max<std::int64_t>(layer.first, size_ - layer.window + 1);
  const std::int64_t needed = size_ + tokens - keep_from;
  const std::int64_t target = std::max(needed, layer.window + std::min(layer.window, kWindowRoomRows));
  const bool room = size_ + tokens - layer.first <= layer.capacity;
  if (room && layer.capacity <= 2 * target) return;
  if (!room && layer.capacity >= needed && layer.capacity <= 2 * target) {
    // Move the rows still needed to the front, in place: no allocation in a steady decode.
    const std::int64_t kept = size_ - keep_from, shift = keep_from - layer.first;
    const auto row_bytes = static_cast<std::size_t>(shape_.row_bytes());
    for (at::Tensor* tensor : {&layer.keys, &layer.values}) {
      auto* base = static_cast<std::uint8_t*>(tensor->data_ptr());
      for (std::int64_t head = 0; head < shape_.kv_heads; ++head) {
        std::uint8_t* head_rows = base + static_cast<std::size_t>(head * layer.capacity) * row_bytes;
        std::memmove(head_rows, head_rows + static_cast<std::size_t>(shift) * row_bytes,
                     static_cast<std::size_t>(kept) * row_bytes);
      }
    }
    layer.first = keep_from;
    return;
  }
  reallocate(layer, target, keep_from);  // a first use, a long prompt's chunk, or a shrink after one
}

std::int64_t ContiguousKvCache::capacity() const {
  std::int64_t largest = 0;
  for (const LayerBuffer& layer : layers_)
    if (layer.window > 0) largest = std::max(largest, layer.first + layer.capacity);
  return full_capacity_ > 0 ? full_capacity_ : largest;
}

std::pair<at::Tensor, at::Tensor> ContiguousKvCache::append(std::int64_t layer_index, const at::Tensor& k,
                                                            const at::Tensor& v) {
  check_kv_step(shape_, layer_index, k, v);
  const std::int64_t steps = k.size(1);
  LayerBuffer& layer = layers_[layer_index];
  if (layer.window > 0)
    make_window_room(layer, steps);
  else
    reserve(size_ + steps);
  const std::int64_t start = size_ - layer.first;
  layer.keys.narrow(1, start, steps).copy_(kv_step_as_stored(k, shape_));
  layer.values.narrow(1, start, steps).copy_(kv_step_as_stored(v, shape_));
  return {layer.keys.narrow(1, 0, start + steps), layer.values.narrow(1, 0, start + steps)};
}

bool ContiguousKvCache::prepare_rows(std::int64_t tokens) {
  reserve(size_ + tokens);
  for (LayerBuffer& layer : layers_)
    if (layer.window > 0) make_window_room(layer, tokens);
  return true;
}

KvLayerRows ContiguousKvCache::layer_rows(std::int64_t layer_index) const {
  // [kv_heads, capacity, row], contiguous: heads are capacity rows apart.
  const LayerBuffer& layer = layers_[layer_index];
  const std::int64_t row_bytes = shape_.row_bytes();
  return {static_cast<const std::uint8_t*>(layer.keys.data_ptr()),
          static_cast<const std::uint8_t*>(layer.values.data_ptr()),
          layer.capacity * row_bytes,
          row_bytes,
          layer.first,
          shape_.dtype};
}

void ContiguousKvCache::write_rows(std::int64_t layer_index, std::int64_t position, const float* k, const float* v) {
  const LayerBuffer& layer = layers_[layer_index];
  const std::int64_t head_dim = shape_.head_dim, row_bytes = shape_.row_bytes(),
                     head_stride = layer.capacity * row_bytes;
  auto* keys = static_cast<std::uint8_t*>(layer.keys.data_ptr());
  auto* values = static_cast<std::uint8_t*>(layer.values.data_ptr());
  for (std::int64_t head = 0; head < shape_.kv_heads; ++head) {
    const std::int64_t slot = head * head_stride + (position - layer.first) * row_bytes;
    kernels::encode_kv_rows(shape_.dtype, k + head * head_dim, 1, head_dim, keys + slot);
    kernels::encode_kv_rows(shape_.dtype, v + head * head_dim, 1, head_dim, values + slot);
  }
}

std::pair<at::Tensor, at::Tensor> ContiguousKvCache::view(std::int64_t layer_index, std::int64_t n) const {
  const LayerBuffer& layer = layers_.at(layer_index);
  return {layer.keys.narrow(1, 0, n - layer.first), layer.values.narrow(1, 0, n - layer.first)};
}

std::int64_t ContiguousKvCache::truncate(std::int64_t n) {
  n = std::clamp<std::int64_t>(n, 0, size_);
  for (const LayerBuffer& layer : layers_)
    if (layer.window > 0 && layer.first > std::max<std::int64_t>(0, n - layer.window + 1)) {
      // Position n's window reaches back past what this layer kept: start again from nothing.
      n = 0;
      break;
    }
  if (n == 0)
    for (LayerBuffer& layer : layers_) layer.first = 0;
  size_ = n;
  return n;
}

std::unique_ptr<KvCache> make_kv_cache(KvCacheMode mode, const KvCacheShape& shape) {
  switch (mode) {
    case KvCacheMode::Contiguous: return std::make_unique<ContiguousKvCache>(shape);
    case KvCacheMode::Naive: return std::make_unique<NaiveKvCache>(shape);
    case KvCacheMode::Off: return nullptr;
  }
  return nullptr;
}

}  // namespace kvchat
