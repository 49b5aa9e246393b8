"""Qwen-Bailian traces (Alibaba, "KVCache Cache in the Wild", ATC'25): ``{"chat_id", "parent_chat_id",
"timestamp": s, "input_length", "output_length", "type", "turn", "hash_ids"}`` per line, 16-token hash
blocks; sessions follow the parent_chat_id chains. Synthetic ids: see `hashtrace`."""
from __future__ import annotations

from typing import Iterator

from strata_lab.traces.hashtrace import detect_hash_format, read_calls
from strata_lab.traces.source import Source

NAME = "bailian"


def detect(first: dict) -> bool:
    return detect_hash_format(first) == NAME


def read(src: Source) -> Iterator[dict]:
    return read_calls(src, NAME, NAME)
