"""The package namespace is the public API and nothing else: `dir(lazymath)` is pinned to an
allowlist (public functions, dtypes, subpackages), no helper module (np, math, builtins, ...)
leaks into it, and every listed name resolves."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

import lazymath as lm

TENSOR = sys.modules["lazymath.tensor"]

# Adding a public name is a deliberate change: add it here too.
# fmt: off
ALLOWLIST = {
    # arrays and creation
    "Tensor", "tensor", "asarray", "full", "zeros", "ones", "empty", "zeros_like", "ones_like",
    "full_like", "empty_like", "arange", "linspace", "eye", "random", "broadcast_shapes",
    "from_dlpack",
    # the Array API standard: version, inspection, data type functions, constants
    "__array_api_version__", "__array_namespace_info__", "finfo", "iinfo", "isdtype",
    "result_type", "can_cast", "e", "inf", "nan", "pi", "newaxis",
    "positive", "logical_xor", "conj", "real", "imag", "nextafter", "any", "all",
    "count_nonzero", "cumulative_sum", "cumulative_prod", "sort", "argsort", "searchsorted",
    "nonzero", "unique_all", "unique_counts", "unique_inverse", "unique_values", "take",
    "take_along_axis", "moveaxis", "matrix_transpose", "unstack", "broadcast_arrays", "meshgrid",
    "tril", "triu", "roll", "tile", "repeat", "diff", "isin", "tensordot", "vecdot", "linalg",
    # elementwise, with numpy's spellings
    "neg", "abs", "exp", "exp2", "log", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tan", "tanh",
    "sigmoid", "relu", "sign", "floor", "ceil", "round", "logical_not", "add", "sub", "mul", "div",
    "floor_divide", "remainder", "pow", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge",
    "logical_and", "logical_or", "subtract", "multiply", "divide", "true_divide", "negative",
    "power", "equal", "not_equal", "less", "less_equal", "greater", "greater_equal", "leaky_relu",
    "where", "clip", "astype",
    "isnan", "isinf", "isfinite", "signbit", "trunc", "square", "bitwise_invert", "log1p", "expm1",
    "log2", "log10", "sinh", "cosh", "asinh", "acosh", "atanh", "asin", "acos", "atan", "erf", "erfc",
    "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift",
    "copysign", "hypot", "logaddexp", "atan2",
    # reductions, linear algebra, shapes, signal
    "sum", "prod", "max", "min", "argmax", "argmin", "mean", "var", "std", "softmax",
    "log_softmax", "matmul", "dot", "reshape", "permute_dims", "transpose", "swapaxes",
    "expand_dims", "squeeze", "broadcast_to", "flip", "concat", "concatenate", "stack", "pad",
    "conv1d", "fft",
    # dtypes
    "dtypes", "bool_", "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
    "uint64", "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
    # running, inspecting, devices
    "realize", "schedule", "explain", "precompile", "cache_info", "clear_cache", "show_config",
    "init_device", "current_device", "Device", "Stream", "Event", "profile",
    "visualize", "report",
    # the low-level API: user kernels (lazymath/lowlevel.py)
    "kernel", "Kernel", "KernelBuilder",
    # execution threads (lazymath/_threads.py)
    "set_num_threads", "get_num_threads",
    # staged functions (lazymath/staging.py)
    "jit",
    # subpackages and public modules
    "backend", "fusion", "graph", "runtime", "settings", "viz", "lowlevel", "nn",
    "__version__",
}
# fmt: on
HELPER_MODULES = {
    "np",
    "numpy",
    "math",
    "builtins",
    "operator",
    "annotations",
    "os",
    "sys",
    "gn",
    "dt",
    "Sequence",
}  # fmt: skip


def test_dir_is_the_allowlist():
    assert set(dir(lm)) == ALLOWLIST
    assert not HELPER_MODULES & set(dir(lm))


def test_every_listed_name_resolves():
    for name in ALLOWLIST:
        assert getattr(lm, name) is not None or name == "newaxis", name
    assert lm.newaxis is None  # the standard's newaxis
    for name in ("backend", "fusion", "graph", "runtime", "settings", "viz", "lowlevel", "nn"):
        assert isinstance(getattr(lm, name), types.ModuleType), name


def test_all_matches_dir():
    subs = {"backend", "fusion", "graph", "runtime", "settings", "viz", "lowlevel", "nn"}
    assert set(lm.__all__) | subs | {"__version__"} == ALLOWLIST
    assert len(lm.__all__) == len(set(lm.__all__))


def test_tensor_all_is_explicit_and_public():
    assert isinstance(TENSOR.__all__, list)
    for name in TENSOR.__all__:
        obj = getattr(TENSOR, name)
        assert not isinstance(obj, types.ModuleType) and not name.startswith("_"), name
    assert not HELPER_MODULES & set(TENSOR.__all__)
    assert set(TENSOR.__all__) <= ALLOWLIST


def test_no_helper_leaks_in_a_fresh_interpreter():
    """What `import lazymath` actually binds (not only what dir() shows): public names, lazymath
    submodules and underscored internals, no helper modules."""
    code = (
        "import types, lazymath as lm\n"
        "for k, v in vars(lm).items():\n"
        "    if k.startswith('_'): continue\n"
        "    sub = isinstance(v, types.ModuleType) and v.__name__.startswith('lazymath.')\n"
        "    print(k, int(sub))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    bound = dict(line.split() for line in out.stdout.splitlines())
    leaks = {k for k, sub in bound.items() if k not in ALLOWLIST and sub == "0"}
    assert not leaks, f"not public, not a lazymath submodule: {sorted(leaks)}"


def test_star_import_gives_the_public_names():
    ns: dict = {}
    exec("from lazymath import *", ns)
    got = {k for k in ns if k != "__builtins__"}
    assert got == set(lm.__all__)
    assert not HELPER_MODULES & got


def test_unknown_attribute_raises():
    with pytest.raises(AttributeError, match="no attribute 'np'"):
        lm.np  # noqa: B018


def test_every_public_function_and_method_has_a_docstring():
    """`help(lm.x)` must say something: the public names and Tensor's public methods."""
    import inspect

    missing = [
        n
        for n in lm.__all__
        if callable(getattr(lm, n))
        and not inspect.isclass(getattr(lm, n))
        and not (getattr(lm, n).__doc__ or "").strip()
    ]
    missing += [
        f"Tensor.{n}"
        for n in dir(lm.Tensor)
        if not n.startswith("_")
        and callable(getattr(lm.Tensor, n))
        and not (getattr(lm.Tensor, n).__doc__ or "").strip()
    ]
    assert not missing, f"public functions without a docstring: {missing}"
