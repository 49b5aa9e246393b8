"""Import speed and memory, and import + replay against kvlint, on generated logs.

1. `load_trace` (import) and `load_trace` + render + encode with the Qwen3 tokenizer and template (what
   `to_dump` does per call; the vocabulary is loaded before the clock starts) on generated OpenAI and Claude Code
   logs vs `json.loads` of the same lines (the floor: any reader must at least parse every line; the vocabulary
   and, for the fast path, its native BPE tables, strata/byte_bpe.h, are built before the clock). Target: render
   + encode >= 0.5x json.loads. Two render rows: `+render` (the fast path: a line parsed after the prefix it
   shares with its session's previous line, messages converted and chained only where they are new, the
   template rendered by `ChatTemplate` (Jinja, as for every template), what a prompt adds to its session's
   previous one encoded with the tokenizer's own BPE model) and `+plain` (`render(fast=False)`: the same
   render and `tokenizer.encode` of every whole prompt, what the fast path is checked against; the same ids,
   checked here too by a digest of every call's ids: a difference stops the run). The OpenAI log's sessions have --turns calls each
   (each call resends the history, so the JSON grows with the square of the session length and the new text to
   encode linearly: the ratio follows the session length, not the file's size; a comma list measures several
   shapes in one run).
2. `strata-lab replay LOG --engine vllm --engine sglang` (import, render, encode, replay under both caches) vs
   `kvlint analyze LOG --engine vllm --engine sglang` (PyPI `kvlint`, the same simulation) on one generated
   agent log of --agent-requests requests (issue: 3,000; default 600 to keep the run short), both with the same
   local tokenizer folder (the Qwen3 vocabulary and template; no hub access), each CLI end to end in its own
   process, in the same run. Target: >= 2x kvlint. Skipped (said so) when kvlint is not installed
   (`pip install kvlint`).

    PYTHONPATH=$PWD python benchmarks/traces.py              # 8 MB per log, 600 agent requests (a few minutes)
    PYTHONPATH=$PWD python benchmarks/traces.py --mb 500 --agent-requests 3000     # the issue's sizes
    PYTHONPATH=$PWD python benchmarks/traces.py --mb 32 --formats openai --turns 16,64 --skip kvlint --no-plain
    PYTHONPATH=$PWD python benchmarks/traces.py --mb 32 --formats openai --turns 16,64,128 --agent-requests 3000 \
        --out benchmarks/results/traces.md                 # the run in benchmarks/results/traces.md

Each measurement runs in a fresh child process so its peak RSS is its own; the table prints MB/s, calls/s and
the ratio to json.loads in the same run (fastest of --repeat interleaved runs each), all on the child's CPU
time (single-threaded children: on a shared machine the wall clock also counts the other processes' turns;
the wall-clock ratio is printed beside it), and the child's peak RSS above an idle child's (bounded memory: it
must not grow with the file). The kvlint comparison is on the wall clock of each CLI (kvlint's tokenizer may
use several threads), its children's CPU time beside it.
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
        if mode == "render":  # the fast path's tables of the vocabulary and merges (C++): once a process too
            from strata_lab.traces.fast_encode import SegmentEncoder

            SegmentEncoder.of(tok)
    t0, c0 = time.perf_counter(), time.process_time()
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

        n, digest, checking, checking_cpu = 0, hashlib.blake2b(digest_size=8), 0.0, 0.0
        for _, r in load_trace(path, format=fmt).render(tok, tmpl, fast=mode == "render"):
            n += 1
            t1, c1 = time.perf_counter(), time.process_time()  # the check of the ids is not the render's time
            digest.update(array("q", r.prompt_ids).tobytes() + b"|" + array("q", r.gen_ids).tobytes() + b";")
            checking += time.perf_counter() - t1
            checking_cpu += time.process_time() - c1
        print(json.dumps({"seconds": time.process_time() - c0 - checking_cpu,
                          "wall": time.perf_counter() - t0 - checking, "n": n, "ids": digest.hexdigest(),
                          "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
        return
    else:
        from strata_lab import load_trace

        n = sum(1 for _ in load_trace(path, format=fmt))
    print(json.dumps({"seconds": time.process_time() - c0, "wall": time.perf_counter() - t0, "n": n,
                      "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


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
    ap.add_argument("--turns", default="16", help="calls per session in the OpenAI log (a comma list: one log each)")
    ap.add_argument("--out", help="also write the tables to this markdown file (e.g. benchmarks/results/traces.md)")
    ap.add_argument("--no-plain", dest="plain", action="store_false",
                    help="skip the plain (Jinja + tokenizer.encode) render row: it is the slow one")
    ap.add_argument("--repeat", type=int, default=2, help="runs per reader; the fastest counts (noisy machines)")
    ap.add_argument("--kvlint-repeat", type=int, default=1,
                    help="runs of each CLI in the kvlint comparison (kvlint takes minutes on 3,000 requests)")
    ap.add_argument("--template", action="append", default=None, metavar="JINJA",
                    help="chat template(s) of the kvlint comparison, one table each: qwen3 (ours) or a .jinja file "
                         "(e.g. llama.cpp's models/templates/deepseek-ai-DeepSeek-V3.1.jinja); repeatable")
    ap.add_argument("--child", nargs=3, metavar=("MODE", "FORMAT", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    lines = [f"`{' '.join(['benchmarks/traces.py'] + sys.argv[1:])}`", ""]
    if "import" not in args.skip.split(","):
        lines += import_table(args)
    if "kvlint" not in args.skip.split(","):
        for template in args.template or ["qwen3"]:
            lines += kvlint_table(args, template)
    if args.out:
        with open(args.out, "w") as f:
            f.write("# Trace import (`benchmarks/traces.py`)\n\n" + "\n".join(lines) + "\n")


def say(out: list, line: str = "") -> None:
    print(line, flush=True)
    out.append(line)


def import_table(args) -> list:
    out: list = []
    idle = run_child("idle", "-", "-")["rss_mb"]
    say(out, "```")
    say(out, f"{'log':<22} {'MB':>6} {'calls':>8} {'reader':<10} {'MB/s':>7} {'calls/s':>9} {'x json.loads':>12} "
             f"{'(wall)':>7} {'peak RSS over idle MB':>22}")
    try:
        turns = [int(t) for t in str(args.turns).split(",") if t]
    except ValueError:
        raise SystemExit(f"--turns: {args.turns!r} is not a comma list of integers")
    if not turns or min(turns) < 1:
        raise SystemExit("--turns: at least one session length >= 1")
    formats = [f for f in args.formats.split(",") if f]
    unknown = sorted(set(formats) - {"openai", "claude-code"})
    if unknown:
        raise SystemExit(f"--formats: unknown {', '.join(unknown)}; known: openai, claude-code")
    logs = [(f"openai, {t} calls/session", "openai", lambda p, t=t: make_openai(p, args.mb, turns=t))
            for t in turns if "openai" in formats]
    if "claude-code" in formats:
        logs.append(("claude-code", "claude-code", lambda p: make_claude_code(p, args.mb)))
    with tempfile.TemporaryDirectory() as tmp:
        for label, fmt, maker in logs:
            path = os.path.join(tmp, f"{fmt}.jsonl")
            calls = maker(path)
            mb = os.path.getsize(path) / 2**20
            best = {}
            # interleaved, so that every reader sees the same load on a shared machine
            for _ in range(args.repeat):
                for mode in ("json", "trace", "render") + (("plain",) if args.plain else ()):
                    r = run_child(mode, fmt, path)
                    if mode not in best or r["seconds"] < best[mode]["seconds"]:
                        best[mode] = r
                    best.setdefault(mode + "-wall", r["wall"])
                    best[mode + "-wall"] = min(best[mode + "-wall"], r["wall"])
            if best["trace"]["n"] != calls:
                raise SystemExit(f"{label}: load_trace read {best['trace']['n']} calls of {calls}")
            if "plain" in best and best["plain"]["ids"] != best["render"]["ids"]:
                raise SystemExit(f"{label}: the fast path's ids differ from the plain path's (Jinja + "
                                 f"tokenizer.encode): digest {best['render']['ids']} vs {best['plain']['ids']}")
            rows = [("json.loads", "json"), ("load_trace", "trace"), ("+render", "render")]
            if "plain" in best:
                rows.append(("+plain", "plain"))
            for name, mode in rows:
                r = best[mode]
                say(out, f"{label:<22} {mb:>6.0f} {calls:>8} {name:<10} {mb / r['seconds']:>7.1f} "
                         f"{calls / r['seconds']:>9.0f} {best['json']['seconds'] / r['seconds']:>12.2f} "
                         f"{best['json-wall'] / best[mode + '-wall']:>7.2f} {r['rss_mb'] - idle:>22.1f}")
            if "plain" in best:
                say(out, f"{label:<22} ids of every call: fast == plain (digest {best['render']['ids']})")
    say(out, "```")
    return out


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


def _tokenizer_folder(folder: str, template: str = "qwen3") -> str:
    """A model folder both tools load offline: our Qwen3 tokenizer.json and the qwen3 chat template, or another
    template (a .jinja file: the ids are Qwen3's, the rendered text is that template's)."""
    from strata_lab import ChatTemplate, load_tokenizer

    os.makedirs(folder, exist_ok=True)
    load_tokenizer("qwen3").save(os.path.join(folder, "tokenizer.json"))
    if template == "qwen3":
        source = ChatTemplate.from_name("qwen3").source
    else:
        with open(template, encoding="utf-8") as f:
            source = f.read()
    cfg = {"chat_template": source, "eos_token": "<|im_end|>", "bos_token": "<|endoftext|>",
           "pad_token": "<|endoftext|>", "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 20}
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f)
    return folder


def _timed(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process and its children) of one command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({out.returncode}): {out.stderr[-2000:]}")
    return seconds, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def kvlint_table(args, template: str = "qwen3") -> list:
    import shutil

    out: list = []
    kvlint = shutil.which("kvlint")
    if kvlint is None:
        say(out, "kvlint: not installed (pip install kvlint); the import + replay comparison is skipped")
        return out
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "agent.jsonl")
        n = make_agent(log, args.agent_requests)
        folder = _tokenizer_folder(os.path.join(tmp, "model-folder"), template)
        ours_cmd = [sys.executable, "-m", "strata_lab", "replay", log, "--format", "openai", "--tokenizer", folder,
                    "--engine", "vllm", "--engine", "sglang", "--quiet", "--json", os.path.join(tmp, "ours.json")]
        theirs_cmd = [kvlint, "analyze", log, "--model", folder, "--engine", "vllm", "--engine", "sglang",
                      "--json", os.path.join(tmp, "kvlint.json")]
        env_note = "HF_HUB_OFFLINE=1"
        os.environ["HF_HUB_OFFLINE"] = "1"
        wall: dict = {}
        cpu: dict = {}
        for _ in range(args.kvlint_repeat):  # interleaved
            for name, cmd in (("kvlint analyze", theirs_cmd), ("strata-lab replay", ours_cmd)):
                w, c = _timed(cmd)
                wall[name], cpu[name] = min(wall.get(name, w), w), min(cpu.get(name, c), c)
        with open(os.path.join(tmp, "ours.json")) as f:
            ours = {e["engine"]: e for e in json.load(f)["engines"]}
        with open(os.path.join(tmp, "kvlint.json")) as f:
            theirs = json.load(f)
        mb = os.path.getsize(log) / 2**20
        say(out)
        say(out, f"import + replay under vLLM and SGLang, {n} agent requests ({mb:.0f} MB), same tokenizer folder "
                 f"({env_note}), template {os.path.basename(template)}:")
        say(out, "```")
        say(out, f"{'tool':<20} {'seconds':>8} {'requests/s':>11} {'x kvlint':>9} {'CPU s':>7} {'x kvlint (CPU)':>15}")
        for name, sec in wall.items():
            say(out, f"{name:<20} {sec:>8.2f} {n / sec:>11.0f} {wall['kvlint analyze'] / sec:>9.2f} "
                     f"{cpu[name]:>7.2f} {cpu['kvlint analyze'] / cpu[name]:>15.2f}")
        say(out, "same simulation: (hit rate, prompt tokens) ours "
                 + ", ".join(f"{k} ({v['hit_rate']:.4f}, {v['prompt_tokens']})" for k, v in ours.items())
                 + "; kvlint " + ", ".join(f"{k} {v}" for k, v in _kvlint_rates(theirs).items()))
        say(out, "```")
    return out


def _kvlint_rates(doc) -> dict:
    """Per engine: (hit rate, prompt tokens) from kvlint's JSON report (`sims`, one per engine)."""
    return {sim["engine"]: (round(sim["hit_rate"], 4), sum(r["prompt_tokens"] for r in sim["per_request"]))
            for sim in doc.get("sims", ())}


if __name__ == "__main__":
    main()
