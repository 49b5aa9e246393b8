"""Issue 49, the researcher's path on any model: progress bars on stderr for every long command (silenced by
-q), the replay table as a summary per engine plus each engine's worst calls, a note when a policy is another
one on the trace, exports and replays of ids no tokenizer made, a bare .jinja's special tokens from the
tokenizer's folder."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from strata_lab.cli import main
from strata_lab.traces import TraceWarning

ROOT = Path(__file__).parent.parent
FIX = ROOT / "tests" / "fixtures" / "traces"
AGENT = str(ROOT / "dumps" / "agent.jsonl")

pytestmark = pytest.mark.filterwarnings("ignore::strata_lab.traces.source.TraceWarning")


def _run(capsys, argv, rc=0):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        assert main(argv) == rc, capsys.readouterr()
    return capsys.readouterr()


@pytest.fixture(scope="module")
def hashed(tmp_path_factory):
    """A 40-request Mooncake-shaped trace: its synthetic ids run far past any vocabulary."""
    from strata_lab.traces.hashtrace import MooncakeShape, generate_mooncake, write_hash_trace

    path = tmp_path_factory.mktemp("hash") / "m40.jsonl"
    write_hash_trace(generate_mooncake(MooncakeShape(requests=40, seed=3)), path, "mooncake")
    return path


# -- progress ---------------------------------------------------------------------------------------------
# tqdm draws on a pipe too (no TTY needed): its first and last states are written whatever its mininterval,
# so each command's bar shows up in the captured stderr by its name
def _commands(tmp: Path, hashed: Path):
    return [
        (["sweep", str(FIX / "mooncake.jsonl"), "--capacity", "1e3", "--policy", "lru", "--policy", "vllm"],
         ["sweep:", "hash trace:"], 0),
        (["replay", AGENT, "--engine", "vllm"], ["replay vllm@0.33:", "read calls:"], 0),
        (["replay", str(hashed), "--engine", "vllm", "--json", str(tmp / "r.json")], ["replay vllm@0.33:"], 0),
        (["import", str(FIX / "openai.jsonl"), "--out", str(tmp / "o.jsonl")], ["render:"], 0),
        (["lint", AGENT, "--engine", "vllm"], ["lint: decode:", "replay vllm@0.33:"], 1),
        (["export", AGENT, "--format", "mooncake", "--out", str(tmp / "e.jsonl")], ["export mooncake:"], 0),
        (["convert", AGENT, "--out", str(tmp / "store")], ["convert:"], 0),
    ]


@pytest.mark.parametrize("k", range(7))
def test_long_commands_draw_progress_on_stderr_and_q_silences_it(k, capsys, tmp_path, hashed):
    argv, bars, rc = _commands(tmp_path, hashed)[k]
    err = _run(capsys, argv, rc).err
    for bar in bars:
        assert bar in err, (argv[0], bar, err[-500:])
    for p in tmp_path.iterdir():   # the second run writes the same outputs afresh
        if p.is_dir():
            import shutil

            shutil.rmtree(p)
        else:
            p.unlink()
    quiet = _run(capsys, argv + ["-q"], rc)
    assert not any(bar in quiet.err for bar in bars) and "%|" not in quiet.err, quiet.err


def test_rewrite_q_draws_no_bar(capsys, tmp_path):
    pytest.importorskip("strata_lab._engine")
    rc = main(["rewrite", AGENT, "--out", str(tmp_path / "w.jsonl"), "-q"])
    quiet = capsys.readouterr()
    assert rc in (0, 1) and "engine run" not in quiet.err and "%|" not in quiet.err


def test_a_ticking_bar_redraws_while_one_step_runs_and_stops_when_closed():
    """`tick`: a step longer than a few seconds (a server starting, one sweep point) still moves the bar."""
    import io
    import threading
    import time

    from strata_lab.progress import progress_bar

    buf = io.StringIO()
    with progress_bar(total=1, desc="slow", unit="step", tick=0.05, file=buf, mininterval=0) as bar:
        time.sleep(0.4)                       # no update: only the ticks draw
        drawn = buf.getvalue().count("slow")
        assert drawn >= 3, buf.getvalue()
        bar.update(1)
    time.sleep(0.2)
    after = buf.getvalue().count("slow")
    time.sleep(0.2)
    assert buf.getvalue().count("slow") == after
    assert not any(t.name == "progress-tick" and t.is_alive() for t in threading.enumerate())


def test_demo_and_record_take_q():
    from strata_lab.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["demo", "-q"]).quiet and not parser.parse_args(["demo"]).quiet
    assert parser.parse_args(["record", "--out", "x.jsonl", "-q"]).quiet


def test_progress_bar_off_is_the_iterable():
    from strata_lab.progress import progress_bar

    items = [1, 2]
    assert progress_bar(items, enabled=False) is items
    bar = progress_bar(total=2, enabled=False)
    bar.update(2)
    bar.set_postfix_str("x")
    bar.close()
    assert bar.n == 2


# -- the replay table -------------------------------------------------------------------------------------
def test_replay_table_shows_every_engine_and_its_worst_calls(capsys, tmp_path):
    engines = ["--engine", "vllm", "--engine", "sglang", "--engine", "llama.cpp", "--engine", "anthropic"]
    csv, js = tmp_path / "r.csv", tmp_path / "r.json"
    out = _run(capsys, ["replay", AGENT, *engines, "--rows", "2", "--csv", str(csv), "-q"]).out
    specs = ["vllm@0.33", "sglang@0.5", "llama.cpp@b7000", "anthropic@2026-11"]
    for spec in specs:   # a summary row and a table of its two worst calls per engine
        assert f"{spec}: the 2 of 5 calls that re-read the most" in out
        assert any(line.split()[:1] == [spec] for line in out.splitlines())
    tables = [line for line in out.splitlines() if line.split()[:2] in (["vllm", "4"], ["vllm", "1"],
                                                                        ["vllm", "0"], ["vllm", "2"], ["vllm", "3"])]
    assert [t.split()[1] for t in tables] == ["4", "1"]   # the two that re-read the most, most first
    # --csv holds every (engine, call) row whatever the terminal shows
    import pandas as pd

    assert len(pd.read_csv(csv)) == 4 * 5
    _run(capsys, ["replay", AGENT, *engines, "--rows", "2", "--json", str(js), "-q"])
    assert len(json.loads(js.read_text())["calls"]) == 4 * 5
    # --all-rows: every row; an engine with no more calls than --rows shows them all, in call order
    every = _run(capsys, ["replay", AGENT, *engines, "--all-rows", "-q"]).out
    assert sum(line.split()[:1] in (["vllm"], ["sglang"], ["llama.cpp"], ["anthropic"]) and
               line.split()[1].isdigit() for line in every.splitlines()) == 4 * 5
    default = _run(capsys, ["replay", AGENT, "--engine", "vllm", "-q"]).out
    assert "vllm@0.33: every call (5)" in default
    assert _run(capsys, ["replay", AGENT, "--rows", "-1", "-q"], 2).err.count("--rows must be >= 0") == 1


def test_replay_table_of_a_long_trace_is_bounded(capsys, hashed):
    out = _run(capsys, ["replay", str(hashed), "--engine", "vllm", "--engine", "sglang", "-q"]).out
    rows = [line for line in out.splitlines() if line.split()[:1] in (["vllm"], ["sglang"])
            and len(line.split()) > 2 and line.split()[1].isdigit()]
    assert len(rows) == 2 * 10 and "the 10 of 40 calls that re-read the most" in out


# -- a policy that is another one here ------------------------------------------------------------------
def test_atc25_without_categories_is_noted_as_lru(capsys, tmp_path):
    import pandas as pd

    import strata_lab as sl
    from strata_lab.caches.capacity import plot_sweep

    csv = tmp_path / "s.csv"
    out = _run(capsys, ["sweep", str(FIX / "mooncake.jsonl"), "--capacity", "1e3", "--capacity", "1e4",
                        "--policy", "lru", "--policy", "atc25", "--csv", str(csv), "-q"]).out
    assert "note: atc25: the trace has no request categories; it is lru here" in out
    df = pd.read_csv(csv, keep_default_na=False)
    assert set(df[df["policy"] == "atc25"]["note"]) == {"atc25: the trace has no request categories; it is lru here"}
    assert set(df[df["policy"] == "lru"]["note"]) == {""}
    cols = ["capacity", "hit_rate", "reused", "evictions"]
    assert df[df["policy"] == "atc25"][cols].values.tolist() == df[df["policy"] == "lru"][cols].values.tolist()
    fig = plot_sweep(sl.sweep(FIX / "mooncake.jsonl", capacities=[10**3], policies=["lru", "atc25"]))
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["lru", "atc25 (the trace has no request categories; it is lru here)"]
    # Bailian's requests have types: atc25 is itself there
    bailian = sl.sweep(FIX / "bailian.jsonl", capacities=[10**3], policies=["atc25"])
    assert list(bailian["note"]) == [""]


# -- ids no tokenizer made ------------------------------------------------------------------------------
def _foreign_dump(path: Path, **extra) -> Path:
    """Two calls of one session whose ids run past qwen3's vocabulary."""
    prompts = [list(range(200_000, 200_040)), list(range(200_000, 200_020)) + list(range(300_000, 300_030))]
    path.write_text("".join(json.dumps({"schema": "strata-dump/1", "session": "s", "call": i, "prompt_ids": p,
                                        "gen_ids": [400_000 + i], **extra}) + "\n" for i, p in enumerate(prompts)))
    return path


def test_export_of_an_id_dump_needs_no_tokenizer(capsys, tmp_path):
    from strata_lab.traces.hashtrace import load_hash_trace

    dump, out = _foreign_dump(tmp_path / "d.jsonl"), tmp_path / "e.jsonl"
    _run(capsys, ["export", str(dump), "--format", "mooncake", "--block", "16", "--out", str(out), "-q"])
    assert len(load_hash_trace(out)) == 2
    # named, the tokenizer checks the ids as before
    err = _run(capsys, ["export", str(dump), "--format", "mooncake", "--out", str(out), "--tokenizer", "qwen3",
                        "-q"], 2).err
    assert "past the 151936 ids of --tokenizer qwen3" in err


def test_an_export_with_its_own_block_replays_as_the_original(capsys, tmp_path):
    """`export --block 16` writes the block on every line: `replay` reads it with that block (no override)
    and vLLM reuses what it reuses on the original dump."""
    out, a, b = tmp_path / "m.jsonl", tmp_path / "a.json", tmp_path / "b.json"
    _run(capsys, ["export", AGENT, "--format", "mooncake", "--block", "16", "--out", str(out), "-q"])
    _run(capsys, ["replay", str(out), "--engine", "vllm", "--json", str(a), "-q"])
    _run(capsys, ["replay", AGENT, "--engine", "vllm", "--json", str(b), "-q"])
    ra, rb = json.loads(a.read_text()), json.loads(b.read_text())
    assert [c["reused"] for c in ra["calls"]] == [c["reused"] for c in rb["calls"]]
    assert ra["engines"][0]["reused"] == rb["engines"][0]["reused"] > 0


def test_a_dump_of_a_hash_trace_replays(capsys, tmp_path, hashed):
    dump = tmp_path / "d.jsonl"
    _run(capsys, ["import", str(hashed), "--out", str(dump), "-q"])
    lines = [json.loads(x) for x in dump.read_text().splitlines()]
    assert all(r["synthetic_ids"] is True for r in lines) and max(max(r["prompt_ids"]) for r in lines) > 151_936
    out = _run(capsys, ["replay", str(dump), "-q"]).out
    assert "40 calls" in out
    assert _run(capsys, ["replay", str(dump), "--engine", "vllm", "-q"]).out.count("vllm@0.33") > 1
    # a divergence in placeholder ids is found without decoding them (they have no text)
    syn = _foreign_dump(tmp_path / "s.jsonl", synthetic_ids=True)
    out = _run(capsys, ["replay", str(syn), "-q"]).out
    assert "diverged" in out
    # lint reads text: it says why it cannot, in one line
    err = _run(capsys, ["lint", str(syn), "-q"], 2).err
    assert "placeholders (synthetic_ids)" in err and err.count("\n") == 1
    # a dump of ids past the vocabulary that does not say they are placeholders is still refused
    err = _run(capsys, ["replay", str(_foreign_dump(tmp_path / "f.jsonl")), "-q"], 2).err
    assert "past the 151936 ids of --tokenizer qwen3" in err


def test_a_bare_jinja_takes_bos_and_eos_from_the_tokenizer_folder(tmp_path):
    from strata_lab.text.tokenizer import load_tokenizer
    from strata_lab.traces.trace import resolve

    folder = tmp_path / "model"
    folder.mkdir()
    load_tokenizer("qwen3").save(folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|endoftext|>",
                                                              "eos_token": {"content": "<|im_end|>"}}))
    jinja = tmp_path / "t.jinja"
    jinja.write_text("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}{{ eos_token }}\n"
                     "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    _, tmpl = resolve(str(folder), str(jinja))
    text = tmpl.render([{"role": "user", "content": "hi"}])
    assert text.startswith("<|endoftext|><|im_start|>user\nhi<|im_end|>\n"), text
    _, tmpl = resolve("qwen3", str(jinja))   # no folder: nothing to take them from
    assert tmpl.render([{"role": "user", "content": "hi"}]).startswith("<|im_start|>user")
