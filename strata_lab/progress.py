"""Progress bars for work that can take more than a few seconds: one helper, so every command draws the same
bar (tqdm, on stderr: stdout stays the command's output) and `-q` / `progress=False` silences all of them.

>>> list(progress_bar([1, 2, 3], enabled=False))          # off: the iterable itself, untouched
[1, 2, 3]
>>> with progress_bar(total=3, enabled=False) as bar:    # off, with no iterable: a bar that draws nothing
...     bar.update(3)
"""
from __future__ import annotations

import sys

__all__ = ["progress_bar"]


class _Off:
    """A bar that draws nothing (the calls a caller makes on a tqdm bar, as no-ops)."""

    n = 0

    def __init__(self, iterable=None):
        self.iterable = iterable

    def __iter__(self):
        return iter(self.iterable if self.iterable is not None else ())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def update(self, n=1):
        self.n += n

    def set_postfix_str(self, *a, **kw):
        pass

    def set_description(self, *a, **kw):
        pass

    def close(self):
        pass


def _tick(bar, seconds: float) -> None:
    """Redraw `bar` (its elapsed time) every `seconds` until it is closed (tqdm's close disables it)."""
    import threading
    import weakref

    ref = weakref.ref(bar)   # a bar dropped unclosed (an exception in its loop) stops the thread too

    def loop():
        while not stopped.wait(seconds):
            b = ref()
            if b is None or b.disable:
                return
            b.refresh()
            del b

    stopped = threading.Event()
    threading.Thread(target=loop, daemon=True, name="progress-tick").start()
    close = bar.close

    def closed():
        stopped.set()
        close()

    bar.close = closed


def progress_bar(iterable=None, *, enabled: bool = True, total: int | None = None, desc: str | None = None,
                 unit: str = "it", tick: float | None = None, **kw):
    """A tqdm bar on stderr over `iterable` (or one to `update` by hand when it is None) when `enabled`, else
    the iterable itself (or a bar that draws nothing). `total`, `desc`, `unit` and any other keyword go to
    tqdm (`leave=False` for a bar that should vanish when done). `tick`: redraw the bar every `tick` seconds
    until it closes, for steps that can each take longer than that (a server starting, one slow request):
    its elapsed time moves, so the command is never silent."""
    if not enabled:
        return iterable if iterable is not None else _Off()
    from tqdm.auto import tqdm

    kw.setdefault("file", sys.stderr)
    kw.setdefault("dynamic_ncols", True)
    bar = tqdm(iterable, total=total, desc=desc, unit=unit, **kw)
    if tick:
        _tick(bar, tick)
    return bar
