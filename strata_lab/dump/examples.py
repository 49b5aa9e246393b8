"""Where the recorded sessions shipped with the project are, for notebooks and examples that may run from
anywhere (a copy of `notebooks/`, a scratch directory, an installed wheel). The repository keeps them in
`dumps/`; a wheel carries the same files as package data, `strata_lab/dumps/` (`wheel.packages` in
pyproject.toml).

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
    set, else the copy installed with the package (`strata_lab/dumps/`), else the `dumps/` of the checkout this
    `strata_lab` was imported from (a source or editable install). A clear error when none holds them."""
    package = Path(__file__).resolve().parents[1]
    chosen = os.environ.get(DUMPS_ENV)
    if chosen:      # chosen by the caller: no quiet fallback when it is wrong
        if (Path(chosen) / "agent.jsonl").is_file():
            return Path(chosen)
        raise FileNotFoundError(f"{DUMPS_ENV}={chosen} does not hold the example dumps (agent.jsonl, ...)")
    candidates = [package / "dumps", package.parent / "dumps"]
    for path in candidates:
        if (path / "agent.jsonl").is_file():
            return path
    raise FileNotFoundError(f"the example dumps (agent.jsonl, ...) are not in {' or '.join(map(str, candidates))}; "
                            f"set {DUMPS_ENV} to the folder holding them (the repository's dumps/)")
