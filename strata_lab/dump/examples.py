"""Where the recorded sessions shipped with the project (`dumps/` of the repository) are, for notebooks and
examples that may run from anywhere (a copy of `notebooks/`, a scratch directory).

>>> (example_dumps() / "agent.jsonl").is_file()
True
"""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["example_dumps", "DUMPS_ENV"]

DUMPS_ENV = "STRATA_DUMPS"


def example_dumps() -> Path:
    """The folder holding `agent.jsonl`, `thinking.jsonl`, `webui.jsonl` and `logs/`: `$STRATA_DUMPS` when
    set, else `dumps/` beside the current directory or its parent (a notebook in `notebooks/`), else the
    `dumps/` of the checkout this `strata_lab` was imported from. A clear error when none holds them."""
    here = Path(__file__).resolve().parents[2] / "dumps"
    candidates = ([Path(os.environ[DUMPS_ENV])] if os.environ.get(DUMPS_ENV) else []) + \
        [Path.cwd() / "dumps", Path.cwd().parent / "dumps", here]
    for path in candidates:
        if (path / "agent.jsonl").is_file():
            return path
    raise FileNotFoundError(f"the example dumps (agent.jsonl, ...) are in the repository's dumps/ folder, which "
                            f"is not in {', '.join(str(p) for p in candidates)}; set {DUMPS_ENV} to that folder")
