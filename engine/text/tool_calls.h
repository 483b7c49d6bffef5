#pragma once
// Tool calls in a model's reply. Each chat-template family trains its models to write calls in a syntax of
// its own; these turn that text back into OpenAI-style calls (a name and the JSON text of the arguments), for
// a whole reply or for one that arrives piece by piece. No Qt, no torch.
#include <string>
#include <string_view>
#include <vector>

namespace kvchat {

// Hermes: <tool_call>{"name", "arguments"}</tool_call> (Hermes 2 Pro, Qwen2.5, Qwen3).
// Llama3Json: a bare {"name", "parameters"} object, or one after <|python_tag|> (Llama 3.1-3.3).
// Mistral: [TOOL_CALLS] then a JSON array, or [TOOL_CALLS]name[ARGS]{...} in the newer templates.
// Functionary: <function=NAME>{...}</function>, and <|python_tag|>code for its code interpreter (v3.1).
// FireFunction: functools[{"name", "arguments"}, ...] (firefunction v2).
enum class ToolCallFormat { None, Hermes, Llama3Json, Mistral, Functionary, FireFunction };

const char* to_string(ToolCallFormat format);

// Which format a chat template's tool calls take, from the template's own text (its Jinja source): the
// markers its tool-call rendering writes. None for a template that renders no tool calls.
ToolCallFormat tool_call_format_for_template(std::string_view template_source);

struct ToolCall {
  // The model's own id where it writes one (Mistral), else one made from the call, distinct within its
  // reply. Mistral's templates refuse ids that are not 9 letters or digits, so those made for it are.
  std::string id;
  std::string name;
  std::string arguments;  // JSON text of an object, compact, keys in the model's order
};

struct ParsedReply {
  std::string content;
  std::vector<ToolCall> tool_calls;
};

// Tool calls found in a complete reply. When none parse (no call, or a malformed one), tool_calls is empty
// and content is the reply unchanged: a reply is either all calls after its text or all text, so a client
// never gets half of what the model meant. Calls may be separated by whitespace only.
// With calls, content is the text before the first one without the whitespace that separates it from the
// call ("" when that is all there is). Whitespace at the very start of the reply stays when text follows it,
// because a stream has already sent it by the time a call shows up.
ParsedReply parse_tool_calls(ToolCallFormat format, std::string_view reply);

// Streaming: text is pushed as it is generated; push() returns the part that is certainly content (safe to
// send to a client now) and holds back from the first byte where a tool call could begin (including a
// partial opener at the end of the text, e.g. "<tool_" for Hermes) and any trailing whitespace, which is
// dropped if a call follows. What push() returned, followed by finish()'s content, is the content of
// parse_tool_calls() on the whole reply, and finish()'s calls are its calls.
class ToolCallStream {
 public:
  explicit ToolCallStream(ToolCallFormat format);

  std::string push(std::string_view text);
  // Parses what was held back; its content is that text when it holds no valid call. The stream is then
  // ready for the next reply.
  ParsedReply finish();

 private:
  ToolCallFormat format_;
  std::string held_;      // not sent yet: trailing whitespace, a partial opener, or everything from an opener on
  bool in_call_ = false;  // an opener was seen: nothing more is sent before finish()
  bool started_ = false;  // a non-whitespace byte was seen (Llama 3's bare object counts only at the start)
};

}  // namespace kvchat
