#include <ATen/Parallel.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <stdexcept>
#include <thread>

#include "engine/kernels/thread_pool.h"
#include "engine/model_loader.h"

namespace kvchat {

const char* to_string(WeightDtype dtype) { return dtype == WeightDtype::BFloat16 ? "bf16" : "f32"; }

WeightDtype weight_dtype_from_string(const std::string& text) {
  if (text == "f32" || text == "float32" || text == "fp32") return WeightDtype::Float32;
  if (text == "bf16" || text == "bfloat16") return WeightDtype::BFloat16;
  throw std::invalid_argument("unknown weight dtype '" + text + "' (expected f32 or bf16)");
}

void set_engine_threads(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(threads);
  kernels::set_default_threads(threads);
  spdlog::debug("engine threads: {}", threads);
}

}  // namespace kvchat
