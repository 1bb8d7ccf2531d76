"""pacer.native: the row-statistics kernel is compiled once per machine, trusted only after a separate process
checked it, cached with its sha256 and rebuilt when the file is damaged; anything failing leaves numpy's path,
which gives the same values."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pacer import native
from pacer.sampling import softmax_stats

pytestmark = pytest.mark.skipif(native._compiler() is None, reason="no C compiler on this machine")


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("PACER_HOME", str(tmp_path))
    monkeypatch.delenv(native.ENV, raising=False)
    monkeypatch.setattr(native, "_state", {})
    return tmp_path / "native"


def _reference(row: np.ndarray) -> tuple[float, float]:
    d = row.astype(np.float64) - float(row.max())
    e = np.exp(d)
    with np.errstate(invalid="ignore"):  # 0 · -inf at a masked id: its term is 0
        return float(e.sum()), float(np.where(e > 0, e * d, 0.0).sum())


def test_kernel_agrees_with_float64_and_softmax_stats_with_numpys_path(home, monkeypatch):
    f = native.row_stats_kernel()
    assert f is not None
    rng = np.random.default_rng(1)
    for scale, n in ((0.1, 151_936), (4.0, 151_936), (40.0, 3000), (1.0, 1), (3.0, 17), (0.0, 5000)):
        row = (rng.standard_normal(n) * scale).astype(np.float32)
        row[::5] = -np.inf if n > 5 else row[::5]
        i, j, m, z, s = f(row, True)
        assert (i, m) == (int(row.argmax()), float(row.max()))  # the first of equal maxima, as numpy's argmax
        assert f(row, False)[:2] == (i, -1)
        rz, rs = _reference(row)
        assert z == pytest.approx(rz, rel=1e-6) and s == pytest.approx(rs, rel=1e-5, abs=1e-6 * rz)
        fast = softmax_stats(row)
        k = native._state["kernels"]
        monkeypatch.setitem(native._state, "kernels", None)
        slow = softmax_stats(row)
        monkeypatch.setitem(native._state, "kernels", k)
        assert (fast.i, fast.j) == (slow.i, slow.j)
        assert fast.z == pytest.approx(slow.z, rel=1e-5) and fast.entropy == pytest.approx(slow.entropy, abs=1e-5)
        assert 1.0 / fast.z == pytest.approx(math.exp(-math.log(rz)), rel=1e-6)


def test_built_once_then_loaded_from_the_verified_cache(home, monkeypatch):
    assert native.row_stats_kernel() is not None
    (verdict,) = home.glob("kernels-*.json")
    assert json.loads(verdict.read_text())["ok"] is True
    calls = []
    monkeypatch.setattr(native, "_check", lambda path: calls.append(path) or True)
    monkeypatch.setattr(native, "_state", {})
    assert native.row_stats_kernel() is not None and calls == []  # the cached build, no new check
    (lib,) = home.glob("kernels-*.so")
    damaged = lib.with_suffix(".tmp")  # a new file, not the one this process has mapped
    damaged.write_bytes(lib.read_bytes() + b"\0")  # damaged: its sha256 no longer matches the verdict
    damaged.replace(lib)
    monkeypatch.setattr(native, "_state", {})
    assert native.row_stats_kernel() is not None and len(calls) == 1  # rebuilt and checked again


def test_a_build_that_fails_its_check_is_never_used_and_numpys_path_runs(home, monkeypatch):
    monkeypatch.setattr(native, "_check", lambda path: False)
    assert native.row_stats_kernel() is None
    (verdict,) = home.glob("kernels-*.json")
    assert json.loads(verdict.read_text())["ok"] is False
    monkeypatch.setattr(native, "_check", lambda path: pytest.fail("the failed verdict is kept, not rechecked"))
    monkeypatch.setattr(native, "_state", {})
    assert native.row_stats_kernel() is None
    row = np.array([1.0, 2.0, -np.inf], np.float32)
    st = softmax_stats(row)
    assert 1.0 / st.z == pytest.approx(math.exp(2) / (math.exp(1) + math.exp(2)), rel=1e-6)


def test_no_compiler_or_switched_off_means_numpy(home, monkeypatch):
    monkeypatch.setattr(native, "_compiler", lambda: None)
    assert native.row_stats_kernel() is None
    monkeypatch.undo()
    monkeypatch.setenv("PACER_HOME", str(home.parent))
    monkeypatch.setattr(native, "_state", {})
    monkeypatch.setenv(native.ENV, "0")
    assert native.row_stats_kernel() is None and not home.exists()


def test_the_separate_check_rejects_a_wrong_kernel(home, tmp_path):
    """The check really runs the library: one whose sums are off fails it."""
    import subprocess

    def build(name: str, source: str) -> object:
        (tmp_path / f"{name}.c").write_text(source)
        out = tmp_path / f"{name}.so"
        subprocess.run([native._compiler(), *native.FLAGS, "-o", str(out), str(tmp_path / f"{name}.c"), *native.LIBS],
                       check=True)
        return out

    src = native.SOURCE.read_text()
    assert native._check(build("sums", src.replace("z += w * bz[b];", "z += w * bz[b] * 1.001;"))) is False
    assert native._check(build("second", src.replace("if (b != ib && bmax[b] > v)", "if (bmax[b] > v)"))) is False
    assert native._check(build("layer", src.replace("affine(L->w_o, L->b_o, o, d, d, z, 1);",
                                                    "affine(L->w_o, L->b_o, o, d, d, z, 0);"))) is False
    assert native._check(build("pooled", src.replace("mean / block * L->w_b", "mean * L->w_b"))) is False
    assert native._check(build("normed", src.replace("(s_raw[i] - mu[i]) / sd[i]", "s_raw[i] - mu[i]"))) is False
    assert native._check(build("good", src)) is True
