"""A plan as a Dask task graph: one task per shard program and shard, one per tail, the
collectives as trees of small tasks. Keys are named after what they are, so the Dask dashboard
groups them ("lm-shard0", "lm-allreduce-sum", ...)."""

from __future__ import annotations

import uuid

from . import worker as W
from .plan import DNode, Plan, bounds


class Graph:
    """The task dict of one plan, and how to find each value's key(s)."""

    def __init__(self, plan: Plan, sources: dict, client=None):
        self.plan = plan
        self.sources = sources
        self.client = client
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
            k = (self.name(f"leaf{d.id}"),)
            self.dsk[k] = d.node.realized
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
