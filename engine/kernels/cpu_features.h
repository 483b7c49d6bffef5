#pragma once
// What the processor we run on can do; kernels check this once and fall back to plain code.
namespace kvchat::kernels {
bool cpu_has_avx2_fma();
}
