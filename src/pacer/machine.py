"""The machine pacer runs on: the CPU as its matrix kernels see it (:func:`cpu_identity`, part of every calibration
key), and the store where the calibrations and the machine choices measured with them are cached (:data:`STORE`,
a choice under :func:`machine_key`).
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch

from .cache import Store

#: the format of a cached calibration or machine choice (2: the draft's prefill cost per token; 3: the draft's
#: curve c_d(k)); a file of an older format is measured again
FORMAT = "pacer-calibration/3"
#: the cached calibrations (:mod:`pacer.calibration`) and the machine measurements kept with them
#: (a backend's automatic choices: :mod:`pacer.backends.transformers`)
STORE = Store("calibration", FORMAT, "calibration cache")

#: the ISA flags that decide which GEMM kernels run (x86 and ARM)
ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8",
             "asimd", "sve", "bf16", "i8mm")
KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")


# ------------------------------------------------------------------------------------------------------ CPU
def cpu_identity() -> dict:
    """The CPU as the kernels see it: model name, family/model, the ISA flags that matter, PyTorch's kernel level
    and the environment switches that lower it (``ATEN_CPU_CAPABILITY``, ``ONEDNN_MAX_CPU_ISA``)."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            k, _, v = line.partition(":")
            k = k.strip()
            if k in ("model name", "cpu family", "model", "flags", "Features", "CPU implementer", "CPU part") \
                    and k not in info:
                info[k] = v.strip()
    except OSError:
        pass
    flags = set((info.get("flags") or info.get("Features") or "").split())
    return {
        "model": info.get("model name") or platform.processor() or platform.machine(),
        "family": info.get("cpu family", ""),
        "model_id": info.get("model", info.get("CPU part", "")),
        "arch": platform.machine(),
        "flags": [f for f in ISA_FLAGS if f in flags],
        "torch_kernels": torch.backends.cpu.get_cpu_capability(),
        "env": {k: os.environ[k] for k in KERNEL_ENV if k in os.environ},
    }


def isa_level(cpu: dict) -> str:
    """A short name for the CPU's fastest matrix instructions: AMX, AVX-512 BF16, AVX-512, AVX2, ..."""
    f = set(cpu.get("flags", ()))
    level = ("AMX" if "amx_tile" in f else "AVX-512 BF16" if "avx512_bf16" in f else "AVX-512" if "avx512f" in f
             else "AVX2" if "avx2" in f else "NEON" if "asimd" in f else "no vector ISA known")
    return level


def describe_cpu(cpu: dict | None = None) -> str:
    """One line: ``Intel(R) Xeon(R) ... (family 6, model 207), AVX-512 BF16, PyTorch kernels AVX512``."""
    cpu = cpu or cpu_identity()
    env = "".join(f", {k}={v}" for k, v in cpu.get("env", {}).items())
    fam = f" (family {cpu['family']}, model {cpu['model_id']})" if cpu.get("family") else ""
    return f"{cpu['model']}{fam}, {isa_level(cpu)}, PyTorch kernels {cpu['torch_kernels']}{env}"


def machine_key(what: str, loaded=None, **settings) -> dict:
    """The key in :data:`STORE` of a choice ``what`` measured on this machine (the threads, the CPU, PyTorch), for a
    loaded model (:class:`pacer.models.LoadedModel`: its weights) where given, under the measurement's ``settings``
    (a backend's ``--dtype auto`` and ``--draft-quant auto``)."""
    model = {} if loaded is None else {"model": loaded.fingerprint, "dtype": loaded.weights}
    return {"format": FORMAT, "what": what, **model, **settings, "threads": torch.get_num_threads(),
            "cpu": cpu_identity(), "torch": torch.__version__}
