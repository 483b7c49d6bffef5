#pragma once
// A paged KV cache's memory: one pool of fixed-size blocks, each holding `block_tokens` positions of every
// layer's keys and values (all KV heads, rows in the shape's KvDtype), and per sequence a block table that maps
// its positions to blocks.
//
// Blocks are reference-counted so that sequences with a common prefix (one system prompt, a regenerate, a
// branch) hold its blocks once: KvBlockTable::fork() shares every block of a table. Writing into a block that
// another table still holds copies it first (copy-on-write), so a shared block is never changed under its other
// owners; only the block a sequence diverges in is copied, never the whole prefix.
//
// The pool's budget is its block count, fixed at construction: the storage is reserved (not touched) up front,
// and allocation past the budget fails without changing anything, for the caller to evict or refuse.
//
// Ownership: the pool owns the storage; a table holds references to blocks and releases them when truncated or
// destroyed, so every table must be gone before its pool. Not thread-safe: one scheduler owns both.
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "engine/cache/kv_cache.h"

namespace kvchat {

class KvBlockPool {
 public:
  using BlockId = std::int32_t;
  enum class Part { Keys = 0, Values = 1 };

  // Throws std::invalid_argument for an empty shape, block_tokens < 1, max_blocks < 1 or a pool past 2^50 bytes
  // (std::bad_alloc where the system cannot reserve it).
  KvBlockPool(const KvCacheShape& shape, std::int64_t block_tokens, std::int64_t max_blocks);
  KvBlockPool(const KvBlockPool&) = delete;
  KvBlockPool& operator=(const KvBlockPool&) = delete;

  // A block of reference count 1 (its rows undefined), or nothing when all max_blocks() are in use.
  std::optional<BlockId> allocate();
  void retain(BlockId block);
  // Drops one reference; the block returns to the free list at zero.
  void release(BlockId block);
  int reference_count(BlockId block) const;
  // `block` itself when this is its only reference; otherwise a new block holding a copy of its rows, the reference
  // to `block` released (nothing when the pool is full: then nothing changes).
  std::optional<BlockId> make_writable(BlockId block);

  // Position `row` (0 .. block_tokens - 1) of a block's K or V rows for one layer and KV head.
  std::uint8_t* row(BlockId block, std::int64_t layer, Part part, std::int64_t head, std::int64_t row);
  const std::uint8_t* row(BlockId block, std::int64_t layer, Part part, std::int64_t head, std::int64_t row) const;

  // The layout the attention kernels read: a block starts at block_data(block); one layer's K (V) rows of KV head h
  // start part_offset(layer, part) + h * head_bytes() bytes into it, a position's row row_bytes after the last.
  const std::uint8_t* block_data(BlockId block) const;
  std::int64_t part_offset(std::int64_t layer, Part part) const {
    return (layer * 2 + static_cast<std::int64_t>(part)) * shape_.kv_heads * head_bytes_;
  }
  std::int64_t head_bytes() const { return head_bytes_; }

  const KvCacheShape& shape() const { return shape_; }
  std::int64_t block_tokens() const { return block_tokens_; }
  std::int64_t block_bytes() const { return block_bytes_; }
  std::int64_t max_blocks() const { return max_blocks_; }

  // Counters, for the gauge, the scheduler and the tests.
  std::int64_t blocks_in_use() const { return max_blocks_ - static_cast<std::int64_t>(free_.size()); }
  std::int64_t blocks_free() const { return static_cast<std::int64_t>(free_.size()); }
  std::int64_t shared_blocks() const;  // blocks held by more than one table
  std::int64_t copies_made() const { return copies_made_; }

 private:
  void check(BlockId block) const;

  KvCacheShape shape_;
  std::int64_t block_tokens_, max_blocks_;
  std::int64_t head_bytes_;   // one head's rows in a block: block_tokens x row bytes
  std::int64_t block_bytes_;  // layers x (K, V) x kv_heads x head_bytes_
  std::unique_ptr<std::uint8_t[]> storage_;
  std::vector<int> references_;
  std::vector<BlockId> free_;  // a stack: the most recently freed block is reused first (still in cache)
  std::int64_t copies_made_ = 0;
};

// One sequence's positions 0 .. size() - 1 in the pool's blocks, position p in block blocks()[p / block_tokens]
// at row p % block_tokens. The caller owns the token history; the table owns its block references.
class KvBlockTable {
 public:
  explicit KvBlockTable(KvBlockPool& pool) : pool_(&pool) {}
  ~KvBlockTable();
  KvBlockTable(KvBlockTable&& other) noexcept;
  KvBlockTable& operator=(KvBlockTable&& other) noexcept;
  KvBlockTable(const KvBlockTable&) = delete;
  KvBlockTable& operator=(const KvBlockTable&) = delete;

  // Another table holding the same positions in the same blocks (each block's reference count + 1).
  KvBlockTable fork() const;

  // Makes positions size() .. size() + tokens - 1 writable: new blocks where the table has none, and a copy of
  // a block it shares with another table where one of them falls into it. False when the pool runs out of blocks;
  // the table then keeps what it had, and blocks it took for this call are given back.
  bool prepare(std::int64_t tokens);
  // The row of a prepared or committed position: for writing (throws std::logic_error in a block another table
  // shares: prepare copies it first), and const for reading.
  std::uint8_t* row(std::int64_t layer, KvBlockPool::Part part, std::int64_t head, std::int64_t position);
  const std::uint8_t* row(std::int64_t layer, KvBlockPool::Part part, std::int64_t head, std::int64_t position) const;
  // Counts `tokens` prepared positions as written.
  void commit(std::int64_t tokens);
  // Keeps the first n positions (n <= size()) and releases the blocks past them.
  void truncate(std::int64_t n);

  std::int64_t size() const { return size_; }
  const std::vector<KvBlockPool::BlockId>& blocks() const { return blocks_; }

 private:
  void release_all();
  std::int64_t blocks_for(std::int64_t tokens) const;

  KvBlockPool* pool_;
  std::vector<KvBlockPool::BlockId> blocks_;
  std::int64_t size_ = 0, prepared_ = 0;
};

}  // namespace kvchat
