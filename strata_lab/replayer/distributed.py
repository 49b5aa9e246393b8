"""Replay a store on a Dask cluster: one task per cache domain (a replica, all its days, in order).

A replica's sessions share its cache, so its calls are replayed in order by one task; replicas are
independent and run in parallel. The tasks return their rows with each call's position in the store, and
the client merges them in store order: the same rows an in-process replay gives. `cluster` is a
`distributed.Client`, a scheduler address ("tcp://host:8786"), or "local[:N]" (a LocalCluster with N
worker processes, started and closed here).
"""
from __future__ import annotations

import functools

__all__ = ["replay_on_cluster", "connect"]


@functools.lru_cache(maxsize=4)
def _worker_tokenizer(name: str):
    from strata_lab.text.tokenizer import load_tokenizer

    return load_tokenizer(name)


def _domain_task(partitions, opts, tokenizer, cost_model, spec):
    from strata_lab.replayer.native import replay_domain

    tok = _worker_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
    seqs, batches, snap, ms = replay_domain(partitions, opts, tok, cost_model, spec=spec)
    return seqs, batches, snap, ms   # Arrow batches travel compactly


MAX_LOCAL_WORKERS = 256


def local_workers(cluster) -> int | None:
    """The worker count of a "local[:N]" cluster, None for a Client or a scheduler address; a malformed value
    is a ValueError (checked before any work: nothing is started here)."""
    if not isinstance(cluster, str):
        if type(cluster).__name__ == "Client":
            return None
        raise TypeError(f"cluster must be a distributed.Client, an address or 'local[:N]', got {cluster!r}")
    if not cluster:
        raise TypeError(f"cluster must be a distributed.Client, an address or 'local[:N]', got {cluster!r}")
    if cluster != "local" and not cluster.startswith("local:"):
        return None
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
    return workers


def connect(cluster):
    """(client, owned): a Client for `cluster`; owned is True when this call started it."""
    from distributed import Client, LocalCluster

    if isinstance(cluster, Client):
        return cluster, False
    workers = local_workers(cluster)
    if workers is not None:
        lc = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0")
        return Client(lc), True
    return Client(cluster), True


def _merge_in_store_order(results):
    """The domains' rows as one table in store (seq) order, numbered in it."""
    import numpy as np
    import pyarrow as pa

    from strata_lab.replayer.native import numbered

    batches = [b for res in results for b in res[1]]
    seqs = [s for res in results for s in res[0]]
    if not batches:
        return None
    table = pa.Table.from_batches(batches)
    order = np.asarray(seqs, dtype=np.int64).argsort(kind="stable")
    return numbered(table.take(pa.array(order)).combine_chunks().to_batches())


def replay_on_cluster(store, opts, tokenizer, cost_model, *, cluster, progress: bool = False, spec: str = "strata"):
    """The distributed replay behind `replay(store, cluster=...)`: the report's rows (an Arrow table)."""
    from distributed import as_completed

    if opts.policy.changes_prompts:
        raise ValueError("cluster: prompt-rewriting policies (reply-ids, keep-drained) replay in-process only")
    client, owned = connect(cluster)
    try:
        domains = store.domains()
        futures = [client.submit(_domain_task, parts, opts, tokenizer, cost_model, spec, key=f"replay-{name}",
                                 pure=False)
                   for name, parts in domains.items()]
        bar = None
        if progress:
            from strata_lab.progress import progress_bar

            bar = progress_bar(total=len(futures), desc=f"replay {spec} on dask", unit="domain")
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
    return _merge_in_store_order(results)
