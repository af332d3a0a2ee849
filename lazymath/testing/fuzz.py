"""A random-graph fuzzer: compiled backends against the numpy reference backend.

    python -m lazymath.testing.fuzz --graphs 1000 [--seed 0] [--backends llvm,interp]

Each case is a small program (a list of `Step`s) over random leaf arrays: every op family
(unary and binary elementwise with broadcasting and Python scalars, comparisons and logic,
where, casts, reductions and arg-reductions, softmax/log_softmax, var/std, views -- transpose,
strided and reversed slices, flip, reshape, broadcast, expand_dims -- concat, pad, matmul, clip)
over every dtype and awkward shapes (0, 1, primes). Its outputs (several, in a random subset)
are realized on the backend under test in a random order -- all together, one by one in every
order for small sets, an intermediate first -- and compared with the reference backend run on
the same program. A mismatch or an exception is shrunk (steps removed, one at a time, while the
failure stays) and printed as a minimal Python repro.

Tolerances are per dtype (float16 1e-2, float32 1e-4, float64 1e-9 relative, with an absolute
floor scaled by the magnitude of the result); integers and bools compare exactly; NaN == NaN.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field

import numpy as np

from lazymath import settings
from lazymath.api import schedule
from lazymath.realize import realize
from lazymath.runtime.api import init_device

DTYPES = ("float32", "float64", "float16", "int32", "int64", "int8", "bool", "complex64")
FLOATS = ("float32", "float64", "float16")
UNARY_FLOAT = ("exp", "log", "sqrt", "sin", "cos", "tanh", "sigmoid", "relu", "abs", "neg",
               "floor", "ceil", "round", "reciprocal", "rsqrt", "sign", "tan")  # fmt: skip
UNARY_INT = ("abs", "neg", "sign", "relu")
BINARY = ("add", "sub", "mul", "div", "maximum", "minimum", "pow", "floor_divide", "remainder")
COMPARE = ("eq", "ne", "lt", "le", "gt", "ge")
LOGICAL = ("logical_and", "logical_or")
REDUCE = ("sum", "max", "min", "prod", "mean", "argmax", "argmin", "var", "std")
SIZES = (0, 1, 1, 2, 3, 4, 5, 7, 8, 13, 16, 31, 33)


@dataclass
class Step:
    """out = op(values[srcs], **params). `op` names a function of `_OPS`."""

    op: str
    srcs: tuple
    params: dict = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"Step({self.op!r}, {self.srcs!r}, {self.params!r})"


@dataclass
class Case:
    seed: int
    leaves: list  # numpy arrays
    steps: list  # Step
    outputs: list  # value indices to realize
    order: str  # "together" | "each" | "intermediate"
    perm: tuple = ()

    def repro(self, backend: str = "llvm") -> str:
        """Python source that rebuilds this case and prints the comparison's verdict."""
        leaves = ",\n    ".join(_lit(a) for a in self.leaves)
        steps = ",\n    ".join(repr(st) for st in self.steps)
        return (f"import numpy as np\nfrom lazymath.testing.fuzz import Case, Step, check\n"
                f"leaves = [\n    {leaves},\n]\nsteps = [\n    {steps},\n]\n"
                f"case = Case({self.seed}, leaves, steps, {self.outputs!r}, {self.order!r}, "
                f"{self.perm!r})\nprint(check(case, {backend!r}))")  # fmt: skip


def _lit(a: np.ndarray) -> str:
    return f"np.array({a.tolist()!r}, dtype={a.dtype.name!r}).reshape({a.shape!r})"


# ----------------------------------------------------------------------------- generation


def _shape(rng, ndim=None) -> tuple:
    nd = int(rng.integers(0, 4)) if ndim is None else ndim
    return tuple(int(rng.choice(SIZES)) for _ in range(nd))


def _array(rng, shape, dtype: str) -> np.ndarray:
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype.startswith("int"):
        hi = 5 if dtype == "int8" else 50
        return rng.integers(-hi, hi, shape).astype(dtype)
    if dtype.startswith("complex"):
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    a = rng.standard_normal(shape) * rng.choice([0.5, 2.0, 10.0])
    return a.astype(dtype)


def _kind(dtype: str) -> str:
    return np.dtype(dtype).kind


def generate(seed: int) -> Case:
    rng = np.random.default_rng(seed)
    leaves = []
    for _ in range(int(rng.integers(1, 4))):
        dtype = str(rng.choice(DTYPES, p=[0.3, 0.12, 0.08, 0.12, 0.08, 0.08, 0.12, 0.1]))
        leaves.append(_array(rng, _shape(rng), dtype))
    # meta: (shape, dtype) of every value so far (leaves first)
    meta = [(a.shape, a.dtype.name) for a in leaves]
    steps: list[Step] = []
    for _ in range(int(rng.integers(1, 9))):
        step = _random_step(rng, meta)
        if step is None:
            continue
        try:
            shape, dtype = _infer(step, meta, leaves)
        except Exception:  # the reference rejects it (bad broadcast, dtype): not a test
            continue
        steps.append(step)
        meta.append((shape, dtype))
    n = len(meta)
    k = len(leaves)
    cand = list(range(k, n)) or list(range(n))
    m = int(rng.integers(1, min(4, len(cand)) + 1))
    outputs = sorted(rng.choice(cand, m, replace=False).tolist())
    order = str(rng.choice(["together", "each", "intermediate"]))
    perm = tuple(rng.permutation(len(outputs)).tolist())
    return Case(seed, leaves, steps, outputs, order, perm)


def _pick(rng, meta, kinds=None, ndim_min=0):
    idx = [i for i, (s, d) in enumerate(meta) if (kinds is None or _kind(d) in kinds)
           and len(s) >= ndim_min]  # fmt: skip
    return int(rng.choice(idx)) if idx else None


def _random_step(rng, meta) -> Step | None:
    fam = str(rng.choice(["unary", "binary", "scalar", "compare", "logical", "where", "cast",
                          "reduce", "softmax", "view", "view", "concat", "pad", "matmul",
                          "clip"]))  # fmt: skip
    if fam == "unary":
        i = _pick(rng, meta, "fiub")
        if i is None:
            return None
        ops = UNARY_FLOAT if _kind(meta[i][1]) == "f" else UNARY_INT
        return Step(str(rng.choice(ops)), (i,))
    if fam in ("binary", "compare"):
        i = _pick(rng, meta, "fiub")
        j = _pick(rng, meta, "fiub")
        if i is None:
            return None
        ops = BINARY if fam == "binary" else COMPARE
        return Step(str(rng.choice(ops)), (i, j))
    if fam == "scalar":
        i = _pick(rng, meta, "fiu")
        if i is None:
            return None
        v = float(rng.choice([0.5, 2.0, -1.5, 3.0])) if rng.random() < 0.5 else int(
            rng.choice([1, 2, 3, -2]))  # fmt: skip
        op = str(rng.choice(["add", "sub", "mul", "maximum", "minimum", "div"]))
        return Step(op, (i,), {"scalar": v, "right": bool(rng.random() < 0.5)})
    if fam == "logical":
        return Step(str(rng.choice(LOGICAL)), (_pick(rng, meta), _pick(rng, meta)))
    if fam == "where":
        c = _pick(rng, meta, "b")
        if c is None:
            return None
        return Step("where", (c, _pick(rng, meta, "fiub"), _pick(rng, meta, "fiub")))
    if fam == "cast":
        i = _pick(rng, meta, "fiub")
        if i is None:
            return None
        return Step("astype", (i,), {"dtype": str(rng.choice(DTYPES[:7]))})
    if fam == "reduce":
        i = _pick(rng, meta, "fiubc")
        if i is None:
            return None
        op = str(rng.choice(REDUCE))
        nd = len(meta[i][0])
        if _kind(meta[i][1]) == "c" and op not in ("sum", "mean", "var", "std", "prod"):
            op = "sum"
        axis = None if nd == 0 or rng.random() < 0.3 else int(rng.integers(-nd, nd))
        if op in ("argmax", "argmin", "max", "min") and 0 in meta[i][0]:
            return None  # numpy raises on empty max/arg-reductions
        p = {"axis": axis}
        if op not in ("argmax", "argmin"):
            p["keepdims"] = bool(rng.random() < 0.3)
        return Step(op, (i,), p)
    if fam == "softmax":
        i = _pick(rng, meta, "f", ndim_min=1)
        if i is None:
            return None
        nd = len(meta[i][0])
        return Step(str(rng.choice(["softmax", "log_softmax"])), (i,),
                    {"axis": int(rng.integers(-nd, nd))})  # fmt: skip
    if fam == "view":
        i = _pick(rng, meta)
        shape = meta[i][0]
        nd = len(shape)
        v = str(rng.choice(["transpose", "slice", "flip", "reshape", "broadcast", "expand_dims"]))
        if v == "transpose" and nd >= 2:
            return Step("permute", (i,), {"axes": tuple(rng.permutation(nd).tolist())})
        if v == "slice" and nd >= 1:
            sl = []
            for s in shape:
                step = int(rng.choice([1, 1, 2, -1, -2, 3]))
                a = int(rng.integers(0, s + 1)) if s else 0
                b = int(rng.integers(0, s + 1)) if s else 0
                if step < 0:
                    a, b = max(a, b), min(a, b) - 1
                    b = None if b < 0 else b
                else:
                    a, b = min(a, b), max(a, b)
                sl.append((a, b, step))
            return Step("slice", (i,), {"slices": tuple(sl)})
        if v == "flip" and nd >= 1:
            return Step("flip", (i,), {"axis": int(rng.integers(0, nd))})
        if v == "reshape":
            n = int(np.prod(shape))
            return Step("reshape", (i,), {"shape": (n,) if rng.random() < 0.5 or n == 0 else
                                          (1, n, 1)})  # fmt: skip
        if v == "broadcast":
            return Step("broadcast_to", (i,), {"shape": (int(rng.choice([1, 3, 5])), *shape)})
        return Step("expand_dims", (i,), {"axis": int(rng.integers(0, nd + 1))})
    if fam == "concat":
        i = _pick(rng, meta, ndim_min=1)
        if i is None:
            return None
        same = [j for j, (s, _d) in enumerate(meta) if len(s) == len(meta[i][0])
                and s[1:] == meta[i][0][1:]]  # fmt: skip
        return Step("concatenate", (i, int(rng.choice(same))), {"axis": 0})
    if fam == "pad":
        i = _pick(rng, meta, "fiu", ndim_min=1)
        if i is None:
            return None
        return Step("pad", (i,), {"width": int(rng.integers(0, 3)), "value": 1})
    if fam == "matmul":
        i = _pick(rng, meta, "f", ndim_min=2)
        if i is None:
            return None
        k = meta[i][0][-1]
        cands = [j for j, (s, d) in enumerate(meta) if len(s) == 2 and s[0] == k
                 and _kind(d) == "f"]  # fmt: skip
        if not cands:
            return None
        return Step("matmul", (i, int(rng.choice(cands))))
    if fam == "clip":
        i = _pick(rng, meta, "fi")
        if i is None:
            return None
        return Step("clip", (i,), {"lo": -1, "hi": 2})
    return None


# ----------------------------------------------------------------------------- evaluation


def _apply(mod, step: Step, vals: list):
    """Run `step` with `mod` (lazymath or numpy) on `vals`."""
    x = [vals[i] for i in step.srcs]
    p = step.params
    op = step.op
    if op in ("add", "sub", "mul", "div", "maximum", "minimum") and "scalar" in p:
        f = getattr(mod, {"sub": "subtract", "mul": "multiply", "div": "divide"}.get(op, op))
        s = p["scalar"]
        return f(s, x[0]) if p["right"] else f(x[0], s)
    lm = mod
    if op in ("exp", "log", "sqrt", "sin", "cos", "tanh", "sigmoid", "relu", "abs", "neg",
              "floor", "ceil", "round", "reciprocal", "rsqrt", "sign", "tan"):  # fmt: skip
        return getattr(lm, op)(x[0])
    if op in BINARY or op in COMPARE or op in LOGICAL:
        return getattr(lm, op)(x[0], x[1])
    if op == "where":
        return lm.where(*x)
    if op == "astype":
        return x[0].astype(p["dtype"])
    if op in ("sum", "max", "min", "prod", "mean", "var", "std"):
        return getattr(lm, op)(x[0], axis=p["axis"], keepdims=p["keepdims"])
    if op in ("argmax", "argmin"):
        return getattr(lm, op)(x[0], axis=p["axis"])
    if op in ("softmax", "log_softmax"):
        return getattr(lm, op)(x[0], axis=p["axis"])
    if op == "permute":
        return lm.permute_dims(x[0], p["axes"])
    if op == "slice":
        return x[0][tuple(slice(*s) for s in p["slices"])]
    if op == "flip":
        return lm.flip(x[0], p["axis"])
    if op == "reshape":
        return x[0].reshape(p["shape"])
    if op == "broadcast_to":
        return lm.broadcast_to(x[0], p["shape"])
    if op == "expand_dims":
        return lm.expand_dims(x[0], p["axis"])
    if op == "concatenate":
        return lm.concatenate([x[0], x[1]], axis=p["axis"])
    if op == "pad":
        return lm.pad(x[0], p["width"], constant_values=p["value"])
    if op == "matmul":
        return lm.matmul(x[0], x[1])
    if op == "clip":
        return lm.clip(x[0], p["lo"], p["hi"])
    raise ValueError(f"unknown step {op}")


def _infer(step: Step, meta, leaves):
    """(shape, dtype) of the step's result; raises when lazymath rejects the step."""
    lm = sys.modules["lazymath.functions"]

    vals = []
    for s, d in meta:
        vals.append(lm.zeros(s, d) if d != "bool" else lm.zeros(s, "int8") > 0)
    out = _apply(lm, step, vals)
    return out.shape, out.dtype.name


def _realize(*tensors) -> None:
    realize(*tensors)


def _chain_dtypes(case: Case, steps, vals, i: int) -> set:
    """Dtype names of value `i` and of every value it is computed from."""
    n0, seen, stack, out = len(case.leaves), set(), [i], set()
    while stack:
        j = stack.pop()
        if j in seen:
            continue
        seen.add(j)
        out.add(np.dtype(vals[j].dtype).name)
        if j >= n0:
            stack.extend(steps[j - n0].srcs)
    return out


def _run(case: Case, backend: str, steps=None, dtypes: list | None = None):
    """Values of the case's outputs on `backend` (numpy arrays), realized in the case's order.
    `dtypes` (a list, optional) receives, per output, the dtypes its chain went through."""
    lm = sys.modules["lazymath.functions"]

    steps = case.steps if steps is None else steps
    with settings.override(LAZYMATH_BACKEND=backend):
        vals = [lm.asarray(a) for a in case.leaves]
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            for st in steps:
                vals.append(_apply(lm, st, vals))
            outs = [vals[i] for i in case.outputs if i < len(vals)]
            if dtypes is not None:  # every dtype each output's value went through
                dtypes[:] = [_chain_dtypes(case, steps, vals, i) for i in case.outputs
                             if i < len(vals)]  # fmt: skip
            if case.order == "together":
                _realize(*[outs[i] for i in case.perm if i < len(outs)])
            elif case.order == "intermediate" and len(vals) > len(case.leaves) + 1:
                mid = vals[len(case.leaves)]
                _realize(mid)
                _realize(*outs)
            else:
                for i in case.perm:
                    if i < len(outs):
                        _realize(outs[i])
            return [o.numpy() for o in outs]


# Float tolerance of a value: that of the least precise dtype its chain went through (a float32
# log_softmax cast to float64 carries float32 rounding: seed 201072)
TOL = {"float16": 1e-2, "float32": 1e-4, "float64": 1e-9, "complex64": 1e-4, "complex128": 1e-9}


def _compare(got, want, chains=None) -> str | None:
    for k, (g, w) in enumerate(zip(got, want)):
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"output {k}: {g.dtype}{g.shape} != reference {w.dtype}{w.shape}"
        if w.dtype.kind in "fc":
            r = TOL.get(w.dtype.name, 1e-6)
            if chains is not None and k < len(chains):
                r = max([r, *[TOL[d] for d in chains[k] if d in TOL]])
            wf = w.astype(np.complex128 if w.dtype.kind == "c" else np.float64)
            gf = g.astype(wf.dtype)
            fin = np.isfinite(wf)
            scale = float(np.abs(wf[fin]).max()) if fin.any() else 1.0
            ok = np.isclose(gf, wf, rtol=r, atol=r * max(scale, 1.0), equal_nan=True)
            if not ok.all():
                i = np.argwhere(~ok)[0]
                return (f"output {k} ({w.dtype}{w.shape}) differs at {tuple(i)}: "
                        f"{gf[tuple(i)]!r} vs reference {wf[tuple(i)]!r}")  # fmt: skip
        elif not np.array_equal(g, w):
            i = np.argwhere(g != w)[0]
            return f"output {k} ({w.dtype}) differs at {tuple(i)}: {g[tuple(i)]} vs {w[tuple(i)]}"
    return None


def check(case: Case, backend: str, steps=None) -> str | None:
    """None if `backend` agrees with the reference on `case`, else what went wrong."""
    chains: list = []
    try:
        want = _run(case, "reference", steps, chains)
    except Exception:  # the reference rejects the program: nothing to compare
        return None
    try:
        got = _run(case, backend, steps)
    except Exception as e:
        return f"{backend} raised {type(e).__name__}: {e}"
    return _compare(got, want, chains)


def shrink(case: Case, backend: str) -> Case:
    """Remove steps (and outputs) while the failure remains: a smaller repro."""
    steps = list(case.steps)
    changed = True
    while changed:
        changed = False
        for k in range(len(steps) - 1, -1, -1):
            trial = _drop(case, steps, k)
            if trial is not None and check(trial, backend) is not None:
                case, steps, changed = trial, list(trial.steps), True
                break
    for i in list(case.outputs):
        if len(case.outputs) > 1:
            outs = [o for o in case.outputs if o != i]
            trial = Case(case.seed, case.leaves, case.steps, outs, case.order,
                         tuple(range(len(outs))))  # fmt: skip
            if check(trial, backend) is not None:
                case = trial
    return case


def _drop(case: Case, steps: list, k: int) -> Case | None:
    """The case without step k: later indices shift down; a step using k is dropped too
    (returns None then), outputs equal to k are dropped."""
    n0 = len(case.leaves)
    vid = n0 + k

    def remap(i):
        return i - 1 if i > vid else i

    new = []
    for j, st in enumerate(steps):
        if j == k:
            continue
        if vid in st.srcs:
            return None
        new.append(Step(st.op, tuple(remap(i) for i in st.srcs), st.params))
    outs = [remap(o) for o in case.outputs if o != vid]
    if not outs:
        return None
    return Case(case.seed, case.leaves, new, outs, case.order, tuple(range(len(outs))))


# ----------------------------------------------------------------------------- structural step

# The structural step (issue 38): multi-output graphs that mix complex inputs (AI CPU kernels),
# reversed and strided views of their results, arg-reductions and reductions, and comparisons
# whose operands come from both sides of a reduction -- the shapes that once made the planner
# merge kernels into a cycle. Every graph's schedule is checked without executing (fast); a
# sample is also realized against the reference backend.
STRUCT_FAMILIES = ("view", "view", "abs", "abs", "scalar", "binary", "reduce", "reduce",
                   "compare", "compare", "unary", "where", "cast")  # fmt: skip


def generate_structural(seed: int) -> Case:
    """A random structural case: 1-3 leaves (at least one complex), 4-11 steps, 2-4 outputs."""
    rng = np.random.default_rng(seed)
    n = int(rng.choice([1, 2, 5, 7, 12, 17, 31]))
    shapes = [(n,), (int(rng.choice([1, 3, 4])), n), ()]
    leaves = [_array(rng, shapes[0], str(rng.choice(["complex64", "complex64", "complex128"])))]
    for _ in range(int(rng.integers(0, 3))):
        sh = shapes[int(rng.integers(0, 3))]
        leaves.append(_array(rng, sh, str(rng.choice(["float32", "complex64", "int32",
                                                          "float16", "float64"]))))  # fmt: skip
    meta = [(a.shape, a.dtype.name) for a in leaves]
    steps: list[Step] = []
    for _ in range(int(rng.integers(4, 12))):
        step = _structural_step(rng, meta)
        if step is None:
            continue
        try:
            shape, dtype = _infer(step, meta, leaves)
        except Exception:  # lazymath rejects it (a bad broadcast, a dtype): not a test
            continue
        steps.append(step)
        meta.append((shape, dtype))
    k = len(leaves)
    cand = list(range(k, len(meta))) or list(range(len(meta)))
    m = int(rng.integers(min(2, len(cand)), min(4, len(cand)) + 1))
    outputs = sorted(rng.choice(cand, m, replace=False).tolist())
    # the repro realized a leaf with the outputs: sometimes do the same
    if rng.random() < 0.3:
        outputs = [0] + [o for o in outputs if o != 0]
    order = str(rng.choice(["together", "together", "each", "intermediate"]))
    return Case(seed, leaves, steps, outputs, order, tuple(rng.permutation(len(outputs)).tolist()))


def _recent(rng, meta, kinds=None, ndim_min=0):
    """A value index biased to recent values (deeper graphs), or None."""
    idx = [i for i, (s, d) in enumerate(meta) if (kinds is None or _kind(d) in kinds)
           and len(s) >= ndim_min]  # fmt: skip
    if not idx:
        return None
    w = np.arange(1, len(idx) + 1, dtype=float) ** 2
    return int(rng.choice(idx, p=w / w.sum()))


def _structural_step(rng, meta) -> Step | None:
    fam = str(rng.choice(STRUCT_FAMILIES))
    if fam == "view":
        i = _recent(rng, meta, ndim_min=1)
        if i is None:
            return None
        shape = meta[i][0]
        sl = []
        for d, size in enumerate(shape):
            if d != len(shape) - 1 and rng.random() < 0.5:
                sl.append((None, None, 1))
                continue
            st = int(rng.choice([-1, -1, -2, 2, 3]))
            a = int(rng.integers(0, size)) if size else 0
            sl.append((a, None, st))
        if rng.random() < 0.2:
            return Step("flip", (i,), {"axis": int(rng.integers(0, len(shape)))})
        return Step("slice", (i,), {"slices": tuple(sl)})
    if fam == "abs":
        i = _recent(rng, meta, "c") if rng.random() < 0.8 else _recent(rng, meta, "fi")
        return None if i is None else Step("abs", (i,))
    if fam == "scalar":
        i = _recent(rng, meta, "fic")
        if i is None:
            return None
        op = str(rng.choice(["sub", "add", "mul"]))
        return Step(
            op, (i,), {"scalar": int(rng.choice([0, 1, 2])), "right": bool(rng.random() < 0.5)}
        )
    if fam == "binary":
        i, j = _recent(rng, meta, "fic"), _recent(rng, meta, "fic")
        if i is None:
            return None
        return Step(str(rng.choice(["add", "sub", "mul", "maximum"])), (i, j))
    if fam == "reduce":
        i = _recent(rng, meta, "fic")
        if i is None:
            return None
        shape, dtype = meta[i]
        op = str(rng.choice(["argmax", "argmax", "argmin", "sum", "max", "mean"]))
        if _kind(dtype) == "c":
            op = str(rng.choice(["sum", "mean"]))
        if op in ("argmax", "argmin", "max") and 0 in shape:
            return None
        nd = len(shape)
        axis = None if nd == 0 or rng.random() < 0.5 else int(rng.integers(-nd, nd))
        p = {"axis": axis}
        if op not in ("argmax", "argmin"):
            p["keepdims"] = bool(rng.random() < 0.3)
        return Step(op, (i,), p)
    if fam == "compare":
        i, j = _recent(rng, meta, "fiub"), _recent(rng, meta, "fiub")
        if i is None:
            return None
        return Step(str(rng.choice(COMPARE)), (i, j))
    if fam == "unary":
        i = _recent(rng, meta, "fiub")
        if i is None:
            return None
        return Step(str(rng.choice(["exp", "neg", "relu", "sign"])), (i,))
    if fam == "where":
        c = _recent(rng, meta, "b")
        if c is None:
            return None
        return Step("where", (c, _recent(rng, meta, "fiu"), _recent(rng, meta, "fiu")))
    i = _recent(rng, meta, "fiub")
    if i is None:
        return None
    return Step("astype", (i,), {"dtype": str(rng.choice(["float32", "int64", "float16"]))})


def _build(case: Case):
    """The case's output tensors, built lazily (nothing realized)."""
    lm = sys.modules["lazymath.functions"]
    vals = [lm.asarray(a) for a in case.leaves]
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        for st in case.steps:
            vals.append(_apply(lm, st, vals))
    return [vals[i] for i in case.outputs]


def schedule_problem(case: Case, spec: str) -> str | None:
    """None if the case's outputs plan into kernels in a valid launch order on `spec` (every
    kernel reads only inputs and values written by earlier kernels); else what is wrong.
    Compiles and executes nothing."""
    try:
        outs = _build(case)
    except Exception:  # lazymath rejects the program at capture: not a planner case
        return None
    try:
        s = schedule(*outs, spec=spec)
    except Exception as e:
        return f"schedule on {spec} raised {type(e).__name__}: {e}"
    written: set[int] = set()
    for k in s.kernels:
        g = getattr(k, "group", None)
        if g is None:
            continue
        for n in g.inputs:
            if n.realized is None and id(n) not in written:
                return f"{spec}: kernel {k.name} reads {n.op}{list(n.shape)} before it is written"
        written |= {id(n) for n in g.outputs}
    return None


def run_structural(graphs: int, seed: int = 0, backends=("llvm", "interp"),
                   specs=("ascend910", "ascend910b"), values_every: int = 10,
                   out=sys.stdout, stop_after: int = 5) -> tuple[list, dict]:  # fmt: skip
    """The structural step: every case's schedule on every spec, and every `values_every`-th
    case realized on one backend (cycling backends and specs) against the reference. Returns
    ([(seed, what, message, repro)], counts)."""
    failures: list = []
    counts = {"graphs": 0, "schedules": 0, "valued": 0}
    t0 = time.time()
    for k in range(graphs):
        s = seed + k
        case = generate_structural(s)
        counts["graphs"] += 1
        for spec in specs:
            msg = schedule_problem(case, spec)
            counts["schedules"] += 1
            if msg is not None:
                failures.append((s, f"schedule/{spec}", msg, case.repro()))
                print(f"[fuzz-struct] seed {s}: {msg}\n{case.repro()}\n", file=out, flush=True)
        if values_every and k % values_every == 0:
            j = k // values_every
            backend, spec = backends[j % len(backends)], specs[(j // len(backends)) % len(specs)]
            init_device(0, spec=spec)
            try:
                msg = check(case, backend)
                if msg is not None:
                    case = shrink(case, backend)
                    msg = check(case, backend) or msg
            finally:
                init_device(0, spec="ascend910")
            counts["valued"] += 1
            counts[f"valued/{backend}/{spec}"] = counts.get(f"valued/{backend}/{spec}", 0) + 1
            if msg is not None:
                failures.append((s, f"values/{backend}/{spec}", msg, case.repro(backend)))
                print(f"[fuzz-struct] seed {s} {backend} {spec}: {msg}\n"
                      f"{case.repro(backend)}\n", file=out, flush=True)  # fmt: skip
        if len(failures) >= stop_after:
            break
        if (k + 1) % 200 == 0:
            print(f"[fuzz-struct] {k + 1} graphs, {len(failures)} failures, "
                  f"{time.time() - t0:.0f} s", file=out, flush=True)  # fmt: skip
    return failures, counts


# ----------------------------------------------------------------------------- driver


def run(graphs: int, seed: int = 0, backends=("llvm", "interp"), out=sys.stdout,
        stop_after: int = 5) -> list:  # fmt: skip
    """Fuzz `graphs` cases from `seed`; returns [(seed, backend, message, repro)]."""
    failures = []
    t0 = time.time()
    for k in range(graphs):
        s = seed + k
        case = generate(s)
        backend = backends[k % len(backends)]
        msg = check(case, backend)
        if msg is not None:
            small = shrink(case, backend)
            msg2 = check(small, backend) or msg
            failures.append((s, backend, msg2, small.repro(backend)))
            print(f"[fuzz] seed {s} {backend}: {msg2}\n{small.repro(backend)}\n", file=out,
                  flush=True)  # fmt: skip
            if len(failures) >= stop_after:
                break
        if (k + 1) % 100 == 0:
            dt = time.time() - t0
            print(f"[fuzz] {k + 1} graphs (seeds {seed}..{s}), {len(failures)} failures, "
                  f"{dt:.0f} s, {(k + 1) / dt:.2f} graphs/s", file=out, flush=True)  # fmt: skip
    return failures


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graphs", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backends", default="llvm,interp")
    ap.add_argument("--stop-after", type=int, default=20)
    ap.add_argument(
        "--structural",
        action="store_true",
        help="the structural step: schedules of every graph, values of a sample",
    )
    ap.add_argument("--values-every", type=int, default=10)
    a = ap.parse_args(argv)
    t0 = time.time()
    if a.structural:
        fails, counts = run_structural(
            a.graphs,
            a.seed,
            tuple(a.backends.split(",")),
            values_every=a.values_every,
            stop_after=a.stop_after,
        )
        print(f"[fuzz-struct] seeds {a.seed}..{a.seed + a.graphs - 1}: {counts}, "
              f"{len(fails)} failure(s) in {time.time() - t0:.0f} s")  # fmt: skip
        return 1 if fails else 0
    fails = run(a.graphs, a.seed, tuple(a.backends.split(",")), stop_after=a.stop_after)
    print(f"[fuzz] seeds {a.seed}..{a.seed + a.graphs - 1}: {len(fails)} failure(s) in "
          f"{time.time() - t0:.0f} s")  # fmt: skip
    return 1 if fails else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        traceback.print_exc()
        sys.exit(130)
