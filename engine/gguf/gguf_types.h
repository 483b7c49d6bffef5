#pragma once
// Tensor types of GGUF files: the type ids stored in the file, each type's block geometry and name,
// and for the types this library can dequantize, the exact decoder of their blocks. No torch.
#include <cstdint>
#include <string>

namespace kvchat {

// Type ids as stored in a GGUF tensor info. Ids 4, 5 and 31-33, 36-38 belonged to types that were
// removed from the format; a file using them is rejected like any other unknown id.
enum class GgufType : std::uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
};

// The exact f32 values of `count` consecutive blocks of a type, from `blocks` into `out` (count * block_size
// floats): the format's reference decoder's float operations, bit for bit (dequantize.h).
using GgufBlockDecoder = void (*)(const std::uint8_t* blocks, float* out, std::int64_t count);

// Data of a tensor is a sequence of blocks; a row (ne[0] elements) is a whole number of blocks.
// Plain types are blocks of one element.
struct GgufTypeInfo {
  GgufType type;
  const char* name;           // "Q4_K", "F32", ...
  std::uint32_t block_size;   // elements per block
  std::uint32_t block_bytes;  // bytes per block
  GgufBlockDecoder decode;    // null for the types this library cannot decode

  bool dequantizable() const { return decode != nullptr; }  // dequantize() supports it
};

// The type with this id, or nullptr when the id is not a known type.
const GgufTypeInfo* find_gguf_type(std::uint32_t id);
const GgufTypeInfo& gguf_type_info(GgufType type);
const char* to_string(GgufType type);
// "F32, F16, BF16, ..." for error messages.
std::string dequantizable_gguf_type_names();

}  // namespace kvchat
