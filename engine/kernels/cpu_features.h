#pragma once
// What the processor we run on can do; kernels check this once and fall back to plain code.

// x86-64 builds (GCC or Clang) have the AVX2 and AVX-512 kernel files (*_avx2.cpp, *_avx512.cpp, each compiled
// for its instruction set: engine/CMakeLists.txt); elsewhere only the portable kernels exist.
#if defined(__GNUC__) && defined(__x86_64__)
#define KVCHAT_HAVE_AVX2_KERNELS 1
#else
#define KVCHAT_HAVE_AVX2_KERNELS 0
#endif

namespace kvchat::kernels {
bool cpu_has_avx2_fma();

// True when the AVX2/FMA kernels should run: the processor has them and they have not been switched
// off (set_avx2_kernels_enabled(false), or KVCHAT_ISA=portable in the environment). Tests and benchmarks
// switch them off to exercise the portable fallbacks on an AVX2 machine.
bool use_avx2_kernels();
void set_avx2_kernels_enabled(bool enabled);

// AVX-512 (F, BW, VL, with the OS saving the 512-bit state): the attention and float kernels use it
// where it is there.
bool cpu_has_avx512();
// AVX-512 VNNI on top of that: the K-quants' byte kernels (vpdpbusd, vpdpwssd).
bool cpu_has_avx512_vnni();
// AVX-512 BF16 on top of AVX-512: a GGUF BF16 matrix's products (vdpbf16ps, bf16_packed.h).
bool cpu_has_avx512_bf16();
// True when the AVX-512 kernels should run: use_avx2_kernels(), the processor has AVX-512, and neither
// set_avx512_kernels_enabled(false) nor KVCHAT_ISA=avx2 (or KVCHAT_AVX512=off) in the environment
// switched them off (tests and benchmarks compare them with the AVX2 ones on the same machine). The
// integer kernels also need cpu_has_avx512_vnni().
bool use_avx512_kernels();
void set_avx512_kernels_enabled(bool enabled);
}  // namespace kvchat::kernels
