#pragma once
// The engine's thread settings (set_compute_threads: LibTorch's and BLAS's thread counts and the
// kernels' thread pool, which it recreates) are process-wide, and a pool must not be destroyed while
// another thread runs a kernel on it. Where one process runs the model on several threads and one of
// them may change those settings (the desktop app: its engine thread and the server it can host), the
// generations hold this lock shared and the change (a model load, a new thread count) holds it
// exclusively. The model itself is immutable and the kernels take concurrent callers (a second caller
// runs inline), which is what `kvchat-cli serve --parallel` relies on.
#include <shared_mutex>

namespace kvchat::app {

std::shared_mutex& compute_settings_mutex();

}  // namespace kvchat::app
