#pragma once
// How one user of the engine computes: its thread count, whether the hand-written kernels replace LibTorch's
// products, and a kernels' thread pool of that size. The desktop app's engine, the server it hosts and each
// bench run own one, so that two configurations run side by side in one process.
//
// A session computes with the context it was given (Session::set_compute_context): while it generates, a
// ComputeScope makes the context the calling thread's, and the kernels, the layer's dispatch and the compute
// phases read it from there. Without one, the process-wide settings of compute_options.h apply.
//
// What stays process-wide: OpenBLAS has one thread count for the whole process (the latest phase change of
// any thread sets it; LibTorch's OpenMP count is per thread), and the process-wide settings themselves
// (set_compute_threads recreates the default pool: app/compute_lock.h says who may call it when).
#include <memory>

#include "engine/kernels/thread_pool.h"

namespace kvchat {

class ComputeContext {
 public:
  struct Options {
    int threads = 0;      // 0: the machine's cores; more than max_compute_threads() is refused
    bool kernels = true;  // the hand-written kernels where they apply (KVCHAT_KERNELS=off: LibTorch's only)
  };
  // Throws std::invalid_argument for a thread count past max_compute_threads().
  explicit ComputeContext(Options options);
  ~ComputeContext();
  ComputeContext(const ComputeContext&) = delete;
  ComputeContext& operator=(const ComputeContext&) = delete;

  int threads() const { return threads_; }
  bool kernels_enabled() const { return kernels_; }
  kernels::ThreadPool& pool() const { return *pool_; }

 private:
  int threads_;
  bool kernels_;
  std::unique_ptr<kernels::ThreadPool> pool_;
};

// Makes `context` the calling thread's until destroyed (scopes nest; null changes nothing).
class ComputeScope {
 public:
  explicit ComputeScope(const ComputeContext* context);
  ~ComputeScope();
  ComputeScope(const ComputeScope&) = delete;
  ComputeScope& operator=(const ComputeScope&) = delete;

 private:
  const ComputeContext* previous_;
  kernels::PoolScope pool_scope_;
};

// The calling thread's context (the innermost ComputeScope's), or null.
const ComputeContext* current_compute_context();

}  // namespace kvchat
