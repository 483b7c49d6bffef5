#pragma once
// Function attributes that pin the instruction set of a kernel variant. The kernels library is built
// with -mavx2 -mfma -mf16c, which would let the compiler vectorise (and FMA-contract) the portable
// fallbacks with AVX2 too; pinning them to baseline x86-64 keeps them runnable on any x86-64
// processor (their helpers are KVCHAT_ISA_BASELINE_INLINE so they inline into them), and marking the AVX2 variants
// keeps them compilable without the global flags.
#if defined(__GNUC__) && defined(__x86_64__)
#define KVCHAT_ISA_BASELINE_INLINE __attribute__((target("arch=x86-64")))
#define KVCHAT_ISA_BASELINE __attribute__((target("arch=x86-64"), noinline))
#define KVCHAT_ISA_AVX2 __attribute__((target("avx2,fma,f16c")))
#define KVCHAT_ISA_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define KVCHAT_ISA_AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define KVCHAT_HAVE_AVX2_KERNELS 1
#else
#define KVCHAT_ISA_BASELINE_INLINE
#define KVCHAT_ISA_BASELINE
#define KVCHAT_ISA_AVX2
#define KVCHAT_ISA_AVX512
#define KVCHAT_ISA_AVX512_VNNI
#define KVCHAT_HAVE_AVX2_KERNELS 0
#endif
