// kvchat-cli render: a model's chat template (tokenizer_config.json or a GGUF file's) applied to conversations
// given as JSON, the way transformers' apply_chat_template renders them (for checking templates against references).
#include <cstdio>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "app/cli/cli_command.h"
#include "app/cli/tokenizer_source.h"
#include "engine/text/chat_template.h"
#include "engine/text/chat_template_config.h"

namespace kvchat::cli {
// Named, not anonymous: the command files are compiled in batches (unity build).
namespace render_command {

const char* kUsage =
    "usage: kvchat-cli render (--tokenizer-config FILE | --tokenizer DIR|FILE.gguf) [--date YYYY-MM-DD] [--jsonl]\n"
    "Renders the chat_template of a tokenizer_config.json (--tokenizer-config FILE, or DIR/tokenizer_config.json)\n"
    "with its special tokens, or a GGUF file's tokenizer.chat_template with its BOS/EOS tokens.\n"
    "Input on stdin: {\"messages\": [...], \"add_generation_prompt\": bool, \"tools\": [...],\n"
    "\"extra_context\": {...}} (all but messages optional); tools and the extra_context keys become\n"
    "template variables. --date fixes strftime_now (default: today).\n"
    "--jsonl: one such object per line; prints {\"rendered\": \"...\"} or {\"error\": \"...\"} per line.\n"
    "Without --jsonl: one object, and the rendered text is printed as is.";

using json = nlohmann::ordered_json;

bool is_iso_date(const std::string& text) {
  if (text.size() != 10 || text[4] != '-' || text[7] != '-') return false;
  for (std::size_t i : {0, 1, 2, 3, 5, 6, 8, 9})
    if (text[i] < '0' || text[i] > '9') return false;
  int month = std::stoi(text.substr(5, 2)), day = std::stoi(text.substr(8, 2));
  return month >= 1 && month <= 12 && day >= 1 && day <= 31;
}

// Renders one request object; throws TemplateError (template problems) or std::invalid_argument
// (a request of the wrong shape).
std::string render_request(const ChatTemplate& chat_template, const json& special_tokens, const json& request,
                           const std::string& date) {
  if (!request.is_object()) throw std::invalid_argument("the request must be a JSON object");
  if (!request.contains("messages") || !request["messages"].is_array())
    throw std::invalid_argument("\"messages\" must be a list of messages");
  bool add_generation_prompt = false;
  if (request.contains("add_generation_prompt")) {
    if (!request["add_generation_prompt"].is_boolean())
      throw std::invalid_argument("\"add_generation_prompt\" must be true or false");
    add_generation_prompt = request["add_generation_prompt"].get<bool>();
  }
  json tools = request.contains("tools") ? request["tools"] : json(nullptr);
  json extra = json::object();
  if (request.contains("extra_context") && !request["extra_context"].is_null()) {
    if (!request["extra_context"].is_object()) throw std::invalid_argument("\"extra_context\" must be an object");
    extra = request["extra_context"];
  }
  json context = chat_template_context(request["messages"], add_generation_prompt, special_tokens, tools, extra);
  return chat_template.render(context, date);
}

std::string dump(const json& value) { return value.dump(-1, ' ', false, json::error_handler_t::replace); }

int run_render(const std::vector<std::string>& args) {
  ArgParser parser({"tokenizer-config", "tokenizer", "date"}, {"jsonl"});
  parser.parse(args);
  if (parser.has("tokenizer-config") == parser.has("tokenizer"))
    throw UsageError("give exactly one of --tokenizer-config FILE and --tokenizer DIR|FILE.gguf");
  const std::string date = parser.value_or("date", "");
  if (!date.empty() && !is_iso_date(date)) throw UsageError("--date must be YYYY-MM-DD, got '" + date + "'");

  std::string config_path = parser.value_or("tokenizer-config", "");
  ChatTemplateConfig config;
  if (config_path.empty() && is_gguf_tokenizer_source(parser.required("tokenizer"))) {
    config_path = parser.required("tokenizer");
    config = chat_template_config_from_gguf(config_path);
  } else {
    if (config_path.empty()) config_path = parser.required("tokenizer") + "/tokenizer_config.json";
    config = read_chat_template_config(config_path);
  }
  if (!config.chat_template) throw std::runtime_error(config_path + " has no chat_template");
  std::unique_ptr<ChatTemplate> chat_template;
  try {
    chat_template = std::make_unique<ChatTemplate>(*config.chat_template);
  } catch (const TemplateError& error) {
    throw TemplateError(config_path + ": chat_template: " + error.what());
  }

  if (!parser.has("jsonl")) {
    std::stringstream input;
    input << std::cin.rdbuf();
    json request;
    try {
      request = json::parse(input.str());
    } catch (const json::exception& error) {
      throw UsageError(std::string("stdin is not valid JSON: ") + error.what());
    }
    std::string text = render_request(*chat_template, config.special_tokens, request, date);
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  }

  int failures = 0;
  std::string line;
  for (long line_number = 1; std::getline(std::cin, line); ++line_number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json out = json::object();
    try {
      out["rendered"] = render_request(*chat_template, config.special_tokens, json::parse(line), date);
    } catch (const json::exception& error) {
      out["error"] = "line " + std::to_string(line_number) + ": invalid JSON: " + error.what();
    } catch (const std::invalid_argument& error) {
      out["error"] = "line " + std::to_string(line_number) + ": " + error.what();
    } catch (const TemplateError& error) {
      out["error"] = error.what();
    }
    if (out.contains("error")) {
      ++failures;
      spdlog::debug("render line {}: {}", line_number, out["error"].get<std::string>());
    }
    std::string text = dump(out) + "\n";
    std::fwrite(text.data(), 1, text.size(), stdout);
  }
  std::fflush(stdout);
  // Per-line errors are answers, not failures of the command: the exit code stays 0.
  if (failures) spdlog::info("render: {} request(s) answered with an error", failures);
  return 0;
}

const CliRegistration kRegistration{CliCommand{
    "render", "apply a chat template (tokenizer_config.json or GGUF) to JSON conversations", kUsage, run_render}};

}  // namespace render_command
}  // namespace kvchat::cli
