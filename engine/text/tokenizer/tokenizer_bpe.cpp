#include "engine/text/tokenizer/tokenizer_bpe.h"
#include "engine/text/tokenizer/tokenizer_json.h"

#include <cstdio>
#include <queue>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "engine/text/tokenizer/tokenizer_error.h"
#include "engine/text/utf8.h"

namespace kvchat::tokenization {

using nlohmann::json;

namespace {

// Splits "left right" (the string form of a merge). A token containing a space cannot be written
// in this form, which is why newer files use ["left", "right"] pairs instead.
bool split_merge_string(const std::string& text, std::string& left, std::string& right) {
  auto space = text.find(' ');
  if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) return false;
  left = text.substr(0, space);
  right = text.substr(space + 1);
  return !left.empty() && !right.empty();
}

}  // namespace

BpeModel::BpeModel(const json& model, const std::string& source) {
  auto fail = [&](const std::string& what) { throw TokenizerError(source + ": " + what); };

  for (const char* unsupported : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(unsupported) && !model[unsupported].is_null() &&
        !(model[unsupported].is_string() && model[unsupported].get<std::string>().empty())) {
      fail(std::string("unsupported BPE option '") + unsupported + "' in model");
    }
  }
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0)) {
    fail("unsupported BPE option 'dropout' in model (only null or 0 is supported)");
  }

  if (!model.contains("vocab")) fail("model has no 'vocab'");
  const json& vocab = model["vocab"];
  if (!vocab.is_object()) fail("model.vocab is not an object");
  TokenId max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<long long>() < 0 ||
        it.value().get<long long>() > 0x7FFFFFFF) {
      fail("model.vocab entry '" + it.key() + "' has an id that is not a non-negative integer");
    }
    if (it.value().get<long long>() >= token_id_limit(vocab.size()))
      fail("model.vocab entry '" + it.key() + "': " + sparse_id_message(it.value().get<long long>(), vocab.size()));
    max_id = std::max(max_id, static_cast<TokenId>(it.value().get<long long>()));
  }
  id_to_token_.assign(static_cast<std::size_t>(max_id + 1), std::string());
  std::vector<bool> used(id_to_token_.size(), false);
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    auto id = static_cast<std::size_t>(it.value().get<long long>());
    if (used[id]) fail("model.vocab assigns id " + std::to_string(id) + " to more than one token");
    used[id] = true;
    id_to_token_[id] = it.key();
  }
  present_ = std::move(used);

  BpeOptions options;
  if (model.contains("unk_token") && !model["unk_token"].is_null()) {
    if (!model["unk_token"].is_string()) fail("model.unk_token is not a string");
    options.unk_token = model["unk_token"].get<std::string>();
  }
  options.fuse_unk = optional_field(model, "fuse_unk", false, source + ": model");
  options.byte_fallback = optional_field(model, "byte_fallback", false, source + ": model");
  options.ignore_merges = optional_field(model, "ignore_merges", false, source + ": model");
  finish_vocab(options, source);

  if (!model.contains("merges")) fail("model has no 'merges'");
  const json& merges = model["merges"];
  if (!merges.is_array()) fail("model.merges is not an array");
  merges_.reserve(merges.size());
  std::string left, right;
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const json& merge = merges[rank];
    std::string where = "model.merges[" + std::to_string(rank) + "]";
    if (merge.is_string()) {
      if (!split_merge_string(merge.get<std::string>(), left, right)) {
        fail(where + " '" + merge.get<std::string>() + "' is not two tokens separated by one space");
      }
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      fail(where + " is neither \"a b\" nor [\"a\", \"b\"]");
    }
    add_merge(left, right, static_cast<std::int32_t>(rank), source + ": " + where);
  }
}

BpeModel::BpeModel(std::vector<std::string> tokens,
                   const std::vector<std::pair<std::string_view, std::string_view>>& merges, const BpeOptions& options,
                   const std::string& source, const std::string& merges_key)
    : id_to_token_(std::move(tokens)), present_(id_to_token_.size(), true) {
  finish_vocab(options, source);
  if (vocab_.size() != id_to_token_.size()) {
    throw TokenizerError(source + ": the vocabulary repeats a token (" + std::to_string(id_to_token_.size()) +
                         " tokens, " + std::to_string(vocab_.size()) + " distinct)");
  }
  merges_.reserve(merges.size());
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    add_merge(merges[rank].first, merges[rank].second, static_cast<std::int32_t>(rank),
              source + ": " + merges_key + "[" + std::to_string(rank) + "]");
  }
}

void BpeModel::finish_vocab(const BpeOptions& options, const std::string& source) {
  // The views are taken only now: id_to_token_ no longer reallocates.
  vocab_.reserve(id_to_token_.size());
  for (std::size_t id = 0; id < id_to_token_.size(); ++id) {
    if (present_[id]) vocab_.emplace(std::string_view(id_to_token_[id]), static_cast<TokenId>(id));
  }
  if (options.unk_token) {
    auto id = token_to_id(*options.unk_token);
    if (!id) throw TokenizerError(source + ": model.unk_token '" + *options.unk_token + "' is not in the vocabulary");
    unk_id_ = *id;
  }
  fuse_unk_ = options.fuse_unk;
  byte_fallback_ = options.byte_fallback;
  ignore_merges_ = options.ignore_merges;

  byte_tokens_.assign(256, -1);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    if (auto id = token_to_id(name)) byte_tokens_[b] = *id;
  }
}

void BpeModel::add_merge(std::string_view left, std::string_view right, std::int32_t rank, const std::string& where) {
  auto left_id = token_to_id(left);
  auto right_id = token_to_id(right);
  if (!left_id) throw TokenizerError(where + " names unknown token '" + std::string(left) + "'");
  if (!right_id) throw TokenizerError(where + " names unknown token '" + std::string(right) + "'");
  std::string merged;
  merged.reserve(left.size() + right.size());
  merged.append(left).append(right);
  auto merged_id = token_to_id(merged);
  if (!merged_id) throw TokenizerError(where + " produces '" + merged + "', which is not in the vocabulary");
  // A repeated merge takes its last rank: both reference implementations build their rank map
  // by inserting in order, so later entries overwrite earlier ones.
  merges_.insert_or_assign(pair_key(*left_id, *right_id), Merge{rank, *merged_id});
}

std::string BpeModel::describe() const {
  return "BPE, " + std::to_string(vocab_.size()) + " vocabulary entries, " + std::to_string(merges_.size()) + " merges";
}

std::optional<TokenId> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(TokenId id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= id_to_token_.size()) return nullptr;
  if (!present_[static_cast<std::size_t>(id)]) return nullptr;
  return &id_to_token_[static_cast<std::size_t>(id)];
}

const BpeModel::Merge* BpeModel::find_merge(TokenId left, TokenId right) const {
  auto it = merges_.find(pair_key(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

void BpeModel::initial_symbols(std::string_view word, std::vector<TokenId>& symbols) const {
  bool previous_was_unk = false;
  for (std::size_t i = 0; i < word.size();) {
    std::size_t start = i;
    utf8::next_code_point(word, i);
    std::string_view character = word.substr(start, i - start);
    auto found = vocab_.find(character);
    if (found != vocab_.end()) {
      symbols.push_back(found->second);
      previous_was_unk = false;
      continue;
    }
    if (byte_fallback_) {
      bool all_bytes = true;
      for (unsigned char b : character) all_bytes = all_bytes && byte_tokens_[b] >= 0;
      if (all_bytes) {
        for (unsigned char b : character) symbols.push_back(byte_tokens_[b]);
        previous_was_unk = false;
        continue;
      }
    }
    if (unk_id_) {
      if (!(fuse_unk_ && previous_was_unk)) symbols.push_back(*unk_id_);
      previous_was_unk = true;
    }
    // Without an unk token the character is dropped, as the reference implementation does.
  }
}

void BpeModel::tokenize(std::string_view word, std::vector<TokenId>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    auto whole = vocab_.find(word);
    if (whole != vocab_.end()) {
      out.push_back(whole->second);
      return;
    }
  }
  std::vector<TokenId> ids;
  ids.reserve(word.size());
  initial_symbols(word, ids);
  const int n = static_cast<int>(ids.size());
  if (n <= 1) {
    out.insert(out.end(), ids.begin(), ids.end());
    return;
  }

  // Doubly linked symbols; a merged-away symbol is marked dead. The heap holds candidate pairs
  // ordered by (rank, position): the best-ranked pair first, the leftmost among equals.
  std::vector<int> prev(n), next(n);
  std::vector<char> alive(n, 1);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = (i + 1 < n) ? i + 1 : -1;
  }
  struct Candidate {
    std::int32_t rank;
    int pos;
    bool operator>(const Candidate& other) const { return rank != other.rank ? rank > other.rank : pos > other.pos; }
  };
  std::vector<Candidate> storage;
  storage.reserve(static_cast<std::size_t>(n));
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap(std::greater<Candidate>(),
                                                                                       std::move(storage));
  for (int i = 0; i + 1 < n; ++i) {
    if (const Merge* m = find_merge(ids[i], ids[i + 1])) heap.push({m->rank, i});
  }
  while (!heap.empty()) {
    Candidate top = heap.top();
    heap.pop();
    int left = top.pos;
    if (!alive[left]) continue;
    int right = next[left];
    if (right < 0) continue;
    const Merge* m = find_merge(ids[left], ids[right]);
    if (!m || m->rank != top.rank) continue;  // stale: one side changed since this entry was pushed
    ids[left] = m->merged;
    alive[right] = 0;
    next[left] = next[right];
    if (next[right] >= 0) prev[next[right]] = left;
    if (prev[left] >= 0) {
      if (const Merge* before = find_merge(ids[prev[left]], ids[left])) heap.push({before->rank, prev[left]});
    }
    if (next[left] >= 0) {
      if (const Merge* after = find_merge(ids[left], ids[next[left]])) heap.push({after->rank, left});
    }
  }
  for (int i = 0; i >= 0; i = next[i]) out.push_back(ids[i]);
}

}  // namespace kvchat::tokenization
