"""GGUF block types and files, written from the format's description (ggml's block layouts), independent of kvchat.

Q8_0: blocks of 32 weights, an f16 scale d and 32 int8 values: w = d * q.
Q4_K: super-blocks of 256 weights in 8 sub-blocks of 32: f16 d and dmin, 12 bytes of 6-bit scales and mins
(packed as ggml's get_scale_min_k4 reads them), then 128 bytes of 4-bit values (each 32-byte group holds two
sub-blocks: low nibbles the first, high nibbles the second): w = d * sc * q - dmin * m.
"""
import json
import struct

import numpy as np

GGUF_F32, GGUF_Q8_0, GGUF_Q4_K = 0, 8, 12
BLOCK_SIZE = {GGUF_Q8_0: 32, GGUF_Q4_K: 256}


def f16(values):
    return np.asarray(values, dtype=np.float32).astype(np.float16)


def quantize_q8_0(w):
    blocks = np.asarray(w, dtype=np.float32).reshape(-1, 32)
    d = f16(np.abs(blocks).max(axis=1) / 127.0)
    scale = d.astype(np.float32)[:, None]
    q = np.where(scale > 0, np.round(blocks / np.where(scale > 0, scale, 1)), 0).clip(-127, 127).astype(np.int8)
    out = bytearray()
    for i in range(blocks.shape[0]):
        out += d[i].tobytes() + q[i].tobytes()
    return bytes(out)


def dequantize_q8_0(data, count):
    raw = np.frombuffer(data, dtype=np.uint8).reshape(-1, 34)
    d = raw[:, :2].copy().view(np.float16).astype(np.float64)
    q = raw[:, 2:].copy().view(np.int8).astype(np.float64)
    return (d * q).reshape(-1)[:count]


def pack_scales_k4(sc, m):
    """The 12 bytes that ggml's get_scale_min_k4(j) reads back as (sc[j], m[j]), each 6 bits."""
    q = [0] * 12
    for j in range(4):
        q[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6)
        q[j + 4] = (m[j] & 63) | ((m[j + 4] >> 4) << 6)
        q[j + 8] = (sc[j + 4] & 15) | ((m[j + 4] & 15) << 4)
    return bytes(q)


def scale_min_k4(j, q):
    if j < 4:
        return q[j] & 63, q[j + 4] & 63
    return (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)


def quantize_q4_k(w):
    """A valid (not optimal) Q4_K encoding: each sub-block's range [min(x, 0), max(x)] in 15 steps."""
    out = bytearray()
    for block in np.asarray(w, dtype=np.float64).reshape(-1, 256):
        sub = block.reshape(8, 32)
        low = np.minimum(sub.min(axis=1), 0.0)
        step = (sub.max(axis=1) - low) / 15.0
        d = f16(step.max() / 63.0)
        dmin = f16((-low).max() / 63.0)
        d_value, dmin_value = float(d), float(dmin)
        sc = [int(np.clip(np.round(s / d_value), 0, 63)) if d_value > 0 else 0 for s in step]
        m = [int(np.clip(np.round(-l / dmin_value), 0, 63)) if dmin_value > 0 else 0 for l in low]
        q = np.zeros((8, 32), dtype=np.uint8)
        for j in range(8):
            scale = d_value * sc[j]
            if scale > 0:
                q[j] = np.clip(np.round((sub[j] + dmin_value * m[j]) / scale), 0, 15).astype(np.uint8)
        qs = bytearray()
        for group in range(4):
            qs += bytes((q[2 * group] | (q[2 * group + 1] << 4)).astype(np.uint8))
        out += d.tobytes() + dmin.tobytes() + pack_scales_k4(sc, m) + bytes(qs)
    return bytes(out)


def dequantize_q4_k(data, count):
    raw = np.frombuffer(data, dtype=np.uint8).reshape(-1, 144)
    values = []
    for block in raw:
        d = float(block[0:2].copy().view(np.float16)[0])
        dmin = float(block[2:4].copy().view(np.float16)[0])
        scales = [int(x) for x in block[4:16]]
        qs = block[16:]
        for group in range(4):
            nibbles = qs[32 * group:32 * group + 32]
            for half, q in ((0, nibbles & 0xF), (1, nibbles >> 4)):
                sc, m = scale_min_k4(2 * group + half, scales)
                values.append(d * sc * q.astype(np.float64) - dmin * m)
    return np.concatenate(values)[:count]


def quantize(type_id, w):
    if type_id == GGUF_F32:
        return np.asarray(w, dtype=np.float32).tobytes()
    return {GGUF_Q8_0: quantize_q8_0, GGUF_Q4_K: quantize_q4_k}[type_id](w)


def dequantize(type_id, data, count):
    if type_id == GGUF_F32:
        return np.frombuffer(data, dtype=np.float32).astype(np.float64)[:count]
    return {GGUF_Q8_0: dequantize_q8_0, GGUF_Q4_K: dequantize_q4_k}[type_id](data, count)


def _string(text):
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def _value(value):
    """(GGUF type, payload): strings, bools, float32, uint32, and arrays of strings, float32 or int32."""
    if isinstance(value, str):
        return 8, _string(value)
    if isinstance(value, bool):
        return 7, struct.pack("<B", value)
    if isinstance(value, float):
        return 6, struct.pack("<f", value)
    if isinstance(value, list):
        element = 8 if isinstance(value[0], str) else 6 if isinstance(value[0], float) else 5
        items = b"".join(_string(v) if element == 8 else struct.pack("<f" if element == 6 else "<i", v)
                         for v in value)
        return 9, struct.pack("<IQ", element, len(value)) + items
    return 4, struct.pack("<I", value)  # uint32


def _metadata(key, value):
    value_type, payload = _value(value)
    return _string(key) + struct.pack("<I", value_type) + payload


def write_gguf(path, metadata, tensors):
    """tensors: (name, shape in numpy order, ggml type, bytes). Version 3, alignment 32."""
    header = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata))
    header += b"".join(_metadata(key, value) for key, value in metadata.items())
    data = bytearray()
    infos = bytearray()
    for name, shape, type_id, payload in tensors:
        infos += _string(name) + struct.pack("<I", len(shape))
        infos += b"".join(struct.pack("<Q", n) for n in reversed(shape))  # ggml's ne: innermost first
        infos += struct.pack("<IQ", type_id, len(data))
        data += payload
        data += b"\0" * ((32 - len(data) % 32) % 32)
    head = header + bytes(infos)
    head += b"\0" * ((32 - len(head) % 32) % 32)
    with open(path, "wb") as out:
        out.write(head + bytes(data))


def read_gguf_tensors(path):
    """name -> (shape in numpy order, ggml type, bytes) of a file write_gguf wrote (its metadata types only)."""
    with open(path, "rb") as f:
        blob = f.read()
    at = 4
    version, tensor_count, metadata_count = struct.unpack_from("<IQQ", blob, at)
    at += 20

    def string():
        nonlocal at
        (n,) = struct.unpack_from("<Q", blob, at)
        at += 8 + n
        return blob[at - n:at].decode()

    for _ in range(metadata_count):
        string()
        (value_type,) = struct.unpack_from("<I", blob, at)
        at += 4
        count = 1
        if value_type == 9:  # an array: its element type and length, then the elements
            value_type, count = struct.unpack_from("<IQ", blob, at)
            at += 12
        for _ in range(count):
            if value_type == 8:
                string()
            else:
                at += 1 if value_type == 7 else 4
    infos = []
    for _ in range(tensor_count):
        name = string()
        (dims,) = struct.unpack_from("<I", blob, at)
        at += 4
        ne = struct.unpack_from("<" + "Q" * dims, blob, at)
        at += 8 * dims
        type_id, offset = struct.unpack_from("<IQ", blob, at)
        at += 12
        infos.append((name, tuple(reversed(ne)), type_id, offset))
    start = at + (32 - at % 32) % 32
    tensors = {}
    for name, shape, type_id, offset in infos:
        count = int(np.prod(shape))
        size = count * 4 if type_id == GGUF_F32 else count // BLOCK_SIZE[type_id] * (34 if type_id == GGUF_Q8_0 else 144)
        tensors[name] = (shape, type_id, blob[start + offset:start + offset + size])
    return tensors


def write_safetensors(path, tensors):
    """tensors: name -> (dtype name, shape, bytes)."""
    header = {}
    offset = 0
    for name, (dtype, shape, payload) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(payload)]}
        offset += len(payload)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(text)) + text + b"".join(p for _, _, p in tensors.values()))


def read_safetensors(path):
    """name -> float64 array (F32 and BF16 tensors)."""
    with open(path, "rb") as f:
        blob = f.read()
    (size,) = struct.unpack_from("<Q", blob, 0)
    header = json.loads(blob[8:8 + size])
    base = 8 + size
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        raw = blob[base + begin:base + end]
        if entry["dtype"] == "BF16":
            values = bf16_from_bytes(raw)
        elif entry["dtype"] == "F32":
            values = np.frombuffer(raw, dtype=np.float32)
        else:
            raise ValueError(f"{name}: dtype {entry['dtype']} is not read here")
        tensors[name] = values.astype(np.float64).reshape(entry["shape"])
    return tensors


def bf16_from_bytes(raw):
    """bf16 values as float32 (exact: a bf16 is a float32's top half)."""
    return (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def bf16_bytes(values):
    """Round to nearest even, as torch's float32 -> bfloat16."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return bits.astype(np.uint16).tobytes()
