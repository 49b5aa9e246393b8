"""Server tier: continuous batching across slots. With --slots 4 the worker runs one request per slot at a
time and the engine advances the slots that decode together in shared steps; each reply is the one the
same request gets alone, /props and /slots show the batch, and the dump recorded under concurrency
replays with no mismatch (Contract 1 unchanged: batching changes timing, never ids)."""
import threading

import httpx

from _strata_server import ServerProcess, tiny_model

CTX = 1024
PROMPTS = ["Alpha: rivers and lakes in the north.", "Beta: compilers, parsers and grammars.",
           "Gamma: a recipe for bread with seeds.", "Delta: the rules of a card game, briefly."]


def _ask(url, i, out):
    body = {"messages": [{"role": "user", "content": PROMPTS[i]}], "max_tokens": 24, "temperature": 0,
            "ignore_eos": True, "id_slot": i, "logprobs": True, "top_logprobs": 1}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    c = r.json()["choices"][0]
    out[i] = (c["message"]["content"], [e["logprob"] for e in c["logprobs"]["content"]])


def test_concurrent_slots_share_decode_steps_and_reply_as_alone(tmp_path):
    from strata_lab.caches.replay import replay

    alone = ServerProcess(tmp_path, "--model", str(tiny_model()), "--ctx", str(CTX), "--slots", "4",
                          name="alone").wait()
    want = [None] * 4
    try:
        for i in range(4):
            _ask(alone.url, i, want)
        assert httpx.get(alone.url + "/props").json()["batch"]["max_batch"] == 1
    finally:
        alone.stop()

    srv = ServerProcess(tmp_path, "--model", str(tiny_model()), "--ctx", str(CTX), "--slots", "4",
                        name="batched").wait()
    try:
        got = [None] * 4
        threads = [threading.Thread(target=_ask, args=(srv.url, i, got)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert got == want  # the same text and the same logprobs, bit for bit through JSON
        props = httpx.get(srv.url + "/props").json()
        assert props["queue"]["lanes"] == 4
        batch = props["batch"]
        assert batch["max_batch"] >= 2, batch  # the slots decoded in shared steps
        assert batch["decoding"] == 0 and batch["waiting"] == 0
        slots = httpx.get(srv.url + "/slots").json()
        assert [s["requests"] for s in slots] == [1, 1, 1, 1]
        assert all(s["batch"] == 0 and not s["is_processing"] for s in slots)  # idle now
        lines = srv.lines()
        assert sorted(ln["session"] for ln in lines) == [f"default-{i}" for i in range(4)]  # one line per call
        report = replay(srv.dump, "strata", checkpoints="recorded")
        assert report["calls_differ"] == 0
    finally:
        srv.stop()
