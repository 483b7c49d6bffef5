#pragma once
// Activations rounded to one signed byte per value, for the integer dot products of the quantized-weight
// kernels (integer_dot.h). Decode on two cores cannot widen every 4-bit weight to f32 fast enough to
// keep up with memory; _mm256_maddubs_epi16 and AVX-512 VNNI's vpdpbusd multiply 32 or 64 stored
// integers by as many bytes at once.
//
// Per group of values (a block of 32 or a super-block of 256), as llama.cpp rounds its block-type products' input on
// x86 (so that kvchat's products on a GGUF file equal llama.cpp's up to the order of f32 sums): byte = nearest integer
// of x * (127 / max|x|), ties to even, so |byte| <= 127, and x ~ s * byte with a unit s of about max|x| / 127:
// kept as an IEEE half for blocks of 32 (ggml's Q8_0 activations), as 1 / (127 / max|x|) in f32 for super-blocks
// (its Q8_K). |x - x^| stays within about 0.56 s (half a step, the half's rounding of s times 127, and the f32
// roundings): about 1/230 of the group's largest magnitude. With each group come
// the byte sums of each 16 and each 32 (for the weights' offsets and mins).
// - Blocks of 32 (BlockBytes) serve Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: one activation scale per weight
//   block (llama.cpp's Q8_0/Q8_1 activations). Q4_1 and Q5_1's offset terms take the exact byte sums, where
//   llama.cpp's Q8_1 keeps each block's scaled sum as a half: on those two types the products still differ from
//   llama.cpp's by that half's rounding.
// - Super-blocks of 256 (SuperBlockBytes) serve the K-quants (Q4_K, Q5_K, Q6_K): their weights'
//   sub-block scales are small integers, so with one activation scale per super-block the whole
//   super-block's sum stays an exact integer and is converted to f32 once, not once per block of 32 (far
//   fewer conversions on the K-quants' hot loop); llama.cpp's Q8_K.
// One byte per activation halves the bytes re-read from L1 per weight against the two (254 * high + low)
// this rounding once took, which the Q8_0 products' share of the bandwidth showed (DESIGN's tuning table).
// It is coarse enough that f32 noise (the last bits of a prompt's GEMM
// against a decode step) would move logits by the rounding's own size, so a model with these weights
// computes every forward row-exact (LlamaModel::forward_rows): a prompt, its tokens decoded one by one
// and the uncached path round the same inputs and agree to the bit.
//
// An all-zero group has scale 0 and zeros. A group holding a NaN or an infinity gets scale NaN and
// zeros, so every product that reads it is NaN, as an f32 product would be non-finite. Where llama.cpp's rounding
// overflows, kvchat's stays finite: a unit past the half range stays f32, and a group whose largest magnitude is
// below about 4e-37 (127 / max|x| past the f32 range) is a zero group. The AVX2 and
// the portable code give bit-identical results.
#include <cstdint>
#include <vector>

namespace kvchat::kernels {

constexpr std::int64_t kActivationBlock = 32;
constexpr std::int64_t kActivationSuperBlock = 256;

// Which rounding a product's input takes (activation_rounding(type) in quantized_matvec.h).
enum class ActivationRounding {
  None,             // f32 products (F32, F16, BF16)
  BlockBytes,       // a scale per block of 32 (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1)
  SuperBlockBytes,  // a scale per super-block of 256 (the K-quants)
};

// The values of a rounding's groups: 32 or 256 (`rounding` is not None).
std::int64_t activation_group(ActivationRounding rounding);

// x[cols] rounded in groups of `group` values: x ~ scales[i / group] * bytes[i].
struct ActivationBytes {
  const std::int8_t* bytes = nullptr;    // [cols]
  const float* scales = nullptr;         // [cols / group]
  const std::int16_t* sums16 = nullptr;  // [cols / 16]: the sum of the bytes of each 16
  const std::int16_t* sums32 = nullptr;  // [cols / 32]: of each 32
};

// One input vector as the products take it; a rounding that was not made has null pointers.
struct QuantizedActivations {
  ActivationBytes blocks;        // BlockBytes
  ActivationBytes super_blocks;  // SuperBlockBytes
};

// Rounds x[cols] in groups of `group` (32 or 256) into bytes[cols], scales[cols / group],
// sums16[cols / 16], sums32[cols / 32]; cols is a multiple of group.
void quantize_activation_bytes(const float* x, std::int64_t cols, std::int64_t group, std::int8_t* bytes, float* scales,
                               std::int16_t* sums16, std::int16_t* sums32);

// The values the integer products multiply by (scale * byte), for n rows of cols (out may be x): the
// prefill GEMM rounds its input the same way, so a prompt and a decode step compute the same products.
// `rounding` is not None.
void round_activations(ActivationRounding rounding, const float* x, std::int64_t n, std::int64_t cols, float* out);

// Rounds x[n, cols] into buffers the calling thread keeps (grown on first use, then reused: a decode
// step allocates nothing), in blocks and/or super-blocks (for products whose weights differ in type,
// q/k/v of a Q4_K_M file). Row i's activations are returned by row(i); valid until the thread's next call.
class ThreadActivations {
 public:
  static const ThreadActivations& quantize(const float* x, std::int64_t n, std::int64_t cols, bool blocks,
                                           bool super_blocks);
  QuantizedActivations row(std::int64_t i) const;

 private:
  // One rounding's buffers for n rows.
  struct Buffers {
    bool made = false;
    std::int64_t group = 0;
    std::vector<std::int8_t> bytes;
    std::vector<float> scales;
    std::vector<std::int16_t> sums16, sums32;
    void fill(const float* x, std::int64_t n, std::int64_t cols);
    ActivationBytes row(std::int64_t i, std::int64_t cols) const;
  };
  ThreadActivations() = default;
  std::int64_t cols_ = 0;
  Buffers blocks_, super_blocks_;
};

}  // namespace kvchat::kernels
