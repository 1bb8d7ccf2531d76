"""One load request and one loaded pair: :class:`LoadSpec` owns every ``auto`` choice and every cross-check of the
model settings, made once by :meth:`LoadSpec.resolve`; :class:`Pair` trusts a resolved spec and is what the layers
below the API get (calibration, the draft vocabulary, the learned policies, the method factories), never the
:class:`pacer.Decoder`.

``LoadSpec(...)`` checks each setting's type and what a value alone can say (the threads, :func:`check_threads`;
the draft vocabulary, :func:`check_draft_vocab`); ``resolve()`` checks, before anything loads: the quantization
kinds, the backend (``auto``: the first registered backend that runs the models, the device and the settings,
:func:`pacer.backends.resolve`), that the backend runs every model spec and is installed, that it takes the settings
(int8, a reduced draft vocabulary) and the device (:func:`pacer.devices.check_device`), and caps the threads at the
cores. ``load()`` then measures what ``auto`` leaves to this machine (the weights' dtype: the record's
``auto_dtype``), loads the models with the backend's loader and returns the :class:`Pair`. Models loaded already
get their settings checked the same way, once (:meth:`LoadSpec.loaded`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from . import backends, devices, models
from .decoding import ModelBackend
from .decoding.meter import DRAFT, TARGET, metered
from .errors import ContextError, InvalidType, InvalidValue, PacerError
from .prompt import check_history, check_prompt_ids, check_stop, check_text

END_TOKENS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end|>")


class Pair:
    """A target, an optional draft and their tokenizer, placed on a device with their quantization applied.

    ``spec``: the resolved :class:`LoadSpec` the models were loaded with (trusted: nothing is checked again), or
    ``None`` to check ``threads``, ``device``, ``quantize`` and ``draft_quant`` here for models loaded some other
    way (:meth:`LoadSpec.loaded`). ``target`` is the target's :class:`~pacer.decoding.ModelBackend` (metered: its
    forwards go to a generation's ledger); :meth:`draft_backend` opens a fresh one on the draft. ``vocab``: the
    target's vocabulary size; ``eos``: the ids that end a generation; ``record``: the backend's
    :class:`pacer.backends.Backend`."""

    def __init__(self, target: models.LoadedModel, draft: models.LoadedModel | None = None,
                 threads: int | None = None, device: str | torch.device | None = "auto", quantize: str = "none",
                 draft_quant: str = "none", *, spec: LoadSpec | None = None) -> None:
        from . import quantize as q

        if spec is None:
            spec = LoadSpec.loaded(target, draft, threads, device, quantize, draft_quant)
        elif not spec.resolved:
            raise PacerError("a Pair takes a resolved LoadSpec (LoadSpec.resolve())")
        self.spec = spec
        self.record = backends.of(target)
        self.device = devices.place(target, draft, spec.device)
        self.threads = models.set_threads(spec.threads)
        self.tokenizer = target.tokenizer
        if draft is not None and target.tokenizer is not None and draft.tokenizer is not None:
            models.check_same_tokenizer(target.tokenizer, draft.tokenizer)
        if spec.quantize == "int8":
            q.quantize_int8(target.model)
        if draft is not None and spec.draft_quant == "int8":
            q.quantize_int8(draft.model)
        elif draft is not None and spec.draft_quant == "auto" and (choose := backends.of(draft).auto_draft_quant):
            draft = choose(draft)  # the draft only proposes: any encoding of its weights keeps the output
        self.target_info, self.draft_info = target, draft
        self.backend = target.backend
        self.target: ModelBackend = metered(target.open(), TARGET)
        self.vocab = target.vocab_size
        self.eos = target.end_ids()
        if self.tokenizer is not None:
            vocab = self.tokenizer.get_vocab()
            self.eos.update(vocab[t] for t in END_TOKENS if t in vocab)

    def draft_backend(self, rows: torch.Tensor | None = None) -> ModelBackend:
        """A fresh backend (its own cache) on the draft model, scoring vocabulary ``rows`` (``None``: all)."""
        if self.draft_info is None:
            raise PacerError("this method needs a draft model")
        return metered(self.draft_info.open(rows), DRAFT)

    def encode(self, prompt: str | Sequence[int], chat: bool = False, history: Sequence[dict] = ()) -> list[int]:
        """Token ids of ``prompt`` (a string, or token ids: integers below the models' vocabulary, checked);
        ``chat`` applies the chat template to a string, after ``history`` (earlier ``{"role", "content"}``
        messages)."""
        if not isinstance(prompt, str):
            vocab = min(self.vocab, self.draft_info.vocab_size) if self.draft_info is not None else self.vocab
            ids = check_prompt_ids(prompt, vocab)
        else:
            if not prompt.strip():
                raise PacerError("the prompt is empty; pass some text")
            check_text(prompt)
            if self.tokenizer is None:
                raise PacerError("this model pair has no tokenizer; pass token ids instead of text")
            if chat:
                if not getattr(self.tokenizer, "chat_template", None):
                    raise PacerError("a chat prompt needs a chat template, and the target's tokenizer has none")
                msgs = [*check_history(history), {"role": "user", "content": prompt}]
                ids = self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                                         return_dict=False)
                if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                    ids = ids["input_ids"]
                ids = list(ids)
            else:
                ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        if not ids:
            raise PacerError("the prompt is empty; pass some text")
        if len(ids) >= self.target.context:
            raise ContextError(
                f"the prompt has {len(ids)} tokens but the model's context is {self.target.context}; "
                f"shorten the prompt"
            )
        return ids

    def decode(self, ids: Sequence[int], stop: str | Sequence[str] = ()) -> str:
        """The text of ``ids``, cut before the first stop string (``stop``: one string or a list)."""
        stop = check_stop(stop)
        if self.tokenizer is None:
            return ""
        text = self.tokenizer.decode(list(ids), skip_special_tokens=True)
        for s in stop:
            if s in text:
                text = text[: text.index(s)]
        return text


# ------------------------------------------------------------------------------------------ a load's settings
def check_threads(threads: object) -> int | None:
    """``threads``, the intra-op threads of a load: ``None`` (all cores) or an integer >= 1
    (:class:`~pacer.errors.InvalidType` / :class:`~pacer.errors.InvalidValue` otherwise). The one check of the
    setting: a :class:`LoadSpec` makes it when built (:meth:`LoadSpec.resolve` caps it at the cores), the command
    line before anything loads."""
    if threads is None:
        return None
    if isinstance(threads, bool) or not isinstance(threads, int):
        raise InvalidType(f"threads must be an integer >= 1 or None (all cores), got {threads!r}")
    if threads <= 0:
        raise InvalidValue(f"threads must be >= 1, got {threads}")
    return threads


def parse_draft_vocab(text: str, name: str = "draft_vocab") -> int | str:
    """``auto`` or a number of tokens (0: the full vocabulary) from text; ``name``: what the messages call the
    setting."""
    if text == "auto":
        return text
    try:
        size = int(text)
    except ValueError:
        size = -1
    if size < 0:
        raise InvalidValue(f"{name} must be auto or a number of tokens (0: the full vocabulary), got "
                           f"{text!r}")
    return size


def check_draft_vocab(value: Any) -> Any:
    """A draft vocabulary (:mod:`pacer.draftvocab`): ``auto``, a number of tokens >= 0 or token ids (a sequence of
    ints), the load setting's and every drafting method's ``draft_vocab`` option's."""
    if isinstance(value, str):
        return parse_draft_vocab(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    try:
        if not isinstance(value, (bool, int, float)) and all(int(i) == i for i in value):
            return value
    except (TypeError, ValueError):
        pass
    raise InvalidValue(f"draft_vocab must be auto, a number of tokens (0: the full vocabulary) or token ids, got "
                       f"{value!r}")


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
    #: the models are loaded already (:meth:`loaded`): their specs are not checked against the backend
    preloaded: bool = field(default=False, compare=False)

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
        check_threads(self.threads)
        if not (self.device is None or isinstance(self.device, (str, torch.device))):
            raise InvalidType(f"device must be auto, cpu, cuda, cuda:N or a torch.device, got {self.device!r}")
        if self.draft_vocab is not None:
            if isinstance(self.draft_vocab, Mapping):
                raise InvalidType(f"draft_vocab must be auto, a number of tokens or token ids, got "
                                  f"{self.draft_vocab!r}")
            check_draft_vocab(self.draft_vocab)
        if not isinstance(self.progress, bool):
            raise InvalidType(f"progress must be true or false, got {self.progress!r}")

    @property
    def specs(self) -> tuple[str | None, ...]:
        """The model specs the backend must run (none for models loaded already)."""
        return () if self.preloaded else (self.target, self.draft)

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
        known = record.dtypes or backends.dtypes()  # (a backend without a choice runs the file's own types)
        if self.dtype != "auto" and self.dtype not in known:
            raise InvalidValue(f"dtype must be auto or one of {', '.join(known)}, got '{self.dtype}'")
        return replace(self, backend=name, device=device, threads=threads, resolved=True)

    @classmethod
    def loaded(cls, target: models.LoadedModel, draft: models.LoadedModel | None = None, threads: int | None = None,
               device: str | torch.device | None = "auto", quantize: str = "none",
               draft_quant: str = "none") -> LoadSpec:
        """The resolved settings of models loaded already (on ``target``'s backend; their specs are not checked:
        they have loaded)."""
        return cls(target.source, draft.source if draft is not None else None, backends.of(target).name, "auto",
                   threads, device, draft_quant, quantize, preloaded=True).resolve()

    def without_draft(self) -> LoadSpec:
        """This spec with no draft (resolved stays resolved: dropping a model leaves every check true)."""
        return replace(self, draft=None)

    @property
    def record(self) -> backends.Backend:
        return backends.get(self.resolve().backend)

    def load(self) -> Pair:
        """The pair, loaded (resolving first, unless resolved already)."""
        spec = self.resolve()
        models.set_threads(spec.threads)
        dtype = spec.dtype
        record = spec.record
        if dtype == "auto":  # the weights' dtype, measured on this machine where the backend has a choice
            dtype = record.auto_dtype(spec.device, spec.progress)[0] if record.auto_dtype else "bfloat16"
        t = backends.load_model(spec.target, dtype, progress=spec.progress, backend=spec.backend, checked=True)
        d = (backends.load_model(spec.draft, dtype, progress=spec.progress, backend=spec.backend, checked=True)
             if spec.draft else None)
        return Pair(t, d, spec=spec)
