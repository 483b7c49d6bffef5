// The portable integer dot products (integer_dot.h): per block of 32 activations (per super-block of 256 for
// the K-quants) the same exact integer sum as the AVX2 and AVX-512 kernels, scaled by the same factors. Plain
// C++ for any processor. Block layouts are those of engine/gguf/gguf_types.cpp, which documents them.
#include <cstring>

#include "engine/gguf/dequantize.h"
#include "engine/kernels/block_types.h"
#include "engine/kernels/integer_dot.h"

namespace kvchat::kernels::portable {
namespace {

inline float scale_at(const std::uint8_t* at) {
  std::uint16_t bits;
  std::memcpy(&bits, at, 2);
  return f16_to_f32(bits);
}

// The 32 integers of a Q4_0/Q4_1 block (0..15), or of a Q5_0/Q5_1 block with its fifth bits (0..31).
inline void nibbles32(const std::uint8_t* qs, std::uint32_t fifth_bits, int* w) {
  for (int j = 0; j < 16; ++j) {
    w[j] = (qs[j] & 0x0F) | static_cast<int>(((fifth_bits >> j) & 1u) << 4);
    w[j + 16] = (qs[j] >> 4) | static_cast<int>(((fifth_bits >> (j + 16)) & 1u) << 4);
  }
}

// sum_j w[j] * bytes[j] over the 32 values of activation block b.
inline std::int32_t block_dot(const int* w, const QuantizedActivations& x, std::int64_t b) {
  std::int32_t sum = 0;
  for (int j = 0; j < 32; ++j) sum += w[j] * x.blocks.bytes[32 * b + j];
  return sum;
}

// sum_j w[j] * bytes[j] over `count` integers from element `first` (the one-byte rounding).
inline std::int64_t dot_bytes(const int* w, const QuantizedActivations& x, std::int64_t first, int count) {
  std::int64_t sum = 0;
  for (int j = 0; j < count; ++j) sum += std::int64_t{w[j]} * x.super_blocks.bytes[first + j];
  return sum;
}

// Q4_K / Q5_K: x = d*sc*q - dmin*m per sub-block of 32; against one-byte activations with one scale per
// super-block, d * x_scale * sum(sc * sum(q b)) - dmin * x_scale * sum(m * sum(b)), both sums exact.
template <bool kFifthBits>
float dot_q4_q5_k(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks) {
  constexpr int kBlockBytes = kFifthBits ? 176 : 144, kNibblesAt = kFifthBits ? 48 : 16;
  float total = 0.f;
  int w[32];
  for (std::int64_t s = 0; s < blocks; ++s, row += kBlockBytes) {
    std::int64_t scaled = 0, mins = 0;
    for (int sub = 0; sub < 8; ++sub) {
      const std::uint8_t* qs = row + kNibblesAt + 32 * (sub / 2);
      for (int l = 0; l < 32; ++l) {
        w[l] = sub % 2 == 0 ? qs[l] & 0x0F : qs[l] >> 4;
        if (kFifthBits) w[l] |= ((row[16 + l] >> sub) & 1) << 4;
      }
      int scale, min;
      k_quant_scale_and_min(sub, row + 4, scale, min);
      scaled += scale * dot_bytes(w, x, 256 * s + 32 * sub, 32);
      mins += min * std::int64_t{x.super_blocks.sums32[8 * s + sub]};
    }
    total += scale_at(row) * x.super_blocks.scales[s] * static_cast<float>(scaled) -
             scale_at(row + 2) * x.super_blocks.scales[s] * static_cast<float>(mins);
  }
  return total;
}

}  // namespace

// A type with blocks of 32 (SmallBlockLayout, block_types.h): x = d * (q - offset) (+ m), so a block's
// product is d * s * sum (q - offset) byte (+ m * s * sum byte), s the activations' scale.
template <GgufType kType>
float dot_small_block(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks) {
  using Layout = SmallBlockLayout<kType>;
  float sum = 0.f;
  int w[32];
  for (std::int64_t b = 0; b < blocks; ++b, row += Layout::kBytes) {
    if constexpr (kType == GgufType::Q8_0) {
      for (int j = 0; j < 32; ++j) w[j] = static_cast<std::int8_t>(row[Layout::kQuantsAt + j]);
    } else {
      std::uint32_t fifth_bits = 0;
      if constexpr (Layout::kFifthBitsAt >= 0) std::memcpy(&fifth_bits, row + Layout::kFifthBitsAt, 4);
      nibbles32(row + Layout::kQuantsAt, fifth_bits, w);
      for (int& q : w) q -= Layout::kOffset;
    }
    sum += scale_at(row) * x.blocks.scales[b] * static_cast<float>(block_dot(w, x, b));
    if constexpr (Layout::kMin) sum += scale_at(row + 2) * x.blocks.scales[b] * static_cast<float>(x.blocks.sums32[b]);
  }
  return sum;
}

#define KVCHAT_INSTANTIATE(type) \
  template float dot_small_block<GgufType::type>(const std::uint8_t*, const QuantizedActivations&, std::int64_t);
KVCHAT_SMALL_BLOCK_TYPES(KVCHAT_INSTANTIATE)
#undef KVCHAT_INSTANTIATE

float dot_q4_k(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks) {
  return dot_q4_q5_k<false>(row, x, blocks);
}

float dot_q5_k(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks) {
  return dot_q4_q5_k<true>(row, x, blocks);
}

// Q6_K: x = d*sc*(q - 32) per group of 16; d * x_scale * sum(sc * (sum(q b) - 32 sum(b))), exact inside.
float dot_q6_k(const std::uint8_t* row, const QuantizedActivations& x, std::int64_t blocks) {
  float total = 0.f;
  for (std::int64_t s = 0; s < blocks; ++s, row += 210) {
    const auto* sc = reinterpret_cast<const std::int8_t*>(row + 192);
    std::int64_t scaled = 0;
    for (int sub = 0; sub < 8; ++sub) {
      const int half = sub / 4, k = sub % 4;
      const std::uint8_t* ql = row + 64 * half + (k % 2 == 1 ? 32 : 0);
      const std::uint8_t* qh = row + 128 + 32 * half;
      int w[32];
      for (int l = 0; l < 32; ++l) w[l] = (k < 2 ? ql[l] & 0x0F : ql[l] >> 4) | (((qh[l] >> (2 * k)) & 3) << 4);
      for (int group = 0; group < 2; ++group)
        scaled += sc[2 * sub + group] * (dot_bytes(w + 16 * group, x, 256 * s + 32 * sub + 16 * group, 16) -
                                         32 * std::int64_t{x.super_blocks.sums16[16 * s + 2 * sub + group]});
    }
    total += scale_at(row + 208) * x.super_blocks.scales[s] * static_cast<float>(scaled);
  }
  return total;
}

}  // namespace kvchat::kernels::portable
