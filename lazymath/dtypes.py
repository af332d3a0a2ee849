"""Supported dtypes and type promotion.

Promotion follows numpy 2 (NEP 50), which agrees with the Array API wherever the Array API
defines a result: tensors promote by dtype, Python scalars are "weak" and take the tensor's
kind when they can. Results are always compared against numpy, so numpy's table is the spec.
"""

from __future__ import annotations

import sys

import numpy as np

float16 = np.dtype("float16")
# bfloat16 is ml_dtypes' numpy dtype (the one JAX uses), so `np.asarray(t)` of a bfloat16 tensor
# is an ordinary numpy array and numpy's casts round like the hardware (round to nearest even,
# NaN/inf kept). numpy files it under kind "V"; `is_float` is the test to use, not `.kind`.
# It is loaded on first use (`bfloat16` below is a module attribute made by `__getattr__`):
# importing ml_dtypes' extension costs ~0.4 s, most of `import lazymath`, and no array can be
# bfloat16 before ml_dtypes registered the type, so `is_bf16` answers False until then.
_bf16: np.dtype | None = None


def _load_bf16() -> np.dtype:
    """ml_dtypes' bfloat16 dtype, importing ml_dtypes the first time (the one place that does)."""
    global _bf16
    if _bf16 is None:
        import ml_dtypes  # optional until used: ~0.4 s of import time

        _bf16 = np.dtype(ml_dtypes.bfloat16)
        globals()["bfloat16"] = _bf16  # later `dt.bfloat16` lookups skip __getattr__
    return _bf16


def __getattr__(name: str):
    if name == "bfloat16":
        return _load_bf16()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_bf16(d) -> bool:
    """Whether `d` (a dtype, or anything `np.dtype` accepts) is bfloat16, without importing
    ml_dtypes: while nothing has imported it (lazymath, JAX, the user), no bfloat16 exists."""
    if _bf16 is None:
        if "ml_dtypes" not in sys.modules:
            return False
        _load_bf16()
    return d == _bf16


float32 = np.dtype("float32")
float64 = np.dtype("float64")
int8 = np.dtype("int8")
int16 = np.dtype("int16")
int32 = np.dtype("int32")
int64 = np.dtype("int64")
uint8 = np.dtype("uint8")
uint16 = np.dtype("uint16")
uint32 = np.dtype("uint32")
uint64 = np.dtype("uint64")
bool_ = np.dtype("bool")
complex64 = np.dtype("complex64")
complex128 = np.dtype("complex128")


class DtypeSet:
    """An ordered, fixed set of dtypes that may include bfloat16 without importing ml_dtypes:
    `d in s` compares `d` with the others as a tuple does (strings and scalar types match too)
    and asks `is_bf16` for bfloat16; iterating (support tables, error messages) loads it."""

    __slots__ = ("_names", "_eager")

    def __init__(self, *names: str) -> None:
        self._names = names
        self._eager = tuple(np.dtype(n) for n in names if n != "bfloat16")

    def __contains__(self, d) -> bool:
        return d in self._eager or ("bfloat16" in self._names and is_bf16(d))

    def __iter__(self):
        return iter(tuple(_load_bf16() if n == "bfloat16" else np.dtype(n) for n in self._names))

    def __len__(self) -> int:
        return len(self._names)

    @property
    def names(self) -> tuple[str, ...]:
        """The dtypes' names in order (for messages: no ml_dtypes import)."""
        return self._names

    def __repr__(self) -> str:
        return f"DtypeSet{self._names!r}"


SUPPORTED = DtypeSet("float16", "bfloat16", "float32", "float64", "int8", "int16", "int32",
                     "int64", "uint8", "uint16", "uint32", "uint64", "bool", "complex64",
                     "complex128")  # fmt: skip
_NAMES = {d.name: d for d in SUPPORTED._eager} | {"bool_": bool_, "float": float64, "int": int64}

# The AI Core computes in these; anything else runs on the AI CPU fallback.
AICORE = DtypeSet("float16", "bfloat16", "float32", "int8", "int16", "int32", "int64", "uint8",
                  "bool")  # fmt: skip


def as_dtype(d) -> np.dtype:
    """Normalise a user-given dtype, rejecting the ones lazymath does not support."""
    if isinstance(d, str) and d in _NAMES:
        return _NAMES[d]
    if isinstance(d, str) and d == "bfloat16":  # numpy knows it once ml_dtypes registered it
        return _load_bf16()
    try:
        nd = np.dtype(d)
    except TypeError as e:
        raise TypeError(f"not a dtype: {d!r}{_suggest(d)}") from e
    if nd not in SUPPORTED:
        names = ", ".join(SUPPORTED.names)
        if not nd.isnative and nd.newbyteorder("=") in SUPPORTED:
            order = "big" if nd.byteorder == ">" else "little"
            raise TypeError(
                f"unsupported byte order: {nd.name} stored {order}-endian ({nd.str!r}); "
                f"lazymath computes in native byte order, use "
                f"{nd.newbyteorder('=').name} (arrays are converted by lm.asarray)"
            )
        raise TypeError(f"unsupported dtype {nd.name}; lazymath supports {names}")
    return nd


# spellings from other frameworks that numpy does not know, and what they mean here
_ALIASES = {"fp16": "float16", "f16": "float16", "bf16": "bfloat16", "fp32": "float32",
            "f32": "float32", "fp64": "float64", "f64": "float64", "i8": "int8", "i16": "int16",
            "i32": "int32", "i64": "int64", "u8": "uint8", "bool": "bool_", "boolean": "bool_",
            "c64": "complex64", "c128": "complex128", "long": "int64"}  # fmt: skip


def _suggest(d) -> str:
    """ "; did you mean 'float32'?" for a misspelled or foreign dtype name (else "")."""
    if not isinstance(d, str):
        return ""
    key = d.strip().lower().removeprefix("torch.").removeprefix("np.").removeprefix("numpy.")
    if key in _ALIASES:
        return f"; did you mean {_ALIASES[key]!r}?"
    import difflib

    close = difflib.get_close_matches(key, [n for n in _NAMES if n != "bool_"], n=2, cutoff=0.6)
    if close:
        return "; did you mean " + " or ".join(repr(c) for c in close) + "?"
    return ""


def is_float(d: np.dtype) -> bool:
    return d.kind == "f" or is_bf16(d)


def is_int(d: np.dtype) -> bool:
    return d.kind in "iu"


def is_complex(d: np.dtype) -> bool:
    return d.kind == "c"


def result_type(*operands) -> np.dtype:
    """numpy's result dtype for tensors (given as dtypes) and Python scalars (weak), with
    bfloat16's torch rule (`bf16_rule`)."""
    out = bf16_rule(np.result_type(*operands), operands)
    if out not in SUPPORTED:
        raise TypeError(f"operation would produce unsupported dtype {out.name}")
    return out


def bf16_rule(out: np.dtype, operands) -> np.dtype:
    """bfloat16 combined with integer or bool tensors stays bfloat16, as in torch
    (`torch.result_type(bf16, int32)`): the Array API leaves mixed kinds to the library, and
    ml_dtypes' table (bfloat16 + int32 -> float64) would turn every bf16 model's integer
    index arithmetic into float64 work for the AI CPU. Everything else is numpy's/ml_dtypes'
    table, which agrees with torch and the Array API: bf16 + f16 -> f32, bf16 + f32 -> f32,
    bf16 + Python float/int -> bf16, bf16 + complex -> complex64."""
    if out != float64:
        return out
    tensors = [np.dtype(o) for o in operands if isinstance(o, (np.dtype, type)) and
               not (isinstance(o, type) and o in (bool, int, float, complex))]  # fmt: skip
    tensors += [o.dtype for o in operands if isinstance(o, np.ndarray)]
    if any(is_bf16(d) for d in tensors) and all(is_bf16(d) or d.kind in "biu" for d in tensors):
        return _bf16
    return out


def default_float_for(d: np.dtype) -> np.dtype:
    """dtype numpy uses for float math on `d` (true division, sqrt, mean)."""
    if d.kind in "fc" or is_bf16(d):
        return d
    if d in (bool_, int8, uint8):  # numpy picks the smallest float that holds every value
        return float16
    if d in (int16, uint16):
        return float32
    return float64
