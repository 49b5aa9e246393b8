"""Paging through a store's replay: one cache domain at a time, a page of calls at a time.

Only the current page's calls (their held and prompt ids) are in memory; the next page continues the
replay where the last one stopped; going back replays the domain again from its start up to that page
(without copying ids). The divergence viewer uses this for stores.

>>> import tempfile
>>> from strata_lab.dump import convert_jsonl, Store
>>> d = tempfile.mkdtemp()
>>> _ = convert_jsonl("dumps/agent.jsonl", d)                     # doctest: +SKIP
>>> pager = StorePager(Store(d), page_size=2)                    # doctest: +SKIP
>>> [c["row"].cause for c in pager.calls]                        # doctest: +SKIP
['new_session', 'none']
"""
from __future__ import annotations

from strata_lab.replayer.core import load_tokenizer_arg, resolve_options
from strata_lab.replayer.fast import DomainSteps

__all__ = ["StorePager"]


class StorePager:
    """Pages of replayed calls from a store: `calls` (dicts with held, prompt, segments, row, seq)."""

    def __init__(self, store, *, domain: str | None = None, page_size: int = 100, tokenizer="qwen3",
                 model: str = "hybrid", checkpoint_policy=None, full_hit: str = "held_logits"):
        from strata_lab.replayer.fast import fit_cost_store

        if not isinstance(page_size, int) or isinstance(page_size, bool) or page_size < 1:
            raise ValueError(f"page_size must be a positive int, got {page_size!r}")
        self.store = store
        self.domains = store.domains()
        if domain is None:
            domain = next(iter(self.domains))
        if domain not in self.domains:
            raise ValueError(f"domain must be one of {sorted(self.domains)}, got {domain!r}")
        self.domain = domain
        self.page_size = page_size
        self.opts = resolve_options(model=model, checkpoint_policy=checkpoint_policy, full_hit=full_hit)
        self.tok = load_tokenizer_arg(tokenizer)
        from strata_lab.replayer.costs import usable_fit

        self.cost_model = usable_fit(fit_cost_store(store))[0]   # as the replay does: a poor fit prices nothing
        self.calls: list[dict] = []
        self.page = -1
        self._restart()
        self.next_page()

    def _restart(self) -> None:
        self._seen: list = []
        self._steps = DomainSteps(self.domains[self.domain], self.opts, self.tok, self.cost_model,
                                  show=self._keep)
        self._it = iter(self._steps)
        self.page = -1

    def _keep(self, held, prompt, segments) -> None:
        self._seen.append((held, prompt, segments))

    def next_page(self) -> bool:
        """Move to the next page; False (and no change) at the end of the domain."""
        calls = []
        for seq, row in self._it:
            held, prompt, segments = self._seen.pop()
            calls.append({"held": held, "prompt": prompt, "segments": segments, "row": row, "seq": seq})
            if len(calls) == self.page_size:
                break
        if not calls:
            return False
        self.calls = calls
        self.page += 1
        return True

    def prev_page(self) -> bool:
        """Move to the previous page (replays the domain from its start); False on the first page."""
        if self.page <= 0:
            return False
        target = self.page - 1
        self._restart()
        self._steps.show = None  # skip without copying ids
        for _ in range(target * self.page_size):
            next(self._it)
        self._steps.show = self._keep
        self.next_page()
        return True

    def set_domain(self, domain: str) -> None:
        if domain not in self.domains:
            raise ValueError(f"domain must be one of {sorted(self.domains)}, got {domain!r}")
        self.domain = domain
        self._restart()
        self.next_page()
