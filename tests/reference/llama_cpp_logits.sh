#!/usr/bin/env bash
# Writes llama.cpp's own logits for the family fixtures' GGUF files, an implementation independent of kvchat and of
# transformer_reference.py: for each family (gemma2 and phi3 by default, or those named as arguments),
# tests/fixtures/families/<family>/logits-<F32|Q8_0|Q4_K>-llama.cpp.f32 (float32 [positions, vocab], row-major) over
# reference.json's prompt, and the keys "llama_cpp_logits" and "llama_cpp" (commit, settings) in reference.json; and
# llama.cpp's tokenization of the fixture's prompt, turn and chat texts ("llama_cpp_tokenization"), which every GGUF
# file of the family must reproduce. --tokenize-only records the tokenization alone.
# Not part of the product build: it compiles llama_cpp_logits.cpp into a temporary folder against a llama.cpp build.
#
# Run from the repository root: tests/reference/llama_cpp_logits.sh [--tokenize-only] [FAMILY...]
#   LLAMA_CPP_SOURCE  llama.cpp's source tree, default ~/llama.cpp: its headers (include/, ggml/include/), and its
#                     ggml/src/ggml-cpu/vec.h tells which GELU the recorded settings name
#   LLAMA_CPP_DIR     the folder of its libllama.so and libggml*.so, default $LLAMA_CPP_SOURCE/build/bin
#   LLAMA_CPP_COMMIT  the commit recorded in reference.json, default the source tree's git HEAD (else "unknown")
#
# The committed files come from llama.cpp d32676d built with exact GELU. Stock ggml's CPU backend computes GELU (and
# GeGLU, Gemma 2's feed-forward) from an fp16 lookup table, about 1e-3 off the tanh formula, and the Q8_0 / Q8_K
# rounding of every product's input amplifies that into logits about 2% apart; with exact GELU, gemma2's logits
# agree with a float64 forward that rounds activations as ggml does to about 2e-7. phi3 does not use GELU: both
# builds give the same bytes. llama.cpp ignores Phi-3's sliding window (llama_model_phi3::load_arch_hparams), so
# phi3's logits agree with the windowed reference at positions below the window (32) only.
# The exact build is the stock one with the single line `#define GGML_GELU_FP16` removed from
# ggml/src/ggml-cpu/vec.h, in a copy of the sources:
#   cp -r ~/llama.cpp /tmp/llama.cpp-exact-gelu && cd /tmp/llama.cpp-exact-gelu && rm -rf build
#   sed -i '/^#define GGML_GELU_FP16$/d' ggml/src/ggml-cpu/vec.h
#   cmake -B build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF \
#     -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF && cmake --build build -j2 --target llama
# then, from the repository root:
#   LLAMA_CPP_SOURCE=/tmp/llama.cpp-exact-gelu LLAMA_CPP_COMMIT=d32676d tests/reference/llama_cpp_logits.sh
set -euo pipefail

source_dir=${LLAMA_CPP_SOURCE:-$HOME/llama.cpp}
lib_dir=${LLAMA_CPP_DIR:-$source_dir/build/bin}
commit=${LLAMA_CPP_COMMIT:-$(git -C "$source_dir" rev-parse --short HEAD 2>/dev/null || echo unknown)}
if grep -q '^#define GGML_GELU_FP16$' "$source_dir/ggml/src/ggml-cpu/vec.h"; then
    gelu="GELU from ggml's fp16 table (stock)"
else
    gelu="exact tanh GELU (GGML_GELU_FP16 undefined in ggml/src/ggml-cpu/vec.h)"
fi
settings="CPU only, 1 thread, KV cache F32, flash attention off, n_ctx 512, n_batch = n_ubatch = 512, the prompt as \
one batch without BOS, logits at every position; $gelu"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
g++ -O2 -std=c++17 -I"$source_dir/include" -I"$source_dir/ggml/include" tests/reference/llama_cpp_logits.cpp \
    -o "$work/llama_cpp_logits" -L"$lib_dir" -Wl,-rpath,"$lib_dir" -lllama -lggml -lggml-base

# --tokenize-only FAMILY...: llama.cpp's tokenization alone, no logits (the other GGUF families: their logits files
# would take the fixtures past their 20 MB).
logits=1
if [ "${1:-}" = "--tokenize-only" ]; then
    logits=0
    shift
fi
families=("$@")
[ $# -gt 0 ] || families=(gemma2 phi3)
for family in "${families[@]}"; do
    folder=tests/fixtures/families/$family
    ids=$(python3 -c 'import json, sys; print(",".join(map(str, json.load(open(sys.argv[1]))["prompt"])))' \
        "$folder/reference.json")
    for type in F32 Q8_0 Q4_K; do
        [ "$logits" = 1 ] || break
        "$work/llama_cpp_logits" "$folder/model-$type.gguf" "$ids" "$folder/logits-$type-llama.cpp.f32"
    done
    # llama.cpp's tokenization of the prompt, turn and chat texts, by the F32 file's vocabulary (every file of the
    # family carries the same one).
    for text in prompt_text turn_text chat_text; do
        python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); sys.stdout.write(r.get(sys.argv[2]) or r["tokenizer"][sys.argv[2]])' \
            "$folder/reference.json" "$text" > "$work/$text.txt"
        "$work/llama_cpp_logits" --tokenize "$folder/model-F32.gguf" "$work/$text.txt" > "$work/$text.ids"
    done
    python3 - "$folder/reference.json" "$commit" "$settings" "$work" "$logits" <<'EOF'
import json, os, sys
sys.path.insert(0, "tests/reference")
import fixture_json
path, commit, settings, work, logits = sys.argv[1:]
with open(path) as f:
    summary = json.load(f)
with open(os.path.join(os.path.dirname(path), "config.json")) as f:
    config = json.load(f)
# The positions where llama.cpp computes the model the fixture defines.
comparable, why = summary["positions"], "every position"
window = config.get("sliding_window") or 0
if config["model_type"] == "phi3" and 0 < window < comparable:
    comparable, why = window, "llama.cpp runs Phi-3 without its sliding window: the positions before the window fills"
if logits == "1":
    summary["llama_cpp_logits"] = {f"model-{t}.gguf": f"logits-{t}-llama.cpp.f32" for t in ("F32", "Q8_0", "Q4_K")}
    summary["llama_cpp"] = {"commit": commit, "settings": settings, "comparable_positions": comparable, "why": why}
tokenized = {"commit": commit}
for text in ("prompt_text", "turn_text", "chat_text"):
    with open(os.path.join(work, text + ".ids")) as f:
        tokenized[text + "_ids"] = [int(i) for i in f.read().strip().split(",")]
summary["llama_cpp_tokenization"] = {"file": "model-F32.gguf", **tokenized}
fixture_json.write(path, summary)
EOF
done
