#include "engine/kernels/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace kvchat::kernels {
namespace {

// How long an idle worker keeps polling before it sleeps. Consecutive matvecs of one token are a few
// microseconds apart, so a short spin keeps the wake-up off the futex path; tokens are milliseconds
// apart, so the worker is asleep (not stealing a core from LibTorch) between them.
constexpr auto kWorkerSpin = std::chrono::microseconds(50);

// The job word: job id in the high 32 bits, a "closed" flag, and the number of workers that joined.
constexpr std::uint64_t kClosedFlag = std::uint64_t{1} << 31;
constexpr std::uint64_t kActiveMask = kClosedFlag - 1;

inline std::uint32_t job_id_of(std::uint64_t word) { return static_cast<std::uint32_t>(word >> 32); }

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// Set while a thread runs a chunk, so that a nested parallel_for runs inline instead of waiting on
// workers that are busy with the outer call.
thread_local bool t_inside_chunk = false;

struct ChunkScope {
  ChunkScope() : previous(t_inside_chunk) { t_inside_chunk = true; }
  ~ChunkScope() { t_inside_chunk = previous; }
  bool previous;
};

}  // namespace

// Protocol: the caller writes the job fields, then publishes a new job id (open, no workers joined).
// A worker that sees the new id joins by incrementing the worker count with a CAS that fails once
// the job is closed or replaced; only then does it read the job fields. The caller claims chunks
// like everybody else; when none is left it closes the job and waits for the joined workers only.
// So a worker that is slow to wake costs nothing, and the job fields are never rewritten while a
// worker may still read them.
struct ThreadPool::State {
  int threads = 1;
  std::vector<std::thread> workers;

  // Held for the duration of one job; a second caller that finds it taken runs inline.
  std::mutex submit_mutex;

  std::mutex wake_mutex;
  std::condition_variable wake_cv;
  int sleepers = 0;  // guarded by wake_mutex
  std::atomic<std::uint64_t> job_word{0};
  std::atomic<bool> stopping{false};

  // The current job.
  const std::function<void(std::int64_t, std::int64_t)>* body = nullptr;
  std::int64_t n = 0;
  std::int64_t grain = 1;
  std::int64_t units = 0;
  std::int64_t chunks = 0;
  std::int64_t guided_max_block = 0;  // > 0: guided claims of grain..guided_max_block indices
  std::atomic<std::int64_t> next_chunk{0};
  std::atomic<std::int64_t> next_index{0};  // guided: the first index not yet claimed
  std::atomic<bool> failed{false};

  std::mutex error_mutex;
  std::exception_ptr error;

  // Claims [begin, end) under guided scheduling; false when nothing is left.
  bool claim_guided(std::int64_t& begin, std::int64_t& end) {
    std::int64_t first = next_index.load(std::memory_order_relaxed);
    for (;;) {
      const std::int64_t left = n - first;
      if (left <= 0) return false;
      const std::int64_t share = (left / (2 * threads) + grain - 1) / grain * grain;
      const std::int64_t size = std::min(left, std::clamp(share, grain, guided_max_block));
      if (next_index.compare_exchange_weak(first, first + size, std::memory_order_relaxed)) {
        begin = first;
        end = first + size;
        return true;
      }
    }
  }

  // Runs the body over [begin, end); the first exception is kept for the caller and stops the job.
  void run_block(std::int64_t begin, std::int64_t end) {
    try {
      (*body)(begin, end);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      failed.store(true, std::memory_order_relaxed);
    }
  }

  void run_chunks() {
    ChunkScope scope;
    if (guided_max_block > 0) {
      std::int64_t begin = 0, end = 0;
      while (!failed.load(std::memory_order_relaxed) && claim_guided(begin, end)) run_block(begin, end);
      return;
    }
    for (;;) {
      if (failed.load(std::memory_order_relaxed)) return;
      const std::int64_t chunk = next_chunk.fetch_add(1, std::memory_order_relaxed);
      if (chunk >= chunks) return;
      const std::int64_t begin = (chunk * units / chunks) * grain;
      const std::int64_t end = std::min(n, ((chunk + 1) * units / chunks) * grain);
      if (begin < end) run_block(begin, end);
    }
  }

  std::uint32_t wait_for_new_job(std::uint32_t seen) {
    const auto spin_until = std::chrono::steady_clock::now() + kWorkerSpin;
    for (unsigned poll = 0;; ++poll) {
      const std::uint32_t current = job_id_of(job_word.load(std::memory_order_acquire));
      if (current != seen) return current;
      if ((poll & 63u) == 63u && std::chrono::steady_clock::now() >= spin_until) break;
      cpu_relax();
    }
    std::unique_lock<std::mutex> lock(wake_mutex);
    ++sleepers;
    wake_cv.wait(lock, [&] { return job_id_of(job_word.load(std::memory_order_acquire)) != seen; });
    --sleepers;
    return job_id_of(job_word.load(std::memory_order_acquire));
  }

  bool try_join(std::uint32_t id) {
    std::uint64_t word = job_word.load(std::memory_order_acquire);
    while (job_id_of(word) == id && (word & kClosedFlag) == 0) {
      if (job_word.compare_exchange_weak(word, word + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
        return true;
      }
    }
    return false;
  }

  void worker_loop() {
    std::uint32_t seen = 0;
    for (;;) {
      seen = wait_for_new_job(seen);
      if (stopping.load(std::memory_order_acquire)) return;
      if (!try_join(seen)) continue;
      run_chunks();
      job_word.fetch_sub(1, std::memory_order_acq_rel);
    }
  }

  void publish(std::uint32_t id) {
    bool anyone_sleeping = false;
    {
      std::lock_guard<std::mutex> lock(wake_mutex);
      job_word.store(static_cast<std::uint64_t>(id) << 32, std::memory_order_release);
      anyone_sleeping = sleepers > 0;
    }
    if (anyone_sleeping) wake_cv.notify_all();
  }

  std::uint32_t next_id() const { return job_id_of(job_word.load(std::memory_order_relaxed)) + 1; }
};

ThreadPool::ThreadPool(int threads) : state_(new State) {
  if (threads < 1) {
    delete state_;
    throw std::invalid_argument("ThreadPool: threads must be >= 1, got " + std::to_string(threads));
  }
  state_->threads = threads;
  state_->workers.reserve(static_cast<std::size_t>(threads - 1));
  for (int index = 1; index < threads; ++index) {
    state_->workers.emplace_back([state = state_] { state->worker_loop(); });
  }
}

ThreadPool::~ThreadPool() {
  state_->stopping.store(true, std::memory_order_release);
  state_->publish(state_->next_id());
  for (auto& worker : state_->workers) worker.join();
  delete state_;
}

int ThreadPool::size() const { return state_->threads; }

void ThreadPool::parallel_for(std::int64_t n, const std::function<void(std::int64_t, std::int64_t)>& body,
                              std::int64_t grain) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  const std::int64_t units = (n + grain - 1) / grain;
  run(n, body, grain, std::min<std::int64_t>(state_->threads, units));
}

void ThreadPool::parallel_for_blocks(std::int64_t n, const std::function<void(std::int64_t, std::int64_t)>& body,
                                     std::int64_t block) {
  if (n <= 0) return;
  if (block < 1) block = 1;
  run(n, body, block, (n + block - 1) / block);
}

void ThreadPool::parallel_for_guided(std::int64_t n, const std::function<void(std::int64_t, std::int64_t)>& body,
                                     std::int64_t min_block, std::int64_t max_block) {
  if (n <= 0) return;
  if (min_block < 1) min_block = 1;
  max_block = std::max(max_block, min_block);
  run(n, body, min_block, (n + min_block - 1) / min_block, max_block);
}

// Runs chunk i = [(i * units / chunks) * grain, ((i + 1) * units / chunks) * grain) for i < chunks,
// where units = ceil(n / grain), clipped to n; or, with guided_max_block > 0, guided claims (see
// parallel_for_guided).
void ThreadPool::run(std::int64_t n, const std::function<void(std::int64_t, std::int64_t)>& body, std::int64_t grain,
                     std::int64_t chunks, std::int64_t guided_max_block) {
  if (chunks <= 1 || state_->threads == 1 || t_inside_chunk) {
    body(0, n);
    return;
  }
  std::unique_lock<std::mutex> submit(state_->submit_mutex, std::try_to_lock);
  if (!submit.owns_lock()) {
    body(0, n);
    return;
  }

  State& s = *state_;
  s.body = &body;
  s.n = n;
  s.grain = grain;
  s.units = (n + grain - 1) / grain;
  s.chunks = chunks;
  s.guided_max_block = guided_max_block;
  s.next_chunk.store(0, std::memory_order_relaxed);
  s.next_index.store(0, std::memory_order_relaxed);
  s.failed.store(false, std::memory_order_relaxed);
  s.error = nullptr;
  s.publish(s.next_id());

  s.run_chunks();

  s.job_word.fetch_or(kClosedFlag, std::memory_order_acq_rel);
  for (unsigned poll = 0; (s.job_word.load(std::memory_order_acquire) & kActiveMask) != 0; ++poll) {
    // A joined worker that lost its core needs the scheduler; stop hogging ours after a while.
    if (poll < (1u << 16))
      cpu_relax();
    else
      std::this_thread::yield();
  }
  s.body = nullptr;
  if (s.error) {
    std::exception_ptr error = s.error;
    s.error = nullptr;
    std::rethrow_exception(error);
  }
}

namespace {

std::mutex g_default_mutex;
std::unique_ptr<ThreadPool> g_default_pool;  // guarded by g_default_mutex
std::atomic<ThreadPool*> g_default_pool_fast{nullptr};
int g_default_threads = 0;  // guarded by g_default_mutex; 0 = not chosen yet

int hardware_threads() {
  const unsigned hardware = std::thread::hardware_concurrency();
  return hardware == 0 ? 1 : static_cast<int>(hardware);
}

}  // namespace

ThreadPool& default_thread_pool() {
  if (ThreadPool* pool = g_default_pool_fast.load(std::memory_order_acquire)) return *pool;
  std::lock_guard<std::mutex> lock(g_default_mutex);
  if (!g_default_pool) {
    if (g_default_threads == 0) g_default_threads = hardware_threads();
    g_default_pool = std::make_unique<ThreadPool>(g_default_threads);
    g_default_pool_fast.store(g_default_pool.get(), std::memory_order_release);
  }
  return *g_default_pool;
}

namespace {
thread_local ThreadPool* t_current_pool = nullptr;
}  // namespace

ThreadPool& current_thread_pool() { return t_current_pool ? *t_current_pool : default_thread_pool(); }

PoolScope::PoolScope(ThreadPool* pool) : previous_(t_current_pool) {
  if (pool) t_current_pool = pool;
}

PoolScope::~PoolScope() { t_current_pool = previous_; }

void set_default_threads(int threads) {
  if (threads < 0) {
    throw std::invalid_argument("set_default_threads: threads must be >= 0, got " + std::to_string(threads));
  }
  std::lock_guard<std::mutex> lock(g_default_mutex);
  g_default_threads = threads == 0 ? hardware_threads() : threads;
  g_default_pool_fast.store(nullptr, std::memory_order_release);
  g_default_pool.reset();
  g_default_pool = std::make_unique<ThreadPool>(g_default_threads);
  g_default_pool_fast.store(g_default_pool.get(), std::memory_order_release);
}

int default_threads() {
  std::lock_guard<std::mutex> lock(g_default_mutex);
  if (g_default_threads == 0) g_default_threads = hardware_threads();
  return g_default_threads;
}

}  // namespace kvchat::kernels
