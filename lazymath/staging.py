"""Staged functions: `lm.jit(fn)` captures fn's graph once per input signature and replays it.

Why: every eager call of a composite re-runs its Python op code, walks the new graph and hashes
its signature before it finds the cached program (~20 us for relu(x * 2 + y) on 1,000 floats).
A jitted function does that on the first call of each signature only. Later calls with the
same signature bind the new input arrays to the stored program and launch it: no Python op
code of `fn`, no graph walk, no graph hash (the key is the small tuple of the inputs' shapes,
dtypes, strides, devices, static arguments and pytree structure).

What is part of the signature (a new value retraces; LAZYMATH_DEBUG=1 prints the reason):
  - the structure of the arguments: nested tuples, lists and dicts (keys sorted), with tensor
    or numpy array leaves (numpy arrays become tensors);
  - each tensor leaf's shape, dtype, strides and device;
  - every non-tensor leaf by value (Python scalars, None, strings: they may steer Python
    control flow in `fn`), and the arguments named by `static_argnums` (hashable);
  - the device preset, the backend and the host target in force.
A batch dimension can be symbolic (`dynamic=`, see `jit`); docs/jit.md has the whole story.
A Python scalar argument is therefore static: a new value retraces, but the retrace finds the
compiled program (scalars are runtime kernel arguments, LAZYMATH_SCALAR_ARGS), so it costs a
trace, not a compile. Pass a value that changes every step as a 0-d tensor
(`lm.asarray(np.float32(lr))`) to replay without tracing.

`fn` must be a pure function of its arguments: tensors it reads from a closure or a global are
captured as constants at the trace (a rebound global is not seen until the next retrace).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from . import engine, settings
from .graph import node as gn
from .graph.ops import ELEMENTWISE
from .graph.walk import no_view_folding, plan_outputs
from .realize import watch_realizes
from .runtime import api as _rt_api
from .runtime import profiler as _prof
from .runtime.replay import BoundReplay, Slot
from .tensor import Tensor, asarray

__all__ = ["jit", "Jitted", "Lowered"]

_DEBUG = settings.DEBUG
_BACKEND = settings.BACKEND
# The settings a stored program depends on besides the device: a cheap key of their raw values
# is part of the replay's fast key (an environment change or an override sends the call down
# the full signature, which parses them).
_KEYED = (settings.BACKEND, settings.TARGET_CPU, settings.SCALAR_ARGS, settings.HOST_MATH)
_settings_state = settings.state_key(*_KEYED)
_new_tensor = Tensor.__new__
_buffer_node = gn.buffer_node


# ----------------------------------------------------------------------------- pytrees


def _flatten(tree, leaves: list, static: list) -> Any:
    """The structure of `tree` (a hashable description); tensor leaves (numpy arrays made
    tensors) appended to `leaves`, other leaves by value into the structure."""
    t = type(tree)
    if t is Tensor:
        leaves.append(tree)
        return "T"
    if isinstance(tree, np.ndarray):
        leaves.append(asarray(tree))
        return "T"
    if t is tuple or t is list:
        return (t.__name__, tuple(_flatten(x, leaves, static) for x in tree))
    if t is dict:
        keys = sorted(tree)
        return ("dict", tuple(keys), tuple(_flatten(tree[k], leaves, static) for k in keys))
    try:
        hash(tree)
    except TypeError:
        raise TypeError(
            f"lm.jit: an argument leaf of type {t.__name__} is neither a tensor, a numpy array "
            "nor hashable (non-tensor leaves are static, part of the signature by value)"
        ) from None
    static.append(tree)
    return ("S", t.__name__, tree)


def _unflatten(struct, leaves) -> Any:
    """Rebuild the tree described by `struct` from an iterator of tensor leaves."""
    if struct == "T":
        return next(leaves)
    kind = struct[0]
    if kind == "S":
        return struct[2]
    if kind == "tuple":
        return tuple(_unflatten(s, leaves) for s in struct[1])
    if kind == "list":
        return [_unflatten(s, leaves) for s in struct[1]]
    return {k: _unflatten(s, leaves) for k, s in zip(struct[1], struct[2])}


def _leaf_sig(t: Tensor) -> tuple:
    """What of an input tensor the compiled program depends on (the data's layout, never its
    values); the tensor must be realized."""
    a = t._node.realized
    return (a.shape, a.dtype, a.strides, t._device)


# ----------------------------------------------------------------------------- the stored stage


class _Entry:
    """One traced signature: the program and how to bind the inputs and build the outputs."""

    __slots__ = ("prog", "leaf_src", "fixed", "outs", "out_struct", "long", "checks", "traced",
                 "bound", "single")  # fmt: skip

    def __init__(self, prog, leaf_src, fixed, outs, out_struct, checks):
        self.prog = prog
        self.leaf_src = leaf_src  # per program leaf: input index, or -1 (a fixed array)
        self.fixed = fixed  # per program leaf: the captured array (constants, closures)
        # per output leaf: (-1, j, loc, device, (shape, dtype) or None) for program output j
        # (the pair when the result must be reshaped/cast), or (k, ...) for call input k
        self.outs = outs
        self.out_struct = out_struct
        self.single = out_struct == "T"  # fn returned one tensor: no pytree to rebuild
        self.long = engine._program_work(prog) >= engine.LONG_WORK
        self.checks = checks  # (input index, bytes): 0-d inputs folded into the kernels
        self.traced = 1
        # the fast launch (runtime.replay.BoundReplay), None when the program does not qualify
        self.bound = None if self.long else BoundReplay.make(prog, leaf_src, fixed)


class Jitted:
    """A staged function (see the module docstring); call it like `fn`."""

    def __init__(self, fn: Callable, static_argnums=(), donate=(), dynamic=None, chunk=None):
        if not callable(fn):
            raise TypeError(f"lm.jit: expected a callable, got {type(fn).__name__}")
        if dynamic not in (None, False, 0) or dynamic is True:
            raise ValueError(f"lm.jit: dynamic must be None (automatic: after a second size "
                             f"of the leading dim), 0 (the leading dim from the first call) "
                             f"or False (a program per size), got {dynamic!r}")  # fmt: skip
        if chunk is not None and (not isinstance(chunk, int) or chunk < 1):
            raise ValueError(f"lm.jit: chunk must be a positive int, got {chunk!r}")
        self.dynamic = dynamic
        self.chunk = chunk
        self._dyn_inputs: tuple[int, ...] | None = None  # dynamic=0: fixed at the first call
        # masked signature (batched inputs' leading dims removed) -> _Dynamic, or None when
        # the function was found not to keep batch rows apart (then: a program per size)
        self._dyn: dict = {}
        self.fn = fn
        self.static_argnums = _argnums(static_argnums, "static_argnums")
        self.donate = _argnums(donate, "donate")
        if set(self.static_argnums) & set(self.donate):
            raise ValueError("lm.jit: an argument cannot be both static and donated")
        self._entries: dict = {}
        # calls whose arguments are all realized tensors (no kwargs, no static arguments) look
        # their entry up here first: key = settings state, device, each input's layout
        self._fast: dict = {}
        self._flat = not self.static_argnums
        self._last_sig = None
        self.traces = 0  # how many times fn's Python code ran (first calls and retraces)
        functools.update_wrapper(self, fn)

    # -- signature
    def _split(self, args, kwargs):
        leaves: list = []
        static: list = []
        dyn, stat = [], []
        for i, a in enumerate(args):
            if i in self.static_argnums:
                try:
                    hash(a)
                except TypeError:
                    raise TypeError(
                        f"lm.jit: static argument {i} ({type(a).__name__}) must be hashable"
                    ) from None
                stat.append((i, a))
                dyn.append(("S", "static", i))
            else:
                dyn.append(_flatten(a, leaves, static))
        kw = _flatten(kwargs, leaves, static) if kwargs else None
        for n in self.static_argnums:
            if n >= len(args):
                raise IndexError(
                    f"lm.jit: static_argnums names argument {n}, the call has {len(args)}"
                )
        return leaves, (tuple(dyn), kw, tuple(stat))

    def _signature(self, leaves, struct) -> tuple:
        pending = [t for t in leaves if t._node.realized is None]
        if pending:  # inputs computed lazily by the caller: realize them (one program)
            from .realize import realize

            realize(*pending)
        spec = engine.device_spec()
        target = (settings.TARGET_CPU.get() or "").strip()
        return (struct, tuple(_leaf_sig(t) for t in leaves), spec.key(), _BACKEND.get(),
                target, settings.SCALAR_ARGS.get(), settings.HOST_MATH.get())  # fmt: skip

    # -- calls
    def __call__(self, *args, **kwargs):
        fast_key = None
        if self._flat and not kwargs:
            # the fast key: no pytree walk, no settings parsing, no device lookup
            key = [_settings_state(), _rt_api._CURRENT]
            for a in args:
                if type(a) is not Tensor:
                    break
                r = a._node.realized
                if r is None:
                    break
                key += (r.shape, r.dtype, r.strides, a._device)
            else:
                fast_key = tuple(key)
                entry = self._fast.get(fast_key)
                if entry is not None:
                    return self._replay(entry, args)
        leaves, struct = self._split(args, kwargs)
        sig = self._signature(leaves, struct)
        entry = self._entries.get(sig)
        if entry is not None:
            for k, b in entry.checks:
                if leaves[k]._node.realized.tobytes() != b:
                    self._debug("a 0-d input folded into a kernel changed value (eager call)")
                    return self.fn(*args, **kwargs)
            if fast_key is not None and not entry.checks and fast_key[1] is not None:
                if len(self._fast) > 4 * len(self._entries) + 16:
                    self._fast.clear()  # settings changed often: old states are dead keys
                self._fast[fast_key] = entry
            return self._replay(entry, leaves)
        if self.dynamic is not False:
            out = self._dynamic_call(args, kwargs, leaves, sig)
            if out is not _NO:
                return out
        return self._trace(args, kwargs, leaves, sig)

    # -- dynamic batch
    def _batched(self, sig) -> tuple[int, ...]:
        """The inputs whose leading dim is the batch for this call's signature: with
        dynamic=0 those sharing the first tensor input's leading size; automatically, those
        whose leading dim alone changed from a signature seen before (all from the same old
        size to the same new one, everything else equal)."""
        lsig = sig[1]
        if self.dynamic == 0 and self.dynamic is not False:
            chosen = self._dyn_inputs
            if chosen is None:  # the first call decides (a later coincidence of sizes does not)
                first = next((x for x in lsig if len(x[0]) >= 1), None)
                if first is None:
                    return ()
                b = first[0][0]
                chosen = self._dyn_inputs = tuple(
                    k for k, x in enumerate(lsig) if len(x[0]) >= 1 and x[0][0] == b
                )
            if not chosen or chosen[-1] >= len(lsig):
                return ()
            if (
                any(len(lsig[k][0]) < 1 for k in chosen)
                or len({lsig[k][0][0] for k in chosen}) != 1
            ):  # (a batch of 0 rows is a batch: no `and`-chain that turns 0 into False)
                return ()  # the batched inputs no longer share a leading size
            return chosen
        for old in list(self._entries)[::-1]:
            if old[0] != sig[0] or old[2:] != sig[2:] or len(old[1]) != len(lsig):
                continue
            changed, sizes = [], set()
            for k, (x, y) in enumerate(zip(old[1], lsig)):
                if x == y:
                    continue
                if (len(x[0]) < 1 or len(x[0]) != len(y[0]) or x[0][1:] != y[0][1:]
                        or x[1] != y[1] or x[3] != y[3]):  # fmt: skip
                    break
                changed.append(k)
                sizes.add((x[0][0], y[0][0]))
            else:
                if changed and len(sizes) == 1:
                    return tuple(changed)
        return ()

    def _dynamic_call(self, args, kwargs, leaves, sig):
        batched = self._batched(sig)
        if not batched:
            return _NO
        lsig = sig[1]
        size = lsig[batched[0]][0][0]
        masked = list(lsig)
        for k in batched:
            shape, dtype, _strides, device = lsig[k]
            masked[k] = (("batch",) + shape[1:], dtype, device)
        dkey = (sig[0], tuple(masked), batched) + sig[2:]
        if dkey in self._dyn:
            dyn = self._dyn[dkey]
        else:
            dyn = self._dyn[dkey] = self._dynamic_trace(args, kwargs, leaves, sig, batched, size)
        if dyn is None:
            return _NO
        return dyn.run(leaves, size)

    def _dynamic_trace(self, args, kwargs, leaves, sig, batched, size):
        """Trace fn at `chunk` rows and check the graph keeps batch rows apart: the _Dynamic
        that runs any batch chunk by chunk, or None (why: LAZYMATH_DEBUG=1)."""
        chunk = self.chunk or max(64, min(512, 1 << max(0, size - 1).bit_length()))
        chunk_leaves = list(leaves)
        for k in batched:
            a = leaves[k]._node.realized
            chunk_leaves[k] = Tensor(gn.buffer_node(_rows(a, 0, chunk)), leaves[k]._device)
        what = (f"dynamic batch: inputs {list(batched)} leading dim now {size}: tracing one "
                f"program at {chunk} rows")  # fmt: skip

        def analyze(roots, fresh, out_leaves):
            axes = batch_axes(roots, {id(fresh[k]._node): 0 for k in batched}, chunk)
            for i, t in enumerate(out_leaves):
                a = axes.get(id(t._node))
                if a != 0 or t.shape[0] != chunk:
                    raise NotBatched(f"output {i} {t.shape} does not carry the batch on its "
                                     "leading axis")  # fmt: skip

        try:
            _out, entry = self._trace_entry(args, kwargs, chunk_leaves, sig, analyze, what)
        except NotBatched as e:
            self._debug(f"not a dynamic batch ({e}): a program per size")
            return None
        except Exception as e:  # noqa: BLE001 - fn fails at chunk rows: the real size decides
            self._debug(f"not a dynamic batch (fn at {chunk} rows raised {e!r}): a program per "
                        "size")  # fmt: skip
            return None
        if entry is None or any(o[4] is not None for o in entry.outs):
            self._debug("not a dynamic batch (no stored program): a program per size")
            return None
        shapes = {k: chunk_leaves[k]._node.realized.shape for k in batched}
        try:
            rows = _RuntimeRows.make(entry, shapes, chunk, len(leaves))
        except NotBatched as e:  # a kernel that cannot take its rows at run time: host chunks
            self._debug(f"dynamic batch by host chunks of {chunk} rows ({e})")
            rows = None
        else:
            self._debug(f"dynamic batch: one program for up to {chunk} rows per launch, the "
                        "row count a kernel argument")  # fmt: skip
        return _Dynamic(entry, batched, chunk, rows)

    def _replay(self, entry: _Entry, leaves):
        bound = entry.bound
        if bound is not None and _prof._ACTIVE is None:
            results = bound([t._node for t in leaves], _rt_api._CURRENT or _rt_api.current_device())
        else:
            data = [leaves[k]._node.realized if k >= 0 else f
                    for k, f in zip(entry.leaf_src, entry.fixed)]  # fmt: skip
            if entry.long:
                results = engine._run_program(entry.prog, _Leaves(data), False, True)
            else:
                results = entry.prog.run(data, True)
        return _wrap(entry, leaves, results)

    def _trace(self, args, kwargs, leaves, sig):
        out, entry = self._trace_entry(args, kwargs, leaves, sig)
        if entry is not None:
            self._entries[sig] = entry
        return out

    def _trace_entry(self, args, kwargs, leaves, sig, analyze=None, what=""):
        """Run fn on fresh handles of `leaves` and compile its graph: (its outputs, the entry
        or None). `analyze(roots, fresh, out_leaves)` runs on the graph before it is compiled
        (the dynamic batch's check; NotBatched propagates)."""
        t0 = time.perf_counter()
        reason = what or self._retrace_reason(sig)
        self.traces += 1
        # fresh handles over the realized input arrays: the program's leaves are found by
        # node identity, and a caller's tensor may share its node with other tensors
        fresh = [Tensor(gn.buffer_node(t._node.realized), t._device) for t in leaves]
        it = iter(fresh)
        call_args = []
        for i, a in enumerate(args):
            call_args.append(a if i in self.static_argnums else _rebuild(a, it))
        call_kwargs = _rebuild(kwargs, it) if kwargs else {}
        in_pos = {id(t._node): k for k, t in enumerate(fresh)}
        reads: list = []  # realizes inside fn of values computed from its inputs

        def watch(realized_roots):
            if not reads and any(id(n) in in_pos for n in gn.toposort(realized_roots)):
                reads.append(realized_roots)

        with no_view_folding(), watch_realizes(watch):
            # a realize inside fn must not turn views of inputs to leaves
            out = self.fn(*call_args, **call_kwargs)
        out_leaves: list = []
        out_struct = _flatten(out, out_leaves, [])
        roots = list(dict.fromkeys(t._node for t in out_leaves if t._node.realized is None))
        if analyze is not None:
            analyze(roots, fresh, out_leaves)
        entry = None
        if reads:
            # fn read values of its inputs while traced (`float(x.sum())` in an `if`, a host
            # gather such as lm.take, .numpy()): a replay would reuse this call's values
            self._debug("not replayed: fn reads values of its inputs (control flow, .numpy(), "
                        "or a host op such as lm.take); every call runs fn")  # fmt: skip
            if roots:
                from .realize import realize

                realize(*out_leaves)
        elif roots and _BACKEND.get() != "reference":
            with no_view_folding():  # the program's leaves must be the traced inputs
                entry = self._compile(roots, in_pos, out_leaves, out_struct, fresh)
        else:
            from .realize import realize

            realize(*out_leaves)
        self._last_sig = sig
        self._debug(f"{reason}: traced in {(time.perf_counter() - t0) * 1e3:.1f} ms")
        return out, entry  # out computed by the trace's realize

    def _compile(self, roots, in_pos, out_leaves, out_struct, fresh) -> _Entry | None:
        spec = engine.device_spec()
        backend = _BACKEND.get()
        outputs, key, leaves, _order = plan_outputs(roots)
        engine.run_compiled(roots, backend)  # compiles (or finds) and runs the program once
        full_key = engine.program_key(key, spec, backend)
        prog = engine.PROGRAMS.get(full_key)
        if prog is not None and prog.folded:
            values = engine._leaf_values(leaves, prog.folded)
            if values != prog.folded_values:
                prog = engine.PROGRAMS.get(full_key + (values,))
        if prog is None:  # evicted at once (a tiny LAZYMATH_PROGRAM_CACHE_LIMIT): eager calls
            return None
        leaf_src = [in_pos.get(id(n), -1) for n in leaves]
        fixed = [None if k >= 0 else n.realized for k, n in zip(leaf_src, leaves)]
        checks = tuple((leaf_src[i], leaves[i].realized.tobytes()) for i in prog.folded
                       if leaf_src[i] >= 0)  # fmt: skip
        out_index = {id(n): j for j, n in enumerate(outputs)}
        out_slots = [prog.slots[s] for s in prog.outputs]
        outs = []
        for t in out_leaves:
            n = t._node
            if id(n) in out_index:
                j = out_index[id(n)]
                s = out_slots[j]
                conv = None if (s.shape, s.dtype) == (n.shape, n.dtype) else (n.shape, n.dtype)
                # the traced node's call site: replayed outputs skip the frame walk (~2 us)
                outs.append((-1, j, n._loc, t._device, conv))
            elif id(n) in in_pos:
                outs.append((in_pos[id(n)], -1, None, None, None))
            else:  # realized before the call (a closure tensor, a constant): a fixed output
                return None
        return _Entry(prog, leaf_src, fixed, outs, out_struct, checks)

    # -- debugging
    def _retrace_reason(self, sig) -> str:
        last = self._last_sig
        if last is None:
            return "first call"
        names = ("pytree structure or static arguments", "input shapes/dtypes/strides/devices",
                 "device preset", "backend", "host target", "LAZYMATH_SCALAR_ARGS",
                 "LAZYMATH_HOST_MATH")  # fmt: skip
        for name, a, b in zip(names, last, sig):
            if a != b:
                if name.startswith("input"):
                    for i, (x, y) in enumerate(zip(a, b)):
                        if x != y:
                            return (f"retrace: input {i} was {x[0]} {x[1]} strides {x[2]}, "
                                    f"now {y[0]} {y[1]} strides {y[2]}")  # fmt: skip
                    return f"retrace: {len(a)} tensor inputs, now {len(b)}"
                return f"retrace: new {name}"
        return "retrace: a signature seen before whose program was not kept"

    def _debug(self, msg: str) -> None:
        if _DEBUG.get() >= 1:
            name = getattr(self.fn, "__qualname__", repr(self.fn))
            print(f"[lazymath] jit {name}: {msg}", file=sys.stderr, flush=True)

    # -- staging API
    def lower(self, *args, **kwargs) -> Lowered:
        """The staged computation for these arguments, not run: `as_text()` (the fused
        schedule), `explain()` (lm.explain's report) and `cost()` (kernels, flops, bytes)."""
        leaves, struct = self._split(args, kwargs)
        self._signature(leaves, struct)
        it = iter(leaves)
        call_args = [a if i in self.static_argnums else _rebuild(a, it)
                     for i, a in enumerate(args)]  # fmt: skip
        out = self.fn(*call_args, **(_rebuild(kwargs, it) if kwargs else {}))
        out_leaves: list = []
        _flatten(out, out_leaves, [])
        return Lowered(out_leaves)

    def cache_size(self) -> int:
        """How many signatures hold a stored program."""
        return len(self._entries)


_NO = object()  # "not handled here": _dynamic_call's answer when the call is not a batch


def _rows(a: np.ndarray, start: int, n: int) -> np.ndarray:
    """Rows [start, start + n) of `a` as a C-contiguous array of exactly n rows; missing rows
    repeat the last real one (edge padding: padded rows compute on real data, so an integer
    division or a log sees nothing a real row would not)."""
    part = a[start : start + n]
    if part.shape[0] == n and part.flags.c_contiguous:
        return part
    out = np.empty((n,) + a.shape[1:], a.dtype)
    m = part.shape[0]
    out[:m] = part
    if m < n:
        out[m:] = part[m - 1] if m else 0
    return out


class _RuntimeRows:
    """The traced program with its row count a run-time kernel argument: every kernel that
    touches batch rows rebuilt as a `DynamicElementwiseKernel` (its loops, block range and
    tail tile bound by the row count it reads from one more GM argument, the tiling word),
    so one launch serves any 1..chunk rows without padding, and no kernel touches a row past
    the count (inputs and outputs are exact row views).

    `make` proves, per kernel argument, that row i of the kernel's iteration space reads or
    writes only row i of a batched buffer (its leading stride is the buffer's row size and the
    rest of the view stays inside one row) and that buffers without the batch are the same for
    every row (stride 0); a kernel of another kind (matmul, reduce, rows...) that touches a
    batched buffer raises NotBatched, and the caller keeps the host-chunked path."""

    __slots__ = ("prog", "leaf_src", "fixed", "bound", "single", "small", "tiling_input")

    def __init__(self, prog, leaf_src, fixed, small: int, tiling_input: int) -> None:
        self.prog = prog
        self.leaf_src = leaf_src
        self.fixed = fixed
        self.small = small  # batches below this many rows launch one host block per kernel
        self.tiling_input = tiling_input  # the call-input position of the tiling word
        self.bound = BoundReplay.make(prog, leaf_src, fixed)
        # small batches launch one host block: a thread hand-off costs more than the work
        self.single = None if self.bound is None else self.bound.with_blocks(1)

    @classmethod
    def make(cls, entry: _Entry, shapes: dict, chunk: int, n_inputs: int) -> _RuntimeRows:
        # in the function: `import lazymath` must not load the backend (+~100 ms, the ISA),
        # and a traced program has loaded it by the time a dynamic batch gets here
        from .backend.compile import SMALL_VECTOR_WORK, compile_kernels
        from .backend.kernel_ir import DynamicElementwiseKernel, ElementwiseKernel

        prog = entry.prog
        slots = prog.slots
        rows_of: dict[int, int] = {}  # slot id -> elements per batch row, for batched slots
        for j, s in enumerate(slots):
            if s.kind == "leaf":
                k = entry.leaf_src[s.index]
                if k in shapes:
                    rows_of[j] = math.prod(shapes[k][1:])
            elif s.kind == "out":
                rows_of[j] = math.prod(s.shape[1:])
        kernels = []
        dyn_items = []
        for sk, ck, slot_ids in prog.kernels:
            ir = getattr(ck, "ir", None)
            touched = [j for j in slot_ids if j in rows_of]
            if not touched:
                kernels.append((sk, ck, list(slot_ids)))
                continue
            if type(ir) is not ElementwiseKernel or not ir.shape or ir.shape[0] != chunk:
                raise NotBatched(f"kernel {ck.name} ({getattr(ir, 'kind', '?')}) reads batch "
                                 "rows and is not elementwise over them")  # fmt: skip
            views = (*ir.inputs, *ir.outputs)
            for pos, (v, j) in enumerate(zip(views, slot_ids)):
                if slots[j].kind == "alias":
                    raise NotBatched(f"kernel {ck.name} writes through an alias")
                is_out = pos >= len(ir.inputs)
                if is_out and j not in rows_of:  # an intermediate: batched if it has the rows
                    if slots[j].kind != "arena" or not slots[j].shape or \
                            slots[j].shape[0] != chunk:  # fmt: skip
                        raise NotBatched(f"kernel {ck.name} writes {slots[j].kind} slot {j} "
                                         "without the batch rows")  # fmt: skip
                    rows_of[j] = math.prod(slots[j].shape[1:])
                if j in rows_of:
                    if not _row_local(v, rows_of[j]):
                        raise NotBatched(f"kernel {ck.name} argument {pos} does not address "
                                         "one buffer row per batch row")  # fmt: skip
                elif v.strides[0] != 0:
                    raise NotBatched(f"kernel {ck.name} argument {pos} differs between rows "
                                     "and does not carry the batch")  # fmt: skip
            dyn = DynamicElementwiseKernel(ir.shape, ir.inputs, ir.outputs, ir.expr, ir.results)
            dyn_items.append((len(kernels), dyn, ck.name, math.prod(ir.shape[1:])))
            kernels.append((sk, ck, list(slot_ids)))
        if not dyn_items:
            raise NotBatched("no kernel reads the batch rows")
        backend = kernels[dyn_items[0][0]][1].backend  # the traced program's (llvm, interp)
        compiled = compile_kernels([(ir, name) for _i, ir, name, _w in dyn_items],
                                   engine.device_spec(), backend)  # fmt: skip
        tiling_slot = len(slots)
        n_leaves = len(entry.leaf_src)
        for (i, _ir, _name, _w), ck in zip(dyn_items, compiled):
            sk, old, slot_ids = kernels[i]
            ck.source_loc = getattr(old, "source_loc", None)
            kernels[i] = (sk, ck, [*slot_ids, tiling_slot])
        rt_prog = dataclasses.replace(
            prog,
            kernels=kernels,
            slots=[*slots, Slot("leaf", n_leaves)],
            hits=0,
            _events=None,
            _launches=None,
            _replay=None,
            _contexts=[],
            label=prog.label + " (run-time rows)",
        )
        leaf_src = [*entry.leaf_src, n_inputs]
        fixed = [*entry.fixed, None]
        small = SMALL_VECTOR_WORK // max(1, max(w for *_x, w in dyn_items))
        return cls(rt_prog, leaf_src, fixed, small, n_inputs)


def _row_local(v, row: int) -> bool:
    """Whether element (i, ...) of view `v` always lies in row i of a buffer of `row`
    elements per row (the leading stride is one row, the other axes stay inside it)."""
    if not v.shape or v.strides[0] != row:
        return False
    lo = hi = v.offset
    for n, st in zip(v.shape[1:], v.strides[1:]):
        if n > 1:
            lo += min(0, (n - 1) * st)
            hi += max(0, (n - 1) * st)
    return 0 <= lo and hi < max(row, 1)


class _Dynamic:
    """One program traced at `chunk` rows of the batched inputs, run on any batch. With
    `rows` (the usual case for elementwise work, `_RuntimeRows`) its kernels take the row
    count at run time: a batch of up to `chunk` rows is one launch on exact row views of the
    inputs and the result, a bigger one a launch per `chunk` rows plus one for the tail.
    Otherwise (a matmul, a reduction over other axes... reads the rows) whole chunks run as
    zero-copy row views and the tail through copies padded with the last real row. The graph
    was checked to keep batch rows apart (`batch_axes`)."""

    __slots__ = ("entry", "batched", "chunk", "rows")

    def __init__(self, entry: _Entry, batched: tuple[int, ...], chunk: int,
                 rows: _RuntimeRows | None = None) -> None:  # fmt: skip
        self.entry = entry
        self.batched = batched
        self.chunk = chunk
        self.rows = rows

    def run(self, leaves: list, size: int):
        if self.rows is not None:
            return self._run_rows(leaves, size)
        entry, chunk = self.entry, self.chunk
        prog = entry.prog
        arrays = [t._node.realized for t in leaves]
        for k in self.batched:
            if not arrays[k].flags.c_contiguous:
                arrays[k] = np.ascontiguousarray(arrays[k])
        slots = [prog.slots[j] for j in prog.outputs]
        full = [np.empty((size,) + s.shape[1:], s.dtype) for s in slots]
        dev = _rt_api._CURRENT or _rt_api.current_device()
        bound = entry.bound if _prof._ACTIVE is None else None
        batched = set(self.batched)
        for start in range(0, size, chunk):
            n = min(chunk, size - start)
            ins = [_rows(a, start, chunk) if k in batched else a for k, a in enumerate(arrays)]
            tail = n < chunk
            outs = [np.empty(s.shape, s.dtype) if tail else f[start : start + chunk]
                    for s, f in zip(slots, full)]  # fmt: skip
            if bound is not None:
                bound.run_into(ins, outs, dev)
            else:
                data = [ins[k] if k >= 0 else f for k, f in zip(entry.leaf_src, entry.fixed)]
                res = (engine._run_program(prog, _Leaves(data), False, True) if entry.long
                       else prog.run(data, True))  # fmt: skip
                for o, r in zip(outs, res):
                    o[...] = r
            if tail:
                for f, o in zip(full, outs):
                    f[start:] = o[:n]
        return _wrap(entry, leaves, full)

    def _run_rows(self, leaves: list, size: int):
        rt, chunk, entry = self.rows, self.chunk, self.entry
        prog = rt.prog
        arrays = [t._node.realized for t in leaves]
        for k in self.batched:
            if not arrays[k].flags.c_contiguous:
                arrays[k] = np.ascontiguousarray(arrays[k])
        full = [np.empty((size,) + prog.slots[j].shape[1:], prog.slots[j].dtype)
                for j in prog.outputs]  # fmt: skip
        dev = _rt_api._CURRENT or _rt_api.current_device()
        profiled = _prof._ACTIVE is not None
        batched = self.batched
        for start in range(0, size, chunk):
            n = min(chunk, size - start)
            ins = list(arrays)
            for k in batched:
                ins[k] = arrays[k][start : start + n]
            ins.append(np.array([n], np.int64))  # the tiling word: the kernels' row count
            outs = [f[start : start + n] for f in full]
            bound = rt.bound if n >= rt.small else rt.single
            if bound is not None and not profiled:
                bound.run_into(ins, outs, dev)
                continue
            data = [ins[k] if k >= 0 else f for k, f in zip(rt.leaf_src, rt.fixed)]
            for o, r in zip(outs, prog.run(data, True)):
                o[...] = r[:n]
        return _wrap(entry, leaves, full)


def _wrap(entry: _Entry, leaves, results: list):
    """The call's outputs (fn's pytree) over the program's result arrays."""
    outs = []
    for k, j, loc, device, conv in entry.outs:
        if k >= 0:
            outs.append(leaves[k])
            continue
        a = results[j]
        if conv is not None:
            a = np.asarray(a, dtype=conv[1]).reshape(conv[0])
        if a.flags.writeable:
            a.flags.writeable = False
        # Tensor(node, device) without the __init__ call: this is every replay's cost
        node = _buffer_node(a, loc)
        t = _new_tensor(Tensor)
        t._node = node
        t._device = device
        node.tensors = 1
        if entry.single:
            return t
        outs.append(t)
    return _unflatten(entry.out_struct, iter(outs))


class _Leaves(list):
    """engine._run_program reads `n.realized` of each leaf: arrays wrapped to look like nodes."""

    def __init__(self, arrays):
        super().__init__(_Realized(a) for a in arrays)


class _Realized:
    __slots__ = ("realized",)

    def __init__(self, a):
        self.realized = a


def _rebuild(tree, it):
    """`tree` with its tensor/array leaves replaced, in `_flatten`'s order, from `it`."""
    t = type(tree)
    if t is Tensor or isinstance(tree, np.ndarray):
        return next(it)
    if t is tuple or t is list:
        return t(_rebuild(x, it) for x in tree)
    if t is dict:
        return {k: _rebuild(tree[k], it) for k in sorted(tree)}
    return tree


class Lowered:
    """The stage `Jitted.lower` returns: the traced outputs, not computed."""

    def __init__(self, outputs: list):
        self.outputs = outputs

    def schedule(self):
        from .api import schedule

        return schedule(*self.outputs)

    def as_text(self) -> str:
        """The fused schedule (one row per kernel) and each kernel's IR."""
        s = self.schedule()
        parts = [str(s)]
        for k in s.kernels:
            ir = k.ir
            text = ir.as_text() if hasattr(ir, "as_text") else repr(ir)
            parts.append(f"--- {k.name}\n{text}")
        return "\n".join(parts)

    def explain(self):
        from .api import explain

        return explain(*self.outputs)

    def cost(self) -> dict:
        """Kernels, total flops and bytes moved of the schedule (the fusion cost classes)."""
        s = self.schedule()
        return {"kernels": len(s.kernels), "flops": sum(k.flops for k in s.kernels),
                "bytes": sum(k.bytes for k in s.kernels)}  # fmt: skip


def _argnums(v, what: str) -> tuple[int, ...]:
    if isinstance(v, int):
        v = (v,)
    try:
        out = tuple(int(i) for i in v)
    except TypeError:
        raise TypeError(f"lm.jit: {what} must be an int or a sequence of ints") from None
    if any(i < 0 for i in out):
        raise ValueError(f"lm.jit: {what} must be non-negative, got {out}")
    return out


def jit(fn: Callable | None = None, *, static_argnums=(), donate=(), dynamic=None, chunk=None):
    """Stage `fn`: trace and compile once per input signature, then replay (see the module
    docstring for what the signature holds). Usable as `lm.jit(fn)`, `@lm.jit` and
    `@lm.jit(static_argnums=(1,))`. `donate` names arguments the caller will not use again
    (checked: not static); their buffers are not reused yet (outputs get fresh buffers).

    `dynamic=0`: the leading dim of the inputs sharing the first tensor input's leading size
    is a symbolic batch from the first call: one program, traced at `chunk` rows (default:
    the first batch rounded up to a power of two, within 64..512), runs every batch size
    chunk by chunk. `dynamic=None` (default) switches to that after a second distinct size of
    a leading dim; `dynamic=False` keeps a program per size. A function whose rows interact
    (a reduction or a view across the batch) keeps a program per size (LAZYMATH_DEBUG=1
    says why)."""
    if fn is None:
        return lambda f: Jitted(f, static_argnums, donate, dynamic, chunk)
    return Jitted(fn, static_argnums, donate, dynamic, chunk)


# ----------------------------------------------------------------------------- dynamic batch


class NotBatched(Exception):
    """The traced graph mixes rows of the batch dimension (a reduction or a view across it, a
    contraction over it...): the function cannot run chunk by chunk."""


_ROW_LOCAL_VIEWS = frozenset({"permute", "reshape", "slice", "expand"})


def batch_axes(roots: list[gn.Node], batched: dict[int, int], size: int) -> dict[int, int]:
    """For each node of the graph behind `roots`, the axis that carries the batch rows (absent:
    the node does not depend on the batch), proving that row i of every output depends only on
    row i of the batched inputs: the condition for running the one program compiled at batch
    `size` on chunks of any batch. `batched`: id(leaf node) -> its batch axis. Raises
    NotBatched naming the first node that mixes rows (its op and the user's line).

    Conservative: an op not known to be row-local (window, pad, concat over the batch, custom
    kernels, convolutions) refuses, and the caller retraces per size instead."""
    axes = dict(batched)
    for n in gn.toposort(roots):
        if id(n) in axes or not n.srcs:
            continue
        src_axes = [axes.get(id(s)) for s in n.srcs]
        if all(a is None for a in src_axes):
            continue
        op = n.op
        where = f"{op} {n.shape} at {n.loc}"
        if op in ELEMENTWISE or op == "cast" or op == "where":
            out = None
            for s, a in zip(n.srcs, src_axes):
                if a is not None:
                    b = a + len(n.shape) - len(s.shape)
                    if out is not None and out != b:
                        raise NotBatched(f"{where}: operands carry the batch on different axes")
                    out = b
            for s, a in zip(n.srcs, src_axes):
                if a is None and not _uniform_at(s, out - (len(n.shape) - len(s.shape))):
                    raise NotBatched(f"{where}: an operand that is not batched has "
                                     f"{size} rows along the batch axis")  # fmt: skip
            axes[id(n)] = out
            continue
        (a,) = src_axes if len(src_axes) == 1 else (None,)
        s = n.srcs[0]
        if op == "reduce":
            if a in n.arg[1]:
                raise NotBatched(f"{where}: reduces over the batch axis")
            axes[id(n)] = a - sum(1 for r in n.arg[1] if r < a)
        elif op == "permute":
            axes[id(n)] = tuple(n.arg).index(a)
        elif op == "slice":
            if tuple(n.arg[a]) != (0, size, 1):
                raise NotBatched(f"{where}: slices the batch axis")
            axes[id(n)] = a
        elif op == "expand":
            b = a + len(n.shape) - len(s.shape)
            if n.shape[b] != size:
                raise NotBatched(f"{where}: broadcasts the batch axis")
            axes[id(n)] = b
        elif op == "reshape":
            axes[id(n)] = _reshaped_axis(s.shape, n.shape, a, where)
        elif op == "complex_join" and a != len(s.shape) - 1:
            axes[id(n)] = a
        elif op == "matmul" and len(n.srcs) == 2:
            axes[id(n)] = _matmul_axis(n, src_axes, where)
        else:
            raise NotBatched(f"{where}: not known to keep batch rows apart")
    return axes


def _uniform_at(node: gn.Node, axis: int) -> bool:
    """Whether a node that does not depend on the batch is the same along `axis` (absent, size
    1, or broadcast there by an expand): it then meets every batch row alike."""
    if axis < 0 or node.shape[axis] == 1:
        return True
    if node.op == "expand":
        s = node.srcs[0]
        k = axis - (len(node.shape) - len(s.shape))
        return k < 0 or s.shape[k] == 1
    return False


def _reshaped_axis(src: tuple, dst: tuple, a: int, where: str) -> int:
    """The batch axis after a reshape that keeps it a whole axis of its own (row-major: the
    elements before it and the axis itself span the same prefix)."""
    before = 1
    for d in src[:a]:
        before *= d
    acc = 1
    for b, d in enumerate(dst):
        if acc == before and d == src[a]:
            return b
        acc *= d
    raise NotBatched(f"{where}: reshapes the batch axis together with others")


def _matmul_axis(n: gn.Node, src_axes: list, where: str) -> int:
    """(..., M, K) @ (..., K, N): the batch may be in M, N or the stacked leading axes, never
    in the contracted K."""
    out_nd = len(n.shape)
    found = None
    for side, (s, a) in enumerate(zip(n.srcs, src_axes)):
        if a is None:
            continue
        nd = len(s.shape)
        if nd < 2 or a == (nd - 1 if side == 0 else nd - 2):
            raise NotBatched(f"{where}: contracts over the batch axis")
        if a >= nd - 2:
            b = out_nd - 2 if side == 0 else out_nd - 1
        else:
            b = a + out_nd - nd
        if found is not None and found != b:
            raise NotBatched(f"{where}: operands carry the batch on different axes")
        found = b
    for s, a in zip(n.srcs, src_axes):
        if a is None and found < out_nd - 2 and not _uniform_at(s, found - (out_nd - len(s.shape))):
            raise NotBatched(f"{where}: a stacked operand that is not batched")
    return found
