#pragma once
// The KV cache: per layer, the keys and values of every processed position, in the compact GQA form
// ([num_key_value_heads, tokens, head_dim]: never the heads repeated for the score matmul).
//
// A layer with a sliding window (KvCacheShape::layer_windows) needs only its last `window` positions: the
// contiguous cache keeps those (and a little room to write into) and drops older ones, so a long chat on such a
// model holds bounded memory. first_position(layer) says where a layer's rows begin; truncating to a length
// whose window was already dropped empties the cache instead (the caller prefills again from the start).
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

// The stored rows of one layer, for the decode step's attention: KV head h's keys (values likewise) at
// position first_position + p are the row_bytes bytes at head_keys(h) + p * row_bytes, in the cache's KvDtype
// (engine/kernels/kv_rows.h; F32 rows are head_dim floats). Writing goes through KvCache::write_rows, so the
// cache alone knows its layout.
//
// A paged cache's rows (paged()) are in blocks of block_tokens positions instead: position p of KV head h is at
// blocks[p / block_tokens] + keys_offset (values_offset) + h * head_stride + (p % block_tokens) * row_bytes, and
// keys and values are null.
struct KvLayerRows {
  const std::uint8_t* keys = nullptr;
  const std::uint8_t* values = nullptr;
  std::int64_t head_stride = 0;     // bytes from one KV head's rows to the next's
  std::int64_t row_bytes = 0;       // bytes of one position's row
  std::int64_t first_position = 0;  // the position of row 0 (a sliding layer's cache drops older positions)
  KvDtype dtype = KvDtype::F32;
  const std::uint8_t* const* blocks = nullptr;  // each block's start, in position order (paged rows only)
  std::int64_t block_tokens = 0, keys_offset = 0, values_offset = 0;
  bool paged() const { return blocks != nullptr; }
  const std::uint8_t* head_keys(std::int64_t head) const { return keys + head * head_stride; }
  const std::uint8_t* head_values(std::int64_t head) const { return values + head * head_stride; }
};

struct KvCacheShape {
  std::int64_t layers = 0;
  std::int64_t kv_heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t max_tokens = 0;   // the model's context limit: capacity never grows past it
  KvDtype dtype = KvDtype::F32;  // how rows are stored: a row is row_elements() elements of storage_type()
  // Per layer, the sliding window of its attention (0: every position); empty for none.
  std::vector<std::int64_t> layer_windows;
  at::ScalarType storage_type() const;  // f32, bf16, f16, or bytes (q8_0)
  std::int64_t row_elements() const;    // head_dim, or a q8_0 row's bytes
  std::int64_t row_bytes() const;       // of one KV head at one position
  std::int64_t window(std::int64_t layer) const {
    return static_cast<std::size_t>(layer) < layer_windows.size() ? layer_windows[static_cast<std::size_t>(layer)] : 0;
  }
  // 2 (K and V) x kv_heads x row bytes x the positions each layer needs for `tokens`: all of them, or a sliding
  // layer's window at most (what a cache of this shape holding `tokens` positions counts as its bytes).
  std::int64_t bytes_for(std::int64_t tokens) const;
};

class KvCache {
 public:
  explicit KvCache(const KvCacheShape& shape) : shape_(shape) {}
  virtual ~KvCache() = default;

  // k, v: [kv_heads, T, head_dim] f32 values (stored in the cache's dtype), or rows already stored
  // ([kv_heads, T, row_elements()] of storage_type(): another cache's view, a snapshot). Returns the layer's stored
  // (keys, values) of [kv_heads, size() + T - first_position(layer), row_elements()].
  virtual std::pair<at::Tensor, at::Tensor> append(std::int64_t layer, const at::Tensor& k, const at::Tensor& v) = 0;
  void commit(std::int64_t tokens) { size_ += tokens; }
  // The stored keys and values of a layer's committed positions first_position(layer) .. n - 1.
  virtual std::pair<at::Tensor, at::Tensor> view(std::int64_t layer, std::int64_t n) const = 0;
  // Keeps the first n positions (n <= size()) and returns how many it kept: n, or 0 where a sliding layer has
  // already dropped positions that the window of position n would need.
  virtual std::int64_t truncate(std::int64_t n) = 0;
  // The first position a layer still holds: 0, unless a sliding layer dropped older ones.
  virtual std::int64_t first_position(std::int64_t layer) const {
    (void)layer;
    return 0;
  }
  // Whether every layer still holds every position from 0 (what a snapshot or a prefix copy needs).
  bool holds_every_position() const;
  // Capacity in tokens before the next growth.
  virtual std::int64_t capacity() const = 0;
  // Room for `tokens` positions in all (at most the context limit), so that reaching them copies nothing; a cache
  // that does not preallocate ignores it.
  virtual void reserve(std::int64_t tokens) { (void)tokens; }

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
  // Writes one position's K and V of a layer ([kv_heads, head_dim] floats each, heads in order, stored in the
  // cache's dtype) into the rows made ready by prepare_rows. Counts only after commit(), as with append.
  virtual void write_rows(std::int64_t layer, std::int64_t position, const float* k, const float* v);

  std::int64_t size() const { return size_; }
  // KvCacheShape::bytes_for the cache's tokens (what the contiguous cache holds; the naive reference keeps every one).
  std::int64_t bytes() const { return bytes_for(size_); }
  std::int64_t bytes_for(std::int64_t tokens) const { return shape_.bytes_for(tokens); }
  // The positions a layer needs for the cache's tokens: size(), or at most its window.
  std::int64_t held_positions(std::int64_t layer) const;
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
  std::int64_t truncate(std::int64_t n) override;
  std::int64_t capacity() const override { return size_; }

 private:
  std::vector<at::Tensor> keys_, values_;  // per layer [kv_heads, tokens, head_dim]
};

// The fast one: one preallocated buffer per layer, new positions written in place, so a decode step allocates
// nothing. A full layer's capacity grows geometrically (x2, capped at the context limit); a sliding layer's buffer
// holds its window plus room for the rows being written, and moves the window's rows to its front when that room
// is used up (once per kWindowRoomRows steps of decode).
class ContiguousKvCache final : public KvCache {
 public:
  explicit ContiguousKvCache(const KvCacheShape& shape, std::int64_t initial_capacity = 256);
  std::pair<at::Tensor, at::Tensor> append(std::int64_t layer, const at::Tensor& k, const at::Tensor& v) override;
  std::pair<at::Tensor, at::Tensor> view(std::int64_t layer, std::int64_t n) const override;
  std::int64_t truncate(std::int64_t n) override;
  std::int64_t first_position(std::int64_t layer) const override { return layers_.at(layer).first; }
  // Positions the full layers hold before their next growth (a model of sliding layers only: the largest buffer).
  std::int64_t capacity() const override;
  // Rows one layer's buffer has room for.
  std::int64_t layer_capacity(std::int64_t layer) const { return layers_.at(layer).capacity; }
  bool prepare_rows(std::int64_t tokens) override;
  KvLayerRows layer_rows(std::int64_t layer) const override;
  void write_rows(std::int64_t layer, std::int64_t position, const float* k, const float* v) override;
  void reserve(std::int64_t tokens) override;

  // A sliding layer's room beyond its window (at most the window itself).
  static constexpr std::int64_t kWindowRoomRows = 256;

 private:
  struct LayerBuffer {
    at::Tensor keys, values;  // [kv_heads, capacity, head_dim]; row r holds position first + r
    std::int64_t capacity = 0, first = 0, window = 0;
  };
  // Makes room in a sliding layer for `tokens` positions after size(), dropping the positions its window no
  // longer needs (and shrinking a buffer that a long prompt grew).
  void make_window_room(LayerBuffer& layer, std::int64_t tokens);
  void reallocate(LayerBuffer& layer, std::int64_t capacity, std::int64_t keep_from);

  std::int64_t full_capacity_ = 0;  // of the layers without a window
  std::vector<LayerBuffer> layers_;
};

std::unique_ptr<KvCache> make_kv_cache(KvCacheMode mode, const KvCacheShape& shape);

// Stored rows as f32 values: [kv_heads, T, row_elements()] of the shape's storage type -> [kv_heads, T, head_dim].
at::Tensor stored_kv_to_float(const at::Tensor& stored, const KvCacheShape& shape);

}  // namespace kvchat
