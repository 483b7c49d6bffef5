// Dequantization without files: exact f16/bf16 widening over every bit pattern, hand-packed blocks of
// the 32-element types (Q4_1, Q5_0 and Q5_1 appear in no fixture), pseudo-random blocks of every
// supported quantized type against checksums of the reference decoder, the type table, and errors.
#include <QCryptographicHash>
#include <QtTest>
#include "common/test_suite.h"

#include <cmath>
#include <cstring>
#include <random>

#include "engine/gguf/dequantize.h"
#include "engine/gguf/gguf_types.h"
#include "engine/model/model_config.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace gguf_test_dequantize {

using namespace kvchat;

namespace {

std::string sha256_hex(const void* data, std::size_t size) {
  const QByteArray bytes(static_cast<const char*>(data), static_cast<qsizetype>(size));
  return QCryptographicHash::hash(bytes, QCryptographicHash::Sha256).toHex().toStdString();
}

// The value of a binary16 / bfloat16 pattern from its definition, computed in double.
double half_value(std::uint32_t bits, int exponent_bits, int mantissa_bits) {
  const int bias = (1 << (exponent_bits - 1)) - 1;
  const std::uint32_t mantissa = bits & ((1u << mantissa_bits) - 1);
  const std::uint32_t exponent = (bits >> mantissa_bits) & ((1u << exponent_bits) - 1);
  const double sign = (bits >> (exponent_bits + mantissa_bits)) ? -1.0 : 1.0;
  if (exponent == 0) return sign * std::ldexp(mantissa, 1 - bias - mantissa_bits);
  return sign * std::ldexp((1u << mantissa_bits) + mantissa, static_cast<int>(exponent) - bias - mantissa_bits);
}

std::uint16_t f16_bits(float value) {  // for the exactly representable values the tests use
  for (std::uint32_t bits = 0; bits < 0x7C00; ++bits)
    if (half_value(bits, 5, 10) == std::fabs(value)) return static_cast<std::uint16_t>(bits | (value < 0 ? 0x8000 : 0));
  throw std::invalid_argument("not an f16 value");
}

// 32 quants in element order packed as the 32-element block formats store them: byte j holds
// element j (low nibble) and element j + 16 (high nibble); bit i of the 4-byte field is element i's
// fifth bit.
void pack_nibbles(const int* q, std::uint8_t* qs) {
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<std::uint8_t>((q[j] & 0x0F) | (q[j + 16] & 0x0F) << 4);
}
void pack_fifth_bits(const int* q, std::uint8_t* qh) {
  std::uint32_t bits = 0;
  for (int i = 0; i < 32; ++i) bits |= static_cast<std::uint32_t>((q[i] >> 4) & 1) << i;
  std::memcpy(qh, &bits, 4);
}

// Pseudo-random blocks of `type` (any bytes, with finite f16 scales at `scale_offsets`). The
// generator is fixed so that the checksums below stay valid.
std::vector<std::uint8_t> random_blocks(GgufType type, int n_blocks, std::initializer_list<int> scale_offsets) {
  std::uint64_t state = 0x9E3779B97F4A7C15ull ^ static_cast<std::uint32_t>(type);
  auto next = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  const std::uint32_t block_bytes = gguf_type_info(type).block_bytes;
  std::vector<std::uint8_t> blocks(static_cast<std::size_t>(block_bytes) * n_blocks);
  for (std::uint8_t& byte : blocks) byte = static_cast<std::uint8_t>(next() & 0xFF);
  for (int b = 0; b < n_blocks; ++b) {
    for (int offset : scale_offsets) {
      const std::uint64_t a = next();
      const std::uint64_t exponent = next() % 30 + 1;
      const std::uint64_t subnormal = next() % 16 == 0;
      auto h = static_cast<std::uint16_t>((a & 0x83FF) | (subnormal ? 0 : exponent << 10));
      std::memcpy(&blocks[static_cast<std::size_t>(b) * block_bytes + offset], &h, 2);
    }
  }
  return blocks;
}

}  // namespace

class DequantizeTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void f16_every_pattern() {
    for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
      const float value = f16_to_f32(static_cast<std::uint16_t>(bits));
      const bool special = ((bits >> 10) & 0x1F) == 0x1F;
      if (special && (bits & 0x3FF)) {
        QVERIFY2(std::isnan(value), qPrintable(QString::number(bits, 16)));
      } else if (special) {
        QVERIFY(std::isinf(value) && std::signbit(value) == bool(bits & 0x8000));
      } else {
        QVERIFY2(static_cast<double>(value) == half_value(bits, 5, 10), qPrintable(QString::number(bits, 16)));
        QCOMPARE(std::signbit(value), bool(bits & 0x8000));  // -0 stays -0
      }
    }
  }

  void bf16_every_pattern() {
    for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
      const float value = bf16_to_f32(static_cast<std::uint16_t>(bits));
      const std::uint32_t widened = bits << 16;
      QVERIFY(std::memcmp(&value, &widened, 4) == 0);  // bf16 is the top half of an f32
      if (((bits >> 7) & 0xFF) != 0xFF) QVERIFY(static_cast<double>(value) == half_value(bits, 8, 7));
    }
  }

  // Hand-packed blocks: every quant value of each format, decoded as d * q (+ m).
  void q4_q5_q8_blocks() {
    const float d = -0.375f;
    const float m = 1.5f;
    int q16[32], q32[32], q8[32];
    for (int i = 0; i < 32; ++i) {
      q16[i] = (i * 7 + 3) % 16;    // every 4-bit value
      q32[i] = (i * 13 + 5) % 32;   // every 5-bit value
      q8[i] = i * 8 - 128 + i % 3;  // spans -128 .. 127
    }
    std::vector<float> out(32);
    auto check = [&](const char* name, auto expected) {
      for (int i = 0; i < 32; ++i)
        QVERIFY2(out[i] == expected(i), qPrintable(QString("%1 element %2: %3").arg(name).arg(i).arg(out[i])));
    };
    std::uint8_t block[40] = {};
    const std::uint16_t d_bits = f16_bits(d), m_bits = f16_bits(m);

    std::memcpy(block, &d_bits, 2);
    pack_nibbles(q16, block + 2);
    dequantize(GgufType::Q4_0, block, 32, out.data());
    check("Q4_0", [&](int i) { return static_cast<float>(q16[i] - 8) * d; });

    std::memcpy(block + 2, &m_bits, 2);
    pack_nibbles(q16, block + 4);
    dequantize(GgufType::Q4_1, block, 32, out.data());
    check("Q4_1", [&](int i) { return static_cast<float>(q16[i]) * d + m; });

    pack_fifth_bits(q32, block + 2);
    pack_nibbles(q32, block + 6);
    dequantize(GgufType::Q5_0, block, 32, out.data());
    check("Q5_0", [&](int i) { return static_cast<float>(q32[i] - 16) * d; });

    std::memcpy(block + 2, &m_bits, 2);
    pack_fifth_bits(q32, block + 4);
    pack_nibbles(q32, block + 8);
    dequantize(GgufType::Q5_1, block, 32, out.data());
    check("Q5_1", [&](int i) { return static_cast<float>(q32[i]) * d + m; });

    for (int i = 0; i < 32; ++i) block[2 + i] = static_cast<std::uint8_t>(static_cast<std::int8_t>(q8[i]));
    dequantize(GgufType::Q8_0, block, 32, out.data());
    check("Q8_0", [&](int i) { return static_cast<float>(q8[i]) * d; });
  }

  // Random block bytes reach every scale, min and quant bit pattern. The sha256 of the f32 output of
  // these exact blocks was recorded from the reference decoder.
  void random_blocks_match_reference_data() {
    QTest::addColumn<int>("type");
    QTest::addColumn<int>("n_blocks");
    QTest::addColumn<QList<int>>("scale_offsets");
    QTest::addColumn<QString>("blocks_sha256");
    QTest::addColumn<QString>("values_sha256");
    auto row = [](const char* name, GgufType type, int n, QList<int> scales, const char* blocks, const char* values) {
      QTest::newRow(name) << static_cast<int>(type) << n << scales << blocks << values;
    };
    row("Q4_0", GgufType::Q4_0, 1024, {0}, "a21c6cbc751866c099c10cf528d5b983cc9b01af9f4d48b19506cf0a8b25c841",
        "80b22ade2c66eea5b14117674445dcce2f1d48818165f43b666963f4e70d7256");
    row("Q4_1", GgufType::Q4_1, 1024, {0, 2}, "672a2ef7d54d1fdbed2c9eef83c56d5bdee3ea888f08699654b2ddf055b09652",
        "cd42612a83a08c3307d895f80ee142e40faa510e01f3def752ca443cd7fa53c5");
    row("Q5_0", GgufType::Q5_0, 1024, {0}, "65c5c3a62b2c75a16d716e5bc2ee2efe90a41ebfcc0912f899257d3f986d2cc9",
        "3796da791a227220ec9e09b69b64d8f784dbfb6ac430482d1d9dae4c1cb4844a");
    row("Q5_1", GgufType::Q5_1, 1024, {0, 2}, "6266738eed59bac285784addadd18a4749f7648bfd46e2ec5c32c83c15b853ed",
        "dfd27814a2e654c3c3420f3a9cc04688ca555b49306a9e171482d9b708971d5b");
    row("Q8_0", GgufType::Q8_0, 1024, {0}, "6f1efa0acd3ee3e4c151f1f404d120293ce0d40129ba6894b61e278e8dceeb99",
        "1282bdf05d83699ce6bf719c3ef694000851614b431410571012a66d9741bb10");
    row("Q4_K", GgufType::Q4_K, 128, {0, 2}, "a396b7f671887f043689eb56d27c8c629c0a99169b656818620db74fb9815b7c",
        "79a4473c925946b8f4943a765509a6cd7538236470f9992fc5c764430e2a15e7");
    row("Q5_K", GgufType::Q5_K, 128, {0, 2}, "20dd84b17471ba028a90942062612c5df268616640fc6cbe208c4bcb0515c340",
        "5f59366ecd45c2b727607cb9644b451056349f63a64901aa3d347dc9c7c8dab9");
    row("Q6_K", GgufType::Q6_K, 128, {208}, "b096a388f669e394930def5b03a85f4719a39d2046867b0ea01b38a9a6e274d3",
        "598ff7436db02781e52189786ff48cde251196147f62d1a9dd256d3fc095abe2");
  }
  void random_blocks_match_reference() {
    QFETCH(int, type);
    QFETCH(int, n_blocks);
    QFETCH(QList<int>, scale_offsets);
    QFETCH(QString, blocks_sha256);
    QFETCH(QString, values_sha256);
    const auto gguf_type = static_cast<GgufType>(type);
    std::vector<std::uint8_t> blocks;
    if (scale_offsets.size() == 1)
      blocks = random_blocks(gguf_type, n_blocks, {scale_offsets[0]});
    else
      blocks = random_blocks(gguf_type, n_blocks, {scale_offsets[0], scale_offsets[1]});
    QCOMPARE(QString::fromStdString(sha256_hex(blocks.data(), blocks.size())), blocks_sha256);  // same input
    const std::int64_t n = static_cast<std::int64_t>(n_blocks) * gguf_type_info(gguf_type).block_size;
    std::vector<float> values(static_cast<std::size_t>(n));
    dequantize(gguf_type, blocks.data(), n, values.data());
    QCOMPARE(QString::fromStdString(sha256_hex(values.data(), values.size() * sizeof(float))), values_sha256);
  }

  // Block geometry of every known type; removed and unknown ids are not types.
  void type_table() {
    const std::pair<GgufType, std::pair<std::uint32_t, std::uint32_t>> expected[] = {
        {GgufType::F32, {1, 4}},        {GgufType::F16, {1, 2}},        {GgufType::BF16, {1, 2}},
        {GgufType::Q4_0, {32, 18}},     {GgufType::Q4_1, {32, 20}},     {GgufType::Q5_0, {32, 22}},
        {GgufType::Q5_1, {32, 24}},     {GgufType::Q8_0, {32, 34}},     {GgufType::Q8_1, {32, 36}},
        {GgufType::Q2_K, {256, 84}},    {GgufType::Q3_K, {256, 110}},   {GgufType::Q4_K, {256, 144}},
        {GgufType::Q5_K, {256, 176}},   {GgufType::Q6_K, {256, 210}},   {GgufType::Q8_K, {256, 292}},
        {GgufType::IQ2_XXS, {256, 66}}, {GgufType::IQ2_XS, {256, 74}},  {GgufType::IQ3_XXS, {256, 98}},
        {GgufType::IQ1_S, {256, 50}},   {GgufType::IQ4_NL, {32, 18}},   {GgufType::IQ3_S, {256, 110}},
        {GgufType::IQ2_S, {256, 82}},   {GgufType::IQ4_XS, {256, 136}}, {GgufType::I8, {1, 1}},
        {GgufType::I16, {1, 2}},        {GgufType::I32, {1, 4}},        {GgufType::I64, {1, 8}},
        {GgufType::F64, {1, 8}},        {GgufType::IQ1_M, {256, 56}},   {GgufType::TQ1_0, {256, 54}},
        {GgufType::TQ2_0, {256, 66}}};
    for (const auto& [type, geometry] : expected) {
      const GgufTypeInfo* info = find_gguf_type(static_cast<std::uint32_t>(type));
      QVERIFY(info && info->type == type);
      QCOMPARE(info->block_size, geometry.first);
      QCOMPARE(info->block_bytes, geometry.second);
    }
    for (std::uint32_t id : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 39u, 1000u}) QVERIFY(!find_gguf_type(id));
    QCOMPARE(QString(to_string(GgufType::Q4_K)), QString("Q4_K"));
    QCOMPARE(QString::fromStdString(dequantizable_gguf_type_names()),
             QString("F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, BF16"));
  }

  void errors() {
    std::vector<std::uint8_t> block(292);
    std::vector<float> out(256);
    try {
      dequantize(GgufType::Q2_K, block.data(), 256, out.data());
      QFAIL("Q2_K dequantized");
    } catch (const ModelError& error) {
      const std::string expected = "cannot dequantize tensor type Q2_K (supported: F32,";
      QVERIFY2(std::string(error.what()).find(expected) != std::string::npos, error.what());
    }
    QVERIFY_THROWS_EXCEPTION(ModelError, dequantize(GgufType::IQ4_XS, block.data(), 256, out.data()));
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, dequantize(GgufType::Q4_0, block.data(), 33, out.data()));
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, dequantize(GgufType::Q6_K, block.data(), 128, out.data()));

    GgufTensor tensor;
    tensor.name = "blk.0.ffn_down.weight";
    tensor.type = GgufType::Q3_K;
    tensor.ne = {256, 1};
    tensor.n_elements = 256;
    tensor.n_bytes = 110;
    tensor.data = block.data();
    try {
      dequantize_tensor(tensor);
      QFAIL("Q3_K dequantized");
    } catch (const ModelError& error) {
      QVERIFY2(std::string(error.what()).find("tensor 'blk.0.ffn_down.weight' has type Q3_K, which cannot be") !=
                   std::string::npos,
               error.what());
    }
  }
};

KVCHAT_TEST_APPLESS_MAIN(DequantizeTest)

}  // namespace gguf_test_dequantize

#include "test_dequantize.moc"
