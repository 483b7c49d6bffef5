#pragma once
// Activations rounded to integers in blocks of 32, for the integer dot products of the quantized-weight
// kernels (integer_dot.h). Decode on two cores cannot widen every 4-bit weight to f32 fast enough to
// keep up with memory; _mm256_maddubs_epi16 multiplies 32 stored integers by 32 signed bytes at once.
//
// Each value is kept as two signed bytes, x ~ scale * (254 * high + low): per block of 32,
// t = x * (1 / s) with s = max|x| / 127, high = nearest integer of t, low = nearest integer of
// (t - high) * 254 (ties to even), scale = s / 254. So |high| <= 127, |low| <= 127, and
// |x - x^| <= scale * 0.51 (half a step, plus the f32 roundings of t): about 1/64500 of the block's
// largest magnitude. Eight bits alone (llama.cpp's choice) would be 254 times coarser; there a rounding
// decision flipped by f32 noise (the last bits of a prompt's GEMM against a decode step) moves a product
// visibly, and greedy ids of a cached and an uncached run could part on close calls.
// The K-quant kernels (Q4_K, Q5_K, Q6_K) take a second, coarser rounding instead: one signed byte per
// value and one scale per super-block of 256, x ~ scale * byte with scale = max|x| / 127 (llama.cpp's
// Q8_K). Their weights' sub-block scales are small integers, so with one activation scale per super-block
// the whole super-block's sum stays an exact integer and is converted to f32 once, not once per block of 32
// (one core's Q4_K products: 36 -> 62 G weights/s in cache). |x - x^| <= scale * 0.51, about 1/250 of
// the super-block's largest magnitude: coarse enough that the f32 noise named above would move logits by
// the rounding's own size, so a model with K-quants computes every forward row-exact
// (LlamaModel::forward_rows): a prompt, its tokens decoded one by one and the uncached path round the same
// inputs and agree to the bit.
// Q8_0 takes the high bytes of the two-byte rounding alone, x ~ (254 * scale) * high per block of 32
// (llama.cpp's Q8_0 activations; |x - x^| <= 254 * scale * 0.51, about 1/250 of the block's largest
// magnitude). Decode reads every weight once per token while the activations are re-read from L1 for
// each row: one byte per activation instead of two let the 1B shape's Q8_0 products on two cores read
// 0.88-0.91 of a paired read probe instead of 0.84-0.85 (medians of 40 and 60 rounds). Its models run
// row-exact too.
//
// An all-zero block has scale 0 and zeros. A block holding a NaN or an infinity gets scale NaN and
// zeros, so every product that reads it is NaN, as an f32 product would be non-finite. The AVX2 and
// the portable code give bit-identical results.
#include <cstdint>
#include <vector>

namespace kvchat::kernels {

constexpr std::int64_t kActivationBlock = 32;
// The weight of the high byte: |low| stays within 127, so sign tricks on it cannot overflow.
constexpr int kActivationRadix = 254;
// The coarse rounding's super-block.
constexpr std::int64_t kActivationSuperBlock = 256;

// Which rounding a product's input takes (activation_rounding(type) in quantized_matvec.h).
enum class ActivationRounding {
  None,                // f32 products (F32, F16, BF16)
  TwoBytesPerValue,    // blocks of 32, two signed bytes per value
  OneBytePerValue,     // super-blocks of 256, one signed byte per value (the K-quants)
  HighBytePerValue,    // blocks of 32, the high byte of TwoBytesPerValue alone (Q8_0)
};

// The roundings coarse enough that their models compute every forward row-exact (see above).
inline bool rounds_to_one_byte(ActivationRounding rounding) {
  return rounding == ActivationRounding::OneBytePerValue || rounding == ActivationRounding::HighBytePerValue;
}

// x[cols] rounded as above; cols is a multiple of kActivationBlock.
struct QuantizedActivations {
  const std::int8_t* high = nullptr;   // [cols]
  const std::int8_t* low = nullptr;    // [cols]
  const float* scales = nullptr;       // [cols / 32]: x ~ scale * (254 * high + low), or (scale * 254) * high
  const std::int32_t* sums = nullptr;  // [cols / 16]: sum of 254 * high + low over each 16 elements
  // [cols]: 254 * high + low as one 16-bit integer (|value| <= 32385), for the AVX-512 kernels, which
  // multiply 16-bit pairs; filled by ThreadActivations (null where only high and low were made).
  const std::int16_t* values = nullptr;

  // The coarse rounding (null where it was not made): x ~ byte_scales[i / 256] * bytes[i].
  const std::int8_t* bytes = nullptr;         // [cols]
  const float* byte_scales = nullptr;         // [cols / 256]
  const std::int16_t* byte_sums16 = nullptr;  // [cols / 16]: the sum of the bytes of each 16
  const std::int16_t* byte_sums32 = nullptr;  // [cols / 32]: of each 32
};

// Rounds x[cols] into the caller's buffers high[cols], low[cols], scales[cols / 32], sums[cols / 16].
void quantize_activations(const float* x, std::int64_t cols, std::int8_t* high, std::int8_t* low, float* scales,
                          std::int32_t* sums);

// Rounds x[cols] into one byte per value (the coarse rounding above): bytes[cols], scales[cols / 256],
// sums16[cols / 16], sums32[cols / 32]; cols is a multiple of 256.
void quantize_activation_bytes(const float* x, std::int64_t cols, std::int8_t* bytes, float* scales,
                               std::int16_t* sums16, std::int16_t* sums32);

// The values the integer products multiply by (scale * (254 * high + low), or scale * byte), for n rows
// of cols (out may be x): the prefill GEMM rounds its input the same way, so a prompt and a decode step
// compute the same products. `rounding` is not None.
void round_activations(ActivationRounding rounding, const float* x, std::int64_t n, std::int64_t cols, float* out);

// Rounds x[n, cols] into buffers the calling thread keeps (grown on first use, then reused: a decode
// step allocates nothing), in two bytes per value and/or one (for products whose weights differ in type,
// q/k/v of a Q4_K_M file). Row i's activations are returned by row(i); valid until the thread's next call.
class ThreadActivations {
 public:
  static const ThreadActivations& quantize(const float* x, std::int64_t n, std::int64_t cols, bool two_bytes = true,
                                           bool one_byte = false);
  QuantizedActivations row(std::int64_t i) const;

 private:
  ThreadActivations() = default;
  std::int64_t cols_ = 0;
  std::vector<std::int8_t> high_, low_;
  std::vector<float> scales_;
  std::vector<std::int32_t> sums_;
  std::vector<std::int16_t> values_;
  bool two_bytes_ = false, one_byte_ = false;
  std::vector<std::int8_t> bytes_;
  std::vector<float> byte_scales_;
  std::vector<std::int16_t> byte_sums16_, byte_sums32_;
};

}  // namespace kvchat::kernels
