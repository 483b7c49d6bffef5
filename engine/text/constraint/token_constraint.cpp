#include "engine/text/constraint/token_constraint.h"

#include <algorithm>
#include <limits>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "engine/text/tokenizer.h"
#include "engine/text/utf8.h"

namespace kvchat {
namespace {

// The number of code points of `bytes` when it is whole UTF-8 characters none of which is a quote, a
// backslash or a control character (text a JSON string takes as it is); -1 otherwise.
std::int32_t plain_code_points(const std::string& bytes) {
  if (!utf8::is_valid(bytes)) return -1;
  std::int32_t count = 0;
  for (char c : bytes) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == '"' || byte == '\\') return -1;
    count += (byte & 0xC0) != 0x80;  // a character starts at every byte but a continuation byte
  }
  return count;
}

}  // namespace

ConstraintVocabulary::ConstraintVocabulary(std::vector<std::string> token_bytes, const std::vector<bool>& usable)
    : token_bytes_(std::move(token_bytes)) {
  std::vector<std::pair<std::string, TokenId>> all, special;
  plain_bits_.assign((token_bytes_.size() + 63) / 64, 0);
  for (std::size_t id = 0; id < token_bytes_.size(); ++id) {
    const std::string& bytes = token_bytes_[id];
    if (id >= usable.size() || !usable[id] || bytes.empty()) continue;
    all.emplace_back(bytes, static_cast<TokenId>(id));
    const std::int32_t code_points = plain_code_points(bytes);
    if (code_points < 0) {
      special.emplace_back(bytes, static_cast<TokenId>(id));
      continue;
    }
    plain_.push_back(static_cast<TokenId>(id));
    plain_code_points_.push_back(code_points);
    plain_bits_[id / 64] |= std::uint64_t{1} << (id % 64);
  }
  all_ = build_trie(std::move(all));
  special_ = build_trie(std::move(special));
}

// Sorted entries make the trie in one pass: each entry shares with the one before it the path of their
// common prefix and adds nodes for the rest.
ConstraintVocabulary::Trie ConstraintVocabulary::build_trie(std::vector<std::pair<std::string, TokenId>> entries) {
  std::sort(entries.begin(), entries.end());
  Trie trie;
  trie.nodes.emplace_back();
  std::vector<std::int32_t> path = {0};  // path[d]: the node at depth d of the previous entry
  std::vector<std::int32_t> last_child = {-1};
  std::string previous;
  for (const auto& [bytes, id] : entries) {
    std::size_t common = 0;
    while (common < bytes.size() && common < previous.size() && bytes[common] == previous[common]) ++common;
    path.resize(common + 1);
    last_child.resize(common + 1);
    for (std::size_t depth = common; depth < bytes.size(); ++depth) {
      const auto index = static_cast<std::int32_t>(trie.nodes.size());
      TrieNode node;
      node.byte = static_cast<std::uint8_t>(bytes[depth]);
      node.token_begin = node.token_end = static_cast<std::int32_t>(trie.tokens.size());
      trie.nodes.push_back(node);
      const std::int32_t parent = path[depth];
      if (last_child[depth] < 0)
        trie.nodes[static_cast<std::size_t>(parent)].first_child = index;
      else
        trie.nodes[static_cast<std::size_t>(last_child[depth])].next_sibling = index;
      last_child[depth] = index;
      path.push_back(index);
      last_child.push_back(-1);
    }
    TrieNode& end = trie.nodes[static_cast<std::size_t>(path.back())];
    if (end.token_begin == end.token_end)
      end.token_begin = end.token_end = static_cast<std::int32_t>(trie.tokens.size());
    trie.tokens.push_back(id);
    end.token_end = static_cast<std::int32_t>(trie.tokens.size());
    trie.depth = std::max(trie.depth, bytes.size());
    previous = bytes;
  }
  return trie;
}

std::shared_ptr<const ConstraintVocabulary> ConstraintVocabulary::from_tokenizer(const Tokenizer& tokenizer) {
  std::vector<std::string> bytes = tokenizer.token_bytes();
  std::vector<bool> usable(bytes.size());
  for (std::size_t id = 0; id < bytes.size(); ++id) usable[id] = !tokenizer.is_special(static_cast<TokenId>(id));
  return std::make_shared<const ConstraintVocabulary>(std::move(bytes), usable);
}

TokenConstraint::TokenConstraint(std::shared_ptr<const JsonGrammar> grammar,
                                 std::shared_ptr<const ConstraintVocabulary> vocabulary)
    : grammar_(std::move(grammar)), vocabulary_(std::move(vocabulary)), matcher_(*grammar_) {
  allowed_.assign((static_cast<std::size_t>(vocabulary_->size()) + 63) / 64, 0);
  states_.assign(vocabulary_->all_.depth + 1, matcher_);
}

void TokenConstraint::allow(const ConstraintVocabulary::Trie& trie, const ConstraintVocabulary::TrieNode& node) {
  for (std::int32_t i = node.token_begin; i < node.token_end; ++i) {
    const auto id = static_cast<std::size_t>(trie.tokens[static_cast<std::size_t>(i)]);
    allowed_[id / 64] |= std::uint64_t{1} << (id % 64);
  }
}

// Depth-first: states_[depth] is the matcher after the bytes of the path to `node`.
void TokenConstraint::walk(const ConstraintVocabulary::Trie& trie, std::int32_t node, std::size_t depth) {
  for (std::int32_t child = trie.nodes[static_cast<std::size_t>(node)].first_child; child >= 0;
       child = trie.nodes[static_cast<std::size_t>(child)].next_sibling) {
    const auto& child_node = trie.nodes[static_cast<std::size_t>(child)];
    JsonMatcher& state = states_[depth + 1];
    state = states_[depth];
    if (!state.advance(child_node.byte)) continue;
    allow(trie, child_node);
    walk(trie, child, depth + 1);
  }
}

const std::vector<std::uint64_t>& TokenConstraint::allowed() {
  if (allowed_current_) return allowed_;
  std::fill(allowed_.begin(), allowed_.end(), 0);
  states_[0] = matcher_;
  const ConstraintVocabulary& vocabulary = *vocabulary_;
  if (const auto room = matcher_.string_room()) {
    if (*room >= std::numeric_limits<std::int32_t>::max()) {
      allowed_ = vocabulary.plain_bits_;
    } else {
      for (std::size_t i = 0; i < vocabulary.plain_.size(); ++i)
        if (vocabulary.plain_code_points_[i] <= *room) {
          const auto id = static_cast<std::size_t>(vocabulary.plain_[i]);
          allowed_[id / 64] |= std::uint64_t{1} << (id % 64);
        }
    }
    walk(vocabulary.special_, 0, 0);
  } else {
    walk(vocabulary.all_, 0, 0);
  }
  allowed_current_ = true;
  return allowed_;
}

void TokenConstraint::mask_logits(float* logits, std::int64_t size, const std::vector<TokenId>& stop_ids) {
  const std::vector<std::uint64_t>& bits = allowed();
  const bool may_stop = matcher_.complete();
  bool any = false;
  for (std::int64_t id = 0; id < size; ++id) {
    const bool allowed = id < vocabulary_->size() && (bits[static_cast<std::size_t>(id / 64)] >> (id % 64) & 1);
    bool stop = false;
    if (may_stop) stop = std::find(stop_ids.begin(), stop_ids.end(), static_cast<TokenId>(id)) != stop_ids.end();
    if (allowed || stop)
      any = true;
    else
      logits[id] = -std::numeric_limits<float>::infinity();
  }
  if (!any) {
    // The reply's end, as a JSON string (escapes show what the bytes are).
    const std::string end = nlohmann::json(text_.size() > 80 ? text_.substr(text_.size() - 80) : text_)
                                .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    throw std::runtime_error(may_stop ? "the constrained reply is complete but the model has no end-of-sequence token"
                                      : "no token of the vocabulary can continue the constrained reply after " + end);
  }
}

bool TokenConstraint::accept(TokenId token) {
  allowed_current_ = false;
  if (token < 0 || token >= vocabulary_->size()) return false;
  const std::string& bytes = vocabulary_->bytes(token);
  text_ += bytes;
  return !bytes.empty() && matcher_.advance(bytes);
}

}  // namespace kvchat
