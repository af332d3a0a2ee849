"""REPL and notebook displays: a realized tensor's repr shows its values as numpy prints them, a
lazy one's never computes; Jupyter gets HTML (and the kernel graph as SVG when Graphviz is
installed) from tensors, schedules and explanations; `dir(lm)` lists the lazily loaded names."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import lazymath as lm

VALUES = [
    np.arange(6, dtype=np.float32).reshape(2, 3),
    np.array([True, False]),
    np.arange(-3, 4, dtype=np.int8),
    np.array([1 + 2j, -0.5j], dtype=np.complex64),
    np.float64(2.5),
    np.zeros((0, 3), np.float16),
    np.linspace(0, 1, 3000, dtype=np.float32),  # summarized by numpy
]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: f"{np.asarray(v).dtype}{np.shape(v)}")
def test_realized_repr_shows_the_values(value):
    t = lm.tensor(value)
    t.realize()
    r = repr(t)
    body = np.array2string(np.asarray(value), separator=", ", prefix="lazymath.Tensor(")
    assert r.startswith(f"lazymath.Tensor({body}, ")
    assert f"dtype={t.dtype.name}, realized, device=npu:0)" in r
    assert ("shape=" in r) == (np.size(value) > np.get_printoptions()["threshold"])
    assert t._repr_html_().startswith("<pre>lazymath.Tensor(")
    assert t._repr_svg_() is None  # a realized tensor has no kernels to draw


def test_lazy_repr_does_not_compute():
    t = lm.exp(lm.tensor(np.ones((2, 3), np.float32)))
    assert repr(t) == "lazymath.Tensor(shape=(2, 3), dtype=float32, lazy, device=npu:0)"
    assert not t.is_realized


@pytest.mark.skipif(shutil.which("dot") is None, reason="needs Graphviz's dot")
def test_lazy_tensor_html_shows_the_kernel_graph():
    t = lm.exp(lm.tensor(np.ones((2, 3), np.float32))) + 1
    svg = t._repr_svg_()
    assert svg.startswith("<svg") and "</svg>" in svg
    html = t._repr_html_()
    assert html.startswith("<pre>lazymath.Tensor(shape=(2, 3)") and "<svg" in html
    assert not t.is_realized  # drawing schedules, it does not run


def test_lazy_tensor_html_without_graphviz(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    t = lm.exp(lm.tensor(np.ones(3, np.float32)))
    assert t._repr_svg_() is None
    assert t._repr_html_().startswith("<pre>lazymath.Tensor(shape=(3,)")


def test_schedule_and_explanation_display_as_text_and_html():
    t = lm.sum(lm.exp(lm.tensor(np.ones((4, 5), np.float32))), axis=1)
    s = lm.schedule(t)
    assert repr(s) == str(s) and "1 kernel" in repr(s)
    assert "<pre" in s._repr_html_()
    e = lm.explain(t)
    assert repr(e) == str(e) and "<pre" in e._repr_html_()


def test_dir_lists_the_lazy_functions():
    names = dir(lm)
    for name in ("schedule", "explain", "profile", "report", "visualize", "init_device",
                 "precompile", "cache_info", "show_config"):  # fmt: skip
        assert name in names
        assert callable(getattr(lm, name))
        assert getattr(lm, name).__doc__, f"lm.{name} has no docstring"


@pytest.mark.parametrize(
    "typo,hint",
    [("fp16", "'float16'"), ("flaot32", "'float32'"), ("int33", "'int32'"), ("FP32", "'float32'"),
     ("torch.f64", "'float64'"), ("bf16", "'bfloat16'")],
)  # fmt: skip
def test_dtype_typos_get_a_suggestion(typo, hint):
    with pytest.raises(TypeError, match="did you mean|not supported") as e:
        lm.zeros(3, dtype=typo)
    assert hint in str(e.value) and repr(typo) in str(e.value)


def test_item_assignment_is_a_functional_update():
    """t[i] = v (the Array API's __setitem__, issue 16) rebinds t to a new graph node: no
    realized buffer is written, so other tensors reading the old one keep their values."""
    t = lm.tensor(np.zeros(3, np.float32))
    old = t[1:]
    t[0] = 1
    np.testing.assert_array_equal(t.numpy(), [1, 0, 0])
    np.testing.assert_array_equal(old.numpy(), [0, 0])


def test_standalone_picture_has_a_legend_and_spells_out_the_bound():
    x = lm.tensor(np.ones((4, 6, 5), np.float32))
    src = lm.visualize(lm.exp(x) + lm.sum(x, axis=(0, 2), keepdims=True))
    assert '"legend" [shape=plaintext' in src
    for words in ("Vector kernel (SIMD unit)", "input buffer (GM)", "output buffer (GM)",
                  "fusion refused", "memory-bound: moves more bytes per FLOP"):  # fmt: skip
        assert words in src, words
    assert "| memory-bound | stream 0" in src  # the kernel titles say memory-bound
    i = lm.tensor(np.ones((3, 3), np.int32))
    assert "AI CPU kernel (host numpy)" in lm.visualize(i @ i)


def test_missing_output_folder_is_named_not_a_temporary_file(tmp_path):
    t = lm.exp(lm.tensor(np.ones(3, np.float32)))
    missing = tmp_path / "no" / "such"
    calls = {
        "lm.visualize": lambda: t.visualize(missing / "k.dot"),
        "lm.report": lambda: lm.report(t, filename=missing / "r.html"),
    }
    for what, call in calls.items():
        with pytest.raises(FileNotFoundError) as e:
            call()
        msg = str(e.value)
        assert msg.startswith(f"{what}: cannot write") and f"{missing}' does not exist" in msg
        assert ".tmp" not in msg
    assert not t.is_realized
    with lm.profile() as p:
        t.realize()
    with pytest.raises(FileNotFoundError, match="profile.save: cannot write .* does not exist"):
        p.save(missing / "trace.json")


def test_scalar_conversion_hints_fit_the_conversion():
    t = lm.tensor(np.ones(3, np.float32))
    with pytest.raises(TypeError, match=r"bool\(\) .* use t.any\(\) or t.all\(\)"):
        bool(t)
    with pytest.raises(TypeError, match=r"float\(\) .* reduce it first \(t.sum\(\)"):
        float(t)
