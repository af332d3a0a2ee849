"""A data-only encoding of ISA programs for the disk cache (no pickle).

    blob = encode(program)          # bytes (JSON text)
    program = decode(blob)          # an isa.Program, or CodecError

Why not pickle: a pickle is a program for the unpickler's VM; whatever it may name (even classes
of lazymath's own modules) it can chain into arbitrary calls. This reader can only build values
of the types below, from constants, and checks every field against its dataclass:

- plain values: None, bool, int, str, float (as ``float.hex``), complex, tuples of these;
- a fixed set of lazymath's frozen dataclasses: the scalar expressions and buffers of
  ``isa`` (Var, BinInt, Buffer, Ref, Program), the kernel IR's SOp/ArgView (Cube prologues),
  and every instruction type declared with ``isa.register_instr`` (the ISA's own, Cube's,
  vmath's). Types are named by module and class; a name is looked up in that registry only,
  never imported from what the file says, except that the registering modules listed in
  ``_INSTR_MODULES`` (fixed here) are imported so their instructions are registered.

Layout (JSON): ``{"codec": VERSION, "types": [[name, [field, ...]], ...], "objs": [[type index,
[value, ...]], ...]}``; the last object is the program. An object may only refer to objects
before it (``{"o": index}``), so the graph is built bottom-up without recursion and cannot be
cyclic; shared values (a Buffer referenced by many Refs) are stored once. Every type's stored
field list must equal the class's current fields, every field value must match the field's
annotation (``IntExpr`` = int | Var | BinInt, ``Ref``, ``tuple`` ...), and anything else --
unknown type, extra or missing field, wrong value type, bad reference -- is a `CodecError`.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math

from lazymath.backend.npu import isa
from lazymath.backend.npu.kernel_ir import ArgView, SOp

VERSION = 1

# Modules whose import registers instruction types a cached program may contain (fixed here:
# the file never chooses what gets imported).
_INSTR_MODULES = ("lazymath.backend.npu.isa_cube", "lazymath.backend.npu.vmath")

_BASE_TYPES = (isa.Var, isa.BinInt, isa.Buffer, isa.Ref, isa.Program, SOp, ArgView)


class CodecError(ValueError):
    """The bytes are not a valid encoding of a lazymath ISA program."""


def _type_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _registry(import_all: bool = False) -> dict[str, type]:
    if import_all:
        for m in _INSTR_MODULES:
            importlib.import_module(m)
    types = list(_BASE_TYPES) + list(isa.PIPE_OF)
    return {_type_name(c): c for c in types if dataclasses.is_dataclass(c)}


# ----------------------------------------------------------------------------- field schemas

_INT_EXPR = (int, isa.Var, isa.BinInt)
_SCALAR = (bool, int, float, complex, str, type(None))
_ANY = object  # any encodable value (SOp.arg)


def _resolve(annotation: str, reg_by_short: dict[str, type]) -> tuple:
    """Allowed Python types of a field from its (string) annotation."""
    out: list = []
    for part in annotation.split("|"):
        p = part.strip()
        base = p.split("[", 1)[0].split(".")[-1]
        if base == "None":
            out.append(type(None))
        elif base == "int":
            out.append(int)
        elif base == "float":
            out.extend((float, int))
        elif base == "str":
            out.append(str)
        elif base == "bool":
            out.append(bool)
        elif base in ("tuple", "Expr"):
            out.append(tuple)
        elif base == "IntExpr":
            out.extend(_INT_EXPR)
        elif base in reg_by_short:
            out.append(reg_by_short[base])
        else:  # object, or a name we do not know: any encodable value
            return (_ANY,)
    return tuple(out)


_schemas: dict[type, tuple] = {}


def _schema(cls: type, reg: dict[str, type]) -> tuple:
    """((field name, allowed types), ...) of a registered dataclass."""
    s = _schemas.get(cls)
    if s is None:
        short = {c.__name__: c for c in reg.values()}
        s = tuple(
            (f.name, _resolve(f.type if isinstance(f.type, str) else f.type.__name__, short))
            for f in dataclasses.fields(cls)
        )
        _schemas[cls] = s
    return s


# ----------------------------------------------------------------------------- encode


def encode(program: isa.Program) -> bytes:
    """The program as codec bytes. Raises CodecError for a value outside the encoding (the
    caller then does not cache the kernel on disk)."""
    if not isinstance(program, isa.Program):
        raise CodecError("only isa.Program values are encoded")
    reg = _registry()
    names = {c: n for n, c in reg.items()}
    type_idx: dict[type, int] = {}
    types: list = []
    objs: list = []
    memo: dict[int, int] = {}
    keep: list = []  # objects whose id() is in memo stay alive while encoding

    def children(v, acc):
        if isinstance(v, tuple):
            for x in v:
                children(x, acc)
        elif dataclasses.is_dataclass(v) and not isinstance(v, type) and id(v) not in memo:
            acc.append(v)

    def value(v):
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, int):
            return int(v)
        if isinstance(v, float):
            return {"f": float(v).hex()}
        if isinstance(v, complex):
            return {"c": [v.real.hex(), v.imag.hex()]}
        if isinstance(v, tuple):
            return [value(x) for x in v]
        k = memo.get(id(v))
        if k is not None:
            return {"o": k}
        raise CodecError(f"cannot encode a {type(v).__name__} value ({v!r:.80})")

    stack = [(program, False)]
    while stack:
        obj, ready = stack.pop()
        if id(obj) in memo:
            continue
        cls = type(obj)
        if cls not in names:
            raise CodecError(f"type {_type_name(cls)} is not part of the ISA encoding")
        fields = [f.name for f in dataclasses.fields(cls)]
        if not ready:
            stack.append((obj, True))
            pending: list = []
            for f in fields:
                children(getattr(obj, f), pending)
            stack.extend((c, False) for c in reversed(pending))
            continue
        t = type_idx.get(cls)
        if t is None:
            t = type_idx[cls] = len(types)
            types.append([names[cls], fields])
        objs.append([t, [value(getattr(obj, f)) for f in fields]])
        memo[id(obj)] = len(objs) - 1
        keep.append(obj)
    doc = {"codec": VERSION, "types": types, "objs": objs}
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()


def encode_checked(program: isa.Program) -> bytes:
    """`encode`, then decode and encode again: only bytes the reader accepts and turns back
    into the same program are returned (CodecError otherwise)."""
    blob = encode(program)
    if encode(decode(blob)) != blob:
        raise CodecError(f"program {program.name} does not survive its encoding")
    return blob


# ----------------------------------------------------------------------------- decode


def _float(s) -> float:
    if not isinstance(s, str) or len(s) > 40:
        raise CodecError("bad float")
    try:
        return float.fromhex(s)
    except (ValueError, OverflowError):
        raise CodecError(f"bad float {s!r}") from None


def decode(blob: bytes) -> isa.Program:
    """The program encoded in `blob`; CodecError for anything else (never runs code)."""
    try:
        doc = json.loads(blob.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CodecError(f"not a lazymath ISA encoding ({type(e).__name__})") from None
    if not isinstance(doc, dict) or set(doc) != {"codec", "types", "objs"}:
        raise CodecError("not a lazymath ISA encoding")
    if doc["codec"] != VERSION:
        raise CodecError(f"ISA encoding version {doc['codec']!r}, expected {VERSION}")
    types, objs = doc["types"], doc["objs"]
    if not isinstance(types, list) or not isinstance(objs, list) or not objs:
        raise CodecError("malformed ISA encoding")
    reg = _registry()
    classes: list = []
    for entry in types:
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)):
            raise CodecError("malformed type table")
        name, fields = entry
        cls = reg.get(name)
        if cls is None and name.rsplit(".", 1)[0] in _INSTR_MODULES:
            reg = _registry(import_all=True)
            cls = reg.get(name)
        if cls is None:
            raise CodecError(f"type {name!r:.100} is not part of the ISA encoding")
        schema = _schema(cls, reg)
        if fields != [f for f, _ in schema]:
            raise CodecError(f"fields of {name} differ from this lazymath's ({fields!r:.200})")
        classes.append((cls, schema))
    built: list = []

    def value(v, depth=0):
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, int):
            return v
        if isinstance(v, list):
            if depth > 32:
                raise CodecError("tuples nested too deeply")
            return tuple(value(x, depth + 1) for x in v)
        if isinstance(v, dict) and len(v) == 1:
            ((k, x),) = v.items()
            if k == "o" and type(x) is int and 0 <= x < len(built):
                return built[x]
            if k == "f":
                return _float(x)
            if k == "c" and isinstance(x, list) and len(x) == 2:
                return complex(_float(x[0]), _float(x[1]))
        raise CodecError(f"bad value {v!r:.80}")

    for entry in objs:
        if not (isinstance(entry, list) and len(entry) == 2 and type(entry[0]) is int):
            raise CodecError("malformed object table")
        t, vals = entry
        if not (0 <= t < len(classes)) or not isinstance(vals, list):
            raise CodecError("malformed object")
        cls, schema = classes[t]
        if len(vals) != len(schema):
            raise CodecError(f"{cls.__name__}: {len(vals)} values for {len(schema)} fields")
        kwargs = {}
        for (fname, allowed), raw in zip(schema, vals):
            v = value(raw)
            if allowed != (_ANY,) and not isinstance(v, allowed):
                raise CodecError(f"{cls.__name__}.{fname}: a {type(v).__name__} is not allowed")
            if isinstance(v, float) and not math.isfinite(v) and allowed == _INT_EXPR:
                raise CodecError(f"{cls.__name__}.{fname}: not an integer")
            kwargs[fname] = v
        try:
            built.append(cls(**kwargs))
        except (TypeError, ValueError) as e:
            raise CodecError(f"{cls.__name__}: {e}") from None
    program = built[-1]
    if not isinstance(program, isa.Program):
        raise CodecError("the encoded value is not an isa.Program")
    return program


def _no_constant(name: str):
    raise CodecError(f"JSON constant {name} is not allowed")
