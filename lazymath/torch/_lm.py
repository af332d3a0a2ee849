"""The lazymath functions the torch backend calls, as one namespace (`from . import _lm as lm`).

A subpackage may not import the package root (`import lazymath`: the root imports everything,
tests/test_import_direction.py), so this module gathers the same public names from the modules
that define them: the tensor functions, the Array API extras, realize and explain.
"""

from ..api import explain
from ..array_api import *  # noqa: F403  (the Array API extras: any, all, tril, take, ...)
from ..dtypes import bfloat16
from ..realize import realize
from ..tensor import *  # noqa: F403  (the tensor functions: add, matmul, softmax, ...)
from ..tensor import Tensor

__all__ = ["Tensor", "bfloat16", "explain", "realize"]
