"""Feedback a new user gets: every subcommand and option explains itself in --help, long commands say what
they are doing, and the public functions' docstrings list their parameters (what help() shows)."""
import argparse
import inspect
import re

import pytest

import strata_lab
from strata_lab.cli import build_parser, main


def _subparsers():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices


def test_every_subcommand_has_a_description_and_every_option_help():
    missing = []
    choices = _subparsers()
    assert {"lint", "reproduce", "rewrite", "record", "replay", "serve"} <= set(choices)
    for name, p in choices.items():
        if not p.description or len(p.description) < 20:
            missing.append(f"{name}: no description")
        for a in p._actions:
            if isinstance(a, argparse._HelpAction):
                continue
            if not a.help or a.help == argparse.SUPPRESS:
                missing.append(f"{name} {'/'.join(a.option_strings) or a.dest}: no help")
    assert not missing, missing


def test_rewrite_help_points_to_policies_it_accepts():
    text = _subparsers()["rewrite"].format_help()
    assert "header" in text and "every:N" in text


def test_tokenize_says_what_it_is_loading(capsys, monkeypatch):
    import strata_lab.cli.commands as commands

    assert main(["tokenize", "hello"]) == 0
    assert capsys.readouterr().err == ""            # a pipe or a script: stderr holds errors only
    monkeypatch.setattr(commands, "_interactive", lambda: True)   # a person at a terminal
    assert main(["tokenize", "hello"]) == 0
    captured = capsys.readouterr()
    assert captured.err.startswith("strata-lab: loading the qwen3 tokenizer")
    assert "tokens" in captured.out


def test_reproduce_shows_progress(capsys, tmp_path):
    # the engine run, which takes seconds per call on a real model, draws a bar on stderr (tqdm)
    import os

    agent = os.path.join(os.path.dirname(__file__), "..", "dumps", "agent.jsonl")
    assert main(["reproduce", agent]) == 0
    captured = capsys.readouterr()
    assert "engine run (recorded)" in captured.err and "5/5" in captured.err
    assert "the engine matches the replay's prediction on 5/5 calls" in captured.out


def _documented(doc: str, name: str) -> bool:
    return re.search(rf"`{name}`|^\s*(?:[\w*]+, )*\**{name}(?:, [\w*]+)*:", doc, re.M) is not None


PUBLIC_FUNCTIONS = sorted(n for n in strata_lab._EXPORTS if inspect.isfunction(getattr(strata_lab, n)))


@pytest.mark.parametrize("name", PUBLIC_FUNCTIONS)
def test_public_function_docstrings_list_their_parameters(name):
    fn = getattr(strata_lab, name)
    doc = inspect.getdoc(fn) or ""
    missing = [p for p in inspect.signature(fn).parameters if not _documented(doc, p)]
    assert not missing, f"{name}: {missing} not in its docstring"


@pytest.mark.parametrize("qualname", ["strata_lab.sessions.runs.reproduce", "strata_lab.sessions.runs.rewrite",
                                      "strata_lab.caches.lint.lint_calls", "strata_lab.caches.lint.fix_calls",
                                      "strata_lab.caches.lint.check_fixes", "strata_lab.caches.sweeps.compare_policies",
                                      "strata_lab.testing.strategies.conversations"])
def test_module_function_docstrings_list_their_parameters(qualname):
    import importlib

    mod, name = qualname.rsplit(".", 1)
    fn = getattr(importlib.import_module(mod), name)
    fn = getattr(fn, "__wrapped__", fn)
    doc = inspect.getdoc(fn) or ""
    params = [p for p in inspect.signature(fn).parameters if p != "draw"]
    missing = [p for p in params if not _documented(doc, p)]
    assert not missing, f"{qualname}: {missing} not in its docstring"


def test_help_of_replay_lists_its_parameters():
    sig = inspect.signature(strata_lab.replay)
    assert {"dump", "engine", "tokenizer", "policy", "cost_model"} <= set(sig.parameters)


def test_defaults_that_give_other_numbers_are_explained_where_printed(capsys):
    # plain `replay` is `--engine strata`: the checkpoints each dump line recorded; a modelled policy says so
    import os

    agent = os.path.join(os.path.dirname(__file__), "..", "dumps", "agent.jsonl")
    assert main(["replay", agent, "-q"]) == 0
    out = capsys.readouterr().out
    assert "engines strata@1," in out.splitlines()[0] and "checkpoints: recorded (the snapshots each dump line" in out
    assert main(["replay", agent, "-q", "--checkpoints", "turn"]) == 0
    out = capsys.readouterr().out
    assert "strata@1:checkpoints=turn" in out.splitlines()[0] and "checkpoints: turn (modelled" in out
    assert main(["replay", agent, "-q", "--engine", "strata"]) == 0
    assert "checkpoints: recorded (the snapshots each dump line reports" in capsys.readouterr().out
