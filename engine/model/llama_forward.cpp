// The one transformer layer of LlamaModel, over row buffers: a prompt's tokens are rows, a decode step
// is one row, and both go through the same RMSNorm, RoPE at explicit positions, cache writes, attention,
// SwiGLU and residual adds below. Only the products differ by the number of rows (the weight-streaming
// kernels for a few rows, LibTorch's GEMM for a prompt chunk; see ProductPath), which for the models
// whose products round their input to bytes would flip roundings, so there every row is computed as a
// decode step computes it (row-exact): a prompt, its tokens decoded one by one, and the uncached
// recomputation give bit-identical logits.
//
// A decode step over a cache with direct rows makes no LibTorch call and no allocation (tiny models
// spent most of a step in LibTorch's per-call cost). The independent ATen forward the fidelity tests
// compare against lives with the tests (tests/common/reference_forward.h), outside this dispatch.
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#include "engine/compute/compute_options.h"
#include "engine/kernels/activation.h"
#include "engine/kernels/attention.h"
#include "engine/kernels/kv_rows.h"
#include "engine/kernels/matvec.h"
#include "engine/kernels/quantized_matvec.h"
#include "engine/kernels/thread_pool.h"
#include "engine/model/llama_model.h"

namespace kvchat {

void DecodeContext::reserve(const ModelConfig& c, std::int64_t positions, std::int64_t rows) {
  const auto n = static_cast<std::size_t>(std::max<std::int64_t>(rows, 1));
  const auto q_size = static_cast<std::size_t>(c.num_attention_heads * c.head_dim);
  const auto kv_size = static_cast<std::size_t>(c.num_key_value_heads * c.head_dim);
  const auto hidden = static_cast<std::size_t>(c.hidden_size), inter = static_cast<std::size_t>(c.intermediate_size);
  // resize() keeps the storage when it only shrinks or stays: a decode step after a prompt allocates nothing.
  logits.resize(static_cast<std::size_t>(c.vocab_size));
  x.resize(n * hidden);
  h.resize(n * std::max(hidden, q_size));
  q.resize(n * q_size);
  attended.resize(n * q_size);
  k.resize(n * kv_size);
  v.resize(n * kv_size);
  gate.resize(n * inter);
  up.resize(n * inter);
  // Sized for what the cache can hold, so the buffer grows when the cache does, not per token.
  const auto needed_scores = static_cast<std::size_t>(c.num_attention_heads * positions);
  if (scores.size() < needed_scores) scores.resize(std::max(needed_scores, 2 * scores.size()));
}

namespace {

// out = x * rsqrt(mean(x^2) + eps) * weight, as transformers' LlamaRMSNorm (float32).
void rms_norm_into(const float* x, const float* weight, float* out, std::int64_t n, double eps) {
  double sum = 0;
  for (std::int64_t i = 0; i < n; ++i) sum += double(x[i]) * x[i];
  const float inverse = 1.0f / std::sqrt(static_cast<float>(sum / double(n)) + static_cast<float>(eps));
  for (std::int64_t i = 0; i < n; ++i) out[i] = (x[i] * inverse) * weight[i];
}

// Each of `heads` consecutive vectors of head_dim through one RMSNorm, in place (the norm reads its input before it
// writes): Qwen3's q_norm and k_norm.
void rms_norm_heads(float* vectors, std::int64_t heads, const at::Tensor& weight, std::int64_t head_dim, double eps) {
  for (std::int64_t head = 0; head < heads; ++head)
    rms_norm_into(vectors + head * head_dim, weight.data_ptr<float>(), vectors + head * head_dim, head_dim, eps);
}

// Up to three products that share their input (q/k/v, gate/up): each matrix and where its output goes.
// A plain value on the stack: a decode step allocates nothing here.
struct SharedInputLinears {
  std::pair<const Linear*, float*> items[3];
  int count = 0;
  SharedInputLinears(std::initializer_list<std::pair<const Linear*, float*>> products) {
    for (const auto& product : products) items[count++] = product;
  }
  const std::pair<const Linear*, float*>* begin() const { return items; }
  const std::pair<const Linear*, float*>* end() const { return items + count; }
};

// y_i = W_i x for projections that share their input (n rows of it), streamed as one parallel job; each row
// as the one-row product computes it.
template <typename Weight>
void shared_input_into(const SharedInputLinears& products, const float* x, std::int64_t n = 1) {
  kernels::SharedInputProduct<Weight> jobs[3];  // on the stack: a decode step allocates nothing here
  int count = 0;
  for (auto [linear, y] : products) {
    const void* data = linear->weight.data_ptr();
    jobs[count++] = {static_cast<const Weight*>(data), y, linear->weight.size(0), linear->bias_data()};
  }
  const std::int64_t in = products.begin()->first->weight.size(1);
  if (n != 1) {
    if constexpr (std::is_same_v<Weight, float>)
      kernels::matmul_f32_shared_input_exact(jobs, count, x, n, in);
    else
      kernels::matmul_bf16_shared_input_exact(jobs, count, x, n, in);
  } else if constexpr (std::is_same_v<Weight, float>) {
    kernels::matvec_f32_shared_input(jobs, count, x, in);
  } else {
    kernels::matvec_bf16_shared_input(jobs, count, x, in);
  }
}

// The view of a matrix for the quantized kernels; f32 and bf16 tensors are GGUF F32 and BF16 rows.
kernels::QuantizedMatrixView quantized_view(const Linear& linear) {
  if (linear.is_quantized()) return linear.quantized.view;
  const bool bf16 = linear.weight.scalar_type() == at::kBFloat16;
  const std::int64_t in = linear.weight.size(1);
  return {bf16 ? GgufType::BF16 : GgufType::F32, static_cast<const std::uint8_t*>(linear.weight.data_ptr()),
          linear.weight.size(0), in, in * (bf16 ? 2 : 4)};
}

// The tensor type every matrix of `products` is kept in (f32 or bf16), or Undefined for a mix or a GGUF type.
at::ScalarType common_dense_type(const SharedInputLinears& products) {
  const Linear& first = *products.begin()->first;
  const at::ScalarType type = first.is_quantized() ? at::ScalarType::Undefined : first.weight.scalar_type();
  for (const auto& [linear, y] : products)
    if (linear->is_quantized() || linear->weight.scalar_type() != type) return at::ScalarType::Undefined;
  return type == at::kFloat || type == at::kBFloat16 ? type : at::ScalarType::Undefined;
}

// Products that share their input go to the kernels of their common storage type; a mix (or a GGUF
// type) goes to the quantized kernels, which take each matrix in its own type.
void shared_input_linears_into(const SharedInputLinears& products, const float* x) {
  const at::ScalarType dense = common_dense_type(products);
  if (dense == at::kFloat) return shared_input_into<float>(products, x);
  if (dense == at::kBFloat16) return shared_input_into<std::uint16_t>(products, x);
  kernels::SharedInputQuantizedProduct jobs[3];
  int count = 0;
  for (auto [linear, y] : products) jobs[count++] = {quantized_view(*linear), y, linear->bias_data()};
  kernels::matvec_quantized_shared_input(jobs, count, x);
}

// HF rotate_half RoPE of `heads` vectors of head_dim at one position, in place: the first `rotated` dimensions of
// each (all of them but for a partial rotary factor), cos/sin rows of that length.
void rotate_into(float* vectors, std::int64_t heads, std::int64_t head_dim, std::int64_t rotated, const float* cos,
                 const float* sin) {
  const std::int64_t half = rotated / 2;
  for (std::int64_t head = 0; head < heads; ++head) {
    float* v = vectors + head * head_dim;
    for (std::int64_t i = 0; i < half; ++i) {
      const float a = v[i], b = v[i + half];
      v[i] = a * cos[i] - b * sin[i];
      v[i + half] = b * cos[i + half] + a * sin[i + half];
    }
  }
}

// Attention of `steps` query rows over the rows of a layer's cache: row i sits at absolute position
// start_pos + i and sees positions 0 .. start_pos + i (the rectangular causal mask, as a count of keys), or with a
// sliding window only the last `window` of them. Work items run KV head by KV head, so that a thread's consecutive
// rows read the same head's keys and values while they are in cache. Passed to the pool by pointer so that the job
// fits std::function's small buffer (no allocation per layer).
struct RowsAttention {
  const float* q;           // [steps, heads * head_dim]
  const KvLayerRows* rows;  // every row's cache rows; or, with per_row, one entry per row
  std::int64_t steps, start_pos, q_size, head_dim, group;
  std::int64_t window;  // 0: every earlier position
  float scale, softcap;
  float* single_row_scores;  // a decode step's [heads, positions] (no allocation); null: per-thread scratch
  float* out;                // [steps, heads * head_dim]
  // A batched step: row i's own cache rows and absolute position (null: `rows` and start_pos + i for every row).
  const KvLayerRows* per_row = nullptr;
  const std::int64_t* row_positions = nullptr;
  void items(std::int64_t first, std::int64_t last) const {
    // 16- and 8-bit rows decoded so far into scratch 1 and 2: a thread's consecutive items are one head's
    // consecutive prompt rows, and each row's keys and values are the last one's and one more. Decoding every row's
    // whole prefix again made a prompt's attention quadratic in conversions (DESIGN: the KV dtype).
    const std::uint8_t* decoded_from = nullptr;
    std::int64_t decoded_rows = 0;
    for (std::int64_t item = first; item < last; ++item) {
      const std::int64_t g = item / steps, i = item % steps,
                         position = row_positions ? row_positions[i] : start_pos + i;
      const KvLayerRows* row_cache = per_row ? per_row + i : rows;
      const std::int64_t first_key = window > 0 ? std::max<std::int64_t>(0, position - window + 1) : 0;
      const std::int64_t positions = position - first_key + 1;
      // The cache holds positions from first_position on (a sliding layer's cache drops older ones).
      const std::int64_t offset = (first_key - row_cache->first_position) * row_cache->row_bytes;
      float* scores = single_row_scores ? single_row_scores + g * group * positions : scratch<0>(group * positions);
      const float* query = q + i * q_size + g * group * head_dim;
      float* result = out + i * q_size + g * group * head_dim;
      if (row_cache->paged()) {
        paged_head(*row_cache, g, first_key, positions, query, scores, result);
        continue;
      }
      const std::uint8_t* stored_keys = row_cache->head_keys(g) + offset;
      const std::uint8_t* stored_values = row_cache->head_values(g) + offset;
      const float* keys = reinterpret_cast<const float*>(stored_keys);
      const float* values = reinterpret_cast<const float*>(stored_values);
      if (row_cache->dtype != KvDtype::F32) {
        // 16- and 8-bit rows are read as the f32 values they stand for (exactly), and attended as f32 rows are: the
        // same arithmetic as the uncached path over its rounded keys and values. A kernel that reads the stored
        // rows directly reads fewer bytes; elsewhere they are decoded first.
        if (softcap <= 0.f &&
            kernels::attention_decode_head_stored(query, {stored_keys, row_cache->row_bytes, row_cache->dtype},
                                                  {stored_values, row_cache->row_bytes, row_cache->dtype}, positions,
                                                  group, head_dim, scale, scores, result))
          continue;
        float* decoded_keys = scratch<1>(positions * head_dim);
        float* decoded_values = scratch<2>(positions * head_dim);
        // The rows already decoded for the last item stay (the cache's rows do not change during a forward).
        const std::int64_t kept = stored_keys == decoded_from ? std::min(decoded_rows, positions) : 0;
        const std::int64_t stride = row_cache->row_bytes;
        kernels::decode_kv_rows(row_cache->dtype, stored_keys + kept * stride, positions - kept, stride, head_dim,
                                decoded_keys + kept * head_dim);
        kernels::decode_kv_rows(row_cache->dtype, stored_values + kept * stride, positions - kept, stride, head_dim,
                                decoded_values + kept * head_dim);
        decoded_from = stored_keys;
        decoded_rows = positions;
        keys = decoded_keys;
        values = decoded_values;
      }
      if (softcap > 0.f)
        kernels::attention_decode_head_softcapped(query, keys, values, positions, head_dim, group, head_dim, scale,
                                                  softcap, scores, result);
      else
        kernels::attention_decode_head(query, keys, values, positions, head_dim, group, head_dim, scale, scores,
                                       result);
    }
  }
  // One KV head's attention over a paged cache's rows: read in their blocks, or gathered into f32 rows where no
  // kernel reads blocks (the same values and arithmetic either way).
  void paged_head(const KvLayerRows& cache_rows, std::int64_t g, std::int64_t first_key, std::int64_t positions,
                  const float* query, float* scores, float* result) const {
    const std::int64_t head_offset = g * cache_rows.head_stride;
    const kernels::PagedKvRows keys{cache_rows.blocks, cache_rows.block_tokens, cache_rows.keys_offset + head_offset,
                                    first_key,         cache_rows.row_bytes,    cache_rows.dtype};
    kernels::PagedKvRows values = keys;
    values.offset = cache_rows.values_offset + head_offset;
    if (softcap <= 0.f &&
        kernels::attention_decode_head_paged(query, keys, values, positions, group, head_dim, scale, scores, result))
      return;
    float* gathered_keys = scratch<1>(positions * head_dim);
    float* gathered_values = scratch<2>(positions * head_dim);
    kernels::gather_paged_kv_rows(keys, positions, head_dim, gathered_keys);
    kernels::gather_paged_kv_rows(values, positions, head_dim, gathered_values);
    if (softcap > 0.f)
      kernels::attention_decode_head_softcapped(query, gathered_keys, gathered_values, positions, head_dim, group,
                                                head_dim, scale, softcap, scores, result);
    else
      kernels::attention_decode_head(query, gathered_keys, gathered_values, positions, head_dim, group, head_dim, scale,
                                     scores, result);
  }
  // Per-thread scratch, one buffer per `kBuffer`: grows to the largest use, then is reused.
  template <int kBuffer>
  static float* scratch(std::int64_t floats) {
    thread_local std::vector<float> buffer;
    if (buffer.size() < static_cast<std::size_t>(floats)) buffer.resize(static_cast<std::size_t>(floats));
    return buffer.data();
  }
};

// y[i] = W x[i] (+ b) for n input rows and products that share their input, each row computed as
// shared_input_linears_into computes a single one: the f32 and bf16 kernels' row-exact products, the quantized
// kernels over all rows at once (their result for a row does not depend on the others).
void shared_input_linears_rows(const SharedInputLinears& products, const float* x, std::int64_t n) {
  const at::ScalarType dense = common_dense_type(products);
  if (dense == at::kFloat) return shared_input_into<float>(products, x, n);
  if (dense == at::kBFloat16) return shared_input_into<std::uint16_t>(products, x, n);
  for (auto [linear, y] : products) kernels::matmul_quantized(quantized_view(*linear), x, y, n, linear->bias_data());
}

// Stored rows [kv_heads, positions, row] laid out one after another, as RowsAttention reads them.
at::Tensor attention_rows(const at::Tensor& t) {
  if (t.stride(2) == 1 && t.stride(1) == t.size(2)) return t;
  return t.contiguous();
}

}  // namespace

LlamaModel::ProductPath LlamaModel::product_path(std::int64_t rows, bool rows_as_decode) const {
  if (!fast_kernels_enabled() || !fused_decode_) return ProductPath::Linear;
  if (rows == 1) return ProductPath::SharedInput;
  return row_exact_ || rows_as_decode ? ProductPath::RowExact : ProductPath::Linear;
}

// The products of `products`, which share their input x [rows, in], for `rows` rows.
void LlamaModel::products_into(ProductPath path, std::initializer_list<std::pair<const Linear*, float*>> products,
                               const float* x, std::int64_t rows) const {
  // Repacked bf16 matrices (Linear::bf16_packed) take their own kernels on every path, which sum each row alike.
  std::size_t packed = 0;
  for (const auto& [linear, y] : products) packed += linear->rounds_input_to_bf16() ? 1 : 0;
  if (packed == products.size()) return bf16_packed_forward(products.begin(), products.size(), x, rows);
  if (packed > 0) {  // a mix: each product on its own
    for (const auto& [linear, y] : products) products_into(path, {{linear, y}}, x, rows);
    return;
  }
  switch (path) {
    case ProductPath::SharedInput: return shared_input_linears_into(SharedInputLinears(products), x);
    case ProductPath::RowExact: return shared_input_linears_rows(SharedInputLinears(products), x, rows);
    case ProductPath::Linear:
      for (auto [linear, y] : products) linear->forward_into(x, rows, y);
      return;
  }
}

void LlamaModel::forward_rows(const TokenId* ids, std::int64_t steps, std::int64_t start_pos, KvCache* cache,
                              DecodeContext& s, float* logits, bool all_positions, bool rows_as_decode,
                              KvCache* const* row_caches) const {
  const ModelConfig& c = config_;
  const std::int64_t hidden = c.hidden_size, heads = c.num_attention_heads, kv_heads = c.num_key_value_heads;
  const std::int64_t head_dim = c.head_dim, group = heads / kv_heads, inter = c.intermediate_size;
  const std::int64_t q_size = heads * head_dim, kv_size = kv_heads * head_dim;
  const ProductPath path = product_path(steps, rows_as_decode);
  const bool gelu = c.hidden_act == "gelu_pytorch_tanh";
  // Gemma's norms of a sublayer's output, rows [steps, hidden] in place.
  const auto norm_rows_in_place = [&](float* rows, std::int64_t count, const at::Tensor& weight) {
    for (std::int64_t i = 0; i < count; ++i)
      rms_norm_into(rows + i * hidden, weight.data_ptr<float>(), rows + i * hidden, hidden, c.rms_norm_eps);
  };
  const bool streaming = path != ProductPath::Linear || (fast_kernels_enabled() && steps <= streaming_rows_);
  enter_compute_phase(streaming ? ComputePhase::Streaming : ComputePhase::Parallel);
  // A batched step's rows each sit at the end of their own sequence (positions fixed until the commit below).
  std::vector<std::int64_t> batch_positions;
  std::vector<KvLayerRows> batch_rows;
  std::int64_t end_position = start_pos + steps;
  if (row_caches) {
    batch_positions.resize(static_cast<std::size_t>(steps));
    batch_rows.resize(static_cast<std::size_t>(steps));
    for (std::int64_t i = 0; i < steps; ++i) {
      batch_positions[i] = row_caches[i]->size();
      end_position = std::max(end_position, batch_positions[i] + 1);
      if (!row_caches[i]->prepare_rows(1))
        throw std::logic_error("forward: a batched step needs caches that take rows in place");
    }
  }
  const auto position_of = [&](std::int64_t i) { return row_caches ? batch_positions[i] : start_pos + i; };
  // What keys and values are stored as: a cache rounds them as it writes them; without one, they are rounded here
  // as a cache of the context's dtype would store them (a cache changes no result).
  const KvDtype kv_dtype = row_caches ? row_caches[0]->shape().dtype : cache ? cache->shape().dtype : s.kv_dtype;
  if (row_caches)
    for (std::int64_t i = 1; i < steps; ++i)
      if (row_caches[i]->shape().dtype != kv_dtype)
        throw std::invalid_argument("forward: a batched step over caches of different KV dtypes");
  const auto cache_of = [&](std::int64_t i) { return row_caches ? row_caches[i] : cache; };
  rope_.ensure(end_position);
  if (local_rope_) local_rope_->ensure(end_position);
  // A cache with direct rows takes the new keys and values in place; prepare_rows grows it, if it must,
  // before any layer runs. Other caches (and none) go through tensors.
  const bool direct_rows = row_caches || (cache && cache->prepare_rows(steps));
  const float scale = c.attention_scale();
  for (std::int64_t i = 0; i < steps; ++i) weights_.embedding.row_into(ids[i], s.x.data() + i * hidden);
  if (c.embedding_scale != 1.0) {  // Gemma: rows times sqrt(hidden), in f32 as llama.cpp computes it
    const auto embedding_scale = static_cast<float>(c.embedding_scale);
    for (std::int64_t j = 0; j < steps * hidden; ++j) s.x[j] *= embedding_scale;
  }

  for (std::int64_t layer_index = 0; layer_index < c.num_hidden_layers; ++layer_index) {
    const LayerWeights& layer = weights_.layers[layer_index];
    for (std::int64_t i = 0; i < steps; ++i)
      rms_norm_into(s.x.data() + i * hidden, layer.attention_norm.data_ptr<float>(), s.h.data() + i * hidden, hidden,
                    c.rms_norm_eps);
    products_into(path, {{&layer.q, s.q.data()}, {&layer.k, s.k.data()}, {&layer.v, s.v.data()}}, s.h.data(), steps);
    if (c.qk_norm) {
      rms_norm_heads(s.q.data(), steps * heads, layer.q_norm, head_dim, c.rms_norm_eps);
      rms_norm_heads(s.k.data(), steps * kv_heads, layer.k_norm, head_dim, c.rms_norm_eps);
    }
    const RopeTable& rope = c.layer_uses_local_rope(layer_index) ? *local_rope_ : rope_;
    for (std::int64_t i = 0; i < steps && c.layer_uses_rope(layer_index); ++i) {
      const float* cos = rope.cos_row(position_of(i));
      const float* sin = rope.sin_row(position_of(i));
      rotate_into(s.q.data() + i * q_size, heads, head_dim, c.rotated_dims(), cos, sin);
      rotate_into(s.k.data() + i * kv_size, kv_heads, head_dim, c.rotated_dims(), cos, sin);
    }

    if (!cache && !row_caches && kv_dtype != KvDtype::F32) {
      kernels::round_kv_rows(kv_dtype, s.k.data(), steps * kv_heads, head_dim);
      kernels::round_kv_rows(kv_dtype, s.v.data(), steps * kv_heads, head_dim);
    }
    KvLayerRows rows;
    at::Tensor keys, values;  // hold the rows of a cache without direct rows (or of no cache)
    if (direct_rows) {
      for (std::int64_t i = 0; i < steps; ++i)
        cache_of(i)->write_rows(layer_index, position_of(i), s.k.data() + i * kv_size, s.v.data() + i * kv_size);
      if (row_caches)
        for (std::int64_t i = 0; i < steps; ++i) batch_rows[i] = row_caches[i]->layer_rows(layer_index);
      else
        rows = cache->layer_rows(layer_index);
    } else {
      // [kv_heads, steps, head_dim] views of the new rows; with a cache, its keys and values of every position.
      keys = at::from_blob(s.k.data(), {steps, kv_heads, head_dim}, at::kFloat).transpose(0, 1);
      values = at::from_blob(s.v.data(), {steps, kv_heads, head_dim}, at::kFloat).transpose(0, 1);
      if (cache) std::tie(keys, values) = cache->append(layer_index, keys, values);
      keys = attention_rows(keys);
      values = attention_rows(values);
      const KvDtype stored = cache ? kv_dtype : KvDtype::F32;  // without a cache, the f32 rows rounded above
      rows = KvLayerRows{static_cast<const std::uint8_t*>(keys.data_ptr()),
                         static_cast<const std::uint8_t*>(values.data_ptr()),
                         keys.stride(0) * static_cast<std::int64_t>(keys.element_size()),
                         kernels::kv_row_bytes(stored, head_dim),
                         cache ? cache->first_position(layer_index) : 0,
                         stored};
      // The cache's rows (and their copies) keep keys and values in one layout.
      if (values.stride(0) != keys.stride(0)) throw std::logic_error("forward: keys and values differ in layout");
    }
    const RowsAttention attention{s.q.data(),
                                  &rows,
                                  steps,
                                  start_pos,
                                  q_size,
                                  head_dim,
                                  group,
                                  c.layer_window(layer_index),
                                  scale,
                                  static_cast<float>(c.attention_logit_softcap),
                                  steps == 1 ? s.scores.data() : nullptr,
                                  s.attended.data(),
                                  row_caches ? batch_rows.data() : nullptr,
                                  row_caches ? batch_positions.data() : nullptr};
    // A single row's attention over a short context costs about what a dispatch to the pool does.
    if (steps == 1 && !parallel_attention(position_of(0) + 1))
      attention.items(0, kv_heads);
    else
      kernels::current_thread_pool().parallel_for(
          steps * kv_heads, [job = &attention](std::int64_t first, std::int64_t last) { job->items(first, last); });

    products_into(path, {{&layer.o, s.h.data()}}, s.attended.data(), steps);
    if (layer.post_attention_norm.defined()) norm_rows_in_place(s.h.data(), steps, layer.post_attention_norm);
    for (std::int64_t j = 0; j < steps * hidden; ++j) s.x[j] += s.h[j];

    for (std::int64_t i = 0; i < steps; ++i)
      rms_norm_into(s.x.data() + i * hidden, layer.mlp_norm.data_ptr<float>(), s.h.data() + i * hidden, hidden,
                    c.rms_norm_eps);
    products_into(path, {{&layer.gate, s.gate.data()}, {&layer.up, s.up.data()}}, s.h.data(), steps);
    for (std::int64_t i = 0; i < steps; ++i)
      (gelu ? kernels::gelu_tanh_mul : kernels::silu_mul)(s.gate.data() + i * inter, s.up.data() + i * inter, inter);
    products_into(path, {{&layer.down, s.h.data()}}, s.gate.data(), steps);
    if (layer.post_mlp_norm.defined()) norm_rows_in_place(s.h.data(), steps, layer.post_mlp_norm);
    for (std::int64_t j = 0; j < steps * hidden; ++j) s.x[j] += s.h[j];
  }
  if (row_caches)
    for (std::int64_t i = 0; i < steps; ++i) row_caches[i]->commit(1);
  else if (cache)
    cache->commit(steps);

  // Only the positions asked for go through the final norm and the (large) lm_head.
  const std::int64_t first = all_positions ? 0 : steps - 1, out_rows = steps - first;
  for (std::int64_t i = 0; i < out_rows; ++i)
    rms_norm_into(s.x.data() + (first + i) * hidden, weights_.final_norm.data_ptr<float>(), s.h.data() + i * hidden,
                  hidden, c.rms_norm_eps);
  products_into(product_path(out_rows, rows_as_decode), {{&weights_.lm_head, logits}}, s.h.data(), out_rows);
  if (c.final_logit_softcap > 0) {  // Gemma 2
    const auto cap = static_cast<float>(c.final_logit_softcap);
    for (std::int64_t j = 0; j < out_rows * c.vocab_size; ++j) logits[j] = cap * std::tanh(logits[j] / cap);
  }
}

}  // namespace kvchat
