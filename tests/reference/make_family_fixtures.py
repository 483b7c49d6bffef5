#!/usr/bin/env python3
"""Writes tests/fixtures/families/<family>/: a tiny seeded random model of the family as a Hugging Face folder
(config.json, model.safetensors in bf16, the family's published tokenizer cut to a few hundred tokens by
real_vocabulary.py) and as GGUF (F32, Q8_0, and Q4_K with Q8_0 where a row is not a whole number of 256-weight
blocks, as llama.cpp's quantizer falls back; the same vocabulary in tokenizer.ggml.*), a prompt text with its ids as
transformers.js encodes it, and the logits of transformer_reference.py over its first 64 ids for each file (the GGUF
ones over the files' own dequantized weights).

Run from the repository root with Debian's python3-numpy and Node.js, after
tests/reference/fetch_tokenizer_sources.sh DIR:
    python3 tests/reference/make_family_fixtures.py --tokenizer-sources DIR [FAMILY...]
(every family by default). Deterministic: the same files every run.
"""
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import fixture_json  # noqa: E402
import ggml_blocks as gg  # noqa: E402
import real_vocabulary as vocabulary  # noqa: E402
import transformer_reference as reference  # noqa: E402

# Seeds: each gives a model whose greedy continuation does not settle into a loop of a few tokens (the cache tests
# need at least 10 distinct ids in 200), and Phi-3's a prompt whose next token differs between its short and long
# LongRoPE factors (the --long-context test).
FAMILIES = {
    # Qwen3: per-head q/k norms, no biases, head_dim given (q is narrower than the residual here), untied.
    "qwen3": dict(
        config={
            "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 256,
            "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 32, "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0, "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False,
            "use_sliding_window": False, "sliding_window": None, "torch_dtype": "bfloat16",
            
        },
        seed=3,
        tokenizer=dict(regular=288, pre="qwen2"),
    ),
    # Qwen2 with its sliding window switched on: q/k/v biases, untied; layer 0 attends to every position, layers 1
    # and 2 (from max_window_layers) through a window of 32, shorter than the 64-token prompt. Hugging Face folder
    # only: llama.cpp's qwen2 GGUF files carry no window.
    "qwen2": dict(
        config={
            "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 64,
            "intermediate_size": 256, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
            "tie_word_embeddings": False, "hidden_act": "silu", "use_sliding_window": True, "sliding_window": 32,
            "max_window_layers": 1, "torch_dtype": "bfloat16",
        },
        seed=17,
        tokenizer=dict(regular=320, pre="qwen2"),
        gguf=False,
    ),
    # Gemma 2: four layers, alternating sliding (window 32, shorter than the 64-token prompt) and global layers, soft-capped
    # scores and logits (caps small enough to bite on random weights), tied embeddings. query_pre_attn_scalar is
    # head_dim, as llama.cpp scales every Gemma 2 but the 27B.
    "gemma2": dict(
        config={
            "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 64,
            "intermediate_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 16, "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0, "tie_word_embeddings": True, "hidden_act": "gelu_pytorch_tanh",
            "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 16, "sliding_window": 32,
            "attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0, "attention_bias": False,
            "torch_dtype": "bfloat16",
        },
        seed=31,
        tokenizer=dict(regular=300, pre=None),
    ),
    # Gemma 3 (text): six layers, five sliding (window 32, RoPE base 10000) and the sixth global (base 1e6 with
    # linear scaling, as the 4B and larger), per-head q/k norms, no soft-capping.
    "gemma3": dict(
        config={
            "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 64,
            "intermediate_size": 256, "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 1,
            "head_dim": 16, "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
            "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "tie_word_embeddings": True,
            "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 16, "sliding_window": 32,
            "sliding_window_pattern": 6, "attn_logit_softcapping": None, "final_logit_softcapping": None,
            "attention_bias": False, "torch_dtype": "bfloat16",
        },
        seed=7,
        tokenizer=dict(regular=300, pre=None),
    ),
    # Mistral: the Llama layout with a sliding window on every layer, Mistral Nemo's Tekken vocabulary. Its GGUF
    # files are of the llama architecture, as llama.cpp's converter writes Mistral, which carries no window: their
    # reference is the same model without one (as Mistral 7B v0.2 on and Nemo are).
    "mistral": dict(
        config={
            "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 64,
            "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 16, "max_position_embeddings": 512, "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0, "sliding_window": 32, "tie_word_embeddings": False, "hidden_act": "silu",
            "torch_dtype": "bfloat16",
        },
        seed=9,
        tokenizer=dict(regular=320, pre="tekken"),
    ),
    # SmolLM3: the Llama layout with every fourth layer without RoPE (the fourth here), tied embeddings. Its GGUF
    # files carry Q and K permuted for interleaved RoPE, as llama.cpp's converter writes llama files.
    "smollm3": dict(
        config={
            "architectures": ["SmolLM3ForCausalLM"], "model_type": "smollm3", "hidden_size": 64,
            "intermediate_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 16, "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
            "rope_theta": 5000000.0, "no_rope_layer_interval": 4, "no_rope_layers": [1, 1, 1, 0],
            "use_sliding_window": False, "sliding_window": None, "tie_word_embeddings": True, "hidden_act": "silu",
            "attention_bias": False, "mlp_bias": False, "torch_dtype": "bfloat16",
        },
        seed=25,
        tokenizer=dict(regular=320, pre="llama-bpe"),
    ),
    # Phi-3.5 / Phi-4-mini: fused qkv_proj and gate_up_proj, LongRoPE (short factors within the original context,
    # the attention factor of a context twice as long), 3/4 of each head rotated (Phi-4-mini's
    # partial_rotary_factor), a sliding window on every layer.
    "phi3": dict(
        config={
            "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": 64,
            "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 1024, "original_max_position_embeddings": 512,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
            "rope_scaling": {"type": "longrope", "short_factor": [round(1.0 + 0.08 * i, 4) for i in range(6)],
                             "long_factor": [round(1.0 + 4.0 * i, 4) for i in range(6)]},
            "sliding_window": 32, "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False,
            "torch_dtype": "bfloat16",
        },
        seed=16,
        tokenizer=dict(regular=300, pre=None),
    ),
}

GEMMA = ("gemma2", "gemma3_text")
GGUF_ARCHITECTURE = {"gemma3_text": "gemma3", "mistral": "llama"}  # model_type -> general.architecture
PERMUTED_QK = ("llama", "mistral", "smollm3")  # llama.cpp writes their Q and K rows for interleaved RoPE


def permute_rows(w, heads):
    """llama.cpp's converter: row (head, half i, j) of Hugging Face's order goes to head * head_dim + 2 j + i."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_rows(w, heads):
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def qk_heads(config, name):
    if name.endswith("q_proj.weight"):
        return config["num_attention_heads"]
    if name.endswith("k_proj.weight"):
        return config["num_key_value_heads"]
    return 0

# Gemma's post-attention norm is its own; its feed-forward's input norm is llama.cpp's ffn_norm.
GEMMA_GGUF_NAMES = [
    (".post_attention_layernorm.", ".post_attention_norm."), (".pre_feedforward_layernorm.", ".ffn_norm."),
    (".post_feedforward_layernorm.", ".post_ffw_norm."),
]
GGUF_NAMES = [
    ("model.embed_tokens.", "token_embd."), ("model.layers.", "blk."), (".input_layernorm.", ".attn_norm."),
    (".self_attn.q_proj.", ".attn_q."), (".self_attn.k_proj.", ".attn_k."), (".self_attn.v_proj.", ".attn_v."),
    (".self_attn.o_proj.", ".attn_output."), (".self_attn.q_norm.", ".attn_q_norm."),
    (".self_attn.k_norm.", ".attn_k_norm."), (".post_attention_layernorm.", ".ffn_norm."),
    (".mlp.gate_proj.", ".ffn_gate."), (".mlp.up_proj.", ".ffn_up."), (".mlp.down_proj.", ".ffn_down."),
    (".self_attn.qkv_proj.", ".attn_qkv."), (".mlp.gate_up_proj.", ".ffn_up."),
    ("model.norm.", "output_norm."), ("lm_head.", "output."),
]


def gguf_name(name, model_type):
    for hf, gguf in (GEMMA_GGUF_NAMES if model_type in GEMMA else []) + GGUF_NAMES:
        name = name.replace(hf, gguf)
    return name


def random_weights(config, seed):
    rng = np.random.default_rng(seed)
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    shapes = {"model.embed_tokens.weight": (config["vocab_size"], hidden)}
    norms = ["model.norm.weight"]
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        shapes.update({
            p + ".self_attn.q_proj.weight": (heads * head_dim, hidden),
            p + ".self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
            p + ".self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
            p + ".self_attn.o_proj.weight": (hidden, heads * head_dim),
            p + ".mlp.gate_proj.weight": (inter, hidden),
            p + ".mlp.up_proj.weight": (inter, hidden),
            p + ".mlp.down_proj.weight": (hidden, inter),
        })
        norms += [p + ".input_layernorm.weight", p + ".post_attention_layernorm.weight"]
        if config["model_type"] in GEMMA:
            norms += [p + ".pre_feedforward_layernorm.weight", p + ".post_feedforward_layernorm.weight"]
        if config["model_type"] in ("qwen3", "gemma3_text"):
            norms += [p + ".self_attn.q_norm.weight", p + ".self_attn.k_norm.weight"]
    if config["model_type"] == "qwen2":  # biases on q, k and v
        for layer in range(config["num_hidden_layers"]):
            p = f"model.layers.{layer}"
            for n, rows in (("q", heads), ("k", kv_heads), ("v", kv_heads)):
                shapes[p + f".self_attn.{n}_proj.bias"] = (rows * head_dim,)
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (config["vocab_size"], hidden)
    if config["model_type"] == "phi3":  # one qkv_proj (q, k, v rows) and one gate_up_proj (gate rows first)
        for layer in range(config["num_hidden_layers"]):
            p = f"model.layers.{layer}"
            parts = [shapes.pop(p + f".self_attn.{n}_proj.weight") for n in "qkv"]
            shapes[p + ".self_attn.qkv_proj.weight"] = (sum(part[0] for part in parts), hidden)
            parts = [shapes.pop(p + f".mlp.{n}_proj.weight") for n in ("gate", "up")]
            shapes[p + ".mlp.gate_up_proj.weight"] = (2 * inter, hidden)
    weights = {name: rng.normal(0.0, 0.08, shape) for name, shape in shapes.items()}
    if config["model_type"] in GEMMA:
        # Gemma scales its (tied) embeddings by sqrt(hidden): at the other matrices' spread, a token's own embedding
        # would dominate the residual and a random model would only repeat its last token.
        weights["model.embed_tokens.weight"] /= 4.0
    for name in norms:
        size = head_dim if name.endswith(("q_norm.weight", "k_norm.weight")) else hidden
        # Gemma's norms multiply by 1 + weight: its checkpoints store weights around 0.
        weights[name] = (0.0 if config["model_type"] in GEMMA else 1.0) + rng.normal(0.0, 0.1, size)
    # The checkpoint is bf16: what every reader sees is the rounded values.
    return {name: gg.bf16_from_bytes(gg.bf16_bytes(w)).astype(np.float64).reshape(np.shape(w))
            for name, w in weights.items()}


def gguf_metadata(config, file_type, vocabulary):
    arch = GGUF_ARCHITECTURE.get(config["model_type"], config["model_type"])
    extra = {}
    if arch in ("gemma2", "gemma3"):
        extra[f"{arch}.attention.sliding_window"] = config["sliding_window"]
    if arch == "gemma2":
        extra["gemma2.attn_logit_softcapping"] = float(config["attn_logit_softcapping"])
        extra["gemma2.final_logit_softcapping"] = float(config["final_logit_softcapping"])
    scaling = config.get("rope_scaling") or {}
    if scaling.get("rope_type") == "linear":
        extra[f"{arch}.rope.scaling.type"] = "linear"
        extra[f"{arch}.rope.scaling.factor"] = float(scaling["factor"])
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if arch == "phi3":  # as llama.cpp's converter writes LongRoPE and the window
        original = config["original_max_position_embeddings"]
        ratio = config["max_position_embeddings"] / original
        extra["phi3.rope.scaling.attn_factor"] = float(np.sqrt(1.0 + np.log(ratio) / np.log(original)))
        extra["phi3.rope.scaling.original_context_length"] = original
        extra["phi3.attention.sliding_window"] = config["sliding_window"]
    return extra | {
        "general.architecture": arch, "general.name": f"tiny random {arch}", "general.file_type": file_type,
        f"{arch}.context_length": config["max_position_embeddings"], f"{arch}.embedding_length": config["hidden_size"],
        f"{arch}.block_count": config["num_hidden_layers"], f"{arch}.feed_forward_length": config["intermediate_size"],
        f"{arch}.attention.head_count": config["num_attention_heads"],
        f"{arch}.attention.head_count_kv": config["num_key_value_heads"],
        f"{arch}.attention.key_length": head_dim, f"{arch}.attention.value_length": head_dim,
        f"{arch}.rope.dimension_count": int(head_dim * config.get("partial_rotary_factor", 1.0)),
        f"{arch}.attention.layer_norm_rms_epsilon": float(config["rms_norm_eps"]),
        f"{arch}.rope.freq_base": float(config["rope_theta"]),
        f"{arch}.vocab_size": config["vocab_size"],
    } | vocabulary


def write_gguf(path, config, weights, matrix_type, file_type, vocabulary):
    model_type = config["model_type"]
    gemma = model_type in GEMMA
    tensors = []
    for name, w in weights.items():
        if w.ndim == 1:
            # llama.cpp's converter stores Gemma's norms as 1 + weight.
            stored = w + 1.0 if gemma and name.endswith("norm.weight") else w
            tensors.append((gguf_name(name, model_type), w.shape, gg.GGUF_F32, gg.quantize(gg.GGUF_F32, stored)))
            continue
        type_id = matrix_type
        if matrix_type != gg.GGUF_F32 and w.shape[1] % gg.BLOCK_SIZE[matrix_type] != 0:
            type_id = gg.GGUF_Q8_0
        if model_type in PERMUTED_QK and qk_heads(config, name):
            w = permute_rows(w, qk_heads(config, name))
        tensors.append((gguf_name(name, model_type), w.shape, type_id, gg.quantize(type_id, w)))
    scaling = config.get("rope_scaling") or {}
    for kind in ("short", "long") if scaling.get("type") == "longrope" else ():
        factors = np.asarray(scaling[kind + "_factor"], dtype=np.float32)
        tensors.append((f"rope_factors_{kind}.weight", factors.shape, gg.GGUF_F32, factors.tobytes()))
    gg.write_gguf(path, gguf_metadata(config, file_type, vocabulary), tensors)
    # The reference reads the file back: the weights as stored, dequantized its own way, and for each block-type
    # matrix the group its products round their input in (32 for Q8_0, 256 for the K-quants).
    hf_of = {gguf_name(name, model_type): name for name in weights}
    stored, groups = {}, {}
    for name, (shape, type_id, payload) in gg.read_gguf_tensors(path).items():
        if name.startswith("rope_factors_"):
            continue
        stored[hf_of[name]] = gg.dequantize(type_id, payload, int(np.prod(shape))).reshape(shape)
        if gemma and name.endswith("norm.weight"):  # back to the checkpoint's meaning for the reference
            stored[hf_of[name]] = stored[hf_of[name]] - 1.0
        if model_type in PERMUTED_QK and qk_heads(config, hf_of[name]):
            stored[hf_of[name]] = unpermute_rows(stored[hf_of[name]], qk_heads(config, hf_of[name]))
        if type_id != gg.GGUF_F32:
            groups[hf_of[name]] = 256 if type_id == gg.GGUF_Q4_K else 32
    return stored, groups


# The prompt: the text each family's cut tokenizer encodes (ending with its end-of-sequence token, an added token
# the encoding splits out), of which the model sees the first 64 ids. The turn text has text after added tokens,
# where a Llama tokenizer's "▁" prefix rules differ between transformers and llama.cpp.
PROMPT_TEXT = ("Once upon a time, a little robot named Kiwi found an old map in the library. It said: \"Follow the "
               "river to the hill, then count 3 stones.\"\n\nKiwi smiled and went out the door.{eos}")
TURN_TEXT = "{eos}\nHello there! Can you count to 3?\n{eos} Yes: 1, 2, 3.{eos}"
PROMPT_LENGTH = 64
# A chat as the family's published template renders it (Jinja2): the first case of the model's template fixture.
CHAT_TEXT_FIXTURES = {
    "qwen3": "../shared/fixtures/chat_templates/qwen3.json", "gemma3": "../shared/fixtures/chat_templates/gemma3.json",
    "gemma2": "tests/fixtures/chat_templates/gemma2.json", "phi3": "tests/fixtures/chat_templates/phi3_5.json",
    "smollm3": "tests/fixtures/chat_templates/smollm3.json", "mistral": "tests/fixtures/chat_templates/mistral_nemo.json",
}


def chat_text(family):
    if family not in CHAT_TEXT_FIXTURES:
        return None
    with open(CHAT_TEXT_FIXTURES[family], encoding="utf-8") as f:
        cases = json.load(f)["cases"]
    return next(case["rendered"] for case in cases if isinstance(case.get("rendered"), str))


def encode_independently(source_dir, tokenizer, tokenizer_config, texts):
    """transformers.js's encoding of `texts` (encode_with_transformers_js.mjs, installed by
    fetch_tokenizer_sources.sh): special tokens as the tokenizer adds them, added tokens in the text split out."""
    script = os.path.join(source_dir, "transformers-js", "encode_with_transformers_js.mjs")
    request = json.dumps({"tokenizer": tokenizer, "tokenizer_config": tokenizer_config, "texts": texts})
    done = subprocess.run(["node", script], input=request, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def family_tokenizer(family, spec, source_dir, sources, folder):
    """Cuts the family's published tokenizer (real_vocabulary.py), writes it to the folder, sets the config's
    vocabulary size and bos/eos ids from it; returns (GGUF metadata, prompt text, its ids, the cut's summary)."""
    config = spec["config"]
    full, full_config = vocabulary.load_sources(source_dir, family, sources)
    tokenizer, tokenizer_config, _ = vocabulary.cut(full, full_config, spec["tokenizer"]["regular"])
    fixture_json.write(os.path.join(folder, "tokenizer.json"), tokenizer)
    fixture_json.write(os.path.join(folder, "tokenizer_config.json"), tokenizer_config)
    config["vocab_size"] = vocabulary.vocabulary_size(tokenizer)
    metadata = vocabulary.gguf_vocabulary(tokenizer, tokenizer_config, spec["tokenizer"]["pre"])
    config["bos_token_id"] = metadata.get("tokenizer.ggml.bos_token_id")
    config["eos_token_id"] = metadata["tokenizer.ggml.eos_token_id"]
    eos = metadata["tokenizer.ggml.tokens"][config["eos_token_id"]]
    chat = chat_text(family)
    texts = [PROMPT_TEXT.format(eos=eos), TURN_TEXT.format(eos=eos)] + ([chat] if chat else [])
    ids, turn_ids, *chat_ids = encode_independently(source_dir, tokenizer, tokenizer_config, texts)
    if len(ids) < PROMPT_LENGTH:
        raise SystemExit(f"{family}: the prompt text is only {len(ids)} tokens")
    summary = {"sources": sources[family], "regular_tokens_kept": spec["tokenizer"]["regular"],
               "added_tokens_kept": [t["content"] for t in tokenizer["added_tokens"]],
               "cut_by": "tests/reference/real_vocabulary.py",
               "encoded_by": "transformers.js tokenizers (@lenml/tokenizers@3.7.2)",
               "turn_text": texts[1], "turn_text_ids": turn_ids,
               **({"chat_text": texts[2], "chat_text_source": CHAT_TEXT_FIXTURES[family], "chat_text_ids": chat_ids[0]}
                  if chat_ids else {})}
    return metadata, texts[0], ids, summary


def main():
    root = os.path.join("tests", "fixtures", "families")
    arguments = sys.argv[1:]
    if "--tokenizer-sources" not in arguments[:-1]:
        raise SystemExit(__doc__)
    at = arguments.index("--tokenizer-sources")
    source_dir = arguments[at + 1]
    del arguments[at:at + 2]
    with open(os.path.join(os.path.dirname(__file__), "tokenizer_sources.json")) as f:
        sources = json.load(f)
    chosen = arguments or list(FAMILIES)  # families named on the command line, else all
    for family, spec in FAMILIES.items():
        if family not in chosen:
            continue
        config = spec["config"]
        folder = os.path.join(root, family)
        os.makedirs(folder, exist_ok=True)
        gguf_vocabulary, prompt_text, prompt_text_ids, tokenizer_summary = family_tokenizer(
            family, spec, source_dir, sources, folder)
        weights = random_weights(config, spec["seed"])
        fixture_json.write(os.path.join(folder, "config.json"), config)
        gg.write_safetensors(os.path.join(folder, "model.safetensors"),
                             {name: ("BF16", w.shape, gg.bf16_bytes(w)) for name, w in weights.items()})
        prompt = prompt_text_ids[:PROMPT_LENGTH]
        files = {"model.safetensors": (gg.read_safetensors(os.path.join(folder, "model.safetensors")), {})}
        # llama.cpp's file types: ALL_F32 0, MOSTLY_Q8_0 7, MOSTLY_Q4_K_M 15.
        gguf_files = (("model-F32.gguf", gg.GGUF_F32, 0), ("model-Q8_0.gguf", gg.GGUF_Q8_0, 7),
                      ("model-Q4_K.gguf", gg.GGUF_Q4_K, 15))
        for file_name, matrix_type, file_type in gguf_files if spec.get("gguf", True) else ():
            files[file_name] = write_gguf(os.path.join(folder, file_name), config, weights, matrix_type, file_type,
                                          gguf_vocabulary)
        logits, rounded_logits, long_logits = {}, {}, {}
        longrope = (config.get("rope_scaling") or {}).get("type") == "longrope"
        for file_name, (file_weights, groups) in files.items():
            stem = "logits-" + file_name.split(".")[0].replace("model-", "").replace("model", "hf")
            file_config = config
            if file_name.endswith(".gguf") and GGUF_ARCHITECTURE.get(config["model_type"]) == "llama":
                file_config = config | {"sliding_window": None}  # a llama GGUF file carries no window
            values = reference.forward(file_config, file_weights, prompt).astype(np.float32)
            values.tofile(os.path.join(folder, stem + ".f32"))
            logits[file_name] = stem + ".f32"
            if longrope:  # the model opened for its long context: the long factors at every position
                values = reference.forward(file_config, file_weights, prompt, longrope_factors="long").astype(np.float32)
                values.tofile(os.path.join(folder, stem + "-long.f32"))
                long_logits[file_name] = stem + "-long.f32"
            if groups:  # what the integer-dot kernels compute: the same weights, rounded inputs
                values = reference.forward(file_config, file_weights, prompt, groups).astype(np.float32)
                values.tofile(os.path.join(folder, stem + "-rounded.f32"))
                rounded_logits[file_name] = stem + "-rounded.f32"
        summary = {"family": family, "prompt": prompt, "positions": len(prompt), "vocab_size": config["vocab_size"],
                   "prompt_text": prompt_text, "prompt_text_ids": prompt_text_ids, "tokenizer": tokenizer_summary,
                   "logits": logits, "logits_with_rounded_activations": rounded_logits,
                   **({"logits_long_context": long_logits} if long_logits else {}),
                   "made_by": "tests/reference/make_family_fixtures.py (transformer_reference.py)"}
        summary_path = os.path.join(folder, "reference.json")
        if os.path.exists(summary_path):  # keep what llama_cpp_logits.sh added: its files stay valid for these GGUFs
            with open(summary_path) as f:
                kept = ("llama_cpp_logits", "llama_cpp", "llama_cpp_tokenization")
                summary |= {k: v for k, v in json.load(f).items() if k in kept}
        fixture_json.write(summary_path, summary)
        print(family, "written to", folder)


if __name__ == "__main__":
    main()
