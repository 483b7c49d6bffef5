// kvchat-cli tokenize: encode / decode with a tokenizer.json folder or a GGUF file, one string or JSON lines.
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/cli/cli_command.h"
#include "app/cli/tokenizer_source.h"
#include "engine/text/tokenizer.h"

namespace kvchat::cli {
// Named, not anonymous: the command files are compiled in batches (unity build).
namespace tokenize_command {

using nlohmann::json;

void print_line(const json& value) {
  // Decoded text is valid UTF-8; the replace handler only guards against the impossible.
  std::string line = value.dump(-1, ' ', false, json::error_handler_t::replace);
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fflush(stdout);
}

std::optional<bool> optional_flag(const json& request, const char* field) {
  if (!request.contains(field) || request[field].is_null()) return std::nullopt;
  if (!request[field].is_boolean()) throw std::invalid_argument(std::string("'") + field + "' is not a boolean");
  return request[field].get<bool>();
}

json encode_request(const Tokenizer& tokenizer, const json& request) {
  if (!request.contains("text") || !request["text"].is_string())
    throw std::invalid_argument("missing string field 'text'");
  auto ids =
      tokenizer.encode(request["text"].get<std::string>(), optional_flag(request, "add_special_tokens").value_or(true),
                       optional_flag(request, "parse_special").value_or(false));
  return json{{"ids", ids}};
}

json decode_request(const Tokenizer& tokenizer, const json& request) {
  if (!request.contains("ids") || !request["ids"].is_array()) throw std::invalid_argument("missing array field 'ids'");
  std::vector<TokenId> ids;
  for (std::size_t i = 0; i < request["ids"].size(); ++i) {
    const json& id = request["ids"][i];
    if (!id.is_number_integer() || id.get<long long>() < INT32_MIN || id.get<long long>() > INT32_MAX) {
      throw std::invalid_argument("ids[" + std::to_string(i) + "] is not a 32-bit integer");
    }
    ids.push_back(id.get<TokenId>());
  }
  std::string text = tokenizer.decode(ids, optional_flag(request, "skip_special_tokens").value_or(false),
                                      optional_flag(request, "clean_up_tokenization_spaces"));
  return json{{"text", text}};
}

// One request per input line, one JSON object per output line, in order. A bad line answers
// {"error": ...} and the stream goes on.
int run_jsonl(const Tokenizer& tokenizer, bool decode) {
  std::string line;
  std::size_t line_number = 0;
  while (std::getline(std::cin, line)) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    try {
      json request = json::parse(line);
      if (!request.is_object()) throw std::invalid_argument("not a JSON object");
      print_line(decode ? decode_request(tokenizer, request) : encode_request(tokenizer, request));
    } catch (const std::exception& e) {
      print_line(json{{"error", "line " + std::to_string(line_number) + ": " + e.what()}});
    }
  }
  return 0;
}

int run_tokenize(const std::vector<std::string>& args) {
  ArgParser parser({"tokenizer", "text"},
                   {"decode", "jsonl", "parse-special", "no-special-tokens", "skip-special-tokens"});
  parser.parse(args);
  const bool decode = parser.has("decode");
  if (parser.has("jsonl") == parser.has("text")) throw UsageError("give exactly one of --jsonl and --text");
  Tokenizer tokenizer = tokenizer_from_path(parser.required("tokenizer"));
  if (parser.has("jsonl")) return run_jsonl(tokenizer, decode);

  const std::string text = parser.required("text");
  if (decode) {
    std::vector<TokenId> ids;
    for (long long id : parse_int_list("text", text)) {
      if (id < INT32_MIN || id > INT32_MAX) throw UsageError("--text: id " + std::to_string(id) + " is out of range");
      ids.push_back(static_cast<TokenId>(id));
    }
    print_line(json{{"text", tokenizer.decode(ids, parser.has("skip-special-tokens"))}});
  } else {
    print_line(json{{"ids", tokenizer.encode(text, !parser.has("no-special-tokens"), parser.has("parse-special"))}});
  }
  return 0;
}

const CliRegistration kRegistration{CliCommand{
    "tokenize",
    "encode or decode text with a tokenizer.json folder or a GGUF file",
    "usage: kvchat-cli tokenize --tokenizer DIR|FILE.gguf [--decode] (--jsonl | --text T)\n"
    "         [--parse-special] [--no-special-tokens] [--skip-special-tokens]\n\n"
    "--tokenizer        a folder with tokenizer.json (and tokenizer_config.json), or a GGUF file\n"
    "                   (its tokenizer.ggml.* metadata, tokenized as llama.cpp does)\n"
    "--text T           encode T and print {\"ids\": [...]}; with --decode, T is \"1,2,3\" and the\n"
    "                   output is {\"text\": ...}.\n"
    "--jsonl            read JSON lines on stdin, write one JSON line per input line:\n"
    "                     encode: {\"text\", \"add_special_tokens\" (true), \"parse_special\" (false)}\n"
    "                             -> {\"ids\": [...]}\n"
    "                     decode: {\"ids\", \"skip_special_tokens\" (false),\n"
    "                              \"clean_up_tokenization_spaces\" (tokenizer_config.json's)}\n"
    "                             -> {\"text\": ...}\n"
    "                   A bad line gives {\"error\": ...} and the next line is read.\n"
    "--parse-special    (--text) written special tokens become their ids\n"
    "--no-special-tokens (--text) do not add BOS/EOS\n"
    "--skip-special-tokens (--text --decode) leave special tokens out of the text",
    run_tokenize,
}};

}  // namespace tokenize_command
}  // namespace kvchat::cli
