"""The user-facing Tensor: a thin handle on a graph node, and what every tensor function needs
of it (devices, the wrap of a new node, Python scalars as runtime arguments, implicit syncs).

The numpy-like functions live in `lazymath.functions`, one module per family; Tensor's operators
and methods call them (`t + u` is `functions.add(t, u)`, `t.sum()` is `functions.sum(t)`).
Nothing is computed until a realize (`t.realize()`, `lm.realize(...)`, `t.numpy()`,
`np.asarray(t)`, `t.item()`, `t.tolist()`).
"""

from __future__ import annotations

import builtins
import math
import sys
import types
from collections.abc import Sequence

import numpy as np

from lazymath import dtypes as dt
from lazymath import settings
from lazymath._lazy import deferred
from lazymath.graph import node as gn
from lazymath.graph import reference
from lazymath.graph.ops import ufunc_dtypes
from lazymath.realize import realize as _realize
from lazymath.realize import realize_into

# Loaded on first use, not by `import lazymath`: the pictures (viz, ~90 ms with Graphviz's
# helpers), the runtime (devices, streams) and the bfloat16 DLPack capsules.
viz = deferred("lazymath.viz")
viz_render = deferred("lazymath.viz.render")
runtime = deferred("lazymath.runtime")
_dlpack = deferred("lazymath._dlpack")

# lazymath.realize the module (the package's `realize` attribute is the function): numpy()
# reads its _WATCH flag (lm.jit's trace) to skip the realize call of a computed tensor
_REALIZE_MODULE = sys.modules[_realize.__module__]

__all__ = ["Tensor"]  # the functions' names are `lazymath.functions.__all__`

# The module of the numpy-like functions that the operators and methods call: `t + u` is
# `_fn.add(t, u)`. lazymath.functions imports this module (for the class and the helpers
# below) and imports run one way (tests/test_import_direction.py), so that package hands
# itself over when it loads (`bind_functions`), before any tensor exists.
_fn = types.ModuleType("lazymath.functions (not bound yet)")


def bind_functions(module: types.ModuleType) -> None:
    """Called once by `lazymath.functions` at import: the module the operators call."""
    global _fn
    _fn = module


def __getattr__(name: str):
    """`lazymath.tensor.add` and the other functions that lived here before the split
    (issue 36) still resolve, to `lazymath.functions.add`; new code imports them from there."""
    if name in getattr(_fn, "__all__", ()):
        return getattr(_fn, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ----------------------------------------------------------------------------- Tensor


class Tensor:
    """A lazy n-dimensional array on the emulated NPU."""

    __slots__ = ("_node", "_device", "__weakref__")
    __array_priority__ = 100  # numpy defers to our reflected operators

    def __init__(self, node: gn.Node, device=None):
        self._node = node
        self._device = device if device is not None else default_device()
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
        if viz.dot_binary() is None:
            return None
        return viz_render.svg_inline(viz_render.render(viz.visualize(self), "svg"))

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
        note_sync(what, self)
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
            realize_into(self, out)
            return self
        _realize(self)
        return self

    def numpy(self) -> np.ndarray:
        """The realized value, without a copy. It is read-only: the tensor is immutable and
        other graphs may read the same buffer."""
        r = self._node.realized  # (a donated tensor's dead node raises here)
        if r is not None and _REALIZE_MODULE._WATCH is None:
            return r  # already computed, no lm.jit trace watching: no realize call (~0.2 us)
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
        d = device_arg(device, "to_device")
        return self if d is self._device else Tensor(self._node, d)

    # -- operators --
    def __add__(self, o):
        if type(o) in PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = scalar_arg(self, o, "add", False, sys._getframe(1).f_code)
        return _fn.add(self, o)

    def __radd__(self, o):
        if type(o) in PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = scalar_arg(self, o, "add", True, sys._getframe(1).f_code)
        return _fn.add(o, self)

    def __sub__(self, o):
        if type(o) in PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = scalar_arg(self, o, "sub", False, sys._getframe(1).f_code)
        return _fn.sub(self, o)

    def __rsub__(self, o):
        if type(o) in PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = scalar_arg(self, o, "sub", True, sys._getframe(1).f_code)
        return _fn.sub(o, self)

    def __mul__(self, o):
        if type(o) in PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = scalar_arg(self, o, "mul", False, sys._getframe(1).f_code)
        return _fn.mul(self, o)

    def __rmul__(self, o):
        if type(o) in PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = scalar_arg(self, o, "mul", True, sys._getframe(1).f_code)
        return _fn.mul(o, self)

    def __truediv__(self, o):
        if type(o) in PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = scalar_arg(self, o, "div", False, sys._getframe(1).f_code)
        return _fn.div(self, o)

    def __rtruediv__(self, o):
        if type(o) in PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = scalar_arg(self, o, "div", True, sys._getframe(1).f_code)
        return _fn.div(o, self)

    def __floordiv__(self, o):
        if type(o) in PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = scalar_arg(self, o, "floor_divide", False, sys._getframe(1).f_code)
        return _fn.floor_divide(self, o)

    def __rfloordiv__(self, o):
        if type(o) in PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = scalar_arg(self, o, "floor_divide", True, sys._getframe(1).f_code)
        return _fn.floor_divide(o, self)

    def __mod__(self, o):
        if type(o) in PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = scalar_arg(self, o, "remainder", False, sys._getframe(1).f_code)
        return _fn.remainder(self, o)

    def __rmod__(self, o):
        if type(o) in PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = scalar_arg(self, o, "remainder", True, sys._getframe(1).f_code)
        return _fn.remainder(o, self)

    def __pow__(self, o):
        return _fn.pow(self, o)

    def __rpow__(self, o):
        return _fn.pow(o, self)

    def __matmul__(self, o):
        return _fn.matmul(self, o)

    def __rmatmul__(self, o):
        return _fn.matmul(o, self)

    def __neg__(self):
        return _fn.neg(self)

    def __pos__(self):
        return self

    def __abs__(self):
        return _fn.abs(self)

    def __invert__(self):
        return _fn.bitwise_invert(self)

    def __and__(self, o):
        if type(o) in PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = scalar_arg(self, o, "bitwise_and", False, sys._getframe(1).f_code)
        return _fn.bitwise_and(self, o)

    def __rand__(self, o):
        if type(o) in PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = scalar_arg(self, o, "bitwise_and", True, sys._getframe(1).f_code)
        return _fn.bitwise_and(o, self)

    def __or__(self, o):
        if type(o) in PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = scalar_arg(self, o, "bitwise_or", False, sys._getframe(1).f_code)
        return _fn.bitwise_or(self, o)

    def __ror__(self, o):
        if type(o) in PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = scalar_arg(self, o, "bitwise_or", True, sys._getframe(1).f_code)
        return _fn.bitwise_or(o, self)

    def __xor__(self, o):
        if type(o) in PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = scalar_arg(self, o, "bitwise_xor", False, sys._getframe(1).f_code)
        return _fn.bitwise_xor(self, o)

    def __rxor__(self, o):
        if type(o) in PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = scalar_arg(self, o, "bitwise_xor", True, sys._getframe(1).f_code)
        return _fn.bitwise_xor(o, self)

    def __lshift__(self, o):
        if type(o) in PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = scalar_arg(self, o, "bitwise_left_shift", False, sys._getframe(1).f_code)
        return _fn.bitwise_left_shift(self, o)

    def __rlshift__(self, o):
        if type(o) in PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = scalar_arg(self, o, "bitwise_left_shift", True, sys._getframe(1).f_code)
        return _fn.bitwise_left_shift(o, self)

    def __rshift__(self, o):
        if type(o) in PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = scalar_arg(self, o, "bitwise_right_shift", False, sys._getframe(1).f_code)
        return _fn.bitwise_right_shift(self, o)

    def __rrshift__(self, o):
        if type(o) in PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = scalar_arg(self, o, "bitwise_right_shift", True, sys._getframe(1).f_code)
        return _fn.bitwise_right_shift(o, self)

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
        if type(o) in PY_SCALAR_TYPES and _SCALAR_ARGS.get() and fn is not _fn.pow:
            o = scalar_arg(self, o, fn.__name__, False, sys._getframe(2).f_code)
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
            out = _fn.astype(out, self.dtype)
        return self._rebind(out)

    def __iadd__(self, o):
        return self._inplace(_fn.add, o)

    def __isub__(self, o):
        return self._inplace(_fn.sub, o)

    def __imul__(self, o):
        return self._inplace(_fn.mul, o)

    def __itruediv__(self, o):
        return self._inplace(_fn.div, o)

    def __ifloordiv__(self, o):
        return self._inplace(_fn.floor_divide, o)

    def __imod__(self, o):
        return self._inplace(_fn.remainder, o)

    def __ipow__(self, o):
        return self._inplace(_fn.pow, o)

    def __imatmul__(self, o):
        return self._inplace(_fn.matmul, o)

    def __iand__(self, o):
        return self._inplace(_fn.bitwise_and, o)

    def __ior__(self, o):
        return self._inplace(_fn.bitwise_or, o)

    def __ixor__(self, o):
        return self._inplace(_fn.bitwise_xor, o)

    def __ilshift__(self, o):
        return self._inplace(_fn.bitwise_left_shift, o)

    def __irshift__(self, o):
        return self._inplace(_fn.bitwise_right_shift, o)

    def __setitem__(self, idx, value) -> None:
        """``x[idx] = value`` rebinds x to where(mask, value, x) (see `setitem`)."""
        self._rebind(_fn.setitem(self, idx, value))

    def __eq__(self, o):  # type: ignore[override]
        if type(o) in PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = scalar_arg(self, o, "eq", False, sys._getframe(1).f_code)
        return _fn.eq(self, o)

    def __ne__(self, o):  # type: ignore[override]
        if type(o) in PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = scalar_arg(self, o, "ne", False, sys._getframe(1).f_code)
        return _fn.ne(self, o)

    def __lt__(self, o):
        if type(o) in PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = scalar_arg(self, o, "lt", False, sys._getframe(1).f_code)
        return _fn.lt(self, o)

    def __le__(self, o):
        if type(o) in PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = scalar_arg(self, o, "le", False, sys._getframe(1).f_code)
        return _fn.le(self, o)

    def __gt__(self, o):
        if type(o) in PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = scalar_arg(self, o, "gt", False, sys._getframe(1).f_code)
        return _fn.gt(self, o)

    def __ge__(self, o):
        if type(o) in PY_SCALAR_TYPES and _SCALAR_ARGS.get():  # LAZYMATH_SCALAR_ARGS
            o = scalar_arg(self, o, "ge", False, sys._getframe(1).f_code)
        return _fn.ge(self, o)

    def __getitem__(self, idx):
        return _fn.getitem(self, idx)

    # -- methods mirroring numpy --
    def astype(self, dtype) -> Tensor:
        """A copy cast to `dtype` (numpy's casting: floats to ints truncate toward zero)."""
        return _fn.astype(self, dtype)

    def reshape(self, *shape) -> Tensor:
        """`lm.reshape(self, shape)`; the shape may be given as separate arguments, one -1 is
        inferred."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return _fn.reshape(self, shape)

    def transpose(self, *axes) -> Tensor:
        """`lm.transpose(self, axes)`; the axes may be given as separate arguments."""
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        return _fn.transpose(self, axes or None)

    def permute(self, *axes) -> Tensor:
        """`lm.permute_dims(self, axes)`; the axes may be given as separate arguments."""
        return self.transpose(*axes)

    def swapaxes(self, a: int, b: int) -> Tensor:
        """`lm.swapaxes(self, a, b)`: a view."""
        return _fn.swapaxes(self, a, b)

    def flip(self, axis=None) -> Tensor:
        """`lm.flip(self, axis)`: a view."""
        return _fn.flip(self, axis)

    def squeeze(self, axis=None) -> Tensor:
        """`lm.squeeze(self, axis)`: a view."""
        return _fn.squeeze(self, axis)

    def expand_dims(self, axis) -> Tensor:
        """`lm.expand_dims(self, axis)`: a view."""
        return _fn.expand_dims(self, axis)

    def broadcast_to(self, shape) -> Tensor:
        """`lm.broadcast_to(self, shape)`: a view."""
        return _fn.broadcast_to(self, shape)

    def flatten(self) -> Tensor:
        """A 1-D view of all elements in C order (a reshape; copies only if the layout needs it)."""
        return _fn.reshape(self, (-1,))

    @property
    def T(self) -> Tensor:
        return _fn.transpose(self, None)

    @property
    def mT(self) -> Tensor:
        if self.ndim < 2:
            raise ValueError(f"mT needs at least 2 dimensions, got shape {self.shape}")
        return _fn.swapaxes(self, -1, -2)

    def sum(self, axis=None, keepdims=False) -> Tensor:
        """`lm.sum(self, axis, keepdims)`."""
        return _fn.sum(self, axis, keepdims)

    def mean(self, axis=None, keepdims=False) -> Tensor:
        """`lm.mean(self, axis, keepdims)`."""
        return _fn.mean(self, axis, keepdims)

    def max(self, axis=None, keepdims=False) -> Tensor:
        """`lm.max(self, axis, keepdims)`."""
        return _fn.max(self, axis, keepdims)

    def min(self, axis=None, keepdims=False) -> Tensor:
        """`lm.min(self, axis, keepdims)`."""
        return _fn.min(self, axis, keepdims)

    def prod(self, axis=None, keepdims=False) -> Tensor:
        """`lm.prod(self, axis, keepdims)`."""
        return _fn.prod(self, axis, keepdims)

    def argmax(self, axis=None, keepdims=False) -> Tensor:
        """`lm.argmax(self, axis, keepdims)`."""
        return _fn.argmax(self, axis, keepdims)

    def argmin(self, axis=None, keepdims=False) -> Tensor:
        """`lm.argmin(self, axis, keepdims)`."""
        return _fn.argmin(self, axis, keepdims)

    def var(self, axis=None, keepdims=False, ddof=0) -> Tensor:
        """`lm.var(self, axis, keepdims, ddof)`."""
        return _fn.var(self, axis, keepdims, ddof)

    def std(self, axis=None, keepdims=False, ddof=0) -> Tensor:
        """`lm.std(self, axis, keepdims, ddof)`."""
        return _fn.std(self, axis, keepdims, ddof)

    def clip(self, lo=None, hi=None) -> Tensor:
        """`lm.clip(self, lo, hi)`: values limited to [lo, hi] (either may be None)."""
        return _fn.clip(self, lo, hi)

    def visualize(self, filename=None, stage: str = "kernels"):
        """`lm.visualize(self, ...)`: this tensor's graph (`stage="graph"`) or its fused
        kernels (`"kernels"`); writes `filename` (.dot, .svg/.png/.pdf via Graphviz, .html for
        the report) and returns its path, or returns the DOT source when `filename` is None."""
        return viz.visualize(self, filename=filename, stage=stage)


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
    a = node.realized
    for v in reversed(chain):
        a = reference.fold(v, [a])  # the reference executor's view rules (not counted as work)
    return a


SYNCS: dict[str, int] = {}  # implicit syncs (bool(t), int(t), ...) by kind, this process


def note_sync(what: str, t: Tensor) -> None:
    SYNCS[what] = SYNCS.get(what, 0) + 1
    if not t.is_realized and settings.DEBUG.get():
        import sys

        print(f"lazymath: implicit sync {what}() realizes a {t.shape} {t.dtype.name} tensor "
              f"(#{SYNCS[what]} {what}() this process)", file=sys.stderr)  # fmt: skip


def default_device():
    return runtime.current_device()


def check_devices(op: str, tensors: Sequence[Tensor]) -> None:
    d0 = tensors[0]._device
    if builtins.all(t._device is d0 for t in tensors):
        return
    devs = {id(t._device): t._device for t in tensors}
    if len(devs) > 1:
        names = ", ".join(str(d) for d in devs.values())
        raise ValueError(f"{op}: operands live on different devices ({names}); move them first")


# ----------------------------------------------------------------------------- new tensors


def wrap(node: gn.Node, like: Sequence[Tensor] = ()) -> Tensor:
    """A tensor on `node`, on the device of the first of `like` (the current one without)."""
    return Tensor(node, like[0]._device if like else None)


_SCALAR_ARGS = settings.SCALAR_ARGS


PY_SCALAR_TYPES = frozenset((bool, int, float, complex))  # exact types: not np.generic


def scalar_arg(t: Tensor, value, op: str, reflected: bool, caller):
    """LAZYMATH_SCALAR_ARGS (on by default): the Python scalar operand (bool, int, float,
    complex) of `t op value` or `lm.op(t, value)` written in user code, as a realized 0-d
    tensor of the dtype NEP 50's weak-scalar rule gives it (a float with a float32 tensor
    stays float32, with float64 float64; a complex with a real float tensor is complex of its
    precision), so the kernel reads it at run time: the program and its kernels are the same
    for every value (the program cache key holds the leaf's dtype, not its value) and nothing
    recompiles when the value changes. lazymath's own composites keep their constants folded
    into the kernel, and an integer that does not fit the tensor's dtype takes the static
    path (which reports numpy's OverflowError or folds a comparison)."""
    if gn.is_lazymath_code(caller) or peel_const(t._node) is not None:
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


def scalar_args_of(op: str, a, b, caller):
    """(a, b) with a Python scalar beside a tensor made a runtime argument (see `scalar_arg`)
    when the call comes from user code and LAZYMATH_SCALAR_ARGS is on."""
    ta, tb = type(a), type(b)
    if ta is Tensor and tb in PY_SCALAR_TYPES:
        if _SCALAR_ARGS.get():
            b = scalar_arg(a, b, op, False, caller)
    elif tb is Tensor and ta in PY_SCALAR_TYPES:
        if _SCALAR_ARGS.get():
            a = scalar_arg(b, a, op, True, caller)
    return a, b


def device_arg(device, who: str):
    """A device keyword: a lazymath Device (or its name, e.g. "npu:0"); validated at the call."""
    cur = default_device()
    if device is None or device is cur:
        return cur
    if isinstance(device, str):
        if device == str(cur):
            return cur
        raise ValueError(f"{who}: unknown device {device!r}; the current device is {cur}")
    if type(device).__name__ == "Device" or device == cur:
        return device
    raise ValueError(f"{who}: {device!r} is not a lazymath device")


def peel_const(node: gn.Node):
    """The const behind `node` if it is a (broadcast) constant, else None."""
    while node.op == "expand" and node.srcs:  # a realized expand has no srcs: it is a buffer
        node = node.srcs[0]
    return node if node.op == "const" else None
