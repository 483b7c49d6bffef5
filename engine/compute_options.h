#pragma once
// Process-wide switches for how the engine computes.
namespace kvchat {

// Whether the hand-written CPU kernels (engine/kernels) replace LibTorch's linear where they apply:
// batch-1 and short-chunk products, and bf16 weights. On by default; KVCHAT_KERNELS=off in the
// environment starts with them off, so the fidelity tests can run over the plain LibTorch path too.
bool fast_kernels_enabled();
void set_fast_kernels_enabled(bool enabled);

}  // namespace kvchat
