#pragma once
// Process-level set-up that must happen before LibTorch's OpenMP runtime reads its environment.

namespace kvchat {

// LibTorch's OpenMP threads spin-wait after every parallel region by default, and on a machine with
// as many engine threads as cores they then steal those cores from OpenBLAS's and the kernels'
// threads, and a prefill lost a quarter of the sgemm rate. libgomp reads
// OMP_WAIT_POLICY only when it is loaded, before main() runs, so when the variable is unset this sets
// it to PASSIVE and re-executes the program (once; a failed exec just continues). Call it first in
// main(), before any thread exists. KVCHAT_NO_REEXEC=1 turns it off.
void ensure_passive_openmp_threads(char** argv);

// A prefill's temporaries are large (a 512-token chunk of a 1B model: 16 MiB MLP activations, 32 MiB of
// attention scores), and glibc serves blocks over its mmap threshold (dynamic, at most 32 MiB) with
// fresh mappings and gives freed heap tops back to the system: every product then paid a page fault
// and a zero fill per 4 KiB, about half of a 512-token prefill's time. This keeps allocations up to 1 GiB in the heap
// and freed memory in the process, so the next chunk reuses it: resident memory stays at the largest prefill's
// high-water mark. Call it once, early in main().
void keep_freed_memory_for_reuse();

// Gives the heap's free memory back to the system (malloc_trim): after a model is loaded, so that the
// loader's temporaries (converted tensors, random weights made in f32 before their GGUF type) do not
// stay resident under keep_freed_memory_for_reuse. No-op outside glibc.
void release_freed_memory();

}  // namespace kvchat
