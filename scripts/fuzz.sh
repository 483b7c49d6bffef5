#!/usr/bin/env bash
# make fuzz: builds the libFuzzer targets of tests/fuzz/ with clang (ASan + UBSan) into build-fuzz/, writes
# their seed corpora from the reference fixtures, and runs each target for FUZZ_SECONDS seconds.
#   FUZZ_SECONDS   seconds per target (default 60)
#   FUZZ_TARGETS   which targets (default: all six)
#   FUZZ_BUILD_DIR build folder (default build-fuzz)
#   FUZZ_PARALLEL  targets run at a time (default: JOBS, else the number of cores)
#   FUZZ_ARGS      more libFuzzer options (e.g. "-jobs=2 -workers=2")
#   FUZZ_SANITIZERS the sanitizers of a new build folder (default address,undefined)
#   FUZZ_CORPUS_DIR where the corpora accumulate (default <build folder>/fuzz/corpus)
#   FUZZ_REPLAY=1  instead of fuzzing, run every input of the corpora, seeds and regressions once
# New inputs accumulate in build-fuzz/fuzz/corpus/<target>/, so later runs (a longer campaign:
# FUZZ_SECONDS=36000 nice -n 19 scripts/fuzz.sh) continue from them. A crash, sanitizer report, timeout
# or memory blow-up stops that target and leaves its input in build-fuzz/fuzz/artifacts/<target>/; the
# script then goes on with the next target and fails at the end.
# ASan costs 3-15x the executions per second. A long campaign can fuzz with UBSan alone, into the same
# corpora, and then replay them under ASan:
#   FUZZ_BUILD_DIR=build-fuzz-ubsan FUZZ_SANITIZERS=undefined FUZZ_CORPUS_DIR=build-fuzz/fuzz/corpus \
#     FUZZ_SECONDS=7200 nice -n 19 scripts/fuzz.sh
#   FUZZ_REPLAY=1 scripts/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=${FUZZ_BUILD_DIR:-build-fuzz}
seconds=${FUZZ_SECONDS:-60}
targets=${FUZZ_TARGETS:-"safetensors model_config tokenizer chat_template gguf remote_stream openai_request"}
shared_dir=${KVCHAT_SHARED_DIR:-$(cd .. && pwd)/shared}

if [ ! -f "$build_dir/build.ninja" ]; then
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DKVCHAT_FUZZ=ON -DKVCHAT_FUZZ_SANITIZERS="${FUZZ_SANITIZERS:-address,undefined}" -DKVCHAT_SHARED_DIR="$shared_dir"
fi
cmake --build "$build_dir" --target kvchat_fuzzers -j "${JOBS:-$(nproc)}"

fuzz_dir=$build_dir/fuzz
corpus_dir=${FUZZ_CORPUS_DIR:-$fuzz_dir/corpus}
rm -rf "$fuzz_dir/seeds"
"$fuzz_dir/fuzz_seeds" "$shared_dir" "$fuzz_dir/seeds" tests/fixtures/families

# halt_on_error: the first report ends the run with the input saved. Leaks are bugs here (only kvchat
# code and system libraries run; no LibTorch).
export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export ASAN_SYMBOLIZER_PATH=${ASAN_SYMBOLIZER_PATH:-$(command -v llvm-symbolizer-14 || true)}

# What a failed run found, for a log that is all a CI run keeps: the sanitizer's or the C++ runtime's report
# with its stack, and the input that did it (base64, when small) to save under tests/fuzz/regressions/.
report_finding() {
  local log=$1 artifacts=$2
  grep -aE "ERROR: |SUMMARY: |runtime error|==[0-9]+==|terminate called|what\(\): |Assertion|^ +#[0-9]+ 0x" "$log" |
    head -40 | sed 's/^/  /' || true
  local input
  input=$(find "$artifacts" -type f -newer "$log.start" 2>/dev/null | head -1)
  if [ -n "$input" ] && [ "$(stat -c %s "$input")" -le 8192 ]; then
    echo "  input $(basename "$input"), base64:"
    base64 -w 100 "$input" | sed 's/^/    /'
  fi
}

# One target's run; its summary goes to $fuzz_dir/logs/<target>.summary, its status is the run's.
fuzz_one() {
  local target=$1
  local corpus=$corpus_dir/$target
  local artifacts=$fuzz_dir/artifacts/$target
  local log=$fuzz_dir/logs/$target.log
  local summary=$fuzz_dir/logs/$target.summary
  mkdir -p "$corpus" "$artifacts" "$(dirname "$log")"
  touch "$log.start"  # artifacts newer than this are this run's
  local inputs=("$corpus" "$fuzz_dir/seeds/$target")
  [ -d "tests/fuzz/regressions/$target" ] && inputs+=("tests/fuzz/regressions/$target")
  if [ "${FUZZ_REPLAY:-0}" = 1 ]; then
    # Every input once (-runs=0 after loading them): a report on any of them fails the target.
    local count
    count=$(find "${inputs[@]}" -type f | wc -l)
    echo "fuzz_$target: replay of $count inputs (log: $log)" > "$summary"
    if "$fuzz_dir/fuzz_$target" -runs=0 -timeout=60 -rss_limit_mb=2048 -artifact_prefix="$artifacts/" "${inputs[@]}" > "$log" 2>&1; then
      grep -E "^#[0-9]+[[:space:]]+DONE" "$log" | tail -1 | sed 's/^/  /' >> "$summary" || true
      return 0
    fi
    echo "  FAILED: see $log and $artifacts/" >> "$summary"
    report_finding "$log" "$artifacts" >> "$summary"
    return 1
  fi
  echo "fuzz_$target: ${seconds}s (log: $log)" > "$summary"
  # -timeout: one input may take a few seconds under ASan (the largest templates render ~10^7 steps);
  # longer is a hang. -rss_limit_mb: more than 2 GB for one input is a memory blow-up.
  # shellcheck disable=SC2086
  if "$fuzz_dir/fuzz_$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
       -dict="tests/fuzz/dict/$target.dict" -artifact_prefix="$artifacts/" ${FUZZ_ARGS:-} "${inputs[@]}" > "$log" 2>&1; then
    grep -E "^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)|^#[0-9]+[[:space:]]+DONE" "$log" | sed 's/^/  /' >> "$summary" || true
  else
    echo "  FAILED: see $log and $artifacts/" >> "$summary"
    report_finding "$log" "$artifacts" >> "$summary"
    return 1
  fi
}

# FUZZ_PARALLEL targets at a time (default: one per core): each still gets its FUZZ_SECONDS.
parallel=${FUZZ_PARALLEL:-${JOBS:-$(nproc)}}
declare -A pid_of
failed=()
for target in $targets; do
  while [ "$(jobs -rp | wc -l)" -ge "$parallel" ]; do wait -n || true; done
  fuzz_one "$target" &
  pid_of[$target]=$!
done
for target in $targets; do
  wait "${pid_of[$target]}" || failed+=("$target")
  cat "$fuzz_dir/logs/$target.summary"
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz targets that failed: ${failed[*]}"
  exit 1
fi
if [ "${FUZZ_REPLAY:-0}" = 1 ]; then echo "every input of every target replayed without a finding"; exit 0; fi
echo "all fuzz targets ran ${seconds}s without a finding"
