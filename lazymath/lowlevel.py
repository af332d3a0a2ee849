"""The low-level API: write an NPU kernel in Python and use it as a lazy op (`lm.kernel`).

    @lm.kernel(unit="vector", tiling=my_tiling, reference=np_gelu)
    def gelu(k, x, y, *, tile):          # k: KernelBuilder, x/y: GlobalTensor (GM)
        buf = k.ub(x.dtype, tile)         # declare UB buffers
        with k.loop(lm.lowlevel.ceil_div(x.size, tile)) as t: ...  # movers, vector ops, flags
    y = gelu(lazy_x)                      # records a graph node; fused around, cached, costed

See docs/custom_kernels.md for the whole surface and a tutorial. A kernel is a `Kernel`
object: calling it on tensors records one `custom` graph node (the op registry's
`Op.CUSTOM`; its arg is the kernel key, which hashes the source of the kernel, tiling and shape
functions, plus the call's keyword parameters). The fusion planner treats it as a boundary
(or fuses elementwise consumers into its epilogue slot, `epilogue=True`), and the rest of the
stack (program and disk caches, `lm.schedule`/`lm.explain`, the profiler, the
HTML report, LAZYMATH_VALIDATE, the llvm and interp backends, the cycle model) handles it like
any built-in kernel. Also here: `Context` and `ascendcl_names()` (the runtime layer with its
AscendCL names), `pipe_timeline` (a kernel's simulated per-pipe timeline as text).
"""

from __future__ import annotations

import hashlib
import inspect
import math

import numpy as np

from lazymath import runtime as rt
from lazymath.backend.compile import compile_kernel
from lazymath.backend.npu import isa
from lazymath.backend.npu.cost import estimate
from lazymath.backend.npu.ir_reference import eval_expr
from lazymath.backend.npu.kernel_ir import CustomKernel, contiguous_view
from lazymath.backend.npu.userkernel import (
    UNITS,
    GlobalTensor,
    KernelBuilder,
    KernelDefinitionError,
    LocalTensor,
    build_program,
    check_dtype,
)
from lazymath.functions import tensor
from lazymath.graph import custom
from lazymath.graph import node as gn
from lazymath.runtime import api, current_device, init_device, set_device
from lazymath.runtime.device import get_spec
from lazymath.runtime.stream import Event, Stream
from lazymath.tensor import Tensor

__all__ = [
    "kernel",
    "Kernel",
    "KernelBuilder",
    "GlobalTensor",
    "LocalTensor",
    "KernelDefinitionError",
    "ceil_div",
    "pipe_timeline",
    "Context",
    "ascendcl_names",
]

BufferOverflowError = isa.BufferOverflowError


def ceil_div(a, b):
    """ceil(a / b) for b > 0, on ints or kernel integer expressions (AscendC tile counts)."""
    return isa.ceildiv(a, b)


def _source(fn) -> str:
    if fn is None:
        return ""
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        if code is None:
            return repr(fn)
        return repr((code.co_code, code.co_consts, code.co_names))


_PLAIN = (int, float, str, bytes, bool, type(None), np.generic)


def _plain(v) -> str | None:
    """repr of a constant a kernel may read (numbers, strings, tuples of them), else None."""
    if isinstance(v, _PLAIN):
        return repr(v)
    if isinstance(v, tuple) and all(isinstance(x, _PLAIN) for x in v):
        return repr(v)
    return None


def _names(code) -> set[str]:
    out = set(code.co_names)
    for c in code.co_consts:
        if inspect.iscode(c):
            out |= _names(c)
    return out


def identity(fn, _seen: set | None = None) -> str:
    """What a kernel's cache key hashes for one function: its source, its defaults and closure
    values, and (one module deep, recursively) the source of the functions and the values of
    the constants it reads from its module's globals. Editing any of these gives a new key;
    objects that are neither functions nor plain constants are not followed."""
    if fn is None:
        return ""
    seen = set() if _seen is None else _seen
    if id(fn) in seen:
        return ""
    seen.add(id(fn))
    parts = [_source(fn), repr(getattr(fn, "__defaults__", None))]
    kw = getattr(fn, "__kwdefaults__", None)
    parts.append(repr(sorted(kw.items())) if kw else "")
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            v = cell.cell_contents
        except ValueError:
            continue
        parts.append(identity(v, seen) if inspect.isfunction(v) else (_plain(v) or "?"))
    code, g = getattr(fn, "__code__", None), getattr(fn, "__globals__", {})
    mod = getattr(fn, "__module__", None)
    for name in sorted(_names(code)) if code is not None else ():
        v = g.get(name)
        if inspect.isfunction(v) and v.__module__ == mod:
            parts.append(f"{name}=" + identity(v, seen))
        elif (p := _plain(v)) is not None:
            parts.append(f"{name}={p}")
    return "\0".join(parts)


class _Spec:
    """What a shape function receives per input: `shape`, `dtype`, `ndim`, `size`."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)

    ndim = property(lambda self: len(self.shape))
    size = property(lambda self: math.prod(self.shape))

    def __repr__(self) -> str:
        return f"<{self.dtype.name}{list(self.shape)}>"


class Kernel:
    """A user kernel (made by `lm.kernel`). Call it on tensors to record a lazy op; `program`,
    `compile` and `cost` look at what it builds for given shapes."""

    def __init__(self, fn, unit: str, outputs, tiling, reference, flops, name: str | None,
                 rtol: float | None, atol: float | None, epilogue: bool = False,
                 check: bool = True):  # fmt: skip
        if not callable(fn):
            raise KernelDefinitionError(f"lm.kernel decorates a function, got {fn!r}")
        if unit not in UNITS:
            raise KernelDefinitionError(
                f"kernel {fn.__name__}: unit must be one of {', '.join(UNITS)}, got {unit!r}"
            )
        for what, f in (("outputs", outputs), ("tiling", tiling), ("reference", reference),
                        ("flops", flops)):  # fmt: skip
            if f is not None and not callable(f):
                raise KernelDefinitionError(
                    f"kernel {fn.__name__}: {what}= takes a function, got {type(f).__name__}"
                )
        params = list(inspect.signature(fn).parameters.values())
        if not params:
            raise KernelDefinitionError(
                f"kernel {fn.__name__}: the function takes the builder first: def "
                f"{fn.__name__}(k, x, ..., out)"
            )
        self.fn = fn
        self.unit = unit
        self.shape_fn = outputs
        self.tiling = tiling
        self.reference = reference
        self.flops = flops
        self.name = name or fn.__name__
        self.rtol, self.atol = rtol, atol
        self.epilogue = bool(epilogue)
        self.check_build = bool(check)
        self.__doc__ = fn.__doc__
        self.__name__ = self.name
        self.__wrapped__ = fn
        positional = [p for p in params[1:]
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]  # fmt: skip
        self.n_args = None if any(p.kind == p.VAR_POSITIONAL for p in params) else len(positional)
        blob = "\1".join([unit, self.name, identity(fn), identity(tiling), identity(outputs),
                          "epilogue" if epilogue else ""])  # fmt: skip
        digest = hashlib.sha256(blob.encode()).hexdigest()[:16]
        self.key = f"{fn.__module__}.{fn.__qualname__}:{digest}"
        custom.register(self.key, self)

    def __repr__(self) -> str:
        return f"<lazymath kernel {self.name} unit={self.unit} key={self.key}>"

    # ------------------------------------------------------------ the lazy op
    def output_specs(self, inputs, params: dict) -> tuple[list, bool]:
        """([(shape, dtype), ...] of the outputs, several?) for inputs with these
        shapes/dtypes: the shape function's answer, or the first input's shape and dtype.
        The shape function returns ``(shape, dtype)`` for one output or a list of such pairs
        for several."""
        specs = [_Spec(x.shape, x.dtype) for x in inputs]
        if self.shape_fn is None:
            if not specs:
                raise KernelDefinitionError(
                    f"kernel {self.name}: no inputs, so it needs outputs=(a shape function)"
                )
            return [(specs[0].shape, specs[0].dtype)], False
        try:
            out = self.shape_fn(*specs, **params)
        except Exception as e:
            raise KernelDefinitionError(
                f"kernel {self.name}: its shape function raised {type(e).__name__}: {e} "
                f"(inputs {specs}, params {params})"
            ) from e
        multi = (isinstance(out, (tuple, list)) and len(out) > 0
                 and isinstance(out[0], (tuple, list)) and len(out[0]) == 2
                 and isinstance(out[0][0], (tuple, list)))  # fmt: skip
        return [self._one_spec(o) for o in (out if multi else [out])], multi

    def _one_spec(self, out) -> tuple[tuple[int, ...], np.dtype]:
        ok = isinstance(out, (tuple, list)) and len(out) == 2
        shape = out[0] if ok else None
        ok = ok and isinstance(shape, (tuple, list))
        ok = ok and all(isinstance(d, (int, np.integer)) and d >= 0 for d in shape)
        if not ok:
            raise KernelDefinitionError(
                f"kernel {self.name}: the shape function must return (shape, dtype) with a "
                f"tuple of non-negative ints, or a list of such pairs, got {out!r}"
            )
        dtype = check_dtype(out[1], f"kernel {self.name}: output")
        return tuple(int(d) for d in shape), np.dtype(dtype)

    def output_spec(self, inputs, params: dict) -> tuple[tuple[int, ...], np.dtype]:
        """(shape, dtype) of the (first) output."""
        return self.output_specs(inputs, params)[0][0]

    def _check_arity(self, n_in: int, n_out: int) -> None:
        if self.n_args is not None and n_in + n_out != self.n_args:
            raise TypeError(
                f"kernel {self.name} takes {self.n_args - n_out} input(s) (its function has "
                f"{self.n_args} GM arguments including {n_out} output(s)), got {n_in}"
            )

    def __call__(self, *inputs, **params):
        """Record the kernel on lazy tensors (arrays are converted); returns its output, or a
        tuple of outputs when the shape function declares several."""
        if self.shape_fn is None:
            self._check_arity(len(inputs), 1)
        ts = [x if isinstance(x, Tensor) else tensor(x) for x in inputs]
        for i, t in enumerate(ts):
            check_dtype(t.dtype, f"kernel {self.name}: input {i}")
        for k, v in params.items():
            try:
                hash(v)
            except TypeError:
                raise TypeError(
                    f"kernel {self.name}: parameter {k}={v!r} must be hashable (an int, float, "
                    "str or tuple): it is part of the kernel's cache key"
                ) from None
        outs, multi = self.output_specs(ts, params)
        self._check_arity(len(ts), len(outs))
        if multi and self.epilogue:
            raise KernelDefinitionError(
                f"kernel {self.name}: an epilogue slot needs a single output"
            )
        p = tuple(sorted(params.items()))
        srcs = tuple(t._node for t in ts)
        dev = ts[0]._device if ts else None
        if not multi:
            shape, dtype = outs[0]
            return Tensor(gn.make("custom", dtype, shape, srcs, (self.key, p)), dev)
        return tuple(Tensor(gn.make("custom", dt, sh, srcs, (self.key, p, j)), dev)
                     for j, (sh, dt) in enumerate(outs))  # fmt: skip

    def output_nodes(self, node) -> tuple:
        """Every output node of the multi-output call `node` belongs to (the planner writes
        them all: one launch computes them together)."""
        outs, _ = self.output_specs(node.srcs, dict(node.arg[1]))
        key, p = node.arg[0], node.arg[1]
        return tuple(gn.make("custom", dt, sh, node.srcs, (key, p, j), loc=node.loc)
                     for j, (sh, dt) in enumerate(outs))  # fmt: skip

    # ------------------------------------------------------------ what the layers call
    def ir(self, inputs, params: dict | None = None) -> CustomKernel:
        """The kernel IR for inputs with these shapes/dtypes (objects with .shape/.dtype)."""
        params = dict(params or {})
        outs, _ = self.output_specs(inputs, params)
        views = tuple(contiguous_view(np.dtype(x.dtype).name, tuple(x.shape)) for x in inputs)
        out = tuple(contiguous_view(dt.name, sh) for sh, dt in outs)
        return CustomKernel(self.key, self.name, self.unit, views, out,
                            tuple(sorted(params.items())))  # fmt: skip

    def build(self, ir: CustomKernel, spec, name: str) -> isa.Program:
        """The checked ISA program for `ir` on `spec` (the backend template calls this)."""
        return build_program(name, self.unit, self.fn, self.tiling, ir, spec,
                             check=self.check_build)  # fmt: skip

    def flop_count(self, ir: CustomKernel) -> int:
        if self.flops is None:
            return 0
        ins = [_Spec(v.shape, v.dtype) for v in ir.inputs]
        return int(self.flops(*ins, **dict(ir.params)))

    def _reference_outputs(self, srcs, params: dict, n_out: int) -> list:
        out = self.reference(*srcs, **params)
        if n_out > 1:
            if not isinstance(out, (tuple, list)) or len(out) != n_out:
                raise ValueError(
                    f"kernel {self.name}: the reference must return {n_out} arrays (one per "
                    f"output), got {type(out).__name__}"
                )
            return [np.asarray(o) for o in out]
        return [np.asarray(out)]

    def evaluate(self, srcs, arg, dtype, shape) -> np.ndarray:
        """The reference executor's value of one output of one call (`arg` is the node's):
        the author's numpy reference, or the kernel's own program on the ISA interpreter."""
        params = dict(arg[1])
        j = arg[2] if len(arg) > 2 else 0
        ir = self.ir([_Spec(s.shape, s.dtype) for s in srcs], params)
        if self.reference is not None:
            out = self._reference_outputs(srcs, params, len(ir.outputs))[j]
            if out.shape != tuple(shape):
                raise ValueError(
                    f"kernel {self.name}: the reference returned shape {out.shape} for output "
                    f"{j}, the shape function says {tuple(shape)}"
                )
            return out.astype(dtype, copy=False)
        arrays = [np.ascontiguousarray(s).reshape(-1) for s in srcs]
        outs = [np.zeros(math.prod(v.shape), v.dtype) for v in ir.outputs]
        self._interp_run(ir, arrays + outs)
        return outs[j].reshape(shape)

    def reference_run(self, ir: CustomKernel, arrays) -> None:
        """The IR oracle (LAZYMATH_VALIDATE, the irref backend): write the outputs into the
        flat `arrays` (kernel_args order) from the numpy reference (or the interpreter). The
        program is always stepped through the interpreter too, so a missing pipe flag is a
        `RaceError` under LAZYMATH_VALIDATE whatever the backend."""
        n_in = len(ir.inputs)
        if self.reference is None:
            self._interp_run(ir, list(arrays))
            return
        self._interp_run(ir, [np.array(a, copy=True) for a in arrays])  # the race check
        srcs = [a.reshape(-1)[: math.prod(v.shape)].reshape(v.shape)
                for a, v in zip(arrays, ir.inputs)]  # fmt: skip
        outs = self._reference_outputs(srcs, dict(ir.params), len(ir.outputs))
        for j, (out, v) in enumerate(zip(outs, ir.outputs)):
            if ir.epilogue:  # the consumers fused into the epilogue slot
                acc = out.astype(v.dtype, copy=False).reshape(v.shape)
                out = eval_expr(ir.epilogue, [], v.shape, acc)[ir.epilogue_result]
            arrays[n_in + j].reshape(-1)[: math.prod(v.shape)] = np.broadcast_to(
                np.asarray(out).astype(v.dtype, copy=False), v.shape
            ).reshape(-1)

    def _interp_run(self, ir: CustomKernel, arrays) -> None:
        ck = compile_kernel(ir, current_device().spec, "interp", self.name)
        ck(*arrays)

    # ------------------------------------------------------------ looking at it
    def _shapes(self, inputs):
        out = []
        for x in inputs:
            if isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], tuple):
                out.append(_Spec(*x))
            else:
                out.append(x if hasattr(x, "shape") and hasattr(x, "dtype") else np.asarray(x))
        return out

    def program(self, *inputs, spec="ascend910", **params) -> isa.Program:
        """The ISA program for inputs like these (arrays, tensors or (shape, dtype) pairs)."""
        ir = self.ir(self._shapes(inputs), params)
        return self.build(ir, get_spec(spec), self.name)

    def compile(self, *inputs, spec=None, backend: str | None = None, **params):
        """The `CompiledKernel` for inputs like these (arrays, tensors or (shape, dtype)
        pairs) through the kernel caches: `ck(*flat_arrays)` runs it, `ck.cost` is its
        simulated cycles per pipe, `ck.isa_text` / `ck.llvm_ir` / `ck.asm` its code. Launch
        it on a stream with `lm.launch` / `Device.launch`."""
        spec = current_device().spec if spec is None else get_spec(spec)
        ir = self.ir(self._shapes(inputs), params)
        return compile_kernel(ir, spec, backend, self.name)

    def launch(self, *arrays, stream=None, blocks: int | None = None, backend: str | None = None,
               **params) -> np.ndarray:  # fmt: skip
        """Compile for these arrays (numpy, C order) on the current device and enqueue one
        launch on `stream` (aclrtLaunchKernel; default: the device's default stream) with
        `blocks` blocks (default: the host mapping of the kernel's own count). Returns the
        output array, valid once the stream is synchronized; work queued on the stream before
        (an event wait, a memcpy) runs first."""
        arrays = [np.ascontiguousarray(a) for a in arrays]
        dev = stream.device if stream is not None else current_device()
        ck = self.compile(*arrays, spec=dev.spec, backend=backend, **params)
        outs = [np.empty(v.shape, v.dtype) for v in ck.ir.outputs]
        flat = [a.reshape(-1) for a in arrays] + [o.reshape(-1) for o in outs]
        dev.launch(ck, blocks, flat, stream, unit=self.unit)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def check(self, *arrays, spec=None, **params):
        """Step the kernel through the ISA interpreter on these arrays (exact; every pipe
        hazard without a flag raises `RaceError`, unpaired flags raise too) and compare with
        the numpy reference when there is one (AssertionError naming the output and the first
        differing index). Returns the outputs (a tuple when there are several)."""
        spec = current_device().spec if spec is None else get_spec(spec)
        arrays = [np.ascontiguousarray(a) for a in arrays]
        ck = compile_kernel(self.ir(arrays, params), spec, "interp", self.name)
        outs = [np.zeros(v.shape, v.dtype) for v in ck.ir.outputs]
        ck(*[a.reshape(-1) for a in arrays], *[o.reshape(-1) for o in outs])
        if self.reference is not None:
            want = self._reference_outputs(arrays, params, len(outs))
            for j, (g, w) in enumerate(zip(outs, want)):
                w = np.broadcast_to(np.asarray(w).astype(g.dtype), g.shape)
                tol = 2e-2 if g.dtype == np.float16 else 1e-4
                rtol = tol if self.rtol is None else self.rtol
                atol = tol if self.atol is None else self.atol
                close = (np.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
                         if g.dtype.kind in "fc" else g == w)  # fmt: skip
                if not np.all(close):
                    i = int(np.argmin(np.asarray(close).reshape(-1)))
                    raise AssertionError(
                        f"kernel {self.name}: output {j} differs from the reference at flat "
                        f"index {i}: got {g.reshape(-1)[i]!r}, expected {w.reshape(-1)[i]!r}"
                    )
        return outs[0] if len(outs) == 1 else tuple(outs)

    def cost(self, *inputs, spec="ascend910", **params):
        """Simulated NPU cycles per pipe (`cost.KernelCost`) for inputs like these."""
        spec = get_spec(spec)
        return estimate(self.program(*inputs, spec=spec, **params), spec)


class Context:
    """aclrtCreateContext: a device made current for a block of code (``with ctx:``), the
    previous one restored after it. Lazy tensors created inside run on its device; `device`
    holds its streams, events, memory pool and launches (the runtime layer, `lm.runtime`)."""

    def __init__(self, device_id: int = 0, spec="ascend910", **device_kwargs):
        prev = _current_or_none()
        self.device = init_device(device_id, spec, **device_kwargs)
        _restore(prev)
        self._saved: list = []

    def __enter__(self):
        self._saved.append(_current_or_none())
        set_device(self.device)
        return self

    def __exit__(self, *exc) -> None:
        _restore(self._saved.pop())

    def synchronize(self) -> None:
        """aclrtSynchronizeDevice on this context's device."""
        self.device.synchronize()

    def __repr__(self) -> str:
        return f"<lazymath Context {self.device} {self.device.spec.name}>"


def _current_or_none():
    return api._CURRENT


def _restore(dev) -> None:
    api._CURRENT = dev


def _acl_table() -> dict:
    return {
        "aclInit / aclrtSetDevice": rt.init_device,
        "aclrtGetDevice": rt.current_device,
        "aclrtResetDevice": rt.Device.close,
        "aclrtCreateContext / aclrtSetCurrentContext": Context,
        "aclrtCreateStream": rt.create_stream,
        "aclrtSynchronizeStream": Stream.synchronize,
        "aclrtStreamWaitEvent": Stream.wait_event,
        "aclrtCreateEvent": rt.create_event,
        "aclrtRecordEvent": Event.record,
        "aclrtSynchronizeEvent": Event.synchronize,
        "aclrtQueryEvent": Event.query,
        "aclrtEventElapsedTime": rt.elapsed_time,
        "aclrtSynchronizeDevice": rt.synchronize,
        "aclrtMalloc": rt.malloc,
        "aclrtFree": rt.free,
        "aclrtMemcpy (host to device)": rt.memcpy_h2d,
        "aclrtMemcpy (device to host)": rt.memcpy_d2h,
        "aclrtMemcpyAsync": rt.memcpy_async,
        "aclrtLaunchKernel": rt.launch,
        "aclrtLaunchKernel (compile + launch a user kernel)": Kernel.launch,
    }


def ascendcl_names() -> dict:
    """AscendCL call -> the lazymath function or method that mirrors it (the low-level runtime
    layer; docs/custom_kernels.md has the table)."""
    return _acl_table()


def pipe_timeline(cost, width: int = 64) -> str:
    """The simulated per-pipe timeline of one kernel block (`Kernel.cost`, `CompiledKernel.cost`)
    as text: one row per pipe, ``#`` where the pipe is busy, over the block's makespan (a MIX
    kernel's pipes per core: "AIC.Cube", "AIV.Vector", ...)."""
    total = max(float(cost.total), 1.0)
    order = [p for p in isa.PIPES if cost.intervals.get(p)]
    order += [p for p in cost.intervals if p not in isa.PIPES and cost.intervals[p]]
    wid = max(8, *(len(p) for p in order)) if order else 8
    lines = [f"{cost.name}: {cost.total:,.0f} cycles per block, {cost.blocks} block(s)"]
    for p in order:
        row = [" "] * width
        for a, b in cost.intervals[p]:
            lo = min(width - 1, int(a / total * width))
            hi = max(lo + 1, min(width, int(round(b / total * width))))
            for i in range(lo, hi):
                row[i] = "#"
        busy = cost.pipes.get(p, 0)
        lines.append(f"  {p:{wid}}|{''.join(row)}| {busy:>10,.0f} ({100 * busy / total:4.1f}%)")
    if getattr(cost, "truncated", False):
        lines.append("  (long loop: the middle iterations are summarised)")
    return "\n".join(lines)


def kernel(fn=None, *, unit: str = "vector", outputs=None, tiling=None, reference=None,
           flops=None, name: str | None = None, rtol: float | None = None,
           atol: float | None = None, epilogue: bool = False, check: bool = True):  # fmt: skip
    """Define an NPU kernel in Python; the result is a lazy op (`Kernel`).

    The decorated function is ``fn(k, *inputs, out, **params_and_tiling)``: `k` is a
    `KernelBuilder`, every input and the output is a `GlobalTensor` (dense GM, C order).

    unit: "vector" (UB, movers, vector instructions) or "cube" (L1/L0A/L0B/L0C, load_nz,
        load_l0, mmad, fixpipe; plus UB on the coupled ascend910).
    outputs: shape function ``outputs(*inputs, **params) -> (shape, dtype)``; inputs have
        .shape/.dtype. Default: the first input's shape and dtype.
    tiling: ``tiling(spec, *inputs, out, **params) -> dict`` of keyword arguments for the
        kernel (tile sizes, ...); the key "blocks" sets the launch's block count (default 1).
    reference: numpy ``reference(*arrays, **params) -> array``: the reference backend and
        LAZYMATH_VALIDATE compare against it (without one they run the program on the ISA
        interpreter).
    flops: ``flops(*inputs, **params) -> int`` for the schedule's roofline class.
    check: when the program is built (once per shape, before any native code exists), step
        its block 0 through the ISA interpreter on zeros: a missing pipe flag (`RaceError`),
        an unpaired flag or an out-of-bounds access is reported then, on every backend
        (skipped above 4M GM elements; False turns it off).
    epilogue: the kernel has an epilogue slot (it calls ``k.epilogue(tile, n)`` on each output
        tile before copying it out): elementwise consumers of its result that read nothing
        else but constants fuse into it instead of running as another kernel.
    """

    def wrap(f):
        return Kernel(f, unit, outputs, tiling, reference, flops, name, rtol, atol, epilogue,
                      check)  # fmt: skip

    return wrap(fn) if fn is not None else wrap
