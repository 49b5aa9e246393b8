"""Deprecated: renamed `strata_lab.caches.call_ids` (calls as token-id arrays for the cache models); this alias
goes in the next release."""
from __future__ import annotations

import warnings

from strata_lab.caches.call_ids import *  # noqa: F401,F403
from strata_lab.caches.call_ids import __all__  # noqa: F401

warnings.warn("strata_lab.caches.calls is renamed strata_lab.caches.call_ids", DeprecationWarning, stacklevel=2)
