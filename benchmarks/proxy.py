"""What `strata-lab proxy` costs a client, on loopback, proxy and direct in one run.

A tiny fake upstream (vLLM-shaped: it answers `return_token_ids` with `prompt_token_ids` / `token_ids`, and
streams `--stream-tokens` chunks a call) runs in its own process; the proxy (`strata-lab proxy --engine vllm`)
in another, recording to a dump in a temporary folder. The client sends the same requests direct and through
the proxy, interleaved in rounds, and reports:
- added latency per request: p50 (and p90) of proxy minus direct, non-streamed chat calls (target <= 2 ms);
- streamed chunks per second, proxy / direct (target >= 0.95x);
- the proxy's RSS before and after `--requests` calls (the memory must stay flat).

    python benchmarks/proxy.py [--requests 10000] [--latency-calls 2000] [--stream-tokens 2000] [--out FILE]
"""
from __future__ import annotations

import argparse
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(url: str) -> None:
    import httpx

    for _ in range(300):
        try:
            httpx.get(url + "/v1/models", timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10000, help="calls for the memory check")
    ap.add_argument("--latency-calls", type=int, default=2000, help="non-streamed calls each way for latency")
    ap.add_argument("--stream-tokens", type=int, default=2000, help="chunks per streamed call")
    ap.add_argument("--streams", type=int, default=10, help="streamed calls each way")
    ap.add_argument("--out", help="also write the report here (markdown)")
    args = ap.parse_args()
    import httpx

    tmp = Path(tempfile.mkdtemp(prefix="strata-proxy-bench-"))
    (tmp / "upstream.py").write_text(UPSTREAM)
    up_port, px_port = free_port(), free_port()
    up = subprocess.Popen([sys.executable, str(tmp / "upstream.py"), str(up_port), str(args.stream_tokens)])
    px = None
    try:
        wait(f"http://127.0.0.1:{up_port}")
        px = subprocess.Popen([sys.executable, "-m", "strata_lab", "proxy", "--upstream", f"http://127.0.0.1:{up_port}",
                               "--port", str(px_port), "--dump", str(tmp / "calls.jsonl"), "--engine", "vllm"],
                              stderr=subprocess.DEVNULL)
        wait(f"http://127.0.0.1:{px_port}")
        direct, proxied = f"http://127.0.0.1:{up_port}", f"http://127.0.0.1:{px_port}"
        body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        client = httpx.Client(timeout=60)
        for url in (direct, proxied):      # warm both paths
            for _ in range(50):
                client.post(url + "/v1/chat/completions", json=body)

        lat = {direct: [], proxied: []}
        for i in range(args.latency_calls):        # interleaved: the same load on both
            for url in ((direct, proxied) if i % 2 == 0 else (proxied, direct)):
                t = time.perf_counter()
                r = client.post(url + "/v1/chat/completions", json=body)
                lat[url].append(time.perf_counter() - t)
                assert r.status_code == 200
        p50d, p50p = statistics.median(lat[direct]) * 1e3, statistics.median(lat[proxied]) * 1e3
        q = lambda xs, f: sorted(xs)[int(f * (len(xs) - 1))] * 1e3  # noqa: E731
        p90d, p90p = q(lat[direct], 0.9), q(lat[proxied], 0.9)

        rate = {direct: [], proxied: []}
        sbody = {**body, "stream": True}
        for i in range(args.streams):
            for url in ((direct, proxied) if i % 2 == 0 else (proxied, direct)):
                t = time.perf_counter()
                n = 0
                with client.stream("POST", url + "/v1/chat/completions", json=sbody) as r:
                    for line in r.iter_lines():
                        if line.startswith("data: {") and '"content":"x"' in line.replace(" ", ""):
                            n += 1
                rate[url].append(n / (time.perf_counter() - t))
                assert n == args.stream_tokens, n
        sd, sp = statistics.median(rate[direct]), statistics.median(rate[proxied])

        before = rss_kib(px.pid)
        t = time.perf_counter()
        for i in range(args.requests):
            client.post(proxied + "/v1/chat/completions", json=body)
        took = time.perf_counter() - t
        after = rss_kib(px.pid)
        lines = sum(1 for _ in open(tmp / "calls.jsonl"))
        first = json.loads(open(tmp / "calls.jsonl").readline())
        report = "\n".join([
            "| measure | direct | through the proxy | proxy vs direct | target |",
            "|---|---|---|---|---|",
            f"| p50 latency, non-streamed chat call | {p50d:.3f} ms | {p50p:.3f} ms | +{p50p - p50d:.3f} ms | <= +2 ms |",
            f"| p90 latency | {p90d:.3f} ms | {p90p:.3f} ms | +{p90p - p90d:.3f} ms | |",
            f"| streamed chunks/s ({args.stream_tokens} a call, median of {args.streams}) | {sd:,.0f} | {sp:,.0f} | "
            f"{sp / sd:.3f}x | >= 0.95x |",
            f"| proxy RSS before / after {args.requests:,} calls | | {before:,} / {after:,} KiB | "
            f"{after - before:+,} KiB | flat |",
            "",
            f"{args.latency_calls:,} calls each way for latency, interleaved; {args.requests:,} calls in "
            f"{took:.1f} s for the memory check ({args.requests / took:,.0f} calls/s through the proxy, one client); "
            f"{lines:,} dump lines written; each with {len(first['prompt_ids'])} prompt ids and "
            f"{len(first['gen_ids'])} reply ids, reported_cached_tokens {first.get('reported_cached_tokens')}.",
        ])
        print(report)
        if args.out:
            Path(args.out).write_text(report + "\n")
        return 0
    finally:
        for p in (px, up):
            if p is not None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()


if __name__ == "__main__":
    raise SystemExit(main())
