"""Session chaining for logs without a session key: one rule (`CHAINING_RULE`), longest prefix over recent calls
with a documented minimum, for message-level and id-level logs alike."""
import random
from pathlib import Path

import pytest

from strata_lab import load_trace
from strata_lab.traces.log_calls import CHAINING_RULE, ID_SLACK, SessionChain

FIX = Path(__file__).parent / "fixtures" / "traces"
pytestmark = pytest.mark.filterwarnings("ignore::strata_lab.traces.source.TraceWarning")


@pytest.mark.parametrize("name", ["vllm-edits.log", "sglang-edits.jsonl"])
def test_id_logs_chain_edits_by_longest_prefix(name):
    calls = load_trace(FIX / name).calls()
    rid = {c["request_id"].removeprefix("chatcmpl-"): c for c in calls}
    a1, a2, a3 = rid["a1"]["prompt_ids"], rid["a2"]["prompt_ids"], rid["a3"]["prompt_ids"]
    # the shapes the rule is about: no later call extends an earlier one (the think block of the generation
    # prompt is gone from history; a3 re-sends a2 with its last message edited), yet they share long prefixes
    lcp = next(i for i, (x, y) in enumerate(zip(a2, a3)) if x != y)
    assert a3[:len(a2)] != a2 and a2[:len(a1)] != a1 and lcp > len(a1) > 40
    sessions = {k: c["session"] for k, c in rid.items()}
    assert sessions["a1"] == sessions["a2"] == sessions["a3"]
    assert sessions["b1"] == sessions["b2"] != sessions["a1"]
    # c1 shares the system prompt with everyone, and nothing more: a session of its own
    assert sessions["c1"] not in (sessions["a1"], sessions["b1"])
    assert len(set(sessions.values())) == 3


def _ids(rng, n):
    return [rng.randrange(1000, 50000) for _ in range(n)]


def test_id_chain_minimum_and_choice_among_sessions():
    rng = random.Random(0)
    system, gen = _ids(rng, 300), [7, 8, 9]
    chain = SessionChain("s")
    first_a = system + _ids(rng, 20) + gen
    assert chain.session_of_ids(first_a, _ids(rng, 10)) == "s-1"
    b_turn = _ids(rng, 200)
    assert chain.session_of_ids(first_a[:-3] + b_turn + gen) == "s-1"
    first_c = system + _ids(rng, 20) + gen   # shares the system prompt only: new
    assert chain.session_of_ids(first_c) == "s-2"
    # an edit deep in s-1's history (its ids do not extend any earlier call) stays in s-1
    edited = first_a[:-3] + b_turn[:150] + _ids(rng, 60) + gen
    assert chain.session_of_ids(edited) == "s-1"
    # the minimum: all of the session's first prompt but at most its last ID_SLACK ids
    assert chain.session_of_ids(first_c[:-ID_SLACK] + _ids(rng, 40)) == "s-2"
    assert chain.session_of_ids(first_c[:-ID_SLACK - 1] + _ids(rng, 40)) == "s-3"


def test_help_and_docs_state_one_rule():
    docs = " ".join((Path(__file__).parent.parent / "docs" / "FORMATS.md").read_text().split())
    assert "longest prefix over recent calls (not equality)" in CHAINING_RULE
    for phrase in ("longest prefix over recent calls (not equality)", f"except at most its last {ID_SLACK} ids"):
        assert phrase in docs, phrase


from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

_TEXT = st.sampled_from(["", "hi", "sys", "é", "a b", "<think>x</think>"])
_ARGS = st.one_of(st.none(), st.just(""), st.just('{"a": 1}'), st.just({"a": 1}), st.just({"a": 1.0}), st.just(3))
_CALL = st.one_of(
    st.builds(lambda n, a: {"type": "function", "function": {"name": n, "arguments": a}},
              st.sampled_from(["read", "f", ""]), _ARGS),
    st.builds(lambda a: {"function": {"arguments": a}}, _ARGS),  # no name
    st.just({"function": None}), st.just("not a dict"), st.just({"type": "function"}))
_MESSAGE = st.builds(
    lambda role, content, calls: {k: v for k, v in (("role", role), ("content", content), ("tool_calls", calls))
                                  if v != "-"},
    st.sampled_from(["system", "developer", "user", "assistant", "tool", None, "-"]),
    st.one_of(_TEXT, st.none(), st.just("-"), st.just(7),
              st.lists(st.one_of(st.builds(lambda t: {"type": "text", "text": t}, _TEXT), st.just("x")),
                       max_size=2)),
    st.one_of(st.just("-"), st.none(), st.lists(_CALL, max_size=2)))


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(st.integers(0, 4), st.lists(_MESSAGE, max_size=3), st.one_of(st.none(), _MESSAGE),
                          st.booleans()), min_size=1, max_size=10), st.integers(4, 64))
def test_known_digests_chain_as_hashing_every_message(steps, max_entries):
    """A call given the digests of its leading messages (`known`, what the OpenAI reader passes for the messages
    an earlier line held) gets the session, digests and registered prefixes of one that hashes every message,
    on histories that grow, get cut back and restart, with every message shape the key reads (content parts,
    tool calls without a name or a function, object arguments, ...), and with the oldest digests evicted."""
    a, b = SessionChain("s", max_entries=max_entries), SessionChain("s", max_entries=max_entries)
    history: list = []
    for cut, more, reply, use_known in steps:
        kept = history[: len(history) * cut // 4] if cut < 4 else history
        history = kept + more
        if not history:
            continue
        known = b.digests[: min(len(kept), len(b.digests))] if use_known else []  # the digests of kept messages
        got_a = a.session_of_messages(list(history), reply, known=list(known))
        got_b = b.session_of_messages(list(history), reply)
        assert (got_a, a.digests) == (got_b, b.digests)
        assert list(a._seen.items()) == list(b._seen.items())
        if reply is not None and cut % 2:
            history = history + [reply]
