"""A plan as a Dask task graph: one task per shard program and shard, one per tail, the
collectives as trees of small tasks. Keys are named after what they are, so the Dask dashboard
groups them ("lm-shard0", "lm-allreduce-sum", ...)."""

from __future__ import annotations

import pickle
import uuid
import weakref

from lazymath.distributed import worker as W
from lazymath.distributed.plan import DNode, Plan, bounds

# A replicated leaf (a plain lazymath tensor read by a sharded graph, e.g. the weights of
# `x @ w`) of at least this many bytes is scattered to the cluster instead of riding in the task
# graph; smaller ones cost less embedded than a scatter round trip.
SCATTER_MIN_BYTES = 64 << 10
# leaf node -> (client, future) of its scattered value: later computes on the same client
# reuse it instead of sending the data again (the entry dies with the node)
_LEAF_FUTURES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def live(client, futures) -> bool:
    """Do `futures` still hold their data on `client` (running, none lost or cancelled)?"""
    if client is None or futures is None or client.status != "running":
        return False
    return all(f.status in ("pending", "finished") for f in futures)


class Graph:
    """The task dict of one plan, and how to find each value's key(s).

    With `scatter=True` (what `compute` uses) numpy data reaches the workers through
    `client.scatter` (one future per shard, spread over the workers, and one per large
    replicated leaf) so the task graph holds only references: a 1 GiB input sends a graph of a
    few KiB instead of one Dask warns about and the scheduler has to hold."""

    def __init__(self, plan: Plan, sources: dict, client=None, *, scatter: bool = False):
        self.plan = plan
        self.sources = sources
        self.client = client
        self.scatter = scatter and client is not None
        self.tok = uuid.uuid4().hex[:10]
        self.dsk: dict = {}
        self.keys: dict[int, object] = {}  # dnode id -> key (replicated) or [key per shard]
        self.source_keys: list = []  # (Source, [keys]) of sources read for the first time
        self._stage_keys: dict = {}

    def name(self, what: str) -> str:
        return f"lm-{what}-{self.tok}"

    # -- values --
    def key(self, d: DNode):
        hit = self.keys.get(d.id)
        if hit is not None:
            return hit
        k = self._make(d)
        self.keys[d.id] = k
        return k

    def _make(self, d: DNode):
        if d.kind == "shard":
            src = self.sources[d.node]
            keys = src.keys(self)
            return keys
        if d.kind == "leaf":
            v = d.node.realized
            if self.scatter and v.nbytes >= SCATTER_MIN_BYTES:
                return self._scattered_leaf(d.node)
            k = (self.name(f"leaf{d.id}"),)
            self.dsk[k] = v
            return k
        if d.kind == "local":  # a replicated leaf sliced for every shard
            full = self.key(d.srcs[0])
            nm = self.name(f"slice{d.id}")
            out = []
            for i, (lo, hi) in enumerate(bounds(d.place.sizes)):
                self.dsk[(nm, i)] = (W.take, full, d.place.axis, lo, hi)
                out.append((nm, i))
            return out
        if d.kind == "allreduce":
            return self._allreduce(d)
        if d.kind == "allgather":
            parts = self.key(d.srcs[0])
            k = (self.name(f"allgather{d.id}"),)
            self.dsk[k] = (W.gather, list(parts), d.srcs[0].place.axis)
            return k
        if d.kind == "scatter":
            full = self.key(d.srcs[0])
            nm = self.name(f"scatter{d.id}")
            out = []
            for i, (lo, hi) in enumerate(bounds(d.place.sizes)):
                self.dsk[(nm, i)] = (W.take, full, d.place.axis, lo, hi)
                out.append((nm, i))
            return out
        if d.kind == "op":
            st, j = self.plan.producer[d.id]
            tasks = self._stage(st)
            nm = self.name(f"{st.name}-out{j}")
            out = []
            for i, t in enumerate(tasks):
                self.dsk[(nm, i)] = (W.output, t, j)
                out.append((nm, i))
            return out if st.sharded else out[0]
        raise AssertionError(f"no key for {d.kind}")

    def _scattered_leaf(self, node):
        hit = _LEAF_FUTURES.get(node)
        if hit is not None and hit[0] is self.client and live(self.client, [hit[1]]):
            return hit[1]
        fut = self.client.scatter(node.realized, hash=False)
        _LEAF_FUTURES[node] = (self.client, fut)
        return fut

    def nbytes(self) -> int:
        """Size of the pickled task graph (futures pickle as their keys): what the client
        sends the scheduler for this plan."""
        return len(pickle.dumps(self.dsk, protocol=pickle.HIGHEST_PROTOCOL))

    def _allreduce(self, d: DNode):
        """A binary tree of combine tasks over the shards' partial results."""
        op = d.arg
        level = list(self.key(d.srcs[0]))
        nm = self.name(f"allreduce-{op}{d.id}")
        depth = 0
        while len(level) > 1:
            nxt = []
            for i in range(0, len(level) - 1, 2):
                k = (nm, depth, i // 2)
                self.dsk[k] = (W.combine, op, level[i], level[i + 1])
                nxt.append(k)
            if len(level) % 2:
                nxt.append(level[-1])
            level = nxt
            depth += 1
        k = (nm, "result")
        self.dsk[k] = (W.finish, level[0], d.node.dtype.str)
        return k

    def _stage(self, st) -> list:
        hit = self._stage_keys.get(st.name)
        if hit is not None:
            return hit
        nm = self.name(st.name)
        keys = []
        ins = [self.key(x) for x in st.inputs]
        for i, prog in enumerate(st.programs):
            args = [k[i] if isinstance(k, list) else k for k in ins]
            self.dsk[(nm, i)] = (W.run_program, prog, i, *args)
            keys.append((nm, i))
        self._stage_keys[st.name] = keys
        return keys

    def root_keys(self) -> list:
        return [self.key(d) for d in self.plan.roots]
