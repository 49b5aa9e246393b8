"""Import speed and memory, and import + replay against kvlint, on generated logs.

1. `load_trace` (import) and `load_trace` + render + encode with the Qwen3 tokenizer and template (what
   `to_dump` does per call; the vocabulary is loaded before the clock starts) on generated OpenAI and Claude Code
   logs vs `json.loads` of the same lines (the floor: any reader must at least parse every line). Target: render
   + encode >= 0.5x json.loads. Two render rows: `+render` (the fast path: the qwen3 template in Python, pieces
   encoded with the tokenizer's own BPE model, incrementally per session) and `+plain` (`render(fast=False)`: the
   Jinja template and `tokenizer.encode`, what the fast path is checked against; the same ids, checked here too
   by a digest of every call's ids). The OpenAI log's sessions have --turns calls each (each call resends the
   history, so the JSON grows with the square of the session length and the new text to encode linearly).
2. `strata-lab replay LOG --engine vllm --engine sglang` (import, render, encode, replay under both caches) vs
   `kvlint analyze LOG --engine vllm --engine sglang` (PyPI `kvlint`, the same simulation) on one generated
   agent log of --agent-requests requests (issue: 3,000; default 600 to keep the run short), both with the same local tokenizer folder (the
   Qwen3 vocabulary and template; no hub access), each CLI end to end in its own process, in the same run.
   Target: >= 2x kvlint. Skipped (said so) when kvlint is not installed (`pip install kvlint`).

    PYTHONPATH=$PWD python benchmarks/traces.py              # 8 MB per log, 600 agent requests (a few minutes)
    PYTHONPATH=$PWD python benchmarks/traces.py --mb 500 --agent-requests 3000     # the issue's sizes
    PYTHONPATH=$PWD python benchmarks/traces.py --mb 50 --formats openai --skip kvlint --no-plain  # import only

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


def make_openai(path: str, mb: float, seed: int = 0, turns: int = 16) -> int:
    """Agent-like request logs: each line resends the whole conversation so far (request + response pair)."""
    rng, calls, s = random.Random(seed), 0, 0
    with open(path, "w") as f:
        while f.tell() < mb * 2**20:
            msgs = [{"role": "system", "content": _text(rng, 100, 300)}]
            for turn in range(turns):
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
    if mode in ("trace", "render", "plain"):  # imports and the vocabulary (seconds, once a process): not throughput
        from strata_lab import ChatTemplate, load_tokenizer, load_trace  # noqa: F401
        import strata_lab.traces.trace  # noqa: F401

        if mode in ("render", "plain"):
            tok, tmpl = load_tokenizer("qwen3"), ChatTemplate.from_name("qwen3")
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
    elif mode in ("render", "plain"):
        import hashlib

        from strata_lab import load_trace

        from array import array

        n, digest, checking = 0, hashlib.blake2b(digest_size=8), 0.0
        for _, r in load_trace(path, format=fmt).render(tok, tmpl, fast=mode == "render"):
            n += 1
            t1 = time.perf_counter()  # the check of the ids is not the render's time
            digest.update(array("q", r.prompt_ids).tobytes() + b"|" + array("q", r.gen_ids).tobytes() + b";")
            checking += time.perf_counter() - t1
        seconds = time.perf_counter() - t0 - checking
        print(json.dumps({"seconds": seconds, "n": n, "ids": digest.hexdigest(),
                          "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
        return
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
    ap.add_argument("--mb", type=float, default=8.0, help="size of each generated log in MB (issue: 500)")
    ap.add_argument("--agent-requests", type=int, default=600,
                    help="requests in the log replayed against kvlint (issue: 3000)")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: import, kvlint")
    ap.add_argument("--formats", default="openai,claude-code", help="logs of the import table: openai, claude-code")
    ap.add_argument("--turns", type=int, default=16, help="calls per session in the OpenAI log")
    ap.add_argument("--no-plain", dest="plain", action="store_false",
                    help="skip the plain (Jinja + tokenizer.encode) render row: it is the slow one")
    ap.add_argument("--repeat", type=int, default=2, help="runs per reader; the fastest counts (noisy machines)")
    ap.add_argument("--child", nargs=3, metavar=("MODE", "FORMAT", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    if "import" not in args.skip.split(","):
        import_table(args)
    if "kvlint" not in args.skip.split(","):
        kvlint_table(args)


def import_table(args) -> None:
    idle = run_child("idle", "-", "-")["rss_mb"]
    print(f"{'format':<12} {'MB':>6} {'calls':>8} {'reader':<10} {'MB/s':>7} {'calls/s':>9} {'x json.loads':>12} "
          f"{'peak RSS over idle MB':>22}")
    makers = {"openai": lambda p: make_openai(p, args.mb, turns=args.turns),
              "claude-code": lambda p: make_claude_code(p, args.mb)}
    formats = [f for f in args.formats.split(",") if f]
    unknown = sorted(set(formats) - set(makers))
    if unknown:
        raise SystemExit(f"--formats: unknown {', '.join(unknown)}; known: {', '.join(makers)}")
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in formats:
            path = os.path.join(tmp, f"{fmt}.jsonl")
            calls = makers[fmt](path)
            mb = os.path.getsize(path) / 2**20
            best = {}
            # interleaved, so that every reader sees the same load on a shared machine
            for _ in range(args.repeat):
                for mode in ("json", "trace", "render") + (("plain",) if args.plain else ()):
                    r = run_child(mode, fmt, path)
                    if mode not in best or r["seconds"] < best[mode]["seconds"]:
                        best[mode] = r
            assert best["trace"]["n"] == calls, (best["trace"]["n"], calls)
            if "plain" in best:  # the fast path gives the plain path's ids, call by call
                assert best["plain"]["ids"] == best["render"]["ids"], "fast and plain render differ"
            rows = [("json.loads", best["json"]), ("load_trace", best["trace"]), ("+render", best["render"])]
            if "plain" in best:
                rows.append(("+plain", best["plain"]))
            for name, r in rows:
                print(f"{fmt:<12} {mb:>6.0f} {calls:>8} {name:<10} {mb / r['seconds']:>7.1f} "
                      f"{calls / r['seconds']:>9.0f} {best['json']['seconds'] / r['seconds']:>12.2f} "
                      f"{r['rss_mb'] - idle:>22.1f}")


def make_agent(path: str, requests: int, seed: int = 2) -> int:
    """Agent sessions as request bodies (what kvlint reads, and our OpenAI reader): system prompt, then user /
    assistant / tool turns, each request resending the conversation so far, with a `session_id`."""
    rng, n, s = random.Random(seed), 0, 0
    with open(path, "w") as f:
        while n < requests:
            msgs = [{"role": "system", "content": _text(rng, 200, 600)}]
            for turn in range(rng.randrange(10, 30)):
                if n >= requests:
                    break
                msgs.append({"role": "user" if turn % 3 == 0 else "tool", "content": _text(rng, 20, 300)})
                f.write(json.dumps({"model": "m", "session_id": f"s{s}", "request_id": f"r{n}", "timestamp": float(n),
                                    "messages": msgs}) + "\n")
                msgs = msgs + [{"role": "assistant", "content": _text(rng, 10, 120)}]
                n += 1
            s += 1
    return n


def _tokenizer_folder(folder: str) -> str:
    """A model folder both tools load offline: our Qwen3 tokenizer.json and the qwen3 chat template."""
    from strata_lab import ChatTemplate, load_tokenizer

    os.makedirs(folder, exist_ok=True)
    load_tokenizer("qwen3").save(os.path.join(folder, "tokenizer.json"))
    cfg = {"chat_template": ChatTemplate.from_name("qwen3").source, "eos_token": "<|im_end|>",
           "pad_token": "<|endoftext|>", "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 20}
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f)
    return folder


def _timed(cmd: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({out.returncode}): {out.stderr[-2000:]}")
    return seconds, out.stdout


def kvlint_table(args) -> None:
    import shutil

    kvlint = shutil.which("kvlint")
    if kvlint is None:
        print("kvlint: not installed (pip install kvlint); the import + replay comparison is skipped")
        return
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "agent.jsonl")
        n = make_agent(log, args.agent_requests)
        folder = _tokenizer_folder(os.path.join(tmp, "qwen3-folder"))
        ours_cmd = [sys.executable, "-m", "strata_lab", "replay", log, "--format", "openai", "--tokenizer", folder,
                    "--engine", "vllm", "--engine", "sglang", "--quiet", "--json", os.path.join(tmp, "ours.json")]
        theirs_cmd = [kvlint, "analyze", log, "--model", folder, "--engine", "vllm", "--engine", "sglang",
                      "--json", os.path.join(tmp, "kvlint.json")]
        env_note = "HF_HUB_OFFLINE=1"
        os.environ["HF_HUB_OFFLINE"] = "1"
        best = {}
        for name, cmd in (("kvlint analyze", theirs_cmd), ("strata-lab replay", ours_cmd)):
            best[name] = min(_timed(cmd)[0] for _ in range(args.repeat))
        with open(os.path.join(tmp, "ours.json")) as f:
            ours = {e["engine"]: e for e in json.load(f)["engines"]}
        with open(os.path.join(tmp, "kvlint.json")) as f:
            theirs = json.load(f)
        print(f"\nimport + replay under vLLM and SGLang, {n} agent requests, same tokenizer folder ({env_note}):")
        print(f"{'tool':<20} {'seconds':>8} {'requests/s':>11} {'x kvlint':>9}")
        for name, sec in best.items():
            print(f"{name:<20} {sec:>8.2f} {n / sec:>11.0f} {best['kvlint analyze'] / sec:>9.2f}")
        print("same simulation: (hit rate, prompt tokens) ours "
              + ", ".join(f"{k} ({v['hit_rate']:.4f}, {v['prompt_tokens']})" for k, v in ours.items())
              + "; kvlint " + ", ".join(f"{k} {v}" for k, v in _kvlint_rates(theirs).items()))


def _kvlint_rates(doc) -> dict:
    """Per engine: (hit rate, prompt tokens) from kvlint's JSON report (`sims`, one per engine)."""
    return {sim["engine"]: (round(sim["hit_rate"], 4), sum(r["prompt_tokens"] for r in sim["per_request"]))
            for sim in doc.get("sims", ())}


if __name__ == "__main__":
    main()
