"""The user-facing Tensor: a thin handle on a graph node, plus the numpy-like functions.

Every function here validates its inputs (shape, dtype, axes, device) *at the call*, so errors
point at the user's line, then records one or a few graph nodes and returns at once. Nothing is
computed until a realize (`t.realize()`, `lm.realize(...)`, `t.numpy()`, `np.asarray(t)`,
`t.item()`, `t.tolist()`).
"""

from __future__ import annotations

import builtins
import contextlib
import math
import operator
import sys
import threading
import weakref
from collections.abc import Sequence

import numpy as np

from lazymath import dtypes as dt
from lazymath import settings
from lazymath.graph import dft
from lazymath.graph import node as gn
from lazymath.graph.ops import ELEMENTWISE, VIEWS, Op, ufunc_dtypes
from lazymath.realize import realize as _realize

# ----------------------------------------------------------------------------- Tensor


class Tensor:
    """A lazy n-dimensional array on the emulated NPU."""

    __slots__ = ("_node", "_device", "__weakref__")
    __array_priority__ = 100  # numpy defers to our reflected operators

    def __init__(self, node: gn.Node, device=None):
        self._node = node
        self._device = device if device is not None else _current_device()
        node.tensors += 1  # live handles; realize also writes out nodes a live tensor holds

    def __del__(self):
        try:
            self._node.tensors -= 1
        except AttributeError:  # interpreter shutdown or a half-built tensor
            pass

    # -- metadata (never realizes) --
    @property
    def shape(self) -> tuple[int, ...]:
        return self._node.shape

    @property
    def dtype(self) -> np.dtype:
        return self._node.dtype

    @property
    def ndim(self) -> int:
        return len(self._node.shape)

    @property
    def size(self) -> int:
        return self._node.size

    @property
    def nbytes(self) -> int:
        return self._node.nbytes

    @property
    def device(self):
        return self._device

    @property
    def is_realized(self) -> bool:
        return self._node.realized is not None

    @property
    def node(self) -> gn.Node:
        return self._node

    def __repr__(self) -> str:
        """A lazy tensor shows its shape and dtype (repr never computes); a realized one its
        values, as numpy prints them."""
        value = self._node.realized
        if value is None:
            return (f"lazymath.Tensor(shape={self.shape}, dtype={self.dtype.name}, lazy, "
                    f"device={self._device})")  # fmt: skip
        import numpy as np

        prefix = "lazymath.Tensor("
        body = np.array2string(np.asarray(value), separator=", ", prefix=prefix)
        shape = f"shape={self.shape}, " if value.size > np.get_printoptions()["threshold"] else ""
        return f"{prefix}{body}, {shape}dtype={self.dtype.name}, realized, device={self._device})"

    def _repr_html_(self) -> str:
        """Jupyter: the repr, and for a lazy tensor the kernels it would run (the fused
        kernel graph as SVG when Graphviz is installed; `lm.explain(t)` says why)."""
        from html import escape

        text = f"<pre>{escape(repr(self))}</pre>"
        if self.is_realized:
            return text
        try:
            svg = self._repr_svg_()
        except Exception as e:  # noqa: BLE001 - a display never raises
            return f"{text}<p><i>(no kernel picture: {escape(str(e))})</i></p>"
        return f"{text}<div style='overflow-x: auto'>{svg}</div>"

    def _repr_svg_(self) -> str | None:
        """The kernel graph of a lazy tensor as inline SVG (None when realized or without
        Graphviz, so Jupyter falls back to the other displays)."""
        if self.is_realized:
            return None
        from lazymath.viz import dot_binary, visualize
        from lazymath.viz.render import render, svg_inline

        if dot_binary() is None:
            return None
        return svg_inline(render(visualize(self), "svg"))

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def __bool__(self):
        return bool(self._scalar("bool"))

    def _scalar(self, what: str):
        """The value of a one-element tensor for bool()/int()/float()/complex()/index():
        an implicit sync (it realizes), as in Dask and PyTorch; LAZYMATH_DEBUG counts them."""
        if self.size != 1:
            hint = ("use t.any() or t.all()" if what == "bool"
                    else "reduce it first (t.sum(), t.max(), ...) or pick one element "
                    "(t[i])")  # fmt: skip
            raise TypeError(
                f"{what}() of a tensor needs exactly one element, this one has shape "
                f"{self.shape}; {hint}, then .item()"
            )
        _note_sync(what, self)
        v = _host_view(self._node)
        return (self.numpy() if v is None else v).reshape(()).item()

    def __hash__(self):
        return id(self)

    # -- realize points --
    def realize(self, out: np.ndarray | None = None) -> Tensor:
        """Compile (or fetch from the caches) and run every kernel this tensor needs, and
        return it with its data in place. Later reads (`numpy()`, `item()`, printing) do not
        recompute. Set LAZYMATH_DEBUG=1 to see what each realize did and why.

        `out`: a writable numpy array of the tensor's shape and dtype to compute into (reuse
        one buffer across steps); see `lazymath.realize.realize_into` for when it is written
        directly and the errors."""
        if out is not None:
            from lazymath.realize import realize_into

            realize_into(self, out)
            return self
        _realize(self)
        return self

    def numpy(self) -> np.ndarray:
        """The realized value, without a copy. It is read-only: the tensor is immutable and
        other graphs may read the same buffer."""
        self.realize()
        return self._node.realized

    def __array__(self, dtype=None, copy=None):
        # numpy 2 protocol: copy=True must return a fresh array (np.array(t) then owns a
        # writable copy); copy=False must not copy, so a dtype change is an error then
        a = self.numpy()
        if dtype is not None and np.dtype(dtype) != a.dtype:
            if copy is False:
                raise ValueError(f"__array__: converting {a.dtype} to {dtype} needs a copy")
            return a.astype(dtype)
        return a.copy() if copy else a

    def item(self):
        """The single element as a Python scalar; realizes the tensor. Raises ValueError for a
        tensor of more than one element."""
        if self.size != 1:
            raise ValueError(
                f"item() needs a tensor with one element, this one has shape {self.shape}"
            )
        v = _host_view(self._node)
        return (self.numpy() if v is None else v).item()

    def tolist(self):
        """The values as nested Python lists (numpy's tolist); realizes the tensor."""
        return self.numpy().tolist()

    def __float__(self):
        if dt.is_complex(self.dtype):
            raise TypeError("float() of a complex tensor; use complex() or real()")
        return float(self._scalar("float"))

    def __int__(self):
        if dt.is_complex(self.dtype):
            raise TypeError("int() of a complex tensor")
        v = self._scalar("int")
        if isinstance(v, float) and not math.isfinite(v):
            raise (OverflowError if math.isinf(v) else ValueError)(f"int() of {v}")
        return int(v)

    def __complex__(self):
        return complex(self._scalar("complex"))

    def __index__(self):
        if not dt.is_int(self.dtype):
            raise TypeError(f"only integer tensors can be used as an index, not {self.dtype}")
        return int(self._scalar("index"))

    # -- the Array API protocol --
    def __array_namespace__(self, /, *, api_version=None):
        """The namespace of the Array API standard: the lazymath module itself."""
        if api_version not in (None, "2021.12", "2022.12", "2023.12", "2024.12"):
            raise ValueError(f"unsupported Array API version {api_version!r}")
        import sys

        return sys.modules["lazymath"]

    def __dlpack__(self, /, *, stream=None, max_version=None, dl_device=None, copy=None):
        """Export the realized buffer (realizes first) through DLPack, zero-copy unless
        `copy=True`. The buffer is read-only: a versioned consumer (max_version >= (1, 0))
        gets it flagged read-only; a legacy consumer gets a copy by default (copy=None),
        since the legacy protocol cannot say "read-only". With copy=False a legacy consumer
        gets the buffer itself, unflagged: the standard prefers that to an error and makes
        the user responsible for not writing into it (writing would change this tensor and
        every graph that reads it)."""
        if stream is not None and stream != -1:
            raise BufferError(f"__dlpack__: lazymath tensors live on the host; stream={stream!r}")
        if dl_device is not None and tuple(dl_device)[0] != 1:
            raise BufferError(f"__dlpack__: cannot export to device {dl_device}; only (1, 0)")
        a = self.numpy()
        if dt.is_bf16(a.dtype):  # numpy's exporter has no bfloat16: lazymath's own capsule
            from lazymath import _dlpack

            versioned = max_version is not None and tuple(max_version)[0] >= 1
            if copy or (not versioned and copy is None):  # legacy: cannot say read-only
                a = np.array(a, copy=True)
            return _dlpack.capsule(a, versioned, read_only=not a.flags.writeable)
        if copy:
            a = np.array(a, copy=True)
        legacy = max_version is None or tuple(max_version)[0] < 1
        if not a.flags.writeable and legacy:
            a = _writable_alias(a) if copy is False else np.array(a, copy=True)
        kw = {} if max_version is None else {"max_version": max_version}
        return a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU: buffers live in host memory

    def to_device(self, device, /, *, stream=None) -> Tensor:
        """The Array API's `to_device`: this tensor on `device` (a copy when it differs)."""
        if stream is not None:
            raise ValueError("to_device: streams are not supported here (stream=None)")
        d = _device_arg(device, "to_device")
        return self if d is self._device else Tensor(self._node, d)

    # -- operators --
    def __add__(self, o):
        if type(o) in _PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = _scalar_arg(self, o, "add", False, sys._getframe(1).f_code)
        return add(self, o)

    def __radd__(self, o):
        if type(o) in _PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = _scalar_arg(self, o, "add", True, sys._getframe(1).f_code)
        return add(o, self)

    def __sub__(self, o):
        if type(o) in _PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = _scalar_arg(self, o, "sub", False, sys._getframe(1).f_code)
        return sub(self, o)

    def __rsub__(self, o):
        if type(o) in _PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = _scalar_arg(self, o, "sub", True, sys._getframe(1).f_code)
        return sub(o, self)

    def __mul__(self, o):
        if type(o) in _PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = _scalar_arg(self, o, "mul", False, sys._getframe(1).f_code)
        return mul(self, o)

    def __rmul__(self, o):
        if type(o) in _PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = _scalar_arg(self, o, "mul", True, sys._getframe(1).f_code)
        return mul(o, self)

    def __truediv__(self, o):
        if type(o) in _PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = _scalar_arg(self, o, "div", False, sys._getframe(1).f_code)
        return div(self, o)

    def __rtruediv__(self, o):
        if type(o) in _PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = _scalar_arg(self, o, "div", True, sys._getframe(1).f_code)
        return div(o, self)

    def __floordiv__(self, o):
        if type(o) in _PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = _scalar_arg(self, o, "floor_divide", False, sys._getframe(1).f_code)
        return floor_divide(self, o)

    def __rfloordiv__(self, o):
        if type(o) in _PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = _scalar_arg(self, o, "floor_divide", True, sys._getframe(1).f_code)
        return floor_divide(o, self)

    def __mod__(self, o):
        if type(o) in _PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = _scalar_arg(self, o, "remainder", False, sys._getframe(1).f_code)
        return remainder(self, o)

    def __rmod__(self, o):
        if type(o) in _PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = _scalar_arg(self, o, "remainder", True, sys._getframe(1).f_code)
        return remainder(o, self)

    def __pow__(self, o):
        return pow(self, o)

    def __rpow__(self, o):
        return pow(o, self)

    def __matmul__(self, o):
        return matmul(self, o)

    def __rmatmul__(self, o):
        return matmul(o, self)

    def __neg__(self):
        return neg(self)

    def __pos__(self):
        return self

    def __abs__(self):
        return abs(self)

    def __invert__(self):
        return bitwise_invert(self)

    def __and__(self, o):
        if type(o) in _PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = _scalar_arg(self, o, "bitwise_and", False, sys._getframe(1).f_code)
        return bitwise_and(self, o)

    def __rand__(self, o):
        if type(o) in _PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = _scalar_arg(self, o, "bitwise_and", True, sys._getframe(1).f_code)
        return bitwise_and(o, self)

    def __or__(self, o):
        if type(o) in _PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = _scalar_arg(self, o, "bitwise_or", False, sys._getframe(1).f_code)
        return bitwise_or(self, o)

    def __ror__(self, o):
        if type(o) in _PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = _scalar_arg(self, o, "bitwise_or", True, sys._getframe(1).f_code)
        return bitwise_or(o, self)

    def __xor__(self, o):
        if type(o) in _PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = _scalar_arg(self, o, "bitwise_xor", False, sys._getframe(1).f_code)
        return bitwise_xor(self, o)

    def __rxor__(self, o):
        if type(o) in _PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = _scalar_arg(self, o, "bitwise_xor", True, sys._getframe(1).f_code)
        return bitwise_xor(o, self)

    def __lshift__(self, o):
        if type(o) in _PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = _scalar_arg(self, o, "bitwise_left_shift", False, sys._getframe(1).f_code)
        return bitwise_left_shift(self, o)

    def __rlshift__(self, o):
        if type(o) in _PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = _scalar_arg(self, o, "bitwise_left_shift", True, sys._getframe(1).f_code)
        return bitwise_left_shift(o, self)

    def __rshift__(self, o):
        if type(o) in _PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = _scalar_arg(self, o, "bitwise_right_shift", False, sys._getframe(1).f_code)
        return bitwise_right_shift(self, o)

    def __rrshift__(self, o):
        if type(o) in _PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = _scalar_arg(self, o, "bitwise_right_shift", True, sys._getframe(1).f_code)
        return bitwise_right_shift(o, self)

    # -- in-place operators and item assignment: functional updates. The tensor is rebound
    # to a new graph node; nothing realized is ever written, so other tensors that share the
    # old node (or its buffer) keep their values.
    def _rebind(self, out: Tensor) -> Tensor:
        node = out._node
        if node is not self._node:
            node.tensors += 1
            self._node.tensors -= 1
            self._node = node
        return self

    def _inplace(self, fn, o) -> Tensor:
        if type(o) in _PY_SCALAR_TYPES and _SCALAR_ARGS.get() and fn is not pow:
            o = _scalar_arg(self, o, fn.__name__, False, sys._getframe(2).f_code)
        out = fn(self, o)
        if out.shape != self.shape:
            raise ValueError(
                f"in-place {fn.__name__}: the result's shape {out.shape} is not the left "
                f"operand's {self.shape} (the right operand must broadcast to it)"
            )
        if out.dtype != self.dtype:
            if not np.can_cast(out.dtype, self.dtype, "same_kind"):
                raise TypeError(
                    f"in-place {fn.__name__}: the result dtype {out.dtype} cannot be stored in "
                    f"the left operand's {self.dtype}"
                )
            out = astype(out, self.dtype)
        return self._rebind(out)

    def __iadd__(self, o):
        return self._inplace(add, o)

    def __isub__(self, o):
        return self._inplace(sub, o)

    def __imul__(self, o):
        return self._inplace(mul, o)

    def __itruediv__(self, o):
        return self._inplace(div, o)

    def __ifloordiv__(self, o):
        return self._inplace(floor_divide, o)

    def __imod__(self, o):
        return self._inplace(remainder, o)

    def __ipow__(self, o):
        return self._inplace(pow, o)

    def __imatmul__(self, o):
        return self._inplace(matmul, o)

    def __iand__(self, o):
        return self._inplace(bitwise_and, o)

    def __ior__(self, o):
        return self._inplace(bitwise_or, o)

    def __ixor__(self, o):
        return self._inplace(bitwise_xor, o)

    def __ilshift__(self, o):
        return self._inplace(bitwise_left_shift, o)

    def __irshift__(self, o):
        return self._inplace(bitwise_right_shift, o)

    def __setitem__(self, idx, value) -> None:
        """``x[idx] = value`` rebinds x to where(mask, value, x) (see `_setitem`)."""
        self._rebind(_setitem(self, idx, value))

    def __eq__(self, o):  # type: ignore[override]
        if type(o) in _PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = _scalar_arg(self, o, "eq", False, sys._getframe(1).f_code)
        return eq(self, o)

    def __ne__(self, o):  # type: ignore[override]
        if type(o) in _PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = _scalar_arg(self, o, "ne", False, sys._getframe(1).f_code)
        return ne(self, o)

    def __lt__(self, o):
        if type(o) in _PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = _scalar_arg(self, o, "lt", False, sys._getframe(1).f_code)
        return lt(self, o)

    def __le__(self, o):
        if type(o) in _PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = _scalar_arg(self, o, "le", False, sys._getframe(1).f_code)
        return le(self, o)

    def __gt__(self, o):
        if type(o) in _PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = _scalar_arg(self, o, "gt", False, sys._getframe(1).f_code)
        return gt(self, o)

    def __ge__(self, o):
        if type(o) in _PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = _scalar_arg(self, o, "ge", False, sys._getframe(1).f_code)
        return ge(self, o)

    def __getitem__(self, idx):
        return _getitem(self, idx)

    # -- methods mirroring numpy --
    def astype(self, dtype) -> Tensor:
        """A copy cast to `dtype` (numpy's casting: floats to ints truncate toward zero)."""
        return astype(self, dtype)

    def reshape(self, *shape) -> Tensor:
        """`lm.reshape(self, shape)`; the shape may be given as separate arguments, one -1 is
        inferred."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return reshape(self, shape)

    def transpose(self, *axes) -> Tensor:
        """`lm.transpose(self, axes)`; the axes may be given as separate arguments."""
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        return transpose(self, axes or None)

    def permute(self, *axes) -> Tensor:
        """`lm.permute_dims(self, axes)`; the axes may be given as separate arguments."""
        return self.transpose(*axes)

    def swapaxes(self, a: int, b: int) -> Tensor:
        """`lm.swapaxes(self, a, b)`: a view."""
        return swapaxes(self, a, b)

    def flip(self, axis=None) -> Tensor:
        """`lm.flip(self, axis)`: a view."""
        return flip(self, axis)

    def squeeze(self, axis=None) -> Tensor:
        """`lm.squeeze(self, axis)`: a view."""
        return squeeze(self, axis)

    def expand_dims(self, axis) -> Tensor:
        """`lm.expand_dims(self, axis)`: a view."""
        return expand_dims(self, axis)

    def broadcast_to(self, shape) -> Tensor:
        """`lm.broadcast_to(self, shape)`: a view."""
        return broadcast_to(self, shape)

    def flatten(self) -> Tensor:
        """A 1-D view of all elements in C order (a reshape; copies only if the layout needs it)."""
        return reshape(self, (-1,))

    @property
    def T(self) -> Tensor:
        return transpose(self, None)

    @property
    def mT(self) -> Tensor:
        if self.ndim < 2:
            raise ValueError(f"mT needs at least 2 dimensions, got shape {self.shape}")
        return swapaxes(self, -1, -2)

    def sum(self, axis=None, keepdims=False) -> Tensor:
        """`lm.sum(self, axis, keepdims)`."""
        return sum(self, axis, keepdims)

    def mean(self, axis=None, keepdims=False) -> Tensor:
        """`lm.mean(self, axis, keepdims)`."""
        return mean(self, axis, keepdims)

    def max(self, axis=None, keepdims=False) -> Tensor:
        """`lm.max(self, axis, keepdims)`."""
        return max(self, axis, keepdims)

    def min(self, axis=None, keepdims=False) -> Tensor:
        """`lm.min(self, axis, keepdims)`."""
        return min(self, axis, keepdims)

    def prod(self, axis=None, keepdims=False) -> Tensor:
        """`lm.prod(self, axis, keepdims)`."""
        return prod(self, axis, keepdims)

    def argmax(self, axis=None, keepdims=False) -> Tensor:
        """`lm.argmax(self, axis, keepdims)`."""
        return argmax(self, axis, keepdims)

    def argmin(self, axis=None, keepdims=False) -> Tensor:
        """`lm.argmin(self, axis, keepdims)`."""
        return argmin(self, axis, keepdims)

    def var(self, axis=None, keepdims=False, ddof=0) -> Tensor:
        """`lm.var(self, axis, keepdims, ddof)`."""
        return var(self, axis, keepdims, ddof)

    def std(self, axis=None, keepdims=False, ddof=0) -> Tensor:
        """`lm.std(self, axis, keepdims, ddof)`."""
        return std(self, axis, keepdims, ddof)

    def clip(self, lo=None, hi=None) -> Tensor:
        """`lm.clip(self, lo, hi)`: values limited to [lo, hi] (either may be None)."""
        return clip(self, lo, hi)

    def visualize(self, filename=None, stage: str = "kernels"):
        """`lm.visualize(self, ...)`: this tensor's graph (`stage="graph"`) or its fused
        kernels (`"kernels"`); writes `filename` (.dot, .svg/.png/.pdf via Graphviz, .html for
        the report) and returns its path, or returns the DOT source when `filename` is None."""
        from lazymath.viz import visualize

        return visualize(self, filename=filename, stage=stage)


# ----------------------------------------------------------------------------- devices

_HOST_VIEW_OPS = frozenset(("reshape", "permute", "expand", "slice"))


def _host_view(node: gn.Node) -> np.ndarray | None:
    """The value of a chain of views (reshape/permute/expand/slice) over a realized node as a
    numpy view of its buffer, or None when the chain computes anything.

    Why: reading one element of a realized tensor (`int(x[i, j])`, `x[i].item()`) compiled a
    copy kernel per distinct index -- the slice offsets are part of the program key -- ~13 ms
    each on Zen 5, so a loop over 108 elements cost 1.4 s of compiles (the Array API suite's
    element-by-element checks went over hypothesis' deadline on every new shape). Such a read
    needs no kernel: numpy's view of the realized buffer is the value, read at once, so it
    sees what a realize at this moment would (the node itself stays lazy)."""
    chain = []
    while node.realized is None:
        if node.op not in _HOST_VIEW_OPS or len(node.srcs) != 1:
            return None
        chain.append(node)
        node = node.srcs[0]
    if not chain:
        return None  # realized: the caller's numpy() is already free
    from lazymath.graph import reference

    a = node.realized
    for v in reversed(chain):
        a = reference.fold(v, [a])  # the reference executor's view rules (not counted as work)
    return a


SYNCS: dict[str, int] = {}  # implicit syncs (bool(t), int(t), ...) by kind, this process


def _note_sync(what: str, t: Tensor) -> None:
    SYNCS[what] = SYNCS.get(what, 0) + 1
    if not t.is_realized and settings.DEBUG.get():
        import sys

        print(f"lazymath: implicit sync {what}() realizes a {t.shape} {t.dtype.name} tensor "
              f"(#{SYNCS[what]} {what}() this process)", file=sys.stderr)  # fmt: skip


def _current_device():
    try:
        from lazymath.runtime import current_device
    except ImportError:  # runtime not importable yet (partial checkout): one implicit device
        return "npu:0"
    return current_device()


def _check_devices(op: str, tensors: Sequence[Tensor]) -> None:
    d0 = tensors[0]._device
    if builtins.all(t._device is d0 for t in tensors):
        return
    devs = {id(t._device): t._device for t in tensors}
    if len(devs) > 1:
        names = ", ".join(str(d) for d in devs.values())
        raise ValueError(f"{op}: operands live on different devices ({names}); move them first")


# ----------------------------------------------------------------------------- creation


def _wrap(node: gn.Node, like: Sequence[Tensor] = ()) -> Tensor:
    return Tensor(node, like[0]._device if like else None)


def tensor(data, dtype=None) -> Tensor:
    """Copy `data` (array, nested list, scalar, anything with __dlpack__ or __array__) into a
    new realized tensor (numpy's dtype inference: a Python float gives float64)."""
    if isinstance(data, Tensor):
        return data if dtype is None else astype(data, dtype)
    if hasattr(data, "__dlpack__") and not isinstance(data, np.ndarray):
        try:
            data = _bf16_from_dlpack(data, None) if _bf16_producer(data) else np.from_dlpack(data)
        except Exception:  # fall back to the array protocol (e.g. non-CPU capsules)
            data = np.asarray(data)
    try:
        arr = np.array(
            data, dtype=None if dtype is None else dt.as_dtype(dtype), copy=True, order="C"
        )
    except (TypeError, ValueError) as e:
        raise TypeError(f"tensor(): cannot convert {type(data).__name__} to a tensor: {e}") from e
    return _from_numpy(arr, "tensor()")


_SCALAR_ARGS = settings.SCALAR_ARGS


_PY_SCALAR_TYPES = frozenset((bool, int, float, complex))  # exact types: not np.generic


def _scalar_arg(t: Tensor, value, op: str, reflected: bool, caller):
    """LAZYMATH_SCALAR_ARGS (on by default): the Python scalar operand (bool, int, float,
    complex) of `t op value` or `lm.op(t, value)` written in user code, as a realized 0-d
    tensor of the dtype NEP 50's weak-scalar rule gives it (a float with a float32 tensor
    stays float32, with float64 float64; a complex with a real float tensor is complex of its
    precision), so the kernel reads it at run time: the program and its kernels are the same
    for every value (the program cache key holds the leaf's dtype, not its value) and nothing
    recompiles when the value changes. lazymath's own composites keep their constants folded
    into the kernel, and an integer that does not fit the tensor's dtype takes the static
    path (which reports numpy's OverflowError or folds a comparison)."""
    if gn.is_lazymath_code(caller) or _peel_const(t._node) is not None:
        return value  # (a constant tensor: the whole expression folds at build time)
    kind = type(value)
    # (repr for complex: (-0.0+0j) == 0j; the sign of a float zero: -0.0 == 0.0)
    v = repr(value) if kind is complex else value
    ck = (kind, v, t._node.dtype, reflected, op, t._device, kind is float and str(value)[0] == "-")
    hit = _SCALAR_NODES.get(ck)
    if hit is not None:
        return hit
    kinds = (kind, t.dtype) if reflected else (t.dtype, kind)
    try:
        in_dtypes, _ = ufunc_dtypes(op, kinds)
    except Exception:  # the op reports its own error with the scalar
        return value
    d = in_dtypes[0 if reflected else 1]
    if d not in dt.SUPPORTED:
        return value
    if kind is not bool and d.kind == "b":  # a loop that casts the weak scalar to bool
        return value
    if kind is complex and d.kind != "c":
        return value
    try:
        with np.errstate(over="ignore"):  # as a folded constant: out of range -> inf
            arr = np.array(value, dtype=d)
    except (OverflowError, ValueError, TypeError):
        return value  # an int outside d's range: the static path's rule
    arr.flags.writeable = False
    out = Tensor(gn.buffer_node(arr), t._device)
    if len(_SCALAR_NODES) >= 256:
        _SCALAR_NODES.clear()
    _SCALAR_NODES[ck] = out
    return out


# (type, value, tensor dtype, side, op, device, sign) -> the 0-d tensor bound for it: the same
# scalar in the same place is the same leaf (graphs stay CSE-equal, `x * 2 + 1` twice is one
# node) and costs no array. Bounded: a loop over many values clears it now and then.
_SCALAR_NODES: dict = {}


def _writable_alias(a: np.ndarray) -> np.ndarray:
    """A writable ndarray over `a`'s memory, no copy, that keeps `a` alive: what a legacy
    DLPack consumer gets for `__dlpack__(copy=False)` (numpy refuses to export a read-only
    array through the legacy protocol, and the standard prefers an unflagged export to an
    error). Strides, negative ones included, and the offset are `a`'s."""
    if a.size == 0:
        return np.empty(a.shape, a.dtype)  # no memory to alias
    import ctypes

    lo, hi = np.lib.array_utils.byte_bounds(a)
    buf = (ctypes.c_char * (hi - lo)).from_address(lo)
    buf._lazymath_owner = a  # capsule -> alias -> buf -> a: the tensor's buffer outlives them
    base = np.frombuffer(buf, dtype=np.uint8)
    return np.ndarray(a.shape, a.dtype, buffer=base, offset=a.ctypes.data - lo, strides=a.strides)


def _scalar_args_of(op: str, a, b, caller):
    """(a, b) with a Python scalar beside a tensor made a runtime argument (see `_scalar_arg`)
    when the call comes from user code and LAZYMATH_SCALAR_ARGS is on."""
    ta, tb = type(a), type(b)
    if ta is Tensor and tb in _PY_SCALAR_TYPES:
        if _SCALAR_ARGS.get():
            b = _scalar_arg(a, b, op, False, caller)
    elif tb is Tensor and ta in _PY_SCALAR_TYPES:
        if _SCALAR_ARGS.get():
            a = _scalar_arg(b, a, op, True, caller)
    return a, b


def _from_numpy(arr: np.ndarray, who: str, device=None) -> Tensor:
    """A realized tensor owning `arr` (C-contiguous; made read-only: the tensor is immutable)."""
    if arr.dtype.kind in "OUSV" and not dt.is_bf16(arr.dtype):
        raise TypeError(f"{who}: non-numeric data of dtype {arr.dtype} is not supported")
    if not arr.dtype.isnative and arr.dtype.newbyteorder("=") in dt.SUPPORTED:
        arr = arr.astype(arr.dtype.newbyteorder("="))  # byte-swapped data: same values, native
    if arr.dtype not in dt.SUPPORTED:
        dt.as_dtype(arr.dtype)  # raises with the supported list
    # np.array(order="C") is contiguous already; np.ascontiguousarray would turn 0-d into 1-d
    # the tensor owns this copy; read-only so that t.numpy() cannot mutate a graph input
    arr.flags.writeable = False
    return Tensor(gn.buffer_node(arr), device)


_PY_SCALARS = (bool, int, float, complex)


def _default_dtype_of(obj) -> np.dtype | None:
    """The Array API default dtype of Python data (float -> float32, complex -> complex64,
    int -> int64, bool -> bool), None for anything else (it keeps its own dtype)."""
    if isinstance(obj, np.generic):
        return None
    if isinstance(obj, _PY_SCALARS):
        kind = type(obj)
    elif isinstance(obj, (list, tuple)):
        kinds = set()
        stack = [obj]
        while stack:
            o = stack.pop()
            if isinstance(o, (list, tuple)):
                stack.extend(o)
            elif isinstance(o, _PY_SCALARS) and not isinstance(o, np.generic):
                kinds.add(type(o))
            elif isinstance(o, Tensor) and o.ndim == 0:
                kinds.add({"b": bool, "i": int, "u": int, "c": complex}.get(o.dtype.kind, float))
            else:
                return None
        kind = next((k for k in (complex, float, int, bool) if k in kinds), float)
    else:
        return None
    return {bool: dt.bool_, int: dt.int64, float: dt.float32, complex: dt.complex64}[kind]


def asarray(obj, /, dtype=None, device=None, copy=None) -> Tensor:
    """Array API `asarray`: a tensor from a tensor, a DLPack or buffer-protocol object, a numpy
    array, a Python scalar or a nested sequence.

    Python data takes the default dtypes (float32, complex64, int64, bool; see
    `__array_namespace_info__().default_dtypes()`), arrays keep theirs. `copy=True` always
    copies, `copy=False` never does (ValueError where a copy is needed: a dtype change, a
    non-contiguous or foreign-device source, Python data), `copy=None` shares realized
    tensors and copies host arrays (the tensor must not change behind the graph's back)."""
    if copy not in (None, True, False):
        raise ValueError(f"asarray: copy must be None, True or False, got {copy!r}")
    want = None if dtype is None else dt.as_dtype(dtype)
    if isinstance(obj, Tensor):
        dev = obj._device if device is None else _device_arg(device, "asarray")
        out = obj if want is None or want == obj.dtype else None
        if out is None:
            if copy is False:
                raise ValueError(f"asarray: converting {obj.dtype} to {want} needs a copy")
            out = astype(obj, want)
        if copy or dev is not out._device:
            # tensors are immutable (in-place operators rebind), so a new handle is a copy
            out = Tensor(out._node, dev)
        return out
    dev = None if device is None else _device_arg(device, "asarray")
    if hasattr(obj, "__dlpack__") and not isinstance(obj, np.ndarray):
        try:
            return from_dlpack(obj, copy=copy, dtype=want, device=dev)
        except BufferError:
            if copy is False:
                raise
    if want is None:
        want = _default_dtype_of(obj)
        if want is not None and copy is False:
            raise ValueError("asarray: Python data always needs a copy (copy=False given)")
    if copy is False:
        try:
            arr = np.asarray(obj, dtype=want)
        except (TypeError, ValueError) as e:
            raise TypeError(f"asarray: cannot convert {type(obj).__name__}: {e}") from e
        if not arr.flags.c_contiguous or (
            not np.shares_memory(arr, obj) if isinstance(obj, np.ndarray) else False
        ):
            raise ValueError("asarray: copy=False but the data is not C-contiguous or needs a "
                             "dtype conversion")  # fmt: skip
        view = arr.view()
        view.flags.writeable = False
        return _from_numpy(view, "asarray", dev)
    # A Python float beyond a floating target's range rounds to inf (IEEE 754, as torch.asarray and
    # np.float32(3.5e38) do): asarray(3.4028235677973366e+38) with the float32 default is inf, not
    # an error (the Array API suite converts its scalars so). Other overflows stay errors.
    floating = want is not None and (
        np.dtype(want).kind in "fc" or np.dtype(want).name == "bfloat16"
    )
    try:
        with np.errstate(over="ignore" if floating else "raise"):
            arr = np.array(obj, dtype=want, copy=True, order="C")
    except OverflowError as e:
        raise OverflowError(f"asarray: {e}") from None
    except (TypeError, ValueError, FloatingPointError) as e:
        raise TypeError(f"asarray: cannot convert {type(obj).__name__} to a tensor: {e}") from e
    if arr.dtype == object and want is None and isinstance(obj, (int, list, tuple)):
        raise OverflowError("asarray: a Python int does not fit int64")
    return _from_numpy(arr, "asarray", dev)


def from_dlpack(x, /, *, device=None, copy=None, dtype=None) -> Tensor:
    """A tensor from any DLPack producer (torch, numpy, JAX, ...), zero-copy where allowed.

    copy=None shares a C-contiguous CPU buffer and copies otherwise; copy=False shares or
    raises BufferError; copy=True always copies. A shared buffer is read through, never
    written: lazymath treats it as immutable, so writing it through the producer afterwards
    changes what later realizes of the tensor read (the producer's contract, as with numpy's
    views)."""
    if copy not in (None, True, False):
        raise ValueError(f"from_dlpack: copy must be None, True or False, got {copy!r}")
    if not hasattr(x, "__dlpack__"):
        raise TypeError(f"from_dlpack: {type(x).__name__} does not implement __dlpack__")
    dev = None if device is None else _device_arg(device, "from_dlpack")
    if hasattr(x, "__dlpack_device__"):
        kind, _ = x.__dlpack_device__()
        if int(kind) not in (1, 3):  # kDLCPU, kDLCUDAHost
            if copy is False:
                raise BufferError(
                    f"from_dlpack: the producer's device {x.__dlpack_device__()} is not the "
                    "host; it cannot be shared (copy=False)"
                )
            raise BufferError(
                f"from_dlpack: the producer's buffer is on device {x.__dlpack_device__()}, "
                "not the host; move it to the CPU first"
            )
    try:
        arr = _bf16_from_dlpack(x, copy) if _bf16_producer(x) else np.from_dlpack(x, copy=copy)
    except TypeError:  # an older producer without the copy= keyword
        if copy is False:
            raise
        arr = np.from_dlpack(x)
        if copy:
            arr = arr.copy()
    if arr.dtype not in dt.SUPPORTED:
        raise TypeError(f"from_dlpack: unsupported dtype {arr.dtype}")
    if dtype is not None and arr.dtype != dtype:
        if copy is False:
            raise ValueError(f"from_dlpack: converting {arr.dtype} to {dtype} needs a copy")
        arr = arr.astype(dtype)
    if not arr.flags.c_contiguous:
        if copy is False:
            raise BufferError(
                f"from_dlpack: the producer's buffer is not C-contiguous (strides "
                f"{arr.strides}); lazymath shares only contiguous buffers (copy=False)"
            )
        arr = np.ascontiguousarray(arr)
    elif arr.base is not None or not arr.flags.owndata:
        arr = arr.view()  # our own read-only view; the producer's flags stay as they were
    return _from_numpy(arr, "from_dlpack", dev)


def _bf16_producer(x) -> bool:
    """Whether `x` is a bfloat16 array of another framework (torch, JAX): DLPack has a
    bfloat16 code, but numpy's importer does not take it ("Unsupported dtype in DLTensor")."""
    return str(getattr(x, "dtype", "")) in ("torch.bfloat16", "bfloat16")


def _bf16_from_dlpack(x, copy) -> np.ndarray:
    """A bfloat16 producer's buffer as an ml_dtypes array: torch's through DLPack as int16
    bits (the same bytes, zero-copy where DLPack allows it), others (JAX) through
    __array__, which gives ml_dtypes' bfloat16 already."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return np.from_dlpack(x.view(torch.int16), copy=copy).view(dt.bfloat16)
    arr = np.asarray(x)
    if arr.dtype != dt.bfloat16:
        raise TypeError(f"from_dlpack: {type(x).__name__} of dtype {x.dtype} did not convert "
                        f"to bfloat16 (got {arr.dtype})")  # fmt: skip
    return np.array(arr, copy=True) if copy else arr


def _device_arg(device, who: str):
    """A device keyword: a lazymath Device (or its name, e.g. "npu:0"); validated at the call."""
    cur = _current_device()
    if device is None or device is cur:
        return cur
    if isinstance(device, str):
        if device == str(cur):
            return cur
        raise ValueError(f"{who}: unknown device {device!r}; the current device is {cur}")
    if type(device).__name__ == "Device" or device == cur:
        return device
    raise ValueError(f"{who}: {device!r} is not a lazymath device")


def _shape_arg(shape) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    try:
        shape = tuple(operator.index(s) for s in shape)
    except TypeError:
        raise TypeError(f"shape must be a tuple of ints, got {shape!r}") from None
    if builtins.any(s < 0 for s in shape):
        raise ValueError(f"negative dimensions are not allowed: {shape}")
    return shape


def full(shape, fill_value, dtype=None, *, device=None) -> Tensor:
    """A constant tensor (free in the graph). Without `dtype` the fill value decides: a Python
    bool, int, float, complex gives bool, int64, float32, complex64 (the Array API defaults)."""
    shape = _shape_arg(shape)
    if isinstance(fill_value, Tensor):
        if fill_value.ndim:
            raise ValueError(f"full: fill_value must be a scalar, got shape {fill_value.shape}")
        fill_value = fill_value.item()
    if dtype is None:
        dtype = _default_dtype_of(fill_value)
        if dtype is None:
            dtype = np.asarray(fill_value).dtype
    dtype = dt.as_dtype(dtype)
    if isinstance(fill_value, complex) and dtype.kind != "c":
        raise TypeError(f"full: a complex fill value needs a complex dtype, not {dtype}")
    try:
        c = gn.const_node(fill_value, dtype)
    except OverflowError:
        raise OverflowError(f"full: {fill_value!r} does not fit dtype {dtype}") from None
    dev = None if device is None else _device_arg(device, "full")
    return Tensor(gn.make("expand", dtype, shape, (c,)) if shape else c, dev)


def zeros(shape, dtype=None, *, device=None) -> Tensor:
    """A lazy tensor of zeros (float32 by default): a constant broadcast in the graph, so it
    costs no memory until a kernel writes it out."""
    return full(shape, 0, dt.float32 if dtype is None else dtype, device=device)


def ones(shape, dtype=None, *, device=None) -> Tensor:
    """A lazy tensor of ones (float32 by default); a broadcast constant, like `zeros`."""
    return full(shape, 1, dt.float32 if dtype is None else dtype, device=device)


def empty(shape, dtype=None, *, device=None) -> Tensor:
    """Like numpy.empty; lazymath fills with zeros (a free constant in the graph)."""
    return full(shape, 0, dt.float32 if dtype is None else dtype, device=device)


def zeros_like(x: Tensor, /, dtype=None, *, device=None) -> Tensor:
    """Zeros with `x`'s shape, and its dtype and device unless given."""
    return full(x.shape, 0, dtype or x.dtype, device=device or x.device)


def ones_like(x: Tensor, /, dtype=None, *, device=None) -> Tensor:
    """Ones with `x`'s shape, and its dtype and device unless given."""
    return full(x.shape, 1, dtype or x.dtype, device=device or x.device)


def empty_like(x: Tensor, /, dtype=None, *, device=None) -> Tensor:
    """Like numpy.empty_like; lazymath fills with zeros."""
    return full(x.shape, 0, dtype or x.dtype, device=device or x.device)


def full_like(x: Tensor, /, fill_value, dtype=None, *, device=None) -> Tensor:
    """`fill_value` with `x`'s shape, and its dtype and device unless given; a value that
    does not fit the dtype raises OverflowError here."""
    return full(x.shape, fill_value, dtype or x.dtype, device=device or x.device)


def arange(start, /, stop=None, step=1, dtype=None, *, device=None) -> Tensor:
    """Array API / numpy arange: [start, stop) by step; ``arange(n)`` is ``arange(0, n)``.

    Without `dtype`: int64 when start, stop and step are all integers, else float32 (the
    default floating dtype). The length is ceil((stop - start) / step)."""
    if stop is None:
        start, stop = 0, start
    for name, v in (("start", start), ("stop", stop), ("step", step)):
        if isinstance(v, (complex, np.complexfloating)) or not isinstance(
            v, (int, float, np.integer, np.floating)
        ):
            raise TypeError(f"arange: {name} must be a real number, got {v!r}")
    if step == 0:
        raise ValueError("arange: step must not be zero")
    ints = builtins.all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                        for v in (start, stop, step))  # fmt: skip
    want = dt.as_dtype(dtype) if dtype is not None else (dt.int64 if ints else dt.float32)
    n = builtins.max(0, math.ceil((stop - start) / step)) if not ints else builtins.max(
        0, -(-(stop - start) // step))  # fmt: skip
    if n > 2**31:
        raise ValueError(f"arange: {n} elements is too many")
    if ints and want.kind in "iu":
        arr = (start + step * np.arange(n, dtype=np.int64)).astype(want)
    else:
        arr = (float(start) + float(step) * np.arange(n, dtype=np.float64)).astype(want)
    return _from_numpy(arr, "arange", None if device is None else _device_arg(device, "arange"))


def linspace(start, stop, /, num=50, dtype=None, *, device=None, endpoint=True) -> Tensor:
    """num evenly spaced values over [start, stop] (or [start, stop) without endpoint);
    float32 without `dtype` (complex64 for complex endpoints)."""
    num = operator.index(num)
    if num < 0:
        raise ValueError(f"linspace: num must be non-negative, got {num}")
    cplx = isinstance(start, complex) or isinstance(stop, complex)
    want = dt.as_dtype(dtype) if dtype is not None else (dt.complex64 if cplx else dt.float32)
    arr = np.linspace(start, stop, num, endpoint=endpoint)
    with np.errstate(all="ignore"):
        arr = arr.astype(want)
    return _from_numpy(arr, "linspace", None if device is None else _device_arg(device, "linspace"))


def eye(n_rows, n_cols=None, /, k=0, dtype=None, *, device=None) -> Tensor:
    """numpy.eye: ones on the `k`-th diagonal of an `n_rows` x `n_cols` matrix (square by
    default), float32 unless `dtype` says otherwise. Built on the host: it is an input of the
    graph, not a kernel."""
    dtype = dt.float32 if dtype is None else dt.as_dtype(dtype)
    arr = np.eye(operator.index(n_rows), None if n_cols is None else operator.index(n_cols),
                 operator.index(k), dtype=dtype)  # fmt: skip
    return _from_numpy(arr, "eye", None if device is None else _device_arg(device, "eye"))


def _host_memory_available() -> int:
    """Bytes this host can still allocate (MemAvailable; 0 where /proc/meminfo is missing)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


class _Random:
    """lm.random: deterministic given `seed` (numpy's PCG64, float32 draws cast to `dtype`).

    The values are generated on the host at the call (a realized input of the graph), straight
    into the tensor's own buffer in chunks: one copy of the result at the peak, Ctrl-C works
    between chunks, a size that cannot fit the device's or the host's memory is refused before
    any work, and a generation that takes more than a few seconds reports its progress on
    stderr (`lm.random.randn(1 << 16, 1 << 16)` is 16 GiB: about a minute on one core)."""

    CHUNK = 1 << 22  # elements per draw: 16 MiB of float32, large enough to amortize the call
    PROGRESS_AFTER_S = 2.0

    @staticmethod
    def rand(*shape, seed=None, dtype=dt.float32) -> Tensor:
        """Uniform samples in [0, 1) of `shape` (given as ints or one tuple)."""
        return _Random._draw("rand", shape, seed, dtype, lambda rng, out: rng.random(
            dtype=np.float32, out=out))  # fmt: skip

    @staticmethod
    def randn(*shape, seed=None, dtype=dt.float32) -> Tensor:
        """Standard normal samples of `shape` (given as ints or one tuple)."""
        return _Random._draw("randn", shape, seed, dtype, lambda rng, out: rng.standard_normal(
            dtype=np.float32, out=out))  # fmt: skip

    @staticmethod
    def _draw(who: str, shape, seed, dtype, fill) -> Tensor:
        import time

        from lazymath.units import fmt_bytes as _fmt_bytes

        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape = _shape_arg(shape)
        dtype = dt.as_dtype(dtype)
        if not (dt.is_float(dtype) or dt.is_complex(dtype)):
            raise TypeError(f"lm.random.{who}: dtype must be a floating dtype, got {dtype}")
        n = math.prod(shape)
        nbytes = n * dtype.itemsize
        staging = 0 if dtype == np.float32 else builtins.min(n, _Random.CHUNK) * 4
        spec = getattr(_current_device(), "spec", None)
        cap = getattr(spec, "hbm_bytes", 0) or 0
        avail = _host_memory_available()
        for limit, what in ((cap, f"the device memory of the {getattr(spec, 'name', 'device')}"),
                            (avail, "the memory this host has available")):  # fmt: skip
            if limit and nbytes + staging > limit:
                raise MemoryError(
                    f"lm.random.{who}{shape}: the result is {_fmt_bytes(nbytes)} of {dtype}, "
                    f"more than {what} ({_fmt_bytes(limit)}); nothing was generated. Draw "
                    "smaller pieces (e.g. one block of rows at a time, each with its own seed)."
                )
        rng = np.random.default_rng(seed)
        out = np.empty(shape, dtype=dtype)
        flat = out.reshape(-1)
        t0 = last = time.perf_counter()
        for lo in range(0, n, _Random.CHUNK):
            hi = builtins.min(lo + _Random.CHUNK, n)
            if dtype == np.float32:
                fill(rng, flat[lo:hi])
            else:
                tmp = np.empty(hi - lo, np.float32)
                fill(rng, tmp)
                flat[lo:hi] = tmp
            now = time.perf_counter()
            if now - t0 > _Random.PROGRESS_AFTER_S and (now - last > 5.0 or hi == n):
                last = now
                print(f"lazymath: lm.random.{who}{shape}: {_fmt_bytes(hi * dtype.itemsize)} "
                      f"of {_fmt_bytes(nbytes)} generated on the host ({now - t0:.0f} s)",
                      file=sys.stderr, flush=True)  # fmt: skip
        return _from_numpy(out, f"lm.random.{who}")


random = _Random()


# ----------------------------------------------------------------------------- helpers


def _as_tensor_or_scalar(x, op: str):
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (bool, int, float, complex, np.generic)):
        if isinstance(x, np.generic):
            return tensor(np.asarray(x))
        return x
    if isinstance(x, (np.ndarray, list, tuple)) or hasattr(x, "__array__"):
        return tensor(x)
    raise TypeError(f"{op}: unsupported operand type {type(x).__name__}")


def broadcast_shapes(*shapes: tuple[int, ...], op: str = "broadcast") -> tuple[int, ...]:
    """The numpy broadcast of `shapes` (axes aligned on the right, size 1 stretches).

    Raises ValueError naming `op` and every shape when two sizes disagree, so the message
    points at the user's call (`matmul (batch dimensions)`, `add`, ...), not at this helper."""
    first = shapes[0] if shapes else ()
    if all(s == first for s in shapes):
        return tuple(first)
    ndim = builtins.max((len(s) for s in shapes), default=0)
    out = []
    for d in range(ndim):
        size = 1
        for s in shapes:
            k = d - (ndim - len(s))
            if k < 0:
                continue
            v = s[k]
            if v == 1:
                continue
            if size != 1 and v != size:
                shown = " and ".join(str(tuple(x)) for x in shapes)
                raise ValueError(
                    f"{op}: shapes {shown} cannot be broadcast together: axis {d - ndim} has "
                    f"sizes {size} and {v} (sizes must match or be 1)"
                )
            size = v
        out.append(size)
    return tuple(out)


_CONST_EXPANDS: dict = {}  # (id(const), shape) -> (const, its expand): kept alive


def _expand(node: gn.Node, shape: tuple[int, ...]) -> gn.Node:
    if node.shape == shape:
        return node
    if node.op == "const":
        # scalars broadcast to the same shapes in every call of a composite op: keeping these
        # expand nodes alive saves re-creating (and re-interning) one node per scalar per call
        hit = _CONST_EXPANDS.get((id(node), shape))
        if hit is not None and hit[1].realized is None:
            return hit[1]
        out = gn.make("expand", node.dtype, shape, (node,))
        if len(_CONST_EXPANDS) > 4096:
            _CONST_EXPANDS.clear()
        _CONST_EXPANDS[(id(node), shape)] = (node, out)
        return out
    return gn.make("expand", node.dtype, shape, (node,))


def _cast(node: gn.Node, dtype: np.dtype) -> gn.Node:
    if node.dtype == dtype:
        return node
    c = _peel_const(node)
    if c is not None:  # fold: a cast (broadcast) constant is a (broadcast) constant
        with np.errstate(all="ignore"):
            value = c.realized.astype(dtype).item()
        return _expand(gn.const_node(value, dtype), node.shape)
    return gn.make("cast", dtype, node.shape, (node,))


def _peel_const(node: gn.Node):
    """The const behind `node` if it is a (broadcast) constant, else None."""
    while node.op == "expand" and node.srcs:  # a realized expand has no srcs: it is a buffer
        node = node.srcs[0]
    return node if node.op == "const" else None


def _memo(table: dict, key: tuple, compute, *args):
    """table[key], computed by compute(*args) on a miss. Plan tables are bounded (cleared when
    full); a key that cannot be hashed (an unhashable arg or axis list) is computed each time.
    Errors raised by compute are never stored, so a bad call raises on every attempt."""
    try:
        plan = table.get(key)
    except TypeError:
        return compute(*args)
    if plan is None:
        plan = compute(*args)
        if len(table) > 8192:
            table.clear()
        table[key] = plan
    return plan


_FAST_OPERANDS = (float, int, bool)
_EW_PLANS: dict = {}  # (op, arg, operand dtypes/shapes/scalar types) -> dtypes and shape


def _elementwise(op: str, operands: Sequence, arg=None) -> Tensor:
    """Record an elementwise op with numpy's dtype rule and broadcasting.

    Fast path first: a unary op on a tensor, or a binary op on two tensors or a tensor and a
    Python scalar, whose plan is already known (every call of a composite op after the first).
    Anything else, and every error, goes through `_elementwise_general`."""
    try:
        if len(operands) == 2:
            a, b = operands
            if type(a) is Tensor:
                na = a._node
                tb = type(b)
                if tb is Tensor:
                    nb = b._node
                    if b._device is a._device:
                        plan = _EW_PLANS.get((op, arg, na.dtype, na.shape, nb.dtype, nb.shape))
                        if plan is not None:
                            out = _fast_binary(op, arg, plan, na, nb, a._device)
                            if out is not None:
                                return out
                elif tb is float or tb is int:
                    plan = _EW_PLANS.get((op, arg, na.dtype, na.shape, tb))
                    if plan is not None:
                        nb = gn.const_node(b, plan[0][1])
                        out = _fast_binary(op, arg, plan, na, nb, a._device)
                        if out is not None:
                            return out
            elif type(b) is Tensor and (type(a) is float or type(a) is int):
                nb = b._node
                plan = _EW_PLANS.get((op, arg, type(a), nb.dtype, nb.shape))
                if plan is not None:
                    na = gn.const_node(a, plan[0][0])
                    out = _fast_binary(op, arg, plan, na, nb, b._device)
                    if out is not None:
                        return out
        elif len(operands) == 1:
            (a,) = operands
            if type(a) is Tensor:
                na = a._node
                plan = _EW_PLANS.get((op, arg, na.dtype, na.shape))
                if plan is not None:
                    (d,), out_dtype, shape = plan
                    if na.dtype is not d and na.dtype != d:
                        na = _cast(na, d)
                    if _peel_const(na) is None:
                        return Tensor(_ew_node(op, out_dtype, shape, (na,), arg), a._device)
    except (TypeError, OverflowError):  # unhashable arg, scalar out of range: the slow path
        pass  # raises the user-facing error
    return _elementwise_general(op, operands, arg)


def _fast_binary(op, arg, plan, na, nb, device):
    """The node of a binary op with a known plan, or None to take the general path (constant
    operands fold there)."""
    (da, db), out_dtype, shape = plan
    # `is not` first: builtin dtypes are singletons, and numpy's dtype != is slow
    if na.dtype is not da and na.dtype != da:
        na = _cast(na, da)
    if na.shape != shape:
        na = _expand(na, shape)
    if nb.dtype is not db and nb.dtype != db:
        nb = _cast(nb, db)
    if nb.shape != shape:
        nb = _expand(nb, shape)
    if _peel_const(na) is not None and _peel_const(nb) is not None:
        return None
    return Tensor(_ew_node(op, out_dtype, shape, (na, nb), arg), device)


def _elementwise_general(op: str, operands: Sequence, arg=None) -> Tensor:
    """Record an elementwise op with numpy's dtype rule and broadcasting."""
    ops = []
    tensors = []
    key = [op, arg]
    for x in operands:
        tx = type(x)
        if tx is not Tensor and tx not in _FAST_OPERANDS:
            x = _as_tensor_or_scalar(x, op)
            tx = Tensor if isinstance(x, Tensor) else type(x)
        if tx is Tensor:
            tensors.append(x)
            n = x._node
            key.append(n.dtype)
            key.append(n.shape)
        else:
            key.append(tx)
        ops.append(x)
    if len(tensors) > 1:
        _check_devices(op, tensors)
    # Every op of a composite is captured on each call: the dtype rule and broadcast result
    # for this (op, operand kinds) are computed once and replayed.
    in_dtypes, out_dtype, shape = _memo(_EW_PLANS, tuple(key), _ew_plan, op, ops, tensors)
    nodes = []
    all_const = True
    for x, d in zip(ops, in_dtypes):
        if type(x) is Tensor:
            n = x._node
            if n.dtype != d:
                n = _cast(n, d)
        else:
            try:
                n = gn.const_node(x, d)
            except OverflowError as e:
                raise OverflowError(f"{op}: scalar {x!r} does not fit dtype {d}: {e}") from None
        if n.shape != shape:
            n = _expand(n, shape)
        if all_const and _peel_const(n) is None:
            all_const = False
        nodes.append(n)
    if all_const:  # constant folding: every operand a (broadcast) constant -> one constant
        from lazymath.graph.reference import fold

        consts = [_peel_const(n) for n in nodes]
        probe = gn.make(op, out_dtype, (), consts, arg)
        value = fold(probe, [c.realized for c in consts])
        c = gn.const_node(value.item(), out_dtype)
        return _wrap(_expand(c, shape), tensors)
    return Tensor(_ew_node(op, out_dtype, shape, nodes, arg), tensors[0]._device)


def _ew_node(op: str, out_dtype: np.dtype, shape: tuple, srcs: tuple, arg) -> gn.Node:
    """The node of elementwise `op`; a bfloat16 result is the float32 op rounded by one cast
    (its inputs are float32 already, `_ew_plan`), so kernels only ever load, store and convert
    bfloat16 and every op keeps its float32 lowering (vmath, comparisons, reductions)."""
    if dt.is_bf16(out_dtype):
        return gn.make("cast", out_dtype, shape, (gn.make(op, dt.float32, shape, srcs, arg),))
    return gn.make(op, out_dtype, shape, srcs, arg)


def _ew_plan(op: str, ops: list, tensors: list) -> tuple:
    """(input dtypes, output dtype, output shape) of `op` on these operands, with the errors
    a user should see (unsupported dtypes, shapes that do not broadcast)."""
    if op == "where":
        cond, a, b = ops
        kinds = tuple(x.dtype if isinstance(x, Tensor) else type(x) for x in (a, b))
        try:
            out_dtype = dt.result_type(*[np.empty(0, k) if isinstance(k, np.dtype) else
                                         k(0) for k in kinds])  # fmt: skip
        except TypeError as e:
            raise TypeError(f"where: cannot combine dtypes {kinds}: {e}") from None
        in_dtypes = (dt.bool_, out_dtype, out_dtype)
    else:
        kinds = tuple(x.dtype if isinstance(x, Tensor) else type(x) for x in ops)
        try:
            in_dtypes, out_dtype = ufunc_dtypes(op, kinds)
        except Exception:
            shown = ", ".join(k.name if isinstance(k, np.dtype) else k.__name__ for k in kinds)
            raise TypeError(f"{op}: not supported for operand dtypes ({shown})") from None
        rule = ELEMENTWISE[op].info.dtypes
        if rule.float_result and out_dtype.kind not in "fc" and not dt.is_bf16(out_dtype):
            out_dtype = dt.float64
            in_dtypes = (dt.float64,)
        if rule.bool_inputs:
            in_dtypes = tuple(dt.bool_ for _ in in_dtypes)
    # bfloat16 is a storage format: the op computes in float32 and `_ew_node` rounds its result
    # once (exact for the inputs, one rounding on store, as float16 is computed elsewhere)
    in_dtypes = tuple(dt.float32 if dt.is_bf16(d) else d for d in in_dtypes)
    if out_dtype not in dt.SUPPORTED:
        raise TypeError(f"{op}: result dtype {out_dtype} is not supported by lazymath")
    shape = broadcast_shapes(*(t.shape for t in tensors), op=op)
    return tuple(np.dtype(d) for d in in_dtypes), np.dtype(out_dtype), shape


def _axes(axis, ndim: int, op: str) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, (int, np.integer)):
        axis = (int(axis),)
    elif not isinstance(axis, (tuple, list)):
        raise TypeError(f"{op}: axis must be an int or a tuple of ints, got {axis!r}")
    out = []
    for a in axis:
        if not isinstance(a, (int, np.integer)):
            raise TypeError(f"{op}: axis must be an int or a tuple of ints, got {a!r}")
        if not -ndim <= a < ndim:
            raise ValueError(f"{op}: axis {a} is out of bounds for a tensor of {ndim} dimensions")
        a = int(a) % ndim
        if a in out:
            raise ValueError(f"{op}: repeated axis {a}")
        out.append(a)
    return tuple(sorted(out))


# ----------------------------------------------------------------------------- elementwise


def _doc(m: Op) -> str:
    """A binding's docstring from its op record: the numpy function whose semantics (result
    dtype, values, NaN/inf) it follows."""
    rule = m.info.dtypes
    what = f"Elementwise {m.value}" + (" with broadcasting" if m.arity > 1 else "")
    if m.info.ref is rule.ufunc:
        return f"{what}, as numpy.{rule.ufunc.__name__} (result dtype and values). Lazy."
    extra = ", a float for integer inputs" if rule.float_result else ""
    return f"{what}; result dtype as numpy.{rule.ufunc.__name__}{extra}. Lazy."


def _unary(m: Op):
    """The public function of unary op record `m` (one line per op below)."""
    if m.arity != 1 or m.info.dtypes is None:
        raise TypeError(f"{m!r} is not a unary elementwise op with a dtype rule")
    op = m.value  # a plain str: the node op, a key of the plan tables

    def f(x, *args) -> Tensor:
        return _elementwise(op, (x,), *args)

    f.__name__ = f.__qualname__ = op
    f.__doc__ = _doc(m)
    return f


def _binary(m: Op):
    """The public function of binary op record `m`."""
    if m.arity != 2 or m.info.dtypes is None:
        raise TypeError(f"{m!r} is not a binary elementwise op with a dtype rule")
    op = m.value

    def f(a, b) -> Tensor:
        if type(a) is not type(b):  # a Python scalar from user code: a runtime argument
            a, b = _scalar_args_of(op, a, b, sys._getframe(1).f_code)
        return _elementwise(op, (a, b))

    f.__name__ = f.__qualname__ = op
    f.__doc__ = _doc(m)
    return f


# One line per op record of `graph.ops` with a dtype rule (tests/graph/test_op_registry.py
# checks that none is missing); the function, its name and docstring come from the record.
neg = _unary(Op.NEG)
abs = _unary(Op.ABS)
_abs_elementwise = abs


def abs(x, *args) -> Tensor:  # noqa: A001
    if type(x) is Tensor and x._node.op == "complex_join":
        fused = _fft_abs(x)
        if fused is not None:
            return fused
    return _abs_elementwise(x, *args)


abs.__doc__ = _abs_elementwise.__doc__ + (
    " abs(fft(x)) of a Vector Stockham FFT is one kernel: its last stage writes the magnitudes."
)
exp = _unary(Op.EXP)
exp2 = _unary(Op.EXP2)
log = _unary(Op.LOG)
sqrt = _unary(Op.SQRT)
rsqrt = _unary(Op.RSQRT)
reciprocal = _unary(Op.RECIPROCAL)
sin = _unary(Op.SIN)
cos = _unary(Op.COS)
tan = _unary(Op.TAN)
tanh = _unary(Op.TANH)
sigmoid = _unary(Op.SIGMOID)
relu = _unary(Op.RELU)
sign = _unary(Op.SIGN)
floor = _unary(Op.FLOOR)
ceil = _unary(Op.CEIL)
_round = _unary(Op.ROUND)


def round(x) -> Tensor:
    """Round half to even (numpy.round). Integers round to themselves and keep their dtype,
    as in numpy.round (numpy.rint would give floats); bool gives float16 like numpy."""
    if isinstance(x, Tensor) and dt.is_int(x.dtype):
        return x
    return _round(x)


def _integral_identity(op: str, f):
    """floor/ceil of integers and bools are the input itself (numpy 2 keeps the dtype), so no
    backend has to implement integer rounding."""

    def g(x) -> Tensor:
        return x if isinstance(x, Tensor) and x.dtype.kind in "iub" else f(x)

    g.__name__, g.__doc__ = op, f"Elementwise {op}, numpy semantics (identity on integers)."
    return g


floor = _integral_identity("floor", floor)
ceil = _integral_identity("ceil", ceil)
logical_not = _unary(Op.LOGICAL_NOT)
isnan = _unary(Op.ISNAN)
isinf = _unary(Op.ISINF)
isfinite = _unary(Op.ISFINITE)
signbit = _unary(Op.SIGNBIT)
trunc = _integral_identity("trunc", _unary(Op.TRUNC))
square = _unary(Op.SQUARE)
bitwise_invert = _unary(Op.BITWISE_INVERT)
log1p = _unary(Op.LOG1P)
expm1 = _unary(Op.EXPM1)
log2 = _unary(Op.LOG2)
log10 = _unary(Op.LOG10)
sinh = _unary(Op.SINH)
cosh = _unary(Op.COSH)
asinh = _unary(Op.ASINH)
acosh = _unary(Op.ACOSH)
atanh = _unary(Op.ATANH)
asin = _unary(Op.ASIN)
acos = _unary(Op.ACOS)
atan = _unary(Op.ATAN)
erf = _unary(Op.ERF)
erfc = _unary(Op.ERFC)

add = _binary(Op.ADD)
sub = _binary(Op.SUB)
mul = _binary(Op.MUL)
div = _binary(Op.DIV)
floor_divide = _binary(Op.FLOOR_DIVIDE)
remainder = _binary(Op.REMAINDER)
_pow = _binary(Op.POW)


def _negative_int(x) -> bool:
    """x is a negative Python/numpy integer (a tensor exponent is checked when it is computed:
    the reference backend raises at realize, naming the line)."""
    if isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)):
        return x < 0
    return False


def _negative_values(x) -> bool:
    """x is a signed-integer exponent whose values are already on the host (a realized tensor,
    a numpy array, a list) and holds a negative value. A lazily computed exponent is not
    read here (that would force a realize at graph-building time)."""
    if isinstance(x, Tensor):
        arr = x._node.realized
        if arr is None:
            return False
    elif isinstance(x, (np.ndarray, list, tuple)):
        arr = np.asarray(x)
    else:
        return False
    return arr.dtype.kind == "i" and arr.size > 0 and bool((arr < 0).any())


def pow(a, b) -> Tensor:
    """Elementwise power with broadcasting (numpy.power's dtype rule): an integer base raised
    to a negative integer exponent is a ValueError, as in numpy, for a Python or numpy
    exponent and for an exponent tensor whose values are known (realized). An exponent
    computed in the same graph is not checked on the llvm and interp backends (the integer
    result there is 0 for 2 ** -1, like C's integer power); the reference backend raises."""
    base = a.dtype if isinstance(a, Tensor) else np.asarray(a).dtype
    if base.kind in "iub" and (_negative_int(b) or _negative_values(b)):
        bt = b.dtype if isinstance(b, Tensor) else np.asarray(b).dtype
        if dt.result_type(base, bt).kind in "iu":
            raise ValueError("Integers to negative integer powers are not allowed.")
    return _pow(a, b)


maximum = _binary(Op.MAXIMUM)
minimum = _binary(Op.MINIMUM)
# op(x, c) for an integer tensor x and a Python int c below (index 0) or above (index 1) x's
# dtype's range: every element has the same, known answer (numpy 2, NEP 50)
_OUT_OF_RANGE = {"eq": (False, False), "ne": (True, True), "lt": (False, True),
                 "le": (False, True), "gt": (True, False), "ge": (True, False)}  # fmt: skip
_MIRROR = {"eq": "eq", "ne": "ne", "lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}


def _int_out_of_range(x, c) -> int:
    """-1 / +1 when `x` is an integer tensor and `c` a Python int below / above the range of
    x's dtype (numpy 2 compares such a pair mathematically instead of raising), else 0."""
    if type(x) is not Tensor or not isinstance(c, int) or isinstance(c, bool):
        return 0
    d = x._node.dtype
    if d.kind not in "iu":
        return 0
    info = np.iinfo(d)
    return -1 if c < info.min else 1 if c > info.max else 0


def _compare(m: Op):
    """The public function of comparison record `m`: `_binary`'s, plus numpy 2's answer for
    an integer tensor against an out-of-range Python int (`lm.greater(u8, -1)` is all True,
    `lm.equal(u8, 256)` all False): a constant of x's shape, decided here at the call."""
    op = m.value
    f = _binary(m)

    def g(a, b) -> Tensor:
        side, x, name = _int_out_of_range(a, b), a, op
        if not side:
            side, x, name = _int_out_of_range(b, a), b, _MIRROR[op]
        if side:
            value = _OUT_OF_RANGE[name][side > 0]
            return _wrap(_expand(gn.const_node(value, dt.bool_), x.shape), [x])
        if type(a) is not type(b):  # an in-range user scalar: a runtime argument (as _binary)
            a, b = _scalar_args_of(op, a, b, sys._getframe(1).f_code)
        return f(a, b)

    g.__name__ = g.__qualname__ = op
    g.__doc__ = (f.__doc__ or "") + (
        " An integer tensor against a Python int outside its dtype's range gives numpy 2's "
        "answer (all True or all False), not an OverflowError."
    )
    return g


eq = _compare(Op.EQ)
ne = _compare(Op.NE)
lt = _compare(Op.LT)
le = _compare(Op.LE)
gt = _compare(Op.GT)
ge = _compare(Op.GE)
logical_and = _binary(Op.LOGICAL_AND)
logical_or = _binary(Op.LOGICAL_OR)
bitwise_and = _binary(Op.BITWISE_AND)
bitwise_or = _binary(Op.BITWISE_OR)
bitwise_xor = _binary(Op.BITWISE_XOR)
bitwise_left_shift = _binary(Op.BITWISE_LEFT_SHIFT)
bitwise_right_shift = _binary(Op.BITWISE_RIGHT_SHIFT)
copysign = _binary(Op.COPYSIGN)
hypot = _binary(Op.HYPOT)
logaddexp = _binary(Op.LOGADDEXP)
atan2 = _binary(Op.ATAN2)

subtract, multiply, divide, true_divide, negative, power = sub, mul, div, div, neg, pow
equal, not_equal, less, less_equal, greater, greater_equal = eq, ne, lt, le, gt, ge


def leaky_relu(x, negative_slope: float = 0.01) -> Tensor:
    """Elementwise x if x >= 0 else x * negative_slope; a float result for integer inputs."""
    return _elementwise(Op.LEAKY_RELU.value, (x,), float(negative_slope))


def where(cond, a, b) -> Tensor:
    """Elementwise choice: `a` where `cond` is true, else `b` (numpy.where with three
    arguments). `cond` is cast to bool; `a` and `b` broadcast and promote like an add. One
    Vector op, fused with its neighbours."""
    c = _as_tensor_or_scalar(cond, "where")
    if isinstance(c, Tensor) and c.dtype != dt.bool_:
        c = astype(c, dt.bool_)
    if type(a) is not type(b) and _SCALAR_ARGS.get():  # a user scalar: a runtime argument
        caller = sys._getframe(1).f_code
        if not gn.is_lazymath_code(caller):
            a, b = _where_scalar_args(a, b)
    return _elementwise("where", (c, a, b))


def _where_scalar_args(a, b):
    """where's Python scalar branch beside a tensor branch as a 0-d runtime argument of the
    weak-scalar result dtype (numpy.result_type of the tensor's dtype and the scalar)."""
    for i, (s, t) in enumerate(((b, a), (a, b))):
        if type(t) is Tensor and type(s) in _PY_SCALAR_TYPES:
            try:
                d = np.dtype(dt.result_type(t.dtype, s))
                if d not in dt.SUPPORTED or (d.kind == "b" and type(s) is not bool):
                    continue
                with np.errstate(over="ignore"):
                    arr = np.array(s, dtype=d)
            except (OverflowError, ValueError, TypeError):
                continue
            arr.flags.writeable = False
            st = Tensor(gn.buffer_node(arr), t._device)
            if i == 0:
                b = st
            else:
                a = st
    return a, b


def clip(x, /, min=None, max=None) -> Tensor:
    """Elementwise clamp to [min, max] (scalars or tensors; positional like numpy's a_min,
    a_max); the result keeps x's dtype. With neither bound, x itself (the standard's rule)."""
    lo, hi = min, max
    if lo is None and hi is None:
        if isinstance(x, Tensor):
            return x
        raise ValueError("clip: give at least one of min and max")
    # numpy 2: a Python int bound outside an integer x's range that cannot bind (a min below
    # the dtype's minimum, a max above its maximum) is no bound; one that would bind everything
    # is numpy's OverflowError
    for name, bound, harmless in (("min", lo, -1), ("max", hi, 1)):
        side = _int_out_of_range(x, bound)
        if side and side != harmless:
            raise OverflowError(f"clip: {name}={bound!r} is out of bounds for {x.dtype}")
    if _int_out_of_range(x, lo) == -1:
        lo = None
    if _int_out_of_range(x, hi) == 1:
        hi = None
    if lo is None and hi is None:
        return x
    if type(x) is Tensor and _SCALAR_ARGS.get():  # user scalar bounds: runtime arguments
        caller = sys._getframe(1).f_code
        if type(lo) in _PY_SCALAR_TYPES:
            lo = _scalar_arg(x, lo, "maximum", False, caller)
        if type(hi) in _PY_SCALAR_TYPES:
            hi = _scalar_arg(x, hi, "minimum", False, caller)
    out = x
    if lo is not None:
        out = maximum(out, lo)
    if hi is not None:
        out = minimum(out, hi)
    return out


def astype(x: Tensor, dtype, /, *, copy: bool = True, device=None) -> Tensor:
    """x converted to `dtype` (lazy). Tensors are immutable, so `copy=True` gives a new handle
    and `copy=False` may return x itself."""
    dtype = dt.as_dtype(dtype)
    if not isinstance(x, Tensor):
        raise TypeError(f"astype: expected a Tensor, got {type(x).__name__}")
    node = _cast(x._node, dtype)
    dev = x._device if device is None else _device_arg(device, "astype")
    if node is x._node and not copy and dev is x._device:
        return x
    return Tensor(node, dev)


# ----------------------------------------------------------------------------- reductions


_REDUCE_PLANS: dict = {}  # (op, dtype, shape, axis, keepdims) -> (axes, out dtype, out shape)


def _reduce(op: str, x, axis, keepdims: bool) -> Tensor:
    if type(x) is not Tensor:
        x = _as_tensor_or_scalar(x, op)
        if not isinstance(x, Tensor):
            x = tensor(x)
    node = x._node
    key = (op, node.dtype, node.shape, axis, keepdims)
    axes, out_dtype, out_shape = _memo(_REDUCE_PLANS, key, _reduce_plan, op, x, axis)
    if axes and dt.is_bf16(node.dtype):  # in float32 (exact), rounded once: see `_ew_node`
        out = _reduce(op, Tensor(_cast(node, dt.float32), x._device), axis, keepdims)
        return out if op in ("argmax", "argmin") else astype(out, node.dtype)
    src = node if op in ("argmax", "argmin", "max", "min") else _cast(node, out_dtype)
    if not axes:
        if op in ("argmax", "argmin"):  # argmax of a 0-d tensor
            out_node = gn.const_node(0, dt.int64)
        else:
            out_node = _cast(src, out_dtype)
    else:
        out_node = gn.make("reduce", out_dtype, out_shape, (src,), (op, axes))
    out = Tensor(out_node, x._device)
    if keepdims:
        out = reshape(out, tuple(1 if i in axes else s for i, s in enumerate(x.shape)))
    return out


def _reduce_plan(op: str, x: Tensor, axis) -> tuple:
    """(axes, output dtype, output shape) of a reduction, with the user-facing errors."""
    axes = _axes(axis, x.ndim, op)
    if op in ("argmax", "argmin"):
        if axis is not None and not isinstance(axis, (int, np.integer)):
            raise TypeError(f"{op}: axis must be None or a single int, got {axis!r}")
        out_dtype = dt.int64
    elif op in ("sum", "prod"):
        if x.dtype.kind == "u":
            out_dtype = dt.uint64
        elif x.dtype == dt.bool_ or (dt.is_int(x.dtype) and x.dtype.itemsize < 8):
            out_dtype = dt.int64
        else:
            out_dtype = x.dtype
    else:
        out_dtype = x.dtype
    if op in ("max", "min", "argmax", "argmin"):
        for a in axes:
            if x.shape[a] == 0:
                raise ValueError(
                    f"{op}: reduction over axis {a} of size 0 (shape {x.shape}) has no identity"
                )
    out_shape = tuple(s for i, s in enumerate(x.shape) if i not in axes)
    return axes, np.dtype(out_dtype), out_shape


def sum(x, axis=None, keepdims=False, *, dtype=None) -> Tensor:
    """Sum over `axis` (all by default); integers accumulate in int64 (uint64 unsigned), float16
    in float32; `dtype=` casts the input first and is the result's dtype (the Array API's
    accumulator dtype: a narrow integer dtype wraps, as numpy's)."""
    if dtype is None:
        return _reduce("sum", x, axis, keepdims)
    x = astype(x if isinstance(x, Tensor) else tensor(x), dtype, copy=False)
    return astype(_reduce("sum", x, axis, keepdims), dtype, copy=False)


def prod(x, axis=None, keepdims=False, *, dtype=None) -> Tensor:
    """Product over `axis` (all axes by default); integers accumulate in int64 (uint64 when
    unsigned), like numpy. `dtype=` casts the input first and is the result's dtype (the
    Array API's accumulator dtype)."""
    if dtype is None:
        return _reduce("prod", x, axis, keepdims)
    x = astype(x if isinstance(x, Tensor) else tensor(x), dtype, copy=False)
    return astype(_reduce("prod", x, axis, keepdims), dtype, copy=False)


def max(x, axis=None, keepdims=False) -> Tensor:
    """Maximum over `axis` (all by default). NaN propagates like numpy.max; an empty axis raises
    ValueError (there is no identity to return)."""
    return _reduce("max", x, axis, keepdims)


def min(x, axis=None, keepdims=False) -> Tensor:
    """Minimum over `axis` (all by default). NaN propagates like numpy.min; an empty axis raises
    ValueError."""
    return _reduce("min", x, axis, keepdims)


def argmax(x, axis=None, keepdims=False) -> Tensor:
    """Index of the first maximum along `axis` (of the flattened tensor when `axis` is None),
    int64 like numpy; `keepdims` keeps the reduced axes as size 1."""
    if axis is None and isinstance(x, Tensor):
        out = _reduce("argmax", reshape(x, (-1,)), 0, False)
        return reshape(out, (1,) * x.ndim) if keepdims else out
    return _reduce("argmax", x, axis, keepdims)


def argmin(x, axis=None, keepdims=False) -> Tensor:
    """Index of the first minimum along `axis` (of the flattened tensor when `axis` is None),
    int64 like numpy; `keepdims` keeps the reduced axes as size 1."""
    if axis is None and isinstance(x, Tensor):
        out = _reduce("argmin", reshape(x, (-1,)), 0, False)
        return reshape(out, (1,) * x.ndim) if keepdims else out
    return _reduce("argmin", x, axis, keepdims)


def _float_for_mean(x: Tensor) -> Tensor:
    if x.dtype.kind in "fc" or dt.is_bf16(x.dtype):
        return x
    return astype(x, dt.float64)


def mean(x, axis=None, keepdims=False) -> Tensor:
    """Arithmetic mean over `axis` (all by default). Integers average in float64 (numpy's
    rule); float16 accumulates in float32 and is cast back. An empty reduction gives NaN."""
    x = x if isinstance(x, Tensor) else tensor(x)
    axes = _axes(axis, x.ndim, "mean")
    n = math.prod(x.shape[a] for a in axes)
    xf = _float_for_mean(x)
    acc = astype(xf, dt.float32) if xf.dtype == dt.float16 or dt.is_bf16(xf.dtype) else xf
    s = sum(acc, axis, keepdims)
    out = s * (1.0 / n) if n else s * float("nan")
    return astype(out, xf.dtype)


def var(x, axis=None, keepdims=False, ddof=0, *, correction=None) -> Tensor:
    """Variance; `correction` (the Array API's name) is numpy's `ddof`."""
    return _var("var", x, axis, keepdims, ddof if correction is None else correction)


def _var(op: str, x, axis, keepdims: bool, ddof) -> Tensor:
    x = x if isinstance(x, Tensor) else tensor(x)
    axes = _axes(axis, x.ndim, op)
    n = math.prod(x.shape[a] for a in axes)
    xf = _float_for_mean(x)
    acc = astype(xf, dt.float32) if xf.dtype == dt.float16 or dt.is_bf16(xf.dtype) else xf
    m = mean(acc, axis, keepdims=True)
    d = acc - m
    out_dtype = xf.dtype
    if dt.is_complex(xf.dtype):  # numpy: mean of |d|^2, a real result (float32 for complex64)
        a = abs(d)
        sq = a * a
        out_dtype = a.dtype
    else:
        sq = d * d
    denom = builtins.max(n - ddof, 0)
    s = sum(sq, axis, keepdims)
    out = s * (1.0 / denom) if denom else s * float("nan")
    return astype(out, out_dtype)


def std(x, axis=None, keepdims=False, ddof=0, *, correction=None) -> Tensor:
    """Standard deviation; `correction` (the Array API's name) is numpy's `ddof`."""
    return sqrt(_var("std", x, axis, keepdims, ddof if correction is None else correction))


def softmax(x, axis=-1) -> Tensor:
    """exp(x - max) / sum(exp(x - max)) along `axis`: the max shift keeps exp from
    overflowing. The planner fuses the whole chain into one row-resident kernel when a row
    fits the Vector unit's Unified Buffer (see `lm.explain`)."""
    x = _float_for_mean(x if isinstance(x, Tensor) else tensor(x))
    _axes(axis, x.ndim, "softmax")  # validate here so errors name softmax, not max
    m = max(x, axis, keepdims=True)
    e = exp(x - m)
    return e / sum(e, axis, keepdims=True)


def log_softmax(x, axis=-1) -> Tensor:
    """(x - max) - log(sum(exp(x - max))) along `axis`, the stable form; fused into one
    row-resident kernel like `softmax`."""
    x = _float_for_mean(x if isinstance(x, Tensor) else tensor(x))
    _axes(axis, x.ndim, "log_softmax")  # validate here so errors name log_softmax, not max
    m = max(x, axis, keepdims=True)
    z = x - m
    return z - log(sum(exp(z), axis, keepdims=True))


# ----------------------------------------------------------------------------- matmul


def _const_operand(node):
    """A matmul operand computed from constants alone (`lm.zeros(...)` and elementwise functions
    of it: the Cube kernel would have no buffer to load) as a realized buffer; others as is."""
    stack, seen = [node], set()
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if x.op == "const":
            continue
        if x.realized is not None or not (x.op in ELEMENTWISE or x.op in VIEWS):
            return node
        stack.extend(x.srcs)
    from lazymath.graph import reference

    return gn.buffer_node(np.ascontiguousarray(reference.run([node])[id(node)]))


def matmul(a, b) -> Tensor:
    """Matrix product with numpy's rules: 1-D operands are promoted (and the added axis removed
    again), leading axes broadcast as a batch, dtypes promote.

    Runs on the Cube unit for float16/bfloat16/float32 (float16 and bfloat16 accumulate in
    float32 and round once, on the FixPipe's way out); int and float64
    matmuls run on the AI CPU, and `lm.explain` says why. Elementwise ops that consume the
    result fuse into the Cube kernel's epilogue."""
    a = a if isinstance(a, Tensor) else tensor(a)
    b = b if isinstance(b, Tensor) else tensor(b)
    _check_devices("matmul", [a, b])
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(
            f"matmul: operands must have at least 1 dimension, got shapes {a.shape} and {b.shape}"
        )
    try:
        out_dtype = dt.result_type(a.dtype, b.dtype)
    except TypeError as e:
        raise TypeError(f"matmul: {e}") from None
    if out_dtype == dt.bool_:
        raise TypeError("matmul: bool operands are not supported; cast them to an integer dtype")
    a2 = reshape(a, (1, a.shape[0])) if a.ndim == 1 else a
    b2 = reshape(b, (b.shape[0], 1)) if b.ndim == 1 else b
    if a2.shape[-1] != b2.shape[-2]:
        raise ValueError(
            f"matmul: inner dimensions do not match: a has shape {a.shape}, b has shape "
            f"{b.shape} ({a2.shape[-1]} != {b2.shape[-2]}); the last axis of a must equal the "
            f"{'only' if b.ndim == 1 else 'second-to-last'} axis of b"
        )
    batch = broadcast_shapes(a2.shape[:-2], b2.shape[:-2], op="matmul (batch dimensions)")
    m, k, n = a2.shape[-2], a2.shape[-1], b2.shape[-1]
    na = _expand(_cast(_const_operand(a2._node), out_dtype), batch + (m, k))
    nb = _expand(_cast(_const_operand(b2._node), out_dtype), batch + (k, n))
    out = _wrap(gn.make("matmul", out_dtype, batch + (m, n), (na, nb)), [a])
    if a.ndim == 1 and b.ndim == 1:
        return reshape(out, ())
    if a.ndim == 1:
        return reshape(out, batch + (n,))
    if b.ndim == 1:
        return reshape(out, batch + (m,))
    return out


def dot(a, b) -> Tensor:
    """numpy.dot for 1-D and 2-D operands: the same as `matmul` (for N-D operands numpy's dot
    contracts differently; use `matmul` or `tensordot` there)."""
    return matmul(a, b)


# ----------------------------------------------------------------------------- views


def reshape(x: Tensor, shape, *, copy=None) -> Tensor:
    """A view with a new shape (one -1 is inferred). Tensors are immutable: `copy=` is
    accepted for the Array API and changes nothing."""
    try:
        shape = (
            (operator.index(shape),)
            if not isinstance(shape, (tuple, list))
            else tuple(operator.index(s) for s in shape)
        )
    except TypeError:
        raise TypeError(
            f"reshape: shape must be an int or a tuple of ints, got {shape!r}"
        ) from None
    if shape.count(-1) > 1:
        raise ValueError(f"reshape: only one dimension can be -1, got {shape}")
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        if known == 0 or x.size % known:
            raise ValueError(f"reshape: cannot reshape tensor of shape {x.shape} into {shape}")
        shape = tuple(x.size // known if s == -1 else s for s in shape)
    if builtins.any(s < 0 for s in shape) or math.prod(shape) != x.size:
        raise ValueError(
            f"reshape: cannot reshape tensor of shape {x.shape} ({x.size} elements) into "
            f"shape {shape} ({math.prod(shape)} elements)"
        )
    if shape == x.shape:
        return x
    node = x._node
    if node.op == "reshape" and node.srcs:  # reshape of reshape is one reshape
        node = node.srcs[0]
        if node.shape == shape:
            return _wrap(node, [x])
    c = _peel_const(x._node)
    if c is not None:
        return _wrap(_expand(c, shape), [x])
    return _wrap(gn.make("reshape", x.dtype, shape, (node,)), [x])


def permute_dims(x: Tensor, axes) -> Tensor:
    """A view with the axes reordered: output axis i is input axis `axes[i]`. No data
    moves until a kernel reads it; nested permutes compose into one."""
    axes = tuple(int(a) for a in axes)
    if (
        sorted(a % x.ndim if x.ndim else a for a in axes) != list(range(x.ndim))
        or len(axes) != x.ndim
    ):
        raise ValueError(f"permute_dims: axes {axes} are not a permutation of {x.ndim} axes")
    axes = tuple(a % x.ndim for a in axes)
    if axes == tuple(range(x.ndim)):
        return x
    shape = tuple(x.shape[a] for a in axes)
    node = x._node
    if node.op == "permute" and node.srcs:  # compose permutations (unless realized)
        inner = node.arg
        axes = tuple(inner[a] for a in axes)
        node = node.srcs[0]
        if axes == tuple(range(len(axes))):
            return _wrap(node, [x])
    return _wrap(gn.make("permute", x.dtype, shape, (node,), axes), [x])


def transpose(x: Tensor, axes=None) -> Tensor:
    """A view with the axes reversed (or reordered by `axes`, like numpy.transpose)."""
    if axes is None:
        axes = tuple(reversed(range(x.ndim)))
    return permute_dims(x, axes)


def swapaxes(x: Tensor, a: int, b: int) -> Tensor:
    """A view with axes `a` and `b` exchanged."""
    a, b = _axes(a, x.ndim, "swapaxes")[0], _axes(b, x.ndim, "swapaxes")[0]
    axes = list(range(x.ndim))
    axes[a], axes[b] = axes[b], axes[a]
    return permute_dims(x, axes)


def expand_dims(x: Tensor, axis) -> Tensor:
    """A view with size-1 axes inserted at `axis` (an int or a tuple of positions in the
    result)."""
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    nd = x.ndim + len(axes)
    for a in axes:  # the standard raises IndexError here; numpy's AxisError is also a ValueError
        if isinstance(a, (int, np.integer)) and not -nd <= a < nd:
            raise np.exceptions.AxisError(
                f"expand_dims: axis {a} is out of bounds for the {nd}-d result (x has {x.ndim})"
            )
    norm = _axes(axes, nd, "expand_dims")
    shape, it = [], iter(x.shape)
    for i in range(nd):
        shape.append(1 if i in norm else next(it))
    return reshape(x, tuple(shape))


def squeeze(x: Tensor, axis=None) -> Tensor:
    """A view without the size-1 axes (all of them, or those in `axis`; naming an axis whose
    size is not 1 raises ValueError)."""
    if axis is None:
        axes = tuple(i for i, s in enumerate(x.shape) if s == 1)
    else:
        axes = _axes(axis, x.ndim, "squeeze")
        for a in axes:
            if x.shape[a] != 1:
                raise ValueError(
                    f"squeeze: cannot remove axis {a} of size {x.shape[a]} (shape {x.shape})"
                )
    return reshape(x, tuple(s for i, s in enumerate(x.shape) if i not in axes))


def broadcast_to(x: Tensor, shape) -> Tensor:
    """A read-only view of `x` broadcast to `shape` (stride 0 on the stretched axes);
    raises ValueError when numpy's broadcasting rules do not allow it."""
    shape = _shape_arg(shape)
    out = broadcast_shapes(x.shape, shape, op="broadcast_to")
    if out != shape:
        raise ValueError(f"broadcast_to: cannot broadcast shape {x.shape} to {shape}")
    if shape == x.shape:
        return x
    return _wrap(_expand(x._node, shape), [x])


def _slice_node(x: Tensor, spec) -> Tensor:
    """spec: per-axis (start, count, step) with step != 0, already normalised."""
    if builtins.all(st == 0 and c == s and sp == 1 for (st, c, sp), s in zip(spec, x.shape)):
        return x
    shape = tuple(c for _, c, _ in spec)
    return _wrap(gn.make("slice", x.dtype, shape, (x._node,), tuple(spec)), [x])


def flip(x: Tensor, axis=None) -> Tensor:
    """A view with the order of elements reversed along `axis` (all axes by default): a
    negative-stride slice, no copy."""
    axes = _axes(axis, x.ndim, "flip")
    spec = tuple(
        (s - 1, s, -1) if i in axes and s > 0 else (0, s, 1) for i, s in enumerate(x.shape)
    )
    return _slice_node(x, spec)


def _is_advanced(idx: tuple) -> bool:
    return builtins.any(isinstance(i, (Tensor, np.ndarray, list, bool, np.bool_)) for i in idx)


def _basic_index(x: Tensor, idx: tuple) -> tuple[tuple, tuple]:
    """(per-axis (start, count, step), result shape) of a basic index: ints, slices, None,
    one ellipsis."""
    n_ell = builtins.sum(1 for i in idx if i is Ellipsis)
    if n_ell > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    n_real = builtins.sum(1 for i in idx if i is not None and i is not Ellipsis)
    if n_real > x.ndim:
        raise IndexError(f"too many indices for tensor of shape {x.shape}: {n_real} were given")
    if n_ell:
        k = idx.index(Ellipsis)
        idx = idx[:k] + (slice(None),) * (x.ndim - n_real) + idx[k + 1 :]
    else:
        idx = idx + (slice(None),) * (x.ndim - n_real)
    spec, out_shape, axis = [], [], 0
    for i in idx:
        if i is None:
            out_shape.append(1)
            continue
        size = x.shape[axis]
        if isinstance(i, slice):
            try:
                start, stop, step = i.indices(size)
            except TypeError:
                raise IndexError(f"slice {i} must have integer (or None) bounds") from None
            count = len(range(start, stop, step))
            spec.append((start if count else 0, count, step))
            out_shape.append(count)
        else:
            try:
                j = operator.index(i)
            except TypeError:
                raise IndexError(f"unsupported index {i!r} of type {type(i).__name__}") from None
            if not -size <= j < size:
                raise IndexError(f"index {j} is out of bounds for axis {axis} with size {size}")
            spec.append((j % size, 1, 1))
        axis += 1
    return tuple(spec), tuple(out_shape)


def _host_index(idx: tuple) -> tuple:
    """An advanced index with its tensors realized to numpy arrays (an implicit sync)."""
    out = []
    for i in idx:
        if isinstance(i, Tensor):
            _note_sync("index", i)
            i = i.numpy()
        elif isinstance(i, list):
            i = np.asarray(i)
        if isinstance(i, np.ndarray) and i.dtype.kind not in "biu":
            raise IndexError(f"array indices must be integer or bool, not {i.dtype}")
        out.append(i)
    return tuple(out)


def _getitem(x: Tensor, idx) -> Tensor:
    """Basic indexing (ints, slices with steps, None, ...) is a lazy view. Integer-array and
    boolean-mask indexing (numpy's advanced indexing) realize `x` and the index at the call:
    the result's shape depends on the data (masks) or it gathers (integer arrays)."""
    if not isinstance(idx, tuple):
        idx = (idx,)
    if _is_advanced(idx):
        key = _host_index(idx)
        _note_sync("getitem", x)
        try:
            got = x.numpy()[key]
        except IndexError as e:
            raise IndexError(f"{e} (tensor of shape {x.shape})") from None
        return _from_numpy(np.array(got, copy=True, order="C"), "getitem", x._device)
    spec, out_shape = _basic_index(x, idx)
    out = _slice_node(x, spec)
    return reshape(out, out_shape)


def _axis_mask(size: int, start: int, count: int, step: int) -> np.ndarray:
    m = np.zeros(size, dtype=bool)
    m[range(start, start + count * step, step) if count else []] = True
    return m


def _setitem(x: Tensor, idx, value) -> Tensor:
    """The tensor `x` would be after ``x[idx] = value``, as a new graph node (functional):
    where(mask, value placed at idx, x). Lazy for basic indices and for a boolean mask with a
    scalar value; an integer-array index, or a mask with an array of values, realizes `x`."""
    if not isinstance(idx, tuple):
        idx = (idx,)
    if isinstance(value, Tensor):
        v = value
    else:
        v = value if type(value) is complex else _as_tensor_or_scalar(value, "setitem")
        if not isinstance(v, Tensor):  # a Python scalar (weak): x's dtype if it holds the kind
            rank = {"b": 0, "u": 1, "i": 1, "f": 2, "c": 3}
            fits = rank[np.dtype(type(v)).kind] <= rank[x.dtype.kind]
            v = full((), v, x.dtype if fits else None)
    if v.dtype != x.dtype:
        if not np.can_cast(v.dtype, x.dtype, "same_kind"):
            raise TypeError(f"setitem: cannot store {v.dtype} values into a {x.dtype} tensor")
        v = astype(v, x.dtype)
    if len(idx) == 1 and isinstance(idx[0], Tensor) and idx[0].dtype == dt.bool_:
        mask = idx[0]
        if mask.shape == x.shape and v.size == 1:
            return where(mask, reshape(v, ()), x)
    if _is_advanced(idx):
        key = _host_index(idx)
        _note_sync("setitem", x)
        a = np.array(x.numpy(), copy=True)
        try:
            a[key] = v.numpy()
        except (IndexError, ValueError) as e:
            raise type(e)(f"setitem: {e} (tensor of shape {x.shape})") from None
        return _from_numpy(a, "setitem", x._device)
    spec, region = _basic_index(x, idx)
    if builtins.any(c == 0 for _, c, _ in spec):
        return x
    try:
        vb = broadcast_to(v, region)
    except ValueError:
        raise ValueError(f"setitem: value of shape {v.shape} cannot be broadcast to the indexed "
                         f"region of shape {region}") from None  # fmt: skip
    mask = None
    for d, (start, count, step) in enumerate(spec):
        if count == x.shape[d]:
            continue  # the whole axis
        m = _axis_mask(x.shape[d], start, count, step).reshape(
            (1,) * d + (x.shape[d],) + (1,) * (x.ndim - d - 1))  # fmt: skip
        mt = tensor(m)
        mask = mt if mask is None else logical_and(mask, mt)
    if v.size == 1:
        placed = reshape(v, ())
    else:  # move the values to their positions: flip negative steps, spread steps, pad
        placed = reshape(vb, tuple(c for _, c, _ in spec))
        for d, (start, count, step) in enumerate(spec):
            if step < 0:
                placed = flip(placed, d)
                start, step = start + (count - 1) * step, -step
            if step > 1:
                w = [(0, 0)] * (placed.ndim + 1)
                w[d + 1] = (0, step - 1)
                spread = pad(expand_dims(placed, d + 1), w)
                shp = list(placed.shape)
                shp[d] = count * step
                placed = reshape(spread, tuple(shp))
                placed = _slice_node(
                    placed, tuple((0, (count - 1) * step + 1 if k == d else s, 1)
                                  for k, s in enumerate(placed.shape)))  # fmt: skip
            w = [(0, 0)] * placed.ndim
            w[d] = (start, x.shape[d] - start - placed.shape[d])
            placed = pad(placed, w)
    if mask is None:
        return broadcast_to(placed, x.shape) if placed.shape != x.shape else placed
    return where(mask, placed, x)


# ----------------------------------------------------------------------------- copies


def concat(tensors: Sequence[Tensor], axis: int | None = 0) -> Tensor:
    """Join tensors along `axis` (None: flattened first, as the Array API says)."""
    ts = [t if isinstance(t, Tensor) else tensor(t) for t in tensors]
    if not ts:
        raise ValueError("concat: need at least one tensor")
    if axis is None:
        ts, axis = [reshape(t, (-1,)) for t in ts], 0
    _check_devices("concat", ts)
    nd = ts[0].ndim
    if nd == 0:
        raise ValueError("concat: zero-dimensional tensors cannot be concatenated")
    for t in ts:
        if t.ndim != nd:
            raise ValueError(
                f"concat: all tensors must have the same number of dimensions, got shapes "
                f"{[t.shape for t in ts]}"
            )
    ax = _axes(axis, nd, "concat")[0]
    for t in ts:
        for d in range(nd):
            if d != ax and t.shape[d] != ts[0].shape[d]:
                raise ValueError(
                    f"concat: shapes {[t.shape for t in ts]} differ on axis {d}, which is not "
                    f"the concatenation axis {ax}"
                )
    out_dtype = dt.result_type(*[t.dtype for t in ts])
    shape = list(ts[0].shape)
    shape[ax] = builtins.sum(t.shape[ax] for t in ts)
    srcs = [_cast(t._node, out_dtype) for t in ts]
    return _wrap(gn.make("concat", out_dtype, tuple(shape), srcs, ax), ts)


concatenate = concat


def stack(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    """Join same-shape tensors along a new axis `axis` (numpy.stack): each gets a size-1 axis
    and the results are concatenated."""
    ts = [t if isinstance(t, Tensor) else tensor(t) for t in tensors]
    if not ts:
        raise ValueError("stack: need at least one tensor")
    for t in ts:
        if t.shape != ts[0].shape:
            raise ValueError(
                f"stack: all tensors must have the same shape, got {[t.shape for t in ts]}"
            )
    ax = _axes(axis, ts[0].ndim + 1, "stack")[0]
    return concat([expand_dims(t, ax) for t in ts], ax)


def pad(x: Tensor, pad_width, mode: str = "constant", constant_values=0) -> Tensor:
    """numpy.pad with mode='constant': `pad_width` is an int, a (before, after) pair, or one
    pair per axis; the padding is filled with `constant_values`."""
    if mode != "constant":
        raise ValueError(f"pad: only mode='constant' is supported, got {mode!r}")
    try:
        w = np.broadcast_to(np.asarray(pad_width, dtype=np.int64), (x.ndim, 2))
    except (TypeError, ValueError):
        raise ValueError(
            f"pad: pad_width {pad_width!r} must be an int, a (before, after) pair or one pair "
            f"per axis of shape {x.shape}"
        ) from None
    if (w < 0).any():
        raise ValueError(f"pad: pad widths must be non-negative, got {pad_width}")
    widths = tuple((int(a), int(b)) for a, b in w)
    if not builtins.any(a or b for a, b in widths):  # nothing to pad (also every 0-d tensor)
        return x
    shape = tuple(s + a + b for s, (a, b) in zip(x.shape, widths))
    try:  # numpy's rule: a Python int that does not fit the dtype is an OverflowError
        value = np.asarray(constant_values, dtype=x.dtype).item()
    except OverflowError as e:
        raise OverflowError(f"pad: constant_values {constant_values!r} does not fit dtype "
                            f"{x.dtype}: {e}") from None  # fmt: skip
    return _wrap(gn.make("pad", x.dtype, shape, (x._node,), (widths, value)), [x])


# ----------------------------------------------------------------------------- conv1d, fft


def conv1d(x, weight, bias=None, stride: int = 1, padding: int | str = 0, dilation: int = 1,
           groups: int = 1) -> Tensor:  # fmt: skip
    """torch.nn.functional.conv1d: x (N, C_in, L) or (C_in, L), weight (C_out, C_in/groups, K);
    `padding` an int, "valid" (0) or "same" (stride 1 only; the output keeps L, the odd
    padding element on the right, as torch)."""
    x = x if isinstance(x, Tensor) else tensor(x)
    w = weight if isinstance(weight, Tensor) else tensor(weight)
    unbatched = x.ndim == 2
    if unbatched:
        x = expand_dims(x, 0)
    if x.ndim != 3 or w.ndim != 3:
        raise ValueError(
            f"conv1d: expected x of shape (N, C_in, L) or (C_in, L) and weight (C_out, C_in/groups,"
            f" K), got {x.shape} and {w.shape}"
        )
    same = isinstance(padding, str) and padding == "same"
    if isinstance(padding, str):
        if padding not in ("same", "valid"):
            raise ValueError(f"conv1d: padding must be an int, 'same' or 'valid', got {padding!r}")
        padding = 0
    for name, v, lo in (("stride", stride, 1), ("padding", padding, 0), ("dilation", dilation, 1),
                        ("groups", groups, 1)):  # fmt: skip
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < lo:
            raise ValueError(f"conv1d: {name} must be an int >= {lo}, got {v!r}")
    n, cin, length = x.shape
    cout, cpg, k = w.shape
    pads = (int(padding), int(padding))
    if same:
        if stride != 1:
            raise ValueError("conv1d: padding='same' is not supported for strided convolutions")
        total = dilation * (k - 1)
        pads = (total // 2, total - total // 2)
    if cin % groups or cout % groups or cpg != cin // groups:
        raise ValueError(
            f"conv1d: weight {w.shape} does not match input channels {cin} with groups={groups} "
            f"(need C_in/groups = {cin // groups if cin % groups == 0 else '?'} and C_out % groups"
            f" == 0)"
        )
    lout = (length + pads[0] + pads[1] - dilation * (k - 1) - 1) // stride + 1
    if lout < 1:
        raise ValueError(
            f"conv1d: input length {length} (padding {pads}) is shorter than the dilated kernel"
            f" {dilation * (k - 1) + 1}"
        )
    out_dtype = dt.result_type(x.dtype, w.dtype)
    srcs = [_cast(x._node, out_dtype), _cast(w._node, out_dtype)]
    b = None
    if bias is not None:
        b = bias if isinstance(bias, Tensor) else tensor(bias)
        if b.shape != (cout,):
            raise ValueError(f"conv1d: bias must have shape ({cout},), got {b.shape}")
        srcs.append(_cast(b._node, out_dtype))
    impl = _conv1d_impl(out_dtype, n * lout * cout, cpg, cout, groups, stride)
    if impl is not None:
        out = impl(x, w, b, out_dtype, stride, pads, dilation, lout)
        return reshape(out, (cout, lout)) if unbatched else out
    node = gn.make("conv1d", out_dtype, (n, cout, lout), srcs,
                   (int(stride), pads, int(dilation), int(groups)))  # fmt: skip
    out = _wrap(node, [x])
    return reshape(out, (cout, lout)) if unbatched else out


def _conv1d_impl(out_dtype, size: int, cpg: int, cout: int, groups: int, stride: int):
    """The AI Core form of a conv1d, None for the AI CPU's: a depthwise convolution (C_in/groups
    = 1 = C_out/groups) is one Vector kernel (K multiply-adds, the padding in its loads); any
    other float16/float32 one (dense, grouped, strided, dilated, padded) is an implicit GEMM on the
    Cube: one matmul whose B operand, an `im2col` node of x, is built by the GM -> L1 packing
    (no im2col buffer, no padded copy: backend/host/im2col.py)."""
    if out_dtype not in (dt.float16, dt.float32) or size == 0:
        return None
    if cpg == 1 and cout == groups and groups > 1:
        return _conv1d_depthwise
    return _conv1d_cube


def _conv1d_cube(x, w, b, dtype, stride, pads, dilation, lout) -> Tensor:
    """Implicit GEMM: out[n, g] = W_g (C_out/G, C/G*K) @ B[n, g] (C/G*K, L_out) with B = im2col
    of x (element (c*K + j, l) = x[n, g*C/G + c, l*stride + j*dilation - pad_left], 0 in the
    padding): the weight's own (c, j) order, so W_g is a free reshape of w; the Cube's B packing
    reads x in place (any layout) and builds the windows and the zero padding on the way to L1.
    Bias and elementwise consumers are the matmul's epilogue, an elementwise producer of x its
    prologue."""
    n, cin, _ = x.shape
    cout, cpg, k = w.shape
    groups = cin // cpg
    shape = (n, cpg * k, lout) if groups == 1 else (n, groups, cpg * k, lout)
    cols = gn.make("im2col", dtype, shape, (_cast(x._node, dtype),),
                   (int(k), int(stride), int(dilation), int(pads[0]), int(groups)))  # fmt: skip
    wg = astype(w, dtype)
    wg = reshape(wg, (cout, cpg * k) if groups == 1 else (groups, cout // groups, cpg * k))
    out = matmul(wg, _wrap(cols, [x]))
    if groups > 1:  # (N, G, C_out/G, L_out) is (N, C_out, L_out) in memory
        out = reshape(out, (n, cout, lout))
    return out if b is None else out + reshape(astype(b, dtype), (cout, 1))


def _conv1d_depthwise(x, w, b, dtype, stride, pads, dilation, lout) -> Tensor:
    """Depthwise, stride 1: one Vector kernel (backend/npu/templates/conv1d.py) over the rows
    (n, c) of x read in place, the zero padding in the bounds of its loads; elementwise
    consumers fuse into its epilogue slot."""
    from lazymath import engine  # noqa: F401  (the driver registers the built-in kernels)
    from lazymath.graph import custom

    n, c, _ = x.shape
    k = w.shape[2]
    srcs = [astype(x, dtype)._node, astype(w, dtype)._node]
    if b is not None:
        srcs.append(astype(b, dtype)._node)
    params = (("bias", b is not None), ("dilation", int(dilation)), ("k_taps", int(k)),
              ("lout", int(lout)), ("pad", int(pads[0])), ("stride", int(stride)))  # fmt: skip
    node = gn.make("custom", dtype, (n, c, lout), tuple(srcs),
                   (custom.BUILTIN["conv1d_depthwise"], params))  # fmt: skip
    return _wrap(node, [x])


_FFT_NORMS = (None, "backward", "ortho", "forward")
_fft_dtypes: dict = {}


def _fft_out_dtype(kind: str, d: np.dtype) -> np.dtype:
    """numpy.fft's result dtype for `kind` on a `d` input (asked of numpy once per pair:
    complex64 for float16/float32/complex64, complex128 for the rest; irfft's real result
    keeps float16/float32, float64 otherwise)."""
    key = (kind, d)
    out = _fft_dtypes.get(key)
    if out is None:
        with np.errstate(all="ignore"):
            out = np.dtype(getattr(np.fft, kind)(np.zeros(2, d)).dtype)
        _fft_dtypes[key] = out
    return out


def _fft_n(kind: str, n) -> int | None:
    if n is None:
        return None
    try:
        n = operator.index(n)
    except TypeError:
        raise TypeError(f"{kind}: n must be an int or None, got {n!r}") from None
    if n < 1:
        raise ValueError(f"{kind}: invalid number of data points ({n}): n must be >= 1")
    return n


def _fft_common(kind: str, x, n, axis, norm) -> Tensor:
    x = x if isinstance(x, Tensor) else tensor(x)
    hit = dft.fast_join(_fft_memo, kind, x, n, axis, norm, _RFFT_PACKED, _FFT_TUNING.forced)
    if hit is not None:  # the same transform of the same realized input again
        return _from_last(_wrap(gn.make("complex_join", *hit[:4]), [x]), hit[4])
    if x.ndim == 0:
        raise ValueError(f"{kind}: input must have at least one dimension")
    if not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{kind}: axis must be an int, got {axis!r}")
    ax = _axes(axis, x.ndim, kind)[0]
    if norm not in _FFT_NORMS:
        raise ValueError(
            f"{kind}: norm must be None, 'backward', 'ortho' or 'forward', got {norm!r}"
        )
    n = _fft_n(kind, n)
    if kind == "rfft" and dt.is_complex(x.dtype):
        raise TypeError("rfft: input must be real (use fft for complex input)")
    size = x.shape[ax]
    out_dtype = _fft_out_dtype(kind, x.dtype)
    if kind == "irfft":
        nout = n if n is not None else 2 * (size - 1)
        length = nout
    else:
        nout = n if n is not None else size
        length = nout // 2 + 1 if kind == "rfft" else nout
    if nout < 1:
        raise ValueError(f"{kind}: invalid number of data points ({nout}) along axis {ax}")
    shape = list(x.shape)
    shape[ax] = length
    double = out_dtype in (dt.complex128, dt.float64)
    rows = math.prod(d for i, d in enumerate(x.shape) if i != ax)
    ub = x._device.spec.ub_bytes if x._device is not None else None
    impl, fs, why = _fft_plan(kind, x, double, nout, x.size == 0 or math.prod(shape) == 0, rows,
                              ub)  # fmt: skip
    if impl != "aicpu":
        return _fft_cube(kind, x, n, ax, norm, out_dtype, impl, fs, f"{impl}: {why}")
    node = gn.make("fft", out_dtype, tuple(shape), (x._node,), (kind, n, ax, norm, f"aicpu: {why}"))
    return _wrap(node, [x])


def _fft_plan(kind: str, x: Tensor, double: bool, n: int, empty: bool, rows: int, ub):
    """dft.plan's choice (the cost model), or the measured one: a record stored by an earlier
    autotuned compile (any process on this host target), or, with LAZYMATH_AUTOTUNE=1 / inside
    lm.precompile(..., autotune=True), a fresh measurement of every candidate plan (each built
    and realized on random rows of the same shape and dtype, timed; engine.tuned_choice)."""
    forced = _FFT_TUNING.get(kind, n, rows)
    if forced is not None and not (double or empty):  # a candidate being timed
        return (*forced, dft.describe(kind, *forced, n, rows, ub) + " [a candidate timed]")
    spec = x._device.spec if x._device is not None else None
    sig = (kind, double, n, empty, rows, ub, x._node.dtype, spec, settings.TARGET_CPU.get())
    hit = dft.MEMO.get(sig)  # this process's answer (no disk read per call; lm.precompile's
    if hit is not None and kind not in dft.FORCE and (hit[3] or not settings.AUTOTUNE.get()):
        return hit[:3]  # autotune=True clears it)
    from lazymath import engine

    host = engine.host_fft_rates()
    impl, fs, why = dft.plan(kind, double, n, empty, rows, ub, host)
    if double or empty or kind in dft.FORCE:
        return impl, fs, why
    impl, fs, why, measured = _fft_tuned(kind, x, n, rows, ub, spec, impl, fs, why)
    if len(dft.MEMO) > 4096:  # (a long process over many shapes)
        dft._clear()
    dft.MEMO[sig] = (impl, fs, why, measured)
    return impl, fs, why


def _fft_tuned(kind: str, x: Tensor, n: int, rows: int, ub, spec, impl, fs, why):
    """(impl, fs, why, measured): the measured plan (a stored record or a fresh measurement),
    else the model's (impl, fs, why)."""
    from lazymath import engine

    cands = dft.candidates(kind, n, ub)
    if len(cands) < 2:
        return impl, fs, why, False
    by_label = {dft.label(c): c for c in cands}
    nin = n // 2 + 1 if kind == "irfft" else n

    def run(lab: str):  # a callable realizing candidate `lab` on random rows (warm after one)
        c = by_label[lab]
        rng = np.random.default_rng(0)
        data = rng.standard_normal((rows, nin)).astype(np.float32)
        if dt.is_complex(x.dtype):
            data = (data + 1j * rng.standard_normal((rows, nin))).astype(np.complex64)
        elif x.dtype != dt.float32:
            data = data.astype(np.dtype(x.dtype.name))
        t = tensor(data)

        def once():
            with _FFT_TUNING.forcing(kind, n, rows, c):
                out = _fft_common(kind, t, n if kind == "irfft" else None, -1, None)
            out.realize()

        return once

    sig = ("fft-plan", kind, n, rows, x.dtype.name, spec.key())
    hit = engine.tuned_choice(sig, list(by_label), run)
    if hit is None:
        return impl, fs, why, False
    best, times, origin = hit
    impl, fs = by_label[best]
    return impl, fs, dft.explain_choice(kind, impl, fs, n, rows, ub, origin, times), True


class _Tuning(threading.local):
    """The plan forced while a candidate is timed: (kind, n, rows) -> (impl, fs)."""

    def __init__(self):
        self.forced: dict = {}

    def get(self, kind, n, rows):
        return self.forced.get((kind, n, rows))

    @contextlib.contextmanager
    def forcing(self, kind, n, rows, c):
        key = (kind, n, rows)
        old = self.forced.get(key)
        self.forced[key] = c
        try:
            yield
        finally:
            if old is None:
                self.forced.pop(key, None)
            else:
                self.forced[key] = old


_FFT_TUNING = _Tuning()


# FFT on the AI Core: DFT matmuls on real planes (a complex row as two float32 rows, real and
# imaginary) plus Vector twiddles; the plan and its tables are `graph.dft`'s. The constant
# tables are realized tensors cached per (table, length, direction, scale).
_fft_tables: dict = {}


def _fft_table(like: Tensor, fn, *args) -> Tensor:
    """The realized constant fn(*args) (a graph.dft table) on `like`'s device."""
    key = (fn.__name__, *args)
    hit = _fft_tables.get(key)
    if hit is None or hit._device is not like._device:
        hit = Tensor(gn.buffer_node(fn(*args)), like._device)
        _fft_tables[key] = hit
    return hit


def _to_last(x: Tensor, ax: int) -> Tensor:
    if ax == x.ndim - 1:
        return x
    return permute_dims(x, [i for i in range(x.ndim) if i != ax] + [ax])


def _from_last(x: Tensor, ax: int) -> Tensor:
    if ax == x.ndim - 1:
        return x
    perm = list(range(x.ndim - 1))
    perm.insert(ax, x.ndim - 1)
    return permute_dims(x, perm)


def _fit_axis(x: Tensor, m: int, axis: int) -> Tensor:
    """Crop or zero-pad `axis` to m (numpy.fft's `n`)."""
    axis %= x.ndim
    length = x.shape[axis]
    if m < length:
        spec = [(0, s, 1) for s in x.shape]
        spec[axis] = (0, m, 1)
        return _slice_node(x, tuple(spec))
    if m > length:
        widths = [(0, 0)] * x.ndim
        widths[axis] = (0, m - length)
        return pad(x, widths)
    return x


# input node -> {call key: the node of its transform's result before the join}; weak on the
# input, whose realized array the graph holds (not the node itself), so nothing outlives it
_fft_memo: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _KeepAlive:
    """The array interface of a float32 (..., 2) view of a complex64 array that keeps the array
    itself alive: numpy collapses a view's base to the owner of the memory, and the owner of a
    device output goes back to the memory pool when the array that leases it dies."""

    def __init__(self, arr: np.ndarray) -> None:
        iface = dict(arr.__array_interface__)
        self.__array_interface__ = dict(
            shape=arr.shape + (2,), typestr=np.dtype(np.float32).str, data=(iface["data"][0], True),
            strides=None, version=3,
        )  # fmt: skip
        self.base = arr


def _complex_rows(x: Tensor, ax: int) -> Tensor:
    """complex64 `x` as float32 (other axes..., n, 2): each value's (real, imaginary) pair, the
    transform axis `ax` next to last. The memory of a realized array or of a Cube FFT's result
    is read as it is (no copy); anything else is one AI CPU copy (complex_planes)."""
    node = x._node
    nd = x.ndim
    if node.realized is not None and node.realized.flags.c_contiguous:
        arr = node.realized
        if arr.size:  # a float32 view of the same memory, holding the complex64 array alive
            view = np.asarray(_KeepAlive(arr))
            p = Tensor(gn.buffer_node(view), x._device)
            return permute_dims(p, [i for i in range(nd) if i != ax] + [ax, nd])
    axes = list(range(nd))  # x's axis i is axis axes[i] of the join
    if node.op == "permute" and node.srcs[0].op == "complex_join":
        axes = list(node.arg)
        node = node.srcs[0]
    if node.op == "complex_join" and node.realized is None:
        # its source holds (join.shape[:-1], nfull, 2) in C order
        p = reshape(_wrap(node.srcs[0], [x]), node.shape[:-1] + (node.arg[1], 2))
        p = _fit_axis(p, node.shape[-1], -2)
        return permute_dims(p, [axes[i] for i in range(nd) if i != ax] + [axes[ax], nd])
    last = _to_last(x, ax)
    shape = last.shape + (2,)
    return _wrap(gn.make("complex_planes", dt.float32, shape, (last._node,)), [x])


def _dft_rows(p: Tensor, fs: tuple, sign: int, scale: float, real: bool, m: int) -> Tensor:
    """The DFT of each row of `p`: p is (..., n, 2) complex rows as (real, imaginary) pairs, or
    (..., n) real rows when `real`. The result holds the transforms, complex64 in C order, as
    float32 pairs: direct, the first m frequencies of each row, shape (..., 2m), the batch axes
    kept; four-step, all n, the batch axes merged. fs: the plan's factors."""
    lead = p.shape[:-1] if real else p.shape[:-2]
    n = p.shape[-1] if real else p.shape[-2]
    if len(fs) == 1:  # direct: rows (lead) x (t, plane) @ (t, plane) x (k, plane')
        mat = _fft_table(p, dft.direct_matrix, n, sign, scale, real, m)
        return matmul(p if real else reshape(p, lead + (2 * n,)), mat)
    b = math.prod(lead)
    n1 = fs[0]
    n2 = n // n1
    # step 1: the length-n1 DFTs over t1 (t = t1 n2 + t2), the input read in place as slabs
    # (t1, (t2, plane)): z [b, t2, plane, q, k1] = slab^T @ [Re F; Im F]^T when step 3 follows
    # (its rows want t2 outer), else z [b, q, k1, t2, plane] = [Re F; Im F] @ slab (the
    # recursion's rows want k1 outer): the Vector kernel reads z without a transpose
    g = _fft_table(p, dft.first_matrix, n1, sign)
    xs = reshape(p, (b, n1, n2) if real else (b, n1, 2 * n2))
    last = len(fs) == 2
    if last:
        z = matmul(permute_dims(xs, (0, 2, 1)), permute_dims(g, (1, 0)))
        z = reshape(z, (b, n2, 1, 2, n1) if real else (b, n2, 2, 2, n1))
        part = lambda plane, q: z[:, :, plane, q]  # noqa: E731  [b, t2, k1]
    else:
        z = matmul(g, xs)
        z = reshape(z, (b, 2, n1, n2, 1) if real else (b, 2, n1, n2, 2))
        part = lambda plane, q: z[:, q, :, :, plane]  # noqa: E731  [b, k1, t2]
    if real:
        yr, yi = part(0, 0), part(0, 1)
    else:  # the complex product's four real parts
        yr = part(0, 0) - part(1, 1)
        yi = part(1, 0) + part(0, 1)
    if last:
        # step 2 (Vector): the twiddles w**(k1 t2), written as the rows R [b, q, t2, k1, plane']
        # of step 3: [[Re y', Im y'], [Im y', -Re y']]
        ta = _fft_table(p, dft.twiddles, n1, n2, sign, 0)
        tb = _fft_table(p, dft.twiddles, n1, n2, sign, 1)
        yr = reshape(yr, (b, 1, n2, n1, 1))
        yi = reshape(yi, (b, 1, n2, n1, 1))
        r = reshape(yr * ta + yi * tb, (b, 2 * n2, 2 * n1))
        # step 3: [Re F, -Im F] (n2, 2 n2) @ R: [b, k2, (k1, plane')], the result in C order
        return matmul(_fft_table(p, dft.last_matrix, n2, sign, scale), r)
    # recursively: the twiddled rows (b, k1) are length-n2 transforms, (real, imaginary) pairs
    ca = _fft_table(p, dft.twiddle_pairs, n1, n2, sign, 0)
    cb = _fft_table(p, dft.twiddle_pairs, n1, n2, sign, 1)
    rows = reshape(yr, (b, n1, n2, 1)) * ca + reshape(yi, (b, n1, n2, 1)) * cb
    out = _dft_rows(reshape(rows, (b * n1, n2, 2)), fs[1:], sign, scale, False, n2)
    return permute_dims(reshape(out, (b, n1, n2, 2)), (0, 2, 1, 3))  # [b, k2, k1, plane]


def _bluestein_rows(p: Tensor, fs: tuple, sign: int, scale: float, real: bool,
                    vector: bool = False) -> Tensor:  # fmt: skip
    """Bluestein's algorithm: the length-n DFT of each row of `p` ((..., n, 2) pairs, or (..., n)
    real) as the chirp convolution X_k = c_k sum_t (x_t c_t) b_(k-t), c_t = exp(sign i pi t^2/n),
    b = conj(c), computed through transforms of the smooth length m = prod(fs) >= 2n - 1 (the
    filter's spectrum is a constant table). Result (b, n, 2) pairs, complex64 in C order."""
    lead = p.shape[:-1] if real else p.shape[:-2]
    n = p.shape[-1] if real else p.shape[-2]
    b = math.prod(lead)
    m = math.prod(fs)

    def cmul(v: Tensor, table, *args) -> Tensor:  # v (b, k, 2) pairs times a constant vector
        t0 = _fft_table(p, table, *args, 0)
        t1 = _fft_table(p, table, *args, 1)
        return _slice_last(v, 0) * t0 + _slice_last(v, 1) * t1

    if real:
        a = reshape(p, (b, n, 1)) * _fft_table(p, dft.chirp, n, sign, 1.0, 0)
    else:
        a = cmul(reshape(p, (b, n, 2)), dft.chirp, n, sign, 1.0)
    if vector:  # the Vector Stockham FFTs zero-pad to m and keep the first n themselves
        f = _stockham_rows(a, m, -1, 1.0, False, m)
        g = cmul(f, dft.bluestein_filter, n, m, sign)
        return cmul(_stockham_rows(g, m, 1, 1.0, False, n), dft.chirp, n, sign, scale)
    a = pad(a, [(0, 0), (0, m - n), (0, 0)])
    f = reshape(_dft_rows(a, fs, -1, 1.0, False, m), (b, m, 2))
    g = cmul(f, dft.bluestein_filter, n, m, sign)
    c = reshape(_dft_rows(g, fs, 1, 1.0, False, m), (b, m, 2))
    c = _slice_node(c, ((0, b, 1), (0, n, 1), (0, 2, 1)))
    return cmul(c, dft.chirp, n, sign, scale)


def _fft_window(x: Tensor, ax: int, n: int) -> tuple | None:
    """(data, window) when `x` is the pending float32 product data * window, the window a
    realized length-n vector broadcast along the transform axis (the last): the Vector
    Stockham kernel multiplies it in its load (fft(x * window) is one kernel)."""
    node = x._node
    if (node.realized is not None or node.op != "mul" or node.dtype != dt.float32
            or ax != x.ndim - 1 or x.shape[ax] != n):  # fmt: skip
        return None
    for d, w in (node.srcs, node.srcs[::-1]):
        base = w
        while base.op in ("expand", "reshape") and base.realized is None:
            base = base.srcs[0]
        ok = base.realized is not None and base.size == n and base.shape[-1] == n
        if ok and d.shape == node.shape and d.dtype == w.dtype == dt.float32:
            wt = Tensor(base, x._device)
            return _wrap(d, [x]), reshape(wt, (n,))
    return None


def _stockham_rows(p: Tensor, n: int, sign: int, scale: float, real: bool, length: int,
                   window: Tensor | None = None, shape: tuple | None = None) -> Tensor:  # fmt: skip
    """The Vector Stockham FFT (backend/npu/templates/fft.py) of each row of `p` ((..., n, 2)
    pairs, or (..., n) real): one Vector kernel; the first `length` frequencies, (b, length, 2)
    pairs, complex64 in C order."""
    from lazymath import engine  # noqa: F401  (the driver registers the built-in kernels)
    from lazymath.graph import custom

    lead = p.shape[:-1] if real else p.shape[:-2]
    b = math.prod(lead)
    m = p.shape[-1] if real else p.shape[-2]  # m < n: the kernel zero-pads the rows to n
    xs = reshape(p, (b, m) if real else (b, m, 2))
    tw = _fft_table(p, dft.stockham_tables, n, sign, 0)
    ix = _fft_table(p, dft.stockham_tables, n, sign, 1)
    params = (("length", length), ("n", n), ("real", bool(real)), ("scale", float(scale)),
              ("sign", sign)) + ((("window", True),) if window is not None else ())  # fmt: skip
    srcs = (xs._node, tw._node, ix._node) + ((window._node,) if window is not None else ())
    node = gn.make("custom", dt.float32, shape or (b, length, 2), srcs,
                   (custom.BUILTIN["fft_stockham"], params))  # fmt: skip
    return _wrap(node, [p])


def _sixstep_rows(p: Tensor, fs: tuple, sign: int, scale: float, real: bool,
                  shape: tuple | None = None) -> Tensor:  # fmt: skip
    """The six-step FFT of each row of `p` (n = n1 n2, t = t1 n2 + t2, k = k1 + n1 k2) as two
    passes of the Vector Stockham kernel reading and writing strided columns in GM (no
    transposes): pass 1, rows (b, t2): the length-n1 DFT over t1, times w_n^(t2 k1), written
    [b, t2, k1]; pass 2, rows (b, k1): the length-n2 DFT over t2, written at k1 + n1 k2.
    Result (b, n, 2) pairs, complex64 in C order."""
    from lazymath import engine  # noqa: F401  (the driver registers the built-in kernels)
    from lazymath.graph import custom

    n1, n2 = fs
    n = n1 * n2
    b = math.prod(p.shape[:-1] if real else p.shape[:-2])
    key = custom.BUILTIN["fft_stockham"]
    xs = reshape(p, (b, n) if real else (b, n, 2))

    def tables(m: int) -> tuple:
        return (_fft_table(p, dft.stockham_tables, m, sign, 0)._node,
                _fft_table(p, dft.stockham_tables, m, sign, 1)._node)  # fmt: skip

    ub = p._device.spec.ub_bytes

    def tiles(m: int, rows: int, real: bool, out: bool) -> tuple:  # columns per tile, tables
        c = dft.tile_columns(m, rows, real, out, ub)
        if c == 1:
            return 1, ()
        return c, (_fft_table(p, dft.tile_tables, c, m, real, 0)._node,
                   _fft_table(p, dft.tile_tables, c, m, real, 1)._node)  # fmt: skip

    pt = _fft_table(p, dft.sixstep_twiddles, n1, n2, sign)._node
    cols, extra = tiles(n1, n2, real, False)
    lay = (b * n2, n2, n, 1, n2, n, n1, 1, n1)
    params = (("cols", cols), ("lay", lay), ("length", n1), ("n", n1), ("real", bool(real)),
              ("scale", 1.0), ("sign", sign))  # fmt: skip
    y = gn.make("custom", dt.float32, (b * n2, n1, 2), (xs._node, *tables(n1), pt, *extra),
                (key, params))  # fmt: skip
    cols, extra = tiles(n2, n1, False, True)
    lay = (b * n1, n1, n, 1, n1, n, 1, n1, n2)
    params = (("cols", cols), ("lay", lay), ("length", n2), ("n", n2), ("real", False),
              ("scale", float(scale)), ("sign", sign))  # fmt: skip
    node = gn.make("custom", dt.float32, shape or (b, n, 2), (y, *tables(n2), *extra),
                   (key, params))  # fmt: skip
    return _wrap(node, [p])


def _fft_abs(x: Tensor) -> Tensor | None:
    """|fft(...)| as one Vector Stockham kernel that writes the magnitudes (float32), when `x`
    is the pending, uncropped result of one; None otherwise."""
    from lazymath.graph import custom

    j = x._node
    if j.realized is not None or j.arg[1] != j.shape[-1]:
        return None
    s = j.srcs[0]
    if s.op != "custom" or s.realized is not None or s.arg[0] != custom.BUILTIN.get("fft_stockham"):
        return None
    p = dict(s.arg[1])
    if p.get("lay") is not None or p.get("mode") not in (None, "rpost", "rfused"):
        return None
    # (a packed rfft's combine, separate or inside the Stockham kernel, writes the magnitudes)
    mode = {"rpost": "rpost_abs", "rfused": "rfused_abs"}.get(p.get("mode"), "abs")
    params = tuple(sorted({**p, "mode": mode}.items()))
    node = gn.make("custom", dt.float32, s.shape[:-1], s.srcs, (s.arg[0], params))
    return reshape(_wrap(node, [x]), x.shape)


_RFFT_PACKED = True  # rfft above STOCKHAM_MAX: a half-length complex FFT + one combine kernel


def _rfft_packed(p: Tensor, n: int, scale: float) -> Tensor:
    """rfft of real rows (..., n), n even: the rows read as n / 2 complex points (a free
    reshape), their complex FFT (Stockham or six-step), then one Vector kernel combining
    Z[k] and Z[n/2 - k] into the n / 2 + 1 kept frequencies. Result (b, n // 2 + 1, 2)."""
    from lazymath.graph import custom

    h = n // 2
    b = math.prod(p.shape[:-1])
    z = reshape(p, (b, h, 2))
    impl, fs = dft.vector_plan(h, p._device.spec.ub_bytes)
    if impl == "stockham" and dft.RFFT_FUSED:  # one kernel: the combine on the UB-resident Z
        from lazymath import engine  # noqa: F401  (the driver registers the built-in kernels)

        tables = (
            _fft_table(p, dft.stockham_tables, h, -1, 0),
            _fft_table(p, dft.stockham_tables, h, -1, 1),
            _fft_table(p, dft.rfft_twiddles, n),
            _fft_table(p, dft.reverse_index, h),
        )
        params = (("length", h + 1), ("mode", "rfused"), ("n", h), ("real", False),
                  ("scale", float(scale)), ("sign", -1))  # fmt: skip
        node = gn.make("custom", dt.float32, (b, h + 1, 2), (z._node, *(t._node for t in tables)),
                       (custom.BUILTIN["fft_stockham"], params))  # fmt: skip
        return _wrap(node, [p])
    if impl == "stockham":
        zf = _stockham_rows(z, h, -1, 1.0, False, h)
    else:
        zf = reshape(_sixstep_rows(z, fs, -1, 1.0, False), (b, h, 2))
    tw = _fft_table(p, dft.rfft_twiddles, n)
    ix = _fft_table(p, dft.stockham_tables, 4, -1, 1)  # unused by the kernel (its signature)
    params = (("length", h + 1), ("mode", "rpost"), ("n", n), ("real", False),
              ("scale", float(scale)), ("sign", -1))  # fmt: skip
    node = gn.make("custom", dt.float32, (b, h + 1, 2), (zf._node, tw._node, ix._node),
                   (custom.BUILTIN["fft_stockham"], params))  # fmt: skip
    return _wrap(node, [p])


def _irfft_packed(x: Tensor, nout: int, ax: int, norm, out_dtype, real: bool,
                  why: str = "") -> Tensor:  # fmt: skip
    """irfft of length nout = 2h (dft.plan "packed"): one Vector kernel (mode "ipre") forms the
    spectrum Z of z_m = x_2m + i x_2m+1 from the h + 1 frequencies, and the inverse Vector FFT
    of Z (Stockham or six-step, scaled by the norm factor) is z: (b, h, 2) float32 pairs, the
    real result (b, nout) in C order."""
    from lazymath import engine  # noqa: F401  (the driver registers the built-in kernels)
    from lazymath.graph import custom

    h = nout // 2
    m = h + 1
    if real:  # a real input is the real part; its imaginary part is zero
        rows = _fit_axis(astype(_to_last(x, ax), dt.float32), m, -1)
        lead = rows.shape[:-1]
    else:
        rows = _fit_axis(_complex_rows(x, ax), m, -2)
        lead = rows.shape[:-2]
    b = math.prod(lead)
    xs = reshape(rows, (b, m) if real else (b, m, 2))
    tw = _fft_table(x, dft.rfft_twiddles, nout)
    ix = _fft_table(x, dft.stockham_tables, 4, -1, 1)  # unused by the kernel (its signature)
    params = (("length", h), ("mode", "ipre"), ("n", nout), ("real", bool(real)),
              ("scale", 1.0), ("sign", 1))  # fmt: skip
    z = _wrap(gn.make("custom", dt.float32, (b, h, 2), (xs._node, tw._node, ix._node),
                      (custom.BUILTIN["fft_stockham"], params)), [x])  # fmt: skip
    scale = dft.norm_scale(norm, nout, True)
    impl, fs = dft.vector_plan(h, x._device.spec.ub_bytes)
    shape = lead + (nout,)  # the pairs of z are the real result in C order: no reshape node
    if impl == "stockham":
        zf = _stockham_rows(z, h, 1, scale, False, h, shape=shape)
    else:
        zf = _sixstep_rows(z, fs, 1, scale, False, shape=shape)
    if why:
        dft.note_plan(zf._node, why)
    return _from_last(astype(zf, out_dtype), ax)


def _slice_last(v: Tensor, i: int) -> Tensor:
    """v[..., i:i + 1]"""
    return _slice_node(v, tuple((0, d, 1) for d in v.shape[:-1]) + ((i, 1, 1),))


def _fft_cube(kind: str, x: Tensor, n, ax: int, norm, out_dtype, impl: str, fs: tuple,
              why: str) -> Tensor:  # fmt: skip
    """`kind` along `ax` as Cube DFT matmuls (see graph/dft.py)."""
    inverse = kind in ("ifft", "irfft")
    sign = 1 if inverse else -1
    size = x.shape[ax]
    real = not dt.is_complex(x.dtype)
    if kind == "irfft" and impl == "packed":
        return _irfft_packed(x, n if n is not None else 2 * (size - 1), ax, norm, out_dtype, real,
                             why)  # fmt: skip
    if kind == "irfft":
        nout = n if n is not None else 2 * (size - 1)
        m = nout // 2 + 1
        mat = _fft_table(x, dft.irfft_matrix, m, nout, dft.norm_scale(norm, nout, True), real)
        if real:  # a real input is the real part; its imaginary part is zero
            rows = _fit_axis(astype(_to_last(x, ax), dt.float32), m, -1)
        else:
            p = _fit_axis(_complex_rows(x, ax), m, -2)
            rows = reshape(p, p.shape[:-2] + (2 * m,))
        prod = matmul(rows, mat)
        dft.note_plan(prod._node, why)
        return _from_last(astype(prod, out_dtype), ax)
    nin = n if n is not None else size
    length = nin // 2 + 1 if kind == "rfft" else nin  # rfft: the first n // 2 + 1 frequencies
    other = tuple(d for i, d in enumerate(x.shape) if i != ax)
    win = _fft_window(x, ax, nin) if real and impl in ("stockham", "packed") else None
    ub = x._device.spec.ub_bytes
    vp = dft.vector_plan(nin, ub) if impl == "packed" else None
    one = vp is not None and vp[0] == "stockham" and (win is not None or size != nin)
    if vp is not None and (one or not _RFFT_PACKED):  # one kernel: the window, the zero pad
        impl, fs = vp
        what = "off" if not _RFFT_PACKED else "the window product or the zero pad in its load"
        why = (
            f"{impl}: {dft.describe(kind, impl, fs, nin, math.prod(other), ub)} (not packed: "
            f"{what})"
        )
    packed = impl == "packed"
    # direct, stockham and the packed rfft compute only the kept frequencies
    full = length if impl in ("direct", "stockham", "packed") else nin
    # a realized input keeps its transform graph (every node of it is interned: the same
    # structure), so a repeated call costs dictionary lookups instead of building ~30 nodes
    memo = _fft_memo.get(x._node) if x._node.realized is not None else None
    key = (kind, nin, ax, norm, fs, x._device, packed, packed and dft.RFFT_FUSED)
    out = None if memo is None else memo.get(key)
    if out is None:
        scale = dft.norm_scale(norm, nin, inverse)
        fit = builtins.min(nin, size) if impl == "stockham" else nin  # the kernel zero-pads
        win = win if impl == "stockham" else None
        if win is not None:
            rows = win[0]
        elif real:
            rows = _fit_axis(astype(_to_last(x, ax), dt.float32), fit, -1)
        else:
            rows = _fit_axis(_complex_rows(x, ax), fit, -2)
        if impl in ("bluestein", "bluestein-vector"):
            out = _bluestein_rows(rows, fs, sign, scale, real, impl == "bluestein-vector")._node
        elif packed:
            out = _rfft_packed(rows, nin, scale)._node
        elif impl == "stockham":
            wt = None if win is None else win[1]
            out = _stockham_rows(rows, nin, sign, scale, real, length, wt)._node
        elif impl == "six-step":
            out = _sixstep_rows(rows, fs, sign, scale, real)._node
        else:
            out = _dft_rows(rows, fs, sign, scale, real, full)._node
        while out.op == "reshape":  # the join reads its source in C order
            out = out.srcs[0]
        if x._node.realized is not None:
            if len(_fft_memo) > 64:
                _fft_memo.clear()
            _fft_memo.setdefault(x._node, {})[key] = out
    unit = "vector" if impl in ("stockham", "six-step", "bluestein-vector", "packed") else "cube"
    join = (out_dtype, other + (length,), (out,), (f"{unit} {why}", full), ax, dft.GEN)
    if x._node.realized is not None:
        _fft_memo.setdefault(x._node, {})[dft.fast_key(kind, x, n, ax, norm, _RFFT_PACKED)] = join
    return _from_last(_wrap(gn.make("complex_join", *join[:4]), [x]), ax)


def _fft2_common(kind: str, x, s, axes, norm) -> Tensor:
    """numpy's fft2/ifft2: the 1-D transform over each of `axes`, last axis first, with the
    lengths `s` (crop or zero-pad, like `n`)."""
    x = x if isinstance(x, Tensor) else tensor(x)
    if norm not in _FFT_NORMS:
        raise ValueError(
            f"{kind}: norm must be None, 'backward', 'ortho' or 'forward', got {norm!r}"
        )
    if axes is None:
        axes = tuple(range(-len(s), 0)) if s is not None else tuple(range(-x.ndim, 0))
    if not isinstance(axes, (tuple, list)) or not builtins.all(
        isinstance(a, (int, np.integer)) for a in axes
    ):
        raise TypeError(f"{kind}: axes must be a sequence of ints, got {axes!r}")
    if s is None:
        for a in axes:
            _axes(a, x.ndim, kind)
        s = [None] * len(axes)
    elif not isinstance(s, (tuple, list)):
        raise TypeError(f"{kind}: s must be a sequence of ints, got {s!r}")
    elif len(s) != len(axes):
        raise ValueError(f"{kind}: s {tuple(s)} and axes {tuple(axes)} differ in length")
    base = "ifft" if kind.startswith("i") else "fft"
    for n in s:
        _fft_n(kind, n)
    out = x
    for a, n in reversed(list(zip(axes, s))):
        out = _fft_common(base, out, n, a, norm)
    return out


class _FFT:
    """lm.fft: numpy.fft semantics (`n` crops or zero-pads, `norm` backward/ortho/forward;
    complex64 results for float16/float32/complex64 inputs, complex128 for the others)."""

    @staticmethod
    def fft(x, n=None, axis=-1, norm=None) -> Tensor:
        return _fft_common("fft", x, n, axis, norm)

    @staticmethod
    def ifft(x, n=None, axis=-1, norm=None) -> Tensor:
        return _fft_common("ifft", x, n, axis, norm)

    @staticmethod
    def rfft(x, n=None, axis=-1, norm=None) -> Tensor:
        return _fft_common("rfft", x, n, axis, norm)

    @staticmethod
    def irfft(x, n=None, axis=-1, norm=None) -> Tensor:
        return _fft_common("irfft", x, n, axis, norm)

    @staticmethod
    def fft2(x, s=None, axes=(-2, -1), norm=None) -> Tensor:
        return _fft2_common("fft2", x, s, axes, norm)

    @staticmethod
    def ifft2(x, s=None, axes=(-2, -1), norm=None) -> Tensor:
        return _fft2_common("ifft2", x, s, axes, norm)


fft = _FFT()


# The public names (`lazymath/__init__.py` re-exports exactly these; tests/test_namespace.py pins
# `dir(lazymath)`). A new public function goes here.
# fmt: off
__all__ = [
    # the array and its creation
    "Tensor", "tensor", "asarray", "full", "zeros", "ones", "empty", "zeros_like", "ones_like",
    "full_like", "empty_like", "arange", "linspace", "eye", "random", "broadcast_shapes",
    "from_dlpack",
    # elementwise (numpy spellings too)
    "neg", "abs", "exp", "exp2", "log", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tan", "tanh",
    "sigmoid", "relu", "sign", "floor", "ceil", "round", "logical_not", "add", "sub", "mul", "div",
    "floor_divide", "remainder", "pow", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge",
    "logical_and", "logical_or", "subtract", "multiply", "divide", "true_divide", "negative",
    "power", "equal", "not_equal", "less", "less_equal", "greater", "greater_equal", "leaky_relu",
    "isnan", "isinf", "isfinite", "signbit", "trunc", "square", "bitwise_invert", "log1p", "expm1",
    "log2", "log10", "sinh", "cosh", "asinh", "acosh", "atanh", "asin", "acos", "atan",
    "erf", "erfc",
    "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift",
    "copysign", "hypot", "logaddexp", "atan2",
    # reductions, linear algebra, shapes
    "where", "clip", "astype", "sum", "prod", "max", "min", "argmax", "argmin", "mean", "var",
    "std", "softmax", "log_softmax", "matmul", "dot", "reshape", "permute_dims", "transpose",
    "swapaxes", "expand_dims", "squeeze", "broadcast_to", "flip", "concat", "concatenate", "stack",
    "pad", "conv1d",
]  # lm.fft is array_api.fft: these transforms plus the rest of the Array API's fft extension
# fmt: on
