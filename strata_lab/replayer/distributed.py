"""Replay a store on a Dask cluster: one task per cache domain (a replica, all its days, in order).

A replica's sessions share its cache, so its calls are replayed in order by one task; replicas are
independent and run in parallel. The tasks return their rows with each call's position in the store, and
the client merges them into the same Report an in-process replay returns. `cluster` is a
`distributed.Client`, a scheduler address ("tcp://host:8786"), or "local[:N]" (a LocalCluster with N
worker processes, started and closed here).
"""
from __future__ import annotations

import functools

from strata_lab.replayer.report import Report
from strata_lab.replayer.rowtable import RowTable

__all__ = ["replay_on_cluster", "connect"]


@functools.lru_cache(maxsize=4)
def _worker_tokenizer(name: str):
    from strata_lab.text.tokenizer import load_tokenizer

    return load_tokenizer(name)


def _domain_task(partitions, opts, tokenizer, cost_model):
    from strata_lab.replayer.native import replay_domain

    tok = _worker_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
    seqs, rows, snap, ms = replay_domain(partitions, opts, tok, cost_model)
    return seqs, rows.batches(), snap, ms   # Arrow batches travel compactly


MAX_LOCAL_WORKERS = 256


def connect(cluster):
    """(client, owned): a Client for `cluster`; owned is True when this call started it."""
    from distributed import Client, LocalCluster

    if isinstance(cluster, Client):
        return cluster, False
    if not isinstance(cluster, str) or not cluster:
        raise TypeError(f"cluster must be a distributed.Client, an address or 'local[:N]', got {cluster!r}")
    if cluster == "local" or cluster.startswith("local:"):
        _, _, n = cluster.partition(":")
        try:
            workers = int(n) if n else 2
        except ValueError:
            raise ValueError(f"cluster: 'local:N' needs an int N, got {cluster!r}") from None
        if workers < 1:
            raise ValueError(f"cluster: local needs at least one worker, got {workers}")
        if workers > MAX_LOCAL_WORKERS:  # one process each: past a few hundred the machine, not the work, is the limit
            raise ValueError(f"cluster: local runs at most {MAX_LOCAL_WORKERS} worker processes on one machine, "
                             f"got {workers}; use a scheduler's address for more")
        lc = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0")
        return Client(lc), True
    return Client(cluster), True


def sum_in_order(xs) -> float:
    total = 0.0
    for x in xs:
        total += x
    return total


def _merge_in_store_order(results) -> RowTable:
    """The domains' rows as one RowTable in store (seq) order, merged column-wise in Arrow."""
    import pyarrow as pa

    batches = [b for res in results for b in res[1]]
    seqs = [s for res in results for s in res[0]]
    if not batches:
        return RowTable()
    table = pa.Table.from_batches(batches)
    order = pa.array(seqs, type=pa.int64()).to_numpy().argsort(kind="stable")
    return RowTable.from_batches(table.take(pa.array(order)).combine_chunks().to_batches(max_chunksize=8192))


def replay_on_cluster(store, opts, tokenizer, cost_model, *, cluster, progress: bool = False) -> Report:
    """The distributed replay behind `replay(store, cluster=...)`."""
    from distributed import as_completed

    from strata_lab.replayer.fast import fit_cost_store

    if opts.policy.changes_prompts:
        raise ValueError("cluster: prompt-rewriting policies (reply-ids, keep-drained) replay in-process only")
    poor_fit = None
    if cost_model is None:
        from strata_lab.replayer.costs import usable_fit

        cost_model, poor_fit = usable_fit(fit_cost_store(store))
    client, owned = connect(cluster)
    try:
        domains = store.domains()
        futures = [client.submit(_domain_task, parts, opts, tokenizer, cost_model, key=f"replay-{name}", pure=False)
                   for name, parts in domains.items()]
        bar = None
        if progress:
            from strata_lab.progress import progress_bar

            bar = progress_bar(total=len(futures), desc=f"replay {opts.policy.name} on dask", unit="domain")
        results = []
        for fut in as_completed(futures):
            try:
                results.append(fut.result())
            except Exception as exc:
                if type(exc).__name__ != "KilledWorker":
                    raise
                # a domain whose workers kept dying (out of memory, killed): one clear error, not a traceback
                raise RuntimeError(f"dask: the workers running cache domain {fut.key!r} died repeatedly (out of "
                                   "memory? see the workers' logs); the replay stopped") from None
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
    finally:
        if owned:
            cluster_obj = client.cluster
            client.close()
            if cluster_obj is not None:
                cluster_obj.close()
    rows = _merge_in_store_order(results)
    snap = sum(res[2] for res in results)
    ms = [t for t in rows.column("prefill_ms") if t == t]  # in store order, as in-process sums
    recorded_s = sum_in_order(ms) / 1000.0 if any(res[3] is not None for res in results) else None
    if opts.policy.checkpoint_policy is not None:
        recorded_s = None
    return Report(rows, policy=opts.policy, model=opts.model, cost_model=cost_model, snapshot_bytes=snap,
                  recorded_prefill_s=recorded_s, poor_fit=poor_fit)
