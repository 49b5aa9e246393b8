"""A generator of realistic fleet traces: agent sessions rendered with the real template and tokenizer.

Each session belongs to a tenant (its system prompt follows a preamble and tool list shared by every
tenant) and is pinned to one replica. It runs user turns; a turn is a tool loop (assistant tool calls,
tool results) ending in an answer; replies carry reasoning (`<think>`), which the Qwen3 template strips
from earlier turns once a new user turn arrives (`template_rewrite`); the model sometimes writes a word
in other pieces than BPE would (`retokenized_reply`), stops on a thinking budget with drained ids the
client never sees (`drained_dropped`), retries a call, or the user edits an earlier message
(`history_edit`); agents spawn short subagent sessions. Sessions arrive in bursts (a two-state Markov
modulated Poisson process); lengths are drawn from log-normal distributions set in `FleetConfig`.

Prompts are rendered with `ChatTemplate` and encoded by a per-session `PromptEncoder` (as the server
does), generated ids by the tokenizer: the ids are real, not random.

>>> recs = list(generate_fleet(FleetConfig(sessions=2, turns=2.0, seed=1)))
>>> len(recs) > 2 and all(r["prompt_ids"] for r in recs)
True
"""
from __future__ import annotations

import heapq
import math
import os
import random
from dataclasses import dataclass
from typing import Iterator


__all__ = ["FleetConfig", "generate_fleet", "write_fleet"]

_WORDS = ("the file test function module error value return list result build config server client request "
          "cache token prompt replay session engine model layer state check update fix run import class "
          "path data table index query user agent tool call output input string number line code read write "
          "öğrenci şehir değer çıktı über straße naïve café résumé 数据 模型 缓存 — … → ✓").split()
_CODE = ("def f(x):\n    return x + 1\n", "import os\nprint(os.getcwd())\n", "for i in range(10):\n    pass\n",
         "{\"ok\": true, \"items\": [1, 2, 3]}\n", "assert result == expected, result\n", "x = [a for a in b if a]\n")
_TOOLS = ("read_file", "write_file", "run_tests", "search", "list_dir", "run_shell", "fetch_docs", "edit")


@dataclass(frozen=True)
class FleetConfig:
    """Knobs of a generated fleet. Lengths are medians in words of log-normal draws (sigma 0.8)."""

    sessions: int = 50
    replicas: int = 4
    tenants: int = 5
    duration_s: float = 3600.0
    start_ts: float = 1.7e9
    burstiness: float = 4.0        # arrival rate in a burst / outside one
    turns: float = 4.0             # mean user turns per session (geometric)
    tool_calls: float = 3.0        # mean tool calls per user turn (geometric)
    user_words: int = 40
    tool_words: int = 200
    reasoning_words: int = 60
    answer_words: int = 50
    system_words: int = 400        # the shared preamble; each tenant adds a fifth of it
    p_reasoning: float = 0.8
    p_split_word: float = 0.3      # a reply holds a word written in other pieces than BPE's
    p_budget_stop: float = 0.05    # a reply stopped on a thinking budget, with drained ids
    p_retry: float = 0.03
    p_edit: float = 0.03
    p_subagent: float = 0.1
    think_time_s: float = 20.0     # median gap between a session's calls
    seed: int = 0

    def __post_init__(self):
        for name in ("sessions", "replicas", "tenants"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        for name in ("p_reasoning", "p_split_word", "p_budget_stop", "p_retry", "p_edit", "p_subagent"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], got {v!r}")
        for name in ("duration_s", "burstiness", "turns", "tool_calls", "think_time_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")


class _Text:
    def __init__(self, rng: random.Random):
        self.rng = rng

    def words(self, median: int) -> str:
        rng = self.rng
        n = max(1, int(median * math.exp(rng.gauss(0.0, 0.8))))
        out = []
        for _ in range(n):
            if rng.random() < 0.02:
                out.append("\n" + rng.choice(_CODE))
            else:
                out.append(rng.choice(_WORDS))
        return " ".join(out)


def _arrivals(cfg: FleetConfig, rng: random.Random) -> list[float]:
    """Session start times from a two-state Markov-modulated Poisson process (bursts and lulls)."""
    n = cfg.sessions
    base = n / cfg.duration_s / ((1 + cfg.burstiness) / 2)
    t, burst, out = 0.0, False, []
    while len(out) < n:
        t += rng.expovariate(base * (cfg.burstiness if burst else 1.0))
        if rng.random() < 0.1:
            burst = not burst
        out.append(cfg.start_ts + min(t, cfg.duration_s))
    return out


class _Session:
    """One agent session: yields (ts, record) in time order."""

    def __init__(self, fleet: "_Fleet", sid: str, tenant: int, replica: str, start: float, *, subagent=False):
        self.f, self.sid, self.replica, self.t = fleet, sid, replica, start
        self.rng = random.Random(f"{fleet.cfg.seed}/{sid}")
        self.text = _Text(self.rng)
        sysmsg = fleet.preamble + "\n\n" + fleet.tenant_prompts[tenant]
        if subagent:
            sysmsg = "You are a subagent. " + sysmsg
        self.messages = [{"role": "system", "content": sysmsg}]
        self.tools = fleet.tools
        self.subagent = subagent
        from strata_lab.text.encoder import PromptEncoder

        from strata_lab.replayer.state import SessionState

        self.encoder = PromptEncoder(fleet.tok)
        self.state = SessionState(model="hybrid")
        self.calls = 0

    def _geom(self, mean: float) -> int:
        return 1 + int(math.log(max(self.rng.random(), 1e-12)) / math.log(1 - 1 / (mean + 1))) if mean > 0 else 1

    def _reply_ids(self, text: str) -> list[int]:
        tok, rng = self.f.tok, self.rng
        ids = tok.encode(text)
        if rng.random() < self.f.cfg.p_split_word and len(ids) > 4:
            for _ in range(8):  # a word the model wrote in two pieces
                k = rng.randrange(len(ids) - 1)
                piece = self.f.piece(ids[k])
                if piece is not None and len(piece) >= 4 and piece.strip().isalpha():
                    cut = rng.randrange(2, len(piece) - 1)
                    a, b = tok.encode(piece[:cut]), tok.encode(piece[cut:])
                    if len(a) == 1 and len(b) == 1:
                        ids[k:k + 1] = a + b
                        break
        return ids

    def _call(self, *, answer: bool) -> Iterator[tuple[float, dict]]:
        f, rng, cfg, tok = self.f, self.rng, self.f.cfg, self.f.tok
        prompt_text = f.template.render(self.messages, tools=self.tools)
        prompt = self.encoder.encode(prompt_text)
        reasoning = self.text.words(cfg.reasoning_words) if rng.random() < cfg.p_reasoning else ""
        msg = {"role": "assistant", "content": self.text.words(cfg.answer_words) if answer else ""}
        if reasoning:
            msg["reasoning_content"] = reasoning
        if not answer:
            self.calls_made = getattr(self, "calls_made", 0) + 1
            msg["tool_calls"] = [{"id": f"call_{self.sid}_{self.calls}", "type": "function", "function": {
                "name": rng.choice(_TOOLS), "arguments": {"path": f"src/{rng.choice(_WORDS)}.py"}}}]
        full = f.template.render(self.messages + [msg], tools=self.tools, add_generation_prompt=False)
        gen_text = full[len(prompt_text):].rstrip("\n") if full.startswith(prompt_text) else \
            (f"<think>\n{reasoning}\n</think>\n\n" if reasoning else "") + msg["content"] + "<|im_end|>"
        gen = self._reply_ids(gen_text)
        drained: list[int] = []
        finish = "stop"
        if reasoning and rng.random() < cfg.p_budget_stop:  # a thinking budget cut the reasoning short
            cut = max(1, len(tok.encode("<think>\n" + reasoning)) // 2)
            drained = gen[cut:cut + rng.randrange(1, 4)]
            gen = gen[:cut]
            finish = "budget"
            msg["reasoning_content"] = tok.decode(gen[1:]).lstrip("\n") if len(gen) > 1 else ""
            msg.pop("tool_calls", None)
            msg["content"] = msg["content"] or self.text.words(cfg.answer_words // 2)
        reused = self.state.call(prompt).reused  # what a hybrid engine with turn-start snapshots reuses
        self.state.finish(gen, drained)
        read = len(prompt) - reused
        rec = {"schema": "strata-dump/1", "ts": self.t, "request_id": f"{self.sid}-{self.calls}",
               "session": self.sid, "call": 0, "prompt_ids": prompt, "reused": reused, "gen_ids": gen,
               "drained_ids": drained, "finish": finish,
               "timings": {"prefill_ms": round(0.02 * read + 1.0, 3), "decode_ms": round(8.0 * len(gen), 3)},
               "checkpoints": sorted(self.state.checkpoints), "replica": self.replica}
        self.calls += 1
        yield self.t, rec
        self.messages.append(msg)
        if rng.random() < cfg.p_retry:  # the client retries the same request
            self.t += 1.0
            rec = dict(rec, ts=self.t, request_id=f"{self.sid}-{self.calls}", reused=self.state.call(prompt).reused)
            self.state.finish(gen, drained)
            rec["checkpoints"] = sorted(self.state.checkpoints)
            self.calls += 1
            yield self.t, rec
        self.t += cfg.think_time_s * math.exp(rng.gauss(0.0, 0.8))

    def run(self) -> Iterator[tuple[float, dict]]:
        cfg, rng = self.f.cfg, self.rng
        for turn in range(self._geom(cfg.turns - 1) if not self.subagent else 1):
            if turn and rng.random() < cfg.p_edit:  # the user edits an earlier message
                users = [m for m in self.messages if m["role"] == "user"]
                if users:
                    rng.choice(users)["content"] += " (edited) " + self.text.words(5)
            self.messages.append({"role": "user", "content": self.text.words(cfg.user_words)})
            for _ in range(self._geom(cfg.tool_calls - 1) - 1 if not self.subagent else 2):
                yield from self._call(answer=False)
                last = self.messages[-1]
                for tc in last.get("tool_calls", ()):
                    self.messages.append({"role": "tool", "tool_call_id": tc["id"],
                                          "content": self.text.words(cfg.tool_words)})
                if not self.subagent and rng.random() < cfg.p_subagent:
                    self.f.spawn(self, self.t)
            yield from self._call(answer=True)


class _Fleet:
    def __init__(self, cfg: FleetConfig, tokenizer):
        from strata_lab.text.template import ChatTemplate
        from strata_lab.text.tokenizer import load_tokenizer

        self.cfg = cfg
        self.tok = load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
        self.template = ChatTemplate.from_name("qwen3")
        rng = random.Random(cfg.seed)
        text = _Text(rng)
        self.preamble = "You are a coding agent. " + text.words(cfg.system_words)
        self.tenant_prompts = [f"Tenant {k}: " + text.words(max(cfg.system_words // 5, 1)) for k in range(cfg.tenants)]
        self.tools = [{"type": "function", "function": {
            "name": name, "description": text.words(20),
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}
            for name in _TOOLS]
        self.rng = rng
        self.pending: list = []   # subagents to start
        self.n = 0
        self._pieces: dict = {}

    def piece(self, token_id: int):
        if token_id not in self._pieces:
            try:
                self._pieces[token_id] = self.tok.token_bytes(token_id).decode("utf-8")
            except (ValueError, UnicodeDecodeError):
                self._pieces[token_id] = None
        return self._pieces[token_id]

    def spawn(self, parent: _Session, t: float) -> None:
        self.n += 1
        child = _Session(self, f"{parent.sid}.sub{self.n}", 0, parent.replica, t + 0.5, subagent=True)
        self.pending.append(child)


def generate_fleet(cfg: FleetConfig = FleetConfig(), *, tokenizer="qwen3") -> Iterator[dict]:
    """Dump records of the whole fleet in time order (sessions interleaved, as a server logs them)."""
    fleet = _Fleet(cfg, tokenizer)
    rng = fleet.rng
    starts = _arrivals(cfg, rng)
    heap: list = []
    order = 0

    def push(sess):
        nonlocal order
        it = sess.run()
        for ts, rec in it:
            heapq.heappush(heap, (ts, order, rec, it))
            order += 1
            return

    k = 0
    while k < len(starts) or heap or fleet.pending:
        while fleet.pending:
            push(fleet.pending.pop())
        next_start = starts[k] if k < len(starts) else math.inf
        if heap and heap[0][0] <= next_start:
            _ts, _o, rec, it = heapq.heappop(heap)
            yield rec
            for ts, nxt in it:
                heapq.heappush(heap, (ts, order, nxt, it))
                order += 1
                break
        elif k < len(starts):
            tenant = rng.randrange(cfg.tenants)
            sess = _Session(fleet, f"t{tenant}-s{k}", tenant, f"r{k % cfg.replicas}", starts[k])
            k += 1
            push(sess)
        else:
            break


def write_fleet(path: str | os.PathLike, cfg: FleetConfig = FleetConfig(), *, tokenizer="qwen3",
                progress: bool = False) -> int:
    """Write a generated fleet as a JSONL dump; returns the number of calls."""
    bar = None
    if progress:
        from strata_lab.progress import progress_bar

        bar = progress_bar(desc="fleet", unit="call")
    from strata_lab.dump.writer import write_records

    def counted():
        for rec in generate_fleet(cfg, tokenizer=tokenizer):
            yield rec
            if bar is not None:
                bar.update(1)

    n = write_records(counted(), path)  # the one dump writer: 0600, no symbolic link
    if bar is not None:
        bar.close()
    return n
