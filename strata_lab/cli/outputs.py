"""Every file a `strata-lab` command writes, checked against what it reads before any work.

`OUTPUTS` names, per command, the options that write a file (or a store directory) and the arguments it
reads; `check_outputs(args)` (called by `main` once the arguments are parsed) refuses an output that resolves
to an input (`strata_lab.dump.files.check_output`: same file, a link to it, inside an input directory) or is
not a regular file, with one line naming the option. The handlers write each output through
`strata_lab.dump.files.replaced_output` (a temporary beside it, renamed at the end), so a failed run leaves
the previous file or none.
"""
from __future__ import annotations

import argparse
import contextlib
import glob
import os
from typing import Iterator

from strata_lab.dump.files import check_output, replaced_output, same_file

__all__ = ["OUTPUTS", "check_outputs", "input_paths", "output"]

# command -> (input argument dests, ((output dest, option, is a directory or may be one), ...))
OUTPUTS: dict[str, tuple[tuple[str, ...], tuple[tuple[str, str, bool], ...]]] = {
    "import": (("log",), (("out", "--out", False),)),
    "replay": (("dump",), (("json", "--json", False), ("csv", "--csv", False), ("png", "--png", False))),
    "convert": (("dump", "tokenizer"), (("out", "--out", True),)),
    "lint": (("dump", "tokenizer"), (("fix", "--fix", False),)),
    "sweep": (("trace",), (("csv", "--csv", False), ("png", "--png", False))),
    "export": (("dump", "tokenizer", "template"), (("out", "--out", False),)),
    "reproduce": (("dump", "tokenizer", "model"), (("out", "--out", False),)),
    "rewrite": (("dump", "tokenizer", "model"), (("out", "--out", False),)),
    "record": (("model",), (("out", "--out", False),)),
    "demo": (("model",), (("png", "--png", False), ("out_dir", "--out-dir", True))),
    "serve": (("model", "api_key_file", "template"), (("dump", "--dump", True),)),
    "proxy": ((), (("dump", "--dump", True),)),
}


def input_paths(args: argparse.Namespace, dests) -> list[str]:
    """The paths the command reads: its input arguments, globs expanded (`import` takes `logs/*.jsonl`)."""
    out: list[str] = []
    for dest in dests:
        value = getattr(args, dest, None)
        for v in ([value] if isinstance(value, str) else value or ()):
            if not isinstance(v, str) or v in ("", "-"):
                continue
            out.extend(glob.glob(v) if glob.has_magic(v) and not os.path.lexists(v) else [v])
    return out


def check_outputs(args: argparse.Namespace) -> None:
    """Refuse, before any work, an output of the command that is one of its inputs or not a regular file."""
    spec = OUTPUTS.get(getattr(args, "command", None) or "")
    if spec is None:
        return
    inputs = input_paths(args, spec[0])
    outputs = []
    for dest, option, directory in spec[1]:
        value = getattr(args, dest, None)
        if value is None or value == "-" and dest == "json":   # --json alone: the report goes to stdout
            continue
        check_output(value, inputs, option, directory=directory)
        for other, other_option in outputs:
            if same_file(value, other):
                raise ValueError(f"{option} {value} is also the {other_option} output; name another file")
        outputs.append((value, option))


@contextlib.contextmanager
def output(path: str | None, *, directory: bool = False) -> Iterator[str | None]:
    """`replaced_output` for an optional output: None (no such output) and "-" (stdout) pass through."""
    if path is None or path == "-":
        yield path
        return
    with replaced_output(path, directory=directory) as tmp:
        yield tmp
