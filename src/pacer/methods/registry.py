"""One registry of decoding methods: a :class:`Method` record says everything about a method, once.

The API (:meth:`pacer.Decoder.generate`), the command line (``--method`` and the option flags), ``pacer bench``
(``--methods name:key=val``) and the docs' method table all read this registry; nothing else lists methods.

A record holds: the policy factory and the drafter factory (each takes a :class:`Build`: the decoder, the
method's options, the draft bounds, ``γ``, whether the cost-aware rule is on, the draft vocabulary), the options
the method takes (:class:`Option`: type, default, whether it goes to the policy or the drafter, its command-line
flag), and what it needs (a draft model; greedy decoding only). What a *policy* needs from the loop at run time
(hidden layers, soft acceptance, the target's reference continuation) is declared on the policy object itself
(:class:`pacer.policies.DraftPolicy`), because a learned policy knows it only once its checkpoint is read.

Adding a method: one file under ``pacer/methods/`` that builds a :class:`Method` and calls :func:`register`, and
one line importing it in ``pacer/methods/__init__.py`` (or a :func:`register` call from your own code).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..bounds import MAX_KEY, MAX_PHRASE  # noqa: F401 - re-exported: the phrase options' bounds (pacer.bounds)
from ..errors import InvalidType, InvalidValue, PacerError
from ..pair import check_draft_vocab, parse_draft_vocab

if TYPE_CHECKING:
    import torch

    from ..decoding import Drafter
    from ..pair import Pair
    from ..policies.base import DraftPolicy


def parse_bool(text: str) -> bool:
    low = str(text).lower()
    if low in ("true", "1", "yes", "on"):
        return True
    if low in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"not true/false: {text!r}")


@dataclass(frozen=True)
class Option:
    """One option of a method. ``to``: ``"policy"`` or ``"drafter"`` (which factory reads it); ``type``: ``int``,
    ``float``, ``bool`` or ``str``; ``minimum`` / ``maximum``: the valid range of a number; ``flag``: the
    command-line flag (default ``--name-with-dashes``); ``explicit``: giving it asks for that literal rule (a
    threshold, a length), so the cost-aware rule stays off unless asked for; ``path``: its value names a file or
    folder on the machine that runs pacer (read or written there), which a server never takes from a request."""

    name: str
    type: type
    help: str
    to: str = "policy"
    minimum: float | None = None
    maximum: float | None = None
    flag: str = ""
    explicit: bool = False
    path: bool = False
    #: text -> value where ``type`` cannot say it (``type`` is then ``object``, and ``validate`` checks a value)
    parser: Callable[[str], Any] | None = None
    validate: Callable[[Any], Any] | None = None
    #: checks the file or folder a ``path`` option's value names, before anything loads (a one-line error)
    preflight: Callable[[Any], None] | None = None

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    def parse(self, text: str) -> Any:
        """A value from text (command line, ``pacer bench`` specs)."""
        if self.parser is not None:
            return self.parser(text)
        try:
            return parse_bool(text) if self.type is bool else self.type(text)
        except ValueError:
            raise PacerError(f"option {self.name} takes {self.type.__name__}, got {text!r}") from None

    def check(self, value: Any, method: str) -> Any:
        """``value`` validated (a number within range, the right type), or a one-line error."""
        if self.type is object:
            return self.validate(value) if self.validate is not None else value
        ok = isinstance(value, self.type) and not (self.type is not bool and isinstance(value, bool))
        if self.type is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            raise InvalidType(f"method '{method}': option {self.name} takes {self.type.__name__}, got {value!r}")
        if self.type is float and value != value:
            raise InvalidValue(f"method '{method}': option {self.name} must be a number, got nan")
        if self.minimum is not None and value < self.minimum:
            raise InvalidValue(f"method '{method}': option {self.name} must be >= {self.minimum:g}, got {value}")
        if self.maximum is not None and value > self.maximum:
            raise InvalidValue(f"method '{method}': option {self.name} must be <= {self.maximum:g} (the most pacer "
                               f"takes), got {value}")
        return value


@dataclass
class Build:
    """What a factory gets: the loaded ``pair`` (:class:`pacer.pair.Pair`); ``options`` (this method's,
    validated; absent ones are not in it); ``bounds`` (``min_draft``/``max_draft`` where given); ``gamma``
    (``None``: not given); ``cost_aware`` (the cost-aware rule will wrap the policy: a threshold not given must
    then be none); ``rows`` (the drafter's draft vocabulary, ``None``: full)."""

    pair: Pair
    options: dict = field(default_factory=dict)
    bounds: dict = field(default_factory=dict)
    gamma: int | None = None
    cost_aware: bool = False
    rows: torch.Tensor | None = None


@dataclass(frozen=True)
class Method:
    """A decoding method. ``policy`` / ``drafter``: factories (both ``None``: plain decoding, ``ar``);
    ``drafter=None`` with a policy means the default token-by-token drafter on the draft model.
    ``needs_draft``: it drafts with the draft model (``False``: e.g. prompt lookup drafts from the text).
    ``extras``: its drafter adds work to a round beyond the draft that costs price (phrases the draft checks,
    branches the target scores; :meth:`pacer.pricing.Pricer.branch_room`), so that a literal length rule is
    still given a pricer for them (:meth:`pacer.factory.MethodFactory.make_pricer`)."""

    name: str
    summary: str
    policy: Callable[[Build], DraftPolicy] | None = None
    drafter: Callable[[Build], Drafter] | None = None
    options: tuple[Option, ...] = ()
    greedy_only: bool = False
    needs_draft: bool = True
    extras: bool = False

    @property
    def drafts(self) -> bool:
        """Drafts (every method but plain decoding); whether with the draft model: :attr:`needs_draft`."""
        return self.policy is not None

    @property
    def loads_draft(self) -> bool:
        """Needs the draft model loaded."""
        return self.drafts and self.needs_draft

    def option(self, name: str) -> Option | None:
        return next((o for o in self.options if o.name == name), None)

    def split(self, options: Mapping[str, Any]) -> tuple[dict, dict]:
        """``options`` checked against this method's (and ``draft_vocab``, every drafting method's), split into
        (policy options, drafter options)."""
        policy, drafter = {}, {}
        for k, v in options.items():
            o = DRAFT_VOCAB if k == DRAFT_VOCAB.name and self.loads_draft else self.option(k)
            if o is None:
                own = ", ".join(o.name for o in self.options) or "none"
                common = ", ".join(o.name for o in (*COMMON, DRAFT_VOCAB))
                raise InvalidValue(f"method '{self.name}' takes no option '{k}' (its own options: {own}"
                                 + (f"; every drafting method takes {common})" if self.drafts else ")"))
            (policy if o.to == "policy" else drafter)[k] = o.check(v, self.name)
        return policy, drafter

    def explicit(self, options: Mapping[str, Any]) -> bool:
        """Does ``options`` pin a literal rule (so the cost-aware rule is off by default)?"""
        return any(o.explicit for k in options if (o := self.option(k)) is not None)


#: the most draft tokens of one round any setting may ask for (the measured best lengths are 4-16; a round of more
#: costs that many draft forwards and one verification of them all)
MAX_DRAFT = 256

#: the draft-length bounds and switches every drafting method takes (``Decoder.generate`` arguments)
COMMON = (
    Option("gamma", int, "draft length of the fixed rules (sd, ouroboros; with the cost-aware rule their cap; "
           "default 4); the initial length of heuristic", minimum=1, maximum=MAX_DRAFT, explicit=True),
    Option("min_draft", int, "lower bound on draft tokens per round", minimum=0, maximum=MAX_DRAFT),
    Option("max_draft", int, "upper bound on draft tokens per round", minimum=1, maximum=MAX_DRAFT),
    Option("cost_aware", bool, "draft a token only where it pays on this machine's measured costs (default: on "
           "unless gamma or a threshold is given)"),
)
#: the draft vocabulary, every drafting method (``Decoder.generate(options={"draft_vocab": ...})``): ``auto``, a
#: number of most frequent tokens (0: the full vocabulary) or explicit ids; see :mod:`pacer.draftvocab`
DRAFT_VOCAB = Option("draft_vocab", object, "draft from the S most frequent tokens and the prompt's (0: the full "
                     "vocabulary; auto: the decoder's default)", to="drafter", parser=parse_draft_vocab,
                     validate=check_draft_vocab)

#: flags of the settings every generation has (a method option may not take one of them)
RESERVED_FLAGS = ("--method", "--max-new-tokens", "--temperature", "--top-k", "--top-p", "--seed", "--stop", "--chat",
                  "--json", "--target", "--draft", "--dtype", "--threads", "--draft-quant", "--quantize",
                  "--draft-vocab", "--cost-aware", "--plot", "--help")

#: option names that name a file or folder (such an option must be declared ``path=True``)
PATH_LIKE = re.compile(r"path|file|dir|folder", re.IGNORECASE)

_REGISTRY: dict[str, Method] = {}


def register(method: Method, replace: bool = False) -> Method:
    """Add ``method`` (``replace``: over one of the same name)."""
    if not method.name or any(c in method.name for c in ",:= "):
        raise PacerError(f"a method name must be non-empty without ',', ':', '=' or spaces: {method.name!r}")
    if method.name in _REGISTRY and not replace:
        raise PacerError(f"method '{method.name}' is already registered")
    names = {o.name for o in (*COMMON, DRAFT_VOCAB)}
    flags = {*RESERVED_FLAGS, *(o.cli_flag for o in COMMON)}
    for o in method.options:
        if o.name in names or o.cli_flag in flags or o.to not in ("policy", "drafter"):
            raise PacerError(f"method '{method.name}': option {o.name!r} clashes with a common option or setting "
                             f"({o.cli_flag}) or has no valid target")
        if PATH_LIKE.search(o.name) and not o.path:
            raise PacerError(f"method '{method.name}': option {o.name!r} looks like a file or folder: declare it "
                             f"Option(..., path=True), so that a server never takes it from a request")
        if o.to == "drafter" and method.drafter is None:
            raise PacerError(f"method '{method.name}': drafter option {o.name!r} needs a drafter factory")
        other = next((x for m in _REGISTRY.values() for x in m.options if x.name == o.name), None)
        if other is not None and (other.type, other.cli_flag) != (o.type, o.cli_flag):
            raise PacerError(f"method '{method.name}': option {o.name!r} differs from another method's option of "
                             f"that name (type or flag)")
    _REGISTRY[method.name] = method
    return method


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def get(name: str) -> Method:
    """The method called ``name``, or a one-line error listing the known ones."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise InvalidValue(f"unknown method '{name}'; choose one of {', '.join(_REGISTRY)}") from None


def names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def all_options() -> list[Option]:
    """Every method option once (the command line has one flag per option name)."""
    seen: dict[str, Option] = {}
    for m in _REGISTRY.values():
        for o in m.options:
            seen.setdefault(o.name, o)
    return list(seen.values())


def path_options() -> tuple[str, ...]:
    """The names of every registered option whose value is a file or folder (:attr:`Option.path`)."""
    return tuple(o.name for o in all_options() if o.path)


#: when to use each method, for the README's table (from the committed reports and cost curves, docs/results.md)
WHEN = {
    "ar": "the baseline; what every other method falls back to where no draft pays (llama.cpp on few CPU cores)",
    "sd": "a fixed-length baseline; with a cheap draft on a flat curve (GPU, PyTorch bf16 on AVX-512 BF16 / AMX)",
    "heuristic": "comparing with Hugging Face's assisted generation",
    "confidence": "any pair, no training: llama.cpp's rule, to compare with it",
    "entropy": "any pair, no training",
    "cumprob": "any pair, no training: the best training-free rule, within a few percent of the trained layer",
    "oracle": "measurement only: the ceiling of any length rule (greedy)",
    "specdecpp": "research comparison (a trained per-token head)",
    "pacer": "a pair with a trained layer (the default pair ships one), on a flat curve",
    "ouroboros": "grounded text (summaries, answers over given passages, code edits) without a trained layer",
    "pacer+ouroboros": "the default pair on a flat curve, chat and code; most on grounded text",
    "lookup": "no draft model, or one too dear for the machine: rewriting or editing text or code the prompt holds",
}


def table() -> str:
    """The Markdown table of methods, their options and when to use each (the README's, checked by a test)."""
    rows = ["| method | what it is | options | when to use |", "|---|---|---|---|"]
    for m in _REGISTRY.values():
        opts = ", ".join(f"`{o.name}`" for o in m.options) or "-"
        rows.append(f"| `{m.name}` | {m.summary} | {opts} | {WHEN.get(m.name, '-')} |")
    return "\n".join(rows)
