"""MIX kernels (AIC + AIV on the split 910B) are two instruction streams joined by cross-core
flags: the program structure, the listing, the verifier and the cost model's two-stream
simulation (programs built and costed, not run), then the kernels' values on both presets and
both backends (the host runs the same body in program order: the split changes the device
model, not the math)."""

import dataclasses

import numpy as np
import pytest

import lazymath as lm
from lazymath.backend.compile import build_program
from lazymath.backend.npu import cost, isa
from lazymath.backend.npu.templates.matmul import tile_matmul
from lazymath.fusion import rules


@pytest.fixture(autouse=True)
def _scalars_folded(monkeypatch):
    """These tests run single programs with hand-built argument lists (weights, inputs, outputs,
    workspace): the Python scalars of their graphs are folded into the kernel
    (LAZYMATH_SCALAR_ARGS=0), not passed as 0-d inputs. Runtime scalars are
    tests/test_scalar_args.py's."""
    monkeypatch.setenv("LAZYMATH_SCALAR_ARGS", "0")


SPEC = "ascend910b"
N = 512  # big enough for several tiles per block and both workspace slots in use


def _mats(dtype="float16", n=N):
    rng = np.random.default_rng(0)
    return (lm.tensor(rng.standard_normal((n, n)).astype(dtype)),
            lm.tensor(rng.standard_normal((n, n)).astype(dtype)))  # fmt: skip


def _conv_args(length=700):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 16, length)).astype(np.float32)
    w = rng.standard_normal((32, 16, 5)).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    return x, w, b


# kind -> (graph builder, the rules flag whose False gives the two-kernel form)
KINDS = {
    "colsum": (lambda A, B: lm.sum(A @ B, axis=0), "MATMUL_COL_SUM"),
    "rowsum": (lambda A, B: lm.sum(A @ B, axis=-1), "MATMUL_ROW_REDUCE"),
    "softmax": (lambda A, B: lm.softmax(A @ B, axis=-1), "MATMUL_SOFTMAX"),
}


def _programs(out):
    s = lm.schedule(out, spec=SPEC)
    return [(k, build_program(k.group.ir, s.spec, k.name)) for k in s.kernels], s.spec


def _spec():
    return lm.schedule(lm.tensor(np.ones(2)) + 1, spec=SPEC).spec


def _ir(kind):
    (k,) = lm.schedule(KINDS[kind][0](*_mats()), spec=SPEC).kernels
    return k.group.ir


def _mix_program(kind):
    if kind == "conv":
        x, w, b = (lm.tensor(a) for a in _conv_args())
        out = lm.relu(lm.conv1d(x, w, b)) * 0.5
    else:
        out = KINDS[kind][0](*_mats())
    ((k, prog),), spec = _programs(out)
    assert k.unit == "mix" and isa.is_mix(prog), (kind, k)
    return prog, spec


ALL = [*KINDS, "conv"]


@pytest.mark.parametrize("kind", ALL)
def test_each_core_runs_only_its_own_instructions(kind):
    prog, spec = _mix_program(kind)
    streams = isa.mix_streams(prog)
    assert set(streams) == {"AIC", "AIV"}
    aic, aiv = streams["AIC"], streams["AIV"]
    aic_pipes = {isa.pipe_of(i) for i in aic.instructions()}
    aiv_pipes = {isa.pipe_of(i) for i in aiv.instructions()}
    assert {"Cube", "MTE1", "FixPipe", "MTE2"} <= aic_pipes and not aic_pipes & {"Vector", "MTE3"}
    assert {"Vector", "MTE3", "MTE2"} <= aiv_pipes and not aiv_pipes & {"Cube", "MTE1", "FixPipe"}
    assert {b.scope for b in aic.buffers} <= {"L1", "L0A", "L0B", "L0C"}
    assert {b.scope for b in aiv.buffers} == {"UB"}
    for core, p in streams.items():
        assert all(isa.core_of(i) in (core, None) for i in p.instructions())
    # the projections partition the leaf instructions of the one body
    n_leaf = sum(1 for i in prog.instructions() if isa.core_of(i) is not None)
    assert n_leaf == sum(1 for p in streams.values() for i in p.instructions()
                         if isa.core_of(i) is not None)  # fmt: skip


@pytest.mark.parametrize("kind", ALL)
def test_cross_core_flags_pair_up(kind):
    """The AIC raises 'tile in GM' on FixPipe and waits for 'slot free'; the AIV mirrors it; the
    two-stream simulation consumes every set (a leftover set would raise)."""
    prog, spec = _mix_program(kind)
    flags = {c: [(type(i).__name__, i.pipe) for i in p.instructions()
                 if isinstance(i, (isa.CrossCoreSetFlag, isa.CrossCoreWaitFlag))]
             for c, p in isa.mix_streams(prog).items()}  # fmt: skip
    assert set(flags["AIC"]) == {("CrossCoreSetFlag", "FIX"), ("CrossCoreWaitFlag", "FIX")}
    assert set(flags["AIV"]) == {("CrossCoreSetFlag", "MTE2"), ("CrossCoreWaitFlag", "MTE2")}
    c = cost.estimate(prog, spec)
    assert not c.unknown and c.total > 0


@pytest.mark.parametrize("kind", ALL)
def test_mix_time_is_the_later_stream_and_each_stream_at_least_alone(kind):
    """Kernel time = the later stream's end; each core's stream ends no earlier than that core's
    program costed alone (cross-core flags dropped: the coupling only adds waits) and no earlier
    than its busiest pipe is done."""
    prog, spec = _mix_program(kind)
    c = cost.estimate(prog, spec)
    aivs = ["AIV"] if isa.mix_aivs(prog) == 1 else ["AIV0", "AIV1"]
    assert list(c.streams) == ["AIC", *aivs]
    assert c.total == max(c.streams.values())
    for core, p in isa.mix_streams(prog).items():
        body = _drop(p.body, lambda i: isinstance(i, (isa.CrossCoreSetFlag, isa.CrossCoreWaitFlag)))
        alone = cost.estimate(dataclasses.replace(p, body=body), spec)  # (sub-block 0's work)
        for name in ["AIC"] if core == "AIC" else aivs:
            busiest = max(v for q, v in c.pipes.items() if q.startswith(name + "."))
            assert c.streams[name] >= busiest > 0, name
        assert c.streams[core if core == "AIC" else aivs[0]] >= alone.total - 1e-6, core
    assert {"AIC.Cube", "AIC.FixPipe", f"{aivs[0]}.Vector", f"{aivs[-1]}.MTE3"} <= set(c.intervals)


@pytest.mark.parametrize("kind", ["colsum", "rowsum"])
def test_mix_kernel_is_modelled_no_slower_than_its_two_kernel_form(kind, monkeypatch):
    """The MIX merge is accepted on the split 910B; the device model now agrees with it (it
    modelled every 910B MIX kernel slower than Cube + Vector kernels while the AIC's loop and the
    AIV's epilogue were one Scalar stream). (softmax over several N panels is not: its combine,
    one AIV rescaling the whole row block after the last panel, is on the critical path.)"""
    build, flag = KINDS[kind]
    A, B = _mats(n=1024)
    (fused,), spec = _programs(build(A, B))
    monkeypatch.setattr(rules, flag, False)
    parts, _ = _programs(build(A, B))
    assert [k.unit for k, _ in parts] == ["cube", "vector"]
    two = sum(cost.estimate(p, spec).seconds for _, p in parts)
    assert cost.estimate(fused[1], spec).seconds <= two


def test_conv_epilogue_mix_is_modelled_no_slower_than_cube_plus_vector():
    """issue 14's benchmark shape: x (32, 64, 4096), w (64, 64, 7)."""
    x = lm.tensor(np.zeros((32, 64, 4096), np.float32))
    w = lm.tensor(np.zeros((64, 64, 7), np.float32))
    b = lm.tensor(np.zeros(64, np.float32))
    ((_, fused),), spec = _programs(lm.relu(lm.conv1d(x, w, b)) * 0.5)
    ((k1, conv),), _ = _programs(lm.conv1d(x, w))
    y = lm.tensor(np.zeros((32, 64, 4090), np.float32))
    ((k2, epi),), _ = _programs(lm.relu(y + b[:, None]) * 0.5)
    assert (k1.unit, k2.unit) == ("cube", "vector")
    two = cost.estimate(conv, spec).seconds + cost.estimate(epi, spec).seconds
    assert cost.estimate(fused, spec).seconds <= two


def _drop(body, pred):
    out = []
    for i in body:
        if pred(i):
            continue
        if isinstance(i, isa.Loop):
            i = isa.Loop(i.var, i.start, i.stop, i.step, _drop(i.body, pred))
        elif isinstance(i, isa.If):
            i = isa.If(i.a, i.cmp, i.b, _drop(i.body, pred))
        out.append(i)
    return tuple(out)


def _with(prog, body):
    return dataclasses.replace(prog, body=body)


def test_verifier_rejects_a_cross_core_wait_nobody_sets():
    prog, spec = _mix_program("rowsum")
    prog.check(spec)
    no_set = _drop(prog.body, lambda i: isinstance(i, isa.CrossCoreSetFlag) and i.side == "AIV")
    with pytest.raises(ValueError, match="no matching cross-core set on the AIV.*wait forever"):
        _with(prog, no_set).check(spec)
    no_wait = _drop(prog.body, lambda i: isinstance(i, isa.CrossCoreWaitFlag) and i.side == "AIV")
    with pytest.raises(ValueError, match="no matching cross-core wait on the AIV"):
        _with(prog, no_wait).check(spec)


def test_verifier_rejects_instructions_of_no_single_core():
    prog, spec = _mix_program("colsum")
    for bad, why in [(isa.PipeBarrier("ALL"), "barrier covers one core"),
                     (isa.SetFlag("V", "M", 0), "between the AIC and the AIV"),
                     (isa.CrossCoreSetFlag("V", 0, "AIC"), "not a pipe of the AIC")]:  # fmt: skip
        with pytest.raises(ValueError, match=why):
            _with(prog, (bad, *prog.body)).check(spec)


def test_cost_model_rejects_unbalanced_cross_core_flags():
    """The static check sees flag ids only; the two-stream walk counts: without the AIV's
    per-tile 'slot free' sets the AIC waits forever after two tiles."""
    prog, spec = _mix_program("softmax")
    body = _drop(prog.body, lambda i: isinstance(i, isa.CrossCoreSetFlag) and i.side == "AIV"
                 and not isinstance(i.flag, int))  # fmt: skip
    _with(prog, body).check(spec)  # the presets (flags 2, 3) still match statically
    with pytest.raises(ValueError, match="no pending cross-core set"):
        cost.estimate(_with(prog, body), spec)
    extra = (*prog.body, isa.CrossCoreSetFlag("MTE2", 2, "AIV"))
    with pytest.raises(ValueError, match="never waited"):
        cost.estimate(_with(prog, extra), spec)


def test_listing_prints_both_programs():
    prog, _ = _mix_program("softmax")
    text = str(prog)
    head, rest = text.split("\n  AIC (Cube core):\n")
    aic, aiv = rest.split("\n  AIV (Vector cores: 2 per AIC, each with its subblock_idx):\n")
    assert "MIX" in head
    assert "mmad" in aic and "fixpipe_l0c_to_gm" in aic and "aic: cross_core_set_flag" in aic
    assert "vexp" not in aic and "ub " not in aic
    assert "vexp" in aiv and "aiv: cross_core_wait_flag" in aiv and "mmad" not in aiv
    assert "ub acc_ub" in aiv and "l0c" not in aiv.split("\n")[0]


def test_timeline_lanes_show_the_aic_and_the_aiv():
    from lazymath.lowlevel import pipe_timeline
    from lazymath.runtime.timeline import SimKernel, simulate

    prog, spec = _mix_program("conv")
    c = cost.estimate(prog, spec)
    tl = simulate([SimKernel("k", 0, c, unit="mix")], spec)
    lanes = {"AIC.Cube", "AIC.MTE2", "AIV0.Vector", "AIV0.MTE2", "AIV1.Vector", "AIV1.MTE3"}
    assert lanes <= set(tl.pipe_busy)
    assert tl.makespan == round(c.total)
    text = pipe_timeline(c)
    assert "AIC.Cube" in text and "AIV1.Vector" in text
    assert "streams  AIC" in str(c)


# ----------------------------------------------------------------------------- values


@pytest.mark.parametrize("preset", ["ascend910", "ascend910b"])
def test_mix_kernels_equal_numpy(backend, preset):
    """The four 910B MIX kinds (one Cube kernel each on the 910) on both presets and backends,
    at awkward sizes: several N panels and M groups (partials combined in GM), a prime K; one N
    panel (rows split over the two AIVs: row sum, mean, softmax)."""
    rng = np.random.default_rng(2)
    a = rng.standard_normal((131, 37)).astype(np.float32)
    b = rng.standard_normal((37, 290)).astype(np.float32)
    b1 = b[:, :100].copy()
    x, w, bias = _conv_args(131)
    lm.init_device(0, spec=preset)
    try:
        A, B, B1 = lm.tensor(a), lm.tensor(b), lm.tensor(b1)
        outs = [lm.sum(A @ B, axis=0), lm.sum(A @ B, axis=-1), lm.softmax(A @ B, axis=-1),
                lm.relu(lm.conv1d(lm.tensor(x), lm.tensor(w), lm.tensor(bias))) * 0.5,
                lm.sum(A @ B1, axis=-1), lm.mean(A @ B1, axis=-1), lm.softmax(A @ B1, axis=-1)]  # fmt: skip
        units = {k.unit for o in outs for k in lm.schedule(o).kernels}
        assert units == ({"mix"} if preset == "ascend910b" else {"cube"}), units
        got = [o.numpy() for o in outs]
    finally:
        lm.init_device(0, spec="ascend910")
    c = a.astype(np.float64) @ b
    e = np.exp(c - c.max(-1, keepdims=True))
    idx = np.arange(x.shape[-1] - 4)[:, None] + np.arange(5)
    conv = np.einsum("bcln,ocn->bol", x.astype(np.float64)[:, :, idx], w) + bias[:, None]
    c1 = a.astype(np.float64) @ b1
    e1 = np.exp(c1 - c1.max(-1, keepdims=True))
    want = [c.sum(0), c.sum(-1), e / e.sum(-1, keepdims=True), np.maximum(conv, 0) * 0.5,
            c1.sum(-1), c1.mean(-1), e1 / e1.sum(-1, keepdims=True)]  # fmt: skip
    for g, wv in zip(got, want):
        np.testing.assert_allclose(g, wv, rtol=2e-4, atol=2e-4)


def test_race_checker_tracks_each_cores_pipes():
    """The interpreter's race checker names pipes per core in a MIX kernel: without the AIV's
    'workspace slot free' flags the AIC's FixPipe overwrites a slot the AIV's MTE2 may still be
    reading (with one set of pipe names the AIC's own MTE2 -> MTE1 -> M -> FIX chain hid it)."""
    from lazymath.backend.npu import interp
    from lazymath.backend.npu.races import RaceError

    rng = np.random.default_rng(3)
    a = rng.standard_normal((300, 40)).astype(np.float32)
    b = rng.standard_normal((40, 300)).astype(np.float32)
    A, B = lm.tensor(a), lm.tensor(b)
    ((_, prog),), spec = _programs(lm.sum(A @ B, axis=-1))

    def run(body):
        out = np.zeros(300, np.float32)
        p = _with(prog, body)
        interp.run(p, [a.ravel(), b.ravel(), out, np.zeros(p.workspace, np.uint8)], 0, 1)
        return out

    np.testing.assert_allclose(run(prog.body), (a @ b).sum(-1), rtol=1e-4, atol=1e-3)

    def slot_free(i):  # the per-tile 'slot free' pair, flag cs + 2 (presets, drains stay)
        cross = isinstance(i, (isa.CrossCoreSetFlag, isa.CrossCoreWaitFlag))
        return cross and isinstance(i.flag, isa.BinInt)

    with pytest.raises(RaceError, match=r"ws_tiles.*AIC\.FixPipe|AIC\.FixPipe.*ws_tiles"):
        run(_drop(prog.body, slot_free))


def test_two_aivs_per_aic_split_the_tile_rows():
    """MIX_AIC_1_2: the AIV work (conv's epilogue, row values and softmax, also over several N
    panels) is split over the group's two AIVs (sub-block loops); both have Vector work. Column
    sums keep one AIV."""
    prog, spec = _mix_program("conv")  # 32 output channels: a 32-row tile, 16 rows per AIV
    assert isa.mix_aivs(prog) == 2
    c = cost.estimate(prog, spec)
    assert c.pipes["AIV0.Vector"] > 0 and c.pipes["AIV1.Vector"] > 0
    assert c.pipes["AIV0.Vector"] == pytest.approx(c.pipes["AIV1.Vector"], rel=0.2)
    text = str(prog)
    assert "Vector cores: 2 per AIC" in text and "sr0 = min(mv, (subblock_idx *" in text
    A, B = _mats(n=512)
    ((_, one_panel),), _ = _programs(lm.softmax(A @ B[:, :100], axis=-1))
    assert isa.mix_aivs(one_panel) == 2
    for kind in ("rowsum", "softmax"):  # several N panels: a counter per AIV share of the rows
        p, _ = _mix_program(kind)
        assert isa.mix_aivs(p) == 2
        (atomic,) = [i for i in p.instructions() if isinstance(i, isa.AtomicAdd)]
        (last,) = [i for i in p.instructions() if isinstance(i, isa.If) and i.a == atomic.var]
        assert last.b == tile_matmul(_ir(kind), _spec()).n_panels - 1
        assert "subblock_idx" in str(atomic.dst.off)
    assert isa.mix_aivs(_mix_program("colsum")[0]) == 1  # one column accumulator


def test_the_aic_waits_for_both_aivs():
    """An AIC cross-core wait completes when every AIV of the group has set the flag: if only
    sub-block 0 frees the workspace slots, the AIC hangs (cost model and interpreter)."""
    from lazymath.backend.npu import interp
    from lazymath.backend.npu.interp import FlagError

    prog, spec = _mix_program("conv")

    def only_sub0(body):
        out = []
        for i in body:
            if isinstance(i, isa.CrossCoreSetFlag) and i.side == "AIV":
                i = isa.If(isa.SUBBLOCK_IDX, "==", 0, (i,))
            elif isinstance(i, isa.Loop):
                i = isa.Loop(i.var, i.start, i.stop, i.step, only_sub0(i.body))
            out.append(i)
        return tuple(out)

    bad = _with(prog, only_sub0(prog.body))
    with pytest.raises(ValueError, match="no pending cross-core set"):
        cost.estimate(bad, spec)
    x, w, b = _conv_args()
    out = np.zeros((3, 32, 696), np.float32)
    args = [w.ravel(), x.ravel(), b, out.ravel(), np.zeros(bad.workspace, np.uint8)]
    with pytest.raises(FlagError, match="cross_core_wait_flag"):
        interp.run(bad, args, 0, 1)


def test_explain_names_the_streams_of_a_mix_kernel():
    x, w, b = (lm.tensor(a) for a in _conv_args())
    text = str(lm.explain(lm.relu(lm.conv1d(x, w, b)) * 0.5, spec=SPEC))
    assert "Cube cores, each with 2 AIV" in text, text
    assert "streams: AIC " in text and "AIV0 " in text and "AIV1 " in text, text


def test_split_reduction_combine_is_charged():
    """The block that arrives last at a split reduction's counter pays for the combine (the
    modelled block is taken to be that block), whatever the block count: the softmax's row
    rescale is part of its modelled time."""
    prog, spec = _mix_program("softmax")
    full = cost.estimate(prog, spec).total

    def no_combine(body):
        out = []
        for i in body:
            if isinstance(i, isa.If) and any(isinstance(j, isa.AtomicAdd) for j in body):
                continue
            if isinstance(i, isa.Loop):
                i = isa.Loop(i.var, i.start, i.stop, i.step, no_combine(i.body))
            out.append(i)
        return tuple(out)

    assert full > 1.5 * cost.estimate(_with(prog, no_combine(prog.body)), spec).total
    # a hand-made handshake: 5 blocks, the combine tests for the 3rd arrival
    u = isa.Buffer("u", "UB", "float32", 4096)
    cnt = isa.Buffer("cnt", "GM", "int64", 0, arg=0)
    arrived = isa.Var("arrived")
    body = (
        isa.AtomicAdd(isa.Ref(cnt, 0), 1, arrived),
        isa.If(arrived, "==", 2, (isa.VUnary("vexp", isa.Ref(u, 0), isa.Ref(u, 0), 4096),)),
    )
    p = isa.Program("h", (cnt,), (u,), body, 5, 5)
    assert cost.estimate(p, spec).pipes["Vector"] > 0
