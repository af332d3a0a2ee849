"""The Array API's set functions: `unique_all`, `unique_counts`, `unique_inverse`,
`unique_values`. Their output shapes depend on the data, so each realizes its input at the call
and runs numpy.unique on the host.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

from lazymath.functions.creation import from_host, host_value, tensor_arg
from lazymath.tensor import Tensor


def _unique(x, who: str):
    x = tensor_arg(x, who)
    a = host_value(x, who).reshape(-1)
    vals, idx, inv, counts = np.unique(a, return_index=True, return_inverse=True,
                                       return_counts=True, equal_nan=False)  # fmt: skip
    return x, vals, idx, inv, counts


# the standard's named results: tuples whose fields also read by name
UniqueAllResult = namedtuple("UniqueAllResult", "values indices inverse_indices counts")
UniqueCountsResult = namedtuple("UniqueCountsResult", "values counts")
UniqueInverseResult = namedtuple("UniqueInverseResult", "values inverse_indices")


def unique_all(x, /) -> UniqueAllResult:
    """values, first indices, inverse indices (x's shape), counts. Data-dependent: realizes x."""
    x, v, i, inv, c = _unique(x, "unique_all")
    return UniqueAllResult._make((from_host(v, x), from_host(i.astype(np.int64), x),
                            from_host(inv.reshape(x.shape).astype(np.int64), x),
                            from_host(c.astype(np.int64), x)))  # fmt: skip


def unique_counts(x, /) -> UniqueCountsResult:
    """values and counts. Data-dependent: realizes x."""
    x, v, _, _, c = _unique(x, "unique_counts")
    return UniqueCountsResult._make((from_host(v, x), from_host(c.astype(np.int64), x)))


def unique_inverse(x, /) -> UniqueInverseResult:
    """values and inverse indices (x's shape). Data-dependent: realizes x."""
    x, v, _, inv, _ = _unique(x, "unique_inverse")
    return UniqueInverseResult._make(
        (from_host(v, x), from_host(inv.reshape(x.shape).astype(np.int64), x))
    )


def unique_values(x, /) -> Tensor:
    """The distinct values, sorted. Data-dependent: realizes x."""
    x, v, *_ = _unique(x, "unique_values")
    return from_host(v, x)
