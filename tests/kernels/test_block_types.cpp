// The block-type table (engine/kernels/block_types.h) walked record by record:
// - its facts agree with the GGUF format: every type engine/gguf decodes has a record and no other, the
//   records' formats are the catalog's, the blocks of 32 have the layouts the catalog's sizes say, and each
//   type's values and bytes per block are what llama.cpp wrote into the fixture files (../shared/fixtures/gguf:
//   consecutive tensors lie exactly that many bytes apart, padded to the file's alignment);
// - every instruction set's kernels the processor runs give the portable kernels' results bit for bit, and
//   the exact integer product: on random blocks whose scales are powers of two with small activation bytes,
//   every f32 operation of every kernel is exact, whatever its order, so any difference is a wrong kernel
//   (or a record pointing at another type's); the several-vector kernels equal their one-vector twins, and the
//   row decoders the exact decoder;
// - a product takes the kernels the settings (cpu_features.h) allow.
#include <QDir>
#include <QtTest>
#include "common/test_suite.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "common/test_paths.h"
#include "engine/gguf/gguf_file.h"
#include "engine/kernels/block_types.h"
#include "engine/kernels/cpu_features.h"
#include "engine/kernels/quantized_matvec.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace kernels_test_block_types {

using namespace kvchat;
using namespace kvchat::kernels;

namespace {

QString type_name(GgufType type) { return QString(to_string(type)); }

// The blocks of 32 against the catalog: a scale d first, m after it where the layout says so, the quants
// (16 bytes of nibbles, Q8_0's 32 signed bytes) ending the block, the fifth bits between.
template <GgufType kType>
void check_small_block_layout() {
  using Layout = SmallBlockLayout<kType>;
  const BlockType* record = find_block_type(kType);
  QVERIFY2(record != nullptr, qPrintable(type_name(kType) + " is in KVCHAT_SMALL_BLOCK_TYPES without a record"));
  const QString what = type_name(kType);
  QCOMPARE(int(record->format->block_size), 32);
  QCOMPARE(Layout::kBytes, int(record->format->block_bytes));
  QCOMPARE(Layout::kQuantsAt + (kType == GgufType::Q8_0 ? 32 : 16), Layout::kBytes);
  QCOMPARE(record->scale_at, 0);
  QCOMPARE(record->min_at, Layout::kMin ? 2 : -1);
  const int header = 2 + (Layout::kMin ? 2 : 0);
  if (Layout::kFifthBitsAt >= 0) {
    QCOMPARE(Layout::kFifthBitsAt, header);
    QCOMPARE(Layout::kQuantsAt, header + 4);
  } else {
    QCOMPARE(Layout::kQuantsAt, header);
  }
  QCOMPARE(record->rounding, ActivationRounding::BlockBytes);
}

// The exact f32 value of 2^exponent as f16 bits (normal range).
std::uint16_t f16_power_of_two(int exponent) { return static_cast<std::uint16_t>((exponent + 15) << 10); }

// Rows of random blocks of `type` whose f16 scale fields (the record's scale_at, min_at) hold 2^-10 or 2^-11.
std::vector<std::uint8_t> random_rows(const BlockType& type, std::int64_t rows, std::int64_t blocks,
                                      std::mt19937& rng) {
  const GgufTypeInfo& format = *type.format;
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(rows * blocks * format.block_bytes));
  for (std::uint8_t& byte : bytes) byte = static_cast<std::uint8_t>(rng());
  for (std::size_t block = 0; block < bytes.size(); block += format.block_bytes)
    for (int field : {type.scale_at, type.min_at}) {
      if (field < 0) continue;
      const std::uint16_t bits = f16_power_of_two(-10 - static_cast<int>(rng() % 2));
      std::memcpy(&bytes[block + static_cast<std::size_t>(field)], &bits, 2);
    }
  return bytes;
}

// One input vector's rounded activations, made up rather than rounded: bytes in [-limit, limit], scales
// 2^-7 or 2^-8 per group, and the byte sums of each 16 and 32.
struct Activations {
  std::vector<std::int8_t> bytes;
  std::vector<float> scales;
  std::vector<std::int16_t> sums16, sums32;
  QuantizedActivations view(ActivationRounding rounding) const {
    const ActivationBytes values{bytes.data(), scales.data(), sums16.data(), sums32.data()};
    QuantizedActivations x;
    (rounding == ActivationRounding::BlockBytes ? x.blocks : x.super_blocks) = values;
    return x;
  }
};

// The rounded activations with these bytes: scales 2^-7 or 2^-8 per group, the byte sums of each 16 and 32.
Activations activations_from_bytes(std::vector<std::int8_t> bytes, std::int64_t group, std::mt19937& rng) {
  Activations a;
  a.bytes = std::move(bytes);
  const auto cols = static_cast<std::int64_t>(a.bytes.size());
  for (std::int64_t g = 0; g < cols / group; ++g) a.scales.push_back(std::ldexp(1.f, -7 - static_cast<int>(rng() % 2)));
  for (std::int64_t i = 0; i < cols; i += 16) {
    int sum = 0;
    for (int j = 0; j < 16; ++j) sum += a.bytes[static_cast<std::size_t>(i + j)];
    a.sums16.push_back(static_cast<std::int16_t>(sum));
  }
  for (std::size_t i = 0; i < a.sums16.size(); i += 2)
    a.sums32.push_back(static_cast<std::int16_t>(a.sums16[i] + a.sums16[i + 1]));
  return a;
}

Activations random_activations(std::int64_t cols, std::int64_t group, int limit, std::mt19937& rng) {
  std::vector<std::int8_t> bytes;
  for (std::int64_t i = 0; i < cols; ++i)
    bytes.push_back(static_cast<std::int8_t>(static_cast<int>(rng() % (2 * limit + 1)) - limit));
  return activations_from_bytes(std::move(bytes), group, rng);
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }
QString number(double value) { return QString::number(value, 'g', 17); }

}  // namespace

class BlockTypesTest : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void cleanup() {
    set_avx2_kernels_enabled(true);
    set_avx512_kernels_enabled(true);
  }
  void records_agree_with_the_catalog();
  void small_block_layouts_agree_with_the_catalog();
  void block_sizes_agree_with_the_fixture_files();
  void isa_kernels_equal_the_portable_ones_data();
  void isa_kernels_equal_the_portable_ones();
  void k_quant_sums_at_their_largest_stay_exact();
  void products_take_the_kernels_the_settings_allow();
};

// One record for each type engine/gguf decodes, and none for another; each record's facts consistent.
void BlockTypesTest::records_agree_with_the_catalog() {
  QVERIFY(!block_types().empty());
  for (std::uint32_t id = 0; id < 256; ++id) {
    const GgufTypeInfo* info = find_gguf_type(id);
    const BlockType* record = info ? find_block_type(info->type) : nullptr;
    if (!info) continue;
    QVERIFY2(
        (record != nullptr) == info->dequantizable(),
        qPrintable(
            QString("%1: decodable %2, record %3").arg(info->name).arg(info->dequantizable()).arg(record != nullptr)));
  }
  std::set<GgufType> seen;
  for (const BlockType& record : block_types()) {
    const QString what = type_name(record.type);
    QVERIFY2(seen.insert(record.type).second, qPrintable(what + " has two records"));
    QCOMPARE(find_block_type(record.type), &record);
    QCOMPARE(record.format, &gguf_type_info(record.type));
    QVERIFY2(record.kernels[int(Isa::Portable)].decode == record.format->decode,
             qPrintable(what + ": the portable decoder is not the exact one"));
    QCOMPARE(activation_rounding(record.type), record.rounding);
    const bool integer = record.rounding != ActivationRounding::None;
    if (integer) {
      // The input is rounded per weight block: a group of 32 values, or a super-block of 256.
      QCOMPARE(activation_group(record.rounding), std::int64_t{record.format->block_size});
      QVERIFY2(record.on(Isa::Portable).dot != nullptr, qPrintable(what + ": no portable integer dot"));
      QVERIFY2(record.float_dot == nullptr, qPrintable(what));
      QVERIFY2(record.scale_at >= 0, qPrintable(what + ": no scale"));
    }
    for (int isa = 0; isa < kIsaCount; ++isa) {
      const BlockKernels& kernels = record.kernels[isa];
      QVERIFY2(!kernels.dot || integer, qPrintable(what + ": an integer dot without a rounding"));
      QVERIFY2(!kernels.dots || kernels.dot, qPrintable(what + ": dots without dot"));
    }
    for (int field : {record.scale_at, record.min_at})
      QVERIFY2(field >= -1 && field + 2 <= int(record.format->block_bytes),
               qPrintable(what + ": a scale outside the block"));
    QVERIFY2(record.min_at < 0 || record.min_at != record.scale_at, qPrintable(what));
    QVERIFY2(record.largest_quant >= 1, qPrintable(what));
  }
  QCOMPARE(find_block_type(GgufType::Q2_K), nullptr);
  QCOMPARE(find_block_type(GgufType::IQ4_NL), nullptr);
  QVERIFY(integer_row_dot(GgufType::Q3_K) == nullptr);
  QCOMPARE(activation_rounding(GgufType::Q8_K), ActivationRounding::None);
}

void BlockTypesTest::small_block_layouts_agree_with_the_catalog() {
#define KVCHAT_CHECK_LAYOUT(type) check_small_block_layout<GgufType::type>();
  KVCHAT_SMALL_BLOCK_TYPES(KVCHAT_CHECK_LAYOUT)
#undef KVCHAT_CHECK_LAYOUT
}

// llama.cpp writes a file's tensors one after another, each padded to the alignment: the distance from one
// to the next is its values / values per block * bytes per block, padded.
void BlockTypesTest::block_sizes_agree_with_the_fixture_files() {
  const QDir fixtures(QString::fromStdString(test::shared_path("fixtures/gguf")));
  const QStringList files = fixtures.entryList({"*.gguf"}, QDir::Files, QDir::Name);
  if (files.isEmpty()) QSKIP(qPrintable("no GGUF fixtures in " + fixtures.path()));
  std::map<GgufType, int> checked;
  for (const QString& file : files) {
    // The reader checks that every tensor fits in the file by the catalog's sizes.
    std::unique_ptr<GgufFile> opened;
    try {
      opened = std::make_unique<GgufFile>(fixtures.filePath(file).toStdString());
    } catch (const std::exception& error) {
      QFAIL(qPrintable(file + ": " + error.what()));
    }
    const GgufFile& gguf = *opened;
    std::vector<const GgufTensor*> tensors;
    for (const GgufTensor& tensor : gguf.tensors()) tensors.push_back(&tensor);
    std::sort(tensors.begin(), tensors.end(),
              [](const GgufTensor* a, const GgufTensor* b) { return a->offset < b->offset; });
    const std::uint64_t alignment = gguf.alignment(), data_bytes = gguf.file_size() - gguf.data_offset();
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      const GgufTensor& tensor = *tensors[i];
      const BlockType* record = find_block_type(tensor.type);
      if (!record) continue;
      const std::uint64_t bytes =
          static_cast<std::uint64_t>(tensor.n_elements) / record->format->block_size * record->format->block_bytes;
      const std::uint64_t padded = (bytes + alignment - 1) / alignment * alignment;
      const std::uint64_t room = (i + 1 < tensors.size() ? tensors[i + 1]->offset : data_bytes) - tensor.offset;
      const bool fits = i + 1 < tensors.size() ? room == padded : room >= bytes && room <= padded;
      QVERIFY2(fits, qPrintable(QString("%1, %2 (%3, %4 values): %5 bytes to the next, %6 by the table")
                                    .arg(file, QString::fromStdString(tensor.name), type_name(tensor.type))
                                    .arg(tensor.n_elements)
                                    .arg(room)
                                    .arg(bytes)));
      ++checked[tensor.type];
    }
  }
  // The fixtures hold these types; the other blocks of 32 are checked against their layouts above.
  for (GgufType type : {GgufType::F32, GgufType::F16, GgufType::BF16, GgufType::Q8_0, GgufType::Q4_0, GgufType::Q4_K,
                        GgufType::Q5_K, GgufType::Q6_K})
    QVERIFY2(checked[type] > 0, qPrintable("no fixture tensor of type " + type_name(type)));
}

void BlockTypesTest::isa_kernels_equal_the_portable_ones_data() {
  QTest::addColumn<int>("type");
  QTest::addColumn<int>("isa");
  for (const BlockType& record : block_types())
    for (Isa isa : {Isa::Avx2, Isa::Avx512}) {
      const BlockKernels& kernels = record.on(isa);
      if (kernels.dot || kernels.dots || kernels.decode)
        QTest::newRow(qPrintable(type_name(record.type) + " " + to_string(isa))) << int(record.type) << int(isa);
    }
}

void BlockTypesTest::isa_kernels_equal_the_portable_ones() {
  QFETCH(int, type);
  QFETCH(int, isa);
  if (!cpu_runs_block_kernels(Isa(isa)))
    QSKIP(qPrintable(QString("this processor does not run the %1 kernels").arg(to_string(Isa(isa)))));
  const BlockType& record = *find_block_type(GgufType(type));
  const BlockKernels& portable = record.on(Isa::Portable);
  const BlockKernels& kernels = record.on(Isa(isa));
  const GgufTypeInfo& format = *record.format;
  std::mt19937 rng(static_cast<unsigned>(type * 7 + isa));
  // Blocks of 32: 19 per row (two groups of eight and three left over, as the kernels take them); K-quants:
  // two super-blocks; single values: 83 (groups of 64 and 8, and the rest one by one).
  const std::int64_t blocks = format.block_size == 32 ? 19 : format.block_size == 256 ? 2 : 83, rows = 3;
  const std::int64_t cols = blocks * format.block_size, row_bytes = blocks * format.block_bytes;
  const std::vector<std::uint8_t> weights = random_rows(record, rows, blocks, rng);

  // The row decoder: the exact decoder's values (with scales that are powers of two, a K-quant's fused
  // d*sc*q - dmin*m is exact too).
  if (kernels.decode) {
    std::vector<float> got(static_cast<std::size_t>(rows * cols)), expected(got.size());
    kernels.decode(weights.data(), got.data(), rows * blocks);
    portable.decode(weights.data(), expected.data(), rows * blocks);
    for (std::size_t i = 0; i < got.size(); ++i)
      QVERIFY2(same_bits(got[i], expected[i]),
               qPrintable(QString("decoded value %1: %2, exact %3").arg(i).arg(number(got[i]), number(expected[i]))));
  }
  if (!kernels.dot) return;

  const std::int64_t group = activation_group(record.rounding);
  const int limit = record.rounding == ActivationRounding::BlockBytes ? 8 : 3;
  std::vector<Activations> inputs;
  std::vector<QuantizedActivations> views;
  // Enough vectors for every kernel's groups of every width, and for two or three groups.
  constexpr int kVectors = 11;
  for (int v = 0; v < kVectors; ++v) inputs.push_back(random_activations(cols, group, limit, rng));
  for (const Activations& input : inputs) views.push_back(input.view(record.rounding));
  std::vector<float> row(static_cast<std::size_t>(cols));
  float isa_results[rows][kVectors];
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::uint8_t* weight_row = weights.data() + r * row_bytes;
    format.decode(weight_row, row.data(), blocks);
    for (int v = 0; v < kVectors; ++v) {
      // The exact product, in units of the smallest step it is made of (2^-11 * 2^-8): every partial sum
      // of every kernel is a whole number of them below 2^24, so every f32 step is exact.
      double exact = 0.0, magnitude = 0.0;
      for (std::int64_t c = 0; c < cols; ++c) {
        const auto k = static_cast<std::size_t>(c);
        const double activation = double(inputs[v].scales[k / static_cast<std::size_t>(group)]) * inputs[v].bytes[k];
        exact += double(row[k]) * activation;
        magnitude += std::fabs(double(row[k]) * activation);
      }
      QVERIFY2(magnitude < std::ldexp(1.0, 24 - 11 - 8),
               "the product is too large for exact f32 sums: are the scales where scale_at / min_at say?");
      const float expected = portable.dot(weight_row, views[static_cast<std::size_t>(v)], blocks);
      QVERIFY2(
          double(expected) == exact,
          qPrintable(
              QString("row %1 vector %2: portable %3, exact %4").arg(r).arg(v).arg(number(expected), number(exact))));
      isa_results[r][v] = kernels.dot(weight_row, views[static_cast<std::size_t>(v)], blocks);
      QVERIFY2(same_bits(isa_results[r][v], expected),
               qPrintable(QString("row %1 vector %2: %3 %4, portable %5")
                              .arg(r)
                              .arg(v)
                              .arg(to_string(Isa(isa)), number(isa_results[r][v]), number(expected))));
    }
  }
  // The several-vector kernel over a tile of all the rows, each result where the tile says, plus its bias.
  if (kernels.dots) {
    const float bias[rows] = {0.5f, -0.25f, 0.125f};
    for (int count = 1; count <= kVectors; ++count) {
      float several[kVectors][rows];
      kernels.dots(RowTile{weights.data(), row_bytes, rows, &several[0][0], rows, bias}, views.data(), blocks, count);
      for (int v = 0; v < count; ++v)
        for (std::int64_t r = 0; r < rows; ++r)
          QVERIFY2(same_bits(several[v][r], isa_results[r][v] + bias[r]),
                   qPrintable(QString("row %1, %2 vectors, vector %3: dots %4, dot %5 + bias")
                                  .arg(r)
                                  .arg(count)
                                  .arg(v)
                                  .arg(number(several[v][r]), number(isa_results[r][v]))));
    }
  }
}

// The K-quant kernels add their integer products in 16-bit words (vpmaddubsw, or vpdpbusd sums packed to words)
// and 32-bit lanes: at the largest quants and sub-block scales against activation bytes of +-127 no word may
// saturate. One super-block whose every quant is
// the type's largest and every sub-block scale 63 (mins 0), d = 2^-10: every kernel, one vector or several,
// gives the exact d * x_scale * 63 * 256 * q * 127 (a whole number of f32 steps below 2^24).
void BlockTypesTest::k_quant_sums_at_their_largest_stay_exact() {
  std::mt19937 rng(5);
  int checked = 0;
  for (GgufType type : {GgufType::Q4_K, GgufType::Q5_K}) {
    const BlockType& record = *find_block_type(type);
    std::vector<std::uint8_t> block(record.format->block_bytes, 0xFF);  // every nibble and fifth bit set
    const std::uint16_t d = f16_power_of_two(-10);
    std::memcpy(block.data(), &d, 2);
    block[2] = block[3] = 0;  // dmin 0
    // Scales 0-3 and their mins' high bits, mins 0-3, then the low nibbles of scales and mins 4-7.
    for (int j = 0; j < 4; ++j) {
      block[4 + j] = 0xFF;
      block[8 + j] = 0x00;
      block[12 + j] = 0x0F;
    }
    const double largest_quant = type == GgufType::Q4_K ? 15 : 31;
    for (int sign : {1, -1}) {
      std::vector<Activations> inputs;
      std::vector<QuantizedActivations> views;
      constexpr int kVectors = 11;
      for (int v = 0; v < kVectors; ++v)
        inputs.push_back(activations_from_bytes(std::vector<std::int8_t>(256, static_cast<std::int8_t>(sign * 127)),
                                                kActivationSuperBlock, rng));
      for (const Activations& input : inputs) views.push_back(input.view(ActivationRounding::SuperBlockBytes));
      for (Isa isa : {Isa::Portable, Isa::Avx2, Isa::Avx512}) {
        const BlockKernels& kernels = record.on(isa);
        if (!kernels.dot || !cpu_runs_block_kernels(isa)) continue;
        for (int count = 1; count <= kVectors; ++count) {
          float several[kVectors];
          if (kernels.dots)
            kernels.dots(RowTile{block.data(), std::int64_t(block.size()), 1, several, 1, nullptr}, views.data(), 1,
                         count);
          for (int v = 0; v < count; ++v) {
            const double expected =
                std::ldexp(1.0, -10) * inputs[std::size_t(v)].scales[0] * 63 * 256 * largest_quant * 127 * sign;
            const float one = kernels.dot(block.data(), views[std::size_t(v)], 1);
            QVERIFY2(double(one) == expected,
                     qPrintable(QString("%1 %2: %3, exact %4")
                                    .arg(type_name(type), to_string(isa), number(one), number(expected))));
            if (kernels.dots)
              QVERIFY2(double(several[v]) == expected, qPrintable(QString("%1 %2, %3 vectors: %4, exact %5")
                                                                      .arg(type_name(type), to_string(isa))
                                                                      .arg(count)
                                                                      .arg(number(several[v]), number(expected))));
            ++checked;
          }
        }
      }
    }
  }
  QVERIFY(checked > 0);
}

// active_block_kernels follows use_avx2_kernels() / use_avx512_kernels(): the portable kernels when they are
// off, the highest set the processor runs and has a kernel for when they are on; the exact decoder where no
// set has one of its own.
void BlockTypesTest::products_take_the_kernels_the_settings_allow() {
  set_avx2_kernels_enabled(false);
  QCOMPARE(active_block_isa(), Isa::Portable);
  for (const BlockType& record : block_types()) {
    const BlockKernels active = active_block_kernels(record);
    const QString what = type_name(record.type);
    QVERIFY2(active.dot == record.on(Isa::Portable).dot, qPrintable(what));
    QVERIFY2(active.dots == record.on(Isa::Portable).dots, qPrintable(what));
    QVERIFY2(active.decode == record.format->decode, qPrintable(what));
    QVERIFY2(integer_row_dot(record.type) == active.dot, qPrintable(what));
  }
  if (!cpu_runs_block_kernels(Isa::Avx2)) QSKIP("no AVX2 on this processor: the portable kernels only");
  set_avx2_kernels_enabled(true);
  set_avx512_kernels_enabled(false);
  QCOMPARE(active_block_isa(), Isa::Avx2);
  for (const BlockType& record : block_types()) {
    const BlockKernels active = active_block_kernels(record);
    const BlockKernels& avx2 = record.on(Isa::Avx2);
    const QString what = type_name(record.type);
    QVERIFY2(active.dot == (avx2.dot ? avx2.dot : record.on(Isa::Portable).dot), qPrintable(what));
    QVERIFY2(active.dots == (avx2.dot ? avx2.dots : record.on(Isa::Portable).dots), qPrintable(what));
    QVERIFY2(active.decode == (avx2.decode ? avx2.decode : record.format->decode), qPrintable(what));
    QVERIFY2(integer_row_dots(record.type) == active.dots, qPrintable(what));
  }
  set_avx512_kernels_enabled(true);
  QCOMPARE(active_block_isa(), cpu_runs_block_kernels(Isa::Avx512) ? Isa::Avx512 : Isa::Avx2);
}

KVCHAT_TEST_GUILESS_MAIN(BlockTypesTest)

}  // namespace kernels_test_block_types

#include "test_block_types.moc"
