"""Memory plan tests (issue 5): liveness over the kernel order, best-fit reuse of dead arena
blocks, in-place reuse, the planned peak, and that plans stay correct when executed.

Two halves: schedules of real graphs (`lm.schedule`, nothing executed, except the tests that
realize a plan to show reuse and in-place do not corrupt values), and unit tests of
`lazymath.fusion.memory.plan_memory` on synthetic kernel lists, including a hypothesis
property that no two simultaneously live buffers share arena bytes.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lazymath as lm
from lazymath.fusion.memory import ALIGN, plan_memory
from lazymath.fusion.streams import KernelDeps, StreamEntry, StreamPlan, verify_plan

RNG = np.random.default_rng(7)


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def intermediates(s) -> list:
    """BufferPlans of the arena buffers (written by one kernel, read by later ones)."""
    return [b for b in s.memory.buffers.values() if not b.is_output]


def outputs_bytes(s) -> int:
    return sum(b.nbytes for b in s.memory.buffers.values() if b.is_output)


def assert_no_live_overlap(buffers) -> None:
    """Two arena buffers whose lifetimes overlap never share bytes, except an in-place
    handover (the consumer writes over the input that dies at it)."""
    bs = [b for b in buffers if not b.is_output]
    for i, a in enumerate(bs):
        assert a.offset >= 0, a
        for b in bs[i + 1 :]:
            live_together = a.first <= b.last and b.first <= a.last
            overlap = a.offset < b.offset + _align(b.nbytes) and b.offset < a.offset + _align(
                a.nbytes
            )
            handover = (b.inplace_of == a.node_id and a.last == b.first) or (
                a.inplace_of == b.node_id and b.last == a.first
            )
            assert not (live_together and overlap and not handover), (a, b)


# ----------------------------------------------------------------------------- graphs


def exp_sum_chain(x, steps: int = 4):
    """e <- exp(e * sum(e over axes 0 and 2) * c) on a (4, 4, 4) view of x: each e is read by
    a sum kernel and by the next elementwise kernel (a broadcast epilogue, refused: the reduced
    axes are not adjacent, so no row kernel takes the chain), so every e is a materialized
    intermediate that dies at an elementwise kernel of the same size: an in-place candidate.
    Works on numpy arrays (the expected values) and on lazymath tensors alike."""
    exp = np.exp if isinstance(x, np.ndarray) else lm.exp
    e = exp(x.reshape(4, 4, 4))
    for _ in range(steps):
        e = exp(e * e.sum(axis=(0, 2), keepdims=True) * np.float32(1e-3))
    return e


def transposed_chain(x, steps: int = 3):
    """e <- exp(e.T * sum(e) * c): the next kernel reads e transposed, so it cannot write in
    place; the block of e_{i-1} is free again when e_{i+1} is allocated: a best-fit reuse."""
    exp = np.exp if isinstance(x, np.ndarray) else lm.exp
    e = exp(x)
    for _ in range(steps):
        e = exp(e.T * e.sum() * np.float32(1e-3))
    return e


def vec(n: int = 64) -> np.ndarray:
    return (RNG.standard_normal(n) * 0.1).astype(np.float32)


def mat(n: int = 16) -> np.ndarray:
    return (RNG.standard_normal((n, n)) * 0.1).astype(np.float32)


def test_inplace_chain_reuses_blocks():
    s = lm.schedule(exp_sum_chain(lm.tensor(vec()), 4))
    mem = s.memory
    inter = intermediates(s)
    assert len(inter) == 8  # 4 exp vectors (256 B) + 4 sums (16 B)
    assert mem.inplace == 3  # e_{i+1} overwrites e_i at the kernel where e_i dies
    assert mem.reuses > 0  # the sums reuse each other's block
    assert mem.arena_bytes < sum(b.nbytes for b in inter)
    assert mem.arena_bytes == _align(256) + _align(16)  # one vector block + one sums block
    assert_no_live_overlap(mem.buffers.values())
    for b in inter:
        if b.inplace_of is not None:
            donor = mem.buffers[b.inplace_of]
            assert donor.offset == b.offset and donor.nbytes == b.nbytes
            assert donor.last == b.first  # the donor dies at the kernel that overwrites it


def test_transposed_reads_reuse_blocks_best_fit_without_inplace():
    s = lm.schedule(transposed_chain(lm.tensor(mat()), 3))
    mem = s.memory
    inter = intermediates(s)
    assert mem.inplace == 0  # a transposed read is not the output's layout
    assert mem.reuses > 0
    assert mem.arena_bytes < sum(_align(b.nbytes) for b in inter)
    assert_no_live_overlap(mem.buffers.values())


def test_planned_peak_is_readable_and_covers_outputs():
    s = lm.schedule(exp_sum_chain(lm.tensor(vec()), 4))
    assert isinstance(s.planned_peak_bytes, int)
    assert s.planned_peak_bytes >= outputs_bytes(s) == 256
    assert s.planned_peak_bytes >= max(_align(b.nbytes) for b in intermediates(s))
    assert s.planned_peak_bytes <= s.memory.arena_bytes + outputs_bytes(s)


def test_single_kernel_peak_is_its_output():
    A = lm.tensor(RNG.standard_normal((32, 48)).astype(np.float16))
    B = lm.tensor(RNG.standard_normal((48, 64)).astype(np.float16))
    s = lm.schedule(lm.relu(A @ B) * 0.5)
    assert s.memory.arena_bytes == 0
    assert s.planned_peak_bytes == 32 * 64 * 2  # inputs are the user's, not planned


def test_multi_output_peak_counts_every_output():
    x = lm.tensor(np.ones(1000, np.float32))
    s = lm.schedule(lm.sin(x), lm.exp(x), x * 2.0)
    assert s.planned_peak_bytes == 3 * 4000


def test_planned_peak_in_the_schedule_text():
    s = lm.schedule(exp_sum_chain(lm.tensor(vec()), 2))
    assert "planned peak" in str(s)


def test_matmul_intermediate_dies_and_is_reused():
    A = lm.tensor(RNG.standard_normal((16, 16)).astype(np.float16))
    m1 = A @ A  # materialized (matmul)
    m2 = m1 @ A  # materialized, reads m1 (which dies here)
    m3 = m2 @ A  # m2 dies; m3's block can be m1's
    out = m3 @ A
    del m1, m2, m3
    s = lm.schedule(out)
    assert len(s.kernels) == 4
    assert s.memory.reuses >= 1 and s.memory.inplace == 0  # Cube kernels never write in place
    assert s.memory.arena_bytes == 2 * _align(16 * 16 * 2)
    assert_no_live_overlap(s.memory.buffers.values())


@pytest.mark.parametrize("backend", ["irref", "llvm"])
def test_inplace_and_reuse_plans_compute_the_right_values(backend, monkeypatch):
    """Execute the plans: overwritten/reused blocks must not corrupt a later read. llvm gets
    a cheap chain (add/mul/sum, quick to compile); irref runs the exp chains too."""
    if backend == "llvm":
        pytest.importorskip("lazymath.backend.compile")
    monkeypatch.setenv("LAZYMATH_BACKEND", backend)
    x = RNG.standard_normal((4, 4, 4)).astype(np.float32) * 0.1

    def cheap(e):  # 4 cheap ops > RECOMPUTE_MAX_OPS: materialized, then a same-size consumer
        for _ in range(3):  # (sums over axes that are not adjacent: no row kernel)
            e = ((e + 1.0) * 0.5 + 0.25) * 0.75
            e = e * e.sum(axis=(0, 2), keepdims=True)
        return e

    got = cheap(lm.tensor(x))
    s = lm.schedule(got)
    assert s.memory.inplace > 0 and s.memory.reuses > 0
    np.testing.assert_allclose(got.numpy(), cheap(x), rtol=1e-5)
    if backend == "irref":
        for chain, x in ((exp_sum_chain, vec()), (transposed_chain, mat())):
            got = chain(lm.tensor(x))
            np.testing.assert_allclose(got.numpy(), chain(x), rtol=1e-5)


def _kernel_deps_on_arena_bytes(s) -> list[KernelDeps]:
    """What each kernel reads/writes, with arena buffers named by the ALIGN-sized cells they
    occupy (so two buffers sharing a reused block conflict) and other buffers by node id."""
    mem = s.memory

    def cells(n) -> set:
        b = mem.buffers.get(id(n))
        if b is None or b.is_output:
            return {("node", id(n))}
        return {("cell", c) for c in range(b.offset // ALIGN, (b.offset + _align(b.nbytes)) //
                                           ALIGN)}  # fmt: skip

    deps = []
    for k in s.kernels:
        r = frozenset(c for n in k.group.inputs for c in cells(n))
        w = frozenset(c for n in k.group.outputs for c in cells(n))
        deps.append(KernelDeps(r, w, k.name))
    return deps


def _stream_plan(s) -> StreamPlan:
    entries = tuple(StreamEntry(k.stream, tuple(k.waits), k.records) for k in s.kernels)
    return StreamPlan(entries, s.n_events, max(2, s.n_streams))


def two_branches():
    outs = []
    for _ in range(2):
        x = lm.tensor(RNG.standard_normal(64).astype(np.float32))
        a = lm.exp(x)  # materialized: read by two kernels
        outs += [a.sum(), a.max()]
        del a
    return outs


def test_stream_plan_orders_buffer_dependencies():
    s = lm.schedule(exp_sum_chain(lm.tensor(vec()), 3))
    verify_plan(_kernel_deps_on_arena_bytes(s), _stream_plan(s))


def test_arena_reuse_across_streams_is_ordered():
    s = lm.schedule(*two_branches())
    assert s.memory.reuses >= 1
    verify_plan(_kernel_deps_on_arena_bytes(s), _stream_plan(s))


# ----------------------------------------------------------------------------- plan_memory


def never(k, i, o) -> bool:
    return False


def always(k, i, o) -> bool:
    return True


def test_plan_memory_chain_inplace():
    # k0: leaf -> a ; k1: a -> b ; k2: b -> out
    ks = [([(100, 40)], [(1, 400)]), ([(1, 400)], [(2, 400)]), ([(2, 400)], [(3, 400)])]
    p = plan_memory(ks, {3}, always)
    assert p.inplace == 1 and p.buffers[2].inplace_of == 1 and p.buffers[2].offset == 0
    assert p.arena_bytes == _align(400)
    assert p.buffers[3].is_output and p.buffers[3].offset == -1
    assert p.planned_peak_bytes == _align(400) + 400


def test_plan_memory_chain_without_inplace_needs_two_blocks():
    ks = [([(100, 40)], [(1, 400)]), ([(1, 400)], [(2, 400)]), ([(2, 400)], [(3, 400)])]
    p = plan_memory(ks, {3}, never)
    assert p.inplace == 0
    assert p.buffers[1].offset != p.buffers[2].offset  # both live at k1
    assert p.arena_bytes == 2 * _align(400)


def test_plan_memory_inplace_needs_the_same_size_and_the_last_use():
    # b (400) is read again by k2: not dying at k1, so c cannot take it in place
    ks = [
        ([(100, 4)], [(1, 400)]),
        ([(1, 400)], [(2, 400), (3, 200)]),
        ([(1, 400), (2, 400), (3, 200)], [(9, 4)]),
    ]
    p = plan_memory(ks, {9}, always)
    assert p.inplace == 0
    # size mismatch: a 400-byte input dying into a 200-byte output is not in place
    ks = [([(100, 4)], [(1, 400)]), ([(1, 400)], [(2, 200)]), ([(2, 200)], [(9, 4)])]
    p = plan_memory(ks, {9}, always)
    assert p.inplace == 0


def test_plan_memory_asks_the_layout_callback():
    seen = []

    def ok(k, i, o):
        seen.append((k, i, o))
        return False

    ks = [([(100, 4)], [(1, 400)]), ([(1, 400)], [(2, 400)]), ([(2, 400)], [(9, 4)])]
    plan_memory(ks, {9}, ok)
    assert (1, 1, 2) in seen


def test_plan_memory_best_fit():
    # k0 writes a 1024-byte and a 256-byte buffer kept apart by `hold` (alive to the end);
    # when a 200-byte buffer is allocated, both blocks (plus what merged with them) are free:
    # best fit takes the smaller block, where the 256-byte buffer was.
    hold = (3, 64)
    ks = [
        ([(100, 4)], [(1, 1024), hold, (2, 256)]),
        ([(1, 1024)], [(4, 64)]),
        ([(2, 256), (4, 64)], [(5, 64)]),
        ([(5, 64)], [(6, 200)]),
        ([(6, 200), hold], [(9, 4)]),
    ]
    p = plan_memory(ks, {9}, never)
    assert p.buffers[6].offset == p.buffers[2].offset
    assert p.reuses >= 2
    assert_no_live_overlap(p.buffers.values())


def test_plan_memory_adjacent_free_blocks_merge():
    # two 256-byte blocks die together; a 512-byte buffer fits in their union
    ks = [
        ([(100, 4)], [(1, 256), (2, 256)]),
        ([(1, 256), (2, 256)], [(3, 64)]),
        ([(3, 64)], [(4, 512)]),
        ([(4, 512)], [(9, 4)]),
    ]
    p = plan_memory(ks, {9}, never)
    assert p.buffers[4].offset == min(p.buffers[1].offset, p.buffers[2].offset)
    assert p.arena_bytes == 512 + 64


def test_plan_memory_outputs_are_not_in_the_arena():
    ks = [([(100, 4)], [(1, 128), (2, 128)]), ([(1, 128)], [(3, 64)])]
    p = plan_memory(ks, {2, 3}, always)
    assert p.buffers[2].offset == -1 and p.buffers[3].offset == -1
    assert p.arena_bytes == 128
    assert p.planned_peak_bytes == 128 + 128 + 64


def test_plan_memory_empty_program():
    p = plan_memory([], set(), always)
    assert p.arena_bytes == 0 and p.planned_peak_bytes == 0 and not p.buffers


def test_plan_memory_releases_write_only_buffers():
    ks = [
        ([(0, 100)], [(1, 256), (2, 256)]),
        ([(2, 256)], [(3, 256)]),
        ([(3, 256)], [(4, 256)]),
        ([(4, 256)], [(5, 256)]),
    ]
    p = plan_memory(ks, {5}, never)
    assert p.arena_bytes == 512


@st.composite
def kernel_lists(draw):
    """Random programs: each kernel reads some earlier buffers and writes 1-2 new ones."""
    n = draw(st.integers(1, 10))
    ks, made, nid = [], [], 1000
    for _ in range(n):
        k_ins = []
        if made:
            picks = draw(st.lists(st.sampled_from(made), max_size=3, unique=True))
            k_ins = [(i, sz) for i, sz in picks]
        if not k_ins:
            k_ins = [(0, 64)]  # a user input (leaf), never planned
        outs = []
        for _ in range(draw(st.integers(1, 2))):
            nid += 1
            sz = draw(st.sampled_from([4, 64, 100, 256, 400, 1024]))
            outs.append((nid, sz))
        made.extend(outs)
        ks.append((k_ins, outs))
    read = {i for ins, _ in ks for i, _ in ins}
    # program outputs: everything never read, plus a random few
    out_ids = {i for i, _ in made if i not in read}
    out_ids |= set(draw(st.lists(st.sampled_from([i for i, _ in made]), max_size=2)))
    return ks, out_ids, draw(st.booleans())


@settings(max_examples=100, deadline=None)
@given(kernel_lists())
def test_plan_memory_property(prog):
    ks, out_ids, inplace = prog
    p = plan_memory(ks, out_ids, always if inplace else never)
    assert_no_live_overlap(p.buffers.values())
    inter = [b for b in p.buffers.values() if not b.is_output]
    for b in inter:
        assert b.offset % ALIGN == 0
        assert b.offset + _align(b.nbytes) <= p.arena_bytes
        if b.inplace_of is not None:
            d = p.buffers[b.inplace_of]
            assert d.nbytes == b.nbytes and d.offset == b.offset and d.last == b.first
    out_total = sum(b.nbytes for b in p.buffers.values() if b.is_output)
    assert p.planned_peak_bytes >= out_total
    if inter:
        assert p.planned_peak_bytes >= max(_align(b.nbytes) for b in inter)
    assert p.planned_peak_bytes <= p.arena_bytes + out_total
    if not inplace:
        assert p.inplace == 0


def test_arena_reuse_across_streams_computes_the_right_values(monkeypatch):
    pytest.importorskip("lazymath.backend.compile")
    monkeypatch.setenv("LAZYMATH_BACKEND", "llvm")
    monkeypatch.delenv("LAZYMATH_SCHEDULER", raising=False)
    n = 32768  # below the size where a sum splits over blocks (needs a GM workspace)
    xs = (RNG.standard_normal(n) * 0.1).astype(np.float32)
    ys = (RNG.standard_normal(n) * 0.1 + 3.0).astype(np.float32)
    want = [np.exp(xs).sum(), np.exp(xs).max(), np.exp(ys).sum(), np.exp(ys).max()]
    for _ in range(60):
        outs = []
        for v in (xs, ys):
            a = lm.exp(lm.tensor(v))
            outs += [a.sum(), a.max()]
            del a
        lm.realize(*outs)
        np.testing.assert_allclose([float(o.numpy()) for o in outs], want, rtol=1e-3)
