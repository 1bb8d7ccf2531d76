"""One load spec and one loaded pair: :class:`LoadSpec` owns every ``auto`` choice and every cross-check of the
model settings, once; :class:`Pair` is what the layers below the API get (calibration, the draft vocabulary, the
learned policies, the method factories), never the :class:`pacer.Decoder`.

``LoadSpec(...).resolve()`` checks, before anything loads: the quantization kinds, the backend (``auto``: the
first registered backend that runs the models, the device and the settings, :func:`pacer.backends.resolve`), that
the backend runs every model spec and is installed, that it takes the settings (int8, a reduced draft vocabulary),
the device (:func:`pacer.devices.check_device`) and the threads. ``load()`` then measures what ``auto`` leaves to
this machine (the weights' dtype: the record's ``auto_dtype``), loads the models with the
backend's loader and returns the :class:`Pair`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import torch

from . import backends, devices, models
from .decoding import ModelBackend
from .decoding.meter import DRAFT, TARGET, metered
from .errors import InvalidType, PacerError

END_TOKENS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end|>")


class Pair:
    """A target, an optional draft and their tokenizer, placed on a device with their quantization applied.

    ``target`` is the target's :class:`~pacer.decoding.ModelBackend` (metered: its forwards go to a generation's
    ledger); :meth:`draft_backend` opens a fresh one on the draft. ``vocab``: the target's vocabulary size;
    ``eos``: the ids that end a generation; ``record``: the backend's :class:`pacer.backends.Backend`."""

    def __init__(self, target: models.LoadedModel, draft: models.LoadedModel | None = None,
                 threads: int | None = None, device: str | torch.device | None = "auto", quantize: str = "none",
                 draft_quant: str = "none") -> None:
        from . import quantize as q

        q.check_kind(quantize)
        if draft_quant != "auto":
            q.check_kind(draft_quant)
        self.record = backends.of(target)
        if why := self.record.setting_problem(quantize, draft_quant):
            raise PacerError(why)
        self.device = devices.place(target, draft, device, quantize, draft_quant)
        self.threads = models.set_threads(threads)
        self.target_info, self.draft_info = target, draft
        self.tokenizer = target.tokenizer
        if draft is not None and target.tokenizer is not None and draft.tokenizer is not None:
            models.check_same_tokenizer(target.tokenizer, draft.tokenizer)
        if quantize == "int8":
            q.quantize_int8(target.model)
        if draft is not None and draft_quant == "int8":
            q.quantize_int8(draft.model)
        elif draft is not None and draft_quant == "auto" and (choose := backends.of(draft).auto_draft_quant):
            if choose(draft) == "int8":
                q.quantize_int8(draft.model)
        self.backend = target.backend
        self.target: ModelBackend = metered(target.open(), TARGET)
        self.vocab = target.vocab_size
        self.eos = models.eos_ids(target)
        if self.tokenizer is not None:
            vocab = self.tokenizer.get_vocab()
            self.eos.update(vocab[t] for t in END_TOKENS if t in vocab)

    def draft_backend(self, rows: torch.Tensor | None = None) -> ModelBackend:
        """A fresh backend (its own cache) on the draft model, scoring vocabulary ``rows`` (``None``: all)."""
        if self.draft_info is None:
            raise PacerError("this method needs a draft model")
        return metered(self.draft_info.open(rows), DRAFT)


@dataclass(frozen=True)
class LoadSpec:
    """What to load and how (see the module docstring). ``target`` / ``draft``: ``default-target`` /
    ``default-draft``, a Hugging Face model folder or a ``.gguf`` file (``draft=None``: no draft). ``backend``,
    ``dtype``, ``device``, ``draft_quant``: ``auto`` or a value (``dtype`` applies to backends with dtypes);
    ``quantize``: ``none`` or ``int8`` (a different, faster target); ``draft_vocab``: checked against the backend
    here, resolved by the :class:`pacer.Decoder`; ``threads``: ``None`` for all cores (more than the cores are
    capped, with a warning)."""

    target: str = "default-target"
    draft: str | None = "default-draft"
    backend: str = "auto"
    dtype: str = "auto"
    threads: int | None = None
    device: str | torch.device | None = "auto"
    draft_quant: str = "auto"
    quantize: str = "none"
    draft_vocab: int | str | Sequence[int] | None = "auto"
    progress: bool = field(default=True, compare=False)
    resolved: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        """Every field of the right type (a path may be a :class:`os.PathLike`, kept as its text), else a one-line
        :class:`~pacer.errors.InvalidType` (a ``TypeError``); the values are checked by :meth:`resolve`."""
        for name, optional in (("target", False), ("draft", True)):
            v = getattr(self, name)
            if isinstance(v, os.PathLike):
                object.__setattr__(self, name, v := os.fspath(v))
            if not (isinstance(v, str) or (optional and v is None)):
                raise InvalidType(f"{name} must be a model: default-{name}, a Hugging Face model folder or a .gguf "
                                  f"file (a str or a path){', or None for no draft' if optional else ''}; got {v!r}")
        for name in ("backend", "dtype", "draft_quant", "quantize"):
            if not isinstance(v := getattr(self, name), str):
                raise InvalidType(f"{name} must be a str (auto or a value), got {v!r}")
        if self.threads is not None and (isinstance(self.threads, bool) or not isinstance(self.threads, int)):
            raise InvalidType(f"threads must be an integer >= 1 or None (all cores), got {self.threads!r}")
        if not (self.device is None or isinstance(self.device, (str, torch.device))):
            raise InvalidType(f"device must be auto, cpu, cuda, cuda:N or a torch.device, got {self.device!r}")
        if self.draft_vocab is not None:
            if isinstance(self.draft_vocab, Mapping):
                raise InvalidType(f"draft_vocab must be auto, a number of tokens or token ids, got "
                                  f"{self.draft_vocab!r}")
            from .methods import DRAFT_VOCAB

            DRAFT_VOCAB.check(self.draft_vocab, "")
        if not isinstance(self.progress, bool):
            raise InvalidType(f"progress must be true or false, got {self.progress!r}")

    @property
    def specs(self) -> tuple[str | None, ...]:
        return (self.target, self.draft)

    def resolve(self) -> LoadSpec:
        """This spec with ``backend`` and ``device`` decided and every setting checked (loads nothing)."""
        if self.resolved:
            return self
        from .quantize import check_kind

        check_kind(self.quantize)
        if self.draft_quant != "auto":
            check_kind(self.draft_quant)
        threads = self.threads
        if threads is not None:
            if isinstance(threads, bool) or not isinstance(threads, int) or threads <= 0:
                raise PacerError(f"threads must be >= 1, got {threads}")
            cores = os.cpu_count() or 1
            if threads > cores:
                print(f"pacer: warning: --threads {threads} is more than this machine's {cores} cores "
                      f"(oversubscribed threads run many times slower); using {cores}", file=sys.stderr)
                threads = cores
        name = backends.resolve(self.backend, self.specs, devices.device_type(self.device), self.quantize,
                                self.draft_quant, self.draft_vocab)
        device = devices.check_device(self.device, name, self.quantize, self.draft_quant)
        record = backends.check(name, *self.specs)
        if why := record.setting_problem(self.quantize, self.draft_quant, self.draft_vocab):
            raise PacerError(why)
        if self.dtype != "auto" and record.dtypes and self.dtype not in record.dtypes:
            raise PacerError(f"dtype must be auto or one of {', '.join(record.dtypes)}, got '{self.dtype}'")
        return replace(self, backend=name, device=device, threads=threads, resolved=True)

    @property
    def record(self) -> backends.Backend:
        return backends.get(self.resolve().backend)

    def load(self) -> Pair:
        """The pair, loaded (resolving first)."""
        spec = self.resolve()
        models.set_threads(spec.threads)
        dtype = spec.dtype
        record = spec.record
        if dtype == "auto":  # the weights' dtype, measured on this machine where the backend has a choice
            dtype = record.auto_dtype(spec.device, spec.progress)[0] if record.auto_dtype else "bfloat16"
        t = models.load_model(spec.target, dtype, progress=spec.progress, backend=spec.backend)
        d = models.load_model(spec.draft, dtype, progress=spec.progress, backend=spec.backend) if spec.draft else None
        return Pair(t, d, spec.threads, spec.device, spec.quantize, spec.draft_quant)
