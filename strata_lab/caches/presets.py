"""Engine presets: frozen, versioned parameter sets loaded from the TOML shipped with the package.

A spec names an engine, optionally a version, optionally overrides:

>>> p = parse_engine("vllm:block_size=32,kv_blocks=8774")
>>> p.engine, p.version, p.block_size, p.kv_blocks
('vllm', '0.33', 32, 8774)
>>> parse_engine("llama.cpp:slots=4").spec()
'llama.cpp@b7000:slots=4'
>>> parse_engine("vllm:blok_size=32")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: vllm: unknown parameter 'blok_size' (did you mean 'block_size'? known: ...)
>>> parse_engine("vllm:block_size=0")
Traceback (most recent call last):
...
ValueError: vllm: block_size must be a positive int, got 0

Capacity is given in tokens, blocks or bytes; bytes use the model's shape (`[shapes]` in the TOML):
>>> shape("qwen3-8b").kv_bytes_per_token
147456
>>> parse_engine("vllm:kv_bytes=1GiB").capacity_blocks()   # 1 GiB / (144 KiB x 16 tokens)
455
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import re
import shlex
from dataclasses import dataclass, fields, replace
from importlib import resources

try:
    import tomllib
except ImportError:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["EnginePreset", "ModelShape", "parse_engine", "preset", "shape", "ENGINES", "ROUTING", "parse_bytes"]

# engine name -> (TOML section, module with `Preset` and `Model`); aliases map to these names
ENGINES = {
    "vllm": ("vllm", "strata_lab.caches.vllm"),
    "sglang": ("sglang", "strata_lab.caches.sglang"),
    "llama.cpp": ("llama-cpp", "strata_lab.caches.llamacpp"),
    "trtllm": ("trtllm", "strata_lab.caches.trtllm"),
    "openai": ("openai", "strata_lab.caches.openai"),
    "anthropic": ("anthropic", "strata_lab.caches.anthropic"),
    "gemini": ("gemini", "strata_lab.caches.gemini"),
    "strata": ("strata", "strata_lab.caches.strata"),
}
_ALIASES = {"llamacpp": "llama.cpp", "llama-cpp": "llama.cpp", "tensorrt-llm": "trtllm", "trt-llm": "trtllm",
            "claude": "anthropic", "google": "gemini"}
ROUTING = ("session", "round_robin", "cache_aware", "prefix_hash")


@functools.lru_cache(maxsize=1)
def _tables() -> dict:
    with resources.files("strata_lab.caches").joinpath("presets.toml").open("rb") as f:
        return tomllib.load(f)


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(v, name: str = "bytes") -> int:
    """An int, or a size string like "40GiB" / "512 MB".

    >>> parse_bytes("1.5GiB"), parse_bytes(1024)
    (1610612736, 1024)
    """
    if isinstance(v, int) and not isinstance(v, bool) and v > 0:
        return v
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]i?b|b)?\s*", str(v), re.I) if isinstance(v, str) else None
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"{name} must be a positive size like 40GiB, got {v!r}")
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])


@dataclass(frozen=True)
class ModelShape:
    """What one token's KV (and one sequence's recurrent state) costs in bytes."""

    name: str
    layers: int
    attention_layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2
    state_bytes: int = 0   # recurrent state per sequence (hybrid models); 0: attention only

    def __post_init__(self):
        for f in ("layers", "attention_layers", "kv_heads", "head_dim", "dtype_bytes"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"shape {self.name}: {f} must be a positive int, got {v!r}")
        if isinstance(self.state_bytes, bool) or not isinstance(self.state_bytes, int) or self.state_bytes < 0:
            raise ValueError(f"shape {self.name}: state_bytes must be an int >= 0, got {self.state_bytes!r}")

    @property
    def kv_bytes_per_token(self) -> int:
        # K and V: [attention_layer, kv_head, head_dim] each
        return 2 * self.attention_layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def hybrid(self) -> bool:
        return self.state_bytes > 0


def shape(name: str) -> ModelShape:
    shapes = _tables()["shapes"]
    if name not in shapes:
        raise ValueError(f"model must be one of {sorted(shapes)}, got {name!r}")
    return ModelShape(name=name, **shapes[name])


@dataclass(frozen=True)
class EnginePreset:
    """Fields every engine has. Subclasses (one per engine module) add theirs and validate them."""

    engine = "base"   # class attribute: the engine name
    version: str = ""
    model: str = "qwen3-8b"
    replicas: int = 1
    routing: str = "session"
    cache_threshold: float = 0.3        # SGLang router: best-match worker above this match ratio
    balance_abs_threshold: int = 64     # ... unless loads differ by more than this
    balance_rel_threshold: float = 1.5  # ... and max > this x min
    overrides: tuple = dataclasses.field(default=(), compare=False, repr=False)

    def __post_init__(self):
        shape(self.model)  # raises naming the model
        _positive_int(self, "replicas")
        if self.routing not in ROUTING:
            raise ValueError(f"{self.engine}: routing must be one of {ROUTING}, got {self.routing!r}")
        if not 0 <= self.cache_threshold <= 1:
            raise ValueError(f"{self.engine}: cache_threshold must be in [0, 1], got {self.cache_threshold!r}")
        _positive_int(self, "balance_abs_threshold", zero=True)
        if not self.balance_rel_threshold >= 1:
            raise ValueError(f"{self.engine}: balance_rel_threshold must be >= 1, got {self.balance_rel_threshold!r}")

    @property
    def shape(self) -> ModelShape:
        return shape(self.model)

    def spec(self) -> str:
        """The spec that rebuilds this preset: engine@version plus the overrides given (`args=`, the engine's
        own command line, last: it runs to the end of the spec)."""
        extra = ",".join(f"{k}={v}" for k, v in self.overrides if k != "args")
        extra += "".join(f"{',' if extra else ''}args={v}" for k, v in self.overrides if k == "args")
        return f"{self.engine}@{self.version}" + (f":{extra}" if extra else "")

    def with_(self, **kw) -> "EnginePreset":
        """A copy with some fields changed (validated like a spec override)."""
        return _apply(self, {k: v for k, v in kw.items()}, from_text=False)

    def build(self):
        """A fresh cache model (one replica) for this preset."""
        return importlib.import_module(ENGINES[self.engine][1]).Model(self)


def _positive_int(p, name, zero=False, maximum=None):
    v = getattr(p, name)
    if isinstance(v, bool) or not isinstance(v, int) or v < (0 if zero else 1):
        raise ValueError(f"{p.engine}: {name} must be a {'non-negative' if zero else 'positive'} int, got {v!r}")
    if maximum is not None and v > maximum:  # a value that sizes an allocation: bounded
        raise ValueError(f"{p.engine}: {name} must be at most {maximum}, got {v!r}")


def _optional_positive_int(p, name):
    if getattr(p, name) is not None:
        _positive_int(p, name)


def _coerce(p, f: dataclasses.Field, text: str):
    """Turn an override's text into the field's type, or raise naming the field."""
    ann = str(f.type)
    t = text.strip()
    if "None" in ann and t.lower() in ("none", "null", ""):
        return None
    try:
        if ann.startswith("bool"):
            if t.lower() in ("1", "true", "yes", "on"):
                return True
            if t.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if ann.startswith("int"):
            return int(t)
        if ann.startswith("float"):
            return float(t)
    except ValueError:
        kind = ann.split(" ")[0]
        raise ValueError(f"{p.engine}: {f.name} must be {'a' if kind != 'int' else 'an'} {kind}, got {text!r}") from None
    return t


def _apply(p: EnginePreset, kw: dict, *, from_text: bool) -> EnginePreset:
    known = {f.name: f for f in fields(p) if f.name not in ("overrides", "version")}
    for k in kw:
        if k not in known:
            close = difflib.get_close_matches(k, known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ValueError(f"{p.engine}: unknown parameter {k!r} ({hint}known: {', '.join(sorted(known))})")
    vals = {k: _coerce(p, known[k], v) if from_text else v for k, v in kw.items()}
    merged = dict(p.overrides)
    merged.update({k: (kw[k] if from_text else v) for k, v in vals.items()})
    return replace(p, overrides=tuple(sorted(merged.items())), **vals)


def preset(engine: str, version: str | None = None):
    """The shipped preset of `engine` at `version` (default: the newest shipped)."""
    name = _ALIASES.get(engine.strip().lower(), engine.strip().lower())
    if name not in ENGINES:
        raise ValueError(f"engine must be one of {sorted(ENGINES)}, got {engine!r}")
    section, module = ENGINES[name]
    table = _tables()[section]
    version = version or table["default"]
    if version not in table or not isinstance(table[version], dict):
        versions = sorted(k for k, v in table.items() if isinstance(v, dict))
        raise ValueError(f"{name}: version must be one of {versions}, got {version!r}")
    cls = importlib.import_module(module).Preset
    known = {f.name for f in fields(cls)}
    bad = sorted(set(table[version]) - known)
    if bad:  # the shipped TOML and the dataclass disagree: a packaging bug, say where
        raise ValueError(f"presets.toml [{section}.{version}]: unknown parameter {bad[0]!r}")
    return cls(version=version, **table[version])


def _apply_args(p: EnginePreset, text: str) -> EnginePreset:
    """Fields from the engine's own command line (`args=` runs to the end of the spec), parsed by the
    engine module's `parse_args(argv, preset)` as the engine parses its flags; the engine's own defaults
    (`args_defaults`) stand for every flag not given, then key=value overrides before `args=` apply."""
    mod = importlib.import_module(ENGINES[p.engine][1])
    if not hasattr(mod, "parse_args"):
        raise ValueError(f"{p.engine}: args= is not supported (this engine has no command line to parse)")
    try:
        argv = shlex.split(text)
    except ValueError as e:
        raise ValueError(f"{p.engine}: args: {e}") from None
    vals = dict(getattr(mod, "args_defaults", {}))
    vals.update(mod.parse_args(argv, p))
    given = dict(p.overrides)
    vals = {k: v for k, v in vals.items() if k not in given}
    q = replace(p, **vals)
    return replace(q, overrides=tuple(sorted(given.items())) + (("args", text.strip()),))


def parse_engine(spec) -> EnginePreset:
    """A preset from "name[@version][:key=value,...]" (or a preset, returned as it is).

    Args:
        spec: the engine spec, e.g. "vllm", "vllm@0.11:block_size=32", "llama.cpp:slots=4", or a preset.

    `name:args=FLAGS` configures the model from the engine's own command line (the rest of the spec):

    >>> q = parse_engine("vllm:args=--block-size 32 --num-gpu-blocks-override 300")
    >>> q.block_size, q.kv_blocks, q.spec()
    (32, 300, 'vllm@0.32:args=--block-size 32 --num-gpu-blocks-override 300')
    """
    if isinstance(spec, EnginePreset):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"engine must be a non-empty spec like 'vllm:block_size=32', got {spec!r}")
    head, _, rest = spec.strip().partition(":")
    name, _, version = head.partition("@")
    args = None
    m = re.search(r"(?:^|,)\s*args=", rest)
    if m:
        rest, args = rest[:m.start()], rest[m.end():]
        if not version and name.strip().lower() in _ARGS_VERSION:  # the version the flags were checked on
            version = _ARGS_VERSION[name.strip().lower()]
    p = preset(name, version or None)
    if rest.strip():
        p = _apply(p, _split_overrides(p, rest), from_text=True)
    return _apply_args(p, args) if args is not None else p


# `name:args=...` without a version: the engine version whose command line (and defaults) the parser follows
_ARGS_VERSION = {"vllm": "0.32", "llama.cpp": "0c1e570", "llamacpp": "0c1e570", "llama-cpp": "0c1e570"}


def _split_overrides(p: EnginePreset, rest: str) -> dict:
    kw = {}
    for part in rest.split(","):
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"{p.engine}: override {part!r} is not key=value")
        kw[key.strip()] = value.strip()
    return kw
