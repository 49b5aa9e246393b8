"""What `strata-lab proxy` costs a client, on loopback, proxy and direct in one run.

A tiny fake upstream (vLLM-shaped: it answers `return_token_ids` with `prompt_token_ids` / `token_ids`, and
streams `--stream-tokens` chunks a call) runs in its own process; the proxy (`strata-lab proxy --engine vllm`)
in another, recording to a dump in a temporary folder; with `--compare-with REV`, a second proxy runs the
`strata_lab/proxy` modules of that git revision (the rest of the package as installed), so two rounds of the
proxy are measured under the same load. The client (the standard library's http.client, one keep-alive
connection per path) sends the same requests direct and through each proxy, interleaved, in `--rounds` rounds,
and reports:
- added latency per request: p50 (and p90) of proxy minus direct, non-streamed chat calls; each round's
  difference of medians, then the median over the rounds (target <= 2 ms);
- streamed chunks per second over a long stream, proxy / direct, the median of the rounds (target >= 0.95x);
- the CPU time each proxy process spends per call and per streamed chunk (/proc/PID/schedstat): what the
  proxy costs independent of how loaded the machine is;
- the proxy's RSS before and after `--requests` calls (the memory must stay flat).

With `--llama-server PATH --model GGUF` the upstream is a real engine instead: that llama-server on that
model (`--engine-threads`, default 2; one slot; the proxy runs with `--engine llama.cpp`), and only the streams are measured:
chat calls at temperature 0 with `ignore_eos`, so every stream is `--stream-tokens` tokens long, one token a
chunk; the upstream's CPU per chunk is then the engine's CPU per token. The tiny GGUF the live tests use:
`python -c "from strata_lab.validate.llamacpp_check import tiny_gguf; print(tiny_gguf())"`.

    python benchmarks/proxy.py [--rounds 5] [--latency-calls 400] [--streams 4] [--stream-tokens 512]
                               [--requests 10000] [--compare-with REV] [--out FILE]
    python benchmarks/proxy.py --llama-server PATH --model GGUF [--rounds 5] [--streams 4]
                               [--stream-tokens 512] [--compare-with REV] [--out FILE]
"""
from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

UPSTREAM = r'''
import json, sys
PROMPT = list(range(100, 164))
def body(ids):
    d = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "fake",
         "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop",
                      "logprobs": None, "token_ids": [7, 8] if ids else None}],
         "usage": {"prompt_tokens": 64, "completion_tokens": 2, "total_tokens": 66,
                   "prompt_tokens_details": {"cached_tokens": 48}},
         "prompt_token_ids": PROMPT if ids else None}
    return json.dumps(d, separators=(",", ":")).encode()
N = int(sys.argv[2])
async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            if m["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"}); return
    raw = b""
    while True:
        m = await receive()
        raw += m.get("body", b"")
        if not m.get("more_body"):
            break
    if scope["path"] == "/v1/models":
        out = json.dumps({"object": "list", "data": [{"id": "fake", "owned_by": "vllm"}]}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": out}); return
    req = json.loads(raw) if raw else {}
    ids = bool(req.get("return_token_ids"))
    if not req.get("stream"):
        out = body(ids)
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(out)).encode())]})
        await send({"type": "http.response.body", "body": out}); return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    first = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "fake",
             "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
             "prompt_token_ids": PROMPT if ids else None}
    await send({"type": "http.response.body", "body": b"data: " + json.dumps(first).encode() + b"\n\n", "more_body": True})
    for i in range(N):
        ch = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "fake",
              "choices": [{"index": 0, "delta": {"content": "x"}, "token_ids": [i % 1000] if ids else None}]}
        await send({"type": "http.response.body", "body": b"data: " + json.dumps(ch).encode() + b"\n\n",
                    "more_body": True})
    opts = req.get("stream_options") or {}
    if opts.get("include_usage"):
        u = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "fake", "choices": [],
             "usage": {"prompt_tokens": 64, "completion_tokens": N, "total_tokens": 64 + N,
                       "prompt_tokens_details": {"cached_tokens": 48}}}
        await send({"type": "http.response.body", "body": b"data: " + json.dumps(u).encode() + b"\n\n", "more_body": True})
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
if __name__ == "__main__":
    import uvicorn
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
'''


# runs a proxy whose strata_lab/proxy modules are the files in argv[1] (another revision's), the rest as installed
OLD_PROXY = r"""
import importlib.util, sys
d = sys.argv[1]
for name in ("__init__", "engines", "app", "cli"):
    full = "strata_lab.proxy" if name == "__init__" else "strata_lab.proxy." + name
    spec = importlib.util.spec_from_file_location(full, f"{d}/{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[full] = mod
    spec.loader.exec_module(mod)
from strata_lab.cli import main
sys.exit(main(sys.argv[2:]))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(port: int, proc: subprocess.Popen) -> None:
    for _ in range(600):
        if proc.poll() is not None:
            raise RuntimeError(f"the process on port {port} exited (rc {proc.returncode})")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/v1/models")
            c.getresponse().read()
            c.close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"port {port} did not come up")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def cpu_ns(pid: int) -> int:
    """CPU time the process (all its threads) has run, in ns."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


class Path_:
    """One way to the upstream: direct or through a proxy; one keep-alive connection."""

    def __init__(self, name: str, port: int, pid: int | None):
        self.name, self.port, self.pid = name, port, pid
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.lat: list[list[float]] = []
        self.rate: list[list[float]] = []
        self.cpu_call: list[float] = []
        self.cpu_chunk: list[float] = []

    def post(self, body: bytes) -> http.client.HTTPResponse:
        """The request on the kept connection; once more on a new one when the server had closed it (llama-server
        closes a connection idle for 5 s, as each path's is while the other paths stream)."""
        for again in (True, False):
            try:
                self.conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
                return self.conn.getresponse()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.conn.close()
                if not again:
                    raise
        raise AssertionError("unreachable")

    def call(self, body: bytes) -> float:
        t = time.perf_counter()
        r = self.post(body)
        data = r.read()
        took = time.perf_counter() - t
        assert r.status == 200 and b'"content":"ok"' in data and b'"token_ids":[' not in data, data[:200]
        return took

    def stream(self, body: bytes, tokens: int, marker: bytes, forbidden: bytes) -> float:
        """Chunks a second over one streamed call: the events holding `marker` are counted (there must be
        `tokens` of them); no event may hold `forbidden` (what the proxy adds and takes out again)."""
        t = time.perf_counter()
        r = self.post(body)
        assert r.status == 200, (self.name, r.status, r.read()[:200])
        n = 0
        while True:
            line = r.readline()
            if not line:
                break
            if line.startswith(b"data: {"):
                n += marker in line
                assert forbidden not in line, (self.name, line[:200])
        took = time.perf_counter() - t
        assert n == tokens, (self.name, n)
        return n / took


LLAMA_ARGS = "-np 1 -c 4096 --cache-ram 0 --jinja"   # one slot, as the live tests run it (+ -t, --engine-threads)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options, checked before any work: a missing engine binary or model is a one-line error."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="rounds of latency calls and streams (medians over them)")
    ap.add_argument("--latency-calls", type=int, help="non-streamed calls each way per round (default 400; the fake "
                                                      "upstream only)")
    ap.add_argument("--streams", type=int, default=4, help="streamed calls each way per round")
    ap.add_argument("--stream-tokens", type=int, default=512, help="chunks per streamed call (a real engine: its "
                                                                   "max_tokens, one token a chunk)")
    ap.add_argument("--requests", type=int, help="calls through the proxy for the memory check (default 10000; the "
                                                 "fake upstream only)")
    ap.add_argument("--llama-server", metavar="PATH", help="the upstream is this llama-server binary on --model "
                                                           "instead of the fake (streams only)")
    ap.add_argument("--model", metavar="GGUF", help="the GGUF model the llama-server upstream serves")
    ap.add_argument("--engine-threads", type=int, metavar="N", help="llama-server's -t (default 2, every core here; "
                    "1 leaves the other core to the proxy and the client, as an engine on an accelerator does)")
    ap.add_argument("--compare-with", metavar="REV", help="also run the proxy of this git revision (e.g. the "
                                                          "commit of an earlier round)")
    ap.add_argument("--out", help="also write the report here (markdown)")
    args = ap.parse_args(argv)
    if args.llama_server is not None:
        if args.model is None:
            ap.error("--llama-server needs --model GGUF")
        if not (os.path.isfile(args.llama_server) and os.access(args.llama_server, os.X_OK)):
            ap.error(f"--llama-server: {args.llama_server!r} is not an executable file")
        if not os.path.isfile(args.model):
            ap.error(f"--model: {args.model!r} is not a file")
        args.engine_threads = 2 if args.engine_threads is None else args.engine_threads
        if args.engine_threads < 1:
            ap.error(f"--engine-threads must be >= 1, got {args.engine_threads}")
        for name in ("latency_calls", "requests"):
            if getattr(args, name) is not None:
                ap.error(f"--{name.replace('_', '-')} measures the fake upstream only (a real engine's run "
                         f"measures streams)")
    elif args.model is not None:
        ap.error("--model needs --llama-server PATH")
    elif args.engine_threads is not None:
        ap.error("--engine-threads needs --llama-server PATH")
    else:
        args.latency_calls = 400 if args.latency_calls is None else args.latency_calls
        args.requests = 10000 if args.requests is None else args.requests
    for name in ("rounds", "latency_calls", "streams", "stream_tokens"):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            ap.error(f"--{name.replace('_', '-')} must be positive")
    if args.requests is not None and args.requests < 0:
        ap.error("--requests must be >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    real = args.llama_server is not None
    tmp = Path(tempfile.mkdtemp(prefix="strata-proxy-bench-"))
    procs: list[subprocess.Popen] = []
    with contextlib.ExitStack() as stack:
        try:
            if real:
                from strata_lab.validate.llamacpp_check import LiveLlama

                srv = stack.enter_context(LiveLlama(args.model, f"{LLAMA_ARGS} -t {args.engine_threads}",
                                                    binary=args.llama_server,
                                                    log=str(tmp / "llama-server.log")))
                up_port, up_pid, engine = srv.port, srv.proc.pid, "llama.cpp"
            else:
                (tmp / "upstream.py").write_text(UPSTREAM)
                up_port = free_port()
                up = subprocess.Popen([sys.executable, str(tmp / "upstream.py"), str(up_port),
                                       str(args.stream_tokens)])
                procs.append(up)
                wait(up_port, up)
                up_pid, engine = up.pid, "vllm"
            return measure(args, tmp, procs, up_port, up_pid, engine, srv.version() if real else None)
        finally:
            for p in reversed(procs):
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()


def measure(args, tmp: Path, procs: list, up_port: int, up_pid: int, engine: str, version: str | None) -> int:
    real = version is not None
    upstream = f"http://127.0.0.1:{up_port}"
    paths = [Path_("direct", up_port, None)]

    def start_proxy(name: str, cmd: list[str], dump: Path) -> None:
        port = free_port()
        p = subprocess.Popen(cmd + ["proxy", "--upstream", upstream, "--port", str(port), "--dump", str(dump),
                                    "--engine", engine], stderr=subprocess.DEVNULL)
        procs.append(p)
        wait(port, p)
        paths.append(Path_(name, port, p.pid))

    start_proxy("proxy", [sys.executable, "-m", "strata_lab"], tmp / "calls.jsonl")
    if args.compare_with:
        root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                              check=True, cwd=Path(__file__).parent).stdout.strip()
        old = tmp / "old"
        old.mkdir()
        for name in ("__init__", "engines", "app", "cli"):
            src = subprocess.run(["git", "show", f"{args.compare_with}:strata_lab/proxy/{name}.py"], cwd=root,
                                 capture_output=True, check=True).stdout
            (old / f"{name}.py").write_bytes(src)
        (tmp / "old_proxy.py").write_text(OLD_PROXY)
        start_proxy(f"proxy@{args.compare_with}", [sys.executable, str(tmp / "old_proxy.py"), str(old)],
                    tmp / "calls_old.jsonl")

    if real:
        def chat(n: int) -> bytes:   # greedy, and ignore_eos: every stream is n tokens, one a chunk
            return json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "Tell me a long story."}],
                               "max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": True}).encode()

        sbody = chat(args.stream_tokens)
        # llama-server's token chunks (its role chunk starts with "role", its last one has an empty delta);
        # the client asks for no usage, so no usage chunk may reach it (the proxy asks for one and drops it)
        marker, forbidden = b'"delta":{"content":', b'"usage"'
        for p in paths:
            p.stream(chat(16), 16, marker, forbidden)
    else:
        body = json.dumps({"model": "fake", "messages": [{"role": "user", "content": "hi"}],
                           "max_tokens": 2}).encode()
        sbody = json.dumps({"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                            "stream": True}).encode()
        marker, forbidden = b'"content": "x"', b'"token_ids": ['
        for p in paths:                         # warm every path
            for _ in range(50):
                p.call(body)
            p.stream(sbody, args.stream_tokens, marker, forbidden)

    med = statistics.median
    up_call, up_chunk, me_call, me_chunk, loads = [], [], [], [], []    # the upstream's and the client's CPU
    for rnd in range(args.rounds):
        if not real:
            lat = {p.name: [] for p in paths}
            cpu0 = {p.name: cpu_ns(p.pid) for p in paths if p.pid}
            u0, m0 = cpu_ns(up_pid), time.process_time()
            for i in range(args.latency_calls):       # interleaved, the order turning: the same load on all
                k = i % len(paths)
                for p in paths[k:] + paths[:k]:
                    lat[p.name].append(p.call(body))
            for p in paths:
                p.lat.append(lat[p.name])
                if p.pid:
                    p.cpu_call.append((cpu_ns(p.pid) - cpu0[p.name]) / args.latency_calls / 1e3)
            calls = args.latency_calls * len(paths)
            up_call.append((cpu_ns(up_pid) - u0) / calls / 1e3)
            me_call.append((time.process_time() - m0) / calls * 1e6)
        rate = {p.name: [] for p in paths}
        cpu0 = {p.name: cpu_ns(p.pid) for p in paths if p.pid}
        u0, m0 = cpu_ns(up_pid), time.process_time()
        for i in range(args.streams):
            k = i % len(paths)
            for p in paths[k:] + paths[:k]:
                rate[p.name].append(p.stream(sbody, args.stream_tokens, marker, forbidden))
        for p in paths:
            p.rate.append(rate[p.name])
            if p.pid:
                p.cpu_chunk.append((cpu_ns(p.pid) - cpu0[p.name]) / (args.streams * args.stream_tokens) / 1e3)
        chunks = args.streams * args.stream_tokens * len(paths)
        up_chunk.append((cpu_ns(up_pid) - u0) / chunks / 1e3)
        me_chunk.append((time.process_time() - m0) / chunks * 1e6)
        loads.append(os.getloadavg()[0])
        print(f"round {rnd + 1}/{args.rounds}: " + ", ".join(
            (f"{p.name} p50 {med(p.lat[-1]) * 1e3:.3f} ms, " if not real else f"{p.name} ") +
            f"{med(p.rate[-1]):,.0f} {'tokens' if real else 'chunks'}/s" for p in paths) + f"; load {loads[-1]:.1f}",
            file=sys.stderr, flush=True)

    direct = paths[0]

    def q(xs, f):
        return sorted(xs)[int(f * (len(xs) - 1))] * 1e3

    unit = "tokens/s" if real else "chunks/s"
    each = f"{args.stream_tokens} a call" + (", one token a chunk" if real else "")
    rows = ["| measure | " + " | ".join(p.name for p in paths) + " | target |",
            "|---|" + "---|" * len(paths) + "---|"]
    if not real:
        rows.append("| p50 latency, non-streamed chat call (median of the rounds' p50) | " + " | ".join(
            f"{med([med(r) for r in p.lat]) * 1e3:.3f} ms" for p in paths) + " | |")
        rows.append("| added p50 latency (median of the rounds' differences) | | " + " | ".join(
            f"+{med([(med(r) - med(d)) * 1e3 for r, d in zip(p.lat, direct.lat)]):.3f} ms" for p in paths[1:])
            + " | <= +2 ms |")
        rows.append("| p90 latency, all rounds | " + " | ".join(
            f"{q([x for r in p.lat for x in r], 0.9):.3f} ms" for p in paths) + " | |")
    rows.append(f"| streamed {unit} ({each}; median of the rounds' medians) | " +
                " | ".join(f"{med([med(r) for r in p.rate]):,.{1 if real else 0}f}" for p in paths) + " | |")
    rows.append(f"| streamed {unit}, proxy / direct (median of the rounds' ratios) | | " + " | ".join(
        f"{med([med(r) / med(d) for r, d in zip(p.rate, direct.rate)]):.3f}x" for p in paths[1:]) + " | >= 0.95x |")
    if not real:
        rows.append("| proxy CPU per non-streamed call (median of the rounds) | | " + " | ".join(
            f"{med(p.cpu_call):,.0f} µs" for p in paths[1:]) + " | |")
    rows.append("| proxy CPU per streamed chunk (median of the rounds) | | " + " | ".join(
        f"{med(p.cpu_chunk):,.1f} µs" for p in paths[1:]) + " | |")
    uc, cc = med(up_chunk), med(me_chunk)
    if real:
        rows.append(f"| engine + client CPU per token (the direct path's own work) | {uc:,.0f} + {cc:,.1f} µs |"
                    + " |" * (len(paths) - 1) + " |")
    else:
        rows.append(f"| upstream + client CPU per call / per chunk (the direct path's own work) | {med(up_call):,.0f} "
                    f"+ {med(me_call):,.0f} µs / {uc:,.1f} + {cc:,.1f} µs |" + " |" * (len(paths) - 1) + " |")
    rows.append("| chunks/s ratio if every process waits for CPU: (U + C) / (U + C + P) per chunk | | " +
                " | ".join(f"{(uc + cc) / (uc + cc + med(p.cpu_chunk)):.3f}x" for p in paths[1:]) + " | |")
    if real:
        notes = [f"{args.rounds} rounds of {args.streams} streams each way, interleaved: chat calls at temperature 0 "
                 f"with ignore_eos, {args.stream_tokens} tokens each. Engine: llama-server ({version}), "
                 f"`{LLAMA_ARGS} -t {args.engine_threads}`, model {Path(args.model).name} "
                 f"({Path(args.model).stat().st_size / 2 ** 20:,.1f} MiB); the proxy with `--engine {engine}`. "
                 f"Load average (1 min) after each round {', '.join(f'{x:.1f}' for x in loads)} on "
                 f"{os.cpu_count()} CPUs."]
        notes += [f"Rounds' ratios, {p.name} / direct: " + ", ".join(
            f"{med(r) / med(d):.2f}x" for r, d in zip(p.rate, direct.rate)) + "." for p in paths[1:]]
    else:
        notes = [f"{args.rounds} rounds of {args.latency_calls:,} calls and {args.streams} streams each way, "
                 f"interleaved; load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs."]
    if args.requests:
        proxy = paths[1]
        before = rss_kib(proxy.pid)
        t = time.perf_counter()
        for _ in range(args.requests):
            proxy.call(body)
        took = time.perf_counter() - t
        after = rss_kib(proxy.pid)
        rows.append(f"| proxy RSS before / after {args.requests:,} calls | | {before:,} / {after:,} KiB "
                    f"({after - before:+,} KiB)" + " |" * (len(paths) - 1) + " flat |")
        notes.append(f"{args.requests:,} calls in {took:.1f} s for the memory check "
                     f"({args.requests / took:,.0f} calls/s through the proxy, one client).")
    for p in paths:
        p.conn.close()
    time.sleep(0.5)
    lines = (tmp / "calls.jsonl").read_text().splitlines()
    rec = json.loads(lines[-1 if real else 0])
    notes.append(f"{len(lines):,} dump lines written by the proxy; the {'last (streamed)' if real else 'first'} "
                 f"with {len(rec.get('prompt_ids') or [])} prompt ids and {len(rec.get('gen_ids') or [])} reply ids, "
                 f"reported_cached_tokens {rec.get('reported_cached_tokens')}.")
    report = "\n".join(rows + [""] + notes)
    print(report)
    if args.out:
        Path(args.out).write_text(report + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
