#include "engine/bench/snapshot_benchmark.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>

#include "engine/cache/kv_snapshot.h"
#include "engine/cache/session_pool.h"
#include "engine/cache/snapshot_store.h"
#include "engine/generation/session.h"
#include "engine/model/llama_model.h"

namespace kvchat {

namespace {

using Clock = std::chrono::steady_clock;

// The bench's own snapshot names: the conversation's snapshot as written by hand, and the pool's.
constexpr const char* kWrittenKey = "snapshot-bench";
constexpr const char* kPoolKeyPrefix = "snapshot-bench-pool";
constexpr SessionPool::ConversationId kConversation = 1;

double ms_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

double megabytes_per_second(std::int64_t bytes, double milliseconds) {
  return milliseconds > 0 ? static_cast<double>(bytes) / 1e6 / (milliseconds / 1e3) : 0.0;
}

std::int64_t file_bytes_of(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 ? static_cast<std::int64_t>(info.st_size) : 0;
}

// The fraction of the file's pages in the page cache: mincore over a mapping, which reads nothing in.
double page_cache_fraction(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  double fraction = -1;
  struct stat info {};
  if (::fstat(fd, &info) == 0 && info.st_size > 0) {
    const auto bytes = static_cast<std::size_t>(info.st_size);
    void* mapping = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (mapping != MAP_FAILED) {
      const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
      std::vector<unsigned char> pages((bytes + page - 1) / page);
      if (::mincore(mapping, bytes, pages.data()) == 0) {
        std::size_t resident = 0;
        for (unsigned char flags : pages) resident += flags & 1;
        fraction = static_cast<double>(resident) / static_cast<double>(pages.size());
      }
      ::munmap(mapping, bytes);
    }
  }
  ::close(fd);
  return fraction;
}

// Asks the kernel to drop the file's pages from the page cache. Best effort: only clean pages go (the
// file was fsynced when written), and the kernel may keep some; page_cache_fraction tells what stayed.
bool drop_page_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool accepted = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0;
  ::close(fd);
  return accepted;
}

GenerationConfig reply_config(int tokens) {
  GenerationConfig config;
  config.cache_mode = KvCacheMode::Contiguous;
  config.max_new_tokens = tokens;
  config.stop_token_ids = {-1};  // never stop early: every reply has the same length
  return config;
}

// A reply, and when each of its tokens arrived.
struct TimedReply {
  GenerationResult result;
  std::vector<Clock::time_point> arrived;
};

TimedReply generate_timed(Session& session, const std::vector<TokenId>& prompt, int tokens) {
  TimedReply reply;
  reply.arrived.reserve(static_cast<std::size_t>(tokens));
  reply.result = session.generate(prompt, reply_config(tokens), nullptr,
                                  [&](TokenId, const DecodeProgress&) { reply.arrived.push_back(Clock::now()); });
  return reply;
}

// Decode steps first+1..last per second (step i runs from token i-1's arrival to token i's).
double steps_per_second(const std::vector<Clock::time_point>& arrived, std::size_t first, std::size_t last) {
  if (last <= first || last >= arrived.size()) return 0.0;
  const double seconds = std::chrono::duration<double>(arrived[last] - arrived[first]).count();
  return seconds > 0 ? static_cast<double>(last - first) / seconds : 0.0;
}

std::vector<TokenId> joined(std::vector<TokenId> head, const std::vector<TokenId>& tail) {
  head.insert(head.end(), tail.begin(), tail.end());
  return head;
}

// Where the bench's snapshots live, and their removal (before, so that a run killed earlier cannot hand
// its longer snapshot to this one's restore, and after).
struct BenchFolder {
  std::string directory;
  ModelFingerprint fingerprint;
  KvCacheShape shape;

  std::string model_directory() const { return directory + "/" + fingerprint.hex(); }
  std::string written_path() const { return model_directory() + "/" + kWrittenKey + ".kvsnap"; }
  std::shared_ptr<SnapshotStore> open_store() const {
    return std::make_shared<SnapshotStore>(directory, 0, fingerprint, shape);
  }
  void remove_bench_files() const {
    const std::string pool_key = std::string(kPoolKeyPrefix) + "-" + std::to_string(kConversation);
    for (const std::string& key : {std::string(kWrittenKey), pool_key})
      ::unlink((model_directory() + "/" + key + ".kvsnap").c_str());
    std::error_code error;
    std::filesystem::remove(model_directory(), error);  // only when empty: other snapshots stay
  }
};

// 1 and 2: the full prefill, the conversation's snapshot captured and written as the store's thread
// writes it, and the reference reply on the cache the prefill built.
void measure_prefill_and_write(const std::shared_ptr<const LlamaModel>& model, const BenchFolder& folder,
                               const std::vector<TokenId>& conversation, const std::vector<TokenId>& followup,
                               int reply_tokens, SnapshotBenchResult& result) {
  Session session(model, KvCacheMode::Contiguous);  // no restorer: this one always prefills
  const GenerationResult first = session.generate(conversation, reply_config(1));
  result.prefill_ttft_ms = first.stats.ttft_ms;
  result.prefill_tok_s = first.stats.prefill_tokens_per_second;

  auto started = Clock::now();
  std::unique_ptr<KvSnapshot> snapshot = session.capture();
  result.capture_ms = ms_between(started, Clock::now());
  if (!snapshot) throw std::runtime_error("the prefilled session holds no cache to snapshot");
  result.snapshot_tokens = static_cast<std::int64_t>(snapshot->tokens.size());
  std::filesystem::create_directories(folder.model_directory());
  started = Clock::now();
  write_snapshot_file(folder.written_path(), *snapshot, folder.fingerprint.hash);
  result.write_ms = ms_between(started, Clock::now());
  result.file_bytes = file_bytes_of(folder.written_path());
  result.write_mb_s = megabytes_per_second(result.file_bytes, result.write_ms);
  snapshot.reset();

  const GenerationResult reference = session.generate(joined(conversation, followup), reply_config(reply_tokens));
  result.reference_ids = reference.generated;
}

// 3: the conversation and its new turn continued by `pool` (nothing in memory), from the snapshot.
SnapshotRestoreRun measure_restore(SessionPool& pool, const BenchFolder& folder, const std::vector<TokenId>& prompt,
                                   bool cold, const SnapshotBenchResult& result, int reply_tokens) {
  SnapshotRestoreRun run;
  if (cold) run.cache_drop_requested = drop_page_cache(folder.written_path());
  run.resident_before = page_cache_fraction(folder.written_path());
  Session& session = pool.acquire(kConversation, KvCacheMode::Contiguous);
  const TimedReply reply = generate_timed(session, prompt, reply_tokens);
  const GenerationStats& stats = reply.result.stats;
  run.ttft_ms = stats.ttft_ms;
  run.restore_ms = stats.restore_ms;
  run.restore_mb_s = megabytes_per_second(result.file_bytes, stats.restore_ms);
  run.restored_tokens = stats.restored_tokens;
  run.restored_from = stats.restored_from;
  run.decode_tok_s = stats.decode_tokens_per_second;
  run.generated = reply.result.generated;
  run.ids_identical = run.generated == result.reference_ids;
  return run;
}

// 4: two more replies of the conversation, each continuing from the last one's final token (one token
// to prefill, then decode steps only): the first with no write in flight, the second with a snapshot
// of the whole conversation queued on the store's thread just before it.
void measure_decode_under_write(SessionPool& pool, SnapshotStore& store, std::vector<TokenId> prompt, int reply_tokens,
                                SnapshotBenchResult& result) {
  Session& session = pool.acquire(kConversation, KvCacheMode::Contiguous);
  const TimedReply idle = generate_timed(session, prompt, reply_tokens);
  result.decode_tok_s_idle = steps_per_second(idle.arrived, 0, idle.arrived.size() - 1);
  prompt = joined(std::move(prompt), idle.result.generated);

  std::mutex mutex;
  std::optional<Clock::time_point> written_at;
  store.set_written_callback([&](const std::string&, std::int64_t, std::int64_t file_bytes, std::int64_t) {
    std::lock_guard<std::mutex> lock(mutex);
    written_at = Clock::now();
    result.background_file_bytes = file_bytes;
  });
  const auto saving = Clock::now();
  if (!pool.save_snapshot(kConversation)) throw std::runtime_error("the conversation's snapshot was not queued");
  const auto queued = Clock::now();
  result.background_capture_ms = ms_between(saving, queued);
  result.background_tokens = static_cast<std::int64_t>(session.history().size());
  const TimedReply writing = generate_timed(session, prompt, reply_tokens);
  store.flush();
  store.set_written_callback({});
  if (!written_at) throw std::runtime_error("the background snapshot write failed (see the log)");

  const std::size_t steps = writing.arrived.size() - 1;
  std::size_t during = 0;  // steps that ended while the write was in flight
  while (during < steps && writing.arrived[during + 1] <= *written_at) ++during;
  result.decode_steps = static_cast<int>(steps);
  result.decode_steps_during_write = static_cast<int>(during);
  result.decode_tok_s_writing = steps_per_second(writing.arrived, 0, steps);
  result.decode_tok_s_during_write = steps_per_second(writing.arrived, 0, during);
  // From the save call, not from its return: a small write can end on the store's thread before save returns.
  result.background_write_ms = ms_between(saving, *written_at);
}

}  // namespace

std::vector<TokenId> seeded_token_ids(const LlamaModel& model, int count, unsigned seed, bool with_bos) {
  std::mt19937 generator(seed);
  std::uniform_int_distribution<TokenId> token(3, static_cast<TokenId>(model.config().vocab_size - 1));
  std::vector<TokenId> ids(static_cast<std::size_t>(std::max(0, count)));
  for (TokenId& id : ids) id = token(generator);
  if (with_bos && !ids.empty())
    ids[0] = model.config().bos_token_id >= 0 ? static_cast<TokenId>(model.config().bos_token_id) : 1;
  return ids;
}

std::int64_t snapshot_bench_context_tokens(const SnapshotBenchConfig& config) {
  return std::int64_t(config.conversation_tokens) + config.followup_tokens + 3LL * config.reply_tokens;
}

SnapshotBenchResult run_snapshot_benchmark(const std::shared_ptr<const LlamaModel>& model,
                                           const SnapshotBenchConfig& config) {
  if (config.conversation_tokens < 2 || config.followup_tokens < 1 || config.reply_tokens < 2)
    throw std::invalid_argument(
        "the snapshot bench needs a conversation of 2 or more tokens, a new turn and replies of 2 or more");
  const std::int64_t needed = snapshot_bench_context_tokens(config);
  if (needed > model->config().max_position_embeddings)
    throw std::invalid_argument("the conversation, its new turn and three replies (" + std::to_string(needed) +
                                " tokens) do not fit the model's context of " +
                                std::to_string(model->config().max_position_embeddings));
  const BenchFolder folder{config.directory, fingerprint_model(*model), model->cache_shape()};
  folder.remove_bench_files();
  struct Cleanup {
    const BenchFolder& folder;
    ~Cleanup() { folder.remove_bench_files(); }
  } cleanup{folder};  // declared before any store: runs after their writers stopped

  const std::vector<TokenId> conversation = seeded_token_ids(*model, config.conversation_tokens, 1234, true);
  const std::vector<TokenId> followup = seeded_token_ids(*model, config.followup_tokens, 4321, false);
  const std::vector<TokenId> continued = joined(conversation, followup);
  SnapshotBenchResult result;
  measure_prefill_and_write(model, folder, conversation, followup, config.reply_tokens, result);
  {
    const std::shared_ptr<SnapshotStore> store = folder.open_store();
    SessionPool pool(model, store, kPoolKeyPrefix);
    pool.set_minimum_restore_tokens(1);
    result.cold = measure_restore(pool, folder, continued, true, result, config.reply_tokens);
  }
  const std::shared_ptr<SnapshotStore> store = folder.open_store();
  SessionPool pool(model, store, kPoolKeyPrefix);
  pool.set_minimum_restore_tokens(1);
  result.warm = measure_restore(pool, folder, continued, false, result, config.reply_tokens);
  measure_decode_under_write(pool, *store, joined(continued, result.warm.generated), config.reply_tokens, result);
  spdlog::info("snapshot bench: {} tokens, restore cold {:.1f} ms, warm {:.1f} ms, ids identical: {}",
               result.snapshot_tokens, result.cold.restore_ms, result.warm.restore_ms,
               result.cold.ids_identical && result.warm.ids_identical);
  return result;
}

}  // namespace kvchat
