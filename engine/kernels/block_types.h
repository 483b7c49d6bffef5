#pragma once
// The weight types the products take, as data. One record per GGUF type a matrix may keep (F32, F16, BF16 and
// the block quantizations), in one table (block_types.cpp):
// - its format, from engine/gguf's type catalog: name, values and bytes per block, the exact decoder;
// - how products round their input for it (activation_quantization.h);
// - for each instruction set its kernels: the integer row dot, the four-vector one, the row decoder of the
//   prefill GEMM; null where it has none (the portable row decoder is the exact one);
// - where a block keeps its f16 scales and the largest quant in units of the scale (random weights).
// A product looks its type up once and takes function pointers from the record (active_block_kernels), which
// then run over whole rows: nothing is looked up per block.
//
// Adding a block type whose kernels are those of an existing family (as Q5_1 is one of the blocks of 32):
//   engine/gguf/gguf_types.cpp      its exact decoder, in its row of the type catalog;
//   engine/kernels/block_types.h    its SmallBlockLayout and its place in KVCHAT_SMALL_BLOCK_TYPES;
//   engine/kernels/block_types.cpp  its record.
// A type with kernels of its own adds them to integer_dot_portable.cpp (and, where it is worth it,
// integer_dot_avx2.cpp / integer_dot_avx512.cpp), declared in integer_dot.h.
#include <cstdint>
#include <vector>

#include "engine/gguf/gguf_types.h"
#include "engine/kernels/activation_quantization.h"
#include "engine/kernels/integer_dot.h"

namespace kvchat::kernels {

// The types with blocks of 32 values (engine/gguf/gguf_types.cpp documents them), each block an f16 scale
// d first: its bytes, where its 16 bytes of nibbles (or Q8_0's 32 signed quants) start, where its 32 fifth
// bits are (Q5_0/Q5_1), the offset taken off each quant (w = d * (q - offset)) and whether an f16 min m
// follows the scale (w = d * q + m). Their kernels (dot_small_block, integer_dot.h) are templates over these.
template <GgufType kType>
struct SmallBlockLayout;
template <>
struct SmallBlockLayout<GgufType::Q8_0> {
  static constexpr int kBytes = 34, kQuantsAt = 2, kFifthBitsAt = -1, kOffset = 0;
  static constexpr bool kMin = false;
};
template <>
struct SmallBlockLayout<GgufType::Q4_0> {
  static constexpr int kBytes = 18, kQuantsAt = 2, kFifthBitsAt = -1, kOffset = 8;
  static constexpr bool kMin = false;
};
template <>
struct SmallBlockLayout<GgufType::Q4_1> {
  static constexpr int kBytes = 20, kQuantsAt = 4, kFifthBitsAt = -1, kOffset = 0;
  static constexpr bool kMin = true;
};
template <>
struct SmallBlockLayout<GgufType::Q5_0> {
  static constexpr int kBytes = 22, kQuantsAt = 6, kFifthBitsAt = 2, kOffset = 16;
  static constexpr bool kMin = false;
};
template <>
struct SmallBlockLayout<GgufType::Q5_1> {
  static constexpr int kBytes = 24, kQuantsAt = 8, kFifthBitsAt = 4, kOffset = 0;
  static constexpr bool kMin = true;
};

// The types of SmallBlockLayout: each instruction set's file instantiates its dot_small_block for every one.
#define KVCHAT_SMALL_BLOCK_TYPES(X) X(Q8_0) X(Q4_0) X(Q4_1) X(Q5_0) X(Q5_1)

// The instruction sets the kernels are built for.
enum class Isa { Portable, Avx2, Avx512 };
constexpr int kIsaCount = 3;
const char* to_string(Isa isa);
// Whether this processor can run an instruction set's block kernels: AVX2 with FMA and F16C; AVX-512 F, BW
// and VL with VNNI (the integer kernels' vpdpbusd).
bool cpu_runs_block_kernels(Isa isa);

// dot(row, x) in f32 on a row of `cols` values as stored, without decoding it first.
using FloatRowDot = float (*)(const std::uint8_t* row, const float* x, std::int64_t cols);

// One instruction set's kernels for a type.
struct BlockKernels {
  IntegerRowDot dot = nullptr;    // the row against the rounded input (`rounding`)
  IntegerRowDots dots = nullptr;  // several input vectors, each bit-identical to `dot`
  RowDecoder decode = nullptr;    // rows to f32 for the prefill GEMM
};

struct BlockType {
  GgufType type;
  const GgufTypeInfo* format;       // engine/gguf: name, block_size, block_bytes, the exact decoder
  ActivationRounding rounding;      // None: products in f32 (decoded rows, or float_dot)
  FloatRowDot float_dot;            // the f32 product on the stored row (F16), or null
  int scale_at, min_at;             // byte offsets in a block of the f16 scale d and of the min m / dmin, or -1
  double largest_quant;             // the largest |value| a block encodes, in units of d
  BlockKernels kernels[kIsaCount];  // by Isa

  const BlockKernels& on(Isa isa) const { return kernels[static_cast<int>(isa)]; }
};

// The record of `type`, or null for a type the products do not take.
const BlockType* find_block_type(GgufType type);
// Every record.
const std::vector<BlockType>& block_types();

// The instruction set whose block kernels run now: AVX-512 where use_avx512_kernels() (cpu_features.h) and
// the processor has VNNI, else AVX2 where use_avx2_kernels(), else portable.
Isa active_block_isa();

// What a product over weights of `type` runs now. The integer dot is that of the highest instruction set up to
// active_block_isa() that has one, and dots that same set's (a prompt's several-vector results must have the
// one-vector kernel's bits); the row decoder is the highest one there is, down to the exact one.
BlockKernels active_block_kernels(const BlockType& type);

}  // namespace kvchat::kernels
