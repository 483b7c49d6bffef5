#include "engine/kernels/kv_rows.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "engine/kernels/bf16.h"

namespace kvchat::kernels {

std::uint16_t float_to_f16(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);   // NaN
  if (magnitude >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds past 65504: infinity
  if (magnitude < 0x38800000u) {
    // Below the smallest normal half: a multiple of 2^-24, rounded to nearest even by the float addition.
    float absolute;
    std::memcpy(&absolute, &magnitude, sizeof absolute);
    const float shifted = absolute + 0.5f;  // 2^-1 has its last mantissa bit at 2^-24
    std::uint32_t shifted_bits;
    std::memcpy(&shifted_bits, &shifted, sizeof shifted_bits);
    return static_cast<std::uint16_t>(sign | (shifted_bits - 0x3f000000u));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even.
  const std::uint32_t rounded = magnitude + 0x0fffu + ((magnitude >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

float f16_to_float(std::uint16_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1fu, mantissa = bits & 0x3ffu;
  float result;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in f32
    result = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -result : result;
  }
  const std::uint32_t out =
      exponent == 0x1fu ? sign | 0x7f800000u | (mantissa << 13) : sign | ((exponent + 112u) << 23) | (mantissa << 13);
  std::memcpy(&result, &out, sizeof result);
  return result;
}

std::int64_t kv_q8_block(std::int64_t head_dim) { return head_dim % 32 == 0 ? 32 : head_dim; }

std::int64_t kv_row_bytes(KvDtype dtype, std::int64_t head_dim) {
  switch (dtype) {
    case KvDtype::F32: return 4 * head_dim;
    case KvDtype::BF16:
    case KvDtype::F16: return 2 * head_dim;
    case KvDtype::Q8_0: return head_dim + 2 * (head_dim / kv_q8_block(head_dim));
  }
  throw std::invalid_argument("kv_row_bytes: unknown dtype");
}

namespace {

// One Q8_0 block: bytes and its f16 scale. A block with a NaN or an infinity (or a scale past the f16 range)
// gets a NaN scale (every value
// reads back NaN, as the f32 row's products would be non-finite); an all-zero block scale 0.
void encode_q8_block(const float* x, std::int64_t n, std::int8_t* bytes, std::uint16_t* scale) {
  float largest = 0.f;
  bool finite = true;
  for (std::int64_t i = 0; i < n; ++i) {
    finite = finite && std::isfinite(x[i]);
    largest = std::max(largest, std::fabs(x[i]));
  }
  if (!finite) {
    std::fill(bytes, bytes + n, std::int8_t{0});
    *scale = 0x7e00u;
    return;
  }
  const float d = largest / 127.f, inverse = d != 0.f ? 1.f / d : 0.f;
  *scale = float_to_f16(d);
  if ((*scale & 0x7c00u) == 0x7c00u) {  // past the f16 range: unreadable as a number, as a non-finite block
    std::fill(bytes, bytes + n, std::int8_t{0});
    *scale = 0x7e00u;
    return;
  }
  for (std::int64_t i = 0; i < n; ++i)
    bytes[i] = static_cast<std::int8_t>(std::clamp(std::nearbyint(x[i] * inverse), -127.f, 127.f));
}

}  // namespace

void encode_kv_rows(KvDtype dtype, const float* values, std::int64_t rows, std::int64_t head_dim, void* stored) {
  auto* out = static_cast<std::uint8_t*>(stored);
  const std::int64_t count = rows * head_dim;
  switch (dtype) {
    case KvDtype::F32: std::memcpy(out, values, static_cast<std::size_t>(count) * 4); return;
    case KvDtype::BF16: {
      for (std::int64_t i = 0; i < count; ++i) {
        const std::uint16_t half = float_to_bf16(values[i]);
        std::memcpy(out + 2 * i, &half, 2);
      }
      return;
    }
    case KvDtype::F16: {
      for (std::int64_t i = 0; i < count; ++i) {
        const std::uint16_t half = float_to_f16(values[i]);
        std::memcpy(out + 2 * i, &half, 2);
      }
      return;
    }
    case KvDtype::Q8_0: {
      const std::int64_t block = kv_q8_block(head_dim), row_bytes = kv_row_bytes(dtype, head_dim);
      for (std::int64_t r = 0; r < rows; ++r) {
        std::uint8_t* row = out + r * row_bytes;
        for (std::int64_t b = 0; b < head_dim / block; ++b) {
          std::uint16_t scale;
          encode_q8_block(values + r * head_dim + b * block, block, reinterpret_cast<std::int8_t*>(row + b * block),
                          &scale);
          std::memcpy(row + head_dim + 2 * b, &scale, 2);
        }
      }
      return;
    }
  }
}

void decode_kv_rows(KvDtype dtype, const void* stored, std::int64_t rows, std::int64_t stored_stride,
                    std::int64_t head_dim, float* values) {
  const auto* in = static_cast<const std::uint8_t*>(stored);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::uint8_t* row = in + r * stored_stride;
    float* out = values + r * head_dim;
    switch (dtype) {
      case KvDtype::F32: std::memcpy(out, row, static_cast<std::size_t>(head_dim) * 4); break;
      case KvDtype::BF16:
      case KvDtype::F16:
        for (std::int64_t i = 0; i < head_dim; ++i) {
          std::uint16_t half;
          std::memcpy(&half, row + 2 * i, 2);
          out[i] = dtype == KvDtype::BF16 ? bf16_to_float(half) : f16_to_float(half);
        }
        break;
      case KvDtype::Q8_0: {
        const std::int64_t block = kv_q8_block(head_dim);
        for (std::int64_t b = 0; b < head_dim / block; ++b) {
          std::uint16_t scale_bits;
          std::memcpy(&scale_bits, row + head_dim + 2 * b, 2);
          const float scale = f16_to_float(scale_bits);
          // byte (8 bits) times an f16 scale (11 bits) is exact in f32: the same value on every path.
          for (std::int64_t i = b * block; i < (b + 1) * block; ++i)
            out[i] = scale * static_cast<float>(static_cast<std::int8_t>(row[i]));
        }
        break;
      }
    }
  }
}

void round_kv_rows(KvDtype dtype, float* values, std::int64_t rows, std::int64_t head_dim) {
  if (dtype == KvDtype::F32) return;
  const std::int64_t row_bytes = kv_row_bytes(dtype, head_dim);
  thread_local std::vector<std::uint8_t> stored;  // grows to the largest chunk once, then reused
  if (stored.size() < static_cast<std::size_t>(row_bytes * rows))
    stored.resize(static_cast<std::size_t>(row_bytes * rows));
  encode_kv_rows(dtype, values, rows, head_dim, stored.data());
  decode_kv_rows(dtype, stored.data(), rows, row_bytes, head_dim, values);
}

}  // namespace kvchat::kernels
