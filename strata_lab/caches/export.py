"""Publish your own traffic the way production traces are published: any dump, store or imported log written as
an anonymous Mooncake or Qwen-Bailian hash trace (`strata-lab export`).

Each call's prompt is cut into blocks of `block` tokens; block i's hash chains block i-1's hash and the
block's ids under a keyed BLAKE2b (`salt`: given, or random per export), so equal hashes mean equal
prefixes, and the hashes are then remapped to small integers in order of first appearance. Nothing else of
the ids is kept, and no text: only lengths, relative timestamps, the hash integers and, for Bailian, chat /
parent-chat ids numbering the calls of each session (the session names are not written) and the turn.

`output_hash_ids` (an extension both formats' readers here accept and other readers ignore) holds the
hashes of the blocks of prompt + output from the prompt's last block on: the reply's blocks, so a later
prompt that repeats it finds them cached when the trace is replayed again. With it, re-importing an
export and replaying it under vLLM with `block_size` = the export's block gives exactly the original's
reused tokens per call.

>>> import os, tempfile, json
>>> from strata_lab.caches.call_ids import Call, as_ids
>>> calls = [Call(0, "s", as_ids(range(40)), as_ids([90, 91]), ts=5.0),
...          Call(1, "s", as_ids(list(range(40)) + [90, 91, 7]), ts=6.5)]
>>> out = os.path.join(tempfile.mkdtemp(), "t.jsonl")
>>> export_trace(calls, out, format="bailian", block=16, salt="x")
2
>>> [json.loads(line) for line in open(out)][1]
{'chat_id': 2, 'parent_chat_id': 1, 'timestamp': 1.5, 'input_length': 43, 'output_length': 0, 'type': 'text', 'turn': 2, 'hash_ids': [0, 1, 4], 'output_hash_ids': [4]}
"""
from __future__ import annotations

import hashlib
import os

__all__ = ["export_trace", "FORMATS"]

FORMATS = ("mooncake", "bailian")


def export_trace(dump, out, *, format: str = "mooncake", block: int | None = None, salt: str | None = None,
                 progress: bool = False) -> int:
    """Write `dump` (a path, paths, `Dump`, store, or `Call`s) as a `format` hash trace to `out`; returns
    the number of requests written. `block`: tokens per hash block (default: the format's, 512 / 16).
    `salt`: the hash key (1-64 bytes of text; default random, so two exports share no hash values).
    `progress`: a progress bar."""
    from strata_lab.caches.call_ids import calls_from_dump
    from strata_lab.caches.replay import _order
    from strata_lab.traces.hashtrace import BLOCK, write_hash_trace

    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
    N = BLOCK[format] if block is None else block
    if isinstance(N, bool) or not isinstance(N, int) or N < 1:
        raise ValueError(f"block must be a positive int, got {block!r}")
    if salt is not None and not isinstance(salt, str):
        raise ValueError(f"salt must be a string, got {salt!r}")
    key = salt.encode() if salt is not None else os.urandom(32)
    if not 1 <= len(key) <= 64:
        raise ValueError(f"salt must be 1 to 64 bytes, got {len(key)}")
    calls = calls_from_dump(dump)
    if not calls:
        raise ValueError("dump: no calls to export")
    order = _order(calls)
    # relative times; a dump with calls lacking ts replays in file order, so then every call's time is its
    # position (seconds), which keeps that order when the export is replayed
    timed = all(c.ts is not None for c in calls)
    t0 = min(c.ts for c in calls) if timed else None
    remap: dict = {}

    def num(digest: bytes) -> int:
        v = remap.get(digest)
        if v is None:
            v = remap[digest] = len(remap)
        return v

    chats: dict = {}     # session -> (last chat id, turns)
    rows = []
    it = order
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(order, desc=f"export {format}", unit="call")
    for n, i in enumerate(it):
        c = calls[i]
        seq = c.sequence()
        P, O = c.prompt_len, len(c.output)
        root = hashlib.blake2b((c.cache_salt or "").encode(), key=key, digest_size=16).digest()

        def chain(start_digest, lo, hi, src=seq):
            out, h = [], start_digest
            for b in range(lo, hi, N):
                part = src[b:min(b + N, hi)]
                h = hashlib.blake2b(h + len(part).to_bytes(4, "little") + part.tobytes(), key=key,
                                    digest_size=16).digest()
                out.append(h)
            return out

        full = chain(root, 0, (P // N) * N)
        prompt_h = full + (chain(full[-1] if full else root, (P // N) * N, P) if P % N else [])
        out_h = chain(full[-1] if full else root, (P // N) * N, P + O)
        ts = c.ts - t0 if timed else float(n)
        row = {"input_length": P, "output_length": O, "hash_ids": [num(h) for h in prompt_h],
               "output_hash_ids": [num(h) for h in out_h]}
        if format == "mooncake":
            row["timestamp"] = int(round(ts * 1000))
        else:
            last, turns = chats.get(c.session, (-1, 0))
            row.update(chat_id=n + 1, parent_chat_id=last, timestamp=round(ts, 3), type="text", turn=turns + 1)
            chats[c.session] = (n + 1, turns + 1)
        rows.append(row)
    write_hash_trace(rows, out, format)
    return len(rows)
