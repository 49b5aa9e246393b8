"""Paging through a store's replay: one cache domain at a time, a page of calls at a time.

The domain's rows are the one replay's (`ReplayReport`'s columns, Contract 3), written by the C++ replay core
(`native.replay_domain`, as `strata_lab.replay(store)` replays it) and kept as one Arrow table; only the
current page's calls (their held and prompt ids, read back from the store) are in memory. The next page
continues reading the domain's lines where the last one stopped; going back reads the domain again from its
start up to that page. The divergence viewer uses this for stores.

>>> import tempfile
>>> from strata_lab.dump import convert_jsonl, Store
>>> d = tempfile.mkdtemp()
>>> _ = convert_jsonl("dumps/agent.jsonl", d)                     # doctest: +SKIP
>>> pager = StorePager(Store(d), page_size=2)                    # doctest: +SKIP
>>> [c["row"]["cause"] for c in pager.calls]                     # doctest: +SKIP
['new_session', 'none']
"""
from __future__ import annotations

from strata_lab.replayer.core import load_tokenizer_arg, resolve_options

__all__ = ["StorePager"]


class StorePager:
    """Pages of replayed calls from a store: `calls` (dicts with held, prompt, segments, row, seq); each row is
    the report's row (Contract 3) with the line's `recorded_reused`, `call`, `gen_len` and `drained_len`."""

    def __init__(self, store, *, domain: str | None = None, page_size: int = 100, tokenizer="qwen3",
                 model: str = "hybrid", checkpoint_policy=None, full_hit: str = "held_logits",
                 spec: str = "strata"):
        if not isinstance(page_size, int) or isinstance(page_size, bool) or page_size < 1:
            raise ValueError(f"page_size must be a positive int, got {page_size!r}")
        self.store = store
        self.domains = store.domains()
        if domain is None:
            domain = next(iter(self.domains))
        if domain not in self.domains:
            raise ValueError(f"domain must be one of {sorted(self.domains)}, got {domain!r}")
        self.page_size = page_size
        self.opts = resolve_options(model=model, checkpoint_policy=checkpoint_policy, full_hit=full_hit)
        self.tok = load_tokenizer_arg(tokenizer)
        self.spec = spec
        from strata_lab.replayer.costs import usable_fit
        from strata_lab.replayer.fast import fit_cost_store

        self.cost_model = usable_fit(fit_cost_store(store))[0]   # as the replay does: a poor fit prices nothing
        self.calls: list[dict] = []
        self.set_domain(domain)

    def set_domain(self, domain: str) -> None:
        """Replay another cache domain (a replica) and show its first page."""
        from strata_lab.replayer.native import numbered, replay_domain

        if domain not in self.domains:
            raise ValueError(f"domain must be one of {sorted(self.domains)}, got {domain!r}")
        self.domain = domain
        _seqs, batches, _snap, _ms = replay_domain(self.domains[domain], self.opts, self.tok, self.cost_model,
                                                   spec=self.spec)
        self.rows = numbered(batches)   # the domain's rows in seq order (None: no row)
        self._restart()
        self.next_page()

    def _restart(self) -> None:
        from strata_lab.replayer.fast import session_ends

        self._ends = session_ends(self.domains[self.domain])   # after a session's last call its ids can go
        self._lines = self.store.iter_domain(self.domain)
        self._held: dict = {}   # session -> (ids held, segments) after its last call read so far
        self._done = 0          # rows read so far
        self.page = -1

    def _read(self, n: int, keep: bool) -> list[dict]:
        calls = []
        for seq, rec in self._lines:
            sid = str(rec["session"])
            held, segs = self._held.get(sid, ([], []))
            prompt, gen, drained = rec["prompt_ids"], rec["gen_ids"], rec["drained_ids"]
            if keep:
                row = {k: v[0] for k, v in self.rows.slice(self._done, 1).to_pydict().items()}
                row.update(recorded_reused=row["reported"], call=rec.get("call", 0), gen_len=len(gen),
                           drained_len=len(drained))
                calls.append({"held": held, "prompt": prompt, "segments": segs, "row": row, "seq": seq})
            # held before the session's next call: this prompt + generated + drained ids (Contract 1)
            p, g = len(prompt), len(gen)
            if self._ends.get(rec["session"]) == seq:
                self._held.pop(sid, None)
            else:
                self._held[sid] = (list(prompt) + list(gen) + list(drained),
                                   [(p, p + g, "gen", None), (p + g, p + g + len(drained), "drained", None)])
            self._done += 1
            if self._done % n == 0:
                break
        return calls

    def next_page(self) -> bool:
        """Move to the next page; False (and no change) at the end of the domain."""
        calls = self._read(self.page_size, keep=True)
        if not calls:
            return False
        self.calls = calls
        self.page += 1
        return True

    def prev_page(self) -> bool:
        """Move to the previous page (reads the domain from its start); False on the first page."""
        if self.page <= 0:
            return False
        target = self.page - 1
        self._restart()
        for _ in range(target):
            self._read(self.page_size, keep=False)
        self.page = target - 1
        self.next_page()
        return True
