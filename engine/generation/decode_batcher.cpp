#include "engine/generation/decode_batcher.h"

#include <c10/core/InferenceMode.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "engine/cache/kv_cache.h"
#include "engine/model/llama_model.h"

namespace kvchat {

DecodeBatcher::DecodeBatcher(std::shared_ptr<const LlamaModel> model, int max_rows,
                             std::chrono::microseconds straggler_wait)
    : model_(std::move(model)), max_rows_(max_rows), straggler_wait_(straggler_wait) {
  if (!model_) throw std::invalid_argument("DecodeBatcher needs a model");
  if (max_rows < 1) throw std::invalid_argument("DecodeBatcher: max_rows must be at least 1");
  if (!model_->rows_match_decode_steps())
    throw std::invalid_argument("DecodeBatcher: this model's products do not compute rows as decode steps do");
}

DecodeBatcher::Stats DecodeBatcher::stats() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

DecodeBatcher::Member::Member(DecodeBatcher& batcher) : batcher_(batcher) {
  const std::lock_guard<std::mutex> lock(batcher_.mutex_);
  ++batcher_.members_;
}

DecodeBatcher::Member::~Member() {
  const std::lock_guard<std::mutex> lock(batcher_.mutex_);
  --batcher_.members_;
  batcher_.changed_.notify_all();  // the others no longer wait for this one's row
}

void DecodeBatcher::Member::exclusive(const std::function<void()>& work) {
  batcher_.run_exclusive(work, /*member=*/true);
}

bool DecodeBatcher::step_due(Clock::time_point now) const {
  if (busy_ || pending_.empty()) return false;
  // Exclusive work waiting gets its turn after each step.
  if (exclusive_waiting_ > 0 && last_was_step_) return false;
  const auto waiting = static_cast<int>(pending_.size());
  return waiting >= max_rows_ || waiting >= members_ - members_elsewhere_ || now >= first_pending_ + straggler_wait_;
}

void DecodeBatcher::Member::decode(TokenId token, KvCache& cache, std::vector<float>& logits) {
  DecodeBatcher& b = batcher_;
  Row row{token, &cache, &logits, false, nullptr};
  std::unique_lock<std::mutex> lock(b.mutex_);
  if (b.pending_.empty()) b.first_pending_ = Clock::now();
  b.pending_.push_back(&row);
  b.changed_.notify_all();
  while (!row.done) {
    const auto now = Clock::now();
    if (b.step_due(now)) {
      b.lead(lock);
    } else if (!b.busy_ && !b.pending_.empty() && !(b.exclusive_waiting_ > 0 && b.last_was_step_)) {
      b.changed_.wait_until(lock, b.first_pending_ + b.straggler_wait_);
    } else {
      b.changed_.wait(lock);
    }
  }
  if (row.error) std::rethrow_exception(row.error);
}

void DecodeBatcher::lead(std::unique_lock<std::mutex>& lock) {
  // One KV dtype per step (decode_batch's rule): rows of another wait for the next step, in order.
  std::vector<Row*> rows;
  const KvDtype dtype = pending_.front()->cache->shape().dtype;
  for (auto it = pending_.begin(); it != pending_.end() && static_cast<int>(rows.size()) < max_rows_;) {
    if ((*it)->cache->shape().dtype == dtype) {
      rows.push_back(*it);
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
  busy_ = true;
  if (!pending_.empty()) first_pending_ = Clock::now();
  lock.unlock();
  run_rows(rows);
  lock.lock();
  for (Row* row : rows) row->done = true;
  busy_ = false;
  last_was_step_ = true;
  ++stats_.steps;
  stats_.rows += static_cast<std::int64_t>(rows.size());
  stats_.largest_batch = std::max<std::int64_t>(stats_.largest_batch, static_cast<std::int64_t>(rows.size()));
  changed_.notify_all();
}

void DecodeBatcher::run_rows(const std::vector<Row*>& rows) {
  c10::InferenceMode inference_guard;
  const std::int64_t vocab = model_->config().vocab_size;
  const auto copy_row = [&](Row& row, const float* logits) {
    row.logits->resize(static_cast<std::size_t>(vocab));
    std::memcpy(row.logits->data(), logits, static_cast<std::size_t>(vocab) * sizeof(float));
  };
  std::vector<TokenId> ids;
  std::vector<KvCache*> caches;
  for (const Row* row : rows) {
    ids.push_back(row->token);
    caches.push_back(row->cache);
  }
  try {
    model_->decode_batch(ids.data(), caches.data(), static_cast<std::int64_t>(rows.size()), context_);
    for (std::size_t i = 0; i < rows.size(); ++i) copy_row(*rows[i], context_.row_logits.data() + i * vocab);
    return;
  } catch (const std::exception& error) {
    if (rows.size() == 1) {
      rows[0]->error = std::current_exception();
      return;
    }
    spdlog::warn("batched decode: a step of {} rows failed ({}); running them one by one", rows.size(), error.what());
  }
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.failed_steps;
  }
  // decode_batch checks every row before it writes any, so each row still stands where it stood.
  for (Row* row : rows) {
    try {
      model_->decode(row->token, row->cache->size(), *row->cache, context_);
      copy_row(*row, context_.logits.data());
    } catch (...) {
      row->error = std::current_exception();
    }
  }
}

void DecodeBatcher::run_exclusive(const std::function<void()>& work, bool member) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (member) ++members_elsewhere_;
  ++exclusive_waiting_;
  changed_.notify_all();  // the members need not wait for this one's row
  // Between steps; when rows wait as well, after the next step (steps and exclusive work alternate).
  changed_.wait(lock, [&] { return !busy_ && (pending_.empty() || last_was_step_); });
  --exclusive_waiting_;
  busy_ = true;
  lock.unlock();
  std::exception_ptr error;
  try {
    work();
  } catch (...) {
    error = std::current_exception();
  }
  lock.lock();
  busy_ = false;
  last_was_step_ = false;
  ++stats_.exclusive_runs;
  if (member) --members_elsewhere_;
  changed_.notify_all();
  lock.unlock();
  if (error) std::rethrow_exception(error);
}

}  // namespace kvchat
