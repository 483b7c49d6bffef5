#include "engine/compute/compute_options.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>

#include "engine/compute/compute_context.h"
#include "engine/kernels/cpu_features.h"
#include "engine/kernels/thread_pool.h"

namespace kvchat {

namespace {
std::atomic<bool>& kernels_flag() {
  static std::atomic<bool> flag{[] {
    const char* setting = std::getenv("KVCHAT_KERNELS");
    return !(setting && std::strcmp(setting, "off") == 0);
  }()};
  return flag;
}
}  // namespace

bool fast_kernels_enabled() {
  if (const ComputeContext* context = current_compute_context()) return context->kernels_enabled();
  return kernels_flag().load(std::memory_order_relaxed);
}
void set_fast_kernels_enabled(bool enabled) { kernels_flag().store(enabled, std::memory_order_relaxed); }

namespace {
std::atomic<int> configured_threads{0};
// The thread counts the calling thread last set for LibTorch (its OpenMP count is per thread): -1 unknown.
thread_local int t_phase_threads = -1;
thread_local int t_phase_blas_threads = -1;
std::atomic<int> settings_generation{0};  // set_compute_threads makes every thread's record stale
thread_local int t_phase_generation = -1;

// OpenBLAS's thread count, where LibTorch's BLAS is OpenBLAS (found at run time: with the reference
// BLAS there is nothing to set).
void set_blas_threads(int threads) {
  using SetThreads = void (*)(int);
  static const SetThreads set_threads = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (set_threads) set_threads(threads);
}
}  // namespace

int max_compute_threads() { return 4 * static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

void set_compute_threads(int threads) {
  if (threads > max_compute_threads())
    throw std::invalid_argument(std::to_string(threads) + " threads is more than " +
                                std::to_string(max_compute_threads()) + " (4x this machine's cores)");
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  configured_threads = threads;
  ++settings_generation;
  at::set_num_threads(threads);
  set_blas_threads(threads);
  kernels::set_default_threads(threads);
  spdlog::debug("compute threads: {}", threads);
}

int compute_threads() {
  int threads = configured_threads.load();
  return threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

void enter_compute_phase(ComputePhase phase) {
  const ComputeContext* context = current_compute_context();
  const int threads = phase == ComputePhase::Streaming ? 1 : context ? context->threads() : compute_threads();
  const int blas_threads = phase == ComputePhase::Parallel && fast_kernels_enabled() ? 1 : threads;
  const int generation = settings_generation.load();
  if (t_phase_threads == threads && t_phase_blas_threads == blas_threads && t_phase_generation == generation) return;
  t_phase_threads = threads;
  t_phase_blas_threads = blas_threads;
  t_phase_generation = generation;
  at::set_num_threads(threads);
  set_blas_threads(blas_threads);
}

}  // namespace kvchat
