"""Launch overhead of the runtime (not collected by pytest; run it directly):

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python tests/runtime/bench_launch.py

The kernel is a real ctypes call (libc getpid, which releases the GIL like a compiled kernel),
so every number is runtime overhead: enqueue, handoff, execution bookkeeping, synchronize.
"""

from __future__ import annotations

import ctypes
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # run from a checkout

from lazymath.runtime import Device, Event, Launch, profile  # noqa: E402

_libc = ctypes.CDLL(None)


class Trivial:
    name = "trivial"

    def run_block(self, argv, block_idx: int, block_num: int) -> None:
        _libc.getpid()


def median_us(fn, n: int = 3000, warm: int = 300) -> float:
    for _ in range(warm):
        fn()
    times = []
    for _ in range(n):
        t = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t)
    return statistics.median(times) / 1e3


def main() -> None:
    k = Trivial()
    rows = []
    for label, kw in [
        ("threads (host assist)", {"scheduler": "threads"}),
        ("threads (no host assist)", {"scheduler": "threads", "host_assist": False}),
        ("sync", {"scheduler": "sync"}),
    ]:
        dev = Device(**kw)
        s0, s1 = dev.stream(0), dev.stream(1)
        ev = [Event()]

        def one(dev=dev, s0=s0):
            dev.launch_argv(k, 1, (), s0)
            s0.synchronize()

        def two_streams(dev=dev, s0=s0, s1=s1):
            dev.launch_argv(k, 1, (), s0)
            dev.launch_argv(k, 1, (), s1)
            dev.synchronize()

        def two_blocks(dev=dev, s0=s0):
            dev.launch_argv(k, 2, (), s0)
            s0.synchronize()

        program = [Launch(k, 1, 0), Launch(k, 1, 1, record=0), Launch(k, 1, 0),
                   Launch(k, 1, 0, waits=(0,)), Launch(k, 1, 0)]  # fmt: skip
        argvs = [()] * 5

        def five(dev=dev, program=program, argvs=argvs, ev=ev):
            dev.execute(program, argvs, ev)

        def one_profiled(dev=dev, s0=s0):
            with profile():
                dev.launch_argv(k, 1, (), s0)
                s0.synchronize()

        rows.append((label, median_us(one), median_us(two_streams), median_us(two_blocks),
                     median_us(five), median_us(one_profiled, n=1000)))  # fmt: skip
        dev.close()
    head = ("scheduler", "1 launch+sync", "2 streams", "2 blocks", "5-kernel program",
            "1 launch profiled")  # fmt: skip
    print(f"{head[0]:26}" + "".join(f"{h:>20}" for h in head[1:]))
    for r in rows:
        print(f"{r[0]:26}" + "".join(f"{v:>17.2f} us" for v in r[1:]))


if __name__ == "__main__":
    main()
