"""Native kernels (``kernels.c``), compiled on this machine on first use and checked before they are trusted.

- ``exp_stats(row, m)`` (:func:`exp_stats_kernel`) - ``z = Σ exp(x - m)`` and ``s = Σ exp(x - m)(x - m)`` of a
  float32 logits row in one pass that writes nothing. It replaces numpy's four passes and two row-sized scratch
  arrays in :func:`pacer.sampling.softmax_stats`, which every drafted token's features pay for: live beside
  llama.cpp's forwards (caches cold after each) on an Intel Xeon (family 6, model 207) a row of 151,936 ids took
  0.35-0.43 ms with numpy and ~0.15 ms with this kernel (ad hoc).
- ``pacer_layer_step`` (:func:`layer_kernel`) - one drafted token through the pre-verification layer's folded
  weights (:class:`pacer.preverify.layer.CpuExtend`): one call instead of ~50 small numpy operations, each of
  which runs cold after a forward.

The kernel is compiled once per machine with the C compiler found (``$CC``, ``cc`` or ``gcc``) and
``-O3 -march=native`` into ``$PACER_HOME/native/``, keyed by the source, the flags, the compiler and the CPU. A new
build is trusted only after a separate process has loaded it and its results agreed with float64 numpy on rows with
masked ids and extreme logits (an instruction this machine cannot run, like llama.cpp's AMX kernels on that Xeon,
kills that process, not this one); the verdict is kept beside the library with its sha256, checked at every load.
Where anything fails - no compiler, a failed check, a damaged file, ``PACER_NATIVE=0`` - :func:`exp_stats` is
``None`` and numpy's path runs; the result is the same up to float32 rounding."""

from __future__ import annotations

import ctypes
import hashlib
import json
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
from ..io import atomic_write_text

SOURCE = Path(__file__).with_name("kernels.c")
FLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp-simd", "-shared", "-fPIC"]
LIBS = ["-lm"]
#: set to 0 to keep numpy's path
ENV = "PACER_NATIVE"
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
        (name, ctypes.POINTER(ctypes.c_float)) for name in ("w_h", "b_h", "w_s", "b_s", "pos", "w_qkv", "b_qkv",
                                                             "w_o", "b_o", "w_1", "b_1", "w_2", "b_2")]


class Kernels:
    """The loaded library: :meth:`exp_stats` and :attr:`layer_step`."""

    def __init__(self, lib_path: Path) -> None:
        self.lib = lib = ctypes.CDLL(str(lib_path))
        f = lib.pacer_exp_stats
        f.restype = None
        f.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.POINTER(ctypes.c_double),
                      ctypes.POINTER(ctypes.c_double)]
        z, s = ctypes.c_double(), ctypes.c_double()
        rz, rs = ctypes.byref(z), ctypes.byref(s)

        def exp_stats(row: np.ndarray, m: float) -> tuple[float, float]:
            """``(Σ exp(x - m), Σ exp(x - m)(x - m))`` of a C-contiguous float32 row ``x`` (``m``: its top
            logit)."""
            f(row.ctypes.data, row.size, m, rz, rs)
            return z.value, s.value

        self.exp_stats = exp_stats
        #: ``layer_step(byref(Layer), hidden*, scalars*, n, K*, V*, Z*) -> int`` (0: done)
        self.layer_step = lib.pacer_layer_step
        self.layer_step.restype = ctypes.c_int
        self.layer_step.argtypes = [ctypes.POINTER(Layer), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
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
        doc = json.loads(verdict.read_text())
        if doc.get("sha256") == sha256_file(lib_path):
            return Kernels(lib_path) if doc.get("ok") else None
    except (OSError, ValueError, AttributeError):
        pass  # not built yet, or damaged: build again
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
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


def exp_stats_kernel() -> Callable[[np.ndarray, float], tuple[float, float]] | None:
    """The native ``exp_stats(row, m)``, or ``None``."""
    k = kernels()
    return None if k is None else k.exp_stats
