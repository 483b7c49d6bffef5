#include "engine/text/chat_prompt.h"

#include <algorithm>
#include <stdexcept>

namespace kvchat {

ChatPrompt encode_chat_prompt(const ChatFormatter& formatter, const Tokenizer& tokenizer,
                              const std::vector<ChatMessage>& messages, PromptEnd end,
                              const nlohmann::ordered_json& extra_context) {
  const bool continuing = end == PromptEnd::ContinueLastMessage;
  RenderedPrompt rendered =
      formatter.render_prompt(messages, /*add_generation_prompt=*/!continuing, extra_context, "",
                              [&](std::string_view text) { return tokenizer.added_token_ranges(text); });

  if (continuing) {
    // The reply goes on from the end of its text: what the template writes after it (the end of the
    // turn) is not part of the prompt.
    auto last =
        std::find_if(rendered.contents.rbegin(), rendered.contents.rend(),
                     [&](const RenderedPrompt::Content& content) { return content.message + 1 == messages.size(); });
    if (messages.empty() || last == rendered.contents.rend())
      throw std::invalid_argument("the reply to continue is not in the rendered prompt");
    const std::size_t cut = last->end;
    rendered.text.resize(cut);
    rendered.contents.erase(std::remove_if(rendered.contents.begin(), rendered.contents.end(),
                                           [&](const RenderedPrompt::Content& content) { return content.end > cut; }),
                            rendered.contents.end());
    std::vector<std::pair<size_t, size_t>> kept;
    for (auto [first, second] : rendered.content_ranges)
      if (first < cut) kept.emplace_back(first, std::min(second, cut));
    rendered.content_ranges = std::move(kept);
  }

  std::vector<Tokenizer::KnownIds> known;
  const std::uint64_t vocabulary = tokenizer.vocabulary_fingerprint();
  for (const RenderedPrompt::Content& content : rendered.contents) {
    const ChatMessage& message = messages[content.message];
    if (!content.whole || content.begin == content.end || message.token_ids.empty() ||
        message.token_vocabulary != vocabulary)
      continue;
    // Ids from a damaged store are not used: the text is encoded instead.
    if (std::any_of(message.token_ids.begin(), message.token_ids.end(),
                    [&](TokenId id) { return id < 0 || id >= tokenizer.vocab_size(); }))
      continue;
    if (!known.empty() && content.begin < known.back().end) continue;  // a template that wrote it twice, overlapping
    known.push_back({content.begin, content.end, message.token_ids});
  }

  ChatPrompt prompt;
  // Without a template the text is the messages' contents alone: all of it plain, BOS as the tokenizer says.
  prompt.ids = tokenizer.encode_chat(rendered.text, rendered.content_ranges,
                                     /*add_special_tokens=*/!rendered.uses_template, known);
  prompt.text = std::move(rendered.text);
  return prompt;
}

}  // namespace kvchat
