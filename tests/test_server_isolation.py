"""Server tier, issue 52: nothing crosses between API keys; stored responses are bounded; no field stalls.

Two keys (alice, bob) on one slot: a stored response is the key's own (another key gets the 404 of an id
never held), the prompt cache and the `cached_tokens` it reports are per key unless `--shared-cache`, and
`/slots` shows another key's slot without its contents. The response store expires and is bounded in count
and bytes (metadata included). Huge `assistant_prefix` / `logit_bias` texts are refused or tokenized
without holding the event loop (checked against a /health baseline measured in the same test).
"""
from __future__ import annotations

import httpx
import pytest

from _strata_server import ServerProcess, assert_no_stall, health_while, tiny_model

ALICE, BOB = {"x-api-key": "sk-alice-1"}, {"Authorization": "Bearer sk-bob-2"}
# a prompt long enough that its reuse shows (a turn's header and more)
LONG = [{"role": "user", "content": "Tell me about the weather in Lisbon in early spring, please. " * 8}]


def _keys(tmp) -> str:
    path = tmp / "keys.txt"
    path.write_text("alice sk-alice-1\nbob sk-bob-2\n")
    return str(path)


def _server(tmp, *extra, name="server") -> ServerProcess:
    # a context that lets a 400 KB prefix past the cheap check (3 K tokens at most) and refuses a 3 MB one
    return ServerProcess(tmp, "--model", str(tiny_model()), "--ctx", "8192", "--slots", "1",
                         "--max-tokens-default", "2", "--api-key-file", _keys(tmp), *extra, name=name)


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("isolation")
    both = [_server(tmp), _server(tmp, "--shared-cache", name="shared")]  # started together
    try:
        yield [s.wait(120) for s in both]
    finally:
        for s in both:
            s.stop()


@pytest.fixture(scope="module")
def server(servers):
    return servers[0]


def post(server, path, body, headers, timeout=120):
    return httpx.post(server.url + path, json=body, headers=headers, timeout=timeout)


def _cached(server, headers) -> int:
    r = post(server, "/v1/chat/completions", {"messages": LONG, "max_tokens": 1, "temperature": 0}, headers)
    assert r.status_code == 200, r.text[:300]
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


# --- stored responses: the key's own --------------------------------------------------------------------------
def test_a_stored_response_is_its_keys_own(server):
    r = post(server, "/v1/responses", {"input": "hello", "max_output_tokens": 2, "temperature": 0}, ALICE)
    assert r.status_code == 200, r.text[:300]
    rid = r.json()["id"]
    assert httpx.get(f"{server.url}/v1/responses/{rid}", headers=ALICE).json()["id"] == rid
    theirs = httpx.get(f"{server.url}/v1/responses/{rid}", headers=BOB)
    never = httpx.get(f"{server.url}/v1/responses/resp_never_made", headers=BOB)
    assert theirs.status_code == never.status_code == 404
    assert theirs.json()["error"]["message"].replace(rid, "X") == never.json()["error"]["message"].replace(
        "resp_never_made", "X")  # nothing tells bob that the id exists
    cont = post(server, "/v1/responses", {"input": "go on", "previous_response_id": rid, "max_output_tokens": 2}, BOB)
    assert cont.status_code == 400 and cont.json()["error"]["code"] == "not_found", cont.text[:300]
    ok = post(server, "/v1/responses", {"input": "go on", "previous_response_id": rid, "max_output_tokens": 2}, ALICE)
    assert ok.status_code == 200, ok.text[:300]


def test_metadata_is_bounded_like_openais(server):
    body = {"input": "x", "max_output_tokens": 1}
    for meta, param in (({"k": "v" * 513}, "metadata.k"), ({f"k{i}": "v" for i in range(17)}, "metadata"),
                        ({"k" * 65: "v"}, "metadata"), ({"k": 5}, "metadata.k")):
        r = post(server, "/v1/responses", {**body, "metadata": meta}, ALICE)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text[:300]
    assert post(server, "/v1/responses", {**body, "metadata": {"k": "v" * 512}}, ALICE).status_code == 200


# --- the prompt cache: per key --------------------------------------------------------------------------------
def test_cached_tokens_never_cross_keys(server):
    _cached(server, ALICE)
    assert _cached(server, ALICE) > 0  # alice's own prompt, reused
    assert _cached(server, BOB) == 0   # the same prompt from bob: nothing of alice's is reused or reported
    assert _cached(server, BOB) > 0    # bob's own, now
    assert _cached(server, ALICE) == 0  # the one slot served bob since: alice reads hers again


def test_slots_show_another_keys_slot_without_its_contents(server):
    _cached(server, ALICE)
    (mine,) = httpx.get(server.url + "/slots", headers=ALICE).json()
    (theirs,) = httpx.get(server.url + "/slots", headers=BOB).json()
    assert mine["n_held"] > 0 and mine["requests"] > 0
    assert theirs["n_held"] is None and theirs["requests"] is None and theirs["checkpoints"] is None


def test_shared_cache_shares_one_cache(servers):
    srv = servers[1]
    _cached(srv, ALICE)
    assert _cached(srv, BOB) > 0  # the operator chose one cache for all keys
    r = post(srv, "/v1/responses", {"input": "hello", "max_output_tokens": 1}, ALICE)
    assert httpx.get(f"{srv.url}/v1/responses/{r.json()['id']}", headers=BOB).status_code == 404  # still per key


# --- the store's bounds (unit) --------------------------------------------------------------------------------
def test_the_store_expires_and_is_bounded_in_count_and_bytes():
    from strata_lab.server.responses import ResponseStore

    now = [0.0]
    store = ResponseStore(max_entries=3, max_bytes=10_000, ttl=60, clock=lambda: now[0])
    for i in range(5):
        assert store.put(f"r{i}", [], {"id": f"r{i}"}, owner="alice")
    assert len(store) == 3 and store.get("r0", "alice") is None and store.get("r4", "alice")[1]["id"] == "r4"
    now[0] = 61
    assert store.get("r4", "alice") is None and len(store) == 0 and store.bytes == 0  # expired
    big = {"id": "b", "metadata": {"k": "v" * 4000}}
    assert store.put("b1", [], big) and store.put("b2", [], big)
    assert store.put("b3", [], big) and store.get("b1") is None  # over 10,000 bytes: the oldest went
    assert store.bytes <= 10_000
    assert not store.put("huge", [], {"metadata": {"k": "v" * 20_000}}) and store.get("huge") is None
    assert not ResponseStore(max_entries=0).put("r", [], {})


def test_slots_are_chosen_among_the_keys_own():
    from strata_lab.server.slots import SlotPool, _Held

    pool = SlotPool([_Held([1, 2, 3, 4]), _Held([])], names=["a", "b"])
    first = pool.choose([1, 2, 3, 4, 5], owner="alice")
    assert pool.take(first, "alice")  # an unowned slot: taken (reset)
    first.session.held_ids = [1, 2, 3, 4, 5]
    assert pool.choose([1, 2, 3, 4, 5, 6], owner="alice").id == first.id
    other = pool.choose([1, 2, 3, 4, 5, 6], owner="bob")
    assert other.id != first.id  # alice's prefix is never bob's to reuse
    # a session key names a slot within its API key only
    pool.choose([9], key="s", owner="alice")
    assert pool._keys[("alice", "s")] is not None and ("bob", "s") not in pool._keys


# --- huge text fields: refused or tokenized off the event loop ------------------------------------------------
@pytest.mark.parametrize("field, body", [
    ("assistant_prefix", {"assistant_prefix": "a b " * 750_000}),
    ("logit_bias", {"logit_bias": [["word " * 700_000, 1]]}),
    ("logit_bias", {"logit_bias": {"word " * 700_000: 1}}),
])
def test_huge_text_fields_are_a_400_without_a_stall(server, field, body):
    r, worst, base, took = health_while(server.url, lambda: post(
        server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, **body},
        ALICE))
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text[:300]
    assert_no_stall(worst, base, took)


def test_a_long_prefix_under_the_cheap_bound_is_tokenized_without_a_stall(server):
    """The cheap check lets a 400 KB prefix through (3 K tokens at most in a context of 8 K); its tokenizing
    (seconds) runs without holding the event loop; the prompt is then over the context: a 400."""
    r, worst, base, took = health_while(server.url, lambda: post(server, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "assistant_prefix": "a b " * 100_000},
        ALICE))
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text[:300]
    assert "at least" not in r.json()["error"]["message"]  # counted by the tokenizer, not the cheap check
    assert_no_stall(worst, base, took)
