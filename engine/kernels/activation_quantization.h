#pragma once
// Activations rounded to 8-bit integers in blocks of 32, for the integer dot products of the
// quantized-weight kernels (quantized_matvec.h). Decode on two cores cannot widen every 4-bit weight
// to f32 fast enough to keep up with memory; multiplying the stored integers by 8-bit activations
// (_mm256_maddubs_epi16) does 32 products per instruction, so the weights are read at bandwidth.
//
// Rounding: per block of 32, scale = max|x| / 127 and q = x * (1 / scale) rounded to the nearest
// integer (ties to even), so |x - scale * q| <= scale / 2 (plus one f32 rounding of x * (1/scale)).
// An all-zero block has scale 0 and q 0. A block holding a NaN or an infinity gets scale NaN and q 0,
// so every product that reads it is NaN, as an f32 product would be non-finite. The AVX2 and the
// portable code give bit-identical results.
#include <cstdint>
#include <vector>

namespace kvchat::kernels {

constexpr std::int64_t kActivationBlock = 32;

// x[cols] rounded as above; cols is a multiple of kActivationBlock.
struct QuantizedActivations {
  const std::int8_t* q = nullptr;     // [cols]
  const float* scales = nullptr;      // [cols / 32]: x ~ scale * q
  const std::int16_t* sums = nullptr; // [cols / 16]: sum of q over each 16 elements (for weight offsets and mins)
};

// Rounds x[cols] into the caller's buffers q[cols], scales[cols / 32], sums[cols / 16].
void quantize_activations(const float* x, std::int64_t cols, std::int8_t* q, float* scales, std::int16_t* sums);

// The values the integer products multiply by, scale * q, for n rows of cols (out may be x): the
// prefill GEMM rounds its input the same way, so a prompt and a decode step compute the same products.
void round_activations(const float* x, std::int64_t n, std::int64_t cols, float* out);

// Rounds x[n, cols] into buffers the calling thread keeps (grown on first use, then reused: a decode
// step allocates nothing). Row i's activations are returned by row(i); valid until the thread's next call.
class ThreadActivations {
 public:
  static const ThreadActivations& quantize(const float* x, std::int64_t n, std::int64_t cols);
  QuantizedActivations row(std::int64_t i) const;

 private:
  ThreadActivations() = default;
  std::int64_t cols_ = 0;
  std::vector<std::int8_t> q_;
  std::vector<float> scales_;
  std::vector<std::int16_t> sums_;
};

}  // namespace kvchat::kernels
