#pragma once
// What the processor we run on can do; kernels check this once and fall back to plain code.
namespace kvchat::kernels {
bool cpu_has_avx2_fma();

// True when the AVX2/FMA kernels should run: the processor has them and they have not been switched
// off. Tests and benchmarks switch them off to exercise the portable fallbacks on an AVX2 machine.
bool use_avx2_kernels();
void set_avx2_kernels_enabled(bool enabled);
}
