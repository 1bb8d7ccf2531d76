"""Benchmark method specs (``name:key=val:key=val``) and running one turn of one method.

Every name in :data:`pacer.api.METHODS` goes through :meth:`pacer.api.Decoder.generate` generically;
``hf-assisted`` is transformers' own assisted generation on the same two loaded models (see
:mod:`pacer.bench.hf`).

Option keys: ``gamma``, ``min_draft`` (alias ``min``), ``max_draft`` (alias ``max``), ``cost_aware``
(``true``/``false``; default: on unless ``gamma`` or ``threshold`` is given) go to ``generate`` itself;
``ngram``, ``pool_size``, ``candidates`` to the drafter (Ouroboros), ``draft_vocab`` to the drafter of
any drafting method (a reduced draft vocabulary, :mod:`pacer.draftvocab`); any other key to the policy
(``threshold``, ``path``, ``initial``, ...). A value ``A..B`` expands into one method per integer in
``A..B`` (``sd:gamma=2..8`` is seven methods). ``hf-assisted`` takes ``schedule``, ``tokens`` and
``threshold``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import PacerError

HF_ASSISTED = "hf-assisted"
HF_KEYS = {"schedule": "num_assistant_tokens_schedule", "tokens": "num_assistant_tokens",
           "threshold": "assistant_confidence_threshold"}
HF_SCHEDULES = ("constant", "heuristic", "heuristic_transient")
DRAFTER_KEYS = ("ngram", "pool_size", "candidates", "draft_vocab")
#: drafter keys every drafting method takes (the others are for ``PHRASE_METHODS`` only)
ANY_DRAFTER_KEYS = ("draft_vocab",)
#: methods that draft phrase by phrase and take ``DRAFTER_KEYS``
PHRASE_METHODS = ("ouroboros", "pacer+ouroboros")
ALIASES = {"min": "min_draft", "max": "max_draft", "pool-size": "pool_size"}
#: options that go to ``Decoder.generate`` itself
GENERATE_KEYS = ("gamma", "min_draft", "max_draft", "cost_aware")
#: methods whose policy takes only gamma and the bounds (make_policy would silently ignore other options)
NO_POLICY_OPTS = ("sd", "ouroboros")


def all_methods() -> tuple[str, ...]:
    from ..api import METHODS

    return (*METHODS, HF_ASSISTED)


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
    """One benchmarked method: ``name`` (in :data:`pacer.api.METHODS`, or ``hf-assisted``) with options."""

    name: str
    options: tuple[tuple[str, object], ...] = ()
    label: str = field(default="", compare=False)

    @property
    def opts(self) -> dict:
        return dict(self.options)

    @property
    def is_ar(self) -> bool:
        return self.name == "ar"

    @property
    def is_oracle(self) -> bool:
        return self.name == "oracle"

    def generate_kwargs(self) -> dict:
        """Keyword arguments for :meth:`Decoder.generate` (not for ``hf-assisted``)."""
        kw: dict = {}
        policy: dict = {}
        drafter: dict = {}
        for k, v in self.options:
            if k in GENERATE_KEYS:
                kw[k] = v
            elif k in DRAFTER_KEYS:
                drafter[k] = v
            else:
                policy[k] = v
        if policy:
            kw["policy_opts"] = policy
        if drafter:
            kw["drafter_opts"] = drafter
        return kw


def _check(name: str, opts: list[tuple[str, object]], raw: str) -> None:
    known = all_methods()
    if name not in known:
        raise PacerError(f"unknown method '{name}' in --methods ('{raw}'); choose from {', '.join(known)}")
    keys = [k for k, _ in opts]
    if len(set(keys)) != len(keys):
        raise PacerError(f"method '{raw}' repeats an option")
    if name == "ar" and opts:
        raise PacerError(f"method '{raw}': ar takes no options")
    if name == HF_ASSISTED:
        for k, v in opts:
            if k not in HF_KEYS:
                raise PacerError(f"method '{raw}': hf-assisted takes {', '.join(HF_KEYS)}, not '{k}'")
            if k == "schedule" and v not in HF_SCHEDULES:
                raise PacerError(f"method '{raw}': schedule must be one of {', '.join(HF_SCHEDULES)}")
        return
    for k, v in opts:
        integer = isinstance(v, int) and not isinstance(v, bool) and v >= 0
        if k in ("gamma", "min_draft", "max_draft", *DRAFTER_KEYS) and not integer:
            raise PacerError(f"method '{raw}': {k} must be a non-negative integer, got {v!r}")
        if k == "gamma" and v == 0:
            raise PacerError(f"method '{raw}': gamma must be >= 1")
        if k == "cost_aware" and not isinstance(v, bool):
            raise PacerError(f"method '{raw}': cost_aware must be true or false, got {v!r}")
        if k in DRAFTER_KEYS and k not in ANY_DRAFTER_KEYS and name not in PHRASE_METHODS:
            raise PacerError(f"method '{raw}': {k} is an option of {', '.join(PHRASE_METHODS)} only")
        if name in NO_POLICY_OPTS and k not in (*GENERATE_KEYS, *DRAFTER_KEYS):
            raise PacerError(f"method '{raw}': {name} takes gamma, min, max only, not '{k}'")


def parse_methods(text: str) -> list[MethodSpec]:
    """Parse ``--methods``: comma-separated ``name:key=val:...``; ``ar`` goes first (added if missing)."""
    specs: list[MethodSpec] = []
    for raw in (s.strip() for s in text.split(",")):
        if not raw:
            continue
        name, *parts = [p.strip() for p in raw.split(":")]
        items: list[tuple[str, str]] = []
        for p in parts:
            if "=" not in p:
                raise PacerError(f"method '{raw}': option '{p}' is not key=value")
            k, v = (s.strip() for s in p.split("=", 1))
            items.append((ALIASES.get(k, k).replace("-", "_"), v))
        variants: list[list[tuple[str, object]]] = [[]]
        for k, v in items:
            if ".." in v and all(s.strip().lstrip("-").isdigit() for s in v.split("..", 1)):
                lo, hi = (int(s) for s in v.split("..", 1))
                if hi < lo:
                    raise PacerError(f"method '{raw}': empty range {v}")
                values: list[object] = list(range(lo, hi + 1))
            else:
                values = [parse_value(v)]
            variants = [[*base, (k, x)] for base in variants for x in values]
        for opts in variants:
            _check(name, opts, raw)
            label = ":".join([name, *(f"{k}={v}" for k, v in opts)])
            spec = MethodSpec(name, tuple(opts), label)
            if spec.label in {s.label for s in specs}:
                raise PacerError(f"method '{label}' is listed twice in --methods")
            specs.append(spec)
    if not specs:
        raise PacerError("--methods is empty")
    ar = [s for s in specs if s.is_ar]
    return [ar[0] if ar else MethodSpec("ar", (), "ar"), *(s for s in specs if not s.is_ar)]
