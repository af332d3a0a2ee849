"""Views across the boundary: graph outputs that are views, inputs in a permuted layout.

Why: AOTAutograd's forward graph also returns what the backward saves, and much of that is
views: `permute(weight)` (each Linear's transposed weight), `view(layer_norm(x))`, the
attention output's `alias`. A lazymath output is a buffer of its own, so each such view cost
a copy kernel per call (the GPT block's training forward: 8 of its 21 kernels, four of them
its weights transposed; eager and Inductor save views). Now the *base* of such a view is the
output instead (a graph input as it is, or the buffer lazymath computes for the value the
view reads) and the view ops run in torch on it, as eager makes them: metadata only.

The backward graph then receives, e.g., a transposed weight: a non-contiguous tensor, which
lazymath (it shares contiguous buffers only) would copy on every call. A tensor whose
strides are a permutation of a contiguous layout (`dense_order`) crosses instead as its
contiguous base plus a lazy `permute_dims`, which its consumers read through strides (a
matmul operand's packing absorbs the transpose).
"""

from __future__ import annotations

import torch

from lazymath.torch._aten import TORCH_TO_NP

__all__ = ["VIEW_OPS", "apply", "dense_order", "inverse", "output_views"]

aten = torch.ops.aten

# ATen view ops whose result is a view of their one tensor input: an output made by a chain
# of them is rebuilt in torch from its base (slices and splits are not among them: their
# result is not dense, and the backward would copy it)
VIEW_OPS = frozenset({
    aten.view.default, aten._unsafe_view.default, aten.permute.default, aten.t.default,
    aten.transpose.int, aten.alias.default, aten.unsqueeze.default, aten.squeeze.dim,
    aten.squeeze.dims, aten.squeeze.default,
})  # fmt: skip


def dense_order(t: torch.Tensor) -> tuple[int, ...] | None:
    """The dims of `t`, outermost first, when `t` is a non-contiguous permutation of a
    contiguous layout (`t.permute(order)` is contiguous: no copy); None for a contiguous
    tensor and for any other layout (gaps, overlaps, broadcasts)."""
    if t.ndim < 2 or t.is_contiguous():
        return None
    order = tuple(sorted(range(t.ndim), key=lambda d: (-t.stride(d), -t.shape[d], d)))
    return order if t.permute(order).is_contiguous() else None


def inverse(order: tuple[int, ...]) -> tuple[int, ...]:
    """The permutation that undoes `order`: t.permute(order).permute(inverse(order)) is t."""
    inv = [0] * len(order)
    for i, d in enumerate(order):
        inv[d] = i
    return tuple(inv)


def apply(chain: tuple[torch.fx.Node, ...], t: torch.Tensor) -> torch.Tensor:
    """The view ops of `chain` (FX nodes, base first) applied in torch to `t`."""
    for n in chain:
        t = n.target(t, *n.args[1:], **n.kwargs)
    return t


def _concrete(shape) -> bool:
    return all(isinstance(s, int) for s in shape)


def _chain_ok(base: torch.fx.Node, chain: tuple[torch.fx.Node, ...]) -> bool:
    """Whether `chain` applied to what `base` becomes at run time is a valid view whose layout
    the backward takes without a copy: a graph input keeps its traced strides, a computed
    value is a contiguous lazymath buffer (tried on meta tensors: a `view` of a transposed
    base would fail in torch)."""
    meta = base.meta.get("val")
    if not isinstance(meta, torch.Tensor) or meta.dtype not in TORCH_TO_NP:
        return False
    if not _concrete(meta.shape) or not _concrete(meta.stride()):
        return False
    try:
        if base.op == "placeholder":
            t = torch.empty_strided(meta.shape, meta.stride(), dtype=meta.dtype, device="meta")
        else:
            t = torch.empty(meta.shape, dtype=meta.dtype, device="meta")
        r = apply(chain, t)
    except Exception:  # noqa: BLE001  (not a valid view of this base: copied as before)
        return False
    return r.is_contiguous() or dense_order(r) is not None


def output_views(nodes: list[torch.fx.Node]) -> dict[int, tuple[torch.fx.Node, tuple]]:
    """Output position -> (base node, the chain of view nodes from it to the output) for each
    output of a flat output list made by `VIEW_OPS` alone from a base (any node that is not
    one), when the chain is valid on the base's run-time layout (`_chain_ok`)."""
    out = next((n for n in reversed(nodes) if n.op == "output"), None)
    if out is None or not isinstance(out.args[0], (list, tuple)):
        return {}
    found: dict[int, tuple[torch.fx.Node, tuple]] = {}
    for pos, v in enumerate(out.args[0]):
        if not isinstance(v, torch.fx.Node):
            continue
        chain: list[torch.fx.Node] = []
        n = v
        while (n.op == "call_function" and n.target in VIEW_OPS and n.args
               and isinstance(n.args[0], torch.fx.Node)
               and len(n.all_input_nodes) == 1):  # fmt: skip
            chain.append(n)
            n = n.args[0]
        if not chain or n.op not in ("placeholder", "call_function"):
            continue
        chain.reverse()
        if _chain_ok(n, tuple(chain)):
            found[pos] = (n, tuple(chain))
    return found
