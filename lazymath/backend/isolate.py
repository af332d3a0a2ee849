"""Crash isolation for the LLVM compiler: an abort in LLVM costs a warning, not the process.

LLVM reports internal errors with abort() (assertions, "VPlan cost model and legacy cost model
disagreed", ...) and can loop forever on rare inputs; neither can be caught in the process that
runs it. So:

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

``LAZYMATH_COMPILE_ISOLATE``: ``auto`` (default: a child after a crash), ``1`` (always a child),
``server`` (every compile in a persistent compile-server process, see below: no first-crash
window), ``0`` (never; a crash in LLVM ends the process as before).
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import threading
import warnings
from contextlib import contextmanager
from pathlib import Path

from lazymath.backend import kernel_cache


def mode() -> str:
    """ "auto", "always" or "off" (LAZYMATH_COMPILE_ISOLATE)."""
    from lazymath import settings

    return settings.COMPILE_ISOLATE.get()


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
    import subprocess  # here: the import costs every process's first compile ~3 ms

    if mode() != "always":
        _warn(f"compiling kernel {module_name} in a separate process: {why}")
    first = ""
    for vectorize in (True, False):
        payload = json.dumps({"text": text, "module": module_name, "level": level,
                              "vectorize": vectorize}).encode()  # fmt: skip
        rc: int | None
        try:
            out = subprocess.run(
                [sys.executable, "-c", "from lazymath.backend.workers import child_main; "
                 "child_main()"],
                input=payload, capture_output=True, timeout=timeout,
                env={**os.environ, "LAZYMATH_CACHE": "0"},
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


# ----------------------------------------------------------------------------- compile servers
#
# `LAZYMATH_COMPILE_ISOLATE=server`: every LLVM compile of the workers runs in a persistent
# compile-server process (one per compile thread, started on its first job and kept), so even
# the first LLVM abort of a fresh process costs a restarted server and a retry, never the
# user's process. A server compiles with the same `workers.Compiler` (IR text in, object code
# out) and never touches the disk cache; the parent links the object like a disk-cache hit.
#
# A hung compile (LLVM looping) is a process here, so it can be killed: a request that gets no
# answer within LAZYMATH_COMPILE_TIMEOUT seconds kills its server, which is restarted and the
# kernel compiled again with the vectorizers off (the in-process path can only abandon a stuck
# thread, which keeps its core until exit).
#
# The server boots without `lazymath/__init__` (`_BOOT`: a bare package object, then only
# settings, backend.jit, backend.host, backend.workers): no numpy, no ml_dtypes, no tensor
# layer. Measured on Zen 5: ~0.05 s of imports and set-up after the interpreter starts, where
# `import lazymath` first took ~0.6 s -- the cost that kept this mode opt-in.


class CompilerCrashed(RuntimeError):
    """LLVM killed (or hung) the compile server on a kernel twice (vectorizers on, then off):
    the caller runs that kernel on the interpreter."""


class _Died(Exception):
    def __init__(self, rc: int | None, tail: str) -> None:
        super().__init__(rc, tail)
        self.rc, self.tail = rc, tail


_HEAD = 9  # response: 1 status byte (b"O" object code, b"E" a compile error) + u64 length
_READY = b"R"  # the server's first byte: booted, its compiler for the target built
BOOT_TIMEOUT = 60.0  # seconds a server may take to boot (a loaded 2-core CI machine: ~1 s)

# `python -c _BOOT <lazymath package dir> <target>`: the server imports only what it compiles
# with (see above); `lazymath` is a bare package object over the same directory
_BOOT = (
    "import sys, types; p = types.ModuleType('lazymath'); p.__path__ = [sys.argv[1]]; "
    "sys.modules['lazymath'] = p; from lazymath.backend.workers import server_main; "
    "server_main(sys.argv[2])"
)


class _Server:
    """One compile-server process and the pipes to it (owned by one thread of one process)."""

    def __init__(self, target: str = "") -> None:
        import subprocess
        import tempfile

        self.pid = os.getpid()
        self.err = tempfile.TemporaryFile()  # its stderr: LLVM's last words if it dies
        pkg = str(Path(__file__).resolve().parents[1])
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT, pkg, target],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, bufsize=0,
            env={**os.environ, "LAZYMATH_CACHE": "0"},
        )  # fmt: skip
        self.ready = False
        with _servers_lock:
            _servers.append(self)

    def request(self, req: dict, timeout: float) -> bytes:
        """The object code for `req`; RuntimeError for a compile error the server reported
        (bad IR: what an in-process compile would raise); `_Died` if the server died, or if
        it gave no answer within `timeout` seconds (then it is killed: rc None)."""
        import struct
        import time

        data = json.dumps(req).encode()
        fd = self.proc.stdout.fileno()
        try:
            if not self.ready:
                if _read_exact(fd, 1, time.monotonic() + max(BOOT_TIMEOUT, timeout)) != _READY:
                    raise ValueError("compile server: bad greeting")
                self.ready = True
            _write_all(self.proc.stdin, struct.pack("<Q", len(data)) + data)
            deadline = time.monotonic() + timeout if timeout > 0 else None
            head = _read_exact(fd, _HEAD, deadline)
            payload = _read_exact(fd, struct.unpack("<Q", head[1:])[0], deadline)
        except TimeoutError:
            self.close()
            raise _Died(None, "") from None
        except (OSError, EOFError, ValueError):
            try:
                self.proc.wait(timeout=5)  # it is dying: its status and last words
            except Exception:  # noqa: BLE001,S110 - killed below
                pass
            tail = self._tail()
            self.close()
            raise _Died(self.proc.returncode, tail) from None
        if head[:1] == b"O":
            return payload
        raise RuntimeError(payload.decode(errors="replace"))

    def _tail(self) -> str:
        try:
            self.err.seek(0)
            lines = self.err.read().decode(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return lines[-1][:300] if lines else ""

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=5)
        except Exception:  # noqa: BLE001,S110 - a zombie at worst
            pass
        for f in (self.proc.stdin, self.proc.stdout, self.err):
            try:
                f.close()
            except OSError:
                pass
        with _servers_lock:
            if self in _servers:
                _servers.remove(self)


def _write_all(f, data: bytes) -> None:
    """All of `data` to the unbuffered pipe `f` (a raw write may take only part of it)."""
    view = memoryview(data)
    while view:
        n = f.write(view)
        if not n:
            raise EOFError("compile server closed its pipe")
        view = view[n:]


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    """`n` bytes from pipe `fd`; TimeoutError past `deadline` (time.monotonic), EOFError if
    the writer closed it (the server died)."""
    import select
    import time

    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise EOFError("compile server closed its pipe")
        buf += chunk
    return bytes(buf)


_servers: list[_Server] = []
_servers_lock = threading.Lock()
_local = threading.local()


def _server(target: str = "") -> _Server:
    s = getattr(_local, "server", None)
    if s is None or s.pid != os.getpid():  # none yet, or a forked parent's (not ours to use)
        s = _local.server = _Server(target)
    return s


def start_server(target: str | None = None) -> None:
    """Start this thread's compile server now, booting in the background (a compile thread
    does at its start: the boot overlaps the caller's lowering)."""
    _server(target or "")


def server_compile(req: dict) -> bytes:
    """Object code of `req` (workers' job: text, module, level, vectorize, target, codegen,
    cleanup) from this thread's compile server. If LLVM kills the server, or it gives no
    answer within LAZYMATH_COMPILE_TIMEOUT seconds (it is killed), it is restarted and the
    kernel compiled again with the vectorizers off (a RuntimeWarning says so); if that fails
    too, `CompilerCrashed`."""
    from lazymath import settings

    name = req["module"]
    timeout = settings.COMPILE_TIMEOUT.get()
    for attempt in range(2):
        srv = _server(req.get("target") or "")
        try:
            return srv.request(req if attempt == 0 else {**req, "vectorize": False}, timeout)
        except _Died as d:
            _local.server = None
            if d.rc is None:
                what = (f"LLVM did not finish compiling kernel {name} within {timeout:g} s "
                        "(LAZYMATH_COMPILE_TIMEOUT) in the compile server, which was "
                        "killed")  # fmt: skip
            else:
                what = f"LLVM {_describe(d.rc)} compiling kernel {name} in the compile server" + (
                    f": {d.tail}" if d.tail else "")  # fmt: skip
            if attempt == 0:
                _warn(f"{what}; restarting it and compiling again with the vectorizers off")
            else:
                _warn(f"{what}, even with the vectorizers off; this kernel runs on the numpy "
                      "interpreter (correct, slow)")  # fmt: skip
                raise CompilerCrashed(what) from None
    raise AssertionError("unreachable")


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


atexit.register(_close_servers)
