"""The trace table: every model call of one or more logs, one row each, whatever format they came in.

>>> import os, json, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "calls.jsonl")
>>> body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}
>>> _ = open(path, "w").write(json.dumps(body) + "\\n")
>>> trace = load_trace(path)
>>> trace.detected[path][0], len(trace.calls()), trace.to_frame()[["session", "call", "fidelity"]].values.tolist()
('openai', 1, [['calls-1', 0, 'messages']])
"""
from __future__ import annotations

import glob as _glob
import os
from typing import Iterable, Iterator

from strata_lab.traces.log_calls import FIELDS, parse_field_path
from strata_lab.traces.registry import READERS, TEXT_FORMATS, detect_format
from strata_lab.traces.fast_encode import FastTokenizer, SegmentEncoder
from strata_lab.traces.render import LengthsSynth, PrefixEncoder, render_call
from strata_lab.traces.source import Source, warn

__all__ = ["Trace", "load_trace"]

_INT_COLS = ("prompt_len", "prompt_tokens", "completion_tokens", "cached_tokens", "cache_read_tokens",
             "cache_creation_tokens")
# the engine whose cache figures a log format reports (formats any server can write, e.g. OpenAI, say nothing)
_REPORTED_BY = {"vllm-log": "vllm", "sglang-log": "sglang", "llama.cpp-log": "llama.cpp", "anthropic": "anthropic",
                "claude-code": "anthropic", "codex": "openai", "gemini-cli": "gemini"}
_JSON_COLS = ("messages", "tools", "response_tool_calls", "extra")


class Trace:
    """Calls read from `paths` (each in `format`, or the detected one: `detected[path] = (format, why)`).
    Iterating streams the files; `to_frame()` gives pandas; `to_dump()` renders to strata-dump/1. After a
    pass, `stats[path]` says per file: calls, sessions, fidelities, calls with reported usage / cached tokens,
    notes, what the log reports beyond its calls (`facts`), for a file with no call, why (`why_none`), and for
    an OpenAI Batch output file, how many of its lines became its input file's calls (`joined`).
    OpenAI Batch output files join their input files' lines on ``custom_id`` when both are given, and a Cline /
    Roo Code task folder's ui_messages.json its api_conversation_history.json (its usage, request by request)."""

    def __init__(self, paths: Iterable[str | os.PathLike], format: str | None = None, *, progress: bool = False,
                 session_key: str | None = None, messages_path: str | None = None):
        self.paths = [os.fspath(p) for p in paths]
        if not self.paths:
            raise ValueError("path: no log files given (or the glob matched nothing)")
        if format is not None and format not in READERS:
            import difflib

            near = difflib.get_close_matches(format, list(READERS), n=1)
            hint = f" (did you mean --format {near[0]}?)" if near else ""
            raise ValueError(f"format: unknown {format!r}{hint}; known: {', '.join(READERS)}")
        if messages_path is not None:  # the message lists at this path, read by the generic reader
            from strata_lab.traces.generic import parse_path

            parse_path(messages_path)
            if format not in (None, "generic"):
                raise ValueError(f"messages_path: --messages-path reads the files with the generic reader; "
                                 f"--format {format} reads them its own way (give one of the two)")
            format = "generic"
        self.messages_path = messages_path
        self.progress = progress
        self.session_key = parse_field_path(session_key)
        # per file, filled while reading: calls, sessions, fidelity and usage counts, notes, what the log reports
        self.stats: dict[str, dict] = {}
        self.render_skipped: list[tuple[str, str]] = []
        self.checks: dict = {}
        self.detected: dict[str, tuple[str, str]] = {}
        from strata_lab.traces.cline import folder_extra

        for p in self.paths:
            src = Source(p)
            extra = folder_extra(p) if format is None and len(self.paths) > 1 else None
            if extra is not None:
                warn(f"{p}: skipped: {extra}")
                continue
            try:
                self.detected[p] = (format, "given") if format is not None else detect_format(src)
            except ValueError as exc:
                if len(self.paths) == 1:
                    raise
                warn(f"{p}: skipped: {exc}")  # a README beside the logs
        self.paths = [p for p in self.paths if p in self.detected]
        if not self.paths:
            raise ValueError("format: no file's format could be detected; pass --format NAME (the warnings above "
                             "say what each file holds)")
        if self.session_key is not None:
            text = sorted({f for f, _ in self.detected.values() if f in TEXT_FORMATS})
            if text:
                raise ValueError(f"session_key: {', '.join(text)} logs are text lines, not records with fields; "
                                 "they have no session field to name")
            own = sorted({f for f, _ in self.detected.values() if not getattr(READERS[f], "SESSION_KEY", False)})
            if own:
                raise ValueError(f"session_key: {', '.join(own)} logs name their sessions themselves (session "
                                 "files, rollouts, dump sessions); --session-key does not apply")

    @property
    def formats(self) -> list[str]:
        return sorted({f for f, _ in self.detected.values()})

    def _source(self, path: str) -> Source:
        src = Source(path, progress=self.progress, session_key=self.session_key)
        src.messages_path = self.messages_path
        src.detect = detect_format
        return src

    def __iter__(self) -> Iterator[dict]:
        counts: dict[str, int] = {}
        # OpenAI Batch output files are read first: their input files' lines join them on custom_id
        outputs = [p for p in self.paths if self.detected[p][0] == "openai-batch"]
        batch = None
        batch_joined: dict[str, int] = {}  # output file -> its lines joined to input lines (counted there)
        if outputs and any(self.detected[p][0] == "openai" for p in self.paths):
            from strata_lab.traces.openai_batch import load

            batch = {}
            for p in outputs:
                before = len(batch)
                load(self._source(p), batch)
                batch_joined[p] = len(batch) - before  # less the lines left unjoined, once the inputs are read
        # a Cline / Roo Code task folder's ui_messages.json is read with its api_conversation_history.json
        from strata_lab.traces.cline import companions

        joined = companions(self.paths, self.detected)
        order = [p for p in self.paths if p not in outputs and p not in joined] + outputs
        for p in order:
            fmt = self.detected[p][0]
            src = self._source(p)
            src.batch = batch
            src.reader = fmt
            src.forced = self.detected[p][1] == "given"
            src.companions = [u for u, h in joined.items() if h == p]
            st = self.stats[p] = {"format": fmt, "why": self.detected[p][1], "calls": 0, "sessions": set(),
                                  "fidelity": {}, "usage": 0, "cached": 0, "notes": {}, "facts": src.facts,
                                  "why_none": None, "skipped": 0}
            if p in batch_joined:
                st["joined"] = batch_joined[p] - sum(1 for v in batch.values() if v[1].startswith(p + ":"))
            for call in READERS[fmt].read(src):
                call["session"] = str(call["session"] or fmt)
                call["call"] = counts.get(call["session"], 0)
                counts[call["session"]] = call["call"] + 1
                if call["prompt_ids"] is not None and call["prompt_len"] is None:
                    call["prompt_len"] = len(call["prompt_ids"])
                st["calls"] += 1
                src.calls += 1
                st["sessions"].add(call["session"])
                st["fidelity"][call["fidelity"]] = st["fidelity"].get(call["fidelity"], 0) + 1
                if call["prompt_tokens"] is not None or call["cached_tokens"] is not None:
                    st["usage"] += 1
                if call["cached_tokens"] is not None:
                    st["cached"] += 1
                for n in call["notes"]:
                    st["notes"][n] = st["notes"].get(n, 0) + 1
                yield call
            st["skipped"] = src.skipped
            if src.key_missing:
                src.facts.append(f"{src.key_missing} records without {self.session_key} (chained instead)")
            if not st["calls"]:
                st["why_none"] = (f"its {st['joined']} lines were joined to their input lines (counted there)"
                                  if st.get("joined") else None) or src.why_none or (
                    f"every record was skipped ({src.skipped} of them)"
                    + (f"; {src.elsewhere()}" if src.elsewhere() else "") if src.skipped
                    else f"no model call in it for the {fmt} reader")

    def calls(self) -> list[dict]:
        """Every call, read into a list (no __len__: a trace is streamed, counting it means reading it)."""
        return [c for c in self]

    def to_frame(self):
        """One row per call: the `FIELDS` columns with typed scalars (ts float64, counts Int64, fidelity and
        format categories) and object columns for messages, tools, ids and notes; plus n_messages."""
        import pandas as pd

        cols: dict[str, list] = {k: [] for k in FIELDS}
        for call in self:
            for k in FIELDS:
                cols[k].append(call[k])
        df = pd.DataFrame({k: pd.Series(v, dtype="object") for k, v in cols.items()})
        df["ts"] = pd.Series(cols["ts"], dtype="float64")
        df["call"] = pd.Series(cols["call"], dtype="int64")
        for k in ("session", "model", "source", "request_id", "system", "response_text", "response_reasoning",
                  "finish"):
            df[k] = pd.Series(cols[k], dtype="string")
        for k in ("fidelity", "format"):
            df[k] = pd.Series(cols[k], dtype="category")
        for k in _INT_COLS:
            df[k] = pd.Series(cols[k], dtype="Int64")
        df.insert(df.columns.get_loc("messages"), "n_messages",
                  pd.Series([len(m) if m is not None else 0 for m in cols["messages"]], dtype="int64"))
        return df

    def render(self, tokenizer="qwen3", template=None, *, enable_thinking: bool | None = None,
               progress: bool = False, fast: bool = True) -> Iterator[tuple[dict, object]]:
        """(call, Rendered) for every call; calls the template cannot render are skipped with a TraceWarning.
        A call that carries token ids and names a model of another family than `tokenizer` is a ValueError.
        Every template renders the same way (`ChatTemplate.render`, Jinja). `fast=False` encodes every prompt
        whole with `tokenizer.encode` (the same ids, slower: what the fast path is checked against); the fast
        path encodes only what a session's next prompt adds after the part it shares with the previous one
        (`PrefixEncoder`), byte-level BPE tokenizers (Qwen, Llama-3, GPT-2) by pieces with their own model."""
        tok, tmpl = resolve(tokenizer, template)
        synth = None  # built at the first lengths-only call (a pool of the vocabulary's ids)
        seg = SegmentEncoder.of(tok) if fast else None
        fast_tok = FastTokenizer(seg) if seg is not None else tok
        encoder = PrefixEncoder(fast_tok) if fast else None
        self.render_skipped = []  # (source, why) of the calls the last render could not render
        from strata_lab.progress import progress_bar

        it: Iterable[dict] = progress_bar(self, enabled=progress, desc="render", unit="call")
        checked: set = set()
        for call in it:
            if call["fidelity"] == "ids" and call["model"] not in checked:  # the log's ids, read with `tok`
                tok.check_model(call["model"], what=call["source"] or "the log")
                checked.add(call["model"])
            try:
                if call["fidelity"] == "lengths" and synth is None:
                    synth = LengthsSynth(tok)
                r = synth.render(call) if call["fidelity"] == "lengths" else \
                    render_call(call, fast_tok, tmpl, enable_thinking=enable_thinking, encoder=encoder)
            except ValueError as exc:
                warn(f"{call['source']}: skipped: not rendered: {exc}")
                self.render_skipped.append((call["source"], str(exc)))
                continue
            yield call, r

    def render_check(self, tokenizer="qwen3", template=None, **kw):
        """Per call: rendered length vs the reported prompt_tokens (`render_exact`, `render_diff`), and the
        reconstructed reply's length vs the reported completion_tokens (`reply_exact`, `reply_diff`); calls
        that did not render are in `render_skipped` afterwards."""
        import pandas as pd

        cols = ["session", "call", "source", "fidelity", "rendered_len", "prompt_tokens", "render_exact",
                "render_diff", "reply_len", "completion_tokens", "reply_exact", "reply_diff", "notes"]
        rows = [(c["session"], c["call"], c["source"], c["fidelity"], len(r.prompt_ids), c["prompt_tokens"], r.exact,
                 r.diff, len(r.gen_ids), c["completion_tokens"], r.gen_exact, r.gen_diff, "; ".join(r.notes))
                for c, r in self.render(tokenizer, template, **kw)]
        df = pd.DataFrame(rows, columns=cols)
        for k in ("prompt_tokens", "render_diff", "completion_tokens", "reply_diff"):
            df[k] = df[k].astype("Int64")
        for k in ("render_exact", "reply_exact"):
            df[k] = df[k].astype("boolean")
        return df

    def dump_records(self, tokenizer="qwen3", template=None, *, checkpoint_policy: dict | None = None,
                     **kw) -> Iterator[dict]:
        """strata-dump/1 records, one per rendered call (see `to_dump`). Afterwards `checks` holds, for "render"
        (prompt_tokens) and "reply" (completion_tokens), [calls checked, [(source, ours, the log's) for every
        call that differs]]."""
        from strata_lab.traces.breakpoints import positions

        from strata_lab.traces.habits import history_change

        tokenizer, template = resolve(tokenizer, template)
        self.checks = {"render": [0, []], "reply": [0, []]}
        last: dict = {}  # session -> its previous message-level call (what the session held: `history_change`)
        for call, r in self.render(tokenizer, template, **kw):
            for what, exact, ours, theirs in (("render", r.exact, len(r.prompt_ids), call["prompt_tokens"]),
                                              ("reply", r.gen_exact, len(r.gen_ids), call["completion_tokens"])):
                if exact is not None:
                    self.checks[what][0] += 1
                    if not exact:
                        self.checks[what][1].append((call["source"], ours, theirs))
            rec = {"schema": "strata-dump/1", "ts": call["ts"], "request_id": call["request_id"],
                   "session": call["session"], "call": call["call"], "prompt_ids": r.prompt_ids,
                   "gen_ids": r.gen_ids, "drained_ids": [], "finish": "stop", "timings": {}, "checkpoints": []}
            if call["format"] == "strata":
                rec.update(call["extra"] or {})
            if call["model"] is not None:
                rec["model"] = call["model"]
            rec.update(source=call["source"], fidelity=call["fidelity"], trace_format=call["format"],
                       render_exact=r.exact, render_diff=r.diff, reported_prompt_tokens=call["prompt_tokens"],
                       reported_cached_tokens=call["cached_tokens"])
            if r.gen_exact is not None:  # the reconstructed reply against the log's completion_tokens
                rec.update(reply_exact=r.gen_exact, reply_diff=r.gen_diff,
                           reported_completion_tokens=call["completion_tokens"])
            if r.notes:
                rec["render_notes"] = list(r.notes)
            # Contract 4: one field for what the engine served from its cache, one for what a hosted API wrote
            if call["cache_creation_tokens"] is not None:
                rec["reported_cache_write_tokens"] = call["cache_creation_tokens"]
            if call["cached_tokens"] is not None and call["format"] in _REPORTED_BY:
                rec["cache_engine"] = _REPORTED_BY[call["format"]]
            if call["cache_breakpoints"] is not None and call["fidelity"] == "messages":
                tkw = dict((call.get("extra") or {}).get("chat_template_kwargs") or {})
                if kw.get("enable_thinking") is not None:
                    tkw["enable_thinking"] = kw["enable_thinking"]
                bps, blocks = positions(call, tokenizer, template, r.prompt_ids, tkw)
                if bps is not None:
                    rec["cache_control"] = bps  # Anthropic breakpoints as prompt positions (breakpoint mode)
                if blocks is not None:  # where content blocks end: what Anthropic's look-back counts
                    rec["content_blocks"] = blocks
            if call["fidelity"] == "messages":  # the first message the client changed (traces/habits.py)
                prev = last.get(call["session"])
                if prev is not None:
                    rec["history_change"] = history_change(prev, call)
                last[call["session"]] = call
            if call["notes"]:
                rec["trace_notes"] = list(call["notes"])  # what the log lacks or how it was read, per call
            if r.synthetic or (call["extra"] or {}).get("synthetic_ids"):  # placeholder ids: no tokenizer's
                rec["synthetic_ids"] = True
            if checkpoint_policy is not None:
                rec["checkpoint_policy"] = dict(checkpoint_policy)
            yield rec

    def records(self, tokenizer="qwen3", template=None, **kw):
        """The rendered calls as `strata_lab.dump.record.CallRecord`s (the one call record; see `dump_records`)."""
        from strata_lab.dump.record import CallRecord

        return (CallRecord.from_mapping(r) for r in self.dump_records(tokenizer, template, **kw))

    def to_dump(self, tokenizer="qwen3", template=None, out=None, *, checkpoint_policy: dict | None = None,
                **kw):  # noqa: D417
        """Render every call and write strata-dump/1 lines to `out` (default: a new temp file); returns the
        `Dump`, so `replay`, `sessions.reproduce` and the notebooks work on it. `tokenizer`: a name, a model
        folder or tokenizer.json; `template`: a ChatTemplate, preset name, file or folder (default: the
        tokenizer's folder, or qwen3). `checkpoint_policy` (CheckpointPolicy fields) is written into each line
        for `reproduce`. Lines carry `render_exact` / `render_diff`, the reported usage
        (`reported_cached_tokens`, and for hosted APIs `reported_cache_write_tokens`:
        Contract 4) and, for Anthropic requests, `cache_control`: the breakpoints as
        prompt positions."""
        import tempfile

        from strata_lab.dump import load_dump
        from strata_lab.dump.writer import write_records

        if out is None:
            out = os.path.join(tempfile.mkdtemp(prefix="strata-trace-"), "trace.jsonl")
        out = os.fspath(out)
        # the one dump writer: 0600, no symbolic link, whole lines (token ids of private conversations)
        write_records(self.dump_records(tokenizer, template, checkpoint_policy=checkpoint_policy, **kw), out)
        return load_dump(out)

    def write(self, out, tokenizer="qwen3", template=None, **kw) -> str:
        """`out` ending .parquet: the trace table (message/tool columns as JSON text); .jsonl: `to_dump`."""
        out = os.fspath(out)
        if out.endswith(".parquet"):
            import json

            df = self.to_frame()
            for k in _JSON_COLS:
                df[k] = [None if v is None else json.dumps(v, ensure_ascii=False) for v in df[k]]
            from strata_lab.dump.files import write_private_file

            write_private_file(out, lambda f: df.to_parquet(f, engine="pyarrow", index=False), what="trace table")
        elif out.endswith(".jsonl"):
            self.to_dump(tokenizer, template, out, **kw)
        else:
            raise ValueError(f"out: {out} must end in .parquet (trace table) or .jsonl (strata-dump/1)")
        return out

    def __repr__(self) -> str:
        return f"Trace({len(self.paths)} file(s), formats={self.formats})"


def resolve(tokenizer, template):
    """A Tokenizer and ChatTemplate from names, files or folders (the template defaults to the tokenizer's
    folder, or our qwen3 preset for the named Qwen vocabularies)."""
    from strata_lab.text.template import TEMPLATE_PRESETS, ChatTemplate
    from strata_lab.text.tokenizer import Tokenizer, load_tokenizer

    tok = tokenizer if isinstance(tokenizer, Tokenizer) else load_tokenizer(tokenizer)
    if isinstance(template, ChatTemplate):
        return tok, template
    if template is None:
        template = "qwen3" if not isinstance(tokenizer, (str, os.PathLike)) or not os.path.isdir(tokenizer) \
            else tokenizer
    if isinstance(template, str) and template in TEMPLATE_PRESETS:
        return tok, ChatTemplate.from_name(template)
    tmpl = ChatTemplate.from_file(template)
    if isinstance(tokenizer, (str, os.PathLike)):   # a bare .jinja takes bos_token / eos_token from the model folder
        folder = tokenizer if os.path.isdir(tokenizer) else os.path.dirname(os.fspath(tokenizer)) \
            if os.path.basename(os.fspath(tokenizer)) == "tokenizer.json" else None
        if folder:
            tmpl = tmpl.with_special_tokens_from(folder)
    return tok, tmpl


def load_trace(path_or_paths_or_glob, format: str | None = None, *, progress: bool = False,
               session_key: str | None = None, messages_path: str | None = None) -> Trace:
    """Read logs into a `Trace`: a file, a list of files, a directory (its files, by name, recursively) or a
    glob. `format=None` detects each file's format (`trace.detected` says which and why). `session_key`: a
    dotted field path in each record naming its session (else `calls.CHAINING_RULE`).

    Args:
        path_or_paths_or_glob: a log file, a list of them, a directory, or a glob.
        format: a reader name (see `strata_lab.traces.READERS`), or None to detect each file's.
        progress: show a progress bar while reading.
        messages_path: read every file with the generic reader, its message lists at this path
            (``data.messages``, ``turns[*].messages``).

    >>> load_trace("/nonexistent/*.jsonl")
    Traceback (most recent call last):
    ...
    ValueError: path: no log files given (or the glob matched nothing)
    """
    arg = path_or_paths_or_glob
    if isinstance(arg, (str, os.PathLike)):
        p = os.fspath(arg)
        if os.path.isdir(p):
            paths = sorted(os.path.join(d, n) for d, _, names in os.walk(p) for n in names if not n.startswith("."))
        elif any(ch in p for ch in "*?["):
            paths = sorted(_glob.glob(p, recursive=True))
        else:
            paths = [p]
    else:
        paths = [os.fspath(x) for x in arg]
    return Trace(paths, format, progress=progress, session_key=session_key, messages_path=messages_path)
