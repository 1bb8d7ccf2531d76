"""pacer.native: the row-statistics kernel is compiled once per machine, trusted only after a separate process
checked it, cached with its sha256 and rebuilt when the file is damaged; anything failing leaves numpy's path,
which gives the same values."""

from __future__ import annotations

import json
import math
import shutil

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


def _rows() -> list[np.ndarray]:
    """Rows of the vocabulary's size and smaller, spreads from flat to steep, a fifth of the ids masked."""
    rng = np.random.default_rng(1)
    out = []
    for scale, n in ((0.1, 151_936), (4.0, 151_936), (40.0, 3000), (1.0, 1), (3.0, 17), (0.0, 5000)):
        row = (rng.standard_normal(n) * scale).astype(np.float32)
        row[::5] = -np.inf if n > 5 else row[::5]
        out.append(row)
    return out


def check_accuracy(f) -> None:
    """``row_stats`` ``f`` against float64 within the bound its arithmetic guarantees (``native.RELATIVE_BOUND``,
    derived in :mod:`pacer.native`'s docstring; the same on every instruction set), and the ids exactly."""
    for row in _rows():
        i, j, m, z, s = f(row, True)
        assert (i, m) == (int(row.argmax()), float(row.max()))  # the first of equal maxima, as numpy's argmax
        assert f(row, False)[:2] == (i, -1)
        rz, rs = _reference(row)
        slack = row.size * native.CLAMP_TERM
        assert abs(z - rz) <= native.RELATIVE_BOUND * rz + slack, (row.size, z, rz)
        assert abs(s - rs) <= native.RELATIVE_BOUND * abs(rs) + slack, (row.size, s, rs)


def test_kernel_agrees_with_float64_and_softmax_stats_with_numpys_path(home, monkeypatch):
    f = native.row_stats_kernel()
    assert f is not None
    check_accuracy(f)
    for row in _rows():
        rz, rs = _reference(row)
        fast = softmax_stats(row)
        k = native._state["kernels"]
        monkeypatch.setitem(native._state, "kernels", None)
        slow = softmax_stats(row)
        monkeypatch.setitem(native._state, "kernels", k)
        assert (fast.i, fast.j) == (slow.i, slow.j)
        # each path within the bound of the exact value (numpy's pairwise float32 sum adds fewer terms in sequence
        # than a kernel block's, and its exp is as close): the entropy within (1 + 2|s|/z) times it
        h = math.log(rz) - rs / rz
        tol = native.RELATIVE_BOUND * (1 + 2 * abs(rs) / rz) + 1e-12
        for st in (fast, slow):
            assert abs(st.z - rz) <= native.RELATIVE_BOUND * rz + row.size * native.CLAMP_TERM
            assert abs(st.entropy - max(h, 0.0)) <= tol, (row.size, st.entropy, h)


#: instruction-set levels below this machine's own (``-march=native``) that the kernel must hold its bound on:
#: AVX2 with FMA and no AVX-512 (Haswell, Zen 1-3), and SSE4.2 without FMA (older x86); each tested where this CPU
#: runs it (an AVX-512 machine runs all three)
LEVELS = {"x86-64-v3": {"avx2", "fma", "bmi2"}, "x86-64-v2": {"sse4_2", "popcnt"}}


def _cpu_flags() -> set[str]:
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        return set()
    return set(next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []))


@pytest.mark.parametrize("march", list(LEVELS))
def test_the_kernel_holds_its_bound_compiled_for_lower_instruction_sets(home, tmp_path, march):
    """The kernel built as it would be on an AVX2-only CPU (``-march=x86-64-v3``: 8-lane float32 vectors, FMA,
    no AVX-512) or an SSE4.2 one (4 lanes, no FMA), loaded here: another order and rounding of the sums, the same
    bound, and the separate check passes it. (The build ``-march=native`` is the one a machine uses; this runs the
    other machines' code paths on this one.)"""
    import platform
    import subprocess

    if platform.machine() not in ("x86_64", "AMD64") or not LEVELS[march] <= _cpu_flags():
        pytest.skip(f"this CPU does not run {march} code")
    flags = [f"-march={march}" if f == "-march=native" else f for f in native.FLAGS]
    out = tmp_path / f"kernels-{march}.so"
    subprocess.run([native._compiler(), *flags, "-o", str(out), str(native.SOURCE), *native.LIBS], check=True)
    asm = subprocess.run(["objdump", "-d", str(out)], capture_output=True, text=True).stdout \
        if shutil.which("objdump") else ""
    assert "zmm" not in asm  # no AVX-512 register in it
    check_accuracy(native.Kernels(out).row_stats)
    assert native._check(out) is True


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
