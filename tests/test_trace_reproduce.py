"""An imported trace runs through our engine like a recorded session: prompts rendered with the Qwen3 template
and vocabulary, replies forced from the log, on both model kinds under each checkpoint policy; the engine's
reused count equals the replay's prediction on every call."""
import warnings
from pathlib import Path

import pytest

from strata_lab import load_trace, replay
from strata_lab.sessions import reproduce
from strata_lab.traces import TraceWarning

pytest.importorskip("strata_lab._engine")
FIX = Path(__file__).parent / "fixtures" / "traces"

# engine CheckpointPolicy fields written into the dump  <->  the replay's spec for the same policy
POLICIES = [({}, "turn"), ({"every": 16}, "every:16"), ({"before_last": 151644}, "header"),
            ({"at_prompt_end": False}, "none")]


@pytest.mark.parametrize("name", ["claude-code-session.jsonl", "codex-rollout.jsonl", "openai.jsonl",
                                  "capture.har", "vllm.log"])
@pytest.mark.parametrize("kind", ["attention", "hybrid"])
def test_engine_reuse_equals_replay_prediction(name, kind, tmp_path, qwen3):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        trace = load_trace(FIX / name)
        total = 0
        for fields, spec in POLICIES:
            dump = trace.to_dump(qwen3, out=tmp_path / f"{spec}.jsonl", checkpoint_policy=fields)
            engine = reproduce(dump, model=kind, out=tmp_path / f"{spec}-engine.jsonl")
            predicted = replay(dump, engine=f"strata:kind={kind}", checkpoints=spec, tokenizer=qwen3)
            assert [r["reused"] for r in engine.rows] == [r["reused"] for r in predicted.rows], (name, kind, spec)
            assert len(engine.rows) == len(trace.calls())
            total += sum(r["reused"] for r in engine.rows)
            # and the engine's own run, replayed with the checkpoints it reports, has no mismatch
            assert replay(engine.path, engine=f"strata:kind={kind}", tokenizer=qwen3)["calls_differ"] == 0
    # the sessions reuse something after their first call (the check is not vacuous)
    assert total > 0
