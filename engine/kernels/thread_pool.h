#pragma once
// A small persistent thread pool for the decode kernels. Batch-1 decode calls a matrix-vector product
// dozens of times per token, so dispatch must cost microseconds, not the tens of microseconds of
// creating threads or of a general task queue. Workers spin briefly after each job (the next matvec
// usually follows within microseconds), then sleep on a condition variable so that they neither burn
// a core between tokens nor compete with LibTorch's own OpenMP threads.
#include <cstdint>
#include <functional>

namespace kvchat::kernels {

class ThreadPool {
 public:
  // threads >= 1: threads - 1 workers plus the calling thread. 1 runs everything inline.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const;

  // Splits [0, n) into at most size() contiguous chunks whose boundaries are multiples of `grain`
  // (so every chunk but the last holds a whole number of grains), runs them on the calling thread and
  // the workers, and returns when all are done. Chunks are claimed by whichever thread is free, so a
  // worker that the OS has not scheduled yet never holds the caller up: the caller runs its chunk.
  // The first exception thrown by any chunk is rethrown here (chunks not yet started are skipped).
  // A call made from inside a running chunk, or while another thread is using the pool, runs inline
  // on the calling thread (same result, no deadlock).
  void parallel_for(std::int64_t n, const std::function<void(std::int64_t begin, std::int64_t end)>& body,
                    std::int64_t grain = 1);

  // Like parallel_for, but cuts [0, n) into blocks of `block` indices (the last may be shorter) that
  // the threads claim in order as they finish the previous one: load balancing for when a core is
  // shared with other work. body is called once per block.
  void parallel_for_blocks(std::int64_t n, const std::function<void(std::int64_t begin, std::int64_t end)>& body,
                           std::int64_t block);

  // Guided scheduling: like parallel_for_blocks, but each claim takes about (what is left) / (2 x
  // threads) indices, rounded up to a multiple of min_block and at most max_block (>= min_block). The
  // threads read long runs while much is left and short ones at the end, so they finish together
  // instead of one waiting a whole long block for the other. A pool of one thread (or a call that
  // runs inline, see parallel_for) calls body once over [0, n).
  void parallel_for_guided(std::int64_t n, const std::function<void(std::int64_t begin, std::int64_t end)>& body,
                           std::int64_t min_block, std::int64_t max_block);

 private:
  void run(std::int64_t n, const std::function<void(std::int64_t, std::int64_t)>& body, std::int64_t grain,
           std::int64_t chunks, std::int64_t guided_max_block = 0);
  struct State;
  State* state_;
};

// The process-wide pool; created on first use with default_threads() threads.
ThreadPool& default_thread_pool();
// The pool the kernels use on the calling thread: the innermost PoolScope's, else default_thread_pool().
ThreadPool& current_thread_pool();
// Makes `pool` the calling thread's current pool until destroyed (scopes nest). A compute context enters
// its pool this way, so that two contexts (the app's engine and its server, two benches) each run the
// kernels on their own pool with their own thread count.
class PoolScope {
 public:
  explicit PoolScope(ThreadPool* pool);  // null: the scope changes nothing
  ~PoolScope();
  PoolScope(const PoolScope&) = delete;
  PoolScope& operator=(const PoolScope&) = delete;

 private:
  ThreadPool* previous_;
};
// 0 = std::thread::hardware_concurrency(). Recreates the default pool; call it while no kernel runs.
void set_default_threads(int threads);
int default_threads();

}  // namespace kvchat::kernels
