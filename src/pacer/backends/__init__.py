"""What runs the models: one :class:`Backend` record per backend, and the registry ``--backend`` reads.

A record says everything the rest of pacer asks of a backend, once: how it loads a model spec, which devices,
dtypes and quantization it takes, what ``auto`` chooses for its dtype and its draft's quantization, whether a draft
can score a reduced vocabulary, which hidden layers it returns, the suffix of its shipped pre-verifier
checkpoints, its runtime's version, and whether ``--backend auto`` may pick it. Nothing else in pacer compares
backend names (an architecture test checks it): code asks the record (``backends.of(loaded).reduced_head``,
``backends.get(name).dtypes``), and loads a model through it (:func:`load_model`). This module imports nothing of
pacer's but its errors and, as a type, the loaded-model contract (:class:`pacer.models.LoadedModel`, which imports
no backend), so that every layer above the models may ask a record.

A backend is one file: a :class:`~pacer.decoding.backend.ModelBackend`, a loaded-model class (the contract of
:class:`pacer.models.LoadedModel`, with ``backend`` set to the record's name), its loader and one
:func:`register` call with its record. The built-ins are the files of this package, registered when ``pacer`` is
imported (``pacer/__init__.py`` imports them, ``llamacpp`` first: ``auto`` tries records in registry order):

- :mod:`pacer.backends.transformers`: PyTorch (the reference). Model folders and GGUF files (dequantized once
  and cached); bf16/fp32/fp16 (``auto``: measured on this machine), pacer's int8 weight-only quantization, a
  reduced draft head, any hidden layer, CPU or CUDA.
- :mod:`pacer.backends.llamacpp`: GGUF files as they are, on llama.cpp's own kernels through llama-cpp-python:
  the file's own quantization, the whole LM head, the final hidden state only, the CPU in this build. ``auto``
  picks it for a GGUF pair when llama-cpp-python is installed.

An outside backend is the same file anywhere, calling ``pacer.backends.register(Backend(...))``
(``tests/test_toy_backend.py`` registers a toy one).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import PacerError

if TYPE_CHECKING:
    from ..models import LoadedModel


def _none(*_a) -> str | None:
    return None


@dataclass(frozen=True)
class Backend:
    """A backend's abilities. ``load(spec, dtype, home, progress)`` returns a loaded model;
    ``version()`` names the runtime that computes the forwards (calibration keys, profiles);
    ``refuses(spec)`` says why it cannot run a model spec (``None``: it can), checked before anything loads;
    ``missing()`` says why it cannot run on this machine (``None``: installed)."""

    name: str
    summary: str
    load: Callable[[str, str, Path | None, bool], LoadedModel]
    version: Callable[[], str]
    #: device types it runs on (``cpu``, ``cuda``)
    devices: tuple[str, ...] = ("cpu",)
    #: the weight dtypes ``--dtype`` chooses among (empty: the model file's own types; ``--dtype`` does not apply)
    dtypes: tuple[str, ...] = ()
    #: pacer's int8 weight-only quantization (``--quantize``/``--draft-quant``) applies
    int8: bool = False
    #: a draft can score a reduced vocabulary (``--draft-vocab``, :mod:`pacer.draftvocab`)
    reduced_head: bool = False
    #: the hidden layers a forward can return (``None``: any layer)
    hidden_layers: tuple[int, ...] | None = None
    #: the models are ``transformers`` modules (moved to a device in place; transformers' own assisted generation
    #: can run them)
    torch_modules: bool = False
    #: shipped pre-verifier checkpoints: ``pacer-default`` (empty suffix) or ``pacer-<suffix>``
    checkpoint_suffix: str = ""
    refuses: Callable[[str | None], str | None] = _none
    missing: Callable[[], str | None] = _none
    #: ``--backend auto`` may pick it (in registry order) where it runs every model and setting
    auto: bool = False
    #: why ``auto`` picks it, in a few words (``pacer demo`` prints it)
    auto_reason: str = ""
    #: the backend whose plain decoding of the same model file is the user's real anchor beside this one's runs
    #: (``pacer bench``, ``pacer demo``; empty: none), where that backend runs the target
    anchor: str = ""
    #: ``pacer bench``'s default ``--methods`` on this backend (empty: the bench's default)
    bench_methods: str = ""
    #: ``(dtype, why)`` that ``--dtype auto`` loads the weights in on a device (``device, progress``); ``None``:
    #: no choice (the loader gets ``bfloat16`` and may ignore it)
    auto_dtype: Callable[[str, bool], tuple[str, str]] | None = None
    #: the draft ``--draft-quant auto`` runs, given the loaded one: itself (as loaded, or quantized in place:
    #: transformers' int8) or the same weights in a cheaper encoding (llama.cpp: a Q4_0 copy of its GGUF) where
    #: that measures faster here; ``None``: the draft as loaded
    auto_draft_quant: Callable[[LoadedModel], LoadedModel] | None = None

    @property
    def default_layers(self) -> tuple[int, ...]:
        """The hidden layers a pre-verifier reads on this backend by default (the trained features)."""
        return self.hidden_layers if self.hidden_layers is not None else (-13, -1)

    def setting_problem(self, quantize: str = "none", draft_quant: str = "none",
                        draft_vocab: object = "auto") -> str | None:
        """Why this backend cannot take these settings (``None``: it can)."""
        def which(ability: str) -> str:
            return " / ".join(b.name for b in _REGISTRY.values() if getattr(b, ability)) or "no"

        if not self.int8 and (quantize != "none" or draft_quant not in ("none", "auto")):
            return (f"--quantize/--draft-quant apply to the {which('int8')} backend; the {self.name} backend runs "
                    f"the model file's own quantization (pass a quantized GGUF instead)")
        if not self.reduced_head and str(draft_vocab) not in ("auto", "0", "None"):
            return (f"--draft-vocab applies to the {which('reduced_head')} backend; the {self.name} backend scores "
                    f"the whole vocabulary (drop --draft-vocab)")
        return None


_REGISTRY: dict[str, Backend] = {}


def register(backend: Backend, replace: bool = False) -> Backend:
    """Add ``backend`` (``replace``: over one of the same name)."""
    if not backend.name or backend.name == "auto" or any(c in backend.name for c in ",:= "):
        raise PacerError(f"a backend name must be non-empty, not auto, without ',', ':', '=' or spaces: "
                         f"{backend.name!r}")
    if backend.name in _REGISTRY and not replace:
        raise PacerError(f"backend '{backend.name}' is already registered")
    _REGISTRY[backend.name] = backend
    return backend


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def dtypes() -> tuple[str, ...]:
    """Every weights dtype a registered backend takes (what ``dtype`` may name besides ``auto``)."""
    return tuple(dict.fromkeys(d for b in _REGISTRY.values() for d in b.dtypes))


def get(name: str) -> Backend:
    """The backend called ``name``, or a one-line error listing the known ones."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise PacerError(f"unknown backend '{name}'; use auto or one of {', '.join(_REGISTRY)}") from None


def of(loaded: object) -> Backend:
    """The record of a loaded model (its ``backend`` attribute names it)."""
    return get(loaded.backend)


def check(name: str, *specs: str | None) -> Backend:
    """The record of ``name`` after checking, before anything loads, that it runs here and runs every model spec
    (``None``: no model)."""
    b = get(name)
    for spec in specs:
        if spec is not None and (why := b.refuses(spec)):
            raise PacerError(why)
    if why := b.missing():
        raise PacerError(why)
    return b


def load_model(spec: str, dtype: str = "bfloat16", home: Path | None = None, progress: bool = True,
               backend: str = "transformers", checked: bool = False) -> LoadedModel:
    """Load ``spec`` (``default-target``/``default-draft``, a Hugging Face model folder or a ``.gguf`` file) with
    ``backend``'s loader, checking first that the backend runs it here (``checked``: a resolved
    :class:`pacer.pair.LoadSpec` has)."""
    record = get(backend) if checked else check(backend, spec)
    return record.load(spec, dtype, home, progress)


def resolve(name: str, specs: Sequence[str | None], device: str = "cpu", quantize: str = "none",
            draft_quant: str = "none", draft_vocab: object = "auto") -> str:
    """``auto`` -> the first registered backend with ``auto`` set that is installed and runs every model spec,
    the device type and the settings (the ``llamacpp`` record for a GGUF pair with llama-cpp-python installed:
    several times faster per token on a CPU than PyTorch's dequantized weights, docs/backends.md), else
    ``transformers`` (the reference). Any other name is returned as it is (checked by :func:`check`)."""
    if name != "auto":
        return name
    for b in _REGISTRY.values():
        if (b.auto and device in b.devices and b.missing() is None
                and b.setting_problem(quantize, draft_quant, draft_vocab) is None
                and not any(s is not None and b.refuses(s) for s in specs)):
            return b.name
    for b in _REGISTRY.values():  # the first that runs them (the reference, transformers, for model folders)
        if (device in b.devices and b.missing() is None
                and b.setting_problem(quantize, draft_quant, draft_vocab) is None
                and not any(s is not None and b.refuses(s) for s in specs)):
            return b.name
    raise PacerError("no registered backend runs these models with these settings here")


def anchor_for(name: str, target: str) -> str | None:
    """The backend whose plain decoding of ``target`` is the real anchor beside backend ``name``'s runs, or
    ``None`` where there is none or it cannot run ``target`` here."""
    other = get(name).anchor
    if not other or other not in _REGISTRY:
        return None
    b = get(other)
    return other if b.missing() is None and b.refuses(target) is None else None


def reason(name: str) -> str:
    """Why ``auto`` chose backend ``name``, in a few words (for ``pacer demo``)."""
    if get(name).auto:
        return get(name).auto_reason
    skipped = [b for b in _REGISTRY.values() if b.auto and b.name != name]
    missing = [f"{b.missing()}" for b in skipped if b.missing()]
    if missing:
        return f"{missing[0]}: PyTorch runs the pair"
    return "the pair or a setting needs PyTorch (a model folder, --quantize, --draft-vocab, a GPU)"
