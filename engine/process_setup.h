#pragma once
// Process-level set-up that must happen before LibTorch's OpenMP runtime reads its environment.

namespace kvchat {

// LibTorch's OpenMP threads spin-wait after every parallel region by default, and on a machine with
// as many engine threads as cores they then steal those cores from OpenBLAS's and the kernels'
// threads: a 512-token prefill ran at 56 % of the sgemm rate instead of 76 %. libgomp reads
// OMP_WAIT_POLICY only when it is loaded, before main() runs, so when the variable is unset this sets
// it to PASSIVE and re-executes the program (once; a failed exec just continues). Call it first in
// main(), before any thread exists. KVCHAT_NO_REEXEC=1 turns it off.
void ensure_passive_openmp_threads(char** argv);

}  // namespace kvchat
