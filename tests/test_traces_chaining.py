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
