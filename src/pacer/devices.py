"""Where the models run: ``device`` is ``auto`` (the default), ``cpu`` or ``cuda`` (``cuda:N`` for a given GPU).

``auto`` is CUDA when ``torch.cuda.is_available()`` and the settings can run there (the ``transformers`` backend,
no int8 weight-only quantization, whose kernel is PyTorch's CPU one), else the CPU. An explicit ``cuda`` that
cannot be honoured is refused before any model loads (:func:`check_device`, called by
:meth:`pacer.api.Decoder.from_pretrained` and, for the command line, by :func:`pacer.args.load_decoder`): on a
machine without CUDA, with a backend whose record runs on the CPU only (``llamacpp``: the llama-cpp-python build
here is CPU-only) or with int8.

:func:`place` moves a pair's ``transformers`` models to the device (``model.to(device)``: the dtype stays the one
they were loaded in, bfloat16 by default on CUDA as on the CPU). Everything a backend creates per forward (input
ids, tree masks, position ids, the restricted draft head's row indices) is made on the backend's device; host-side
bookkeeping (token trees, the prompt-lookup proposal) names ``device="cpu"`` and is moved once per round where the
model needs it. :func:`pacer.timing.synchronize` waits for a device's queued work, so that a timed forward
(:mod:`pacer.timing`) measures the forward and not its launch; the decoding loop needs none, since every round reads
its verdicts (tokens) back to the host anyway.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .errors import PacerError

if TYPE_CHECKING:
    from .models import LoadedModel

#: the values ``device`` takes (``cuda:N`` too)
DEVICES = ("auto", "cpu", "cuda")


def cuda_available() -> bool:
    return torch.cuda.is_available()


def _no_cuda_reason() -> str:
    build = torch.version.cuda
    if build is None:
        return f"torch {torch.__version__} is a CPU-only build"
    return f"torch {torch.__version__} (CUDA {build}) finds no GPU"


def _name(device: str | torch.device | None) -> str:
    return "auto" if device is None else str(device).strip().lower()


def device_type(device: str | torch.device | None = "auto") -> str:
    """``cuda`` or ``cpu``: where ``device`` would run the models (``auto``: CUDA when available), before any
    backend is chosen (``--backend auto`` picks one that runs there, :func:`pacer.backends.resolve`)."""
    name = _name(device)
    return "cuda" if name.startswith("cuda") or (name == "auto" and cuda_available()) else "cpu"


def check_device(device: str | torch.device | None = "auto", backend: str = "transformers",
                 quantize: str = "none", draft_quant: str = "none") -> torch.device:
    """The device ``device`` resolves to for these settings on ``backend`` (a registered backend's name), or a
    :class:`PacerError` saying why it cannot be used (see the module docstring). Loads nothing, so the command
    line and the API call it before any model loads."""
    from . import backends

    record = backends.get(backend)
    name = _name(device)
    int8 = quantize == "int8" or draft_quant == "int8"
    if name == "auto":
        if cuda_available() and "cuda" in record.devices and not int8:
            return torch.device("cuda")
        return torch.device("cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name != "cuda" and not (name.startswith("cuda:") and name[5:].isdigit()):
        raise PacerError(f"device must be auto, cpu or cuda (cuda:N for a given GPU), got '{device}'")
    if "cuda" not in record.devices:
        raise PacerError(f"device must be cpu or auto with the {backend} backend: it runs on the CPU in this build "
                         f"(use --backend transformers to run on CUDA)")
    if not cuda_available():
        raise PacerError(f"device must be cpu or auto on this machine: it has no CUDA GPU "
                         f"(torch.cuda.is_available() is false: {_no_cuda_reason()})")
    if int8:
        raise PacerError("device must be cpu with int8 weight-only quantization (--quantize/--draft-quant int8): "
                         "its kernel is PyTorch's CPU one (use --draft-quant none on CUDA)")
    dev = torch.device(name)
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        raise PacerError(f"device must name one of this machine's {torch.cuda.device_count()} CUDA GPU(s) "
                         f"(cuda:0..cuda:{torch.cuda.device_count() - 1}), got '{name}'")
    return dev


def place(target: LoadedModel, draft: LoadedModel | None, device: torch.device) -> torch.device:
    """Move a pair of :class:`pacer.models.LoadedModel` (``draft`` may be ``None``) to ``device`` (what
    :func:`check_device` resolved); returns it. Models of a backend with ``torch_modules`` move in place
    (``model.to``); a llama.cpp model stays where llama.cpp runs it (the CPU)."""
    from . import backends

    dev = torch.device(device)
    for loaded in (target, draft):
        if loaded is not None and backends.of(loaded).torch_modules:
            loaded.model.to(dev)
    return dev


def describe(device: torch.device | str) -> str:
    """One line naming the device: ``cpu``, or ``NVIDIA H200 (cuda:0, compute 9.0, 139 GiB, CUDA 12.8)``."""
    device = torch.device(device)
    if device.type != "cuda":
        return device.type
    i = device.index if device.index is not None else torch.cuda.current_device()
    p = torch.cuda.get_device_properties(i)
    return (f"{p.name} (cuda:{i}, compute {p.major}.{p.minor}, {p.total_memory / 2**30:.0f} GiB, "
            f"CUDA {torch.version.cuda})")
