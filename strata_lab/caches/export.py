"""Publish your own traffic the way production traces are published: any dump, store or imported log written as
an anonymous Mooncake or Qwen-Bailian hash trace (`strata-lab export`).

Each call's prompt is cut into blocks of `block` tokens; block i's hash chains block i-1's hash and the
block's ids under a keyed BLAKE2b (`salt`: given, or random per export), so equal hashes mean equal
prefixes; each hash is written as a 52-bit integer drawn from its keyed digest, so two exports with random
salts share no hash values and an export's integers cannot be computed from a guessed text without the key.
Nothing else of the ids is kept, and no text: only lengths, relative timestamps, the hash integers and, for
Bailian, chat / parent-chat ids numbering the calls of each session (the session names are not written) and
the turn.

`min_sessions` (k): a block keeps its shared hash integer only when at least k distinct sessions hold it
(their prompts share the prefix up to it); a rarer block gets an integer of its own in each session that
holds it, so content private to fewer than k sessions keeps its reuse within its session (a conversation
re-reading its own history) but shows none across sessions, and an attacker who planted or guessed content
cannot confirm it in someone else's session unless k - 1 other sessions hold it too. Prefixes common to k
sessions (system prompts, shared documents, tool schemas) keep their reuse across sessions.
A block size other than the format's is written on every line (`block_tokens`), so the trace replays with it.

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
>>> export_trace(calls, out, format="bailian", block=16, salt="x", min_sessions=1)
2
>>> a, b = [json.loads(line) for line in open(out)]
>>> b["input_length"], b["turn"], b["hash_ids"][:2] == a["hash_ids"][:2], b["output_hash_ids"] == b["hash_ids"][2:]
(43, 2, True, True)
>>> other = [Call(2, "t", as_ids(range(40)), as_ids([5]), ts=7.0)]   # another session, the same 40 ids
>>> _ = export_trace(calls + other, out, format="bailian", block=16, salt="x", min_sessions=3)
>>> a, b, t = [json.loads(line) for line in open(out)]   # held by 2 sessions < k = 3: reuse inside "s" only
>>> b["hash_ids"][:2] == a["hash_ids"][:2], set(t["hash_ids"]) & set(a["hash_ids"])
(True, set())
"""
from __future__ import annotations

import hashlib
import os

__all__ = ["export_trace", "FORMATS"]

FORMATS = ("mooncake", "bailian")


MIN_SESSIONS = 3   # distinct sessions a block must be in to keep its shared hash integer (the default: a guess
# planted in one session, or in two, cannot be matched against a victim's)
_ID_BITS = 52      # hash integers below 2**52: exact in any JSON reader (a double holds them)


def export_trace(dump, out, *, format: str = "mooncake", block: int | None = None, salt: str | None = None,
                 min_sessions: int = MIN_SESSIONS, progress: bool = False) -> int:
    """Write `dump` (a path, paths, `Dump`, store, or `Call`s) as a `format` hash trace to `out`; returns
    the number of requests written. `block`: tokens per hash block (default: the format's, 512 / 16).
    `salt`: the hash key (1-64 bytes of text; default random, so two exports share no hash values).
    `min_sessions`: distinct sessions a block must be in to keep its shared hash (rarer blocks get an
    integer of their own per session, their reuse kept within it; 1 keeps every block's reuse). `progress`: a progress bar."""
    from strata_lab.caches.call_ids import calls_from_dump
    from strata_lab.caches.replay import _order
    from strata_lab.traces.hashtrace import BLOCK, write_hash_trace

    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
    N = BLOCK[format] if block is None else block
    if isinstance(N, bool) or not isinstance(N, int) or N < 1:
        raise ValueError(f"block must be a positive int, got {block!r}")
    if isinstance(min_sessions, bool) or not isinstance(min_sessions, int) or min_sessions < 1:
        raise ValueError(f"min_sessions must be an int >= 1, got {min_sessions!r}")
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
    remap: dict = {}      # digest -> its integer
    taken: set = set()    # integers given out (a new one never repeats one)

    def draw(material: bytes) -> int:
        """A 52-bit integer from the keyed hash of `material`, redrawn on the (rare) clash with one given out."""
        for attempt in range(1 << 16):
            d = hashlib.blake2b(material + attempt.to_bytes(4, "little"), key=key, digest_size=8).digest()
            v = int.from_bytes(d, "little") >> (64 - _ID_BITS)
            if v not in taken:
                taken.add(v)
                return v
        raise RuntimeError("export: no free hash integer")  # pragma: no cover - 2**52 values

    holders: dict = {}    # digest -> distinct sessions holding it (up to min_sessions)
    private: dict = {}    # (digest, session) -> the integer of a block held by fewer than min_sessions sessions

    def num(digest: bytes, session) -> int:
        if len(holders[digest]) < min_sessions:   # rare: an integer of its own in this session
            k = (digest, session)
            v = private.get(k)
            if v is None:
                sid = hashlib.blake2b(str(session).encode(), key=key, digest_size=16).digest()
                v = private[k] = draw(b"session" + sid + digest)
            return v
        v = remap.get(digest)
        if v is None:
            v = remap[digest] = draw(b"block" + digest)
        return v

    chats: dict = {}     # session -> (last chat id, turns)
    hashed = []          # per call in order: (prompt digests, output digests)
    from strata_lab.progress import progress_bar

    it = progress_bar(order, enabled=progress, desc=f"export {format}", unit="call")
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
        for h in prompt_h + out_h:
            held = holders.setdefault(h, set())
            if len(held) < min_sessions:
                held.add(c.session)
        hashed.append((prompt_h, out_h))
    rows = []
    for n, (i, (prompt_h, out_h)) in enumerate(zip(order, hashed)):
        c = calls[i]
        P, O = c.prompt_len, len(c.output)
        ts = c.ts - t0 if timed else float(n)
        row = {"input_length": P, "output_length": O, "hash_ids": [num(h, c.session) for h in prompt_h],
               "output_hash_ids": [num(h, c.session) for h in out_h]}
        if N != BLOCK[format]:
            row["block_tokens"] = N
        if format == "mooncake":
            row["timestamp"] = int(round(ts * 1000))
        else:
            last, turns = chats.get(c.session, (-1, 0))
            row.update(chat_id=n + 1, parent_chat_id=last, timestamp=round(ts, 3), type="text", turn=turns + 1)
            chats[c.session] = (n + 1, turns + 1)
        rows.append(row)
    write_hash_trace(rows, out, format)
    return len(rows)
