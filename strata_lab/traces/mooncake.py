"""Mooncake traces (Kimi, FAST'25): ``{"timestamp": ms, "input_length", "output_length", "hash_ids"}`` per
line, 512-token hash blocks, no sessions (each request is its own). Synthetic ids: see `hashtrace`."""
from __future__ import annotations

from typing import Iterator

from strata_lab.traces.hashtrace import detect_hash_format, read_calls
from strata_lab.traces.source import Source

NAME = "mooncake"


def detect(first: dict) -> bool:
    return detect_hash_format(first) == NAME


def read(src: Source) -> Iterator[dict]:
    return read_calls(src, NAME, NAME)
