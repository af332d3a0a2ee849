"""lazymath as a PyTorch compiler: ``torch.compile(model, backend="lazymath")``.

Dynamo captures the model's Python into FX graphs; AOTAutograd (torch's own) functionalizes
them, splits training into a forward and a backward graph and decomposes them to core ATen with
`DECOMPOSITIONS`. Each ATen graph is then *traced* into lazy lazymath ops (`_aten.LOWERINGS`)
and all its outputs are realized together, so the graph becomes one lazymath graph: fusion,
Cube/Vector placement, streams and the kernel cache (keyed by the graph's signature) apply as
for native lazymath code. Tensors cross the boundary through DLPack without copies (torch's
CPU buffers are read in place; results are handed to torch as the buffers lazymath computed).

An ATen node with no lowering (or a case its lowering does not cover, e.g. a transposed
convolution, a complex32 tensor) is a graph break: the lazymath values it needs are realized,
the node runs in torch eager, and tracing resumes after it, so the segments before and after
stay lazymath. Breaks are listed by `explain` (also `lm.explain(compiled_model)`) and printed
once per graph at LAZYMATH_DEBUG >= 1. A graph whose lazymath realize fails (the ascend910
preset refuses bfloat16) runs whole in torch eager from then on, also reported. Correctness
never depends on a lowering being present.
"""

from __future__ import annotations

import operator
import sys
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.backends.registry import _BACKENDS, _COMPILER_FNS, register_backend

from lazymath import api as _api
from lazymath import settings
from lazymath.torch import _aten, _replay, _views
from lazymath.torch import _lm as lm
from lazymath.torch._aten import LOWERINGS, PYTHON_TARGETS, Unsupported, lowering_for, np_dtype

__all__ = ["backend", "compile", "explain", "DECOMPOSITIONS", "CompiledGraph", "LOWERINGS"]

aten = torch.ops.aten


def _decompositions() -> dict:
    """Core ATen decompositions, minus the ops lazymath lowers whole (softmax, layer_norm,
    GELU, SiLU, attention): a fused lazymath softmax or attention beats the primitive ops
    torch would otherwise hand over, and their backward ops still decompose."""
    from torch._decomp import core_aten_decompositions

    table = dict(core_aten_decompositions())
    keep = (
        aten._softmax.default, aten._log_softmax.default, aten.native_layer_norm.default,
        aten.gelu.default, aten.silu.default, aten.embedding.default,
        aten._scaled_dot_product_flash_attention_for_cpu.default,
        aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
    )  # fmt: skip
    for op in keep:
        table.pop(op, None)
    return table


DECOMPOSITIONS = _decompositions()


def _debug() -> int:
    try:
        return int(settings.DEBUG.get())
    except (ValueError, TypeError):
        return 0


def _to_lm(t: torch.Tensor) -> lm.Tensor:
    """A torch CPU tensor as a lazymath leaf over the same memory (DLPack). A permutation of
    a contiguous layout (a saved transposed weight) is its contiguous base, permuted lazily
    (`_views.dense_order`); any other non-contiguous tensor is copied once, as lazymath
    shares only contiguous buffers."""
    if t.device.type != "cpu":
        raise Unsupported(f"a tensor on device {t.device} (lazymath reads host memory)")
    np_dtype(t.dtype)  # Unsupported for dtypes lazymath has not (complex32, float8, ...)
    if t.requires_grad:
        t = t.detach()
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    order = _views.dense_order(t)
    if order is not None:
        return lm.permute_dims(lm.from_dlpack(t.permute(order)), _views.inverse(order))
    return lm.from_dlpack(t)


def _to_torch(x: lm.Tensor) -> torch.Tensor:
    """A realized lazymath tensor as a torch tensor over the same buffer (DLPack; bfloat16,
    which numpy's DLPack exporter lacks, crosses as its uint16 bits, viewed back)."""
    if x.dtype == lm.bfloat16:
        return torch.from_dlpack(x.numpy().view(np.uint16)).view(torch.bfloat16)
    return torch.from_dlpack(x)


class _LazymathFailed(Exception):
    """A realize of this graph's lazymath values failed (e.g. a preset refusing a dtype)."""


def _flatten(v) -> list:
    if isinstance(v, (list, tuple)):
        out = []
        for e in v:
            out.extend(_flatten(e))
        return out
    if isinstance(v, dict):
        return _flatten(list(v.values()))
    return [v]


def _map(v, fn):
    """`v` with every tensor leaf replaced by fn(leaf) (lists/tuples/dicts rebuilt)."""
    if isinstance(v, (lm.Tensor, torch.Tensor)):
        return fn(v)
    if isinstance(v, list):
        return [_map(e, fn) for e in v]
    if isinstance(v, tuple):
        return tuple(_map(e, fn) for e in v)
    if isinstance(v, dict):
        return {k: _map(e, fn) for k, e in v.items()}
    return v


def _op_name(target) -> str:
    return (
        str(target)
        if isinstance(target, torch._ops.OpOverload)
        else getattr(target, "__name__", repr(target))
    )


def _specs(args: list) -> list:
    """(shape, dtype, is_parameter) of each tensor argument, other values as they are: what
    `explain` traces again on zeros."""
    return [
        (tuple(a.shape), a.dtype, isinstance(a, torch.nn.Parameter))
        if isinstance(a, torch.Tensor)
        else a
        for a in args
    ]


def _concrete(shape) -> bool:
    return all(isinstance(s, int) for s in shape)


def _zeros_like_spec(v):
    """Zeros of a recorded (shape, dtype, is_parameter) input (a Parameter again if it was
    one, so explain shows the steady state's kept weight views); any other value as it was."""
    if isinstance(v, tuple) and len(v) == 3 and isinstance(v[1], torch.dtype):
        z = torch.zeros(v[0], dtype=v[1])
        return torch.nn.Parameter(z, requires_grad=False) if v[2] else z
    return v


def _bases(args: list, perms: dict) -> list:
    """`args` with each tensor at an index of `perms` replaced by its contiguous base
    (`t.permute(order)`, a view: no copy)."""
    return [a.permute(perms[i]) if i in perms else a for i, a in enumerate(args)]


_PARAM_VIEW_OPS = (aten.t.default, aten.transpose.int, aten.permute.default)
_MISSING = object()


class CompiledGraph:
    """One ATen FX graph (an AOTAutograd forward, backward or inference graph) run as lazy
    lazymath ops, with torch eager for the nodes that break the graph.

    The node plan (lowering or break) is decided when the graph is compiled from its ops and
    FakeTensor dtypes, and refined at the first call that meets a case a lowering refuses;
    either way the decision is kept (`breaks`), so every later call runs the same segments.

    From the second call on, a graph without breaks is replayed (`_replay`): traced once per
    replay signature into a stored program by lm.jit, then launched on the new buffers
    without running a lowering (lazymath/torch/_replay.py says what the signature holds)."""

    def __init__(self, gm: torch.fx.GraphModule, kind: str, index: int):
        self.gm = gm
        self.kind = kind
        self.index = index
        self.nodes = list(gm.graph.nodes)
        self.breaks: dict[str, str] = {}  # node name -> why it runs in torch eager
        self.eager: str | None = None  # why the whole graph runs in torch (a failed realize)
        self.calls = 0
        self.segments = 0  # lazymath realizes per call (1 = the whole graph is one graph)
        self._last_inputs: list | None = None  # (shape, dtype) / Python values of the last call
        # t/transpose/permute of a graph input: when that input is an nn.Parameter its
        # realized (contiguous) result is kept across calls, see `_param_view` (inference
        # graphs only: training loops may still update weights through `.data`)
        self._param_views: dict[torch.fx.Node, torch.fx.Node] = {
            n: n.args[0]
            for n in self.nodes
            if kind == "inference"
            and n.op == "call_function"
            and n.target in _PARAM_VIEW_OPS
            and isinstance(n.args[0], torch.fx.Node)
            and n.args[0].op == "placeholder"
        }
        self._consts: dict[str, tuple] = {}  # node name -> (weakref, key, realized lm tensor)
        self.const_hits = 0  # calls' uses of a kept parameter view (no copy kernel ran)
        # node -> the values whose last reader it is: `_run` drops them once it has run, so a
        # realize sees only the values later nodes still read (a lazy tensor still referenced
        # is a program output with its own buffer: every FX intermediate was one, and the GPT
        # block's forward kept 13 activation copies alive; issue 32's peak memory)
        self._last_use: dict[torch.fx.Node, list[torch.fx.Node]] = {}
        # outputs that are views: their base is the output, the views are made in torch
        # (lazymath/torch/_views.py); the output node reads the bases. Not for a backward
        # graph: its outputs are gradients, and AccumulateGrad clones one whose strides
        # differ from its parameter's (a view would only move the copy into torch)
        self._out_views = _views.output_views(self.nodes) if kind != "backward" else {}
        self._view_base = {ch[-1]: b for b, ch in self._out_views.values()}
        readers: dict[torch.fx.Node, int] = {n: len(n.users) for n in self.nodes}
        for v in self._view_base:
            readers[v] -= 1
        seen: set = set()
        for n in reversed(self.nodes):
            if n.op != "output" and readers[n] <= 0:  # read by nobody: dropped right away
                self._last_use.setdefault(n, []).append(n)
            ins = n.all_input_nodes
            if n.op == "output":
                ins = list(dict.fromkeys(self._view_base.get(m, m) for m in ins))
            for m in ins:
                if m not in seen:
                    seen.add(m)
                    self._last_use.setdefault(n, []).append(m)
        self._placeholders = {
            n: i for i, n in enumerate(n for n in self.nodes if n.op == "placeholder")
        }
        self._stored: dict = {}  # replay signature -> _replay.Stored, or None (not replayed)
        self.replays = 0  # calls served by a stored program (no lowering ran)
        self.traces = 0  # replay signatures traced
        self.replay_off: str | None = None  # why no call of this graph is replayed
        for n in self.nodes:
            if n.op != "call_function" or n.target in PYTHON_TARGETS:
                continue
            if n.target is operator.getitem:
                continue
            if lowering_for(n.target) is None:
                self._break(n, "no lazymath lowering")
                continue
            for v in _flatten(n.meta.get("val")):
                if isinstance(v, torch.Tensor) and v.dtype not in _aten.TORCH_TO_NP:
                    self._break(n, f"dtype {v.dtype} (no lazymath dtype)")
                    break

    @property
    def n_ops(self) -> int:
        return sum(1 for n in self.nodes if n.op == "call_function")

    def _break(self, n: torch.fx.Node, why: str) -> None:
        if n.name in self.breaks:
            return
        self.breaks[n.name] = f"{_op_name(n.target)}: {why}"
        if _debug() >= 1:
            print(f"[lazymath.torch] graph break in {self.kind} graph {self.index}: node "
                  f"{n.name} = {_op_name(n.target)} runs in torch eager ({why})",
                  file=sys.stderr)  # fmt: skip

    def __call__(self, args: list) -> list:
        """Run the graph on `args` (AOTAutograd's boxed convention: a list, cleared here so
        the inputs can die as early as torch expects)."""
        args = list(args)
        self.calls += 1
        if self.eager is None:
            try:
                if self.calls > 1 and not self.breaks and self.replay_off is None:
                    out = self._replay(args)
                    if out is not None:
                        return out
                self._last_inputs = _specs(args)
                return self._run(args, None)
            except _LazymathFailed as e:
                self.eager = str(e)
                if _debug() >= 1:
                    print(f"[lazymath.torch] {self.kind} graph {self.index} runs in torch "
                          f"eager: lazymath could not realize it ({self.eager})",
                          file=sys.stderr)  # fmt: skip
        out = self.gm(*args)
        return list(out) if isinstance(out, (list, tuple)) else [out]

    # -- the replay path (see lazymath/torch/_replay.py)
    def _replay(self, args: list) -> list | None:
        """This call's outputs from the stored program of its replay signature (traced now if
        the signature is new); None when the signature is not replayed (the per-call path
        runs instead)."""
        key = _replay.signature(args)
        rec = self._stored.get(key, _MISSING)
        if rec is _MISSING:
            return self._record(key, args)
        if rec is None:
            return None
        if rec.perms:
            args = _bases(args, rec.perms)
        leaves = [a for a in args if isinstance(a, torch.Tensor)]
        pending: list = []
        for n, i in rec.views:
            v = self._param_view(n, args[i], self._consts, self._view_lowering(n, args[i]),
                                 pending)  # fmt: skip
            if v is None:
                return None
            leaves.append(v)
        self._commit_views(pending, self._consts)
        self._last_inputs = rec.specs
        self.replays += 1
        if rec.bound is not None and _replay.bound_ok():
            arrays = [_replay.np_view(v) if isinstance(v, torch.Tensor) else v.numpy()
                      for v in leaves]  # fmt: skip
            return rec.run(arrays, leaves)
        outs = rec.jitted(*[_to_lm(a) if isinstance(a, torch.Tensor) else a for a in args],
                          *leaves[len(leaves) - len(rec.views):])  # fmt: skip
        return rec.wrap(self._realized(outs), leaves)

    @staticmethod
    def _realized(outs: list) -> list:
        """lm.jit's outputs, realized (a call that found a folded 0-d input changed runs the
        traced function eagerly: lazy results)."""
        pending = [t for t in outs if not t.is_realized]
        if pending:
            try:
                lm.realize(*pending)
            except Exception as e:  # noqa: BLE001  (-> the whole graph in torch eager)
                raise _LazymathFailed(f"{type(e).__name__}: {e}") from e
        return outs

    def _view_lowering(self, n: torch.fx.Node, src) -> Callable:
        """The lazy value of parameter view `n` of the parameter `src` (when it is not kept)."""

        def lower():
            a = torch.fx.node.map_arg(n.args, lambda m: _to_lm(src))
            return self._lower(n, a, dict(n.kwargs))

        return lower

    def _record(self, key: tuple, args: list) -> list | None:
        """Trace this call's replay signature with lm.jit: store its program and return the
        call's outputs, or store None (this signature is not replayed; why at
        LAZYMATH_DEBUG=1) and return None."""
        self._stored[key] = None
        self.traces += 1
        views = [(n, self._placeholders[src]) for n, src in self._param_views.items()
                 if isinstance(args[self._placeholders[src]], torch.nn.Parameter)]  # fmt: skip
        n_args = len(args)
        view_at = {n: n_args + i for i, (n, _i) in enumerate(views)}
        # inputs in a permuted layout enter the program as their contiguous base
        # (`_views.dense_order`; the signature holds the strides, so the order is its own)
        perms = {}
        for i, a in enumerate(args):
            o = _views.dense_order(a) if isinstance(a, torch.Tensor) else None
            if o is not None:
                perms[i] = o
        specs = _specs(args)  # (the arguments as torch passed them, for `explain`)
        args = _bases(args, perms)
        template: list = []
        tensor_at: list[int] = []
        last_use = self._last_use

        def traced(*vals):
            env: dict = {}
            lm_of: dict = {}
            keep: list = []

            def as_lm(v):
                if isinstance(v, torch.Tensor):  # a get_attr constant: captured by the trace
                    got = lm_of.get(id(v))
                    if got is None:
                        got = lm_of[id(v)] = _to_lm(v)
                        keep.append(v)
                    return got
                return v

            it = iter(vals[:n_args])
            prev = None
            for n in self.nodes:
                # dead values dropped as in `_run`: a lazy value still referenced at the
                # realize becomes a program output with its own buffer
                for m in last_use.get(prev, ()):
                    env.pop(m, None)
                prev = n
                a = kw = None
                if n.op == "placeholder":
                    v = next(it)
                    o = perms.get(self._placeholders[n])
                    env[n] = v if o is None else lm.permute_dims(v, _views.inverse(o))
                elif n.op == "get_attr":
                    env[n] = getattr(self.gm, n.target)
                elif n.op == "call_function":
                    if n in view_at:
                        env[n] = vals[view_at[n]]
                        continue
                    a = torch.fx.node.map_arg(n.args, lambda m: env[m])
                    kw = torch.fx.node.map_arg(n.kwargs, lambda m: env[m])
                    if n.target is operator.getitem or n.target in PYTHON_TARGETS:
                        env[n] = n.target(*a, **kw)
                    else:
                        env[n] = self._lower(n, _map(a, as_lm), _map(kw, as_lm))
                elif n.op == "output":
                    vb = self._view_base
                    result = torch.fx.node.map_arg(n.args[0], lambda m, vb=vb: env[vb.get(m, m)])
                    env.clear()
                    if not isinstance(result, (list, tuple)) or any(
                        isinstance(v, (list, tuple, dict)) for v in result
                    ):
                        raise _replay.NotReplayed("the graph's output is not a flat list")
                    template.clear()
                    tensor_at.clear()
                    outs = []
                    for i, v in enumerate(result):
                        v = as_lm(v)
                        if isinstance(v, lm.Tensor):
                            tensor_at.append(i)
                            template.append(None)
                            outs.append(v)
                        else:
                            template.append(v)
                    return outs
            raise _replay.NotReplayed("the FX graph has no output node")

        name = f"torch {self.kind} graph {self.index}"
        try:
            view_vals = []
            pending: list = []
            for n, i in views:
                v = self._param_view(n, args[i], self._consts, self._view_lowering(n, args[i]),
                                     pending)  # fmt: skip
                if v is None:
                    raise _replay.NotReplayed(f"parameter view {n.name} is not a tensor")
                view_vals.append(v)
            self._commit_views(pending, self._consts)
            jitted = _replay.make_jitted(traced, name)
            lm_args = [_to_lm(a) if isinstance(a, torch.Tensor) else a for a in args]
            outs = self._realized(jitted(*lm_args, *view_vals))
            rec = _replay.Stored(jitted, template, tensor_at)
        except _LazymathFailed:
            raise
        except Exception as e:  # noqa: BLE001  (any failure: the per-call path decides)
            if _debug() >= 1:
                print(f"[lazymath.torch] {name}: this signature is not replayed, each call "
                      f"lowers the graph again ({type(e).__name__}: {e})",
                      file=sys.stderr)  # fmt: skip
            return None
        rec.views = views
        rec.perms = perms
        rec.post = tuple((pos, chain) for pos, (_b, chain) in self._out_views.items())
        rec.specs = specs
        self._stored[key] = rec
        self._last_inputs = rec.specs
        leaves = [a for a in args if isinstance(a, torch.Tensor)] + view_vals
        return rec.wrap(outs, leaves)

    def _param_view(self, n: torch.fx.Node, src, consts: dict, lower: Callable,
                    pending: list):  # fmt: skip
        """The value of `n` = t/transpose/permute of the parameter `src`, kept across calls
        realized. Weights are constant between optimizer steps, yet a Linear lowers to
        mm(x, t(w)) and the transposed weight was copied by a kernel on every call (4 copies
        of the GPT block's weights per forward). The key is the parameter object (weakref),
        its storage pointer and its version counter (bumped by every in-place update, e.g.
        an optimizer step, and a `.data =` swap changes the pointer), so a changed weight is
        not served stale. Not seen: in-place writes through `w.data` (a tensor with its own
        version counter; autograd misses them too) — the reason only inference graphs keep
        views: old-style training loops update `p.data` in place. None when `src` is not a
        Parameter (activations change every call).

        A view not kept yet is returned lazy and listed in `pending`: the caller realizes
        every pending view together, with the call's own program where it has one
        (`_commit_views` after the realize). Realized one by one before the first call's
        program, the GPT block's 4 weight transposes were 4 programs compiled one after
        another (~0.26 s of its cold call); inside it their copy kernels compile in parallel
        with the rest, and the matmuls read the same contiguous (K, N) buffers as they read
        the kept views later, so the replay's kernels are the first call's."""
        if not isinstance(src, torch.nn.Parameter):
            return None
        key = (src.data_ptr(), src._version, tuple(src.shape), src.stride(), src.dtype)
        got = consts.get(n.name)
        if got is not None and got[0]() is src and got[1] == key:
            self.const_hits += 1
            return got[2]
        res = lower()
        if not isinstance(res, lm.Tensor):
            return None
        pending.append((n.name, weakref.ref(src), key, res))
        return res

    @staticmethod
    def _commit_views(pending: list, consts: dict) -> None:
        """Realize the `pending` parameter views (those not realized yet, in one program) and
        keep them in `consts`; the list is emptied."""
        todo = [p[3] for p in pending if not p[3].is_realized]
        if todo:
            try:
                lm.realize(*todo)
            except Exception as e:  # noqa: BLE001  (-> the whole graph in torch eager)
                raise _LazymathFailed(f"{type(e).__name__}: {e}") from e
        for name, ref, key, res in pending:
            consts[name] = (ref, key, res)
        pending.clear()

    def _run(self, args: list, sink: list | None, consts: dict | None = None) -> list:
        if consts is None:
            consts = self._consts
        env: dict = {}
        lm_of: dict = {}  # id(torch tensor) -> its lazymath leaf, once per call
        keep: list = []  # the torch tensors lm_of's ids refer to stay alive during the call
        segments = 0
        it = iter(args)
        last_use = self._last_use
        # parameter views not kept yet: realized with the call's first program (`_param_view`;
        # `explain` realizes them on their own, so its segments show what later calls run)
        views: list = []

        def as_lm(v):
            if isinstance(v, torch.Tensor):
                got = lm_of.get(id(v))
                if got is None:
                    got = lm_of[id(v)] = _to_lm(v)
                    keep.append(v)
                return got
            return v

        def flush(live: list | None = None):
            # what later nodes still read (or the graph's outputs): dead values are not computed
            nonlocal segments
            if live is None:
                live = [t for v in env.values() for t in _flatten(v)
                        if isinstance(t, lm.Tensor) and not t.is_realized]  # fmt: skip
            if sink is not None and live:
                sink.append(lm.explain(*live))
            if live:
                try:
                    lm.realize(*live, *(p[3] for p in views))
                except Exception as e:  # noqa: BLE001  (-> the whole graph in torch eager)
                    raise _LazymathFailed(f"{type(e).__name__}: {e}") from e
                segments += 1
            self._commit_views(views, consts)

        def as_torch(v):
            if isinstance(v, lm.Tensor):
                return _to_torch(v)
            return v

        prev = None
        for n in self.nodes:
            for m in last_use.get(prev, ()):
                env.pop(m, None)
            prev = n
            a = kw = res = None  # (locals would keep a dead value alive too)
            if n.op == "placeholder":
                env[n] = next(it)
            elif n.op == "get_attr":
                env[n] = getattr(self.gm, n.target)
            elif n.op == "call_function":
                a = torch.fx.node.map_arg(n.args, lambda m: env[m])
                kw = torch.fx.node.map_arg(n.kwargs, lambda m: env[m])
                if n.target is operator.getitem or n.target in PYTHON_TARGETS:
                    env[n] = n.target(*a, **kw)
                    continue
                if n.name not in self.breaks and n in self._param_views:
                    try:
                        res = self._param_view(
                            n, env[self._param_views[n]], consts,
                            lambda n=n, a=a, kw=kw: self._lower(n, _map(a, as_lm), _map(kw, as_lm)),
                            views,
                        )  # fmt: skip
                        if sink is not None:  # explain: on their own (see `views`)
                            self._commit_views(views, consts)
                    except _LazymathFailed:
                        raise
                    except Exception:  # noqa: BLE001  (the ordinary path below decides)
                        res = None
                    if res is not None:
                        env[n] = res
                        continue
                if n.name not in self.breaks:
                    try:
                        res = self._lower(n, _map(a, as_lm), _map(kw, as_lm))
                    except Exception as e:  # noqa: BLE001  (any refusal -> torch eager)
                        why = str(e) if isinstance(e, Unsupported) else (
                            f"lowering raised {type(e).__name__}: {e}")  # fmt: skip
                        self._break(n, why)
                    else:
                        env[n] = res
                        continue
                # graph break: realize what the eager node reads (with every value a later
                # node reads, one lazymath graph), run it in torch
                if any(isinstance(v, lm.Tensor) for v in _flatten([a, kw])):
                    flush()
                env[n] = n.target(*_map(a, as_torch), **_map(kw, as_torch))
            elif n.op == "output":
                vb = self._view_base
                result = torch.fx.node.map_arg(n.args[0], lambda m, vb=vb: env[vb.get(m, m)])
                env.clear()
                flush([v for v in _flatten(result) if isinstance(v, lm.Tensor)])
                self.segments = segments
                if not isinstance(result, (list, tuple)):
                    return [_map(result, as_torch)]
                out = list(_map(result, as_torch))
                for pos, (_b, chain) in self._out_views.items():
                    out[pos] = _views.apply(chain, out[pos])
                return out
        raise RuntimeError("lazymath.torch: the FX graph has no output node")

    def _lower(self, n: torch.fx.Node, a: tuple, kw: dict):
        """The lazy lazymath value(s) of node `n`, checked against its FakeTensor metadata:
        dtypes are made torch's (type promotion differs between numpy and torch for 0-d
        tensors and integer division), a shape that differs is a lowering bug -> Unsupported
        (the node then runs in torch; never a wrong answer)."""
        if any(isinstance(v, torch.Tensor) for v in _flatten([a, kw])):
            raise Unsupported("an input stays a torch tensor (dtype or device lazymath has not)")
        meta = n.meta.get("val")
        if isinstance(meta, (list, tuple)):
            # outputs nobody reads get None: a lowering may skip work only they need
            used = {u.args[1] for u in n.users if u.target is operator.getitem}
            meta = type(meta)(m if i in used else None for i, m in enumerate(meta))
        res = lowering_for(n.target)(meta, *a, **kw)
        if isinstance(meta, (list, tuple)):
            if not isinstance(res, (list, tuple)) or len(res) != len(meta):
                raise Unsupported("the lowering returned a different number of outputs")
            return type(res)(self._fix(r, m) for r, m in zip(res, meta))
        return self._fix(res, meta)

    @staticmethod
    def _fix(r, m):
        if not isinstance(m, torch.Tensor):
            return r
        if not isinstance(r, lm.Tensor):
            r = lm.full((), r, dtype=np_dtype(m.dtype))
        if _concrete(m.shape) and tuple(r.shape) != tuple(m.shape):
            raise Unsupported(f"shape {tuple(r.shape)} where torch has {tuple(m.shape)}")
        want = np_dtype(m.dtype)
        return r if r.dtype == want else lm.astype(r, want)

    def explain(self) -> str:
        """What this graph became: node counts, graph breaks, and `lm.explain` of every
        lazymath segment (traced again on zeros of the last call's shapes; nothing of the
        user's data is kept)."""
        head = (f"{self.kind} graph {self.index}: {self.n_ops} ATen nodes, "
                f"{len(self.breaks)} graph break(s), {self.segments} lazymath segment(s) per "
                f"call, {self.calls} call(s)")  # fmt: skip
        lines = [head]
        if self.eager is not None:
            lines.append(f"  the whole graph runs in torch eager: {self.eager}")
            return "\n".join(lines)
        for name, why in self.breaks.items():
            lines.append(f"  graph break: node {name} = {why} -> torch eager")
        if self.breaks:
            lines.append("  replay: off (a graph with breaks lowers its nodes on every call)")
        else:
            stored = sum(1 for r in self._stored.values() if r is not None)
            off = self.traces - stored
            lines.append(f"  replay: {self.replays} call(s) replayed from {stored} stored "
                         f"program(s); {off} signature(s) not replayed")  # fmt: skip
        if self._last_inputs is not None:
            args = [_zeros_like_spec(v) for v in self._last_inputs]
            sink: list = []
            consts: dict = {}
            with torch.no_grad():
                self._run(args, sink, consts)
            if consts:
                lines.append(
                    f"  {len(consts)} parameter view(s) (t/transpose/permute of a weight) "
                    "realized once, reused while the weight is unchanged"
                )
            for i, text in enumerate(sink):
                lines.append(f"-- segment {i + 1} of {len(sink)} --")
                lines.append(str(text))
        return "\n".join(lines)


class Session:
    """The graphs one compiled model (or the registered backend) produced, for `explain`."""

    def __init__(self, options: dict | None = None):
        self.options = dict(options or {})
        self.graphs: list[CompiledGraph] = []

    def compiler(self, kind: str) -> Callable:
        def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence) -> Callable:
            g = CompiledGraph(gm, kind, len(self.graphs) + 1)
            self.graphs.append(g)

            def run(args: list) -> list:
                return g(args)

            run._boxed_call = True  # AOTAutograd passes the argument list itself
            return run

        return compile_graph

    def backend(self) -> Callable:
        return aot_autograd(
            fw_compiler=self.compiler("forward"),
            bw_compiler=self.compiler("backward"),
            inference_compiler=self.compiler("inference"),
            decompositions=DECOMPOSITIONS,
        )

    def explain(self) -> str:
        if not self.graphs:
            return "lazymath.torch: nothing compiled yet (call the compiled model once)"
        return "\n\n".join(g.explain() for g in self.graphs)


_DEFAULT = Session()


def backend(gm: torch.fx.GraphModule, example_inputs: Sequence, **kwargs: Any) -> Callable:
    """The Dynamo backend ``"lazymath"``: AOTAutograd with lazymath compiling the forward,
    backward and inference graphs. Graphs compiled through the name go to a module-level
    session (`explain()` with no argument shows them)."""
    return _DEFAULT.backend()(gm, example_inputs, **kwargs)


_COMPILE_OPTIONS = ("dynamic", "fullgraph", "mode_options")


def compile(model_or_fn: Callable, **options: Any) -> Callable:
    """`torch.compile(model_or_fn, backend=<lazymath>)` with its own session, so
    `lm.explain(compiled)` shows this model's graphs. Options: ``dynamic`` (None/True/False,
    torch.compile's), ``fullgraph`` (bool: Dynamo must capture one graph, a Python-level break
    is an error). Any other keyword is a TypeError."""
    unknown = set(options) - {"dynamic", "fullgraph"}
    if unknown:
        raise TypeError(f"lazymath.torch.compile: unknown option(s) {sorted(unknown)}; known: "
                        "dynamic, fullgraph")  # fmt: skip
    if not callable(model_or_fn):
        raise TypeError(f"lazymath.torch.compile: expected a torch.nn.Module or a function, got "
                        f"{type(model_or_fn).__name__}")  # fmt: skip
    session = Session(options)
    compiled = torch.compile(model_or_fn, backend=session.backend(),
                             dynamic=options.get("dynamic"),
                             fullgraph=bool(options.get("fullgraph", False)))  # fmt: skip
    try:
        object.__setattr__(compiled, "_lazymath_session", session)
    except (AttributeError, TypeError):
        _SESSIONS[id(compiled)] = (weakref.ref(compiled), session)
    return compiled


_SESSIONS: dict = {}


def _session_of(obj) -> Session:
    s = getattr(obj, "_lazymath_session", None) if obj is not None else None
    if s is None and obj is not None:
        ref = _SESSIONS.get(id(obj))
        if ref is not None and ref[0]() is obj:
            s = ref[1]
    return s or _DEFAULT


def explain(compiled: Callable | None = None) -> str:
    """What a compiled model became: per FX graph (forward, backward, inference) the ATen node
    count, each graph break (node, ATen op, why) and `lm.explain` of each lazymath segment.
    Without an argument: the graphs compiled through ``backend="lazymath"``."""
    return _api.Explanation(_session_of(compiled).explain())


def _explain_hook(obj) -> str | None:
    """lm.explain(obj) for a compiled torch model or function (or any torch module: the
    graphs compiled through backend="lazymath"); None for anything else."""
    if isinstance(obj, lm.Tensor):
        return None
    if (
        hasattr(obj, "_lazymath_session")
        or isinstance(obj, torch.nn.Module)
        or (callable(obj) and hasattr(obj, "_torchdynamo_orig_callable"))
    ):
        return explain(obj)
    if id(obj) in _SESSIONS:
        return explain(obj)
    return None


_api.EXPLAIN_HOOKS.append(_explain_hook)

if "lazymath" not in _COMPILER_FNS and _BACKENDS.get("lazymath") is None:
    # without the installed entry point (a source checkout), importing lazymath.torch makes
    # the name work; with it, torch loads `backend` through the entry point itself
    register_backend(compiler_fn=backend, name="lazymath")
