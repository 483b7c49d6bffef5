// GGUF files: header, metadata, tensor infos (GgufFile), every metadata value through its typed
// getter, the model hyper-parameters, the first row of every tensor dequantized, and the tokenizer
// built from the metadata. The input is the whole file. Refusals are ModelError and TokenizerError;
// anything else escaping is a bug.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/gguf/dequantize.h"
#include "engine/gguf/gguf_file.h"
#include "engine/model/gguf_model_config.h"
#include "engine/model/model_config.h"  // ModelError
#include "engine/text/tokenizer.h"
#include "fuzz_input.h"

namespace {

// Rows longer than this are skipped: decoding is linear and says nothing more on a longer row.
constexpr std::int64_t kMaxRowLength = 1 << 16;

void read_metadata(const kvchat::GgufFile& file) {
  using kvchat::GgufValueType;
  for (const kvchat::GgufMetadataEntry& entry : file.metadata()) {
    try {
      switch (entry.type) {
        case GgufValueType::String: file.get_string(entry.key); break;
        case GgufValueType::Float32:
        case GgufValueType::Float64: file.get_float(entry.key); break;
        case GgufValueType::Bool: file.get_bool(entry.key); break;
        case GgufValueType::Array:
          file.get_array_length(entry.key);
          if (entry.element_type == GgufValueType::String)
            file.get_string_array(entry.key);
          else if (entry.element_type == GgufValueType::Float32)
            file.get_float_array(entry.key);
          else
            file.get_int_array(entry.key);
          break;
        default: file.get_int64(entry.key); file.get_uint32(entry.key);
      }
    } catch (const kvchat::ModelError&) {
    }
  }
}

void read_tensors(const kvchat::GgufFile& file) {
  std::vector<float> row;
  for (const kvchat::GgufTensor& tensor : file.tensors()) {
    if (tensor.n_elements == 0 || tensor.row_length() > kMaxRowLength) continue;
    row.resize(static_cast<std::size_t>(tensor.row_length()));
    try {
      kvchat::dequantize_rows(tensor, 0, 1, row.data());
      kvchat::dequantize_rows(tensor, tensor.n_rows() - 1, 1, row.data());
    } catch (const kvchat::ModelError&) {  // a type kvchat does not decode
    }
  }
}

void read_tokenizer(const kvchat::GgufFile& file) {
  try {
    const kvchat::Tokenizer tokenizer = kvchat::Tokenizer::from_gguf(file);
    const auto ids = tokenizer.encode("Hello world! <|eot_id|> <s> 12345 \xC3\xA9t\xC3\xA9\n\t  ", true, true);
    tokenizer.decode(ids);
    kvchat::StreamingDecoder stream(tokenizer);
    for (kvchat::TokenId id : ids) stream.push(id);
    stream.finish();
  } catch (const kvchat::TokenizerError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path =
      kvchat::fuzz::scratch().write("model.gguf", std::string_view(reinterpret_cast<const char*>(data), size));
  try {
    const kvchat::GgufFile file(path);
    read_metadata(file);
    read_tensors(file);
    try {
      kvchat::model_config_from_gguf(file);
      kvchat::gguf_file_type_name(file);
    } catch (const kvchat::ModelError&) {
    }
    read_tokenizer(file);
  } catch (const kvchat::ModelError&) {
  }
  return 0;
}
