#include "engine/gguf/gguf_types.h"

#include <cstring>
#include <stdexcept>

#include "engine/gguf/dequantize.h"

// Each GGUF tensor type's facts in one row of the catalog below: id, name, block geometry and, for the types
// this library decodes, the exact decoder of its blocks, with the block layouts it reads.
//
// Every value is computed as its format defines it, one rounding per operation, in the order written.
// The build compiles this library with -ffp-contract=off: a fused multiply-add would round d*q - m once
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

// ---------------------------------------------------------------------------------------------------
// The catalog.

// `count` blocks of kValues values in kBytes bytes each, one decode_block call per block.
template <void (*decode_block)(const std::uint8_t* block, float* out), std::uint32_t kValues, std::uint32_t kBytes>
void decode_blocks(const std::uint8_t* blocks, float* out, std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i) decode_block(blocks + i * kBytes, out + i * kValues);
}

void decode_f32(const std::uint8_t* blocks, float* out, std::int64_t count) {
  if (count != 0) std::memcpy(out, blocks, static_cast<std::size_t>(count) * sizeof(float));
}

// A type this library decodes: its geometry stated once, for the catalog and for its decoder's loop.
template <void (*decode_block)(const std::uint8_t* block, float* out), std::uint32_t kValues, std::uint32_t kBytes>
constexpr GgufTypeInfo decoded(GgufType type, const char* name) {
  return {type, name, kValues, kBytes, decode_blocks<decode_block, kValues, kBytes>};
}

constexpr std::uint32_t kSuperBlock = 256;  // elements in a K-quant / IQ super-block

// Block sizes in bytes follow each type's block layout (see the decoders above for the layouts this
// library decodes).
constexpr GgufTypeInfo kTypes[] = {
    {GgufType::F32, "F32", 1, 4, decode_f32},
    decoded<decode_f16, 1, 2>(GgufType::F16, "F16"),
    decoded<decode_q4_0, 32, 2 + 16>(GgufType::Q4_0, "Q4_0"),
    decoded<decode_q4_1, 32, 2 + 2 + 16>(GgufType::Q4_1, "Q4_1"),
    decoded<decode_q5_0, 32, 2 + 4 + 16>(GgufType::Q5_0, "Q5_0"),
    decoded<decode_q5_1, 32, 2 + 2 + 4 + 16>(GgufType::Q5_1, "Q5_1"),
    decoded<decode_q8_0, 32, 2 + 32>(GgufType::Q8_0, "Q8_0"),
    {GgufType::Q8_1, "Q8_1", 32, 2 + 2 + 32, nullptr},
    {GgufType::Q2_K, "Q2_K", kSuperBlock, 16 + 64 + 2 + 2, nullptr},
    {GgufType::Q3_K, "Q3_K", kSuperBlock, 32 + 64 + 12 + 2, nullptr},
    decoded<decode_q4_k, kSuperBlock, 2 + 2 + 12 + 128>(GgufType::Q4_K, "Q4_K"),
    decoded<decode_q5_k, kSuperBlock, 2 + 2 + 12 + 32 + 128>(GgufType::Q5_K, "Q5_K"),
    decoded<decode_q6_k, kSuperBlock, 128 + 64 + 16 + 2>(GgufType::Q6_K, "Q6_K"),
    {GgufType::Q8_K, "Q8_K", kSuperBlock, 4 + 256 + 16 * 2, nullptr},
    {GgufType::IQ2_XXS, "IQ2_XXS", kSuperBlock, 2 + 64, nullptr},
    {GgufType::IQ2_XS, "IQ2_XS", kSuperBlock, 2 + 64 + 8, nullptr},
    {GgufType::IQ3_XXS, "IQ3_XXS", kSuperBlock, 2 + 96, nullptr},
    {GgufType::IQ1_S, "IQ1_S", kSuperBlock, 2 + 32 + 16, nullptr},
    {GgufType::IQ4_NL, "IQ4_NL", 32, 2 + 16, nullptr},
    {GgufType::IQ3_S, "IQ3_S", kSuperBlock, 2 + 64 + 8 + 32 + 4, nullptr},
    {GgufType::IQ2_S, "IQ2_S", kSuperBlock, 2 + 64 + 16, nullptr},
    {GgufType::IQ4_XS, "IQ4_XS", kSuperBlock, 2 + 2 + 4 + 128, nullptr},
    {GgufType::I8, "I8", 1, 1, nullptr},
    {GgufType::I16, "I16", 1, 2, nullptr},
    {GgufType::I32, "I32", 1, 4, nullptr},
    {GgufType::I64, "I64", 1, 8, nullptr},
    {GgufType::F64, "F64", 1, 8, nullptr},
    {GgufType::IQ1_M, "IQ1_M", kSuperBlock, 32 + 16 + 8, nullptr},
    decoded<decode_bf16, 1, 2>(GgufType::BF16, "BF16"),
    {GgufType::TQ1_0, "TQ1_0", kSuperBlock, 48 + 4 + 2, nullptr},
    {GgufType::TQ2_0, "TQ2_0", kSuperBlock, 64 + 2, nullptr},
};

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

const GgufTypeInfo* find_gguf_type(std::uint32_t id) {
  for (const GgufTypeInfo& info : kTypes)
    if (static_cast<std::uint32_t>(info.type) == id) return &info;
  return nullptr;
}

const GgufTypeInfo& gguf_type_info(GgufType type) {
  const GgufTypeInfo* info = find_gguf_type(static_cast<std::uint32_t>(type));
  if (!info)
    throw std::invalid_argument("unknown GGUF tensor type id " + std::to_string(static_cast<std::uint32_t>(type)));
  return *info;
}

const char* to_string(GgufType type) {
  const GgufTypeInfo* info = find_gguf_type(static_cast<std::uint32_t>(type));
  return info ? info->name : "unknown";
}

std::string dequantizable_gguf_type_names() {
  std::string names;
  for (const GgufTypeInfo& info : kTypes) {
    if (!info.dequantizable()) continue;
    if (!names.empty()) names += ", ";
    names += info.name;
  }
  return names;
}

}  // namespace kvchat
