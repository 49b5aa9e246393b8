"""Small tokenizer.json files of five families, built offline with the `tokenizers` trainers on a small corpus
and configured as the real ones are (model kind, normalizer, pre-tokenizer, decoder, byte fallback, added and
special tokens and where their ids sit). Qwen is the real Qwen3 vocabulary (`load_tokenizer("qwen3")`).

| family | model | what is configured as in the released tokenizer.json |
|---|---|---|
| `llama3` | byte-level BPE, `ignore_merges` | tiktoken-style split regex (`\\p{N}{1,3}`), ByteLevel, 256 `<|...|>` specials after the ranks |
| `deepseek_v3` | byte-level BPE | digit / CJK / letter split chain, ByteLevel, `<｜begin▁of▁sentence｜>` etc. *inside* the model vocab (ids 0-2), `<｜User｜>`, `<think>` (not special) added |
| `mistral` | SentencePiece BPE, byte fallback | `<unk> <s> </s> [INST] [/INST] ...` at ids 0.., `<0x00>`..`<0xFF>` pieces, Prepend+Replace(`▁`) normalizer, Replace/ByteFallback/Fuse/Strip decoder |
| `gemma` | Unigram, byte fallback | `<pad> <eos> <bos> <unk>` at 0-3, `<start_of_turn>` / `<end_of_turn>` specials, `<0xNN>` pieces, Replace(` `->`▁`) normalizer, no prepend |

Each builds in well under a second; `build(family, folder)` writes `folder/tokenizer.json` (a few tens of KB).
"""
from __future__ import annotations

import json
from pathlib import Path

CORPUS = [
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs!",
    "def encode(text: str) -> list[int]:\n    return [ord(c) for c in text]  # 1234567890\n",
    "Öğrenciler İstanbul'da çalışıyor; şimdi ağaçların gölgesinde oturuyorlar.",
    "我们今天在北京学习人工智能和机器学习。東京の天気は晴れです。ひらがなとカタカナ。",
    "Привет, как дела? Всё хорошо. Emoji: 😀🚀✨ — “quotes” and ‘more’ … done.",
    "{\"path\": \"README.md\", \"lines\": [1, 2, 3], \"ok\": true}\n\tIndented\r\nWindows line",
    "User: what is 2 + 2?\nAssistant: 4. <think>simple arithmetic</think> It is 4.",
] * 20

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                  "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>",
                  "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
DEEPSEEK_IN_VOCAB = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"]
DEEPSEEK_ADDED = ["<｜User｜>", "<｜Assistant｜>", "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>",
                  "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>", "<｜tool▁output▁begin｜>",
                  "<｜tool▁output▁end｜>"]
DEEPSEEK_NOT_SPECIAL = ["<think>", "</think>"]
MISTRAL_SPECIAL = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                   "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"]
GEMMA_SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>"]
GEMMA_TURNS = ["<start_of_turn>", "<end_of_turn>"]

# the strings each family's chat format puts in a prompt (texts in the parity test mix them in)
SPECIALS = {
    "qwen3": ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>"],
    "llama3": ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>"],
    "deepseek_v3": DEEPSEEK_IN_VOCAB[:2] + DEEPSEEK_ADDED[:4] + DEEPSEEK_NOT_SPECIAL,
    "mistral": ["<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]"],
    "gemma": ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"],
}
FAMILIES = tuple(SPECIALS)


def _byte_level(pattern_splits, vocab_size: int, in_vocab: list, ignore_merges: bool):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False) for p in pattern_splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=in_vocab, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def _llama3():
    from tokenizers import AddedToken

    tok = _byte_level([LLAMA3_PATTERN], 700, [], ignore_merges=True)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in LLAMA3_SPECIAL])
    return tok


def _deepseek_v3():
    from tokenizers import AddedToken

    splits = [r"\p{N}{1,3}", r"[一-龥\u3040-ゟ゠-ヿ]+",
              r"[\r\n]|\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-Ֆ]+|\s?[!-/:-~！-／：-～‘-‟　-。]+"
              r"|\s+$|[^\r\n\p{L}\p{P}\p{S}]|\p{L}+|\s+(?!\S)|\s+|\p{P}|\p{S}"]
    tok = _byte_level(splits, 700, DEEPSEEK_IN_VOCAB, ignore_merges=False)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in DEEPSEEK_IN_VOCAB + DEEPSEEK_ADDED])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in DEEPSEEK_NOT_SPECIAL])
    return tok


def _with_byte_pieces(vocab: dict[str, int], first: list[str]) -> tuple[list[str], int]:
    """Pieces in SentencePiece order: the control tokens, the 256 <0xNN> byte pieces, then the learned ones."""
    pieces = list(first) + [f"<0x{b:02X}>" for b in range(256)]
    pieces += [p for p, _ in sorted(vocab.items(), key=lambda kv: kv[1]) if p not in first]
    return pieces, len(first)


def _mistral():
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, trainers

    norm = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trained = Tokenizer(models.BPE(unk_token="<unk>"))
    trained.normalizer = norm
    trained.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=500, special_tokens=MISTRAL_SPECIAL,
                                                            show_progress=False))
    state = json.loads(trained.model.__getstate__())
    pieces, _ = _with_byte_pieces(state["vocab"], MISTRAL_SPECIAL)
    vocab = {p: i for i, p in enumerate(pieces)}
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in state["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = norm
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in MISTRAL_SPECIAL])
    return tok


def _gemma():
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, trainers

    norm = normalizers.Replace(" ", "▁")
    trained = Tokenizer(models.Unigram())
    trained.normalizer = norm
    trained.train_from_iterator(CORPUS, trainers.UnigramTrainer(vocab_size=500, special_tokens=GEMMA_SPECIAL,
                                                                unk_token="<unk>", show_progress=False))
    state = json.loads(trained.model.__getstate__())
    scores = {p: s for p, s in state["vocab"]}
    pieces, _ = _with_byte_pieces({p: i for i, (p, _) in enumerate(state["vocab"])}, GEMMA_SPECIAL + GEMMA_TURNS)
    tok = Tokenizer(models.Unigram([(p, scores.get(p, 0.0)) for p in pieces], pieces.index("<unk>"), True))
    tok.normalizer = norm
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in GEMMA_SPECIAL + GEMMA_TURNS])
    return tok


_BUILDERS = {"llama3": _llama3, "deepseek_v3": _deepseek_v3, "mistral": _mistral, "gemma": _gemma}


def build(family: str, folder: Path) -> Path:
    """Write `folder/tokenizer.json` for `family` and return the folder (qwen3: our real Qwen3 vocabulary)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if family == "qwen3":
        from strata_lab import load_tokenizer

        load_tokenizer("qwen3").save(folder / "tokenizer.json")
    else:
        _BUILDERS[family]().save(str(folder / "tokenizer.json"))
    return folder
