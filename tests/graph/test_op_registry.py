"""The op registry (`lazymath.graph.ops.Op`) is the one source of the op vocabulary.

Protects: every table that names ops is derived from the records and agrees with them (fusion
rule sets, view sets, the kernel IR's scalar vocabulary, the backend's lowering tables, the
public bindings), every declared lowering names something the backend has, and a record's
numpy reference and dtype rule agree with numpy. Adding an op is one record plus its lowering:
these tests fail if any derived table misses it.
"""

from __future__ import annotations

import numpy as np
import pytest

import lazymath as lm
from lazymath.backend import isa, kernel_ir, vmath
from lazymath.fusion import rules, views
from lazymath.graph import ops
from lazymath.graph.ops import ELEMENTWISE, Kind, Op


def test_members_are_their_names():
    for m in Op:
        assert m == m.name.lower() == m.info.name
        assert Op(m.value) is m and ops.OPS[m.value] is m
        assert str(m) == f"{m}" == m.value
        assert hash(m) == hash(m.value)  # a member and a node's plain-string op are one key
    assert {"exp": 1}[Op.EXP] == 1 and {Op.EXP: 1}["exp"] == 1


def test_derived_op_sets():
    assert set(ELEMENTWISE) == {m for m in Op if m.kind is Kind.ELEMENTWISE}
    assert ops.VIEWS == views.VIEW_OPS == {"reshape", "permute", "expand", "slice"}
    assert ops.REDUCE_OPS == ("sum", "prod", "max", "min", "argmax", "argmin")
    assert kernel_ir.REDUCE_OPS == ops.REDUCE_OPS
    assert ops.COMPARISONS == {"eq", "ne", "lt", "le", "gt", "ge"}
    assert ops.LOGICAL == {"logical_and", "logical_or", "logical_not"}
    assert ops.UNARY | ops.BINARY | {"where", "cast"} == set(ELEMENTWISE)
    assert rules.FIXPIPE_OPS == {"relu", "cast"}
    assert rules.EXPENSIVE_OPS == {k for k, m in ELEMENTWISE.items() if m.info.cost >= 2}
    assert {"exp", "sin", "div", "sqrt", "pow"} <= rules.EXPENSIVE_OPS
    assert not {"add", "relu", "maximum", "where"} & rules.EXPENSIVE_OPS
    for name, m in ELEMENTWISE.items():
        assert kernel_ir.SCALAR_OPS[name] == m.arity
    assert set(kernel_ir.SCALAR_OPS) == set(ELEMENTWISE) | {"load", "const", "acc"}


def test_kind_of_node_ops():
    assert ops.kind("add") == "elementwise" and type(ops.kind("add")) is str
    assert ops.kind("reshape") == "view"
    assert ops.kind("buffer") == ops.kind("const") == "leaf"
    for op in ("reduce", "matmul", "pad", "concat", "conv1d", "fft"):
        assert ops.kind(op) == op
    assert rules.AICPU_KINDS == {m.kind for m in Op if isinstance(m.lowering, ops.AiCpu)}


def test_lowerings_name_what_the_backend_has():
    for m in Op:
        low = m.lowering
        if isinstance(low, ops.Native):
            table = isa.VECTOR_UNARY if m.arity == 1 else isa.VECTOR_BINARY
            assert low.instr in table, m
        elif isinstance(low, ops.Composite):
            assert low.fn in vmath.COMPOSITE_OPS, m
            assert low.fallback is None or low.fallback in isa.VECTOR_BINARY, m
        elif isinstance(low, ops.ReduceInstr):
            assert low.instr in (*isa.VECTOR_REDUCE, "vargmax", "vargmin"), m
            assert low.combine is None or low.combine in isa.VECTOR_BINARY, m
        if m.info.inplace:
            assert m.kind is Kind.ELEMENTWISE and not isinstance(low, ops.Composite), m


@pytest.mark.parametrize("name", sorted(ops.UNARY | ops.BINARY))
def test_public_binding_and_dtype_rule(name):
    """Every unary/binary op has `lm.<name>`, and its record's rule gives numpy's dtype."""
    m = ELEMENTWISE[name]
    assert callable(getattr(lm, name))
    rule = m.info.dtypes
    for d in ("float16", "float32", "int32", "bool"):
        args = (np.dtype(d),) * m.arity
        try:
            want = rule.ufunc.resolve_dtypes((*args, None))[-1]
        except TypeError:
            continue
        ins, out = ops.ufunc_dtypes(name, args)
        assert out == want and len(ins) == m.arity


@pytest.mark.parametrize("name", sorted(k for k, m in ELEMENTWISE.items() if m.info.dtypes))
def test_reference_matches_the_ufunc(name):
    """A record's numpy reference computes what its rule's ufunc computes (up to dtype and
    rounding for the ops whose reference is not the ufunc itself)."""
    m = ELEMENTWISE[name]
    x = np.linspace(0.25, 3.0, 11)
    args = (x,) * m.arity
    got = m.ref(*args, 0.1) if name == "leaky_relu" else m.ref(*args)
    want = {
        "rsqrt": 1 / np.sqrt(x),
        "reciprocal": 1 / x,
        "sigmoid": 1 / (1 + np.exp(-x)),
        "relu": x,
        "leaky_relu": x,
    }.get(name)
    if want is None:
        want = m.info.dtypes.ufunc(*args)
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want, rtol=1e-12)
