"""The one dump writer against the unsafe buffered write it replaced, in the same run.

    PYTHONPATH=$PWD python benchmarks/dump_writer.py [--calls 3000] [--prompt 2000] [--reps 12]

"plain" is what `Trace.to_dump` and `write_calls` did before: `os.open(O_TRUNC, 0o600)` (follows a symbolic
link, leaves a 0644 file at 0644) and a 1 MB buffered file. "one writer" is `strata_lab.dump.writer.write_records`
(O_NOFOLLOW, regular file only, narrowed to 0600, whole lines gathered 64 per writev). Reported: the median of
the per-repetition ratios one writer / plain (1.0 = as fast), interleaved so both see the same machine load.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import orjson

from strata_lab.dump.writer import write_records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--prompt", type=int, default=2000, help="prompt ids per call")
    ap.add_argument("--reps", type=int, default=12)
    args = ap.parse_args()
    recs = [{"schema": "strata-dump/1", "session": f"s{i % 50}", "call": i, "prompt_ids": list(range(args.prompt)),
             "gen_ids": [1] * 50} for i in range(args.calls)]
    d = tempfile.mkdtemp(prefix="strata-bench-writer-")

    def plain():
        fd = os.open(os.path.join(d, "plain.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb", buffering=1 << 20) as f:
            for r in recs:
                f.write(orjson.dumps(r) + b"\n")

    def one_writer():
        write_records(recs, os.path.join(d, "one.jsonl"))

    ratios = []
    for _ in range(args.reps):
        t = time.perf_counter()
        plain()
        a = time.perf_counter() - t
        t = time.perf_counter()
        one_writer()
        b = time.perf_counter() - t
        ratios.append(b / a)
    ratios.sort()
    mb = os.path.getsize(os.path.join(d, "one.jsonl")) / 2**20
    print(f"{args.calls} calls, {mb:.1f} MB: one writer / plain = {ratios[len(ratios) // 2]:.2f} (median of "
          f"{args.reps}; range {ratios[0]:.2f}-{ratios[-1]:.2f})")


if __name__ == "__main__":
    main()
