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


def _replay_input(args: argparse.Namespace, tmp: str):
    """A Dump for `replay`: strata dumps as they are; any other log imported through Trace.to_dump."""
    from strata_lab.dump import load_dump
    from strata_lab.traces.trace import load_trace

    import warnings

    from strata_lab.traces.source import TraceWarning

    from strata_lab.dump import is_store

    paths = args.dump if len(args.dump) > 1 else args.dump[0]
    if isinstance(paths, str) and is_store(paths):  # a Parquet store (strata-lab convert)
        return load_dump(paths)
    rows = _load_tokenizer(args.tokenizer).embedding_rows  # ids past the model's rows make a line bad
    try:
        with warnings.catch_warnings():  # a dumps/ folder holds a README: only say so if it is not all dumps
            warnings.simplefilter("ignore", TraceWarning)
            trace = load_trace(paths, format=args.format, progress=not args.quiet)
    except ValueError:
        names = [paths] if isinstance(paths, str) else list(paths)
        if args.format is not None or not all(str(n).endswith(".jsonl") for n in names):
            raise
        return load_dump(paths, vocab_size=rows)  # no format to detect (empty, or no valid line): a dump
    if trace.formats == ["strata"]:
        return load_dump(paths, vocab_size=rows)
    _describe(trace)
    return trace.to_dump(args.tokenizer, args.template, os.path.join(tmp, "imported.jsonl"))


def _cmd_import(args: argparse.Namespace) -> int:
    from collections import Counter

    from strata_lab.traces.trace import load_trace

    trace = load_trace(args.log if len(args.log) > 1 else args.log[0], format=args.format, progress=not args.quiet)
    _describe(trace)
    if args.out.endswith(".parquet"):
        df = trace.to_frame()
        trace.write(args.out)
        fidelity = Counter(df["fidelity"].astype(str))
        print(f"{len(df)} calls in {df['session'].nunique()} sessions "
              f"({', '.join(f'{n} {k}' for k, n in sorted(fidelity.items()))}) -> {args.out}")
        return 0
    if not args.out.endswith(".jsonl"):
        raise ValueError(f"--out: {args.out} must end in .parquet (trace table) or .jsonl (strata-dump/1)")
    dump = trace.to_dump(args.tokenizer, args.template, args.out)
    records = dump.records()
    reported = [r for r in records if r.get("render_exact") is not None]
    exact = sum(bool(r["render_exact"]) for r in reported)
    print(f"{len(records)} calls in {len({r['session'] for r in records})} sessions -> {args.out}")
    if reported:
        print(f"render check: {exact}/{len(reported)} calls render to exactly the prompt_tokens the log reports"
              + ("" if exact == len(reported) else " (another template or tokenizer than the server's?)"))
    return 0


def _cmd_replay(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="strata-replay-") as tmp:  # an imported log's rendered dump
        return _replay(args, _replay_input(args, tmp))


def _replay(args: argparse.Namespace, dump) -> int:
    from strata_lab.replayer import compare_policies, replay

    if type(dump).__name__ == "Dump" and next(iter(dump), None) is None:
        raise ValueError(f"no engine calls in {', '.join(dump.paths)}: the dump is empty or every line was "
                         "skipped (see the warnings above); nothing to replay")
    if args.engine:
        return _replay_engines(dump, args)

    kw = dict(model=args.model, checkpoint_policy=args.checkpoints, tokenizer=args.tokenizer,
              full_hit=args.full_hit)
    report = replay(dump, policy="recorded", progress=not args.quiet, cluster=args.dask, **kw)
    print(report.format(worst=args.worst))
    table = None
    if args.policy:
        policies = ["recorded"] + [p for p in args.policy if p != "recorded"]
        table = compare_policies(dump, policies, cost_model=report.cost_model, **kw)
        print("\npolicy comparison:")
        print(table.to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    if args.png:
        from strata_lab.notebook.plots import plot_report

        plot_report(report.to_frame(), args.png, policies=table)
        print(f"\nwrote {args.png}")
    return 0


def _replay_engines(dump, args: argparse.Namespace) -> int:
    from strata_lab.caches.replay import replay_engines

    report = replay_engines(dump, args.engine, tokenizer=args.tokenizer, progress=not args.quiet and not args.json)
    if args.json:
        text = report.to_json()
        if args.json == "-":
            sys.stdout.write(text)
        else:
            with open(args.json, "w", encoding="utf-8") as f:
                f.write(text)
            print(f"wrote {args.json}")
        return 0
    print(report.format())
    if args.png:
        from strata_lab.caches.sweeps import plot_engines

        plot_engines(report, args.png)
        print(f"\nwrote {args.png}")
    return 0


def _cmd_lint(args: argparse.Namespace) -> int:
    from strata_lab.caches.calls import write_calls
    from strata_lab.caches.lint import before_after, fix_calls, lint_calls
    from strata_lab.dump import load_dump

    dump = load_dump(args.dump if len(args.dump) > 1 else args.dump[0])
    if type(dump).__name__ == "Dump" and next(iter(dump), None) is None:  # not a clean "0 findings"
        raise ValueError(f"no engine calls in {', '.join(dump.paths)}: the dump is empty or every line was "
                         "skipped (see the warnings above); nothing to lint")
    engines = args.engine or ["vllm", "sglang", "llama.cpp", "anthropic"]
    findings = lint_calls(dump, args.tokenizer, engines=engines)
    for f in findings:
        print(f)
    print(f"{len(findings)} finding(s)")
    if args.fix:
        fixed = fix_calls(dump, findings, tokenizer=args.tokenizer)
        write_calls(fixed, args.fix)
        print(f"wrote {args.fix}\n")
        print(before_after(dump, fixed, engines).to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    return 1 if findings and not args.fix else 0


def _cmd_convert(args: argparse.Namespace) -> int:
    from strata_lab.dump import Store, convert_jsonl

    if args.to_jsonl:
        if len(args.dump) != 1:
            raise ValueError("dump: --to-jsonl reads one store")
        n = Store(args.dump[0]).to_jsonl(args.out)
        print(f"wrote {n} lines to {args.out}")
        return 0
    info = convert_jsonl(args.dump, args.out, row_group_rows=args.row_group, progress=not args.quiet)
    ratio = info["bytes_in"] / info["bytes_out"] if info["bytes_out"] else float("nan")
    print(f"{info['lines']} calls ({info['skipped']} bad lines skipped): {info['bytes_in'] / 2**20:.1f} MB JSONL -> "
          f"{info['bytes_out'] / 2**20:.1f} MB Parquet ({ratio:.1f}x smaller) in {args.out}")
    return 0
