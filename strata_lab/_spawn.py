"""Start `python -m strata_lab ...` in a child process that imports this very strata_lab.

`python -m` puts the working directory first on the child's path, so a child started from a source
checkout would import the checkout's sources (which have no compiled engine after a plain `pip install .`)
instead of the installed package. The child runs from the directory that holds the package imported
here, with that directory first on PYTHONPATH, so parent and child always run the same code.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["child_process_args"]


def child_process_args(args, env=None) -> dict:
    """kwargs for subprocess.Popen/run: `python -m strata_lab *args` on this strata_lab.

    Relative paths in `args` must be made absolute by the caller (the child's cwd differs)."""
    root = Path(__file__).resolve().parent.parent
    base = dict(os.environ if env is None else env)
    base["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), base.get("PYTHONPATH", "")) if p)
    return {"args": [sys.executable, "-m", "strata_lab", *map(str, args)], "env": base, "cwd": str(root)}
