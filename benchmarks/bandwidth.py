"""The decode bandwidth fraction of benchmarks/engine.py: a strata engine's decode tok/s against the limit a
read loop sets over the same bytes, with both sides measured alternately under the same load.

One round: (1) wait, at most ``quiet_wait`` seconds, for a 0.5 s window in which processes other than this
one used fewer than ``quiet_cores`` cores; (2) one read pass of ``_engine.read_bandwidth`` over ``nbytes``
(the weights and KV cache one decode step reads) with the engine's threads; (3) 8 decode steps of the
engine from the same held context. The cores other processes used during (2)+(3) tag the round (from
/proc/stat, less this process's own CPU time; None where /proc/stat is missing). The fraction is the median
decode tok/s over the median limit, over the quiet rounds and over all of them.

On a shared machine a process that takes a core costs each of a decode step's ~150 parallel loops a
scheduler wake-up, and the one long read pass almost nothing: the fraction of loaded rounds measures the
scheduler, that of quiet rounds the engine's use of memory bandwidth.
"""
from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass


@dataclass
class Round:
    read_gbs: float  # the read pass
    decode_tps: float  # the 8 decode steps
    others: float | None  # cores other processes used during the round


def _busy_seconds() -> float | None:
    """CPU seconds all processes have used (user, nice, system, irq, softirq, steal), or None."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    t = os.times()
    return t.user + t.system


class LoadMeter:
    """Cores used by other processes since start()."""

    def start(self):
        self.b0, self.s0, self.w0 = _busy_seconds(), _own_seconds(), time.perf_counter()

    def others(self) -> float | None:
        b = _busy_seconds()
        if b is None or self.b0 is None:
            return None
        wall = time.perf_counter() - self.w0
        return max(0.0, (b - self.b0 - (_own_seconds() - self.s0)) / wall) if wall > 0 else None


def wait_quiet(quiet_cores: float, max_wait: float, window: float = 0.5) -> None:
    """Return after the first ``window`` in which other processes used < quiet_cores cores, or after max_wait s."""
    meter = LoadMeter()
    deadline = time.perf_counter() + max_wait
    while time.perf_counter() < deadline:
        meter.start()
        time.sleep(window)
        o = meter.others()
        if o is None or o < quiet_cores:
            return


def interleaved(ext, eng, prompt, nbytes: int, threads: int, rounds: int, quiet_cores: float = 0.25,
                quiet_wait: float = 20.0, steps: int = 8, log=None) -> list[Round]:
    """``rounds`` alternations of one read pass and ``steps`` decode steps from the held ``prompt``;
    ``log(str)`` gets one line per round."""
    s = eng.session("bandwidth")
    s.reset()
    s.generate(prompt, max_new_tokens=0)
    held = s.held_ids[:len(prompt)]
    out = []
    meter = LoadMeter()
    for _ in range(rounds):
        wait_quiet(quiet_cores, quiet_wait)
        meter.start()
        gbs = ext.read_bandwidth(int(nbytes), threads, 1)
        r = s.generate(held, max_new_tokens=steps).result  # held: only the decode steps run
        assert r.tokens_read <= 1 and len(r.gen_ids) == steps, (r.tokens_read, len(r.gen_ids))
        out.append(Round(gbs, steps / (r.decode_ms / 1e3), meter.others()))
        if log:
            o = out[-1]
            log(f"    round {len(out)}: read {o.read_gbs:.1f} GB/s, decode {o.decode_tps:.2f} tok/s = "
                f"{o.decode_tps * nbytes / 1e9 / o.read_gbs:.2f}, others "
                + ("?" if o.others is None else f"{o.others:.2f} cores"))
    s.reset()
    return out


def fraction(rs: list[Round], nbytes: int) -> tuple[float, float, float]:
    """(median GB/s, limit tok/s at that rate, median decode tok/s / limit) of the rounds ``rs``."""
    gbs = statistics.median(r.read_gbs for r in rs)
    limit = gbs * 1e9 / nbytes
    return gbs, limit, statistics.median(r.decode_tps for r in rs) / limit


def describe(rs: list[Round], nbytes: int, threads: int, quiet_cores: float) -> str:
    """One result line: the quiet rounds' fraction (bold), then all rounds' with the others' median load."""
    quiet = [r for r in rs if r.others is not None and r.others < quiet_cores]
    loads = [r.others for r in rs if r.others is not None]
    head = (f"decode streams {nbytes / 1e9:.3f} GB/token (weights + KV cache as the engine holds it); "
            f"{len(rs)} rounds of one read pass ({threads} threads, that many bytes) then 8 decode steps")
    parts = []
    if quiet:
        gbs, limit, frac = fraction(quiet, nbytes)
        tps = statistics.median(r.decode_tps for r in quiet)
        parts.append(f"{len(quiet)} quiet (others < {quiet_cores:g} cores): medians {gbs:.1f} GB/s = limit "
                     f"{limit:.1f} tok/s, decode {tps:.2f} tok/s = **{frac:.2f} of the bandwidth limit**")
    else:
        parts.append(f"no quiet round (others < {quiet_cores:g} cores)")
    gbs, limit, frac = fraction(rs, nbytes)
    tps = statistics.median(r.decode_tps for r in rs)
    load = f", others {statistics.median(loads):.2f} cores median" if loads else ""
    parts.append(f"all {len(rs)}{load}: {gbs:.1f} GB/s = {limit:.1f} tok/s, decode {tps:.2f} tok/s = "
                 f"{frac:.2f}")
    return head + "; " + "; ".join(parts)
