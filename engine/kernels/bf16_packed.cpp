#include "engine/kernels/bf16_packed.h"

#include <stdexcept>
#include <string>

#include "engine/kernels/cpu_features.h"

namespace kvchat::kernels {

#if KVCHAT_HAVE_AVX2_KERNELS
namespace avx512 {
void bf16_pack_matrix(const std::uint16_t* w, std::int64_t rows, std::int64_t cols, std::int64_t first_tile,
                      std::int64_t tiles, std::uint32_t* packed);
void bf16_pack_input(const float* x, std::int64_t rows, std::int64_t cols, std::int64_t first_row, std::int64_t count,
                     std::uint32_t* packed);
void bf16_packed_products(const std::uint32_t* input, std::int64_t rows, std::int64_t cols, const std::uint32_t* matrix,
                          std::int64_t out, std::int64_t first_tile, std::int64_t tiles, float* y, std::int64_t ldy,
                          float* scratch);
}  // namespace avx512
#endif

namespace {
[[noreturn]] void unavailable(const char* function) {
  throw std::logic_error(std::string(function) + ": no AVX-512 BF16 here (check bf16_packed_available())");
}
}  // namespace

bool bf16_packed_available() { return use_avx512_kernels() && cpu_has_avx512_bf16(); }

std::int64_t bf16_packed_matrix_words(std::int64_t rows, std::int64_t cols) {
  return (rows + kBf16TileRows - 1) / kBf16TileRows * kBf16TileRows * ((cols + 1) / 2);
}

std::int64_t bf16_packed_input_words(std::int64_t rows, std::int64_t cols) {
  if (rows == 1) return (cols + 1) / 2;
  return (rows + kBf16InputGroupRows - 1) / kBf16InputGroupRows * kBf16InputGroupRows * ((cols + 1) / 2);
}

std::int64_t bf16_products_scratch_floats(std::int64_t tiles) { return kBf16InputGroupRows * tiles * kBf16TileRows; }

void bf16_pack_matrix(const std::uint16_t* w, std::int64_t rows, std::int64_t cols, std::int64_t first_tile,
                      std::int64_t tiles, std::uint32_t* packed) {
#if KVCHAT_HAVE_AVX2_KERNELS
  if (bf16_packed_available()) return avx512::bf16_pack_matrix(w, rows, cols, first_tile, tiles, packed);
#endif
  (void)w, (void)rows, (void)cols, (void)first_tile, (void)tiles, (void)packed;
  unavailable("bf16_pack_matrix");
}

void bf16_pack_input(const float* x, std::int64_t rows, std::int64_t cols, std::int64_t first_row, std::int64_t count,
                     std::uint32_t* packed) {
#if KVCHAT_HAVE_AVX2_KERNELS
  if (bf16_packed_available()) return avx512::bf16_pack_input(x, rows, cols, first_row, count, packed);
#endif
  (void)x, (void)rows, (void)cols, (void)first_row, (void)count, (void)packed;
  unavailable("bf16_pack_input");
}

void bf16_packed_products(const std::uint32_t* input, std::int64_t rows, std::int64_t cols, const std::uint32_t* matrix,
                          std::int64_t out, std::int64_t first_tile, std::int64_t tiles, float* y, std::int64_t ldy,
                          float* scratch) {
#if KVCHAT_HAVE_AVX2_KERNELS
  if (bf16_packed_available())
    return avx512::bf16_packed_products(input, rows, cols, matrix, out, first_tile, tiles, y, ldy, scratch);
#endif
  (void)input, (void)rows, (void)cols, (void)matrix, (void)out, (void)first_tile, (void)tiles, (void)y, (void)ldy,
      (void)scratch;
  unavailable("bf16_packed_products");
}

}  // namespace kvchat::kernels
