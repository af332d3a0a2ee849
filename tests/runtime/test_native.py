"""A real native kernel (llvmlite MCJIT, called through ctypes, which releases the GIL) shows
that blocks on the host thread pool and kernels on two streams really run in parallel."""

from __future__ import annotations

import ctypes
import os
import time

import numpy as np
import pytest

from lazymath.runtime import Event

llvm = pytest.importorskip("llvmlite.binding")

# void spin(i64 block, i64 nblocks, ptr args): x <- x * 0.5 + 0.25 for *args[1] iterations
# (a dependent fp chain LLVM cannot fold or vectorize), then args[0][block] = x + block.
SPIN_IR = r"""
define void @spin(i64 %block, i64 %nblocks, ptr %args) {
entry:
  %p0 = getelementptr ptr, ptr %args, i64 0
  %out = load ptr, ptr %p0
  %p1 = getelementptr ptr, ptr %args, i64 1
  %itp = load ptr, ptr %p1
  %iters = load i64, ptr %itp
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %i1, %loop ]
  %x = phi double [ 3.0, %entry ], [ %x1, %loop ]
  %xm = fmul double %x, 5.000000e-01
  %x1 = fadd double %xm, 2.500000e-01
  %i1 = add i64 %i, 1
  %c = icmp slt i64 %i1, %iters
  br i1 %c, label %loop, label %done
done:
  %bf = sitofp i64 %block to double
  %r = fadd double %x1, %bf
  %o = getelementptr double, ptr %out, i64 %block
  store double %r, ptr %o
  ret void
}
"""

# void meet(i64 block, i64 nblocks, ptr args): side = *args[3] + block; flags = args[0];
# flags[side] <- 1, then poll flags[1 - side] (atomic loads) up to *args[1] times; out[side] <- 1
# when the other side was seen. Both sides finish with 1 only if they are in native code at the
# same time: a serialised run leaves the first side polling to its bound, then 0.
MEET_IR = r"""
define void @meet(i64 %block, i64 %nblocks, ptr %args) {
entry:
  %p0 = getelementptr ptr, ptr %args, i64 0
  %flags = load ptr, ptr %p0
  %p1 = getelementptr ptr, ptr %args, i64 1
  %itp = load ptr, ptr %p1
  %iters = load i64, ptr %itp
  %p2 = getelementptr ptr, ptr %args, i64 2
  %out = load ptr, ptr %p2
  %p3 = getelementptr ptr, ptr %args, i64 3
  %sidep = load ptr, ptr %p3
  %side0 = load i64, ptr %sidep
  %me = add i64 %side0, %block
  %other = sub i64 1, %me
  %pm = getelementptr i64, ptr %flags, i64 %me
  %po = getelementptr i64, ptr %flags, i64 %other
  store atomic i64 1, ptr %pm seq_cst, align 8
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %i1, %cont ]
  %v = load atomic i64, ptr %po seq_cst, align 8
  %met = icmp eq i64 %v, 1
  br i1 %met, label %found, label %cont
cont:
  %i1 = add i64 %i, 1
  %c = icmp slt i64 %i1, %iters
  br i1 %c, label %loop, label %done
found:
  %pr = getelementptr i64, ptr %out, i64 %me
  store i64 1, ptr %pr
  br label %done
done:
  ret void
}
"""

CFUNC = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, ctypes.POINTER(ctypes.c_void_p))


@pytest.fixture(scope="module")
def spin_fn():
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_default_triple()
    tm = target.create_target_machine(opt=2, jit=True)
    mod = llvm.parse_assembly(SPIN_IR)
    mod.name = "lazymath_runtime_test_spin"
    mod.verify()
    engine = llvm.create_mcjit_compiler(mod, tm)
    meet = llvm.parse_assembly(MEET_IR)
    meet.name = "lazymath_runtime_test_meet"
    meet.verify()
    engine.add_module(meet)
    engine.finalize_object()
    fn = CFUNC(engine.get_function_address("spin"))
    fn.meet = CFUNC(engine.get_function_address("meet"))
    yield fn
    del engine


class SpinKernel:
    """A CompiledKernel look-alike: ctypes argv built once, run_block is one ctypes call.
    Each block's host interval around the native call is stamped."""

    def __init__(self, fn, name: str, iters: int) -> None:
        self.fn = fn
        self.name = name
        self.iters = np.array([iters], dtype=np.int64)
        self.intervals: list[tuple[int, int, int]] = []  # (block, start ns, end ns)

    def make_argv(self, arrays):
        (out,) = arrays
        return (ctypes.c_void_p * 2)(out.ctypes.data, self.iters.ctypes.data)

    def run_block(self, argv, block_idx: int, block_num: int) -> None:
        t0 = time.perf_counter_ns()
        self.fn(block_idx, block_num, argv)
        self.intervals.append((block_idx, t0, time.perf_counter_ns()))


class MeetKernel:
    """Runs `meet` (see MEET_IR) for side `side` + block index; `flags`/`out` are shared."""

    def __init__(self, fn, name: str, flags, out, side: int, iters: int) -> None:
        self.fn, self.name = fn, name
        self.side = np.array([side], dtype=np.int64)
        self.iters = np.array([iters], dtype=np.int64)
        self.argv = (ctypes.c_void_p * 4)(flags.ctypes.data, self.iters.ctypes.data,
                                          out.ctypes.data, self.side.ctypes.data)  # fmt: skip
        self.blocks_seen: list[int] = []

    def run_block(self, argv, block_idx: int, block_num: int) -> None:
        self.fn(block_idx, block_num, self.argv)
        self.blocks_seen.append(block_idx)


MEET_BOUND = 1 << 34  # polls: a liveness bound (seconds of spinning), never reached when it works


def test_native_blocks_and_streams_run_concurrently(spin_fn, device):
    """Two blocks of one launch, and two launches on two streams, are inside native code at the
    same time (impossible unless the GIL is released and threads really run them): each side
    raises its flag and polls for the other's, so both succeed only when they overlap. Sync
    mode runs them one after the other. Event order, not wall time (that is benchmarks/)."""
    threaded = device.scheduler == "threads" and (os.cpu_count() or 1) >= 2
    out = np.zeros(4, dtype=np.float64)
    buf = device.malloc(out.nbytes)
    view = buf.as_array(np.float64, 4)
    if not threaded:  # sequential: block 1 starts after block 0 ended, results exact
        kb = SpinKernel(spin_fn, "spin2", 100_000)
        device.launch(kb, 2, [view])
        device.synchronize()
        (b0, _, e0), (b1, s1, _) = kb.intervals
        assert (b0, b1) == (0, 1) and e0 <= s1
        np.testing.assert_array_equal(view[:2], [0.5, 1.5])  # x -> 0.5, plus the block index
        device.free(buf)
        return
    for case in ("blocks", "streams"):
        flags = np.zeros(2, dtype=np.int64)
        met = np.zeros(2, dtype=np.int64)
        if case == "blocks":
            k = MeetKernel(spin_fn.meet, "meet2", flags, met, 0, MEET_BOUND)
            device.launch(k, 2, [view])
        else:
            ka = MeetKernel(spin_fn.meet, "meet_a", flags, met, 0, MEET_BOUND)
            kc = MeetKernel(spin_fn.meet, "meet_c", flags, met, 1, MEET_BOUND)
            device.launch(ka, 1, [view], device.stream(0))
            device.launch(kc, 1, [view], device.stream(1))
        device.synchronize()
        assert flags.tolist() == [1, 1] and met.tolist() == [1, 1], case
    device.free(buf)


def test_native_event_chain_across_streams(spin_fn, device):
    """Producer on s1 writes out[0]; consumer on s2 (after the event) copies it to out[1]."""
    k = SpinKernel(spin_fn, "producer", 200_000)
    out = np.zeros(2, dtype=np.float64)
    s1, s2 = device.stream(1), device.stream(2)
    ev = Event()
    device.launch(k, 1, [out], s1)
    ev.record(s1)
    s2.wait_event(ev)
    device.memcpy_async(out[1:], out[:1], s2)
    device.synchronize()
    assert out.tolist() == [0.5, 0.5]
