"""DLPack export of a bfloat16 host buffer (numpy's own exporter has no bfloat16).

`capsule(a, versioned, read_only)` builds the DLPack capsule for a C-contiguous or strided
numpy array of ml_dtypes' bfloat16 by hand: a DLManagedTensor ("dltensor", the legacy protocol)
or a DLManagedTensorVersioned ("dltensor_versioned", DLPack >= 1.0, which can say read-only)
whose data pointer is the array's own memory (zero-copy) and whose dtype is kDLBfloat (code 4),
16 bits, 1 lane, as torch and JAX read it. The array is kept alive until the consumer calls the
deleter (or, if nobody consumed the capsule, until the capsule is collected), as the standard
requires. Structure layouts follow dlpack.h (v1.0).
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

KDL_CPU = 1
KDL_BFLOAT = 4
FLAG_READ_ONLY = 1 << 0  # DLPACK_FLAG_BITMASK_READ_ONLY


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype", _DType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _ManagedVersioned(ctypes.Structure):
    _fields_ = [
        ("version", _Version),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", _DELETER),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", _Tensor),
    ]


# address of a managed struct -> what keeps its memory valid (array, struct, shape/strides)
_LIVE: dict[int, tuple] = {}
_LOCK = threading.Lock()


@_DELETER
def _delete(addr: int) -> None:
    """The consumer is done with the tensor: release the array and the structs."""
    with _LOCK:
        _LIVE.pop(addr, None)


_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
_PyCapsule_IsValid = ctypes.pythonapi.PyCapsule_IsValid
_PyCapsule_IsValid.restype = ctypes.c_int
_PyCapsule_IsValid.argtypes = (ctypes.c_void_p, ctypes.c_char_p)
_PyCapsule_GetPointer = ctypes.pythonapi.PyCapsule_GetPointer
_PyCapsule_GetPointer.restype = ctypes.c_void_p
_PyCapsule_GetPointer.argtypes = (ctypes.c_void_p, ctypes.c_char_p)
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_NAMES = {False: b"dltensor", True: b"dltensor_versioned"}


def _make_destructor(name: bytes):
    @_CAPSULE_DESTRUCTOR
    def destructor(cap: int) -> None:
        # a consumer renames the capsule ("used_dltensor"): then the deleter is its job
        if _PyCapsule_IsValid(cap, name):
            addr = _PyCapsule_GetPointer(cap, name)
            if addr:
                _delete(addr)

    return destructor


_DESTRUCTORS = {v: _make_destructor(n) for v, n in _NAMES.items()}


def capsule(a: np.ndarray, versioned: bool, read_only: bool):
    """The DLPack capsule of bfloat16 array `a` (zero-copy; see the module docstring)."""
    if a.dtype.itemsize != 2:
        raise TypeError(f"bfloat16 DLPack export needs a 2-byte dtype, got {a.dtype}")
    nd = a.ndim
    shape = (ctypes.c_int64 * max(nd, 1))(*a.shape)
    strides = (ctypes.c_int64 * max(nd, 1))(*(s // 2 for s in a.strides))
    if any(s % 2 for s in a.strides):
        raise BufferError("bfloat16 DLPack export: strides are not whole elements")
    m = _ManagedVersioned() if versioned else _Managed()
    t = m.dl_tensor
    t.data = a.ctypes.data if a.size else None
    t.device = _Device(KDL_CPU, 0)
    t.ndim = nd
    t.dtype = _DType(KDL_BFLOAT, 16, 1)
    t.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    t.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
    t.byte_offset = 0
    m.manager_ctx = None
    m.deleter = _delete
    if versioned:
        m.version = _Version(1, 0)
        m.flags = FLAG_READ_ONLY if read_only else 0
    addr = ctypes.addressof(m)
    with _LOCK:
        _LIVE[addr] = (a, m, shape, strides)
    d = _DESTRUCTORS[versioned]
    return _PyCapsule_New(addr, _NAMES[versioned], ctypes.cast(d, ctypes.c_void_p))
