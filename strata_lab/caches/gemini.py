"""Gemini implicit caching (ai.google.dev/gemini-api/docs/caching): the hosted prefix cache of `caches.openai`
with the numbers Google gives, and the ones it does not.

- Automatic on Gemini 2.5 and newer, for prompts of at least `min_tokens`: 2,048 on Gemini 2.5 Flash and Pro,
  4,096 on the 3.x models (`gemini:min_tokens=4096`), as the caching page lists them (2026-10; it said 1,024 for
  2.5 Flash and 4,096 for 2.5 Pro when implicit caching started in May 2025).
- The cached part of a prompt is reported as ``usageMetadata.cachedContentTokenCount``; Google documents no step
  for it (reported hits are not multiples of any block size), so hits are counted in tokens (`granularity` 1).
- How long an entry lives is not documented ("send requests with a similar prefix in a short amount of time"):
  `ttl_s` is 300 s, idle.
- Google gives no guarantee of a hit. This model is the documented rule, an upper bound: where the log reports
  less, Google cached less than the rule allows (docs/FIDELITY.md, hosted APIs).
- Price (Gemini 2.5 Pro, prompts up to 200k tokens): input 1.25 USD a million tokens, cached input 0.1 of that,
  output 10.

>>> from strata_lab.caches.call_ids import Call, as_ids
>>> from strata_lab.caches.base import Hint
>>> from strata_lab.caches.presets import parse_engine
>>> m = parse_engine("gemini").build()
>>> ids = list(range(3000))
>>> _ = m.step(Call(0, "a", as_ids(ids), ts=0.0), Hint(None, 0, 0))
>>> m.step(Call(1, "a", as_ids(ids + [7]), ts=10.0), Hint(None, 3000, 3000)).reused    # every token of the prefix
3000
>>> p = m.step(Call(2, "b", as_ids(ids[:1500] + [9]), ts=20.0), Hint(None, 0, 0)); (p.reused, p.cause)
(0, None)
>>> parse_engine("gemini:min_tokens=1024").build().step(Call(0, "a", as_ids(ids[:1500]), ts=0.0), Hint(None, 0, 0)).written
1500
"""
from __future__ import annotations

from dataclasses import dataclass

from strata_lab.caches import openai

__all__ = ["Preset", "Model"]


@dataclass(frozen=True)
class Preset(openai.Preset):
    engine = "gemini"
    min_tokens: int = 2048
    granularity: int = 1
    ttl_s: float = 300.0


class Model(openai.Model):
    engine = "gemini"
