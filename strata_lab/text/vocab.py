"""What the ids of any vocabulary stand for: the bytes of every id, for every token kind the `tokenizers`
library loads (byte-level BPE, SentencePiece BPE or Unigram with byte fallback, added and special tokens), and
the model family a vocabulary or a model name belongs to (so ids are never read with another family's table).

>>> model_family("deepseek-ai/DeepSeek-V3.1"), model_family("mistralai/Mistral-7B-Instruct-v0.3")
('deepseek', 'mistral')
>>> bytes_to_unicode()[ord(" ")]
'Ġ'
"""
from __future__ import annotations

import json
from functools import lru_cache

__all__ = ["bytes_to_unicode", "build_bytes_table", "model_family", "FAMILY_MARKERS"]


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (the byte-level alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def build_bytes_table(hf, n: int, rows: int) -> list:
    """Every id's bytes, for any token kind: byte-level BPE pieces through GPT-2's alphabet (a character
    outside it, as in DeepSeek's ``<｜begin▁of▁sentence｜>`` vocabulary pieces, stands for its own UTF-8, as the
    ByteLevel decoder has it); SentencePiece pieces (BPE or Unigram) with ``▁`` as a space and, with byte
    fallback, ``<0xNN>`` as that byte; added and special tokens as their content (what
    ``decode(..., skip_special_tokens=False)`` writes); anything else as the decoder writes that id alone.
    Spare embedding rows past the vocabulary stand for no bytes."""
    table: list = [None] * n + [b""] * (rows - n)
    added = {i: t.content for i, t in hf.get_added_tokens_decoder().items()}
    vocab = hf.get_vocab(with_added_tokens=False)
    dec = _decoder_types(hf)
    if "ByteLevel" in dec:
        u2b = {u: b for b, u in bytes_to_unicode().items()}
        for piece, i in vocab.items():
            try:
                table[i] = bytes([u2b[ch] for ch in piece])
            except KeyError:  # not a byte-level piece: its characters stand for themselves
                table[i] = b"".join(bytes([u2b[ch]]) if ch in u2b else ch.encode("utf-8") for ch in piece)
    elif "Metaspace" in dec or "Replace" in dec:
        fallback = _byte_fallback(hf)
        for piece, i in vocab.items():
            if fallback and len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                table[i] = bytes([int(piece[3:5], 16)])
            else:
                table[i] = piece.replace("\u2581", " ").encode("utf-8")
    for i, content in added.items():
        if i < n:
            table[i] = content.encode("utf-8")
    for i in range(n):
        if table[i] is None:  # anything else: ask the decoder, one id at a time
            table[i] = hf.decode([i], skip_special_tokens=False).encode("utf-8")
    return table


def _decoder_types(hf_tokenizer) -> set[str]:
    """The decoder's type and, for a Sequence, its parts' types (read from the decoder alone, not the vocab)."""
    dec = hf_tokenizer.decoder
    if dec is None:
        return set()
    cfg = json.loads(dec.__getstate__())
    return {cfg.get("type")} | {d.get("type") for d in cfg.get("decoders", []) if isinstance(d, dict)}


def _byte_fallback(hf_tokenizer) -> bool:
    model = hf_tokenizer.model
    if hasattr(model, "byte_fallback"):
        return bool(model.byte_fallback)
    return bool(json.loads(model.__getstate__()).get("byte_fallback"))  # Unigram keeps it in its state


def _has_decoder(hf_tokenizer, kind: str) -> bool:
    return kind in _decoder_types(hf_tokenizer)


def _is_byte_level(hf_tokenizer) -> bool:
    return _has_decoder(hf_tokenizer, "ByteLevel")


# (family, an added token only that family's vocabularies have), checked in order
FAMILY_MARKERS = (("deepseek", "<｜begin▁of▁sentence｜>"), ("llama", "<|begin_of_text|>"), ("gemma", "<start_of_turn>"),
                  ("mistral", "[INST]"), ("qwen", "<|im_start|>"))
_FAMILY_NAMES = (("deepseek", ("deepseek",)), ("llama", ("llama",)), ("gemma", ("gemma",)),
                 ("mistral", ("mistral", "mixtral", "ministral", "codestral", "devstral", "magistral")),
                 ("qwen", ("qwen", "qwq")))


def model_family(model) -> str | None:
    """The family a model name belongs to ("deepseek", "llama", "gemma", "mistral", "qwen"), or None.
    Distilled models take their base's family (``DeepSeek-R1-Distill-Qwen-7B`` is a Qwen vocabulary). A
    file path (llama-server names its model by the GGUF's path) is judged by its file name alone: the folders
    it sits in say nothing of its vocabulary. A hub id's organisation counts only when the name says nothing.

    >>> model_family("Qwen/Qwen3-8B"), model_family("DeepSeek-R1-Distill-Llama-8B"), model_family("hybrid")
    ('qwen', 'llama', None)
    >>> model_family("/srv/llama-models/Qwen3-8B-Q4_K_M.gguf"), model_family("meta-llama/Meta-Llama-3-8B")
    ('qwen', 'llama')
    """
    if not isinstance(model, str):
        return None
    parts = [p for p in model.replace("\\", "/").split("/") if p]
    if not parts:
        return None
    hub_id = len(parts) == 2 and not model.startswith(("/", ".", "~")) \
        and not parts[1].lower().endswith((".gguf", ".bin", ".safetensors"))
    for name in ([parts[-1], parts[0]] if hub_id else [parts[-1]]):
        found = _name_family(name.lower())
        if found is not None:
            return found
    return None


def _name_family(name: str) -> str | None:
    if "distill-" in name:
        name = name[name.index("distill-") + len("distill-"):]
    hits = [(name.find(k), fam) for fam, keys in _FAMILY_NAMES for k in keys if k in name]
    return min(hits)[1] if hits else None
