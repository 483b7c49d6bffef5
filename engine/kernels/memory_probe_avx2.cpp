// The AVX2 reader of the memory probe (memory_probe.h): four 32-byte loads per 128 bytes, as the AVX2 kernels
// read their rows (this file alone is compiled for AVX2, FMA and F16C).
#include <cstddef>
#include <cstdint>

#include "engine/kernels/isa_kernels.h"
#include "engine/kernels/vector_math_avx2.h"

#if KVCHAT_HAVE_AVX2_KERNELS
namespace kvchat::kernels::avx2 {

std::uint64_t read_words(const std::uint64_t* data, std::size_t words) {
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  std::size_t i = 0;
  for (; i + 16 <= words; i += 16) {
    a = _mm256_xor_si256(a, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + i)));
    b = _mm256_xor_si256(b, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + i + 4)));
    c = _mm256_xor_si256(c, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + i + 8)));
    d = _mm256_xor_si256(d, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + i + 12)));
  }
  const __m256i all = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
  alignas(32) std::uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), all);
  std::uint64_t sum = lanes[0] ^ lanes[1] ^ lanes[2] ^ lanes[3];
  for (; i < words; ++i) sum ^= data[i];
  return sum;
}

}  // namespace kvchat::kernels::avx2
#endif  // KVCHAT_HAVE_AVX2_KERNELS
