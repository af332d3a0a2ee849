"""The lazymath functions the torch backend calls, as one namespace (`from . import _lm as lm`).

A subpackage may not import the package root (`import lazymath`: the root imports everything,
tests/test_import_direction.py), so this module gathers the same public names from the modules
that define them: the tensor functions, the Array API extras, realize and explain.
"""

from lazymath.api import explain
from lazymath.array_api import *  # noqa: F403  (the Array API extras: any, all, tril, take, ...)
from lazymath.dtypes import bfloat16
from lazymath.functions import *  # noqa: F403  (the tensor functions: add, matmul, softmax, ...)
from lazymath.realize import realize
from lazymath.tensor import Tensor

__all__ = ["Tensor", "bfloat16", "explain", "realize"]
