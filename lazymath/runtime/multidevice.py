"""Simulated timeline of N devices joined by links: per-device work plus collectives.

The single-device simulator (`timeline.py`) places kernels on one NPU. A sharded program runs
the same kernels on every device, so N devices are one per-device timeline repeated, joined by
collective communication where data crosses devices. This module costs the collectives from
link bandwidth and latency and composes the phases (bulk synchronous: a collective starts when
the slowest device is done with the phase before it).

Link figures (`LINKS`), with their sources (see also docs/distributed.md):

- HCCS, Ascend 910 chip-to-chip inside a server: 3 ports x 240 Gbit/s = 30 GB/s each; a
  collective uses all three (HCCL runs one ring per port), 90 GB/s per chip. Hot Chips 31
  (2019) talk, as reported by third parties [3rd].
- RoCE v2 between servers: 2 x 100 Gbit/s per chip = 25 GB/s. Same source [3rd].
- 8 chips per server (Atlas 800 / the Hot Chips talk), clusters of 2,048 chips [3rd].
- Latencies per hop are NOT from a Huawei source: 2 us (HCCS) and 5 us (RoCE) are typical
  figures for a chip-to-chip SerDes link and an RDMA NIC; they are parameters, marked
  unverified.

Collective formulas (Thakur, Rabenseifner, Gropp 2005; NCCL docs), S bytes, p devices, link
bandwidth B, latency a:

- ring all-reduce: 2 (p - 1)/p * S/B + 2 (p - 1) a
- hierarchical all-reduce (g devices per server, m = p/g servers): reduce-scatter inside the
  server (ring), all-reduce of S/g across servers (ring over RoCE), all-gather inside the server
- ring all-gather of S bytes in total: (p - 1)/p * S/B + (p - 1) a
- broadcast (pipelined binary tree): S/B + ceil(log2 p) a, per level of the hierarchy
- the cheaper of ring and hierarchical is taken, as HCCL picks an algorithm by size and scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class LinkSpec:
    """How devices talk: bandwidth per device in bytes/s, latency per hop in seconds."""

    name: str
    intra_bw: float  # inside a server (HCCS)
    intra_latency: float
    inter_bw: float  # between servers (RoCE)
    inter_latency: float
    devices_per_server: int
    source: str = ""


ASCEND910_CLUSTER = LinkSpec(
    name="ascend910-cluster",
    intra_bw=3 * 240e9 / 8,  # 3 HCCS ports x 240 Gbit/s [3rd: Hot Chips 31]
    intra_latency=2e-6,  # assumed (unverified), per hop
    inter_bw=2 * 100e9 / 8,  # RoCE v2 2 x 100 Gbit/s per chip [3rd: Hot Chips 31]
    inter_latency=5e-6,  # assumed (unverified), per hop
    devices_per_server=8,
    source="HCCS 3x240 Gbit/s, RoCE 2x100 Gbit/s, 8 chips/server: Hot Chips 31 (2019) via "
    "third-party reports; latencies assumed",
)

LINKS = {ASCEND910_CLUSTER.name: ASCEND910_CLUSTER}


def get_link(link) -> LinkSpec:
    if isinstance(link, LinkSpec):
        return link
    if link is None:
        return ASCEND910_CLUSTER
    try:
        return LINKS[link]
    except KeyError:
        raise ValueError(f"unknown link preset {link!r}; known: {', '.join(LINKS)}") from None


def ring_allreduce(nbytes: float, p: int, bw: float, latency: float) -> float:
    if p <= 1:
        return 0.0
    return 2 * (p - 1) / p * nbytes / bw + 2 * (p - 1) * latency


def ring_allgather(total_bytes: float, p: int, bw: float, latency: float) -> float:
    if p <= 1:
        return 0.0
    return (p - 1) / p * total_bytes / bw + (p - 1) * latency


def tree_broadcast(nbytes: float, p: int, bw: float, latency: float) -> float:
    if p <= 1:
        return 0.0
    return nbytes / bw + math.ceil(math.log2(p)) * latency


def _split(p: int, link: LinkSpec) -> tuple[int, int]:
    """(devices per server used, servers)."""
    g = min(p, link.devices_per_server)
    return g, math.ceil(p / g)


def allreduce_seconds(nbytes: float, p: int, link=None) -> tuple[float, str]:
    """Cheaper of a flat ring (over the slowest link in use) and the hierarchical algorithm."""
    link = get_link(link)
    g, m = _split(p, link)
    if m == 1:
        return ring_allreduce(nbytes, p, link.intra_bw, link.intra_latency), "ring"
    flat = ring_allreduce(nbytes, p, link.inter_bw, link.inter_latency)
    inside = ring_allgather(nbytes, g, link.intra_bw, link.intra_latency)  # RS costs the same
    hier = 2 * inside + ring_allreduce(nbytes / g, m, link.inter_bw, link.inter_latency)
    return (hier, "hierarchical") if hier < flat else (flat, "ring")


def allgather_seconds(total_bytes: float, p: int, link=None) -> tuple[float, str]:
    link = get_link(link)
    g, m = _split(p, link)
    if m == 1:
        return ring_allgather(total_bytes, p, link.intra_bw, link.intra_latency), "ring"
    inter = ring_allgather(total_bytes, m, link.inter_bw, link.inter_latency)
    return inter + ring_allgather(total_bytes / m, g, link.intra_bw, link.intra_latency), (
        "hierarchical"
    )


def broadcast_seconds(nbytes: float, p: int, link=None) -> tuple[float, str]:
    link = get_link(link)
    g, m = _split(p, link)
    t = tree_broadcast(nbytes, g, link.intra_bw, link.intra_latency)
    if m > 1:
        t += tree_broadcast(nbytes, m, link.inter_bw, link.inter_latency)
    return t, "tree"


COLLECTIVES = {
    "allreduce": allreduce_seconds,
    "allgather": allgather_seconds,
    "broadcast": broadcast_seconds,
    # a scatter of a replicated value: every device takes its slice of a broadcast
    "scatter": broadcast_seconds,
}


@dataclass
class Phase:
    """One step of a multi-device run: every device computes (`kind` "compute") or the devices
    exchange data (a collective kind)."""

    name: str
    kind: str
    seconds: float
    nbytes: float = 0.0
    algorithm: str = ""


@dataclass
class MultiDeviceTimeline:
    devices: int
    link: LinkSpec
    phases: list[Phase] = field(default_factory=list)

    @property
    def makespan_s(self) -> float:
        return sum(p.seconds for p in self.phases)

    @property
    def compute_s(self) -> float:
        return sum(p.seconds for p in self.phases if p.kind == "compute")

    @property
    def comm_s(self) -> float:
        return self.makespan_s - self.compute_s

    def __str__(self) -> str:
        lines = [f"{self.devices} devices on {self.link.name}"]
        t = 0.0
        for p in self.phases:
            extra = f"  {p.nbytes / 2**20:.2f} MiB {p.algorithm}" if p.kind != "compute" else ""
            lines.append(f"  {t * 1e3:10.3f} ms  {p.name:28} {p.seconds * 1e3:10.3f} ms{extra}")
            t += p.seconds
        total, comp, comm = self.makespan_s * 1e3, self.compute_s * 1e3, self.comm_s * 1e3
        lines.append(f"  makespan {total:.3f} ms (compute {comp:.3f}, communication {comm:.3f})")
        return "\n".join(lines)


def compose(devices: int, steps, link=None) -> MultiDeviceTimeline:
    """Compose steps in order: ("compute", name, seconds of the slowest device) or
    (collective kind, name, bytes) into a timeline of `devices` devices."""
    link = get_link(link)
    tl = MultiDeviceTimeline(devices, link)
    for kind, name, value in steps:
        if kind == "compute":
            tl.phases.append(Phase(name, "compute", float(value)))
        else:
            secs, algo = COLLECTIVES[kind](float(value), devices, link)
            tl.phases.append(Phase(name, kind, secs, float(value), algo))
    return tl
