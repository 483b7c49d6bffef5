#include "engine/gguf/dequantize.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "engine/model/model_config.h"  // ModelError

// Every value is computed as its format defines it, one rounding per operation, in the order written.
// The build compiles this file with -ffp-contract=off: a fused multiply-add would round d*q - m once
// instead of twice and break bit-exactness.

namespace kvchat {

namespace {

float load_f16(const std::uint8_t* at) {
  std::uint16_t bits;
  std::memcpy(&bits, at, 2);
  return f16_to_f32(bits);
}

// ---------------------------------------------------------------------------------------------------
// 32-element blocks. An f16 scale d (and for the _1 types an f16 offset m) followed by the quants.
// 4-bit quants are packed two per byte: byte j holds element j in its low nibble and element j + 16
// in its high nibble.

// Q4_0: d, 16 bytes of nibbles. x = d * (q - 8).
void decode_q4_0(const std::uint8_t* block, float* out) {
  const float d = load_f16(block);
  const std::uint8_t* qs = block + 2;
  for (int j = 0; j < 16; ++j) {
    out[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;
    out[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

// Q4_1: d, m, 16 bytes of nibbles. x = d * q + m.
void decode_q4_1(const std::uint8_t* block, float* out) {
  const float d = load_f16(block);
  const float m = load_f16(block + 2);
  const std::uint8_t* qs = block + 4;
  for (int j = 0; j < 16; ++j) {
    out[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
    out[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

// The fifth bits of a 5-bit block: bit i of a little-endian u32 belongs to element i.
std::uint32_t load_high_bits(const std::uint8_t* at) {
  return static_cast<std::uint32_t>(at[0]) | static_cast<std::uint32_t>(at[1]) << 8 |
         static_cast<std::uint32_t>(at[2]) << 16 | static_cast<std::uint32_t>(at[3]) << 24;
}

// Q5_0: d, 4 bytes of fifth bits, 16 bytes of nibbles. x = d * (q - 16).
void decode_q5_0(const std::uint8_t* block, float* out) {
  const float d = load_f16(block);
  const std::uint32_t qh = load_high_bits(block + 2);
  const std::uint8_t* qs = block + 6;
  for (int j = 0; j < 16; ++j) {
    const int low = (qs[j] & 0x0F) | static_cast<int>((qh >> j) & 1) << 4;
    const int high = (qs[j] >> 4) | static_cast<int>((qh >> (j + 16)) & 1) << 4;
    out[j] = static_cast<float>(low - 16) * d;
    out[j + 16] = static_cast<float>(high - 16) * d;
  }
}

// Q5_1: d, m, 4 bytes of fifth bits, 16 bytes of nibbles. x = d * q + m.
void decode_q5_1(const std::uint8_t* block, float* out) {
  const float d = load_f16(block);
  const float m = load_f16(block + 2);
  const std::uint32_t qh = load_high_bits(block + 4);
  const std::uint8_t* qs = block + 8;
  for (int j = 0; j < 16; ++j) {
    const int low = (qs[j] & 0x0F) | static_cast<int>((qh >> j) & 1) << 4;
    const int high = (qs[j] >> 4) | static_cast<int>((qh >> (j + 16)) & 1) << 4;
    out[j] = static_cast<float>(low) * d + m;
    out[j + 16] = static_cast<float>(high) * d + m;
  }
}

// Q8_0: d, 32 signed bytes. x = d * q.
void decode_q8_0(const std::uint8_t* block, float* out) {
  const float d = load_f16(block);
  const auto* qs = reinterpret_cast<const std::int8_t*>(block + 2);
  for (int j = 0; j < 32; ++j) out[j] = static_cast<float>(qs[j]) * d;
}

// ---------------------------------------------------------------------------------------------------
// 256-element super-blocks ("K-quants").

// The scale and offset of the two 32-element sub-blocks of a K-quant pair: (d*scale, dmin*min) each.
struct PairScales {
  float d1, m1, d2, m2;
};
PairScales pair_scales(float d, float dmin, const std::uint8_t* scales, int pair) {
  int scale = 0, min = 0;
  PairScales result{};
  k_quant_scale_and_min(2 * pair, scales, scale, min);
  result.d1 = d * static_cast<float>(scale);
  result.m1 = dmin * static_cast<float>(min);
  k_quant_scale_and_min(2 * pair + 1, scales, scale, min);
  result.d2 = d * static_cast<float>(scale);
  result.m2 = dmin * static_cast<float>(min);
  return result;
}

// Q4_K: f16 d, f16 dmin, 12 bytes of scales and mins, 128 bytes of nibbles. Each 64 elements share 32
// bytes: the low nibbles are one sub-block, the high nibbles the next. x = (d*scale) * q - (dmin*min).
void decode_q4_k(const std::uint8_t* block, float* out) {
  const float d = load_f16(block);
  const float dmin = load_f16(block + 2);
  const std::uint8_t* scales = block + 4;
  const std::uint8_t* q = block + 16;
  for (int pair = 0; pair < 4; ++pair, q += 32, out += 64) {
    const auto [d1, m1, d2, m2] = pair_scales(d, dmin, scales, pair);
    for (int l = 0; l < 32; ++l) out[l] = d1 * static_cast<float>(q[l] & 0x0F) - m1;
    for (int l = 0; l < 32; ++l) out[l + 32] = d2 * static_cast<float>(q[l] >> 4) - m2;
  }
}

// Q5_K: as Q4_K with 32 bytes of fifth bits after the scales: for the sub-block pair p, bit 2p of byte
// l is the fifth bit of the low-nibble element l, bit 2p+1 that of the high-nibble element l.
void decode_q5_k(const std::uint8_t* block, float* out) {
  const float d = load_f16(block);
  const float dmin = load_f16(block + 2);
  const std::uint8_t* scales = block + 4;
  const std::uint8_t* qh = block + 16;
  const std::uint8_t* ql = block + 48;
  for (int pair = 0; pair < 4; ++pair, ql += 32, out += 64) {
    const auto [d1, m1, d2, m2] = pair_scales(d, dmin, scales, pair);
    const int low_bit = 1 << (2 * pair);
    const int high_bit = 2 << (2 * pair);
    for (int l = 0; l < 32; ++l) out[l] = d1 * static_cast<float>((ql[l] & 0x0F) + ((qh[l] & low_bit) ? 16 : 0)) - m1;
    for (int l = 0; l < 32; ++l)
      out[l + 32] = d2 * static_cast<float>((ql[l] >> 4) + ((qh[l] & high_bit) ? 16 : 0)) - m2;
  }
}

// Q6_K: 128 bytes of low nibbles, 64 bytes of top 2-bit pairs, 16 signed 8-bit scales (one per 16
// elements), f16 d. Each half of 128 elements uses 64 low bytes and 32 high bytes: element l + 32k
// (k = 0..3) takes the low or high nibble of low byte l or l + 32 and bits 2k..2k+1 of high byte l.
// x = (d * scale) * (q - 32).
void decode_q6_k(const std::uint8_t* block, float* out) {
  const std::uint8_t* ql = block;
  const std::uint8_t* qh = block + 128;
  const auto* sc = reinterpret_cast<const std::int8_t*>(block + 192);
  const float d = load_f16(block + 208);
  for (int half = 0; half < 2; ++half, ql += 64, qh += 32, sc += 8, out += 128) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0x0F) | ((qh[l] >> 0) & 3) << 4) - 32;
      const int q2 = ((ql[l + 32] & 0x0F) | ((qh[l] >> 2) & 3) << 4) - 32;
      const int q3 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
      const int q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
      out[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
      out[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      out[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      out[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Plain types (blocks of one element).

void decode_f16(const std::uint8_t* block, float* out) { *out = load_f16(block); }

void decode_bf16(const std::uint8_t* block, float* out) {
  std::uint16_t bits;
  std::memcpy(&bits, block, 2);
  *out = bf16_to_f32(bits);
}

using BlockDecoder = void (*)(const std::uint8_t* block, float* out);

template <BlockDecoder decode>
void decode_blocks(const std::uint8_t* blocks, std::int64_t n_blocks, const GgufTypeInfo& info, float* out) {
  for (std::int64_t i = 0; i < n_blocks; ++i) decode(blocks + i * info.block_bytes, out + i * info.block_size);
}

}  // namespace

float f16_to_f32(std::uint16_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1Fu;
  std::uint32_t mantissa = bits & 0x3FFu;
  std::uint32_t result = 0;
  if (exponent == 0x1F) {
    // Infinity, or NaN made quiet (as hardware converters do) keeping its payload.
    result = sign | 0x7F800000u | (mantissa != 0 ? 0x00400000u : 0u) | (mantissa << 13);
  } else if (exponent != 0) {
    result = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    result = sign;  // signed zero
  } else {
    // Subnormal (mantissa * 2^-24): shift until the leading bit becomes the implicit one.
    int shifts = 0;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      ++shifts;
    }
    result = sign | (static_cast<std::uint32_t>(127 - 15 + 1 - shifts) << 23) | ((mantissa & 0x3FFu) << 13);
  }
  float value;
  std::memcpy(&value, &result, 4);
  return value;
}

float bf16_to_f32(std::uint16_t bits) {
  // bf16 is the top half of an f32.
  const std::uint32_t widened = static_cast<std::uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &widened, 4);
  return value;
}

void dequantize(GgufType type, const void* blocks, std::int64_t n_elements, float* out) {
  const GgufTypeInfo& info = gguf_type_info(type);
  if (!info.dequantizable)
    throw ModelError(std::string("cannot dequantize tensor type ") + info.name +
                     " (supported: " + dequantizable_gguf_type_names() + ")");
  if (n_elements < 0 || n_elements % info.block_size != 0)
    throw std::invalid_argument(std::to_string(n_elements) + " elements are not a whole number of " + info.name +
                                " blocks (" + std::to_string(info.block_size) + " elements each)");
  const auto* bytes = static_cast<const std::uint8_t*>(blocks);
  const std::int64_t n_blocks = n_elements / info.block_size;
  switch (type) {
    case GgufType::F32:
      if (n_elements != 0) std::memcpy(out, bytes, static_cast<std::size_t>(n_elements) * sizeof(float));
      return;
    case GgufType::F16: return decode_blocks<decode_f16>(bytes, n_blocks, info, out);
    case GgufType::BF16: return decode_blocks<decode_bf16>(bytes, n_blocks, info, out);
    case GgufType::Q4_0: return decode_blocks<decode_q4_0>(bytes, n_blocks, info, out);
    case GgufType::Q4_1: return decode_blocks<decode_q4_1>(bytes, n_blocks, info, out);
    case GgufType::Q5_0: return decode_blocks<decode_q5_0>(bytes, n_blocks, info, out);
    case GgufType::Q5_1: return decode_blocks<decode_q5_1>(bytes, n_blocks, info, out);
    case GgufType::Q8_0: return decode_blocks<decode_q8_0>(bytes, n_blocks, info, out);
    case GgufType::Q4_K: return decode_blocks<decode_q4_k>(bytes, n_blocks, info, out);
    case GgufType::Q5_K: return decode_blocks<decode_q5_k>(bytes, n_blocks, info, out);
    case GgufType::Q6_K: return decode_blocks<decode_q6_k>(bytes, n_blocks, info, out);
    default: break;
  }
  // A type marked dequantizable without a decoder here is a bug in the type table.
  throw std::logic_error(std::string("no decoder for dequantizable type ") + info.name);
}

void dequantize_rows(const GgufTensor& tensor, std::int64_t first_row, std::int64_t n_rows, float* out) {
  const GgufTypeInfo& info = gguf_type_info(tensor.type);
  if (!info.dequantizable)
    throw ModelError("tensor '" + tensor.name + "' has type " + info.name +
                     ", which cannot be dequantized (supported: " + dequantizable_gguf_type_names() + ")");
  const std::int64_t total_rows = tensor.n_rows();
  if (first_row < 0 || n_rows < 0 || first_row > total_rows || n_rows > total_rows - first_row)
    throw std::out_of_range("rows [" + std::to_string(first_row) + ", +" + std::to_string(n_rows) +
                            ") are outside tensor '" + tensor.name + "' (" + std::to_string(total_rows) + " rows)");
  const std::uint8_t* rows = tensor.data + static_cast<std::uint64_t>(first_row) * tensor.row_bytes();
  dequantize(tensor.type, rows, n_rows * tensor.row_length(), out);
}

std::vector<float> dequantize_tensor(const GgufTensor& tensor) {
  std::vector<float> values(static_cast<std::size_t>(tensor.n_elements));
  dequantize_rows(tensor, 0, tensor.n_rows(), values.data());
  return values;
}

}  // namespace kvchat
