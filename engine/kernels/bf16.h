#pragma once
// bfloat16 <-> float32. bf16 is the top half of an IEEE float32, so widening is exact; narrowing
// rounds to nearest, ties to even, and keeps NaNs NaN (a NaN whose payload lives only in the low
// half would otherwise truncate to infinity).
#include <cstdint>
#include <cstring>

namespace kvchat::kernels {

inline float bf16_to_float(std::uint16_t value) {
  const std::uint32_t bits = static_cast<std::uint32_t>(value) << 16;
  float result;
  std::memcpy(&result, &bits, sizeof result);
  return result;
}

inline std::uint16_t float_to_bf16(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN
  const std::uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

// Vectorised, threaded on the default pool for large n. src and dst must not overlap.
void bf16_to_f32(const std::uint16_t* src, float* dst, std::int64_t n);
void f32_to_bf16(const float* src, std::uint16_t* dst, std::int64_t n);

}  // namespace kvchat::kernels
