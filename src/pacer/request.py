"""One request shape for a decoding method: :class:`MethodRequest`, checked once, in its constructor; and one for a
generation with it: :class:`GenerationRequest` (the token budget and the sampling settings besides).

The command line (:func:`pacer.args.method_request`), the server (:mod:`pacer.serve.protocol`), the benchmark
(:class:`pacer.bench.methods.MethodSpec`) and the API (:meth:`pacer.Decoder.generate`) build one; the method
factories (:class:`pacer.methods.Build`) read it. Terms:

- ``method``: a registered method's name (:mod:`pacer.methods`); ``record`` is its :class:`~pacer.methods.Method`.
- ``gamma``: the fixed rules' draft length (their cap under the cost-aware rule); ``min_draft`` / ``max_draft``:
  bounds on the draft tokens of a round; ``None``: not given (the method's default).
- ``cost_aware``: wrap the policy in the cost-aware rule (:mod:`pacer.costs`); ``None``: on unless ``gamma`` or an
  option that pins a literal rule (a threshold) is given (:attr:`aware`).
- ``options``: the method's own options and ``draft_vocab``, split into ``policy_options`` and
  ``drafter_options`` by the record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from . import methods
from .errors import InvalidType, InvalidValue
from .methods import DEFAULT_METHOD

if TYPE_CHECKING:
    from .sampling import SamplingConfig

#: the settings every drafting method takes besides its options (``Decoder.generate`` keywords)
SETTINGS = ("gamma", "min_draft", "max_draft", "cost_aware")


@dataclass(frozen=True)
class MethodRequest:
    """A decoding method with its settings, resolved against the registry and validated (a one-line
    :class:`~pacer.errors.PacerError` otherwise); see the module docstring for the terms."""

    method: str = DEFAULT_METHOD
    gamma: int | None = None
    min_draft: int | None = None
    max_draft: int | None = None
    cost_aware: bool | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    record: methods.Method = field(init=False, repr=False, compare=False)
    policy_options: dict = field(init=False, repr=False, compare=False)
    drafter_options: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.method, str):
            raise InvalidType(f"method must be a method's name, got {self.method!r}")
        record = methods.get(self.method)
        for o in methods.COMMON:
            if (v := getattr(self, o.name)) is not None:
                o.check(v, self.method)
        if self.min_draft is not None and self.max_draft is not None and self.min_draft > self.max_draft:
            raise InvalidValue(f"min_draft ({self.min_draft}) must not exceed max_draft ({self.max_draft})")
        if not isinstance(self.options, Mapping):
            raise InvalidType(f"options must be a mapping of option names to values, got {self.options!r}")
        policy, drafter = record.split(self.options)
        object.__setattr__(self, "options", {**policy, **drafter})
        object.__setattr__(self, "record", record)
        object.__setattr__(self, "policy_options", policy)
        object.__setattr__(self, "drafter_options", drafter)

    @classmethod
    def of(cls, method: str | MethodRequest = DEFAULT_METHOD, **settings: Any) -> MethodRequest:
        """A request from a method's name and keyword settings: ``gamma``, ``min_draft``, ``max_draft``,
        ``cost_aware``, ``options`` (a mapping) and any other keyword as an option; ``None`` values are not
        given. A :class:`MethodRequest` is returned as it is (then nothing else may be given)."""
        given = {k: v for k, v in settings.items() if v is not None}
        if isinstance(method, MethodRequest):
            if given:
                raise InvalidValue(f"a MethodRequest is complete: pass {', '.join(given)} in it, not beside it")
            return method
        options = given.pop("options", None) or {}
        if not isinstance(options, Mapping):
            raise InvalidType(f"options must be a mapping of option names to values, got {options!r}")
        options = dict(options)
        options.update({k: given.pop(k) for k in list(given) if k not in SETTINGS})
        return cls(method, options=options, **given)

    @property
    def name(self) -> str:
        return self.method

    @property
    def drafts(self) -> bool:
        return self.record.drafts

    @property
    def loads_draft(self) -> bool:
        """It drafts with the draft model (which must then be loaded)."""
        return self.record.loads_draft

    @property
    def aware(self) -> bool:
        """Whether the cost-aware rule wraps the policy (``cost_aware``, or by default unless a literal rule is
        pinned by ``gamma`` or an explicit option)."""
        if self.cost_aware is not None:
            return self.cost_aware
        return not (self.gamma is not None or self.record.explicit(self.policy_options))

    @property
    def bounds(self) -> dict:
        """The draft bounds given (``min_draft`` defaults to 0 under the cost-aware rule: a round where nothing
        pays is a plain decoding step)."""
        lo = 0 if self.min_draft is None and self.aware else self.min_draft
        return {k: v for k, v in (("min_draft", lo), ("max_draft", self.max_draft)) if v is not None}

    def check_sampling(self, sampling: SamplingConfig | None) -> None:
        if self.record.greedy_only and sampling is not None and not sampling.greedy:
            raise InvalidValue(f"the {self.method} method is defined for greedy decoding only (temperature 0)")

    def check_files(self) -> None:
        """The files and folders its options name (:attr:`~pacer.methods.Option.path`), checked before anything
        loads by each option's ``preflight`` (a pool file that can be written, a checkpoint folder that is one)."""
        for name, value in self.options.items():
            o = self.record.option(name)
            if o is not None and o.preflight is not None:
                o.preflight(value)

    def to_dict(self) -> dict:
        """The given settings (``None`` ones left out) and options, as JSON-able values."""
        out: dict = {"method": self.method}
        out.update({f.name: v for f in fields(self) if f.name in SETTINGS and (v := getattr(self, f.name)) is not None})
        if self.options:
            out["options"] = dict(self.options)
        return out


def verify_problem(temperature: float, verify: str | None) -> str | None:
    """Why the verification rule ``verify`` cannot go with ``temperature`` (``None``: it can). The one rule every
    entry point applies (:class:`GenerationRequest`, hence ``Decoder.generate``, ``pacer generate`` and a served
    request; ``pacer bench`` for ``--verify`` and each spec's ``verify=``): greedy decoding verifies by exact matching,
    so block verification at temperature 0 is refused rather than ignored; ``token`` is greedy's own default."""
    if verify == "block" and temperature == 0:
        return ("verify (block) needs sampling: greedy decoding (temperature 0) verifies by exact matching under "
                "either rule; pass a temperature > 0, or leave verify out")
    return None


@dataclass(frozen=True)
class GenerationRequest:
    """One generation's request: a :class:`MethodRequest` with the token budget and the sampling settings, checked
    together once, in the constructor (a one-line :class:`~pacer.errors.InvalidType` or
    :class:`~pacer.errors.InvalidValue` otherwise). The command line
    (:func:`pacer.args.check_args`) and the server (:mod:`pacer.serve.protocol`) build one before any model loads
    or any request is queued; :meth:`pacer.Decoder.generate` takes it as it is, or builds one from a method and
    its keywords. ``sampling``: ``None`` is greedy."""

    request: MethodRequest
    max_new_tokens: int = 128
    sampling: SamplingConfig | None = None

    @classmethod
    def of(cls, method: str | MethodRequest | GenerationRequest = DEFAULT_METHOD, max_new_tokens: int | None = None,
           sampling: SamplingConfig | None = None, **settings: Any) -> GenerationRequest:
        """A request from a method (a :class:`MethodRequest`, or a name with keyword settings:
        :meth:`MethodRequest.of`), a budget (``None``: 128) and sampling. A :class:`GenerationRequest` is returned
        as it is (then nothing else may be given)."""
        if isinstance(method, GenerationRequest):
            given = {"max_new_tokens": max_new_tokens, "sampling": sampling, **settings}
            if named := [k for k, v in given.items() if v is not None]:
                raise InvalidValue(f"a GenerationRequest is complete: pass {', '.join(named)} in it, not beside it")
            return method
        return cls(MethodRequest.of(method, **settings), 128 if max_new_tokens is None else max_new_tokens, sampling)

    def __post_init__(self) -> None:
        from .sampling import SamplingConfig

        n = self.max_new_tokens
        if isinstance(n, bool) or not isinstance(n, int):
            raise InvalidType(f"max_new_tokens must be an integer >= 1, got {n!r}")
        if n <= 0:
            raise InvalidValue(f"max_new_tokens must be >= 1, got {n}")
        from .bounds import MAX_NEW_TOKENS

        if n > MAX_NEW_TOKENS:  # the command line's bound (pacer.bounds), for every entry point
            raise InvalidValue(f"max_new_tokens must be <= {MAX_NEW_TOKENS} (the most pacer takes), got {n}")
        if self.sampling is not None and not isinstance(self.sampling, SamplingConfig):
            raise InvalidType(f"sampling must be a pacer.SamplingConfig, got {self.sampling!r}")
        if self.sampling is not None and (why := verify_problem(self.sampling.temperature, self.sampling.verify)):
            raise InvalidValue(why)
        self.request.check_sampling(self.sampling)
