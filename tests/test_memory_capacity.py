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
    monkeypatch.setattr(engine, "_host_memory_bytes", lambda: 1 << 20)
    with pytest.raises(MemoryError, match="this host's 1.0 MiB of physical memory"):
        (lm.tensor(np.ones(1 << 19, np.float32)) + 1).realize()
