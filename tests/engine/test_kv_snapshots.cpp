// KV snapshot files: never a wrong cache. A snapshot that is corrupt (a flipped byte anywhere),
// truncated, of another model, another cache dtype, another format version or another token prefix is
// ignored with a log message saying which check failed, deleted, and the turn's output is exactly a
// fresh prefill's. A writer killed with SIGKILL leaves the previous snapshot or none, never a part.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <QTemporaryDir>
#include <QtTest/QtTest>
#include "common/test_suite.h"

#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "common/snapshot_support.h"
#include "common/test_paths.h"
#include "engine/kv_snapshot.h"
#include "engine/llama_model.h"
#include "engine/model_loader.h"
#include "engine/session_pool.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace engine_test_kv_snapshots {

using kvchat::GenerationResult;
using kvchat::KvCacheMode;
using kvchat::KvSnapshot;
using kvchat::SessionPool;
using kvchat::SnapshotStore;
using kvchat::TokenId;
namespace test = kvchat::test;

class KvSnapshotsTest : public QObject {
  Q_OBJECT

 private:
  std::shared_ptr<SnapshotStore> make_store(const QTemporaryDir& folder) const {
    return std::make_shared<SnapshotStore>(folder.path().toStdString(), 0, fingerprint_, loaded_.model->cache_shape());
  }

  // Conversation 1's first turn, its snapshot written: returns the snapshot's path.
  std::string write_first_turn(const QTemporaryDir& folder) {
    auto store = make_store(folder);
    SessionPool pool(loaded_.model, store);
    pool.acquire(1, KvCacheMode::Contiguous).generate(first_prompt_, test::greedy(20));
    if (!pool.save_snapshot(1, "the transcript of chat 1")) return {};
    store->flush();
    return store->path_for(pool.snapshot_key(1));
  }

  // Turn 2 of conversation 1 in a new pool (a new process's view) over the snapshot folder.
  GenerationResult second_turn(const QTemporaryDir& folder) {
    SessionPool pool(loaded_.model, make_store(folder));
    return pool.acquire(1, KvCacheMode::Contiguous).generate(second_prompt_, test::greedy(20));
  }

  // The snapshot at `path` replaced by `bytes` is ignored with `message` in the log and deleted; the turn
  // gives a fresh prefill's ids.
  void expect_rejected(const QTemporaryDir& folder, const std::string& path, const QByteArray& bytes,
                       const std::string& message) {
    QVERIFY(test::write_bytes(path, bytes));
    test::LogCapture log;
    const GenerationResult result = second_turn(folder);
    QCOMPARE(result.stats.restored_tokens, 0);
    QCOMPARE(result.stats.reused_tokens, 0);
    QCOMPARE(result.generated, fresh_.generated);
    QVERIFY2(log.contains(message), (message + " not in the log: " + log.all()).c_str());
    QVERIFY2(!std::filesystem::exists(path), "a rejected snapshot is deleted");
  }

  static QByteArray with_header_checksum(QByteArray bytes) {
    const std::uint64_t checksum = XXH3_64bits(bytes.constData(), 120);
    std::memcpy(bytes.data() + 120, &checksum, sizeof checksum);
    return bytes;
  }

 private Q_SLOTS:
  void initTestCase() {
    loaded_ = kvchat::load_model(test::shared_path("models/stories260K"));
    fingerprint_ = kvchat::fingerprint_model(*loaded_.model);
    first_prompt_ = test::made_up_prompt(40, 3);
    kvchat::Session session(loaded_.model, KvCacheMode::Contiguous);
    const auto first = session.generate(first_prompt_, test::greedy(20));
    second_prompt_ = test::continued(first_prompt_, first.generated, 4);
    kvchat::Session fresh(loaded_.model, KvCacheMode::Contiguous);
    fresh_ = fresh.generate(second_prompt_, test::greedy(20));
  }

  void a_valid_snapshot_is_restored() {
    QTemporaryDir folder;
    const std::string path = write_first_turn(folder);
    QVERIFY(std::filesystem::exists(path));
    const kvchat::SnapshotHeader header = kvchat::read_snapshot_header(path);
    QCOMPARE(header.tokens.size(), first_prompt_.size() + 19);  // the prompt and every fed reply token
    QCOMPARE(header.fingerprint, fingerprint_.hash);
    QCOMPARE(header.annotation, std::string("the transcript of chat 1"));
    QCOMPARE(SessionPool(loaded_.model, make_store(folder)).snapshot_annotation(1), std::optional<std::string>(header.annotation));
    const GenerationResult result = second_turn(folder);
    QCOMPARE(result.stats.restored_tokens, static_cast<int>(header.tokens.size()));
    QCOMPARE(result.stats.reused_tokens, result.stats.restored_tokens);
    QCOMPARE(result.stats.restored_from, std::string("c-1"));
    QCOMPARE(result.generated, fresh_.generated);
  }

  void a_flipped_byte_is_rejected_wherever_it_is() {
    QTemporaryDir folder;
    const std::string path = write_first_turn(folder);
    const QByteArray valid = test::read_bytes(path);
    struct Flip {
      int offset;
      const char* message;
    };
    const Flip flips[] = {{20, "header checksum mismatch"},
                          {130, "token checksum mismatch"},
                          {128 + 4 * (40 + 19) + 3, "annotation checksum mismatch"},
                          {static_cast<int>(valid.size()) - 1, "K/V data checksum mismatch"},
                          {static_cast<int>(valid.size()) / 2, "K/V data checksum mismatch"}};
    for (const Flip& flip : flips) {
      QByteArray bytes = valid;
      bytes[flip.offset] = static_cast<char>(bytes[flip.offset] ^ 0x10);
      expect_rejected(folder, path, bytes, flip.message);
    }
  }

  void a_truncated_snapshot_is_rejected() {
    QTemporaryDir folder;
    const std::string path = write_first_turn(folder);
    const QByteArray valid = test::read_bytes(path);
    expect_rejected(folder, path, QByteArray(), "less than its header");
    expect_rejected(folder, path, valid.left(100), "less than its header");
    for (int size : {130, static_cast<int>(valid.size()) / 2, static_cast<int>(valid.size()) - 1})
      expect_rejected(folder, path, valid.left(size), "(truncated or extended)");
    expect_rejected(folder, path, valid + QByteArray(8, '\0'), "(truncated or extended)");
  }

  void a_future_format_version_is_rejected() {
    QTemporaryDir folder;
    const std::string path = write_first_turn(folder);
    QByteArray bytes = test::read_bytes(path);
    const std::uint32_t version = kvchat::kSnapshotFormatVersion + 1;
    std::memcpy(bytes.data() + 8, &version, sizeof version);
    expect_rejected(folder, path, with_header_checksum(bytes), "has format version 2; this kvchat reads version 1");
  }

  // Snapshots of the same shape from other weights (random, other seed) and of another RoPE base: other
  // fingerprints. A file of another model in this model's folder is rejected.
  void another_model_is_rejected() {
    const kvchat::ModelConfig& config = loaded_.model->config();
    const auto random = kvchat::LlamaModel::random(config, 7);
    QVERIFY(kvchat::fingerprint_model(*random).hash != fingerprint_.hash);
    kvchat::ModelConfig other_rope = config;
    other_rope.rope_theta = 20000.0;
    const auto rotated = kvchat::LlamaModel::from_checkpoint(test::shared_path("models/stories260K"), other_rope);
    QVERIFY(kvchat::fingerprint_model(*rotated).hash != fingerprint_.hash);
    QCOMPARE(kvchat::fingerprint_model(*kvchat::load_model(test::shared_path("models/stories260K")).model).hash,
             fingerprint_.hash);  // the same model loaded again: the same fingerprint

    QTemporaryDir folder;
    const std::string path = write_first_turn(folder);
    kvchat::Session session(random, KvCacheMode::Contiguous);
    session.generate(first_prompt_, test::greedy(20));
    const std::unique_ptr<KvSnapshot> foreign = session.capture();
    kvchat::write_snapshot_file(path, *foreign, kvchat::fingerprint_model(*random).hash);
    expect_rejected(folder, path, test::read_bytes(path), "was made by another model");
    kvchat::write_snapshot_file(path, *foreign, kvchat::fingerprint_model(*random).hash);
    QVERIFY_THROWS_EXCEPTION(kvchat::SnapshotError,
                             kvchat::read_snapshot_file(path, fingerprint_.hash, loaded_.model->cache_shape()));
  }

  void another_cache_dtype_is_rejected() {
    QTemporaryDir folder;
    const std::string path = write_first_turn(folder);
    kvchat::KvCacheShape shape = loaded_.model->cache_shape();
    shape.dtype = at::kBFloat16;
    kvchat::NaiveKvCache cache(shape);
    kvchat::Session session(loaded_.model, KvCacheMode::Contiguous);
    session.generate(first_prompt_, test::greedy(20));
    const std::unique_ptr<KvSnapshot> f32 = session.capture();
    // The same K/V in bf16: a cache of another dtype.
    for (std::int64_t layer = 0; layer < shape.layers; ++layer) {
      const auto count = static_cast<std::int64_t>(f32->tokens.size());
      const std::int64_t bytes = kvchat::snapshot_data_bytes(f32->shape, count) / (2 * shape.layers);
      auto view = [&](std::int64_t offset) {
        return at::from_blob(f32->data.data() + offset, {shape.kv_heads, count, shape.head_dim}, at::kFloat);
      };
      cache.append(layer, view(2 * layer * bytes), view(2 * layer * bytes + bytes));
    }
    cache.commit(static_cast<std::int64_t>(f32->tokens.size()));
    kvchat::write_snapshot_file(path, kvchat::capture_snapshot(cache, f32->tokens), fingerprint_.hash);
    expect_rejected(folder, path, test::read_bytes(path), "holds a BFloat16 cache; this cache is Float");
  }

  // A snapshot whose tokens are not the prompt's prefix is not used (and stays: it is another chat's).
  void another_token_prefix_is_not_used() {
    QTemporaryDir folder;
    const std::string path = write_first_turn(folder);
    SessionPool pool(loaded_.model, make_store(folder));
    std::vector<TokenId> other = second_prompt_;
    other[1] = other[1] == 11 ? 12 : 11;  // differs right after BOS
    const GenerationResult result = pool.acquire(1, KvCacheMode::Contiguous).generate(other, test::greedy(20));
    QCOMPARE(result.stats.restored_tokens, 0);
    kvchat::Session fresh(loaded_.model, KvCacheMode::Contiguous);
    QCOMPARE(result.generated, fresh.generate(other, test::greedy(20)).generated);
    QVERIFY(std::filesystem::exists(path));
  }

  // A child process writes snapshots A and B to one path in turn and is killed with SIGKILL at many
  // moments: the path then holds A or B whole (all checks pass, the bytes are one of them) or nothing;
  // a leftover temporary file is never taken for a snapshot.
  void a_writer_killed_mid_write_leaves_a_whole_snapshot_or_none() {
    QTemporaryDir folder;
    const std::string directory = folder.path().toStdString() + "/" + fingerprint_.hex();
    std::filesystem::create_directories(directory);
    const std::string path = directory + "/c-1.kvsnap";
    kvchat::KvCacheShape shape{8, 8, 64, 4096, at::kFloat};
    KvSnapshot snapshots[2];
    for (int which = 0; which < 2; ++which) {
      snapshots[which].shape = shape;
      snapshots[which].tokens.assign(768, static_cast<TokenId>(5 + which));
      snapshots[which].data = kvchat::HugePageBuffer(static_cast<std::size_t>(kvchat::snapshot_data_bytes(shape, 768)));
      std::memset(snapshots[which].data.data(), 0x40 + which, snapshots[which].data.size());
    }
    int whole = 0, none = 0;
    const int delays_ms[] = {5, 15, 30, 60, 100, 150, 220, 300, 400, 500};
    for (int delay_ms : delays_ms) {
      const pid_t child = ::fork();
      QVERIFY(child >= 0);
      if (child == 0) {
        for (int i = 0;; ++i) kvchat::write_snapshot_file(path, snapshots[i % 2], fingerprint_.hash);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      ::kill(child, SIGKILL);
      int status = 0;
      ::waitpid(child, &status, 0);
      QVERIFY(WIFSIGNALED(status));
      if (!std::filesystem::exists(path)) {
        ++none;
        continue;
      }
      const kvchat::LoadedSnapshot loaded = kvchat::read_snapshot_file(path, fingerprint_.hash, shape);  // throws if partial
      const int which = loaded.header.tokens[0] - 5;
      QVERIFY(which == 0 || which == 1);
      QVERIFY(loaded.header.tokens == snapshots[which].tokens);
      QVERIFY(loaded.data == snapshots[which].data);
      ++whole;
    }
    qInfo("after 10 kills: %d whole snapshots, %d rounds before the first rename", whole, none);
    QVERIFY(whole > 0);
    // A store over that folder lists only whole snapshots: the temporary files are not candidates.
    SnapshotStore store(folder.path().toStdString(), 0, fingerprint_, shape);
    const auto match = store.best_match(snapshots[0].tokens, 1);
    if (match) QCOMPARE(match->path, path);
  }

 private:
  kvchat::LoadedModel loaded_;
  kvchat::ModelFingerprint fingerprint_;
  std::vector<TokenId> first_prompt_, second_prompt_;
  GenerationResult fresh_;
};

KVCHAT_TEST_GUILESS_MAIN(KvSnapshotsTest)

}  // namespace engine_test_kv_snapshots

#include "test_kv_snapshots.moc"
