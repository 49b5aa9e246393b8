"""Server settings, and the default model: a tiny generated checkpoint, so `serve` needs no download.

>>> ServerConfig(port=0).host
'127.0.0.1'
>>> ServerConfig(port=70000)
Traceback (most recent call last):
...
ValueError: port must be in 0..65535, got 70000
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ServerConfig", "default_model_dir", "DEFAULT_ARCH"]

DEFAULT_ARCH = "qwen3_next"


@dataclass
class ServerConfig:
    model: str | None = None          # model directory; None = the tiny generated hybrid checkpoint
    host: str = "127.0.0.1"
    port: int = 8080
    dump: str | None = None           # strata-dump/1 file; None = $STRATA_PROMPT_DUMP if set
    api_key: str | None = None
    max_context: int = 4096
    threads: int = 0                  # 0 = the engine's default
    reply_reuse: bool = True          # PromptEncoder.remember_reply after each request
    max_body_bytes: int = 4 * 1024 * 1024
    template: str = "qwen3"
    model_name: str | None = None
    session: str = "default"
    stop_latency: int = 0             # engine steps a STOP takes to land (production engines: 1-3)

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if self.max_context < 16:
            raise ValueError(f"max_context must be >= 16, got {self.max_context}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        if self.stop_latency < 0:
            raise ValueError(f"stop_latency must be >= 0, got {self.stop_latency}")
        if self.threads < 0:
            raise ValueError(f"threads must be >= 0, got {self.threads}")
        if self.api_key == "":
            raise ValueError("api_key must not be empty (leave it unset for no key)")
        if self.model is not None and not Path(self.model).is_dir():
            raise ValueError(f"model must be a model directory, {self.model!r} is not one")


def _cache_dir() -> Path:
    base = os.environ.get("STRATA_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "strata_lab")
    return Path(base)


def default_model_dir(arch: str = DEFAULT_ARCH) -> Path:
    """The tiny checkpoint of `arch` (default: the hybrid) in the user cache dir, generated on first use."""
    from strata_lab.checkpoints import make_tiny

    path = _cache_dir() / "models" / f"tiny-{arch.replace('_', '-')}"
    if not (path / "config.json").is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        # the real Qwen vocabulary: the server speaks through the real tokenizer
        make_tiny(tmp, arch=arch, overrides={"vocab_size": 151936})
        try:
            os.replace(tmp, path)
        except OSError:  # another process made it first
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return path
