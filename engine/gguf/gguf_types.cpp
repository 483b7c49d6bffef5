#include "engine/gguf/gguf_types.h"

#include <stdexcept>

namespace kvchat {

namespace {

constexpr std::uint32_t kSuperBlock = 256;  // elements in a K-quant / IQ super-block

// Block sizes in bytes follow each type's block layout (see the comments in dequantize.cpp for the
// layouts this library decodes).
constexpr GgufTypeInfo kTypes[] = {
    {GgufType::F32, "F32", 1, 4, true},
    {GgufType::F16, "F16", 1, 2, true},
    {GgufType::Q4_0, "Q4_0", 32, 2 + 16, true},
    {GgufType::Q4_1, "Q4_1", 32, 2 + 2 + 16, true},
    {GgufType::Q5_0, "Q5_0", 32, 2 + 4 + 16, true},
    {GgufType::Q5_1, "Q5_1", 32, 2 + 2 + 4 + 16, true},
    {GgufType::Q8_0, "Q8_0", 32, 2 + 32, true},
    {GgufType::Q8_1, "Q8_1", 32, 2 + 2 + 32, false},
    {GgufType::Q2_K, "Q2_K", kSuperBlock, 16 + 64 + 2 + 2, false},
    {GgufType::Q3_K, "Q3_K", kSuperBlock, 32 + 64 + 12 + 2, false},
    {GgufType::Q4_K, "Q4_K", kSuperBlock, 2 + 2 + 12 + 128, true},
    {GgufType::Q5_K, "Q5_K", kSuperBlock, 2 + 2 + 12 + 32 + 128, true},
    {GgufType::Q6_K, "Q6_K", kSuperBlock, 128 + 64 + 16 + 2, true},
    {GgufType::Q8_K, "Q8_K", kSuperBlock, 4 + 256 + 16 * 2, false},
    {GgufType::IQ2_XXS, "IQ2_XXS", kSuperBlock, 2 + 64, false},
    {GgufType::IQ2_XS, "IQ2_XS", kSuperBlock, 2 + 64 + 8, false},
    {GgufType::IQ3_XXS, "IQ3_XXS", kSuperBlock, 2 + 96, false},
    {GgufType::IQ1_S, "IQ1_S", kSuperBlock, 2 + 32 + 16, false},
    {GgufType::IQ4_NL, "IQ4_NL", 32, 2 + 16, false},
    {GgufType::IQ3_S, "IQ3_S", kSuperBlock, 2 + 64 + 8 + 32 + 4, false},
    {GgufType::IQ2_S, "IQ2_S", kSuperBlock, 2 + 64 + 16, false},
    {GgufType::IQ4_XS, "IQ4_XS", kSuperBlock, 2 + 2 + 4 + 128, false},
    {GgufType::I8, "I8", 1, 1, false},
    {GgufType::I16, "I16", 1, 2, false},
    {GgufType::I32, "I32", 1, 4, false},
    {GgufType::I64, "I64", 1, 8, false},
    {GgufType::F64, "F64", 1, 8, false},
    {GgufType::IQ1_M, "IQ1_M", kSuperBlock, 32 + 16 + 8, false},
    {GgufType::BF16, "BF16", 1, 2, true},
    {GgufType::TQ1_0, "TQ1_0", kSuperBlock, 48 + 4 + 2, false},
    {GgufType::TQ2_0, "TQ2_0", kSuperBlock, 64 + 2, false},
};

}  // namespace

const GgufTypeInfo* find_gguf_type(std::uint32_t id) {
  for (const GgufTypeInfo& info : kTypes)
    if (static_cast<std::uint32_t>(info.type) == id) return &info;
  return nullptr;
}

const GgufTypeInfo& gguf_type_info(GgufType type) {
  const GgufTypeInfo* info = find_gguf_type(static_cast<std::uint32_t>(type));
  if (!info)
    throw std::invalid_argument("unknown GGUF tensor type id " + std::to_string(static_cast<std::uint32_t>(type)));
  return *info;
}

const char* to_string(GgufType type) {
  const GgufTypeInfo* info = find_gguf_type(static_cast<std::uint32_t>(type));
  return info ? info->name : "unknown";
}

std::string dequantizable_gguf_type_names() {
  std::string names;
  for (const GgufTypeInfo& info : kTypes) {
    if (!info.dequantizable) continue;
    if (!names.empty()) names += ", ";
    names += info.name;
  }
  return names;
}

}  // namespace kvchat
