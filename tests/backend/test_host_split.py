"""The host work split of matmul kernels (`compile.host_blocks`, `templates.matmul.host_blocks`).

Protects: a big matmul runs as more host blocks than threads (a thread that starts late or runs
on a busier core no longer leaves the others waiting), every block holds whole N panels (B is
packed once per panel) or a run of whole items with at least SPLIT_PANEL_ROWS rows of its panel,
small or narrow matmuls keep one block per thread, and the result does
not depend on the block count at all (bit-identical for any BLOCK_NUM, both presets, llvm and
interp, float32 and float16, batched, on every target the host can execute).
"""

from __future__ import annotations

import numpy as np
import pytest

from lazymath.backend import compile as C
from lazymath.backend.native import host
from lazymath.backend.npu.kernel_ir import ArgView, MatmulKernel, SOp
from lazymath.backend.npu.templates import matmul as T
from lazymath.runtime.device import ASCEND910, ASCEND910B, get_spec


def mm_ir(batch, m, n, k, dtype="float32") -> MatmulKernel:
    a = ArgView(dtype, (*batch, m, k), (*([m * k] if batch else []), k, 1))
    b = ArgView(dtype, (*batch, k, n), (*([k * n] if batch else []), n, 1))
    out = ArgView("float32", (*batch, m, n), (*([m * n] if batch else []), n, 1))
    return MatmulKernel(batch, m, n, k, a, b, None, None, dtype, (), (SOp("acc", "float32"),),
                        (0,), (out,))  # fmt: skip


@pytest.mark.parametrize("spec", [ASCEND910, ASCEND910B], ids=lambda s: s.name)
@pytest.mark.parametrize("workers", [1, 2, 3, 16])
@pytest.mark.parametrize(
    "shape",
    [((), 256, 256, 256), ((), 512, 512, 512), ((), 1024, 1024, 1024), ((), 2048, 2048, 2048),
     ((), 4096, 4096, 4096), ((), 300, 1000, 64), ((6,), 128, 256, 128), ((), 4096, 64, 4096)],
)  # fmt: skip
def test_host_blocks_keep_whole_panels(spec, workers, shape):
    ir = mm_ir(*shape)
    prog = T.build(ir, spec, "mm")
    t = T.tile_matmul(ir, spec)
    panels = int(np.prod(ir.batch)) * t.n_panels
    threads = C.host_blocks(ir, prog, workers)  # without a spec: one block per thread
    blocks = C.host_blocks(ir, prog, workers, spec)
    assert 1 <= threads <= workers and threads <= prog.blocks
    assert blocks >= threads and blocks <= t.items
    if blocks > threads:  # a dynamic split: whole panels per block, enough work per block
        if panels % blocks or blocks > T.BLOCKS_PER_THREAD * threads:
            # runs of whole items holding at least HALF_PANEL_ROWS rows of their panel
            assert t.items % blocks == 0
            assert blocks <= T.ITEM_BLOCKS_PER_THREAD * threads
            assert min(t.items // blocks * t.mg_rows, ir.m) >= min(T.HALF_PANEL_ROWS, ir.m)
        flops = 2 * int(np.prod(ir.batch)) * ir.m * ir.n * ir.k
        assert flops // blocks >= C.MIN_FLOPS_PER_WORKER
    if threads > 1 and panels >= 2 * threads and panels % (2 * threads) == 0:
        assert blocks > threads  # enough panels: more blocks than threads


def test_big_square_matmuls_get_more_blocks_than_threads_on_two_cores():
    """The measured case (2 cores, ascend910): 1024^3 runs 8 blocks of half a 256-column panel
    (four 128-row items), 2048^3 16 blocks of two 512-row items (half a panel); 512^3 (2
    panels, 64-row items) keeps 2; 4096^3 (M groups of 2048 rows) 32 blocks of one item each."""
    got = {}
    for n in (512, 1024, 2048, 4096):
        ir = mm_ir((), n, n, n)
        got[n] = C.host_blocks(ir, T.build(ir, ASCEND910, "mm"), 2, ASCEND910)
    assert got == {512: 2, 1024: 8, 2048: 16, 4096: 32}


def _cases():
    """(target, spec, dtype, shape): both presets and dtypes natively, the forced targets once."""
    cases = [(None, "ascend910", "float32", ((), 70, 1000, 45)),
             (None, "ascend910b", "float16", ((5,), 33, 300, 20)),
             (None, "ascend910", "float16", ((5,), 33, 300, 20)),
             (None, "ascend910b", "float32", ((), 70, 1000, 45))]  # fmt: skip
    cases += [(t, "ascend910", "float32", ((3,), 33, 600, 20)) for t in host.executable_targets()
              if t]  # fmt: skip
    return [pytest.param(*c, id=f"{c[0] or 'native'}-{c[1]}-{c[2]}-{c[3]}") for c in cases]


@pytest.mark.parametrize(("target_cpu", "spec", "dtype", "shape"), _cases())
def test_result_does_not_depend_on_the_block_count(target_cpu, spec, dtype, shape, monkeypatch):
    """Every BLOCK_NUM from 1 to past the item count gives the same bits (each output element
    is one item's, its K order fixed), equal to numpy within float tolerance; blocks run
    serially and on the pool."""
    from lazymath._threads import block_pool

    if target_cpu:
        monkeypatch.setenv("LAZYMATH_TARGET_CPU", target_cpu)
    ir = mm_ir(*shape, dtype)
    k = C.compile_kernel(ir, get_spec(spec), "llvm")
    rng = np.random.default_rng(1)
    batch, m, n, kk = shape
    a = rng.uniform(-1, 1, (*batch, m, kk)).astype(dtype)
    b = rng.uniform(-1, 1, (*batch, kk, n)).astype(dtype)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    items = T.tile_matmul(ir, get_spec(spec)).items
    first = None
    for nb in sorted({1, 2, 3, k.blocks, items, items + 2}):
        out = np.full((*batch, m, n), np.nan, np.float32)
        argv = k.make_argv([a.reshape(-1), b.reshape(-1), out.reshape(-1)])
        if nb % 2:
            for i in range(nb):
                k.run_block(argv, i, nb)
        else:
            block_pool().run(k.run_block, argv, nb)
        if first is None:
            first = out
            np.testing.assert_allclose(out, want, rtol=2e-3 if dtype == "float16" else 2e-5,
                                       atol=1e-2 if dtype == "float16" else 1e-4)  # fmt: skip
        else:
            np.testing.assert_array_equal(out, first)


@pytest.mark.parametrize("spec", ["ascend910", "ascend910b"])
def test_interp_backend_splits_the_same_way(spec):
    """The interpreter runs the same program with the same host block count: same numbers."""
    ir = mm_ir((), 20, 600, 8)
    rng = np.random.default_rng(2)
    a = rng.uniform(-1, 1, (20, 8)).astype(np.float32)
    b = rng.uniform(-1, 1, (8, 600)).astype(np.float32)
    outs = []
    for backend in ("llvm", "interp"):
        k = C.compile_kernel(ir, get_spec(spec), backend)
        out = np.zeros((20, 600), np.float32)
        for nb in (1, 3):
            argv = k.make_argv([a.reshape(-1), b.reshape(-1), out.reshape(-1)])
            for i in range(nb):
                k.run_block(argv, i, nb)
            outs.append(out.copy())
    np.testing.assert_allclose(outs[0], a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    for o in outs[1:]:
        np.testing.assert_allclose(o, outs[0], rtol=1e-6, atol=1e-6)
