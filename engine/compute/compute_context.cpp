#include "engine/compute/compute_context.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <thread>

#include "engine/compute/compute_options.h"

namespace kvchat {

namespace {
thread_local const ComputeContext* t_current_context = nullptr;

int resolved_threads(int threads) {
  if (threads > max_compute_threads())
    throw std::invalid_argument(std::to_string(threads) + " threads is more than " +
                                std::to_string(max_compute_threads()) + " (4x this machine's cores)");
  if (threads < 0) throw std::invalid_argument("a thread count cannot be negative: " + std::to_string(threads));
  return threads == 0 ? static_cast<int>(std::max(1u, std::thread::hardware_concurrency())) : threads;
}
}  // namespace

ComputeContext::ComputeContext(Options options)
    : threads_(resolved_threads(options.threads)),
      kernels_(options.kernels),
      pool_(std::make_unique<kernels::ThreadPool>(threads_)) {}

ComputeContext::~ComputeContext() = default;

ComputeScope::ComputeScope(const ComputeContext* context)
    : previous_(t_current_context), pool_scope_(context ? &context->pool() : nullptr) {
  if (context) t_current_context = context;
}

ComputeScope::~ComputeScope() { t_current_context = previous_; }

const ComputeContext* current_compute_context() { return t_current_context; }

}  // namespace kvchat
