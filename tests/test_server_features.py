"""Server tier, issue 17: logprobs, raw-id completions, n > 1 and seeds, slots, token counting, aliases."""
import json

import httpx
import numpy as np
import openai
import pytest

from _strata_server import ServerProcess, tiny_model

CTX = 1024


@pytest.fixture(scope="module")
def dense(tmp_path_factory, tiny_dir):
    """The f32 tiny dense model folder (transformers loads it) behind a real server."""
    srv = ServerProcess(tmp_path_factory.mktemp("dense"), "--model", str(tiny_dir), "--ctx", str(CTX)).wait()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def oa(dense):
    return openai.OpenAI(base_url=dense.url + "/v1", api_key="none", max_retries=0)


def _hf_logprobs(model_dir, ids):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1).numpy()


def test_prompt_logprobs_equal_transformers_through_the_openai_sdk(oa, dense, tiny_dir):
    ids = [9707, 1879, 13, 151644, 872, 198, 3838, 374, 220, 17, 10, 17, 30]
    r = oa.completions.create(model="m", prompt=ids, max_tokens=3, logprobs=3, echo=True, temperature=0)
    lp = r.choices[0].logprobs
    ref = _hf_logprobs(tiny_dir, ids)
    assert lp.token_logprobs[0] is None and len(lp.token_logprobs) == len(ids) + 3
    got = np.array(lp.token_logprobs[1:len(ids)])
    want = np.array([ref[j, ids[j + 1]] for j in range(len(ids) - 1)])
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    # the ids went to the engine as given: the dump's prompt is exactly them
    assert dense.lines()[-1]["prompt_ids"] == ids
    # generated part: greedy ids are their position's best, alternatives sorted
    for tok, value, top in zip(lp.tokens[len(ids):], lp.token_logprobs[len(ids):], lp.top_logprobs[len(ids):]):
        assert list(top.values()) == sorted(top.values(), reverse=True)
        assert max(top.values()) == pytest.approx(value, abs=1e-6)


def test_chat_logprobs_typed_fields_sorted_and_consistent(oa, dense):
    r = oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=6,
                                   temperature=0, logprobs=True, top_logprobs=4)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for entry in content:
        values = [t.logprob for t in entry.top_logprobs]
        assert values == sorted(values, reverse=True) and len(values) == 4
        assert entry.top_logprobs[0].token == entry.token and entry.top_logprobs[0].logprob == entry.logprob
    assert "".join(e.token for e in content) == r.choices[0].message.content
    # chat prompt logprobs (vLLM's field) for the rendered prompt
    raw = httpx.post(dense.url + "/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "prompt_logprobs": 1}, timeout=30).json()
    assert raw["prompt_logprobs"][0] is None and len(raw["prompt_logprobs"]) == raw["usage"]["prompt_tokens"]


def test_sampled_logprob_is_the_raw_distribution(oa, tiny_dir):
    """At temperature 1.5 the reported logprob is still log-softmax of the raw logits (stated in the docs)."""
    ids = [9707, 1879, 13]
    r = oa.completions.create(model="m", prompt=ids, max_tokens=1, logprobs=1, temperature=1.5, seed=3)
    lp = r.choices[0].logprobs
    first_id = None
    from strata_lab import load_tokenizer

    tok = load_tokenizer("qwen3")
    first_id = [i for i in range(tok.vocab_size) if tok.decode([i]) == lp.tokens[0]][:1]
    ref = _hf_logprobs(tiny_dir, ids)
    assert any(abs(ref[-1, i] - lp.token_logprobs[0]) < 1e-4 for i in first_id)


def test_n_choices_read_the_prompt_once_and_seed_reproduces(oa, dense):
    before = len(dense.lines())
    body = dict(model="m", messages=[{"role": "user", "content": "tell me"}], max_tokens=5, temperature=1.0,
                n=3, seed=11)
    a = oa.chat.completions.create(**body)
    b = oa.chat.completions.create(**body)
    texts = [c.message.content for c in a.choices]
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert texts == [c.message.content for c in b.choices]  # same seed, same choices
    assert len(set(texts)) > 1                                # each choice its own seed stream
    lines = dense.lines()[before:before + 3]
    assert [ln["call"] for ln in lines] == [0, 1, 2]
    assert len({ln["request_id"] for ln in lines}) == 1
    assert all(ln["reused"] == len(ln["prompt_ids"]) for ln in lines[1:])  # choices 1..: nothing read
    c = oa.chat.completions.create(**{**body, "seed": 12})
    assert [ch.message.content for ch in c.choices] != texts


def test_llama_completion_ids_cache_prompt_and_timings(dense):
    ids = [9707, 1879, 13, 400]
    r = httpx.post(dense.url + "/completion", json={"prompt": ids, "n_predict": 4, "n_probs": 2,
                                                    "temperature": 0}, timeout=30).json()
    assert len(r["tokens"]) == 4 and r["tokens_predicted"] == 4 and r["stop_type"] == "limit"
    assert set(r["timings"]) >= {"prompt_n", "prompt_ms", "predicted_n", "predicted_ms"}
    assert [p["id"] for p in r["completion_probabilities"]] == r["tokens"]
    again = httpx.post(dense.url + "/completion", json={"prompt": ids + r["tokens"], "n_predict": 0}).json()
    assert again["tokens_cached"] == len(ids) + 4  # prompt == held: all reused, the saved logits serve
    fresh = httpx.post(dense.url + "/completion", json={"prompt": ids + r["tokens"], "n_predict": 0,
                                                        "cache_prompt": False}).json()
    assert fresh["tokens_cached"] == 0
    bad = httpx.post(dense.url + "/completion", json={"prompt": [1, -2]})
    assert bad.status_code == 400 and "prompt[1]" in bad.text


def test_count_tokens_aliases_and_chat_template_option(dense, tmp_path):
    msgs = [{"role": "user", "content": "count me"}]
    n = httpx.post(dense.url + "/v1/messages/count_tokens", json={"model": "m", "messages": msgs}).json()
    ids = httpx.post(dense.url + "/apply-template", json={"messages": msgs}).json()["ids"]
    assert n == {"input_tokens": len(ids)}
    assert httpx.get(dense.url + "/models").json() == httpx.get(dense.url + "/v1/models").json()
    r = httpx.post(dense.url + "/chat/completions", json={"messages": msgs, "max_tokens": 1})
    assert r.status_code == 200 and r.json()["object"] == "chat.completion"


def test_chat_template_from_a_file(tmp_path, tiny_dir):
    from strata_lab.text.template import ChatTemplate

    path = tmp_path / "t.jinja"
    path.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
                    "{% if add_generation_prompt %}[assistant] {% endif %}")
    srv = ServerProcess(tmp_path, "--model", str(tiny_dir), "--chat-template", str(path)).wait()
    try:
        r = httpx.post(srv.url + "/apply-template", json={"messages": [{"role": "user", "content": "x"}]}).json()
        assert r["prompt"] == "[user] x\n[assistant] "
        assert ChatTemplate.from_file(path).source == path.read_text()
    finally:
        srv.stop()


def _turns(srv, key_a="A", key_b="B"):
    """Two conversations, interleaved A1 B1 A2 B2; returns the usage of A2 and B2 and of A1, B1."""
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
    conv = {"A": [{"role": "user", "content": "Alpha: let us talk about rivers and lakes in the north."}],
            "B": [{"role": "user", "content": "Beta: a question about compilers, parsers and grammars."}]}
    first, second = {}, {}
    for turn, out in ((0, first), (1, second)):
        for name in ("A", "B"):
            r = client.chat.completions.create(model="m", messages=conv[name], max_tokens=6, temperature=0)
            out[name] = r.usage
            conv[name] = conv[name] + [{"role": "assistant", "content": r.choices[0].message.content},
                                       {"role": "user", "content": f"and then {turn}?"}]
    return first, second


@pytest.mark.parametrize("slots", [2, 1])
def test_interleaved_conversations_keep_their_slots(tmp_path, slots):
    from strata_lab.caches.replay import replay

    srv = ServerProcess(tmp_path, "--model", str(tiny_model()), "--ctx", str(CTX), "--slots", str(slots)).wait()
    try:
        first, second = _turns(srv)
        for name in ("A", "B"):
            whole = first[name].prompt_tokens + first[name].completion_tokens
            cached = second[name].prompt_tokens_details.cached_tokens
            if slots == 2:
                assert cached == whole, (name, cached, whole)  # the whole previous turn
            else:
                assert cached < first[name].prompt_tokens // 2  # evicted by the other conversation
        lines = srv.lines()
        sessions = [ln["session"] for ln in lines]
        assert len(set(sessions)) == slots
        if slots == 2:
            assert sessions[0] == sessions[2] != sessions[1] == sessions[3]
        slot_view = httpx.get(srv.url + "/slots").json()
        assert len(slot_view) == slots and sum(s["requests"] for s in slot_view) == 4
        report = replay(srv.dump, "strata", checkpoints="recorded")
        assert report["calls_differ"] == 0  # the replay's state model follows every slot exactly
    finally:
        srv.stop()


def test_slot_named_by_id_and_by_session_key(tmp_path):
    srv = ServerProcess(tmp_path, "--model", str(tiny_model()), "--ctx", str(CTX), "--slots", "3").wait()
    try:
        msgs = [{"role": "user", "content": "hello"}]
        r = httpx.post(srv.url + "/v1/chat/completions", json={"messages": msgs, "max_tokens": 1, "id_slot": 2})
        assert r.status_code == 200 and srv.lines()[-1]["session"] == "default-2"
        for _ in range(2):
            httpx.post(srv.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "zz"}],
                                                                "max_tokens": 1}, headers={"x-session-id": "k1"})
        s1, s2 = srv.lines()[-2:]
        assert s1["session"] == s2["session"]
        bad = httpx.post(srv.url + "/v1/chat/completions", json={"messages": msgs, "id_slot": 3})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "id_slot"
    finally:
        srv.stop()


@pytest.mark.parametrize("body,field", [({"n": 0}, "n"), ({"n": 17}, "n"),
                                        ({"top_logprobs": 3}, "top_logprobs"), ({"logprobs": "yes"}, "logprobs"),
                                        ({"top_logprobs": 50, "logprobs": True}, "top_logprobs"),
                                        ({"tool_choice": "required"}, "tool_choice"),
                                        ({"grammar": 5}, "grammar"), ({"json_schema": {"type": 7}}, "json_schema"),
                                        ({"grammar": "root ::= ("}, "grammar")])
def test_bad_feature_fields_are_400_naming_the_field(dense, body, field):
    r = httpx.post(dense.url + "/v1/chat/completions",
                   json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 1, **body}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field


def test_streamed_logprobs_match_the_non_streamed_ones(oa):
    body = dict(model="m", messages=[{"role": "user", "content": "stream me"}], max_tokens=5, temperature=0,
                logprobs=True, top_logprobs=2)
    whole = oa.chat.completions.create(**body).choices[0].logprobs.content
    streamed = [e for chunk in oa.chat.completions.create(**body, stream=True)
                for c in chunk.choices if c.logprobs is not None for e in c.logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in whole]


def test_slot_rule_similarity_then_lru_without_a_server():
    from strata_lab.server.slots import SlotPool, _Held

    a, b, c = _Held([1, 2, 3, 4, 5, 6]), _Held([7, 8, 9]), _Held([])
    pool = SlotPool([a, b, c], names=["x", "y", "z"], similarity=0.5)
    assert pool.choose([1, 2, 3, 4, 5, 6, 10]).id == 0      # 6/7 of the prompt held: slot 0
    assert pool.choose([1, 2, 99, 98, 97, 96]).id == 1      # 2/6 only: least recently used (never; lowest id)
    assert pool.choose([7, 42, 43]).id == 2                 # 1/3 of slot 1: LRU again, slot 2 never used
    assert pool.choose([50], key="u").id == 0               # LRU, and the key binds to it
    assert pool.choose([7, 8, 9, 1], key="u").id == 0       # the key wins over similarity
    assert pool.choose([7, 8, 9, 1], slot=1, key="u").id == 1  # id_slot wins over everything


def test_features_parse_in_both_dialects():
    from strata_lab.server.features import parse_features

    f = parse_features({"n_probs": 3, "id_slot": -1, "cache_prompt": False, "grammar": 'root ::= "a"'}, "openai")
    assert (f.logprobs, f.slot, f.cache_prompt, f.constraint.kind) == (3, None, False, "gbnf")
    f = parse_features({"metadata": {"user_id": "u1"}, "tool_choice": {"type": "any"}}, "anthropic")
    assert (f.session_key, f.tool_choice) == ("u1", "required")
    assert parse_features({"user": "x"}, "openai", header_key="h").session_key == "h"
    assert parse_features({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "openai").tool_choice == "f"


def test_streamed_n_choices_equal_the_non_streamed_ones(oa):
    body = dict(model="m", messages=[{"role": "user", "content": "two ways"}], max_tokens=5, temperature=1.0,
                n=2, seed=21)
    whole = [c.message.content for c in oa.chat.completions.create(**body).choices]
    texts, finishes = {0: "", 1: ""}, {}
    for chunk in oa.chat.completions.create(**body, stream=True):
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    assert [texts[0], texts[1]] == whole and set(finishes) == {0, 1}


def test_tool_choice_none_hides_the_tools_from_the_prompt():
    from strata_lab.server.prompt import render_prompt
    from strata_lab.server.request import parse_openai
    from strata_lab.text.template import ChatTemplate

    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    body = {"messages": [{"role": "user", "content": "x"}], "tools": tools}
    t = ChatTemplate.from_name("qwen3")
    assert "<tools>" in render_prompt(t, parse_openai(body)).prompt_text
    assert "<tools>" not in render_prompt(t, parse_openai({**body, "tool_choice": "none"})).prompt_text
