"""A prefill cost model: t(read, start) = a * read + b * sum of the positions read.

Reading `read` tokens after `start` held ones costs a per-token term (weights, MLP) and a per-token x
context term (attention over everything before each token): the positions read are start..start+read-1,
whose sum is read * start + read * (read - 1) / 2. The two coefficients are fitted by least squares to
the dump's own `prefill_ms` (or to engine measurements), floored at 0.

>>> true = CostModel(per_token_ms=0.1, per_token_ctx_ms=2e-5)
>>> m = CostModel.fit([(r, s, true.ms(r, s)) for r, s in [(100, 0), (100, 1000), (300, 50)]])
>>> round(m.per_token_ms, 6), round(m.per_token_ctx_ms, 9)
(0.1, 2e-05)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

__all__ = ["CostModel", "MIN_R2", "usable_fit"]

# Below this coefficient of determination a fit explains too little of the dump's own prefill times to
# put seconds on anything (R^2 < 0 is worse than predicting the mean time for every call).
MIN_R2 = 0.5


def _ctx(read, start):
    return read * start + read * (read - 1) / 2.0


@dataclass(frozen=True)
class CostModel:
    """Milliseconds to prefill `read` tokens after `start` held ones."""

    per_token_ms: float
    per_token_ctx_ms: float = 0.0
    points: int = 0            # how many calls the fit used
    r2: float | None = None    # coefficient of determination of the fit (None when not fitted)

    def __post_init__(self):
        for name in ("per_token_ms", "per_token_ctx_ms"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or v < 0 or v != v:
                raise ValueError(f"{name} must be a non-negative number, got {v!r}")

    def ms(self, read, start=0):
        """Predicted prefill time in ms (works on scalars and numpy arrays)."""
        return self.per_token_ms * read + self.per_token_ctx_ms * _ctx(read, start)

    def seconds(self, read, start=0):
        return self.ms(read, start) / 1000.0

    @classmethod
    def fit(cls, samples: Iterable[tuple[int, int, float]]) -> "CostModel":
        """Least squares on (read, start, prefill_ms) samples; calls that read nothing are ignored.

        Raises ValueError when no sample read any token with a positive time.
        """
        import numpy as np

        # unknowns dropped here; which calls count (read > 0, prefill_ms > 0) is decided in fit_arrays
        rows = [(r, s, t) for r, s, t in samples if r is not None and t is not None]
        arr = np.asarray(rows, dtype=np.float64).reshape(-1, 3)
        return cls.fit_arrays(arr[:, 0], arr[:, 1], arr[:, 2])

    @classmethod
    def fit_arrays(cls, read, start, t) -> "CostModel":
        """`fit` on three equal-length arrays (read, start, prefill_ms): no Python object per call.

        >>> import numpy as np
        >>> round(CostModel.fit_arrays(np.array([100, 0, 200]), np.array([0, 5, 0]), np.array([10.0, 3.0, 20.0])).per_token_ms, 12)
        0.1
        """
        import numpy as np

        read, start, t = (np.asarray(x, dtype=np.float64) for x in (read, start, t))
        keep = (read > 0) & (t > 0)
        read, start, t = read[keep], start[keep], t[keep]
        if not len(read):
            raise ValueError("samples: no call read tokens with a positive prefill_ms to fit")
        X = np.stack([read, _ctx(read, start)], axis=1)
        # scale columns so lstsq is well conditioned (the context column is ~1e6 x larger)
        scale = np.maximum(np.abs(X).max(axis=0), 1e-30)
        coef, *_ = np.linalg.lstsq(X / scale, t, rcond=None)
        coef = coef / scale
        if coef[1] < 0 or coef[0] < 0:  # negative slopes are noise: refit the other term alone
            j = 0 if coef[1] < 0 else 1
            c = float(max(np.dot(X[:, j], t) / max(np.dot(X[:, j], X[:, j]), 1e-30), 0.0))
            coef = np.array([c, 0.0]) if j == 0 else np.array([0.0, c])
        pred = X @ coef
        ss_tot = float(((t - t.mean()) ** 2).sum())
        r2 = 1.0 - float(((t - pred) ** 2).sum()) / ss_tot if ss_tot > 0 else None
        return cls(float(coef[0]), float(coef[1]), points=len(read), r2=r2)

    @property
    def usable(self) -> bool:
        """Whether the model may price seconds: set by hand, or fitted with R^2 >= MIN_R2 (or on times it
        explains exactly)."""
        return self.r2 is None or self.r2 >= MIN_R2

    def describe(self) -> str:
        fit = f", fitted on {self.points} calls" + (f", R^2 {self.r2:.3f}" if self.r2 is not None else "") \
            if self.points else ""
        return (f"prefill ~ {self.per_token_ms * 1000:.3g} us/token + "
                f"{self.per_token_ctx_ms * 1e6:.3g} ns/(token x context){fit}")


def usable_fit(model: "CostModel | None") -> "tuple[CostModel | None, CostModel | None]":
    """(the model to price seconds with, the fit rejected as too poor): (model, None) when usable, else
    (None, model), so that reports price in tokens only and say why.

    >>> usable_fit(CostModel(0.1, r2=-2.3))[0] is None, usable_fit(CostModel(0.1, r2=0.9))[1] is None
    (True, True)
    """
    if model is None or model.usable:
        return model, None
    return None, model
