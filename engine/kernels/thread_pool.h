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
  // (so every chunk but the last holds a whole number of grains), runs chunk 0 on the calling thread
  // and the others on the workers, and returns when all are done. The first exception thrown by any
  // chunk is rethrown here. A call made from inside a running chunk, or while another thread is
  // using the pool, runs inline on the calling thread (same result, no deadlock).
  void parallel_for(std::int64_t n, const std::function<void(std::int64_t begin, std::int64_t end)>& body,
                    std::int64_t grain = 1);

 private:
  struct State;
  State* state_;
};

// The process-wide pool used by the kernels; created on first use with default_threads() threads.
ThreadPool& default_thread_pool();
// 0 = std::thread::hardware_concurrency(). Recreates the default pool; call it while no kernel runs.
void set_default_threads(int threads);
int default_threads();

}  // namespace kvchat::kernels
