#!/usr/bin/env bash
# make test-sanitize: the whole ctest suite on a build of every kvchat target with AddressSanitizer and
# UndefinedBehaviorSanitizer (build-sanitize/, -O1 with line tables, a unity build as in build/).
# LibTorch, Qt and the other system libraries are not instrumented: ASan still sees every access kvchat
# code makes, but not what happens inside them.
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=${SANITIZE_BUILD_DIR:-build-sanitize}
if [ ! -f "$build_dir/build.ninja" ]; then
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVCHAT_SANITIZE=ON
fi
cmake --build "$build_dir" -j "${JOBS:-$(nproc)}"

# halt_on_error: the first report fails the test that caused it (UBSan is compiled with
# -fno-sanitize-recover, so it stops too). Leak checking stays on, with tests/sanitize/lsan.supp naming
# the uninstrumented libraries whose process-lifetime allocations are not leaks of ours.
# max_allocation_size_mb: the tests that cap their address space at 2 GiB cannot under ASan
# (tests/common/address_space_limit.h); any single allocation past 2 GiB is a report instead.
export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1:check_initialization_order=1:max_allocation_size_mb=2048}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/sanitize/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export QT_QPA_PLATFORM=offscreen
# The *_portable, *_avx2 and *_plain_path tests repeat engine suites over other kernels (KVCHAT_ISA,
# KVCHAT_KERNELS=off) to show the same ids and logits there; `make test` runs them. Here they are left out: the
# kernels themselves run under the sanitizers at every instruction-set level in kvchat_kernels_tests, and the
# repeats would be a third of this run's time. So are the benchmark suites (app_test_cli_bench*,
# app_test_cli_serve_bench): an instrumented program's figures measure nothing, the generation they time runs in
# the engine and server suites here, and each of their kvchat-cli children pays LibTorch's start-up under the
# sanitizers. SANITIZE_EXCLUDE="" runs them all.
exclude=${SANITIZE_EXCLUDE-'_(portable|avx2|plain_path)$|^app_test_cli_(bench|bench_snapshot|serve_bench)$'}
cd "$build_dir"
ctest --output-on-failure -j "${JOBS:-$(nproc)}" ${exclude:+-E "$exclude"} ${CTEST_ARGS:-}
