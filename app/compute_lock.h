#pragma once
// What compute settings remain process-wide, and who may change them when. Each user of the engine in the
// desktop app computes with a ComputeContext of its own (engine/compute/compute_context.h: its threads, its
// kernels switch, its kernels' pool): the engine thread's and the hosted server's, so a new thread setting
// changes no shared state. A model load still calls set_compute_threads (LibTorch's and OpenBLAS's thread
// counts and the default kernels' pool, which it recreates), and OpenBLAS has one thread count for the
// whole process, which must not change under a product another thread is running. So the server's requests
// hold this lock shared and a load holds it exclusively. The model itself is immutable and the kernels take
// concurrent callers (a second caller of one pool runs inline), which `kvchat-cli serve --parallel` relies on.
#include <shared_mutex>

namespace kvchat::app {

std::shared_mutex& compute_settings_mutex();

}  // namespace kvchat::app
