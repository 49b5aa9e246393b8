"""Import speed and memory: `load_trace` on generated OpenAI and Claude Code logs vs `json.loads` of the same
lines (the floor: any reader must at least parse every line).

    PYTHONPATH=$PWD python benchmarks/traces.py              # 48 MB per log (about a minute here)
    PYTHONPATH=$PWD python benchmarks/traces.py --mb 500     # the issue's size

Each measurement runs in a fresh child process so its peak RSS is its own; the table prints MB/s, calls/s,
the ratio to json.loads in the same run (fastest of --repeat runs each), and the child's peak RSS above an idle
child's (bounded memory: it must not grow with the file).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time

WORDS = ("the cache prefix token prompt engine replay session model tool result read file write test fails "
         "because assert value expected actual line function returns list dict").split()


def _text(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randrange(lo, hi)))


def make_openai(path: str, mb: float, seed: int = 0) -> int:
    """Agent-like request logs: each line resends the whole conversation so far (request + response pair)."""
    rng, calls, s = random.Random(seed), 0, 0
    with open(path, "w") as f:
        while f.tell() < mb * 2**20:
            msgs = [{"role": "system", "content": _text(rng, 100, 300)}]
            for turn in range(16):
                msgs.append({"role": "user", "content": _text(rng, 10, 80)} if turn % 2 == 0 else
                            {"role": "tool", "tool_call_id": f"c{s}_{turn - 1}", "content": _text(rng, 50, 400)})
                reply = {"role": "assistant", "content": None,
                         "tool_calls": [{"id": f"c{s}_{turn}", "type": "function",
                                         "function": {"name": "read_file", "arguments": json.dumps({"path": f"f{turn}.py"})}}]} \
                    if turn % 2 == 0 else {"role": "assistant", "content": _text(rng, 20, 120)}
                f.write(json.dumps({"request": {"model": "m", "messages": msgs},
                                    "response": {"id": f"r{calls}", "choices": [{"message": reply, "finish_reason": "stop"}],
                                                 "usage": {"prompt_tokens": 100 * len(msgs), "completion_tokens": 50,
                                                           "prompt_tokens_details": {"cached_tokens": 90 * len(msgs)}}}}) + "\n")
                msgs = msgs + [reply]
                calls += 1
            s += 1
    return calls


def make_claude_code(path: str, mb: float, seed: int = 1) -> int:
    """Claude Code sessions: one event per line (user text, assistant tool_use, tool_result, assistant text)."""
    rng, calls, s = random.Random(seed), 0, 0
    with open(path, "w") as f:
        while f.tell() < mb * 2**20:
            sid, parent = f"session-{s}", None
            for turn in range(40):
                uid = f"{sid}-{turn}"
                if turn % 2 == 0:
                    content = _text(rng, 10, 80) if turn % 4 == 0 else [
                        {"type": "tool_result", "tool_use_id": f"t{uid}", "content": _text(rng, 50, 600)}]
                    f.write(json.dumps({"type": "user", "sessionId": sid, "uuid": uid, "parentUuid": parent,
                                        "isSidechain": False, "timestamp": "2026-11-30T10:00:00.000Z",
                                        "message": {"role": "user", "content": content}}) + "\n")
                else:
                    block = {"type": "tool_use", "id": f"t{sid}-{turn + 1}", "name": "Read",
                             "input": {"file_path": f"/p/f{turn}.py"}} if turn % 4 == 1 else \
                        {"type": "text", "text": _text(rng, 20, 150)}
                    f.write(json.dumps({"type": "assistant", "sessionId": sid, "uuid": uid, "parentUuid": parent,
                                        "isSidechain": False, "timestamp": "2026-11-30T10:00:01.000Z",
                                        "message": {"id": f"msg_{uid}", "model": "claude", "role": "assistant",
                                                    "content": [block], "usage": {"input_tokens": 5,
                                                    "cache_creation_input_tokens": 100, "cache_read_input_tokens": 1000 * turn,
                                                    "output_tokens": 30}}}) + "\n")
                    calls += 1
                parent = uid
            s += 1
    return calls


def child(mode: str, fmt: str, path: str) -> None:
    t0 = time.perf_counter()
    if mode == "idle":
        import strata_lab.traces.trace  # noqa: F401  what every import run loads anyway
        n = 0
    elif mode == "json":
        n = 0
        with open(path, "rb") as f:
            for line in f:
                json.loads(line)
                n += 1
    else:
        from strata_lab import load_trace

        n = sum(1 for _ in load_trace(path, format=fmt))
    seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "n": n, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def run_child(mode: str, fmt: str, path: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", mode, fmt, path], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=48.0, help="size of each generated log in MB (issue: 500)")
    ap.add_argument("--repeat", type=int, default=2, help="runs per reader; the fastest counts (noisy machines)")
    ap.add_argument("--child", nargs=3, metavar=("MODE", "FORMAT", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    idle = run_child("idle", "-", "-")["rss_mb"]
    print(f"{'format':<12} {'MB':>6} {'calls':>8} {'reader':<10} {'MB/s':>7} {'calls/s':>9} {'x json.loads':>12} "
          f"{'peak RSS over idle MB':>22}")
    with tempfile.TemporaryDirectory() as tmp:
        for fmt, make in (("openai", make_openai), ("claude-code", make_claude_code)):
            path = os.path.join(tmp, f"{fmt}.jsonl")
            calls = make(path, args.mb)
            mb = os.path.getsize(path) / 2**20
            floor = min((run_child("json", fmt, path) for _ in range(args.repeat)), key=lambda r: r["seconds"])
            ours = min((run_child("trace", fmt, path) for _ in range(args.repeat)), key=lambda r: r["seconds"])
            assert ours["n"] == calls, (ours["n"], calls)
            for name, r in (("json.loads", floor), ("load_trace", ours)):
                print(f"{fmt:<12} {mb:>6.0f} {calls:>8} {name:<10} {mb / r['seconds']:>7.1f} "
                      f"{calls / r['seconds']:>9.0f} {floor['seconds'] / r['seconds']:>12.2f} "
                      f"{r['rss_mb'] - idle:>22.1f}")


if __name__ == "__main__":
    main()
