"""Calibration: what a forward costs on the machine that runs pacer, measured once per machine and model pair.

Speculative decoding pays only where verifying ``k`` tokens in one target forward costs much less than ``k``
forwards, and that depends on the CPU's matrix kernels, not on the models: on an AVX2-only CPU a bf16 forward costs
about ``k`` times one token's, on AVX-512/AMX CPUs it is nearly flat in ``k``. So pacer measures, where it runs:

* ``c_t(k)`` - one target forward scoring ``k`` new tokens after a realistic context (``CONTEXT`` cached tokens),
  ``k`` from 1 to ``max_draft + 1``. Where the first points already grow like ``k`` the rest is extrapolated
  (a 16-token bf16 forward takes seconds on such a CPU, and no draft can pay there anyway);
* ``c_d`` - one draft token (one new token through the draft, with the drafter's vocabulary);
* the prefill cost per prompt token of the target, and of the draft (``c_pre``: what a draft model pays to catch up
  with tokens it has not read, see :func:`pacer.policies.cost_aware.catch_up_pays`).

Each point is the median of ``REPS`` forwards after a warm-up, with the cache cropped back between them (on a GPU
each forward is timed between two ``torch.cuda.synchronize()`` calls, :func:`pacer.devices.synchronize`, so that it
counts the kernels and not only their launch). A point whose forwards spread more than ``NOISY`` (max/min) is
measured again; if it still does, the calibration is *noisy*:
it is used with the slowest forward of each point (conservative), said in a note, and cached with that mark (so
that decisions, and seeded sampled outputs, stay the same from run to run; ``pacer calibrate`` measures again).
An interrupted calibration (Ctrl-C) falls back to conservative costs (``c_t(k) = k c_t(1)``: every round is a
plain decoding step) with a note, and writes nothing.

The result is cached in ``$PACER_HOME/calibration/`` under a key of everything it depends on: both models'
fingerprints and dtypes, the draft vocabulary, the threads, the CPU (model, ISA flags, PyTorch's kernel level and
the environment switches that change it), the PyTorch version and, for a pair on a GPU, the GPU. A cache file whose
key or checksum does not match, or that cannot be read, is re-measured with a note; it is written atomically.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import devices
from .costs import Costs

FORMAT = "pacer-calibration/3"  # 2: the draft's prefill cost per token; 3: the draft's curve c_d(k)
#: the draft forwards measured besides one token: a phrase check over k new tokens (Ouroboros)
DRAFT_KS = (2, 4, 8)
CONTEXT = 32
REPS = 3
NOISY = 1.5
#: a curve is treated as growing like ``k`` (and extrapolated) once ``c_t(4) >= LINEAR * c_t(1)``
LINEAR = 2.5
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


# ---------------------------------------------------------------------------------------------- calibration
@dataclass
class Calibration:
    """Measured costs (:class:`pacer.costs.Costs`, without the policy check, which each policy measures itself),
    the prefill cost per prompt token, what they were measured on (``key``) and how they came to be:
    ``source`` is ``measured``, ``cache``, ``conservative`` (interrupted) or ``given``."""

    costs: Costs
    prefill: float = 0.0
    key: dict = field(default_factory=dict)
    source: str = "measured"
    noisy: bool = False
    seconds: float = 0.0
    measured: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def payload(self) -> dict:
        return {"costs": self.costs.to_dict(), "prefill": self.prefill, "seconds": round(self.seconds, 2),
                "measured": self.measured, "noisy": self.noisy}

    def verdict(self) -> str:
        """Why speculation can or cannot pay on this machine, in one sentence."""
        g = self.costs.verification_growth(8)
        if g >= 4:
            return (f"scoring 8 tokens costs {g:.1f}x one token here (verification is not free on this CPU): "
                    f"drafting cannot pay, so rounds decode plainly")
        if g >= 2:
            return f"scoring 8 tokens costs {g:.1f}x one token here: only short, confident drafts pay"
        return f"scoring 8 tokens costs {g:.1f}x one token here (verification nearly free): drafting pays"

    def to_dict(self) -> dict:
        return {**self.payload(), "key": self.key, "source": self.source, "noisy": self.noisy,
                "notes": self.notes, "curve": self.costs.curve(), "verdict": self.verdict()}


def backend_version(loaded) -> str:
    """The runtime that computes the forwards (its backend record's: PyTorch's version, llama-cpp-python's)."""
    from . import backends

    return backends.of(loaded).version()


def calibration_key(decoder, rows: torch.Tensor | None) -> dict:
    """Everything a calibration depends on (see the module docstring)."""
    t, d = decoder.target_info, decoder.draft_info
    key = {
        "format": FORMAT,
        "target": t.fingerprint, "target_dtype": t.weights,
        "draft": d.fingerprint if d else None, "draft_dtype": d.weights if d else None,
        "draft_rows": "full" if rows is None else int(len(rows)),
        "backend": t.backend, "runtime": backend_version(t),
        "threads": torch.get_num_threads(),
        "cpu": cpu_identity(),
        "torch": torch.__version__,
        "context": CONTEXT,
    }
    if decoder.target.device.type != "cpu":  # (CPU keys stay as they were: their caches stay valid)
        key["device"] = devices.describe(decoder.target.device)
    return key


def _machine_key(loaded, what: str) -> dict:
    return {"format": FORMAT, "what": what, "model": loaded.fingerprint, "dtype": loaded.weights,
            "threads": torch.get_num_threads(), "cpu": cpu_identity(), "torch": torch.__version__}


def choose_draft_quant(draft, reps: int = 5) -> str:
    """``"int8"`` if the draft's int8 weight-only copy drafts a token at least 10% faster than the draft as loaded
    on this machine (one new token after ``CONTEXT`` cached, median of ``reps``), else ``"none"``. Measured once
    per machine, draft and threads, and cached like a calibration."""
    import copy

    from . import backends
    from .decoding import TransformersBackend
    from .quantize import available, quantize_int8

    if not available() or not backends.of(draft).int8 or draft.model.device.type != "cpu":
        return "none"  # the int8 kernel is a CPU one
    key = _machine_key(draft, "draft-quant")
    cached, _ = _read_payload(key)
    if cached is not None and cached.get("choice") in ("int8", "none"):
        return cached["choice"]
    ctx = [(1000 + 7 * i) % max(2, draft.vocab_size - 1) for i in range(CONTEXT)]
    times = {}
    with torch.inference_mode():
        for kind, model in (("none", draft.model), ("int8", quantize_int8(copy.deepcopy(draft.model)))):
            cm = TransformersBackend(model)
            cm.forward(ctx, keep=1)
            _timed(cm, ctx[:1], len(ctx))
            times[kind] = statistics.median(_timed(cm, ctx[:1], len(ctx)) for _ in range(reps))
    choice = "int8" if times["int8"] < 0.9 * times["none"] else "none"
    _write_payload(key, {"choice": choice, "seconds": {k: round(v, 5) for k, v in times.items()}})
    return choice


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
    cached, _ = _read_payload(key)
    cost = cached.get("cost") if cached is not None else None
    if not (isinstance(cost, dict) and all(isinstance(cost.get(d), float) and cost[d] > 0 for d in CPU_DTYPES)):
        if progress:
            print("pacer: timing bfloat16 and float32 matrix kernels on this CPU for --dtype auto (once, seconds)",
                  file=sys.stderr)
        cost = {name: dtype_cost(*linear_times(name, reps)) for name in CPU_DTYPES}
        _write_payload(key, {"cost": {k: round(v, 6) for k, v in cost.items()}})
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


def _key_hash(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def _checksum(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def cache_path(key: dict) -> Path:
    from .models import pacer_home

    return pacer_home() / "calibration" / f"{_key_hash(key)[:20]}.json"


def _timed(cm, tokens: list[int], base: int, keep: int = 1, tree=None) -> float:
    """Seconds of one forward of ``tokens`` on backend ``cm`` (its device synchronised around it; ``keep`` rows of
    logits, as a ``tree`` where given), then the cache is cropped back to ``base`` tokens."""
    devices.synchronize(cm.device)
    t = time.perf_counter()
    cm.forward(tokens, keep=keep, tree=tree)
    devices.synchronize(cm.device)
    dt = time.perf_counter() - t
    cm.crop(base)
    return dt


def _point(cm, tokens: list[int], base: int, reps: int) -> tuple[float, float, bool]:
    """(median, slowest, noisy) seconds of ``reps`` forwards of ``tokens`` after ``base`` cached tokens."""
    times = [_timed(cm, tokens, base) for _ in range(reps)]
    if max(times) > NOISY * min(times):
        times += [_timed(cm, tokens, base) for _ in range(reps)]
        times = sorted(times)[: max(reps, len(times) - 2)]  # drop the two slowest (a stray stall)
    return statistics.median(times), max(times), max(times) > NOISY * min(times)


def measure(decoder, rows: torch.Tensor | None, max_draft: int = 16, reps: int = REPS,
            progress: Callable[[str], None] | None = None) -> Calibration:
    """Measure ``c_t(k)`` for ``k`` in 1..``max_draft + 1`` (sparse, extrapolated once the curve grows like
    ``k``), ``c_d`` and the prefill cost on ``decoder``'s models (see the module docstring)."""
    say = progress or (lambda s: None)
    start = time.perf_counter()
    ctx = [(1000 + 7 * i) % max(2, decoder.vocab - 1) for i in range(CONTEXT)]
    ctx = ctx[: max(1, min(CONTEXT, decoder.target.context - max_draft - 2))]
    ks = sorted(k for k in {1, 2, 3, 4, 6, 8, 12, max_draft + 1} if k <= max_draft + 1)
    target = decoder.target
    target.reset()
    noisy = False
    with torch.inference_mode():
        devices.synchronize(target.device)
        t = time.perf_counter()
        target.forward(ctx, keep=1)
        devices.synchronize(target.device)
        prefill = (time.perf_counter() - t) / len(ctx)
        _timed(target, ctx[:1], len(ctx))  # warm-up
        med: dict[int, float] = {}
        worst: dict[int, float] = {}
        for k in ks:
            say(f"target, {k} token{'s' * (k > 1)}")
            med[k], worst[k], bad = _point(target, ctx[:k], len(ctx), reps)
            noisy |= bad
            if k == 4 and med[4] >= LINEAR * med[1]:
                break  # grows like k: the rest is extrapolated by Costs.target_cost
        for k in sorted(med):  # a point dearer than a longer forward was hit by a stall: measure it again
            if any(med[k] > NOISY * med[j] for j in med if j > k):
                say(f"target, {k} tokens again")
                med[k], worst[k], bad = _point(target, ctx[:k], len(ctx), reps)
        draft = dworst = draft_prefill = 0.0
        dcurve: dict[int, float] = {}
        if decoder.draft_info is not None:
            say("draft, 1 token")
            dm = decoder.draft_backend(rows)
            dm.forward(ctx, keep=1)  # warm-up, then the prefill per token (the draft's catch-up cost)
            dm.reset()
            devices.synchronize(dm.device)
            t = time.perf_counter()
            dm.forward(ctx, keep=1)
            devices.synchronize(dm.device)
            draft_prefill = (time.perf_counter() - t) / len(ctx)
            _timed(dm, ctx[:1], len(ctx))
            draft, dworst, bad = _point(dm, ctx[:1], len(ctx), reps + 2)
            noisy |= bad
            dcurve = {1: dworst if noisy else draft}
            for k in DRAFT_KS:
                if k < len(ctx):
                    say(f"draft, {k} tokens")
                    med_k, worst_k, bad = _point(dm, ctx[:k], len(ctx), reps)
                    dcurve[k] = max(worst_k if noisy else med_k, dcurve[1])
    target.reset()
    use = worst if noisy else med
    cal = Calibration(Costs(dworst if noisy else draft, dict(use), draft_prefill=draft_prefill,
                            draft_curve=dcurve if len(dcurve) > 1 else {}), prefill,
                      source="measured", noisy=noisy, seconds=time.perf_counter() - start, measured=sorted(use))
    if noisy:
        cal.notes.append("the machine was too noisy for a stable measurement (forwards spread more than "
                         f"{NOISY}x): using the slowest forward of each point; `pacer calibrate` measures again")
    return cal


def conservative(decoder, c1: float | None = None) -> Calibration:
    """Costs under which no draft pays (``c_t(k) = k · c_t(1)``): plain-decoding speed, never below."""
    c1 = c1 or 1.0
    return Calibration(Costs(c1 / 3, {1: c1, 2: 2 * c1}), source="conservative")


_READ_ERRORS = (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError)


def _read_payload(key: dict) -> tuple[dict | None, str]:
    """The verified payload cached for ``key``, or ``(None, why)`` (``why`` empty when there is no file)."""
    path = cache_path(key)
    if not path.exists():
        return None, ""
    try:
        doc = json.loads(path.read_text())
        if doc.get("format") != FORMAT or doc.get("key") != key:
            return None, f"calibration cache {path} was made for another machine or pair"
        if doc.get("sha256") != _checksum(doc["payload"]):
            return None, f"calibration cache {path} is damaged (checksum mismatch)"
        return doc["payload"], ""
    except _READ_ERRORS as e:
        return None, f"calibration cache {path} cannot be read ({type(e).__name__})"


def _write_payload(key: dict, payload: dict) -> Path:
    """Cache ``payload`` for ``key`` (atomically, with its checksum)."""
    from .io import atomic_write_text

    path = cache_path(key)
    doc = {"format": FORMAT, "key": key, "payload": payload, "sha256": _checksum(payload)}
    atomic_write_text(path, json.dumps(doc, indent=1) + "\n")
    return path


def load(key: dict) -> tuple[Calibration | None, str]:
    """The cached calibration for ``key``, or ``(None, why)``."""
    p, why = _read_payload(key)
    if p is None:
        return None, why
    try:
        cal = Calibration(Costs.from_dict(p["costs"]), float(p["prefill"]), key, "cache",
                          noisy=bool(p.get("noisy", False)), seconds=float(p.get("seconds", 0)),
                          measured=list(p.get("measured", [])))
    except _READ_ERRORS as e:
        return None, f"calibration cache {cache_path(key)} cannot be read ({type(e).__name__})"
    bad = cal.costs.problems() or ([] if math.isfinite(cal.prefill) and cal.prefill >= 0 else
                                   [f"target prefill is {cal.prefill}"])
    if bad:  # a file edited by hand with its checksum recomputed, say
        return None, f"calibration cache {cache_path(key)} holds unusable costs ({bad[0]})"
    return cal, ""


def save(cal: Calibration) -> Path:
    return _write_payload(cal.key, cal.payload())


def _stderr_progress(msg: str) -> None:
    """A progress line that rewrites itself on a terminal; elsewhere one line when measuring starts."""
    if sys.stderr.isatty():
        sys.stderr.write(f"\rpacer: calibrating this machine's forward costs (once, then cached): {msg:<24}")
    elif msg.startswith("target, 1 "):
        sys.stderr.write("pacer: calibrating this machine's forward costs (once, then cached) ...\n")
    sys.stderr.flush()


def load_or_measure(decoder, rows: torch.Tensor | None, max_draft: int = 16, refresh: bool = False,
                    progress: bool = True) -> Calibration:
    """The calibration for ``decoder`` with draft vocabulary ``rows``: cached, else measured and cached; an
    interrupted measurement gives :func:`conservative` costs. Notes go to ``Calibration.notes``."""
    key = calibration_key(decoder, rows)
    notes: list[str] = []
    if not refresh:
        cal, why = load(key)
        if cal is not None:
            return cal
        if why:
            notes.append(f"{why}; re-measuring")
    try:
        cal = measure(decoder, rows, max_draft, progress=_stderr_progress if progress else None)
    except KeyboardInterrupt:
        if progress and sys.stderr.isatty():
            sys.stderr.write("\n")
        cal = conservative(decoder)
        cal.key = key
        cal.notes = [*notes, "calibration interrupted: decoding conservatively (every round a plain decoding "
                             "step); run `pacer calibrate` to measure"]
        return cal
    if progress:
        sys.stderr.write(f"{chr(13) if sys.stderr.isatty() else ''}pacer: calibrated in {cal.seconds:.1f}s: "
                         f"{cal.costs.curve()}\n")
    cal.key = key
    cal.notes = notes + cal.notes
    save(cal)
    return cal


def plot(cal: Calibration, path: str | Path, title: str = "") -> None:
    """PNG: ``c_t(k)`` and ``c_t(k) / k`` against ``k``, with plain decoding's ``k · c_t(1)`` for reference."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .io import atomic_write_bytes

    c = cal.costs
    ks = list(range(1, max(c.target) + 1))
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    a.plot(ks, [c.target_cost(k) * 1e3 for k in ks], "o-", label="one target forward over k tokens")
    a.plot(ks, [k * c.target_cost(1) * 1e3 for k in ks], "--", color="gray", label="k plain decoding steps")
    a.scatter(cal.measured, [c.target[k] * 1e3 for k in cal.measured], color="black", zorder=3, s=12,
              label="measured")
    a.set_xlabel("k (new tokens scored)")
    a.set_ylabel("ms")
    a.legend(fontsize=8)
    b.plot(ks, [c.target_cost(k) / k * 1e3 for k in ks], "o-", label="target ms per scored token")
    b.axhline(c.draft * 1e3, color="tab:orange", label="draft ms per token")
    b.set_xlabel("k")
    b.set_ylabel("ms per token")
    b.legend(fontsize=8)
    fig.suptitle(title or "forward costs", fontsize=9)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(Path(path), buf.getvalue())
