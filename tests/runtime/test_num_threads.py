"""Execution thread counts: affinity, cgroup v1/v2 quotas (fixture trees), LAZYMATH_NUM_THREADS,
lm.set_num_threads and threadpoolctl's threadpool_limits. Nothing here assumes the host's core
count: every rule is fed its inputs."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import lazymath as lm
from lazymath import _threads, settings


@pytest.fixture(autouse=True)
def _no_limit():
    saved = _threads._LIMIT
    lm.set_num_threads(None)
    yield
    lm.set_num_threads(saved)


def _tree(tmp_path, proc: str, files: dict[str, str]):
    (tmp_path / "proc").write_text(proc)
    root = tmp_path / "cg"
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    root.mkdir(exist_ok=True)
    return str(root), str(tmp_path / "proc")


def test_cgroup_v2_quota_own_group_and_parents(tmp_path):
    root, proc = _tree(tmp_path, "0::/user.slice/app\n", {
        "user.slice/app/cpu.max": "max 100000\n",
        "user.slice/cpu.max": "250000 100000\n",
        "cpu.max": "max 100000\n",
    })  # fmt: skip
    assert _threads.cgroup_cpu_limit(root, proc) == 2.5


def test_cgroup_v2_container_root_and_no_quota(tmp_path):
    root, proc = _tree(tmp_path, "0::/\n", {"cpu.max": "200000 100000\n"})
    assert _threads.cgroup_cpu_limit(root, proc) == 2.0
    (tmp_path / "b").mkdir()
    root, proc = _tree(tmp_path / "b", "0::/\n", {"cpu.max": "max 100000\n"})
    assert _threads.cgroup_cpu_limit(root, proc) is None


def test_cgroup_v1_quota_and_unlimited(tmp_path):
    proc = "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n"
    root, procf = _tree(tmp_path, proc, {
        "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "150000\n",
        "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
    })  # fmt: skip
    assert _threads.cgroup_cpu_limit(root, procf) == 1.5
    (tmp_path / "cg/cpu,cpuacct/docker/abc/cpu.cfs_quota_us").write_text("-1\n")
    assert _threads.cgroup_cpu_limit(root, procf) is None


def test_cgroup_missing_or_garbage_files(tmp_path):
    root, proc = _tree(tmp_path, "0::/x\nnot a cgroup line\n", {"x/cpu.max": "lots 100000\n"})
    assert _threads.cgroup_cpu_limit(root, proc) is None
    assert _threads.cgroup_cpu_limit(str(tmp_path / "none"), str(tmp_path / "nofile")) is None


def test_available_cpus_affinity_and_quota():
    assert _threads.available_cpus(affinity={0}, quota=None) == 1
    assert _threads.available_cpus(affinity={0, 1, 2, 3}, quota=2.0) == 2
    assert _threads.available_cpus(affinity={0, 1, 2, 3}, quota=2.5) == 3  # rounded up
    assert _threads.available_cpus(affinity={0, 1, 2, 3}, quota=0.2) == 1
    assert _threads.available_cpus(affinity={0, 5}, quota=8.0) == 2
    if hasattr(os, "sched_getaffinity"):
        assert 1 <= _threads.available_cpus() <= len(os.sched_getaffinity(0))


def test_setting_and_set_num_threads_order():
    with settings.override(LAZYMATH_NUM_THREADS=3):
        assert _threads.num_threads() == 3
        lm.set_num_threads(1)
        assert _threads.num_threads() == 1 and lm.get_num_threads() == 1
        lm.set_num_threads(None)
        assert _threads.num_threads() == 3
    with settings.override(LAZYMATH_NUM_THREADS=0):
        assert _threads.num_threads() == _threads.available_cpus()


@pytest.mark.parametrize("bad", [0, -2, 1.5, "2", True])
def test_set_num_threads_rejects_bad_counts(bad):
    with pytest.raises((TypeError, ValueError), match="set_num_threads"):
        lm.set_num_threads(bad)


def test_set_num_threads_changes_the_pool_and_results_stay_right():
    """The pool follows the count: with 1 no helper thread runs a block, with 3 (more than this
    host may have) every block still runs once."""
    import threading

    seen: list[str] = []
    lock = threading.Lock()

    def block(argv, i, n):
        with lock:
            seen.append(threading.current_thread().name)

    lm.set_num_threads(3)
    assert _threads.block_pool().n_threads == 3
    _threads.run_blocks(block, None, 12)
    assert len(seen) == 12
    x = np.linspace(-3, 3, 100_003, dtype=np.float32)[::-1]
    np.testing.assert_allclose(
        np.asarray(lm.cos(lm.asarray(x)) + 1), np.cos(x) + 1, rtol=1e-5, atol=1e-6
    )  # fmt: skip  (native lane with up to 2 lane threads)
    lm.set_num_threads(2)  # lower than the lane threads started: the Python path, 2 threads
    np.testing.assert_allclose(np.asarray(lm.cos(lm.asarray(x)) * 3), np.cos(x) * 3, rtol=1e-5,
                               atol=1e-6)  # fmt: skip
    lm.set_num_threads(1)
    assert _threads.block_pool().n_threads == 1
    seen.clear()
    _threads.run_blocks(block, None, 7)
    assert seen == [threading.current_thread().name] * 7
    np.testing.assert_allclose(np.asarray(lm.sin(lm.asarray(x)) * 2), np.sin(x) * 2, rtol=1e-5,
                               atol=1e-6)  # fmt: skip


def test_compile_workers_follow_the_thread_count():
    from lazymath.backend.native import workers

    lm.set_num_threads(1)
    with settings.override(LAZYMATH_COMPILE_THREADS=0):
        assert workers.n_workers() == 1
    with settings.override(LAZYMATH_COMPILE_THREADS=3):
        assert workers.n_workers() == 3


def test_threadpoolctl_limits_lazymath():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    if not hasattr(threadpoolctl, "register"):
        pytest.skip("threadpoolctl < 3.5 has no custom controllers")
    lm.set_num_threads(2)
    info = [d for d in threadpoolctl.threadpool_info() if d["user_api"] == "lazymath"]
    if not info:
        pytest.skip("no C library threadpoolctl can see on this platform")
    assert info[0]["num_threads"] == 2
    with threadpoolctl.threadpool_limits(1):
        assert lm.get_num_threads() == 1 and _threads.num_threads() == 1
    assert lm.get_num_threads() == 2
    with threadpoolctl.threadpool_limits(limits=1, user_api="lazymath"):
        assert lm.get_num_threads() == 1
    assert lm.get_num_threads() == 2


@pytest.mark.parametrize("order", ["lazymath first", "threadpoolctl first"])
def test_threadpoolctl_controller_in_either_import_order(order):
    """`import lazymath` does not import threadpoolctl (2-3 ms of every import); the controller
    is registered when both are loaded, whichever came first (lazymath/_tpctl.py)."""
    pytest.importorskip("threadpoolctl")
    first, second = ("lazymath", "threadpoolctl")[:: 1 if order == "lazymath first" else -1]
    code = (f"import sys, {first}\n"
            "loaded = 'threadpoolctl' in sys.modules\n"
            f"import {second}\n"
            "import lazymath as lm, threadpoolctl as tp\n"
            "if not hasattr(tp, 'register'): print('old'); raise SystemExit\n"
            "lm.set_num_threads(2)\n"
            "apis = [d['user_api'] for d in tp.threadpool_info()]\n"
            "with tp.threadpool_limits(1):\n"
            "    inside = lm.get_num_threads()\n"
            "print(loaded, apis.count('lazymath'), inside, lm.get_num_threads())")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()  # fmt: skip
    if out == ["old"]:
        pytest.skip("threadpoolctl < 3.5 has no custom controllers")
    if out[1] == "0":
        pytest.skip("no C library threadpoolctl can see on this platform")
    assert out == [str(order == "threadpoolctl first"), "1", "1", "2"]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no affinity masks")
def test_one_cpu_affinity_gives_one_thread():
    """What `taskset -c 0` does: a child process pinned to one CPU runs one thread."""
    code = ("import os; os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})\n"
            "import threading; import lazymath as lm; from lazymath import _threads\n"
            "seen = set(); _threads.run_blocks(lambda a, i, n: seen.add(threading.get_ident()),"
            " None, 9)\n"
            "print(lm.get_num_threads(), _threads.available_cpus(), len(seen))")  # fmt: skip
    env = {**os.environ}
    env.pop("LAZYMATH_NUM_THREADS", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True)  # fmt: skip
    assert out.stdout.split() == ["1", "1", "1"]  # one thread ran all 9 blocks
