// Corrupt, truncated and hostile GGUF files, built from a real fixture: each must be refused with its
// specific error (naming the file), under a 2 GiB address-space limit, without crashing or hanging.
#include <sys/resource.h>
#include <sys/stat.h>
#include <QTemporaryDir>
#include <QtTest>
#include "common/test_suite.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <random>

#include "common/address_space_limit.h"
#include "common/test_paths.h"
#include "engine/gguf/dequantize.h"
#include "engine/gguf/gguf_file.h"
#include "engine/model/model_config.h"
#include "gguf_builder.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace gguf_test_gguf_hostile {

using namespace kvchat;
using namespace kvchat::test;

namespace {

constexpr std::uint64_t kAddressSpaceLimit = 2ull << 30;
constexpr const char* kFixture = "fixtures/gguf/stories260K-Q8_0.gguf";

// One corruption: what it breaks, how, and a distinctive piece of the expected message.
struct Corruption {
  const char* name;
  std::function<void(GgufPieces&)> apply;
  const char* expected;
};

template <typename T>
void patch(std::string& bytes, std::size_t offset, T value) {
  std::memcpy(&bytes[offset], &value, sizeof(T));
}

void set_version(GgufPieces& p, std::uint32_t version) { patch(p.magic_and_version, 4, version); }

// Patches a u64 `after` bytes past the value type field of metadata `key`.
void patch_metadata_u64(GgufPieces& p, const std::string& key, std::size_t after, std::uint64_t value) {
  const std::size_t i = p.metadata_index(key);
  patch(p.metadata[i], p.value_type_offset(i) + after, value);
}

// An array nested `depth` deep whose innermost array holds one uint8.
std::string nested_array_entry(const std::string& key, int depth) {
  std::string value;
  append_le<std::uint32_t>(value, 0);  // innermost: uint8 elements
  append_le<std::uint64_t>(value, 1);
  value += '\x07';
  for (int level = 1; level < depth; ++level) {
    std::string outer;
    append_le<std::uint32_t>(outer, 9);  // array of arrays
    append_le<std::uint64_t>(outer, 1);
    value = outer + value;
  }
  std::string entry = gguf_string(key);
  append_le<std::uint32_t>(entry, 9);
  return entry + value;
}

const std::vector<Corruption>& corruptions() {
  static const std::vector<Corruption> cases = {
      {"magic", [](GgufPieces& p) { p.magic_and_version[3] = 'X'; }, "not a GGUF file"},
      {"version 1", [](GgufPieces& p) { set_version(p, 1); }, "GGUF version 1 is not supported"},
      {"version 4", [](GgufPieces& p) { set_version(p, 4); }, "unsupported GGUF version 4"},
      {"big-endian version", [](GgufPieces& p) { set_version(p, 0x03000000u); }, "big-endian"},
      {"huge tensor count", [](GgufPieces& p) { p.tensor_count = 1ull << 60; },
       "tensor count 1152921504606846976 cannot fit"},
      {"huge metadata count", [](GgufPieces& p) { p.metadata_count = 1ull << 60; },
       "metadata count 1152921504606846976 cannot fit"},
      {"key length past the end", [](GgufPieces& p) { patch<std::uint64_t>(p.metadata[0], 0, 1ull << 40); },
       "key of 1099511627776 bytes runs past the end of the file"},
      {"string value past the end", [](GgufPieces& p) { patch_metadata_u64(p, "general.name", 4, 1ull << 40); },
       "string value of 1099511627776 bytes runs past the end of the file"},
      {"array length 2^62", [](GgufPieces& p) { patch_metadata_u64(p, "tokenizer.ggml.scores", 8, 1ull << 62); },
       "array length 4611686018427387904 of float32 cannot fit"},
      {"string array length 2^62", [](GgufPieces& p) { patch_metadata_u64(p, "tokenizer.ggml.tokens", 8, 1ull << 62); },
       "array length 4611686018427387904 of string cannot fit"},
      {"unknown value type", [](GgufPieces& p) { patch<std::uint32_t>(p.metadata[1], p.value_type_offset(1), 13); },
       "metadata 'general.name' at offset"},
      {"unknown array element type",
       [](GgufPieces& p) {
         const std::size_t i = p.metadata_index("tokenizer.ggml.tokens");
         patch<std::uint32_t>(p.metadata[i], p.value_type_offset(i) + 4, 0xFFFFFFFFu);
       },
       "unknown array element type 4294967295"},
      {"arrays nested too deep", [](GgufPieces& p) { p.metadata.push_back(nested_array_entry("test.deep", 10)); },
       "arrays nested more than 8 deep"},
      {"unknown tensor type", [](GgufPieces& p) { p.tensors[0].type = 99; }, "unknown tensor type id 99"},
      {"removed tensor type", [](GgufPieces& p) { p.tensors[0].type = 4; }, "unknown tensor type id 4"},
      {"5 dims",
       [](GgufPieces& p) {
         p.tensors[0].dims = {64, 512, 1, 1, 1};
       },
       "has 5 dimensions (1 to 4 allowed)"},
      {"0 dims", [](GgufPieces& p) { p.tensors[0].dims.clear(); }, "has 0 dimensions"},
      {"zero dim", [](GgufPieces& p) { p.tensors[0].dims[1] = 0; }, "dimension 1 is 0"},
      {"dim beyond int64", [](GgufPieces& p) { p.tensors[0].dims[1] = 1ull << 63; },
       "dimension 1 is 9223372036854775808, too large"},
      {"dims product overflows",
       [](GgufPieces& p) {
         p.tensors[0].dims = {1ull << 32, 1ull << 32, 1ull << 32};
       },
       "element count overflows: dimensions [4294967296, 4294967296] multiply past"},
      {"dims product beyond int64",
       [](GgufPieces& p) {
         p.tensors[0].dims = {1ull << 32, 1ull << 31};
       },
       "overflows"},
      {"row length not a multiple of the block", [](GgufPieces& p) { p.tensors[0].dims[0] = 48; },
       "row length 48 is not a multiple of the block size 32 of Q8_0"},
      {"alignment 3", [](GgufPieces& p) { p.metadata.push_back(gguf_kv_u32("general.alignment", 3)); },
       "alignment 3 is not a power of two"},
      {"alignment 0", [](GgufPieces& p) { p.metadata.push_back(gguf_kv_u32("general.alignment", 0)); },
       "alignment 0 is not a power of two"},
      {"alignment not an integer",
       [](GgufPieces& p) {
         std::string entry = gguf_string("general.alignment");
         append_le<std::uint32_t>(entry, 8);
         p.metadata.push_back(entry + gguf_string("32"));
       },
       "must be an integer, not string"},
      {"tensor offset past the end", [](GgufPieces& p) { p.tensors.back().offset = 1ull << 40; },
       "data offset 1099511627776 (file offset "},
      {"tensor data running past the end", [](GgufPieces& p) { p.tensors[0].offset = p.data.size() - 32; },
       "is past the end of the file"},
      {"tensor offset misaligned", [](GgufPieces& p) { p.tensors[1].offset += 1; },
       "is not a multiple of the alignment 32"},
      {"tensors overlapping", [](GgufPieces& p) { p.tensors[2].offset = p.tensors[1].offset; }, "overlaps tensor"},
      {"duplicate tensor name", [](GgufPieces& p) { p.tensors[1].name = p.tensors[0].name; },
       "tensor 'token_embd.weight' at offset"},
      {"duplicate metadata key", [](GgufPieces& p) { p.metadata.push_back(p.metadata[1]); },
       "metadata 'general.name' at offset"},
  };
  return cases;
}

// Extra words every case above must also contain (split out to keep the table readable).
const std::map<std::string, std::string>& second_fragments() {
  static const std::map<std::string, std::string> fragments = {
      {"unknown value type", "unknown value type 13"},
      {"duplicate tensor name", "duplicate tensor name"},
      {"duplicate metadata key", "duplicate metadata key"},
      {"tensor offset past the end", "is past the end of the file"},
  };
  return fragments;
}

}  // namespace

class GgufHostileTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void initTestCase() {
    // No case may allocate its way out of trouble: cap the address space (the library maps no torch).
    QVERIFY(limit_address_space(kAddressSpaceLimit));
    QVERIFY(directory_.isValid());
    original_ = read_file_bytes(shared_path(kFixture));
    pieces_ = split_gguf(original_);
  }

  // The splitter is faithful: the pieces put back together are the fixture, byte for byte.
  void pieces_rebuild_the_fixture() {
    QVERIFY(pieces_.bytes() == original_);
    const std::string path = write("rebuilt.gguf", pieces_.bytes());
    const GgufFile gguf(path);
    QCOMPARE(gguf.tensors().size(), std::size_t(47));
    QCOMPARE(gguf.metadata().size(), std::size_t(26));
  }

  void corrupt_header_data() {
    QTest::addColumn<int>("index");
    for (std::size_t i = 0; i < corruptions().size(); ++i) QTest::newRow(corruptions()[i].name) << static_cast<int>(i);
  }
  void corrupt_header() {
    QFETCH(int, index);
    const Corruption& corruption = corruptions()[static_cast<std::size_t>(index)];
    GgufPieces pieces = pieces_;
    corruption.apply(pieces);
    const std::string path = write("corrupt.gguf", pieces.bytes());
    std::vector<std::string> fragments = {path + ": ", " at offset ", corruption.expected};
    if (auto it = second_fragments().find(corruption.name); it != second_fragments().end())
      fragments.push_back(it->second);
    expect_refused(path, fragments);
  }

  // The name of the first tensor claims more bytes than the file has.
  void tensor_name_past_the_end() {
    GgufPieces pieces = pieces_;
    std::string bytes = pieces.bytes();
    GgufPieces without_tensors = pieces;
    without_tensors.tensors.clear();
    patch<std::uint64_t>(bytes, without_tensors.header().size(), 1ull << 50);
    const std::string path = write("long-name.gguf", bytes);
    expect_refused(path, {"tensor info 0 at offset", "name of 1125899906842624 bytes runs past the end of the file"});
  }

  void truncated() {
    const std::uint64_t data_offset = GgufFile(shared_path(kFixture)).data_offset();
    std::vector<std::uint64_t> sizes = {1, 3, 4, 7, 8, 16, 23, 24, 25};
    for (std::uint64_t size = 1024; size < data_offset; size += 1024) sizes.push_back(size);
    for (std::uint64_t size : {data_offset - 1, data_offset, data_offset + 1, data_offset + 1000,
                               std::uint64_t(original_.size() / 2), std::uint64_t(original_.size() - 1)})
      sizes.push_back(size);
    for (std::uint64_t size : sizes) {
      const std::string path = write("truncated.gguf", original_.substr(0, size));
      const std::string message = refusal(path);
      QVERIFY2(message.rfind(path + ": ", 0) == 0, qPrintable(QString::fromStdString(message)));
      QVERIFY2(message.find("past the end of the file") != std::string::npos ||
                   message.find("cannot fit in the remaining") != std::string::npos,
               qPrintable(QString("truncated at %1: %2").arg(size).arg(QString::fromStdString(message))));
    }
  }

  void not_a_regular_file() {
    const std::string empty = write("empty.gguf", "");
    expect_refused(empty, {"empty file (0 bytes)"});
    expect_refused(directory_.path().toStdString(), {"is a directory, not a regular file"});
    const std::string fifo = directory_.filePath("model.fifo").toStdString();
    QCOMPARE(mkfifo(fifo.c_str(), 0600), 0);
    expect_refused(fifo, {"is a FIFO, not a regular file"});  // must not block waiting for a writer
    expect_refused("/dev/null", {"is a character device, not a regular file"});
    expect_refused(directory_.filePath("missing.gguf").toStdString(), {"file not found"});
  }

  // Version 2 has the same layout as version 3 (which only added big-endian files).
  void version_2() {
    GgufPieces pieces = pieces_;
    set_version(pieces, 2);
    const GgufFile gguf(write("v2.gguf", pieces.bytes()));
    QCOMPARE(gguf.version(), 2u);
    QCOMPARE(gguf.tensors().size(), std::size_t(47));
  }

  // general.alignment 16 with the data section laid out for it is valid, and so are nested arrays.
  void valid_variants() {
    GgufPieces pieces = pieces_;
    pieces.metadata.push_back(gguf_kv_u32("general.alignment", 16));
    pieces.alignment = 16;
    pieces.metadata.push_back(nested_array_entry("test.nested", 3));
    const std::string path = write("variant.gguf", pieces.bytes());
    const GgufFile gguf(path);
    QCOMPARE(gguf.alignment(), std::uint64_t(16));
    QCOMPARE(gguf.data_offset() % 16, std::uint64_t(0));
    QCOMPARE(gguf.get_array_length("test.nested"), std::uint64_t(1));
    QVERIFY_THROWS_EXCEPTION(ModelError, gguf.get_int_array("test.nested"));
    const GgufFile original(shared_path(kFixture));
    for (const GgufTensor& tensor : original.tensors())
      QVERIFY(dequantize_tensor(tensor) == dequantize_tensor(*gguf.find_tensor(tensor.name)));
  }

  // Random byte changes in the header: the file either opens, with every tensor decodable inside the
  // mapping, or is refused with a ModelError. Anything else (a crash, another exception) fails.
  void random_header_damage() {
    const std::uint64_t header_end = GgufFile(shared_path(kFixture)).data_offset();
    std::mt19937_64 random(20250220);
    int opened = 0;
    for (int round = 0; round < 300; ++round) {
      std::string bytes = original_;
      const int changes = 1 + static_cast<int>(random() % 4);
      for (int c = 0; c < changes; ++c) bytes[random() % header_end] = static_cast<char>(random() & 0xFF);
      const std::string path = write("damaged.gguf", bytes);
      try {
        const GgufFile gguf(path);
        for (const GgufTensor& tensor : gguf.tensors())
          if (gguf_type_info(tensor.type).dequantizable() && tensor.n_elements <= (1 << 24)) dequantize_tensor(tensor);
        ++opened;
      } catch (const ModelError&) {
      }
    }
    qInfo("%d of 300 damaged files still opened (damage in string bytes or values)", opened);
  }

  void cleanupTestCase() { qInfo("slowest refusal: %.3f ms", slowest_ms_); }

 private:
  std::string write(const std::string& name, const std::string& bytes) {
    const std::string path = directory_.filePath(QString::fromStdString(name)).toStdString();
    write_file_bytes(path, bytes);
    return path;
  }

  // The ModelError message of opening `path`, or a note that it opened.
  std::string refusal(const std::string& path) {
    const auto start = std::chrono::steady_clock::now();
    try {
      GgufFile gguf(path);
    } catch (const ModelError& error) {
      const std::chrono::duration<double, std::milli> elapsed = std::chrono::steady_clock::now() - start;
      slowest_ms_ = std::max(slowest_ms_, elapsed.count());
      return error.what();
    }
    return "(" + path + " opened without an error)";
  }

  void expect_refused(const std::string& path, const std::vector<std::string>& fragments) {
    const std::string message = refusal(path);
    for (const std::string& fragment : fragments)
      QVERIFY2(message.find(fragment) != std::string::npos,
               qPrintable(QString::fromStdString("'" + message + "' does not mention '" + fragment + "'")));
  }

  QTemporaryDir directory_;
  std::string original_;
  GgufPieces pieces_;
  double slowest_ms_ = 0.0;
};

KVCHAT_TEST_APPLESS_MAIN(GgufHostileTest)

}  // namespace gguf_test_gguf_hostile

#include "test_gguf_hostile.moc"
