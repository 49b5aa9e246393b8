"""benchmarks/bandwidth.py: the decode bandwidth fraction's arithmetic and its load tag. Nothing is timed
against a target: the rounds here are made up or run for their shape only."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import bandwidth as bw  # noqa: E402

GB = 10 ** 9


def test_fraction_is_median_decode_over_median_limit():
    rs = [bw.Round(30.0, 20.0, 0.0), bw.Round(60.0, 40.0, 0.1), bw.Round(40.0, 25.0, 0.05)]
    gbs, limit, frac = bw.fraction(rs, 2 * GB)
    assert gbs == 40.0 and limit == 20.0
    assert frac == pytest.approx(25.0 / 20.0)


def test_describe_quotes_quiet_rounds_and_all_rounds():
    # two quiet rounds at 0.9 of their limit, two loaded rounds far below: the bold number is the quiet one
    rs = [bw.Round(30.0, 13.5, 0.1), bw.Round(30.0, 13.5, 0.2), bw.Round(30.0, 3.0, 1.2), bw.Round(30.0, 3.0, 1.4)]
    line = bw.describe(rs, 2 * GB, 2, 0.25)
    assert "2 quiet (others < 0.25 cores)" in line
    assert "**0.90 of the bandwidth limit**" in line
    assert "all 4, others 0.70 cores median" in line and "= 0.55" in line  # median decode 8.25 of 15 tok/s


def test_describe_says_when_no_round_was_quiet():
    rs = [bw.Round(30.0, 3.0, 1.0), bw.Round(30.0, 3.0, None)]
    line = bw.describe(rs, 2 * GB, 2, 0.25)
    assert "no quiet round" in line and "**" not in line


def test_load_meter_counts_only_other_processes():
    if bw._busy_seconds() is None:
        pytest.skip("no /proc/stat")
    m = bw.LoadMeter()
    m.start()
    x = 0
    for i in range(3_000_000):  # this process busy: its own CPU time is not counted as others'
        x += i
    o = m.others()
    assert o is not None and 0.0 <= o <= 64


def test_interleaved_rounds_on_a_tiny_engine(tmp_path):
    pytest.importorskip("strata_lab._engine")
    from strata_lab.engine import Engine, _ext
    from strata_lab.tiny import make_tiny

    eng = Engine.load(make_tiny(tmp_path / "ck", dtype="bfloat16", seed=3), threads=1)
    prompt = list(range(5, 25))
    lines = []
    rs = bw.interleaved(_ext(), eng, prompt, 1 << 20, 1, 2, quiet_wait=0.0, log=lines.append)
    assert len(rs) == 2 and len(lines) == 2
    assert all(r.read_gbs > 0 and r.decode_tps > 0 for r in rs)
    s = eng.session("bandwidth")
    assert s.held_ids == []  # the measuring session is left empty
