"""Kernel cache: native code per kernel signature, in memory and on disk.

Memory level: a dict from the kernel signature (template kind, the frozen KernelIR itself,
device spec key, backend) to the CompiledKernel. Disk level: one file per signature under
``$LAZYMATH_CACHE_DIR`` (default ``~/.cache/lazymath`` or ``$XDG_CACHE_HOME/lazymath``) holding
the object code MCJIT produced plus named extra parts (the pickled ISA program), so a later
process loads it instead of running the template, LLVM or even importing llvmlite.binding.

The file name is the sha256 of the signature's repr plus everything the machine code depends
on (`jit.host_key()`: llvmlite version and build, host CPU model and flags, core count), the
lazymath version and a hash of the backend's own source (a code change invalidates old files
instead of loading stale code).

File layout (format 2): MAGIC, u32 header length, u32 payload length, JSON header, payload,
sha256 of everything before it. The payload is the object code followed by the parts the
header's ``"parts"`` list names with their lengths.

Trust: a cache file is machine code that gets executed. The directory is created 0700 and must
be a directory owned by this user that nobody else can write (not world-writable, not writable
by a group other than the user's own); otherwise the disk level is off for the process, with a
warning that names the directory and the reason. Files are written to a private temp file and
renamed into place (atomic). A load opens the entry without following symlinks and without
blocking (a FIFO cannot hang it), and uses it only if it is a regular file owned by this user,
writable by nobody else and at most MAX_FILE_BYTES long; then it checks the magic, the header
(which repeats the expected key) and a sha256 of header + payload, and the program part is read
by `isa_codec` (data only, never pickle). Anything else -- truncated, corrupt, foreign, special
-- is counted in ``disk_rejected``, reported once per file with a warning saying why, removed
and recompiled, never executed. ``LAZYMATH_CACHE=0`` disables the disk level.
"""

from __future__ import annotations

import json
import os
import stat
import struct
import sys
import tempfile
import threading
from pathlib import Path
from typing import NamedTuple

from lazymath import settings
from lazymath._version import __version__

try:  # CPython's builtin SHA-256; `hashlib` would load OpenSSL's libcrypto (3.5 MiB of RSS)
    from _sha2 import sha256 as _sha256  # Python >= 3.12
except ImportError:
    try:
        from _sha256 import sha256 as _sha256  # Python 3.11
    except ImportError:
        from hashlib import sha256 as _sha256

MAGIC = b"LMKCACHE"
FORMAT_VERSION = 3  # 3: the program part is isa_codec JSON (2 held a pickle)
MAX_FILE_BYTES = 256 << 20  # a kernel file is a few KiB to a few MiB
SUFFIX = ".lmk"

_lock = threading.RLock()
_memory: dict = {}
# elf_loads / mcjit_loads: how disk hits got into memory (elfload, or MCJIT as fallback/forced)
_stats = {"compiled": 0, "memory_hits": 0, "disk_hits": 0, "disk_writes": 0, "disk_rejected": 0,
          "disk_errors": 0, "elf_loads": 0, "mcjit_loads": 0, "memory_evictions": 0,
          "disk_evictions": 0}  # fmt: skip
_code_version: str | None = None
_dir_verdict: dict[str, str | None] = {}  # cache dir -> why it is refused (None: usable)
_warned: set = set()


def cache_dir() -> Path:
    d = settings.CACHE_DIR.get()
    if d:
        return Path(d)
    xdg = settings.platform_cache_root()
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "lazymath"


def disk_enabled() -> bool:
    return settings.CACHE.get()


def _warn(what: str, why: str) -> None:
    """One RuntimeWarning per (what, why) and process."""
    if (what, why) in _warned:
        return
    _warned.add((what, why))
    import warnings

    warnings.warn(f"lazymath kernel cache: {what}: {why}", RuntimeWarning, stacklevel=4)


def _untrusted(st: os.stat_result) -> str | None:
    """Why a file or directory with this stat must not be trusted (None: it may)."""
    uid = os.geteuid()
    if st.st_uid != uid:
        return f"owned by uid {st.st_uid}, not by this user (uid {uid})"
    mode = stat.S_IMODE(st.st_mode)
    if mode & stat.S_IWOTH:
        return f"writable by others (mode {mode:04o})"
    if mode & stat.S_IWGRP and st.st_gid != os.getegid():
        return f"writable by group {st.st_gid} (mode {mode:04o})"
    return None


def _check_dir(d: Path) -> str | None:
    """Create `d` (0700) if missing; why it cannot hold trusted kernels, or None."""
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:
        return "exists and is not a directory"
    except OSError as e:
        return f"cannot be created ({e.strerror or e})"
    try:
        st = os.stat(d)
    except OSError as e:
        return f"cannot be inspected ({e.strerror or e})"
    if not stat.S_ISDIR(st.st_mode):
        return "exists and is not a directory"
    why = _untrusted(st)
    if why is not None:
        return why
    if not os.access(d, os.W_OK | os.X_OK):
        return "is not writable"
    return None


def usable_dir(d: Path | None = None) -> Path | None:
    """The cache directory (`d`, else the one in force) if the disk level is on and the
    directory is trusted; None (with a warning once per directory and reason that says why)
    otherwise."""
    if not disk_enabled():
        return None
    d = cache_dir() if d is None else d
    why = _dir_verdict[str(d)] = _check_dir(d)  # checked on every use (a few stat calls)
    if why is not None:
        _warn(f"directory {d}", f"{why}; the disk cache is off")
        return None
    return d


def code_version() -> str:
    """Hash of the backend's source files: generated code depends on all of them."""
    global _code_version
    if _code_version is None:
        _code_version = sources_version(Path(__file__).resolve().parents[1], __version__)
    return _code_version


def sources_version(root: Path, version: str) -> str:
    """sha256 (16 hex digits) of the ``*.py`` files under `root` (relative names and bytes)
    and `version`; remembered in ``root/__pycache__`` (see below)."""
    sources = _py_files(root)
    stamp = _sources_stamp(sources, version)
    found = _stored_version(root, stamp)
    if found is not None:
        return found
    h = _sha256()
    for rel, _st in sources:
        h.update(rel.encode())
        h.update((root / rel).read_bytes())
    h.update(version.encode())
    found = h.hexdigest()[:16]
    _store_version(root, stamp, found)
    return found


# `code_version` reads and hashes every backend source (~35 files, 5-10 ms: every process that
# compiles or loads a kernel needs it for its first cache key). Like Python's bytecode, the
# result is kept next to the sources' bytecode, valid for their names, sizes and mtimes (ns)
# and the lazymath version (a stat of each file, ~1 ms); written only when Python writes
# bytecode (not under PYTHONDONTWRITEBYTECODE / -B); an unreadable or stale file is ignored.
_VERSION_FILE = f"code-version.{sys.implementation.cache_tag}.txt"


def _py_files(root: Path) -> list[tuple[str, os.stat_result]]:
    """(name relative to `root`, '/'-separated; its stat) of every ``*.py`` file below `root`,
    in the order `sorted(root.rglob("*.py"))` gives (by path components). An iterative
    os.scandir walk: ~0.3 ms for the backend's 64 files where rglob, relative_to and
    Path.stat took ~2.3 ms of every process's first kernel."""
    found: list[tuple[tuple[str, ...], os.stat_result]] = []
    todo = [(str(root), ())]
    while todo:
        d, parts = todo.pop()
        with os.scandir(d) as entries:
            for e in entries:
                if e.is_dir(follow_symlinks=False):
                    todo.append((e.path, (*parts, e.name)))
                elif e.name.endswith(".py") and e.is_file():
                    found.append(((*parts, e.name), e.stat()))
    found.sort(key=lambda f: f[0])
    return [("/".join(parts), st) for parts, st in found]


def _sources_stamp(sources: list, version: str) -> str:
    h = _sha256()
    h.update(version.encode())
    for rel, st in sources:
        h.update(f"{rel}:{st.st_size}:{st.st_mtime_ns};".encode())
    return h.hexdigest()


def _stored_version(root: Path, stamp: str) -> str | None:
    try:
        text = (root / "__pycache__" / _VERSION_FILE).read_text()
    except (OSError, ValueError):
        return None
    have, _, version = text.strip().partition(" ")
    ok = have == stamp and len(version) == 16 and all(c in "0123456789abcdef" for c in version)
    return version if ok else None


def _store_version(root: Path, stamp: str, version: str) -> None:
    if sys.dont_write_bytecode:
        return
    d = root / "__pycache__"
    try:
        d.mkdir(exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".code-version-")
        with os.fdopen(fd, "w") as f:
            f.write(f"{stamp} {version}\n")
        os.replace(tmp, d / _VERSION_FILE)
    except OSError:
        pass


def disk_key(signature_repr: str, host_key: tuple) -> str:
    h = _sha256()
    h.update(repr((FORMAT_VERSION, signature_repr, host_key, code_version())).encode())
    return h.hexdigest()


# ----------------------------------------------------------------------------- memory level


def memory_get(sig):
    with _lock:
        k = _memory.pop(sig, None)
        if k is not None:
            _memory[sig] = k  # most recently used last
            _stats["memory_hits"] += 1
        return k


def memory_put(sig, kernel) -> None:
    """Keep `kernel`; the least recently used ones beyond LAZYMATH_KERNEL_CACHE_LIMIT are
    dropped (their code is freed once no cached program uses them either)."""
    with _lock:
        _memory.pop(sig, None)
        _memory[sig] = kernel
        limit = settings.KERNEL_CACHE_LIMIT.get()
        while len(_memory) > limit:
            del _memory[next(iter(_memory))]
            _stats["memory_evictions"] += 1


def count(stat: str) -> None:
    with _lock:
        _stats[stat] += 1


# ----------------------------------------------------------------------------- disk level


def _path(key: str) -> Path:
    return cache_dir() / (key + SUFFIX)


class CacheEntry(NamedTuple):
    """One valid disk file: its JSON header, the object code and the named extra parts."""

    header: dict
    obj: bytes
    parts: dict[str, bytes]


def _read_trusted(p: Path) -> bytes | str | None:
    """The bytes of `p` if it is a trusted regular file; else why not (str); None if missing.

    O_NOFOLLOW: a symlink (e.g. to /dev/zero) is refused, not followed. O_NONBLOCK: opening a
    FIFO returns at once instead of waiting for a writer. The type, owner, mode and size are
    checked on the open descriptor before a single byte is read, and no more than the size
    fstat reported is read."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(p, flags | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as e:
        if os.path.islink(p):
            return "is a symbolic link"
        return f"cannot be opened ({e.strerror or e})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = ("a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO"
                    if stat.S_ISFIFO(st.st_mode) else "a device or socket")  # fmt: skip
            return f"is {kind}, not a regular file"
        why = _untrusted(st)
        if why is not None:
            return why
        if st.st_size > MAX_FILE_BYTES:
            return f"is {st.st_size} bytes, more than the {MAX_FILE_BYTES} a kernel file may be"
        chunks, left = [], st.st_size
        while left > 0:
            b = os.read(fd, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        return b"".join(chunks)
    finally:
        os.close(fd)


def disk_load(key: str) -> CacheEntry | None:
    """The entry if a valid file exists for `key`; None (and counted) otherwise."""
    if usable_dir() is None:
        return None
    p = _path(key)
    try:
        data = _read_trusted(p)
    except OSError as e:
        count("disk_errors")
        _warn(f"file {p}", f"cannot be read ({e.strerror or e})")
        return None
    if data is None:
        return None
    if isinstance(data, str):
        reject(key, data)
        return None
    parsed = _parse(data, key)
    if parsed is None:
        reject(key, "bad magic, length, checksum or header (truncated, corrupt or foreign)")
        return None
    try:
        os.utime(p)  # the mtime orders files for least-recently-used eviction
    except OSError:
        pass
    return parsed


def reject(key: str, why: str = "its contents cannot be used") -> None:
    """Count, report and delete the file of `key` (its contents cannot be used; the caller
    recompiles and stores a fresh one)."""
    count("disk_rejected")
    p = _path(key)
    _warn(f"file {p}", f"{why}; not used, recompiling")
    try:
        if p.is_dir() and not p.is_symlink():
            p.rmdir()
        else:
            p.unlink()
    except OSError:
        pass


def note_unstorable(name: str, why: str) -> None:
    """A kernel that cannot be written to disk (its program is outside the cache encoding)."""
    count("disk_errors")
    _warn(f"kernel {name}", f"not stored on disk: {why}")


def _parse(data: bytes, key: str) -> CacheEntry | None:
    """Validate magic, lengths, checksum and that the header names `key`."""
    n_magic = len(MAGIC)
    if len(data) < n_magic + 8 + 32 or data[:n_magic] != MAGIC:
        return None
    hlen, plen = struct.unpack_from("<II", data, n_magic)
    start = n_magic + 8
    if len(data) != start + hlen + plen + 32:
        return None
    body = data[start : start + hlen + plen]
    if _sha256(data[:start] + body).digest() != data[start + hlen + plen :]:
        return None
    try:
        header = json.loads(body[:hlen].decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(header, dict) or header.get("key") != key:
        return None
    if header.get("format") != FORMAT_VERSION:
        return None
    payload = body[hlen:]
    spec = header.get("parts", [])
    try:
        sizes = [(str(n), int(k)) for n, k in spec]
    except (TypeError, ValueError):
        return None
    extra = sum(k for _, k in sizes)
    if (
        any(k < 0 for _, k in sizes)
        or extra > len(payload)
        or len({n for n, _ in sizes}) != len(sizes)
    ):
        return None
    obj_len = len(payload) - extra
    parts, at = {}, obj_len
    for name, k in sizes:
        parts[name] = payload[at : at + k]
        at += k
    return CacheEntry(header, payload[:obj_len], parts)


def disk_store(key: str, header: dict, obj: bytes, parts: dict[str, bytes] | None = None,
               directory: Path | None = None) -> None:  # fmt: skip
    """Write atomically: private temp file in the cache dir, then os.replace. `parts` are
    extra named byte strings stored after the object code. `directory`: the cache directory
    that was in force when the kernel was requested -- a background tier-up finishes later,
    when LAZYMATH_CACHE_DIR may name another directory (a test's, a user's switch), and its
    file belongs where the request looked for it, not there."""
    d = usable_dir(directory)
    if d is None:
        return
    parts = parts or {}
    try:
        meta = {**header, "key": key, "format": FORMAT_VERSION,
                "parts": [[n, len(b)] for n, b in parts.items()]}  # fmt: skip
        hb = json.dumps(meta).encode()
        payload = obj + b"".join(parts.values())
        head = MAGIC + struct.pack("<II", len(hb), len(payload))
        digest = _sha256(head + hb + payload).digest()
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=SUFFIX, dir=d)  # mode 0600
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(head + hb + payload + digest)
            os.replace(tmp, d / (key + SUFFIX))
        except IsADirectoryError:
            os.unlink(tmp)
            reject(key, "is a directory, not a regular file")
            return
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        count("disk_writes")
        _evict(d)
    except OSError as e:
        count("disk_errors")
        _warn(f"directory {d}", f"cannot write a kernel file ({e.strerror or e})")


def _evict(d: Path) -> None:
    """Delete the least recently used kernel files until the directory holds at most
    LAZYMATH_DISK_CACHE_LIMIT bytes (a file is used when it is written or loaded)."""
    limit = settings.DISK_CACHE_LIMIT.get()
    files = []
    total = 0
    with os.scandir(d) as it:
        for e in it:
            if e.name.endswith(SUFFIX) and not e.name.startswith("."):
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                files.append((st.st_mtime_ns, e.name, st.st_size))
                total += st.st_size
    if total <= limit:
        return
    files.sort()
    for _mtime, name, size in files[:-1]:  # never the file just written
        try:
            os.unlink(d / name)
        except OSError:
            continue
        count("disk_evictions")
        total -= size
        if total <= limit:
            return


def disk_files() -> list[Path]:
    d = cache_dir()
    if not d.is_dir() or d in _refused():
        return []
    return sorted(p for p in d.iterdir() if p.suffix == SUFFIX and not p.name.startswith("."))


def _refused() -> set:
    return {Path(k) for k, why in _dir_verdict.items() if why is not None}


# ----------------------------------------------------------------------------- public


def cache_info() -> dict:
    """Counters and sizes of both cache levels (this process's counters)."""
    files = disk_files() if disk_enabled() else []
    size = 0
    for p in files:
        try:
            size += p.stat().st_size
        except OSError:
            pass
    with _lock:
        return {
            **_stats,
            "memory_entries": len(_memory),
            "disk_enabled": disk_enabled(),
            "disk_dir": str(cache_dir()),
            "disk_files": len(files),
            "disk_bytes": size,
        }


def clear_cache(memory: bool = True, disk: bool = True) -> None:
    """Empty the memory level and delete this cache directory's kernel files."""
    with _lock:
        if memory:
            _memory.clear()  # kernels no cached program uses free their code now
        if disk:
            for p in disk_files():
                try:
                    p.unlink()
                except OSError:
                    pass


def reset_stats() -> None:
    with _lock:
        for k in _stats:
            _stats[k] = 0
