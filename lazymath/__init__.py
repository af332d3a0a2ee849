"""lazymath: lazy tensors fused into kernels for an emulated Ascend-style NPU.

Operator calls record a graph; a realize fuses it into kernels, places each on the Cube or
Vector unit, lowers it through a small NPU instruction set to native code with llvmlite and runs
it on host threads. Layers: tensor -> graph -> fusion -> backend -> runtime.

The public names are `__all__` (tests/test_namespace.py pins `dir(lazymath)`); the runtime, the
compile entry points, viz and the subpackages load on first use so `import lazymath` stays cheap.
"""

from lazymath import _dccache

_dccache.install()  # dataclass methods compiled once, kept beside the bytecode (first-call time)

from lazymath import dtypes
from lazymath._version import __version__
from lazymath.array_api import *  # noqa: F403  (exactly array_api.__all__)
from lazymath.array_api import __all__ as _array_api_all
from lazymath.dtypes import (
    bool_,
    complex64,
    complex128,
    float16,
    float32,
    float64,
    int8,
    int16,
    int32,
    int64,
    uint8,
    uint16,
    uint32,
    uint64,
)
from lazymath.functions import *  # noqa: F403  (exactly functions.__all__)
from lazymath.functions import __all__ as _functions_all
from lazymath.realize import realize
from lazymath.tensor import *  # noqa: F403  (exactly tensor.__all__: Tensor)
from lazymath.tensor import __all__ as _tensor_all

# name -> the module that defines it, imported on first access
_LAZY = {
    **dict.fromkeys(("init_device", "current_device", "profile", "Device", "Stream", "Event"),
                    "runtime"),
    **dict.fromkeys(("schedule", "explain", "cache_info", "clear_cache", "precompile",
                      "show_config"), "api"),
    **dict.fromkeys(("visualize", "report"), "viz"),
    **dict.fromkeys(("kernel", "Kernel", "KernelBuilder"), "lowlevel"),
    **dict.fromkeys(("set_num_threads", "get_num_threads"), "_threads"),
    "jit": "staging",
}  # fmt: skip
# subpackages and public modules, importable as attributes (`lm.runtime.memory_stats()`)
_SUBMODULES = ("backend", "fusion", "graph", "runtime", "settings", "viz", "lowlevel", "nn")
_DTYPES = ("bool_", "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
           "uint64", "float16", "bfloat16", "float32", "float64", "complex64",
           "complex128")  # fmt: skip
bool = bool_  # the standard's name of the dtype (the builtin stays builtins.bool)
# the standard's constants
e, inf, nan, pi, newaxis = 2.718281828459045, float("inf"), float("nan"), 3.141592653589793, None
_CONSTANTS = ("e", "inf", "nan", "pi", "newaxis")

__all__ = [
    *_tensor_all,
    *_functions_all,
    *_array_api_all,
    *_DTYPES,
    *_CONSTANTS,
    "dtypes",
    "realize",
    *_LAZY,
]


from lazymath._tpctl import install as _install_threadpoolctl  # noqa: E402

_install_threadpoolctl()  # threadpool_limits(n) limits lazymath's block pool (lazymath/_tpctl.py)


def __getattr__(name):
    if name == "bfloat16":  # ml_dtypes loads on first use (lazymath.dtypes.__getattr__)
        return dtypes.bfloat16
    where = _LAZY.get(name)
    if where is not None:
        import importlib

        return getattr(importlib.import_module(f".{where}", __name__), name)
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'lazymath' has no attribute {name!r}")


def __dir__():
    return sorted([*__all__, *_SUBMODULES, "__version__"])
