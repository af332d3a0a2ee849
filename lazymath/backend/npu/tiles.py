"""Scratch tiles of an NPU program under construction: `TilePool` (free lists of UB buffers per
(dtype, size)) and `TileBuilder` (an `isa.Builder` drawing its scratch from a pool).

Both the templates' expression emitter (templates/common.py) and the vector math composites
(vmath.py, which the emitter calls) build with them; they live below both so that neither
imports the other back (that was an import cycle, issue 36).
"""

from __future__ import annotations

import numpy as np

from lazymath.backend.npu import isa


class TileBuilder(isa.Builder):
    """A Builder whose scratch buffers come from a recycling pool (see `TilePool`)."""

    def __init__(self, pool: TilePool):
        super().__init__(tile=pool.tile, prefix="tmp")
        self.pool = pool
        self.borrowed: list[isa.Ref] = []
        self.shared_consts: dict | None = None  # see ExprEmitter.vm_consts

    def scratch(self, dtype, size=None, scope="UB", prefix=None):
        if scope != "UB" or (size is not None and size > self.pool.tile):
            return super().scratch(dtype, size, scope, prefix)
        r = self.pool.get(dtype, size)
        self.borrowed.append(r)
        return r


class TilePool:
    """Free lists of UB buffers per (dtype, size); the default size is the tile."""

    def __init__(self, tile: int, prefix: str = "t"):
        self.tile = tile
        self.prefix = prefix
        self.free: dict[tuple, list[isa.Ref]] = {}
        self.buffers: list[isa.Buffer] = []
        self._by_name: dict[str, isa.Buffer] = {}  # owns() in O(1): kernels have many tiles

    def get(self, dtype: str, size: int | None = None) -> isa.Ref:
        size = self.tile if size is None else int(size)
        lst = self.free.setdefault((dtype, size), [])
        if lst:
            return lst.pop()
        tag = "" if size == self.tile else f"_{size}"
        buf = isa.Buffer(f"{self.prefix}{len(self.buffers)}_{dtype}{tag}", "UB", dtype, size)
        self.buffers.append(buf)
        self._by_name[buf.name] = buf
        return isa.Ref(buf, 0)

    def put(self, ref: isa.Ref) -> None:
        if self.owns(ref):
            self.free.setdefault((ref.buf.dtype, ref.buf.size), []).append(ref)

    def owns(self, ref: isa.Ref) -> bool:
        mine = self._by_name.get(ref.buf.name)
        return mine is not None and (mine is ref.buf or mine == ref.buf)

    @property
    def bytes_per_elem(self) -> int:
        return sum(np.dtype(b.dtype).itemsize for b in self.buffers)
