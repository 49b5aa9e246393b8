"""`python -m strata_lab.validate`: a bad argument is a one-line error (exit 2) before any engine starts, and a
missing engine a one-line error (exit 1), never a traceback."""
import pytest

from strata_lab.validate.__main__ import main


@pytest.mark.parametrize("argv, says", [
    (["vllm", "--workload", "bogus"], "--workload 'bogus'"),
    (["vllm", "--workload", "agent:x"], "is not key=value"),
    (["vllm", "--workload", "agent:foo=1"], "unexpected keyword argument 'foo'"),
    (["vllm", "--workload", "agent:sessions=abc"], "--workload 'agent:sessions=abc'"),
    (["vllm", "--workload", "agent:sessions=-1"], "holds no calls"),
    (["vllm", "--workload", "dump:/nonexistent/d.jsonl"], "not found"),
    (["vllm", "--workload", "dump:"], "needs a path"),
    (["vllm", "--workload", "fleet:bogus=1"], "bogus"),
    (["vllm-oracle", "--args", "--block-size abc"], "--args: vllm: args: --block-size expects an integer"),
    (["llama.cpp", "--args=--bogus"], "unknown or unsupported flag '--bogus'"),
    (["llama.cpp", "--model", "bogus"], "invalid choice: 'bogus'"),
    (["vllm", "--clients", "0"], "--clients must be in 1..256"),
    (["vllm-oracle", "--out", "/nonexistent/x.jsonl"], "--out: cannot write"),
])
def test_bad_arguments_are_one_line_errors(capsys, argv, says):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and says in err and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith("python -m strata_lab.validate: error:")


def test_a_missing_engine_is_a_one_line_error(capsys, monkeypatch):
    monkeypatch.setenv("STRATA_LLAMA_SERVER", "/nonexistent/llama-server")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert main(["llama.cpp", "--workload", "agent:sessions=1,turns=1"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("python -m strata_lab.validate: error:"), err
