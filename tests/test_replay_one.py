"""One replay (issue 27): one driver, one explainer, one report type, for our engine and every other.

- every shipped dump: the default replay is `--engine strata` row for row, in the library and the CLI, and
  `--json` always writes;
- an edited history (a session whose turn 3 edits its first message thousands of tokens before the end) is a
  `history_edit` with the tokens it cost under every engine, first among the worst divergences;
- agent.jsonl: one re-read number for our engine, and no engine shows 0 re-read beside retokenized_reply.
"""
import glob
import json
import os

import pytest
from hypothesis import example, given, settings, strategies as st

import strata_lab as sl
from strata_lab.caches.replay import ReplayReport
from strata_lab.cli import main
from strata_lab.dump.writer import Recorder
from strata_lab.replayer.state import SessionState

ROOT = os.path.join(os.path.dirname(__file__), "..")
DUMPS = sorted(glob.glob(os.path.join(ROOT, "dumps", "*.jsonl")))
ENGINES = ["vllm", "sglang", "llama.cpp", "trtllm", "openai", "anthropic", "gemini", "strata"]


@pytest.mark.parametrize("path", DUMPS, ids=[os.path.basename(p) for p in DUMPS])
def test_default_replay_is_engine_strata_row_for_row(qwen3, path, tmp_path):
    default, strata = sl.replay(path, tokenizer=qwen3), sl.replay(path, engine="strata", tokenizer=qwen3)
    assert type(default) is type(strata) is ReplayReport
    assert default.specs == strata.specs == ["strata@1"]
    assert len(default.frame()) > 0 and default.frame().equals(strata.frame())
    # the CLI runs the same code: plain `replay D` and `replay D --engine strata` write the same JSON
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert main(["replay", path, "-q", "--json", str(a)]) == 0
    assert main(["replay", path, "-q", "--engine", "strata", "--json", str(b)]) == 0
    assert a.read_bytes() == b.read_bytes()
    doc = json.loads(a.read_text())
    assert [c["reused"] for c in doc["calls"]] == default.frame()["reused"].tolist()
    # the reported columns (Contract 4) are in every replay: our dumps report `reused`
    assert {"reported", "reported_by", "reported_diff"} <= set(doc["calls"][0])
    assert doc["engines"][0]["reported_calls"] == len(doc["calls"])


def test_replay_returns_one_type_whatever_the_arguments(qwen3):
    path = DUMPS[0]
    reps = [sl.replay(path, tokenizer=qwen3), sl.replay(path, engine="vllm", tokenizer=qwen3),
            sl.replay(path, engine=["vllm", "sglang"], tokenizer=qwen3),
            sl.replay(path, engine="strata", checkpoints="turn", tokenizer=qwen3),
            sl.replay(path, policy="reply-ids", tokenizer=qwen3),
            sl.replay_engines(path, ["llama.cpp"], tokenizer=qwen3)]
    reps.append(sl.replay(path, engine="strata:kind=attention,checkpoints=turn", tokenizer=qwen3))
    assert {type(r) for r in reps} == {ReplayReport}
    # the keyword the engine spec replaced is an error naming the setting to use
    with pytest.raises(ValueError, match="did you mean 'checkpoints'"):
        sl.replay(path, checkpoint_policy="turn", tokenizer=qwen3)


def test_json_is_written_for_every_replay(tmp_path, capsys):
    for args in ([], ["--engine", "vllm"], ["--policy", "keep-drained"], ["--checkpoints", "turn"]):
        out = tmp_path / f"r{len(list(tmp_path.iterdir()))}.json"
        assert main(["replay", DUMPS[0], "-q", "--json", str(out), *args]) == 0
        doc = json.loads(out.read_text())
        assert doc["schema"] == "strata-replay/1" and len(doc["calls"]) > 0
    capsys.readouterr()
    assert main(["replay", DUMPS[0], "-q", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["calls"]


# --- an edited history ------------------------------------------------------------------------------
def _chat(tok, messages, *, open_assistant=True):
    text = "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in messages)
    return tok.encode(text + ("<|im_start|>assistant\n" if open_assistant else ""))


def _history_edit_dump(tok, path) -> tuple[int, int]:
    """A session of 5 turns over a long document; turn 3 edits the first line of the system message (the
    date), thousands of tokens before the end. Returns (the edited call's index, its prompt length)."""
    doc = "\n".join(f"Section {i}: the service keeps a ledger of orders, refunds and audit notes for region "
                    f"{i % 7}; every entry is checked twice before it is filed." for i in range(120))
    system = ("Date: 2026-03-01\nYou are a careful assistant for the operations team.", "Date: 2026-03-02\n"
              "You are a careful assistant for the operations team.")
    asks = ["Summarise the ledger policy.", "Which regions repeat?", "List the checks.", "Any refunds?",
            "Thanks, one more line please."]
    replies = [f"Reply {k}: the ledger is checked twice and filed by region." for k in range(5)]
    edited = 3
    st = SessionState(model="hybrid")   # what our engine reuses and where it keeps snapshots (Contract 1)
    with Recorder(path) as rec:
        prev_prompt, prev_reply = None, None
        for k in range(5):
            msgs = [("system", system[k >= edited]), ("user", doc + "\n\n" + asks[0])]
            for j in range(k):
                msgs += [("assistant", replies[j]), ("user", asks[j + 1])]
            prompt = _chat(tok, msgs)
            if k not in (0, edited) and prev_prompt is not None:   # the server appends ids: the prefix is exact
                tail = _chat(tok, [("user", asks[k])])
                prompt = prev_prompt + prev_reply + tok.encode("\n") + tail
            reply = tok.encode(replies[k]) + [tok.im_end_id]
            reused = st.call(prompt).reused
            st.finish(reply)
            rec.write_call(session="ops", prompt_ids=prompt, reused=reused, gen_ids=reply,
                           checkpoints=list(st.checkpoints))
            prev_prompt, prev_reply = prompt, reply
            if k == edited:
                n = len(prompt)
    return edited, n


def test_history_edit_is_named_and_priced_under_every_engine(qwen3, tmp_path):
    path = str(tmp_path / "edited.jsonl")
    k, n = _history_edit_dump(qwen3, path)
    assert n > 3000
    rep = sl.replay_engines(path, ENGINES, tokenizer=qwen3)
    df = rep.frame()
    edit = df[df["index"] == k]
    assert set(edit["divergence"]) == {"history_edit"}
    assert (edit["lcp_ids"] < 20).all()                      # the prompt parts at the date, near the start
    for spec in rep.specs:
        row = edit[edit["spec"] == spec].iloc[0]
        assert row["cause"] == "history_edit", (spec, row[["cause", "reused", "reread", "engine_reread"]])
        # the edit cost (nearly) every token the session held: far more than a block
        assert row["reread"] > 0.9 * row["held_before"] > 2500, (spec, row["reread"], row["held_before"])
        worst = rep.worst(3, spec)
        assert worst[0]["index"] == k and worst[0]["cause"] == "history_edit", (spec, worst[0])
    # the headline counts it: not "0 of N tokens were re-read"
    assert rep.totals("strata")["reread"] >= edit[edit["engine"] == "strata"]["reread"].iloc[0] > 2500
    # the text the CLI prints ranks it first
    text = rep.format(worst=1)
    assert "worst divergences on vllm@0.33 (top 1 by tokens re-read):\n- session ops turn 3 (call 3): " \
           "history_edit" in text


def test_agent_dump_has_one_reread_number_and_no_zero_beside_a_retokenization(qwen3):
    path = os.path.join(ROOT, "dumps", "agent.jsonl")
    spelled_out = sl.replay(path, engine="strata:kind=hybrid,checkpoints=recorded", tokenizer=qwen3)
    numbers = {sl.replay(path, tokenizer=qwen3)["reread"], sl.replay(path, engine="strata", tokenizer=qwen3)["reread"],
               sl.replay(path, engine="strata", checkpoints="recorded", tokenizer=qwen3)["reread"], spelled_out["reread"]}
    assert len(numbers) == 1 and numbers.pop() > 0
    rep = sl.replay_engines(path, ENGINES, tokenizer=qwen3)
    df = rep.frame()
    retok = df[df["cause"] == "retokenized_reply"]
    assert len(retok) and (retok["reread"] > 0).all()
    for r in rep.summary().to_dict("records"):
        if "retokenized_reply" in r["causes"]:
            assert r["reread"] > 0, r
    assert set(retok["engine"]) >= {"sglang", "llama.cpp", "trtllm", "vllm", "strata"}


def test_one_cause_vocabulary():
    from strata_lab.rules import CAUSES, ENGINE_CAUSES

    rep = sl.replay_engines(DUMPS[0], ENGINES, tokenizer="qwen3")
    assert set(rep.frame()["cause"].astype(str)) <= set(CAUSES)
    assert set(ENGINE_CAUSES) <= set(CAUSES) and "checkpoint" not in CAUSES


def test_prompt_policies_transform_the_call_stream_for_every_engine(qwen3):
    from strata_lab.dump import load_dump
    from strata_lab.replayer import PromptRewriter, SessionState, parse_policy

    path = os.path.join(ROOT, "dumps", "agent.jsonl")
    rep = sl.replay(path, ["vllm", "sglang", "strata:checkpoints=turn"], policy="reply-ids", tokenizer=qwen3)
    s = rep.summary().set_index("engine")
    base = sl.replay(path, ["vllm"], tokenizer=qwen3).summary().iloc[0]
    # one rewritten stream: every engine sees the same prompts, and they are not the recorded ones
    assert s["prompt_tokens"].nunique() == 1 and s.loc["vllm", "prompt_tokens"] != base["prompt_tokens"]
    assert s["reported_calls"].eq(0).all()            # the log's figures belong to the recorded prompts
    # our engine under the transformed stream reuses what the state model predicts for the rewritten prompts
    rw, states, want = PromptRewriter(parse_policy("reply-ids"), qwen3), {}, []
    for rec in load_dump(path).records():
        st = states.setdefault(str(rec["session"]), SessionState(model="hybrid"))
        prompt = rw.prompt(rec, st)
        want.append((st.call(prompt).reused, len(prompt)))
        st.finish(rec["gen_ids"], rec["drained_ids"])
        rw.finish(rec, prompt)
    ours = rep.frame()[rep.frame()["engine"] == "strata"].sort_values("index")
    assert list(zip(ours["reused"].tolist(), ours["prompt_len"].tolist())) == want
    with pytest.raises(ValueError, match="checkpoint policy applies to the strata engine"):
        sl.replay(path, "vllm", policy="header", tokenizer=qwen3)


def _paths(path, tmp_path, qwen3, *, dask: bool) -> dict:
    """The one driver's replays of the same calls: the JSONL lines (call by call), the store on the C++ replay
    core, and (dask) the store on Dask."""
    from strata_lab.dump import convert_jsonl

    store = tmp_path / "store"
    convert_jsonl([path], store, progress=False)
    out = {"jsonl": sl.replay(path, tokenizer=qwen3), "store": sl.replay(store, tokenizer=qwen3)}
    if dask:
        out["dask"] = sl.replay(store, tokenizer=qwen3, cluster="local:1")
    return out


def _fleet_dump(qwen3, path, copies: int = 1) -> str:
    """A small generated fleet (agent sessions on the real template, two replicas): misses of every kind.
    `copies` > 1 writes it again with renamed sessions, each copy starting half the fleet's span later: the
    file's order is then not the calls' arrival order."""
    import orjson

    from strata_lab.fleet import FleetConfig, generate_fleet

    recs = list(generate_fleet(FleetConfig(sessions=6, replicas=2, seed=0), tokenizer=qwen3))
    half = (max(r["ts"] for r in recs) - min(r["ts"] for r in recs)) / 2
    with open(path, "wb") as f:
        for k in range(copies):
            for r in recs:
                r = r if k == 0 else dict(r, session=f"{r['session']}-k{k}", request_id=f"{r['request_id']}-k{k}",
                                          ts=r["ts"] + half * k)
                f.write(orjson.dumps(r) + b"\n")
    return str(path)


@pytest.mark.parametrize("path", DUMPS + ["fleet", "fleet-overlapping"],
                         ids=[os.path.basename(p) for p in DUMPS] + ["fleet", "fleet-overlapping"])
def test_jsonl_store_and_dask_give_the_same_rows(qwen3, path, tmp_path):
    """One report type on every path (issue 51): the same calls replayed from JSONL (call by call), from a store
    on the C++ core and on Dask give equal reports, every column of every row."""
    if path.startswith("fleet"):   # overlapping: rows come in arrival order on every path, not file order
        path = _fleet_dump(qwen3, tmp_path / "fleet.jsonl", copies=2 if path.endswith("overlapping") else 1)
    reps = _paths(path, tmp_path, qwen3, dask=path.endswith(("agent.jsonl", "fleet.jsonl")))
    one = reps.pop("jsonl")
    df = one.frame()
    assert len(df) and df["divergence_reread"].sum() > 0    # the dump has divergences to count
    for name, rep in reps.items():
        assert type(rep) is ReplayReport and rep.specs == one.specs, name
        got = rep.frame()
        assert list(got.columns) == list(df.columns), name
        for col in df.columns:
            assert got[col].equals(df[col]), (name, col, got[col].tolist(), df[col].tolist())
        assert rep.summary().equals(one.summary()), name
        assert rep.to_json() == one.to_json(), name


def test_history_edit_through_the_store_rereads_everything_after_it(qwen3, tmp_path):
    path = str(tmp_path / "edited.jsonl")
    k, _n = _history_edit_dump(qwen3, path)
    one = sl.replay(path, tokenizer=qwen3).frame()
    edit = one[one["index"] == k].iloc[0]
    assert edit["cause"] == "history_edit" and edit["reread"] > 0.9 * edit["held_before"] > 2500
    for name, rep in _paths(path, tmp_path, qwen3, dask=False).items():
        got = rep.frame()
        row = got[got["index"] == k].iloc[0]
        assert (row["cause"], row["reread"]) == ("history_edit", edit["reread"]), name
        assert got["reread"].tolist() == one["reread"].tolist(), name
        assert rep.worst(1)[0]["index"] == k, name


def test_plain_replay_shows_the_reported_column(capsys, tmp_path):
    """Issue 28: `strata-lab replay D` without --engine shows what the log reported beside the simulation."""
    assert main(["replay", DUMPS[0], "-q"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("engine"))
    assert "reported" in header.split() and "reported_diff" in header.split()
    assert "vs reported by strata on" in out
    # a log that reports nothing says so instead of leaving the comparison out
    path = tmp_path / "bare.jsonl"
    path.write_text(json.dumps({"schema": "strata-dump/1", "session": "s", "prompt_ids": [1, 2, 3], "gen_ids": [4],
                                "drained_ids": [], "finish": "stop", "timings": {}, "checkpoints": []}) + "\n")
    assert main(["replay", str(path), "-q"]) == 0
    assert "vs reported: no call in this trace reports its cached tokens" in capsys.readouterr().out


def test_the_replay_cores_causes_are_the_one_vocabulary():
    """The C++ replay core exports its causes by name (`_replay.Cause`): every one is a cause of the one
    vocabulary (`strata_lab.rules.CAUSES`), and the one the renamed `checkpoint` became is spelled the same on both sides."""
    from strata_lab import _native
    from strata_lab.rules import CAUSES

    if not _native.replay_available():
        pytest.skip("the replay core is not built")
    names = set(_native.replay().Cause.__members__)
    assert names <= set(CAUSES), names - set(CAUSES)
    assert "no_state_checkpoint" in names and "checkpoint" not in names


def test_strata_flags_are_the_engine_spec(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert main(["replay", DUMPS[0], "-q", "--model", "attention", "--checkpoints", "turn", "--json", str(a)]) == 0
    assert main(["replay", DUMPS[0], "-q", "--engine", "strata:kind=attention,checkpoints=turn", "--json", str(b)]) == 0
    assert a.read_bytes() == b.read_bytes()
    assert json.loads(a.read_text())["engines"][0]["spec"] == "strata@1:checkpoints=turn,kind=attention"
    assert main(["replay", DUMPS[0], "-q", "--engine", "vllm", "--model", "attention"]) == 2
    assert "--model / --checkpoints / --full-hit set the strata engine" in capsys.readouterr().err


def _greedy_tail(held, prompt, h0, p0, gram=8):
    """explain.realigned_tail spelled out: left to right over held, each run of at least `gram` ids matched at
    its first occurrence in the prompt at or after the previous match's end; a run found further on than it is
    long is passed over when the next held ids the prompt has (past that run) occur before it."""
    H, P = list(held[h0:]), list(prompt[p0:])

    def find(g, lo, hi):
        return next((q for q in range(lo, hi) if P[q:q + gram] == g), None)

    i = j = matched = 0
    while i + gram <= len(H):
        q = find(H[i:i + gram], j, len(P) - gram + 1)
        if q is None:
            i += 1
            continue
        m = gram
        while i + m < len(H) and q + m < len(P) and H[i + m] == P[q + m]:
            m += 1
        if q - j > m:
            nxt = next((i2 for i2 in range(i + m, len(H) - gram + 1)
                        if find(H[i2:i2 + gram], 0, len(P) - gram + 1) is not None), None)
            if nxt is not None and find(H[nxt:nxt + gram], j, q) is not None:
                i += 1
                continue
        matched, j, i = matched + m, q + m, i + m
    return matched


@settings(max_examples=300, deadline=None)
@given(held=st.lists(st.integers(0, 4), max_size=120), edits=st.lists(
    st.tuples(st.integers(0, 120), st.integers(0, 20), st.lists(st.integers(0, 4), max_size=20)), max_size=5),
    rotate=st.booleans(), h0=st.integers(0, 120), p0=st.integers(0, 160))
# a run that recurs exactly where the previous match ends (its last occurrence in the prompt)
@example(held=[0, 1, 2, 3, 4, 0, 1, 2, 4, 4, 0, 1, 2, 3, 4, 0, 1, 2], edits=[(8, 2, [])], rotate=False, h0=0, p0=0)
def test_realigned_tail_is_the_greedy_walk(held, edits, rotate, h0, p0):
    """The realigned tail (the re-read past a divergence, every replay path's) on repetitive ids."""
    from strata_lab.replayer.explain import realigned_tail

    prompt = list(held)
    for at, n, new in edits:
        prompt[at:at + n] = new
    if rotate:
        prompt = prompt[len(prompt) // 2:] + prompt[:len(prompt) // 2]
    h0, p0 = min(h0, len(held)), min(p0, len(prompt))
    assert realigned_tail(held, prompt, h0, p0) == _greedy_tail(held, prompt, h0, p0)
