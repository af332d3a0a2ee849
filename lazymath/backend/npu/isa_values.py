"""The ISA's values: integer expressions (`Var`, `BinInt` and the folding constructors `add`,
`mul`, ... `ceildiv`, `eval_int`), the block/sub-block index variables, and buffers (`Buffer`,
`Ref`), with the static reasoning on expressions that the checks use (`linear`,
`const_difference`, `int_range`).

Part of the ISA's one namespace, `isa` (issue 36 split it by what it holds): use `isa.X`; this
module imports nothing of the ISA, every other part builds on it.
"""

from __future__ import annotations

from dataclasses import dataclass

# ----------------------------------------------------------------------------- scalar values

SCOPES = ("GM", "L1", "L0A", "L0B", "L0C", "UB")


@dataclass(frozen=True, slots=True)
class Var:
    """A scalar (int64) variable: loop counters, block index/count, Let-bound values."""

    name: str

    def __str__(self) -> str:
        return self.name


class _IntArith:
    """Python operators on integer expressions (`i * tile + 1`, `n // 2`, `(t + 1) % 2`): kernel
    authors (`lazymath.kernel`) write addresses as plain arithmetic. Constants fold, like the
    module functions `add`, `mul`, ... that these call."""

    __slots__ = ()

    def __add__(self, o):
        return add(self, o) if _is_int(o) else NotImplemented

    def __radd__(self, o):
        return add(o, self) if _is_int(o) else NotImplemented

    def __sub__(self, o):
        return sub(self, o) if _is_int(o) else NotImplemented

    def __rsub__(self, o):
        return sub(o, self) if _is_int(o) else NotImplemented

    def __mul__(self, o):
        return mul(self, o) if _is_int(o) else NotImplemented

    def __rmul__(self, o):
        return mul(o, self) if _is_int(o) else NotImplemented

    def __floordiv__(self, o):
        return floordiv(self, o) if _is_int(o) else NotImplemented

    def __rfloordiv__(self, o):
        return floordiv(o, self) if _is_int(o) else NotImplemented

    def __mod__(self, o):
        return mod(self, o) if _is_int(o) else NotImplemented

    def __rmod__(self, o):
        return mod(o, self) if _is_int(o) else NotImplemented


def _is_int(o) -> bool:
    return isinstance(o, (int, Var, BinInt)) and not isinstance(o, bool)


for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__",
              "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__"):  # fmt: skip
    setattr(Var, _name, getattr(_IntArith, _name))


@dataclass(frozen=True, slots=True)
class BinInt:
    """Integer arithmetic on IntExpr; op in + - * // % min max."""

    op: str
    a: IntExpr
    b: IntExpr

    def __str__(self) -> str:
        if self.op in ("min", "max"):
            return f"{self.op}({self.a}, {self.b})"
        return f"({self.a} {self.op} {self.b})"


IntExpr = int | Var | BinInt

for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__",
              "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__"):  # fmt: skip
    setattr(BinInt, _name, getattr(_IntArith, _name))

BLOCK_IDX = Var("block_idx")  # GetBlockIdx()
BLOCK_NUM = Var("block_num")  # GetBlockNum()
# GetSubBlockIdx(): which Vector core (AIV) of its group runs the code, in a MIX kernel. A loop
# over it (`Loop(SUBBLOCK_IDX, 0, n, 1, body)`, n <= the spec's AIVs per AIC) is a sub-block
# section: on the host an ordinary loop (the AIVs' parts one after the other), on the device
# iteration v is what AIV v of the group runs (see `isa_mix`).
SUBBLOCK_IDX = Var("subblock_idx")


def add(a: IntExpr, b: IntExpr) -> IntExpr:
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    if b == 0:
        return a
    if a == 0:
        return b
    return BinInt("+", a, b)


def mul(a: IntExpr, b: IntExpr) -> IntExpr:
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    if a == 1:
        return b
    if b == 1:
        return a
    if a == 0 or b == 0:
        return 0
    return BinInt("*", a, b)


def sub(a: IntExpr, b: IntExpr) -> IntExpr:
    if isinstance(a, int) and isinstance(b, int):
        return a - b
    if b == 0:
        return a
    return BinInt("-", a, b)


def imin(a: IntExpr, b: IntExpr) -> IntExpr:
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    return BinInt("min", a, b)


def imax(a: IntExpr, b: IntExpr) -> IntExpr:
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    return BinInt("max", a, b)


def floordiv(a: IntExpr, b: IntExpr) -> IntExpr:
    """Python floor division (consumers implement floor semantics for negative values too)."""
    if isinstance(a, int) and isinstance(b, int):
        return a // b
    if b == 1:
        return a
    return BinInt("//", a, b)


def mod(a: IntExpr, b: IntExpr) -> IntExpr:
    """Python modulo (result has the divisor's sign)."""
    if isinstance(a, int) and isinstance(b, int):
        return a % b
    if b == 1:
        return 0
    return BinInt("%", a, b)


def ceildiv(a: IntExpr, b: IntExpr) -> IntExpr:
    """ceil(a / b) for b > 0: the blockFactor / tile-count formula of AscendC tiling."""
    return floordiv(add(a, sub(b, 1)) if isinstance(b, int) else sub(add(a, b), 1), b)


def eval_int(e: IntExpr, env: dict) -> int:
    """Evaluate an IntExpr with Var values from `env` (iterative: deep address sums are fine)."""
    if isinstance(e, int):
        return e
    if isinstance(e, Var):
        return env[e]
    stack, out = [(e, False)], []
    while stack:
        node, done = stack.pop()
        if isinstance(node, int):
            out.append(node)
        elif isinstance(node, Var):
            out.append(env[node])
        elif done:
            b, a = out.pop(), out.pop()
            out.append(INT_OPS[node.op](a, b))
        else:
            stack.append((node, True))
            stack.append((node.b, False))
            stack.append((node.a, False))
    return out[0]


INT_OPS = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "//": lambda a, b: a // b,
    "%": lambda a, b: a % b,
    "min": min,
    "max": max,
}


# ----------------------------------------------------------------------------- buffers


@dataclass(frozen=True, slots=True)
class Buffer:
    """A named buffer in a scope. GM buffers are kernel arguments (`arg` = position);
    on-chip buffers have a fixed element count that the program declares and the spec checks."""

    name: str
    scope: str
    dtype: str  # numpy dtype name; "bool" is stored as one byte
    size: int  # elements (GM: 0, unknown)
    arg: int = -1  # GM argument index

    @property
    def nbytes(self) -> int:
        import numpy as np

        # bfloat16 by name: np.dtype("bfloat16") exists only once ml_dtypes is imported, and a
        # program (its capacity check, its listing) must not depend on who imported what
        item = 2 if self.dtype == "bfloat16" else np.dtype(self.dtype).itemsize
        return self.size * item

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class Ref:
    """A position inside a buffer: element offset `off` (an IntExpr) from the buffer start."""

    buf: Buffer
    off: IntExpr = 0

    def __str__(self) -> str:
        return f"{self.buf.name}[{self.off}]" if self.off != 0 else self.buf.name

    def __add__(self, k: IntExpr) -> Ref:
        return Ref(self.buf, add(self.off, k))


def linear(e: IntExpr) -> dict | None:
    """`e` as {term: coefficient} (the constant under key 1) when it is a sum of constants and
    constant multiples of other sub-expressions; None otherwise (only + - and * by a constant
    are expanded, anything else is one opaque term)."""
    if isinstance(e, int):
        return {1: e}
    if isinstance(e, BinInt) and e.op in ("+", "-"):
        a, b = linear(e.a), linear(e.b)
        if a is None or b is None:
            return None
        sign = 1 if e.op == "+" else -1
        out = dict(a)
        for k, v in b.items():
            out[k] = out.get(k, 0) + sign * v
        return {k: v for k, v in out.items() if v or k == 1}
    if isinstance(e, BinInt) and e.op == "*" and (isinstance(e.a, int) or isinstance(e.b, int)):
        c, x = (e.a, e.b) if isinstance(e.a, int) else (e.b, e.a)
        lx = linear(x)
        return None if lx is None else {k: c * v for k, v in lx.items()}
    return {e: 1, 1: 0}


def const_difference(a: IntExpr, b: IntExpr) -> int | None:
    """a - b when it is the same constant for every variable value, else None."""
    la, lb = linear(a), linear(b)
    if la is None or lb is None:
        return None
    d = dict(la)
    for k, v in lb.items():
        d[k] = d.get(k, 0) - v
    if any(v for k, v in d.items() if k != 1):
        return None
    return d.get(1, 0)


def int_range(e: IntExpr, ranges: dict) -> tuple[float, float]:
    """Interval [lo, hi] of an IntExpr given intervals of its variables (unknown: unbounded)."""
    inf = float("inf")
    if isinstance(e, int):
        return e, e
    if isinstance(e, Var):
        return ranges.get(e, (-inf, inf))
    a, b = int_range(e.a, ranges), int_range(e.b, ranges)
    op = e.op
    if op == "+":
        return a[0] + b[0], a[1] + b[1]
    if op == "-":
        return a[0] - b[1], a[1] - b[0]
    if op == "min":
        return min(a[0], b[0]), min(a[1], b[1])
    if op == "max":
        return max(a[0], b[0]), max(a[1], b[1])
    if op == "*":
        cs = [x * y for x in a for y in b if not (x == 0 or y == 0)] or [0]
        cs += [0] if 0 in (*a, *b) else []
        return min(cs), max(cs)
    if op == "%" and b[0] == b[1] and b[0] > 0:
        if a[0] >= 0 and a[1] < b[0]:
            return a
        return 0, b[0] - 1
    if op == "//" and b[0] > 0 and b[1] < inf:
        cs = [x // y if abs(x) < inf else x for x in a for y in b]
        return min(cs), max(cs)
    return -inf, inf
