"""An independent reference forward for the decoder-only families kvchat runs, in NumPy (float64), written from
the reference modeling code (transformers' modeling_llama / modeling_qwen2 / modeling_qwen3 / modeling_mistral /
modeling_gemma2 / modeling_gemma3), not from kvchat.

Llama layout: RMSNorm -> q/k/v (+ biases for Qwen2) -> [Qwen3, Gemma 3: RMSNorm of each q and k head] -> RoPE
(rotate_half) -> causal softmax attention with GQA -> o -> residual; RMSNorm -> down(silu(gate) * up) ->
residual; final RMSNorm -> lm_head. Every position's logits, the whole prompt at once (no cache).

Gemma 2/3 on top: embeddings times sqrt(hidden); RMSNorm times (1 + weight); scores scaled by
query_pre_attn_scalar^-1/2 and (Gemma 2) soft-capped, cap * tanh(s / cap); the attention's and the feed-forward's
outputs normed before each residual add (post_attention_layernorm, post_feedforward_layernorm; the feed-forward's
input norm is pre_feedforward_layernorm); GeGLU with the tanh GELU; final logits soft-capped (Gemma 2). Sliding
layers (Gemma's pattern, Mistral's every layer, Qwen's from max_window_layers on when use_sliding_window, or
layer_types) let query p see keys p - window + 1 .. p only;
Gemma 3's sliding layers rotate with rope_local_base_freq and no scaling, its global layers with rope_theta and
rope_scaling. SmolLM3's layers marked 0 in no_rope_layers (every fourth by default) do not rotate q and k at all.

Phi-3 (modeling_phi3): fused qkv_proj (q, k, v rows in order) and gate_up_proj (gate rows first); RoPE over the first
head_dim * partial_rotary_factor dimensions only; LongRoPE frequencies 1 / (short_factor * base^(2i/dim)) with cos
and sin times the attention factor (sequences within original_max_position_embeddings, where transformers uses the
short factors); a sliding window on every layer where the config has one.
"""
import numpy as np


def rms_norm(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def rope(x, positions, theta, linear_factor=1.0, rotated=None, pair_factors=None, attention_factor=1.0):
    """x [T, heads, head_dim]: HF's default RoPE (or "linear": frequencies / factor) of the first `rotated`
    dimensions (all by default); LongRoPE: frequencies / pair_factors, cos and sin times attention_factor."""
    dim = rotated or x.shape[-1]
    inverse_frequency = 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)) / linear_factor
    if pair_factors is not None:
        inverse_frequency = inverse_frequency / np.asarray(pair_factors, dtype=np.float64)
    angles = np.outer(positions, inverse_frequency)
    angles = np.concatenate([angles, angles], axis=-1)[:, None, :]
    part = x[..., :dim]
    cos, sin = np.cos(angles) * attention_factor, np.sin(angles) * attention_factor
    return np.concatenate([part * cos + rotate_half(part) * sin, x[..., dim:]], axis=-1)


def silu(x):
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def rotating_layers(config):
    """One bool per layer: does it apply RoPE? (SmolLM3's no_rope_layers: 1 rotates, 0 does not.)"""
    layers = config["num_hidden_layers"]
    if config.get("model_type") != "smollm3":
        return [True] * layers
    if config.get("no_rope_layers") is not None:
        return [bool(flag) for flag in config["no_rope_layers"]]
    interval = config.get("no_rope_layer_interval", 4)
    return [(i + 1) % interval != 0 for i in range(layers)]


def sliding_layers(config):
    """One bool per layer: does it attend through a sliding window?"""
    layers = config["num_hidden_layers"]
    if config.get("layer_types"):
        return [kind == "sliding_attention" for kind in config["layer_types"]]
    model_type = config.get("model_type", "llama")
    if model_type == "gemma2":
        return [(i + 1) % 2 != 0 for i in range(layers)]
    if model_type in ("gemma3", "gemma3_text"):
        pattern = config.get("sliding_window_pattern", 6)
        return [(i + 1) % pattern != 0 for i in range(layers)]
    if model_type in ("qwen2", "qwen3"):
        # Qwen2Config / Qwen3Config: with use_sliding_window, the layers from max_window_layers on (28 by default).
        windowed = bool(config.get("use_sliding_window")) and bool(config.get("sliding_window"))
        return [windowed and i >= config.get("max_window_layers", 28) for i in range(layers)]
    return [bool(config.get("sliding_window")) and model_type in ("mistral", "phi3")] * layers


def round_activations(x, group):
    """A product's input as llama.cpp rounds it on x86 for its block-type products (ggml's quantize_row_q8_0 for
    groups of 32, quantize_row_q8_K_ref for 256), and kvchat's integer-dot kernels with it: per group, bytes
    rint(x * (127 / max|x|)) in float32 (ties to even), times a unit of max|x| / 127 rounded to an IEEE half for groups
    of 32, 1 / (127 / max|x|) in float32 for groups of 256."""
    shape = x.shape
    blocks = x.astype(np.float32).reshape(-1, group)
    largest = np.abs(blocks).max(axis=1, keepdims=True)
    inverse = np.where(largest > 0, np.float32(127) / np.where(largest > 0, largest, 1), 0).astype(np.float32)
    if group == 32:
        unit = (largest / np.float32(127)).astype(np.float32)
        unit = np.where(unit < 65520, unit.astype(np.float16).astype(np.float32), unit)
    else:
        unit = np.where(inverse > 0, np.float32(1) / np.where(inverse > 0, inverse, 1), 0).astype(np.float32)
    return (unit.astype(np.float64) * np.rint(blocks * inverse)).reshape(shape)


def forward(config, weights, ids, activation_groups=None, longrope_factors="short"):
    """Logits [T, vocab] for token ids `ids` at positions 0..T-1. `weights`: HF tensor names -> float64 arrays.
    activation_groups: matrix name -> group size whose products round their input (round_activations); none
    by default (the exact forward). longrope_factors: which of a LongRoPE config's factors every position takes,
    "short" (transformers within the original context) or "long" (a model opened for its long context)."""
    activation_groups = activation_groups or {}
    model_type = config.get("model_type", "llama")
    gemma = model_type in ("gemma2", "gemma3", "gemma3_text")
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    eps = config.get("rms_norm_eps", 1e-6)
    theta = config.get("rope_theta", 10000.0)
    scaling = config.get("rope_scaling") or {}
    scaling_type = scaling.get("rope_type", scaling.get("type"))
    linear_factor = scaling.get("factor", 1.0) if scaling_type == "linear" else 1.0
    rotated = int(head_dim * config.get("partial_rotary_factor", 1.0))
    pair_factors, attention_factor = None, 1.0
    if scaling_type in ("longrope", "su"):
        original = config["original_max_position_embeddings"]
        pair_factors = scaling[longrope_factors + "_factor"]
        ratio = config["max_position_embeddings"] / original
        attention_factor = scaling.get("attention_factor") or (
            1.0 if ratio <= 1.0 else np.sqrt(1.0 + np.log(ratio) / np.log(original)))
    fused = model_type == "phi3"
    steps = len(ids)
    positions = np.arange(steps, dtype=np.float64)
    x = weights["model.embed_tokens.weight"][np.asarray(ids)]
    if gemma:
        x = x * np.sqrt(config["hidden_size"])
    causal = np.triu(np.full((steps, steps), -np.inf), k=1)
    window = config.get("sliding_window") or 0
    windowed = causal + np.tril(np.full((steps, steps), -np.inf), k=-window) if window else causal
    scale = (config["query_pre_attn_scalar"] if gemma else head_dim) ** -0.5
    attention_cap = config.get("attn_logit_softcapping") if gemma else None

    def norm(h, name):
        weight = weights[name]
        return rms_norm(h, 1.0 + weight if gemma else weight, eps)

    def linear(name, h):
        if name + ".weight" in activation_groups:
            h = round_activations(h, activation_groups[name + ".weight"])
        y = h @ weights[name + ".weight"].T
        return y + weights[name + ".bias"] if name + ".bias" in weights else y

    for layer, (sliding, rotates) in enumerate(zip(sliding_layers(config), rotating_layers(config))):
        p = f"model.layers.{layer}"
        h = norm(x, p + ".input_layernorm.weight")
        if fused:
            qkv = linear(p + ".self_attn.qkv_proj", h)
            q_out, kv_out = heads * head_dim, kv_heads * head_dim
            q = qkv[:, :q_out].reshape(steps, heads, head_dim)
            k = qkv[:, q_out:q_out + kv_out].reshape(steps, kv_heads, head_dim)
            v = qkv[:, q_out + kv_out:].reshape(steps, kv_heads, head_dim)
        else:
            q = linear(p + ".self_attn.q_proj", h).reshape(steps, heads, head_dim)
            k = linear(p + ".self_attn.k_proj", h).reshape(steps, kv_heads, head_dim)
            v = linear(p + ".self_attn.v_proj", h).reshape(steps, kv_heads, head_dim)
        if p + ".self_attn.q_norm.weight" in weights:  # Qwen3, Gemma 3
            q = norm(q, p + ".self_attn.q_norm.weight")
            k = norm(k, p + ".self_attn.k_norm.weight")
        if not rotates:
            pass
        elif sliding and model_type in ("gemma3", "gemma3_text"):
            q, k = rope(q, positions, config["rope_local_base_freq"]), rope(k, positions, config["rope_local_base_freq"])
        else:
            q = rope(q, positions, theta, linear_factor, rotated, pair_factors, attention_factor)
            k = rope(k, positions, theta, linear_factor, rotated, pair_factors, attention_factor)
        group = heads // kv_heads
        mask = windowed if sliding else causal
        attended = np.empty((steps, heads, head_dim))
        for head in range(heads):
            scores = q[:, head, :] @ k[:, head // group, :].T * scale
            if attention_cap:
                scores = np.tanh(scores / attention_cap) * attention_cap
            scores = scores + mask
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            attended[:, head, :] = (scores / scores.sum(axis=-1, keepdims=True)) @ v[:, head // group, :]
        out = linear(p + ".self_attn.o_proj", attended.reshape(steps, heads * head_dim))
        if gemma:
            x = x + norm(out, p + ".post_attention_layernorm.weight")
            h = norm(x, p + ".pre_feedforward_layernorm.weight")
            out = linear(p + ".mlp.down_proj", gelu_tanh(linear(p + ".mlp.gate_proj", h)) * linear(p + ".mlp.up_proj", h))
            x = x + norm(out, p + ".post_feedforward_layernorm.weight")
        elif fused:
            x = x + out
            h = norm(x, p + ".post_attention_layernorm.weight")
            gate, up = np.split(linear(p + ".mlp.gate_up_proj", h), 2, axis=-1)
            x = x + linear(p + ".mlp.down_proj", up * silu(gate))
        else:
            x = x + out
            h = norm(x, p + ".post_attention_layernorm.weight")
            x = x + linear(p + ".mlp.down_proj", silu(linear(p + ".mlp.gate_proj", h)) * linear(p + ".mlp.up_proj", h))
    x = norm(x, "model.norm.weight")
    head_name = "lm_head.weight" if "lm_head.weight" in weights else "model.embed_tokens.weight"
    if head_name in activation_groups:
        x = round_activations(x, activation_groups[head_name])
    logits = x @ weights[head_name].T
    final_cap = config.get("final_logit_softcapping") if gemma else None
    return np.tanh(logits / final_cap) * final_cap if final_cap else logits
