"""Typed face of the compiled extension strata_lab._engine."""
from typing import Any

__version__: str

def build_info() -> dict[str, Any]: ...
def self_test() -> bool: ...
