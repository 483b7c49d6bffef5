#pragma once
// Process-wide switches for how the engine computes.
namespace kvchat {

// Whether the hand-written CPU kernels (engine/kernels) replace LibTorch's linear where they apply:
// batch-1 and short-chunk products, and bf16 weights. On by default; KVCHAT_KERNELS=off in the
// environment starts with them off, so the fidelity tests can run over the plain LibTorch path too.
bool fast_kernels_enabled();
void set_fast_kernels_enabled(bool enabled);

// The engine's thread count (0 = the machine's cores) for LibTorch's intra-op pool, OpenBLAS and the
// engine kernels' pool.
// More than max_compute_threads() (4x the machine's cores) is refused with std::invalid_argument: it
// only adds contention, and absurd counts would allocate per-thread buffers until memory runs out.
void set_compute_threads(int threads);
int max_compute_threads();
int compute_threads();

// Who gets the cores during one forward. Batch-1 decode runs its big products on the engine kernels'
// pool; LibTorch's OpenMP threads and OpenBLAS's threads then only do small work, but once woken they
// spin for milliseconds and take the cores from the kernels' workers (decode at long contexts lost a
// third of its bandwidth). So a streaming forward gives them one thread, and a
// prefill-sized forward gives LibTorch all of them back. OpenBLAS keeps one thread there too while the kernels are
// on: a prompt's products run on the kernels' pool, each thread calling a single-threaded sgemm on blocks of the
// weights (Linear::forward_into); with the kernels off, OpenBLAS has them all. Library gives LibTorch and OpenBLAS
// every thread regardless (the bench's sgemm ceiling). Cheap: it only acts when the phase changes.
enum class ComputePhase { Streaming, Parallel, Library };
void enter_compute_phase(ComputePhase phase);

}  // namespace kvchat
