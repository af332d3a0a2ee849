"""End to end: random programs placed by `assign_streams` and replayed on real streams compute
exactly what sequential execution computes (RAW, WAR and WAW hazards all exercised)."""

from __future__ import annotations

import random
import time

import numpy as np

from lazymath.fusion.streams import KernelDeps, assign_streams, verify_plan
from lazymath.runtime import Event, Launch


class BufKernel:
    """Reads some slots of `argv[0]`, sleeps a random few hundred us, writes its slots."""

    def __init__(self, i: int, reads: list[int], writes: list[int], delay: float) -> None:
        self.name = f"k{i}"
        self.i, self.reads, self.writes, self.delay = i, reads, writes, delay

    def value(self, mem) -> int:
        return (sum(int(mem[r]) for r in self.reads) * 31 + self.i) % 1_000_003

    def run_block(self, argv, block_idx: int, block_num: int) -> None:
        mem = argv[0]
        v = self.value(mem)
        if self.delay:
            time.sleep(self.delay)  # widen the race window between read and write
        for w in self.writes:
            mem[w] = v


def random_program(rng: random.Random, n: int, n_bufs: int) -> list[BufKernel]:
    ks = []
    for i in range(n):
        reads = rng.sample(range(n_bufs), rng.randint(0, 3))
        writes = rng.sample(range(n_bufs), rng.randint(1, 2))
        ks.append(BufKernel(i, reads, writes, rng.choice([0, 0, 1e-4, 5e-4])))
    return ks


def test_random_programs_match_sequential(device):
    rng = random.Random(1234)
    for trial in range(25):
        n_bufs = rng.randint(3, 8)
        ks = random_program(rng, rng.randint(1, 16), n_bufs)
        deps = [KernelDeps(frozenset(k.reads), frozenset(k.writes), k.name) for k in ks]
        n_streams = rng.randint(1, 4)
        plan = assign_streams(deps, n_streams)
        verify_plan(deps, plan)
        init = np.array([rng.randint(0, 99) for _ in range(n_bufs)], dtype=np.int64)
        expect = init.copy()
        for k in ks:
            v = k.value(expect)
            for w in k.writes:
                expect[w] = v
        mem = init.copy()
        program = [Launch(k, 1, e.stream, e.waits, e.record) for k, e in zip(ks, plan)]
        events = [Event() for _ in range(plan.n_events)]
        device.execute(program, [(mem,)] * len(ks), events)
        assert mem.tolist() == expect.tolist(), (trial, str(plan))
