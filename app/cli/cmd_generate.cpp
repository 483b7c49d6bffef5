// kvchat-cli generate: one prompt through the engine, greedy or sampled, with the cache on, naive or off.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "app/cli/cli_command.h"
#include "app/cli/model_options.h"
#include "engine/generation/generation_stats_json.h"
#include "engine/generation/session.h"
#include "engine/model/llama_model.h"
#include "engine/text/chat_prompt.h"
#include "engine/text/constraint/json_grammar.h"
#include "engine/text/constraint/token_constraint.h"
#include "engine/text/regular_file.h"

namespace kvchat::cli {
// Named, not anonymous: the command files are compiled in batches (unity build).
namespace generate_command {

std::vector<ChatMessage> read_messages(const std::string& path) {
  std::string contents, error;
  if (!read_regular_file(path, contents, error)) throw UsageError("--messages " + path + ": " + error);
  const nlohmann::json document = nlohmann::json::parse(contents, nullptr, /*allow_exceptions=*/false);
  if (document.is_discarded()) throw UsageError("--messages " + path + ": not valid JSON");
  const nlohmann::json& list = document.is_object() && document.contains("messages") ? document["messages"] : document;
  if (!list.is_array() || list.empty())
    throw UsageError("--messages " + path + ": expected a non-empty list of {\"role\", \"content\"} messages");
  std::vector<ChatMessage> messages;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const nlohmann::json& message = list[i];
    if (!message.is_object() || !message.contains("role") || !message["role"].is_string() ||
        !message.contains("content") || !message["content"].is_string())
      throw UsageError("--messages " + path + ": message " + std::to_string(i) +
                       " must be an object with a string \"role\" and a string \"content\"");
    messages.push_back(ChatMessage{message["role"], message["content"]});
  }
  return messages;
}

// The first request of a conversation, encoded as ChatTurnRunner encodes it: the template's text with
// its control tokens parsed, the messages' contents never.
// --json-schema FILE: the reply is constrained to a JSON value valid against the schema in FILE.
std::shared_ptr<const JsonGrammar> grammar_from_options(const ArgParser& parser) {
  const auto path = parser.value("json-schema");
  if (!path) return nullptr;
  std::string contents, error;
  if (!read_regular_file(*path, contents, error)) throw UsageError("--json-schema " + *path + ": " + error);
  try {
    return std::make_shared<const JsonGrammar>(compile_json_schema(std::string_view(contents)));
  } catch (const SchemaError& schema_error) {
    throw UsageError("--json-schema " + *path + ": " + schema_error.what());
  }
}

std::vector<TokenId> encode_messages(const ModelSource& source, const std::vector<ChatMessage>& messages) {
  return encode_chat_prompt(source.formatter, *source.tokenizer, messages, PromptEnd::GenerationPrompt).ids;
}

const std::string kUsage =
    "usage: kvchat-cli generate (--model DIR|FILE.gguf | --random-weights CONFIG.json [--weights-seed N])\n"
    "                           (--prompt-ids 1,2,3 | --prompt TEXT | --messages FILE.json)\n"
    "                           [--max-new-tokens N]\n"
    "                           [--kv-cache on|naive|off] [--kv-dtype f32|bf16|f16|q8_0] [--temperature T] [--top-k K] "
    "[--top-p P]\n"
    "                           [--min-p M] [--repeat-penalty R] [--seed S] [--threads N] [--json-schema FILE]\n"
    "                           [--speculative none|lookup|draft] [--draft-tokens K] [--draft-model PATH] [--dtype "
    "f32|bf16] [--long-context] [--ignore-eos] [--json]\n"
    "Greedy by default (temperature 0). --prompt needs the model's tokenizer (a directory's tokenizer.json\n"
    "or a GGUF file's tokenizer metadata); it is encoded as plain text with BOS as the tokenizer says.\n"
    "--messages: a JSON file holding a list of {\"role\", \"content\"} messages (or {\"messages\": [...]}),\n"
    "rendered with the model's chat template and the generation prompt, and encoded as the chat and the\n"
    "server encode a conversation's first request: the template's control tokens become their ids, the\n"
    "messages' text never does. Without a template the contents are joined as plain text.\n"
    "--json-schema FILE: constrained decoding; the reply is a JSON value valid against the schema in FILE\n"
    "(needs the model's tokenizer).\n"
    "--ignore-eos: make --max-new-tokens tokens even past the model's end-of-sequence tokens.\n" +
    std::string(kLongContextUsage) + std::string(kSpeculativeUsage) + kKvDtypeUsage;

int run_generate(const std::vector<std::string>& args) {
  ArgParser parser(with_model_options({"prompt-ids", "prompt", "messages", "max-new-tokens", "kv-cache", "kv-dtype",
                                       "temperature", "top-k", "top-p", "min-p", "repeat-penalty", "seed",
                                       "speculative", "draft-tokens", "draft-model", "json-schema"}),
                   {"json", "long-context", "ignore-eos"});
  parser.parse(args);
  // Every option is checked before the (possibly large) model is loaded.
  GenerationConfig config;
  config.max_new_tokens = parser.int_or("max-new-tokens", 64);
  if (config.max_new_tokens < 1) throw UsageError("--max-new-tokens must be at least 1");
  config.cache_mode = cache_mode_from_option(parser.value_or("kv-cache", "on"));
  config.kv_dtype = kv_dtype_from_option(parser.value_or("kv-dtype", "f32"));
  config.sampling = sampling_from_options(parser);
  config.speculative = speculative_from_options(parser);
  config.grammar = grammar_from_options(parser);
  if (parser.has("ignore-eos")) config.stop_token_ids = {-1};  // no id is -1: nothing stops the reply early
  const int prompt_options =
      int(bool(parser.value("prompt-ids"))) + int(bool(parser.value("prompt"))) + int(bool(parser.value("messages")));
  if (prompt_options == 0) throw UsageError("missing --prompt-ids, --prompt or --messages");
  if (prompt_options > 1) throw UsageError("give one of --prompt-ids, --prompt and --messages");
  std::vector<ChatMessage> messages;
  if (auto path = parser.value("messages")) messages = read_messages(*path);
  ModelSource source = open_model_source(parser);
  load_draft_model(parser, config.speculative, *source.model);

  std::vector<TokenId> prompt;
  if (auto ids = parser.value("prompt-ids")) {
    for (long long id : parse_int_list("prompt-ids", *ids)) {
      if (id < 0 || id >= source.model->config().vocab_size)
        throw UsageError("prompt id " + std::to_string(id) + " is outside the vocabulary (0.." +
                         std::to_string(source.model->config().vocab_size - 1) + ")");
      prompt.push_back(static_cast<TokenId>(id));
    }
  } else if (!messages.empty()) {
    if (!source.tokenizer)
      throw UsageError(
          "--messages needs a tokenizer: a model directory with tokenizer.json or a GGUF file with tokenizer metadata");
    try {
      prompt = encode_messages(source, messages);
    } catch (const std::exception& error) {
      throw UsageError(std::string("--messages: the model's chat template cannot render them: ") + error.what());
    }
  } else if (auto text = parser.value("prompt")) {
    if (!source.tokenizer)
      throw UsageError(
          "--prompt needs a tokenizer: a model directory with tokenizer.json or a GGUF file with tokenizer metadata");
    prompt = source.tokenizer->encode(*text, /*add_special_tokens=*/true, /*parse_special=*/false);
  } else {
    throw UsageError("missing --prompt-ids or --prompt");
  }
  if (prompt.empty()) throw UsageError("the prompt is empty");
  // The reply is decoded to text when there is a tokenizer: ids past its vocabulary have none.
  if (source.tokenizer) config.sampled_vocabulary = source.tokenizer->vocab_size();
  if (config.grammar) {
    if (!source.tokenizer) throw UsageError("--json-schema needs the model's tokenizer");
    config.grammar_vocabulary = ConstraintVocabulary::from_tokenizer(*source.tokenizer);
  }

  Session session(source.model, config.cache_mode);
  GenerationResult result = session.generate(prompt, config);
  // A constrained reply is shown as its tokens spell it: the tokenizer's clean-up of spaces before punctuation
  // would change the JSON's strings.
  const std::optional<bool> clean_up = config.grammar ? std::optional<bool>(false) : std::nullopt;

  if (parser.has("json")) {
    nlohmann::ordered_json out;
    out["prompt_ids"] = prompt;
    out["generated_ids"] = result.generated;
    out["stop_reason"] = to_string(result.stats.stop_reason);
    if (source.tokenizer)
      out["generated_text"] = source.tokenizer->decode(result.generated, /*skip_special=*/true, clean_up);
    out["stats"] = generation_stats_to_json(result.stats);
    std::cout << out.dump() << std::endl;
  } else {
    if (source.tokenizer) {
      std::cout << source.tokenizer->decode(result.generated, true, clean_up) << "\n";
    } else {
      for (size_t i = 0; i < result.generated.size(); ++i) std::cout << (i ? "," : "") << result.generated[i];
      std::cout << "\n";
    }
    const GenerationStats& s = result.stats;
    std::cerr << "prompt " << s.prompt_tokens << " tok, prefill " << s.prefill_ms << " ms ("
              << s.prefill_tokens_per_second << " tok/s), ttft " << s.ttft_ms << " ms, generated " << s.generated_tokens
              << " tok at " << s.decode_tokens_per_second << " tok/s, cache " << s.cache_tokens << " tok / "
              << s.cache_bytes << " bytes (" << to_string(s.cache_mode) << ", " << to_string(s.kv_dtype)
              << "), stop: " << to_string(s.stop_reason) << "\n";
  }
  return 0;
}

const CliRegistration registration({"generate", "generate tokens from a prompt (greedy or sampled)", kUsage,
                                    run_generate});

}  // namespace generate_command
}  // namespace kvchat::cli
