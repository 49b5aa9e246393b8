"""The dump reader checks every line against docs/DUMP_FORMAT.md; bad lines are skipped with file:line."""
import json
import subprocess
import warnings

import pytest

from strata_lab.dump import DumpWarning, load_dump

GOOD = {"schema": "strata-dump/1", "session": "s", "call": 0, "prompt_ids": [1, 2, 3], "reused": 0,
        "gen_ids": [4], "drained_ids": [], "finish": "stop", "checkpoints": [3]}


@pytest.mark.parametrize("edit, message", [
    ({"prompt_ids": [1, -2, 3]}, r"prompt_ids\[1\] = -2"),
    ({"prompt_ids": [1, 2.5, 3]}, r"prompt_ids\[1\] must be an int"),
    ({"prompt_ids": [1, "x", 3]}, r"prompt_ids\[1\] must be an int"),
    ({"prompt_ids": [1, True, 3]}, r"prompt_ids\[1\] must be an int"),
    ({"prompt_ids": [1, 2, 200_000]}, r"prompt_ids\[2\] = 200000 is not an id in 0..151935"),
    ({"gen_ids": [4, None]}, r"gen_ids\[1\] must be an int"),
    ({"drained_ids": [-1]}, r"drained_ids\[0\] = -1"),
    ({"reused": 4}, r"reused must be an int in 0..3"),
    ({"reused": -1}, r"reused must be an int in 0..3"),
    ({"reused": 1.0}, r"reused must be an int"),
    ({"finish": "exploded"}, r"finish must be one of"),
    ({"call": -1}, r"call must be an int >= 0"),
    ({"checkpoints": [-3]}, r"checkpoints\[0\] = -3"),
])
def test_bad_fields_are_skipped_with_file_and_line(tmp_path, edit, message):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps({**GOOD, **edit}) + "\n" + json.dumps(GOOD) + "\n")
    with pytest.warns(DumpWarning, match=rf"{path}:2: skipped bad line: {message}"):
        records = load_dump(path, vocab_size=151936).records()
    assert len(records) == 2


def test_good_lines_pass_quietly(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps({"prompt_ids": [5, 6]}) + "\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(load_dump(path, vocab_size=151936).records()) == 2


def test_empty_dump_replay_says_so(tmp_path):
    from strata_lab._spawn import child_process_args

    for name, text in (("empty.jsonl", ""), ("bad.jsonl", "garbage\n")):
        path = tmp_path / name
        path.write_text(text)
        r = subprocess.run(**child_process_args(["replay", path, "-q"]), capture_output=True, text=True, timeout=300)
        assert r.returncode == 2, r.stdout + r.stderr
        assert "nan" not in r.stdout.lower()
        err = [line for line in r.stderr.splitlines() if "error" in line]
        assert len(err) == 1 and "no engine calls" in err[0] and str(path) in err[0]
