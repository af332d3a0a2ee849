"""Matmul template + Cube ISA against numpy (float64 reference) on both presets and backends.

Protects: awkward shapes (0, 1, primes, non-multiples of 16), batched/broadcast operands,
transposed and flipped views absorbed by packing, fused prologues and epilogues, spec-legal
tiling, and the Cube cycle formula.
"""

from __future__ import annotations

import numpy as np
import pytest

from lazymath.backend.compile import compile_kernel
from lazymath.backend.npu import isa
from lazymath.backend.npu import isa_cube as cube
from lazymath.backend.npu.kernel_ir import ArgView, MatmulKernel, SOp
from lazymath.backend.npu.templates import matmul as T
from lazymath.runtime.device import ASCEND910, ASCEND910B, get_spec

SPECS = ["ascend910", "ascend910b"]
BACKENDS = ["llvm", "interp"]
RNG = np.random.default_rng(0)


def view_of(arr: np.ndarray, base: np.ndarray) -> ArgView:
    """ArgView of numpy view `arr` over the flat buffer `base`."""
    item = arr.itemsize
    off = (arr.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // item
    return ArgView(arr.dtype.name, arr.shape, tuple(s // item for s in arr.strides), off)


def operand(shape, dtype, transpose=False, flip=False, lo=-1.0, hi=1.0):
    """(array view, flat base) with the requested layout."""
    full = shape[:-2] + (shape[-1], shape[-2]) if transpose else shape
    base = RNG.uniform(lo, hi, size=max(int(np.prod(full)), 1)).astype(dtype)
    arr = base[: int(np.prod(full))].reshape(full)
    if transpose:
        arr = np.swapaxes(arr, -1, -2)
    if flip:
        arr = arr[..., ::-1, :]
    return arr, base


def run_matmul(a, abase, b, bbase, *, in_dtype, spec, backend, epilogue=None, results=None,
               epi=(), out_dtypes=("float32",), a_pro=None, b_pro=None):  # fmt: skip
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    m, kk = a.shape[-2:]
    n = b.shape[-1]
    av = np.broadcast_to(a, batch + a.shape[-2:])
    bv = np.broadcast_to(b, batch + b.shape[-2:])
    epilogue = epilogue or (SOp("acc", "float32"),)
    results = results or (len(epilogue) - 1,)
    outs = [np.zeros(batch + (m, n), dt) for dt in out_dtypes]
    epi_views = []
    for arr, base in epi:
        arrb = np.broadcast_to(arr, batch + (m, n))
        epi_views.append(view_of(arrb, base))
    ir = MatmulKernel(batch, m, n, kk, view_of(av, abase), view_of(bv, bbase), a_pro, b_pro,
                      in_dtype, tuple(epi_views), epilogue, results,
                      tuple(view_of(o, o.reshape(-1)) for o in outs))  # fmt: skip
    k = compile_kernel(ir, spec, backend)
    k(abase, bbase, *[base for _, base in epi], *[o.reshape(-1) for o in outs])
    return outs, k


def ref_mm(a, b) -> np.ndarray:
    return np.matmul(a.astype(np.float64), b.astype(np.float64))


def tol(dtype: str, k: int) -> float:
    return (2e-3 if dtype == "float16" else 2e-5) * max(1.0, np.sqrt(k))


SHAPES = [(17, 31, 13), (1, 1, 1), (1, 40, 7), (37, 1, 19), (100, 300, 70), (5, 7, 0),
          (0, 5, 3), (97, 16, 257)]  # fmt: skip


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_plain_matmul(spec, backend, dtype, shape):
    m, n, kk = shape
    if backend == "interp" and m * n * kk > 200_000:
        pytest.skip("interpreter: keep the suite fast")
    a, ab = operand((m, kk), dtype)
    b, bb = operand((kk, n), dtype)
    (c,), _ = run_matmul(a, ab, b, bb, in_dtype=dtype, spec=spec, backend=backend)
    np.testing.assert_allclose(c, ref_mm(a, b), atol=tol(dtype, kk), rtol=tol(dtype, kk))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("ta,tb,flip", [(True, False, False), (False, True, False),
                                        (True, True, True)])  # fmt: skip
def test_transposed_and_flipped_views(backend, ta, tb, flip):
    a, ab = operand((23, 41), "float32", transpose=ta, flip=flip)
    b, bb = operand((41, 35), "float32", transpose=tb)
    (c,), _ = run_matmul(a, ab, b, bb, in_dtype="float32", spec="ascend910", backend=backend)
    np.testing.assert_allclose(c, ref_mm(a, b), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_batched_with_broadcast(spec, backend):
    a, ab = operand((3, 1, 9, 20), "float16")  # broadcast over the second batch axis
    b, bb = operand((4, 20, 18), "float16")  # broadcast over the first
    (c,), _ = run_matmul(a, ab, b, bb, in_dtype="float16", spec=spec, backend=backend)
    assert c.shape == (3, 4, 9, 18)
    np.testing.assert_allclose(c, ref_mm(a, b), atol=1e-2, rtol=1e-2)


def _relu_scale(dt: str, scale: float):
    return (SOp("acc", "float32"), SOp("relu", "float32", (0,)), SOp("cast", dt, (1,)),
            SOp("const", dt, (), scale), SOp("mul", dt, (2, 3)))  # fmt: skip


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_relu_times_scale_epilogue(spec, backend, dtype):
    a, ab = operand((45, 60), dtype)
    b, bb = operand((60, 70), dtype)
    (c,), k = run_matmul(a, ab, b, bb, in_dtype=dtype, spec=spec, backend=backend,
                         epilogue=_relu_scale(dtype, 0.5), out_dtypes=(dtype,))  # fmt: skip
    expect = np.maximum(ref_mm(a, b), 0) * 0.5
    np.testing.assert_allclose(
        c.astype(np.float64), expect, atol=tol(dtype, 60), rtol=tol(dtype, 60)
    )
    kinds = {type(i) for i in k.program.instructions()}
    assert cube.Mmad in kinds and cube.FixPipe in kinds
    if spec == "ascend910":  # coupled: the mul runs on the Vector unit in UB
        assert isa.VScalar in kinds and isa.CopyOut in kinds


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_bias_add_clip_sigmoid_two_outputs(spec, backend):
    m, n, kk = 19, 37, 29
    a, ab = operand((m, kk), "float32")
    b, bb = operand((kk, n), "float32")
    bias_base = RNG.uniform(-1, 1, n).astype(np.float32)
    bias = np.broadcast_to(bias_base, (m, n))  # stride 0 over rows
    epi = (SOp("acc", "float32"), SOp("load", "float32", (), 0), SOp("add", "float32", (0, 1)),
           SOp("const", "float32", (), -0.5), SOp("maximum", "float32", (2, 3)),
           SOp("const", "float32", (), 0.75), SOp("minimum", "float32", (4, 5)),
           SOp("sigmoid", "float32", (2,)), SOp("cast", "float16", (7,)))  # fmt: skip
    (c0, c1), _ = run_matmul(a, ab, b, bb, in_dtype="float32", spec=spec, backend=backend,
                             epilogue=epi, results=(6, 8), epi=[(bias, bias_base)],
                             out_dtypes=("float32", "float16"))  # fmt: skip
    x = ref_mm(a, b) + bias_base
    np.testing.assert_allclose(c0, np.clip(x, -0.5, 0.75), atol=1e-5)
    np.testing.assert_allclose(c1.astype(np.float64), 1 / (1 + np.exp(-x)), atol=2e-3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_prologue_and_cast_output(backend):
    a, ab = operand((13, 21), "float16")
    b, bb = operand((21, 11), "float16")
    pro = (SOp("load", "float16", (), 0), SOp("abs", "float16", (0,)))
    epi = (SOp("acc", "float32"), SOp("relu", "float32", (0,)), SOp("cast", "float16", (1,)))
    (c,), k = run_matmul(a, ab, b, bb, in_dtype="float16", spec="ascend910b", backend=backend,
                         epilogue=epi, out_dtypes=("float16",), a_pro=pro)  # fmt: skip
    np.testing.assert_allclose(c.astype(np.float64), np.maximum(ref_mm(np.abs(a), b), 0),
                               atol=1e-2)  # fmt: skip
    fixpipes = [i for i in k.program.instructions() if isinstance(i, cube.FixPipe)]
    assert fixpipes and all(f.relu and not f.epilogue for f in fixpipes)  # FixPipe does relu+cast


def test_k_zero_gives_epilogue_of_zero():
    a, ab = operand((4, 0), "float32")
    b, bb = operand((0, 6), "float32")
    epi = (SOp("acc", "float32"), SOp("const", "float32", (), 2.0), SOp("add", "float32", (0, 1)))
    for spec in SPECS:
        (c,), _ = run_matmul(a, ab, b, bb, in_dtype="float32", spec=spec, backend="llvm",
                             epilogue=epi)  # fmt: skip
        np.testing.assert_array_equal(c, np.full((4, 6), 2.0, np.float32))


@pytest.mark.parametrize("spec", [ASCEND910, ASCEND910B])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize(
    "shape", [(4096, 4096, 4096), (256, 256, 256), (1, 5000, 3), (7, 9, 70000)]
)
def test_tiling_is_spec_legal(spec, dtype, shape):
    m, n, kk = shape
    a = ArgView(dtype, (m, kk), (kk, 1))
    b = ArgView(dtype, (kk, n), (n, 1))
    o = ArgView("float32", (m, n), (n, 1))
    ir = MatmulKernel((), m, n, kk, a, b, None, None, dtype, (), (SOp("acc", "float32"),), (0,),
                      (o,))  # fmt: skip
    prog = T.build(ir, spec, "mm")  # raises BufferOverflowError when a capacity is exceeded
    totals = prog.scope_bytes(spec)
    for scope in ("L1", "L0A", "L0B", "L0C"):
        assert 0 < totals[scope] <= spec.capacity(scope)
    t = T.tile_matmul(ir, spec)
    assert t.tm % 16 == 0 and t.tn % 16 == 0 and t.kc % 16 == 0
    if m >= 256 and n >= 256:  # enough work: the output is split over the device's Cube cores
        assert t.items >= 2 and prog.blocks == min(t.items, spec.cube_cores)


def test_cube_cycles_worked_example():
    """AscendC tiling guide: 128x64x256 fp16 takes 512 Cube cycles; fp32 runs 4x slower."""
    assert cube.cube_cycles(128, 256, 64, "float16", get_spec("ascend910")) == 512
    assert cube.cube_cycles(128, 256, 64, "float32", get_spec("ascend910b")) == 2048
    assert cube.cube_cycles(17, 31, 13, "float16", ASCEND910) == 2 * 1 * 2


def test_program_lists_the_cube_data_path():
    a = ArgView("float16", (64, 64), (64, 1))
    ir = MatmulKernel((), 64, 64, 64, a, a, None, None, "float16", (), (SOp("acc", "float32"),),
                      (0,), (ArgView("float32", (64, 64), (64, 1)),))  # fmt: skip
    text = str(T.build(ir, ASCEND910B, "mm"))
    for word in ("load_nz", "load_l0a", "load_l0b", "mmad.float16", "fixpipe_l0c_to_gm"):
        assert word in text


@pytest.mark.parametrize("spec", SPECS)
def test_relu_matmul_times_scale_is_one_cube_kernel(spec):
    """mul(relu(matmul(A, B)), scale) compiles to a single Cube kernel that writes C once."""
    import lazymath as lm
    from lazymath.api import schedule

    a = RNG.uniform(-1, 1, (40, 24)).astype(np.float16)
    b = RNG.uniform(-1, 1, (24, 33)).astype(np.float16)
    ta, tb = lm.tensor(a), lm.tensor(b)
    kernels = schedule(lm.relu(ta @ tb) * 0.5, spec=spec).kernels
    if spec == "ascend910":  # coupled core: the mul runs in UB inside the Cube kernel
        (k,) = kernels
        assert k.unit == "cube" and list(k.ops) == ["matmul", "relu", "mul"]
    else:  # split 910B: FixPipe keeps relu, the fusion layer moves mul to a Vector kernel
        k = kernels[0]
        assert k.unit == "cube" and list(k.ops) == ["matmul", "relu"] and len(kernels) == 2
    assert k.kind == "matmul"
    got = (lm.relu(ta @ tb) * 0.5).numpy()
    np.testing.assert_allclose(got.astype(np.float64), np.maximum(ref_mm(a, b), 0) * 0.5,
                               atol=1e-2)  # fmt: skip


def test_cost_model_charges_the_worked_example():
    """A 128x64 @ 64x256 fp16 matmul keeps the Cube busy exactly 512 cycles (AscendC guide)."""
    from lazymath.backend.npu.cost import estimate

    a = ArgView("float16", (128, 64), (64, 1))
    b = ArgView("float16", (64, 256), (256, 1))
    ir = MatmulKernel((), 128, 256, 64, a, b, None, None, "float16", (), (SOp("acc", "float32"),),
                      (0,), (ArgView("float32", (128, 256), (256, 1)),))  # fmt: skip
    prog = T.build(ir, ASCEND910B, "mm")
    kc = estimate(prog, ASCEND910B, block_num=1)
    assert kc.pipes["Cube"] == 512
    assert not kc.unknown and kc.pipes["MTE2"] > 0 and kc.pipes["FixPipe"] > 0


@pytest.mark.parametrize("spec", [ASCEND910, ASCEND910B])
@pytest.mark.parametrize("n", [384, 768, 2304, 1000, 4096])
def test_work_split_is_balanced(spec, n):
    """Items (the unit of block work) have nearly equal size and spread over the device's Cube
    cores, so no core idles while another finishes a larger share (384 used to be 256 + 128
    columns)."""
    a = ArgView("float32", (n, n), (n, 1))
    ir = MatmulKernel((), n, n, n, a, a, None, None, "float32", (), (SOp("acc", "float32"),),
                      (0,), (ArgView("float32", (n, n), (n, 1)),))  # fmt: skip
    t = T.tile_matmul(ir, spec)
    widths = [min(t.tn, n - p * t.tn) for p in range(t.n_panels)]
    # panels are 16-column aligned, so only the last can be narrower: by < 16 per panel
    assert max(widths) - min(widths) < 16 * t.n_panels and t.tn % 16 == 0
    assert t.items == t.n_panels * t.m_groups
    cores = spec.cube_cores
    if t.items >= cores:  # the busiest core does at most ~1/8 more than the average
        assert -(-t.items // cores) * cores <= 1.15 * t.items
    assert t.n0 % 16 == 0 and t.n0 <= t.tn
