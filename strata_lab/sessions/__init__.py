"""Scripted agent sessions: record them through a real server, reproduce a dump on a fresh engine, rewrite
it under a replay policy, and the demo that compares reply-id reuse off and on."""
from __future__ import annotations

from strata_lab.sessions.runs import Recorded, Reproduction, model_kind, record, reproduce, rewrite, serve

__all__ = ["record", "reproduce", "rewrite", "serve", "model_kind", "Recorded", "Reproduction"]
