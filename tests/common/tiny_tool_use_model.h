#pragma once
// The tiny Llama-3-layout chat model (tiny_llama3_chat_model.h) with two chat templates, as tool-use models ship
// them in tokenizer_config.json: Llama 3's as "default" and NousResearch Hermes 2 Pro's tool-use template as
// "tool_use" (its calls are <tool_call>{json}</tool_call>), which renders the requests that carry tools.
#include <string>

#include "common/tiny_llama3_chat_model.h"

namespace kvchat::test {

// `tool_use_template`: the fixture under fixtures/chat_templates/tool_use/ whose template renders tool requests.
inline std::string make_tiny_tool_use_model(
    const std::string& destination,
    const std::string& tool_use_template = "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.json") {
  const std::string model = make_tiny_llama3_chat_model(destination);
  nlohmann::ordered_json config = read_json_file(model + "/tokenizer_config.json");
  const nlohmann::ordered_json tool_use =
      read_json_file(shared_path("fixtures/chat_templates/tool_use/" + tool_use_template));
  config["chat_template"] = nlohmann::ordered_json::array({{{"name", "default"}, {"template", config["chat_template"]}},
                                                           {{"name", "tool_use"}, {"template", tool_use["template"]}}});
  write_json_file(model + "/tokenizer_config.json", config);
  return model;
}

}  // namespace kvchat::test
