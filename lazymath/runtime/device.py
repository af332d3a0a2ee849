"""Device specs for the emulated Ascend-style NPU.

Every capacity, rate and latency that tiling, the ISA checker and the cost model use lives here,
so nothing below hard-codes a hardware number. Values come from ../shared/NPU_FACTS.md; the tag
after each field says where ([doc] official docs, [cfg] platform-config files, [model] Huawei's
fitted cost-model constants).
"""

from __future__ import annotations

from dataclasses import dataclass, field

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


@dataclass(frozen=True)
class DeviceSpec:
    """One Ascend-like device.

    `coupled=True` is the 910 layout: each AI core holds Cube, Vector, L1 and UB and Cube results
    pass L0C -> UB -> GM. `coupled=False` is the 910B split layout: Cube cores (AIC) without UB and
    twice as many Vector cores (AIV); Cube results leave through FixPipe to GM and Cube and Vector
    kernels meet only in GM.
    """

    name: str
    coupled: bool
    cube_cores: int  # AI cores with a Cube unit [cfg]
    vector_cores: int  # AI cores with a Vector unit [cfg]
    clock_hz: float  # [cfg][ext]
    # per-core on-chip buffers, bytes [doc][cfg]
    l1_bytes: int
    l0a_bytes: int
    l0b_bytes: int
    l0c_bytes: int
    ub_bytes: int  # per vector-capable core (AIV on 910B)
    # alignment of each scope, bytes [doc]
    align: dict = field(
        default_factory=lambda: {"L1": 32, "L0A": 512, "L0B": 512, "L0C": 64, "UB": 32, "GM": 32}
    )
    # compute units
    cube_m: int = 16  # fractal 16x16x16 fp16 MACs per cycle [doc]
    cube_k: int = 16
    cube_n: int = 16
    cube_fp32_slowdown: int = 4  # fp32 runs at 1/4 of the fp16 rate [doc]
    vector_bytes_per_repeat: int = 256  # [doc]
    vector_cycles_per_repeat: int = 2  # docs imply 1, Huawei's model charges 2 [model]
    max_repeat: int = 255  # repeat count per vector instruction [doc]
    max_queue_buffers: int = 64  # [doc]
    # data-mover rates, bytes per cycle per core [cfg]
    gm_read_bpc: float = 32.0
    l2_read_bpc: float = 110.0  # reads that hit L2 [cfg]
    gm_write_bpc: float = 32.0
    l2_write_bpc: float = 86.0  # writes that stay in L2 (a MIX kernel's hand-off slots) [cfg]
    l1_to_l0a_bpc: float = 512.0
    l1_to_l0b_bpc: float = 256.0
    l0c_to_ub_bpc: float = 256.0
    ub_gm_bpc: float = 64.0
    # fixed costs, cycles [model]
    copy_ub_fixed: int = 50
    copy_l1_fixed: int = 200
    l0c_out_fixed: int = 200
    gm_read_latency: int = 1400
    gm_write_latency: int = 300
    hbm_bytes_per_s: float = 1.2e12
    l2_bytes: int = 32 * MiB
    event_ids_per_pipe_pair: int = 4  # [doc]
    # bfloat16 on the AI Core (Vector Cast, Cube Mmad, FixPipe fp32 -> bf16) [doc]: AscendC's
    # Cast(float -> bfloat16_t) lists Atlas A2/A3 as supported and "Atlas training series" (the
    # 910) as not (hiascend.com CANN 9.0 ascendcopapi atlasascendc_api_07_0021); aclnn Cast
    # takes BFLOAT16 on A2/A3 only (aolapi atlasascendc_api_07_1193); the ops-math operator
    # docs say "Atlas training series: BFLOAT16 not supported". FixPipe's fp32 -> bf16 cast is
    # a 910B path (NPU_FACTS.md). Without it a graph that computes in bfloat16 is refused with
    # the preset's name (fusion.grouping._refuse_bfloat16).
    bfloat16: bool = False
    # device memory (HBM); a realize whose planned peak exceeds it is refused before any work
    hbm_bytes: int = 32 * GiB  # 910: 32 GB as commonly quoted [3rd, unverified]
    # Vector latency per instruction, cycles [model]
    vector_latency: dict = field(
        default_factory=lambda: {
            "vadd": 6, "vsub": 6, "vmul": 7, "vdiv": 13, "vexp": 12, "vsqrt": 13,
            "vrsqrt": 5, "vrec": 5, "vmax": 4, "vmin": 4, "default": 10,
        }
    )  # fmt: skip

    def __hash__(self) -> int:  # dict fields are not hashable; the name identifies a preset
        return hash((self.name, self.coupled, self.cube_cores, self.vector_cores, self.ub_bytes))

    @property
    def has_ub_on_cube_core(self) -> bool:
        """On the coupled 910 a Cube kernel can run a Vector epilogue in its own UB."""
        return self.coupled

    def capacity(self, scope: str) -> int:
        """Bytes available per core in `scope` (GM is unbounded)."""
        return {
            "L1": self.l1_bytes,
            "L0A": self.l0a_bytes,
            "L0B": self.l0b_bytes,
            "L0C": self.l0c_bytes,
            "UB": self.ub_bytes,
        }.get(scope, 1 << 62)

    @property
    def cube_flops_per_cycle(self) -> int:
        return 2 * self.cube_m * self.cube_k * self.cube_n

    @property
    def peak_flops(self) -> float:
        """fp16 Cube peak of the whole device, FLOP/s."""
        return self.cube_cores * self.cube_flops_per_cycle * self.clock_hz

    @property
    def ridge_point(self) -> float:
        """FLOP per byte above which a kernel is compute bound (roofline ridge)."""
        return self.peak_flops / self.hbm_bytes_per_s

    def key(self) -> tuple:
        """Stable tuple for cache keys."""
        return (self.name, self.coupled, self.cube_cores, self.vector_cores, self.l1_bytes,
                self.l0a_bytes, self.l0b_bytes, self.l0c_bytes, self.ub_bytes)  # fmt: skip


ASCEND910 = DeviceSpec(
    name="ascend910",
    coupled=True,
    cube_cores=32,
    vector_cores=32,
    clock_hz=1.0e9,
    l1_bytes=1 * MiB,
    l0a_bytes=64 * KiB,
    l0b_bytes=64 * KiB,
    l0c_bytes=256 * KiB,
    ub_bytes=256 * KiB,
    hbm_bytes_per_s=1.2e12,
    l2_bytes=32 * MiB,
    event_ids_per_pipe_pair=4,
)

ASCEND910B = DeviceSpec(
    name="ascend910b",
    coupled=False,
    cube_cores=24,
    vector_cores=48,
    clock_hz=1.8e9,
    l1_bytes=512 * KiB,
    l0a_bytes=64 * KiB,
    l0b_bytes=64 * KiB,
    l0c_bytes=128 * KiB,
    ub_bytes=192 * KiB,
    hbm_bytes_per_s=1.6e12,
    l2_bytes=192 * MiB,
    event_ids_per_pipe_pair=8,
    hbm_bytes=64 * GiB,  # [doc]
    bfloat16=True,  # [doc]
)

PRESETS = {"ascend910": ASCEND910, "ascend910b": ASCEND910B}


def get_spec(spec: str | DeviceSpec) -> DeviceSpec:
    if isinstance(spec, DeviceSpec):
        return spec
    try:
        return PRESETS[spec]
    except KeyError:
        raise ValueError(
            f"unknown device spec {spec!r}; known presets: {', '.join(sorted(PRESETS))}"
        ) from None
