"""lazymath: lazy tensors fused into kernels for an emulated Ascend-style NPU.

Operator calls record a graph; a realize fuses it into kernels, places each on the Cube or
Vector unit, lowers it through a small NPU instruction set to native code with llvmlite and runs
it on host threads. Layers: tensor -> graph -> fusion -> backend -> runtime.
"""

from . import dtypes
from .dtypes import bool_, complex64, complex128, float16, float32, float64, int8, int32, int64
from .realize import realize
from .tensor import *  # noqa: F403
from .tensor import Tensor, fft, random

__version__ = "0.1.0"


def __getattr__(name):
    # the runtime, fusion and viz layers load on first use so `import lazymath` stays cheap
    if name in ("init_device", "current_device", "profile", "Device", "Stream", "Event"):
        from . import runtime

        return getattr(runtime, name)
    if name in ("schedule", "explain", "cache_info", "clear_cache", "precompile"):
        from . import engine

        return getattr(engine, name)
    if name in ("visualize", "report"):
        from . import viz

        return getattr(viz, name)
    raise AttributeError(f"module 'lazymath' has no attribute {name!r}")
