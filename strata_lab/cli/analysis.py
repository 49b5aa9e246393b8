"""`strata-lab import | replay | lint | convert`: the commands that read dumps, stores and other tools' logs."""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

from strata_lab.cli.commands import _load_tokenizer


def _describe(trace) -> None:
    for path, (fmt, why) in trace.detected.items():
        print(f"{path}: {fmt} ({why})")


def _replay_input(args: argparse.Namespace, tmp: str, *, vocab_limit: bool = True):
    """A Dump for `replay` and `lint`: stores and strata dumps as they are; any other log imported through
    Trace.to_dump (the library's `open_source` says which). `vocab_limit`: a dump's lines with ids past the
    tokenizer's rows are skipped (lint reads them all: a hash trace's placeholder ids are refused by name)."""
    from strata_lab.dump import is_store
    from strata_lab.traces.opener import open_source

    paths = args.dump if len(args.dump) > 1 else args.dump[0]
    # no --tokenizer (export): ids are taken as they are (hashing them needs none); logs render with qwen3
    tokenizer = args.tokenizer
    if isinstance(paths, str) and is_store(paths):  # a Parquet store (strata-lab convert): ids and models
        from strata_lab.dump import Store      # checked against --tokenizer before any work

        return Store(paths, tokenizer=None if tokenizer is None else _load_tokenizer(tokenizer))
    if tokenizer is not None:
        _load_tokenizer(tokenizer)  # a bad --tokenizer fails before any work
    src = open_source(paths, format=args.format, progress=not args.quiet,
                      session_key=getattr(args, "session_key", None),
                      messages_path=getattr(args, "messages_path", None))
    if src.kind == "dump":
        if tokenizer is None:
            from strata_lab.dump import load_dump

            return load_dump(paths)
        return _checked(paths, tokenizer, vocab_limit=vocab_limit)
    trace = src.source
    _describe(trace)
    dump = trace.to_dump(tokenizer or "qwen3", args.template, os.path.join(tmp, "imported.jsonl"),
                         progress=not args.quiet)
    empty = [f"{p}: no calls: {st['why_none']}" for p, st in trace.stats.items() if not st["calls"]]
    if empty and len(empty) == len(trace.stats):
        raise ValueError("; ".join(empty))
    total = sum(st["calls"] for st in trace.stats.values())
    if total and len(trace.render_skipped) == total:
        src, why = trace.render_skipped[0]
        raise ValueError(f"none of the {total} calls could be rendered with --template {args.template or 'default'} "
                         f"(first: {src}: {why}); nothing to replay")
    if getattr(args, "json", None) != "-":  # --json - keeps stdout to the JSON report
        _print_checks(trace)
    return dump


def _file_report(trace, records=None) -> list[str]:
    """Per file: format and why, calls, sessions, calls rendered exactly, usage found, notes, what it reports."""
    from collections import Counter

    by_file: dict = {}
    for r in records or ():
        by_file.setdefault(str(r.get("source", "")).rsplit(":", 1)[0], []).append(r)
    lines = []
    for path, st in trace.stats.items():
        lines.append(f"{path}: {st['format']} ({st['why']})")
        fid = ", ".join(f"{n} {k}" for k, n in sorted(st["fidelity"].items()))
        lines.append(f"  {st['calls']} calls in {len(st['sessions'])} sessions" + (f" ({fid})" if fid else "")
                     + (f", {st['skipped']} records skipped" if st["skipped"] else ""))
        if records is not None and st["calls"]:
            recs = by_file.get(path, [])
            reported = [r for r in recs if r.get("render_exact") is not None]
            exact = sum(bool(r["render_exact"]) for r in reported)
            lines.append(f"  rendered: {len(recs)} of {st['calls']} calls; " + (
                f"{exact} of {len(reported)} render to exactly the prompt_tokens the log reports"
                + ("" if exact == len(reported) else " (another template or tokenizer than the server's?)")
                if reported else "the log reports no prompt_tokens to check the render against"))
        if st.get("joined"):
            lines.append(f"  {st['joined']} of its lines matched input lines on custom_id (those calls are counted "
                         "with the input file)")
        if st["calls"]:
            lines.append(f"  usage: reported on {st['usage']} of {st['calls']} calls, cached tokens on "
                         f"{st['cached']}")
        for note, n in Counter(st["notes"]).most_common():
            lines.append(f"  note: {note} ({n} calls)")
        for fact in st["facts"]:
            lines.append(f"  the log reports: {fact}")
    return lines


def _checked(paths, tokenizer: str, *, vocab_limit: bool = True, first: int = 256):
    """The dump at `paths`, once its first calls agree with `--tokenizer` (their ids are read with it): no
    id past its embedding rows, no model of another family. Later lines with such ids are skipped with a
    warning by the reader, as any bad line."""
    from itertools import islice

    from strata_lab.dump import load_dump

    tok = _load_tokenizer(tokenizer)
    rows = tok.embedding_rows
    dump = load_dump(paths)
    for rec in islice(iter(dump), first):
        where = rec.get("source") or f"{dump.paths[0]} call {rec.get('request_id') or rec.get('call')}"
        tok.check_model(rec.get("model"), what=f"the dump ({where})")
        if rec.get("synthetic_ids") is True:   # placeholder ids (a hash trace's blocks): no vocabulary's
            continue
        for name in ("prompt_ids", "gen_ids", "drained_ids"):
            if rec[name] and max(rec[name]) >= rows:
                raise ValueError(f"{name}: the dump ({where}) has id {max(rec[name])}, past the {rows} ids of "
                                 f"--tokenizer {tokenizer}: it was recorded with another tokenizer; pass that one")
    return load_dump(paths, vocab_size=rows) if vocab_limit else dump


def _cmd_import(args: argparse.Namespace) -> int:
    from strata_lab.traces.trace import load_trace

    from strata_lab.cli.outputs import output

    if getattr(args, "inspect", False):  # look, import nothing
        from strata_lab.traces.inspection import inspect_file

        if args.out is not None:
            raise ValueError("--inspect: imports nothing, so --out has no use with it")
        paths = load_trace(args.log if len(args.log) > 1 else args.log[0], format="generic").paths
        for path in paths:
            print("\n".join(inspect_file(path)))
        return 0
    if args.out is None:
        raise ValueError("--out: required: trace.parquet (the table) or dump.jsonl (rendered ids); or --inspect")
    if not args.out.endswith((".parquet", ".jsonl")):
        raise ValueError(f"--out: {args.out} must end in .parquet (trace table) or .jsonl (strata-dump/1)")
    trace = load_trace(args.log if len(args.log) > 1 else args.log[0], format=args.format, progress=not args.quiet,
                       session_key=args.session_key, messages_path=getattr(args, "messages_path", None))
    with output(args.out) as out:   # written beside --out and renamed at the end: a failed run leaves the old file
        if args.out.endswith(".parquet"):
            df = trace.to_frame()
            if len(df):
                trace.write(out)
            records = None
        else:
            records = trace.to_dump(args.tokenizer, args.template, out, progress=not args.quiet).records()
        total = sum(st["calls"] for st in trace.stats.values())
        if (total == 0 or records == []) and os.path.exists(out):
            os.remove(out)  # no empty dump left behind (nor an earlier file replaced by one)
    for line in _file_report(trace, records):
        print(line)
    # a file whose lines were joined to another file's calls (a batch output) is judged with that file
    empty = [(p, st["why_none"]) for p, st in trace.stats.items() if not st["calls"] and not st.get("joined")]
    if records is not None:
        _print_checks(trace)
    if total and records == []:  # every call read, none rendered: no dump
        src, why = trace.render_skipped[0] if trace.render_skipped else ("", "")
        print(f"strata-lab import: error: none of the {total} calls could be rendered with --template "
              f"{args.template or 'default'} (first: {src}: {why}); nothing written to {args.out}", file=sys.stderr)
        return 1
    for path, why in empty:
        print(f"strata-lab import: error: {path}: no calls: {why}", file=sys.stderr)
    if empty:
        return 1
    print(f"{total} calls in {len({s for st in trace.stats.values() for s in st['sessions']})} sessions "
          f"-> {args.out}")
    return 0


def _print_checks(trace, show: int = 20) -> None:
    """The render and reply checks: one line each for the count, then one per call that differs (never
    averaged away): where, ours, the log's."""
    if trace.render_skipped:
        print(f"{len(trace.render_skipped)} calls not rendered (skipped): " + "; ".join(
            f"{src}: {why}" for src, why in trace.render_skipped[:3]) + (" ..." if len(trace.render_skipped) > 3 else ""))
    for key, title, what, extra in (
            ("render", "render check", "render to exactly the prompt_tokens the log reports", len(trace.render_skipped)),
            ("reply", "reply check", "have a reconstructed reply of exactly the completion_tokens the log reports", 0)):
        checked, wrong = trace.checks.get(key, (0, []))
        if not checked:
            continue
        print(f"{title}: {checked - len(wrong)}/{checked + extra} calls {what}"
              + ("" if not wrong else " (another template or tokenizer than the server's?)"))
        for src, ours, theirs in wrong[:show]:
            print(f"  {src}: rendered {ours}, the log says {theirs} ({ours - theirs:+d})")
        if len(wrong) > show:
            print(f"  ... and {len(wrong) - show} more calls differ (see render_exact / reply_exact in the dump)")


def _cmd_replay(args: argparse.Namespace) -> int:
    from strata_lab.traces.hashtrace import is_hash_trace, load_hash_trace

    if args.rows < 0:
        raise ValueError(f"--rows must be >= 0 (calls shown per engine), got {args.rows}")
    if args.engine and len(args.dump) == 1 and args.format in (None, "mooncake", "bailian") and \
            is_hash_trace(args.dump[0]):   # a production hash trace: its own fast path, no tokenizer needed
        return _replay_engines(load_hash_trace(args.dump[0], args.format, progress=not args.quiet), args)
    with tempfile.TemporaryDirectory(prefix="strata-replay-") as tmp:  # an imported log's rendered dump
        return _replay(args, _replay_input(args, tmp))


def _replay(args: argparse.Namespace, dump) -> int:
    from strata_lab.dump import Dump

    if isinstance(dump, Dump) and next(iter(dump), None) is None:
        raise ValueError(f"no engine calls in {', '.join(dump.paths)}: the dump is empty or every line was "
                         "skipped (see the warnings above); nothing to replay")
    if args.dask:
        return _replay_dask(dump, args)
    return _replay_engines(dump, args)


def _strata_overrides(args: argparse.Namespace) -> dict:
    """--model / --checkpoints / --full-hit as given (None: the engine's own default): the strata engine's kind,
    checkpoints and full-hit rule."""
    over = {"kind": getattr(args, "model", None), "checkpoints": getattr(args, "checkpoints", None),
            "full_hit": getattr(args, "full_hit", None)}
    return {k: v for k, v in over.items() if v is not None}


def _engines(calls, args: argparse.Namespace) -> list:
    """The engines replayed: --engine, else the engine the trace names (our dumps: strata, recorded
    checkpoints); --model / --checkpoints / --full-hit set every strata engine's own settings."""
    from strata_lab.caches.presets import parse_engine
    from strata_lab.caches.replay import default_engine

    over = _strata_overrides(args)
    engines = [parse_engine(e) for e in (args.engine or [default_engine(calls)])]
    if over and not any(p.engine == "strata" for p in engines):
        raise ValueError(f"--model / --checkpoints / --full-hit set the strata engine; the engines replayed are "
                         f"{', '.join(p.spec() for p in engines)}")
    out = []
    for p in engines:
        # set even when equal to the preset's value: a setting given is never replaced by the dump's (for_calls)
        out.append(p.with_(**over) if over and p.engine == "strata" else p)
    return out


def _replay_engines(dump, args: argparse.Namespace) -> int:
    from strata_lab.caches.call_ids import calls_from_dump
    from strata_lab.caches.replay import replay_engines

    calls = calls_from_dump(dump, progress=not args.quiet)
    engines = _engines(calls, args)
    tok = getattr(args, "tokenizer", None)
    report = replay_engines(calls, engines, tokenizer=tok, progress=not args.quiet)   # bars on stderr
    return _emit(report, args, calls, engines)


def _emit(report, args: argparse.Namespace, calls=None, engines=None) -> int:
    if args.json:
        text = report.to_json()
        if args.json == "-":
            sys.stdout.write(text)
        else:
            from strata_lab.cli.outputs import output

            with output(args.json) as path, open(path, "w", encoding="utf-8") as f:
                f.write(text)
    else:
        print(report.format(worst=getattr(args, "worst", 5), rows=None if args.all_rows else args.rows))
    if getattr(args, "csv", None):   # every (engine, call) row, whatever the terminal shows
        from strata_lab.cli.outputs import output

        with output(args.csv) as path:
            report.frame().to_csv(path, index=False)
    policies = [p for p in getattr(args, "policy", None) or [] if p != "recorded"]
    table = None
    if policies and calls is not None:
        from strata_lab.caches.replay import replay_engines

        rows = []
        for pol in ["recorded"] + policies:
            rep = report if pol == "recorded" else replay_engines(calls, engines, tokenizer=args.tokenizer,
                                                                  cost_model=report.cost_model, policy=pol,
                                                                  progress=not args.quiet)
            rows += rep.summary()[["policy", "spec", "calls", "prompt_tokens", "reused", "read", "reread",
                                   "hit_rate", "reread_s"]].to_dict("records")
        import pandas as pd

        table = pd.DataFrame(rows)
        if not args.json:
            print("\npolicy comparison:")
            print(table.to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    say = (lambda text: print(text, file=sys.stderr)) if args.json == "-" else print   # stdout holds the JSON
    if args.json and args.json != "-":
        say(f"wrote {args.json}")
    if getattr(args, "csv", None):
        say(f"wrote {args.csv}")
    if getattr(args, "png", None):
        from strata_lab.cli.outputs import output

        with output(args.png) as png:
            if len(report.presets) == 1:
                from strata_lab.notebook.plots import plot_report

                plot_report(report.frame(), png, policies=table[table["spec"] == report.specs[0]]
                            if table is not None else None)
            else:
                from strata_lab.caches.sweeps import plot_engines

                plot_engines(report, png)
        say(f"\nwrote {args.png}")
    return 0


def _replay_dask(dump, args: argparse.Namespace) -> int:
    """--dask: a store replayed on a Dask cluster by the state model (one task per replica), into the same
    report as every other replay (engine strata)."""
    from strata_lab.caches.replay import replay
    from strata_lab.cli.commands import status

    if args.engine and any(e.split(":")[0].split("@")[0] != "strata" for e in args.engine):
        raise ValueError("--dask replays our engine (engine strata) only")
    status(f"replaying on Dask ({args.dask}): starting or connecting to the cluster, one task per replica "
           "...", args)
    over = {k: v for k, v in (("kind", args.model), ("checkpoints", args.checkpoints), ("full_hit", args.full_hit))
            if v}
    engine = args.engine[0] if args.engine else "strata"
    return _emit(replay(dump, engine, tokenizer=args.tokenizer, progress=not args.quiet, cluster=args.dask, **over),
                 args)


def _cmd_lint(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="strata-lint-") as tmp:  # an imported log's rendered dump
        return _lint(args, _replay_input(args, tmp, vocab_limit=False))


def _lint(args: argparse.Namespace, dump) -> int:
    from strata_lab.caches.call_ids import write_calls
    from strata_lab.caches.lint import (FIXABLE, REFERENCE_ENGINES, before_after, before_after_sessions, check_fixes,
                                        dump_engines, fix_table, lint_calls, replayed_engines)
    from strata_lab.cli.commands import status

    rows = _load_tokenizer(args.tokenizer).embedding_rows
    if any(rec.get("synthetic_ids") is True and max(rec["prompt_ids"]) >= rows for rec in dump):
        raise ValueError("the dump's ids are a hash trace's placeholders (synthetic_ids), not a tokenizer's: lint "
                         "reads the prompts' text, which such a trace does not have")
    if next(iter(dump), None) is None:
        raise ValueError(f"no engine calls in {', '.join(dump.paths)}: the dump is empty or every line was "
                         "skipped (see the warnings above); nothing to lint")
    engines = args.engine or dump_engines(dump)   # default: the engines the dump names
    tok = _load_tokenizer(args.tokenizer)
    status(f"linting {len(dump.records())} calls, pricing findings on {', '.join(engines)} ...", args)
    findings = lint_calls(dump, tok, engines=engines, template=getattr(args, "template", None),
                          progress=not args.quiet)
    for f in findings:
        print(f)
    print(f"{len(findings)} finding(s)")
    if not args.fix:
        return 1 if findings else 0
    fixable = [f for f in findings if f.rule in FIXABLE]
    if not fixable:
        print(f"nothing to fix: no finding is of a rule with a fix ({', '.join(FIXABLE)}); {args.fix} not written")
        return 0
    shown = replayed_engines(engines, REFERENCE_ENGINES)
    status(f"checking each fix on {', '.join(engines)} (and showing {', '.join(shown[len(engines):])}) ...", args)
    fixed, decisions = check_fixes(dump, fixable, tok, engines, template=getattr(args, "template", None),
                                   progress=not args.quiet)
    print()
    for d in decisions:
        print(f"{'kept' if d['kept'] else 'dropped'}: {d['rule']} in session(s) {', '.join(d['sessions'])}: {d['why']}")
        table = fix_table(d)
        if table:   # what the fix gains (or costs) on each engine; only those asked for decide
            print("\n".join("  " + line for line in table.splitlines()))
    if not any(d["kept"] for d in decisions):
        print(f"nothing to fix: no fix lowers the ids read on {', '.join(engines)} without making a session it "
              f"rewrites worse; {args.fix} not written")
        return 0
    from strata_lab.cli.outputs import output

    with output(args.fix) as out:
        write_calls(fixed, out)
    print(f"wrote {args.fix}\n")
    fmt = lambda x: f"{x:.3g}"  # noqa: E731
    print("per engine (judged: the engines asked for decide; the others are shown):")
    print(before_after(dump, fixed, shown, asked=engines).to_string(index=False, float_format=fmt))
    print("\nper session (ids read):")
    print(before_after_sessions(dump, fixed, engines).to_string(index=False))
    return 0


def _cmd_convert(args: argparse.Namespace) -> int:
    from strata_lab.dump import Store, convert_jsonl

    tok = _load_tokenizer(args.tokenizer) if args.tokenizer is not None else None
    if args.to_jsonl:
        if len(args.dump) != 1:
            raise ValueError("dump: --to-jsonl reads one store")
        from strata_lab.cli.outputs import output

        with output(args.out) as out:
            n = Store(args.dump[0], tokenizer=tok).to_jsonl(out)
        print(f"wrote {n} lines to {args.out}")
        return 0
    if tok is not None:  # the first calls agree with --tokenizer; later lines past its ids are skipped
        _checked(args.dump if len(args.dump) > 1 else args.dump[0], args.tokenizer, vocab_limit=False)
    from strata_lab.cli.outputs import output

    with output(args.out, directory=True) as out:   # a new store is made under a temporary name first
        info = convert_jsonl(args.dump, out, row_group_rows=args.row_group, progress=not args.quiet,
                             vocab_size=None if tok is None else tok.embedding_rows)
    ratio = info["bytes_in"] / info["bytes_out"] if info["bytes_out"] else float("nan")
    print(f"{info['lines']} calls ({info['skipped']} bad lines skipped): {info['bytes_in'] / 2**20:.1f} MB JSONL -> "
          f"{info['bytes_out'] / 2**20:.1f} MB Parquet ({ratio:.1f}x smaller) in {args.out}")
    return 0
