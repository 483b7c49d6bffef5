#pragma once
// A prompt's product with a bf16 matrix whose input is itself bf16: y = x W^T where every value of x is a bf16
// value (rounded before: a GGUF BF16 matrix's rule, as llama.cpp multiplies such a matrix). Each product of two
// bf16 values is exact in f32 and the sums are f32, so this computes what the f32 kernels compute on the same
// values, in another order of the sums; with vdpbf16ps (AVX-512 BF16) one instruction does 32 multiply-adds,
// twice what an f32 one does, and nothing is widened. Where the processor lacks it, the callers widen and use
// sgemm instead (same values, same rule).
//
// Use: pack x once (bf16_gemm_pack_input), then any number of threads each multiply it by their own block of
// W's rows (bf16_gemm_rows), writing that block's columns of y.
#include <cstdint>

namespace kvchat::kernels {

// Whether bf16_gemm_rows runs here: use_avx512_kernels() and the processor has AVX-512 BF16.
bool bf16_gemm_available();

// The packed input's size in 32-bit words for x [rows, cols].
std::int64_t bf16_gemm_packed_words(std::int64_t rows, std::int64_t cols);
// x [rows, cols] (f32 holding bf16 values; another value is rounded to the nearest) into `packed`. Runs on the calling
// thread; rows may be packed by several threads in groups: [first_row, first_row + count) with first_row a
// multiple of kBf16GemmGroupRows.
constexpr std::int64_t kBf16GemmGroupRows = 12;
void bf16_gemm_pack_input(const float* x, std::int64_t rows, std::int64_t cols, std::int64_t first_row,
                          std::int64_t count, std::uint32_t* packed);
// y[r * ldy + c] = sum_k x[r][k] w[c][k] for r < rows, c < out: w holds `out` bf16 rows of `cols` values (row
// stride `cols`). `packed` is the whole input packed; `scratch` holds bf16_gemm_scratch_floats(out) floats (the
// sums of a last group of fewer than kBf16GemmGroupRows rows). Runs on the calling thread.
constexpr std::int64_t kBf16GemmTileColumns = 32;
std::int64_t bf16_gemm_scratch_floats(std::int64_t out);
void bf16_gemm_rows(const std::uint32_t* packed, std::int64_t rows, std::int64_t cols, const std::uint16_t* w,
                    std::int64_t out, float* y, std::int64_t ldy, float* scratch);

}  // namespace kvchat::kernels
