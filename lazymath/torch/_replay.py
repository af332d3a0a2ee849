"""The replay path of a compiled torch graph: traced once per input signature, then launched.

Why: re-running a graph's lowerings on every call (ATen node -> lazymath op calls, graph
capture, signature hashing) cost ~90 % of a small model's call (an MLP at batch 1: 237 us per
call against 17 us in eager; the program itself ~20 us). A graph without graph breaks is
instead traced by `lm.jit` once per *replay signature* (below) into a stored program; later
calls with that signature bind the torch tensors' buffers (numpy views of the same memory, no
copy) to the program, launch it into output buffers torch allocated (fresh per call: outputs
are never aliased across calls), and hand those tensors back as they are.

The replay signature, everything that can change the program or its result besides the data:
  - per argument: a tensor's shape, strides, dtype and class (an nn.Parameter may feed a kept
    parameter view, see `CompiledGraph._param_view`), any other value (a SymInt's size, None)
    by type and value;
  - the settings a stored program depends on (backend, host target, scalar arguments, host
    math: a cheap key of their raw values, as lm.jit's) and the current device (the preset).
The data is never part of it: inputs (parameters included) are read in place on every call,
so an in-place update of an input or a parameter between calls is seen; a kept parameter view
is revalidated per call against the parameter's storage pointer and version counter.

Not replayed (the per-call lowering path runs instead): graphs with graph breaks (their
segments are realized around the torch eager nodes), signatures whose trace failed or left
no stored program (an output that is a captured constant, or a trace that read input data on
the host: lm.jit's realize watch keeps no program then). Values the trace made on the host
without reading data (the causal mask's aranges) are kept as constants of the program. When
the program does not qualify for the bound launch (long programs, folded 0-d
inputs, a profiler running) the call goes through `lm.jit`'s own, still without re-lowering.
A short program on several streams takes the bound launch too, its kernels in schedule order
on the caller's thread (`BoundReplay.make(in_order=True)`): the MLP's training step at batch
1 spent ~1 ms per call in the streams' hand-offs of its backward graph.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from lazymath import settings
from lazymath.runtime import api as _rt_api
from lazymath.runtime import profiler as _prof
from lazymath.runtime.replay import BoundReplay
from lazymath.staging import Jitted
from lazymath.torch import _lm as lm
from lazymath.torch._aten import TORCH_TO_NP
from lazymath.torch._views import apply as apply_views

__all__ = ["NotReplayed", "Stored", "signature", "np_view"]

_settings_state = settings.state_key(
    settings.BACKEND, settings.TARGET_CPU, settings.SCALAR_ARGS, settings.HOST_MATH
)
_BF16 = np.dtype(lm.bfloat16)
_NP_TO_TORCH = {np.dtype(v): k for k, v in TORCH_TO_NP.items()}
_Tensor = torch.Tensor


class NotReplayed(Exception):
    """A graph (or a signature of it) the replay path does not take: the per-call path runs."""


def signature(args: Sequence) -> tuple:
    """The replay signature of a call's arguments (see the module docstring)."""
    key: list = [_settings_state(), _rt_api._CURRENT]
    for a in args:
        if isinstance(a, _Tensor):
            key.append((a.shape, a.stride(), a.dtype, a.__class__))
        else:
            key.append((a.__class__, a))
    return tuple(key)


def np_view(t: torch.Tensor) -> np.ndarray:
    """A CPU torch tensor as a C-contiguous numpy array: its own memory when it is
    C-contiguous (numpy's sense: strides of size-1 dims do not matter), else a copy, which is
    what the trace's leaf was (lazymath shares contiguous buffers only). bfloat16 goes through
    its uint16 bits (torch's numpy bridge has no bfloat16)."""
    if t.requires_grad:
        t = t.detach()
    if t.dtype == torch.bfloat16:
        a = t.view(torch.uint16).numpy().view(_BF16)
    else:
        a = t.numpy()
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def _empty(shape: tuple, dtype: np.dtype) -> tuple[torch.Tensor, np.ndarray]:
    """A fresh torch tensor (torch's allocator, 64-byte aligned) and a numpy view of it."""
    tdt = _NP_TO_TORCH[dtype]
    if tdt == torch.bfloat16:
        t = torch.empty(shape, dtype=torch.bfloat16)
        return t, t.view(torch.uint16).numpy().view(_BF16)
    t = torch.empty(shape, dtype=tdt)
    return t, t.numpy()


def _lm_to_torch(x: lm.Tensor) -> torch.Tensor:
    """A realized lazymath tensor as a torch tensor over the same buffer (as the per-call
    path hands results over)."""
    if x.dtype == lm.bfloat16:
        return torch.from_dlpack(x.numpy().view(np.uint16)).view(torch.bfloat16)
    return torch.from_dlpack(x)


class Stored:
    """One replay signature's stored program: the `lm.jit` stage that traced the graph, and,
    when the program qualifies, its bound launch (`BoundReplay.run_into`) with the output
    plan.

    `outputs` is the graph's flat output list as a template: a tensor position holds
    (True, -1, j) for program output j or (True, k, -1) for tensor leaf k returned as it is
    (an input, or a kept parameter view); any other position holds (False, value, 0), the
    value the trace returned there (None, a size: fixed for the signature)."""

    __slots__ = ("jitted", "bound", "slots", "outputs", "views", "specs", "perms", "post")

    def __init__(self, jitted: Jitted, template: list, tensor_at: list[int]):
        self.jitted = jitted
        self.slots: tuple = ()
        self.views: list = []  # (parameter view node, argument index): extra tensor leaves
        self.specs: list = []  # the signature's argument specs, for `explain`
        self.perms: dict = {}  # argument index -> dim order of its contiguous base
        self.post: tuple = ()  # (output position, view chain made in torch on its base)
        entries = list(jitted._entries.values())
        if len(entries) != 1:
            # lm.jit keeps no entry when the trace read values computed from its inputs on
            # the host (its realize watch: a gather such as lm.nn.embedding's, an index
            # check, .numpy()): a replay would serve this call's values to every call
            raise LookupError("lm.jit kept no program for this signature (the trace read "
                              "input data on the host: a gather, an index check)")  # fmt: skip
        entry = entries[0]
        # Any other program leaf that is no input (`fixed`) was made without reading the data:
        # a graph constant (get_attr) or a value of the signature alone (the causal mask's
        # aranges, a full/zeros): the same on every call, so it is kept like a constant.
        self.bound = None
        bound = entry.bound
        if bound is None and not entry.long and not entry.prog.inline:
            # a short program on several streams (a backward graph's independent gradient
            # matmuls): in order on this thread beats the streams' hand-offs per call
            bound = BoundReplay.make(entry.prog, entry.leaf_src, entry.fixed, in_order=True)
        if bound is not None and not entry.checks:
            prog = entry.prog
            slots = [prog.slots[s] for s in prog.outputs]
            if all(o[4] is None for o in entry.outs if o[0] < 0) and all(
                s.dtype in _NP_TO_TORCH for s in slots
            ):
                self.bound = bound
                self.slots = tuple((s.shape, s.dtype) for s in slots)
        outputs = [(False, v, 0) for v in template]
        if len(tensor_at) != len(entry.outs):
            raise LookupError("lm.jit's outputs do not match the graph's tensor outputs")
        for pos, o in zip(tensor_at, entry.outs):
            outputs[pos] = (True, o[0], o[1])
        self.outputs = outputs

    def run(self, arrays: list[np.ndarray], leaves: list) -> list:
        """The bound launch on `arrays` (per tensor leaf, C-contiguous); `leaves` are the
        torch tensors (or realized lazymath parameter views) behind them, for outputs that
        return a leaf as it is."""
        dev = _rt_api._CURRENT or _rt_api.current_device()
        outs_t, outs_np = [], []
        for shape, dtype in self.slots:
            t, a = _empty(shape, dtype)
            outs_t.append(t)
            outs_np.append(a)
        self.bound.run_into(arrays, outs_np, dev)
        result = []
        for is_tensor, k, j in self.outputs:
            if not is_tensor:
                result.append(k)
            elif k < 0:
                result.append(outs_t[j])
            else:
                v = leaves[k]
                result.append(v if isinstance(v, _Tensor) else _lm_to_torch(v))
        for pos, chain in self.post:
            result[pos] = apply_views(chain, result[pos])
        return result

    def wrap(self, outs: list, leaves: list) -> list:
        """The graph's outputs from `lm.jit`'s own call (`outs`: its lazymath tensors, one
        per tensor output, realized), as the per-call path hands them over."""
        it = iter(outs)
        result = []
        for is_tensor, k, _j in self.outputs:
            if not is_tensor:
                result.append(k)
                continue
            x = next(it)
            v = leaves[k] if k >= 0 else None
            result.append(v if isinstance(v, _Tensor) else _lm_to_torch(x))
        for pos, chain in self.post:
            result[pos] = apply_views(chain, result[pos])
        return result


def bound_ok() -> bool:
    """Whether the bound launch may run now: a running profiler wants the general path
    (it times kernels through the device's streams)."""
    return _prof._ACTIVE is None


def make_jitted(fn: Callable, name: str) -> Jitted:
    """An `lm.jit` stage of `fn` with a program per concrete shape (torch's guards decide
    shapes; lm.jit's automatic dynamic batch would change the program under them)."""
    fn.__qualname__ = name
    return Jitted(fn, dynamic=False)
