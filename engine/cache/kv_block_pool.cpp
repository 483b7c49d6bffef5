#include "engine/cache/kv_block_pool.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

namespace kvchat {

KvBlockPool::KvBlockPool(const KvCacheShape& shape, std::int64_t block_tokens, std::int64_t max_blocks)
    : shape_(shape), block_tokens_(block_tokens), max_blocks_(max_blocks) {
  if (shape.layers < 1 || shape.kv_heads < 1 || shape.head_dim < 1)
    throw std::invalid_argument("KvBlockPool: the shape has no layers, KV heads or head dimension");
  if (block_tokens < 1) throw std::invalid_argument("KvBlockPool: block_tokens must be at least 1");
  if (max_blocks < 1 || max_blocks > (std::int64_t{1} << 30))
    throw std::invalid_argument("KvBlockPool: max_blocks must be between 1 and 2^30, not " +
                                std::to_string(max_blocks));
  // Checked in double first: a huge block or count must be an error here, not a wrapped size for new[].
  const double pool_bytes = double(block_tokens) * double(shape.row_bytes()) * double(shape.layers) * 2.0 *
                            double(shape.kv_heads) * double(max_blocks);
  if (pool_bytes > double(std::int64_t{1} << 50))
    throw std::invalid_argument("KvBlockPool: " + std::to_string(max_blocks) + " blocks of " +
                                std::to_string(block_tokens) + " positions are more memory than can be reserved");
  head_bytes_ = block_tokens * shape.row_bytes();
  block_bytes_ = shape.layers * 2 * shape.kv_heads * head_bytes_;
  // Reserved, not touched: a page costs memory only once a block on it is written.
  storage_.reset(new std::uint8_t[static_cast<std::size_t>(block_bytes_ * max_blocks)]);
  references_.assign(static_cast<std::size_t>(max_blocks), 0);
  free_.reserve(static_cast<std::size_t>(max_blocks));
  for (std::int64_t block = max_blocks - 1; block >= 0; --block) free_.push_back(static_cast<BlockId>(block));
}

void KvBlockPool::check(BlockId block) const {
  if (block < 0 || block >= max_blocks_ || references_[static_cast<std::size_t>(block)] == 0)
    throw std::logic_error("KvBlockPool: block " + std::to_string(block) + " is not allocated");
}

std::optional<KvBlockPool::BlockId> KvBlockPool::allocate() {
  if (free_.empty()) return std::nullopt;
  const BlockId block = free_.back();
  free_.pop_back();
  references_[static_cast<std::size_t>(block)] = 1;
  return block;
}

void KvBlockPool::retain(BlockId block) {
  check(block);
  ++references_[static_cast<std::size_t>(block)];
}

void KvBlockPool::release(BlockId block) {
  check(block);
  if (--references_[static_cast<std::size_t>(block)] == 0) free_.push_back(block);
}

int KvBlockPool::reference_count(BlockId block) const {
  if (block < 0 || block >= max_blocks_) throw std::out_of_range("KvBlockPool: no block " + std::to_string(block));
  return references_[static_cast<std::size_t>(block)];
}

std::optional<KvBlockPool::BlockId> KvBlockPool::make_writable(BlockId block) {
  check(block);
  if (references_[static_cast<std::size_t>(block)] == 1) return block;
  const std::optional<BlockId> copy = allocate();
  if (!copy) return std::nullopt;
  std::memcpy(storage_.get() + *copy * block_bytes_, storage_.get() + block * block_bytes_,
              static_cast<std::size_t>(block_bytes_));
  release(block);
  ++copies_made_;
  return copy;
}

const std::uint8_t* KvBlockPool::row(BlockId block, std::int64_t layer, Part part, std::int64_t head,
                                     std::int64_t row) const {
  check(block);
  if (layer < 0 || layer >= shape_.layers || head < 0 || head >= shape_.kv_heads || row < 0 || row >= block_tokens_)
    throw std::out_of_range("KvBlockPool::row: layer, head or row outside the block");
  return storage_.get() + block * block_bytes_ + part_offset(layer, part) + head * head_bytes_ +
         row * shape_.row_bytes();
}

const std::uint8_t* KvBlockPool::block_data(BlockId block) const {
  check(block);
  return storage_.get() + block * block_bytes_;
}

std::uint8_t* KvBlockPool::row(BlockId block, std::int64_t layer, Part part, std::int64_t head, std::int64_t row) {
  return const_cast<std::uint8_t*>(std::as_const(*this).row(block, layer, part, head, row));
}

std::int64_t KvBlockPool::shared_blocks() const {
  return std::count_if(references_.begin(), references_.end(), [](int count) { return count > 1; });
}

// ---------------------------------------------------------------------------------------------

KvBlockTable::~KvBlockTable() { release_all(); }

KvBlockTable::KvBlockTable(KvBlockTable&& other) noexcept
    : pool_(other.pool_), blocks_(std::move(other.blocks_)), size_(other.size_), prepared_(other.prepared_) {
  other.blocks_.clear();
  other.size_ = other.prepared_ = 0;
}

KvBlockTable& KvBlockTable::operator=(KvBlockTable&& other) noexcept {
  if (this != &other) {
    release_all();
    pool_ = other.pool_;
    blocks_ = std::move(other.blocks_);
    size_ = other.size_;
    prepared_ = other.prepared_;
    other.blocks_.clear();
    other.size_ = other.prepared_ = 0;
  }
  return *this;
}

void KvBlockTable::release_all() {
  for (const KvBlockPool::BlockId block : blocks_) pool_->release(block);
  blocks_.clear();
  size_ = prepared_ = 0;
}

std::int64_t KvBlockTable::blocks_for(std::int64_t tokens) const {
  return (tokens + pool_->block_tokens() - 1) / pool_->block_tokens();
}

KvBlockTable KvBlockTable::fork() const {
  KvBlockTable copy(*pool_);
  for (const KvBlockPool::BlockId block : blocks_) pool_->retain(block);
  copy.blocks_ = blocks_;
  copy.size_ = size_;
  copy.prepared_ = size_;  // the other table's prepared rows are its own to write
  return copy;
}

bool KvBlockTable::prepare(std::int64_t tokens) {
  if (tokens < 0) throw std::invalid_argument("KvBlockTable::prepare: a negative count");
  if (tokens == 0) return true;
  // The blocks positions size() .. size() + tokens - 1 fall into: those the table has and shares need a copy,
  // the rest are new. Counted first, so that the pool cannot run out half way.
  const auto first = static_cast<std::size_t>(size_ / pool_->block_tokens());
  const auto needed = static_cast<std::size_t>(blocks_for(size_ + tokens));
  std::int64_t wanted = static_cast<std::int64_t>(needed > blocks_.size() ? needed - blocks_.size() : 0);
  for (std::size_t i = first; i < std::min(needed, blocks_.size()); ++i)
    if (pool_->reference_count(blocks_[i]) > 1) ++wanted;
  if (wanted > pool_->blocks_free()) return false;
  for (std::size_t i = first; i < std::min(needed, blocks_.size()); ++i) blocks_[i] = *pool_->make_writable(blocks_[i]);
  while (blocks_.size() < needed) blocks_.push_back(*pool_->allocate());
  prepared_ = std::max(prepared_, size_ + tokens);
  return true;
}

const std::uint8_t* KvBlockTable::row(std::int64_t layer, KvBlockPool::Part part, std::int64_t head,
                                      std::int64_t position) const {
  if (position < 0 || position >= std::max(size_, prepared_))
    throw std::out_of_range("KvBlockTable::row: position " + std::to_string(position) +
                            " is neither written nor prepared");
  const std::int64_t block_tokens = pool_->block_tokens();
  return pool_->row(blocks_[static_cast<std::size_t>(position / block_tokens)], layer, part, head,
                    position % block_tokens);
}

std::uint8_t* KvBlockTable::row(std::int64_t layer, KvBlockPool::Part part, std::int64_t head, std::int64_t position) {
  const std::int64_t block = position / pool_->block_tokens();
  if (position >= 0 && block < static_cast<std::int64_t>(blocks_.size()) &&
      pool_->reference_count(blocks_[static_cast<std::size_t>(block)]) > 1)
    throw std::logic_error("KvBlockTable::row: position " + std::to_string(position) +
                           " is in a block another table shares (prepare copies it before a write)");
  return const_cast<std::uint8_t*>(std::as_const(*this).row(layer, part, head, position));
}

void KvBlockTable::commit(std::int64_t tokens) {
  if (tokens < 0 || size_ + tokens > prepared_)
    throw std::invalid_argument("KvBlockTable::commit: more positions than were prepared");
  size_ += tokens;
}

void KvBlockTable::truncate(std::int64_t n) {
  if (n < 0 || n > size_) throw std::invalid_argument("KvBlockTable::truncate: length outside 0..size()");
  const auto keep = static_cast<std::size_t>(blocks_for(n));
  while (blocks_.size() > keep) {
    pool_->release(blocks_.back());
    blocks_.pop_back();
  }
  size_ = prepared_ = n;
}

}  // namespace kvchat
