#pragma once
// The entry points of the instruction-set files, internal to kvchat_kernels. Only *_avx2.cpp and *_avx512.cpp
// are compiled for those instruction sets (engine/CMakeLists.txt); every other file, the portable kernels and
// the code that picks a kernel among them, stays baseline x86-64 and calls these only after cpu_features.h
// said the processor has them (and they are not switched off). The block types' kernels (integer dot
// products, row decoders) are in integer_dot.h.
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "engine/kernels/activation_quantization.h"
#include "engine/kernels/attention.h"
#include "engine/kernels/cpu_features.h"
#include "engine/kernels/kv_rows.h"

namespace kvchat::kernels {
namespace {

// The unit s of a group of activations (NaN when the group is not finite), and the factor that takes x to its byte
// (0 for a zero or non-finite group), as llama.cpp rounds the input of its block-type products on x86, so that a GGUF
// file's products equal its own up to the order of f32 sums (activation_quantization.h):
// - the factor is 127 / max|x| in f32 for both groups;
// - groups of 32 (its Q8_0 activations, ggml's quantize_row_q8_0) keep the unit max|x| / 127 as an IEEE half;
// - groups of 256 (its Q8_K, quantize_row_q8_K_ref) keep 1 / factor in f32.
// Beyond llama.cpp: a unit past the half range (max|x| above 8.3 million) stays f32 instead of infinite, and a factor
// past the f32 range (max|x| below about 4e-37) makes the group zero. Shared by the portable and the AVX2 rounding,
// which must agree to the bit; internal linkage, so that each file has its own copy compiled for its instruction set.
inline void activation_group_scale(float largest, bool finite, std::int64_t group, float& unit, float& inverse) {
  if (!finite) {
    unit = NAN;
    inverse = 0.f;
    return;
  }
  inverse = largest > 0.f ? 127.f / largest : 0.f;
  if (!(inverse > 0.f) || std::isinf(inverse)) {
    unit = inverse = 0.f;
    return;
  }
  if (group == kActivationSuperBlock) {
    unit = 1.f / inverse;
    return;
  }
  unit = largest / 127.f;
  const std::uint16_t half = float_to_f16(unit);
  if ((half & 0x7c00u) != 0x7c00u) unit = f16_to_float(half);
}

}  // namespace

#if KVCHAT_HAVE_AVX2_KERNELS
namespace avx2 {

// matvec.h: dot products and rows [row_begin, row_end) of Y = X W^T for n vectors (f32 or bf16 weights).
float dot_f32(const float* a, const float* b, std::int64_t n);
float dot_f16(const std::uint16_t* w, const float* x, std::int64_t n);
void matmul_rows(const float* weight, const float* x, float* y, std::int64_t n, std::int64_t rows, std::int64_t cols,
                 const float* bias, std::int64_t row_begin, std::int64_t row_end);
void matmul_rows(const std::uint16_t* weight, const float* x, float* y, std::int64_t n, std::int64_t rows,
                 std::int64_t cols, const float* bias, std::int64_t row_begin, std::int64_t row_end);
// The same with every row of Y equal to the matvec of its vector alone (the row-exact products).
void matmul_rows_exact(const float* weight, const float* x, float* y, std::int64_t n, std::int64_t rows,
                       std::int64_t cols, const float* bias, std::int64_t row_begin, std::int64_t row_end);
void matmul_rows_exact(const std::uint16_t* weight, const float* x, float* y, std::int64_t n, std::int64_t rows,
                       std::int64_t cols, const float* bias, std::int64_t row_begin, std::int64_t row_end);

// attention.h
void attention_decode_head(const float* q, const float* keys, const float* values, std::int64_t n,
                           std::int64_t row_stride, std::int64_t group, std::int64_t head_dim, float scale,
                           float* scores, float* out);

// activation.h
void silu_mul(float* gate, const float* up, std::int64_t n);

// bf16.h (one thread's share: the caller splits the work)
void bf16_to_f32(const std::uint16_t* src, float* dst, std::int64_t n);
void f32_to_bf16(const float* src, std::uint16_t* dst, std::int64_t n);

// activation_quantization.h: the bytes and the scales of x[cols] in groups of `group` (not the byte sums).
void quantize_activation_bytes(const float* x, std::int64_t cols, std::int64_t group, std::int8_t* bytes,
                               float* scales);

// memory_probe.h: a checksum of data[0, words), so that the loads cannot be elided.
std::uint64_t read_words(const std::uint64_t* data, std::size_t words);

}  // namespace avx2

namespace avx512 {

// attention.h, for head_dim a multiple of 16 and groups of up to kMaxAttentionGroup queries.
constexpr std::int64_t kMaxAttentionGroup = 64;
void attention_decode_head(const float* q, const float* keys, const float* values, std::int64_t n,
                           std::int64_t row_stride, std::int64_t group, std::int64_t head_dim, float scale,
                           float* scores, float* out);
bool attention_decode_head_stored(const float* q, const StoredKvRows& keys, const StoredKvRows& values, std::int64_t n,
                                  std::int64_t group, std::int64_t head_dim, float scale, float* scores, float* out);
// matvec.h's row-exact products over n > 1 vectors, for rows longer than the short rows the AVX2 kernel takes four at
// a time (each result the AVX2 matvec's of its vector alone, to the bit).
constexpr std::int64_t kExactMinColumns = 257;
void matmul_rows_exact(const float* weight, const float* x, float* y, std::int64_t n, std::int64_t rows,
                       std::int64_t cols, const float* bias, std::int64_t row_begin, std::int64_t row_end);
void matmul_rows_exact(const std::uint16_t* weight, const float* x, float* y, std::int64_t n, std::int64_t rows,
                       std::int64_t cols, const float* bias, std::int64_t row_begin, std::int64_t row_end);
bool attention_decode_head_paged(const float* q, const PagedKvRows& keys, const PagedKvRows& values, std::int64_t n,
                                 std::int64_t group, std::int64_t head_dim, float scale, float* scores, float* out);

}  // namespace avx512
#endif  // KVCHAT_HAVE_AVX2_KERNELS

}  // namespace kvchat::kernels
