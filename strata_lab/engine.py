"""Python face of the C++ engine: Engine, Session, Stream, Sampling (its checkpoint policy is
`strata_lab.rules.CheckpointPolicy`).

A Session follows Contract 1 (docs/CONTRACTS.md). Its reuse rule, which the replay models exactly:

* ``lcp`` = longest common prefix of the prompt and the held ids.
* If the prompt equals the held ids, ``reused = len(prompt)``: nothing is read, the logits the session
  saved after its last id are used (a session always keeps them).
* Else if the prompt is a prefix of the held ids ending exactly on a checkpoint, ``reused = len(prompt)``:
  nothing is read; that snapshot is restored and its saved logits used (``used_saved_logits``,
  ``restored_checkpoint == len(prompt)``). Every snapshot keeps the logits after its last id, so a retry
  of the same prompt after a reply resumes from the turn start on any model.
* Otherwise ``l = min(lcp, len(prompt) - 1)``: at least the last prompt id is read, for its logits.
  Attention-only models (Qwen3): ``reused = l``. Hybrid models: ``reused = l`` if ``l == len(held)``,
  else the largest checkpoint ``c <= l`` (0 if none), whose snapshot is restored (KV cut to ``c``).
* Every generated id is read into the state before the call returns, drained ids included, so afterwards
  ``held_ids == prompt_ids + gen_ids + drained_ids``.

>>> import tempfile
>>> from strata_lab.tiny import make_tiny
>>> engine = Engine.load(make_tiny(tempfile.mkdtemp()), threads=1)
>>> s = engine.session("demo")
>>> r = s.generate([9707, 1879], max_new_tokens=3).result
>>> (r.reused, r.prompt_len, len(r.gen_ids), r.finish)
(0, 2, 3, 'length')
>>> s.generate(s.held_ids + [13], max_new_tokens=0).result.reused
5

Observers: when a call ends, the engine hands one typed record (`strata_lab.dump.record.CallRecord`: the
store's columns) to each of its observers (``engine.add_observer(fn)``), then to the process's observers
(``add_process_observer(fn)``: every engine's calls), once. That is all the engine does with a call's record:
recording (a `Recorder` is one such observer; ``record_to``, ``STRATA_PROMPT_DUMP``) is attached above it, in
`strata_lab.recording`.

Why one module: Engine, Session and Stream share the native handles' lifetimes (a Stream keeps its
Session and Engine alive, the observers hear of a call when its stream ends); split apart, those rules would
hide.
"""
from __future__ import annotations

import os
import threading
import time
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Iterator, Optional, Sequence

import numpy as np

from strata_lab.rules import CheckpointPolicy

__all__ = ["Engine", "Session", "Stream", "Sampling", "GenerateResult", "ModelFolderError",
           "TokenLogprob", "add_process_observer", "remove_process_observer", "process_observers"]

# observers of every engine's calls in this process (strata_lab.recording keeps its recorder here)
_process_observers: list = []
_process_lock = threading.Lock()


def _check_observer(observer) -> None:
    if not callable(observer):
        raise TypeError(f"an observer must be callable with a CallRecord, got {type(observer).__name__}")


def add_process_observer(observer):
    """Call ``observer(record)`` with the `CallRecord` of every call, of every engine of this process, that
    starts from now on (after the engine's own observers). Returns ``observer``."""
    _check_observer(observer)
    with _process_lock:
        if observer not in _process_observers:
            _process_observers.append(observer)
    return observer


def remove_process_observer(observer) -> None:
    """Stop handing calls that start from now on to ``observer`` (a ValueError when it was not added)."""
    with _process_lock:
        try:
            _process_observers.remove(observer)
        except ValueError:
            raise ValueError(f"{observer!r} is not a process observer") from None


def process_observers() -> tuple:
    return tuple(_process_observers)


# Engine.load's kv_cache values (the CLI's and the server's --kv-cache): what the attention KV caches hold.
KV_CACHES = ("auto", "f32", "f16", "q8")


def _ext():
    """The compiled engine, through strata_lab._native (which sets its OpenMP environment before loading it)."""
    from strata_lab import _native

    return _native.engine()


def __getattr__(name: str):
    if name == "ModelFolderError":  # the extension's exception, without importing it at module import
        return _ext().ModelFolderError
    raise AttributeError(name)


def _as_ids(ids, field_name: str, vocab_size: int) -> list[int]:
    a = np.asarray(ids)
    if a.size == 0:
        return []
    if a.ndim != 1:
        raise ValueError(f"{field_name} must be a 1-D sequence of ids, got shape {a.shape}")
    if a.dtype.kind not in "iu":
        raise TypeError(f"{field_name} must hold integers, got dtype {a.dtype}")
    bad = np.flatnonzero((a < 0) | (a >= vocab_size))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{field_name}[{i}] = {int(a[i])} is out of range [0, {vocab_size})")
    return a.astype(np.int64).tolist()


@dataclass(frozen=True)
class Sampling:
    """Sampling settings; ``temperature=0`` is greedy. The same seed gives the same ids.

    >>> Sampling(temperature=0.7, top_p=0.9, seed=1).top_p
    0.9
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int = 0
    # logit modifiers, applied to a copy of the raw logits before temperature and the filters (greedy too):
    logit_bias: tuple = ()              # ((id, bias), ...): bias added to the id's logit; <= -100 bans the id
    repetition_penalty: float = 1.0     # 1: off; ids in the window: logit > 0 ? logit / r : logit * r
    penalty_last_n: int = 64            # repetition window: the last n ids of prompt + output; -1: all; 0: off
    frequency_penalty: float = 0.0      # logit -= count * f (count: times this call generated the id)
    presence_penalty: float = 0.0       # logit -= p once the id was generated

    def __post_init__(self):
        if not (self.temperature >= 0 and np.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if int(self.top_k) < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not 0 <= int(self.seed) < 2**64:
            raise ValueError(f"seed must be in [0, 2**64), got {self.seed}")
        object.__setattr__(self, "logit_bias", tuple((int(i), float(b)) for i, b in dict(self.logit_bias).items()))
        if any(np.isnan(b) for _, b in self.logit_bias):
            raise ValueError("logit_bias values must be numbers, got NaN")
        if not (self.repetition_penalty > 0 and np.isfinite(self.repetition_penalty)):
            raise ValueError(f"repetition_penalty must be a finite number > 0, got {self.repetition_penalty}")
        if int(self.penalty_last_n) < -1:
            raise ValueError(f"penalty_last_n must be >= -1, got {self.penalty_last_n}")
        for name in ("frequency_penalty", "presence_penalty"):
            if not np.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be finite, got {getattr(self, name)}")

    def _native(self):
        p = _ext().SamplingParams()
        p.temperature, p.top_k, p.top_p, p.min_p, p.seed = (
            float(self.temperature), int(self.top_k), float(self.top_p), float(self.min_p), int(self.seed))
        p.logit_bias = list(self.logit_bias)
        p.repetition_penalty, p.penalty_last_n = float(self.repetition_penalty), int(self.penalty_last_n)
        p.frequency_penalty, p.presence_penalty = float(self.frequency_penalty), float(self.presence_penalty)
        return p


@dataclass(frozen=True)
class TokenLogprob:
    """One id's log-probability and its best alternatives, computed in C++ from the engine's logits.

    The distribution is the log-softmax of the model's raw logits: before temperature, top-k/top-p/min-p
    and any grammar mask (as vLLM and OpenAI report them), so a temperature-0 id is always ``top[0]``.
    ``top`` is sorted best first (lowest id on ties).
    """

    id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()

    @classmethod
    def _from_native(cls, raw) -> "TokenLogprob":
        i, lp, top = raw
        return cls(int(i), float(lp), tuple((int(a), float(b)) for a, b in top))


@dataclass(frozen=True)
class GenerateResult:
    """What one generate call did (one dump line's worth)."""

    prompt_len: int
    reused: int                       # prompt ids taken from the session's state
    tokens_read: int                  # prompt_len - reused
    lcp: int                          # common prefix with the held ids before the call
    held_before: int
    restored_checkpoint: Optional[int]  # snapshot restored (hybrid; any model when its logits serve), else None
    used_saved_logits: bool           # nothing read: prompt == held, or it ends on a checkpoint
    gen_ids: list[int]
    drained_ids: list[int]            # produced after stop() was requested; kept in the session
    finish: str                       # "stop" | "length" | "cancelled" | "budget" (stop(reason="budget"))
    prefill_ms: float
    decode_ms: float
    checkpoints: list[int] = field(default_factory=list)  # positions restorable after the call
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per gen_ids entry when asked for

    @property
    def reread(self) -> int:
        """Prompt ids the session held (they matched its ids) but read again: min(lcp, held_before) - reused.
        On a hybrid model this is the cost of having no checkpoint at the divergence; the replay's reread
        also counts ids that part only where the text does not (see docs/DUMP_FORMAT.md)."""
        return max(0, min(self.lcp, self.held_before) - self.reused)


class Stream:
    """Iterates the generated ids of one call as the C++ decode thread produces them.

    ``stop()`` asks the loop to stop; ids produced after the request are drained: not yielded, reported
    in ``result.drained_ids`` and kept in the session. ``result`` waits for the end of the call. The
    call's `CallRecord` goes to the observers the call started with (see ``Session.generate``) exactly once, when the stream sees the call end: its iteration ends, its result is first awaited, or
    the next call on the same session starts while the stream is still held. Reading ``result`` again
    emits nothing; a stream dropped unread emits nothing (its call is not known to have ended).
    """

    _STOP_REASONS = ("cancelled", "budget", "stop")

    def __init__(self, job, *, session: str = "", prompt_ids: Sequence[int] = (),
                 record_meta: Optional[dict] = None, logprobs: bool = False, token_mask=None,
                 observers: Sequence = ()):
        self._job = job
        self._with_logprobs = logprobs
        self._token_mask = token_mask  # kept alive while the decode thread may call it
        self.logprobs: list[TokenLogprob] = []  # entries of the ids yielded so far (when asked for)
        self._result: Optional[GenerateResult] = None
        self._stop_reason: Optional[str] = None
        self._session = session
        self._prompt_ids = prompt_ids
        self._observers = tuple(observers)  # who hears of the call when it ends
        self._emitted = False
        self._record_meta = dict(record_meta or {})
        self._record_meta.setdefault("ts", time.time())  # the call's start

    def __iter__(self) -> Iterator[int]:
        return self

    def __next__(self) -> int:
        if self._with_logprobs:
            raw = self._job.next_entry()  # blocks with the GIL released
            if raw is not None:
                self.logprobs.append(TokenLogprob._from_native(raw))
                return self.logprobs[-1].id
        else:
            i = self._job.next()  # blocks with the GIL released
            if i is not None:
                return i
        self._settle()  # the call has ended: its result and its record, now
        raise StopIteration

    def stop(self, reason: str = "cancelled") -> None:
        """Ask the decode loop to stop. ``reason`` ("cancelled"; "budget": a thinking budget ran out; "stop":
        a stop sequence appeared in the text) becomes the call's finish when the stop takes effect before
        the call ends by itself."""
        if reason not in self._STOP_REASONS:
            raise ValueError(f"reason must be one of {self._STOP_REASONS}, got {reason!r}")
        if self._stop_reason is None:
            self._stop_reason = reason
        self._job.stop()

    @property
    def done(self) -> bool:
        return self._job.done()

    @property
    def result(self) -> GenerateResult:
        """The call's result (waits for its end). Reading it emits nothing: the record went out once, when
        the stream saw the call end."""
        if self._result is None:
            self._settle()
        return self._result

    def _settle(self) -> None:
        """Fetch the ended call's result and hand its record to the observers, once."""
        if self._result is None:
            raw = self._job.result()
            if raw["finish"] == "cancelled" and self._stop_reason is not None:
                raw["finish"] = self._stop_reason
            raw["logprobs"] = [TokenLogprob._from_native(e) for e in raw["logprobs"]]
            self._result = GenerateResult(**raw)
        if not self._emitted:
            self._emitted = True
            if self._observers:
                self._emit(self.call_record())

    def call_record(self):
        """The ended call as a `CallRecord` (waits for the end); the record observers get is built this way."""
        from strata_lab.dump.record import CallRecord

        if self._result is None:
            self._settle()
        r, meta = self._result, dict(self._record_meta)
        return CallRecord(
            session=self._session, prompt_ids=[int(i) for i in self._prompt_ids], call=int(meta.pop("call", 0)),
            ts=float(meta.pop("ts")), request_id=meta.pop("request_id", None) or uuid.uuid4().hex,
            reused=r.reused, gen_ids=list(r.gen_ids), drained_ids=list(r.drained_ids),
            checkpoints=list(r.checkpoints), finish=r.finish, prefill_ms=float(r.prefill_ms),
            decode_ms=float(r.decode_ms), model=meta.pop("model", None), extra=meta)

    def _emit(self, record) -> None:
        first: Optional[BaseException] = None
        for observer in self._observers:  # every observer hears of the call, even when one fails
            try:
                observer(record)
            except Exception as exc:  # noqa: BLE001 - re-raised below, after the others had it
                first = first or exc
        if first is not None:
            raise first

    def ids(self) -> list[int]:
        """Consume the stream; returns the generated (not drained) ids."""
        return list(self)


class Session:
    """Named state in an Engine: held ids, KV cache, checkpoints. Get one with ``engine.session(name)``."""

    def __init__(self, engine: "Engine", native):
        self._engine = engine
        self._s = native
        # the latest call's stream (weakly: a stream the caller dropped frees its job, and the session, at
        # once), settled when the next call starts if the caller still holds it unread
        self._last: Optional["weakref.ref[Stream]"] = None

    @property
    def name(self) -> str:
        return self._s.name

    @property
    def held_ids(self) -> list[int]:
        return self._s.held_ids()

    @property
    def checkpoints(self) -> list[int]:
        return self._s.checkpoints()

    def last_logits(self) -> np.ndarray:
        """Logits ``[vocab_size]`` after the last held id (what the next sample is drawn from)."""
        return self._s.last_logits()

    @property
    def memory_bytes(self) -> int:
        return self._s.memory_bytes()

    @property
    def snapshot_bytes(self) -> int:
        return self._s.snapshot_bytes()

    def reset(self) -> None:
        self._s.reset()

    def checkpoint_policy(self) -> dict:
        """The session's checkpoint policy as a plain dict (the fields of ``CheckpointPolicy``)."""
        p = self._s.policy()
        return {"at_prompt_end": bool(p.at_prompt_end), "every": int(p.every),
                "positions": [int(x) for x in p.positions], "budget_mib": float(p.budget_mib),
                "before_last": None if p.before_last < 0 else int(p.before_last)}

    def plan(self, prompt_ids: Sequence[int]) -> dict:
        """The reuse the next call with ``prompt_ids`` would get (lcp, reused, restore, saved_logits)."""
        return self._s.plan(_as_ids(prompt_ids, "prompt_ids", self._engine.vocab_size))

    def generate(self, prompt_ids: Sequence[int], *, max_new_tokens: int, sampling: Sampling = Sampling(),
                 stop_ids: Sequence[int] = (), force_ids: Optional[Sequence[int]] = None,
                 stop_latency: int = 0, paced: bool = False, record_meta: Optional[dict] = None,
                 logprobs: Optional[int] = None, token_mask=None) -> Stream:
        """Start one call: reuse per Contract 1, read the rest of the prompt, then decode.

        ``max_new_tokens=0`` only reads the prompt. ``force_ids`` decodes those ids instead of sampling
        (min(len(force_ids), max_new_tokens) steps). ``stop_latency`` delays the loop's reaction to
        ``stop()`` by that many steps (models a late STOP). Unpaced (the default) the loop runs ahead of a
        slow reader, and a STOP counts from the step the loop sees it in: the ids it made meanwhile are
        generated ones. ``paced=True`` keeps the loop at most one id ahead of the reader, and a STOP counts
        from the last id the reader took: exactly ``stop_latency`` ids are drained (with 0: none, or the one
        being sampled), however busy the machine; a paced stream must be read to its end or its ``result``
        awaited (the server's are). Bad input raises before any work.

        ``logprobs=n`` (0..1024) reports each generated id's logprob and its n best alternatives
        (``TokenLogprob``: raw logits, before temperature and mask) in ``stream.logprobs`` as ids arrive
        and in ``result.logprobs``. ``token_mask`` (e.g. a ``strata_lab.grammar.GrammarMask``) is called on
        the decode thread before each sampled step, ``token_mask(n_produced, last_id, bits) -> bool``, and
        its ``mask_words`` uint32 bitmask restricts the ids sampled; the session's own logits stay as they are.

        When the call ends, its `CallRecord` goes to the observers there were when it started: the engine's
        (``Engine.add_observer``), then the process's (``add_process_observer``; a recorder of
        `strata_lab.recording` among them). ``record_meta`` adds fields to that record (request_id, call,
        encoder, model, ts).

        >>> import tempfile
        >>> from strata_lab.tiny import make_tiny
        >>> s = Engine.load(make_tiny(tempfile.mkdtemp()), threads=1).session("a")
        >>> stream = s.generate([1, 2, 3], max_new_tokens=4, sampling=Sampling(temperature=1.0, seed=7))
        >>> ids = list(stream)
        >>> s.held_ids == [1, 2, 3] + ids
        True
        """
        V = self._engine.vocab_size
        if not isinstance(max_new_tokens, (int, np.integer)) or isinstance(max_new_tokens, bool):
            raise TypeError(f"max_new_tokens must be an int, got {type(max_new_tokens).__name__}")
        if not isinstance(sampling, Sampling):
            raise TypeError(f"sampling must be a Sampling, got {type(sampling).__name__}")
        opts = _ext().GenerateOptions()
        opts.max_new_tokens = int(max_new_tokens)
        opts.sampling = sampling._native()
        opts.stop_ids = _as_ids(list(stop_ids), "stop_ids", V)
        if force_ids is not None:
            opts.has_force = True
            opts.force_ids = _as_ids(list(force_ids), "force_ids", V)
        opts.stop_latency = int(stop_latency)
        if not isinstance(paced, bool):
            raise TypeError(f"paced must be a bool, got {type(paced).__name__}")
        opts.paced = paced
        if logprobs is not None:
            if isinstance(logprobs, bool) or not isinstance(logprobs, (int, np.integer)) or not 0 <= logprobs <= 1024:
                raise ValueError(f"logprobs must be None or an int in 0..1024, got {logprobs!r}")
            opts.logprobs = int(logprobs)
        if token_mask is not None:
            if not callable(token_mask) or not hasattr(token_mask, "mask_words"):
                raise TypeError("token_mask must be callable with a mask_words attribute")
            opts.set_token_mask(token_mask)
        prompt = _as_ids(prompt_ids, "prompt_ids", V)
        observers = self._engine.observers + process_observers()
        if observers:
            # the policy that produced the line's checkpoints, so a reproduction can use the same one
            record_meta = {"checkpoint_policy": self.checkpoint_policy(), **(record_meta or {})}
        last = self._last() if self._last is not None else None
        if last is not None and not last._emitted and last.done:
            try:  # the previous call ended unread: its record goes out before this call starts
                last._settle()
            except Exception as exc:  # noqa: BLE001 - its observer's failure is not this call's
                import warnings

                warnings.warn(f"session {self.name}: the record of its previous call (never read) could not be "
                              f"delivered to an observer: {type(exc).__name__}: {exc}", stacklevel=2)
        job = _ext().StreamJob(self._s, prompt, opts, V)
        stream = Stream(job, session=self.name, prompt_ids=prompt, record_meta=record_meta, logprobs=logprobs is not None, token_mask=token_mask,
                        observers=observers)
        self._last = weakref.ref(stream)
        return stream

    def __repr__(self) -> str:
        return f"Session({self.name!r}, held={len(self.held_ids)}, checkpoints={self.checkpoints})"


class Engine:
    """A loaded model folder and its sessions. Load with ``Engine.load(path)``."""

    def __init__(self, native, path: str):
        self._e = native
        self.path = path
        self.info: dict = native.info()
        self._sessions: dict[str, Session] = {}
        self._observers: list = []

    # --- observers: who hears of each call when it ends -----------------------------------------------
    def add_observer(self, observer):
        """Call ``observer(record)`` with a `strata_lab.dump.record.CallRecord` when each call of this
        engine ends (once per call; a `Recorder` is such an observer). Returns ``observer``."""
        _check_observer(observer)
        if observer not in self._observers:
            self._observers.append(observer)
        return observer

    def remove_observer(self, observer) -> None:
        """Stop calling ``observer`` (a ValueError when it was not added)."""
        try:
            self._observers.remove(observer)
        except ValueError:
            raise ValueError(f"{observer!r} is not an observer of this engine") from None

    @property
    def observers(self) -> tuple:
        return tuple(self._observers)

    @classmethod
    def load(cls, path: str | os.PathLike, *, threads: Optional[int] = None,
             max_context: Optional[int] = None, mmap: bool = True, check_weights: bool = False,
             weights: Optional[str] = None, kv_cache: str = "auto", device: str = "cpu") -> "Engine":
        """Load a Hugging Face model folder (config.json + safetensors, f32/f16/bf16).

        ``threads``: OpenMP threads (None: all cores; at most 4 per core). ``max_context``: tokens a session
        may hold (None: config max_position_embeddings). Bad files raise ModelFolderError (a ValueError)
        naming the file, field or tensor: non-regular files (a FIFO), out-of-range config values
        (``rope_theta <= 0``, ``rms_norm_eps < 0``, sizes < 1), overlapping tensor offsets.

        ``mmap=True`` (default) maps the weights: fast, shared with the page cache, but the file must not
        change while the engine lives. Rewriting it in place changes the weights under the engine, and
        truncating it kills the process with SIGBUS on the next read of a lost page. Replace checkpoints by
        writing a new file and renaming it over the old one (the mapping keeps the old inode), or load with
        ``mmap=False``, which reads the weights into memory once. ``check_weights=True`` refuses weights
        holding NaN or infinity (one extra pass over them). Mapped weights that take at most half of the
        memory available at load are then copied into transparent huge pages (decode streams every matrix
        row once per token; the mapping's 4 KiB pages cost ~10%): ``info["weights_memory"]`` says
        ``"hugepages"``, ``"mapped"`` (a larger model, or ``STRATA_WEIGHTS_HUGEPAGES=0``), ``"read"``
        (``mmap=False``) or ``"int8"``.

        ``weights``: None computes with the stored dtype; ``"int8"`` quantises every projection matrix and
        the lm_head at load to int8 rows with one float32 scale per row (absmax / 127): half the bytes of
        bf16 per decoded token; logits within the bound `tests/test_engine_int8.py` holds (max error <= 5% of the
        largest |logit|, >= 90% argmax agreement with the same weights in f32).

        ``kv_cache``: what the sessions' attention KV caches hold (``info["kv_cache"]`` says which).
        ``"auto"`` (default): f16 for bf16/f16 weights and for ``weights="int8"`` -- half the bytes
        decode reads per token at long contexts, with logits no worse than transformers computing in bf16
        (which keeps a bf16 cache) -- and f32 for f32 weights (logit parity with transformers f32 at
        1e-4). ``"f32"`` or ``"f16"`` whatever the weights. An f16 cache is rounded chunk by chunk as prefill
        stores it, so decode still gives a position the bits the full forward gives it. ``"q8"``: K and V as
        int8 in blocks of 32 values along head_dim with one float32 scale per block (absmax / 127, llama.cpp's
        ``q8_0`` layout with an f32 scale): 1.125 bytes per value, under a quarter of the f32 cache, for long
        contexts; quantised the same way chunk by chunk, so decode still equals the full forward, with logits
        within the bound `tests/test_engine_attention.py` holds against the f32 cache. Needs head_dim a
        multiple of 32 (else ModelFolderError).

        ``device``: ``"cpu"`` (default) or ``"cuda"``: a dense Qwen3 model's forward on the first CUDA GPU, in
        bf16 with a bf16 KV cache on the device (``info["device"]``); sessions, reuse and sampling as on the
        CPU, each step's logits copied to the host (docs/ENGINE.md "GPU"). Hybrid models, ``weights="int8"``
        and a ``kv_cache`` other than ``"auto"`` are CPU-only (ValueError); a build without the CUDA backend
        or a machine without a usable GPU raises one RuntimeError saying which.

        >>> import tempfile
        >>> from strata_lab.tiny import make_tiny
        >>> Engine.load(make_tiny(tempfile.mkdtemp()), threads=1, mmap=False, check_weights=True).vocab_size
        151936
        >>> Engine.load(make_tiny(tempfile.mkdtemp()), threads=1, weights="int8").info["weights"]
        'int8'
        >>> [Engine.load(make_tiny(tempfile.mkdtemp(), dtype=d), threads=1).info["kv_cache"] for d in ("float32", "bfloat16")]
        ['f32', 'f16']
        """
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise ValueError(f"threads must be a positive int or None, got {threads!r}")
        if threads is not None and threads > 4 * (os.cpu_count() or 1):
            raise ValueError(f"threads must be <= {4 * (os.cpu_count() or 1)} (4 x {os.cpu_count()} cores), "
                             f"got {threads}")
        if max_context is not None and (not isinstance(max_context, int) or max_context < 1):
            raise ValueError(f"max_context must be a positive int or None, got {max_context!r}")
        for name, value in (("mmap", mmap), ("check_weights", check_weights)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
        if weights not in (None, "stored", "int8"):
            raise ValueError(f"weights must be None, 'stored' or 'int8', got {weights!r}")
        if not isinstance(kv_cache, str) or kv_cache not in KV_CACHES:
            raise ValueError(f"kv_cache must be 'auto', 'f32', 'f16' or 'q8', got {kv_cache!r}")
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
        path = os.fspath(path)
        return cls(_ext().Engine(path, threads or 0, max_context or 0, mmap, check_weights, weights or "stored",
                                 kv_cache, device), path)

    @property
    def vocab_size(self) -> int:
        return self.info["vocab_size"]

    @property
    def max_context(self) -> int:
        return self.info["max_context"]

    def forward(self, ids: Sequence[int]) -> np.ndarray:
        """Logits ``[len(ids), vocab_size]`` (float32) of a fresh sequence; no session is touched."""
        return self._e.forward(_as_ids(ids, "ids", self.vocab_size))

    def prompt_logprobs(self, ids: Sequence[int], *, top_n: int = 0) -> list[TokenLogprob]:
        """Logprob of each prompt id after the first, given the ids before it (a fresh sequence, computed
        in C++ in chunks): ``len(ids) - 1`` entries, with ``top_n`` alternatives each.

        >>> import tempfile
        >>> from strata_lab.tiny import make_tiny
        >>> e = Engine.load(make_tiny(tempfile.mkdtemp()), threads=1)
        >>> lps = e.prompt_logprobs([9707, 1879, 13], top_n=2)
        >>> len(lps), lps[0].id, len(lps[0].top), lps[0].logprob <= 0
        (2, 1879, 2, True)
        """
        if isinstance(top_n, bool) or not isinstance(top_n, int) or not 0 <= top_n <= 1024:
            raise ValueError(f"top_n must be an int in 0..1024, got {top_n!r}")
        return [TokenLogprob._from_native(e) for e in self._e.prompt_logprobs(_as_ids(ids, "ids", self.vocab_size),
                                                                              top_n)]

    def step_stats(self) -> dict:
        """Counts of the engine's step thread, where every session read runs and the decode steps of the
        sessions generating at the same time (``generate`` calls on several threads, or the server's slots)
        advance together in one batched forward (continuous batching: a session joins at the next step).
        Keys: ``steps`` (decode steps run), ``tokens`` (tokens they decoded: ``tokens / steps`` is the mean
        batch), ``max_batch``, ``last_batch``, ``prefill_chunks``, ``decoding`` (sessions in their decode
        loop now), ``waiting`` (reads queued now). Batching changes timing only: each sequence gets the
        logits it gets alone, bit for bit."""
        return dict(self._e.step_stats())

    def session(self, name: str, *, checkpoints: Optional[CheckpointPolicy] = None) -> Session:
        """The session called ``name`` (created on first use; ``checkpoints`` sets its policy)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        if checkpoints is not None and not isinstance(checkpoints, CheckpointPolicy):
            raise TypeError("checkpoints must be a CheckpointPolicy")
        native = self._e.session(name, checkpoints._native(_ext()) if checkpoints else None)
        if name not in self._sessions:
            self._sessions[name] = Session(self, native)
        return self._sessions[name]

    def __repr__(self) -> str:
        return f"Engine({self.path!r}, {self.info['model_type']}, layers={self.info['num_layers']})"
