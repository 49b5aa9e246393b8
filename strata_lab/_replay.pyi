"""Typed face of the compiled extension strata_lab._replay: the store replay's core, linked without OpenMP
(engine/bindings/replay_bindings.cpp). Only strata_lab._native imports it; strata_lab.replayer.native drives it.
It also holds the ASCII byte-level BPE encoder of strata_lab.traces.fast_encode (_ByteBpe, strata/byte_bpe.h)."""
from typing import Any, Callable, ClassVar, Optional, Sequence

import numpy as np

class CheckpointPolicy:
    """engine/include/strata/checkpoint_policy.h; `_fields` lists the fields in declaration order."""
    _fields: tuple[str, ...]
    at_prompt_end: bool
    every: int
    positions: list[int]
    budget_mib: float
    before_last: int
    def __init__(self) -> None: ...
    def validate(self) -> None: ...

class FullHit:
    """strata/reuse_rule.h; the names of strata_lab.replayer.state.FULL_HIT_RULES (a pybind11 enum)."""
    held_logits: ClassVar[FullHit]
    last_held_only: ClassVar[FullHit]
    reread_last: ClassVar[FullHit]
    saved_logits: ClassVar[FullHit]
    __members__: ClassVar[dict[str, FullHit]]
    name: str
    value: int
    def __int__(self) -> int: ...
    def __index__(self) -> int: ...

class Cause:
    """The core's `cause` output codes (strata/replay_core.h), by the names of
    strata_lab.replayer.divergence.CAUSES (a pybind11 enum)."""
    none: ClassVar[Cause]
    new_session: ClassVar[Cause]
    retokenized_reply: ClassVar[Cause]
    retokenized_prompt: ClassVar[Cause]
    drained_dropped: ClassVar[Cause]
    template_rewrite: ClassVar[Cause]
    history_edit: ClassVar[Cause]
    no_state_checkpoint: ClassVar[Cause]
    __members__: ClassVar[dict[str, Cause]]
    name: str
    value: int
    def __int__(self) -> int: ...
    def __index__(self) -> int: ...

class _ByteBpe:
    """Byte-level BPE of ASCII text for the Qwen / Llama-3 / GPT-2 split regexes, with the added-token scan
    (strata/byte_bpe.h; strata_lab.traces.fast_encode uses it)."""
    vocab_size: int
    ascii_tokens: int
    merges: int
    cached: int
    def __init__(self, json: bytes, split: int, added: dict[str, int]) -> None: ...
    def encode(self, text: str) -> Optional[list[int]]: ...
    def encode_into(self, text: str, pos: int, ids: list[int], ends: list[int], counts: list[int],
                    other: Callable[[str], list[int]]) -> None: ...

class _ReplayVocab:
    """A tokenizer's bytes per id, for the replay core's byte walk (strata_lab.replayer.native)."""
    size: int
    def __init__(self, blob: bytes, offsets: np.ndarray, im_start: int, assistant: int) -> None: ...

class _ReplayCore:
    """The replay's session state model in C++ (strata_lab.replayer.native drives it)."""
    recorded_ms: Optional[float]
    peak_bytes: int
    live_sessions: int
    has_vocab: bool
    def __init__(self, hybrid: bool, full_hit: FullHit, policy: CheckpointPolicy, capacity: int,
                 bytes_per_snapshot: int, recorded_checkpoints: bool) -> None: ...
    def run(self, start: int, ins: tuple, outs: tuple) -> int: ...
    def has(self, code: int) -> bool: ...
    def open(self, code: int) -> None: ...
    def close(self, code: int) -> None: ...
    def held_len(self, code: int) -> int: ...
    def held(self, code: int) -> np.ndarray: ...
    def held_slice(self, code: int, start: int, stop: int) -> list[int]: ...
    def segments(self, code: int) -> list[tuple[int, int, str, int]]: ...
    def checkpoints(self, code: int) -> list[int]: ...
    def calls(self, code: int) -> int: ...
    def last(self, code: int) -> tuple[int, int, int]: ...
    def lcp_with(self, code: int, start: int, ids: Sequence[int]) -> int: ...
    def plan(self, code: int, prompt_len: int, lcp: int) -> tuple[int, int, Optional[int]]: ...
    def advance(self, code: int, prompt_len: int, lcp: int, tail: Sequence[int], gen: Sequence[int],
                drained: Sequence[int], checkpoints: Optional[Sequence[int]], part: int, row: int) -> tuple: ...
    def set_vocab(self, vocab: _ReplayVocab) -> None: ...
    def explain(self, code: int, lcp: int, ptail: Sequence[int], reused: int, target: int) -> tuple: ...
    def take_misses(self) -> list[tuple]: ...
    def add_recorded_ms(self, ms: float) -> None: ...

def realigned_tail(held: Sequence[int], prompt: Sequence[int]) -> int:
    """How many ids of `held` `prompt` repeats in order (runs of at least 8 ids): the core's
    strata_lab.replayer.explain.realigned_tail(held, prompt, 0, 0)."""
    ...

def json_array_end(data: bytes, pos: int) -> Optional[tuple[int, int]]:
    """(end of the last element, elements) of the JSON array whose elements continue at data[pos:] up to its
    ']', or None; for text a JSON parser read already (brackets and quotes followed, not checked)."""
    ...

def chain_messages(seen: dict, messages: list, known: list, reply: Optional[dict], new_session: Callable[[], str],
                   max_entries: int, python_key: Callable[[dict], int]) -> tuple[str, list[int]]:
    """(session, prefix digests): strata_lab.traces.log_calls.SessionChain.session_of_messages on its dict
    `seen`, the same digests; `python_key(message)` keys the messages the common shapes do not cover."""
    ...

def convert_messages(messages: list, start: int, notes: list,
                     python_one: Callable[[Any, list], tuple[dict, bool]]) -> tuple[list[dict], int]:
    """(messages[start:] converted, how many leading ones are plain): strata_lab.traces.openai._convert for the
    common shapes; python_one(message, notes) -> (converted, plain) for the others."""
    ...

def apply_response(call: dict, response: dict) -> bool:
    """strata_lab.traces.openai.apply_response for the common shape of a chat.completion (True), or False
    (nothing written): the Python function reads it."""
    ...
