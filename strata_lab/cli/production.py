"""`strata-lab sweep | export`: capacity and policy sweeps over a trace, and publishing a dump as an anonymous
Mooncake / Qwen-Bailian hash trace."""
from __future__ import annotations

import argparse


MAX_TOKENS = 10**12   # a cache of a trillion tokens is past any trace; larger values are typos or attacks


def _capacity(text: str, option: str = "--capacity"):
    t = text.strip().lower()
    if t in ("none", "inf", "unbounded"):
        return None
    try:
        v = float(t)
    except ValueError:
        raise ValueError(f"{option} must be tokens (1e6, 3000000) or 'unbounded', got {text[:40]!r}") from None
    if not 1 <= v <= MAX_TOKENS or v != int(v):
        raise ValueError(f"{option} must be a whole number of tokens in 1..{MAX_TOKENS:.0e} (or 'unbounded'), "
                         f"got {text[:40]!r}")
    return int(v)


def _bounded(args: argparse.Namespace) -> None:
    """The integer options of `sweep`, in range before any work."""
    if args.dask is not None and not args.dask.strip():
        raise ValueError("--dask must be 'local[:N]' or a scheduler's address, got an empty value")
    for name, low, high in (("replicas", 1, 1024), ("block", 1, 1 << 16)):
        v = getattr(args, name)
        if not low <= v <= high:
            raise ValueError(f"--{name} must be in {low}..{high}, got {v}")


def _trace_input(paths: list[str], progress: bool = False):
    from strata_lab.traces.opener import open_hash_trace

    hashed = open_hash_trace(paths, progress=progress)  # a production hash trace: its columns, no tokenizer
    if hashed is not None:
        return hashed
    return paths if len(paths) > 1 else paths[0]


def _cmd_sweep(args: argparse.Namespace) -> int:
    from strata_lab.caches.capacity import plot_sweep, sweep

    _bounded(args)
    caps = [_capacity(c) for c in args.capacity] if args.capacity else None
    tier2 = _capacity(args.tier2, "--tier2") if args.tier2 else None
    df = sweep(_trace_input(args.trace, not args.quiet), capacities=caps, policies=args.policy or ("lru", "lfu", "atc25", "vllm"),
               tier2=tier2, replicas=args.replicas, routing=args.routing, block=args.block, dask=args.dask,
               progress=not args.quiet)
    show = df.drop(columns="note")
    show["hit_rate"] = (100 * show["hit_rate"]).round(2)
    show["tier2_hit_rate"] = (100 * show["tier2_hit_rate"]).round(2)
    print(show.to_string(index=False))
    for note in dict.fromkeys(n for n in df["note"] if n):   # a policy that is another one here (the CSV has it too)
        print(f"note: {note}")
    from strata_lab.cli.outputs import output

    if args.csv:
        with output(args.csv) as csv:
            df.to_csv(csv, index=False)
        print(f"-> {args.csv}")
    if args.png:
        with output(args.png) as png:
            plot_sweep(df, png, title=", ".join(args.trace))
        print(f"-> {args.png}")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    import tempfile

    if args.min_sessions < 1:
        raise ValueError(f"--min-sessions must be >= 1, got {args.min_sessions}")
    if args.block is not None and not 1 <= args.block <= 1 << 16:
        raise ValueError(f"--block must be in 1..{1 << 16}, got {args.block}")
    from strata_lab.caches.export import export_trace
    from strata_lab.cli.analysis import _replay_input
    from strata_lab.traces.opener import open_hash_trace

    with tempfile.TemporaryDirectory(prefix="strata-export-") as tmp:
        src = open_hash_trace(args.dump, progress=not args.quiet)  # a hash trace re-exported from its columns
        if src is None:   # dumps and stores as they are; any other log imported (rendered with --tokenizer) first
            src = _replay_input(args, tmp)
        from strata_lab.cli.outputs import output

        with output(args.out) as out:
            n = export_trace(src, out, format=args.to, block=args.block, salt=args.salt,
                             min_sessions=args.min_sessions, progress=not args.quiet)
    print(f"{n} requests -> {args.out} ({args.to}, no text or ids: salted block hashes as integers)")
    return 0


def add_parsers(sub) -> None:
    p = sub.add_parser("sweep", help="hit rate against cache capacity per eviction policy (Mooncake/Bailian traces, "
                                     "dumps, stores)")
    p.add_argument("trace", nargs="+", help="a Mooncake or Bailian JSONL trace, strata-dump/1 files or a store")
    p.add_argument("--capacity", action="append", default=[],
                   help="cache size in tokens (repeatable; 'unbounded' too; default 1e4 .. 1e9)")
    p.add_argument("--policy", action="append", default=[],
                   help="lru, lfu, fifo, atc25 (block policies) or vllm, sglang, sglang-lfu, trtllm, an engine spec "
                        "(repeatable; default lru, lfu, atc25, vllm)")
    p.add_argument("--tier2", help="second-tier tokens (host RAM / SSD) for the block policies")
    p.add_argument("--replicas", type=int, default=1, help="with K > 1: also K per-replica caches of capacity / K")
    p.add_argument("--routing", default="session", choices=["session", "round_robin", "prefix_hash"],
                   help="how per-replica caches get requests: by session, in turn, or by the first block's hash")
    p.add_argument("--block", type=int, default=16, help="block tokens of the block policies on id-level dumps")
    p.add_argument("--dask", metavar="ADDRESS|local[:N]", help="run the points on Dask")
    p.add_argument("--csv", help="write the table here")
    p.add_argument("--png", help="write the hit-rate-vs-capacity plot here")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_sweep)

    p = sub.add_parser("export", help="write a dump or store as an anonymous Mooncake / Bailian hash trace")
    p.add_argument("dump", nargs="+", help="strata-dump/1 files, a store, a hash trace, or any log `strata-lab "
                                          "import` reads")
    p.add_argument("--format", dest="to", required=True, choices=["mooncake", "bailian"], help="trace format to write")
    p.add_argument("--log-format", dest="format", help="format of the input log (default: detected)")
    p.add_argument("--tokenizer", help="renders message-level logs: qwen3 (the default), qwen3.5, or a HF model "
                                       "folder / tokenizer.json; dumps and stores are hashed as their ids are, "
                                       "checked against it only when it is given")
    p.add_argument("--template", help="chat template for message-level logs (default: the tokenizer's folder, "
                                      "else qwen3)")
    p.add_argument("--out", required=True, help="the JSONL trace to write")
    p.add_argument("--block", type=int, help="tokens per hash block (default: 512 mooncake, 16 bailian)")
    p.add_argument("--salt", help="hash key (default: a fresh random one per export, so block hashes cannot be "
                                  "matched across exports; give one to make exports reproducible and comparable)")
    p.add_argument("--min-sessions", type=int, default=3, metavar="K",
                   help="a block keeps its shared hash only when at least K distinct sessions hold it; rarer "
                        "blocks get a hash of their own per session, reuse kept within it (default 3; 1 keeps "
                        "all reuse; see "
                        "docs/FORMATS.md for what an export protects)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_export)
