#include "engine/model/llama_model.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "engine/compute/compute_options.h"
#include "engine/kernels/quantized_matvec.h"

namespace kvchat {

void copy_logits(const at::Tensor& row, std::vector<float>& logits) {
  const at::Tensor values = row.contiguous();
  logits.assign(values.data_ptr<float>(), values.data_ptr<float>() + values.numel());
}

LlamaModel::LlamaModel(ModelConfig config, ModelWeights weights)
    : config_(std::move(config)), weights_(std::move(weights)), rope_(config_) {
  if (config_.rope_local_theta > 0) {
    ModelConfig local = config_;
    local.rope_theta = config_.rope_local_theta;
    local.rope_scaling = RopeScaling{};
    local.rope_frequency_factors.clear();
    local_rope_ = std::make_unique<RopeTable>(local);
  }
  fused_decode_ = fused_decode_applies();
  auto rounds_input = [](const Linear& l) {
    return (l.is_quantized() &&
            kernels::activation_rounding(l.quantized.view.type) != kernels::ActivationRounding::None) ||
           l.bf16_packed.defined();
  };
  bool any_rounded_input = rounds_input(weights_.lm_head);
  streaming_rows_ = weights_.lm_head.streaming_rows();
  for (const LayerWeights& layer : weights_.layers)
    for (const Linear* l : layer.matrices()) {
      any_rounded_input = any_rounded_input || rounds_input(*l);
      streaming_rows_ = std::min(streaming_rows_, l->streaming_rows());
    }
  row_exact_ = fused_decode_ && any_rounded_input;
}

std::shared_ptr<LlamaModel> LlamaModel::from_checkpoint(const std::string& directory, const ModelConfig& config,
                                                        WeightDtype dtype) {
  auto model = std::make_shared<LlamaModel>(config, load_model_weights(directory, config, dtype));
  spdlog::info("loaded {}: {} layers, hidden {}, heads {}/{} (kv), vocab {}, {:.1f} MiB of {} weights", directory,
               config.num_hidden_layers, config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
               config.vocab_size, model->weight_bytes() / 1048576.0, model->weight_types());
  return model;
}

std::shared_ptr<LlamaModel> LlamaModel::random(const ModelConfig& config, std::uint64_t seed, WeightDtype dtype) {
  return std::make_shared<LlamaModel>(config, random_model_weights(config, seed, dtype));
}

KvCacheShape LlamaModel::cache_shape(KvDtype dtype) const {
  KvCacheShape shape{config_.num_hidden_layers,
                     config_.num_key_value_heads,
                     config_.head_dim,
                     config_.max_position_embeddings,
                     dtype,
                     {}};
  if (config_.sliding_window > 0)
    for (std::int64_t layer = 0; layer < config_.num_hidden_layers; ++layer)
      shape.layer_windows.push_back(config_.layer_window(layer));
  return shape;
}

void LlamaModel::check_files_unchanged() const {
  for (const FileIdentity& file : weights_.mapped_files) {
    const std::string change = file.change();
    if (!change.empty())
      throw ModelError("the model file " + file.path + " changed on disk after it was loaded (" + change +
                       "); load the model again");
  }
}

std::string LlamaModel::weight_types() const {
  // Bytes per type name over every matrix, largest share first.
  std::vector<std::pair<std::string, std::int64_t>> shares;
  auto add = [&](const Linear& l) {
    const std::string name = l.type_name();
    auto found = std::find_if(shares.begin(), shares.end(), [&](const auto& share) { return share.first == name; });
    if (found == shares.end())
      shares.emplace_back(name, l.bytes());
    else
      found->second += l.bytes();
  };
  add(weights_.embedding);
  for (const LayerWeights& layer : weights_.layers)
    for (const Linear* l : layer.matrices()) add(*l);
  if (!config_.tie_word_embeddings) add(weights_.lm_head);
  std::stable_sort(shares.begin(), shares.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string text;
  for (const auto& share : shares) text += (text.empty() ? "" : "+") + share.first;
  return text;
}

std::int64_t LlamaModel::weight_bytes() const { return kvchat::weight_bytes(weights_, config_.tie_word_embeddings); }

bool LlamaModel::fused_decode_applies() const {
  auto ok = [](const Linear& l) { return l.is_quantized() || l.weight.is_contiguous(); };
  if (!ok(weights_.embedding)) return false;
  for (const LayerWeights& layer : weights_.layers)
    for (const Linear* l : layer.matrices())
      if (!ok(*l)) return false;
  return ok(weights_.lm_head);
}

void LlamaModel::check_request(const TokenId* ids, std::int64_t steps, std::int64_t start_pos,
                               const KvCache* cache) const {
  if (steps == 0) throw std::invalid_argument("forward: no tokens");
  if (cache ? start_pos != cache->size() : start_pos != 0)
    throw std::invalid_argument("forward: start position " + std::to_string(start_pos) +
                                " does not follow the cache (" + std::to_string(cache ? cache->size() : 0) +
                                " tokens)");
  if (start_pos + steps > config_.max_position_embeddings)
    throw std::length_error("forward: positions up to " + std::to_string(start_pos + steps) +
                            " exceed the context limit of " + std::to_string(config_.max_position_embeddings));
  for (std::int64_t i = 0; i < steps; ++i)
    if (ids[i] < 0 || ids[i] >= config_.vocab_size)
      throw std::out_of_range("forward: token id " + std::to_string(ids[i]) + " outside the vocabulary");
}

void LlamaModel::decode(TokenId token, std::int64_t position, KvCache& cache, DecodeContext& context) const {
  check_request(&token, 1, position, &cache);
  context.reserve(config_, std::max(position + 1, cache.capacity()));
  forward_rows(&token, 1, position, &cache, context, context.logits.data(), /*all_positions=*/false);
}

bool LlamaModel::rows_match_decode_steps() const { return fast_kernels_enabled() && fused_decode_; }

void LlamaModel::decode_rows(const TokenId* ids, std::int64_t steps, std::int64_t position, KvCache& cache,
                             DecodeContext& context) const {
  if (!rows_match_decode_steps())
    throw std::logic_error("decode_rows: this model's products do not compute rows as decode steps do");
  check_request(ids, steps, position, &cache);
  context.reserve(config_, std::max(position + steps, cache.capacity()), steps);
  context.row_logits.resize(static_cast<std::size_t>(steps * config_.vocab_size));
  forward_rows(ids, steps, position, &cache, context, context.row_logits.data(), /*all_positions=*/true,
               /*rows_as_decode=*/true);
}

void LlamaModel::decode_batch(const TokenId* ids, KvCache* const* caches, std::int64_t rows,
                              DecodeContext& context) const {
  if (!rows_match_decode_steps())
    throw std::logic_error("decode_batch: this model's products do not compute rows as decode steps do");
  if (rows <= 0) throw std::invalid_argument("decode_batch: no rows");
  std::int64_t longest = 0;
  for (std::int64_t i = 0; i < rows; ++i) {
    if (caches[i] == nullptr) throw std::invalid_argument("decode_batch: row " + std::to_string(i) + " has no cache");
    for (std::int64_t j = 0; j < i; ++j)
      if (caches[j] == caches[i])
        throw std::invalid_argument("decode_batch: rows " + std::to_string(j) + " and " + std::to_string(i) +
                                    " share a cache (one row per sequence)");
    check_request(ids + i, 1, caches[i]->size(), caches[i]);
    longest = std::max({longest, caches[i]->size() + 1, caches[i]->capacity()});
  }
  context.reserve(config_, longest, rows);
  context.row_logits.resize(static_cast<std::size_t>(rows * config_.vocab_size));
  forward_rows(ids, rows, 0, nullptr, context, context.row_logits.data(), /*all_positions=*/true,
               /*rows_as_decode=*/true, caches);
}

bool LlamaModel::parallel_attention(std::int64_t positions) const {
  const std::int64_t kv_bytes =
      2 * config_.num_key_value_heads * positions * config_.head_dim * static_cast<std::int64_t>(sizeof(float));
  return config_.num_key_value_heads > 1 && kv_bytes >= kParallelAttentionBytes;
}

at::Tensor LlamaModel::forward(const std::vector<TokenId>& ids, std::int64_t start_pos, KvCache* cache,
                               bool all_positions, KvDtype kv_dtype) const {
  const auto steps = static_cast<std::int64_t>(ids.size());
  check_request(ids.data(), steps, start_pos, cache);
  if (cache && cache->shape().dtype != kv_dtype && kv_dtype != KvDtype::F32)
    throw std::invalid_argument(std::string("forward: a ") + to_string(kv_dtype) + " rounding over a " +
                                to_string(cache->shape().dtype) + " cache");
  DecodeContext buffers;  // a prompt's rows: sized per call, unlike a session's decode context
  buffers.reserve(config_, start_pos + steps, steps);
  at::Tensor logits = at::empty({all_positions ? steps : 1, config_.vocab_size}, at::kFloat);
  buffers.kv_dtype = cache ? cache->shape().dtype : kv_dtype;
  forward_rows(ids.data(), steps, start_pos, cache, buffers, logits.data_ptr<float>(), all_positions);
  return all_positions ? logits : logits.squeeze(0);
}

}  // namespace kvchat
