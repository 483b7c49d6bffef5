#pragma once
// The Llama forward pass (llama2.c's shape): embedding, RMSNorm, RoPE at explicit absolute positions,
// grouped-query attention with one rectangular causal mask for prefill and decode, SwiGLU MLP, final
// norm, tied or separate lm_head. Config, weights (model_weights.h) and run state (the KvCache, the
// DecodeContext) are kept apart: the model is immutable after construction and is shared by many
// sessions.
//
// Files: llama_model.cpp (construction, request checks), llama_forward.cpp (the one layer, over row
// buffers: a prompt's tokens and a decode step's one token go through the same code), model_weights.cpp
// (loading).
#include <ATen/ATen.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "engine/cache/kv_cache.h"
#include "engine/model/decode_context.h"
#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"
#include "engine/model/rope.h"
#include "engine/types.h"

namespace kvchat {

class LlamaModel {
 public:
  LlamaModel(ModelConfig config, ModelWeights weights);

  // Loads DIR's safetensors (validated against the config: every tensor present with its shape).
  static std::shared_ptr<LlamaModel> from_checkpoint(const std::string& directory, const ModelConfig& config,
                                                     WeightDtype dtype = WeightDtype::Float32);
  // A seeded random model of the config's exact shape, in memory (benchmarks of real model sizes).
  static std::shared_ptr<LlamaModel> random(const ModelConfig& config, std::uint64_t seed,
                                            WeightDtype dtype = WeightDtype::Float32);

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  // The shape of this model's caches, rows stored in `dtype`.
  KvCacheShape cache_shape(KvDtype dtype = KvDtype::F32) const;
  const RopeTable& rope() const { return rope_; }
  std::int64_t weight_bytes() const;
  // The matrices' storage types, largest share of bytes first: "f32", "bf16", "Q4_K+Q6_K", ...
  std::string weight_types() const;
  // Throws ModelError when a file the weights map has changed on disk since it was mapped (its
  // weights would silently change, or a read past a truncated end would kill the process).
  void check_files_unchanged() const;

  // Runs `ids`, the tokens at absolute positions start_pos .. start_pos + T - 1, through the model.
  // With a cache: start_pos must equal cache->size(); attends to the cached positions plus
  // these, and commits them to the cache. Without (null): start_pos must be 0 and ids the whole
  // sequence. Returns f32 logits of the last position [vocab], or of every position [T, vocab] if
  // all_positions. Keys and values are rounded through the cache's dtype (without a cache: `kv_dtype`, so that
  // the uncached path computes what a cache of that dtype would; with one, kv_dtype is F32 or the cache's).
  at::Tensor forward(const std::vector<TokenId>& ids, std::int64_t start_pos, KvCache* cache,
                     bool all_positions = false, KvDtype kv_dtype = KvDtype::F32) const;

  // One decode step: `token` at `position` (== cache.size()), committed to the cache, its logits
  // written to context.logits: forward({token}) in the context's buffers. Over a cache with direct rows
  // and with the kernels on, a steady-state step makes no LibTorch call and allocates nothing.
  void decode(TokenId token, std::int64_t position, KvCache& cache, DecodeContext& context) const;

  // Whether decode_rows computes each of its rows to the bit as decode() would (the engine kernels are on and
  // the weights suit them): then several tokens can be checked in one pass without changing any result.
  bool rows_match_decode_steps() const;
  // `steps` tokens at positions position .. position + steps - 1 (position == cache.size()) in one pass, each
  // row computed as decode() computes a single token, committed to the cache; the logits of every row go to
  // context.row_logits [steps, vocab]. Requires rows_match_decode_steps().
  void decode_rows(const TokenId* ids, std::int64_t steps, std::int64_t position, KvCache& cache,
                   DecodeContext& context) const;
  // One decode step of several sequences at once: row i is token ids[i] of the sequence whose cache is caches[i]
  // (all different), at position caches[i]->size(), committed there. Each row is computed as decode() computes it
  // alone, to the bit, while the products read every weight once for all the rows; attention reads each row's
  // own cache. The logits of row i go to context.row_logits [rows, vocab]. Requires rows_match_decode_steps() and
  // caches that take rows in place (contiguous) of one dtype.
  void decode_batch(const TokenId* ids, KvCache* const* caches, std::int64_t rows, DecodeContext& context) const;

 private:
  // A single row's attention (a decode step) is split by KV head over the kernels' pool once a layer's
  // cached keys and values reach this many bytes; below, the dispatch costs about what the second core
  // saves. The 1B shape reaches it at 64 positions, the tiny models never do.
  static constexpr std::int64_t kParallelAttentionBytes = 256 * 1024;
  bool parallel_attention(std::int64_t positions) const;

  // How a forward's products are computed, by its number of rows (llama_forward.cpp).
  enum class ProductPath {
    SharedInput,  // one row over the engine kernels, products that share their input as one job
    RowExact,     // every row as SharedInput computes it (models whose products round their input)
    Linear,       // each matrix's own choice (Linear::forward_into): streaming kernels or GEMM
  };
  // rows_as_decode: every row as a one-row step computes it, also for dense weights (decode_rows).
  ProductPath product_path(std::int64_t rows, bool rows_as_decode = false) const;
  void products_into(ProductPath path, std::initializer_list<std::pair<const Linear*, float*>> products, const float* x,
                     std::int64_t rows) const;
  // The forward of every path: `steps` tokens as rows of `buffers` (sized for them), logits of the last
  // row (or of every row if all_positions) into `logits`. The request must have been checked.
  // row_caches (a batched step): row i belongs to the sequence of row_caches[i], at its size(); start_pos and
  // cache are then unused.
  void forward_rows(const TokenId* ids, std::int64_t steps, std::int64_t start_pos, KvCache* cache,
                    DecodeContext& buffers, float* logits, bool all_positions, bool rows_as_decode = false,
                    KvCache* const* row_caches = nullptr) const;
  // Throws for no tokens, a start that does not follow the cache, the context limit, an id outside the vocabulary.
  void check_request(const TokenId* ids, std::int64_t steps, std::int64_t start_pos, const KvCache* cache) const;
  bool fused_decode_applies() const;

  ModelConfig config_;
  ModelWeights weights_;
  bool fused_decode_ = false;  // weights suit the engine kernels' products (taken while the kernels are on)
  // Some matrix's products round their input to one byte per value (a block type): while the kernels
  // are on, every forward is row-exact (ProductPath::RowExact), so that prompts and decode steps agree
  // to the bit.
  bool row_exact_ = false;
  // Up to how many tokens a forward pass streams every matrix (the least of the matrices' own limits):
  // then the kernels' pool computes and LibTorch's threads are parked.
  std::int64_t streaming_rows_ = kStreamingRows;
  RopeTable rope_;  // cos/sin rows, grown as positions are first used
  // The sliding layers' own table where their RoPE base differs (Gemma 3's local layers); null otherwise.
  std::unique_ptr<RopeTable> local_rope_;
};

// Copies a logits row [vocab] (forward()'s result) into `logits`, which keeps its storage when sized.
void copy_logits(const at::Tensor& row, std::vector<float>& logits);

}  // namespace kvchat
