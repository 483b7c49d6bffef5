#pragma once
// The KV cache: per layer, the keys and values of every processed position, in the compact GQA form
// ([num_key_value_heads, tokens, head_dim]: never the heads repeated for the score matmul).
//
// Protocol of one forward over T new tokens: for each layer, append(layer, k, v) writes the new K/V at
// positions size()..size()+T-1 and returns that layer's keys/values for positions 0..size()+T-1; after
// the last layer, commit(T) makes the new positions count. A forward that throws half way leaves size()
// unchanged, so the cache always holds exactly the tokens that were fully processed.
#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "engine/types.h"

namespace kvchat {

// Raw f32 storage of one layer, for the fused decode step's attention: KV head h's keys (values
// likewise) are head_keys(h)[p * head_dim + i] for position p, head_dim floats a position. Writing goes
// through KvCache::write_rows, so the cache alone knows its layout.
struct KvLayerRows {
  const float* keys = nullptr;
  const float* values = nullptr;
  std::int64_t head_stride = 0;
  const float* head_keys(std::int64_t head) const { return keys + head * head_stride; }
  const float* head_values(std::int64_t head) const { return values + head * head_stride; }
};

struct KvCacheShape {
  std::int64_t layers = 0;
  std::int64_t kv_heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t max_tokens = 0;  // the model's context limit: capacity never grows past it
  at::ScalarType dtype = at::kFloat;
};

class KvCache {
 public:
  explicit KvCache(const KvCacheShape& shape) : shape_(shape) {}
  virtual ~KvCache() = default;

  // k, v: [kv_heads, T, head_dim]. Returns (keys, values) of [kv_heads, size() + T, head_dim].
  virtual std::pair<at::Tensor, at::Tensor> append(std::int64_t layer, const at::Tensor& k, const at::Tensor& v) = 0;
  void commit(std::int64_t tokens) { size_ += tokens; }
  // Keys and values of the first n committed positions of a layer.
  virtual std::pair<at::Tensor, at::Tensor> view(std::int64_t layer, std::int64_t n) const = 0;
  // Keeps the first n positions (n <= size()).
  virtual void truncate(std::int64_t n) = 0;
  // Capacity in tokens before the next growth.
  virtual std::int64_t capacity() const = 0;

  // Direct row access, for writing `tokens` new positions in place (a decode step: no LibTorch call,
  // no allocation): makes room for size() + tokens positions and returns true if this cache keeps its
  // layers as KvLayerRows, false if it does not (then use append). Positions written past size() count
  // only after commit(), as with append.
  virtual bool prepare_rows(std::int64_t tokens) {
    (void)tokens;
    return false;
  }
  // Valid after prepare_rows returned true, until the next prepare_rows, append or truncate.
  virtual KvLayerRows layer_rows(std::int64_t layer) const {
    (void)layer;
    return {};
  }
  // Writes one position's K and V of a layer ([kv_heads, head_dim] floats each, heads in order) into
  // the rows made ready by prepare_rows. Counts only after commit(), as with append.
  virtual void write_rows(std::int64_t layer, std::int64_t position, const float* k, const float* v);

  std::int64_t size() const { return size_; }
  // 2 (K and V) x layers x kv_heads x head_dim x tokens x element size.
  std::int64_t bytes() const { return bytes_for(size_); }
  std::int64_t bytes_for(std::int64_t tokens) const {
    return 2 * shape_.layers * shape_.kv_heads * shape_.head_dim * tokens *
           static_cast<std::int64_t>(c10::elementSize(shape_.dtype));
  }
  const KvCacheShape& shape() const { return shape_; }

 protected:
  KvCacheShape shape_;
  std::int64_t size_ = 0;
};

// The reference: grows by concatenation every step, as simple as possible.
class NaiveKvCache final : public KvCache {
 public:
  explicit NaiveKvCache(const KvCacheShape& shape);
  std::pair<at::Tensor, at::Tensor> append(std::int64_t layer, const at::Tensor& k, const at::Tensor& v) override;
  std::pair<at::Tensor, at::Tensor> view(std::int64_t layer, std::int64_t n) const override;
  void truncate(std::int64_t n) override;
  std::int64_t capacity() const override { return size_; }

 private:
  std::vector<at::Tensor> keys_, values_;  // per layer [kv_heads, tokens, head_dim]
};

// The fast one: one preallocated buffer per layer, capacity grown geometrically (x2, capped at the
// context limit), new positions written in place, so a decode step allocates nothing.
class ContiguousKvCache final : public KvCache {
 public:
  explicit ContiguousKvCache(const KvCacheShape& shape, std::int64_t initial_capacity = 256);
  std::pair<at::Tensor, at::Tensor> append(std::int64_t layer, const at::Tensor& k, const at::Tensor& v) override;
  std::pair<at::Tensor, at::Tensor> view(std::int64_t layer, std::int64_t n) const override;
  void truncate(std::int64_t n) override;
  std::int64_t capacity() const override { return capacity_; }
  bool prepare_rows(std::int64_t tokens) override;
  KvLayerRows layer_rows(std::int64_t layer) const override;
  void write_rows(std::int64_t layer, std::int64_t position, const float* k, const float* v) override;
  void reserve(std::int64_t tokens);

 private:
  std::int64_t capacity_ = 0;
  std::vector<at::Tensor> keys_, values_;  // per layer [kv_heads, capacity, head_dim]
};

std::unique_ptr<KvCache> make_kv_cache(KvCacheMode mode, const KvCacheShape& shape);

}  // namespace kvchat
