#include "engine/kernels/block_types.h"

#include <array>
#include <stdexcept>
#include <string>

#include "engine/kernels/cpu_features.h"
#include "engine/kernels/matvec.h"
#include "engine/kernels/quantized_matvec.h"

namespace kvchat::kernels {
namespace {

// The instruction-set kernels exist in x86-64 builds only (cpu_features.h).
#if KVCHAT_HAVE_AVX2_KERNELS
#define KVCHAT_X86_KERNEL(kernel) kernel
#else
#define KVCHAT_X86_KERNEL(kernel) nullptr
#endif

float f16_row_dot(const std::uint8_t* row, const float* x, std::int64_t cols) {
  return dot_f16(reinterpret_cast<const std::uint16_t*>(row), x, cols);
}

// A type with blocks of 32 (SmallBlockLayout): the same kernel templates on every instruction set, d at the
// start of a block and m after it where the layout has one.
template <GgufType kType>
constexpr BlockType small_block_type(double largest_quant, RowDecoder avx2_decode = nullptr,
                                     IntegerRowDots avx2_dots = nullptr, IntegerRowDots avx512_dots = nullptr) {
  return {kType,
          nullptr,
          ActivationRounding::BlockBytes,
          nullptr,
          0,
          SmallBlockLayout<kType>::kMin ? 2 : -1,
          largest_quant,
          {{portable::dot_small_block<kType>, nullptr, nullptr},
           {KVCHAT_X86_KERNEL(avx2::dot_small_block<kType>), avx2_dots, avx2_decode},
           {KVCHAT_X86_KERNEL(avx512::dot_small_block<kType>), avx512_dots, nullptr}}};
}

// The table. The format comes from engine/gguf's catalog when the table is first used; the exact decoder
// is then also the portable row decoder.
constexpr BlockType kBlockTypes[] = {
    // Products in f32: F32 and BF16 rows decoded exactly, F16 rows multiplied as they are.
    {GgufType::F32, nullptr, ActivationRounding::None, nullptr, -1, -1, 1, {}},
    {GgufType::F16,
     nullptr,
     ActivationRounding::None,
     f16_row_dot,
     0,
     -1,
     1,
     {{}, {nullptr, nullptr, KVCHAT_X86_KERNEL(avx2::decode_f16)}, {}}},
    {GgufType::BF16, nullptr, ActivationRounding::None, nullptr, -1, -1, 1, {}},
    // Blocks of 32 against one byte per input value with a scale per block.
    small_block_type<GgufType::Q8_0>(127, KVCHAT_X86_KERNEL(avx2::decode_q8_0),
                                     KVCHAT_X86_KERNEL(avx2::dots_small_block_q8_0),
                                     KVCHAT_X86_KERNEL(avx512::dots_small_block_q8_0)),
    small_block_type<GgufType::Q4_0>(8, KVCHAT_X86_KERNEL(avx2::decode_q4_0)),
    small_block_type<GgufType::Q4_1>(15),
    small_block_type<GgufType::Q5_0>(16),
    small_block_type<GgufType::Q5_1>(31),
    // Super-blocks of 256 against one byte per input value with a scale per super-block: Q4_K and Q5_K keep
    // f16 d and dmin first, Q6_K its d last; their sub-block scales reach 63 (Q6_K's signed ones 127).
    {GgufType::Q4_K,
     nullptr,
     ActivationRounding::SuperBlockBytes,
     nullptr,
     0,
     2,
     63.0 * 15,
     {{portable::dot_q4_k, nullptr, nullptr},
      {KVCHAT_X86_KERNEL(avx2::dot_q4_k), KVCHAT_X86_KERNEL(avx2::dots_q4_k), KVCHAT_X86_KERNEL(avx2::decode_q4_k)},
      {KVCHAT_X86_KERNEL(avx512::dot_q4_k), KVCHAT_X86_KERNEL(avx512::dots_q4_k), nullptr}}},
    {GgufType::Q5_K,
     nullptr,
     ActivationRounding::SuperBlockBytes,
     nullptr,
     0,
     2,
     63.0 * 31,
     {{portable::dot_q5_k, nullptr, nullptr},
      {KVCHAT_X86_KERNEL(avx2::dot_q5_k), KVCHAT_X86_KERNEL(avx2::dots_q5_k), KVCHAT_X86_KERNEL(avx2::decode_q5_k)},
      {KVCHAT_X86_KERNEL(avx512::dot_q5_k), KVCHAT_X86_KERNEL(avx512::dots_q5_k), nullptr}}},
    {GgufType::Q6_K,
     nullptr,
     ActivationRounding::SuperBlockBytes,
     nullptr,
     208,
     -1,
     127.0 * 32,
     {{portable::dot_q6_k, nullptr, nullptr},
      {KVCHAT_X86_KERNEL(avx2::dot_q6_k), KVCHAT_X86_KERNEL(avx2::dots_q6_k), KVCHAT_X86_KERNEL(avx2::decode_q6_k)},
      {KVCHAT_X86_KERNEL(avx512::dot_q6_k), KVCHAT_X86_KERNEL(avx512::dots_q6_k), nullptr}}},
};

// Type ids are small (gguf_types.h): the records are found by id.
constexpr std::size_t kTypeIds = 64;

struct Table {
  std::vector<BlockType> records;
  std::array<const BlockType*, kTypeIds> by_id{};
};

Table make_table() {
  Table table;
  table.records.assign(std::begin(kBlockTypes), std::end(kBlockTypes));
  for (BlockType& record : table.records) {
    const auto id = static_cast<std::size_t>(record.type);
    record.format = &gguf_type_info(record.type);
    // A matrix of any of these types can also be decoded exactly: the portable decoder, and the plain path's.
    if (record.format->decode == nullptr || id >= kTypeIds || table.by_id[id] != nullptr)
      throw std::logic_error(std::string("block-type table: bad record for ") + record.format->name);
    if (record.kernels[0].decode == nullptr) record.kernels[0].decode = record.format->decode;
    table.by_id[id] = &record;
  }
  return table;
}

const Table& table() {
  static const Table instance = make_table();
  return instance;
}

}  // namespace

const char* to_string(Isa isa) {
  switch (isa) {
    case Isa::Portable: return "portable";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
  }
  return "unknown";
}

bool cpu_runs_block_kernels(Isa isa) {
  switch (isa) {
    case Isa::Portable: return true;
    case Isa::Avx2: return cpu_has_avx2_fma();
    case Isa::Avx512: return cpu_has_avx512_vnni();
  }
  return false;
}

const BlockType* find_block_type(GgufType type) {
  const auto id = static_cast<std::size_t>(type);
  return id < kTypeIds ? table().by_id[id] : nullptr;
}

const std::vector<BlockType>& block_types() { return table().records; }

Isa active_block_isa() {
  if (use_avx512_kernels() && cpu_has_avx512_vnni()) return Isa::Avx512;
  if (use_avx2_kernels()) return Isa::Avx2;
  return Isa::Portable;
}

BlockKernels active_block_kernels(const BlockType& type) {
  BlockKernels chosen;
  for (int isa = static_cast<int>(active_block_isa()); isa >= 0; --isa) {
    const BlockKernels& kernels = type.kernels[isa];
    if (!chosen.dot && kernels.dot) {
      chosen.dot = kernels.dot;
      chosen.dots = kernels.dots;
    }
    if (!chosen.decode) chosen.decode = kernels.decode;
  }
  return chosen;
}

IntegerRowDot integer_row_dot(GgufType type) {
  const BlockType* record = find_block_type(type);
  return record ? active_block_kernels(*record).dot : nullptr;
}

IntegerRowDots integer_row_dots(GgufType type) {
  const BlockType* record = find_block_type(type);
  return record ? active_block_kernels(*record).dots : nullptr;
}

}  // namespace kvchat::kernels
