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
A Python scalar argument is therefore static: a new value retraces, but the retrace finds the
compiled program (scalars are runtime kernel arguments, LAZYMATH_SCALAR_ARGS), so it costs a
trace, not a compile. Pass a value that changes every step as a 0-d tensor
(`lm.asarray(np.float32(lr))`) to replay without tracing.

`fn` must be a pure function of its arguments: tensors it reads from a closure or a global are
captured as constants at the trace (a rebound global is not seen until the next retrace).
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from . import engine, settings
from .graph import node as gn
from .graph.walk import plan_outputs
from .runtime import api as _rt_api
from .runtime import profiler as _prof
from .runtime.replay import BoundReplay
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

    def __init__(self, fn: Callable, static_argnums=(), donate=()):
        if not callable(fn):
            raise TypeError(f"lm.jit: expected a callable, got {type(fn).__name__}")
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
        return self._trace(args, kwargs, leaves, sig)

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

    def _trace(self, args, kwargs, leaves, sig):
        t0 = time.perf_counter()
        reason = self._retrace_reason(sig)
        self.traces += 1
        # fresh handles over the realized input arrays: the program's leaves are found by
        # node identity, and a caller's tensor may share its node with other tensors
        fresh = [Tensor(gn.buffer_node(t._node.realized), t._device) for t in leaves]
        it = iter(fresh)
        call_args = []
        for i, a in enumerate(args):
            call_args.append(a if i in self.static_argnums else _rebuild(a, it))
        call_kwargs = _rebuild(kwargs, it) if kwargs else {}
        out = self.fn(*call_args, **call_kwargs)
        out_leaves: list = []
        out_struct = _flatten(out, out_leaves, [])
        in_pos = {id(t._node): k for k, t in enumerate(fresh)}
        roots = list(dict.fromkeys(t._node for t in out_leaves if t._node.realized is None))
        entry = None
        if roots and _BACKEND.get() != "reference":
            entry = self._compile(roots, in_pos, out_leaves, out_struct, fresh)
        else:
            from .realize import realize

            realize(*out_leaves)
        if entry is not None:
            self._entries[sig] = entry
        self._last_sig = sig
        self._debug(f"{reason}: traced in {(time.perf_counter() - t0) * 1e3:.1f} ms")
        return out  # computed by the trace's realize (no entry: nothing compiled, eager next)

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


def jit(fn: Callable | None = None, *, static_argnums=(), donate=()):
    """Stage `fn`: trace and compile once per input signature, then replay (see the module
    docstring for what the signature holds). Usable as `lm.jit(fn)`, `@lm.jit` and
    `@lm.jit(static_argnums=(1,))`. `donate` names arguments the caller will not use again
    (checked: not static); their buffers are not reused yet (outputs get fresh buffers)."""
    if fn is None:
        return lambda f: Jitted(f, static_argnums, donate)
    return Jitted(fn, static_argnums, donate)
