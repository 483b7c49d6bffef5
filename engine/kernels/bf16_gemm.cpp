#include "engine/kernels/bf16_gemm.h"

#include <stdexcept>

#include "engine/kernels/cpu_features.h"

namespace kvchat::kernels {

#if KVCHAT_HAVE_AVX2_KERNELS
namespace avx512 {
void bf16_gemm_pack_input(const float* x, std::int64_t rows, std::int64_t cols, std::int64_t first_row,
                          std::int64_t count, std::uint32_t* packed);
void bf16_gemm_rows(const std::uint32_t* packed, std::int64_t rows, std::int64_t cols, const std::uint16_t* w,
                    std::int64_t out, float* y, std::int64_t ldy, float* scratch);
}  // namespace avx512
#endif

bool bf16_gemm_available() { return use_avx512_kernels() && cpu_has_avx512_bf16(); }

std::int64_t bf16_gemm_packed_words(std::int64_t rows, std::int64_t cols) {
  return (rows + kBf16GemmGroupRows - 1) / kBf16GemmGroupRows * kBf16GemmGroupRows * ((cols + 1) / 2);
}

void bf16_gemm_pack_input(const float* x, std::int64_t rows, std::int64_t cols, std::int64_t first_row,
                          std::int64_t count, std::uint32_t* packed) {
#if KVCHAT_HAVE_AVX2_KERNELS
  if (bf16_gemm_available()) return avx512::bf16_gemm_pack_input(x, rows, cols, first_row, count, packed);
#endif
  (void)x, (void)rows, (void)cols, (void)first_row, (void)count, (void)packed;
  throw std::logic_error("bf16_gemm_pack_input: no AVX-512 BF16 here (check bf16_gemm_available())");
}

std::int64_t bf16_gemm_scratch_floats(std::int64_t out) {
  return kBf16GemmGroupRows * ((out + kBf16GemmTileColumns - 1) / kBf16GemmTileColumns * kBf16GemmTileColumns);
}

void bf16_gemm_rows(const std::uint32_t* packed, std::int64_t rows, std::int64_t cols, const std::uint16_t* w,
                    std::int64_t out, float* y, std::int64_t ldy, float* scratch) {
#if KVCHAT_HAVE_AVX2_KERNELS
  if (bf16_gemm_available()) return avx512::bf16_gemm_rows(packed, rows, cols, w, out, y, ldy, scratch);
#endif
  (void)packed, (void)rows, (void)cols, (void)w, (void)out, (void)y, (void)ldy, (void)scratch;
  throw std::logic_error("bf16_gemm_rows: no AVX-512 BF16 here (check bf16_gemm_available())");
}

}  // namespace kvchat::kernels
