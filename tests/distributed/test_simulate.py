"""The simulated N-device timeline: collective costs from link figures, plans costed per device.
No cluster and no data: placeholders carry shapes only (runs without dask installed)."""

from __future__ import annotations

import numpy as np
import pytest

import lazymath as lm
import lazymath.distributed as ld
from lazymath.runtime import multidevice as md

LINK = md.ASCEND910_CLUSTER


@pytest.mark.parametrize("p", [2, 3, 8])
def test_ring_allreduce_is_the_textbook_formula_inside_a_server(p):
    s = 32 * 2**20
    t, algo = md.allreduce_seconds(s, p, LINK)
    want = 2 * (p - 1) / p * s / LINK.intra_bw + 2 * (p - 1) * LINK.intra_latency
    assert algo == "ring" and t == pytest.approx(want)


def test_across_servers_the_cheaper_algorithm_is_taken():
    s = 32 * 2**20
    t, algo = md.allreduce_seconds(s, 64, LINK)
    flat = md.ring_allreduce(s, 64, LINK.inter_bw, LINK.inter_latency)
    assert t <= flat and algo in ("ring", "hierarchical")
    # a tiny message is latency bound: the flat ring pays 2 (p - 1) hops over RoCE
    t_small, _ = md.allreduce_seconds(8, 1024, LINK)
    assert t_small < md.ring_allreduce(8, 1024, LINK.inter_bw, LINK.inter_latency)
    assert md.allreduce_seconds(s, 1, LINK)[0] == 0.0


def test_k_sharded_matmul_costs_an_allreduce_of_the_output():
    a = ld.placeholder((64, 512), "float16", axis=1, n=4)
    b = ld.placeholder((512, 32), "float16", axis=0, n=4)
    tl = ld.simulate(a @ b)
    kinds = [ph.kind for ph in tl.phases]
    assert kinds == ["compute", "allreduce"]
    assert tl.phases[1].nbytes == 64 * 32 * 2
    assert tl.phases[0].seconds > 0 and tl.comm_s == tl.phases[1].seconds
    assert tl.devices == 4 and "allreduce" in str(tl)


def test_strong_scaling_shrinks_per_device_compute():
    def graph(p):
        x = ld.placeholder((8192, 4096), "float32", n=p)
        return lm.exp(x) * 2.0

    t1 = ld.simulate(graph(1)).compute_s
    t8 = ld.simulate(graph(8)).compute_s
    assert 0 < t8 < t1


def test_replicated_inputs_are_broadcast_once():
    x = ld.placeholder((64, 128), "float16", n=8)
    w = lm.tensor(np.zeros((128, 64), np.float16))
    tl = ld.simulate(lm.relu(x @ w))
    (bc,) = [ph for ph in tl.phases if ph.kind == "broadcast"]
    assert bc.nbytes == 128 * 64 * 2
    assert ld.simulate(lm.relu(x @ w), broadcast_inputs=False).comm_s == 0.0


def test_placeholders_refuse_to_compute():
    x = ld.placeholder((8, 8), n=2)
    with pytest.raises(RuntimeError, match="placeholder"):
        ld.compute(x + 1, client=_NoClient())


class _NoClient:
    """Enough of a client for compute() to reach the placeholder check."""

    status = "running"

    def register_plugin(self, plugin):
        pass
