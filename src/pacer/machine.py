"""The machine pacer runs on: the CPU as its matrix kernels see it (:func:`cpu_identity`, part of every calibration
key) and the weights dtype ``--dtype auto`` loads the transformers backend's models in (:func:`choose_dtype`, timed
once per machine and cached with the calibrations, :data:`STORE`).
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from .cache import Store

#: the format of a cached calibration or machine choice (2: the draft's prefill cost per token; 3: the draft's
#: curve c_d(k)); a file of an older format is measured again
FORMAT = "pacer-calibration/3"
#: the cached calibrations (:mod:`pacer.calibration`) and the machine measurements kept with them
#: (:func:`pacer.calibration.choose_draft_quant`, :func:`choose_dtype`)
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


# ---------------------------------------------------------------------------------------------- dtype auto
#: what ``--dtype auto`` chooses among on a CPU (float16 has no fast CPU matrix kernels)
CPU_DTYPES = ("bfloat16", "float32")
#: the layer it times: the MLP up-projection of a 1.5B Qwen2.5 (hidden 1536 -> intermediate 8960), in
#: ``DTYPE_COPIES`` copies (220 MB in bfloat16: out of any last-level cache, as a model's weights are)
DTYPE_SHAPE = (1536, 8960)
DTYPE_COPIES = 8
#: the generation it prices: ``DTYPE_PROMPT`` prompt tokens prefilled ``DTYPE_CHUNK`` at a time, then ``DTYPE_NEW``
#: tokens decoded one at a time
DTYPE_PROMPT, DTYPE_CHUNK, DTYPE_NEW = 128, 32, 128
#: float32 holds twice the memory: it is chosen only when it prices at most this fraction of bfloat16
DTYPE_MARGIN = 0.9


def dtype_cost(t1: float, t_chunk: float) -> float:
    """Seconds of the priced generation from one linear layer's times at 1 and ``DTYPE_CHUNK`` rows."""
    return DTYPE_PROMPT / DTYPE_CHUNK * t_chunk + DTYPE_NEW * t1


def choose_dtype(device: torch.device | str = "cpu", reps: int = 5, progress: bool = True) -> tuple[str, str]:
    """``(dtype, why)``: the weights dtype ``--dtype auto`` loads the transformers backend's models in.

    On CUDA: ``bfloat16`` where the GPU has it natively (compute capability >= 8), else ``float16``. On a CPU
    :data:`DTYPE_COPIES` linear layers of shape :data:`DTYPE_SHAPE` (together larger than a CPU's last-level cache,
    so that weights stream from memory as a model's do) are timed in each of :data:`CPU_DTYPES` at 1 row (a
    decoding step) and ``DTYPE_CHUNK`` rows (prefill, verification), median of ``reps``, and the generation
    :func:`dtype_cost` prices is compared: CPUs
    without native bf16 instructions (AVX2-only ones) convert every bf16 weight to float32 on the fly and can be
    faster in float32, those with AVX-512 BF16 or AMX are faster in bfloat16. Measured once per machine, threads
    and PyTorch, cached like a calibration. Both dtypes hold the dequantized GGUF weights (float32 exactly), so
    the choice changes what plain decoding emits only by rounding; ``--dtype`` pins it."""
    dev = torch.device(device)
    if dev.type == "cuda":  # native bf16 from Ampere (compute capability 8) on; older GPUs only emulate it
        ok = torch.cuda.get_device_capability(dev)[0] >= 8
        return ("bfloat16", "a CUDA GPU with native bf16") if ok else ("float16", "a CUDA GPU without native bf16")
    key = {"format": FORMAT, "what": "dtype", "dtypes": list(CPU_DTYPES), "margin": DTYPE_MARGIN,
           "shape": list(DTYPE_SHAPE), "copies": DTYPE_COPIES, "prompt": DTYPE_PROMPT, "chunk": DTYPE_CHUNK,
           "new": DTYPE_NEW, "threads": torch.get_num_threads(), "cpu": cpu_identity(), "torch": torch.__version__}
    cached, _ = STORE.get(key)
    cost = cached.get("cost") if cached is not None else None
    if not (isinstance(cost, dict) and all(isinstance(cost.get(d), float) and cost[d] > 0 for d in CPU_DTYPES)):
        if progress:
            print("pacer: timing bfloat16 and float32 matrix kernels on this CPU for --dtype auto (once, seconds)",
                  file=sys.stderr)
        cost = {name: dtype_cost(*linear_times(name, reps)) for name in CPU_DTYPES}
        if note := STORE.keep(key, {"cost": {k: round(v, 6) for k, v in cost.items()}}):
            print(f"pacer: note: {note}", file=sys.stderr)
    choice = "float32" if cost["float32"] <= DTYPE_MARGIN * cost["bfloat16"] else "bfloat16"
    return choice, _dtype_reason(cost)


def linear_times(dtype: str, reps: int = 5) -> tuple[float, float]:
    """Median seconds of one :data:`DTYPE_SHAPE` linear layer in ``dtype`` at 1 and ``DTYPE_CHUNK`` rows (each
    repetition runs all :data:`DTYPE_COPIES` copies in turn, so none is served from the cache)."""
    g = torch.Generator().manual_seed(0)
    dt = getattr(torch, dtype)
    ws = [(torch.rand(DTYPE_SHAPE[1], DTYPE_SHAPE[0], generator=g) - 0.5).to(dt) for _ in range(DTYPE_COPIES)]
    times = []
    with torch.inference_mode():
        for rows in (1, DTYPE_CHUNK):
            x = torch.randn(rows, DTYPE_SHAPE[0], generator=g).to(dt)
            ts = []
            for _ in range(reps + 1):  # the first is a warm-up
                t = time.perf_counter()
                for w in ws:
                    torch.nn.functional.linear(x, w)
                ts.append((time.perf_counter() - t) / len(ws))
            times.append(statistics.median(ts[1:]))
    return times[0], times[1]


def _dtype_reason(cost: dict) -> str:
    return (f"one linear layer timed in each dtype: a {DTYPE_PROMPT}-token prompt and {DTYPE_NEW} new tokens cost "
            f"{cost['float32'] / cost['bfloat16']:.2f}x in float32 what they cost in bfloat16 on this CPU")
