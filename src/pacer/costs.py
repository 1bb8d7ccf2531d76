"""What a round costs on this machine: the :class:`Costs` record and its arithmetic. The rule that decides from them
whether one more draft token pays is :mod:`pacer.policies.cost_aware`.

Terms (seconds, measured where pacer runs by :mod:`pacer.calibration`, refined by the loop's own timings):

* ``c_d``     - one draft token (a draft forward over one new token, with the drafter's vocabulary);
* ``c_t(k)``  - one target forward scoring ``k`` new tokens (a round that drafted ``γ`` scores ``k = γ + 1``);
* ``c_p``     - one draft-length policy check (the pre-verification layer; ~0 for the training-free rules).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from .errors import InvalidType, InvalidValue, PacerError


@dataclass
class Costs:
    """Measured seconds: ``draft`` per drafted token (``c_d``), ``target[k]`` per target forward scoring ``k``
    tokens (``c_t(k)``, interpolated between measured ``k``), ``policy_per_check`` (``c_p``), ``draft_prefill`` per
    token the draft reads in one batch before it drafts (``c_pre``: its catch-up, see
    :class:`pacer.policies.cost_aware.CostAwarePolicy`)."""

    draft: float
    target: dict[int, float]
    policy_per_check: float = 0.0
    draft_prefill: float = 0.0
    #: ``c_tree(k)``: a target forward over ``k`` tokens with a tree mask (candidate branches), where measured;
    #: empty: priced as a chain
    tree: dict[int, float] = field(default_factory=dict)
    #: ``c_d(k)``: a draft forward over ``k`` new tokens (a phrase check), where measured; empty: ``c_d`` at any ``k``
    draft_curve: dict[int, float] = field(default_factory=dict)

    def draft_cost(self, k: int) -> float:
        """``c_d(k)``: a draft forward over ``k`` new tokens (``c_d`` where the curve was not measured)."""
        return interpolate(self.draft_curve, k) if self.draft_curve else self.draft

    def target_cost(self, k: int) -> float:
        """``c_t(k)``: linear between measured points, proportional to ``k`` beyond the last one."""
        return interpolate(self.target, k)

    def tree_cost(self, k: int) -> float:
        """``c_tree(k)``: a tree forward over ``k`` tokens (never below the chain's ``c_t(k)``)."""
        return max(interpolate(self.tree, k), self.target_cost(k)) if self.tree else self.target_cost(k)

    def monotone(self) -> Costs:
        """The same costs with ``c_t`` made non-decreasing in ``k`` by isotonic regression (pool adjacent
        violators): a noisy ``c_t(2) < c_t(1)`` would otherwise make a second scored token look like it saves
        time, and one slow point would raise every longer forward."""
        blocks: list[list[float]] = []  # [sum, count] of pooled neighbours
        for k in sorted(self.target):
            blocks.append([self.target[k], 1.0])
            while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
                total, count = blocks.pop()
                blocks[-1][0] += total
                blocks[-1][1] += count
        values = [b[0] / b[1] for b in blocks for _ in range(int(b[1]))]
        return Costs(self.draft, dict(zip(sorted(self.target), values, strict=True)), self.policy_per_check,
                     self.draft_prefill, dict(self.tree), dict(self.draft_curve))

    def scaled(self, draft: float, target: float) -> Costs:
        return Costs(self.draft * draft, {k: v * target for k, v in self.target.items()}, self.policy_per_check,
                     self.draft_prefill * draft, {k: v * target for k, v in self.tree.items()},
                     {k: v * draft for k, v in self.draft_curve.items()})

    def shapes(self, max_k: int) -> dict[str, Costs]:
        """Three curves of the same ``c_t(1)`` up to ``k = max_k + 1``, for a training validation: ``flat``
        (verification free), ``linear`` (``c_t(k) = k c_t(1)``) and ``gpu`` (1 % per extra token, a draft token 0.3 of
        a forward), each with these chain costs' draft and policy check."""
        c1, ks = self.target_cost(1), range(1, max_k + 2)
        return {"flat": Costs(self.draft, dict.fromkeys(ks, c1), self.policy_per_check),
                "linear": Costs(self.draft, {k: k * c1 for k in ks}, self.policy_per_check),
                "gpu": Costs(0.3 * c1, {k: c1 * (1 + 0.01 * (k - 1)) for k in ks}, self.policy_per_check * 0.3)}

    def chain(self, policy_per_check: float | None = None) -> Costs:
        """The chain costs alone (``c_d``, ``c_t``, ``c_p``: a training validation's), with ``policy_per_check`` in
        place of this ``c_p`` where given."""
        return Costs(self.draft, self.target, self.policy_per_check if policy_per_check is None else policy_per_check)

    def to_dict(self) -> dict:
        d = {"draft": self.draft, "target": {str(k): v for k, v in sorted(self.target.items())},
             "policy_per_check": self.policy_per_check, "draft_prefill": self.draft_prefill}
        if self.tree:
            d["tree"] = {str(k): v for k, v in sorted(self.tree.items())}
        if self.draft_curve:
            d["draft_curve"] = {str(k): v for k, v in sorted(self.draft_curve.items())}
        return d

    @classmethod
    def from_dict(cls, d: Any, free_draft: bool = False) -> Costs:
        """The checked reader of costs as :meth:`to_dict` writes them (a calibration, a checkpoint's, ``pacer tune
        --measure-costs``, the vLLM proposer's plain costs): every field a JSON number of seconds, finite, ``c_t``,
        ``c_tree`` and ``c_d`` curves non-empty where given and positive, keyed by ``k >= 1``; ``draft`` positive
        (``free_draft``: may be absent or 0, looked-up tokens), the prefill and policy check non-negative. Raises
        :class:`BadField` naming the field."""
        if not isinstance(d, dict):
            raise BadField(f"the costs are {show_value(d)}, not an object with 'target' {{k: seconds}}")
        if unknown := sorted(set(d) - set(COST_FIELDS)):
            raise BadField(f"unknown field(s) {', '.join(map(repr, unknown))} (known: {', '.join(COST_FIELDS)})")
        if "target" not in d:
            raise BadField("no 'target' {k: seconds}")
        draft = read_seconds(d.get("draft", 0.0) if free_draft else _required(d, "draft"), "'draft'", free_draft)
        return cls(draft, read_curve(d["target"], "'target'"),
                   read_seconds(d.get("policy_per_check", 0.0), "'policy_per_check'", zero=True),
                   read_seconds(d.get("draft_prefill", 0.0), "'draft_prefill'", zero=True),
                   read_curve(d.get("tree") or {}, "'tree'", empty=True),
                   read_curve(d.get("draft_curve") or {}, "'draft_curve'", empty=True))

    def problems(self, free_draft: bool = False) -> list[str]:
        """What makes these costs unusable (empty: none): every value finite, ``c_t`` and ``c_d`` positive
        (``free_draft``: ``c_d`` may be 0, a pair without a draft model: looked-up tokens cost nothing), prefill
        costs non-negative."""
        bad = []
        for name, curve in (("target", self.target), ("tree", self.tree), ("draft", self.draft_curve)):
            for k, v in curve.items():
                if not (isinstance(k, int) and k >= 1 and math.isfinite(v) and v > 0):
                    bad.append(f"{name} cost at k={k} is {v}")
        if not self.target:
            bad.append("no target costs")
        if not (math.isfinite(self.draft) and (self.draft > 0 or (free_draft and self.draft == 0))):
            bad.append(f"draft cost is {self.draft}")
        for name, v in (("draft prefill", self.draft_prefill), ("policy check", self.policy_per_check)):
            if not (math.isfinite(v) and v >= 0):
                bad.append(f"{name} cost is {v}")
        return bad

    def curve(self, ks: tuple[int, ...] = (1, 2, 4, 8, 16)) -> str:
        """One line: ``c_t(k)`` in ms for a few ``k`` and ``c_d``."""
        return ("target " + " ".join(f"k={k}:{self.target_cost(k) * 1e3:.0f}" for k in ks)
                + f" ms per forward; draft {self.draft * 1e3:.0f} ms per token")

    def slow_one_row_note(self) -> str:
        """A note where plain decoding runs a slower kernel than a two-token forward (``c_t(2) < c_t(1)``), else
        ``""``."""
        c1, c2 = self.target_cost(1), self.target_cost(2)
        if c2 >= c1:
            return ""
        return (f"plain decoding runs a slower kernel than a two-token forward here (c_t(1) {c1 * 1e3:.0f} ms > "
                f"c_t(2) {c2 * 1e3:.0f} ms): speedups over plain decoding include that")

    def verification_growth(self, k: int = 8) -> float:
        """``c_t(k) / c_t(1)``: ~1 where verifying a block is nearly free, ~``k`` where it costs ``k`` forwards."""
        return self.target_cost(k) / self.target_cost(1)


def check_given(costs: object, free_draft: bool = False, what: str = "costs") -> ContextCosts:
    """Costs given in code (``Decoder(costs=...)``) checked as a profile's are, as the one shape rounds are priced
    with: a :class:`Costs` (or a :class:`ContextCosts`, checked at context 0) whose fields are numbers and curves
    ``{int k: seconds}``, and whose values :meth:`Costs.problems` finds usable (``free_draft``: a pair without a
    draft model, ``c_d`` may be 0). Raises :class:`~pacer.errors.InvalidType` or :class:`~pacer.errors.InvalidValue`,
    one line naming the field."""
    curve = costs if isinstance(costs, ContextCosts) else None
    if curve is not None:
        costs, what = curve.measure(0), f"{what} at context 0"
    if not isinstance(costs, Costs):
        raise InvalidType(f"{what} must be a pacer.costs.Costs (or a pacer.costs.ContextCosts: costs by context), "
                          f"got {type(costs).__name__}")
    for name in ("draft", "policy_per_check", "draft_prefill"):
        v = getattr(costs, name)
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise InvalidType(f"{what}: {name.replace('_', ' ')} cost is {v!r}, not a number of seconds")
    for name, field_ in (("target", "target"), ("tree", "tree"), ("draft", "draft_curve")):
        d = getattr(costs, field_)
        if not isinstance(d, dict):
            raise InvalidType(f"{what}: {field_} is {type(d).__name__}, not a dict {{k: seconds}}")
        for k, v in d.items():
            if isinstance(k, bool) or not isinstance(k, int):
                raise InvalidType(f"{what}: {name} cost k {show_key(k)} is a {type(k).__name__}, not an int")
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise InvalidType(f"{what}: {name} cost at k={k} is {v!r}, not a number of seconds")
    if bad := costs.problems(free_draft):
        raise InvalidValue(f"{what} hold unusable values ({bad[0]})")
    return curve if curve is not None else ContextCosts.fixed(costs)


#: the fields of :meth:`Costs.to_dict`
COST_FIELDS = ("draft", "target", "policy_per_check", "draft_prefill", "tree", "draft_curve")


class BadField(PacerError, ValueError):
    """A field of a costs file (a profile, a calibration, a checkpoint's costs) that cannot be used; the message
    names the field and what it holds, the reader adds the file and what to do."""


def show_value(v: Any) -> str:
    """``v`` as a message shows it: JSON, NaN and infinities by name, cut at 40 characters."""
    text = json.dumps(v, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def show_key(k: Any) -> str:
    """An object's key as a message shows it: its ``repr``, cut at 40 characters."""
    text = repr(k)
    return text if len(text) <= 40 else text[:37] + "..."


def _required(d: dict, key: str) -> Any:
    if key not in d:
        raise BadField(f"no {key!r}")
    return d[key]


#: the most seconds a cost read from a file may hold: no forward takes hours (the slowest measured, a 16-token bf16
#: forward on an AVX2-only CPU, about 5 s), and a larger figure (1e308, say) would price a long forward at infinity
MAX_SECONDS = 1e4


def read_seconds(v: Any, name: str, zero: bool = False) -> float:
    """A cost read from a file: a JSON number (not a string, not a boolean), ``> 0`` (``>= 0`` with ``zero``) and at
    most :data:`MAX_SECONDS`."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0 or (v == 0 and not zero) \
            or v > MAX_SECONDS:
        want = f"a number of seconds {'>=' if zero else '>'} 0 and <= {MAX_SECONDS:g}"
        raise BadField(f"{name} is {show_value(v)} (want {want})")
    return float(v)


def read_count(v: Any, name: str, least: int, key: bool = False) -> int:
    """A count read from a file: a JSON integer (``key``: an object key, a string holding one), ``>= least``."""
    # ASCII digits only ('²'.isdigit() is true, int('²') fails), and few enough for int() (4300 at most)
    n = int(v) if key and isinstance(v, str) and re.fullmatch(r"\s*-?[0-9]{1,18}\s*", v) else v
    if isinstance(n, bool) or not isinstance(n, int) or n < least:
        raise BadField(f"{name} is {show_value(v)} (want an integer >= {least})")
    return n


def read_curve(d: Any, name: str, empty: bool = False) -> dict[int, float]:
    """A cost curve ``{k: seconds}`` read from a file: an object, keyed by ``k >= 1``, costs ``> 0``; not empty
    (unless ``empty``: an optional curve not measured)."""
    if not isinstance(d, dict):
        raise BadField(f"{name} is {show_value(d)} (want an object {{k: seconds}})")
    if not d and not empty:
        raise BadField(f"{name} is empty (want {{k: seconds}} with at least one k)")
    return {read_count(k, f"{name} k {show_key(k)}", 1, key=True): read_seconds(v, f"{name}[{show_key(k)}]")
            for k, v in d.items()}


#: how much dearer a prefill may be per token than a token of the curve's longest forward (:func:`prefill_doubt`)
PREFILL_SLACK = 1.25


def prefill_doubt(n: int, per_token: float, curve: dict[int, float]) -> str | None:
    """Why a target prefill of ``n`` tokens at ``per_token`` seconds a token cannot be right on a machine whose
    curve after ``n`` cached tokens is ``curve`` (``None``: it can). A prefill reads every weight once for all
    ``n`` tokens, as a forward of ``k`` tokens does for its ``k``, and attends to at most ``n`` tokens where that
    forward attends to ``n + k``: per token it costs no more than ``c_t(k_max) / k_max``. A point above
    :data:`PREFILL_SLACK` times that timed something else, most likely a model's first (cold) forward: the
    shipped profiles' points are 0.14-0.68 of that bound (the Intel Xeon's and the Zen 5's, measured warm by
    ``--export``, and the Zen 4's longer prompts), the Zen 4 sweep's 32-token prompts 1.54 (llama.cpp) and 1.57
    (PyTorch), the Zen 4's calibration (a cold first forward) 3.3."""
    kmax = max(curve)
    bound = curve[kmax] / kmax
    if per_token <= PREFILL_SLACK * bound:
        return None
    return (f"a {n}-token prefill at {per_token * 1e3:.1f} ms a token is {per_token / bound:.2f}x a token of the "
            f"{kmax}-token forward after {n} cached ({bound * 1e3:.1f} ms): contradicted by the curve (likely a "
            f"cold first forward)")


class ContextCosts:
    """Costs that depend on the context a forward runs at: :meth:`costs` gives the :class:`Costs` of forwards after
    ``context`` cached tokens (a profile or a calibration measured at several contexts prices each forward there: on
    llama.cpp with 2 cores a 2-token forward costs 1.3 one-token forwards after 32 tokens and 1.8 after
    500-1,000). ``measure`` makes them (e.g. :meth:`pacer.profiles.Profile.costs`); they are kept per ``step``
    tokens of context (at the nearest step, or the next one up with ``up``), made non-decreasing in ``k``
    (:meth:`Costs.monotone`), with the policy check ``policy_per_check``. The one shape of costs every source
    becomes: a calibration, a profile, costs given in code and the vLLM proposer's."""

    #: contexts are priced in steps of this many tokens (a forward's cost moves little within one)
    STEP = 64

    def __init__(self, measure: Callable[[int], Costs], policy_per_check: float = 0.0, step: int = STEP,
                 up: bool = False) -> None:
        self.measure, self.policy_per_check, self.step, self.up = measure, policy_per_check, step, up
        self._made: dict[int, Costs] = {}

    @classmethod
    def fixed(cls, costs: Costs) -> ContextCosts:
        """The same costs at every context (costs given as one :class:`Costs`)."""
        return cls(lambda _: costs, costs.policy_per_check)

    def with_check(self, seconds: float) -> ContextCosts:
        """The same costs with a policy check of ``seconds``."""
        return ContextCosts(self.measure, seconds, self.step, self.up)

    def costs(self, context: int) -> Costs:
        """The costs of forwards after ``context`` cached tokens (made once per step)."""
        if self.up:
            step = -(-max(1, context) // self.step) * self.step
        else:
            step = (max(0, context) + self.step // 2) // self.step * self.step  # the nearest step
        if step not in self._made:
            self._made[step] = replace(self.measure(step), policy_per_check=self.policy_per_check).monotone()
        return self._made[step]


def between(measured: dict[int, Costs], context: int) -> Costs:
    """Costs measured at several contexts (cached tokens -> :class:`Costs`), at ``context``: every curve (at the
    ``k`` either measured) and every per-token cost linear between the two nearest contexts, clamped to the first
    and the last (a curve measured at one of them only is taken as it is)."""
    cs = sorted(measured)
    if context <= cs[0]:
        return measured[cs[0]]
    if context >= cs[-1]:
        return measured[cs[-1]]
    lo = max(c for c in cs if c <= context)
    hi = min(c for c in cs if c >= context)
    if lo == hi:
        return measured[lo]
    a, b, w = measured[lo], measured[hi], (context - lo) / (hi - lo)

    def mix(x: float, y: float) -> float:
        return x + w * (y - x)

    def curve(p: dict[int, float], q: dict[int, float]) -> dict[int, float]:
        if not p or not q:
            return dict(p or q)
        return {k: mix(interpolate(p, k), interpolate(q, k)) for k in sorted(set(p) | set(q))}

    return Costs(mix(a.draft, b.draft), curve(a.target, b.target), mix(a.policy_per_check, b.policy_per_check),
                 mix(a.draft_prefill, b.draft_prefill), curve(a.tree, b.tree), curve(a.draft_curve, b.draft_curve))


def interpolate(curve: dict[int, float], k: int, clamp: bool = False) -> float:
    """A cost curve at ``k``: linear between measured points, the first point below it, and beyond the last one
    proportional to ``k`` (a forward's cost) or, with ``clamp``, the last point (a cost per token)."""
    ks = sorted(curve)
    if k <= ks[0]:
        return curve[ks[0]]
    for a, b in zip(ks, ks[1:], strict=False):
        if a <= k <= b:
            return curve[a] + (curve[b] - curve[a]) * (k - a) / (b - a)
    return curve[ks[-1]] if clamp else curve[ks[-1]] * k / ks[-1]
