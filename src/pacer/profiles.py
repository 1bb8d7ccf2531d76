"""Cost profiles and the profile clock: any machine's measured costs, applied to a real run on this one.

Whether drafting pays is decided by the machine's cost curve (:mod:`pacer.costs`), and machines differ completely
(a flat bf16 curve on an AVX-512 BF16 CPU or a GPU, a steep one on AVX2 or on llama.cpp's quantized kernels). A
**profile** (``pacer-profile/1``, a JSON file; ``pacer calibrate --export FILE`` writes this machine's) holds what
one machine measured for one pair on one backend:

* ``target_cost[context][k]`` - ``c_t(k)``: one target forward scoring ``k`` new tokens after ``context`` cached
  (``k`` rows of logits kept, as verification keeps them), at several contexts (attention grows with the context);
* ``tree_cost[context][k]`` - ``c_tree(k)``: the same with a tree mask (candidate branches), where measured;
* ``draft_cost[context][k]`` - a draft forward over ``k`` new tokens (``k = 1``: ``c_d``; more: a phrase check);
* ``target_prefill[n]`` / ``draft_prefill`` - seconds per prompt token of a prefill of ``n`` tokens, and per
  token the draft reads to catch up;
* the machine (CPU identity, ISA flags, device, threads), the backend and its runtime, the pair's fingerprints
  and dtypes, where and when it was measured.

The **profile clock** (:func:`clock`) prices every forward of a real run (:class:`pacer.decoding.meter.Call`:
role, ``k``, context, tree) with a profile's curve at the run's context, and adds the run's own overhead as
measured here: its wall time minus the forwards' *measured* seconds (Python, policy checks, pool work and tree
construction stay real). With this machine's own profile the clock must reproduce the wall time, which checks the
pricing itself (:func:`clock` with the machine's calibration is reported beside every run as ``own clock / wall``).

Pricing a call (:meth:`Profile.price`): within the measured ``k`` the curve is interpolated linearly in ``k`` and
in the context (clamped to the measured contexts); beyond the largest measured ``k`` each further token costs the
prefill per token at that context; a forward from an empty cache (the prompt) of more tokens than the curve holds
is a prefill: ``k`` times the prefill per token of an ``k``-token prompt. A draft forward from an empty cache
reads the prompt at ``draft_prefill`` a token.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .costs import (
    BadField,
    Costs,
    interpolate,
    prefill_doubt,
    read_count,
    read_curve,
    read_seconds,
    show_key,
    show_value,
)
from .decoding.meter import DRAFT, TARGET, Call
from .errors import PacerError

if TYPE_CHECKING:
    import torch

    from .pair import Pair

FORMAT = "pacer-profile/1"
#: contexts ``pacer calibrate --export`` measures at (tokens cached before the scored ones)
CONTEXTS = (32, 128, 512, 2048)
#: target ``k`` it measures (1 .. ``max_draft + 1`` sparsely, as :mod:`pacer.calibration` does)
TARGET_KS = (1, 2, 3, 4, 6, 8, 12, 17)
TREE_KS = (4, 8, 12, 17)
DRAFT_KS = (1, 2, 4, 8)
#: prompt lengths whose prefill per token ``--export`` measures
PREFILLS = (32, 128, 512, 2048)


Curves = dict[int, dict[int, float]]


def _curves(d: object, name: str, empty: bool = False) -> Curves:
    """``{context: {k: seconds}}`` read from a profile: every context a count >= 0 holding a non-empty curve (see
    :func:`pacer.costs.read_curve`); none at all only where ``empty`` (a curve not measured)."""
    if d is None and empty:
        return {}
    if not isinstance(d, dict) or (not d and not empty):
        what = "missing" if d is None else "empty" if d == {} else f"{type(d).__name__} {show_value(d)}"
        raise BadField(f"'{name}' is {what} (want an object {{context: {{k: seconds}}}})")
    return {read_count(c, f"'{name}' context {show_key(c)}", 0, key=True):
            read_curve(row, f"'{name}'[{show_key(c)}]") for c, row in d.items()}


def _text(d: dict, key: str, required: bool = True) -> str:
    v = d.get(key, None if required else "")
    if not isinstance(v, str) or (required and not v):
        raise BadField(f"{key!r} is {'missing' if v is None else show_value(v)} (want a "
                       f"{'non-empty ' if required else ''}string)")
    return v


def _object(d: dict, key: str, optional: bool = False) -> dict | None:
    v = d.get(key)
    if optional and (v is None or v == {}):
        return None
    if not isinstance(v, dict):
        raise BadField(f"{key!r} is {'missing' if v is None else show_value(v)} (want an object)")
    return v


def _at_context(curves: Curves, context: int) -> dict[int, float]:
    """The curve at ``context``: linear between the two nearest measured contexts (per ``k`` they share),
    clamped to the first and last."""
    cs = sorted(curves)
    if context <= cs[0]:
        return curves[cs[0]]
    if context >= cs[-1]:
        return curves[cs[-1]]
    lo = max(c for c in cs if c <= context)
    hi = min(c for c in cs if c >= context)
    if lo == hi:
        return curves[lo]
    w = (context - lo) / (hi - lo)
    ks = sorted(set(curves[lo]) & set(curves[hi])) or sorted(curves[lo])
    return {k: curves[lo][k] + w * (curves[hi].get(k, curves[lo][k]) - curves[lo][k]) for k in ks}


@dataclass
class Profile:
    """One machine's measured costs for one pair on one backend (see the module docstring)."""

    name: str
    machine: dict
    backend: str
    runtime: str
    target: dict
    draft: dict | None
    target_cost: Curves
    target_prefill: dict[int, float]
    draft_cost: Curves = field(default_factory=dict)
    draft_prefill: float = 0.0
    tree_cost: Curves = field(default_factory=dict)
    policy_check: dict[str, float] = field(default_factory=dict)
    measured: str = ""
    source: str = ""
    notes: list[str] = field(default_factory=list)

    # ----------------------------------------------------------------------------------------------- pricing
    def price(self, call: Call) -> float:
        """Seconds ``call`` takes on this profile's machine (see the module docstring)."""
        if call.role == TARGET:
            curves = self.tree_cost if call.tree and self.tree_cost else self.target_cost
            per_token = self.prefill_per_token(max(call.context, call.k))
        else:
            if not self.draft_cost:
                raise PacerError(f"profile {self.name} has no draft costs, but the run made draft forwards")
            curves = self.draft_cost
            per_token = self.draft_prefill or 0.0
            if call.context == 0 and per_token:
                return call.k * per_token
        curve = _at_context(curves, call.context)
        kmax = max(curve)
        if call.context == 0 and call.k > kmax and call.role == TARGET:
            return call.k * per_token
        if call.k <= kmax:
            return interpolate(curve, call.k)
        return curve[kmax] + (call.k - kmax) * (per_token or curve[kmax] / kmax)

    def prefill_per_token(self, n: int) -> float:
        """Seconds per token of an ``n``-token prefill (interpolated between the measured prompt lengths)."""
        if not self.target_prefill:
            curve = _at_context(self.target_cost, n)
            return curve[max(curve)] / max(curve)
        return interpolate(self.target_prefill, n, clamp=True)

    def costs(self, context: int = 32) -> Costs:
        """The cost-aware rule's :class:`~pacer.costs.Costs` at ``context``, priced exactly as the clock prices a
        forward there (:meth:`price`: the target's chain and tree curves, the draft's curve, each extended past
        its measured ``k`` by the prefill per token), so that the rule decides on what the clock will charge."""
        ks = sorted({*range(1, 18), 24, 32})
        target = {k: self.price(Call(TARGET, k, context, False, 0.0)) for k in ks}
        tree = {k: self.price(Call(TARGET, k, context, True, 0.0)) for k in ks} if self.tree_cost else {}
        draft = {k: self.price(Call(DRAFT, k, context, False, 0.0)) for k in (1, 2, 3, 4, 6, 8, 12, 16)} \
            if self.draft_cost else {1: 0.0}
        return Costs(draft[1], target, draft_prefill=self.draft_prefill, tree=tree,
                     draft_curve=draft if self.draft_cost else {})

    def c1(self, context: int = 32) -> float:
        return interpolate(_at_context(self.target_cost, context), 1)

    # ------------------------------------------------------------------------------------------------ checks
    def problems(self) -> list[str]:
        bad = []
        for name, curves in (("target", self.target_cost), ("tree", self.tree_cost), ("draft", self.draft_cost)):
            for c, row in curves.items():
                if not row:
                    bad.append(f"{name} cost at context {c} is empty")
                for k, v in row.items():
                    if not (k >= 1 and c >= 0 and math.isfinite(v) and v > 0):
                        bad.append(f"{name} cost at context {c}, k={k} is {v}")
        if not self.target_cost or not any(self.target_cost.values()):
            bad.append("no target costs")
        for n, v in self.target_prefill.items():
            if not (math.isfinite(v) and v > 0):
                bad.append(f"target prefill at {n} tokens is {v}")
        if not (math.isfinite(self.draft_prefill) and self.draft_prefill >= 0):
            bad.append(f"draft prefill is {self.draft_prefill}")
        return bad

    def check_pair(self, backend: str, target: dict, draft: dict | None) -> list[str]:
        """Refuse (:class:`PacerError`) a run of another backend, pair or target dtype: this profile's costs are
        that pair's. Returns notes on softer differences (the draft's dtype or vocabulary)."""
        where = f"the profile {self.name} was measured"
        if backend != self.backend:
            raise PacerError(f"{where} on the {self.backend} backend, this run is on {backend}; pass "
                             f"--backend {self.backend} or a profile of the {backend} backend")
        if target.get("fingerprint") != self.target.get("fingerprint"):
            raise PacerError(f"{where} for another target model (its costs are that model's); pass a profile of "
                             f"this pair (`pacer calibrate --export FILE` on the machine it stands for)")
        if draft is not None and self.draft is not None and draft.get("fingerprint") != self.draft.get("fingerprint"):
            raise PacerError(f"{where} for another draft model; pass a profile of this pair")
        if draft is not None and self.draft is None:
            raise PacerError(f"{where} without a draft model; pass a profile of this pair")
        if target.get("dtype") != self.target.get("dtype"):
            from . import backends

            flag = "--dtype " + str(self.target.get("dtype")) if backends.get(backend).dtypes else "another file"
            raise PacerError(f"{where} with the target in {self.target.get('dtype')}, this run loaded it as "
                             f"{target.get('dtype')}; pass {flag}")
        notes = []
        if draft is not None and self.draft is not None:
            for k in ("dtype", "rows"):
                if draft.get(k) != self.draft.get(k):
                    notes.append(f"the profile's draft ran with {k} {self.draft.get(k)}, this run's with "
                                 f"{draft.get(k)}: its draft forwards are priced at the profile's")
        return notes

    def describe(self) -> str:
        m = self.machine
        return f"{self.name} ({m.get('describe', '?')}, {self.backend} {self.target.get('dtype')}, " \
               f"{m.get('threads', '?')} threads, measured {self.measured or '?'})"

    def digest(self) -> str:
        """The SHA-256 of the profile's content (:meth:`to_dict`): what a report checks before it prices with it."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()

    # ------------------------------------------------------------------------------------------------- files
    def to_dict(self) -> dict:
        def curves(c: Curves) -> dict:
            return {str(ctx): {str(k): v for k, v in sorted(row.items())} for ctx, row in sorted(c.items())}

        return {"format": FORMAT, "name": self.name, "machine": self.machine, "backend": self.backend,
                "runtime": self.runtime, "target": self.target, "draft": self.draft,
                "target_cost": curves(self.target_cost), "tree_cost": curves(self.tree_cost),
                "draft_cost": curves(self.draft_cost),
                "target_prefill": {str(n): v for n, v in sorted(self.target_prefill.items())},
                "draft_prefill": self.draft_prefill, "policy_check": self.policy_check,
                "measured": self.measured, "source": self.source, "notes": self.notes}

    @classmethod
    def from_dict(cls, d: dict, where: str = "profile") -> Profile:
        """The one checked reader of a profile: every field of the right type and range before anything prices
        with it (a curve or context row left empty, a cost NaN, infinite, negative, zero or a string, a draft
        model without draft costs: one line naming the field, :class:`PacerError`)."""
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise PacerError(f"{where} is not a pacer cost profile ({FORMAT}); make one with "
                             f"`pacer calibrate --export FILE`")
        try:
            draft = _object(d, "draft", optional=True)
            prefill = d.get("target_prefill") or {}
            if not isinstance(prefill, dict):
                raise BadField(f"'target_prefill' is {type(prefill).__name__} (want an object {{tokens: seconds}})")
            checks = d.get("policy_check") or {}
            if not isinstance(checks, dict):
                raise BadField(f"'policy_check' is {type(checks).__name__} (want an object {{policy: seconds}})")
            notes = d.get("notes") or []
            if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
                raise BadField("'notes' is not a list of strings")
            p = cls(_text(d, "name"), _object(d, "machine"), _text(d, "backend"), _text(d, "runtime", False),
                    _object(d, "target"), draft, _curves(d.get("target_cost"), "target_cost"),
                    {read_count(n, f"'target_prefill' tokens {show_key(n)}", 1, key=True):
                     read_seconds(v, f"'target_prefill'[{show_key(n)}]") for n, v in prefill.items()},
                    _curves(d.get("draft_cost"), "draft_cost", empty=True),
                    read_seconds(d.get("draft_prefill", 0.0), "'draft_prefill'", zero=True),
                    _curves(d.get("tree_cost"), "tree_cost", empty=True),
                    {str(k): read_seconds(v, f"'policy_check'[{show_key(k)}]", zero=True) for k, v in checks.items()},
                    _text(d, "measured", False), _text(d, "source", False), list(notes))
            if draft is not None and not p.draft_cost:
                raise BadField("'draft_cost' is empty, but the profile has a draft model (its forwards are priced "
                               "with it)")
        except BadField as e:
            raise PacerError(f"{where}: {e}; export it again (`pacer calibrate --export FILE`)") from None
        if bad := p.problems():
            raise PacerError(f"{where} holds unusable costs ({bad[0]}); export it again")
        return p

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        from .io import read_json

        path = Path(path)
        doc = read_json(path, "cost profile", "pass a file written by `pacer calibrate --export` (shipped ones: "
                        "docs/profiles/)")
        return cls.from_dict(doc, f"cost profile {path}")

    def save(self, path: str | Path) -> None:
        from .io import atomic_write_text

        atomic_write_text(Path(path), json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def from_calibration(cls, cal, name: str = "this machine") -> Profile:
        """The profile of a :class:`pacer.calibration.Calibration` (at each context it measured)."""
        key = cal.key or {}
        ctx = int(key.get("context", 32))
        at = cal.contexts or {ctx: cal.costs}
        from .machine import describe_cpu

        cpu = key.get("cpu")
        return cls(name, {"cpu": cpu, "describe": describe_cpu(cpu) if cpu else "?", "threads": key.get("threads"),
                          "device": key.get("device", "cpu")},
                   str(key.get("backend", "")), str(key.get("runtime", "")),
                   {"fingerprint": key.get("target"), "dtype": key.get("target_dtype")},
                   {"fingerprint": key.get("draft"), "dtype": key.get("draft_dtype"), "rows": key.get("draft_rows")}
                   if key.get("draft") else None,
                   {c: dict(v.target) for c, v in at.items()}, {min(at): cal.prefill} if cal.prefill > 0 else {},
                   {c: dict(v.draft_curve) or {1: v.draft} for c, v in at.items()} if cal.costs.draft > 0 else {},
                   cal.costs.draft_prefill,
                   {c: dict(v.tree) for c, v in at.items()} if cal.costs.tree else {},
                   source=f"calibration ({cal.source})")


def doubtful_prefills(target_cost: Curves, target_prefill: dict[int, float]) -> dict[int, str]:
    """The prefill points (``{n: why}``) that the same machine's curve at context ``n`` contradicts
    (:func:`pacer.costs.prefill_doubt`); a prompt longer than the longest context measured is not judged."""
    bad = {}
    for n, v in target_prefill.items():
        if n > max(target_cost, default=0):
            continue  # no curve at that context: its attention is not bounded by a shorter context's
        if (why := prefill_doubt(n, v, _at_context(target_cost, n))) is not None:
            bad[n] = f"{why}, left out"
    return bad


def clock(profile: Profile, wall: float, calls: Iterable[Call]) -> float:
    """Seconds of a generation on ``profile``'s machine: every forward priced there, plus this run's own overhead
    (``wall`` minus the forwards' measured seconds)."""
    calls = list(calls)
    return sum(profile.price(c) for c in calls) + (wall - sum(c.seconds for c in calls))


def clock_recorded(profile: Profile, wall: float, calls: Iterable[list]) -> float:
    """:func:`clock` of one recorded turn: its wall time and its forwards as a bench record keeps them
    (``[role, k, context, tree, seconds, kept]`` lists, :meth:`Call.from_list`)."""
    return clock(profile, wall, [Call.from_list(x) for x in calls])


def pair_of(pair: Pair, rows: torch.Tensor | None = None) -> tuple[str, dict, dict | None]:
    """``(backend, target, draft)`` of a loaded :class:`pacer.pair.Pair` whose draft scores vocabulary ``rows``,
    as :meth:`Profile.check_pair` takes."""
    t, d = pair.target_info, pair.draft_info
    return (pair.backend, {"fingerprint": t.fingerprint, "dtype": t.weights},
            {"fingerprint": d.fingerprint, "dtype": d.weights, "rows": "full" if rows is None else int(len(rows))}
            if d is not None else None)


# ------------------------------------------------------------------------------------------------ measuring
def measure(pair: Pair, rows: torch.Tensor | None = None, contexts: Sequence[int] = CONTEXTS, reps: int = 3,
            name: str = "", say: Callable[[str], None] = lambda s: None) -> Profile:
    """This machine's profile for a loaded pair whose draft scores vocabulary ``rows`` (see the module docstring;
    ``pacer calibrate --export``)."""
    import torch

    from . import devices, timing
    from .decoding.backend import Tree
    from .machine import cpu_identity, describe_cpu

    target = pair.target
    limit = target.context - max(TARGET_KS) - 2
    contexts = sorted({c for c in contexts if c <= limit}) or [min(32, max(1, limit))]

    def ids(n: int, offset: int = 0) -> list[int]:
        return timing.token_ids(pair.vocab, n, offset)

    tc: Curves = {}
    tr: Curves = {}
    dc: Curves = {}
    pre: dict[int, float] = {}
    with torch.inference_mode():
        target.reset()
        target.forward(ids(8), keep=1)  # warm-up
        for n in PREFILLS:
            if n > limit:
                continue
            say(f"target prefill of {n} tokens")
            target.reset()
            pre[n] = timing.prefill(target, ids(n))
        for c in contexts:
            target.reset()
            target.forward(ids(c), keep=1)
            tc[c], tr[c] = {}, {}
            for k in TARGET_KS:
                say(f"target, context {c}, {k} token{'s' * (k > 1)}")
                tc[c][k] = timing.median(target, ids(k, c), c, reps, k)
            for k in TREE_KS:
                say(f"target tree, context {c}, {k} tokens")
                tr[c][k] = timing.median(target, ids(k, c), c, reps, k, Tree.branching(k))
        target.reset()
        draft_prefill = 0.0
        if pair.draft_info is not None:
            dm = pair.draft_backend(rows)
            dm.forward(ids(8), keep=1)
            dm.reset()
            n = min(128, limit)
            draft_prefill = timing.prefill(dm, ids(n))
            for c in contexts:
                dm.reset()
                dm.forward(ids(c), keep=1)
                dc[c] = {}
                for k in DRAFT_KS:
                    say(f"draft, context {c}, {k} token{'s' * (k > 1)}")
                    dc[c][k] = timing.median(dm, ids(k, c), c, reps, k)
            dm.reset()
    backend, t, d = pair_of(pair, rows)
    cpu = cpu_identity()
    machine = {"cpu": cpu, "describe": describe_cpu(cpu), "threads": pair.threads,
               "device": devices.describe(target.device) if target.device.type != "cpu" else "cpu"}
    from .calibration import backend_version

    doubtful = doubtful_prefills(tc, pre)
    for n in doubtful:
        del pre[n]
    return Profile(name or "this machine", machine, backend, backend_version(pair.target_info), t, d, tc, pre,
                   dc, draft_prefill, tr, measured=_dt.date.today().isoformat(),
                   source=f"pacer calibrate --export (median of {reps} forwards a point)",
                   notes=list(doubtful.values()))


def default_name(profile: Profile) -> str:
    """``CPU-BACKEND-DTYPE``, e.g. ``zen4-avx512bf16-transformers-bf16`` (the names under ``docs/profiles/``)."""
    cpu = profile.machine.get("cpu") or {}
    flags = set(cpu.get("flags", ()))
    fam, model = str(cpu.get("family", "")), str(cpu.get("model_id", ""))
    vendor = "amd" if "AMD" in str(cpu.get("model", "")) else "intel" if "Intel" in str(cpu.get("model", "")) \
        else "cpu"
    gen = {("25", "1"): "zen3", ("25", "17"): "zen4", ("26", "2"): "zen5"}.get((fam, model), f"{vendor}{fam}-{model}")
    isa = "amx" if "amx_tile" in flags else "avx512bf16" if "avx512_bf16" in flags else "avx512" \
        if "avx512f" in flags else "avx2" if "avx2" in flags else "other"
    if profile.machine.get("device", "cpu") != "cpu":
        gen, isa = "gpu", str(profile.machine["device"]).split(",")[0].lower().replace(" ", "")
    dtype = str(profile.target.get("dtype", ""))
    dt = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}.get(dtype, dtype.replace("gguf:", "").lower()
                                                                         .replace("_", ""))
    return f"{gen}-{isa}-{profile.backend}-{dt}"
