// The paged KV cache's block pool: a common prefix is held once, a shared block is copied exactly when a
// sequence writes into it, the budget is a block count that allocation never passes, and every block comes back.
#include <QtTest>
#include "common/test_suite.h"

#include <utility>
#include <vector>

#include "engine/cache/kv_block_pool.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace engine_test_kv_block_pool {

using namespace kvchat;
using Part = KvBlockPool::Part;

class KvBlockPoolTest : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void blocks_have_the_shape_bytes();
  void a_shared_prefix_is_held_once();
  void a_prefix_ending_on_a_block_edge_copies_nothing();
  void the_budget_is_never_passed();
  void shared_rows_cannot_be_written();
  void every_block_comes_back();
};

KvCacheShape small_shape() {
  KvCacheShape shape;
  shape.layers = 2;
  shape.kv_heads = 2;
  shape.head_dim = 16;
  return shape;
}

// A value that names its row: a position, layer, part, head and element all make it differ.
float row_value(std::int64_t position, std::int64_t layer, int part, std::int64_t head, std::int64_t element,
                int sequence = 0) {
  return static_cast<float>(((((position * 2 + layer) * 2 + part) * 2 + head) * 16 + element) * 3 + sequence);
}

// Writes positions [from, to) of every layer, part and head with row_value.
void write_positions(KvBlockTable& table, std::int64_t from, std::int64_t to, int sequence = 0) {
  for (std::int64_t position = from; position < to; ++position)
    for (std::int64_t layer = 0; layer < 2; ++layer)
      for (int part = 0; part < 2; ++part)
        for (std::int64_t head = 0; head < 2; ++head) {
          auto* row = reinterpret_cast<float*>(table.row(layer, Part(part), head, position));
          for (std::int64_t element = 0; element < 16; ++element)
            row[element] = row_value(position, layer, part, head, element, sequence);
        }
}

// Prepares, writes (row_value of `sequence`) and commits the table's next `count` positions; false, with nothing
// written, when the pool has no room for them.
bool append_positions(KvBlockTable& table, std::int64_t count, int sequence = 0) {
  if (!table.prepare(count)) return false;
  write_positions(table, table.size(), table.size() + count, sequence);
  table.commit(count);
  return true;
}

// Whether positions [from, to) of a table hold row_value(..., sequence) everywhere.
bool holds_positions(const KvBlockTable& table, std::int64_t from, std::int64_t to, int sequence = 0) {
  for (std::int64_t position = from; position < to; ++position)
    for (std::int64_t layer = 0; layer < 2; ++layer)
      for (int part = 0; part < 2; ++part)
        for (std::int64_t head = 0; head < 2; ++head) {
          const auto* row = reinterpret_cast<const float*>(table.row(layer, Part(part), head, position));
          for (std::int64_t element = 0; element < 16; ++element)
            if (row[element] != row_value(position, layer, part, head, element, sequence)) return false;
        }
  return true;
}

void KvBlockPoolTest::blocks_have_the_shape_bytes() {
  const KvBlockPool pool(small_shape(), 16, 4);
  // 2 layers x (K, V) x 2 KV heads x 16 positions x 16 f32 values.
  QCOMPARE(pool.block_bytes(), std::int64_t{2 * 2 * 2 * 16 * 16 * 4});
  KvCacheShape q8 = small_shape();
  q8.head_dim = 32;
  q8.dtype = KvDtype::Q8_0;
  // A q8_0 row of 32 values: 32 bytes and an f16 scale.
  QCOMPARE(KvBlockPool(q8, 16, 1).block_bytes(), std::int64_t{2 * 2 * 2 * 16 * 34});
  QVERIFY_THROWS_EXCEPTION(std::invalid_argument, KvBlockPool(small_shape(), 0, 4));
  QVERIFY_THROWS_EXCEPTION(std::invalid_argument, KvBlockPool(small_shape(), 16, 0));
  // 2^30 blocks of 2^20 positions: refused by count, not wrapped into a small allocation.
  QVERIFY_THROWS_EXCEPTION(std::invalid_argument, KvBlockPool(small_shape(), std::int64_t{1} << 20, 1 << 30));
}

// Two sequences with a common 200-token prefix (12.5 blocks of 16): the prefix's 13 blocks are held once; the
// partly filled 13th is copied when the first of them writes position 200, and only then.
void KvBlockPoolTest::a_shared_prefix_is_held_once() {
  KvBlockPool pool(small_shape(), 16, 64);
  KvBlockTable first(pool);
  QVERIFY(append_positions(first, 200));
  QCOMPARE(pool.blocks_in_use(), std::int64_t{13});

  KvBlockTable second = first.fork();
  QCOMPARE(second.size(), std::int64_t{200});
  QCOMPARE(pool.blocks_in_use(), std::int64_t{13});
  QCOMPARE(pool.shared_blocks(), std::int64_t{13});
  QCOMPARE(pool.copies_made(), std::int64_t{0});
  QVERIFY(holds_positions(second, 0, 200));

  // The second diverges inside the shared 13th block: that block, and no other, is copied.
  QVERIFY(second.prepare(1));
  QCOMPARE(pool.copies_made(), std::int64_t{1});
  QCOMPARE(pool.blocks_in_use(), std::int64_t{14});
  QCOMPARE(pool.shared_blocks(), std::int64_t{12});
  QVERIFY(second.blocks()[12] != first.blocks()[12]);
  for (std::size_t i = 0; i < 12; ++i) QCOMPARE(second.blocks()[i], first.blocks()[i]);
  write_positions(second, 200, 201, 1);
  second.commit(1);
  // The first now holds its 13th block alone: writing into it copies nothing.
  QVERIFY(first.prepare(1));
  QCOMPARE(pool.copies_made(), std::int64_t{1});
  write_positions(first, 200, 201, 2);
  first.commit(1);

  QVERIFY(holds_positions(first, 0, 200));
  QVERIFY(holds_positions(second, 0, 200));
  QVERIFY(holds_positions(first, 200, 201, 2));
  QVERIFY(holds_positions(second, 200, 201, 1));

  // Both go on past the block: new blocks each, nothing more copied.
  QVERIFY(first.prepare(20) && second.prepare(20));
  QCOMPARE(pool.copies_made(), std::int64_t{1});
  QCOMPARE(pool.blocks_in_use(), std::int64_t{12 + 2 * 2});
}

void KvBlockPoolTest::a_prefix_ending_on_a_block_edge_copies_nothing() {
  KvBlockPool pool(small_shape(), 16, 64);
  KvBlockTable first(pool);
  QVERIFY(append_positions(first, 192));
  KvBlockTable second = first.fork();
  QVERIFY(append_positions(second, 5, 1));
  QCOMPARE(pool.copies_made(), std::int64_t{0});
  QCOMPARE(pool.shared_blocks(), std::int64_t{12});
  QCOMPARE(pool.blocks_in_use(), std::int64_t{13});
  QVERIFY(holds_positions(second, 0, 192));

  // A regenerate: the second goes back into the shared prefix, and the block it then writes in is copied.
  second.truncate(100);
  QCOMPARE(pool.blocks_in_use(), std::int64_t{12});
  QVERIFY(second.prepare(1));
  QCOMPARE(pool.copies_made(), std::int64_t{1});
  write_positions(second, 100, 101, 1);
  second.commit(1);
  QVERIFY(holds_positions(first, 0, 192));  // the first never sees the second's write
  QVERIFY(holds_positions(second, 100, 101, 1));
}

void KvBlockPoolTest::the_budget_is_never_passed() {
  KvBlockPool pool(small_shape(), 16, 8);
  KvBlockTable first(pool);
  QVERIFY(append_positions(first, 120));  // 8 blocks, the last one half full
  QCOMPARE(pool.blocks_free(), std::int64_t{0});

  KvBlockTable other(pool);
  QVERIFY(!other.prepare(1));
  QCOMPARE(other.size(), std::int64_t{0});
  QVERIFY(other.blocks().empty());

  // A fork that would need a copy of the shared last block: refused, and nothing changes.
  KvBlockTable second = first.fork();
  QVERIFY(!second.prepare(1));
  QCOMPARE(second.blocks(), first.blocks());
  QCOMPARE(pool.reference_count(first.blocks()[7]), 2);
  QCOMPARE(pool.copies_made(), std::int64_t{0});
  QCOMPARE(pool.blocks_in_use(), std::int64_t{8});

  // The first gives back its last four blocks; they are still the second's, so the pool stays full...
  first.truncate(64);
  QCOMPARE(pool.blocks_free(), std::int64_t{0});
  // ...until the second lets them go too.
  second.truncate(64);
  QCOMPARE(pool.blocks_free(), std::int64_t{4});
  QVERIFY(other.prepare(64));
  QVERIFY(!other.prepare(65));
  QCOMPARE(pool.blocks_free(), std::int64_t{0});
}

void KvBlockPoolTest::shared_rows_cannot_be_written() {
  KvBlockPool pool(small_shape(), 16, 8);
  KvBlockTable first(pool);
  QVERIFY(append_positions(first, 20));
  KvBlockTable second = first.fork();
  QVERIFY_THROWS_EXCEPTION(std::logic_error, second.row(0, Part::Keys, 0, 3));
  QVERIFY_THROWS_EXCEPTION(std::out_of_range, std::as_const(second).row(0, Part::Keys, 0, 20));
  QVERIFY_THROWS_EXCEPTION(std::invalid_argument, second.commit(1));
}

void KvBlockPoolTest::every_block_comes_back() {
  KvBlockPool pool(small_shape(), 16, 32);
  {
    KvBlockTable first(pool);
    QVERIFY(first.prepare(70));
    first.commit(70);
    std::vector<KvBlockTable> branches;
    for (int i = 0; i < 3; ++i) {
      branches.push_back(first.fork());
      QVERIFY(branches.back().prepare(10));
      branches.back().commit(10);
    }
    KvBlockTable moved = std::move(branches.front());
    QCOMPARE(moved.size(), std::int64_t{80});
    QCOMPARE(branches.front().size(), std::int64_t{0});
    QVERIFY(pool.blocks_in_use() > 5);
  }
  QCOMPARE(pool.blocks_in_use(), std::int64_t{0});
  QCOMPARE(pool.shared_blocks(), std::int64_t{0});
}

KVCHAT_TEST_APPLESS_MAIN(KvBlockPoolTest)

}  // namespace engine_test_kv_block_pool

#include "test_kv_block_pool.moc"
