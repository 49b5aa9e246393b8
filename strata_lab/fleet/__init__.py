"""Realistic fleet traces for benchmarks and tests: many concurrent agent sessions over several replicas,
rendered with the real chat template and tokenizer (`generate_fleet`, `FleetConfig`)."""
from __future__ import annotations

from strata_lab.fleet.generator import FleetConfig, generate_fleet, write_fleet

__all__ = ["FleetConfig", "generate_fleet", "write_fleet"]
