"""Numpy references for the places where the Array API standard and numpy disagree.

Tests compare lazymath with numpy; where the standard's special-case tables say otherwise (and
lazymath follows the standard), the test needs numpy's answer corrected by the table. One copy
here keeps the backend, vmath and operator tests on the same reference.
"""

from __future__ import annotations

import numpy as np


def std_floor_divide(a, b) -> np.ndarray:
    """The Array API standard's floor_divide: numpy's, but floor(a / b) where an operand is
    infinite (inf // 2 = inf and -1 // inf = -0, where numpy gives nan and -1)."""
    with np.errstate(all="ignore"):
        r = np.floor_divide(a, b)
        if np.result_type(a, b).kind != "f":
            return r
        return np.where(np.isinf(a) | np.isinf(b), np.floor(np.true_divide(a, b)), r).astype(
            r.dtype
        )
