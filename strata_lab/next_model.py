"""Qwen3-Next (``qwen3_next``) checkpoints in the C++ engine, and sessions with checkpoint policies.

The C++ side (engine/src/{gdn,gated_attention,moe,qwen3_next}.cpp) does the math; this module reads a
Hugging Face checkpoint directory (config.json + model.safetensors or a sharded index), turns the config
into the engine's ``NextConfig`` (both layer-pattern spellings), and wraps sessions so each call reports
which checkpoint it restored and how many prompt ids it re-read.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["CheckpointPolicy", "NextEngine", "NextSession", "next_config_from_dict", "read_safetensors"]


@dataclass(frozen=True)
class CheckpointPolicy:
    """Where a hybrid session snapshots its recurrent (GDN) state.

    at_prompt_end: one snapshot at the end of each prompt (the turn start) — the default policy.
    every: also at every multiple of N positions, inside replies too (0 = off).
    positions: also at these absolute positions.
    budget_mib: evict least-recently-used snapshots beyond this many MiB (0 = unlimited).

    >>> CheckpointPolicy(every=16).every
    16
    """

    at_prompt_end: bool = True
    every: int = 0
    positions: tuple[int, ...] = ()
    budget_mib: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.every, int) or self.every < 0:
            raise ValueError(f"every must be an int >= 0, got {self.every!r}")
        if any((not isinstance(p, (int, np.integer))) or p <= 0 for p in self.positions):
            raise ValueError(f"positions must be positive ints, got {self.positions!r}")
        if self.budget_mib < 0:
            raise ValueError(f"budget_mib must be >= 0, got {self.budget_mib!r}")
        object.__setattr__(self, "positions", tuple(int(p) for p in self.positions))

    def wants(self, pos: int, prompt_len: int) -> bool:
        """True when a snapshot is due after ``pos`` ids (prompt_len=-1 inside a reply)."""
        if pos <= 0:
            return False
        return ((self.at_prompt_end and pos == prompt_len) or (self.every > 0 and pos % self.every == 0)
                or pos in self.positions)

    def _native(self):
        from strata_lab import _engine

        p = _engine.NextCheckpointPolicy()
        p.at_prompt_end, p.every, p.positions, p.budget_mib = (
            self.at_prompt_end, self.every, list(self.positions), float(self.budget_mib))
        return p


_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}


def read_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """All tensors of one safetensors file as float32 arrays (F32, F16 and BF16 supported).

    >>> import tempfile, numpy as np
    >>> from safetensors.numpy import save_file
    >>> f = tempfile.mktemp(suffix=".safetensors"); save_file({"a": np.ones((2, 3), np.float32)}, f)
    >>> read_safetensors(f)["a"].shape
    (2, 3)
    """
    raw = Path(path).read_bytes()
    if len(raw) < 8:
        raise ValueError(f"{path}: truncated safetensors file (no header)")
    n = int.from_bytes(raw[:8], "little")
    if n > len(raw) - 8:
        raise ValueError(f"{path}: truncated safetensors header")
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = _DTYPES.get(info["dtype"])
        if dt is None:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {info['dtype']}")
        a, b = info["data_offsets"]
        if base + b > len(raw):
            raise ValueError(f"{path}: tensor {name} lies past the end of the file (truncated)")
        arr = np.frombuffer(raw, dtype=dt, count=(b - a) // np.dtype(dt).itemsize, offset=base + a)
        if info["dtype"] == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        out[name] = arr.astype(np.float32, copy=False).reshape(info["shape"])
    return out


def next_config_from_dict(cfg: dict):
    """Engine config for a ``qwen3_next`` config.json dict (either layer-pattern spelling)."""
    from strata_lab import _engine

    if cfg.get("model_type") != "qwen3_next":
        raise ValueError(f"model_type must be 'qwen3_next', got {cfg.get('model_type')!r}")
    L = int(cfg["num_hidden_layers"])
    types = cfg.get("layer_types")
    if types is None:
        interval = int(cfg.get("full_attention_interval", 4))
        if interval <= 0:
            raise ValueError(f"full_attention_interval must be positive, got {interval}")
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(L)]
    if len(types) != L or any(t not in ("full_attention", "linear_attention") for t in types):
        raise ValueError(f"layer_types must list {L} entries of 'full_attention'/'linear_attention'")
    rope = cfg.get("rope_parameters") or {}
    theta = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    factor = float(rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25)))
    E = int(cfg.get("num_experts", 0) or 0)
    step = int(cfg.get("decoder_sparse_step", 1) or 1)
    only = set(cfg.get("mlp_only_layers") or [])
    c = _engine.NextConfig()
    c.vocab, c.D, c.layers = int(cfg["vocab_size"]), int(cfg["hidden_size"]), L
    c.H, c.Hkv = int(cfg["num_attention_heads"]), int(cfg["num_key_value_heads"])
    c.hd = int(cfg.get("head_dim", 256))
    c.I = int(cfg["intermediate_size"])
    c.Hk, c.Hv = int(cfg["linear_num_key_heads"]), int(cfg["linear_num_value_heads"])
    c.dk, c.dv = int(cfg["linear_key_head_dim"]), int(cfg["linear_value_head_dim"])
    c.K = int(cfg.get("linear_conv_kernel_dim", 4))
    c.rd = int(c.hd * factor)
    c.theta, c.eps = theta, float(cfg.get("rms_norm_eps", 1e-6))
    c.E = E
    c.top_k = int(cfg.get("num_experts_per_tok", 1))
    c.moe_I = int(cfg.get("moe_intermediate_size", 0))
    c.shared_I = int(cfg.get("shared_expert_intermediate_size", 0))
    c.norm_topk_prob = bool(cfg.get("norm_topk_prob", True))
    c.tie = bool(cfg.get("tie_word_embeddings", False))
    c.attn_layers = [int(t == "full_attention") for t in types]
    c.moe_layers = [int(i not in only and E > 0 and (i + 1) % step == 0) for i in range(L)]
    return c


class NextEngine:
    """A loaded Qwen3-Next checkpoint.

    >>> import tempfile
    >>> from strata_lab._tiny_next import make_tiny_next
    >>> eng = NextEngine.load(make_tiny_next(tempfile.mkdtemp()))
    >>> eng.forward([1, 2, 3]).shape
    (3, 512)
    """

    def __init__(self, native, config: dict):
        self._native = native
        self.config = config

    @classmethod
    def load(cls, path: str | os.PathLike) -> "NextEngine":
        from strata_lab import _engine

        root = Path(path)
        cfg = json.loads((root / "config.json").read_text())
        ncfg = next_config_from_dict(cfg)
        index = root / "model.safetensors.index.json"
        if index.exists():
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        else:
            files = ["model.safetensors"]
        tensors: dict[str, np.ndarray] = {}
        for f in files:
            tensors.update(read_safetensors(root / f))
        try:
            native = _engine.NextModel(ncfg, tensors)
        except (RuntimeError, IndexError) as e:  # pragma: no cover - C++ errors are ValueError already
            raise ValueError(str(e)) from e
        return cls(native, cfg)

    def forward(self, ids, *, mode: str = "auto") -> np.ndarray:
        """Logits [T, V] of a fresh sequence; ``mode`` picks the GDN prefill ('chunked'/'recurrent')."""
        return self._native.forward([int(i) for i in ids], mode)

    def decode_steps(self, ids) -> np.ndarray:
        """Logits [T, V] computed one token at a time (recurrent GDN, growing KV)."""
        return self._native.decode_steps([int(i) for i in ids])

    def session(self, policy: CheckpointPolicy | None = None) -> "NextSession":
        return NextSession(self, policy or CheckpointPolicy())


@dataclass
class CallResult:
    """What one session call did: reuse per Contract 1 and the checkpoint it restored."""

    prompt_len: int
    lcp: int
    reused: int
    read: int
    restored: int | None
    logits_saved: bool
    gen_ids: list[int]
    evicted: list[int] = field(default_factory=list)
    prefill_ms: float = 0.0
    decode_ms: float = 0.0
    snapshot_ms: float = 0.0
    snapshots_taken: int = 0

    @property
    def reread(self) -> int:
        """Prompt ids the session had held but read again (lcp - reused)."""
        return self.lcp - self.reused


class NextSession:
    """A session on a hybrid model; ``checkpoints`` lists restorable positions."""

    def __init__(self, engine: NextEngine, policy: CheckpointPolicy):
        from strata_lab import _engine

        self.policy = policy
        self._s = _engine.NextSession(engine._native, policy._native())

    def generate(self, prompt_ids, *, max_new_tokens: int = 0, stop_ids=(), force_ids=None) -> CallResult:
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        force = [int(i) for i in force_ids] if force_ids is not None else []
        if force_ids is not None and max_new_tokens == 0:
            max_new_tokens = len(force)
        d = self._s.generate([int(i) for i in prompt_ids], max_new_tokens, [int(i) for i in stop_ids], force)
        return CallResult(**d)

    @property
    def held_ids(self) -> list[int]:
        return list(self._s.held_ids)

    @property
    def checkpoints(self) -> list[int]:
        return list(self._s.checkpoints)

    @property
    def snapshot_bytes(self) -> int:
        return int(self._s.snapshot_bytes)

    @property
    def memory_bytes(self) -> int:
        """Live state (GDN + KV cache) plus snapshots."""
        return int(self._s.state_bytes) + self.snapshot_bytes

    @property
    def last_logits(self) -> np.ndarray:
        return np.array(self._s.last_logits)

    def reset(self) -> None:
        self._s.reset()
