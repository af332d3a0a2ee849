"""A realize whose planned peak exceeds the device's memory (DeviceSpec.hbm_bytes: 32 GiB on
the ascend910, 64 GiB on the ascend910b) is refused before anything is compiled or allocated,
with an error naming the largest tensor, its size, the peak and the capacity."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import lazymath as lm
from lazymath import engine
from lazymath.runtime.device import ASCEND910, ASCEND910B, GiB


def test_presets_have_a_memory_size():
    assert ASCEND910.hbm_bytes == 32 * GiB and ASCEND910B.hbm_bytes == 64 * GiB


@pytest.mark.parametrize("spec,cap", [("ascend910", "32.0 GiB"), ("ascend910b", "64.0 GiB")])
def test_huge_realize_is_refused_before_any_work(spec, cap):
    dev = lm.current_device()
    try:
        lm.init_device(0, spec)
        t = lm.zeros((1 << 20, 1 << 20))  # 4 TiB of float32
        line = t._node.loc
        compiled = lm.cache_info()["compiled"]
        with pytest.raises(MemoryError) as e:
            t.realize()
        msg = str(e.value)
        assert "needs 4.0 TiB at its peak" in msg and f"the {cap} of device memory" in msg
        assert f"[1048576, 1048576]:float32 (4.0 TiB) created at {line}" in msg
        assert "Nothing was compiled or allocated" in msg
        assert lm.cache_info()["compiled"] == compiled
        assert not t.is_realized
    finally:
        lm.runtime.set_device(dev)


def test_capacity_is_the_specs(monkeypatch):
    """A device with 64 KiB of memory refuses a 100 KiB output and runs a 40 KiB one."""
    tiny = dataclasses.replace(ASCEND910, name="tiny910", hbm_bytes=64 * 1024)
    dev = lm.current_device()
    try:
        lm.init_device(0, tiny)
        with pytest.raises(MemoryError, match="more than the 64.0 KiB of device memory of the "
                                              "tiny910"):  # fmt: skip
            (lm.tensor(np.ones(25_600, np.float32)) * 2).realize()
        ok = lm.tensor(np.ones(10_000, np.float32)) * 2
        np.testing.assert_array_equal(ok.numpy(), np.full(10_000, 2, np.float32))
    finally:
        lm.runtime.set_device(dev)


def test_host_memory_bounds_it_too(monkeypatch):
    # the check runs when a program is planned: a program of this shape compiled earlier in the
    # same process (tests/test_jit.py realizes x + 1.0 on 2 MiB) would be a cache hit
    monkeypatch.setattr(engine, "PROGRAMS", engine.ProgramCache())
    monkeypatch.setattr(engine, "_host_memory_bytes", lambda: 1 << 20)
    with pytest.raises(MemoryError, match="this host's 1.0 MiB of physical memory"):
        (lm.tensor(np.ones(1 << 19, np.float32)) + 1).realize()


@pytest.mark.parametrize("spec,cap", [("ascend910", "32.0 GiB"), ("ascend910b", "64.0 GiB")])
def test_huge_random_draw_is_refused_before_generating(spec, cap):
    """lm.random draws on the host at the call: a result larger than the device's memory is
    refused before a single number is generated (it used to run for minutes first)."""
    dev = lm.current_device()
    try:
        lm.init_device(0, spec)
        for fn, name in ((lm.random.randn, "randn"), (lm.random.rand, "rand")):
            with pytest.raises(MemoryError) as e:
                fn(1 << 20, 1 << 20, seed=0)
            msg = str(e.value)
            assert f"lm.random.{name}(1048576, 1048576)" in msg and "4.0 TiB of float32" in msg
            assert f"({cap})" in msg and "nothing was generated" in msg
    finally:
        lm.runtime.set_device(dev)


def test_random_draws_in_chunks_equal_one_numpy_draw(monkeypatch, capsys):
    """The chunked generation gives exactly numpy's single draw (same PCG64 stream), in every
    float dtype, and reports progress on stderr once a draw runs long."""
    monkeypatch.setattr(type(lm.random), "CHUNK", 7)  # many chunks, ragged last one
    monkeypatch.setattr(type(lm.random), "PROGRESS_AFTER_S", -1.0)  # report from the first chunk
    for dtype in ("float32", "float16", "float64"):
        got = lm.random.randn(5, 11, seed=4, dtype=dtype).numpy()
        want = np.random.default_rng(4).standard_normal((5, 11), dtype=np.float32).astype(dtype)
        np.testing.assert_array_equal(got, want)
        assert got.dtype == np.dtype(dtype)
    got = lm.random.rand(13, seed=5).numpy()
    np.testing.assert_array_equal(got, np.random.default_rng(5).random(13, dtype=np.float32))
    err = capsys.readouterr().err
    assert "lazymath: lm.random.rand(13,): 52 B of 52 B generated on the host" in err
    with pytest.raises(TypeError, match="dtype must be a floating dtype, got int32"):
        lm.random.randn(3, dtype="int32")


def test_reference_backend_refuses_a_huge_realize_before_evaluating(monkeypatch):
    """The reference backend keeps every intermediate; its peak is checked like the plan's."""
    monkeypatch.setenv("LAZYMATH_BACKEND", "reference")
    col, row = (
        lm.tensor(np.ones((1 << 20, 1), np.float32)),
        lm.tensor(np.ones((1 << 20,), np.float32)),
    )
    t = lm.exp(col + row)  # 4 TiB of float32, twice (the add and the exp)
    line = t._node.loc
    with pytest.raises(MemoryError) as e:
        t.realize()
    msg = str(e.value)
    assert "reference backend" in msg and "needs 8.0 TiB" in msg and "Nothing was evaluated" in msg
    assert f"[1048576, 1048576]:float32 (4.0 TiB) created at {line}" in msg
    assert not t.is_realized
    small = lm.exp(lm.ones((3, 1)) + lm.zeros((1, 4)))  # still evaluates normally
    np.testing.assert_allclose(small.numpy(), np.full((3, 4), np.e, np.float32), rtol=1e-6)
