#include "engine/bench/benchmark.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <dlfcn.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <random>
#include <stdexcept>

#include "engine/cache/kv_block_pool.h"
#include "engine/cache/kv_cache.h"
#include "engine/cache/paged_kv_cache.h"
#include "engine/compute/compute_options.h"
#include "engine/generation/session.h"
#include "engine/kernels/memory_probe.h"
#include "engine/kernels/thread_pool.h"
#include "engine/model/decode_context.h"
#include "engine/model/llama_model.h"

namespace kvchat {

namespace {
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Best of a few runs of C[m,n] = A[m,k] B[k,n] at the size of a prefill chunk of a 1B-class model.
double measure_sgemm_gflop_s() {
  c10::InferenceMode guard;
  const std::int64_t m = 512, k = 2048, n = 2048;
  at::Tensor a = at::randn({m, k}), b = at::randn({n, k}), c = at::empty({m, n});
  at::mm_out(c, a, b.t());  // warm-up: thread start, page faults
  double best = 0;
  for (int run = 0; run < 5; ++run) {
    auto start = Clock::now();
    at::mm_out(c, a, b.t());
    best = std::max(best, 2.0 * m * n * k / seconds_since(start) / 1e9);
  }
  return best;
}
}  // namespace

HardwareCeilings measure_hardware_ceilings(int threads) {
  enter_compute_phase(ComputePhase::Library);  // every BLAS thread: the machine's sgemm ceiling
  HardwareCeilings ceilings;
  ceilings.read_bandwidth_gb_s =
      kernels::measure_read_bandwidth(threads, std::size_t(256) << 20, 10).gigabytes_per_second;
  ceilings.sgemm_gflop_s = measure_sgemm_gflop_s();
  using CoreName = char* (*)();
  if (const auto core_name = reinterpret_cast<CoreName>(dlsym(RTLD_DEFAULT, "openblas_get_corename"))) {
    ceilings.blas_kernels = core_name();
    ceilings.blas_kernels_forced = std::getenv("OPENBLAS_CORETYPE") != nullptr;
  }
  return ceilings;
}

double prefill_flops_per_token(const LlamaModel& model) {
  const ModelConfig& c = model.config();
  const double q = double(c.num_attention_heads * c.head_dim), kv = double(c.num_key_value_heads * c.head_dim);
  const double per_layer = c.hidden_size * (q + 2 * kv) + q * c.hidden_size + 3.0 * c.hidden_size * c.intermediate_size;
  return 2.0 * per_layer * double(c.num_hidden_layers);
}

std::int64_t peak_rss_bytes() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

std::int64_t current_rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

namespace {
std::size_t paired_probe_bytes(const LlamaModel& model) {
  const Linear& head = model.weights().lm_head;
  const bool contiguous = head.is_quantized() || head.weight.is_contiguous();
  return contiguous ? std::min(kPairedProbeBytes, static_cast<std::size_t>(head.bytes())) : 0;
}
}  // namespace

bool pairs_bandwidth_probes(const LlamaModel& model) {
  // Weights of at least 1 GiB are far beyond any last-level cache, and the lm_head is large enough.
  return model.weight_bytes() >= (std::int64_t(1) << 30) && paired_probe_bytes(model) >= kPairedProbeMinimumBytes;
}

BenchRun run_generation_benchmark(const std::shared_ptr<const LlamaModel>& model, KvCacheMode mode, int prompt_tokens,
                                  int new_tokens, const BenchGeneration& how) {
  const bool probe_between_steps = how.probe_between_steps;
  const std::size_t probe_bytes = paired_probe_bytes(*model);
  if (probe_between_steps && probe_bytes < 4096)
    throw std::invalid_argument("bandwidth probes between steps need a contiguous lm_head of at least 4 KiB");
  std::mt19937 generator(1234);
  std::uniform_int_distribution<TokenId> token(3, static_cast<TokenId>(model->config().vocab_size - 1));
  std::vector<TokenId> prompt(static_cast<std::size_t>(std::max(1, prompt_tokens)));
  prompt[0] = model->config().bos_token_id >= 0 ? static_cast<TokenId>(model->config().bos_token_id) : 1;
  for (std::size_t i = 1; i < prompt.size(); ++i)
    prompt[i] =
        how.repeating_prompt && i > kRepeatedPassageTokens ? prompt[i - kRepeatedPassageTokens] : token(generator);

  GenerationConfig config;
  config.cache_mode = mode;
  config.kv_dtype = how.kv_dtype;
  config.max_new_tokens = new_tokens;
  config.stop_token_ids = {-1};  // never stop early: every run makes the same number of tokens
  config.speculative = how.speculative;
  // For token i: when it arrived, and when the next step started (after the probe, if any).
  std::vector<Clock::time_point> arrived, resumed;
  std::vector<double> probed_gb_s;
  arrived.reserve(static_cast<std::size_t>(new_tokens));
  resumed.reserve(static_cast<std::size_t>(new_tokens));
  probed_gb_s.reserve(static_cast<std::size_t>(new_tokens));
  const void* probe_data = model->weights().lm_head.data();
  Session session(model, mode);
  auto start = Clock::now();
  GenerationResult result = session.generate(prompt, config, nullptr, [&](TokenId, const DecodeProgress&) {
    arrived.push_back(Clock::now());
    if (probe_between_steps && static_cast<int>(arrived.size()) < new_tokens) {
      enter_compute_phase(ComputePhase::Streaming);  // as during decode: the kernels' threads only
      probed_gb_s.push_back(
          kernels::measure_read_bandwidth_of(probe_data, probe_bytes, kernels::default_thread_pool(), 1).best);
    }
    resumed.push_back(Clock::now());
  });

  BenchRun run;
  run.stats = result.stats;
  run.generated = result.generated;
  // Step i (i >= 1) ran from resumed[i-1] to arrived[i].
  const std::size_t steps = arrived.size() > 1 ? arrived.size() - 1 : 0;
  std::vector<double> step_seconds(steps);
  double probe_seconds = 0, decode_seconds = 0;
  for (std::size_t i = 1; i < arrived.size(); ++i) {
    step_seconds[i - 1] = std::chrono::duration<double>(arrived[i] - resumed[i - 1]).count();
    decode_seconds += step_seconds[i - 1];
  }
  for (std::size_t i = 0; i < arrived.size(); ++i)
    probe_seconds += std::chrono::duration<double>(resumed[i] - arrived[i]).count();
  run.total_ms = (seconds_since(start) - probe_seconds) * 1000.0;
  if (decode_seconds > 0) run.decode_tok_s = double(steps) / decode_seconds;
  // Decode speed over a window of steps at the start and at the end of the run.
  const std::size_t window = std::max<std::size_t>(1, std::min<std::size_t>(16, steps / 4));
  auto rate = [&](std::size_t first, std::size_t last) {
    double seconds = 0;
    for (std::size_t i = first; i < last; ++i) seconds += step_seconds[i];
    return seconds > 0 ? double(last - first) / seconds : 0.0;
  };
  if (steps >= 1) {
    run.decode_tok_s_start = rate(0, std::min(window, steps));
    run.decode_tok_s_end = rate(steps - std::min(window, steps), steps);
  }
  if (probe_between_steps && steps >= 1 && probed_gb_s.size() >= steps) {
    double readable_bytes = 0;  // what the machine could have read during the steps
    for (std::size_t i = 0; i < steps; ++i) readable_bytes += probed_gb_s[i] * 1e9 * step_seconds[i];
    run.paired_bandwidth_gb_s = readable_bytes / decode_seconds / 1e9;
    run.decode_fraction_of_paired_bandwidth = double(steps) * double(model->weight_bytes()) / readable_bytes;
    run.bandwidth_probes = static_cast<int>(steps);
  }
  run.peak_rss_bytes = peak_rss_bytes();
  run.rss_bytes = current_rss_bytes();
  return run;
}

BatchRun run_batch_benchmark(const std::shared_ptr<const LlamaModel>& model, int batch, int prompt_tokens,
                             int new_tokens) {
  c10::InferenceMode inference_guard;
  if (!model->rows_match_decode_steps())
    throw std::invalid_argument("a batched decode needs the engine kernels (--kernels on) and weights they take");
  const std::int64_t vocab = model->config().vocab_size;
  const KvCacheShape shape = model->cache_shape();
  const bool paged = PagedKvCache::accepts(shape);
  const int length = std::max(1, prompt_tokens), common = length / 2;
  const std::int64_t blocks_each = (length + new_tokens + kBenchBlockTokens - 1) / kBenchBlockTokens + 1;
  std::unique_ptr<KvBlockPool> pool;
  if (paged) pool = std::make_unique<KvBlockPool>(shape, kBenchBlockTokens, blocks_each * batch);
  std::vector<std::unique_ptr<KvCache>> caches;
  std::vector<KvCache*> rows;
  std::vector<TokenId> next(static_cast<std::size_t>(batch));
  DecodeContext buffers;
  std::mt19937 common_generator(4321);
  std::uniform_int_distribution<TokenId> token(3, static_cast<TokenId>(vocab - 1));
  std::vector<TokenId> common_ids(static_cast<std::size_t>(common));
  for (TokenId& id : common_ids) id = token(common_generator);
  std::unique_ptr<PagedKvCache> common_cache;  // the common half, prefilled once: the first sequence's cache
  const auto run_start = Clock::now();
  std::vector<double> first_token_ms;
  if (paged && common > 0) {
    common_cache = std::make_unique<PagedKvCache>(*pool);
    model->decode_rows(common_ids.data(), common, 0, *common_cache, buffers);
  }
  // The others fork it before the first sequence writes past the common half into it.
  std::vector<std::unique_ptr<PagedKvCache>> forks;
  for (int i = 1; common_cache && i < batch; ++i) forks.push_back(common_cache->fork());
  for (int i = 0; i < batch; ++i) {
    std::mt19937 generator(1234 + static_cast<unsigned>(i));
    std::vector<TokenId> prompt = common_ids;
    while (static_cast<int>(prompt.size()) < length) prompt.push_back(token(generator));
    std::int64_t cached = 0;
    if (common > 0 && paged) {
      caches.push_back(i == 0 ? std::move(common_cache) : std::move(forks[static_cast<std::size_t>(i - 1)]));
      cached = common;
    } else if (paged) {
      caches.push_back(std::make_unique<PagedKvCache>(*pool));
    } else {
      caches.push_back(make_kv_cache(KvCacheMode::Contiguous, shape));
    }
    rows.push_back(caches.back().get());
    model->decode_rows(prompt.data() + cached, static_cast<std::int64_t>(prompt.size()) - cached, cached,
                       *caches.back(), buffers);
    const float* logits = buffers.row_logits.data() + (prompt.size() - cached - 1) * vocab;
    next[i] = static_cast<TokenId>(std::max_element(logits, logits + vocab) - logits);
    first_token_ms.push_back(seconds_since(run_start) * 1000.0);
  }
  BatchRun run;
  run.batch = batch;
  run.first_token_ms = std::move(first_token_ms);
  run.first_sequence.push_back(next[0]);
  const auto start = Clock::now();
  for (int step = 1; step < new_tokens; ++step) {
    model->decode_batch(next.data(), rows.data(), batch, buffers);
    for (int i = 0; i < batch; ++i) {
      const float* logits = buffers.row_logits.data() + static_cast<std::int64_t>(i) * vocab;
      next[i] = static_cast<TokenId>(std::max_element(logits, logits + vocab) - logits);
    }
    run.first_sequence.push_back(next[0]);
  }
  const double seconds = seconds_since(start);
  const int steps = std::max(1, new_tokens - 1);
  run.step_ms = seconds * 1000.0 / steps;
  run.per_sequence_tok_s = seconds > 0 ? steps / seconds : 0.0;
  run.aggregate_tok_s = run.per_sequence_tok_s * batch;
  if (pool) {
    run.paged = true;
    run.kv_blocks_used = pool->blocks_in_use();
    run.kv_blocks_shared = pool->shared_blocks();
    run.kv_block_copies = pool->copies_made();
  }
  return run;
}

std::vector<double> rows_pass_milliseconds(const std::shared_ptr<const LlamaModel>& model, int context_tokens,
                                           const std::vector<int>& rows, int repeats) {
  c10::InferenceMode inference_guard;
  if (!model->rows_match_decode_steps()) return std::vector<double>(rows.size(), 0.0);
  const std::vector<TokenId> context(static_cast<std::size_t>(std::max(1, context_tokens)), 3);
  auto cache = make_kv_cache(KvCacheMode::Contiguous, model->cache_shape());
  DecodeContext buffers;
  const auto cached = static_cast<std::int64_t>(context.size());
  model->decode_rows(context.data(), cached, 0, *cache, buffers);
  std::vector<double> result;
  for (int count : rows) {
    const std::vector<TokenId> ids(static_cast<std::size_t>(count), 5);
    std::vector<double> times;
    for (int repeat = 0; repeat <= repeats; ++repeat) {  // the first pass warms up
      const auto start = Clock::now();
      model->decode_rows(ids.data(), count, cached, *cache, buffers);
      if (repeat > 0) times.push_back(seconds_since(start) * 1000.0);
      cache->truncate(cached);
    }
    std::sort(times.begin(), times.end());
    result.push_back(times.empty() ? 0.0 : times[times.size() / 2]);
  }
  return result;
}

}  // namespace kvchat
