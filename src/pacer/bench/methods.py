"""Benchmark method specs (``name:key=val:key=val``) read from the method registry (:mod:`pacer.methods`).

Every registered method goes through :meth:`pacer.api.Decoder.generate` generically; ``hf-assisted`` is
transformers' own assisted generation on the same two loaded models (see :mod:`pacer.bench.hf`), a peer that
only the benchmark runs.

Option keys: the ones every drafting method takes - ``gamma``, ``min_draft`` (alias ``min``), ``max_draft``
(alias ``max``), ``cost_aware`` (``true``/``false``; default: on unless ``gamma`` or a threshold is given),
``draft_vocab`` (a reduced draft vocabulary, :mod:`pacer.draftvocab`), ``verify`` (``token``/``block``: the sampling
verification rule of this method's runs, ``pacer bench --verify`` for every method; sampling only, not ``ar``) -
and the method's own registered options
(``threshold``, ``path``, ``block``, ``initial``, Ouroboros's ``ngram``, ``candidates``, ``sources``, ...). A value
``A..B`` expands into one method per integer in ``A..B`` (``sd:gamma=2..8`` is seven methods). ``hf-assisted``
takes ``schedule``, ``tokens`` and ``threshold``. ``lookup@llamacpp`` (llama-cpp-python's own prompt lookup on the
run's GGUF target, :mod:`pacer.bench.peer`) takes ``num_pred_tokens``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from .. import methods
from ..errors import PacerError
from ..io import resolve_path
from ..request import SETTINGS, MethodRequest
from ..sampling import VERIFY_RULES, SamplingConfig
from .peer import PEER
from .peer import check_options as check_peer

HF_ASSISTED = "hf-assisted"
#: the user's real anchor on a transformers-backend run of a GGUF target: llama.cpp's plain decoding of the same
#: file (the fastest plain decoding on a CPU), run beside ``ar`` (:func:`anchor_spec`)
ANCHOR = "ar@llamacpp"
HF_KEYS = {"schedule": "num_assistant_tokens_schedule", "tokens": "num_assistant_tokens",
           "threshold": "assistant_confidence_threshold"}
HF_SCHEDULES = ("constant", "heuristic", "heuristic_transient")
ALIASES = {"min": "min_draft", "max": "max_draft"}
#: the spec key of the sampling verification rule (not a method option: the runs' SamplingConfig.verify)
VERIFY = "verify"
#: the settings every drafting method takes besides its own options
GENERATE_KEYS = SETTINGS


def all_methods() -> tuple[str, ...]:
    return (*methods.names(), HF_ASSISTED, PEER)


def parse_value(text: str) -> int | float | bool | str:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


@dataclass(frozen=True)
class MethodSpec:
    """One benchmarked method: ``name`` (a registered method, or ``hf-assisted``) with options."""

    name: str
    options: tuple[tuple[str, object], ...] = ()
    label: str = field(default="", compare=False)

    @property
    def opts(self) -> dict:
        return dict(self.options)

    @property
    def is_ar(self) -> bool:
        """The baseline every speedup divides by (the anchor, llama.cpp's plain decoding, is not)."""
        return self.name == "ar" and not self.is_anchor

    @property
    def is_anchor(self) -> bool:
        return self.label == ANCHOR

    @property
    def greedy_only(self) -> bool:
        """It decodes greedily only (the registry says which methods; ``hf-assisted`` is greedy here)."""
        return self.name in (HF_ASSISTED, PEER) or methods.get(self.name).greedy_only

    @property
    def verify(self) -> str | None:
        """The verification rule this spec names (``verify=``; ``None``: the bench's own, ``--verify``)."""
        return self.opts.get(VERIFY)

    def request(self) -> MethodRequest:
        """The :class:`~pacer.request.MethodRequest` :meth:`Decoder.generate` takes (not for ``hf-assisted``)."""
        return MethodRequest.of(self.name, **{k: v for k, v in self.options if k != VERIFY})

    def sampling(self, sampling: SamplingConfig | None) -> SamplingConfig | None:
        """``sampling`` verified by this spec's own rule where it names one (greedy: ``None``, as it is)."""
        return sampling if sampling is None or self.verify is None else replace(sampling, verify=self.verify)


def anchor_spec() -> MethodSpec:
    return MethodSpec("ar", (), ANCHOR)


def _option(name: str, key: str) -> methods.Option | None:
    """The registered option ``key`` of method ``name`` (common ones included; ``None``: it takes none)."""
    if key in GENERATE_KEYS:
        return next(o for o in methods.COMMON if o.name == key)
    m = methods.get(name)
    return methods.DRAFT_VOCAB if key == methods.DRAFT_VOCAB.name and m.loads_draft else m.option(key)


def _check(name: str, opts: list[tuple[str, object]], raw: str) -> None:
    known = all_methods()
    if name not in known:
        raise PacerError(f"unknown method '{name}' in --methods ('{raw}'); choose from {', '.join(known)}")
    keys = [k for k, _ in opts]
    if len(set(keys)) != len(keys):
        raise PacerError(f"method '{raw}' repeats an option")
    if VERIFY in keys:
        rule = dict(opts)[VERIFY]
        if name in (HF_ASSISTED, PEER) or not methods.get(name).drafts:
            raise PacerError(f"method '{raw}': {name} verifies no draft; verify= is for drafting methods")
        if rule not in VERIFY_RULES:
            raise PacerError(f"method '{raw}': verify must be one of {', '.join(VERIFY_RULES)}, got {rule!r}")
        opts = [(k, v) for k, v in opts if k != VERIFY]
    if name == PEER:  # llama-cpp-python's own prompt lookup (pacer.bench.peer)
        return check_peer(dict(opts), raw)
    if name == HF_ASSISTED:
        for k, v in opts:
            if k not in HF_KEYS:
                raise PacerError(f"method '{raw}': hf-assisted takes {', '.join(HF_KEYS)}, not '{k}'")
            if k == "schedule" and v not in HF_SCHEDULES:
                raise PacerError(f"method '{raw}': schedule must be one of {', '.join(HF_SCHEDULES)}")
        return
    try:
        MethodRequest.of(name, **dict(opts)).check_files()  # a pool file or checkpoint named: before anything loads
    except PacerError as e:  # the request's own check; named by the spec as written where it names no method
        raise PacerError(str(e) if f"method '{name}'" in str(e) else f"method '{raw}': {e}") from None


#: ``rule:threshold=validation``: the rule's threshold chosen on a checkpoint's validation prompts (``--validation``)
VALIDATION = "validation"


def validation_thresholds(ckpt: Path, mode: str | None = None) -> dict[str, dict]:
    """The thresholds a checkpoint records, each with how it was chosen (``pacer train``: on its collection's
    validation prompts under its costs): the training-free rules' (:func:`pacer.preverify.train.rule_thresholds`)
    and the layer's own, under the checkpoint's kind (``pacer`` / ``specdecpp``); ``mode`` (``greedy`` /
    ``sampled``): the one chosen on that mode's validation rounds where the checkpoint records it. A checkpoint
    without rule thresholds is a one-line error."""
    from ..policies.learned import read_config

    try:
        cfg, _ = read_config(ckpt, whole=False)
    except PacerError as e:
        raise PacerError(f"--validation: {e}") from None
    rules = cfg.get("rules")
    if not isinstance(rules, dict) or not rules:
        raise PacerError(f"--validation: {ckpt} records no rule thresholds (a checkpoint trained before pacer train "
                         f"chose them); train one with this pacer and pass it as --validation CKPT")
    ckpt = shown_path(ckpt)
    out = {k: {**v, **(v.get("by_mode") or {}).get(mode, {}), "checkpoint": str(ckpt)} for k, v in rules.items()}
    if cfg.get("kind") in ("pacer", "specdecpp") and "threshold" in cfg:
        val = cfg.get("train", {})
        how = (f"highest predicted speedup on the validation split of {val.get('data', 'its collection')} "
               f"({val.get('rounds_val', '?')} rounds of held-out collection prompts, never benchmark questions) "
               f"under the checkpoint's costs")
        out[cfg["kind"]] = {"threshold": cfg["threshold"], "chosen": how,
                            **(cfg.get("threshold_by_mode") or {}).get(mode, {}), "checkpoint": str(ckpt),
                            "layer": True}
    return out


def shown_path(path: Path | str) -> Path:
    """``path`` relative to the working directory where it lies under it (a report and a method label name the
    repository's files, never one machine's folders), else as it is."""
    p = Path(path)
    try:
        return p.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return p


def _same_checkpoint(raw: str, path: str, ckpt: str) -> None:
    """``pacer:threshold=validation`` runs the threshold chosen for the checkpoint ``--validation`` names, so the
    method must load that checkpoint."""
    if resolve_path(path, "checkpoint") != resolve_path(ckpt, "--validation"):
        raise PacerError(f"method '{raw}': the validation threshold is {ckpt}'s own, but the method loads {path}; "
                         f"pass path={ckpt} or --validation {path}")


#: the most methods ``--methods`` may list, ranges expanded (each runs every question: a benchmark of more is days)
MAX_METHODS = 64
#: ``A..B``: two integers of at most 9 digits (ASCII; a larger one is refused by the option's own range anyway)
_RANGE = re.compile(r"(-?[0-9]{1,9})\.\.(-?[0-9]{1,9})")


def parse_methods(text: str, validation: Callable[[], dict[str, dict]] | None = None) -> list[MethodSpec]:
    """Parse ``--methods``: comma-separated ``name:key=val:...``; ``ar`` goes first (added if missing).
    ``threshold=validation`` takes the rule's threshold from ``validation()`` (:func:`validation_thresholds`).
    At most :data:`MAX_METHODS` methods, ranges expanded (refused before any is expanded)."""
    specs: list[MethodSpec] = []
    labels: set[str] = set()
    for raw in (s.strip() for s in text.split(",")):
        if not raw:
            continue
        name, *parts = [p.strip() for p in raw.split(":")]
        items: list[tuple[str, str]] = []
        for p in parts:
            if "=" not in p:
                raise PacerError(f"method '{raw}': option '{p}' is not key=value")
            k, v = (s.strip() for s in p.split("=", 1))
            k = k.replace("-", "_")
            items.append((ALIASES.get(k, k), v))
        variants: list[list[tuple[str, object]]] = [[]]
        for k, v in items:
            if (m := _RANGE.fullmatch(v.replace(" ", ""))) is not None:
                lo, hi = int(m[1]), int(m[2])
                if hi < lo:
                    raise PacerError(f"method '{raw}': empty range {v}")
                if len(specs) + len(variants) * (hi - lo + 1) > MAX_METHODS:
                    raise PacerError(f"method '{raw}': the range {v} makes more than {MAX_METHODS} methods, the most "
                                     f"--methods runs; pass a shorter range")
                values: list[object] = list(range(lo, hi + 1))
            elif k == "threshold" and v == VALIDATION:
                chosen = (validation or (lambda: {}))().get(name)
                if chosen is None:
                    raise PacerError(f"method '{raw}': no validation threshold for {name} (pass --validation CKPT "
                                     f"with a checkpoint that records the rules' thresholds)")
                if chosen.get("layer"):  # a layer's threshold is its own checkpoint's: it runs that one
                    if (path := dict(items).get("path")) is not None:
                        _same_checkpoint(raw, str(path), chosen["checkpoint"])
                    else:
                        variants = [[*base, ("path", chosen["checkpoint"])] for base in variants]
                values = [float(chosen["threshold"])]
            else:
                o = _option(name, k) if name in methods.names() and methods.get(name).drafts else None
                values = [o.parse(v) if o is not None and (o.type is str or o.parser) else parse_value(v)]
            variants = [[*base, (k, x)] for base in variants for x in values]
        shown = {k: v for k, v in items if (k, v) == ("threshold", VALIDATION)}  # labelled as asked, not its value
        for opts in variants:
            _check(name, opts, raw)
            label = ":".join([name, *(f"{k}={shown.get(k, v)}" for k, v in opts)])
            spec = MethodSpec(name, tuple(opts), label)
            if spec.label in labels:
                raise PacerError(f"method '{label}' is listed twice in --methods")
            if len(specs) >= MAX_METHODS:
                raise PacerError(f"--methods lists more than {MAX_METHODS} methods, the most it runs")
            specs.append(spec)
            labels.add(spec.label)
    if not specs:
        raise PacerError("--methods is empty")
    ar = [s for s in specs if s.is_ar]
    return [ar[0] if ar else MethodSpec("ar", (), "ar"), *(s for s in specs if not s.is_ar)]
