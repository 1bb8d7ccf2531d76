"""Native kernels (``kernels.c``), compiled on this machine on first use and checked before they are trusted.

- ``row_stats(row, second)`` (:func:`row_stats_kernel`) - the top two ids, the top logit ``m``,
  ``z = Σ exp(x - m)`` and ``s = Σ exp(x - m)(x - m)`` of a float32 logits row, reading the row from memory once
  and writing nothing. It replaces numpy's argmax passes, four passes of arithmetic and two row-sized scratch arrays
  in :func:`pacer.sampling.softmax_stats`, which every drafted token's features pay for (and the drafter's own
  argmax: the top id is the greedy draft token).
- ``pacer_layer_check`` (:attr:`Kernels.layer_check`) - a policy's whole check of one drafted token in one call:
  its raw scalars normalised, the token through the pre-verification layer's folded weights
  (:class:`pacer.preverify.layer.CpuExtend`; ``pacer_layer_step``), the token head, the running log-survival and
  the block logit, instead of ~60 small numpy operations, each of which runs cold after a forward.

The kernel is compiled once per machine with the C compiler found (``$CC``, ``cc`` or ``gcc``) and
``-O3 -march=native`` into ``$PACER_HOME/native/``, keyed by the source, the flags, the compiler and the CPU. A new
build is trusted only after a separate process has loaded it and its results agreed with float64 numpy on rows with
masked ids and extreme logits (an instruction this machine cannot run, like llama.cpp's AMX kernels on that Xeon,
kills that process, not this one); the verdict is kept beside the library with its sha256, checked at every load.
Where anything fails - no compiler, a failed check, a damaged file, ``PACER_NATIVE=0`` - :func:`row_stats_kernel` is
``None`` and numpy's path runs; the result is the same up to float32 rounding.

Accuracy of ``row_stats`` (:data:`RELATIVE_BOUND`, what the check and ``tests/test_native.py`` hold it to, on every
instruction set: the vector width and FMA change the order and rounding of the sums, not the bound). With ``u = 2^-24``
(float32's unit roundoff) and ``B = 2048`` values a block (``ROW_BLOCK``), each term ``exp(x - m_b)`` is off by at most
``4u`` relative (``exp_poly``: 2 ulp) plus ``87u`` (``x - m_b`` rounded, at most 87 in size after the clamp); a block's
float32 sum of ``B`` non-negative terms, in any order, adds at most ``(B - 1)u``; the blocks are combined in double
(``~2^-53`` each). So ``z`` and ``s`` (whose terms share one sign) are within ``(B + 96)u ≈ 1.3e-4`` relative of their
exact values, plus, for a row of ``n`` values, at most ``n · 87 e^-87 ≈ n · 1.4e-36`` absolutely (:data:`CLAMP_TERM`: a
value more than 87 below the top counts as ``e^-87``); the entropy ``log z - s / z`` is then within ``(1 + 2|s|/z)``
times the relative bound. That is the worst case; rounding errors that do not all lean one way give about ``sqrt(B)·u ≈
3e-6`` (2.1e-6 on 151,936 ids on an AVX2-only Zen 3, 8 lanes; less on AVX-512's 16)."""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..cache import pacer_home, sha256_file
from ..io import TMP_SUFFIX, atomic_write_text, read_json

SOURCE = Path(__file__).with_name("kernels.c")
FLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp-simd", "-shared", "-fPIC"]
LIBS = ["-lm"]
#: set to 0 to keep numpy's path
ENV = "PACER_NATIVE"
#: values a block of ``row_stats`` sums in float32 (``ROW_BLOCK`` in ``kernels.c``)
ROW_BLOCK = 2048
#: the most ``row_stats``' ``z`` and ``s`` may be off, relative to their exact values (see the module docstring)
RELATIVE_BOUND = (ROW_BLOCK + 96) * 2.0**-24
#: the most one clamped value (``x - m < -87``, a masked id's ``-inf`` included) adds to ``z`` or ``s``
CLAMP_TERM = 87 * math.exp(-87)
_state: dict = {}


def _cpu() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    keep = [x for x in lines if x.startswith(("model name", "flags", "Features"))]
    return "\n".join(dict.fromkeys(keep))


def _compiler() -> str | None:
    for cc in (os.environ.get("CC"), "cc", "gcc"):
        if cc and shutil.which(cc):
            return cc
    return None


def _check(lib_path: Path) -> bool:
    """Whether the library at ``lib_path`` loads and agrees with float64 numpy (in a separate process)."""
    code = f"import sys; from pacer.native.check import self_test; sys.exit(0 if self_test({str(lib_path)!r}) else 1)"
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0


class Layer(ctypes.Structure):
    """``pacer_layer`` of ``kernels.c``: a layer's sizes and its folded weights (pointers into float32 arrays that
    the owner keeps alive)."""

    _fields_ = [(name, ctypes.c_int) for name in ("D", "S", "d", "heads", "context", "tanh_gelu", "max")] + [
        (name, ctypes.c_float) for name in ("eps_h", "eps_a", "eps_m")] + [
        (name, ctypes.POINTER(ctypes.c_float)) for name in (
            "w_h", "b_h", "w_s", "b_s", "pos", "w_qkv", "b_qkv", "w_o", "b_o", "w_1", "b_1", "w_2", "b_2", "w_t",
            "w_b")] + [(name, ctypes.c_float) for name in ("b_t", "b_b")]


class Kernels:
    """The loaded library: :meth:`row_stats` and :attr:`layer_check`."""

    def __init__(self, lib_path: Path) -> None:
        self.lib = lib = ctypes.CDLL(str(lib_path))
        f = lib.pacer_row_stats
        f.restype = ctypes.c_int
        f.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        i64x2, f64x3 = ctypes.c_int64 * 2, ctypes.c_double * 3

        def row_stats(row: np.ndarray, second: bool = True) -> tuple[int, int, float, float, float] | None:
            """``(i, j, m, z, s)`` of a C-contiguous float32 logits row (see ``pacer_row_stats``): the top two ids
            (``j = -1`` without ``second``), the top logit, ``Σ exp(x - m)`` and ``Σ exp(x - m)(x - m)``;
            ``None`` for a NaN or a top logit that is not finite."""
            top, out = i64x2(), f64x3()  # per call: generations may run on several threads
            if f(row.ctypes.data, row.size, second, top, out):
                return None
            return top[0], top[1], out[0], out[1], out[2]

        self.row_stats = row_stats
        #: ``layer_check(byref(Layer), hidden*, raw scalars*, mu*, sd*, n, block, K*, V*, Z*, LS*, out*) -> int``
        #: (0: done; ``out``: the token logit and the block logit, NaN where token ``n`` closes no block)
        self.layer_check = lib.pacer_layer_check
        self.layer_check.restype = ctypes.c_int
        self.layer_check.argtypes = [ctypes.POINTER(Layer), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                     ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                     ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]


def _build() -> Kernels | None:
    cc = _compiler()
    if cc is None or not SOURCE.exists():
        return None
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    key = hashlib.sha256("\0".join([SOURCE.read_text(), " ".join(FLAGS + LIBS), version, _cpu(),
                                    platform.machine()]).encode()).hexdigest()[:16]
    folder = pacer_home() / "native"
    lib_path, verdict = folder / f"kernels-{key}.so", folder / f"kernels-{key}.json"
    try:
        doc = read_json(verdict, "the native kernels' verdict", "")
        if doc.get("sha256") == sha256_file(lib_path):
            return Kernels(lib_path) if doc.get("ok") else None
    except (OSError, ValueError, AttributeError):
        pass  # not built yet, or damaged (BadJson is a ValueError): build again
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".build.", suffix=TMP_SUFFIX) as tmp:
        out = Path(tmp) / lib_path.name
        try:
            r = subprocess.run([cc, *FLAGS, "-o", str(out), str(SOURCE), *LIBS], capture_output=True, timeout=120)
        except (OSError, subprocess.SubprocessError):
            return None
        ok = r.returncode == 0 and _check(out)
        if r.returncode != 0:
            return None
        os.replace(out, lib_path)
    atomic_write_text(verdict, json.dumps({"ok": ok, "sha256": sha256_file(lib_path), "flags": FLAGS, "compiler": cc}))
    return Kernels(lib_path) if ok else None


def kernels() -> Kernels | None:
    """The native kernels (built, checked and loaded once per process), or ``None`` (numpy's paths: see the
    module docstring)."""
    if "kernels" not in _state:
        k = None
        if os.environ.get(ENV, "1") != "0":
            try:
                k = _build()
            except OSError:
                k = None
        _state["kernels"] = k
    return _state["kernels"]


def row_stats_kernel() -> Callable[[np.ndarray, bool], tuple[int, int, float, float, float] | None] | None:
    """The native ``row_stats(row, second)``, or ``None``."""
    k = kernels()
    return None if k is None else k.row_stats
