"""Neural-network operators with torch's semantics (``torch.nn.functional``), lazy and fusing.

    import lazymath as lm
    y = lm.nn.gelu(lm.nn.linear(x, w, b))               # one Cube kernel with its epilogue
    o = lm.nn.scaled_dot_product_attention(q, k, v, is_causal=True)

A thin public module (issue 33): every function here is a composition of registered ops
(`lazymath.graph.ops`: erf, tanh, sigmoid, rsqrt, matmul, the reductions, where, ...), so the
planner fuses it like user code -- gelu after a matmul is a Cube epilogue, layer_norm and
rms_norm are one row-resident Vector kernel, attention's softmax joins its QK^T matmul -- and
nothing here has its own kernel, cache or backend path. Argument names and defaults follow
torch so the torch.compile backend (`lazymath.torch`) can map calls one to one; what torch
rejects is rejected here with a Python exception at the call.

Random numbers (dropout) come from a counter-based generator: the keep/drop decision of an
element is a hash of (its flat index, the seed), computed inside the kernel from index
vectors, so the same seed gives the same mask on every backend, preset and block split, and
no random tensor is ever stored or transferred. The seed enters as a 0-d uint32 tensor (a
kernel input, not a constant), so a new seed reuses the compiled program.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence

import numpy as np

from lazymath import dtypes as dt
from lazymath._lazy import deferred
from lazymath.array_api import take
from lazymath.functions import (
    arange,
    broadcast_shapes,
    broadcast_to,
    erf,
    exp,
    expand_dims,
    matmul,
    mean,
    rsqrt,
    sigmoid,
    softmax,
    swapaxes,
    tanh,
    tensor,
    var,
    where,
    zeros,
)
from lazymath.functions import (
    max as rowmax,
)
from lazymath.functions import (
    sum as rowsum,
)
from lazymath.graph import custom
from lazymath.graph import node as gn
from lazymath.tensor import Tensor, default_device, wrap

# The attention kernels' definitions (registered when it loads): the NPU templates (~100 ms with
# the ISA) load with the first attention, not with lm.nn.
attention = deferred("lazymath.backend.npu.templates.attention")

__all__ = [
    "dropout",
    "embedding",
    "gelu",
    "layer_norm",
    "linear",
    "rms_norm",
    "scaled_dot_product_attention",
    "silu",
]

_SQRT1_2 = 1.0 / math.sqrt(2.0)
_SQRT_2_PI = math.sqrt(2.0 / math.pi)


def _t(x, fn: str) -> Tensor:
    """x as a Tensor (numpy arrays and scalars are wrapped); anything else is a TypeError."""
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (np.ndarray, np.generic, int, float, list, tuple)):
        return tensor(x)
    raise TypeError(f"lm.nn.{fn}: expected a tensor, got {type(x).__name__}")


def _float(x: Tensor, fn: str) -> Tensor:
    if x.dtype.kind not in "fc" and not dt.is_bf16(x.dtype):  # ml_dtypes' bfloat16 has kind 'V'
        raise TypeError(f"lm.nn.{fn}: expected a floating tensor, got {x.dtype}")
    return x


# ----------------------------------------------------------------------------- activations


def gelu(x, approximate: str = "none") -> Tensor:
    """x * Phi(x): ``0.5 x (1 + erf(x / sqrt 2))``, or with ``approximate="tanh"`` torch's
    ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``. Elementwise: it fuses into its
    producer's kernel (a matmul's epilogue, a Vector chain)."""
    x = _float(_t(x, "gelu"), "gelu")
    if approximate == "none":
        return x * (erf(x * _SQRT1_2) + 1.0) * 0.5
    if approximate == "tanh":
        inner = (x + x * x * x * 0.044715) * _SQRT_2_PI
        return x * (tanh(inner) + 1.0) * 0.5
    raise ValueError(f"lm.nn.gelu: approximate must be 'none' or 'tanh', got {approximate!r}")


def silu(x) -> Tensor:
    """x * sigmoid(x) (swish); the accurate sigmoid keeps the negative tail's denormals."""
    x = _float(_t(x, "silu"), "silu")
    return x * sigmoid(x)


# ----------------------------------------------------------------------------- normalization


def _norm_shape(x: Tensor, normalized_shape, fn: str) -> tuple[int, ...]:
    ns = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not all(isinstance(d, (int, np.integer)) for d in ns):
        raise TypeError(f"lm.nn.{fn}: normalized_shape must be ints, got {normalized_shape!r}")
    ns = tuple(int(d) for d in ns)
    if not ns or len(ns) > x.ndim or tuple(x.shape[x.ndim - len(ns) :]) != ns:
        raise ValueError(
            f"lm.nn.{fn}: normalized_shape {list(ns)} must be the trailing dimensions of the "
            f"input, got input of shape {list(x.shape)}"
        )
    return ns


def _rows(x: Tensor, ns: tuple[int, ...]) -> Tensor:
    """x with the normalized dimensions flattened into one last axis (the row kernel's rows)."""
    if len(ns) == 1:
        return x
    return x.reshape(*x.shape[: x.ndim - len(ns)], math.prod(ns))


def _affine(y: Tensor, w, b, ns: tuple[int, ...], fn: str) -> Tensor:
    """y * w + b with w, b of the normalized shape (flattened like the rows)."""
    for name, p in (("weight", w), ("bias", b)):
        if p is None:
            continue
        p = _t(p, fn)
        if tuple(p.shape) != ns:
            raise ValueError(
                f"lm.nn.{fn}: {name} must have the normalized shape {list(ns)}, got {list(p.shape)}"
            )
        p = p.reshape(math.prod(ns)) if len(ns) > 1 else p
        y = y * p if name == "weight" else y + p
    return y


def layer_norm(x, normalized_shape, weight=None, bias=None, eps: float = 1e-5) -> Tensor:
    """(x - mean) / sqrt(var + eps) * weight + bias over the trailing `normalized_shape`
    dimensions (biased variance, as torch). One row kernel: the row stays in UB between the
    mean, the variance and the write (or streams in two passes when a row exceeds UB)."""
    x = _float(_t(x, "layer_norm"), "layer_norm")
    ns = _norm_shape(x, normalized_shape, "layer_norm")
    r = _rows(x, ns)
    mu = mean(r, axis=-1, keepdims=True)
    y = (r - mu) * rsqrt(var(r, axis=-1, keepdims=True) + float(eps))
    return _affine(y, weight, bias, ns, "layer_norm").reshape(*x.shape)


def rms_norm(x, normalized_shape, weight=None, eps: float | None = None) -> Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the trailing `normalized_shape` dimensions;
    eps None is the dtype's machine epsilon (torch's default). One row kernel."""
    x = _float(_t(x, "rms_norm"), "rms_norm")
    ns = _norm_shape(x, normalized_shape, "rms_norm")
    if eps is None:
        eps = float(np.finfo(x.dtype).eps)
    r = _rows(x, ns)
    y = r * rsqrt(mean(r * r, axis=-1, keepdims=True) + float(eps))
    return _affine(y, weight, None, ns, "rms_norm").reshape(*x.shape)


# ----------------------------------------------------------------------------- layers


def linear(x, weight, bias=None) -> Tensor:
    """x @ weight.T + bias (weight is (out_features, in_features), as torch stores it). The
    transpose is a view the Cube's packing reads in place; the bias add is the matmul's
    epilogue (one kernel; on the split 910B a Vector kernel after it, see the fusion log)."""
    x, w = _t(x, "linear"), _t(weight, "linear")
    if w.ndim not in (1, 2):
        raise ValueError(f"lm.nn.linear: weight must be 1-D or 2-D, got shape {list(w.shape)}")
    if x.ndim == 0 or x.shape[-1] != w.shape[-1]:
        raise ValueError(
            f"lm.nn.linear: input's last dimension {list(x.shape)[-1:]} does not match "
            f"weight's in_features {w.shape[-1]} (weight shape {list(w.shape)})"
        )
    y = matmul(x, w.T if w.ndim == 2 else w)
    if bias is not None:
        y = y + _t(bias, "linear")
    return y


def embedding(input, weight, padding_idx: int | None = None) -> Tensor:
    """Rows of `weight` (num_embeddings, dim) at the integer indices `input`: shape
    input.shape + (dim,). A gather (`lm.take`), which no Vector template computes lazily
    yet: it realizes the indices and the table at the call. `padding_idx` only affects
    gradients in torch (the forward is the plain lookup); it is validated like torch."""
    idx, w = _t(input, "embedding"), _t(weight, "embedding")
    if idx.dtype.kind not in "iu":
        raise TypeError(f"lm.nn.embedding: indices must be integers, got {idx.dtype}")
    if w.ndim != 2:
        raise ValueError(f"lm.nn.embedding: weight must be 2-D, got shape {list(w.shape)}")
    n = w.shape[0]
    if padding_idx is not None and not -n <= padding_idx < n:
        raise ValueError(f"lm.nn.embedding: padding_idx {padding_idx} out of range for {n} rows")
    host = np.asarray(idx)
    if host.size and (host.min() < 0 or host.max() >= n):
        raise IndexError(f"lm.nn.embedding: index out of range for a table of {n} rows")
    flat = take(w, tensor(host.reshape(-1)), axis=0)
    return flat.reshape(*idx.shape, w.shape[1])


# ----------------------------------------------------------------------------- dropout

_SEEDS = np.random.default_rng()
_SEEDS_LOCK = threading.Lock()


def _i32(c: int) -> int:
    """A 32-bit constant as the int32 with the same bits (int32 products wrap like uint32)."""
    c &= 0xFFFFFFFF
    return c - (1 << 32) if c >= 1 << 31 else c


_M1, _M2, _GOLDEN = _i32(0x85EBCA6B), _i32(0xC2B2AE35), _i32(0x9E3779B9)


def _shr(h: Tensor, k: int) -> Tensor:
    """Logical right shift of int32 bits (the arithmetic shift, then the sign copies masked)."""
    return (h >> k) & ((1 << (32 - k)) - 1)


def _fmix32(h: Tensor) -> Tensor:
    """MurmurHash3's 32-bit finalizer: a bijection of the 32-bit words with full avalanche
    (each input bit flips each output bit with probability ~1/2). On int32 tensors: the
    Vector unit has 32-bit integer multiply, shift and xor (uint32 would go to the AI CPU)."""
    h = h ^ _shr(h, 16)
    h = h * _M1
    h = h ^ _shr(h, 13)
    h = h * _M2
    return h ^ _shr(h, 16)


def _flat_index(shape: tuple[int, ...]) -> Tensor:
    """The C-order flat index of every element of `shape` as int32 bits (wrapping past 2^31),
    from one small arange per dimension broadcast together (never a buffer of the full size)."""
    if math.prod(shape) > 2**32:
        raise ValueError(f"lm.nn.dropout: {math.prod(shape)} elements exceed the 2^32 counter")
    idx = None
    stride = 1
    for ax in range(len(shape) - 1, -1, -1):
        n = shape[ax]
        view = [1] * len(shape)
        view[ax] = n
        col = np.arange(n, dtype=np.int64) * stride
        part = tensor(((col + 2**31) % 2**32 - 2**31).astype(np.int32)).reshape(*view)
        idx = part if idx is None else idx + part
        stride *= n
    if idx is None:
        return zeros((), dtype=dt.int32)
    return broadcast_to(idx, shape)


def keep_mask(shape: Sequence[int], p: float, seed: int) -> Tensor:
    """The bool mask dropout keeps (True with probability 1 - p), counter-based: element i
    keeps when the top 24 bits of fmix32(i * 0x9E3779B9 + k) are >= p * 2^24, k from the
    seed (a Weyl sequence through the murmur finalizer, as splitmix-style counter generators
    do: the map i -> bits is a bijection, so no two elements share a word). The key is a
    0-d int32 tensor, a kernel input: a new seed reruns the same compiled program."""
    shape = tuple(int(d) for d in shape)
    s = int(seed) & (2**64 - 1)
    k = _i32((s ^ (s >> 32)) * 0x2545F491 + 0x6A09E667)
    key = tensor(np.int32(k))
    h = _fmix32(_flat_index(shape) * _GOLDEN + key)
    return _shr(h, 8) >= int(round(p * 2**24))


def dropout(x, p: float = 0.5, training: bool = True, *, seed: int | None = None) -> Tensor:
    """Zero each element with probability p and scale the rest by 1/(1-p) (torch's default
    training=True); the identity when not training or p == 0. `seed` makes the mask
    reproducible (None draws one from a process-wide generator); the mask is computed in the
    kernel (`keep_mask`), fused with the multiply."""
    x = _float(_t(x, "dropout"), "dropout")
    if not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
        raise ValueError(f"lm.nn.dropout: p must be a probability in [0, 1], got {p!r}")
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return x * 0.0
    if seed is None:
        with _SEEDS_LOCK:
            seed = int(_SEEDS.integers(0, 2**63))
    keep = keep_mask(x.shape, float(p), seed)
    return where(keep, x * (1.0 / (1.0 - p)), 0.0).astype(x.dtype)


# ----------------------------------------------------------------------------- attention


def _causal(L: int, S: int) -> Tensor:
    """torch's is_causal mask: ones(L, S).tril(0), aligned at the top-left corner (query i
    sees keys 0..i, also when L != S)."""
    i = arange(L, dtype=dt.int32).reshape(L, 1)
    j = arange(S, dtype=dt.int32).reshape(1, S)
    return i >= j


def scaled_dot_product_attention(
    query,
    key,
    value,
    attn_mask=None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    seed: int | None = None,
) -> Tensor:
    """softmax(q @ k^T * scale + mask) @ v with torch's semantics: q (..., L, E), k (..., S,
    E), v (..., S, Ev) with broadcasting batch dimensions; scale 1/sqrt(E) by default;
    attn_mask bool (True = attend) or float (added), broadcast to (..., L, S); is_causal the
    top-left-aligned lower triangle; a fully masked row gives zeros (torch's CPU kernels);
    enable_gqa repeats k/v heads (dim -3) to q's; dropout_p drops attention weights (`seed`
    as in `dropout`).

    Composed from registered ops: the score matmul, the mask and the softmax fuse (the
    softmax joins the QK^T kernel in its online form where the planner allows), then the PV
    matmul."""
    q = _float(_t(query, "scaled_dot_product_attention"), "scaled_dot_product_attention")
    k = _float(_t(key, "scaled_dot_product_attention"), "scaled_dot_product_attention")
    v = _float(_t(value, "scaled_dot_product_attention"), "scaled_dot_product_attention")
    fn = "lm.nn.scaled_dot_product_attention"
    if q.ndim < 2 or k.ndim < 2 or v.ndim < 2:
        raise ValueError(f"{fn}: query, key and value need at least 2 dimensions")
    L, E = q.shape[-2:]
    S = k.shape[-2]
    if k.shape[-1] != E:
        raise ValueError(f"{fn}: key's last dimension {k.shape[-1]} != query's {E}")
    if v.shape[-2] != S:
        raise ValueError(f"{fn}: value has {v.shape[-2]} positions, key has {S}")
    if attn_mask is not None and is_causal:
        raise ValueError(f"{fn}: attn_mask must be None when is_causal=True (as torch)")
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"{fn}: dropout_p must be in [0, 1], got {dropout_p!r}")
    if enable_gqa:
        k, v = _repeat_heads(q, k, fn), _repeat_heads(q, v, fn)
    sc = 1.0 / math.sqrt(E) if scale is None else float(scale)
    if dropout_p == 0.0:
        kind = _fused_kind(q, k, v, attn_mask)
        if kind is not None:
            return _fused_attention(q, k, v, sc, bool(is_causal), attn_mask, kind, fn)
    s = matmul(q, swapaxes(k, -1, -2)) * sc
    if is_causal:
        p = softmax(where(_causal(L, S), s, -math.inf), axis=-1)
    elif attn_mask is None:
        p = softmax(s, axis=-1)
    else:
        m = _t(attn_mask, "scaled_dot_product_attention")
        try:
            broadcast_shapes(tuple(m.shape), tuple(s.shape))
        except ValueError:
            raise ValueError(
                f"{fn}: attn_mask of shape {list(m.shape)} does not broadcast to the scores' "
                f"shape {list(s.shape)}"
            ) from None
        s = where(m, s, -math.inf) if m.dtype == np.bool_ else s + m.astype(s.dtype)
        p = _masked_softmax(s)
    if dropout_p > 0.0:
        p = dropout(p, dropout_p, True, seed=seed)
    return matmul(p.astype(v.dtype), v)


def _fused_kind(q: Tensor, k: Tensor, v: Tensor, attn_mask) -> str | None:
    """Which fused attention kernel (backend/npu/templates/attention.py) runs this call, or None
    for the composition: on the split 910B the MIX kernel ("attention_mix": float32, float16
    or bfloat16, masks in the kernel); on the coupled 910 the one-core kernel ("attention":
    float32, no mask). q, k, v of one dtype with equal batch dimensions (>= 1), non-empty;
    unless LAZYMATH_FUSED_ATTENTION is off."""
    if not _FUSED_ATTENTION:
        return None
    if q.ndim < 3 or k.ndim < 3 or v.ndim < 3 or not (q.dtype == k.dtype == v.dtype):
        return None
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]) or 0 in (*q.shape, *k.shape, *v.shape):
        return None
    spec = getattr(default_device(), "spec", None)
    if spec is None:
        return None
    if not spec.coupled:
        ok = q.dtype in (np.float32, np.float16, dt.bfloat16)
        return "attention_mix" if ok else None
    return "attention" if q.dtype == np.float32 and attn_mask is None else None


_FUSED_ATTENTION = True  # module switch (tests compare the fused kernel with the composition)


def _mask_operand(mask: Tensor, lead: tuple, L: int, S: int, fn: str) -> tuple:
    """(additive float32 mask of shape (Mb, L, S), mdiv, mmod) for the MIX kernel: a bool
    mask becomes 0 / -inf, a float mask is cast; batch dimensions that broadcast stay
    unexpanded when q's flattened batch index bh maps to the mask's as (bh // mdiv) % mmod
    (the mask's non-broadcast batch dimensions are one contiguous run of q's: a (L, S),
    (B, 1, L, S) or (1, H, L, S) mask is not copied per head), else expanded to q's."""
    try:
        broadcast_shapes(tuple(mask.shape), (*lead, L, S))
    except ValueError:
        raise ValueError(
            f"{fn}: attn_mask of shape {list(mask.shape)} does not broadcast to the scores' "
            f"shape {[*lead, L, S]}"
        ) from None
    zero, ninf = np.float32(0.0), np.float32(-math.inf)  # (Python floats would make float64)
    add = where(mask, zero, ninf) if mask.dtype == np.bool_ else mask
    add = broadcast_to(add.astype(dt.float32), (*mask.shape[:-2], L, S))
    mlead = (1,) * (len(lead) - (add.ndim - 2)) + tuple(add.shape[:-2])
    if add.ndim - 2 > len(lead):  # extra leading ones (broadcast_shapes checked them)
        mlead = mlead[len(mlead) - len(lead) :]
    real = [i for i, n in enumerate(mlead) if n != 1]
    if not real:
        return add.reshape(1, L, S), 1, 1
    i, j = real[0], real[-1] + 1
    if all(mlead[t] == lead[t] for t in range(i, j)):
        return add.reshape(math.prod(mlead), L, S), math.prod(lead[j:]), math.prod(lead[i:j])
    full = broadcast_to(add.reshape(*mlead, L, S), (*lead, L, S))
    return full.reshape(math.prod(lead), L, S), 1, math.prod(lead)


def _fused_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, causal: bool,
                     attn_mask=None, kind: str = "attention",
                     fn: str = "scaled_dot_product_attention") -> Tensor:  # fmt: skip
    """One `custom` node running a built-in fused attention kernel. q, k and v are read in
    place through their views (heads split from one qkv buffer by a slice and a permute, k/v
    broadcast over heads) when the last dimension is dense and no stride is negative, else
    copied dense first (`Attention.strided_input`)."""
    srcs = [q._node, k._node, v._node]
    params: tuple = (("causal", causal), ("scale", float(scale)))
    if kind == attention.MIX_NAME:
        masked = attn_mask is not None
        mdiv = mmod = 1
        if masked:
            m, mdiv, mmod = _mask_operand(_t(attn_mask, fn), tuple(q.shape[:-2]),
                                          q.shape[-2], k.shape[-2], fn)  # fmt: skip
            srcs.append(m._node)
        params = (("causal", causal), ("masked", masked), ("mdiv", mdiv), ("mmod", mmod),
                  ("scale", float(scale)))  # fmt: skip
    shape = (*q.shape[:-1], v.shape[-1])
    node = gn.make("custom", q.dtype, shape, tuple(srcs), (custom.BUILTIN[kind], params))
    return wrap(node, [q])


def _masked_softmax(s: Tensor) -> Tensor:
    """softmax over the last axis where a row may be entirely -inf: such a row is all zeros
    (torch's CPU attention kernels), not NaN. Same row-kernel shape as softmax."""
    mx = rowmax(s, axis=-1, keepdims=True)
    e = exp(s - where(mx == -math.inf, 0.0, mx).astype(s.dtype))
    total = rowsum(e, axis=-1, keepdims=True)
    return e / where(total == 0, 1.0, total).astype(s.dtype)


def _repeat_heads(q: Tensor, kv: Tensor, fn: str) -> Tensor:
    """k or v with its heads (dim -3) repeated to q's: torch's enable_gqa grouping (query
    head h reads key head h // (Hq / Hk))."""
    if q.ndim < 3 or kv.ndim < 3:
        raise ValueError(f"{fn}: enable_gqa needs a head dimension (dim -3)")
    hq, hk = q.shape[-3], kv.shape[-3]
    if hq % hk:
        raise ValueError(f"{fn}: {hq} query heads are not a multiple of {hk} key/value heads")
    if hq == hk:
        return kv
    g = hq // hk
    *lead, h, S, D = kv.shape
    x = expand_dims(kv, axis=-3)
    x = broadcast_to(x, (*lead, h, g, S, D))
    return x.reshape(*lead, h * g, S, D)
