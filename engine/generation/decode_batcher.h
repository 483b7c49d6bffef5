#pragma once
// Continuous batching for sequences generated on threads of their own (a server's requests, the app's chats): each
// sequence keeps its own Session, sampler, stop rules and callbacks, and only its model step is shared. A sequence
// in its decode phase is a Member; its decode() hands the batcher its next token and waits, and one engine step
// (LlamaModel::decode_batch) computes the next logits of every member waiting, reading the weights once for all of
// them. Each row is computed to the bit as that sequence's step alone would be, so batching changes no token.
//
// When a step runs: as soon as every member has handed in its token, or `straggler_wait` after the first one did
// (a member busy in its callback does not hold the others up longer), at most `max_rows` rows at a time. A
// sequence joins at the next step once its prompt is prefilled and leaves when its generation ends, so none waits
// for another to finish. Other model work (a prefill chunk, a speculative check over several rows) runs through
// exclusive(), between steps, taking turns with them: a long prompt delays the decoding sequences by one chunk at a
// time, never by its whole prefill.
//
// A step that fails (a row past its context, a cache that cannot grow) runs its rows one by one, so that each row
// gets its own logits or its own error: one sequence's fault never fails another's.
//
// Thread-safe: that is its purpose. The leader of a step is whichever waiting thread finds the step due; it computes
// with the compute context entered on its thread (the sessions of one batcher share one).
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/model/decode_context.h"
#include "engine/types.h"

namespace kvchat {

class KvCache;
class LlamaModel;

class DecodeBatcher {
 public:
  struct Stats {
    std::int64_t steps = 0;          // batched steps run
    std::int64_t rows = 0;           // rows they computed
    std::int64_t largest_batch = 0;  // most rows in one step
    std::int64_t failed_steps = 0;   // steps whose rows ran one by one after a failure
    std::int64_t exclusive_runs = 0;
  };

  // Throws std::invalid_argument unless the model's rows are computed as its decode steps are
  // (LlamaModel::rows_match_decode_steps) and max_rows >= 1.
  DecodeBatcher(std::shared_ptr<const LlamaModel> model, int max_rows,
                std::chrono::microseconds straggler_wait = std::chrono::microseconds(2000));
  DecodeBatcher(const DecodeBatcher&) = delete;
  DecodeBatcher& operator=(const DecodeBatcher&) = delete;

  // One sequence in its decode phase, from construction to destruction (on the sequence's thread).
  class Member {
   public:
    explicit Member(DecodeBatcher& batcher);
    ~Member();
    Member(const Member&) = delete;
    Member& operator=(const Member&) = delete;
    // Feeds `token` at position cache.size() of `cache` (the member's own: one row per cache and step) and returns
    // when a step has computed it: the next logits [vocab] in `logits`, the position committed. Throws what the
    // step alone would throw for this row (std::length_error past the context, ...).
    void decode(TokenId token, KvCache& cache, std::vector<float>& logits);
    // Runs `work` alone, between steps; meanwhile the other members do not wait for this one.
    void exclusive(const std::function<void()>& work);

   private:
    DecodeBatcher& batcher_;
  };

  // exclusive() for a thread that is no member (a sequence prefilling its prompt before it joins).
  void exclusive(const std::function<void()>& work) { run_exclusive(work, /*member=*/false); }

  const LlamaModel& model() const { return *model_; }
  int max_rows() const { return max_rows_; }
  Stats stats() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Row {
    TokenId token;
    KvCache* cache;
    std::vector<float>* logits;
    bool done = false;
    std::exception_ptr error;
  };

  void run_exclusive(const std::function<void()>& work, bool member);
  // Whether a waiting thread should lead a step now (mutex_ held).
  bool step_due(Clock::time_point now) const;
  // Takes the step's rows from pending_, runs them with mutex_ released, and marks them done.
  void lead(std::unique_lock<std::mutex>& lock);
  void run_rows(const std::vector<Row*>& rows);

  std::shared_ptr<const LlamaModel> model_;
  const int max_rows_;
  const std::chrono::microseconds straggler_wait_;

  mutable std::mutex mutex_;  // guards everything below but context_ (the leader's alone while busy_)
  std::condition_variable changed_;
  std::deque<Row*> pending_;
  Clock::time_point first_pending_;  // when the oldest pending row was handed in
  bool busy_ = false;                // a step or an exclusive work is running
  bool last_was_step_ = false;       // steps and exclusive work take turns when both wait
  int members_ = 0;
  int members_elsewhere_ = 0;  // members waiting for or running exclusive work (no row to hand in meanwhile)
  int exclusive_waiting_ = 0;
  Stats stats_;
  DecodeContext context_;
};

}  // namespace kvchat
