"""Bad command-line input: one clear line on stderr and exit status 2, never a traceback."""
import subprocess

import pytest

from strata_lab._spawn import child_process_args


def _cli(args, stdin=b""):
    spawn = child_process_args(args)
    spawn["args"] = [a.encode("utf-8", "surrogateescape") if isinstance(a, str) else a for a in spawn["args"]]
    return subprocess.run(**spawn, input=stdin, capture_output=True, timeout=300)


@pytest.fixture()
def files(tmp_path):
    (tmp_path / "five.json").write_text("5")
    (tmp_path / "binary.json").write_bytes(bytes(range(256)) * 8)
    return tmp_path


@pytest.mark.parametrize("case", ["argv_utf8", "stdin_utf8", "binary_tokenizer", "template_int", "template_dir",
                                  "demo_model", "serve_dump_dir", "serve_dump_empty"])
def test_cli_errors_are_one_line_and_exit_2(files, case):
    args, stdin, expect = {
        "argv_utf8": (["tokenize", "caf\udce9"], b"", "not valid UTF-8"),
        "stdin_utf8": (["tokenize"], b"caf\xe9 \xff", "standard input is not valid UTF-8"),
        "binary_tokenizer": (["tokenize", "hi", "--tokenizer", str(files / "binary.json")], b"", "--tokenizer"),
        "template_int": (["template", str(files / "five.json")], b"", "list of messages"),
        "template_dir": (["template", str(files)], b"", "directory"),
        "demo_model": (["demo", "--model", "bogus", "--png", str(files / "x.png")], b"", "--model"),
        "serve_dump_dir": (["serve", "--port", "0", "--dump", str(files)], b"", "directory"),
        "serve_dump_empty": (["serve", "--port", "0", "--dump", ""], b"", "dump"),
    }[case]
    r = _cli(args, stdin)
    err = r.stderr.decode("utf-8", "replace").strip().splitlines()
    assert r.returncode == 2, r.stderr.decode(errors="replace")[-1500:]
    assert len(err) == 1 and ": error: " in err[0] and expect in err[0], err
