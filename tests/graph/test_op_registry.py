"""The op registry (`lazymath.graph.ops.Op`) is the one source of the op vocabulary.

Protects: every table that names ops is derived from the records and agrees with them (fusion
rule sets, view sets, the kernel IR's scalar vocabulary, the backend's lowering tables, the
public bindings), every declared lowering names something the backend has, and a record's
numpy reference and dtype rule agree with numpy. Adding an op is one record plus its lowering:
these tests fail if any derived table misses it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import lazymath as lm
from lazymath.backend.npu import isa, kernel_ir, vmath
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
    assert ops.VIEWS == views.VIEW_OPS == {"reshape", "permute", "expand", "slice", "window"}
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
    if "dd->d" not in m.info.dtypes.ufunc.types and "d->d" not in m.info.dtypes.ufunc.types:
        x = np.arange(11) if "d->?" not in m.info.dtypes.ufunc.types else x  # bitwise: ints
    args = (x,) * m.arity
    got = m.ref(*args, 0.1) if name == "leaky_relu" else m.ref(*args)
    want = {
        "rsqrt": 1 / np.sqrt(x),
        "reciprocal": 1 / x,
        "sigmoid": 1 / (1 + np.exp(-x)),
        "relu": x,
        "leaky_relu": x,
        # numpy has no erf (the rule is exp's): the C library's, element by element
        "erf": np.array([math.erf(v) for v in x]),
        "erfc": np.array([math.erfc(v) for v in x]),
    }.get(name)
    if want is None:
        want = m.info.dtypes.ufunc(*args)
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want, rtol=1e-12)


def test_every_op_with_a_dtype_rule_has_its_binding():
    """Each record with a dtype rule has `lm.<name>` made from it (functions/elementwise.py, one line per op:
    `exp2 = _unary(Op.EXP2)`), with the record's name and a docstring naming numpy's rule."""
    for name, m in ELEMENTWISE.items():
        if m.info.dtypes is None:
            continue
        fn = getattr(lm, name, None)
        assert fn is not None, (
            f"add `{name} = _unary/_binary(Op.{m.name})` to functions/elementwise.py"
        )
        if name not in ("floor", "ceil", "round", "trunc", "pow", "leaky_relu"):  # hand-written
            assert fn.__name__ == name and f"numpy.{m.info.dtypes.ufunc.__name__}" in fn.__doc__


def test_composites_are_what_vmath_expands():
    """The registry's composite lowerings are exactly vmath's composites (exp2 included: it
    was in vmath but no op lowered to it before the registry; now `lm.exp2` does)."""
    fns = {m.lowering.fn for m in Op if isinstance(m.lowering, ops.Composite)}
    assert fns == set(vmath.COMPOSITE_OPS)
    from lazymath.backend.npu.templates import common

    assert set(common.COMPOSITE) == {m for m in Op if isinstance(m.lowering, ops.Composite)}


@pytest.fixture(params=["ascend910", "ascend910b"])
def spec(request):
    lm.init_device(0, spec=request.param)
    yield request.param
    lm.init_device(0, spec="ascend910")


def test_an_op_added_as_one_record_runs_everywhere(backend, spec, check):
    """exp2 is one record (`Op.EXP2`, lowering `Composite("exp2")`) plus its binding line: it
    fuses, lowers through vmath on floats (host libm for float64) and in a Cube epilogue (a
    Vector kernel after the Cube on the 910B, whose FixPipe has no exp2)."""
    a = np.linspace(-4, 4, 7 * 13, dtype=np.float32).reshape(7, 13)
    x = lm.tensor(a)
    (k,) = lm.schedule(lm.exp2(x) * 2 + 1).kernels
    assert k.ops == ["exp2", "mul", "add"]
    check(lm.exp2(x) * 2 + 1, np.exp2(a) * 2 + 1)
    check(lm.exp2(lm.tensor(a.astype(np.float64))), np.exp2(a.astype(np.float64)))
    check(lm.exp2(lm.tensor(a[:, :5] > 0)), np.exp2(a[:, :5] > 0))  # bool -> float16
    w = np.eye(13, dtype=np.float32)[:, :6]
    check(lm.exp2(x @ lm.tensor(w)), np.exp2(a @ w), rtol=1e-5)


def test_op_names_in_the_code_are_registry_names():
    """Op names written as strings where the code tests a node's or a scalar op's `op` (`op ==
    "exp"`, `n.op in ("sum", "prod")`, `make("reshape", ...)`) are registry names (or the
    kernel IR's leaves, or ISA instruction / integer-expression names): a typo or a removed op fails here instead
    of silently never matching. Node ops stay plain strings (fast dict keys)."""
    import ast
    import pathlib

    allowed = set(ops.OPS) | {"load", "const", "acc"}
    allowed |= {*isa.VECTOR_BINARY, *isa.VECTOR_SCALAR, *isa.VECTOR_UNARY, *isa.VECTOR_CMP}
    allowed |= set(isa.VECTOR_REDUCE) | set(isa.INT_OPS)  # (+ the scalar unit's int ops)

    def literals(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value
        elif isinstance(node, (ast.Tuple, ast.Set, ast.List)):
            for e in node.elts:
                yield from literals(e)

    def is_op(e):
        return (isinstance(e, ast.Name) and e.id in ("op", "name")) or (
            isinstance(e, ast.Attribute) and e.attr == "op"
        )

    root = pathlib.Path(lm.__file__).parent
    files = [
        *root.glob("graph/*.py"), *root.glob("fusion/*.py"), *root.glob("viz/*.py"),
        *root.glob("backend/npu/templates/*.py"), root / "backend/host/lower_cube.py", root / "backend/npu/cube_semantics.py",
        root / "backend/npu/ir_reference.py", root / "tensor.py", *root.glob("functions/*.py"),
        root / "engine.py",
    ]  # fmt: skip
    bad = []
    for f in files:
        if not f.exists():
            continue
        for n in ast.walk(ast.parse(f.read_text())):
            found = []
            if isinstance(n, ast.Compare) and is_op(n.left):
                found = [s for c in n.comparators for s in literals(c)]
            elif isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "make" and n.args:
                found = list(literals(n.args[0]))
            bad += [f"{f.relative_to(root)}:{n.lineno} {s!r}" for s in found if s not in allowed]
    assert not bad, bad
