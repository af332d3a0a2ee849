"""The user surface: sharded tensors, compute on the cluster, results as futures or dask arrays.

A sharded tensor is an ordinary lazymath Tensor whose graph node is a leaf standing for data
that lives in shards (a numpy array cut into row blocks, a dask array's chunks, a .npy file read
through memory maps, or the shards of an earlier result still on the workers). Every lazymath op
accepts it and records nodes as usual; `compute` plans the graph (`plan.py`) and runs it on Dask
(`execute.py`). `t.realize()` / `t.numpy()` of a graph that reads sharded data also runs on the
cluster and gathers the result into this process.
"""

from __future__ import annotations

import itertools
import os
import weakref

import numpy as np

from lazymath._threads import available_cpus
from lazymath.distributed import cluster, dot
from lazymath.distributed import worker as W
from lazymath.distributed.execute import Graph, live
from lazymath.distributed.plan import Plan, bounds, make_plan
from lazymath.graph import node as gn
from lazymath.realize import commit, install_sharded_hook, sharded_hook
from lazymath.tensor import Tensor

# graph node of a sharded leaf -> its Source
SOURCES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_ids = itertools.count()


class Source:
    """Where a sharded leaf's data comes from, and its shards' futures once on a cluster."""

    def __init__(self, kind: str, data, axis: int, sizes, shape, dtype):
        self.kind = kind  # "numpy" | "npy" | "dask" | "futures"
        self.data = data
        self.axis = axis
        self.sizes = tuple(int(s) for s in sizes)
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.client = None  # the client holding `futures`
        self.futures = None
        # kind "futures": how to make them again, `recipe(client) -> [future per shard]` (the
        # plan that produced them, over inputs this process still holds), for when a worker
        # dies with scattered data that Dask itself cannot recompute
        self.recipe = None

    @property
    def n(self) -> int:
        return len(self.sizes)

    def live_futures(self, client):
        """The shards' futures if they still hold the data on `client`, else None."""
        if self.client is client and live(client, self.futures):
            return self.futures
        return None

    def keys(self, g: Graph) -> list:
        """The shards' keys (or futures) in `g`, adding the tasks that produce them."""
        futs = self.live_futures(g.client)
        if futs is not None:
            return list(futs)
        if self.kind == "futures" and self.recipe is not None and g.client is self.client:
            self.futures = self.recipe(g.client)  # lost with a worker: made again
            return list(self.futures)
        if self.kind == "futures":
            raise RuntimeError(
                "this sharded result lives on another (or a closed) Dask client; compute it again"
            )
        if self.kind == "virtual":
            raise RuntimeError("a placeholder (ld.placeholder) has no data: plan or simulate it")
        nm = g.name(f"{self.kind}-shards")
        keys = []
        spans = bounds(self.sizes)
        if self.kind == "numpy" and g.scatter:  # the data goes by scatter, not in the graph
            parts = [_take(self.data, self.axis, lo, hi) for lo, hi in spans]
            futs = g.client.scatter(parts, hash=False)  # round-robin over the workers
            self.client, self.futures = g.client, list(futs)
            return list(futs)
        if self.kind == "numpy":
            for i, (lo, hi) in enumerate(spans):  # no client (to_dask): in the graph
                g.dsk[(nm, i)] = _take(self.data, self.axis, lo, hi)
                keys.append((nm, i))
        elif self.kind == "npy":
            for i, (lo, hi) in enumerate(spans):
                g.dsk[(nm, i)] = (W.load_npy, self.data, self.axis, lo, hi)
                keys.append((nm, i))
        else:  # a dask array, rechunked so only the sharded axis is chunked
            arr = self.data
            g.dsk.update(dict(arr.__dask_graph__()))
            keys = _dask_keys(arr, self.axis)
        g.source_keys.append((self, keys))
        return keys


def _take(a: np.ndarray, axis: int, lo: int, hi: int) -> np.ndarray:
    idx = [slice(None)] * a.ndim
    idx[axis] = slice(lo, hi)
    return np.ascontiguousarray(a[tuple(idx)])


def _dask_keys(arr, axis: int) -> list:
    name = arr.name
    out = []
    for i in range(arr.numblocks[axis]):
        idx = [0] * arr.ndim
        idx[axis] = i
        out.append((name, *idx))
    return out


def gather(src: Source) -> np.ndarray:
    """The whole value of a sharded source, assembled in this process."""
    if src.kind == "futures":
        parts = _gather_retrying(src.client, lambda: src.futures, _remake(src))
        return np.concatenate([np.asarray(p) for p in parts], axis=src.axis)
    if src.kind == "numpy":
        return np.asarray(src.data)
    if src.kind == "npy":
        return np.asarray(np.load(src.data, mmap_mode="r"))
    return np.asarray(src.data.compute())


_ATTEMPTS = 3  # gathers of data lost with workers: made again at most twice


def _lost(futures) -> bool:
    """Did some of `futures` lose their data (a worker died holding scattered data or a result
    Dask forgot), rather than fail with a task's error?"""
    st = [f.status for f in futures]
    return "error" not in st and any(x in ("cancelled", "lost") for x in st)


def _remake(src: Source):
    def again() -> None:
        if src.recipe is None:
            raise RuntimeError("a sharded result was lost with its worker and has no recipe")
        src.futures = src.recipe(src.client)

    return again


def _gather_retrying(client, futures, remake) -> list:
    """client.gather(futures()), calling `remake()` (which makes the futures again, re-scattering
    lost inputs from this process) when the data was lost with a worker."""
    for attempt in range(_ATTEMPTS):
        try:
            return client.gather(list(futures()))
        except Exception:
            if attempt == _ATTEMPTS - 1 or not _lost(futures()):
                raise
            remake()
    raise AssertionError("unreachable")


def is_sharded(t: Tensor) -> bool:
    """Does `t` stand for sharded data (an ld.shard input or a computed split result)?"""
    return t._node in SOURCES


def shards(t: Tensor) -> tuple[int, tuple[int, ...]]:
    """(axis, shard sizes) of a sharded tensor."""
    src = SOURCES.get(t._node)
    if src is None:
        raise ValueError("shards(): this tensor is not sharded")
    return src.axis, src.sizes


def _sharded_leaf(src: Source) -> gn.Node:
    node = gn.make("buffer", src.dtype, src.shape, (), ("shard", next(_ids)))
    node.realized = None
    SOURCES[node] = src
    _install_hooks()
    return node


def _split_sizes(extent: int, n: int) -> list[int]:
    n = max(1, min(n, extent)) if extent else 1
    return [len(r) for r in np.array_split(np.arange(extent), n)]


def shard(data, axis: int = 0, n: int | None = None) -> Tensor:
    """A sharded lazymath tensor from a numpy array, a dask.array (its chunks along `axis`
    become the shards; `n` rechunks) or the path of a .npy file (opened as a memory map by each
    worker; the data never passes through this process). `n` defaults to the dask chunks, or to
    one shard per worker core of the default cluster size (the CPUs the process may use:
    `lazymath._threads.available_cpus`)."""
    if isinstance(data, (str, os.PathLike)):
        path = os.fspath(data)
        m = np.load(path, mmap_mode="r")
        shape, dtype = m.shape, m.dtype
        axis = _axis(axis, len(shape))
        sizes = _split_sizes(shape[axis], n or available_cpus())
        src = Source("npy", os.path.abspath(path), axis, sizes, shape, dtype)
    elif _is_dask_array(data):
        axis = _axis(axis, data.ndim)
        if n is not None:
            sizes = _split_sizes(data.shape[axis], n)
        else:
            sizes = data.chunks[axis]
        chunks = {d: (tuple(sizes) if d == axis else -1) for d in range(data.ndim)}
        data = data.rechunk(chunks)
        src = Source("dask", data, axis, sizes, data.shape, data.dtype)
    else:
        if isinstance(data, Tensor):
            data = data.numpy()
        a = np.asarray(data)
        if a.ndim == 0:
            raise ValueError("shard: a 0-d array has no axis to shard")
        axis = _axis(axis, a.ndim)
        sizes = _split_sizes(a.shape[axis], n or available_cpus())
        src = Source("numpy", a, axis, sizes, a.shape, a.dtype)
    return Tensor(_sharded_leaf(src))


def _axis(axis: int, ndim: int) -> int:
    if not -ndim <= axis < ndim:
        raise ValueError(f"shard: axis {axis} is out of range for {ndim} dimensions")
    return axis % ndim


def _is_dask_array(x) -> bool:
    mod = type(x).__module__ or ""
    return mod.startswith("dask.array") and hasattr(x, "chunks")


# ----------------------------------------------------------------------------- compute


def _roots(tensors) -> list[gn.Node]:
    out, seen = [], set()
    for t in tensors:
        if not isinstance(t, Tensor):
            raise TypeError(f"compute() takes lazymath Tensors, got {type(t).__name__}")
        if t._node not in seen:
            seen.add(t._node)
            out.append(t._node)
    return out


def plan(*tensors) -> Plan:
    """The distributed plan of `tensors` (nothing runs): shard programs, collectives, tails."""
    return make_plan(_roots(tensors), SOURCES)


def explain(*tensors) -> str:
    return str(plan(*tensors))


def to_dot(x) -> str:
    """Graphviz DOT of a plan, or of the plan of a tensor or a list of tensors."""
    p = x if isinstance(x, Plan) else plan(*(x if isinstance(x, (list, tuple)) else [x]))
    return dot.to_dot(p)


def compute(*tensors, client=None, sync: bool = True):
    """Realize `tensors` on the cluster. Split results stay on the workers (the tensor now
    stands for its shards' futures: `is_sharded(t)`, `.numpy()` gathers, further ops run on the
    cluster again); replicated results (full reductions, ...) are gathered and become ordinary
    realized tensors. Returns the tensors (one tensor for one argument).

    `sync=True` waits until every result exists on the cluster and raises a task's error here
    (a kernel failing on a worker raises `ShardError`); `sync=False` returns as soon as the work
    is submitted (like dask's persist); replicated results are always waited for."""
    roots = [n for n in _roots(tensors) if n.realized is None or n in SOURCES]
    if roots:
        client = cluster.get_client(client)
        p = make_plan(roots, SOURCES)
        results = _run(client, p)
        if sync:
            from distributed import wait

            for attempt in range(_ATTEMPTS):
                flat = [f for r in results for f in (r if isinstance(r, list) else [r])]
                wait(flat)
                for f in flat:
                    if f.status == "error":
                        f.result()  # raises the task's exception (a ShardError from a kernel)
                if not _lost(flat) or attempt == _ATTEMPTS - 1:
                    break
                results = _run(client, p)  # a worker died with scattered data: send it again
        _bind(tensors, roots, p, results, client)
    return tensors[0] if len(tensors) == 1 else tensors


def _run(client, p: Plan) -> list:
    """Submit plan `p` (its numpy inputs scattered, or their live futures reused): futures
    for every root."""
    g = Graph(p, SOURCES, client, scatter=True)
    return _submit(client, g, g.root_keys())


def _submit(client, g: Graph, rkeys: list) -> list:
    """Futures for every root key (lists for split roots); caches the sources' shard futures."""
    from distributed import Future

    want, seen = [], set()
    for k in rkeys:
        for x in k if isinstance(k, list) else [k]:
            if not isinstance(x, Future) and x not in seen:
                seen.add(x)
                want.append(x)
    src_keys = []
    for src, keys in g.source_keys:
        for x in keys:
            if x not in seen:
                seen.add(x)
                want.append(x)
        src_keys.append((src, keys))
    futs = client.get(g.dsk, want, sync=False) if want else []
    by_key = dict(zip(want, futs))
    for src, keys in src_keys:
        src.client, src.futures = client, [by_key[x] for x in keys]
    out = []
    for k in rkeys:
        if isinstance(k, list):
            out.append([x if isinstance(x, Future) else by_key[x] for x in k])
        else:
            out.append(k if isinstance(k, Future) else by_key[k])
    return out


def _bind(tensors, roots, p: Plan, results, client) -> None:
    """Point the tensors at their results: split ones at new sharded leaves over the futures,
    replicated ones gathered and committed."""
    new = {}
    rep = [i for i, d in enumerate(p.roots) if d.place.kind == "R"]
    if rep:
        box = [results]

        def again() -> None:
            box[0] = _run(client, p)

        values = _gather_retrying(client, lambda: [box[0][i] for i in rep], again)
        for i, v in zip(rep, values):
            commit(roots[i], np.asarray(v))
    for i, (n, d, r) in enumerate(zip(roots, p.roots, results)):
        if d.place.kind == "S" and n not in SOURCES:
            src = Source("futures", None, d.place.axis, d.place.sizes, n.shape, n.dtype)
            src.client, src.futures = client, list(r)
            src.recipe = _recipe(p, i)
            new[n] = _sharded_leaf(src)
    for t in tensors:
        leaf = new.get(t._node)
        if leaf is not None:
            t._node.tensors -= 1
            t._node = leaf
            leaf.tensors += 1


def _recipe(p: Plan, i: int):
    """Futures of root `i` of plan `p`, computed again (lost inputs re-scattered)."""

    def make(client) -> list:
        return list(_run(client, p)[i])

    return make


def to_dask(t: Tensor):
    """`t` as a lazy dask.array chunked like its shards (one chunk when it is replicated).
    Nothing runs until the dask array is computed (on whatever client computes it)."""
    import dask.array as da
    from dask.highlevelgraph import HighLevelGraph

    node = t._node
    if node.realized is not None and node not in SOURCES:
        return da.from_array(node.realized, chunks=node.shape or ())
    src = SOURCES.get(node)
    client = cluster._state["client"]
    if src is not None and src.kind == "futures":
        client = src.client
    p = make_plan([node], SOURCES)
    g = Graph(p, SOURCES, client)
    (k,) = g.root_keys()
    d = p.roots[0]
    name = g.name("array")
    if isinstance(k, list):
        a = d.place.axis
        for i, key in enumerate(k):
            idx = [0] * len(node.shape)
            idx[a] = i
            g.dsk[(name, *idx)] = (_identity, key)
        chunks = tuple(d.place.sizes if j == a else (s,) for j, s in enumerate(node.shape))
    else:
        g.dsk[(name,) + (0,) * len(node.shape)] = (_identity, k)
        chunks = tuple((s,) for s in node.shape)
    hlg = HighLevelGraph.from_collections(name, g.dsk, dependencies=[])
    return da.Array(hlg, name, chunks, dtype=node.dtype)


def _identity(x):
    return x


def worker_stats(client=None) -> list[dict]:
    """One dict per worker: `worker` (address), `compiled` (kernels compiled by LLVM in that
    worker process), `programs_built` and `program_hits` (its program cache), `programs_run`
    (shard/tail tasks it ran), `combines`, `slices`, `cache_dir`, `pid`, `memory_limit`,
    `spilled_keys` and `spilled_bytes` (results Dask moved to disk)."""
    client = cluster.get_client(client)
    out = client.run(W.stats)
    return [{"worker": addr, **s} for addr, s in sorted(out.items())]


# ----------------------------------------------------------------------------- hooks


class _Hooks:
    """Installed in lazymath.realize when the first sharded tensor is made: a realize or a
    schedule of a graph that reads sharded data goes through the distributed plan."""

    @staticmethod
    def reads_shards(roots) -> bool:
        if not SOURCES:
            return False
        return any(n in SOURCES for n in gn.toposort(roots))

    def realize(self, roots) -> bool:
        """Compute on the cluster and gather every root into this process."""
        if not self.reads_shards(roots):
            return False
        pending = [n for n in roots if n not in SOURCES]
        if pending:
            holders = [Tensor(n) for n in pending]
            compute(*holders)
            for n, h in zip(pending, holders):
                if h._node in SOURCES:  # a split result: gathered here
                    commit(n, gather(SOURCES[h._node]))
        for n in roots:
            if n in SOURCES and n.realized is None:  # .numpy() of a sharded tensor
                n.realized = _readonly(gather(SOURCES[n]))
        return True

    def dot(self, roots):
        if not self.reads_shards(roots):
            return None
        return dot.to_dot(make_plan(list(roots), SOURCES))

    def schedule(self, roots):
        if not self.reads_shards(roots):
            return None
        return make_plan(list(roots), SOURCES)


def _readonly(a: np.ndarray) -> np.ndarray:
    if a.flags.writeable:
        a.flags.writeable = False
    return a


def _install_hooks() -> None:
    if sharded_hook() is None:
        install_sharded_hook(_Hooks())
