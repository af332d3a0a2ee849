"""The host target description (backend/native/host.py) and LAZYMATH_TARGET_CPU.

Holds on any host: nothing assumes the host's ISA. Targets the host can execute
(`host.executable_targets()`: native, plus forced AVX2 on an AVX-512 host) run real kernels
against numpy in this process (one JIT engine per target).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import lazymath as lm
from lazymath.backend.native import host, jit


@pytest.fixture(params=host.executable_targets(), ids=lambda t: t or "native")
def target_cpu(request, monkeypatch):
    """Run the test with LAZYMATH_TARGET_CPU set to each target the host can execute."""
    if request.param:
        monkeypatch.setenv(host.ENV_TARGET, request.param)
    else:
        monkeypatch.delenv(host.ENV_TARGET, raising=False)
    lm.clear_cache()  # programs compiled for the other target must not be reused
    yield request.param
    lm.clear_cache()


def test_native_description_is_consistent(monkeypatch):
    monkeypatch.delenv(host.ENV_TARGET, raising=False)
    t = host.target()
    assert t is host.target()  # computed once
    assert t.forced == "" and t.features == t.host_features
    assert t.vector_bits in (128, 256, 512) and t.vector_regs in (16, 32)
    assert t.lanes("float32") == t.vector_bits // 32 and t.lanes("float64") == t.vector_bits // 64
    assert t.lanes("float16") == t.lanes("float32")  # float16 is computed in float32
    assert t.l1d > 0 and t.l2 >= t.l1d and t.cores >= 1
    text = host.describe()
    assert t.llvm_cpu in text and f"{t.vector_bits}-bit" in text and "L1d" in text


def test_forced_target_takes_its_features_and_keys_the_cache(monkeypatch):
    monkeypatch.setattr(host, "_host_features", lambda: host.CPU_FEATURES["x86-64-v4"])
    monkeypatch.setattr(host.platform, "machine", lambda: "x86_64")
    t = host.make_target("haswell")
    assert t.forced == "haswell" and t.llvm_cpu == "haswell" and t.llvm_features() == ""
    assert t.avx2 and not t.avx512 and t.vector_bits == 256 and t.vector_regs == 16
    assert t.reg_class == "ymm" and t.lanes("float32") == 8
    v4 = host.make_target("skylake-avx512")
    assert v4.avx512 and v4.vector_regs == 32 and v4.reg_class == "zmm"
    assert t.key != v4.key != host.make_target("").key


def test_target_the_host_cannot_execute_is_refused_naming_the_features(monkeypatch):
    monkeypatch.setattr(host, "_host_features", lambda: host.CPU_FEATURES["haswell"])
    monkeypatch.setattr(host.platform, "machine", lambda: "x86_64")
    with pytest.raises(host.TargetError, match=r"missing features: .*avx512bw.*avx512f"):
        host.make_target("skylake-avx512")
    with pytest.raises(host.TargetError, match="unknown CPU"):
        host.make_target("pentium-9000")
    assert host.make_target("x86-64-v3").avx2


def test_env_override_reaches_the_jit_and_the_host_key(monkeypatch):
    monkeypatch.delenv(host.ENV_TARGET, raising=False)
    native = jit.host_key()
    for name in host.executable_targets()[1:]:
        monkeypatch.setenv(host.ENV_TARGET, name)
        assert jit.host_key() != native and jit.host_key()[-1] == ("target", name)
        assert jit.get_jit().cpu_name == name
    monkeypatch.setenv(host.ENV_TARGET, "no-such-cpu")
    with pytest.raises(host.TargetError):
        jit.host_key()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_matmul_and_elementwise_on_every_executable_target(target_cpu, dtype):
    rng = np.random.default_rng(3)
    a = rng.uniform(-1, 1, (37, 53)).astype(dtype)
    b = rng.uniform(-1, 1, (53, 70)).astype(dtype)
    x = rng.uniform(0.1, 4, 1001).astype(dtype)
    ta, tb, tx = lm.tensor(a), lm.tensor(b), lm.tensor(x)
    got = np.asarray((lm.relu(ta @ tb) * 0.5).realize())
    want = np.maximum(a.astype(np.float32) @ b.astype(np.float32), 0) * 0.5
    tol = 1e-5 if dtype == "float32" else 2e-2
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=tol, atol=tol)
    y = np.asarray((lm.exp(tx) + lm.log(tx) * lm.sin(tx)).realize())
    xf = x.astype(np.float32)
    np.testing.assert_allclose(y.astype(np.float32), np.exp(xf) + np.log(xf) * np.sin(xf),
                               rtol=tol, atol=tol)  # fmt: skip


def test_explain_names_the_host_target(monkeypatch):
    monkeypatch.delenv("LAZYMATH_BACKEND", raising=False)
    a = lm.tensor(np.ones((8, 8), np.float32))
    text = lm.explain(a @ a)
    assert "host target: " + host.target().llvm_cpu in text


FORCED = host.executable_targets()[1:]  # native runs every test of the suite already


@pytest.mark.parametrize("cpu", FORCED)
def test_vector_templates_vmath_and_asm_on_forced_targets(cpu, monkeypatch):
    """The vector templates, vmath and the lowering's assembly check, re-run with the code
    generated for each smaller target this host can execute (AVX2 on an AVX-512 host)."""
    sys.path.insert(0, os.path.dirname(__file__))
    import test_lowering as TL
    import test_templates_vector as TV
    import test_vmath as TM

    monkeypatch.setenv(host.ENV_TARGET, cpu)
    monkeypatch.setenv("LAZYMATH_CACHE", "0")
    lm.clear_cache()
    try:
        assert jit.get_jit().cpu_name == cpu
        TV.test_every_unary_float_op("float32", "llvm")
        TV.test_every_binary_op("float32", "llvm")
        TV.test_every_binary_op("int32", "llvm")
        TV.test_reduce_axis_sets((37, 1001), (1,), "sum", "llvm")
        for dtype in ("float32", "float64"):
            TM.test_compiled_elementwise_kernel("llvm", dtype, monkeypatch)
        TL.test_lowered_loops_are_vectorized_without_alias_checks()
    finally:
        lm.clear_cache()


def test_float16_runs_on_a_target_without_f16c(monkeypatch, tmp_path):
    """A target without F16C (x86-64 baseline: a VM whose CPU model hides AVX) converts
    float16 through compiler-runtime calls; they resolve (from libgcc_s) on both loaders.
    MCJIT used to call address 0 (a segfault) and elfload refused the object."""
    assert set(jit.HALF_LIBCALLS) <= set(jit.RUNTIME_SYMBOLS)
    monkeypatch.setenv("LAZYMATH_TARGET_CPU", "x86-64")
    monkeypatch.setenv("LAZYMATH_CACHE_DIR", str(tmp_path))
    assert not host.target().f16c  # the forced target is what kernels are built for
    x = np.linspace(-3, 250, 101).astype(np.float16)  # x * x stays finite in float16
    for elfload in ("1", "0"):
        monkeypatch.setenv("LAZYMATH_ELFLOAD", elfload)
        t = lm.tensor(x)
        got = (t * t + lm.astype(lm.tensor(x.astype(np.float64)), "float16")).numpy()
        np.testing.assert_array_equal(got, x * x + x)


def test_native_avx512_target_turns_off_llvms_256_bit_preference():
    """Natively on AVX-512 the vectorizer uses full zmm width (LLVM's Intel tuning prefers
    256 bits); nowhere else is the feature string touched."""
    pytest.importorskip("llvmlite.binding")
    t = host.make_target("")
    feats = t.llvm_features()
    assert ("-prefer-256-bit" in feats) == (t.avx512 and t.arch in ("x86_64", "amd64"))


def test_compile_workers_generate_code_for_the_target_in_effect_at_submission(monkeypatch):
    """A worker that compiled native code keeps one LLVM target machine per target: a job
    submitted under LAZYMATH_TARGET_CPU=haswell is generated for haswell (its IR and disk key
    were made for it), and native jobs after it for the host again."""
    pytest.importorskip("llvmlite.binding")
    if "haswell" not in host.executable_targets():
        pytest.skip("this host cannot run haswell code")
    from lazymath.backend import compile as bc
    from lazymath.backend.native import workers

    assert bc.wait_tiering(300)  # earlier tests' background compiles would show up in `seen`
    text = 'define void @"f"() {\n  ret void\n}\n'
    seen = []
    orig = workers.Compiler.compile

    def spy(self, ir_text, name, level, vectorize=True, **kw):
        if name.startswith("wt_"):  # not a background tier-up left by an earlier test
            seen.append(self.cpu_name)
        return orig(self, ir_text, name, level, vectorize, **kw)

    monkeypatch.setattr(workers.Compiler, "compile", spy)
    monkeypatch.setenv("LAZYMATH_COMPILE_ISOLATE", "auto")  # the spy sees in-process compiles
    monkeypatch.delenv("LAZYMATH_TARGET_CPU", raising=False)
    assert workers.submit(text, "wt_native", 0).result(120)
    monkeypatch.setenv("LAZYMATH_TARGET_CPU", "haswell")
    assert workers.submit(text, "wt_haswell", 0).result(120)
    monkeypatch.delenv("LAZYMATH_TARGET_CPU")
    assert workers.submit(text, "wt_native2", 0).result(120)
    native = jit.get_jit("").cpu_name
    assert seen == [native, "haswell", native] and native != "haswell"


def test_program_cache_is_keyed_by_the_target(monkeypatch):
    """A graph realized again after LAZYMATH_TARGET_CPU changed compiles a program for the new
    target (a program holds one target's native code) instead of replaying the first one's;
    switching back finds the first program again."""
    others = [t for t in host.executable_targets() if t]
    if not others:
        pytest.skip("this host executes no target but its own")
    x = np.arange(1, 38, dtype=np.float32)  # a prime length

    def realize():
        t = lm.tensor(x)
        return (lm.exp(t * 0.01) + t).numpy()

    monkeypatch.delenv(host.ENV_TARGET, raising=False)
    lm.clear_cache()
    want = np.exp(x * np.float32(0.01)) + x
    np.testing.assert_allclose(realize(), want, rtol=1e-6)
    misses = lm.cache_info()["program_misses"]
    monkeypatch.setenv(host.ENV_TARGET, others[-1])
    np.testing.assert_allclose(realize(), want, rtol=1e-6)
    assert lm.cache_info()["program_misses"] == misses + 1
    monkeypatch.delenv(host.ENV_TARGET)
    np.testing.assert_allclose(realize(), want, rtol=1e-6)
    assert lm.cache_info()["program_misses"] == misses + 1
    lm.clear_cache()
