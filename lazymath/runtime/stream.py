"""Streams and events: in-order work queues on real host threads, ordered across streams by events.

A `Stream` (aclrtCreateStream) is a FIFO of commands (kernel launch, event record, event wait,
host callback/copy) executed in order by the stream's own worker thread. Different streams run
concurrently; a kernel's blocks additionally spread over the process's block pool
(`lazymath._threads`).

Host assist: a host thread that calls `synchronize()` would otherwise sleep until the worker
finishes; instead it takes the stream's execution lock and runs the queued commands itself, in
the same order. That saves two thread handoffs (~20-40 us with the GIL) per launch + synchronize,
and is invisible to ordering: exactly one thread executes a stream's commands at a time, in FIFO
order. The worker keeps the stream going while the host does other things.

Events (aclrtCreateEvent) follow the CUDA/ACL rule: `record(stream)` captures the work queued on
the stream so far; each record makes a fresh `_Mark`, and `wait_event` / `synchronize` bind to the
mark current at call time, so re-recording an event never confuses earlier waiters.

Errors: an exception inside a command is caught on the worker, wrapped in `KernelLaunchError`
(kernel name + the user line that created the kernel) and raised at the next synchronize of the
stream, of the device, or of an event recorded after it; a stream that waits on such an event
inherits the error. Each error is raised once; the stream keeps running later commands.

`LAZYMATH_SCHEDULER=sync`: streams have no worker; every command runs inline on the caller's
thread when enqueued, so events are complete as soon as they are recorded. Errors are still
deferred to the next synchronize so programs behave the same in both modes.
"""

from __future__ import annotations

import threading
from collections import deque
from time import perf_counter_ns
from typing import TYPE_CHECKING

from lazymath._threads import BUSY, launch_blocks
from lazymath.runtime import profiler as _prof

if TYPE_CHECKING:
    from lazymath._threads import BlockPool
    from lazymath.runtime.api import Device

# The current device's default stream, for `Event.record()` without a stream. runtime/api.py
# owns the current device and sets this when it loads (api imports this module, so this module
# does not import api).
default_stream_hook = None

# command opcodes (tuples are the cheapest objects to build and unpack)
_KERNEL, _RECORD, _WAIT, _CALL = 0, 1, 2, 3


class DeviceError(RuntimeError):
    """Base of errors raised by the emulated device runtime."""


class KernelLaunchError(DeviceError):
    """A command enqueued on a stream failed; raised at the next synchronize.

    `kernel_name`, `source_loc` (the user's "file:line" that created the kernel, when known),
    `stream` (index) and `__cause__` (the original exception, with its traceback). When several
    commands failed before one synchronize, the first is raised and the rest are in `others`.
    """

    def __init__(self, kernel_name: str, source_loc: str | None, stream: int, cause: BaseException):
        where = f" (created at {source_loc})" if source_loc else ""
        super().__init__(
            f"kernel {kernel_name!r}{where} failed on stream {stream}: "
            f"{type(cause).__name__}: {cause}"
        )
        self.kernel_name = kernel_name
        self.source_loc = source_loc
        self.stream = stream
        self.cause = cause
        self.__cause__ = cause
        self.reported = False
        self.others: tuple[KernelLaunchError, ...] = ()


def raise_pending(errors) -> None:
    """Raise the first not-yet-reported error of `errors` (marking all of them reported)."""
    pending = [e for e in errors if not e.reported]
    if not pending:
        return
    for e in pending:
        e.reported = True
    first = pending[0]
    first.others = tuple(pending[1:])
    raise first


class _Mark:
    """One recording of an event: done once the stream reaches it."""

    __slots__ = ("_lock", "done", "t_ns", "errors", "stream")

    def __init__(self, stream: Stream) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self.done = False
        self.t_ns = 0
        self.errors: tuple[KernelLaunchError, ...] = ()
        self.stream = stream

    def set(self) -> None:
        self.t_ns = perf_counter_ns()
        self.done = True
        self._lock.release()

    def wait(self, timeout: float = -1) -> bool:
        if self.done:
            return True
        if self._lock.acquire(timeout=timeout):
            self._lock.release()  # pass the baton to the next waiter
            return True
        return self.done


class Stream:
    """aclrtCreateStream: an in-order queue of device work with its own worker thread."""

    def __init__(self, device: Device, index: int, *, threaded: bool, pool: BlockPool) -> None:
        self.device = device
        self.index = index
        self.threaded = threaded
        self._pool = pool
        self._q: deque = deque()
        self._exec = threading.Lock()  # held by whichever thread executes this stream's commands
        self._wake = threading.Lock()  # binary semaphore: released when work is enqueued
        self._wake.acquire()
        self._signaled = False
        self._closed = False
        self._errors: list[KernelLaunchError] = []
        self._err_lock = threading.Lock()
        self.host_assist = getattr(device, "host_assist", True)
        self._thread: threading.Thread | None = None
        if threaded:
            self._thread = threading.Thread(
                target=self._worker, name=f"lazymath-stream-{index}", daemon=True
            )
            self._thread.start()

    def __repr__(self) -> str:
        mode = "threads" if self.threaded else "sync"
        return f"<Stream {self.index} ({mode}), {len(self._q)} queued>"

    # -- public AscendCL-like surface ----------------------------------------------------------

    def synchronize(self) -> None:
        """aclrtSynchronizeStream: block until all queued work is done; raise its errors."""
        self._quiesce()
        if self._errors:
            self._raise_errors()

    def wait_event(self, event: Event) -> None:
        """aclrtStreamWaitEvent: later work on this stream waits until `event`'s recorded work
        is done. Blocks this stream's worker, never the host."""
        mark = event._mark
        if mark is None:  # never recorded: nothing to wait for (CUDA/ACL semantics)
            return
        prof = _prof._ACTIVE
        trace = prof._on_wait(self, mark, event) if prof is not None else None
        if trace is None and mark.done and not mark.errors:
            return
        self._enqueue((_WAIT, mark, trace))

    def record_event(self, event: Event) -> None:
        """aclrtRecordEvent(event, stream)."""
        event.record(self)

    def query(self) -> bool:
        """aclrtStreamQuery: True when no work is queued or running."""
        if self._q:
            return False
        if self._exec.acquire(False):
            self._exec.release()
            return not self._q
        return False

    def launch_callback(self, fn, name: str = "host_callback") -> None:
        """aclrtLaunchCallback: run `fn()` on this stream, in order with its kernels. Like a
        CUDA host callback, `fn` must not synchronize streams or events (it may deadlock)."""
        self._enqueue((_CALL, fn, name, None))

    # -- internals ----------------------------------------------------------------------------

    def _enqueue(self, cmd: tuple) -> None:
        if not self.threaded:
            self._execute(cmd)
            return
        self._q.append(cmd)
        if not self._signaled:
            self._kick()

    def _kick(self) -> None:
        """Wake the worker (a ~8 us futex wake; skipped while it is already signalled)."""
        self._signaled = True
        try:
            self._wake.release()
        except RuntimeError:  # already released by a racing enqueuer: the worker will wake
            pass

    def _worker(self) -> None:
        wake, busy, me = self._wake, BUSY, threading.get_ident()
        while True:
            wake.acquire()
            self._signaled = False
            if self._closed:
                return
            busy.add(me)  # commands may run numpy: no OpenBLAS shutdown meanwhile
            try:
                self._drain(blocking=False)
            finally:
                busy.discard(me)

    def _drain(self, blocking: bool) -> None:
        """Execute queued commands while holding the execution lock (see module docstring)."""
        q, ex, execute = self._q, self._exec, self._execute
        while True:
            if not ex.acquire(blocking):
                return  # another thread is executing; it re-checks the queue after releasing
            try:
                while q:
                    execute(q.popleft())
            except BaseException:  # e.g. Ctrl-C while the host assists: the worker goes on
                ex.release()
                self._kick()
                raise
            ex.release()
            if not q:
                return

    def _quiesce(self) -> None:
        """Return once every command enqueued before the call has completed."""
        if not self.threaded:
            return
        if self.host_assist:
            self._drain(blocking=True)
            return
        done = _Mark(self)
        self._enqueue((_CALL, done.set, "synchronize", None))
        done.wait()

    def _run_until(self, mark: _Mark) -> None:
        """Assist: run this stream's commands up to `mark` on the calling thread, if no other
        thread is executing them (Event.synchronize, or a stream about to block on `mark`).

        Only a non-blocking acquire is used, so helping never waits on another stream's lock;
        and a mark is only ever awaited after its record was enqueued, so the help always runs
        earlier-enqueued work: no cycles, no deadlock."""
        if not (self.threaded and self.host_assist) or mark.done:
            return
        q, ex = self._q, self._exec
        if not ex.acquire(False):
            return
        try:
            while q and not mark.done:
                self._execute(q.popleft())
        finally:
            ex.release()
            if q and not self._signaled:  # hand what is left back to the worker
                self._kick()

    def _execute(self, cmd: tuple) -> None:
        op = cmd[0]
        if op == _KERNEL:
            _, kernel, argv, blocks, trace, loc = cmd
            if trace is not None:
                trace.host_start_ns = perf_counter_ns()
            try:
                if blocks == 1:
                    kernel.run_block(argv, 0, 1)
                else:
                    launch_blocks(self._pool, kernel, argv, blocks)
            except Exception as exc:  # deferred to synchronize (Ctrl-C still propagates)
                name = getattr(kernel, "name", None) or type(kernel).__name__
                self._add_error(KernelLaunchError(name, loc, self.index, exc))
            if trace is not None:
                trace.host_end_ns = perf_counter_ns()
        elif op == _RECORD:
            _, mark, trace = cmd
            if self._errors:
                mark.errors = tuple(e for e in self._errors if not e.reported)
            mark.set()
            if trace is not None:
                trace.host_ns = mark.t_ns
        elif op == _WAIT:
            _, mark, trace = cmd
            if trace is not None:
                trace.host_start_ns = perf_counter_ns()
            if not mark.done and mark.stream is not self:
                mark.stream._run_until(mark)  # help the producer stream if it is idle
            mark.wait()
            if trace is not None:
                trace.host_ns = perf_counter_ns()
            for e in mark.errors:
                if e not in self._errors:
                    self._add_error(e)
        else:  # _CALL
            _, fn, name, loc = cmd
            try:
                fn()
            except Exception as exc:
                self._add_error(KernelLaunchError(name, loc, self.index, exc))

    def _add_error(self, err: KernelLaunchError) -> None:
        with self._err_lock:
            self._errors.append(err)

    def _take_errors(self) -> list[KernelLaunchError]:
        if not self._errors:
            return []
        with self._err_lock:
            errs, self._errors = self._errors, []
        return errs

    def _raise_errors(self) -> None:
        raise_pending(self._take_errors())

    def _close(self) -> None:
        if self._thread is None:
            return
        self._quiesce()
        self._closed = True
        self._kick()
        self._thread.join(timeout=1.0)
        self._thread = None

    def _after_fork(self) -> None:
        """In a forked child the worker thread does not exist: run inline from now on."""
        self._thread = None
        self.threaded = False
        self._q.clear()
        self._exec = threading.Lock()
        self._err_lock = threading.Lock()


class Event:
    """aclrtCreateEvent: a point in a stream's work that other streams and the host can wait on."""

    __slots__ = ("_mark", "name")

    def __init__(self, name: str | None = None) -> None:
        self._mark: _Mark | None = None
        self.name = name

    def __repr__(self) -> str:
        state = "unrecorded" if self._mark is None else ("done" if self._mark.done else "pending")
        label = f" {self.name}" if self.name else ""
        return f"<Event{label} {state}>"

    def record(self, stream: Stream | None = None) -> None:
        """aclrtRecordEvent: the event completes when the work queued on `stream` so far does."""
        if stream is None:
            stream = default_stream_hook()
        mark = _Mark(stream)
        self._mark = mark
        prof = _prof._ACTIVE
        trace = prof._on_record(stream, mark, self) if prof is not None else None
        stream._enqueue((_RECORD, mark, trace))

    def query(self) -> bool:
        """aclrtQueryEventStatus: True when the recorded work is complete (or never recorded)."""
        mark = self._mark
        return mark is None or mark.done

    def synchronize(self, timeout: float | None = None) -> None:
        """aclrtSynchronizeEvent: block the host until the recorded work is done; raise errors of
        kernels that failed before the record on its stream (or on streams it waited for)."""
        mark = self._mark
        if mark is None:
            return
        if not mark.done:
            mark.stream._run_until(mark)
            if not mark.wait(-1 if timeout is None else timeout):
                raise TimeoutError(f"{self!r} not complete after {timeout} s")
        if mark.errors:
            raise_pending(mark.errors)

    @property
    def timestamp_ns(self) -> int:
        """Host perf_counter_ns at which the recorded work completed (0 if not yet)."""
        mark = self._mark
        return mark.t_ns if mark is not None and mark.done else 0

    def elapsed_time(self, end: Event) -> float:
        return elapsed_time(self, end)


def elapsed_time(start: Event, end: Event) -> float:
    """aclrtEventElapsedTime: milliseconds between two completed events."""
    for ev in (start, end):
        if ev._mark is None:
            raise DeviceError(f"{ev!r} was never recorded")
        if not ev._mark.done:
            raise DeviceError(f"{ev!r} has not completed; synchronize it first")
    return (end._mark.t_ns - start._mark.t_ns) / 1e6
