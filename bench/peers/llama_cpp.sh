#!/usr/bin/env bash
# kvchat against llama.cpp on the same GGUF file, measured side by side on this machine.
#
#   LLAMA_CPP_DIR=~/llama.cpp/build bench/peers/llama_cpp.sh [--pairs N] [--threads N] [--tests LIST] [--kv-dtype T] FILE.gguf...
#   LLAMA_CPP_DIR=~/llama.cpp/build bench/peers/llama_cpp.sh --make-files DIR [--config CONFIG.json]
#
# For each file and test, N pairs (default 5) of runs: kvchat-cli bench, then llama.cpp's llama-bench (the order
# alternates from pair to pair), each pair started only once the machine is quiet (other processes below 15 % of the
# CPU for a second) and read against the memory bandwidth kvchat-cli bench probes at its start. Prints each pair,
# then per test kvchat / llama.cpp as the median of the pairs' ratios with their range.
#   decode64     decode of 32 tokens after a 64-token prompt (llama-bench -p 0 -n 32 -d 64)
#   decode4096   the same after 4,096 tokens (-d 4096)
#   prefill512   a 512-token prompt (-p 512 -n 0; kvchat's prefill tok/s of a 512-token prompt)
# Both warm up before they measure: llama-bench runs its test once unmeasured (its default), kvchat-cli bench runs
# the row's prompt once (--warmup). A first run after loading pays the first touches of the mapped file and of the
# buffers; llama-bench never reports it.
# Both keep K/V in the same type: --kv-dtype f16 (the default, llama-bench's own default cache type), bf16, q8_0
# (llama.cpp keeps a q8_0 V cache only with flash attention, which is then switched on) or f32.
# OPENBLAS_CORETYPE is unset for the runs: it forces OpenBLAS's kernel set (an AVX2 one on an AVX-512 processor
# slows kvchat's dense prefill), and a machine without it lets OpenBLAS choose for its processor.
# --make-files DIR writes an F32 GGUF of the Llama-3.2-1B shape with random weights (scripts/random-gguf.py) and has
# llama.cpp's own llama-quantize make Q4_K_M, Q8_0, F16 and BF16 files from it in DIR.
#
# llama.cpp, CPU only, from its public repository:
#   git clone https://github.com/ggml-org/llama.cpp && cd llama.cpp
#   cmake -B build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release
#   cmake --build build -j --target llama-bench llama-quantize
# Not part of CI: a comparison takes tens of minutes (decode4096 prefills 4,096 tokens for every run).
set -euo pipefail
cd "$(dirname "$0")/../.."

pairs=5
threads=2
tests="decode64 decode4096 prefill512"
kv_dtype=f16
make_files=""
shared_dir=${KVCHAT_SHARED_DIR:-$(cd .. && pwd)/shared}
config=$shared_dir/fixtures/configs/llama-3.2-1b.json
kvchat=${KVCHAT_CLI:-build/kvchat-cli}
files=()
while [ $# -gt 0 ]; do
  case "$1" in
    --pairs) pairs=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --tests) tests=$2; shift 2 ;;
    --make-files) make_files=$2; shift 2 ;;
    --config) config=$2; shift 2 ;;
    --kv-dtype) kv_dtype=$2; shift 2 ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) files+=("$1"); shift ;;
  esac
done
llama_dir=${LLAMA_CPP_DIR:?set LLAMA_CPP_DIR to a llama.cpp build folder (the one holding bin/llama-bench)}
llama_bench=$llama_dir/bin/llama-bench
[ -x "$llama_bench" ] || { echo "no $llama_bench: build llama.cpp first (see the top of this script)" >&2; exit 2; }

if [ -n "$make_files" ]; then
  mkdir -p "$make_files"
  f32=$make_files/llama-1b-random-F32.gguf
  [ -f "$f32" ] || python3 scripts/random-gguf.py "$config" "$shared_dir/fixtures/gguf/llama3-vocab-only.gguf" "$f32" f32
  for type in Q4_K_M Q8_0 F16 BF16; do
    out=$make_files/llama-1b-random-$type.gguf
    [ -f "$out" ] || "$llama_dir/bin/llama-quantize" "$f32" "$out" "$type" "$threads" > "$out.log" 2>&1
    echo "$out"
  done
  exit 0
fi
case "$kv_dtype" in
  f32|f16|bf16) llama_cache="-ctk $kv_dtype -ctv $kv_dtype" ;;
  q8_0) llama_cache="-ctk q8_0 -ctv q8_0 -fa 1" ;;
  *) echo "--kv-dtype must be f32, f16, bf16 or q8_0" >&2; exit 2 ;;
esac
if [ -n "${OPENBLAS_CORETYPE:-}" ]; then
  echo "(OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE is unset for the runs: OpenBLAS chooses its kernels for this processor)"
  unset OPENBLAS_CORETYPE
fi
[ ${#files[@]} -gt 0 ] || { echo "usage: LLAMA_CPP_DIR=... $0 [--pairs N] [--threads N] [--tests LIST] FILE.gguf..." >&2; exit 2; }
[ -x "$kvchat" ] || { echo "no $kvchat: run make first" >&2; exit 2; }

# The share of the CPU that other processes used over one second (nothing of ours runs while it is read).
busy_share() {
  python3 - <<'EOF'
import time
def read():
    fields = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return sum(fields), fields[3] + fields[4]
total0, idle0 = read(); time.sleep(1); total1, idle1 = read()
print(int(100 * (1 - (idle1 - idle0) / max(1, total1 - total0))))
EOF
}
wait_until_quiet() {
  local waited=0
  while [ "$(busy_share)" -gt 15 ]; do
    waited=$((waited + 1))
    if [ $waited -ge 300 ]; then echo "  (still busy after 5 minutes: measuring anyway)" >&2; return; fi
  done
}

# Prints "tok/s bandwidth_GB/s" for kvchat, "tok/s" for llama.cpp.
run_kvchat() {  # file test
  local prompt new field
  case "$2" in
    decode64) prompt=64; new=32; field=decode_tok_s ;;
    decode4096) prompt=4096; new=32; field=decode_tok_s ;;
    prefill512) prompt=512; new=1; field=prefill_tok_s ;;
  esac
  "$kvchat" bench --model "$1" --threads "$threads" --kv-cache on --kv-dtype "$kv_dtype" --prompt-tokens $prompt \
    --new-tokens $new --warmup --json \
    2>/dev/null | python3 -c "
import json, sys
speed = bandwidth = 0.0
for line in sys.stdin:
    row = json.loads(line)
    if 'machine' in row: bandwidth = row['machine']['read_bandwidth_gb_s']
    elif 'kv_cache' in row: speed = row['$field']
print(speed, bandwidth)"
}
run_llama() {  # file test
  local args
  case "$2" in
    decode64) args="-p 0 -n 32 -d 64" ;;
    decode4096) args="-p 0 -n 32 -d 4096" ;;
    prefill512) args="-p 512 -n 0" ;;
  esac
  # shellcheck disable=SC2086
  "$llama_bench" -m "$1" -t "$threads" -r 1 -o jsonl $llama_cache $args 2>/dev/null | python3 -c "
import json, sys
print([json.loads(line) for line in sys.stdin if line.strip()][-1]['avg_ts'])"
}

# LLAMA_CPP_COMMIT names the build where its folder is not a git checkout (a source archive).
commit=${LLAMA_CPP_COMMIT:-$(git -C "$llama_dir/.." rev-parse --short HEAD 2>/dev/null || echo "unknown")}
echo "kvchat $(git rev-parse --short HEAD) vs llama.cpp $commit, $threads threads, KV cache $kv_dtype, $pairs pairs," \
  "$(date -u +%Y-%m-%d)"
summary=$(mktemp)
for file in "${files[@]}"; do
  for test in $tests; do
    for pair in $(seq 1 "$pairs"); do
      wait_until_quiet
      if [ $((pair % 2)) -eq 1 ]; then
        read -r ours bandwidth < <(run_kvchat "$file" "$test"); theirs=$(run_llama "$file" "$test")
      else
        theirs=$(run_llama "$file" "$test"); read -r ours bandwidth < <(run_kvchat "$file" "$test")
      fi
      printf '%s %s pair %d: kvchat %.2f tok/s, llama.cpp %.2f tok/s, ratio %.3f (bandwidth %.1f GB/s)\n' \
        "$(basename "$file")" "$test" "$pair" "$ours" "$theirs" "$(python3 -c "print($ours / $theirs)")" "$bandwidth"
      echo "$(basename "$file") $test $ours $theirs" >> "$summary"
    done
  done
done
echo
python3 - "$summary" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, test, ours, theirs = line.split()
    rows.setdefault((name, test), []).append((float(ours), float(theirs)))
print("| file | test | kvchat tok/s | llama.cpp tok/s | kvchat / llama.cpp (median, range) |")
print("|---|---|---|---|---|")
for (name, test), pairs in rows.items():
    ratios = [ours / theirs for ours, theirs in pairs]
    print("| %s | %s | %.2f | %.2f | %.3f (%.3f-%.3f) |" % (name, test, statistics.median(p[0] for p in pairs),
          statistics.median(p[1] for p in pairs), statistics.median(ratios), min(ratios), max(ratios)))
EOF
rm -f "$summary"
