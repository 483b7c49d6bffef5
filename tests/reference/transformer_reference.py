"""An independent reference forward for the decoder-only families kvchat runs, in NumPy (float64), written from
the reference modeling code (transformers' modeling_llama / modeling_qwen2 / modeling_qwen3), not from kvchat.

Llama layout: RMSNorm -> q/k/v (+ biases for Qwen2) -> [Qwen3: RMSNorm of each q and k head] -> RoPE
(rotate_half) -> causal softmax attention with GQA -> o -> residual; RMSNorm -> down(silu(gate) * up) ->
residual; final RMSNorm -> lm_head. Every position's logits, the whole prompt at once (no cache).
"""
import numpy as np


def rms_norm(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def rope(x, positions, theta):
    """x [T, heads, head_dim]: HF's default RoPE."""
    head_dim = x.shape[-1]
    inverse_frequency = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    angles = np.outer(positions, inverse_frequency)
    angles = np.concatenate([angles, angles], axis=-1)[:, None, :]
    return x * np.cos(angles) + rotate_half(x) * np.sin(angles)


def silu(x):
    return x / (1.0 + np.exp(-x))


def round_activations(x, group):
    """A product's input as integer-dot kernels see it (llama.cpp's Q8_0 / Q8_K activations): per group of
    `group` values, scale s = max|x| / 127 and x ~ s * nearest(x / s), ties to even, in float32."""
    shape = x.shape
    blocks = x.astype(np.float32).reshape(-1, group)
    scale = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)
    inverse = np.where(scale > 0, np.float32(1) / np.where(scale > 0, scale, 1), 0).astype(np.float32)
    return (scale.astype(np.float64) * np.rint(blocks * inverse)).reshape(shape)


def forward(config, weights, ids, activation_groups=None):
    """Logits [T, vocab] for token ids `ids` at positions 0..T-1. `weights`: HF tensor names -> float64 arrays.
    activation_groups: matrix name -> group size whose products round their input (round_activations); none
    by default (the exact forward)."""
    activation_groups = activation_groups or {}
    model_type = config.get("model_type", "llama")
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    eps = config.get("rms_norm_eps", 1e-6)
    theta = config.get("rope_theta", 10000.0)
    steps = len(ids)
    positions = np.arange(steps, dtype=np.float64)
    x = weights["model.embed_tokens.weight"][np.asarray(ids)]
    causal = np.triu(np.full((steps, steps), -np.inf), k=1)

    def linear(name, h):
        if name + ".weight" in activation_groups:
            h = round_activations(h, activation_groups[name + ".weight"])
        y = h @ weights[name + ".weight"].T
        return y + weights[name + ".bias"] if name + ".bias" in weights else y

    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        h = rms_norm(x, weights[p + ".input_layernorm.weight"], eps)
        q = linear(p + ".self_attn.q_proj", h).reshape(steps, heads, head_dim)
        k = linear(p + ".self_attn.k_proj", h).reshape(steps, kv_heads, head_dim)
        v = linear(p + ".self_attn.v_proj", h).reshape(steps, kv_heads, head_dim)
        if model_type == "qwen3":
            q = rms_norm(q, weights[p + ".self_attn.q_norm.weight"], eps)
            k = rms_norm(k, weights[p + ".self_attn.k_norm.weight"], eps)
        q, k = rope(q, positions, theta), rope(k, positions, theta)
        group = heads // kv_heads
        attended = np.empty((steps, heads, head_dim))
        for head in range(heads):
            scores = q[:, head, :] @ k[:, head // group, :].T / np.sqrt(head_dim) + causal
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            attended[:, head, :] = (scores / scores.sum(axis=-1, keepdims=True)) @ v[:, head // group, :]
        x = x + linear(p + ".self_attn.o_proj", attended.reshape(steps, heads * head_dim))
        h = rms_norm(x, weights[p + ".post_attention_layernorm.weight"], eps)
        x = x + linear(p + ".mlp.down_proj", silu(linear(p + ".mlp.gate_proj", h)) * linear(p + ".mlp.up_proj", h))
    x = rms_norm(x, weights["model.norm.weight"], eps)
    head_name = "lm_head.weight" if "lm_head.weight" in weights else "model.embed_tokens.weight"
    if head_name in activation_groups:
        x = round_activations(x, activation_groups[head_name])
    return x @ weights[head_name].T
