#!/usr/bin/env python3
"""Writes a GGUF file of random weights in a Llama model's shape, with a real vocabulary: a model-sized file
for `kvchat-cli bench --model FILE.gguf` (load, resident memory, speed) without downloading one.

usage: random-gguf.py CONFIG.json VOCAB.gguf OUT.gguf [q4_k|q8_0|f32]
CONFIG.json: a Hugging Face config (hidden_size, intermediate_size, ...); VOCAB.gguf: a vocab-only GGUF
whose tokenizer.ggml.* entries are copied (e.g. fixtures/gguf/llama3-vocab-only.gguf in the reference
data). Norm weights are f32 ones; every matrix, the embedding included, is of the given type (default
q4_k). The blocks are one MiB of random bytes with small scales, repeated: good for memory and speed,
meaningless as text. f32 matrices (one MiB of small random values, repeated) are what llama.cpp's llama-quantize
takes to make its own Q4_K_M, Q8_0, F16 and BF16 files (bench/peers/llama_cpp.sh)."""
import json, os, random, struct, sys

T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64, T_I64, T_F64 = range(13)
SCALAR = {T_U8: "B", T_I8: "b", T_U16: "H", T_I16: "h", T_U32: "I", T_I32: "i", T_F32: "f", T_BOOL: "?",
          T_U64: "Q", T_I64: "q", T_F64: "d"}

def read_value(f, t):
    if t == T_STR:
        n, = struct.unpack("<Q", f.read(8)); return f.read(n)
    if t == T_ARR:
        et, n = struct.unpack("<IQ", f.read(12)); return (et, [read_value(f, et) for _ in range(n)])
    fmt = "<" + SCALAR[t]; return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]

def write_value(out, t, v):
    if t == T_STR:
        out.write(struct.pack("<Q", len(v))); out.write(v)
    elif t == T_ARR:
        et, items = v; out.write(struct.pack("<IQ", et, len(items)))
        for item in items: write_value(out, et, item)
    else:
        out.write(struct.pack("<" + SCALAR[t], v))

BLOCK_TYPES = ("q4_k", "q8_0", "f32")

def main():
    if len(sys.argv) not in (4, 5) or (len(sys.argv) == 5 and sys.argv[4] not in BLOCK_TYPES):
        sys.exit("usage: random-gguf.py CONFIG.json VOCAB.gguf OUT.gguf [" + "|".join(BLOCK_TYPES) + "]")
    config = json.load(open(sys.argv[1]))
    with open(sys.argv[2], "rb") as f:
        if f.read(4) != b"GGUF":
            sys.exit(sys.argv[2] + ": not a GGUF file")
        version, n_tensors, n_kv = struct.unpack("<IQQ", f.read(20))
        kvs = []
        for _ in range(n_kv):
            key = read_value(f, T_STR); t, = struct.unpack("<I", f.read(4))
            kvs.append((key, t, read_value(f, t)))
    kvs = [kv for kv in kvs if kv[0].startswith(b"tokenizer.")]
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim", hidden // heads)
    vocab = len(next(v for k, t, v in kvs if k == b"tokenizer.ggml.tokens")[1])
    F32 = 0
    block_type = sys.argv[4] if len(sys.argv) > 4 else "q4_k"
    # GGUF type id, general.file_type, elements and bytes per block, and the f16 scales each block starts with.
    matrix_type, file_type, block_size, block_bytes, scales = {
        "q4_k": (12, 15, 256, 144, struct.pack("<HH", 0x1c00, 0x1800)),
        "q8_0": (8, 7, 32, 34, struct.pack("<H", 0x1c00)),
        "f32": (F32, 0, 1, 4, b"")}[block_type]
    meta = [(b"general.architecture", T_STR, b"llama"), (b"general.file_type", T_U32, file_type),
            (b"llama.context_length", T_U32, min(config["max_position_embeddings"], 8192)),
            (b"llama.embedding_length", T_U32, hidden), (b"llama.block_count", T_U32, config["num_hidden_layers"]),
            (b"llama.feed_forward_length", T_U32, inter), (b"llama.attention.head_count", T_U32, heads),
            (b"llama.attention.head_count_kv", T_U32, kv_heads), (b"llama.rope.dimension_count", T_U32, head_dim),
            (b"llama.rope.freq_base", T_F32, float(config.get("rope_theta", 10000.0))),
            (b"llama.attention.layer_norm_rms_epsilon", T_F32, float(config["rms_norm_eps"]))]
    tensors = [(b"token_embd.weight", [hidden, vocab], matrix_type), (b"output_norm.weight", [hidden], F32)]
    for i in range(config["num_hidden_layers"]):
        p = b"blk.%d." % i
        tensors += [(p + b"attn_norm.weight", [hidden], F32), (p + b"ffn_norm.weight", [hidden], F32),
                    (p + b"attn_q.weight", [hidden, heads * head_dim], matrix_type),
                    (p + b"attn_k.weight", [hidden, kv_heads * head_dim], matrix_type),
                    (p + b"attn_v.weight", [hidden, kv_heads * head_dim], matrix_type),
                    (p + b"attn_output.weight", [heads * head_dim, hidden], matrix_type),
                    (p + b"ffn_gate.weight", [hidden, inter], matrix_type), (p + b"ffn_up.weight", [hidden, inter], matrix_type),
                    (p + b"ffn_down.weight", [inter, hidden], matrix_type)]
    def nbytes(dims, t):
        count = 1
        for d in dims: count *= d
        return count * 4 if t == F32 else count // block_size * block_bytes
    # About one MiB of blocks (random quants, small scales), repeated.
    blocks = (1 << 20) // block_bytes
    if block_type == "f32":
        generator = random.Random(7)
        block = struct.pack("<%df" % blocks, *(generator.gauss(0.0, 0.02) for _ in range(blocks)))
    else:
        block = bytearray(os.urandom(block_bytes * blocks))
        for b in range(blocks):
            block[block_bytes * b:block_bytes * b + len(scales)] = scales
    ones = struct.pack("<f", 1.0) * 65536
    with open(sys.argv[3], "wb") as out:
        out.write(b"GGUF"); out.write(struct.pack("<IQQ", 3, len(tensors), len(meta) + len(kvs)))
        for key, t, v in meta + kvs:
            write_value(out, T_STR, key); out.write(struct.pack("<I", t)); write_value(out, t, v)
        offset = 0
        for name, dims, t in tensors:
            write_value(out, T_STR, name); out.write(struct.pack("<I", len(dims)))
            for d in dims: out.write(struct.pack("<Q", d))
            out.write(struct.pack("<IQ", t, offset)); offset += (nbytes(dims, t) + 31) // 32 * 32
        out.write(b"\0" * ((32 - out.tell() % 32) % 32))
        for name, dims, t in tensors:
            n = nbytes(dims, t); source = ones if name.endswith(b"norm.weight") else block
            while n > 0:
                piece = min(n, len(source)); out.write(source[:piece]); n -= piece
            out.write(b"\0" * ((32 - out.tell() % 32) % 32))

main()
