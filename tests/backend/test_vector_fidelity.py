"""Vector programs (elementwise, reduce, split reduce, row-resident) are a property of the device
and the kernel, like the Cube's (tests/backend/test_cube_fidelity.py): their block count comes
from the DeviceSpec, never from os.cpu_count(); the host mapping decides how many host threads
run those blocks, and the same program is correct for any block count."""

from __future__ import annotations

import numpy as np
import pytest

import lazymath as lm
from lazymath.backend import compile as C
from lazymath.backend.npu import cost
from lazymath.runtime.device import ASCEND910, ASCEND910B


@pytest.fixture(autouse=True)
def _scalars_folded(monkeypatch):
    """These tests call single kernels with hand-built argument lists (inputs, outputs), here and
    in their subprocesses: the Python scalars of their graphs are folded into the kernel
    (LAZYMATH_SCALAR_ARGS=0) rather than passed as 0-d inputs. Runtime scalars are
    tests/test_scalar_args.py's."""
    monkeypatch.setenv("LAZYMATH_SCALAR_ARGS", "0")


GRAPHS = {
    "elementwise": lambda x: lm.exp(x) * 2.0 + 1.0,
    "reduce_rows": lambda x: lm.sum(x, axis=1),
    "reduce_split": lambda x: lm.max(x),
    "rows": lambda x: lm.softmax(x, axis=-1),
}


def _ir(graph, spec):
    x = lm.tensor(np.random.default_rng(0).standard_normal((96, 1031)).astype(np.float32))
    (k,) = lm.schedule(GRAPHS[graph](x), spec=spec.name).kernels
    return k.ir


@pytest.mark.parametrize("spec", [ASCEND910, ASCEND910B], ids=lambda s: s.name)
@pytest.mark.parametrize("graph", sorted(GRAPHS))
def test_vector_program_does_not_depend_on_the_host(monkeypatch, spec, graph):
    ir = _ir(graph, spec)
    seen = []
    for cpus in (2, 16):
        monkeypatch.setattr(C, "num_threads", lambda cpus=cpus: cpus)  # the host mapping's count
        prog = C.build_program(ir, spec, "k")
        est = cost.estimate(prog, spec)
        seen.append((str(prog), prog.blocks, est.total, C.host_blocks(ir, prog)))
    (text2, blocks2, tot2, hb2), (text16, blocks16, tot16, hb16) = seen
    assert text2 == text16 and blocks2 == blocks16 and tot2 == tot16
    assert 1 <= blocks2 <= spec.vector_cores
    assert hb2 <= min(2, blocks2) and hb16 <= min(16, blocks16)


@pytest.mark.parametrize("blocks", [1, 2, 3, 7])
@pytest.mark.parametrize("graph", sorted(GRAPHS))
def test_vector_program_is_correct_for_any_host_block_count(graph, blocks):
    """run_block(argv, b, n) with n host blocks, whatever the program's device block count."""
    rng = np.random.default_rng(1)
    xn = rng.standard_normal((96, 1031)).astype(np.float32)
    want = GRAPHS[graph](lm.tensor(xn)).numpy()
    ck = C.compile_kernel(_ir(graph, ASCEND910), ASCEND910, backend="llvm")
    out = np.zeros(want.shape, np.float32)
    argv = ck.make_argv([xn, out])
    for b in range(blocks):
        ck.run_block(argv, b, blocks)
    np.testing.assert_allclose(out, want, rtol=2e-6, atol=1e-6)
