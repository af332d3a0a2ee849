"""User kernels (`lazymath.kernel`): the builder an author writes NPU programs with, and the
template that turns a `CustomKernel` into a checked `isa.Program`.

The author's function receives a `KernelBuilder` and one `GlobalTensor` per GM argument
(inputs, then the output). It declares on-chip buffers (`ub`, `l1`, `l0a`, `l0b`, `l0c`),
emits movers (`copy_in`, `copy_out`, `load_nz`, `load_l0`, `fixpipe`), vector instructions
(every `isa.Builder` method: `vadd`, `vexp`, `vmuls`, ...), Cube instructions (`mmad`), loops
(`loop`, `block_range`), scalar values (`let`) and pipe flags (`set_flag`, `wait_flag`,
`pipe_barrier`). Addresses are integer expressions: loop variables support ``+ - * // %``.

Mistakes are reported where they are made, naming the kernel: a buffer that does not fit its
scope (name, size, what is already declared, the capacity), an unknown dtype or scope, a Cube
instruction in a Vector kernel, a UB buffer on a 910B Cube core, a bad pipe name. The program
then goes through `Program.check` (capacity, declarations, event ids, Cube bounds, overlapping
vector windows). A missing set_flag/wait_flag between a mover and a compute instruction is
found by the interpreter's race checker (`backend.npu.races`) on the interp backend.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np

from lazymath.backend.npu import cube_semantics, interp, isa, races  # noqa: F401  (registers the Cube instructions' semantics)
from lazymath.backend.npu import isa_cube as cube
from lazymath.backend.npu.kernel_ir import ArgView, CustomKernel, contiguous_view
from lazymath.backend.npu.templates import common as C
from lazymath.backend.npu.templates.common import ExprEmitter, TilePool
from lazymath.graph import custom

DTYPES = ("bool", "int8", "int32", "int64", "float16", "bfloat16", "float32", "float64")
UNITS = ("vector", "cube")  # what lazymath.kernel accepts
# + "mix": one body for a Cube core and its Vector cores (split 910B, `isa.is_mix`); built-in
# kernels only (the fused attention): each instruction's core follows from it (`isa.core_of`)
BUILTIN_UNITS = (*UNITS, "mix")


class KernelDefinitionError(ValueError):
    """A user kernel is used wrongly: bad dtype, scope, pipe, instruction for its unit, or a
    tiling/shape function that fails."""


def check_dtype(dtype, what: str) -> str:
    """The numpy dtype name of `dtype`, or a KernelDefinitionError naming `what`."""
    try:
        name = np.dtype(getattr(dtype, "name", dtype) if not isinstance(dtype, str) else dtype).name
    except TypeError:
        name = None
    if name not in DTYPES:
        raise KernelDefinitionError(
            f"{what}: unknown dtype {dtype!r}; kernel buffers hold {', '.join(DTYPES)}"
        )
    return name


class GlobalTensor:
    """A GM argument of a user kernel: dense, C order. ``t[off]`` (or ``t + off``) is the element
    at flat offset `off`, what movers take as their GM side; `shape`, `dtype`, `size`, `nbytes`
    describe it (static: the kernel is specialized to its shapes).

    `strides` and `offset` (elements) say where element (i, j, ...) is: ``t[t.offset +
    i * t.strides[0] + ...]``. They are C order and 0 for every user kernel; a built-in kernel
    that declares ``strided_inputs`` (the fused attention) may get a strided view of another
    kernel's buffer instead (heads split by a permute, q/k/v slices of one qkv matmul), read in
    place rather than copied dense first."""

    __slots__ = ("buf", "shape", "dtype", "size", "name", "strides", "offset")

    def __init__(self, buf: isa.Buffer, shape: tuple[int, ...],
                 strides: tuple[int, ...] | None = None, offset: int = 0):  # fmt: skip
        self.buf = buf
        self.shape = tuple(shape)
        self.dtype = np.dtype(buf.dtype)
        self.size = math.prod(self.shape)
        self.name = buf.name
        self.strides = (contiguous_view(self.dtype.name, self.shape).strides if strides is None
                        else tuple(strides))  # fmt: skip
        self.offset = offset

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, off) -> isa.Ref:
        return isa.Ref(self.buf, _int(off))

    def __add__(self, off) -> isa.Ref:
        return isa.Ref(self.buf, _int(off))

    def __repr__(self) -> str:
        return f"GlobalTensor({self.name}: gm {self.dtype.name}{list(self.shape)})"


class _WorkspaceTensor(GlobalTensor):
    """A part of the GM workspace: element `off` is at `base + off` of its typed buffer."""

    __slots__ = ("base",)

    def __init__(self, buf: isa.Buffer, shape: tuple[int, ...], base: int):
        super().__init__(buf, shape)
        self.base = base

    def __getitem__(self, off) -> isa.Ref:
        return isa.Ref(self.buf, isa.add(self.base, _int(off)) if self.base else _int(off))

    __add__ = __getitem__


class LocalTensor:
    """An on-chip buffer (UB, L1, L0A, L0B, L0C) declared by the kernel: ``t[off]`` / ``t + off``
    is the element at `off`; the tensor itself stands for offset 0."""

    __slots__ = ("buf",)

    def __init__(self, buf: isa.Buffer):
        self.buf = buf

    scope = property(lambda self: self.buf.scope)
    dtype = property(lambda self: np.dtype(self.buf.dtype))
    size = property(lambda self: self.buf.size)
    nbytes = property(lambda self: self.buf.nbytes)
    name = property(lambda self: self.buf.name)

    def __getitem__(self, off) -> isa.Ref:
        return isa.Ref(self.buf, _int(off))

    def __add__(self, off) -> isa.Ref:
        return isa.Ref(self.buf, _int(off))

    def __repr__(self) -> str:
        return f"LocalTensor({self.name}: {self.scope.lower()} {self.buf.dtype}[{self.size}])"


def _int(x):
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, bool) or not isinstance(x, (int, isa.Var, isa.BinInt)):
        raise KernelDefinitionError(f"expected an integer expression, got {x!r}")
    return x


def _norm(v):
    """Builder operands -> ISA values (tensors -> Ref at 0, numpy ints -> int)."""
    if isinstance(v, (GlobalTensor, LocalTensor)):
        return isa.Ref(v.buf, 0)
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    if isinstance(v, tuple):
        return tuple(_norm(x) for x in v)
    if isinstance(v, list):
        return tuple(_norm(x) for x in v)
    return v


_CUBE_PIPES = ("Cube", "MTE1", "FixPipe")


class KernelBuilder(isa.Builder):
    """What a user kernel's function receives as its first argument (see the module docstring
    and docs/custom_kernels.md). `spec` is the device, `unit` "vector" or "cube",
    `block_idx`/`block_num` this block's index and the launch's block count (GetBlockIdx /
    GetBlockNum), `params` the call's keyword parameters."""

    def __init__(self, name: str, unit: str, spec, params: dict | None = None):
        super().__init__(prefix="scratch")
        self.name = name
        self.unit = unit
        self.spec = spec
        self.params = dict(params or {})
        self.block_idx = isa.BLOCK_IDX
        self.block_num = isa.BLOCK_NUM
        self._used: dict[str, int] = {}
        self._names: set[str] = set()
        self._vars = 0
        self.workspace = 0
        self.epilogue_expr: tuple = ()  # set by build_program: consumers fused into the slot
        self.epilogue_result = -1
        self.epilogue_calls = 0
        self._epi_pools: dict = {}
        self.ws_arg = -1  # GM argument index of the workspace (set by build_program)
        self.ws_buffers: list[isa.Buffer] = []

    # ------------------------------------------------------------ buffers
    def alloc(self, scope: str, dtype, size: int, name: str | None = None) -> LocalTensor:
        """Declare an on-chip buffer of `size` elements of `dtype` in `scope`. Raises
        `isa.BufferOverflowError` naming the buffer, its size, what the scope already holds
        and the capacity when it does not fit."""
        scope = str(scope).upper()
        if scope not in isa.SCOPES or scope == "GM":
            raise KernelDefinitionError(
                f"kernel {self.name}: unknown on-chip scope {scope!r}; scopes: UB, L1, L0A, L0B, "
                "L0C"
            )
        if self.unit == "vector" and scope != "UB":
            raise KernelDefinitionError(
                f"kernel {self.name}: a Vector kernel has only UB on chip; {scope} belongs to the "
                "Cube core (declare unit='cube')"
            )
        if self.unit == "mix" and self.spec.coupled:
            raise KernelDefinitionError(
                f"kernel {self.name}: a MIX kernel (AIC + AIV joined by cross-core flags) is a "
                f"split-device kernel; {self.spec.name} is coupled"
            )
        if self.unit == "cube" and scope == "UB" and not self.spec.has_ub_on_cube_core:
            raise KernelDefinitionError(
                f"kernel {self.name}: {self.spec.name} is split: its Cube cores have no UB "
                "(results leave L0C through fixpipe to GM; Vector work is a separate kernel)"
            )
        dt = check_dtype(dtype, f"kernel {self.name}: buffer {name or '?'}")
        if isinstance(size, np.integer):
            size = int(size)
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise KernelDefinitionError(
                f"kernel {self.name}: buffer {name or '?'} needs a static positive element "
                f"count, got {size!r}"
            )
        if name is None:
            name = f"{scope.lower()}{len(self.buffers)}"
        if name in self._names:
            raise KernelDefinitionError(f"kernel {self.name}: two buffers named {name!r}")
        return LocalTensor(self._declare(isa.Buffer(name, scope, dt, size)))

    def _declare(self, buf: isa.Buffer, what: str = "") -> isa.Buffer:
        scope, name = buf.scope, buf.name
        align = self.spec.align.get(scope, 32)
        nb = (buf.nbytes + align - 1) // align * align
        used = self._used.get(scope, 0)
        cap = self.spec.capacity(scope)
        if used + nb > cap:
            extra = f" ({what})" if what else ""
            raise isa.BufferOverflowError(
                f"kernel {self.name}: {scope} buffer {name}{extra} ({buf.size} x {buf.dtype} = "
                f"{buf.nbytes} B) does not fit: {used} B of {scope} already declared, {scope} "
                f"capacity {cap} B on {self.spec.name}"
            )
        self._used[scope] = used + nb
        self._names.add(name)
        self.buffers.append(buf)
        return buf

    def ub(self, dtype, size: int, name: str | None = None) -> LocalTensor:
        """A UB buffer (Vector unit's working memory)."""
        return self.alloc("UB", dtype, size, name)

    def l1(self, dtype, size: int, name: str | None = None) -> LocalTensor:
        return self.alloc("L1", dtype, size, name)

    def l0a(self, dtype, size: int, name: str | None = None) -> LocalTensor:
        return self.alloc("L0A", dtype, size, name)

    def l0b(self, dtype, size: int, name: str | None = None) -> LocalTensor:
        return self.alloc("L0B", dtype, size, name)

    def l0c(self, dtype, size: int, name: str | None = None) -> LocalTensor:
        return self.alloc("L0C", dtype, size, name)

    def capacity(self, scope: str) -> int:
        """Bytes of `scope` still free in this kernel."""
        scope = scope.upper()
        return self.spec.capacity(scope) - self._used.get(scope, 0)

    def workspace_tensor(self, dtype, size: int, name: str) -> GlobalTensor:
        """`size` elements of `dtype` in the kernel's GM workspace (one zeroed argument after
        the outputs, fresh per launch; 64-byte aligned parts): where a MIX kernel's AIC and AIV
        hand tiles to each other, since they share no on-chip memory."""
        dt = check_dtype(dtype, f"kernel {self.name}: workspace {name}")
        if not isinstance(size, int) or size <= 0:
            raise KernelDefinitionError(f"kernel {self.name}: workspace {name} needs a static "
                                        f"positive element count, got {size!r}")  # fmt: skip
        item = np.dtype(dt).itemsize
        off = -(-self.workspace // 64) * 64
        self.workspace = off + size * item
        buf = isa.Buffer(name, "GM", dt, 0, arg=self.ws_arg)
        self.ws_buffers.append(buf)
        return _WorkspaceTensor(buf, (size,), off // item)

    def scratch(self, dtype, size=None, scope="UB", prefix=None):
        return isa.Ref(self.alloc(scope, dtype, size if size else self.tile, None).buf, 0)

    # ------------------------------------------------------------ emission
    def emit(self, instr) -> None:
        fields = getattr(instr, "__dataclass_fields__", None)
        if fields:
            changes = {}
            for f in fields:
                v = getattr(instr, f)
                nv = _norm(v)
                if nv is not v:
                    changes[f] = nv
            if changes:
                import dataclasses

                instr = dataclasses.replace(instr, **changes)
        pipe = isa.PIPE_OF.get(type(instr))
        if self.unit == "vector" and pipe in _CUBE_PIPES:
            raise KernelDefinitionError(
                f"kernel {self.name}: {isa.format_instr(instr)!r} runs on the {pipe} pipe of a "
                "Cube core; this kernel is unit='vector'"
            )
        if self.unit == "mix":
            try:
                isa.core_of(instr)
            except ValueError as e:
                raise KernelDefinitionError(f"kernel {self.name}: {e}") from None
        elif self.unit == "cube" and pipe == "Vector" and not self.spec.has_ub_on_cube_core:
            raise KernelDefinitionError(
                f"kernel {self.name}: {isa.format_instr(instr)!r} needs a Vector unit, which a "
                f"{self.spec.name} Cube core does not have"
            )
        self.body.append(instr)

    def _var(self, name: str | None, base: str) -> isa.Var:
        self._vars += 1
        return isa.Var(name if name else f"{base}{self._vars}")

    # ------------------------------------------------------------ scalar control
    def loop(self, start, stop=None, step=1, name: str | None = None):
        """``with k.loop(n) as i:`` or ``k.loop(start, stop, step)``: a for loop (the body
        is what the block emits); `i` is an integer expression."""
        if stop is None:
            start, stop = 0, start
        if isinstance(name, isa.Var):
            var = name
        else:
            var = self._var(name, "i")
        return isa.LoopBuilder(self, var, _int(start), _int(stop), _int(step))

    def let(self, value, name: str | None = None) -> isa.Var:  # type: ignore[override]
        """A scalar register holding `value` (an integer expression); returns it.

        `k.let(value, "name")` is the kernel author's order; isa.Builder's `let(var, value)`
        (a Var or register name first, an expression second) is accepted too. A string `name`
        always means the author's order: `value` may itself be a plain Var (an expression
        that simplified to one, e.g. imin(w, n - c0) with equal operands)."""
        if isinstance(value, (str, isa.Var)) and name is not None and not isinstance(name, str):
            value, name = name, value  # isa.Builder's order
        var = name if isinstance(name, isa.Var) else self._var(name, "s")
        self.body.append(isa.Let(var, _int(value)))
        return var

    @contextlib.contextmanager
    def if_(self, a, cmp: str, b):
        """``with k.if_(i, "<", n):`` runs the block only when the comparison holds."""
        if cmp not in isa.CMP_OPS:
            raise KernelDefinitionError(f"kernel {self.name}: comparison {cmp!r} is not one of "
                                        f"{', '.join(isa.CMP_OPS)}")  # fmt: skip
        saved, self.body = self.body, []
        try:
            yield
        finally:
            inner, self.body = self.body, saved
        self.body.append(isa.If(_int(a), cmp, _int(b), tuple(inner)))

    def block_range(self, items) -> tuple:
        """(start, stop) of the items this block owns: blockFactor = ceil(items / block_num),
        start = block_idx * blockFactor (AscendC's split; right for any block count)."""
        items = _int(items)
        factor = self.let(isa.floordiv(isa.add(isa.sub(items, 1), isa.BLOCK_NUM), isa.BLOCK_NUM),
                          "block_factor")  # fmt: skip
        start = self.let(isa.mul(isa.BLOCK_IDX, factor), "block_start")
        stop = self.let(isa.imin(isa.add(start, factor), items), "block_stop")
        return start, stop

    # ------------------------------------------------------------ epilogue slot
    def epilogue(self, tile, n, size: int | None = None) -> None:
        """The epilogue slot (kernels defined with ``epilogue=True``): `tile` (a UB tensor or a
        position in one) holds `n` output elements about to be copied out; elementwise
        consumers the planner fused into this kernel are applied to them here, in place (in
        the output dtype). Call it on the Vector pipe after computing the tile and before the
        V -> MTE3 flag of its copy-out. Nothing is emitted when no consumer was fused.
        `size`: the static upper bound of `n` (default: the tensor's size)."""
        self.epilogue_calls += 1
        if not self.epilogue_expr:
            return
        ref = _norm(tile)
        if not isinstance(ref, isa.Ref) or ref.buf.scope != "UB":
            raise KernelDefinitionError(f"kernel {self.name}: epilogue() takes a UB tile")
        if size is None:
            size = ref.buf.size if isinstance(tile, LocalTensor) else None
        if not isinstance(size, int) or size <= 0:
            raise KernelDefinitionError(
                f"kernel {self.name}: epilogue(tile[off], n, size=...) needs the static upper "
                "bound of n when the tile is a position inside a buffer"
            )
        pool = self._epi_pools.get(size)
        if pool is None:
            pool = self._epi_pools[size] = TilePool(size, prefix=f"epi{len(self._epi_pools)}_")
        b = isa.Builder(tile=size, prefix=f"epi_s{self.epilogue_calls}_")
        em = ExprEmitter(b, pool, _int(n))
        em.emit(self.epilogue_expr, (self.epilogue_result,), {}, ref, {0: ref})
        for buf in [*pool.buffers, *b.buffers]:
            if buf.name not in self._names:
                self._declare(buf, "the fused epilogue's temporaries")
        self.body.extend(em.hoisted)
        self.body.extend(b.body)

    # ------------------------------------------------------------ flags
    def _pipe(self, p: str) -> str:
        if p not in isa.FLAG_PIPES:
            raise KernelDefinitionError(
                f"kernel {self.name}: unknown pipe {p!r} in a flag; pipes: "
                f"{', '.join(isa.FLAG_PIPES)} (AscendC HardEvent names, e.g. MTE2->V)"
            )
        return p

    def set_flag(self, src_pipe: str, dst_pipe: str, event=0) -> None:
        """Pipe `src_pipe` signals `dst_pipe` on `event` once its earlier work is done."""
        self.body.append(isa.SetFlag(self._pipe(src_pipe), self._pipe(dst_pipe), _int(event)))

    def wait_flag(self, src_pipe: str, dst_pipe: str, event=0) -> None:
        """Pipe `dst_pipe` waits for the matching set_flag."""
        self.body.append(isa.WaitFlag(self._pipe(src_pipe), self._pipe(dst_pipe), _int(event)))

    def pipe_barrier(self, core: str | None = None) -> None:
        """Every pipe waits until all issued work is done; in a MIX kernel every pipe of one
        `core` ("AIC" or "AIV": a barrier never spans the two)."""
        if self.unit == "mix":
            if core not in isa.MIX_CORES:
                raise KernelDefinitionError(f"kernel {self.name}: a MIX kernel's pipe_barrier "
                                            "names its core: 'AIC' or 'AIV'")  # fmt: skip
            self.body.append(isa.PipeBarrier(core))
            return
        if core is not None:
            raise KernelDefinitionError(f"kernel {self.name}: pipe_barrier(core) is for MIX "
                                        "kernels")  # fmt: skip
        self.body.append(isa.PipeBarrier())

    def cross_set(self, side: str, pipe: str, flag) -> None:
        """MIX: `pipe` of core `side` tells the other core kind that its work so far is done
        (AscendC CrossCoreSetFlag), e.g. the AIC after FixPipe wrote a tile to the workspace."""
        self.emit(isa.CrossCoreSetFlag(self._pipe(pipe), _int(flag), side))

    def cross_wait(self, side: str, pipe: str, flag) -> None:
        """MIX: `pipe` of core `side` stalls until the other core kind set `flag`."""
        self.emit(isa.CrossCoreWaitFlag(self._pipe(pipe), _int(flag), side))

    # ------------------------------------------------------------ movers
    def copy_in(self, dst, src, counts, strides=None, dst_pitch=None) -> None:
        """MTE2 GM -> UB (or L1): `counts` elements (an int) or (rows, cols) with GM `strides`
        (default dense: (1,) or (cols, 1))."""
        counts, strides = self._counts(counts, strides)
        self.emit(isa.CopyIn(dst, src, counts, strides, dst_pitch))

    def copy_out(self, dst, src, counts, strides=None, src_pitch=None) -> None:
        """MTE3 UB -> GM, the mirror of `copy_in`."""
        counts, strides = self._counts(counts, strides)
        self.emit(isa.CopyOut(dst, src, counts, strides, src_pitch))

    def _counts(self, counts, strides):
        if not isinstance(counts, (tuple, list)):
            counts = (counts,)
        counts = tuple(_int(c) for c in counts)
        if strides is None:
            if len(counts) == 1:
                strides = (1,)
            elif isinstance(counts[1], int):
                strides = (counts[1], 1)
            else:
                raise KernelDefinitionError(
                    f"kernel {self.name}: a 2-D copy with a variable column count needs strides"
                )
        elif not isinstance(strides, (tuple, list)):
            strides = (strides,)
        if len(strides) != len(counts) or len(counts) not in (1, 2):
            raise KernelDefinitionError(
                f"kernel {self.name}: a copy takes 1 or 2 (count, stride) pairs, got counts "
                f"{counts} and strides {tuple(strides)}"
            )
        return counts, tuple(_int(s) for s in strides)

    # ------------------------------------------------------------ Cube
    def load_nz(self, dst, src, rows, cols, strides, dst_rows: int, row_pad: int = 16,
                reuse: int = 1) -> None:  # fmt: skip
        """MTE2 GM -> L1 in NZ layout: a rows x cols tile read with GM `strides` (row, col)
        into an L1 tile with `dst_rows` padded rows (rows zero-filled to `row_pad`, columns
        to 16). `reuse`: the cost hint of `isa_cube.LoadNz` (loads of the launch that read the
        same GM tile: all but the first hit L2)."""
        self.emit(cube.LoadNz(dst, int(dst_rows), src, tuple(_int(s) for s in strides),
                              _int(rows), _int(cols), int(row_pad),
                              reuse=max(1, int(reuse))))  # fmt: skip

    def load_l0(self, dst, src, rows, cols, src_rows: int, dst_rows: int) -> None:
        """MTE1 L1 -> L0A / L0B: an NZ block of rows x cols (multiples of 16)."""
        self.emit(cube.LoadL0(dst, int(dst_rows), src, int(src_rows), _int(rows), _int(cols)))

    def mmad(self, c, a, b, m, n, k, a_rows: int, b_rows: int, c_rows: int, accumulate=0,
             in_dtype: str | None = None) -> None:  # fmt: skip
        """Cube: C[:m, :n] (+)= A[:m, :k] @ B[:k, :n], float32 accumulation in L0C; NZ tiles
        with padded row counts a_rows / b_rows / c_rows; `accumulate` 0 overwrites, 1 adds."""
        if in_dtype is None:
            in_dtype = _norm(a).buf.dtype
        in_dtype = check_dtype(in_dtype, f"kernel {self.name}: mmad")
        self.emit(cube.Mmad(c, int(c_rows), a, int(a_rows), b, int(b_rows), _int(m), _int(n),
                            _int(k), _int(accumulate), in_dtype))  # fmt: skip

    def fixpipe(self, dst, src, rows, cols, strides, src_rows: int, relu: bool = False) -> None:
        """FixPipe L0C -> GM (or UB on 910): rows x cols of the NZ tile, cast to dst's dtype,
        optional relu, written with `strides` (row, col)."""
        self.emit(cube.FixPipe(dst, tuple(_int(s) for s in strides), src, int(src_rows),
                               _int(rows), _int(cols), bool(relu)))  # fmt: skip


RACE_CHECK_MAX_ELEMENTS = 1 << 22  # GM elements up to which a build steps block 0 (~ms)


def _extent(v: ArgView) -> int:
    """Elements a flat buffer needs for every element of view `v` (a strided input's last
    element may lie past its element count)."""
    if 0 in v.shape:
        return 0
    return v.offset + sum((n - 1) * st for n, st in zip(v.shape, v.strides) if st > 0) + 1


def strided_array(flat: np.ndarray, v: ArgView) -> np.ndarray:
    """View `v` (element strides, offset) of the flat array `flat` of a GM argument, in place."""
    size = flat.dtype.itemsize
    return np.lib.stride_tricks.as_strided(flat[v.offset :], v.shape,
                                           tuple(st * size for st in v.strides))  # fmt: skip


def dry_run(prog: isa.Program, ir: CustomKernel) -> None:
    """Step block 0 of `prog` through the interpreter on zero-filled arguments: a pipe race
    (`races.RaceError`), an unpaired flag (`interp.FlagError`) or an out-of-bounds access
    (IndexError) is the author's bug whatever the data, and the native code would not see
    it. Other interpreter failures are left to the run. Skipped above
    RACE_CHECK_MAX_ELEMENTS elements of GM arguments."""
    views = (*ir.inputs, *ir.outputs)
    if sum(math.prod(v.shape) for v in views) > RACE_CHECK_MAX_ELEMENTS:
        return
    arrays = [np.zeros(max(math.prod(v.shape), _extent(v)), v.dtype) for v in views]
    if prog.workspace:  # the GM workspace argument, raw bytes as a launch binds it
        arrays.append(np.zeros(prog.workspace, np.uint8))
    try:
        interp.run(prog, arrays, 0, max(prog.device_blocks or prog.blocks, 1))
    except (races.RaceError, interp.FlagError, IndexError) as e:
        raise type(e)(
            f"{e} [found when the kernel was built: its block 0 stepped through the ISA "
            "interpreter on zeros; lm.kernel(check=False) skips this check]"
        ) from None
    except Exception:  # noqa: BLE001 - e.g. an op the interpreter lacks: the run will say
        pass


def build_program(name: str, unit: str, fn, tiling, ir: CustomKernel, spec,
                  extra_params: dict | None = None, check: bool = True) -> isa.Program:  # fmt: skip
    """Run the author's tiling hook and kernel function for `ir` on `spec`; the checked
    program (with `check`, also stepped once through the interpreter: `dry_run`)."""
    params = dict(ir.params)
    n_in = len(ir.inputs)
    names = [f"in{i}" for i in range(n_in)] + [f"out{j}" for j in range(len(ir.outputs))]
    views = (*ir.inputs, *ir.outputs)
    args = C.gm_args(views, names)
    gts = [GlobalTensor(b, v.shape, v.strides, v.offset) for b, v in zip(args, views)]
    tiles: dict = {}
    if tiling is not None:
        try:
            tiles = tiling(spec, *gts, **params)
        except KernelDefinitionError:
            raise
        except Exception as e:
            raise KernelDefinitionError(
                f"kernel {name}: its tiling function raised {type(e).__name__}: {e}"
            ) from e
        if not isinstance(tiles, dict):
            raise KernelDefinitionError(
                f"kernel {name}: the tiling function must return a dict of keyword arguments "
                f"for the kernel, got {type(tiles).__name__}"
            )
    tiles = dict(tiles)
    blocks = tiles.pop("blocks", 1)
    if isinstance(blocks, np.integer):
        blocks = int(blocks)
    if not isinstance(blocks, int) or blocks < 1:
        raise KernelDefinitionError(f"kernel {name}: blocks must be an int >= 1, got {blocks!r}")
    k = KernelBuilder(name, unit, spec, {**params, **tiles})
    k.epilogue_expr, k.epilogue_result = ir.epilogue, ir.epilogue_result
    k.ws_arg = len(args)
    fn(k, *gts, **params, **tiles, **(extra_params or {}))
    if ir.epilogue and not k.epilogue_calls:
        raise KernelDefinitionError(
            f"kernel {name} is defined with epilogue=True but never calls k.epilogue(tile, n): "
            "the fused consumers would be lost"
        )
    # the program asks the device for `blocks`; how many host threads run them is the host
    # mapping's choice (compile.host_blocks), as for the templates
    prog = isa.Program(name, (*args, *k.ws_buffers), tuple(k.buffers), tuple(k.body), blocks,
                       blocks, unit, k.workspace)  # fmt: skip
    prog.check(spec)
    if check:
        dry_run(prog, ir)
    return prog


def build(ir: CustomKernel, spec, name: str) -> isa.Program:
    """The template entry (`backend.compile.TEMPLATES["custom"]`)."""
    return custom.get(ir.key).build(ir, spec, name)
