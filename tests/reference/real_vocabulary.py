"""A family's published tokenizer cut down to a small vocabulary, for the tiny fixture models.

The cut keeps the tokenizer's own rules (normalizer, pre-tokenizer, decoder, post-processor, chat template) and:
- the first `regular_count` ordinary tokens of its vocabulary in id order: a byte-level vocabulary's 256 byte
  symbols and its first merges; a SentencePiece one's byte pieces and first pieces, plus its single printable
  ASCII characters (which it lists last);
- the merges among the kept tokens;
- the added tokens a chat needs: the control tokens the vocabulary starts with, the special tokens, and any token
  the chat template writes or tokenizer_config.json names, but never a reserved placeholder.
Ids are renumbered densely in their original order, so a cut vocabulary of V tokens fits a model with vocab_size V.

gguf_vocabulary() writes the same vocabulary as llama.cpp's converter writes GGUF metadata: "gpt2" (byte-level
BPE, its ranked merges) or "llama" (SentencePiece: pieces with scores, here minus the rank of the merge that makes
each piece, so merging by score is merging by rank).
"""
import hashlib
import json
import os
import re

# Placeholders a tokenizer reserves for later use: never written by a chat template, so left out of the cut.
PLACEHOLDER = re.compile(
    r"^(<unused\d+>|<SPECIAL_\d+>|<\|reserved_special_token_\d+\|>|<\|placeholder\d+\|>|\[control_\d+\])$")
SPACE_MARK = "\u2581"  # SentencePiece's space
NAMED_TOKEN_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token")


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def load_sources(source_dir, family, sources):
    """The family's full tokenizer.json and tokenizer_config.json from `source_dir`, checked against the hashes in
    tokenizer_sources.json (where each file comes from, and fetch_tokenizer_sources.sh, which fetches them)."""
    spec = sources[family]
    loaded = []
    for kind in ("tokenizer.json", "tokenizer_config.json"):
        path = os.path.join(source_dir, family, kind)
        if not os.path.exists(path):
            raise SystemExit(f"{path} is missing: run tests/reference/fetch_tokenizer_sources.sh {source_dir} "
                             f"(it comes from {spec[kind]['source']})")
        if sha256(path) != spec[kind]["sha256"]:
            raise SystemExit(f"{path} is not the file tokenizer_sources.json names ({spec[kind]['source']})")
        with open(path, encoding="utf-8") as f:
            loaded.append(json.load(f))
    if "chat_template" in spec and not loaded[1].get("chat_template"):
        # The published template, from the repository's chat template fixture of the model.
        with open(spec["chat_template"]["fixture"], encoding="utf-8") as f:
            loaded[1]["chat_template"] = json.load(f)["template"]
    return loaded


def _token_name(value):
    return value.get("content") if isinstance(value, dict) else value


def _merge_parts(merge):
    return tuple(merge.split(" ", 1)) if isinstance(merge, str) else tuple(merge)


def _template_text(config):
    template = config.get("chat_template") or ""
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        template = "".join(entry["template"] for entry in template)
    return template


def cut(tokenizer, config, regular_count):
    """(cut tokenizer.json, cut tokenizer_config.json, {old id: new id})."""
    tokenizer = json.loads(json.dumps(tokenizer))
    model = tokenizer["model"]
    if model["type"] != "BPE":
        raise ValueError(f"cannot cut a {model['type']} tokenizer")
    # tokenizer_config.json's added_tokens_decoder is what transformers applies: a model that renames reserved ids
    # (SmolLM3 over Llama 3's vocabulary) says so there.
    by_id = {token["id"]: token for token in tokenizer["added_tokens"]}
    for key, entry in (config.get("added_tokens_decoder") or {}).items():
        by_id[int(key)] = {"id": int(key), **{k: entry[k] for k in entry if k != "id"}}
    for token in by_id.values():
        token.setdefault("normalized", False)
    template = _template_text(config)
    named = {_token_name(config.get(key)) for key in NAMED_TOKEN_KEYS} - {None}

    regular = sorted(i for i in model["vocab"].values() if i not in by_id)[:regular_count]
    # The control tokens a vocabulary starts with (<unk>, <s>, </s>, <mask>; llama.cpp looks some of them up by
    # name): the added tokens before its first ordinary token or reserved placeholder.
    leading_end = min([regular[0]] + [i for i, token in by_id.items() if PLACEHOLDER.match(token["content"])])

    def needed(token):
        if PLACEHOLDER.match(token["content"]):
            return False
        return (token["id"] < leading_end or token["special"] or token["content"] in named
                or token["content"] in template)

    if not _byte_level(tokenizer):
        # A SentencePiece vocabulary lists its single characters last: the printable ASCII ones and the space mark
        # stay, so that its first merges have their parts.
        singles = {text for text in model["vocab"] if len(text) == 1 and (" " < text <= "~" or text == SPACE_MARK)}
        regular = sorted(set(regular) | {model["vocab"][text] for text in singles} - set(by_id))
    kept_added = sorted(i for i, token in by_id.items() if needed(token))
    new_id = {old: new for new, old in enumerate(sorted(set(regular) | set(kept_added)))}

    model["vocab"] = {text: new_id[old] for text, old in model["vocab"].items() if old in new_id}
    vocab = model["vocab"]
    model["merges"] = [m for m in model["merges"]
                       if all(part in vocab for part in _merge_parts(m)) and "".join(_merge_parts(m)) in vocab]
    tokenizer["added_tokens"] = [{**by_id[old], "id": new_id[old]} for old in kept_added]
    _renumber_post_processor(tokenizer.get("post_processor"), new_id)

    config = json.loads(json.dumps(config))
    if "added_tokens_decoder" in config:
        config["added_tokens_decoder"] = {
            str(new_id[old]): {k: v for k, v in by_id[old].items() if k != "id"} for old in kept_added}
    return tokenizer, config, new_id


def _renumber_post_processor(node, new_id):
    if isinstance(node, list):
        for item in node:
            _renumber_post_processor(item, new_id)
    elif isinstance(node, dict):
        for name, entry in (node.get("special_tokens") or {}).items():
            if any(old not in new_id for old in entry["ids"]):
                raise ValueError(f"the post-processor adds {name}, which the cut leaves out")
            entry["ids"] = [new_id[old] for old in entry["ids"]]
        for value in node.values():
            if isinstance(value, (dict, list)):
                _renumber_post_processor(value, new_id)


def vocabulary_size(tokenizer):
    ids = list(tokenizer["model"]["vocab"].values()) + [t["id"] for t in tokenizer["added_tokens"]]
    return max(ids) + 1


def _byte_level(tokenizer):
    return (tokenizer.get("decoder") or {}).get("type") == "ByteLevel"


def _adds_bos(tokenizer):
    single = (tokenizer.get("post_processor") or {}).get("single") or []
    return bool(single) and "SpecialToken" in single[0]


def gguf_vocabulary(tokenizer, config, pre=None):
    """The tokenizer.ggml.* metadata of the cut tokenizer, as llama.cpp's converter writes it."""
    size = vocabulary_size(tokenizer)
    tokens, types = [None] * size, [1] * size  # 1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte
    for text, i in tokenizer["model"]["vocab"].items():
        tokens[i] = text
        if not _byte_level(tokenizer) and re.fullmatch(r"<0x[0-9A-F]{2}>", text):
            types[i] = 6
    for token in tokenizer["added_tokens"]:
        tokens[token["id"]] = token["content"]
        types[token["id"]] = 3 if token["special"] else 4
    if None in tokens:
        raise ValueError(f"id {tokens.index(None)} has no token")
    ids = {text: i for i, text in enumerate(tokens)}
    metadata = {"tokenizer.ggml.tokens": tokens}
    merges = [_merge_parts(m) for m in tokenizer["model"]["merges"]]
    if _byte_level(tokenizer):
        metadata["tokenizer.ggml.model"] = "gpt2"
        if pre:
            metadata["tokenizer.ggml.pre"] = pre
        metadata["tokenizer.ggml.merges"] = [" ".join(m) for m in merges]
    else:
        metadata["tokenizer.ggml.model"] = "llama"
        scores = [0.0] * size
        made = set()
        for rank, parts in enumerate(merges):
            piece = "".join(parts)
            if piece not in made:
                made.add(piece)
                scores[ids[piece]] = -float(rank)
        metadata["tokenizer.ggml.scores"] = scores
        prepends = "Prepend" in json.dumps(tokenizer.get("normalizer"))
        metadata["tokenizer.ggml.add_space_prefix"] = prepends
        unk = tokenizer["model"].get("unk_token")
        if unk in ids:
            types[ids[unk]] = 2
    metadata["tokenizer.ggml.token_type"] = types
    for key, gguf_key in (("bos_token", "bos"), ("eos_token", "eos"), ("pad_token", "padding"),
                          ("unk_token", "unknown")):
        name = _token_name(config.get(key))
        if name in ids:
            metadata[f"tokenizer.ggml.{gguf_key}_token_id"] = ids[name]
    metadata["tokenizer.ggml.add_bos_token"] = _adds_bos(tokenizer)
    if config.get("chat_template"):
        metadata["tokenizer.chat_template"] = _template_text(config)
    return metadata
