"""Workloads for checking the cache models against the engines: scripts that build each prompt from what
the engine really generated.

A workload is a generator: it yields a `Request` (session, prompt ids, how many ids to generate, salt) and
is sent back the ids the engine generated for it; the next prompt is built from those. Calls of a session
are sent in order; sessions interleave in the order the script yields them.

- `dump_workload(path)`: the calls of a strata-dump/1 file (the shipped dumps, `strata_lab.fleet` traces)
  with their exact prompt ids; prompts do not depend on the outputs (max_tokens = the recorded output's
  length, at least 1).
- `agent_workload(seed, ...)`: generated agent sessions whose histories hold the engine's own replies:
  tool loops, a user editing an earlier message, retries (the same prompt again), dropped replies (the
  client resends the history without the reply), subagents (a new session on the same system prompt),
  several sessions interleaved, and a `cache_salt` tenant.

>>> w = agent_workload(seed=1, sessions=2, turns=2, system_len=40, turn_len=10, max_tokens=3)
>>> req = next(w); (req.session in ("s0", "s1"), len(req.prompt) >= 40, req.max_tokens)
(True, True, 3)
>>> req2 = w.send([7, 8, 9]); req2.max_tokens
3
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Generator

__all__ = ["Request", "dump_workload", "agent_workload", "fleet_workload", "parse_workload", "drive"]

# ids drawn for generated text: ordinary Qwen3 vocabulary ids (below the special tokens)
_LO, _HI = 100, 150000
_IM_START, _IM_END, _NL = 151644, 151645, 198


@dataclass
class Request:
    session: str
    prompt: list
    max_tokens: int
    salt: str | None = None
    sent: float | None = None      # when the client sent it and got the reply (concurrent runs)
    done: float | None = None
    slot: int | None = None        # the slot the engine ran it in, where it says (llama-server `id_slot`)


Workload = Generator[Request, list, None]


def dump_workload(path) -> Workload:
    """Every call of a dump, in file order, with its exact prompt ids."""
    from strata_lab.caches.call_ids import calls_from_dump

    for c in calls_from_dump(path):
        yield Request(c.session, c.prompt.tolist(), max(len(c.output), 1), c.cache_salt)


def _msg(rng: random.Random, role_id: int, n: int) -> list:
    return [_IM_START, role_id, _NL] + [rng.randrange(_LO, _HI) for _ in range(n)] + [_IM_END, _NL]


def agent_workload(seed: int = 0, *, sessions: int = 4, turns: int = 6, system_len: int = 300,
                   turn_len: int = 60, max_tokens: int = 12, p_edit: float = 0.1, p_retry: float = 0.1,
                   p_drop: float = 0.1, p_subagent: float = 0.15, salted: bool = True,
                   system_seed: int = 0) -> Workload:
    """Agent sessions in ChatML-shaped ids whose histories hold the engine's replies (see module doc)."""
    rng = random.Random(seed)
    system = _msg(random.Random(system_seed), 8948, system_len)   # shared by every session and client
    hist: dict[str, list] = {}                    # session -> list of messages (id lists)
    left: dict[str, int] = {}
    salt: dict[str, str | None] = {}
    order: list[str] = []
    n_sub = 0
    for i in range(sessions):
        sid = f"s{i}"
        hist[sid] = [system, _msg(rng, 872, turn_len)]
        left[sid] = turns
        salt[sid] = "tenant-b" if salted and i == sessions - 1 else None
        order.append(sid)
    header = [_IM_START, 77091, _NL]
    while order:
        sid = order[rng.randrange(len(order))]     # interleave sessions
        msgs = hist[sid]
        prompt = [t for m in msgs for t in m] + header
        out = yield Request(sid, prompt, max_tokens, salt[sid])
        out = list(out)
        r = rng.random()
        if r < p_retry:                           # the client retries: the same prompt again
            out = yield Request(sid, prompt, max_tokens, salt[sid])
            out = list(out)
        reply = header + out + [_IM_END, _NL]
        if rng.random() >= p_drop:                # else the reply is dropped from the history
            msgs.append(reply)
        if rng.random() < p_edit and len(msgs) > 2:   # the user edits an earlier message
            j = rng.randrange(1, len(msgs))
            m = list(msgs[j])
            if len(m) > 6:
                m[3 + rng.randrange(len(m) - 5)] = rng.randrange(_LO, _HI)
            msgs[j] = m
        msgs.append(_msg(rng, 872, max(1, int(turn_len * rng.uniform(0.3, 1.5)))))
        if rng.random() < p_subagent:                # a subagent on the same system prompt
            n_sub += 1
            sub = f"{sid}.sub{n_sub}"
            hist[sub] = [system, _msg(rng, 872, turn_len // 2 + 1)]
            left[sub] = 2
            salt[sub] = salt[sid]
            order.append(sub)
        left[sid] -= 1
        if left[sid] <= 0:
            order.remove(sid)


def drive(workload: Workload, engine) -> list:
    """Run a workload against `engine(request) -> (output ids, reported cached tokens or None)`; returns
    [(request, output, reported)] in send order."""
    out = []
    try:
        req = next(workload)
        while True:
            gen, reported = engine(req)
            out.append((req, list(gen), reported))
            req = workload.send(list(gen))
    except StopIteration:
        pass
    return out


def fleet_workload(**cfg) -> Workload:
    """A `strata_lab.fleet` trace (sessions interleaved in time order), with its exact prompt ids."""
    from strata_lab.fleet import FleetConfig, generate_fleet

    for rec in generate_fleet(FleetConfig(**cfg)):
        n = len(rec.get("gen_ids") or []) + len(rec.get("drained_ids") or [])
        yield Request(str(rec.get("session", "default")), list(rec["prompt_ids"]), max(n, 1), rec.get("cache_salt"))


def parse_workload(spec: str) -> Workload:
    """`agent[:key=value,...]`, `fleet[:key=value,...]` (FleetConfig fields) or `dump:PATH`.

    >>> next(parse_workload("agent:seed=2,sessions=1,system_len=8")).session
    's0'
    """
    name, _, rest = spec.partition(":")
    if name == "dump":
        if not rest:
            raise ValueError("workload dump:PATH needs a path")
        return dump_workload(rest)
    kw: dict = {}
    for part in filter(None, rest.split(",")):
        k, eq, v = part.partition("=")
        if not eq:
            raise ValueError(f"workload {spec!r}: {part!r} is not key=value")
        try:
            kw[k.strip()] = int(v) if v.strip().lstrip("-").isdigit() else float(v) if "." in v else \
                {"true": True, "false": False}.get(v.strip().lower(), v.strip())
        except ValueError:
            kw[k.strip()] = v.strip()
    if name == "agent":
        return agent_workload(**kw)
    if name == "fleet":
        return fleet_workload(**kw)
    raise ValueError(f"workload must be agent[:k=v,...], fleet[:k=v,...] or dump:PATH, got {spec!r}")


def client_workload(spec: str, k: int, n: int) -> Workload:
    """Client k of n's share of a workload: an agent workload of its own (seed + 1000 k, sessions prefixed
    `c{k}.`; every client shares the system prompt), or the sessions of a dump / fleet trace that hash to k."""
    import zlib

    name, _, rest = spec.partition(":")
    if name == "agent":
        kw = dict(p.split("=", 1) for p in filter(None, rest.split(",")))
        kw["seed"] = str(int(kw.get("seed", 0)) + 1000 * k)
        inner = parse_workload("agent:" + ",".join(f"{a}={b}" for a, b in kw.items()))
        out = None
        try:
            req = inner.send(None)
            while True:
                req.session = f"c{k}.{req.session}"
                out = yield req
                req = inner.send(out)
        except StopIteration:
            return
    for req in parse_workload(spec):
        if zlib.crc32(req.session.encode()) % n == k:
            yield req
