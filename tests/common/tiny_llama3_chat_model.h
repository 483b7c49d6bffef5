#pragma once
// A chat model in the Llama 3 layout for the chat-template path, end to end: shared/models/
// tiny-llama3-random (random bf16 weights, two shards, llama3 RoPE, vocabulary of 1000, no tokenizer)
// given a tokenizer and Llama 3's own chat template. The tokenizer is stories260K's 512-piece BPE with
// Llama 3's special tokens added after it (<|begin_of_text|> 512, <|end_of_text|> 513,
// <|start_header_id|> 514, <|end_header_id|> 515, <|eot_id|> 516) and reserved special tokens up to
// id 999, as Llama 3 fills its vocabulary, so every id the model can sample decodes. The template is
// shared/fixtures/chat_templates/llama3.json's; generation stops at <|end_of_text|> or <|eot_id|>.
#include <filesystem>
#include <string>

#include "common/model_folder_copy.h"

namespace kvchat::test {

// `vocabulary_end` < 1000 leaves the reserved tokens from that id on out: a tokenizer smaller than the
// model's embedding table, whose rows past it have no text.
inline std::string make_tiny_llama3_chat_model(const std::string& destination, int vocabulary_end = 1000) {
  namespace fs = std::filesystem;
  copy_reference_model("tiny-llama3-random", destination);
  nlohmann::ordered_json tokenizer = read_json_file(shared_path("models/stories260K/tokenizer.json"));
  const char* llama3_specials[] = {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                                   "<|eot_id|>"};
  int id = 512;
  auto add_special = [&](const std::string& content) {
    tokenizer["added_tokens"].push_back({{"id", id++},
                                         {"content", content},
                                         {"single_word", false},
                                         {"lstrip", false},
                                         {"rstrip", false},
                                         {"normalized", false},
                                         {"special", true}});
  };
  for (const char* special : llama3_specials) add_special(special);
  for (int reserved = 0; id < vocabulary_end; ++reserved)
    add_special("<|reserved_special_token_" + std::to_string(reserved) + "|>");
  tokenizer["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single",
       {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"pair",
       {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
        {{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 1}}}},
        {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
      {"special_tokens",
       {{"<|begin_of_text|>", {{"id", "<|begin_of_text|>"}, {"ids", {512}}, {"tokens", {"<|begin_of_text|>"}}}}}}};
  write_json_file(destination + "/tokenizer.json", tokenizer);

  const nlohmann::ordered_json llama3 = read_json_file(shared_path("fixtures/chat_templates/llama3.json"));
  const nlohmann::ordered_json config = {
      {"bos_token", "<|begin_of_text|>"},    {"eos_token", "<|eot_id|>"},
      {"chat_template", llama3["template"]}, {"clean_up_tokenization_spaces", false},
      {"model_max_length", 131072},          {"tokenizer_class", "PreTrainedTokenizerFast"}};
  write_json_file(destination + "/tokenizer_config.json", config);
  write_json_file(destination + "/generation_config.json", {{"bos_token_id", 512}, {"eos_token_id", {513, 516}}});
  fs::remove(destination + "/reference_logits.json");
  return destination;
}

}  // namespace kvchat::test
