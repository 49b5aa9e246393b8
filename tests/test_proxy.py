"""`strata-lab proxy` in front of a real `strata-lab serve` (the tiny embedded model): the ids it records are the
server's own, the client's answers are the server's answers, secrets stay out of the dump, errors pass through.

Answers are compared byte for byte after normalising what differs between any two requests: `id`, `created`,
`timings` (measured per request), `cached_tokens` / `cache_n` (the second of two equal prompts is served from
the cache) and a streamed call's `prompt_n`.
"""
from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import time

import httpx
import pytest

from _strata_server import ServerProcess, free_port


class ProxyProcess:
    def __init__(self, tmp, upstream: str, *args: str):
        from strata_lab._spawn import child_process_args

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.dump = tmp / "proxy.jsonl"
        self._log = open(tmp / "proxy.log", "wb")
        spawn = child_process_args(["proxy", "--upstream", upstream, "--port", self.port, "--dump", self.dump, *args],
                                   env=dict(os.environ))
        self.proc = subprocess.Popen(**spawn, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError((tmp / "proxy.log").read_text())
            try:
                httpx.get(self.url + "/health", timeout=1)
                return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError("proxy did not come up")

    def lines(self) -> list[dict]:
        return [json.loads(x) for x in self.dump.read_text().splitlines() if x.strip()] if self.dump.exists() else []

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("proxy")
    server = ServerProcess(tmp, "--seed", "3").wait()
    proxy = ProxyProcess(tmp, server.url)
    yield server, proxy
    proxy.stop()
    server.stop()


_NORM = [(re.compile(rb'"id":"[^"]*"'), b'"id":"X"'), (re.compile(rb'"created":\d+'), b'"created":0'),
         (re.compile(rb'"timings":\{[^{}]*\}'), b'"timings":{}'), (re.compile(rb'"cached_tokens":\d+'),
                                                                  b'"cached_tokens":0')]


def norm(raw: bytes) -> bytes:
    for pat, rep in _NORM:
        raw = pat.sub(rep, raw)
    return raw


def _wait_lines(proc, n, timeout=20.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        lines = proc.lines()
        if len(lines) >= n:
            return lines
        time.sleep(0.05)
    return proc.lines()


CHAT = {"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi."}],
        "max_tokens": 6, "temperature": 0, "seed": 5}


def test_answers_are_the_upstreams_and_ids_are_the_servers(pair):
    server, proxy = pair
    n0, s0 = len(proxy.lines()), len(server.lines())
    direct = httpx.post(server.url + "/v1/chat/completions", json=CHAT, timeout=60)
    via = httpx.post(proxy.url + "/v1/chat/completions", json=CHAT, timeout=60,
                     headers={"Authorization": "Bearer sk-proxy-SECRET-1", "x-api-key": "SECRET-2"})
    assert via.status_code == direct.status_code == 200
    assert norm(via.content) == norm(direct.content)
    assert b"token_ids" not in via.content          # the ids the proxy asked for are not passed on
    assert via.headers["content-type"] == direct.headers["content-type"]
    body = {**CHAT, "stream": True, "messages": CHAT["messages"] + [{"role": "assistant", "content": "hi"},
                                                                  {"role": "user", "content": "Again."}]}
    with httpx.stream("POST", proxy.url + "/v1/chat/completions", json=body, timeout=60) as r:
        streamed = b"".join(r.iter_bytes())
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        streamed_direct = b"".join(r.iter_bytes())
    assert norm(streamed) == norm(streamed_direct)
    assert b"token_ids" not in streamed and b'"usage"' not in streamed   # the added usage chunk is dropped
    comp = {"prompt": "One two three", "max_tokens": 5, "temperature": 0, "seed": 1}
    via_c = httpx.post(proxy.url + "/v1/completions", json=comp, timeout=60)
    direct_c = httpx.post(server.url + "/v1/completions", json=comp, timeout=60)
    assert norm(via_c.content) == norm(direct_c.content)

    lines = _wait_lines(proxy, n0 + 3)[n0:]
    served = {rec["request_id"]: rec for rec in server.lines()[s0:]}
    assert [rec["route"] for rec in lines] == ["chat", "chat", "completions"]
    for rec in lines:
        own = served[rec["upstream_id"]]              # the server's own line for this call
        assert rec["prompt_ids"] == own["prompt_ids"] and rec["gen_ids"] == own["gen_ids"]
        assert rec["fidelity"] == "ids" and rec["cache_engine"] == "strata" and rec["status"] == 200
        assert rec["reported_cached_tokens"] == own["reused"]
        assert rec["upstream"]["engine"] == "strata" and rec["upstream"]["model"]
    text = proxy.dump.read_text()
    assert "SECRET" not in text and "sk-proxy" not in text
    assert stat.S_IMODE(os.stat(proxy.dump).st_mode) == 0o600


def test_client_asking_for_ids_gets_them(pair):
    server, proxy = pair
    body = {**CHAT, "return_token_ids": True}
    via = httpx.post(proxy.url + "/v1/chat/completions", json=body, timeout=60).json()
    assert isinstance(via["prompt_token_ids"], list) and isinstance(via["choices"][0]["token_ids"], list)


def test_upstream_errors_pass_through_and_are_recorded(pair):
    server, proxy = pair
    n0 = len(proxy.lines())
    bad = {"messages": "not a list", "max_tokens": 3}
    via = httpx.post(proxy.url + "/v1/chat/completions", json=bad, timeout=60)
    direct = httpx.post(server.url + "/v1/chat/completions", json=bad, timeout=60)
    assert via.status_code == direct.status_code and 400 <= via.status_code < 500
    assert via.content == direct.content
    line = _wait_lines(proxy, n0 + 1)[-1]
    assert line["finish"] == "error" and line["status"] == via.status_code and line["prompt_ids"] == []
    # a path the proxy does not record is passed on as it is
    assert httpx.get(proxy.url + "/v1/models", timeout=10).json()["data"][0]["id"] == \
        httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]["id"]
    assert len(proxy.lines()) == n0 + 1


def test_client_that_leaves_mid_stream(pair):
    server, proxy = pair
    n0 = len(proxy.lines())
    body = {"messages": [{"role": "user", "content": "Count."}], "max_tokens": 3000, "ignore_eos": True,
            "stream": True, "seed": 2}
    with httpx.stream("POST", proxy.url + "/v1/chat/completions", json=body, timeout=60) as r:
        it = r.iter_bytes()
        next(it)
        next(it)
    line = _wait_lines(proxy, n0 + 1)[-1]
    assert line["finish"] == "cancelled" and line["prompt_ids"]
    assert len(line["gen_ids"]) < 3000
    # the server stopped that call too: its line ends cancelled, well short of the cap
    deadline = time.time() + 20
    while time.time() < deadline and not any(r.get("finish") == "cancelled" for r in server.lines()):
        time.sleep(0.1)
    assert any(r.get("finish") == "cancelled" for r in server.lines())


def test_replay_of_a_proxy_dump_compares_prediction_and_report(pair, tmp_path):
    server, proxy = pair
    session = {"x-session-id": "agent-1"}
    msgs = [{"role": "system", "content": "You are a coding agent. " * 8}, {"role": "user", "content": "ls"}]
    n0 = len(proxy.lines())
    for turn in range(3):
        r = httpx.post(proxy.url + "/v1/chat/completions", headers=session, timeout=60,
                       json={"messages": msgs, "max_tokens": 5, "temperature": 0, "seed": turn}).json()
        msgs = msgs + [r["choices"][0]["message"], {"role": "user", "content": f"next {turn}"}]
    lines = _wait_lines(proxy, n0 + 3)[n0:]
    assert {rec["session"] for rec in lines} == {"agent-1"}
    dump = tmp_path / "agent.jsonl"
    dump.write_text("".join(json.dumps(rec) + "\n" for rec in lines))
    out = tmp_path / "report.json"
    res = subprocess.run([sys.executable, "-m", "strata_lab", "replay", str(dump), "--json", str(out), "-q"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    report = json.loads(out.read_text())
    text = json.dumps(report)
    assert "reported" in text and "strata" in text
    for rec in lines:
        assert isinstance(rec["reported_cached_tokens"], int)


# --- without a server: the pieces -----------------------------------------------------------------------------
def test_strip_keeps_every_other_byte():
    from strata_lab.proxy.engines import PROFILES, plan_request, strip

    _, plan = plan_request(PROFILES["strata"], "/v1/chat/completions", {"messages": []})
    raw = b'{"a":1, "prompt_token_ids":[1, 2],"choices":[{"token_ids":[3],"x":"\\"token_ids\\":[9]"}]}'
    assert strip(raw, plan) == b'{"a":1,"choices":[{"x":"\\"token_ids\\":[9]"}]}'
    _, plan = plan_request(PROFILES["llama.cpp"], "/completion", {"prompt": "x"})
    assert strip(b'{"content":"a","tokens":[5,6],"stop":true}', plan) == b'{"content":"a","tokens":[],"stop":true}'
    _, plan = plan_request(PROFILES["vllm"], "/v1/chat/completions", {"messages": [], "return_token_ids": True})
    assert plan.keys == () and strip(b'{"prompt_token_ids":[1]}', plan) == b'{"prompt_token_ids":[1]}'
    body, plan = plan_request(PROFILES["vllm"], "/v1/chat/completions", {"messages": [], "stream": True})
    assert body["stream_options"] == {"include_usage": True} and plan.drop_usage_chunk


def test_capture_reads_each_dialects_usage():
    from strata_lab.proxy.engines import Capture

    c = Capture("messages")
    c.feed({"type": "message_start", "message": {"id": "m", "model": "claude", "usage": {
        "input_tokens": 10, "cache_read_input_tokens": 90, "cache_creation_input_tokens": 5, "output_tokens": 1}}})
    c.feed({"type": "content_block_delta", "delta": {"type": "text_delta", "text": "hi"}})
    c.feed({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 7}})
    assert c.reported() == {"reported_cached_tokens": 90, "reported_prompt_tokens": 105,
                            "reported_completion_tokens": 7, "reported_cache_write_tokens": 5}
    assert "".join(c.text) == "hi" and c.finish == "end_turn"
    c = Capture("llama")
    c.feed({"content": "a", "tokens": [4], "stop": False})
    c.feed({"content": "", "stop": True, "stop_type": "eos", "timings": {"cache_n": 12, "prompt_n": 3,
                                                                        "prompt_ms": 1.0, "predicted_ms": 2.0}})
    assert c.generated() == [4] and c.reported()["reported_cached_tokens"] == 12
    c = Capture("responses")
    c.feed({"type": "response.completed", "response": {"status": "completed", "usage": {
        "input_tokens": 50, "input_tokens_details": {"cached_tokens": 32}, "output_tokens": 3}}})
    assert c.reported()["reported_cached_tokens"] == 32 and c.finish == "stop"


def test_bad_options_are_refused():
    from strata_lab.proxy.app import ProxyConfig

    with pytest.raises(ValueError, match="--upstream"):
        ProxyConfig(upstream="ftp://x", dump="d.jsonl")
    with pytest.raises(ValueError, match="--engine"):
        ProxyConfig(upstream="http://x", dump="d.jsonl", engine="tgi")
