"""Which Dask cluster lazymath uses, and what every worker gets when it starts.

Order: a `Client` passed in; else `LAZYMATH_DASK_SCHEDULER=tcp://host:port` (an existing
cluster); else the process's default Dask client (one the user made); else an embedded
`LocalCluster` of processes, one single-threaded worker per core, started on first use and
closed at exit (or by `ld.close()`).
"""

from __future__ import annotations

import atexit
import logging

from lazymath import settings
from lazymath._threads import available_cpus
from lazymath.backend.native.kernel_cache import cache_dir
from lazymath.distributed import worker as W

SCHEDULER_ENV = "LAZYMATH_DASK_SCHEDULER"
CACHE_BASE_ENV = "LAZYMATH_DASK_CACHE_BASE"  # set on workers: the cache dir before the split

_state: dict = {"client": None, "cluster": None, "prepared": set()}


def _scheduler_address() -> str:
    return settings.get(SCHEDULER_ENV) or ""


def _worker_plugin():
    from distributed import WorkerPlugin

    class LazymathWorker(WorkerPlugin):
        """Gives the worker its own kernel cache directory (a subdirectory of the worker's
        LAZYMATH_CACHE_DIR, or of the default cache dir), named after the worker."""

        name = "lazymath"

        def setup(self, worker):
            base = settings.get(CACHE_BASE_ENV)
            if not base:
                base = str(cache_dir())
                settings.export(CACHE_BASE_ENV, base)
            W.setup_worker(base, worker.name)

    return LazymathWorker()


def prepare(client) -> None:
    """Register the worker plugin once per client (it also runs on workers that join later,
    e.g. the replacement of a killed worker)."""
    if id(client) in _state["prepared"]:
        return
    client.register_plugin(_worker_plugin())
    _state["prepared"].add(id(client))


def get_client(client=None):
    if client is not None:
        prepare(client)
        return client
    c = _state["client"]
    if c is not None and c.status == "running":
        return c
    from distributed import Client

    addr = _scheduler_address()
    if addr:
        c = Client(addr)
    else:
        try:
            from distributed import default_client

            c = default_client()
        except ValueError:
            c = _embedded()
    prepare(c)
    _state["client"] = c
    return c


def _embedded():
    from distributed import Client, LocalCluster

    cluster = LocalCluster(
        n_workers=available_cpus(),
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        # an embedded cluster's own logs (heartbeat tracebacks when a loaded machine stalls a
        # worker, comm errors while it shuts down) are noise to the user: only fatal ones show
        silence_logs=logging.CRITICAL,
    )
    _state["cluster"] = cluster
    return Client(cluster)


def close() -> None:
    """Close the client and the embedded cluster lazymath started (if any)."""
    c, cluster = _state["client"], _state["cluster"]
    _state["client"] = _state["cluster"] = None
    if c is not None and cluster is not None:  # a client lazymath made for its own cluster
        try:
            c.close()
        except Exception:
            pass
    if cluster is not None:
        try:
            cluster.close()
        except Exception:
            pass


atexit.register(close)
