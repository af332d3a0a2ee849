"""The host roofline model (backend/host/roofline.py): deterministic given a fake host description,
so nothing here times anything (the probes are checked for what they compute, not how fast)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import lazymath as lm
from lazymath.backend.host import roofline as rl
from lazymath.backend.host import vmath_native
from lazymath.backend.native import host
from lazymath.backend.npu import vmath
from lazymath.backend.npu.kernel_ir import contiguous_view

GB = 1e9
ZEN5 = rl.Uarch(512, 2, 4, 2.5)
ZEN4 = rl.Uarch(256, 2, 4, 3.5)


def fake(vector_bits: int = 512, uarch: rl.Uarch = ZEN5, threads: int = 2,
         nt_bw: float = 0.0) -> rl.HostRoofs:  # fmt: skip
    """A host with round numbers: 2 GHz, DRAM 20 GB/s on 1 thread / 30 on 2, LLC 100 GB/s per
    thread below 8 MiB (16 MiB LLC); `nt_bw`: DRAM with non-temporal stores (0: unmeasured)."""
    return rl.HostRoofs("fake", vector_bits, uarch, clock_hz=2e9, threads=threads,
                        dram_bw1=20 * GB, dram_bw=30 * GB, cache_bw1=100 * GB,
                        llc_bytes=16 << 20, nt_bw=nt_bw)  # fmt: skip


def kernel_ir(t):
    (k,) = lm.schedule(t).kernels
    return k.ir


def test_elementwise_add_is_memory_bound_with_exact_bounds():
    n = 1 << 22  # 16 MiB in, 16 MiB out: DRAM
    x = lm.tensor(np.ones(n, np.float32))
    roof = rl.kernel_roof(kernel_ir(x + 1.0), 2, fake())
    assert roof.bytes == 2 * 4 * n + 4  # x, the result, and the runtime scalar 1.0 (0-d)
    assert roof.level == "DRAM"
    assert roof.memory_s == pytest.approx(8 * n / (30 * GB))
    # one add per element: 32 bits of n lanes over 4 pipes x 512 bits at 2 GHz on 2 cores
    assert roof.compute_s == pytest.approx(n * 32 / (4 * 512) / (2e9 * 2))
    assert roof.bound == "memory"
    assert roof.roof_s == roof.memory_s
    assert roof.fraction(2 * roof.roof_s) == pytest.approx(0.5)
    text = roof.describe(2 * roof.roof_s)
    assert "memory-bound" in text and "50% of the memory roof" in text
    assert roof.fraction(0) is None


def test_one_thread_and_cache_levels():
    h = fake()
    assert h.bandwidth(1 << 20, 1) == (100 * GB, "LLC")
    assert h.bandwidth(1 << 20, 2) == (200 * GB, "LLC")  # private caches scale with threads
    assert h.bandwidth(64 << 20, 1) == (20 * GB, "DRAM")
    assert h.bandwidth(64 << 20, 2) == (30 * GB, "DRAM")
    assert h.bandwidth(64 << 20, 8) == (30 * GB, "DRAM")  # capped at the host's threads
    x = lm.tensor(np.ones(1 << 22, np.float32))
    one = rl.kernel_roof(kernel_ir(x * 3.0), 1, h)
    two = rl.kernel_roof(kernel_ir(x * 3.0), 2, h)
    assert one.threads == 1 and two.threads == 2
    assert one.compute_s == pytest.approx(2 * two.compute_s)
    assert one.memory_s == pytest.approx(two.memory_s * 30 / 20)


def test_vector_width_comes_from_the_target_and_the_datapath_from_the_host():
    x = lm.tensor(np.ones(1 << 20, np.float32))
    ir = kernel_ir(lm.exp(lm.sin(x) * 0.5 + 1.0) * x)
    wide = rl.kernel_roof(ir, 2, fake(512)).compute_s
    avx2 = rl.kernel_roof(ir, 2, fake(256)).compute_s
    assert avx2 == pytest.approx(2 * wide)  # AVX2 code: half the lanes per slot
    # Zen 4's 512-bit ops take two 256-bit slots: no faster than AVX2 code on the same pipes
    zen4 = rl.kernel_roof(ir, 2, fake(512, ZEN4)).compute_s
    assert zen4 == pytest.approx(rl.kernel_roof(ir, 2, fake(256, ZEN4)).compute_s)
    assert zen4 == pytest.approx(avx2)


def test_chain_work_is_the_sum_of_its_ops():
    n = 1000
    x = lm.tensor(np.ones(n, np.float32))
    work, nbytes = rl.kernel_work(kernel_ir(lm.exp(lm.sin(x) * 0.5 + 1.0) * x))
    expect = rl.Work()
    for op in ("sin", "mul", "add", "exp", "mul"):
        expect.add(rl.op_work(op, "float32"), n)
    assert (work.fma, work.alu, work.div) == (expect.fma, expect.alu, expect.div)
    assert nbytes == 2 * 4 * n + 2 * 4  # x, the result and the runtime scalars 0.5 and 1.0 (0-d)


def test_native_exp_work_counts_its_llvm_instructions():
    from llvmlite import ir

    fn = vmath_native.define_native(ir.Module(), "vexp", "float32")
    ops = [i.opname for i in fn.blocks[0].instructions if i.opname not in ("ret", "bitcast")]
    calls = [i.callee.name for i in fn.blocks[0].instructions if i.opname == "call"]
    w = rl.native_work("vexp", "float32")
    fmas = ops.count("fmul") + sum(".fma." in c for c in calls)
    assert w.fma == 32 * fmas and fmas >= 5  # the Horner steps at least
    assert w.fma + w.alu + w.div == 32 * len(ops)
    assert rl.op_work("exp", "float32").fma == w.fma
    # float16 is computed in float32, float64 with its own (longer) polynomial
    assert rl.op_work("exp", "float16").fma == w.fma
    assert rl.op_work("exp", "float64").fma > 2 * w.fma


def test_composite_and_divider_costs():
    sin = rl.composite_work("sin", "float32")
    # every vector instruction of the common path, GetValue steps excluded
    assert 0 < sin.ops / 32 <= vmath.composite_instructions("sin")
    assert sin.ops > rl.native_work("vexp", "float32").ops
    assert rl.op_work("div", "float32").div == 32
    assert rl.op_work("rsqrt", "float32").div == 64  # sqrt, then 1 / it
    assert rl.op_work("add", "int32").alu == 32
    assert rl.op_work("mul", "float64").fma == 64
    assert rl.op_work("load", "float32").ops == 0


def test_softmax_divides_once_per_row():
    rows, cols = 7, 129
    x = lm.tensor(np.ones((rows, cols), np.float32))
    work, _ = rl.kernel_work(kernel_ir(lm.softmax(x, axis=-1)))
    # max, sub, exp, sum, x * (1 / sum): the divide per row, the multiply per element
    exp = rl.op_work("exp", "float32")
    assert work.div == 32 * rows + exp.div * rows * cols
    assert work.fma == exp.fma * rows * cols + 32 * rows * cols
    assert work.alu == exp.alu * rows * cols + 3 * 32 * rows * cols


def test_matmul_is_compute_bound_and_aicpu_has_no_roof():
    n = 512
    a = lm.tensor(np.ones((n, n), np.float32))
    roof = rl.kernel_roof(kernel_ir(a @ a), 2, fake())
    assert roof.compute_s == pytest.approx(n**3 * 32 / (2 * 512) / (2e9 * 2))
    assert roof.bound == "compute"
    assert rl.kernel_work(None) is None


def test_zero_size_kernel():
    ir = lm.backend.npu.kernel_ir.ElementwiseKernel((0,), (contiguous_view("float32", (0,)),),
                                                (contiguous_view("float32", (0,)),),
                                                (lm.backend.npu.kernel_ir.SOp("load", "float32",
                                                                          (), 0),), (0,))  # fmt: skip
    roof = rl.kernel_roof(ir, 1, fake())
    assert roof.bytes == 0 and roof.roof_s == 0.0 and roof.fraction(1e-6) == 0.0


def test_host_roofs_measure_once_and_cache_on_disk(monkeypatch, tmp_path):
    monkeypatch.setenv("LAZYMATH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(rl, "_cache", rl._Cache())
    calls = []

    def measure(llc, threads):
        calls.append((llc, threads))
        return {"clock_hz": 3e9, "dram_bw1": 10 * GB, "dram_bw": 15 * GB, "cache_bw1": 50 * GB,
                "nt_bw": 20 * GB}  # fmt: skip

    monkeypatch.setattr(rl, "_measure", measure)
    h = rl.host_roofs(host.target())
    assert h.source == "measured" and h.clock_hz == 3e9 and h.dram_bw == 15 * GB
    assert rl.host_roofs(host.target()) is h and len(calls) == 1
    data = json.loads((tmp_path / "host_roofs.json").read_text())
    (entry,) = data.values()
    assert entry["dram_bw1"] == 10 * GB
    monkeypatch.setattr(rl, "_cache", rl._Cache())  # a new process: read from disk
    again = rl.host_roofs(host.target())
    assert again.source == "cached" and again.dram_bw == 15 * GB and len(calls) == 1
    assert "15.0 GB/s on" in again.describe() and again.nt_bw == 20 * GB
    assert "non-temporal stores DRAM 20.0 GB/s on" in again.describe()
    # measuring again keeps the best of old and new per quantity (load only slows a probe)
    slower = {"clock_hz": 2e9, "dram_bw1": 12 * GB, "dram_bw": 9 * GB, "cache_bw1": 50 * GB,
              "nt_bw": 25 * GB}  # fmt: skip
    monkeypatch.setattr(rl, "_measure", lambda llc, threads: calls.append(1) or dict(slower))
    best = rl.host_roofs(host.target(), refresh=True)
    assert len(calls) == 2 and best.source == "measured"
    assert (best.clock_hz, best.dram_bw1, best.dram_bw, best.nt_bw) == (3e9, 12 * GB, 15 * GB,
                                                                         25 * GB)  # fmt: skip
    entry = json.loads((tmp_path / "host_roofs.json").read_text())[next(iter(data))]
    assert entry["dram_bw1"] == 12 * GB and entry["dram_bw"] == 15 * GB


def test_clock_probe_runs_the_add_chain():
    with rl._ClockProbe() as fn:
        if fn is None:
            pytest.skip("the clock probe is x86-64 Linux machine code")
        assert fn(1) == rl._ADDS
        assert fn(37) == 37 * rl._ADDS


def test_copy_probe_copies():
    bw = rl.measure_copy(1 << 16, 2, reps=2, inner=1)
    assert math.isfinite(bw) and bw > 0


def test_a_host_roofs_file_without_the_nt_bandwidth_is_measured_again(monkeypatch, tmp_path):
    """An entry written before the non-temporal probe existed lacks nt_bw: read as a miss, so
    the probe runs once instead of the host reporting 'not measured' forever."""
    monkeypatch.setenv("LAZYMATH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(rl, "_cache", rl._Cache())
    old = {"clock_hz": 3e9, "dram_bw1": 10 * GB, "dram_bw": 15 * GB, "cache_bw1": 50 * GB}
    monkeypatch.setattr(rl, "_measure", lambda llc, threads: dict(old))
    rl.host_roofs(host.target())  # writes an entry without nt_bw, as an older lazymath did
    monkeypatch.setattr(rl, "_cache", rl._Cache())
    monkeypatch.setattr(rl, "_measure", lambda llc, threads: {**old, "nt_bw": 22 * GB})
    h = rl.host_roofs(host.target())
    assert h.source == "measured" and h.nt_bw == 22 * GB


def test_non_temporal_memory_bound_is_shown_beside_the_normal_one():
    n = 1 << 22  # 32 MiB moved: DRAM
    x = lm.tensor(np.ones(n, np.float32))
    ir = kernel_ir(x + 1.0)
    plain = rl.kernel_roof(ir, 2, fake())
    assert plain.memory_nt_s is None  # not measured: nothing claimed
    assert "non-temporal" not in plain.describe(1e-3) and "non-temporal" not in fake().describe()
    h = fake(nt_bw=45 * GB)
    two = rl.kernel_roof(ir, 2, h)
    assert two.memory_s == plain.memory_s  # the roof stays the normal-store one
    assert two.memory_nt_s == pytest.approx(two.bytes / (45 * GB))
    one = rl.kernel_roof(ir, 1, h)  # one thread: 20 GB/s normal, scaled by the same 1.5x
    assert one.memory_nt_s == pytest.approx(one.bytes / (30 * GB))
    text = two.describe(2 * two.memory_s)
    assert "50% of the memory roof" in text
    assert f"{two.memory_nt_s * 1e6:.1f} us with non-temporal stores" in text
    assert f"({two.memory_nt_s / (2 * two.memory_s):.0%} of the non-temporal-store roof)" in text
    assert "non-temporal stores DRAM 45.0 GB/s on 2 (1.50x normal stores)" in h.describe()
    small = rl.kernel_roof(kernel_ir(lm.tensor(np.ones(1 << 10, np.float32)) + 1.0), 2, h)
    assert small.level == "LLC" and small.memory_nt_s is None  # cache-resident: no DRAM store


def test_nt_copy_code_is_the_documented_loop():
    code = rl._nt_copy_code()
    assert code.count(bytes.fromhex("c5fc2b")) == 4  # four vmovntps ymm stores
    assert code.count(bytes.fromhex("c5fc10")) == 4  # four vmovups ymm loads
    assert code.endswith(bytes.fromhex("0faef8c5f877c3"))  # sfence; vzeroupper; ret
    # the jnz lands on the first load
    jnz = code.index(bytes.fromhex("0f85"))
    rel = int.from_bytes(code[jnz + 2 : jnz + 6], "little", signed=True)
    assert jnz + 6 + rel == 0


def nt_copy_or_skip():
    probe = rl._NtCopyProbe()
    copy = probe.__enter__()
    if copy is None:
        pytest.skip("the non-temporal copy probe is AVX machine code on x86-64 Linux")
    return probe, copy


@pytest.mark.parametrize("nbytes", [0, 128, 128 * 37, 1 << 20])
def test_nt_copy_probe_copies_exactly(nbytes):
    probe, copy = nt_copy_or_skip()
    try:
        rng = np.random.default_rng(nbytes)
        src = rl.aligned_empty(nbytes).view(np.uint32)
        src[:] = rng.integers(0, 2**32, src.size, dtype=np.uint32)
        dst = rl.aligned_empty(nbytes + 256)
        dst[:] = 0xA5
        copy(dst[:nbytes].view(np.uint32), src)
        assert np.array_equal(dst[:nbytes].view(np.uint32), src)
        assert (dst[nbytes:] == 0xA5).all()  # nothing written past the end
    finally:
        probe.__exit__(None, None, None)


def test_nt_copy_probe_refuses_what_would_fault():
    probe, copy = nt_copy_or_skip()
    try:
        a = rl.aligned_empty(1024)
        with pytest.raises(ValueError, match="multiple of 128"):
            copy(a[:100], a[512:612])
        with pytest.raises(ValueError, match="bytes into"):
            copy(a[:256], a[512:640])
        with pytest.raises(ValueError, match="32-byte aligned"):
            copy(a[16:144], a[512:640])
        with pytest.raises(ValueError, match="C-contiguous"):
            copy(a[:512:2], a[512:768])
        with pytest.raises(ValueError, match="C-contiguous"):
            copy(a[:128], a[512:640].tolist())
        ro = a[:128]
        ro.flags.writeable = False
        with pytest.raises(ValueError, match="read-only"):
            copy(ro, a[512:640])
    finally:
        probe.__exit__(None, None, None)


def test_nt_bandwidth_probe_measures_something_or_nothing():
    bw = rl.measure_nt_copy(1 << 16, 2, reps=2, inner=1)
    assert math.isfinite(bw) and bw >= 0  # 0.0: no AVX / not x86-64 Linux
    with rl._NtCopyProbe() as copy:
        assert (bw > 0) == (copy is not None)


def test_nt_probe_is_off_without_avx(monkeypatch):
    """A host without AVX (an old or emulated core) gets no probe, not an illegal instruction."""
    monkeypatch.setattr(rl.llvm, "get_host_cpu_features", lambda: {"sse2": True})
    with rl._NtCopyProbe() as copy:
        assert copy is None
    assert rl.measure_nt_copy(1 << 16, 1) == 0.0


@pytest.mark.parametrize("nbytes,align", [(0, 64), (1, 64), (1000, 64), (4096, 4096), (7, 32)])
def test_aligned_empty(nbytes, align):
    a = rl.aligned_empty(nbytes, align)
    assert a.nbytes == nbytes and a.dtype == np.uint8
    assert nbytes == 0 or a.ctypes.data % align == 0  # numpy gives an empty view any address
    with pytest.raises(ValueError, match="power of 2"):
        rl.aligned_empty(nbytes, 48)


def test_explain_and_profile_show_the_host_roof(monkeypatch):
    h = fake()
    monkeypatch.setattr(rl, "host_roofs", lambda target, refresh=False: h)
    x = lm.tensor(np.arange(1 << 16, dtype=np.float32))
    text = lm.explain(lm.exp(x) * 2.0)
    assert "    host:  compute-bound on this host (" in text  # exp: 27 ops per element
    assert h.describe() in text
    with lm.profile() as p:
        lm.realize(lm.exp(x) * 3.0)
    (k,) = p.kernels
    if k.roof is None:  # the interpreter backend: no host roof
        assert lm.backend.compile.default_backend() != "llvm"
        return
    assert k.roof_us == pytest.approx(k.roof.roof_s * 1e6)
    assert k.roof_fraction == pytest.approx(k.roof.roof_s / (k.host_us / 1e6))
    assert "roof us" in p.summary(print_=False)
