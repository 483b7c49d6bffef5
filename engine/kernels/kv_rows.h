#pragma once
// Rows of keys or values in the KV cache's storage types (KvDtype): one row is one KV head's head_dim values at
// one position. F32 rows are the values themselves; BF16 and F16 rows two bytes a value; a Q8_0 row is its
// head_dim signed bytes followed by one f16 scale per block (32 values, or the whole row when head_dim is not a
// multiple of 32): value = scale * byte, with scale = max|x| / 127 of the block and byte = the nearest integer of
// x / scale, ties to even (llama.cpp's q8_0 layout).
//
// Every conversion here is exact one way: decoding gives f32 values that encode back to the same row, so a row
// rounded once (round_kv_rows) and stored, then read, is the rounded row to the bit. That is what lets the cache
// store fewer bytes and still change no token: the model rounds K and V once, when they are made, on every path.
#include <cstdint>

#include "engine/types.h"

namespace kvchat::kernels {

// Values per Q8_0 block of a row of head_dim values.
std::int64_t kv_q8_block(std::int64_t head_dim);
// Bytes of one stored row of head_dim values.
std::int64_t kv_row_bytes(KvDtype dtype, std::int64_t head_dim);

// rows x head_dim f32 values (contiguous) into rows stored rows (contiguous, kv_row_bytes each).
void encode_kv_rows(KvDtype dtype, const float* values, std::int64_t rows, std::int64_t head_dim, void* stored);
// rows stored rows, `stored_stride` bytes apart, into rows x head_dim f32 values (contiguous).
void decode_kv_rows(KvDtype dtype, const void* stored, std::int64_t rows, std::int64_t stored_stride,
                    std::int64_t head_dim, float* values);
// values -> decode(encode(values)), in place: what a cache of `dtype` will give back.
void round_kv_rows(KvDtype dtype, float* values, std::int64_t rows, std::int64_t head_dim);

// IEEE half <-> float (round to nearest even; NaN stays NaN, overflow becomes infinity).
std::uint16_t float_to_f16(float value);
float f16_to_float(std::uint16_t bits);

}  // namespace kvchat::kernels
