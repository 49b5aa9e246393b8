"""Deprecated: renamed `strata_lab.traces.log_calls` (one model call as a log reader yields it); this alias goes
in the next release."""
from __future__ import annotations

import warnings

from strata_lab.traces.log_calls import *  # noqa: F401,F403
from strata_lab.traces.log_calls import __all__  # noqa: F401

warnings.warn("strata_lab.traces.calls is renamed strata_lab.traces.log_calls", DeprecationWarning, stacklevel=2)
