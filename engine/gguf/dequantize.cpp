#include "engine/gguf/dequantize.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "engine/model/model_config.h"  // ModelError

// The types' exact decoders are in gguf_types.cpp, each in its row of the type catalog.

namespace kvchat {

void dequantize(GgufType type, const void* blocks, std::int64_t n_elements, float* out) {
  const GgufTypeInfo& info = gguf_type_info(type);
  if (!info.dequantizable())
    throw ModelError(std::string("cannot dequantize tensor type ") + info.name +
                     " (supported: " + dequantizable_gguf_type_names() + ")");
  if (n_elements < 0 || n_elements % info.block_size != 0)
    throw std::invalid_argument(std::to_string(n_elements) + " elements are not a whole number of " + info.name +
                                " blocks (" + std::to_string(info.block_size) + " elements each)");
  info.decode(static_cast<const std::uint8_t*>(blocks), out, n_elements / info.block_size);
}

void dequantize_rows(const GgufTensor& tensor, std::int64_t first_row, std::int64_t n_rows, float* out) {
  const GgufTypeInfo& info = gguf_type_info(tensor.type);
  if (!info.dequantizable())
    throw ModelError("tensor '" + tensor.name + "' has type " + info.name +
                     ", which cannot be dequantized (supported: " + dequantizable_gguf_type_names() + ")");
  const std::int64_t total_rows = tensor.n_rows();
  if (first_row < 0 || n_rows < 0 || first_row > total_rows || n_rows > total_rows - first_row)
    throw std::out_of_range("rows [" + std::to_string(first_row) + ", +" + std::to_string(n_rows) +
                            ") are outside tensor '" + tensor.name + "' (" + std::to_string(total_rows) + " rows)");
  const std::uint8_t* rows = tensor.data + static_cast<std::uint64_t>(first_row) * tensor.row_bytes();
  dequantize(tensor.type, rows, n_rows * tensor.row_length(), out);
}

std::vector<float> dequantize_tensor(const GgufTensor& tensor) {
  std::vector<float> values(static_cast<std::size_t>(tensor.n_elements));
  dequantize_rows(tensor, 0, tensor.n_rows(), values.data());
  return values;
}

}  // namespace kvchat
