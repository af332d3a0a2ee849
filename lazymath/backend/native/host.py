"""The host target: what the CPU that runs lazymath's native code can do, computed once.

Every host-level code generation decision reads `target()`: the GEMM microkernel shape and its
vector width (``gemm.host_gemm``), packed panel sizes (from the caches), the JIT's target
machine (LLVM CPU name and features, ``jit.Jit``) and the kernel disk cache key
(``jit.host_key``). Nothing else hard-codes an ISA.

``LAZYMATH_TARGET_CPU`` (an LLVM CPU name: ``haswell``, ``znver3``, ``skylake-avx512``,
``x86-64-v3``, ...) makes lazymath generate code for that CPU instead of the host's, so an
AVX-512 machine runs (and tests) the AVX2 path too. A target whose features the host lacks is
refused (`TargetError` names the missing features): its code would die on an illegal
instruction.

Description without LLVM: the host's features come from /proc/cpuinfo flags (mapped to LLVM's
feature names), a forced target's from the table below, caches and cores from sysfs, so a warm
process that only loads cached kernels never imports ``llvmlite.binding``. The LLVM CPU name of
the host itself is asked from LLVM only when code is generated (the Jit) or `describe()` runs.
"""

from __future__ import annotations

import os
import platform
import threading
from dataclasses import dataclass, field

from lazymath import settings

ENV_TARGET = "LAZYMATH_TARGET_CPU"


class TargetError(ValueError):
    """LAZYMATH_TARGET_CPU names a CPU this host cannot execute code for (or an unknown one)."""


# ----------------------------------------------------------------------------- feature tables
# LLVM feature names that matter to the code lazymath generates (vector ISA, FMA, conversions).
_V2 = frozenset({"sse", "sse2", "sse3", "ssse3", "sse4.1", "sse4.2", "popcnt", "cx16"})
_V3 = _V2 | {"avx", "avx2", "bmi", "bmi2", "f16c", "fma", "lzcnt", "movbe"}
_V4 = _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
_ICL = _V4 | {"avx512vbmi", "avx512vbmi2", "avx512vnni", "avx512bitalg", "avx512vpopcntdq",
              "avx512ifma", "gfni", "vaes", "vpclmulqdq"}  # fmt: skip
_SPR = _ICL | {"avx512bf16", "avx512fp16", "avxvnni", "amx-tile", "amx-bf16", "amx-int8"}
_ZN4 = _ICL | {"avx512bf16"}

CPU_FEATURES: dict[str, frozenset[str]] = {
    "x86-64": frozenset({"sse", "sse2"}),
    "x86-64-v2": _V2,
    "x86-64-v3": _V3,
    "x86-64-v4": _V4,
    "sandybridge": _V2 | {"avx"},
    "ivybridge": _V2 | {"avx", "f16c"},
    "haswell": _V3,
    "broadwell": _V3,
    "skylake": _V3,
    "alderlake": _V3 | {"avxvnni"},
    "skylake-avx512": _V4,
    "cascadelake": _V4 | {"avx512vnni"},
    "cooperlake": _V4 | {"avx512vnni", "avx512bf16"},
    "icelake-client": _ICL,
    "icelake-server": _ICL,
    "tigerlake": _ICL,
    "sapphirerapids": _SPR,
    "emeraldrapids": _SPR,
    "graniterapids": _SPR | {"amx-fp16"},
    "znver1": _V3,
    "znver2": _V3,
    "znver3": _V3,
    "znver4": _ZN4,
    "znver5": _ZN4,
}
# /proc/cpuinfo flag -> LLVM feature name (where they differ)
_CPUINFO_RENAME = {
    "pni": "sse3", "bmi1": "bmi", "sse4_1": "sse4.1", "sse4_2": "sse4.2", "abm": "lzcnt",
    "avx512_bf16": "avx512bf16", "avx512_fp16": "avx512fp16", "avx512_vnni": "avx512vnni",
    "avx512_vbmi2": "avx512vbmi2", "avx512_bitalg": "avx512bitalg",
    "avx512_vpopcntdq": "avx512vpopcntdq", "avx_vnni": "avxvnni", "amx_tile": "amx-tile",
    "amx_bf16": "amx-bf16", "amx_int8": "amx-int8", "amx_fp16": "amx-fp16",
}  # fmt: skip
_RELEVANT = frozenset().union(*CPU_FEATURES.values()) | {"neon", "sve", "fp-armv8", "fullfp16"}


def _cpuinfo_features() -> frozenset[str] | None:
    """LLVM names of the host's relevant features from /proc/cpuinfo (None off Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read().split("\n\n", 1)[0]
    except OSError:
        return None
    for line in text.splitlines():
        k, _, v = line.partition(":")
        if k.strip() in ("flags", "Features"):
            flags = {_CPUINFO_RENAME.get(x, x) for x in v.split()}
            if k.strip() == "Features":  # aarch64: asimd is NEON, fphp/asimdhp is fp16
                flags |= {"neon"} if "asimd" in flags else set()
                flags |= {"fullfp16"} if "asimdhp" in flags else set()
            return frozenset(flags & _RELEVANT)
    return None


def _llvm_host_features() -> frozenset[str]:
    import llvmlite.binding as llvm

    return frozenset(k for k, v in llvm.get_host_cpu_features().items() if v) & _RELEVANT


# ----------------------------------------------------------------------------- caches and cores


def _sysfs_size(text: str) -> int:
    text = text.strip()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text.rstrip("KMG") or 0) * mult


def _caches() -> dict[str, int]:
    """Per-core bytes of L1d, L2 and L3 (a shared cache divided by the cores sharing it), from
    sysfs; conservative defaults elsewhere (32 KiB, 1 MiB, 2 MiB per core)."""
    out = {"l1d": 32 << 10, "l2": 1 << 20, "l3": 2 << 20}
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        entries = sorted(os.listdir(base))
    except OSError:
        return out
    for e in entries:
        if not e.startswith("index"):
            continue
        try:
            d = os.path.join(base, e)
            rd = lambda n, d=d: open(os.path.join(d, n)).read().strip()  # noqa: E731
            level, kind, size = int(rd("level")), rd("type"), _sysfs_size(rd("size"))
            sharing = _count_cpus(rd("shared_cpu_list"))
        except (OSError, ValueError):
            continue
        if kind == "Instruction" or size <= 0:
            continue
        name = {1: "l1d", 2: "l2", 3: "l3"}.get(level)
        if name:
            out[name] = size // max(1, sharing) if level == 3 else size
    return out


def _count_cpus(cpu_list: str) -> int:
    n = 0
    for part in cpu_list.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            n += int(hi) - int(lo) + 1
        elif part.strip():
            n += 1
    return max(n, 1)


# ----------------------------------------------------------------------------- the description


@dataclass(frozen=True)
class HostTarget:
    """What generated code may use, and the memory hierarchy it runs on."""

    arch: str  # platform.machine()
    forced: str  # LAZYMATH_TARGET_CPU, "" = the host's own CPU
    features: frozenset[str]  # LLVM feature names the generated code may use (relevant subset)
    host_features: frozenset[str]
    l1d: int  # bytes per core
    l2: int
    l3: int
    cores: int
    _cpu: list = field(default_factory=list, compare=False, repr=False)  # lazily: LLVM name

    # --- ISA summary
    @property
    def avx512(self) -> bool:
        return {"avx512f", "avx512vl", "avx512bw"} <= self.features

    @property
    def avx2(self) -> bool:
        return {"avx2", "fma"} <= self.features

    @property
    def fma(self) -> bool:
        return "fma" in self.features or self.arch in ("aarch64", "arm64")

    @property
    def f16c(self) -> bool:
        return "f16c" in self.features or "avx512fp16" in self.features

    @property
    def bf16(self) -> bool:
        return "avx512bf16" in self.features

    @property
    def masked(self) -> bool:
        """Per-lane predication of vector loads/stores (AVX-512 mask registers, SVE)."""
        return self.avx512 or "sve" in self.features

    @property
    def vector_bits(self) -> int:
        """Natural SIMD register width for float arithmetic."""
        if self.avx512:
            return 512
        if "avx" in self.features:
            return 256
        return 128

    @property
    def vector_regs(self) -> int:
        """Architectural SIMD registers (zmm0-31 / ymm0-15 / xmm0-15 / v0-31)."""
        if self.avx512 or self.arch in ("aarch64", "arm64"):
            return 32
        return 16

    @property
    def reg_class(self) -> str:
        """Assembly register prefix of a full vector ("zmm", "ymm", "xmm" or "v")."""
        if self.arch in ("aarch64", "arm64"):
            return "v"
        return {512: "zmm", 256: "ymm"}.get(self.vector_bits, "xmm")

    def lanes(self, dtype: str) -> int:
        """Elements of `dtype` per natural vector (float16 is computed as float32)."""
        import numpy as np

        size = 4 if dtype in ("float16", "bfloat16") else np.dtype(dtype).itemsize
        return max(1, self.vector_bits // 8 // size)

    # --- LLVM
    @property
    def llvm_cpu(self) -> str:
        if self.forced:
            return self.forced
        if not self._cpu:
            import llvmlite.binding as llvm

            self._cpu.append(llvm.get_host_cpu_name())
        return self._cpu[0]

    def llvm_features(self) -> str:
        """Feature string for the target machine: the host's full set natively, empty for a
        forced CPU (its name implies its features and tuning).

        Natively on AVX-512, LLVM's Intel tuning (Skylake-X to Granite Rapids) makes the loop
        vectorizer prefer 256-bit vectors (``prefer-256-bit``, against the clock drop of
        early AVX-512 parts); lazymath's loops are long, FMA-dense streams that gain from full
        zmm width on the parts it runs on, so the preference is turned off (a no-op where the
        tuning does not set it, e.g. Zen 4/5). Measured on Emerald Rapids, one thread:
        sin+exp+log of 1M float32 2.93 -> 2.53 ms, exp(sin(x)*0.5+1)*x of 4M 7.09 -> 6.28 ms."""
        if self.forced:
            return ""
        import llvmlite.binding as llvm

        feats = llvm.get_host_cpu_features().flatten()
        return (
            feats + ",-prefer-256-bit"
            if self.avx512 and self.arch in ("x86_64", "amd64")
            else feats
        )

    @property
    def key(self) -> tuple:
        """What generated code depends on beyond the host's identity (for the disk cache)."""
        return ("target", self.forced or "native")

    def describe(self) -> str:
        isa = "AVX-512" if self.avx512 else "AVX2" if self.avx2 else "AVX" if (
            "avx" in self.features) else self.arch  # fmt: skip
        named = (("FMA", self.fma), ("F16C", self.f16c), ("BF16", self.bf16),
                 ("masks", self.masked))  # fmt: skip
        flags = ", ".join(f for f, on in named if on)
        src = f"forced by {ENV_TARGET}" if self.forced else "host"
        lines = [
            f"host target: {self.llvm_cpu} ({src}), {self.arch}, {isa}: {self.vector_bits}-bit "
            f"vectors x {self.vector_regs} {self.reg_class} registers"
            f" (float32 {self.lanes('float32')} lanes, float64 {self.lanes('float64')})",
            f"  features: {flags or 'none'}",
            f"  caches per core: L1d {self.l1d >> 10} KiB, L2 {self.l2 >> 10} KiB, "
            f"L3 {self.l3 >> 10} KiB; {self.cores} cores",
        ]
        return "\n".join(lines)  # lm.config adds the GEMM plan (gemm sits above the target)


_lock = threading.Lock()
_targets: dict[str, HostTarget] = {}


def _host_features() -> frozenset[str]:
    feats = _cpuinfo_features()
    if feats is None:  # not Linux: ask LLVM
        feats = _llvm_host_features()
    return feats


def make_target(forced: str = "") -> HostTarget:
    """The description for LLVM CPU `forced` ("" = the host's own); raises TargetError when
    the host cannot execute code built for it."""
    forced = forced.strip()
    host = _host_features()
    if forced in ("", "native", "host"):
        forced, feats = "", host
    else:
        arch = platform.machine().lower()
        if arch not in ("x86_64", "amd64"):
            raise TargetError(f"{ENV_TARGET}={forced}: forcing a target is supported on x86-64 "
                              f"hosts only (this one is {arch})")  # fmt: skip
        if forced not in CPU_FEATURES:
            raise TargetError(f"{ENV_TARGET}={forced}: unknown CPU (known: "
                              f"{', '.join(sorted(CPU_FEATURES))})")  # fmt: skip
        feats = CPU_FEATURES[forced]
        missing = sorted(feats - host)
        if missing:
            raise TargetError(f"{ENV_TARGET}={forced}: this host cannot execute code for it; "
                              f"missing features: {', '.join(missing)}")  # fmt: skip
    caches = _caches()
    return HostTarget(platform.machine().lower(), forced, frozenset(feats), host,
                      caches["l1d"], caches["l2"], caches["l3"], os.cpu_count() or 1)  # fmt: skip


def requested() -> str:
    """The LAZYMATH_TARGET_CPU value in force ("" = host)."""
    v = (settings.TARGET_CPU.get() or "").strip()
    return "" if v in ("native", "host") else v


def target(forced: str | None = None) -> HostTarget:
    """The effective host target (cached per LAZYMATH_TARGET_CPU value)."""
    name = requested() if forced is None else forced
    t = _targets.get(name)
    if t is None:
        with _lock:
            t = _targets.get(name)
            if t is None:
                t = _targets[name] = make_target(name)
    return t


def executable_targets() -> list[str]:
    """Targets this host can run: "" (native) plus forced x86 CPUs of a smaller vector ISA
    than native, one per class, for tests: AVX2 (haswell) if the host has AVX-512, and the
    x86-64 baseline (SSE2: no AVX, FMA or F16C, as in VMs whose CPU model hides them) if the
    host has AVX."""
    out = [""]
    if platform.machine().lower() in ("x86_64", "amd64"):
        host = _host_features()
        if _V4 <= host and _V3 <= host:
            out.append("haswell")
        if "avx" in host:
            out.append("x86-64")
    return out


def describe() -> str:
    """One paragraph about the effective host target (for lm.explain and a config summary)."""
    return target().describe()
