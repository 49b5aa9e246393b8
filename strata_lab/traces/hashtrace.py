"""Production hash-block traces (Mooncake, Qwen-Bailian): read into columns, turned into synthetic token ids.

Public KV-cache traces carry no text, only one integer per block of prompt tokens; equal leading block ids
mean a shared prefix (each block's hash chains its parents):

- **Mooncake** (Kimi, FAST'25, `FAST25-release/traces/`): JSONL lines
  ``{"timestamp": ms, "input_length", "output_length", "hash_ids": [...]}``, 512 tokens per block.
- **Qwen-Bailian** (Alibaba, "KVCache Cache in the Wild", ATC'25): JSONL lines ``{"chat_id",
  "parent_chat_id" (-1 for a root), "timestamp": s, "input_length", "output_length",
  "type": text|search|image|file, "turn", "hash_ids"}``, 16 tokens per block.

Ids: every distinct block hash gets a dense index ``d`` (in order of first appearance) and its tokens the ids
``d * T + j`` (``T`` tokens per block, ``j`` the position in the block), so equal blocks have equal ids and
different blocks share none; a partial last block keeps its hash, truncated to ``input_length``. Outputs are
fresh ids (never seen before) of ``output_length``. Sessions: Bailian's ``chat_id`` / ``parent_chat_id`` chains
(the root chat names the session); Mooncake has none, so every request is its own session.

An export written by `strata-lab export` may add ``output_hash_ids``: the hashes of the blocks of prompt +
output from the prompt's last (partial) block on; then the prompt's tail and the output take their ids from
those blocks, so a later prompt that repeats the reply finds it cached, as in the original.
It writes ``block_tokens`` on every line when its block is not the format's (``export --format mooncake
--block 16``); such a trace is read with that block (`declared_block`).

Each `Call` keeps its blocks (`Call.blocks`): the vLLM model keys them at block granularity instead of
hashing every token (same numbers, see `strata_lab.caches.vllm`).

>>> import os, tempfile, json
>>> path = os.path.join(tempfile.mkdtemp(), "t.jsonl")
>>> with open(path, "w") as f:
...     for line in ({"timestamp": 0, "input_length": 5, "output_length": 2, "hash_ids": [7, 8]},
...                  {"timestamp": 1000, "input_length": 6, "output_length": 1, "hash_ids": [7, 9]}):
...         _ = f.write(json.dumps(line) + "\\n")
>>> t = load_hash_trace(path, block=4)
>>> t.format, len(t), [p.tolist() for p, _, _, _ in t.synth()]
('mooncake', 2, [[0, 1, 2, 3, 4], [0, 1, 2, 3, 12, 13]])
>>> [o.tolist() for _, o, _, _ in t.synth()], t.ts.tolist()
([[8, 9], [16]], [0.0, 1.0])

Why one module: both trace layouts, their limits and the synthetic ids share one column reader; the
ids' definition sits beside the reader that feeds it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from strata_lab.traces.source import Source, loads

__all__ = ["HashTrace", "load_hash_trace", "is_hash_trace", "detect_hash_format", "IdSynth", "BLOCK",
           "parse_record", "write_hash_trace", "generate_mooncake", "MooncakeShape"]

# tokens per hash block of each published trace
BLOCK = {"mooncake": 512, "bailian": 16}
_INT32 = (1 << 31) - 1


def detect_hash_format(first: dict) -> str | None:
    """'bailian' or 'mooncake' for a first record of that shape, else None."""
    if not isinstance(first, dict) or not isinstance(first.get("hash_ids"), list) or "input_length" not in first:
        return None
    return "bailian" if "chat_id" in first else "mooncake"


def _first_record(p: str):
    """The first JSON record of a JSONL file (None: no file, no record, or not JSON)."""
    if not os.path.isfile(p):
        return None
    from strata_lab.limits import open_input

    with open_input(p) as f:   # a .gz trace inflated as it is read
        for raw in f:
            raw = raw.strip()
            if not raw:
                continue
            try:
                return loads(raw)
            except ValueError:
                return None
    return None


def is_hash_trace(path) -> str | None:
    """The format of a JSONL file whose first record is a hash trace line (else None; no file: None)."""
    return detect_hash_format(_first_record(os.fspath(path)))


def declared_block(path) -> int | None:
    """The tokens per block a trace declares (`block_tokens` on its lines: our exports with a block other
    than the format's), else None."""
    first = _first_record(os.fspath(path))
    v = first.get("block_tokens") if isinstance(first, dict) else None
    return v if type(v) is int and v >= 1 else None


def _int(rec: dict, key: str, *, minimum: int = 0) -> int:
    v = rec.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v) or v < minimum:
        raise ValueError(f"{key} must be an int >= {minimum}, got {v!r}")
    return int(v)


def _hashes(rec: dict, key: str) -> list:
    v = rec.get(key)
    if not isinstance(v, list) or any(isinstance(x, bool) or not isinstance(x, int) for x in v):
        raise ValueError(f"{key} must be a list of ints")
    return v


def parse_record(rec: dict, fmt: str, block: int) -> dict:
    """One trace line checked and normalised (ValueError naming the field): ts in seconds, lengths, hashes,
    the optional `output_hash_ids` of our exports, Bailian's chat fields."""
    from strata_lab.limits import check_length

    declared = rec.get("block_tokens")
    if declared is not None and declared != block:
        raise ValueError(f"block_tokens is {declared!r}, the trace is read with blocks of {block} tokens")
    n_in = check_length(_int(rec, "input_length"), "call_tokens", "input_length")   # before any id is made
    n_out = check_length(_int(rec, "output_length"), "call_tokens", "output_length")
    hashes = _hashes(rec, "hash_ids")
    if -(-n_in // block) != len(hashes):
        raise ValueError(f"hash_ids has {len(hashes)} blocks; input_length {n_in} needs {-(-n_in // block)} "
                         f"blocks of {block} tokens")
    out_h = rec.get("output_hash_ids")
    if out_h is not None:
        out_h = _hashes(rec, "output_hash_ids")
        start = n_in // block
        need = -(-(n_in + n_out) // block) - start
        if len(out_h) != need:
            raise ValueError(f"output_hash_ids has {len(out_h)} blocks; prompt + output need {need} from block "
                             f"{start}")
    ts = rec.get("timestamp")
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or ts != ts:
        raise ValueError(f"timestamp must be a number, got {ts!r}")
    out = {"ts": float(ts) / 1000.0 if fmt == "mooncake" else float(ts), "input_length": n_in,
           "output_length": n_out, "hash_ids": hashes, "output_hash_ids": out_h}
    if fmt == "bailian":
        for k in ("chat_id", "parent_chat_id"):
            if isinstance(rec.get(k), bool) or not isinstance(rec.get(k), (int, str)):
                raise ValueError(f"{k} must be an int or a string, got {rec.get(k)!r}")
        out.update(chat_id=rec["chat_id"], parent_chat_id=rec["parent_chat_id"], type=rec.get("type"),
                   turn=rec.get("turn"))
    return out


class IdSynth:
    """Dense block indexes and synthetic ids, shared by every request of one trace (see module docstring)."""

    def __init__(self, block: int):
        self.T = block
        self.dense: dict = {}
        self.next = 0

    def index(self, hashes) -> np.ndarray:
        d, nxt = self.dense, self.next
        out = np.empty(len(hashes), np.int64)
        for i, h in enumerate(hashes):
            v = d.get(h)
            if v is None:
                v = d[h] = nxt
                nxt += 1
            out[i] = v
        self.next = nxt
        self._check()
        return out

    def fresh(self, n_blocks: int) -> np.ndarray:
        out = np.arange(self.next, self.next + n_blocks, dtype=np.int64)
        self.next += n_blocks
        self._check()
        return out

    def _check(self):
        if self.next * self.T > _INT32:
            raise ValueError(f"hash_ids: {self.next} distinct blocks of {self.T} tokens do not fit int32 token ids")

    def ids(self, dense: np.ndarray, start: int, n: int) -> np.ndarray:
        """Ids of positions [start, start + n) of a sequence whose blocks (from block 0) are `dense`."""
        if n <= 0:
            return np.zeros(0, np.int32)
        T = self.T
        b0, b1 = start // T, -(-(start + n) // T)
        grid = dense[b0:b1].astype(np.int32)[:, None] * np.int32(T) + np.arange(T, dtype=np.int32)
        lo = start - b0 * T
        return grid.ravel()[lo:lo + n]


def synth_call(p: dict, synth: IdSynth) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(prompt ids, output ids, dense block indexes of the sequence, positions they cover) of one record."""
    T = synth.T
    n_in, n_out = p["input_length"], p["output_length"]
    dense = synth.index(p["hash_ids"])
    if p["output_hash_ids"] is not None:
        seq = np.concatenate([dense[:n_in // T], synth.index(p["output_hash_ids"])])
        covered = n_in + n_out
        prompt = synth.ids(seq, 0, n_in)
        output = synth.ids(seq, n_in, n_out)
    else:
        seq, covered = dense, n_in
        prompt = synth.ids(dense, 0, n_in)
        output = synth.ids(synth.fresh(-(-n_out // T)), 0, n_out)
    return prompt, output, seq, covered


@dataclass
class HashTrace:
    """A hash trace in columns: one row per request, in file order."""

    format: str
    block: int
    path: str
    ts: np.ndarray                  # float64 seconds
    input_length: np.ndarray        # int64
    output_length: np.ndarray       # int64
    session: list                   # str per request
    records: list = field(repr=False, default_factory=list)  # the parsed records (hash lists)
    skipped: int = 0

    def __len__(self) -> int:
        return len(self.input_length)

    @property
    def prompt_tokens(self) -> int:
        return int(self.input_length.sum())

    def synth(self) -> Iterator[tuple]:
        """Per request: (prompt ids, output ids, dense block indexes of the sequence, positions they cover);
        `strata_lab.caches.call_ids.calls_from_hash_trace` makes `Call`s of them."""
        synth = IdSynth(self.block)
        for r in self.records:
            yield synth_call(r, synth)

    def hash_lists(self) -> list:
        """The `hash_ids` of every request (lists of ints)."""
        return [r["hash_ids"] for r in self.records]

    def to_frame(self):
        import pandas as pd

        df = pd.DataFrame({"ts": self.ts, "session": pd.Series(self.session, dtype="string"),
                           "input_length": self.input_length, "output_length": self.output_length,
                           "blocks": [len(h) for h in self.hash_lists()]})
        if self.format == "bailian":
            df["chat_id"] = [r["chat_id"] for r in self.records]
            df["parent_chat_id"] = [r["parent_chat_id"] for r in self.records]
            df["type"] = pd.Series([r["type"] for r in self.records], dtype="string")
            df["turn"] = pd.Series([r["turn"] for r in self.records], dtype="Int64")
        return df


def _sessions(fmt: str, records: list, stem: str) -> list:
    if fmt == "mooncake":
        return [f"{stem}-{i}" for i in range(len(records))]
    root: dict = {}
    out = []
    for r in records:
        parent = r["parent_chat_id"]
        is_root = parent in (-1, "-1", None)
        base = r["chat_id"] if is_root else root.get(parent, parent)  # a parent outside the window: its own chain
        root[r["chat_id"]] = base
        out.append(f"chat-{base}")
    return out


def iter_records(src: Source, fmt: str, block: int) -> Iterator[tuple[int, dict]]:
    """(line number, parsed record) of every valid line; bad lines are skipped with a warning naming file:line.
    The trace's tokens in all (prompts + outputs) must stay within the `trace_tokens` limit (a ValueError
    naming the file and line where they pass it, before that line's ids are made)."""
    from strata_lab.limits import limit

    top, total = limit("trace_tokens"), 0
    for lineno, rec in src.json_lines():
        try:
            p = parse_record(rec, fmt, block)
        except ValueError as exc:
            src.skip(lineno, f"{fmt} line: {exc}")
            continue
        total += p["input_length"] + p["output_length"]
        if total > top:
            raise ValueError(f"{src.where(lineno)}: the trace's prompt and output tokens pass the limit of {top} "
                             "(trace_tokens; set STRATA_LIMIT_TRACE_TOKENS to change it)")
        yield lineno, p


def load_hash_trace(path, format: str | None = None, *, block: int | None = None, progress: bool = False
                    ) -> HashTrace:
    """Read the Mooncake or Bailian trace (JSONL) at `path` into columns. `format`: detected from the first
    record; `block`: tokens per hash block (default: the format's, 512 or 16); `progress`: a progress bar."""
    p = os.fspath(path)
    src = Source(p, progress=progress)
    fmt = format or is_hash_trace(p)
    if fmt not in BLOCK:
        raise ValueError(f"format: {p} is not a mooncake or bailian hash trace (its first record has no "
                         f"hash_ids / input_length)" if format is None else
                         f"format: must be mooncake or bailian, got {format!r}")
    T = block or declared_block(p) or BLOCK[fmt]
    if isinstance(T, bool) or not isinstance(T, int) or T < 1:
        raise ValueError(f"block must be a positive int, got {block!r}")
    records = [r for _, r in iter_records(src, fmt, T)]
    if not records:
        raise ValueError(f"{p}: no valid {fmt} line")
    return HashTrace(format=fmt, block=T, path=p,
                     ts=np.array([r["ts"] for r in records], np.float64),
                     input_length=np.array([r["input_length"] for r in records], np.int64),
                     output_length=np.array([r["output_length"] for r in records], np.int64),
                     session=_sessions(fmt, records, src.stem), records=records, skipped=src.skipped)


def write_hash_trace(rows, path, fmt: str) -> None:
    """Write rows (dicts in the format's shape) as JSONL, mode 0600. A row's `block_tokens` (a block other
    than the format's) is written too, so the trace is read back with its own block size."""
    from strata_lab.dump.writer import write_records

    keys = ("chat_id", "parent_chat_id", "timestamp", "input_length", "output_length", "type", "turn",
            "hash_ids", "output_hash_ids", "block_tokens") if fmt == "bailian" else \
        ("timestamp", "input_length", "output_length", "hash_ids", "output_hash_ids", "block_tokens")
    write_records(({k: r[k] for k in keys if k in r} for r in rows), path)  # 0600, no symbolic link


@dataclass(frozen=True)
class MooncakeShape:
    """A synthetic Mooncake-shaped workload: `requests` calls over `duration_s`; each comes from a multi-turn
    conversation (a shared document or system prompt of log-normal length, picked with Zipf popularity
    among `documents`, then the conversation's own turns) or is a one-off request. Lengths are tokens.
    The defaults give about 12,000 requests of 12,000 input tokens on average (about 145 M tokens, the size
    of Mooncake's conversation trace) and an LRU hit-rate curve of the paper's shape: a 3 M-token cache
    reaches about half of the unbounded hit rate, 50 M tokens all of it."""

    requests: int = 12_000
    documents: int = 3000
    zipf: float = 0.9
    doc_tokens: float = 10_000.0     # median shared-prefix length
    turn_tokens: float = 1000.0      # median new tokens per turn (user text + the previous reply)
    turns: float = 3.0               # mean turns per conversation
    one_off: float = 0.35            # share of single requests with no shared document
    output_tokens: float = 300.0
    duration_s: float = 3600.0
    think_s: float = 900.0           # mean gap between a conversation's turns
    max_tokens: int = 120_000
    block: int = 512
    seed: int = 0


def generate_mooncake(shape: MooncakeShape = MooncakeShape()) -> Iterator[dict]:
    """Mooncake-format rows (dicts; `write_hash_trace` writes them) drawn from `shape`, in timestamp order.
    Block hashes chain their parents (equal hash = equal prefix), as in the published traces.

    >>> rows = list(generate_mooncake(MooncakeShape(requests=50, documents=5, seed=1)))
    >>> len(rows), all(len(r["hash_ids"]) == -(-r["input_length"] // 512) for r in rows)
    (50, True)
    """
    rng = np.random.default_rng(shape.seed)
    T = shape.block
    intern: dict = {}

    def block_hash(parent: int, content: int) -> int:
        k = (parent, content)
        v = intern.get(k)
        if v is None:
            v = intern[k] = len(intern)
        return v

    content = [0]

    def new_content() -> int:
        content[0] += 1
        return content[0]

    doc_len = np.maximum(rng.lognormal(np.log(shape.doc_tokens), 0.8, shape.documents).astype(int), 64)
    doc_content = [[new_content() for _ in range(-(-int(n) // T))] for n in doc_len]
    ranks = np.arange(1, shape.documents + 1, dtype=float) ** -shape.zipf
    ranks /= ranks.sum()
    events = []  # (ts, seq, conversation state)
    n_conv = 0
    made = 0
    import heapq

    starts = np.sort(rng.uniform(0, shape.duration_s, shape.requests))
    si = 0
    while made < shape.requests:
        # the next event: a new conversation start or a waiting turn, whichever is earlier
        if events and (si >= len(starts) or events[0][0] <= starts[si]):
            ts, _, conv = heapq.heappop(events)
        elif si < len(starts):
            ts = float(starts[si])
            si += 1
            n_conv += 1
            one_off = rng.random() < shape.one_off
            if one_off:
                conv = {"content": [], "len": 0, "left": 1}
            else:
                d = int(rng.choice(shape.documents, p=ranks))
                conv = {"content": list(doc_content[d]), "len": int(doc_len[d]),
                        "left": max(1, int(rng.geometric(1.0 / shape.turns)))}
        else:
            break
        add = max(int(rng.lognormal(np.log(shape.turn_tokens), 0.9)), 8)
        n_in = min(conv["len"] + add, shape.max_tokens)
        # the prompt: the conversation so far (its full blocks keep their content), then fresh content
        keep = min(conv["len"], n_in) // T
        blocks = conv["content"][:keep] + [new_content() for _ in range(-(-n_in // T) - keep)]
        hashes, h = [], -1
        for c in blocks:
            h = block_hash(h, c)
            hashes.append(h)
        n_out = max(int(rng.lognormal(np.log(shape.output_tokens), 0.7)), 1)
        made += 1
        yield {"timestamp": int(round(ts * 1000)), "input_length": n_in, "output_length": n_out,
               "hash_ids": hashes}
        conv["left"] -= 1
        # the reply joins the conversation: the next turn's prompt repeats this one's full blocks
        seq = n_in + n_out
        conv["content"] = blocks[:n_in // T] + [new_content() for _ in range(-(-seq // T) - n_in // T)]
        conv["len"] = seq
        if conv["left"] > 0 and n_in < shape.max_tokens:
            heapq.heappush(events, (ts + float(rng.exponential(shape.think_s)), made, conv))


def read_calls(src: Source, fmt: str, name: str) -> Iterator[dict]:
    """Trace calls (`strata_lab.traces.log_calls.FIELDS`) of a hash trace: ids-level, synthetic ids; the block
    hashes and lengths ride along in `extra` (`hash_ids`, `block_tokens`, ...)."""
    from strata_lab.traces.log_calls import new_call

    T = declared_block(src.path) or BLOCK[fmt]
    synth = IdSynth(T)
    root: dict = {}
    for i, (lineno, p) in enumerate(iter_records(src, fmt, T)):
        prompt, output, _, _ = synth_call(p, synth)
        if fmt == "bailian":
            parent = p["parent_chat_id"]
            base = p["chat_id"] if parent in (-1, "-1", None) else root.get(parent, parent)
            root[p["chat_id"]] = base
            session = f"chat-{base}"
        else:
            session = f"{src.stem}-{i}"
        extra = {"hash_ids": p["hash_ids"], "block_tokens": T, "synthetic_ids": True}
        for k in ("chat_id", "parent_chat_id", "type", "turn", "output_hash_ids"):
            if p.get(k) is not None:
                extra[k] = p[k]
        yield new_call(format=name, fidelity="ids", ts=p["ts"], session=session, source=src.where(lineno),
                       prompt_ids=prompt.tolist(), prompt_len=p["input_length"], response_ids=output.tolist(),
                       prompt_tokens=p["input_length"], completion_tokens=p["output_length"], extra=extra)
