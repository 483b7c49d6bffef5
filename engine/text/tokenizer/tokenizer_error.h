#pragma once
// The tokenizer's error, apart from its front door (tokenizer.h) so that the parts reading
// tokenizer.json (model, normalizer, pre-tokenizer, decoder, ...) need not see the Tokenizer class.
#include <stdexcept>

namespace kvchat {

// Every tokenizer failure: a file that cannot be read or uses something not implemented (the
// message names it), or a bad argument such as a token id outside the vocabulary.
struct TokenizerError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace kvchat
