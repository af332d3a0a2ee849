"""The numpy-like tensor functions, one module per family; `lazymath` re-exports `__all__`.

    base         what the families share: node helpers (expand, cast), argument checks (axes,
                 shapes), plan memos, `broadcast_shapes`, `astype`
    datatypes    the Array API's finfo, iinfo, isdtype, result_type, can_cast
    creation     tensors from data and constants: tensor, asarray, from_dlpack, full, zeros,
                 arange, linspace, eye, random; host round trips (tensor_arg, host_value,
                 from_host)
    shapes       views and joins: reshape, permute_dims, expand_dims, broadcast_to, flip,
                 concat, stack, pad
    elementwise  one binding per op record of `graph.ops` (`exp = _unary(Op.EXP)`), plus pow,
                 comparisons, where, clip; positive, logical_xor, conj, real, imag, nextafter
    reductions   sum, prod, max, min, argmax, argmin, mean, var, std, softmax, log_softmax,
                 any, all, count_nonzero
    manipulation moveaxis, matrix_transpose, unstack, broadcast_arrays, meshgrid, tril, triu,
                 roll, tile, repeat, diff, isin
    linalg       matmul, dot, conv1d, tensordot, vecdot, `lm.linalg`
    indexing     `t[idx]` and `t[idx] = v` (Tensor.__getitem__ / __setitem__), take,
                 take_along_axis, nonzero
    sets         unique_all, unique_counts, unique_inverse, unique_values
    fft          `lm.fft`: the transforms and their plans (Cube DFT, Stockham, six-step,
                 Bluestein) and the rest of the Array API's extension

Each module imports only the ones above it in this list (no import cycles). They validate their
inputs (shape, dtype, axes, device) at the call, so errors point at the user's line, record one
or a few graph nodes and return at once.
"""

import sys

from lazymath import tensor as _tensor
from lazymath.functions.base import astype, broadcast_shapes
from lazymath.functions.creation import (
    arange,
    asarray,
    empty,
    empty_like,
    eye,
    from_dlpack,
    full,
    full_like,
    linspace,
    ones,
    ones_like,
    random,
    tensor,
    zeros,
    zeros_like,
)
from lazymath.functions.elementwise import *  # noqa: F403  (exactly elementwise.__all__: one name per op record)
from lazymath.functions.elementwise import __all__ as _elementwise_all
from lazymath.functions.indexing import getitem, setitem  # noqa: F401  (Tensor.__getitem__ / __setitem__ call them)
from lazymath.functions.linalg import conv1d, dot, matmul
from lazymath.functions.reductions import (
    argmax,
    argmin,
    log_softmax,
    max,
    mean,
    min,
    prod,
    softmax,
    std,
    sum,
    var,
)
from lazymath.functions.shapes import (
    broadcast_to,
    concat,
    concatenate,
    expand_dims,
    flip,
    pad,
    permute_dims,
    reshape,
    squeeze,
    stack,
    swapaxes,
    transpose,
)

# The public names (`lazymath/__init__.py` re-exports exactly these; tests/test_namespace.py pins
# `dir(lazymath)`). A new public function goes here (an elementwise one in elementwise.__all__).
# fmt: off
__all__ = [
    # creation
    "tensor", "asarray", "full", "zeros", "ones", "empty", "zeros_like", "ones_like",
    "full_like", "empty_like", "arange", "linspace", "eye", "random", "broadcast_shapes",
    "from_dlpack",
    # elementwise (numpy spellings too)
    *_elementwise_all,
    # reductions, linear algebra, shapes
    "astype", "sum", "prod", "max", "min", "argmax", "argmin", "mean", "var",
    "std", "softmax", "log_softmax", "matmul", "dot", "reshape", "permute_dims", "transpose",
    "swapaxes", "expand_dims", "squeeze", "broadcast_to", "flip", "concat", "concatenate", "stack",
    "pad", "conv1d",
]  # the Array API's functions (any, sort, lm.linalg, lm.fft, ...): lazymath.array_api.__all__
# fmt: on

_tensor.bind_functions(sys.modules[__name__])
