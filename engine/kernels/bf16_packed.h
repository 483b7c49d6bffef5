#pragma once
// A bf16 matrix repacked for vdpbf16ps (AVX-512 BF16), and its products with inputs rounded to bf16: what a GGUF
// BF16 matrix computes with the kernels on where the processor has the instruction, as llama.cpp multiplies such
// a matrix by bf16 activations. vdpbf16ps adds two products of bf16 values (each exact in f32) to an f32 sum, 32
// multiply-adds per instruction.
//
// One order of the sums for every number of input rows: the lanes are 32 weight rows (a tile), and each output
// (input row r, weight row c) is one sum from zero over the pairs of columns in order, whether a decode step's one
// row or a prompt's hundreds are computed. So a prompt's logits equal, to the bit, its tokens decoded one by one,
// and a rounding decision never goes two ways (the block types' rule: DESIGN, "One layer").
//
// Packed matrix: per tile of 32 rows (the last padded with zero rows), [pair][32] 32-bit words, a word holding a
// row's columns 2p (low half) and 2p + 1 (high half; zero past an odd row length). Packed input: per group of
// kBf16InputGroupRows rows, [pair][group] words the same way, rounded to bf16 (nearest, ties to even; the
// instruction treats bf16 subnormals as zero); a single row (a decode step) is its pair words in order alone.
#include <cstdint>

namespace kvchat::kernels {

// Whether these kernels run here: use_avx512_kernels() and the processor has AVX-512 BF16.
bool bf16_packed_available();

constexpr std::int64_t kBf16TileRows = 32;
constexpr std::int64_t kBf16InputGroupRows = 12;

std::int64_t bf16_packed_matrix_words(std::int64_t rows, std::int64_t cols);
// Tiles [first_tile, first_tile + tiles) of w [rows, cols] (bf16, row-major) into `packed` (the whole matrix's).
void bf16_pack_matrix(const std::uint16_t* w, std::int64_t rows, std::int64_t cols, std::int64_t first_tile,
                      std::int64_t tiles, std::uint32_t* packed);

std::int64_t bf16_packed_input_words(std::int64_t rows, std::int64_t cols);
// Rows [first_row, first_row + count) of x [rows, cols] (first_row a multiple of kBf16InputGroupRows).
void bf16_pack_input(const float* x, std::int64_t rows, std::int64_t cols, std::int64_t first_row, std::int64_t count,
                     std::uint32_t* packed);

// y[r * ldy + c] = sum over pairs of x[r] and w[c] for every input row r < rows and the weight rows of tiles
// [first_tile, first_tile + tiles) below `out` (the matrix's row count). `scratch` holds
// bf16_products_scratch_floats(tiles) floats. Runs on the calling thread; threads split the tiles.
std::int64_t bf16_products_scratch_floats(std::int64_t tiles);
void bf16_packed_products(const std::uint32_t* input, std::int64_t rows, std::int64_t cols, const std::uint32_t* matrix,
                          std::int64_t out, std::int64_t first_tile, std::int64_t tiles, float* y, std::int64_t ldy,
                          float* scratch);

}  // namespace kvchat::kernels
