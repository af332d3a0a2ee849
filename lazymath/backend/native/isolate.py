"""Crash isolation for the LLVM compiler: an abort in LLVM costs a warning, not the process.

LLVM reports internal errors with abort() (assertions, "VPlan cost model and legacy cost model
disagreed", ...) and can loop forever on rare inputs; neither can be caught in the process that
runs it. So, by default (``server``), every compile runs in a persistent compile-server process
(below): an abort there, even on the very first compile of a fresh process, costs a restarted
server and a retry with the vectorizers off, never the user's process.

The in-process compile (``auto``, and server mode where no server can start) has a first-crash
window, closed for the next process:

- Every in-process compile leaves a marker ``.<key>.compiling`` (holding the pid) in the kernel
  cache directory while LLVM runs, and removes it afterwards. A marker whose process is gone
  means that process died inside LLVM on this kernel.
- A kernel with such a marker (or every kernel with ``LAZYMATH_COMPILE_ISOLATE=1``) is compiled
  in a child process (``python -c ... workers.child_main``) that returns the object code; the
  parent loads it like a disk-cache hit (`jit.load_cached`: elfload or MCJIT, no optimizer in
  the parent). If the child dies or exceeds LAZYMATH_COMPILE_TIMEOUT, the kernel is compiled
  again in a child with the vectorizers off; if that fails too, the kernel runs on the numpy
  interpreter (exact, slow). Each step is reported with a RuntimeWarning saying what happened.
- A kernel compiled in a child is stored in the disk cache as usual, and the marker removed:
  later processes load it without compiling.

``LAZYMATH_COMPILE_ISOLATE``: ``server`` (default: every compile in the compile server),
``auto`` (in-process; a child after a crash), ``1`` (always a child), ``0`` (never; a crash in
LLVM ends the process).
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import warnings
from contextlib import contextmanager
from pathlib import Path

from lazymath import settings
from lazymath.backend.native import kernel_cache


def mode() -> str:
    """ "server", "auto", "always" or "off" (LAZYMATH_COMPILE_ISOLATE); "auto" in server mode
    when no compile server can run in this process (`ServerUnavailable`)."""
    m = settings.COMPILE_ISOLATE.get()
    return "auto" if m == "server" and _unavailable else m


def _marker(key: str) -> Path | None:
    d = kernel_cache.usable_dir()
    return None if d is None else d / f".{key}.compiling"


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # a marker of ours that survived: a previous process with our pid
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def tier0_marker(key: str) -> str:
    """The mark of `key`'s tier-0 compile (it may run beside the optimizing one)."""
    return f"{key}.t0"


def crashed_before(key: str) -> bool:
    """Whether a process died while compiling `key` (either tier's marker is left, its pid is
    gone)."""
    return _crashed(key) or _crashed(tier0_marker(key))


def _crashed(key: str) -> bool:
    p = _marker(key)
    if p is None:
        return False
    try:
        st = os.lstat(p)
        if not (st.st_size < 64 and st.st_uid == os.geteuid()):
            return True
        pid = int(p.read_text().strip() or 0)
    except FileNotFoundError:
        return False
    except (OSError, ValueError):
        return True
    return not _alive(pid)


@contextmanager
def compiling(key: str):
    """Marks `key` as being compiled by this process while the body runs."""
    p = _marker(key)
    if p is not None:
        try:
            p.write_text(str(os.getpid()))
        except OSError:
            p = None
    try:
        yield
    finally:
        if p is not None:
            try:
                p.unlink()
            except OSError:
                pass


def clear(key: str) -> None:
    for k in (key, tier0_marker(key)):
        p = _marker(k)
        if p is not None:
            try:
                p.unlink()
            except OSError:
                pass


def _warn(msg: str) -> None:
    warnings.warn(f"lazymath: {msg}", RuntimeWarning, stacklevel=4)


def _describe(rc: int | None) -> str:
    if rc is None:
        return "did not finish in time"
    if rc < 0:
        try:
            return f"died of {signal.Signals(-rc).name}"
        except ValueError:
            return f"died of signal {-rc}"
    return f"exited with status {rc}"


def compile_in_child(text: str, module_name: str, level: int, why: str,
                     timeout: float) -> bytes | None:  # fmt: skip
    """Object code for `text` compiled in a child process (`workers.child_main`: vectorizers
    on, then off, each within `timeout` seconds); None if both attempts failed (the caller
    falls back to the interpreter). `why` is said in the warnings."""
    if mode() != "always":
        _warn(f"compiling kernel {module_name} in a separate process: {why}")
    first = ""
    for vectorize in (True, False):
        payload = json.dumps({"text": text, "module": module_name, "level": level,
                              "vectorize": vectorize}).encode()  # fmt: skip
        rc: int | None
        try:
            out = subprocess.run(
                [sys.executable, "-c", "from lazymath.backend.native.workers import child_main; "
                 "child_main()"],
                input=payload, capture_output=True, timeout=timeout,
                env=settings.child_environment(LAZYMATH_CACHE="0"),
            )  # fmt: skip
            rc = out.returncode
        except subprocess.TimeoutExpired:
            rc, out = None, None
        except OSError as e:
            _warn(f"cannot start a compiler process for kernel {module_name} ({e})")
            return None
        if rc == 0 and out is not None and out.stdout:
            if not vectorize:
                _warn(f"kernel {module_name}: compiled with the vectorizers off in a separate "
                      f"process ({why}; the first attempt {first})")  # fmt: skip
            return out.stdout
        first = _describe(rc)
        tail = (out.stderr.decode(errors="replace").strip().splitlines() or [""])[-1] if out \
            else ""  # fmt: skip
        if vectorize:
            _warn(
                f"LLVM {first} compiling kernel {module_name} in a separate process ({why})"
                + (f": {tail[:300]}" if tail else "")
                + "; retrying with the vectorizers off"
            )
        else:
            _warn(f"LLVM {first} compiling kernel {module_name} even with the vectorizers off"
                  + (f": {tail[:300]}" if tail else "") + "; this kernel runs on the numpy "
                  "interpreter (correct, slow)")  # fmt: skip
    return None


# ----------------------------------------------------------------------------- the compile server
#
# Server mode (the default): every LLVM compile of the workers runs in one persistent
# compile-server process per user process, so even the first LLVM abort of a fresh process
# costs a restarted server and a retry, never the user's process. The server compiles with
# the same `workers.Compiler` (IR text in, object code out) on as many threads as the parent
# has compiles in flight (each thread its own LLVM context, as in the parent), and never
# touches the disk cache; the parent links the object like a disk-cache hit.
#
# Lazy and asynchronous: the server is started by the first compile's `workers.warm` (the
# first disk-cache miss), before that kernel is lowered, and boots (Python, llvmlite, its
# target machine: ~80 ms on a 2-core Zen 4) while the parent lowers; a process that never
# compiles never starts one. One process, not one per compile thread: n boots at once on a
# small machine took the cores the parent's lowering needed (+190 ms on the first realize).
#
# Requests are multiplexed over one pipe pair: u64 id + u64 length + JSON in; u64 id, a
# status byte (b"O" object code, b"E" a compile error) and u64 length + payload out. A
# reader thread in the parent hands each answer to the compile thread waiting for it.
#
# A hung compile (LLVM looping) is a process here, so it can be killed: a request without an
# answer within LAZYMATH_COMPILE_TIMEOUT seconds kills the server, which is restarted and that
# kernel compiled again with the vectorizers off; the other kernels it was compiling are
# simply asked again. When LLVM kills the server, every kernel it was compiling is compiled
# again with the vectorizers off (which of them aborted cannot be told; the innocent ones
# lose nothing but vectorization, and only in a process where LLVM crashed).
#
# The server boots with `python -S` and the parent's sys.path, without `lazymath/__init__`
# (`_BOOT`: a bare package object, then only settings, backend.native.{jit,host,workers}
# and backend.npu.cancel): no site, no numpy, no ml_dtypes, no tensor layer. It ignores
# SIGINT: a Ctrl-C in a terminal goes to the whole process group and must interrupt the user's code,
# not kill its compiler (a server dying of SIGINT anyway is restarted without blame).
#
# If no server can be started (no `sys.executable`, llvmlite not importable without site,
# ...), the process compiles in-process as in `auto` mode, with one warning.


class CompilerCrashed(RuntimeError):
    """LLVM killed (or hung) the compile server on a kernel twice (vectorizers on, then off):
    the caller runs that kernel on the interpreter."""


class ServerUnavailable(RuntimeError):
    """No compile server could be started or booted: this process compiles in-process."""


class _Died(Exception):
    """The server died (`rc`: its exit status; None: killed here for not answering in time)
    with this request in flight."""

    def __init__(self, rc: int | None, tail: str) -> None:
        super().__init__(rc, tail)
        self.rc, self.tail = rc, tail


class _Lost(Exception):
    """The server went away for a reason that is not this request's (it was killed for
    another kernel's hang, or died of SIGINT): ask again unchanged."""


_READY = b"R"  # the server's first byte: booted, its compiler for the target built
_ANSWER = struct.Struct("<QcQ")  # request id, status, payload length
BOOT_TIMEOUT = 60.0  # seconds a server may take to boot (a loaded 2-core CI machine: ~1 s)

# `python -S -c _BOOT <lazymath package dir> <target> <sys.path as JSON>`: the server imports
# only what it compiles with (see above); `lazymath` is a bare package over the same directory
_BOOT = (
    "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "import json, sys, types; sys.path[:] = json.loads(sys.argv[3]); "
    "p = types.ModuleType('lazymath'); p.__path__ = [sys.argv[1]]; "
    "sys.modules['lazymath'] = p; from lazymath.backend.native.workers import server_main; "
    "server_main(sys.argv[2])"
)


class _Slot:
    """One request's answer, filled in by the reader thread."""

    __slots__ = ("done", "status", "payload", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.status = b""
        self.payload = b""
        self.error: Exception | None = None


class _Server:
    """The compile-server process, its pipes and the reader thread that dispatches answers."""

    def __init__(self, target: str = "") -> None:
        self.pid = os.getpid()
        self.err = tempfile.TemporaryFile()  # its stderr: LLVM's last words if it dies
        pkg = str(Path(__file__).resolve().parents[2])
        paths = json.dumps([p for p in sys.path if isinstance(p, str)])
        if not sys.executable:
            raise ServerUnavailable("sys.executable is not set (an embedded interpreter)")
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-S", "-c", _BOOT, pkg, target, paths],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, bufsize=0,
                env=settings.child_environment(LAZYMATH_CACHE="0"),
            )  # fmt: skip
        except OSError as e:
            self.err.close()
            raise ServerUnavailable(f"cannot start it: {e}") from None
        self.ready = threading.Event()  # set once it booted, or died (then `dead` is set)
        self.booted = False
        self.dead: _Died | None = None
        self.killed_for: int | None = None  # the request whose hang made us kill it
        self.lock = threading.Lock()  # pending, next_id, dead, killed_for
        self.write_lock = threading.Lock()
        self.pending: dict[int, _Slot] = {}
        self.next_id = 0
        self.reader = threading.Thread(target=self._read, name="lazymath-compile-server",
                                       daemon=True)  # fmt: skip
        self.reader.start()
        with _servers_lock:
            _servers.append(self)

    def _read(self) -> None:
        fd = self.proc.stdout.fileno()
        try:
            if _read_exact(fd, 1) != _READY:
                raise ValueError("compile server: bad greeting")
            self.booted = True
            self.ready.set()
            while True:
                rid, status, n = _ANSWER.unpack(_read_exact(fd, _ANSWER.size))
                payload = _read_exact(fd, n)
                with self.lock:
                    slot = self.pending.pop(rid, None)
                if slot is not None:
                    slot.status, slot.payload = status, payload
                    slot.done.set()
        except (OSError, EOFError, ValueError, struct.error):
            pass
        try:
            self.proc.wait(timeout=5)  # it is dying: its status and last words
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        with self.lock:
            self.dead = _Died(self.proc.returncode, self._tail())
            pending, self.pending = self.pending, {}
            killed_for = self.killed_for
        blameless = killed_for is not None or self.proc.returncode == -signal.SIGINT
        for slot in pending.values():
            slot.error = _Lost() if blameless else self.dead
            slot.done.set()
        self.ready.set()
        self._close_files()

    def request(self, req: dict, timeout: float) -> bytes:
        """The object code for `req`; RuntimeError for a compile error the server reported
        (bad IR: what an in-process compile would raise); `_Died` if the server died with it
        in flight, or gave no answer within `timeout` seconds (then it is killed: rc None);
        `_Lost` if it went away for another reason; ServerUnavailable if it never booted."""
        if not self.ready.wait(BOOT_TIMEOUT):
            self.kill()
            raise ServerUnavailable(f"it did not boot within {BOOT_TIMEOUT:g} s")
        if not self.booted:
            d = self.dead
            if d is not None and d.rc == -signal.SIGINT:  # Ctrl-C before it ignored SIGINT
                raise _Lost()
            raise ServerUnavailable(f"it {_describe(d.rc if d else None)} while booting"
                                    + (f": {d.tail}" if d and d.tail else ""))  # fmt: skip
        data = json.dumps(req).encode()
        slot = _Slot()
        with self.lock:
            if self.dead is not None:
                raise _Lost()
            rid = self.next_id
            self.next_id += 1
            self.pending[rid] = slot
        try:
            with self.write_lock:
                _write_all(self.proc.stdin, struct.pack("<QQ", rid, len(data)) + data)
        except (OSError, EOFError, ValueError):
            pass  # it died: the reader fails the slot
        try:
            if not slot.done.wait(timeout if timeout > 0 else None):
                with self.lock:
                    hung = self.pending.pop(rid, None) is not None
                    if hung and self.dead is None:
                        self.killed_for = rid
                if hung:
                    self.kill()
                    raise _Died(None, "")
                slot.done.wait()  # answered (or failed) just now
        finally:
            with self.lock:
                self.pending.pop(rid, None)
        if slot.error is not None:
            raise slot.error
        if slot.status == b"O":
            return slot.payload
        raise RuntimeError(slot.payload.decode(errors="replace"))

    def _tail(self) -> str:
        try:
            self.err.seek(0)
            lines = self.err.read().decode(errors="replace").strip().splitlines()
        except (OSError, ValueError):
            return ""
        return lines[-1][:300] if lines else ""

    def kill(self) -> None:
        """Kill the process; the reader thread sees its pipe close and fails what is pending."""
        if self.proc.poll() is None:
            try:
                self.proc.kill()
            except OSError:
                pass

    def _close_files(self) -> None:
        for f in (self.proc.stdin, self.proc.stdout, self.err):
            try:
                f.close()
            except OSError:
                pass
        with _servers_lock:
            if self in _servers:
                _servers.remove(self)

    def close(self) -> None:
        """Stop the server (at exit): its stdin closes, so it exits even if the kill raced."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        self.kill()
        self.reader.join(timeout=5)


def _write_all(f, data: bytes) -> None:
    """All of `data` to the unbuffered pipe `f` (a raw write may take only part of it)."""
    view = memoryview(data)
    while view:
        n = f.write(view)
        if not n:
            raise EOFError("compile server closed its pipe")
        view = view[n:]


def _read_exact(fd: int, n: int) -> bytes:
    """`n` bytes from pipe `fd`; EOFError if the writer closed it (the server died)."""
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise EOFError("compile server closed its pipe")
        buf += chunk
    return bytes(buf)


_servers: list[_Server] = []  # live servers of this process (at most one; a forked parent's)
_servers_lock = threading.Lock()
_current: _Server | None = None
_unavailable = ""  # why no server can run in this process ("" while one can)


def _server(target: str = "") -> _Server:
    """This process's compile server, started now if there is none (or it died)."""
    global _current
    with _servers_lock:
        s = _current
    if s is not None and s.pid == os.getpid() and s.dead is None:
        return s
    with _start_lock:
        s = _current
        if s is None or s.pid != os.getpid() or s.dead is not None:
            s = _current = _Server(target)  # (appends itself to _servers under its lock)
    return s


_start_lock = threading.Lock()


def start_server(target: str | None = None) -> None:
    """Start this process's compile server now, booting in the background (`workers.warm`
    calls it at the first compile: the boot overlaps the lowering of the kernel)."""
    if _unavailable:
        return
    try:
        _server(target or "")
    except ServerUnavailable as e:
        _give_up(str(e))


def _give_up(why: str) -> None:
    global _unavailable
    if not _unavailable:
        _unavailable = why or "unknown"
        _warn(f"no compile server ({_unavailable}); compiling in this process, where an LLVM "
              "abort ends it (LAZYMATH_COMPILE_ISOLATE=auto)")  # fmt: skip


def server_compile(req: dict) -> bytes:
    """Object code of `req` (workers' job: text, module, level, vectorize, target, kw) from
    the compile server. If LLVM kills the server, or it gives no answer within
    LAZYMATH_COMPILE_TIMEOUT seconds (it is killed), it is restarted and the kernel compiled
    again with the vectorizers off (a RuntimeWarning says so); if that fails too,
    `CompilerCrashed`. ServerUnavailable if no server can run here (the caller compiles
    in-process)."""
    name = req["module"]
    timeout = settings.COMPILE_TIMEOUT.get()
    attempt = lost = 0
    while True:
        if _unavailable:
            raise ServerUnavailable(_unavailable)
        try:
            srv = _server(req.get("target") or "")
            return srv.request(req if attempt == 0 else {**req, "vectorize": False}, timeout)
        except ServerUnavailable as e:
            _give_up(str(e))
            raise
        except _Lost:
            lost += 1
            if lost > 8:  # the server keeps going away under us: not this kernel's doing
                _give_up("it keeps exiting")
                raise ServerUnavailable(_unavailable) from None
            continue
        except _Died as d:
            if d.rc is None:
                what = (f"LLVM did not finish compiling kernel {name} within {timeout:g} s "
                        "(LAZYMATH_COMPILE_TIMEOUT) in the compile server, which was "
                        "killed")  # fmt: skip
            else:
                what = f"LLVM {_describe(d.rc)} compiling kernel {name} in the compile server" + (
                    f": {d.tail}" if d.tail else "")  # fmt: skip
            if attempt == 0 and req.get("vectorize", True):
                _warn(f"{what}; restarting it and compiling again with the vectorizers off")
                attempt = 1
                continue
            _warn(f"{what}, even with the vectorizers off; this kernel runs on the numpy "
                  "interpreter (correct, slow)")  # fmt: skip
            raise CompilerCrashed(what) from None


def watchdog_timeout(timeout: float) -> float:
    """The parent-side deadline of a compile (compile's watchdog, which can only abandon a
    stuck thread): in server mode the server enforces `timeout` itself and kills a hung
    compile, twice at most, so the parent waits for that instead of racing it."""
    if timeout > 0 and mode() == "server":
        return 2 * timeout + 2 * BOOT_TIMEOUT
    return timeout


def _close_servers() -> None:
    for s in list(_servers):
        if s.pid == os.getpid():
            s.close()


def _after_fork_in_child() -> None:
    """A forked child has no reader thread and must not use the parent's server (its pipes
    are shared with the parent): it starts its own on its first compile."""
    global _current, _servers_lock, _start_lock
    _current = None
    _servers_lock = threading.Lock()
    _start_lock = threading.Lock()


atexit.register(_close_servers)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
