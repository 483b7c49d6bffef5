#pragma once
// Plain value types shared by the engine, the app and the UI.
// Includes neither LibTorch nor Qt: this is the only engine header that app/ and ui/ headers need.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvchat {

using TokenId = std::int32_t;

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
  // The exact ids the model wrote for `content` (a reply), under the tokenizer whose vocabulary fingerprint
  // is `token_vocabulary`; empty when unknown (typed text, a reply from another model or server). The
  // prompt uses them in place of the text's encoding, which would not give back the sampled ids.
  std::vector<TokenId> token_ids = {};
  std::uint64_t token_vocabulary = 0;
  // Tool use, in OpenAI's shapes: an assistant message's calls as a JSON array of {"id", "type": "function",
  // "function": {"name", "arguments"}} ("" for none); a "tool" message's call id and the tool's name.
  std::string tool_calls = {};
  std::string tool_call_id = {};
  std::string name = {};
};

// Sampling. temperature <= 0 means greedy (argmax); the filters then have no effect.
struct SamplingParams {
  float temperature = 0.0f;
  int top_k = 0;                    // 0 = off
  float top_p = 1.0f;               // 1 = off
  float min_p = 0.0f;               // 0 = off
  float repetition_penalty = 1.0f;  // 1 = off (CTRL-style: divide positive logits, multiply negative)
  int repetition_window = 64;       // how many of the most recent tokens the penalty looks at (0 = all)
  std::uint64_t seed = 0;
};

enum class KvCacheMode {
  Contiguous,  // preallocated, grows geometrically, writes in place (the default, fast path)
  Naive,       // grows by concatenation every step: the simple reference implementation
  Off,         // no cache: every step recomputes the whole sequence (the O(n^2) path)
};

const char* to_string(KvCacheMode mode);
// Accepts "on"/"contiguous", "naive", "off". Throws std::invalid_argument otherwise.
KvCacheMode kv_cache_mode_from_string(const std::string& text);

// How the cache stores keys and values. F32 is exact; the others round each K/V row once, when it is
// made, and every path (cache on, naive, off) computes with the rounded values, so the cache still
// changes no token of the model defined with that rounding (engine/kernels/kv_rows.h).
enum class KvDtype {
  F32,   // 4 bytes a value
  BF16,  // 2 bytes: bfloat16, round to nearest even
  F16,   // 2 bytes: IEEE half, round to nearest even
  Q8_0,  // about 1 byte: blocks of 32 values (a head's row when head_dim is not a multiple of 32), a byte each and
         // an f16 scale (llama.cpp's q8_0)
};
const char* to_string(KvDtype dtype);
// Accepts "f32", "bf16", "f16", "q8_0" (and "float32", "bfloat16", "float16", "q8"). Throws std::invalid_argument.
KvDtype kv_dtype_from_string(const std::string& text);

// Speculative decoding: tokens proposed ahead of the model and checked in one pass over several rows. The
// output is the same token for token (greedy) or draw for draw (sampling with a seed) as without it: every
// token is still sampled from the model's own logits, which are computed for each row exactly as a decode
// step computes them; the proposals only decide which rows were computed ahead.
enum class SpeculativeMode {
  None,
  Lookup,      // prompt lookup: the continuation of the latest earlier occurrence of the last few tokens
  DraftModel,  // a smaller model of the same vocabulary proposes its greedy continuation
};
const char* to_string(SpeculativeMode mode);  // "none", "lookup", "draft"
// Accepts "none"/"off", "lookup" and "draft". Throws std::invalid_argument otherwise.
SpeculativeMode speculative_mode_from_string(const std::string& text);

class LlamaModel;
struct JsonGrammar;
class ConstraintVocabulary;

struct SpeculativeConfig {
  SpeculativeMode mode = SpeculativeMode::None;
  std::shared_ptr<const LlamaModel> draft_model;  // DraftModel's proposer (shared: it is immutable)
  int draft_tokens = 8;                           // at most this many proposed tokens per check
  // Prompt lookup matches the last max_ngram .. min_ngram tokens, longest first.
  int max_ngram = 3;
  int min_ngram = 2;
};

struct GenerationConfig {
  int max_new_tokens = 256;
  SamplingParams sampling;
  KvCacheMode cache_mode = KvCacheMode::Contiguous;
  KvDtype kv_dtype = KvDtype::F32;      // switching it, like the cache mode, drops the cache
  int prefill_chunk_tokens = 512;       // prefill runs in chunks of at most this many tokens
  int context_limit = 0;                // prompt + generated tokens never exceed it (0 or more = the model's)
  std::vector<TokenId> stop_token_ids;  // empty = the model's end-of-sequence ids
  // Only ids below this are sampled (0 = every row of the output). A tokenizer smaller than the embedding
  // table (padded for speed, or a mismatched file) has no text for the ids past its own.
  int sampled_vocabulary = 0;
  // Log-probabilities of each sampled token (TokenLogprobs): -1 none, 0 the chosen token's, N also the N
  // most likely tokens'.
  int top_logprobs = -1;
  SpeculativeConfig speculative;  // applies while the cache is on and the model's rows match its decode steps
  // Constrained decoding (engine/text/constraint/): with a grammar, every token sampled keeps the reply within
  // it (the others' logits are -infinity before sampling, so greedy takes the argmax of what is left) and an
  // end-of-sequence id comes only once the reply is whole. `grammar_vocabulary` is the tokenizer's
  // (ConstraintVocabulary::from_tokenizer). Shared: both are immutable.
  std::shared_ptr<const JsonGrammar> grammar;
  std::shared_ptr<const ConstraintVocabulary> grammar_vocabulary;
};

// A token's log-probability under the distribution it was drawn from, before the sampler's filters: the
// log-softmax of the logits after the repetition penalty, over the temperature when one applies (the raw
// logits for greedy decoding). OpenAI's logprobs.
struct TokenLogprob {
  TokenId token = 0;
  float logprob = 0.0f;
};
struct TokenLogprobs {
  TokenLogprob chosen;
  std::vector<TokenLogprob> top;  // the most likely tokens, most likely first (ties: lower id first)
};

enum class StopReason {
  Eos,          // the model produced an end-of-sequence id
  MaxTokens,    // max_new_tokens reached
  ContextFull,  // the context limit reached (the model's, or a smaller one of GenerationConfig)
  Stopped,      // the caller's stop flag was set
};

const char* to_string(StopReason reason);

// What one generate() call did and how fast. Plain value: copied into signals, stored with messages.
struct GenerationStats {
  int prompt_tokens = 0;      // tokens of the whole conversation history given to this turn
  int reused_tokens = 0;      // of those, already in the cache (not recomputed)
  int restored_tokens = 0;    // of reused_tokens, restored this turn from a snapshot on disk
  double restore_ms = 0.0;    // reading, checking and copying that snapshot (part of ttft_ms)
  std::string restored_from;  // the snapshot's name (its conversation's key); "" when none
  int prefilled_tokens = 0;   // newly prefilled tokens (prompt_tokens - reused_tokens)
  int generated_tokens = 0;   // new tokens sampled
  double prefill_ms = 0.0;    // wall time of the prefill
  double ttft_ms = 0.0;       // time to first token: prefill + first sampling
  double decode_ms = 0.0;     // wall time of the decode steps after the first token
  double prefill_tokens_per_second = 0.0;
  double decode_tokens_per_second = 0.0;
  std::int64_t cache_tokens = 0;  // tokens held by the cache after the turn (0 when the cache is off)
  std::int64_t cache_bytes = 0;   // bytes held by those tokens' K/V
  std::int64_t cache_capacity_tokens = 0;
  KvCacheMode cache_mode = KvCacheMode::Contiguous;
  KvDtype kv_dtype = KvDtype::F32;
  StopReason stop_reason = StopReason::MaxTokens;
  int drafted_tokens = 0;   // speculative decoding: tokens proposed and checked
  int accepted_tokens = 0;  // of those, the ones the model sampled too (each saved a decode step)
  int draft_checks = 0;     // passes that checked proposals
};

}  // namespace kvchat
