"""llama.cpp server slots, as `tools/server/server-context.cpp` does it.

- `slots` slots, each holding one token sequence. Slot choice: among slots with cached tokens, the largest
  `LCP(slot, prompt) / len(prompt)` above `slot_prompt_similarity`, else the least recently used slot.
  A slot that would keep under half of its tokens first saves them to the host prompt cache (`cache_ram_mib`).
- Reuse is token-exact: `n_past = LCP(slot tokens, prompt)`; `cache_reuse` N > 0 also moves matching chunks of
  at least N tokens found later in the cache (KV shift; attention-only models). If `n_past == len(prompt)` one
  token is taken back (`n_past--`: the last token is always evaluated).
- Hybrid / recurrent models cannot cut their state: when `0 < n_past < len(slot tokens)` the newest context
  checkpoint at or before `n_past` is restored, or, with none, "forcing full prompt re-processing"
  (`n_past = 0`). Checkpoints past the new position are erased. While a prompt is read, checkpoints are taken
  `4 + n_ubatch` and `4` tokens before its end (and every `checkpoint_every` tokens), none under or within
  `checkpoint_min_step` of the previous one, at most `ctx_checkpoints` per slot (oldest dropped).
- The host prompt cache keeps evicted slot contents (tokens and checkpoints) up to `cache_ram_mib` MiB, LRU;
  a cached prompt more similar than the chosen slot is loaded into it.

>>> from strata_lab.caches.calls import Call, as_ids
>>> from strata_lab.caches.base import Hint
>>> from strata_lab.caches.presets import parse_engine
>>> m = parse_engine("llama.cpp:slots=2").build()
>>> _ = m.step(Call(0, "a", as_ids([1, 2, 3, 4])), Hint(None, 0, 0))
>>> p = m.step(Call(1, "a", as_ids([1, 2, 3, 4])), Hint(None, 0, 0)); (p.reused, p.unit)   # n_past--
(3, 'slot 0')
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from strata_lab.caches.base import CacheModel, Hint, CachePlan
from strata_lab.caches.calls import Call, lcp
from strata_lab.caches.presets import EnginePreset, _positive_int

__all__ = ["Preset", "Model"]


@dataclass(frozen=True)
class Preset(EnginePreset):
    engine = "llama.cpp"
    slots: int = 1
    slot_prompt_similarity: float = 0.1
    cache_reuse: int = 0
    ctx_checkpoints: int = 8
    n_ubatch: int = 512
    checkpoint_every: int = 0
    checkpoint_min_step: int = 64
    cache_ram_mib: int = 8192

    def __post_init__(self):
        super().__post_init__()
        _positive_int(self, "slots", maximum=4096)  # one object per slot: 10**9 would allocate gigabytes
        for f in ("cache_reuse", "ctx_checkpoints", "checkpoint_every", "checkpoint_min_step"):
            _positive_int(self, f, zero=True)
        _positive_int(self, "n_ubatch")
        if not 0 <= self.slot_prompt_similarity <= 1:
            raise ValueError(f"llama.cpp: slot_prompt_similarity must be in [0, 1], got {self.slot_prompt_similarity!r}")
        if isinstance(self.cache_ram_mib, bool) or not isinstance(self.cache_ram_mib, int) or self.cache_ram_mib < -1:
            raise ValueError(f"llama.cpp: cache_ram_mib must be an int >= -1, got {self.cache_ram_mib!r}")


class _Slot:
    __slots__ = ("id", "tokens", "ckpts", "used", "session", "owner")

    def __init__(self, i):
        self.id = i
        self.tokens = np.zeros(0, np.int32)
        self.ckpts: list = []     # checkpoint positions (n_tokens), oldest first
        self.used = -1            # logical time of last use
        self.session = None       # session whose call last ran here
        self.owner = None         # call index that left the tokens


class Model(CacheModel):
    engine = "llama.cpp"

    def __init__(self, preset: Preset):
        super().__init__(preset)
        self.slots = [_Slot(i) for i in range(preset.slots)]
        self.hybrid = preset.shape.hybrid
        self.clock = 0
        self.ram: "OrderedDict[int, tuple]" = OrderedDict()   # id -> (tokens, ckpts, owner, session)
        self.ram_ids = 0
        self.last_slot: dict = {}   # session -> slot id of its last call

    # -- slot choice -------------------------------------------------------------------------------
    def _choose(self, prompt: np.ndarray):
        best, best_sim, best_lcp = None, -1.0, 0
        sps = self.preset.slot_prompt_similarity
        if sps > 0 and len(prompt):
            for s in self.slots:
                if not len(s.tokens):
                    continue
                n = lcp(s.tokens, prompt)
                sim = n / len(prompt)
                if sim > sps and sim > best_sim:
                    best, best_sim, best_lcp = s, sim, n
        if best is None:
            best = min(self.slots, key=lambda s: s.used)
            best_lcp = lcp(best.tokens, prompt)
        return best, best_lcp

    def _ram_bytes(self, n_tokens: int, n_ckpts: int) -> int:
        sh = self.preset.shape
        return n_tokens * sh.kv_bytes_per_token + n_ckpts * sh.state_bytes

    def _save_to_ram(self, slot: _Slot):
        if self.preset.cache_ram_mib == 0 or not len(slot.tokens):
            return
        self.ram_ids += 1
        self.ram[self.ram_ids] = (slot.tokens, list(slot.ckpts), slot.owner, slot.session)
        cap = self.preset.cache_ram_mib
        if cap > 0:
            limit = cap * 2**20
            while self.ram and sum(self._ram_bytes(len(t), len(c)) for t, c, _, _ in self.ram.values()) > limit:
                self.ram.popitem(last=False)
                self.evictions += 1

    # -- the call ----------------------------------------------------------------------------------
    def plan(self, call: Call, hint: Hint) -> CachePlan:
        self.clock += 1
        prompt, P = call.prompt, call.prompt_len
        slot, n_past = self._choose(prompt)
        f_keep = n_past / len(slot.tokens) if len(slot.tokens) else 1.0
        unit_from = "slot"
        if f_keep < 0.5:
            self._save_to_ram(slot)
        # the host prompt cache: load a cached prompt that matches better than the slot does
        best, best_n = None, n_past
        for rid, (toks, _, _, _) in self.ram.items():
            n = lcp(toks, prompt)
            if n > best_n:
                best, best_n = rid, n
        if best is not None:
            toks, ckpts, owner, sess = self.ram.pop(best)
            slot.tokens, slot.ckpts, slot.owner, slot.session = toks, ckpts, owner, sess
            n_past, unit_from = best_n, "ram"
        cached = len(slot.tokens)
        shifted = 0
        if self.preset.cache_reuse > 0 and not self.hybrid and n_past < P:
            shifted = self._chunk_reuse(slot.tokens, prompt, n_past)
        full = n_past + shifted
        if full >= P and P:
            if shifted:
                shifted -= 1
            else:
                n_past -= 1  # "need to evaluate at least 1 token"
        restored = None
        cause = None
        if self.hybrid and 0 < n_past < cached and not shifted:
            usable = [c for c in slot.ckpts if c <= n_past]
            if usable:
                restored = usable[-1]
                n_past = restored
            else:
                n_past = 0  # "forcing full prompt re-processing due to lack of cache data"
                cause = "no_state_checkpoint"
        reused = n_past + shifted
        prev_slot = self.last_slot.get(call.session)
        if reused < hint.exact and cause is None:
            if prev_slot is not None and self.slots[prev_slot].session != call.session:
                cause = "slot_stolen"
            elif self.hybrid and restored is not None:
                cause = "no_state_checkpoint"
            else:
                cause = "not_cached"
        if reused:
            unit = f"{unit_from} {slot.id}" + (f" ckpt@{restored}" if restored is not None else "") \
                + (f" +{shifted} shifted" if shifted else "")
        else:
            unit = ""
        return CachePlan(reused, unit=unit, source=slot.owner if reused else None, cause=cause,
                    state=(slot, n_past))

    def _chunk_reuse(self, cache: np.ndarray, prompt: np.ndarray, n_past: int) -> int:
        """`--cache-reuse N`: walk both from n_past; a matching run of >= N ids is shifted into place, else
        skip one cached id. Returns the ids gained."""
        n_min = self.preset.cache_reuse
        head_c = head_p = n_past
        got = 0
        while head_c < len(cache) and head_p < len(prompt):
            n = lcp(cache[head_c:], prompt[head_p:])
            if n >= n_min:
                got += n
                head_c += n
                head_p += n
            else:
                head_c += 1
        return got

    def admit(self, call: Call, plan: CachePlan) -> None:
        slot, n_past = plan.state
        P = call.prompt_len
        pre = self.preset
        kept = [c for c in slot.ckpts if c <= n_past]  # erase invalidated checkpoints
        if self.hybrid:
            cands = []
            if pre.checkpoint_every:
                cands += list(range(n_past + pre.checkpoint_every, P, pre.checkpoint_every))
            cands += [P - 4 - pre.n_ubatch, P - 4]
            for c in sorted(set(cands)):
                if c <= n_past or c < pre.checkpoint_min_step:
                    continue
                if kept and c - kept[-1] < pre.checkpoint_min_step:
                    continue
                kept.append(c)
                while len(kept) > pre.ctx_checkpoints:
                    kept.pop(0)
        slot.ckpts = kept
        out = call.output
        slot.tokens = np.concatenate([call.prompt, out[:-1]]) if len(out) > 1 else call.prompt
        slot.used = self.clock
        slot.session = call.session
        slot.owner = call.index
        self.last_slot[call.session] = slot.id
