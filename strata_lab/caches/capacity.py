"""Capacity and policy sweeps: token-weighted hit rate against cache size, per eviction policy, with an optional
second tier and a fleet's shared pool against per-replica caches (`sweep`, `strata-lab sweep`).

Two kinds of policy:

- **Block policies** (`lru`, `lfu`, `fifo`, `atc25`) run on the prefix-block reference stream: each request's
  prompt as chained blocks (a hash trace's `hash_ids`; for id-level dumps, vLLM-style chained keys of
  `block`-token blocks), a hit being the leading blocks found in the cache, weighted by the tokens they hold
  (a partial last block counts its tokens). All of a request's prompt blocks are then cached; its tail is
  evicted before its head (blocks are touched tail first). These can have a second tier (`tier2`: host RAM
  or SSD as SGLang HiCache, LMCache or llama.cpp `--cache-ram` keep): blocks evicted from the first tier
  move there (LRU), a hit there counts (apart, `tier2_hit_rate`) and promotes the block back.
- **Engine policies** (`vllm`, `sglang`, `sglang-lfu`, `trtllm`, or any engine spec): the engine's own cache
  model (`replay_engines`) at that capacity: its block size, what it caches (outputs too), its eviction order.

`atc25` is the workload-aware policy of "KVCache Cache in the Wild: Characterizing and Optimizing KVCache
Cache at a Large Cloud Provider" (Wang et al., USENIX ATC'25, arXiv:2506.02634, section 5), as we read it:
per request category (type x first turn or later) the probability that a block is reused decays
exponentially with the time since its last use, P_w(t) = r_w * exp(-t / tau_w), with r_w (the share of the
category's blocks that were reused) and tau_w (their mean reuse interval) fitted online from the trace;
the block with the lowest (P_w(t), -offset) is evicted: the least likely to be reused, and among equals
the one furthest into its prompt (head blocks are worth more than tail blocks). Time is the trace's clock.

Fleet (`replicas=K`): the same total capacity as one shared pool, or split over K per-replica caches that
requests are routed to (`routing`: session, round_robin, prefix_hash); rows say which (`layout`).

`dask`: run the (policy, capacity, layout) points as Dask tasks ("local[:N]", an address or a Client).

Why one module: the block stream, the block caches (with their tier 2) and the sweep that drives them and
the engines' models are one pipeline; the plot is its view.

>>> import os, tempfile
>>> from strata_lab.traces.hashtrace import MooncakeShape, generate_mooncake, write_hash_trace
>>> path = os.path.join(tempfile.mkdtemp(), "m.jsonl")
>>> write_hash_trace(generate_mooncake(MooncakeShape(requests=200, seed=1)), path, "mooncake")
>>> df = sweep(path, capacities=[10**4, 10**9], policies=["lru", "atc25"])
>>> df[["policy", "capacity"]].values.tolist()
[['lru', 10000], ['lru', 1000000000], ['atc25', 10000], ['atc25', 1000000000]]
>>> bool((df.groupby("policy")["hit_rate"].diff().dropna() >= 0).all())   # more room, more hits
True
"""
from __future__ import annotations

import heapq
import math
import zlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

__all__ = ["sweep", "plot_sweep", "policy_notes", "BlockStream", "block_stream", "simulate", "BLOCK_POLICIES",
           "CAPACITIES"]

BLOCK_POLICIES = ("lru", "lfu", "fifo", "atc25")
# engine policy names -> engine spec (the capacity field comes from sweeps.BUDGET_FIELD)
ENGINE_POLICIES = {"vllm": "vllm", "sglang": "sglang", "sglang-lfu": "sglang:eviction_policy=lfu",
                   "trtllm": "trtllm"}
CAPACITIES = tuple(int(10 ** (e / 2)) for e in range(8, 19))   # 10^4 .. 10^9 tokens, half-decades
ROUTINGS = ("session", "round_robin", "prefix_hash")


@dataclass
class BlockStream:
    """The prefix-block reference stream of a trace: per request its chained block keys, the tokens of its
    last block (the others hold `block`), its prompt length, time, session and category."""

    keys: list            # list of lists of ints
    last: np.ndarray      # tokens in each request's last block
    prompt: np.ndarray    # prompt tokens per request
    ts: np.ndarray        # seconds (request index when the trace has no times)
    session: list
    category: list        # str per request (atc25's request class)
    block: int

    @property
    def prompt_tokens(self) -> int:
        return int(self.prompt.sum())


def block_stream(trace, *, block: int = 16, progress: bool = False) -> BlockStream:
    """The stream of a hash trace (`HashTrace` or its path: its own blocks) or of any dump / list of `Call`s
    (chained keys of `block`-token blocks, full blocks only); `progress`: bars while it is read and keyed."""
    import os

    from strata_lab.progress import progress_bar
    from strata_lab.traces.hashtrace import HashTrace, is_hash_trace, load_hash_trace

    if isinstance(trace, (str, os.PathLike)) and is_hash_trace(trace):
        trace = load_hash_trace(trace, progress=progress)
    if isinstance(trace, HashTrace):
        T = trace.block
        recs = trace.records
        last = np.array([r["input_length"] - (len(r["hash_ids"]) - 1) * T if r["hash_ids"] else 0 for r in recs],
                        np.int64)
        cats = [f"{r.get('type') or 'request'}/{'first' if r.get('parent_chat_id') in (-1, '-1', None) else 'later'}"
                for r in recs]
        return BlockStream([r["hash_ids"] for r in recs], last, trace.input_length.copy(), trace.ts.copy(),
                           list(trace.session), cats, T)
    from strata_lab.caches.call_ids import calls_from_dump
    from strata_lab.caches.replay import _order
    from strata_lab.caches.vllm import chain_hashes

    calls = calls_from_dump(trace, progress=progress)
    order = _order(calls)
    seen: set = set()
    keys, prompt, ts, sess, cats = [], [], [], [], []
    for n, i in enumerate(progress_bar(order, enabled=progress, desc="block keys", unit="call")):
        c = calls[i]
        keys.append(chain_hashes(c.prompt, 0, 0, block, c.cache_salt).tolist())
        prompt.append(c.prompt_len)
        ts.append(c.ts if c.ts is not None else float(n))
        sess.append(c.session)
        cats.append("request/" + ("later" if c.session in seen else "first"))
        seen.add(c.session)
    return BlockStream(keys, np.full(len(keys), block, np.int64), np.array(prompt, np.int64),
                       np.array(ts, np.float64), sess, cats, block)


class _Tier2:
    def __init__(self, cap_blocks: int):
        self.cap = cap_blocks
        self.d: OrderedDict = OrderedDict()

    def put(self, key):
        if self.cap <= 0:
            return
        self.d[key] = None
        self.d.move_to_end(key)
        while len(self.d) > self.cap:
            self.d.popitem(last=False)


class _Cache:
    """One replica's block cache under one policy (capacity in blocks; None: unbounded)."""

    def __init__(self, policy: str, cap: int | None, tier2: int | None):
        self.policy, self.cap = policy, cap
        self.t2 = _Tier2(tier2) if tier2 else None
        self.evictions = 0
        self.n = 0
        if policy in ("lru", "fifo"):
            self.d: OrderedDict = OrderedDict()
        elif policy == "lfu":
            self.count: dict = {}
            self.heap: list = []
            self.tick = 0
        else:  # atc25
            self.where: dict = {}       # key -> (category, last use time)
            self.lists: dict = {}       # category -> OrderedDict of keys, least recently used first
            self.reused: dict = {}      # category -> blocks reused
            self.inserted: dict = {}    # category -> blocks cached
            self.interval: dict = {}    # category -> (sum of reuse intervals, count)

    def __contains__(self, key) -> bool:
        if self.policy in ("lru", "fifo"):
            return key in self.d
        if self.policy == "lfu":
            return key in self.count
        return key in self.where

    # -- the request ----------------------------------------------------------------------------------
    def lookup(self, keys) -> tuple[int, int]:
        """(leading blocks in tier 1 or 2, how many of them came from tier 2)."""
        k = t2 = 0
        for h in keys:
            if h in self:
                k += 1
            elif self.t2 is not None and h in self.t2.d:
                k += 1
                t2 += 1
            else:
                break
        return k, t2

    def touch(self, keys, now: float, cat: str) -> None:
        """Cache every block of the request (tail first, so the head is the most recent)."""
        if self.t2 is not None:
            for h in keys:
                self.t2.d.pop(h, None)   # promoted (or re-computed): it lives in tier 1 now
        p = self.policy
        if p in ("lru", "fifo"):
            d = self.d
            for h in reversed(keys):
                if h in d:
                    if p == "lru":
                        d.move_to_end(h)
                else:
                    d[h] = None
        elif p == "lfu":
            count, heap = self.count, self.heap
            for h in reversed(keys):
                self.tick += 1
                c = count.get(h, (0, 0))[0] + 1
                count[h] = (c, self.tick)
                heapq.heappush(heap, (c, self.tick, h))
            if len(heap) > 4 * len(count) + 4096:   # drop stale entries: the heap stays O(cached blocks)
                self.heap = [(c, t, h) for h, (c, t) in count.items()]
                heapq.heapify(self.heap)
        else:
            for j in range(len(keys) - 1, -1, -1):
                h = keys[j]
                old = self.where.get(h)
                if old is not None:
                    ocat, t = old
                    self.lists[ocat].pop(h)
                    self.reused[ocat] = self.reused.get(ocat, 0) + 1
                    s, n = self.interval.get(ocat, (0.0, 0))
                    self.interval[ocat] = (s + (now - t), n + 1)
                else:
                    self.inserted[cat] = self.inserted.get(cat, 0) + 1
                lst = self.lists.get(cat)
                if lst is None:
                    lst = self.lists[cat] = OrderedDict()
                lst[h] = None
                self.where[h] = (cat, now)
        self._shrink(now)

    def _size(self) -> int:
        if self.policy in ("lru", "fifo"):
            return len(self.d)
        if self.policy == "lfu":
            return len(self.count)
        return len(self.where)

    def _shrink(self, now: float) -> None:
        if self.cap is None:
            return
        while self._size() > self.cap:
            h = self._victim(now)
            self.evictions += 1
            if self.t2 is not None:
                self.t2.put(h)

    def _victim(self, now: float):
        p = self.policy
        if p in ("lru", "fifo"):
            return self.d.popitem(last=False)[0]
        if p == "lfu":   # least frequently used; among equals the least recently used
            while True:
                c, t, h = heapq.heappop(self.heap)
                if self.count.get(h) == (c, t):
                    del self.count[h]
                    return h
        # atc25: the category head (its least recently used block) with the lowest reuse probability now
        best, best_p = None, math.inf
        for cat, lst in self.lists.items():
            if not lst:
                continue
            h = next(iter(lst))
            _, t = self.where[h]
            ins = self.inserted.get(cat, 0)
            r = (self.reused.get(cat, 0) + 1) / (ins + 2)         # share reused (a Laplace prior: 1/2)
            s, n = self.interval.get(cat, (0.0, 0))
            tau = s / n if n and s > 0 else 1.0
            prob = r * math.exp(-(now - t) / tau)
            if prob < best_p:
                best, best_p = cat, prob
        h, _ = self.lists[best].popitem(last=False)
        del self.where[h]
        return h


def simulate(stream: BlockStream, policy: str, capacity: int | None, *, tier2: int | None = None,
             replicas: int = 1, routing: str = "session") -> dict:
    """Replay the block stream under one block policy at `capacity` tokens in all (split evenly over
    `replicas` per-replica caches; `tier2` tokens of second tier, split the same way)."""
    if policy not in BLOCK_POLICIES:
        raise ValueError(f"policy must be one of {BLOCK_POLICIES}, got {policy!r}")
    if routing not in ROUTINGS:
        raise ValueError(f"routing must be one of {ROUTINGS}, got {routing!r}")
    T = stream.block
    per = None if capacity is None else max(capacity // replicas // T, 1)
    per2 = None if not tier2 else max(tier2 // replicas // T, 1)
    caches = [_Cache(policy, per, per2) for _ in range(replicas)]
    sticky: dict = {}
    rr = 0
    hit = hit2 = 0
    for i, keys in enumerate(stream.keys):
        if replicas == 1:
            r = 0
        elif routing == "round_robin":
            r = i % replicas
        elif routing == "prefix_hash":
            r = zlib.crc32(str(keys[0] if keys else "").encode()) % replicas
        else:
            r = sticky.get(stream.session[i])
            if r is None:
                r = sticky[stream.session[i]] = rr % replicas
                rr += 1
        c = caches[r]
        k, k2 = c.lookup(keys)
        # the leading cached blocks' tokens: full blocks hold T, a request's last block `last` (a prompt shorter
        # than a block has no block and reuses nothing); never more than the prompt
        n = len(keys)
        tokens = min((n - 1) * T + int(stream.last[i]) if k == n and n else k * T, int(stream.prompt[i]))
        hit += tokens
        if k2:
            hit2 += min(tokens, k2 * T)
        c.touch(keys, float(stream.ts[i]), stream.category[i])
    total = stream.prompt_tokens
    return {"hit_rate": hit / total if total else math.nan, "tier2_hit_rate": hit2 / total if total else math.nan,
            "reused": hit, "prompt_tokens": total, "evictions": sum(c.evictions for c in caches)}


def _engine_point(calls, policy: str, capacity: int | None, replicas: int, routing: str) -> dict:
    from strata_lab.caches.presets import parse_engine
    from strata_lab.caches.replay import replay_engines
    from strata_lab.caches.sweeps import BUDGET_FIELD

    p = parse_engine(ENGINE_POLICIES.get(policy, policy))
    field = BUDGET_FIELD.get(p.engine)
    if field not in ("kv_tokens", "max_total_tokens"):
        raise ValueError(f"policies: {policy} has no token capacity to sweep (block pools: vllm, sglang, trtllm)")
    kw = {"replicas": replicas, "routing": routing}
    if capacity is not None:
        kw[field] = max(capacity // replicas, 1)
    s = replay_engines(calls, [p.with_(**kw)]).summary().iloc[0]
    return {"hit_rate": float(s["hit_rate"]), "tier2_hit_rate": 0.0, "reused": int(s["reused"]),
            "prompt_tokens": int(s["prompt_tokens"]), "evictions": int(s["evictions"])}


def _point(data, policy, capacity, tier2, replicas, routing, layout):
    kind, obj = data
    if kind == "stream":
        out = simulate(obj, policy, capacity, tier2=tier2, replicas=replicas, routing=routing)
    else:
        out = _engine_point(obj, policy, capacity, replicas, routing)
    out.update(policy=policy, capacity=capacity, tier2=tier2, layout=layout, replicas=replicas)
    return out


def policy_notes(policies, stream: BlockStream | None) -> dict:
    """{policy: note} for the policies that are another one on this trace because their inputs are missing:
    `atc25` keys on request categories (type x first turn or later), so on a trace with one category only
    (Mooncake: no types, no chat chains) it evicts exactly as `lru`.

    >>> s = BlockStream([[1]], np.ones(1, np.int64), np.ones(1, np.int64), np.zeros(1), ["a"], ["request/first"], 16)
    >>> policy_notes(["lru", "atc25"], s)
    {'atc25': 'atc25: the trace has no request categories; it is lru here'}
    """
    notes = {}
    if "atc25" in policies and stream is not None and len(set(stream.category)) <= 1:
        notes["atc25"] = "atc25: the trace has no request categories; it is lru here"
    return notes


def sweep(trace, capacities=None, policies=("lru", "lfu", "atc25", "vllm", "sglang"), *, tier2=None,
          replicas: int = 1, routing: str = "session", block: int = 16, dask=None, progress: bool = False):
    """Token-weighted hit rate against capacity: one row per (policy, capacity, layout).

    `trace`: a Mooncake/Bailian file or `HashTrace`, a dump, a store, or a list of `Call`s.
    `capacities`: cache sizes in tokens (default `CAPACITIES`, 10^4 .. 10^9; None in the list: unbounded).
    `policies`: block policies (`lru`, `lfu`, `fifo`, `atc25`) and engines' own (`vllm`, `sglang`,
    `sglang-lfu`, `trtllm`, or an engine spec). `tier2`: second-tier tokens (block policies only).
    `replicas`: with K > 1 each point runs twice: a shared pool of `capacity` (`layout` "shared") and K
    per-replica caches of capacity / K (`layout` "per-replica", routed by `routing`).
    `block`: block tokens for the block policies on id-level dumps (a hash trace uses its own).
    `dask`: "local[:N]", a scheduler address or a `distributed.Client`: the points run as Dask tasks.
    `progress`: progress bars on stderr (reading the trace, keying its blocks, one step per point).
    Column `note`: why a policy is another one on this trace (`policy_notes`), else "".
    """
    import pandas as pd

    caps = list(CAPACITIES if capacities is None else capacities)
    if not caps:
        raise ValueError("capacities must list at least one cache size")
    for c in caps:
        if c is not None and (isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < 1):
            raise ValueError(f"capacities must be positive ints (tokens) or None, got {c!r}")
    caps = [None if c is None else int(c) for c in caps]
    if isinstance(policies, str):
        policies = [policies]
    if not policies:
        raise ValueError("policies must name at least one policy")
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"replicas must be a positive int, got {replicas!r}")
    if routing not in ROUTINGS:
        raise ValueError(f"routing must be one of {ROUTINGS}, got {routing!r}")
    if tier2 is not None and (isinstance(tier2, bool) or not isinstance(tier2, int) or tier2 < 1):
        raise ValueError(f"tier2 must be a positive int (tokens), got {tier2!r}")
    engines = [p for p in policies if p not in BLOCK_POLICIES]
    if engines and tier2 is not None:
        raise ValueError(f"tier2: a second tier is modelled for the block policies {BLOCK_POLICIES}, "
                         f"not for {engines}")
    for p in engines:   # a clear error before any work
        from strata_lab.caches.presets import parse_engine

        parse_engine(ENGINE_POLICIES.get(p, p))
    import os

    from strata_lab.progress import progress_bar
    from strata_lab.traces.hashtrace import HashTrace, is_hash_trace, load_hash_trace

    if isinstance(trace, (str, os.PathLike)) and is_hash_trace(trace):   # read once, for the stream and the calls
        trace = load_hash_trace(trace, progress=progress)
    data = {}
    if len(engines) < len(policies):
        data["stream"] = ("stream", block_stream(trace, block=block, progress=progress))
    if engines:
        from strata_lab.caches.call_ids import calls_from_dump

        data["calls"] = ("calls", calls_from_dump(trace, progress=progress))
    notes = policy_notes(policies, data["stream"][1] if "stream" in data else None)
    layouts = [("shared", 1)] + ([("per-replica", replicas)] if replicas > 1 else [])
    points = [(p, c, name, k) for p in policies for c in caps for name, k in layouts]

    def args(p, c, name, k):
        return (data["stream"] if p in BLOCK_POLICIES else data["calls"], p, c, tier2, k, routing, name)

    if dask is not None:
        from strata_lab.replayer.distributed import connect

        client, owned = connect(dask)
        try:
            shared = {k: client.scatter(v, broadcast=True) for k, v in data.items()}
            futs = [client.submit(_point, shared["stream" if p in BLOCK_POLICIES else "calls"], *args(p, c, n, k)[1:],
                                  pure=False) for p, c, n, k in points]
            if progress:
                from distributed import progress as dprogress

                dprogress(futs)
            rows = client.gather(futs)
        finally:
            if owned:
                client.close()
    else:
        bar = progress_bar(points, enabled=progress, desc="sweep", unit="point", tick=1.0)
        rows = []
        for pt in bar:
            if progress:   # which point runs now: one can take minutes on a production trace
                bar.set_postfix_str(f"{pt[0]} at " + ("unbounded" if pt[1] is None else f"{pt[1]:.3g} tokens"))
            rows.append(_point(*args(*pt)))
    cols = ["policy", "capacity", "layout", "replicas", "tier2", "hit_rate", "tier2_hit_rate", "reused",
            "prompt_tokens", "evictions"]
    df = pd.DataFrame(rows)[cols]
    df["note"] = [notes.get(p, "") for p in df["policy"]]
    df["capacity"] = df["capacity"].astype("Int64")
    df["tier2"] = df["tier2"].astype("Int64")
    return df


def plot_sweep(frame, path=None, *, ax=None, title: str | None = None):
    """Hit rate (%) against capacity (tokens, log), one line per policy (and layout / tier).

    `frame`: what `sweep` returns; `path`: write a PNG there; `ax`: draw into this matplotlib axes;
    `title`: the figure's title."""
    import matplotlib

    if path is not None and ax is None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(7, 4))
    finite = frame[frame["capacity"].notna()]
    for (pol, layout, t2), g in finite.groupby(["policy", "layout", "tier2"], sort=False, dropna=False):
        import pandas as pd

        label = pol + ("" if frame["layout"].nunique() == 1 else f" ({layout})") + \
            ("" if pd.isna(t2) else f" + tier 2 of {int(t2):,}")
        note = str(g["note"].iloc[0]) if "note" in g and pd.notna(g["note"].iloc[0]) else ""
        if note:   # a policy that is another one on this trace says so where its line is read
            label += f" ({note.split(': ', 1)[-1]})"
        ax.plot(g["capacity"].astype(float), 100 * g["hit_rate"], marker="o", ms=3, label=label)
    unb = frame[frame["capacity"].isna()]
    if len(unb):
        ax.axhline(100 * float(unb["hit_rate"].max()), color="grey", ls=":", lw=1, label="unbounded")
    ax.set_xscale("log")
    ax.set_xlabel("cache capacity (tokens)")
    ax.set_ylabel("hit rate (% of prompt tokens)")
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if fig is not None:
        fig.tight_layout()
        if path is not None:
            fig.savefig(path, dpi=110)
            plt.close(fig)
    return fig if fig is not None else ax.figure

