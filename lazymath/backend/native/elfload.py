"""A small x86-64 ELF64 relocatable-object loader: cached kernel code runs without LLVM.

Why: the disk cache stores the object code MCJIT emitted. Loading it back through MCJIT means
importing ``llvmlite.binding`` -- ~40 MiB of relocated C++ data pages in every process, even one
that never compiles. A warm process only needs what a static linker does for one ``.o``: copy
the allocated sections into memory, apply the relocations, resolve a handful of libc/libm
symbols. That is this module, pure Python over ``ctypes`` (``mmap``/``mprotect``/``dlsym``).

    obj = load(code, resolve=my_resolver)    # LoadedObject
    addr = obj.address("lm_matmul_...")      # C function pointer (int)

What the kernels contain (scanned over every cached kernel kind, see ``scan``): MCJIT's large code
model, so ``.ltext`` with absolute ``R_X86_64_64`` relocations to ``.rodata.cst*`` constant pools
and to external functions (memcpy, memset, sinf, tanhf, pthread_*, aligned_alloc, free, abort) and
one external data symbol (the GEMM workspace key), plus ``.eh_frame`` with ``R_X86_64_PC64``.
The small/medium/large-PIC forms (PC32, PLT32 -- through in-image stubs when libc is further
than 2 GiB --, GOTPCREL[X], 32, 32S, PC64, GOTOFF64, GOTPC32/64, GOT64, GOTPCREL64, PLTOFF64,
``_GLOBAL_OFFSET_TABLE_``) are handled too (tests load objects of every code model), so a change
of LLVM's code model does not silently lose the fast path.

Layout: one anonymous mapping, three page-aligned groups -- code (+ PLT stubs), read-only data
(+ the GOT), writable data/.bss -- each section at its own alignment. The image is built and
relocated in a Python bytearray against the mapping's final address, copied in while the
mapping is read-write, then code becomes read+exec and constants/GOT read-only (W^X: no page
is ever writable and executable). ``.eh_frame`` is not loaded (nothing unwinds through kernels).
The mapping is never unmapped: like MCJIT's, kernel code lives as long as the process (ctypes
function pointers to it are cached everywhere).

Errors: ``ElfFormatError`` -- the bytes are not a well-formed x86-64 relocatable object (bounds,
indices, sizes are all checked before anything is written); the caller must not hand them to
anything that executes them. ``ElfUnsupportedError`` -- a well-formed object using something
this loader does not implement (a relocation type, ``.init_array``, TLS, COMMON symbols, writable
code, a 32-bit distance that does not fit); the caller may fall back to MCJIT. Its subclass
``ElfUnresolvedSymbolError`` (an undefined symbol the resolver and ``dlsym`` do not know) names
the symbol, so the caller can check whether MCJIT knows it before trusting MCJIT with the object.
"""

from __future__ import annotations

import ctypes
import mmap
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

# ----------------------------------------------------------------------------- ELF constants

ET_REL = 1
EM_X86_64 = 62
SHT_NULL, SHT_PROGBITS, SHT_SYMTAB, SHT_STRTAB, SHT_RELA = 0, 1, 2, 3, 4
SHT_NOBITS, SHT_REL = 8, 9
SHT_INIT_ARRAY, SHT_FINI_ARRAY, SHT_PREINIT_ARRAY = 14, 15, 16
SHT_X86_64_UNWIND = 0x70000001
SHF_WRITE, SHF_ALLOC, SHF_EXECINSTR, SHF_TLS = 0x1, 0x2, 0x4, 0x400
SHN_UNDEF, SHN_LORESERVE, SHN_ABS, SHN_COMMON, SHN_XINDEX = 0, 0xFF00, 0xFFF1, 0xFFF2, 0xFFFF
STB_LOCAL, STB_GLOBAL, STB_WEAK = 0, 1, 2
STT_NOTYPE, STT_OBJECT, STT_FUNC, STT_SECTION, STT_FILE, STT_TLS = 0, 1, 2, 3, 4, 6

# relocation type -> name; every type listed here is applied by `_apply`
RELOC_NAMES: dict[int, str] = {
    0: "R_X86_64_NONE",
    1: "R_X86_64_64",
    2: "R_X86_64_PC32",
    4: "R_X86_64_PLT32",
    9: "R_X86_64_GOTPCREL",
    10: "R_X86_64_32",
    11: "R_X86_64_32S",
    24: "R_X86_64_PC64",
    25: "R_X86_64_GOTOFF64",
    26: "R_X86_64_GOTPC32",
    27: "R_X86_64_GOT64",
    28: "R_X86_64_GOTPCREL64",
    29: "R_X86_64_GOTPC64",
    31: "R_X86_64_PLTOFF64",
    41: "R_X86_64_GOTPCRELX",
    42: "R_X86_64_REX_GOTPCRELX",
}
R_NONE, R_64, R_PC32, R_PLT32, R_GOTPCREL, R_32, R_32S = 0, 1, 2, 4, 9, 10, 11
R_PC64, R_GOTOFF64, R_GOTPC32, R_GOTPCRELX, R_REX_GOTPCRELX = 24, 25, 26, 41, 42
R_GOT64, R_GOTPCREL64, R_GOTPC64, R_PLTOFF64 = 27, 28, 29, 31
GOT_RELOCS = frozenset((R_GOTPCREL, R_GOTPCRELX, R_REX_GOTPCRELX))  # 32-bit PC-relative slot
GOT_SLOT_RELOCS = GOT_RELOCS | {R_GOT64, R_GOTPCREL64}  # relocations that need a GOT slot
GOT_BASE_RELOCS = frozenset((R_GOTOFF64, R_GOTPC32, R_GOTPC64, R_PLTOFF64))  # need the base
GOT_SYMBOL = "_GLOBAL_OFFSET_TABLE_"  # the medium/large PIC models name the GOT base

# Sections whose presence means code must run at load time (constructors): never loaded.
INIT_SECTION_TYPES = frozenset((SHT_INIT_ARRAY, SHT_FINI_ARRAY, SHT_PREINIT_ARRAY))
INIT_SECTION_NAMES = (".init_array", ".fini_array", ".preinit_array", ".ctors", ".dtors")

PAGE = mmap.PAGESIZE
PLT_STUB = 16  # jmp *0(%rip); .quad target; 2 bytes padding
_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")
_RELA = struct.Struct("<QQq")


class ElfLoadError(Exception):
    """The object cannot be loaded by this module."""


class ElfFormatError(ElfLoadError):
    """Not a well-formed x86-64 ELF64 relocatable object: never execute these bytes."""


class ElfUnsupportedError(ElfLoadError):
    """Well formed, but uses something this loader does not implement (MCJIT may load it)."""


class ElfUnresolvedSymbolError(ElfUnsupportedError):
    """An undefined symbol neither the resolver nor the process defines (`symbol` names it)."""

    def __init__(self, symbol: str) -> None:
        super().__init__(f"undefined symbol {symbol!r} is not in the process")
        self.symbol = symbol


# ----------------------------------------------------------------------------- parsing


@dataclass(frozen=True)
class Section:
    index: int
    name: str
    type: int
    flags: int
    offset: int
    size: int
    link: int
    info: int
    align: int
    entsize: int


@dataclass(frozen=True)
class Symbol:
    name: str
    value: int
    size: int
    bind: int
    type: int
    shndx: int


@dataclass(frozen=True)
class Rela:
    offset: int
    type: int
    sym: int
    addend: int


@dataclass(frozen=True)
class ElfObject:
    """The parsed, bounds-checked tables of one relocatable object."""

    data: bytes
    sections: tuple[Section, ...]
    symbols: tuple[Symbol, ...]
    relocs: dict[int, tuple[Rela, ...]] = field(default_factory=dict)  # target shndx -> relas

    def section_bytes(self, s: Section) -> bytes:
        return self.data[s.offset : s.offset + s.size]


def _cstr(table: bytes, off: int, what: str) -> str:
    if off >= len(table) and not (off == 0 and not table):
        raise ElfFormatError(f"{what}: string offset {off} outside its table ({len(table)} B)")
    end = table.find(b"\0", off)
    if end < 0:
        raise ElfFormatError(f"{what}: unterminated string at offset {off}")
    try:
        return table[off:end].decode()
    except UnicodeDecodeError:
        raise ElfFormatError(f"{what}: name at offset {off} is not UTF-8") from None


def parse(data: bytes) -> ElfObject:
    """Parse and validate headers, sections, the symbol table and every RELA section."""
    data = bytes(data)
    if len(data) < _EHDR.size:
        raise ElfFormatError(f"{len(data)} bytes: too short for an ELF header")
    (ident, e_type, e_machine, e_version, _entry, _phoff, shoff, _flags, ehsize, _phentsize,
     _phnum, shentsize, shnum, shstrndx) = _EHDR.unpack_from(data, 0)  # fmt: skip
    if ident[:4] != b"\x7fELF":
        raise ElfFormatError("no ELF magic")
    if ident[4] != 2 or ident[5] != 1 or ident[6] != 1:
        raise ElfFormatError("not ELF64 little-endian version 1")
    if e_type != ET_REL or e_machine != EM_X86_64 or e_version != 1:
        raise ElfFormatError(f"not an x86-64 relocatable object (type {e_type}, machine "
                             f"{e_machine})")  # fmt: skip
    if ehsize != _EHDR.size or shentsize != _SHDR.size:
        raise ElfFormatError("unexpected ELF header or section header size")
    if shnum == 0 or shnum >= SHN_LORESERVE or shoff + shnum * shentsize > len(data):
        raise ElfFormatError("section header table outside the file (or extended numbering)")
    if shstrndx >= shnum:
        raise ElfFormatError("section name table index out of range")
    raw = [_SHDR.unpack_from(data, shoff + i * shentsize) for i in range(shnum)]
    names_hdr = raw[shstrndx]
    if names_hdr[1] != SHT_STRTAB or names_hdr[4] + names_hdr[5] > len(data):
        raise ElfFormatError("section name table is not an in-bounds STRTAB")
    shstr = data[names_hdr[4] : names_hdr[4] + names_hdr[5]]
    sections = []
    for i, (name, typ, flags, _addr, off, size, link, info, align, entsize) in enumerate(raw):
        if typ != SHT_NOBITS and typ != SHT_NULL and off + size > len(data):
            raise ElfFormatError(f"section {i}: bytes [{off}, {off + size}) outside the file")
        if align > 1 and align & (align - 1):
            raise ElfFormatError(f"section {i}: alignment {align} is not a power of two")
        if align > PAGE:
            raise ElfUnsupportedError(f"section {i}: alignment {align} above the page size")
        sections.append(Section(i, _cstr(shstr, name, "section name"), typ, flags, off, size,
                                link, info, max(1, align), entsize))  # fmt: skip
    symtabs = [s for s in sections if s.type == SHT_SYMTAB]
    if len(symtabs) > 1:
        raise ElfFormatError("more than one symbol table")
    symbols: tuple[Symbol, ...] = ()
    if symtabs:
        symbols = _parse_symbols(data, sections, symtabs[0])
    relocs: dict[int, tuple[Rela, ...]] = {}
    for s in sections:
        if s.type == SHT_REL:
            raise ElfUnsupportedError(f"{s.name}: SHT_REL relocations (x86-64 uses RELA)")
        if s.type != SHT_RELA:
            continue
        if not symtabs or s.link != symtabs[0].index:
            raise ElfFormatError(f"{s.name}: does not link to the symbol table")
        if s.entsize != _RELA.size or s.size % _RELA.size:
            raise ElfFormatError(f"{s.name}: bad entry size")
        if not 0 < s.info < len(sections) or s.info in relocs:
            raise ElfFormatError(f"{s.name}: bad or duplicate target section {s.info}")
        target = sections[s.info]
        rows = []
        for off in range(s.offset, s.offset + s.size, _RELA.size):
            r_off, r_info, addend = _RELA.unpack_from(data, off)
            rela = Rela(r_off, r_info & 0xFFFFFFFF, r_info >> 32, addend)
            if rela.sym >= len(symbols):
                raise ElfFormatError(f"{s.name}: symbol index {rela.sym} out of range")
            if r_off + _reloc_width(rela.type) > target.size:
                raise ElfFormatError(f"{s.name}: offset {r_off} outside {target.name}")
            rows.append(rela)
        relocs[s.info] = tuple(rows)
    return ElfObject(data, tuple(sections), symbols, relocs)


def _parse_symbols(data: bytes, sections: list[Section], symtab: Section) -> tuple[Symbol, ...]:
    if symtab.entsize != _SYM.size or symtab.size % _SYM.size:
        raise ElfFormatError("symbol table: bad entry size")
    if not 0 < symtab.link < len(sections) or sections[symtab.link].type != SHT_STRTAB:
        raise ElfFormatError("symbol table: string table link is not a STRTAB")
    strtab = data[sections[symtab.link].offset : sections[symtab.link].offset
                  + sections[symtab.link].size]  # fmt: skip
    out = []
    for off in range(symtab.offset, symtab.offset + symtab.size, _SYM.size):
        name, info, _other, shndx, value, size = _SYM.unpack_from(data, off)
        if shndx == SHN_XINDEX:
            raise ElfUnsupportedError("extended section indices (SHN_XINDEX)")
        if shndx != SHN_UNDEF and shndx < SHN_LORESERVE and shndx >= len(sections):
            raise ElfFormatError(f"symbol at {off}: section index {shndx} out of range")
        out.append(Symbol(_cstr(strtab, name, "symbol name"), value, size, info >> 4, info & 0xF,
                          shndx))  # fmt: skip
    return tuple(out)


def _reloc_width(rtype: int) -> int:
    """Bytes a relocation patches (0 for NONE); unknown types are 0 here and refused later."""
    if rtype in (R_64, R_PC64, R_GOTOFF64, R_GOT64, R_GOTPCREL64, R_GOTPC64, R_PLTOFF64):
        return 8
    if rtype in (R_PC32, R_PLT32, R_32, R_32S, R_GOTPC32) or rtype in GOT_RELOCS:
        return 4
    return 0


def scan(data: bytes) -> dict:
    """What an object needs from a loader: relocation type names per section, undefined symbol
    names and section names (used by tests to prove every cached kernel kind is covered)."""
    obj = parse(data)
    types: set[str] = set()
    for rows in obj.relocs.values():
        for r in rows:
            types.add(RELOC_NAMES.get(r.type, f"R_X86_64_<{r.type}>"))
    undefined = {s.name for s in obj.symbols[1:] if s.shndx == SHN_UNDEF and s.name}
    return {"relocations": sorted(types), "undefined": sorted(undefined),
            "sections": [s.name for s in obj.sections[1:]]}  # fmt: skip


# ----------------------------------------------------------------------------- process memory

_libc = ctypes.CDLL(None, use_errno=True)
_mmap = _libc.mmap
_mmap.restype = ctypes.c_void_p
_mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                  ctypes.c_long]  # fmt: skip
_mprotect = _libc.mprotect
_mprotect.restype = ctypes.c_int
_mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_munmap = _libc.munmap
_munmap.restype = ctypes.c_int
_munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value

_sym_lock = threading.Lock()
_sym_cache: dict[str, int | None] = {}


def process_symbol(name: str) -> int | None:
    """Address of `name` in the process's global symbol scope (dlsym), or None.

    The same scope MCJIT's default resolver searches: the executable and the libraries it
    links (libc, libm, libpthread) plus anything loaded RTLD_GLOBAL."""
    with _sym_lock:
        if name in _sym_cache:
            return _sym_cache[name]
        try:
            addr = ctypes.cast(_libc[name], ctypes.c_void_p).value
        except AttributeError:
            addr = None
        _sym_cache[name] = addr
        return addr


def _align(x: int, a: int) -> int:
    return -(-x // a) * a


@dataclass(frozen=True, eq=False)
class LoadedObject:
    """An object mapped into the process: `base`/`size` of the mapping and its global symbols."""

    base: int
    size: int
    symbols: dict[str, int]
    code: tuple[int, int]  # (start, bytes) of the read+exec range

    def address(self, name: str) -> int:
        try:
            return self.symbols[name]
        except KeyError:
            raise ElfFormatError(f"symbol {name!r} is not defined by the object") from None


@dataclass
class _Plan:
    """Where every loaded section, GOT slot and PLT stub goes (offsets from the base)."""

    sec_off: dict[int, int] = field(default_factory=dict)
    got: dict[int, int] = field(default_factory=dict)  # symbol index -> slot offset
    plt: dict[int, int] = field(default_factory=dict)  # symbol index -> stub offset
    need_got: bool = False  # the GOT base is referenced even if it holds no slot
    got_base: int = 0
    groups: list[tuple[int, int, int]] = field(default_factory=list)  # (start, end, prot)
    size: int = 0


def _loadable(obj: ElfObject) -> list[Section]:
    """SHF_ALLOC sections that go into memory; refuses constructors and TLS."""
    out = []
    for s in obj.sections:
        if s.type in INIT_SECTION_TYPES or s.name.startswith(INIT_SECTION_NAMES):
            raise ElfUnsupportedError(f"{s.name}: load-time constructors are not supported")
        if not s.flags & SHF_ALLOC:
            continue
        if s.flags & SHF_TLS:
            raise ElfUnsupportedError(f"{s.name}: thread-local storage is not supported")
        if s.flags & SHF_WRITE and s.flags & SHF_EXECINSTR:
            raise ElfUnsupportedError(f"{s.name}: writable code (W^X)")
        if s.type == SHT_X86_64_UNWIND or s.name == ".eh_frame":
            continue  # unwind tables: nothing unwinds through kernels
        if s.type not in (SHT_PROGBITS, SHT_NOBITS):
            raise ElfUnsupportedError(f"{s.name}: allocated section of type {s.type:#x}")
        out.append(s)
    return out


def _plan(obj: ElfObject, loaded: list[Section]) -> _Plan:
    p = _Plan()
    loaded_idx = {s.index for s in loaded}
    for shndx, rows in obj.relocs.items():
        if shndx not in loaded_idx:
            continue
        for r in rows:
            sym = obj.symbols[r.sym]
            if r.type in GOT_BASE_RELOCS or (sym.name == GOT_SYMBOL and sym.shndx == SHN_UNDEF):
                p.need_got = True
            if r.type in GOT_SLOT_RELOCS:
                p.got.setdefault(r.sym, len(p.got) * 8)
            elif r.type == R_PLT32 and obj.symbols[r.sym].shndx == SHN_UNDEF:
                p.plt.setdefault(r.sym, len(p.plt) * PLT_STUB)
    groups = (
        ([s for s in loaded if s.flags & SHF_EXECINSTR], mmap.PROT_READ | mmap.PROT_EXEC),
        ([s for s in loaded if not s.flags & (SHF_EXECINSTR | SHF_WRITE)], mmap.PROT_READ),
        ([s for s in loaded if s.flags & SHF_WRITE and not s.flags & SHF_EXECINSTR],
         mmap.PROT_READ | mmap.PROT_WRITE),
    )  # fmt: skip
    cur = 0
    for g, (secs, prot) in enumerate(groups):
        start = cur
        for s in secs:
            cur = _align(cur, s.align)
            p.sec_off[s.index] = cur
            cur += s.size
        if g == 0 and p.plt:
            cur = _align(cur, PLT_STUB)
            p.plt = {k: cur + v for k, v in p.plt.items()}
            cur += PLT_STUB * len(p.plt)
        if g == 1 and (p.got or p.need_got):
            cur = _align(cur, 8)
            p.got_base = cur
            p.got = {k: cur + v for k, v in p.got.items()}
            cur += 8 * max(1, len(p.got))
        cur = _align(cur, PAGE)
        if cur > start:
            p.groups.append((start, cur, prot))
    p.size = max(cur, PAGE)
    return p


def validate(data: bytes, entry: str | None = None) -> ElfObject:
    """`parse`, plus: `entry` (if given) is a global function defined in an allocated code
    section. The check a caller runs before handing bytes to any loader (MCJIT included)."""
    obj = parse(data)
    if entry is None:
        return obj
    code = {s.index for s in obj.sections if s.flags & SHF_EXECINSTR and s.flags & SHF_ALLOC}
    for sym in obj.symbols:
        if (sym.name == entry and sym.shndx in code and sym.type == STT_FUNC
                and sym.bind in (STB_GLOBAL, STB_WEAK)):  # fmt: skip
            return obj
    raise ElfFormatError(f"no global function {entry!r} in the object's code sections")


def _fits(v: int, signed: bool, bits: int = 32) -> bool:
    if signed:
        return -(1 << (bits - 1)) <= v < (1 << (bits - 1))
    return 0 <= v < (1 << bits)


def load(data: bytes, resolve: Callable[[str], int | None] | None = None,
         entry: str | None = None) -> LoadedObject:  # fmt: skip
    """Map, relocate and protect one object; returns its global symbols' addresses.

    `resolve(name)` finds undefined symbols (None: not found); the process scope (`dlsym`) is
    tried after it. `entry`, when given, must be a global function defined in a loaded code
    section (checked before anything is mapped). Raises ElfFormatError / ElfUnsupportedError
    before anything executes; on an error after the mapping exists, the mapping is released.
    """
    obj = validate(data, entry)
    loaded = _loadable(obj)
    plan = _plan(obj, loaded)
    base = _mmap(None, plan.size, mmap.PROT_READ | mmap.PROT_WRITE,
                 mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)  # fmt: skip
    if base in (None, _MAP_FAILED):
        raise MemoryError(f"mmap of {plan.size} bytes failed (errno {ctypes.get_errno()})")
    try:
        image, symbols = _link(obj, loaded, plan, base, resolve)
        ctypes.memmove(base, (ctypes.c_char * len(image)).from_buffer(image), len(image))
        code = (base, 0)
        for start, end, prot in plan.groups:
            if _mprotect(base + start, end - start, prot) != 0:
                raise OSError(ctypes.get_errno(), "mprotect failed on the kernel image")
            if prot & mmap.PROT_EXEC:
                code = (base + start, end - start)
    except BaseException:
        _munmap(base, plan.size)
        raise
    return LoadedObject(base, plan.size, symbols, code)


Resolver = Callable[[str], int | None]


def _link(obj: ElfObject, loaded: list[Section], plan: _Plan, base: int,
          resolve: Resolver | None) -> tuple[bytearray, dict[str, int]]:  # fmt: skip
    """The relocated image (as bytes at `base`) and the global symbols it defines."""
    image = bytearray(plan.size)
    for s in loaded:
        if s.type == SHT_PROGBITS:
            off = plan.sec_off[s.index]
            image[off : off + s.size] = obj.section_bytes(s)
    addrs: list[int | None] = []
    exports: dict[str, int] = {}
    for i, sym in enumerate(obj.symbols):
        addrs.append(_symbol_address(obj, plan, base, sym, i, resolve))
        if (
            sym.bind in (STB_GLOBAL, STB_WEAK)
            and sym.name
            and sym.shndx != SHN_UNDEF
            and addrs[-1] is not None
        ):
            exports[sym.name] = addrs[-1]
    for slot_sym, off in plan.got.items():
        struct.pack_into("<Q", image, off, _need(obj, addrs, slot_sym))
    for stub_sym, off in plan.plt.items():
        image[off : off + 6] = b"\xff\x25\x00\x00\x00\x00"  # jmp *0(%rip)
        struct.pack_into("<Q", image, off + 6, _need(obj, addrs, stub_sym))
    for shndx, rows in obj.relocs.items():
        if shndx not in plan.sec_off:
            continue  # relocations of a section that is not loaded (.eh_frame, debug info)
        sec = obj.sections[shndx]
        if sec.type == SHT_NOBITS and rows:
            raise ElfFormatError(f"{sec.name}: relocations against a NOBITS section")
        for r in rows:
            _apply(obj, plan, base, image, plan.sec_off[shndx] + r.offset, r, addrs)
    return image, exports


def _symbol_address(obj: ElfObject, plan: _Plan, base: int, sym: Symbol, i: int,
                    resolve: Callable[[str], int | None] | None) -> int | None:  # fmt: skip
    """Load address of symbol `i`; None for the null symbol and unloaded sections; raises for
    an undefined symbol nobody defines."""
    if i == 0 or sym.type == STT_FILE:
        return None
    if sym.type == STT_TLS:
        raise ElfUnsupportedError(f"TLS symbol {sym.name!r}")
    if sym.shndx == SHN_ABS:
        return sym.value
    if sym.shndx == SHN_COMMON:
        raise ElfUnsupportedError(f"COMMON symbol {sym.name!r}")
    if sym.shndx == SHN_UNDEF and sym.name == GOT_SYMBOL:
        return base + plan.got_base
    if sym.shndx == SHN_UNDEF:
        addr = resolve(sym.name) if resolve is not None else None
        if not addr:
            addr = process_symbol(sym.name)
        if not addr:
            if sym.bind == STB_WEAK:
                return 0
            raise ElfUnresolvedSymbolError(sym.name)
        return addr
    if sym.shndx not in plan.sec_off:
        return None  # defined in a section that is not loaded: only an error if referenced
    sec = obj.sections[sym.shndx]
    if sym.type != STT_SECTION and sym.value + sym.size > sec.size:
        raise ElfFormatError(f"symbol {sym.name!r} extends beyond {sec.name}")
    return base + plan.sec_off[sym.shndx] + sym.value


def _need(obj: ElfObject, addrs: list[int | None], i: int) -> int:
    a = addrs[i]
    if a is None:
        sym = obj.symbols[i]
        raise ElfFormatError(f"relocation against symbol {i} ({sym.name!r}) that is not loaded")
    return a


def _apply(obj: ElfObject, plan: _Plan, base: int, image: bytearray, off: int, r: Rela,
           addrs: list[int | None]) -> None:  # fmt: skip
    """Patch one relocation at image offset `off` (the place P is base + off)."""
    t = r.type
    if t == R_NONE:
        return
    if t not in RELOC_NAMES:
        raise ElfUnsupportedError(f"relocation type {t} at {off:#x} is not implemented")
    place = base + off
    got = base + plan.got_base
    if t == R_GOT64:
        struct.pack_into("<q", image, off, plan.got[r.sym] - plan.got_base + r.addend)
        return
    if t == R_GOTPCREL64:
        struct.pack_into("<q", image, off, base + plan.got[r.sym] + r.addend - place)
        return
    if t == R_GOTPC64:
        struct.pack_into("<q", image, off, got + r.addend - place)
        return
    if t == R_GOTPC32:
        v = got + r.addend - place
        if not _fits(v, True):
            raise ElfUnsupportedError("GOTPC32 distance does not fit 32 bits")
        struct.pack_into("<i", image, off, v)
        return
    if t in GOT_RELOCS:
        # GOTPCRELX / REX_GOTPCRELX allow relaxing to a direct reference; going through the
        # GOT is always correct, so nothing is rewritten.
        v = base + plan.got[r.sym] + r.addend - place
        struct.pack_into("<i", image, off, v)  # the GOT is inside the mapping: always fits
        return
    s = _need(obj, addrs, r.sym)
    if t == R_64:
        struct.pack_into("<Q", image, off, (s + r.addend) & 0xFFFFFFFFFFFFFFFF)
    elif t == R_PC64:
        struct.pack_into("<q", image, off, s + r.addend - place)
    elif t in (R_GOTOFF64, R_PLTOFF64):  # PLTOFF64: a 64-bit offset reaches the symbol itself
        struct.pack_into("<q", image, off, s + r.addend - got)
    elif t in (R_PC32, R_PLT32):
        v = s + r.addend - place
        if not _fits(v, True) and t == R_PLT32 and r.sym in plan.plt:
            v = base + plan.plt[r.sym] + r.addend - place  # call through the in-image stub
        if not _fits(v, True):
            name = obj.symbols[r.sym].name
            raise ElfUnsupportedError(f"{RELOC_NAMES[t]} to {name!r}: {v:#x} does not fit")
        struct.pack_into("<i", image, off, v)
    elif t in (R_32, R_32S):
        v = s + r.addend
        if not _fits(v, t == R_32S):
            raise ElfUnsupportedError(f"{RELOC_NAMES[t]}: {v:#x} does not fit 32 bits")
        struct.pack_into("<i" if t == R_32S else "<I", image, off, v)


def undefined_names(obj: ElfObject) -> list[str]:
    """Undefined non-weak symbols (weak ones may stay 0): what some library must define."""
    return [s.name for s in obj.symbols[1:]
            if s.shndx == SHN_UNDEF and s.name and s.bind != STB_WEAK
            and s.name != GOT_SYMBOL]  # fmt: skip
