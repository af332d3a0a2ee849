"""int16 and uint8 run on the Vector unit (AscendC's Vector instructions take int16, and uint8
for moves, casts, compares and bitwise ops): every elementwise op of the registry, the
reductions and the casts, against numpy, on full-range values, a prime row length, a
broadcast operand and a negative-stride view, on every backend. They ran on the AI CPU before
(docs/ops.md showed "A" for a plain int16 add)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import lazymath as lm
from lazymath import support
from lazymath.graph.ops import Kind, Op

DTYPES = ["int16", "uint8"]
SKIP = {"reduce", "cast", "where"}
OPS = [str(m.value) for m in Op
       if m.kind in (Kind.ELEMENTWISE,) and str(m.value) not in SKIP
       and support._function(str(m.value)) is not None]  # fmt: skip


def _operands(dtype: str, arity: int, op: str) -> list[np.ndarray]:
    rng = np.random.default_rng(5)
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max, (3, 37), endpoint=True).astype(dtype)
    a = a[:, ::-1]  # a negative-stride view
    b = rng.integers(max(info.min, -9), 10, (37,), endpoint=True).astype(dtype)  # broadcast
    b[b == 0] = 3
    if op in ("bitwise_left_shift", "bitwise_right_shift", "pow"):
        b = (np.abs(b.astype(np.int64)) % 7).astype(dtype)
    return [a] if arity == 1 else [a, b]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("spec", ["ascend910", "ascend910b"])
def test_small_ints_are_planned_on_the_vector_unit(dtype, spec):
    x = lm.tensor(np.arange(10, dtype=dtype))
    sched = lm.schedule(lm.maximum(x + x, x), spec=spec)
    assert [k.unit for k in sched.kernels] == ["vector"]
    assert [k.unit for k in lm.schedule(lm.sum(x, axis=0), spec=spec).kernels] in (
        [["vector"]], [["aicpu"]])[dtype == "uint8"]  # numpy sums uint8 in uint64  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES)
def test_small_int_ops_match_numpy(backend, dtype, check):
    ref = {}
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        for op in OPS:
            fn = support._function(op)
            args = _operands(dtype, Op(op).arity, op)
            try:
                out = fn(*[lm.tensor(a) for a in args])
            except TypeError:  # not defined for integers (bitwise ops of floats etc.)
                continue
            ref[op] = (out, args)
        lm.realize(*[o for o, _ in ref.values()])  # one program: every op at once
        for op, (out, args) in ref.items():
            want = _numpy(op, args)
            check(out, want, rtol=2e-3 if want.dtype == np.float16 else None)
        a = _operands(dtype, 1, "abs")[0]
        for red in ("sum", "prod", "max", "min", "argmax", "argmin"):
            check(getattr(lm, red)(lm.tensor(a), axis=1), getattr(np, red)(a, axis=1))
        for dst in ("float32", "float16", "int32", "int8", "uint8", "int16", "bool"):
            check(lm.astype(lm.tensor(a), dst), a.astype(dst))


def _numpy(op: str, args: list[np.ndarray]) -> np.ndarray:
    """numpy's result for `op`: the reference executor evaluates the registry's numpy function
    with numpy's promotion rules, independently of the compiled path."""
    import os

    prev = os.environ.get("LAZYMATH_BACKEND")
    os.environ["LAZYMATH_BACKEND"] = "reference"
    try:
        return support._function(op)(*[lm.tensor(a) for a in args]).numpy()
    finally:
        os.environ["LAZYMATH_BACKEND"] = prev
