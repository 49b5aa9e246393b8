"""llama.cpp server slots, as `tools/server/server-context.cpp` and `server-task.cpp` (llama.cpp 0c1e570, the
copy vendored by llama-cpp-python 0.3.36) do it.

- `slots` slots (`-np`; auto = 4 with a unified KV cache), each holding one token sequence. Slot choice
  (`get_available_slot`): among idle slots with cached tokens, the largest `LCP(slot, prompt) / len(prompt)`
  above `slot_prompt_similarity` (first slot on ties); else the least recently used slot (the last of the
  least recent on ties: `if (!ret || slot.t_last_used <= t_last)`).
- The host prompt cache (`--cache-ram` MiB, 0: off, -1: no byte limit; always at most n_ctx tokens) is
  consulted only when the slot was picked by LRU or by similarity keeping under half of its tokens
  (`update_cache`): the slot's tokens are saved (`prompt_save`: not when a cached prompt already contains
  them; cached prompts they contain are dropped; oldest entries go to make room), then the cached prompt
  that beats the slot on both `f_keep` (LCP / its length) and `f_sim` (LCP / prompt length), walking oldest
  first and skipping those keeping under 25 % of themselves, is loaded into the slot (`server_prompt_cache::
  load`). `--cache-idle-slots` (default on, needs the prompt cache) saves every other idle slot each task and,
  with a unified KV cache, clears it. A saved prompt costs what `llama_state_seq_get_size` says: its K and V
  rows, 12 bytes of cell metadata per token and a small header (`_entry_bytes`); the byte limit therefore
  needs the served model's shape (`model=`; `tiny-qwen3` is the GGUF the validation harness serves).
- Context: `-c` is rounded up to a multiple of 256 cells, and without a unified KV cache each slot's share
  is rounded up to 256 again (`n_ctx`, `n_ctx_slot`). A prompt of `n_ctx_slot` or more is refused (HTTP
  400; 0: no limit): nothing reused, the slot's tokens stay. A unified cache is one pool of `n_ctx` cells:
  when a call needs more cells than the idle slots leave free, the server clears idle slots one at a time
  in slot order, not LRU, until it fits (`try_clear_idle_slots`; only seen with `--no-cache-idle-slots`,
  which leaves the idle slots' tokens in the pool). Restoring a cached prompt needs a free cell per id too;
  short of them the restore fails, the entry stays cached and the slot is cleared.
- Reuse is token-exact: `n_past = LCP(slot tokens, prompt)`; `cache_reuse` N > 0 also moves matching chunks of
  at least N tokens found later in the cache (KV shift; attention-only models). If `n_past == len(prompt)` one
  token is taken back (`n_past--`: the last token is always evaluated).
- Hybrid / recurrent models cannot cut their state: when `0 < n_past < len(slot tokens)` the newest context
  checkpoint at or before `n_past` is restored, or, with none, "forcing full prompt re-processing"
  (`n_past = 0`). Checkpoints past the new position are erased (`pos_max > pos_next`; a checkpoint taken at
  n_tokens c holds pos_max c - 1). A prompt is read in batches that start at `n_past` and stop
  `4 + n_ubatch` and `4` ids before its end (and every `n_batch` = 2048); a checkpoint of the state *before*
  a batch is taken when the batch starts past 0 (memory not empty) and ends within `n_ubatch` of the prompt
  end or is the last one, whatever `checkpoint_min_step` says: `P - 4 - n_ubatch`, `P - 4`, and `n_past`
  itself when the cached prefix already reaches past `P - 4 - n_ubatch`. Periodic ones (`checkpoint_every`,
  older presets) none under or within `checkpoint_min_step` of the previous one. `create_checkpoint` keeps
  at most `ctx_checkpoints` per slot: when the list is full it first drops checkpoints of *earlier* calls
  within `checkpoint_min_step` of the previous kept one (so the oldest survives), then the oldest, and a
  checkpoint at the same position is superseded. Not modelled: checkpoints at user-message starts
  (`message_spans`, only when a request sends `message_delimiters`; `/completion` with ids has none).
- Busy slots: a call that carries its send and reply times (`ts`, `done_ts`) keeps its slot busy until its
  reply, and a slot in use is never picked or saved as idle; when all are busy the call waits for the
  first to free. The slot's LRU time is when its call ended (`t_last_used` is set in `release()`). Untimed
  calls (every sequential replay) see every slot idle. Timed and untimed calls cannot be mixed, and timed
  calls must come in send order (both are errors naming the call).

The rules above, from the source:

    if (f_keep < 0.5f) { update_cache = true; }            // get_available_slot, picked by similarity
    ...
    SLT_INF(*ret, "selected slot by LRU, t_last = %" PRId64 "\n", t_last);
    update_cache = true;
    ...
    ret->prompt_save(*prompt_cache);
    if (!ret->prompt_load(*prompt_cache, task.tokens)) { ret->prompt_clear(); }
    prompt_cache->update();

    if (cur_lcp_len == (int) prompt.tokens.size()) {       // server_prompt_cache::alloc
        SRV_TRC("%s", " - prompt is already in the cache, skipping\n");
    ...
    // remove any cached prompts that are fully contained in the current prompt

    // don't trash large prompts                            // server_prompt_cache::load
    if (f_keep_cur < 0.25f) { continue; }
    if (f_keep_best < f_keep_cur && f_sim_best < f_sim_cur) { ... it_best = it; }

    if (slot.task->n_tokens() >= slot.n_ctx) {              // update_slots
        send_error(slot, string_format("request (%d tokens) exceeds the available context size ...

    // update_slots, reading a prompt (0c1e570):
    static const int checkpoint_offsets[] = {4 + n_ubatch, 4};
    const bool near_prompt_end = slot.task->n_tokens() < slot.prompt.n_tokens() + n_ubatch;
    if (slot.prompt.n_tokens() == slot.task->n_tokens()) { ... } else {
        // skip ordinary mid-prompt checkpoints, unless the batch starts a user message or we are near the end
        if (!is_user_start && !near_prompt_end) { do_checkpoint = false; } }
    if (do_checkpoint && pos_min < 0) { do_checkpoint = false; }             // nothing to checkpoint yet
    do_checkpoint = do_checkpoint && (slot.prompt.checkpoints.empty() ||
            is_last_user_message || near_prompt_end ||
            n_tokens_start > slot.prompt.checkpoints.back().n_tokens + params_base.checkpoint_min_step);

    // create_checkpoint: "evict checkpoints within min-step of a previous checkpoint, unless they were
    // created by the current task; only when the list is full"
    for (auto it = slot.prompt.checkpoints.begin();
            slot.prompt.checkpoints.size() + 1 >= (size_t) params_base.n_ctx_checkpoints && ...; ) {
        if (it->id_task != id_task && last >= 0 && it->n_tokens <= last + params_base.checkpoint_min_step) {
            it = slot.prompt.checkpoints.erase(it); continue; }
        last = it->n_tokens; ++it; }
    while (slot.prompt.checkpoints.size() >= (size_t) params_base.n_ctx_checkpoints) {
        slot.prompt.checkpoints.erase(slot.prompt.checkpoints.begin()); }
    // replace an existing checkpoint at the same n_tokens instead of appending a duplicate

    for (server_slot & slot : slots) {                      // get_available_slot
        if (slot.is_processing()) { continue; } ...
    void release() { ... t_last_used = ggml_time_us(); state = SLOT_STATE_IDLE; ...

    cparams.n_ctx = GGML_PAD(cparams.n_ctx, 256);          // llama_context (src/llama-context.cpp)
    if (cparams.kv_unified) { cparams.n_ctx_seq = cparams.n_ctx; } else {
        cparams.n_ctx_seq = GGML_PAD(cparams.n_ctx / cparams.n_seq_max, 256); ...
        cparams.n_ctx = cparams.n_ctx_seq * cparams.n_seq_max; }

    sinfo = find_slot(ubatch, false);                      // llama_kv_cache::state_read_meta (a restore)
    if (sinfo.empty()) { LLAMA_LOG_ERROR("%s: failed to find %d available cells in kv cache\n", ...); return false; }

    // update_slots, llama_decode found no room: "retry with half the batch size to try to find a free slot"
    if (!try_clear_idle_slots()) { n_batch /= 2; }
    bool try_clear_idle_slots() { if (!params_base.kv_unified) { return res; }
        for (auto & slot : slots) { if (slot.is_processing()) { continue; }
            if (slot.prompt.n_tokens() > 0) { slot.prompt_clear(); res = true; break; } } ...

    if (params_base.cache_idle_slots) {                     // process_single_task, after launching
        for (auto & slot : slots) { if (!slot.is_processing()) {
            if (slot.prompt_save(*prompt_cache)) { prompt_cache->update(); }
            if (params_base.kv_unified) { slot.prompt_clear(); } } } }

Why one module: slot choice, the host prompt cache and the checkpoint list are one server's state, changed
together by each task (`get_available_slot` saves and loads the prompt cache, the checkpoint list travels
with a saved prompt); the quoted source lines above are the model's specification, kept beside it.

`llama.cpp:args=-np 4 -c 8192 --cache-reuse 256` configures the model from the server's command line
(`common/arg.cpp` names and defaults: -np auto = 4 slots + unified KV, -c 0 = the model's context,
--cache-ram 8192, -sps 0.1, --cache-idle-slots on, --ctx-checkpoints 32, -cms 8192, -ub 512).

>>> from strata_lab.caches.call_ids import Call, as_ids
>>> from strata_lab.caches.base import Hint
>>> from strata_lab.caches.presets import parse_engine
>>> m = parse_engine("llama.cpp:slots=2").build()
>>> _ = m.step(Call(0, "a", as_ids([1, 2, 3, 4])), Hint(None, 0, 0))
>>> p = m.step(Call(1, "a", as_ids([1, 2, 3, 4])), Hint(None, 0, 0)); (p.reused, p.unit)   # n_past--
(3, 'slot 1')
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from strata_lab.caches.base import CacheModel, Hint, CachePlan
from strata_lab.caches.call_ids import Call, lcp
from strata_lab.caches.presets import EnginePreset, _positive_int

__all__ = ["Preset", "Model"]


def _pad256(n: int) -> int:
    """`GGML_PAD(n, 256)`: n rounded up to a multiple of 256."""
    return -(-n // 256) * 256


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
    ctx_size: int = 0              # -c: the whole KV cache in tokens (0: the model's context, no limit here)
    kv_unified: bool = False       # -kvu: one KV buffer for all slots (each slot may use all of ctx_size)
    cache_idle_slots: bool = False  # --cache-idle-slots: idle slots saved to the prompt cache each task

    def __post_init__(self):
        super().__post_init__()
        _positive_int(self, "slots", maximum=4096)  # one object per slot: 10**9 would allocate gigabytes
        for f in ("cache_reuse", "ctx_checkpoints", "checkpoint_every", "checkpoint_min_step", "ctx_size"):
            _positive_int(self, f, zero=True)
        _positive_int(self, "n_ubatch")
        if not 0 <= self.slot_prompt_similarity <= 1:
            raise ValueError(f"llama.cpp: slot_prompt_similarity must be in [0, 1], got {self.slot_prompt_similarity!r}")
        if isinstance(self.cache_ram_mib, bool) or not isinstance(self.cache_ram_mib, int) or self.cache_ram_mib < -1:
            raise ValueError(f"llama.cpp: cache_ram_mib must be an int >= -1, got {self.cache_ram_mib!r}")
        if self.ctx_size and not self.kv_unified and _pad256(self.ctx_size) // self.slots == 0:
            raise ValueError(f"llama.cpp: -c {self.ctx_size} over {self.slots} slots leaves each slot no context "
                             "(llama_context refuses n_ctx_seq == 0)")

    @property
    def n_ctx(self) -> int:
        """KV cells in all (0: the model's own context, no limit here). `-c` is rounded up to a multiple of 256;
        split over the slots, each slot's share is rounded up to 256 again and the total follows it
        (`llama_context` constructor, src/llama-context.cpp at 0c1e570: `GGML_PAD(cparams.n_ctx, 256)`,
        `n_ctx_seq = GGML_PAD(n_ctx / n_seq_max, 256)`, `n_ctx = n_ctx_seq * n_seq_max`).

        >>> Preset(ctx_size=600).n_ctx, Preset(ctx_size=16, slots=2).n_ctx, Preset(ctx_size=8192, slots=4).n_ctx
        (768, 512, 8192)
        """
        if not self.ctx_size:
            return 0
        n = _pad256(self.ctx_size)
        return n if self.kv_unified else _pad256(n // self.slots) * self.slots

    @property
    def n_ctx_slot(self) -> int:
        """Tokens one slot may hold (0: no limit): all of `n_ctx` when the KV cache is unified, else its share."""
        return self.n_ctx if self.kv_unified else self.n_ctx // self.slots


# `llama-server` flags (common/arg.cpp at 0c1e570) -> preset fields; flags that change nothing in the prompt
# cache are listed with their arity; any other flag is refused by name.
_FLAGS = {("-np", "--parallel"): ("slots", int), ("-c", "--ctx-size"): ("ctx_size", int),
          ("--cache-reuse",): ("cache_reuse", int), ("-sps", "--slot-prompt-similarity"): ("slot_prompt_similarity", float),
          ("-cram", "--cache-ram"): ("cache_ram_mib", int), ("-ub", "--ubatch-size"): ("n_ubatch", int),
          ("-ctxcp", "--ctx-checkpoints", "--swa-checkpoints"): ("ctx_checkpoints", int),
          ("-cms", "--checkpoint-min-step"): ("checkpoint_min_step", int)}
_BOOLS = {"-kvu": ("kv_unified", True), "--kv-unified": ("kv_unified", True), "-no-kvu": ("kv_unified", False),
          "--no-kv-unified": ("kv_unified", False), "--cache-idle-slots": ("cache_idle_slots", True),
          "--no-cache-idle-slots": ("cache_idle_slots", False)}
_NEUTRAL = {"-m": 1, "--model": 1, "--host": 1, "--port": 1, "-t": 1, "--threads": 1, "-tb": 1, "--threads-batch": 1,
            "-n": 1, "--predict": 1, "--n-predict": 1, "-s": 1, "--seed": 1, "-ngl": 1, "--n-gpu-layers": 1,
            "--metrics": 0, "--no-warmup": 0, "-b": 1, "--batch-size": 1, "--log-file": 1, "-v": 0, "--verbose": 0,
            "--no-webui": 0, "--jinja": 0, "-a": 1, "--alias": 1, "--log-disable": 0, "--slots": 0, "--no-mmap": 0}
_BY_FLAG = {f: v for names, v in _FLAGS.items() for f in names}

# the server's own defaults (common.h / server.cpp at 0c1e570) for every flag an args= spec does not give
args_defaults = {"slots": 4, "kv_unified": True, "ctx_size": 0, "cache_reuse": 0, "slot_prompt_similarity": 0.1,
                 "cache_ram_mib": 8192, "n_ubatch": 512, "ctx_checkpoints": 32, "checkpoint_min_step": 8192,
                 "checkpoint_every": 0, "cache_idle_slots": True}


def parse_args(argv: list, preset) -> dict:
    """Preset fields from a `llama-server` command line; `-np -1` (auto) is 4 slots with a unified KV cache,
    an explicit `-np N` keeps the KV cache per slot unless `-kvu` is given (server.cpp).

    >>> d = parse_args(["-np", "4", "-c", "8192", "--cache-reuse", "256"], None)
    >>> d["slots"], d["ctx_size"], d["cache_reuse"], d["kv_unified"]
    (4, 8192, 256, False)
    """
    out: dict = {}
    unified = None
    i = 0
    while i < len(argv):
        a = argv[i]
        flag, eq, val = a.partition("=")
        if flag in _BY_FLAG:
            if not eq:
                if i + 1 >= len(argv):
                    raise ValueError(f"llama.cpp: args: {flag} expects a value")
                i += 1
                val = argv[i]
            field, kind = _BY_FLAG[flag]
            try:
                out[field] = kind(val)
            except ValueError:
                raise ValueError(f"llama.cpp: args: {flag} expects {'an integer' if kind is int else 'a number'}, "
                                 f"got {val!r}") from None
        elif a in _BOOLS:
            field, v = _BOOLS[a]
            if field == "kv_unified":
                unified = v
            out[field] = v
        elif flag in _NEUTRAL:
            i += 0 if eq else _NEUTRAL[flag]
        else:
            known = sorted(_BY_FLAG) + sorted(_BOOLS)
            raise ValueError(f"llama.cpp: args: unknown or unsupported flag {a!r} (supported: {', '.join(known)}; "
                             f"no effect on the cache: {', '.join(sorted(_NEUTRAL))})")
        i += 1
    n = out.get("slots")
    if n is not None and n < 0:          # -np -1: auto
        out["slots"] = 4
        out.setdefault("kv_unified", True)
    elif n is not None and unified is None:
        out["kv_unified"] = False         # params.kv_unified defaults to false; only auto turns it on
    if out.get("slots") == 0:
        raise ValueError("llama.cpp: args: error: invalid value for n_parallel (-np 0)")
    return out


class _Slot:
    __slots__ = ("id", "tokens", "ckpts", "used", "session", "owner", "busy_until")

    def __init__(self, i):
        self.id = i
        self.tokens = np.zeros(0, np.int32)
        self.ckpts: list = []     # checkpoints (n_tokens, index of the call that took it), oldest first
        self.used = -1            # logical time of last use (t_last_used)
        self.session = None       # session whose call last ran here
        self.owner = None         # call index that left the tokens
        self.busy_until = None    # done_ts of the call running here (timed calls): busy before that


class Model(CacheModel):
    engine = "llama.cpp"

    def __init__(self, preset: Preset):
        super().__init__(preset)
        self.slots = [_Slot(i) for i in range(preset.slots)]
        self.hybrid = preset.shape.hybrid
        self.clock = 0
        self.timed = None            # whether the calls carry ts + done_ts (busy slots); set by the first call
        self.last_ts = float("-inf")
        self.ram: list = []          # the host prompt cache, oldest first: [tokens, ckpts, owner, session]
        self.last_slot: dict = {}    # session -> slot id of its last call
        # the prompt cache's token cap: n_ctx (`server_prompt_cache(cache_ram_mib, n_ctx)` with n_ctx =
        # llama_n_ctx, the padded whole context; unlimited here when -c 0 leaves it to the model)
        self.ram_tokens = preset.n_ctx

    # -- slot choice -------------------------------------------------------------------------------
    def _idle(self, now):
        """The slots not processing a call at time `now` (None: untimed calls, every slot is idle)."""
        if now is None:
            return self.slots
        return [s for s in self.slots if s.busy_until is None or s.busy_until <= now]

    def _choose(self, prompt: np.ndarray, now=None):
        """(slot, lcp, picked by LRU), among the idle slots (`if (slot.is_processing()) continue;`)."""
        best, best_sim, best_lcp = None, 0.0, 0
        sps = self.preset.slot_prompt_similarity
        idle = self._idle(now)
        if sps > 0 and len(prompt):
            for s in idle:
                if not len(s.tokens):
                    continue
                n = lcp(s.tokens, prompt)
                sim = n / len(prompt)
                if sim > best_sim and sim > sps:
                    best, best_sim, best_lcp = s, sim, n
        if best is not None:
            return best, best_lcp, False
        lru = None
        for s in idle:
            if lru is None or s.used <= lru.used:
                lru = s
        return lru, lcp(lru.tokens, prompt), True

    def _entry_bytes(self, n_tokens: int, n_ckpts: int) -> int:
        """What `prompt_save` stores: `llama_state_seq_get_size_ext` of the slot's sequence (+ checkpoints).

        The KV part is `llama_kv_cache::state_write` (src/llama-kv-cache.cpp at 0c1e570) for one sequence: the
        stream count and a cell count per stream (4 bytes each; one stream when unified, else one per slot);
        per cell its position, its sequence count and its one sequence id (`state_write_meta`: 12 bytes); the
        V-transposed flag and the layer count (8 bytes); per attention layer a type and a row size for K and
        for V (12 bytes each); then the K and V rows themselves. Recurrent state (hybrid models): one state
        per saved prompt and per checkpoint."""
        sh, pre = self.preset.shape, self.preset
        n_stream = 1 if pre.kv_unified else pre.slots
        kv = 4 + 4 * n_stream + 8 + 24 * sh.attention_layers + n_tokens * (12 + sh.kv_bytes_per_token)
        return kv + (1 + n_ckpts) * sh.state_bytes

    def _ram_limit(self) -> int:
        return self.preset.cache_ram_mib * 2**20 if self.preset.cache_ram_mib > 0 else 0

    def _save(self, slot: _Slot) -> bool:
        """`prompt_save` + `server_prompt_cache::alloc`."""
        toks = slot.tokens
        if not len(toks):
            return False
        if any(lcp(e[0], toks) == len(toks) for e in self.ram):
            return False                               # already contained in a cached prompt
        new = self._entry_bytes(len(toks), len(slot.ckpts))
        limit = self._ram_limit()
        if limit and new > limit:
            return False
        self.ram = [e for e in self.ram if lcp(e[0], toks) != len(e[0])]   # prefixes of it are dropped
        if limit:
            while self.ram and self._ram_size() + new > limit:
                self.ram.pop(0)
                self.evictions += 1
        self.ram.append([toks, list(slot.ckpts), slot.owner, slot.session])
        return True

    def _ram_size(self) -> int:
        return sum(self._entry_bytes(len(t), len(c)) for t, c, _, _ in self.ram)

    def _update(self):
        """`server_prompt_cache::update`: oldest entries go over the byte limit, then over the token limit."""
        limit = self._ram_limit()
        if limit:
            while self.ram and self._ram_size() > limit:
                self.ram.pop(0)
                self.evictions += 1
        if self.ram_tokens:
            # the byte limit raises the token cap by the average entry's bytes per token, in C++ float
            n_tok = sum(len(e[0]) for e in self.ram)
            per_tok = max(np.float32(1.0), np.float32(self._ram_size()) / np.float32(max(1, n_tok)))
            cap = max(self.ram_tokens, int(np.float32(limit) / per_tok)) if limit else self.ram_tokens
            while self.ram and sum(len(e[0]) for e in self.ram) > cap:
                self.ram.pop(0)
                self.evictions += 1

    def _load(self, slot: _Slot, prompt: np.ndarray) -> bool:
        """`server_prompt_cache::load`: the cached prompt beating the slot on f_keep and f_sim, oldest first."""
        n0 = lcp(slot.tokens, prompt)
        keep_best = n0 / len(slot.tokens) if len(slot.tokens) else -1.0
        sim_best = n0 / len(prompt) if len(prompt) else 0.0
        best = None
        for j, e in enumerate(self.ram):
            n = lcp(e[0], prompt)
            keep, sim = n / len(e[0]), n / len(prompt)
            if keep < 0.25:
                continue
            if keep_best < keep and sim_best < sim:
                keep_best, sim_best, best = keep, sim, j
        if best is None:
            return False
        pre = self.preset
        if pre.kv_unified and pre.n_ctx:
            # restoring drops the slot's own cells, then needs a free cell per cached id in the shared pool; short
            # of them it fails ("failed to find %d available cells in kv cache", `state_read_meta`): the entry
            # stays cached and the server clears the slot (`if (!ret->prompt_load(...)) { ret->prompt_clear(); }`)
            others = sum(len(s.tokens) for s in self.slots if s is not slot)
            if len(self.ram[best][0]) > pre.n_ctx - others:
                slot.tokens, slot.ckpts = np.zeros(0, np.int32), []
                return False
        toks, ckpts, owner, sess = self.ram.pop(best)
        slot.tokens, slot.ckpts, slot.owner, slot.session = toks, ckpts, owner, sess
        return True

    # -- the call ----------------------------------------------------------------------------------
    def plan(self, call: Call, hint: Hint) -> CachePlan:
        pre = self.preset
        self.clock += 1
        prompt, P = call.prompt, call.prompt_len
        now = call.ts if call.ts is not None and call.done_ts is not None else None
        timed = now is not None
        if self.timed is None:
            self.timed = timed
        elif self.timed != timed:   # slot times and turn numbers cannot be mixed
            raise ValueError(f"llama.cpp: call {call.index} {'has' if timed else 'lacks'} ts + done_ts but earlier "
                             "calls do not: busy slots need every call timed (or none)")
        if timed and now < self.last_ts:
            raise ValueError(f"llama.cpp: call {call.index} was sent (ts {now}) before the call replayed before it "
                             f"(ts {self.last_ts}): timed calls must be replayed in send order")
        if timed:
            self.last_ts = now
        if now is not None and not self._idle(now):   # every slot busy: the task waits for the first free one
            now = min(s.busy_until for s in self.slots)
        slot, n_past, by_lru = self._choose(prompt, now)
        # f_keep as the server computes it, in float: (f_sim_best * prompt length) / slot length
        f32 = np.float32
        f_keep = (f32(n_past) / f32(P) * f32(P)) / f32(len(slot.tokens)) if len(slot.tokens) and P else 1.0
        unit_from = "slot"
        cache_on = pre.cache_ram_mib != 0
        if cache_on and (by_lru or f_keep < 0.5):
            self._save(slot)
            if self._load(slot, prompt):
                unit_from = "ram"
            self._update()
        if cache_on and pre.cache_idle_slots:   # every other idle slot saved (and cleared when unified)
            for s in self._idle(now):
                if s is slot:
                    continue
                if self._save(s):
                    self._update()
                if pre.kv_unified:
                    s.tokens, s.ckpts = np.zeros(0, np.int32), []
        n_ctx = pre.n_ctx_slot
        if n_ctx and P >= n_ctx:   # "request (%d tokens) exceeds the available context size"
            slot.used = self._release_time(call)
            return CachePlan(0, cause="refused", state=None)
        n_past = lcp(slot.tokens, prompt)
        cached = len(slot.tokens)
        shifted = 0
        if pre.cache_reuse > 0 and not self.hybrid and n_past < P:
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
            usable = [c for c, _task in slot.ckpts if c <= n_past]
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

    def _create_checkpoint(self, kept: list, c: int, task: int) -> list:
        """`create_checkpoint` (0c1e570): when the list is full, first drop checkpoints of earlier tasks within
        `checkpoint_min_step` of the previous kept one (so the oldest survives, not the newest), then the oldest
        while still full; a checkpoint at the same position is superseded."""
        pre = self.preset
        n_max = pre.ctx_checkpoints
        if len(kept) + 1 >= n_max:
            pruned, last = [], -1
            for n_tok, tid in kept:
                if tid != task and last >= 0 and n_tok <= last + pre.checkpoint_min_step:
                    continue
                last = n_tok
                pruned.append((n_tok, tid))
            kept = pruned
        while kept and len(kept) >= n_max:
            kept = kept[1:]
        kept = [ck for ck in kept if ck[0] != c]
        kept.append((c, task))
        return kept

    def _make_room(self, slot: _Slot, now) -> None:
        """A unified KV cache is one pool of `n_ctx` cells for every slot. When a batch finds too few free cells
        (`llama_decode` returns 1) the server clears the first idle slot holding tokens, in slot order, and
        tries again (`try_clear_idle_slots` in server-context.cpp at 0c1e570: one slot per failed batch; not
        saved to the host prompt cache). The slot ends a call holding its prompt and every generated id but the
        last, and cells are only added on the way, so the slots cleared are the fewest in slot order that leave
        room for that. Without a unified cache each slot has its own `n_ctx_slot` cells and never overflows
        (a longer prompt is refused); with `--cache-idle-slots` the idle slots were cleared already."""
        pre = self.preset
        if not (pre.kv_unified and pre.n_ctx):
            return
        used = sum(len(s.tokens) for s in self.slots)
        for s in self._idle(now):
            if used <= pre.n_ctx:
                return
            if s is not slot and len(s.tokens):
                used -= len(s.tokens)
                s.tokens, s.ckpts = np.zeros(0, np.int32), []
                self.evictions += 1

    def _release_time(self, call: Call):
        """`t_last_used = ggml_time_us()` in `release()`: when the call ended (timed calls), else its turn."""
        return call.done_ts if call.ts is not None and call.done_ts is not None else self.clock

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
        if plan.state is None:   # refused: the slot keeps what it held
            return
        slot, n_past = plan.state
        P = call.prompt_len
        pre = self.preset
        # "erase any checkpoints with pos_max > pos_next": a checkpoint at n_tokens c holds pos_max = c - 1
        kept = [ck for ck in slot.ckpts if ck[0] <= n_past + 1]
        if self.hybrid and pre.ctx_checkpoints:   # --ctx-checkpoints 0: "context checkpoints disabled"
            # the prompt is read in batches that start at n_past and at 4 + n_ubatch and 4 ids before its end
            # (capped at n_batch = 2048); a checkpoint is taken before a batch that starts past 0 (memory not
            # empty) and ends within n_ubatch of the prompt end, or is the last one: min-step never applies there
            ends = [x for x in (P - 4 - pre.n_ubatch, P - 4) if x > n_past]
            starts = list(range(n_past, ends[0] if ends else P, 2048)) + ends
            near = set()
            for s0, e0 in zip(starts, starts[1:] + [P]):
                if s0 > 0 and (e0 == P or P < e0 + pre.n_ubatch):
                    near.add(s0)
            cands = set(near)
            if pre.checkpoint_every:
                cands |= set(range(n_past + pre.checkpoint_every, P, pre.checkpoint_every))
            for c in sorted(cands):
                if c < n_past or c <= 0:
                    continue
                if c not in near and (c < pre.checkpoint_min_step or
                                      (kept and c - kept[-1][0] < pre.checkpoint_min_step)):
                    continue
                kept = self._create_checkpoint(kept, c, call.index)
        slot.ckpts = kept
        out = call.output
        slot.tokens = np.concatenate([call.prompt, out[:-1]]) if len(out) > 1 else call.prompt
        self._make_room(slot, call.ts if call.ts is not None and call.done_ts is not None else None)
        slot.used = self._release_time(call)
        slot.busy_until = call.done_ts if call.ts is not None else None
        slot.session = call.session
        slot.owner = call.index
        self.last_slot[call.session] = slot.id
