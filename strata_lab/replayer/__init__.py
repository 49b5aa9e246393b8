"""The replay stage: step recorded sessions through the session state model, explain every miss, try fixes.

Modules: `state` (which ids a session reuses, where it keeps snapshots), `divergence` (where and why a
prompt leaves what the session held), `explain` (the one explainer every engine's replay uses: the divergence
once per call, then each engine's shortfall; the cause vocabulary is `strata_lab.rules.CAUSES`), `costs` (a prefill cost model),
`policies` (counterfactual prompts), `step` (one call -> one typed row), `report` (totals, frames, text),
`core` (`replay`: our engine's state model over dumps and stores, natively and on Dask; the public
`strata_lab.replay` is the one driver in `strata_lab.caches.replay`, where this model is the engine `strata`,
and `ReplayReport.from_state_report` turns this replay's rows into that report).
The replay never imports the HTTP server: the text rules it shares with it live in `strata_lab.text.stream`.
"""
from __future__ import annotations

from strata_lab.replayer.core import ReplayOptions, compare_policies, fit_cost, replay, resolve_options
from strata_lab.replayer.costs import CostModel
from strata_lab.replayer.divergence import Divergence, classify, find_divergence
from strata_lab.replayer.policies import Policy, PromptRewriter, keep_drained_prompt, parse_policy, policy_changes_prompts
from strata_lab.replayer.report import Report
from strata_lab.replayer.state import SessionState, predict_reuse
from strata_lab.replayer.step import CallRow, step

__all__ = ["replay", "compare_policies", "fit_cost", "ReplayOptions", "resolve_options", "CostModel",
           "Divergence", "classify", "find_divergence", "Policy", "PromptRewriter", "keep_drained_prompt",
           "parse_policy", "policy_changes_prompts", "Report", "SessionState",
           "predict_reuse", "CallRow", "step"]
