#include "engine/kernels/quantized_matvec.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/kernels/block_types.h"
#include "engine/kernels/integer_dot.h"
#include "engine/kernels/matvec.h"

namespace kvchat::kernels {
namespace {

// The view's type, once its arguments are checked.
const BlockType& check_view(const char* function, const QuantizedMatrixView& w, std::int64_t n, const float* x,
                            const float* y) {
  const auto fail = [&](const std::string& what) { throw std::invalid_argument(std::string(function) + ": " + what); };
  const BlockType* type = find_block_type(w.type);
  if (type == nullptr) fail("weights of a type that cannot be decoded");
  const GgufTypeInfo& format = *type->format;
  if (n < 0 || w.rows < 0 || w.cols < 0) fail("negative size");
  if (w.cols % format.block_size != 0) fail(std::to_string(w.cols) + " columns are not a whole number of blocks");
  if (w.row_bytes != w.cols / format.block_size * format.block_bytes) fail("row_bytes does not match the type");
  if (n > 0 && w.rows > 0 && (y == nullptr || (w.cols > 0 && (w.data == nullptr || x == nullptr)))) fail("null buffer");
  return *type;
}

// The bytes of rounded activations taken together by a product over several vectors (a prompt).
constexpr std::int64_t kActivationChunkBytes = 256 * 1024;
constexpr std::int64_t kMaxChunkVectors = 64;
// The weights of a tile of rows, which stay in L2 while a product's vectors pass over them a group at a time.
constexpr std::int64_t kRowTileBytes = 64 * 1024;

// Rows [begin, end) of Y = X W^T for n vectors (Y's row stride is w.rows), `type` the record of w.type, its
// kernels taken once here. Block types: the integer kernel against the activations rounded once per product
// (`activations`, row i for vector i). F16: its float_dot (dot_f16, matvec.h) on the row as it is. Others:
// each row decoded once into a buffer the thread keeps (it stays in L1/L2) and multiplied by every vector in
// f32.
void quantized_rows(const BlockType& type, const QuantizedMatrixView& w, const float* x,
                    const ThreadActivations* activations, float* y, std::int64_t n, const float* bias,
                    std::int64_t begin, std::int64_t end) {
  const std::int64_t blocks = w.cols / type.format->block_size;
  const BlockKernels kernels = active_block_kernels(type);
  if (const IntegerRowDot dot = activations ? kernels.dot : nullptr) {
    // A prompt's vectors a chunk at a time, whose rounded values (a byte each) stay in L2 while the
    // block's rows pass: all of them would be re-read from memory for every row.
    const std::int64_t chunk = std::clamp<std::int64_t>(kActivationChunkBytes / std::max<std::int64_t>(w.cols, 1), 1,
                                                        std::min(n, kMaxChunkVectors));
    QuantizedActivations vectors[kMaxChunkVectors];  // the chunk's views, made once rather than per row
    // Several vectors at a time where the type has such a kernel (Q8_0 and the K-quants, on AVX-512 VNNI and
    // on AVX2): the row's unpacking is shared, and each result has the one-vector kernel's bits (the
    // row-exact forwards).
    const IntegerRowDots dots = n >= 2 ? kernels.dots : nullptr;
    // With several vectors, the rows a tile at a time (it stays in L2 while the kernel takes the vectors a group
    // at a time across it: RowTile in integer_dot.h, for_row_tile in vector_math_avx2.h).
    const std::int64_t row_tile = std::max<std::int64_t>(1, kRowTileBytes / std::max<std::int64_t>(w.row_bytes, 1));
    for (std::int64_t first = 0; first < n; first += chunk) {
      const std::int64_t count = std::min(n - first, chunk);
      for (std::int64_t i = 0; i < count; ++i) vectors[i] = activations->row(first + i);
      if (dots) {
        for (std::int64_t tile_begin = begin; tile_begin < end; tile_begin += row_tile) {
          const RowTile tile{w.data + tile_begin * w.row_bytes, w.row_bytes, std::min(row_tile, end - tile_begin),
                             y + first * w.rows + tile_begin,   w.rows,      bias ? bias + tile_begin : nullptr};
          dots(tile, vectors, blocks, static_cast<int>(count));
        }
        continue;
      }
      for (std::int64_t r = begin; r < end; ++r) {
        const std::uint8_t* row = w.data + r * w.row_bytes;
        const float b = bias ? bias[r] : 0.f;
        for (std::int64_t i = 0; i < count; ++i) y[(first + i) * w.rows + r] = dot(row, vectors[i], blocks) + b;
      }
    }
    return;
  }
  if (const FloatRowDot float_dot = type.float_dot) {
    for (std::int64_t r = begin; r < end; ++r) {
      const std::uint8_t* row = w.data + r * w.row_bytes;
      const float b = bias ? bias[r] : 0.f;
      for (std::int64_t i = 0; i < n; ++i) y[i * w.rows + r] = float_dot(row, x + i * w.cols, w.cols) + b;
    }
    return;
  }
  const RowDecoder decode = kernels.decode;
  thread_local std::vector<float> decoded;
  if (decoded.size() < static_cast<std::size_t>(w.cols)) decoded.resize(static_cast<std::size_t>(w.cols));
  for (std::int64_t r = begin; r < end; ++r) {
    const std::uint8_t* row = w.data + r * w.row_bytes;
    decode(row, decoded.data(), blocks);
    const float b = bias ? bias[r] : 0.f;
    for (std::int64_t i = 0; i < n; ++i) y[i * w.rows + r] = dot_f32(decoded.data(), x + i * w.cols, w.cols) + b;
  }
}

// The roundings that products with weights of the added types take of their input.
struct InputRoundings {
  bool blocks = false, super_blocks = false;
  void add(const BlockType& type) {
    const ActivationRounding rounding = type.rounding;
    blocks = blocks || rounding == ActivationRounding::BlockBytes;
    super_blocks = super_blocks || rounding == ActivationRounding::SuperBlockBytes;
  }
  // x [n, cols] rounded in each of them on the calling thread, or null when none is needed.
  const ThreadActivations* apply(const float* x, std::int64_t n, std::int64_t cols) const {
    return blocks || super_blocks ? &ThreadActivations::quantize(x, n, cols, blocks, super_blocks) : nullptr;
  }
};

}  // namespace

ActivationRounding activation_rounding(GgufType type) {
  const BlockType* record = find_block_type(type);
  return record ? record->rounding : ActivationRounding::None;
}

void matmul_quantized(const QuantizedMatrixView& weight, const float* x, float* y, std::int64_t n, const float* bias) {
  const BlockType& type = check_view("matmul_quantized", weight, n, x, y);
  if (n == 0 || weight.rows == 0) return;
  // Rounded once here, on the calling thread; the pool's threads read the caller's buffers.
  InputRoundings roundings;
  roundings.add(type);
  const ThreadActivations* activations = roundings.apply(x, n, weight.cols);
  struct Problem {
    const BlockType* type;
    const QuantizedMatrixView* weight;
    const float* x;
    const ThreadActivations* activations;
    float* y;
    std::int64_t n;
    const float* bias;
  } const problem{&type, &weight, x, activations, y, n, bias};
  for_row_blocks(weight.rows, weight.row_bytes, [p = &problem](std::int64_t begin, std::int64_t end) {
    quantized_rows(*p->type, *p->weight, p->x, p->activations, p->y, p->n, p->bias, begin, end);
  });
}

void dequantize_rows(const QuantizedMatrixView& weight, std::int64_t first, std::int64_t count, float* out) {
  const BlockType& type = check_view("dequantize_rows", weight, count, out, out);
  if (first < 0 || count < 0 || first + count > weight.rows)
    throw std::invalid_argument("dequantize_rows: rows outside the matrix");
  const std::int64_t blocks = weight.cols / type.format->block_size;
  const RowDecoder decode = active_block_kernels(type).decode;
  for (std::int64_t r = 0; r < count; ++r)
    decode(weight.data + (first + r) * weight.row_bytes, out + r * weight.cols, blocks);
}

void matvec_quantized_shared_input(const SharedInputQuantizedProduct* products, int count, const float* x) {
  std::int64_t total_rows = 0, total_bytes = 0;
  for (int i = 0; i < count; ++i) {
    check_view("matvec_quantized_shared_input", products[i].weight, 1, x, products[i].y);
    if (products[i].weight.cols != products[0].weight.cols)
      throw std::invalid_argument("matvec_quantized_shared_input: the products' column counts differ");
    total_rows += products[i].weight.rows;
    total_bytes += products[i].weight.rows * products[i].weight.row_bytes;
  }
  if (total_rows == 0) return;
  // Each rounding the products' types ask for, made once (q/k/v of one input may differ in type).
  InputRoundings roundings;
  for (int i = 0; i < count; ++i) roundings.add(*find_block_type(products[i].weight.type));
  const ThreadActivations* activations = roundings.apply(x, 1, products[0].weight.cols);
  struct Problem {
    const SharedInputQuantizedProduct* products;
    int count;
    const float* x;
    const ThreadActivations* activations;
  } const problem{products, count, x, activations};
  // Blocks are sized by the average row: the products' rows differ in bytes only by their types.
  for_row_blocks(total_rows, total_bytes / total_rows, [p = &problem](std::int64_t begin, std::int64_t end) {
    std::int64_t offset = 0;
    for (int i = 0; i < p->count && offset < end; ++i) {
      const SharedInputQuantizedProduct& product = p->products[i];
      const std::int64_t first = std::max(begin, offset), last = std::min(end, offset + product.weight.rows);
      if (first < last)
        quantized_rows(*find_block_type(product.weight.type), product.weight, p->x, p->activations, product.y, 1,
                       product.bias, first - offset, last - offset);
      offset += product.weight.rows;
    }
  });
}

}  // namespace kvchat::kernels
