"""The replay stage: the session state model, the explanation of every miss, counterfactual policies.

Modules: `state` (which ids a session reuses, where it keeps snapshots), `divergence` (where and why a
prompt leaves what the session held), `explain` (the one explainer every engine's replay uses: the divergence
once per call, then each engine's shortfall; the cause vocabulary is `strata_lab.rules.CAUSES`), `costs` (a prefill cost model),
`policies` (counterfactual prompts), `core` (the validated replay settings), `native` (the C++ replay core
over a store of our engine's lines, in-process or on Dask through `distributed`; `step` holds the per-call
rules it defers to Python), `pages` (a store's replay a page at a time, for the divergence viewer). The
replay, on every path, is `strata_lab.replay` (`strata_lab.caches.replay`, where this model is the engine
`strata`); its one report is `ReplayReport`.
The replay never imports the HTTP server: the text rules it shares with it live in `strata_lab.text.stream`.
"""
from __future__ import annotations

from strata_lab.replayer.core import ReplayOptions, resolve_options
from strata_lab.replayer.costs import CostModel
from strata_lab.replayer.divergence import Divergence, classify, find_divergence
from strata_lab.replayer.policies import Policy, PromptRewriter, keep_drained_prompt, parse_policy, policy_changes_prompts
from strata_lab.replayer.state import SessionState, predict_reuse

__all__ = ["ReplayOptions", "resolve_options", "CostModel",
           "Divergence", "classify", "find_divergence", "Policy", "PromptRewriter", "keep_drained_prompt",
           "parse_policy", "policy_changes_prompts", "SessionState",
           "predict_reuse"]
