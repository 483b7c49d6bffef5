// KV snapshot files: never a wrong cache. A snapshot that is corrupt (a flipped byte anywhere),
// truncated, of another model, another cache dtype, another format version, another installation or
// another token prefix is ignored with a log message saying which check failed, and the turn's output
// is exactly a fresh prefill's; it is deleted only when its header shows it is this installation's (an
// older format version's included, which a new snapshot also replaces). A
// writer killed with SIGKILL leaves the previous snapshot or none, never a part. The store touches
// nothing but its own snapshot files (no symbolic link followed), reads no snapshot past the model's
// context, and finds the longest shared prefix from bounded summaries.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <QTemporaryDir>
#include <QtTest/QtTest>
#include "common/test_suite.h"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <random>
#include <thread>

#include "common/snapshot_support.h"
#include "common/test_paths.h"
#include "engine/cache/kv_snapshot.h"
#include "engine/cache/session_pool.h"
#include "engine/compute/compute_options.h"
#include "engine/model/llama_model.h"
#include "engine/model/model_loader.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace engine_test_kv_snapshots {

using kvchat::GenerationResult;
using kvchat::KvCacheMode;
using kvchat::KvSnapshot;
using kvchat::SessionPool;
using kvchat::SnapshotKey;
using kvchat::SnapshotStore;
using kvchat::TokenId;
namespace fs = std::filesystem;
namespace test = kvchat::test;

// An installation's key as app/snapshot_key.cpp makes one, from a seed.
SnapshotKey key_of_installation(std::uint64_t installation, unsigned seed) {
  std::mt19937 random(seed);
  SnapshotKey key{installation, std::string(kvchat::kSnapshotSecretBytes, '\0')};
  for (char& c : key.secret) c = static_cast<char>(random());
  return key;
}

class KvSnapshotsTest : public QObject {
  Q_OBJECT

 private:
  std::shared_ptr<SnapshotStore> make_store(const QTemporaryDir& folder, const SnapshotKey& key = {}) const {
    return std::make_shared<SnapshotStore>(folder.path().toStdString(), 0, fingerprint_, loaded_.model->cache_shape(),
                                           key);
  }

  // Conversation 1's first turn, its snapshot written: returns the snapshot's path.
  std::string write_first_turn(const QTemporaryDir& folder, const SnapshotKey& key = {}) {
    auto store = make_store(folder, key);
    SessionPool pool(loaded_.model, store);
    pool.acquire(1, KvCacheMode::Contiguous).generate(first_prompt_, test::greedy(20));
    if (!pool.save_snapshot(1)) return {};
    store->flush();
    return store->path_for(pool.snapshot_key(1));
  }

  // Turn 2 of conversation 1 in a new pool (a new process's view) over the snapshot folder.
  GenerationResult second_turn(const QTemporaryDir& folder, const SnapshotKey& key = {}) {
    SessionPool pool(loaded_.model, make_store(folder, key));
    return pool.acquire(1, KvCacheMode::Contiguous).generate(second_prompt_, test::greedy(20));
  }

  enum class Then { Deleted, LeftAlone };
  // The snapshot at `path` replaced by `bytes` is ignored with `message` in the log, and deleted when its
  // header shows it is one of this installation's (else left as it is); the turn gives a fresh prefill's ids.
  void expect_rejected(const QTemporaryDir& folder, const std::string& path, const QByteArray& bytes,
                       const std::string& message, Then then = Then::Deleted, const SnapshotKey& key = {}) {
    QVERIFY(test::write_bytes(path, bytes));
    test::LogCapture log;
    const GenerationResult result = second_turn(folder, key);
    QCOMPARE(result.stats.restored_tokens, 0);
    QCOMPARE(result.stats.reused_tokens, 0);
    QCOMPARE(result.generated, fresh_.generated);
    QVERIFY2(log.contains(message), (message + " not in the log: " + log.all()).c_str());
    if (then == Then::Deleted) {
      QVERIFY2(!fs::exists(path), "a rejected snapshot of this installation is deleted");
    } else {
      QVERIFY2(fs::exists(path), "a file not provably this installation's snapshot is left alone");
      QCOMPARE(test::read_bytes(path), bytes);
    }
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
    // The K/V data starts where the tokens end, rounded up to 64 bytes.
    QCOMPARE(header.data_offset, std::int64_t{(128 + 4 * (40 + 19) + 63) / 64 * 64});
    QCOMPARE(header.file_bytes, static_cast<std::int64_t>(fs::file_size(path)));
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
    // A flipped header byte leaves no proof that the file is a snapshot of this installation: it stays.
    QByteArray header_flipped = valid;
    header_flipped[20] = static_cast<char>(header_flipped[20] ^ 0x10);
    expect_rejected(folder, path, header_flipped, "header checksum mismatch", Then::LeftAlone);
    const Flip flips[] = {{130, "token checksum mismatch"},
                          {128 + 4 * (40 + 19) - 1, "token checksum mismatch"},
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
    // Shorter than a header: nothing shows it is a snapshot, so it stays.
    expect_rejected(folder, path, QByteArray(), "less than its header", Then::LeftAlone);
    expect_rejected(folder, path, valid.left(100), "less than its header", Then::LeftAlone);
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
    // Another kvchat's file: left for it.
    expect_rejected(folder, path, test::with_header_checksum(bytes),
                    "has format version 3; this kvchat reads version 2", Then::LeftAlone);
  }

  // A snapshot the first kvchat wrote (format version 1: the conversation's transcript between the tokens
  // and the K/V data), every checksum right for this installation: never used and deleted; while it is
  // there, a new snapshot of the conversation replaces it, the folder's size counts it and removing the
  // conversation deletes it.
  void an_older_format_version_is_deleted_and_replaced() {
    const SnapshotKey mine = key_of_installation(0x1111, 1);
    QTemporaryDir folder;
    const std::string path = write_first_turn(folder, mine);
    const QByteArray current = test::read_bytes(path);
    const QByteArray version_1 = test::as_format_version_1(current, "kvchat-transcript-1\nthe ids of chat 1", mine);
    QCOMPARE(test::field_of<std::uint32_t>(version_1, test::kSnapshotVersionAt), std::uint32_t{1});
    QVERIFY(version_1.size() > current.size());
    expect_rejected(folder, path, version_1, "has format version 1; this kvchat reads version 2", Then::Deleted, mine);

    QVERIFY(test::write_bytes(path, version_1));
    QCOMPARE(make_store(folder, mine)->folder_bytes(), static_cast<std::int64_t>(version_1.size()));
    kvchat::Session session(loaded_.model, KvCacheMode::Contiguous);
    session.generate(first_prompt_, test::greedy(20));
    kvchat::write_snapshot_file(path, *session.capture(), fingerprint_.hash, mine);
    QCOMPARE(test::read_bytes(path), current);

    QVERIFY(test::write_bytes(path, version_1));
    make_store(folder, mine)->remove("c-1");
    QVERIFY(!fs::exists(path));
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
    // A BF16 file whose products take bf16 input (kernels on, AVX-512 BF16) makes other K/V than its exact
    // products (kernels off): another fingerprint.
    const auto bf16_file = kvchat::load_model(test::shared_path("fixtures/gguf/tiny-llama-k-BF16.gguf")).model;
    if (bf16_file->weights().layers.front().q.rounds_input_to_bf16()) {
      const std::uint64_t rounded = kvchat::fingerprint_model(*bf16_file).hash;
      kvchat::set_fast_kernels_enabled(false);
      const std::uint64_t exact = kvchat::fingerprint_model(*bf16_file).hash;
      kvchat::set_fast_kernels_enabled(true);  // on before (rounds_input_to_bf16 says so)
      QVERIFY(rounded != exact);
    }

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
    shape.dtype = kvchat::KvDtype::BF16;
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
    // Whole, and of use again when the KV dtype setting changes back: left as it is.
    expect_rejected(folder, path, test::read_bytes(path), "holds a bf16 KV cache; this cache is f32", Then::LeftAlone);
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
    kvchat::KvCacheShape shape{8, 8, 64, 4096, kvchat::KvDtype::F32, {}};
    KvSnapshot snapshots[2];
    for (int which = 0; which < 2; ++which) {
      snapshots[which].shape = shape;
      snapshots[which].tokens.assign(768, static_cast<TokenId>(5 + which));
      snapshots[which].data = kvchat::HugePageBuffer(static_cast<std::size_t>(kvchat::snapshot_data_bytes(shape, 768)));
      std::memset(snapshots[which].data.data(), 0x40 + which, snapshots[which].data.size());
    }
    int whole = 0, none = 0;
    // One round: the child writes for delay_ms, then is killed; the path must hold a whole snapshot or none.
    const auto kill_after = [&](int delay_ms) {
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
        return;
      }
      const kvchat::LoadedSnapshot loaded =
          kvchat::read_snapshot_file(path, fingerprint_.hash, shape);  // throws if partial
      const int which = loaded.header.tokens[0] - 5;
      QVERIFY(which == 0 || which == 1);
      QVERIFY(loaded.header.tokens == snapshots[which].tokens);
      QVERIFY(loaded.data == snapshots[which].data);
      ++whole;
    };
    for (int delay_ms : {5, 15, 30, 60, 100, 150, 220, 300, 400, 500}) {
      kill_after(delay_ms);
      if (QTest::currentTestFailed()) return;
    }
    // On a busy machine the first write may not have been renamed into place yet: longer rounds until one is.
    for (int delay_ms = 1000; whole == 0 && delay_ms <= 32000; delay_ms *= 2) {
      kill_after(delay_ms);
      if (QTest::currentTestFailed()) return;
    }
    qInfo("after %d kills: %d whole snapshots, %d rounds before the first rename", whole + none, whole, none);
    QVERIFY(whole > 0);
    // A store over that folder lists only whole snapshots: the temporary files are not candidates.
    SnapshotStore store(folder.path().toStdString(), 0, fingerprint_, shape);
    const auto match = store.best_match(snapshots[0].tokens, 1);
    if (match) QCOMPARE(match->path, path);
  }

  // The store lists, writes and deletes only its own snapshot files. The cache folder itself may be a
  // symbolic link (the user named it); a model folder that is one is never entered (another model's is
  // skipped, this model's makes the store refuse the folder); a file named like a snapshot that is none
  // and a symbolic link named like one are never written through, followed or deleted, by the disk
  // budget, a lookup, remove or remove_all.
  void only_its_own_files_are_touched() {
    QTemporaryDir outside, cache_target, holder;
    const std::string elsewhere = outside.path().toStdString();
    const QByteArray precious("the user's own file, not a snapshot\n");
    const char* const kept_names[] = {"notes.kvsnap", "c-1.kvsnap", "c-2.kvsnap", "c-7.kvsnap", "other.txt"};
    for (const char* name : kept_names) QVERIFY(test::write_bytes(elsewhere + "/" + name, precious));
    const std::string cache = holder.path().toStdString() + "/cache";
    fs::create_directory_symlink(cache_target.path().toStdString(), cache);
    fs::create_directory_symlink(elsewhere, cache + "/0123456789abcdef");  // "another model's folder"
    const std::string own = cache_target.path().toStdString() + "/" + fingerprint_.hex();
    fs::create_directories(own);
    QVERIFY(test::write_bytes(own + "/c-7.kvsnap", precious));
    fs::create_symlink(elsewhere + "/c-1.kvsnap", own + "/c-8.kvsnap");
    test::LogCapture log;
    {
      // A budget of one byte: after each write, every other snapshot of this installation goes.
      auto store = std::make_shared<SnapshotStore>(cache, 1, fingerprint_, loaded_.model->cache_shape());
      SessionPool pool(loaded_.model, store);
      for (int conversation : {1, 2, 7, 8}) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // unambiguous file times for the budget
        pool.acquire(conversation, KvCacheMode::Contiguous)
            .generate(test::made_up_prompt(40, conversation), test::greedy(4));
        QVERIFY(pool.save_snapshot(conversation));
        store->flush();
        if (conversation == 1) QVERIFY(fs::is_regular_file(own + "/c-1.kvsnap"));  // written through the cache link
        if (conversation == 2) QVERIFY(!fs::exists(own + "/c-1.kvsnap") && fs::is_regular_file(own + "/c-2.kvsnap"));
      }
      QVERIFY2(log.contains(own.substr(own.size() - 16) +
                            "/c-7.kvsnap exists and is not a KV snapshot of this installation"),
               log.all().c_str());
      QVERIFY2(log.contains("/c-8.kvsnap exists and is not a KV snapshot of this installation"), log.all().c_str());
      // Lookups see neither as a snapshot (and say so once).
      QVERIFY(!store->best_match(test::made_up_prompt(40, 7), 2));
      QVERIFY(!store->best_match(test::made_up_prompt(40, 8), 2));
      QVERIFY2(log.contains("/c-7.kvsnap is truncated (36 bytes, less than its header)"), log.all().c_str());
      QCOMPARE(store->folder_bytes(), static_cast<std::int64_t>(fs::file_size(own + "/c-2.kvsnap")));
      QVERIFY(pool.forget(7));
      QVERIFY(pool.forget(8));
      store->remove("notes");
      store->remove_all();
      QVERIFY(!fs::exists(own + "/c-2.kvsnap"));
    }
    for (const char* name : kept_names) QCOMPARE(test::read_bytes(elsewhere + "/" + name), precious);
    QCOMPARE(test::read_bytes(own + "/c-7.kvsnap"), precious);
    QVERIFY(fs::is_symlink(own + "/c-8.kvsnap"));
    QCOMPARE(fs::read_symlink(own + "/c-8.kvsnap").string(), elsewhere + "/c-1.kvsnap");

    // This model's folder a symbolic link: the store refuses the folder, and writes nothing through it.
    QTemporaryDir second, target;
    fs::create_directory_symlink(target.path().toStdString(), second.path().toStdString() + "/" + fingerprint_.hex());
    try {
      SnapshotStore store(second.path().toStdString(), 0, fingerprint_, loaded_.model->cache_shape());
      QFAIL("a store over a model folder that is a symbolic link");
    } catch (const kvchat::SnapshotError& error) {
      QVERIFY2(std::string(error.what())
                       .find(fingerprint_.hex() + " is a symbolic link or not a folder: kvchat keeps "
                                                  "snapshots only in a folder of its own") != std::string::npos,
               error.what());
    }
    QVERIFY(fs::is_empty(target.path().toStdString()));
  }

  // A snapshot claiming more tokens than the model's context, its checksums valid, hard-linked twelve
  // times: never read past its header (no token of it is held in memory), never used, never deleted.
  void a_snapshot_longer_than_the_context_is_left_alone() {
    QTemporaryDir folder;
    const std::string directory = folder.path().toStdString() + "/" + fingerprint_.hex();
    fs::create_directories(directory);
    const kvchat::KvCacheShape shape = loaded_.model->cache_shape();
    test::CraftedSnapshot crafted;
    crafted.fingerprint = fingerprint_.hash;
    crafted.layers = static_cast<std::uint64_t>(shape.layers);
    crafted.kv_heads = static_cast<std::uint64_t>(shape.kv_heads);
    crafted.head_dim = static_cast<std::uint64_t>(shape.head_dim);
    crafted.tokens = std::int64_t(1) << 20;
    crafted.token = 1;
    crafted.data_bytes = kvchat::snapshot_data_bytes(shape, crafted.tokens);
    QVERIFY(test::write_crafted_snapshot(directory + "/long-0.kvsnap", crafted));
    for (int link = 1; link < 12; ++link)
      fs::create_hard_link(directory + "/long-0.kvsnap", directory + "/long-" + std::to_string(link) + ".kvsnap");
    const std::vector<TokenId> prompt(40, 1);  // its first 40 tokens are the prompt
    test::LogCapture log;
    SessionPool pool(loaded_.model, make_store(folder));
    const GenerationResult result = pool.acquire(1, KvCacheMode::Contiguous).generate(prompt, test::greedy(4));
    QCOMPARE(result.stats.restored_tokens, 0);
    kvchat::Session fresh(loaded_.model, KvCacheMode::Contiguous);
    QCOMPARE(result.generated, fresh.generate(prompt, test::greedy(4)).generated);
    QVERIFY2(log.contains("/long-0.kvsnap holds 1048576 tokens, more than this model's context of 512"),
             log.all().c_str());
    for (int link = 0; link < 12; ++link) QVERIFY(fs::exists(directory + "/long-" + std::to_string(link) + ".kvsnap"));
  }

  // Four snapshots share the prompt's first 17, 200, 203 and 205 tokens (three of them in the same summary
  // block): the lookup finds exactly the 205 and the restore gives a fresh prefill's ids.
  void the_longest_shared_prefix_is_found_exactly() {
    QTemporaryDir folder;
    auto store = make_store(folder);
    const std::vector<TokenId> base = test::made_up_prompt(300, 5);
    {
      SessionPool pool(loaded_.model, store);
      const int diverging[] = {200, 17, 205, 203};
      for (int conversation = 1; conversation <= 4; ++conversation) {
        std::vector<TokenId> prompt(base.begin(), base.begin() + 240);
        prompt[static_cast<std::size_t>(diverging[conversation - 1])] = static_cast<TokenId>(450 + conversation);
        pool.acquire(conversation, KvCacheMode::Contiguous).generate(prompt, test::greedy(2));
        QVERIFY(pool.save_snapshot(conversation));
      }
      store->flush();
    }
    QCOMPARE(store->summary_block_tokens(), std::int64_t{16});
    const std::optional<SnapshotStore::Match> match = store->best_match(base, 1);
    QVERIFY(match);
    QCOMPARE(match->key, std::string("c-3"));
    QCOMPARE(match->tokens, std::int64_t{205});
    QCOMPARE(match->snapshot_tokens, std::int64_t{241});
    QVERIFY(!store->best_match(base, 206));
    const std::vector<TokenId> shorter(base.begin(), base.begin() + 201);
    QCOMPARE(store->best_match(shorter, 1)->tokens, std::int64_t{201});
    SessionPool pool(loaded_.model, store);
    const GenerationResult restored = pool.acquire(9, KvCacheMode::Contiguous).generate(base, test::greedy(6));
    QCOMPARE(restored.stats.restored_tokens, 205);
    QCOMPARE(restored.stats.restored_from, std::string("c-3"));
    kvchat::Session fresh(loaded_.model, KvCacheMode::Contiguous);
    QCOMPARE(restored.generated, fresh.generate(base, test::greedy(6)).generated);
  }

  // What a lookup finds does not depend on the writer's progress: with the writer held back (its callback
  // blocks after the first write), a queued snapshot and the one being written are matched from memory, the
  // file a newer snapshot will replace is not used, and a restore from memory gives a fresh prefill's ids.
  void a_snapshot_not_yet_written_is_found_from_memory() {
    QTemporaryDir folder;
    auto store = make_store(folder);
    std::mutex mutex;
    std::condition_variable released_signal, written_signal;
    bool released = false;
    int written = 0;
    store->set_written_callback([&](const std::string&, std::int64_t, std::int64_t, std::int64_t) {
      std::unique_lock<std::mutex> lock(mutex);
      ++written;
      written_signal.notify_all();
      released_signal.wait(lock, [&] { return released; });
    });
    auto release = [&] {
      {
        std::lock_guard<std::mutex> lock(mutex);
        released = true;
      }
      released_signal.notify_all();
    };
    // However the test ends: a writer left waiting in the callback would hold the store's destructor forever.
    struct ReleaseOnExit {
      std::function<void()> release;
      ~ReleaseOnExit() { release(); }
    } release_on_exit{release};
    const std::vector<TokenId> base = test::made_up_prompt(120, 9);
    SessionPool pool(loaded_.model, store);
    // Conversation 1 shares the first 60 tokens with `base`, conversation 2 the first 90.
    std::vector<TokenId> first(base.begin(), base.begin() + 100), second(base.begin(), base.begin() + 100);
    first[60] = 461;
    second[90] = 462;
    pool.acquire(1, KvCacheMode::Contiguous).generate(first, test::greedy(2));
    QVERIFY(pool.save_snapshot(1));
    {
      std::unique_lock<std::mutex> lock(mutex);
      QVERIFY(written_signal.wait_for(lock, std::chrono::seconds(30), [&] { return written == 1; }));
    }
    // c-1 is on disk now, and the writer is still "writing" it: matched from memory, its file left out.
    QVERIFY(!store->best_match(base, 1));
    std::optional<SnapshotStore::PendingMatch> pending = store->best_pending_match(base, 1);
    QVERIFY(pending);
    QCOMPARE(pending->key, std::string("c-1"));
    QCOMPARE(pending->tokens, std::int64_t{60});
    pool.acquire(2, KvCacheMode::Contiguous).generate(second, test::greedy(2));
    QVERIFY(pool.save_snapshot(2));  // queued behind the held writer
    pending = store->best_pending_match(base, 1);
    QCOMPARE(pending->key, std::string("c-2"));
    QCOMPARE(pending->tokens, std::int64_t{90});
    QVERIFY(!store->best_pending_match(base, 91));
    QVERIFY(!fs::exists(store->path_for("c-2")));
    {
      SessionPool other(loaded_.model, store);  // no file of c-2 yet: only memory holds those 90 tokens
      const GenerationResult restored = other.acquire(9, KvCacheMode::Contiguous).generate(base, test::greedy(6));
      QCOMPARE(restored.stats.restored_tokens, 90);
      QCOMPARE(restored.stats.restored_from, std::string("c-2"));
      kvchat::Session fresh(loaded_.model, KvCacheMode::Contiguous);
      QCOMPARE(restored.generated, fresh.generate(base, test::greedy(6)).generated);
    }
    release();
    store->flush();
    QVERIFY(!store->best_pending_match(base, 1));
    const std::optional<SnapshotStore::Match> match = store->best_match(base, 1);
    QVERIFY(match);
    QCOMPARE(match->key, std::string("c-2"));
    QCOMPARE(match->tokens, std::int64_t{90});
    store->set_written_callback({});
  }

  // 2 x 4096 layers x 4096 heads x 65536 dims x 2^21 tokens x 4 bytes is 2^64 bytes, 0 in 64 bits: a
  // header claiming that shape and no K/V data at all "adds up" unless the product is checked.
  void a_header_whose_sizes_wrap_around_is_rejected() {
    QTemporaryDir folder;
    const std::string path = folder.path().toStdString() + "/wrap.kvsnap";
    test::CraftedSnapshot crafted;
    crafted.fingerprint = fingerprint_.hash;
    crafted.layers = 4096;
    crafted.kv_heads = 4096;
    crafted.head_dim = 65536;
    crafted.tokens = std::int64_t(1) << 21;
    crafted.token = 1;
    crafted.data_bytes = 0;
    QVERIFY(test::write_crafted_snapshot(path, crafted));
    try {
      kvchat::read_snapshot_header(path);
      QFAIL("a header whose sizes wrap around was accepted");
    } catch (const kvchat::SnapshotError& error) {
      QCOMPARE(std::string(error.what()),
               "snapshot " + path + ": its header's shape gives more bytes than a file can hold");
      QVERIFY(error.kind == kvchat::SnapshotError::Kind::Damaged);
    }
  }

  // Keyed checksums: a snapshot is restored by the installation that wrote it; another installation's
  // key (or none) leaves it alone and unused; one edited with its checksums recomputed without the
  // secret is rejected; an unkeyed one where the installation keys its own is deleted.
  void snapshots_are_keyed_by_installation() {
    const SnapshotKey mine = key_of_installation(0x1111, 1), theirs = key_of_installation(0x2222, 2);
    QTemporaryDir folder;
    const std::string path = write_first_turn(folder, mine);
    const QByteArray valid = test::read_bytes(path);
    QCOMPARE(test::field_of<std::uint64_t>(valid, test::kSnapshotInstallationAt), std::uint64_t{0x1111});
    QCOMPARE(second_turn(folder, mine).stats.restored_tokens, static_cast<int>(first_prompt_.size()) + 19);

    expect_rejected(folder, path, valid, "was written by another kvchat installation", Then::LeftAlone, theirs);
    expect_rejected(folder, path, valid, "was written by another kvchat installation", Then::LeftAlone, SnapshotKey{});

    // A token id edited and every checksum recomputed, without the secret: not this installation's.
    QByteArray edited = valid;
    const TokenId last = test::field_of<TokenId>(valid, 128 + 4 * 58);
    test::set_field<TokenId>(edited, 128 + 4 * 58, last == 7 ? 8 : 7);
    expect_rejected(folder, path, test::with_token_checksum(edited, SnapshotKey{}), "header checksum mismatch",
                    Then::LeftAlone, mine);
    // The same edit with the secret (what this installation would write) passes every check.
    QVERIFY(test::write_bytes(path, test::with_token_checksum(edited, mine)));
    QCOMPARE(kvchat::read_snapshot_header(path, mine).tokens.back(), last == 7 ? 8 : 7);

    // A snapshot of the unkeyed form (as written before the installation had a key) is deleted.
    QTemporaryDir unkeyed;
    const std::string unkeyed_path = write_first_turn(unkeyed);
    expect_rejected(unkeyed, unkeyed_path, test::read_bytes(unkeyed_path), "has no installation key", Then::Deleted,
                    mine);
  }

  // describe(key) reads a chat's snapshot header only (a damaged K/V section does not stop it, as it stops
  // a restore); a chat with none, another installation's file and a truncated one give nothing, and are
  // left exactly as they are.
  void a_snapshot_is_described_from_its_header_alone() {
    const SnapshotKey mine = key_of_installation(0x1111, 1), theirs = key_of_installation(0x2222, 2);
    QTemporaryDir folder;
    const std::string path = write_first_turn(folder, mine);
    const QByteArray valid = test::read_bytes(path);
    auto store = make_store(folder, mine);
    QCOMPARE(store->path_for("c-1"), path);
    const auto described = store->describe("c-1");
    QVERIFY(described);
    QCOMPARE(described->token_count, std::int64_t{40 + 19});
    QCOMPARE(described->fingerprint, fingerprint_.hash);
    QCOMPARE(described->file_bytes, static_cast<std::int64_t>(valid.size()));
    QVERIFY(!store->describe("c-2"));

    QByteArray damaged_data = valid;
    damaged_data[valid.size() - 1] = static_cast<char>(damaged_data[valid.size() - 1] ^ 0x10);
    QVERIFY(test::write_bytes(path, damaged_data));
    const auto header_only = store->describe("c-1");
    QVERIFY2(header_only, "the K/V data is not read to describe a snapshot");
    QCOMPARE(header_only->token_count, std::int64_t{40 + 19});
    QCOMPARE(test::read_bytes(path), damaged_data);
    QVERIFY(test::write_bytes(path, valid));

    QVERIFY(!make_store(folder, theirs)->describe("c-1"));
    QVERIFY(!make_store(folder, SnapshotKey{})->describe("c-1"));
    QCOMPARE(test::read_bytes(path), valid);

    for (int size : {0, 100, 130, static_cast<int>(valid.size()) / 2, static_cast<int>(valid.size()) - 1}) {
      const QByteArray truncated = valid.left(size);
      QVERIFY(test::write_bytes(path, truncated));
      QVERIFY2(!store->describe("c-1"), qPrintable(QStringLiteral("truncated to %1 bytes").arg(size)));
      QVERIFY2(fs::exists(path) && test::read_bytes(path) == truncated, "describing never deletes");
    }
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
