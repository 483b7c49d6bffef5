#include "engine/kernels/bf16.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "engine/kernels/cpu_features.h"
#include "engine/kernels/isa_kernels.h"
#include "engine/kernels/thread_pool.h"

namespace kvchat::kernels {
namespace {

// Below this many elements a conversion is cheaper than waking a worker.
constexpr std::int64_t kParallelConversionElements = 1 << 20;
// Elements per block claimed by a thread (multiple of 16, the vector step).
constexpr std::int64_t kConversionBlock = 1 << 16;

void bf16_to_f32_portable(const std::uint16_t* src, float* dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t bits = static_cast<std::uint32_t>(src[i]) << 16;
    std::memcpy(dst + i, &bits, sizeof bits);
  }
}

void f32_to_bf16_portable(const float* src, std::uint16_t* dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint32_t bits;
    std::memcpy(&bits, src + i, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
      dst[i] = static_cast<std::uint16_t>((bits >> 16) | 0x0040u);
    } else {
      dst[i] = static_cast<std::uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
    }
  }
}

void check_conversion_args(const char* function, const void* src, const void* dst, std::int64_t n) {
  if (n < 0) throw std::invalid_argument(std::string(function) + ": negative element count " + std::to_string(n));
  if (n > 0 && (src == nullptr || dst == nullptr)) {
    throw std::invalid_argument(std::string(function) + ": null buffer for " + std::to_string(n) + " elements");
  }
}

template <typename Convert>
void run_conversion(std::int64_t n, const Convert& convert) {
  if (n < kParallelConversionElements) {
    convert(0, n);
    return;
  }
  current_thread_pool().parallel_for_blocks(n, convert, kConversionBlock);
}

}  // namespace

void bf16_to_f32(const std::uint16_t* src, float* dst, std::int64_t n) {
  check_conversion_args("bf16_to_f32", src, dst, n);
#if KVCHAT_HAVE_AVX2_KERNELS
  if (use_avx2_kernels()) {
    run_conversion(
        n, [&](std::int64_t begin, std::int64_t end) { avx2::bf16_to_f32(src + begin, dst + begin, end - begin); });
    return;
  }
#endif
  run_conversion(
      n, [&](std::int64_t begin, std::int64_t end) { bf16_to_f32_portable(src + begin, dst + begin, end - begin); });
}

void f32_to_bf16(const float* src, std::uint16_t* dst, std::int64_t n) {
  check_conversion_args("f32_to_bf16", src, dst, n);
#if KVCHAT_HAVE_AVX2_KERNELS
  if (use_avx2_kernels()) {
    run_conversion(
        n, [&](std::int64_t begin, std::int64_t end) { avx2::f32_to_bf16(src + begin, dst + begin, end - begin); });
    return;
  }
#endif
  run_conversion(
      n, [&](std::int64_t begin, std::int64_t end) { f32_to_bf16_portable(src + begin, dst + begin, end - begin); });
}

}  // namespace kvchat::kernels
