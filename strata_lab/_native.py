"""The one importer of strata_lab's compiled extensions: every other module gets them from here.

- `engine()`: ``strata_lab._engine``, the inference engine, linked with OpenMP (libgomp). libgomp reads its
  settings once, when it is loaded, so they are set here, just before the engine's first import.
- `replay()`: ``strata_lab._replay``, the store replay's core (engine/src/replay_core.cpp), linked without
  OpenMP: a store replay loads no OpenMP runtime, so replaying before `Engine.load` leaves the engine's
  threads as they would be otherwise.

Import order therefore never changes the engine's threads: the only way to load libgomp from strata_lab is
`engine()`, which sets the environment first (tests/test_native_import.py checks that no other module
imports an extension, and that a store replay before `Engine.load` neither warns nor changes the settings).
"""
from __future__ import annotations

import os

__all__ = ["engine", "replay", "replay_available", "libgomp_mapped"]

_OMP_CHECKED = False

# What to do when Python finds a source checkout's strata_lab (no compiled extension) before an installed one.
_NO_EXTENSION = (
    "strata_lab's compiled {what} (strata_lab.{name}) is not in {where}: this is a source checkout without a "
    "build ({exc}). Either install the package (`pip install .`) and run from another directory, so that "
    "Python imports the installed copy rather than this folder, or build the extensions in place "
    "(`./scripts/dev_build.sh`) and run with PYTHONPATH=$PWD. See docs/guide/develop.md.")


def libgomp_mapped() -> bool:
    """Whether a libgomp is already loaded in this process (Linux; False where /proc is absent)."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return b"libgomp" in f.read()
    except OSError:
        return False


def _set_openmp_environment() -> None:
    # A short spin, then sleep, at OpenMP barriers: a decode step has ~150 parallel regions a few hundred
    # microseconds apart. Spinning without bound (libgomp's default, ~3 ms) starves the working threads on
    # shared or oversubscribed cores (measured: 2.8 vs 21 tok/s decode); sleeping at once costs a futex
    # wake-up per region (bf16 decode x1.08-1.29 slower than spinning 20,000 rounds, ~0.2 ms, on the quiet
    # 2-core VM; benchmarks/results/engine.md). libgomp reads these once when it loads; a value the user set
    # for either variable wins (GOMP_SPINCOUNT=0: sleep at once, for heavily shared machines).
    global _OMP_CHECKED
    if _OMP_CHECKED:
        return
    _OMP_CHECKED = True
    if "OMP_WAIT_POLICY" not in os.environ and libgomp_mapped():
        # PyTorch ships libgomp.so.1 under the same soname: loaded first, it is ours too, already set up
        # with spinning waits. Too late to change; say what to do.
        import warnings

        warnings.warn("an OpenMP runtime (libgomp, e.g. PyTorch's) was loaded before strata_lab's engine, "
                      "with OMP_WAIT_POLICY unset: its threads spin at the engine's barriers, which can make "
                      "it many times slower on few cores. Set OMP_WAIT_POLICY=passive in the environment "
                      "before Python starts, or import strata_lab.engine before torch.", RuntimeWarning,
                      stacklevel=5)
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = "20000"
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")


def _missing(what: str, name: str, exc: ImportError) -> ImportError:
    where = os.path.dirname(os.path.abspath(__file__))
    return ImportError(_NO_EXTENSION.format(what=what, name=name, where=where, exc=exc))


def engine():
    """The inference engine extension, ``strata_lab._engine``, loaded after its OpenMP settings are set."""
    _set_openmp_environment()
    try:
        from strata_lab import _engine
    except ImportError as exc:
        raise _missing("engine", "_engine", exc) from exc
    return _engine


def replay():
    """The store replay core extension, ``strata_lab._replay`` (no OpenMP)."""
    try:
        from strata_lab import _replay
    except ImportError as exc:
        raise _missing("replay core", "_replay", exc) from exc
    return _replay


def replay_available() -> bool:
    """Whether the replay core is built (a source checkout without a build has not)."""
    try:
        replay()
    except ImportError:
        return False
    return True
