#include "engine/text/tokenizer/tokenizer_spm.h"

#include <cstdio>
#include <queue>

#include "engine/text/tokenizer/tokenizer_error.h"
#include "engine/text/utf8.h"

namespace kvchat::tokenization {

SpmModel::SpmModel(std::vector<std::string> tokens, std::vector<float> scores, const std::vector<bool>& can_produce,
                   std::optional<TokenId> unk, const std::string& source)
    : id_to_token_(std::move(tokens)), scores_(std::move(scores)), can_produce_(can_produce), unk_(unk) {
  if (scores_.size() != id_to_token_.size() || can_produce_.size() != id_to_token_.size()) {
    throw TokenizerError(source + ": SentencePiece vocabulary of " + std::to_string(id_to_token_.size()) +
                         " tokens has " + std::to_string(scores_.size()) + " scores");
  }
  // The views are taken only now: id_to_token_ no longer reallocates.
  vocab_.reserve(id_to_token_.size());
  for (std::size_t id = 0; id < id_to_token_.size(); ++id) {
    if (!vocab_.emplace(std::string_view(id_to_token_[id]), static_cast<TokenId>(id)).second) {
      throw TokenizerError(source + ": the vocabulary repeats token '" + id_to_token_[id] + "' (id " +
                           std::to_string(id) + ")");
    }
  }
  // As llama.cpp: the <0xNN> token of a byte, else a token that is that single byte.
  byte_tokens_.assign(256, -1);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    if (auto id = token_to_id(name)) {
      byte_tokens_[b] = *id;
    } else if (auto single = token_to_id(std::string(1, static_cast<char>(b)))) {
      byte_tokens_[b] = *single;
    }
  }
}

std::optional<TokenId> SpmModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* SpmModel::id_to_token(TokenId id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= id_to_token_.size()) return nullptr;
  return &id_to_token_[static_cast<std::size_t>(id)];
}

std::string SpmModel::describe() const {
  return "SentencePiece BPE by score, " + std::to_string(id_to_token_.size()) + " tokens";
}

std::optional<TokenId> SpmModel::producible(std::string_view text) const {
  auto it = vocab_.find(text);
  if (it == vocab_.end() || !can_produce_[static_cast<std::size_t>(it->second)]) return std::nullopt;
  return it->second;
}

void SpmModel::append_bytes(std::string_view text, std::vector<TokenId>& out) const {
  for (unsigned char b : text) {
    if (byte_tokens_[b] >= 0) {
      out.push_back(byte_tokens_[b]);
    } else if (unk_) {
      out.push_back(*unk_);
    }
    // Neither: the byte is dropped (a vocabulary without byte tokens or <unk> cannot say it).
  }
}

void SpmModel::tokenize(std::string_view word, std::vector<TokenId>& out) const {
  if (word.empty()) return;
  // Symbols are byte ranges of `word`; merging only ever joins neighbours, so a symbol's text is
  // always the contiguous range [begin, begin + size).
  struct Symbol {
    std::size_t begin, size;
    int prev, next;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  for (std::size_t i = 0; i < word.size();) {
    std::size_t start = i;
    utf8::next_code_point(word, i);
    int index = static_cast<int>(symbols.size());
    symbols.push_back({start, i - start, index - 1, -1});
    if (index > 0) symbols[index - 1].next = index;
  }

  // Candidate pairs: the highest score first, the leftmost among equal scores (llama.cpp's order).
  struct Bigram {
    float score;
    int left, right;
    std::size_t size;
  };
  auto worse = [](const Bigram& a, const Bigram& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(worse)> queue(worse);
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    std::size_t size = symbols[left].size + symbols[right].size;
    if (auto id = producible(word.substr(symbols[left].begin, size))) {
      queue.push({scores_[static_cast<std::size_t>(*id)], left, right, size});
    }
  };
  for (std::size_t i = 1; i < symbols.size(); ++i) try_add(static_cast<int>(i) - 1, static_cast<int>(i));

  while (!queue.empty()) {
    Bigram top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.left];
    Symbol& right = symbols[top.right];
    // Stale: one side was merged away or has grown since the pair was queued.
    if (left.size == 0 || right.size == 0 || left.size + right.size != top.size) continue;
    left.size += right.size;
    right.size = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.left;
    try_add(left.prev, top.left);
    try_add(top.left, left.next);
  }

  for (int i = 0; i >= 0; i = symbols[i].next) {
    std::string_view text = word.substr(symbols[i].begin, symbols[i].size);
    if (auto id = producible(text)) {
      out.push_back(*id);
    } else {
      append_bytes(text, out);  // only single characters can be left without a token
    }
  }
}

}  // namespace kvchat::tokenization
