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

import ctypes
import functools
import math
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from lazymath import engine, functions, settings
from lazymath._lazy import deferred
from lazymath.graph import node as gn
from lazymath.graph.walk import no_view_folding, plan_outputs
from lazymath.realize import realize, watch_realizes
from lazymath.runtime import api as _rt_api
from lazymath.runtime import profiler as _prof
from lazymath.runtime.replay import BoundReplay
from lazymath.runtime.replay import address_of as _address_of
from lazymath.staging_batch import NotBatched, RowPlan, RuntimeRows, _rows, batch_axes
from lazymath.tensor import Tensor

# The public reports (lm.schedule, lm.explain) for the stage objects' methods: api imports the
# whole backend and this module (lm.jit), so it is referenced, not imported.
api = deferred("lazymath.api")

__all__ = ["jit", "Jitted", "Lowered", "DonatedError", "NotBatched", "batch_axes"]

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
        leaves.append(functions.asarray(tree))
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
                 "bound", "single", "donors", "one")  # fmt: skip

    def __init__(self, prog, leaf_src, fixed, outs, out_struct, checks):
        self.prog = prog
        self.leaf_src = leaf_src  # per program leaf: input index, or -1 (a fixed array)
        self.fixed = fixed  # per program leaf: the captured array (constants, closures)
        # per output leaf: (-1, j, loc, device, (shape, dtype) or None) for program output j
        # (the pair when the result must be reshaped/cast), or (k, ...) for call input k
        self.outs = outs
        self.out_struct = out_struct
        self.single = out_struct == "T"  # fn returned one tensor: no pytree to rebuild
        # (program output j, call site, device) when fn returns one plain program output
        o = outs[0] if self.single else None
        self.one = (o[1], o[2], o[3]) if o is not None and o[0] < 0 and o[4] is None else None
        self.long = engine._program_work(prog) >= engine.LONG_WORK
        self.checks = checks  # (input index, bytes): 0-d inputs folded into the kernels
        self.traced = 1
        # the fast launch (runtime.replay.BoundReplay), None when the program does not qualify
        self.bound = None if self.long else BoundReplay.make(prog, leaf_src, fixed)
        # (program output j, call input k): a donated input whose buffer output j may take
        self.donors: tuple[tuple[int, int], ...] = ()


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
        # flat calls of a dynamic batch: batched positions -> {masked fast key -> _Dynamic}
        self._dyn_fast: dict = {}
        self.fn = fn
        self.static_argnums = _argnums(static_argnums, "static_argnums")
        self.donate = _argnums(donate, "donate")
        if set(self.static_argnums) & set(self.donate):
            raise ValueError("lm.jit: an argument cannot be both static and donated")
        if self.donate:
            self.__class__ = _Donating
        self._entries: dict = {}
        # calls whose arguments are all realized tensors (no kwargs, no static arguments) look
        # their entry up here first: key = settings state, device, each input's layout
        self._fast: dict = {}
        self._flat = not self.static_argnums
        self._name = getattr(fn, "__qualname__", repr(fn))  # (named by a DonatedError)
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
            realize(*pending)
        spec = engine.device_spec()
        target = (settings.TARGET_CPU.get() or "").strip()
        return (struct, tuple(_leaf_sig(t) for t in leaves), spec.key(), _BACKEND.get(),
                target, settings.SCALAR_ARGS.get(), settings.HOST_MATH.get())  # fmt: skip

    # -- calls
    def _call_donating(self, args, kwargs):
        """A call with donated arguments: their buffers may become outputs (`_replay`), and
        their tensors are dead afterwards (any use raises DonatedError)."""
        donated = self._donated_tensors(args)
        out = Jitted.__call__(self, *args, **kwargs)
        if donated:
            if type(out) is Tensor:  # one output (the common step): no pytree walk
                if any(out is t for t in donated):  # fn returned a donated input: a new handle
                    out = Tensor(out._node, out._device)
            else:
                out_leaves: list = []
                _flatten(out, out_leaves, [])
                mine = {id(t) for t in donated}
                if any(id(t) in mine for t in out_leaves):  # a donated input returned
                    fresh = iter([Tensor(t._node, t._device) if id(t) in mine else t
                                  for t in out_leaves])  # fmt: skip
                    out = _rebuild(out, fresh)
            for t in donated:
                node = t._node
                if type(node) is not _DonatedNode:
                    node.tensors -= 1
                    t._node = _DonatedNode(self._name, node.shape, node.dtype)
        return out

    def _donated_tensors(self, args) -> list:
        """The tensor leaves of the donated arguments (numpy leaves: converted copies, nothing
        to invalidate); a tensor donated earlier raises DonatedError here."""
        out = []
        for i in self.donate:
            if i < len(args):
                a = args[i]
                if type(a) is Tensor:  # (the common case: no pytree walk)
                    out.append(a)
                else:
                    _flatten_tensors(a, out)
        for t in out:
            t._node.shape  # noqa: B018 - a dead (donated) tensor raises DonatedError
        return out

    def _donated_leaves(self, args) -> set[int]:
        """Leaf positions (in `_split` order) of the donated arguments."""
        pos, out = 0, set()
        for i, a in enumerate(args):
            if i in self.static_argnums:
                continue
            leaves: list = []
            _flatten(a, leaves, [])
            if i in self.donate:
                out.update(range(pos, pos + len(leaves)))
            pos += len(leaves)
        return out

    def __call__(self, *args, **kwargs):
        # the replay's fast path: every statement here is paid per call (donating functions
        # are a `_Donating`, whose __call__ wraps this one, so no flag is tested here)
        fast_key = None
        if self._flat and not kwargs:
            # the fast key: no pytree walk, no settings parsing, no device lookup
            # (each input's layout id and address come from its node's cache, `node.addr`:
            # no shape/strides tuples, a cheap hash, and the launch needs the address anyway)
            key = [_settings_state(), _rt_api._CURRENT]
            addrs = []
            for a in args:
                if type(a) is not Tensor:
                    break
                node = a._node
                r = node.realized
                c = node.addr
                if c is None or c[0] is not r:
                    if r is None:
                        break
                    c = node.addr = _address_of(r)
                key += (c[2], a._device)
                addrs.append(c[1])
            else:
                fast_key = tuple(key)
                entry = self._fast.get(fast_key)
                if entry is not None:
                    bound = entry.bound
                    if bound is None or entry.donors or _prof._ACTIVE is not None:
                        return self._replay(entry, args)
                    results = bound.launch(addrs, key[1] or _rt_api.current_device())
                    one = entry.one
                    if one is None:
                        return _wrap(entry, args, results, True)
                    # one plain output: _wrap inlined (a frame and a loop less per call)
                    node = _buffer_node(results[one[0]], one[1])
                    t = _new_tensor(Tensor)
                    t._node = node
                    t._device = one[2]
                    node.tensors = 1
                    return t
                for batched, table in self._dyn_fast.items():  # a dynamic batch seen before
                    dyn = table.get(_masked_key(args, batched))
                    if dyn is not None:
                        size = args[batched[0]]._node.realized.shape[0]
                        if all(args[k]._node.realized.shape[0] == size for k in batched):
                            return dyn.run(list(args), size)
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
        if self._flat and not kwargs and len(leaves) == len(args):  # all args tensors: fast key
            table = self._dyn_fast.setdefault(batched, {})
            if len(table) > 64:
                table.clear()  # settings changed often: old states are dead keys
            table[_masked_key(args, batched)] = dyn
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

        made: dict = {}  # "rows": the RuntimeRows compiled, or "why": the host chunks' reason

        def compile_rows(roots, in_pos, out_leaves, out_struct, fresh):
            """The batch kernels compiled once, taking the row count at run time (RowPlan);
            else (NotBatched) the traced program at `chunk` rows, run by host chunks."""
            backend = _BACKEND.get()
            if backend in ("llvm", "interp"):
                elems = {id(fresh[k]._node): math.prod(chunk_leaves[k].shape[1:])
                         for k in batched}  # fmt: skip
                plan = RowPlan(elems, chunk)
                try:
                    prog, outputs, leaves = engine.compile_detached(roots, backend, plan)
                except (NotBatched, ValueError) as e:  # (ValueError: a template refused one)
                    made["why"] = e
                else:
                    prog.label += " (run-time rows)"
                    entry = _entry_of(prog, outputs, leaves, in_pos, out_leaves, out_struct,
                                      len(fresh))  # fmt: skip
                    if entry is not None:
                        made["rows"] = RuntimeRows(prog, entry.leaf_src, entry.fixed,
                                                   plan.small, plan.capacity,
                                                   entry.bound)  # fmt: skip
                    return entry
            else:
                made["why"] = f"the {backend} backend takes no run-time row count"
            return self._compile(roots, in_pos, out_leaves, out_struct, fresh)

        try:
            _out, entry = self._trace_entry(args, kwargs, chunk_leaves, sig, analyze, what,
                                            compile_rows)  # fmt: skip
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
        rows = made.get("rows")
        if rows is None:  # a kernel that cannot take its rows at run time: host chunks
            self._debug(f"dynamic batch by host chunks of {chunk} rows ({made.get('why')})")
        else:
            self._debug(f"dynamic batch: one program for up to {rows.capacity} rows per launch, "
                        "the row count a kernel argument")  # fmt: skip
        return _Dynamic(entry, batched, chunk, rows)

    def _replay(self, entry: _Entry, leaves):
        bound = entry.bound
        if entry.donors:
            outs = _run_donating(entry, leaves)
            return _wrap(entry, leaves, outs, entry.bound is not None and _prof._ACTIVE is None)
        if bound is not None and _prof._ACTIVE is None:
            results = bound([t._node for t in leaves], _rt_api._CURRENT or _rt_api.current_device())
            return _wrap(entry, leaves, results, True)
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
            if self.donate:
                entry.donors = _donors(entry, self._donated_leaves(args), leaves)
            self._entries[sig] = entry
        return out

    def _trace_entry(self, args, kwargs, leaves, sig, analyze=None, what="", compile=None):
        """Run fn on fresh handles of `leaves` and compile its graph: (its outputs, the entry
        or None). `analyze(roots, fresh, out_leaves)` runs on the graph before it is compiled
        (the dynamic batch's check; NotBatched propagates); `compile` replaces `_compile`
        (the dynamic batch's: its program is compiled, not run, and the outputs stay lazy)."""
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
                realize(*out_leaves)
        elif roots and _BACKEND.get() != "reference":
            with no_view_folding():  # the program's leaves must be the traced inputs
                entry = (compile or self._compile)(roots, in_pos, out_leaves, out_struct, fresh)
        else:
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
        return _entry_of(prog, outputs, leaves, in_pos, out_leaves, out_struct)

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


class _Donating(Jitted):
    """A staged function with donated arguments (`lm.jit(..., donate=...)`): its calls go
    through `_call_donating` (find the donated tensors, call, kill them)."""

    def __call__(self, *args, **kwargs):
        return self._call_donating(args, kwargs)


class DonatedError(RuntimeError):
    """A tensor donated to a staged function (`lm.jit(..., donate=...)`) was used again."""


class _DonatedNode:
    """What a donated tensor points to after the call: its buffer may now hold an output, so
    every use (an op, `.numpy()`, printing, another call) raises DonatedError."""

    __slots__ = ("tensors", "_what")

    def __init__(self, fn: str, shape, dtype) -> None:
        self.tensors = 0
        self._what = (fn, shape, dtype)  # the message is built when raised (per call: cheap)

    def __getattr__(self, name: str):
        fn, shape, dtype = object.__getattribute__(self, "_what")
        raise DonatedError(f"a {dtype} tensor of shape {shape} donated to lm.jit function {fn} "
                           "cannot be used after that call: its buffer may hold the call's "
                           "outputs (pass a copy, or do not donate it)")  # fmt: skip


def _flatten_tensors(tree, out: list) -> None:
    """The Tensor leaves of a pytree (iterative; numpy leaves skipped)."""
    stack = [tree]
    while stack:
        x = stack.pop()
        t = type(x)
        if t is Tensor:
            out.append(x)
        elif t is tuple or t is list:
            stack.extend(reversed(x))
        elif t is dict:
            stack.extend(x[k] for k in sorted(x, reverse=True))


def _donors(entry: _Entry, donated: set[int], leaves: list) -> tuple[tuple[int, int], ...]:
    """(output j, input k) pairs where output j can be written into donated input k's buffer:
    same shape and dtype, input C-contiguous, and the program stays correct in place -- one
    elementwise kernel writes j, reading k only at the very index it writes (identical views),
    and every other kernel reading k runs before it (one stream, in order)."""
    prog = entry.prog
    if not donated or not prog.inline:
        return ()
    out_slot = {slot: j for j, slot in enumerate(prog.outputs)}
    leaf_slots: dict[int, set[int]] = {}
    for sid, s in enumerate(prog.slots):
        if s.kind == "leaf" and entry.leaf_src[s.index] in donated:
            leaf_slots.setdefault(entry.leaf_src[s.index], set()).add(sid)
    pairs, used = [], set()
    writers: dict[int, list[int]] = {}
    for ki, (_sk, ck, slot_ids) in enumerate(prog.kernels):
        ir = getattr(ck, "ir", None)
        n_in = len(getattr(ir, "inputs", ()))
        for sid in slot_ids[n_in:]:
            writers.setdefault(sid, []).append(ki)
    for k, sids in leaf_slots.items():
        a = leaves[k]._node.realized
        for sid, j in out_slot.items():
            s = prog.slots[sid]
            if j in used or s.kind != "out" or s.shape != a.shape or s.dtype != a.dtype:
                continue
            if not a.flags.c_contiguous or len(writers.get(sid, ())) != 1:
                continue
            kw = writers[sid][0]
            _sk, ck, slot_ids = prog.kernels[kw]
            ir = ck.ir
            if type(ir).__name__ != "ElementwiseKernel":
                continue
            n_in = len(ir.inputs)
            view = ir.outputs[slot_ids[n_in:].index(sid)]
            if any(sid2 in sids and v != view for v, sid2 in zip(ir.inputs, slot_ids)):
                continue  # reads the donated buffer elsewhere than it writes
            later = any(set(sl) & sids for _s, _c, sl in prog.kernels[kw + 1 :])
            if later:
                continue
            pairs.append((j, k))
            used.add(j)
            break
    return tuple(pairs)


def _run_donating(entry: _Entry, leaves: list) -> list:
    """Run the entry's program with donated input buffers as outputs where that is safe now:
    the input's array owns its memory and nothing but its tensor refers to it (no other handle,
    view, numpy result or pending lazy op), so writing it changes nothing anyone can see.
    Otherwise that output gets a fresh buffer."""
    prog = entry.prog
    arrays = [t._node.realized for t in leaves]
    bound = entry.bound if _prof._ACTIVE is None else None
    if bound is None:  # interp, profiled, a long program: fresh outputs (the general launch)
        data = [arrays[k] if k >= 0 else f for k, f in zip(entry.leaf_src, entry.fixed)]
        if entry.long:
            return engine._run_program(prog, _Leaves(data), False, True)
        return prog.run(data, True)
    addrs = _addresses(leaves)  # (a function: no local may keep an input array alive)
    outs: list = [None] * len(prog.outputs)
    out_addrs = [0] * len(outs)
    for j, k in entry.donors:
        node = leaves[k]._node
        a = node.realized
        holders = 4  # realized, node.addr, arrays, a
        if bound.holds(a):
            holders += 1  # the context keeps its last output for reuse: released below
        # (node: its tensor, `node`, getrefcount's argument; a pending op on it adds one)
        alone = sum(x is a for x in arrays) == 1 and sys.getrefcount(a) - 1 <= holders
        if alone and node.tensors == 1 and sys.getrefcount(node) == 3:
            flags = a.flags
            if flags.owndata:
                flags.writeable = False  # (a realized array is immutable: _wrap needs no check)
                outs[j], out_addrs[j] = a, addrs[k]
    for j, slot in enumerate(prog.outputs):
        if outs[j] is None:
            o = outs[j] = np.empty(prog.slots[slot].shape, prog.slots[slot].dtype)
            o.flags.writeable = False
            out_addrs[j] = o.__array_interface__["data"][0]
    bound.run_addresses(addrs, out_addrs, _rt_api._CURRENT or _rt_api.current_device())
    return outs


def _addresses(leaves: list) -> list[int]:
    """The tensors' data addresses, cached on their nodes (`node.addr`, as BoundReplay)."""
    out = []
    for t in leaves:
        node = t._node
        r, c = node.realized, node.addr
        if c is None or c[0] is not r:
            c = node.addr = _address_of(r)
        out.append(c[1])
    return out


_NO = object()  # "not handled here": _dynamic_call's answer when the call is not a batch


def _masked_key(args, batched: tuple[int, ...]) -> tuple:
    """The fast key of a flat call (all arguments realized tensors) with the batched inputs'
    leading dim left out: one key for every batch size."""
    key = [_settings_state(), _rt_api._CURRENT, batched]
    for k, a in enumerate(args):
        r = a._node.realized
        if k in batched:
            key += (r.shape[1:], r.dtype, r.strides[1:], a._device)
        else:
            key += (r.shape, r.dtype, r.strides, a._device)
    return tuple(key)


def _entry_of(prog, outputs, leaves, in_pos, out_leaves, out_struct,
              tiling: int | None = None) -> _Entry | None:  # fmt: skip
    """The entry binding a compiled program's leaves to the call's inputs and its outputs to
    fn's output leaves (None: fn returns a tensor realized before the call). `tiling`: the
    program has one more leaf after `leaves`, the tiling word, passed after the call's
    `tiling` inputs (a dynamic batch's run-time rows)."""
    leaf_src = [in_pos.get(id(n), -1) for n in leaves]
    fixed = [None if k >= 0 else n.realized for k, n in zip(leaf_src, leaves)]
    checks = tuple((leaf_src[i], leaves[i].realized.tobytes()) for i in prog.folded
                   if leaf_src[i] >= 0)  # fmt: skip
    if tiling is not None:
        leaf_src.append(tiling)
        fixed.append(None)
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


class _Dynamic:
    """One program traced at `chunk` rows of the batched inputs, run on any batch. With
    `rows` (the usual case for elementwise work, `RuntimeRows`) its kernels take the row
    count at run time: a batch of up to `chunk` rows is one launch on exact row views of the
    inputs and the result, a bigger one a launch per `chunk` rows plus one for the tail.
    Otherwise (a matmul, a reduction over other axes... reads the rows) whole chunks run as
    zero-copy row views and the tail through copies padded with the last real row. The graph
    was checked to keep batch rows apart (`batch_axes`)."""

    __slots__ = ("entry", "batched", "chunk", "rows")

    def __init__(self, entry: _Entry, batched: tuple[int, ...], chunk: int,
                 rows: RuntimeRows | None = None) -> None:  # fmt: skip
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
        # a native launch serves up to `capacity` rows; Program.run's outputs have `chunk`
        step = chunk if profiled or rt.bound is None else rt.capacity
        native = rt.bound is not None and not profiled
        if native:  # addresses: each base once, row views at offsets (no dict per view)
            base = [a.__array_interface__["data"][0] for a in arrays]
            rows = [a.strides[0] if a.ndim else 0 for a in arrays]
            obase = [f.__array_interface__["data"][0] for f in full]
            orows = [f.strides[0] for f in full]
            word = ctypes.c_int64(0)  # the tiling word: the kernels' row count
            base.append(ctypes.addressof(word))
        for start in range(0, size, step):
            n = min(step, size - start)
            if native:
                word.value = n
                addrs = list(base)
                for k in batched:
                    addrs[k] += start * rows[k]
                outs = [b + start * r for b, r in zip(obase, orows)]
                (rt.bound if n >= rt.small else rt.single).run_addresses(addrs, outs, dev)
                continue
            ins = list(arrays)
            for k in batched:
                ins[k] = arrays[k][start : start + n]
            ins.append(np.array([n], np.int64))  # the tiling word: the kernels' row count
            outs = [f[start : start + n] for f in full]
            data = [ins[k] if k >= 0 else f for k, f in zip(rt.leaf_src, rt.fixed)]
            for o, r in zip(outs, prog.run(data, True)):
                o[...] = r[:n]
        return _wrap(entry, leaves, full)


def _wrap(entry: _Entry, leaves, results: list, readonly: bool = False):
    """The call's outputs (fn's pytree) over the program's result arrays (`readonly`: they
    are already, as BoundReplay makes them: no flags object per output)."""
    outs = []
    for k, j, loc, device, conv in entry.outs:
        if k >= 0:
            outs.append(leaves[k])
            continue
        a = results[j]
        if conv is not None:
            a = np.asarray(a, dtype=conv[1]).reshape(conv[0])
        if not readonly and a.flags.writeable:
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
    """A graph node's stand-in: `realized`, and `addr`, where Program.run's replay path caches
    the array's data address (a long program replays through engine._run_program)."""

    __slots__ = ("realized", "addr")

    def __init__(self, a):
        self.realized = a
        self.addr = None


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
        return api.schedule(*self.outputs)

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
        return api.explain(*self.outputs)

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
    `@lm.jit(static_argnums=(1,))`. `donate` names arguments the caller will not use again:
    their tensors are dead after the call (any use raises DonatedError), and an output of the
    same shape and dtype that one elementwise kernel writes at the very index it reads the
    donated input is written into the donated buffer, when nothing else still sees it (another
    handle, a view, a numpy result, a pending op: then a fresh buffer).

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
