"""How a :class:`pacer.Decoder` turns a method request into a policy and a drafter on its :class:`~pacer.pair.Pair`,
with what it keeps between generations: this machine's costs per draft vocabulary (or given ones, or another
machine's profile), the draft vocabularies it has resolved, and what the cost-aware rule learned per method."""

from __future__ import annotations

import sys
import weakref
from collections.abc import Sequence

import torch

from . import methods
from .calibration import Calibration
from .costs import ContextCosts, Costs, check_given
from .decoding import Drafter
from .drafters.token import TokenDrafter
from .errors import InvalidType, InvalidValue, PacerError
from .pair import Pair
from .policies.base import DraftPolicy
from .policies.cost_aware import CostAwarePolicy
from .pricing import UNPRICED, CostMemory, CostPricer, Pricer
from .request import MethodRequest


class MethodFactory:
    """The policies and drafters of method requests on ``pair``; ``draft_vocab``, ``costs`` and ``progress``: see
    :class:`pacer.Decoder`."""

    def __init__(self, pair: Pair, draft_vocab: int | str | Sequence[int] | None = "auto",
                 costs: Costs | ContextCosts | None = None, progress: bool = True) -> None:
        self.pair = pair
        self.draft_vocab = draft_vocab
        self.progress = progress
        self._calibrations: dict[int | None, Calibration] = {}
        #: costs given to the constructor or a profile's (every vocabulary's), as one shape, and where they came from
        self._given: tuple[ContextCosts, str] | None = None
        if costs is not None:  # checked as a profile is (use_profile)
            self._given = (check_given(costs, free_draft=pair.draft_info is None), "given")
        self._cost_memory: dict[str, CostMemory] = {}
        self._pricers: dict[tuple, CostPricer] = {}
        #: the pricer of each policy :meth:`make_policy` built (:meth:`pricer_of`)
        self._pricer_of: weakref.WeakKeyDictionary[DraftPolicy, Pricer] = weakref.WeakKeyDictionary()
        self._draft_rows: dict[int | str, torch.Tensor | None] = {}

    def calibration(self, rows: torch.Tensor | None = None, refresh: bool = False) -> Calibration:
        """This machine's measured costs for this pair with draft vocabulary ``rows`` (cached; see
        :mod:`pacer.calibration`)."""
        key = None if rows is None else len(rows)
        if refresh or key not in self._calibrations:
            from .calibration import load_or_measure

            cal = load_or_measure(self.pair, rows, refresh=refresh, progress=self.progress)
            for note in cal.notes:
                print(f"pacer: note: {note}", file=sys.stderr)
            self._calibrations[key] = cal
            self._pricers.clear()
        return self._calibrations[key]

    def costs(self, rows: torch.Tensor | None = None) -> tuple[ContextCosts, str]:
        """The costs rounds are priced with for draft vocabulary ``rows``, by context, and their source: those given
        to the constructor or a profile's (:meth:`use_profile`), else this machine's calibration
        (:meth:`calibration`: ``measured``, ``cache`` or ``conservative``)."""
        if self._given is not None:
            return self._given
        cal = self.calibration(rows)
        return cal.by_context(0.0), cal.source

    def use_profile(self, profile) -> list[str]:
        """Decide with another machine's measured costs (a :class:`pacer.profiles.Profile` of this pair and
        backend; refused otherwise): the cost-aware rule takes the profile's curve (not refined by this
        machine's timings). Returns notes on softer differences (the draft's dtype or vocabulary)."""
        from .profiles import Profile, pair_of

        if not isinstance(profile, Profile):
            raise InvalidType(f"profile must be a pacer.profiles.Profile (Profile.load(FILE)), got "
                              f"{type(profile).__name__}")
        if bad := profile.problems():  # one built in code never met the file reader's checks
            raise InvalidValue(f"the cost profile {profile.name} holds unusable costs ({bad[0]})")
        rows = self.draft_rows(self.draft_vocab) if self.pair.draft_info is not None else None
        notes = profile.check_pair(*pair_of(self.pair, rows))
        # the rule prices each round at the context it runs at, as the profile clock prices its forwards there
        self._given = (ContextCosts(profile.costs), f"profile {profile.name}")
        self._pricers.clear()
        return notes

    def draft_rows(self, draft_vocab: int | str | Sequence[int] | torch.Tensor | None) -> torch.Tensor | None:
        """The draft's kept vocabulary rows for a ``draft_vocab`` setting (``None`` for the full vocabulary)."""
        if draft_vocab == "auto":  # resolved once per decoder; a failure is said once and remembered
            if "auto" not in self._draft_rows:
                from .draftvocab import auto_size

                size, rows = auto_size(self.pair), None
                try:
                    rows = self.draft_rows(size) if size else None
                except PacerError as e:  # e.g. the corpus is not installed: draft from the full vocabulary
                    print(f"pacer: note: drafting from the full vocabulary ({e})", file=sys.stderr)
                self._draft_rows["auto"] = rows
            return self._draft_rows["auto"]
        if isinstance(draft_vocab, str):
            raise PacerError(f"draft_vocab must be auto or a number of tokens, got {draft_vocab!r}")
        if draft_vocab is None or (isinstance(draft_vocab, int) and draft_vocab == 0):
            return None
        if isinstance(draft_vocab, bool):
            raise PacerError(f"draft_vocab must be a number of tokens, got {draft_vocab!r}")
        if isinstance(draft_vocab, int):
            from .draftvocab import load_or_build

            if draft_vocab not in self._draft_rows:
                self._draft_rows[draft_vocab] = load_or_build(self.pair, draft_vocab)
            return self._draft_rows[draft_vocab]
        return torch.as_tensor(list(draft_vocab), dtype=torch.long, device="cpu")

    def make_policy(self, method: str | MethodRequest, rows: torch.Tensor | None = None, verify: str = "token",
                    **settings) -> DraftPolicy:
        """The draft-length policy of a :class:`~pacer.request.MethodRequest` (or of a method's name with its
        settings and options as keywords, :meth:`MethodRequest.of`), for draft vocabulary ``rows``, whose rounds
        ``verify`` verifies (:data:`pacer.sampling.VERIFY_RULES`; greedy decoding's exact matching is ``token``).

        Under the cost-aware rule (:attr:`MethodRequest.aware`) the policy is wrapped in the rule of
        :mod:`pacer.policies.cost_aware` on this machine's costs for ``rows``: a rule's threshold gives way to it
        (an explicit one is kept), and ``min_draft`` defaults to 0, so a round where nothing pays is a plain
        decoding step. A literal rule (``gamma``, a threshold) of a method whose drafter adds priced work to a
        round (:attr:`~pacer.methods.registry.Method.extras`: Ouroboros' phrases and branches) is returned as it
        is: its pricer (:meth:`make_pricer`, :meth:`pricer_of`) prices that work on the same costs unless
        ``cost_aware`` is false."""
        req = MethodRequest.of(method, **settings)
        if not req.drafts:
            raise PacerError(f"method '{req.method}' drafts nothing and has no draft-length policy")
        aware = req.aware
        policy = req.record.policy(methods.Build(self.pair, req.policy_options, req.bounds, req.gamma, aware, rows))
        if not aware and not (req.cost_aware is None and req.record.extras):
            return policy
        pricer = self.make_pricer(req, rows, verify, policy)
        if aware:
            policy = CostAwarePolicy(policy, pricer)
        self._pricer_of[policy] = pricer
        return policy

    def pricer_of(self, policy: DraftPolicy) -> Pricer:
        """The pricer of a policy :meth:`make_policy` built (its cost rule's, or a literal rule's priced extras');
        :data:`~pacer.pricing.UNPRICED` for any other (a literal rule without priced extras, a policy built
        elsewhere: give its pricer beside it)."""
        try:
            return self._pricer_of.get(policy, UNPRICED)
        except TypeError:  # an unhashable policy (a dataclass, say): not one built here
            return UNPRICED

    def make_pricer(self, method: str | MethodRequest, rows: torch.Tensor | None = None, verify: str = "token",
                    policy: DraftPolicy | None = None, **settings) -> Pricer:
        """What prices the rounds of a :class:`~pacer.request.MethodRequest` (or of a method's name with its
        settings as keywords) for draft vocabulary ``rows`` and verification rule ``verify`` under ``policy`` (its
        check's seconds, ``c_p``, and its longest draft; default: the method's): :data:`~pacer.pricing.UNPRICED`
        where no cost rule prices them (a method that drafts nothing, a literal rule without priced extras), else a
        :class:`~pacer.pricing.CostPricer` on this factory's costs (:meth:`costs`) and what the rule learned
        about this method on this pair (a :class:`~pacer.pricing.CostMemory` carried across generations). One per
        method, vocabulary, rule and policy check: :meth:`make_policy`'s cost rule and the loop get the same one.
        Costs given to the decoder (or a profile's) are taken as they are; measured ones follow the loop's
        timings."""
        req = MethodRequest.of(method, **settings)
        if not req.drafts or not (req.aware or (req.cost_aware is None and req.record.extras)):
            return UNPRICED
        if policy is None:
            policy = req.record.policy(methods.Build(self.pair, req.policy_options, req.bounds, req.gamma,
                                                     req.aware, rows))
        # what the rule learned about this method on this pair carries over to its next generation (keyed by the
        # drafter's options too: what its branches yield is that drafter's; the vocabulary is in the rows' size;
        # and by the verification rule: block verification keeps other counts than token-level's)
        size = None if rows is None else len(rows)
        bounds = req.bounds
        drafter = sorted((k, v) for k, v in req.drafter_options.items() if k != "draft_vocab")
        key = "|".join(map(str, (req.method, sorted(req.policy_options.items()), drafter, bounds.get("min_draft"),
                                 bounds.get("max_draft"), size, req.gamma, req.aware)))
        key += "" if verify == "token" else f"|{verify}"
        priced = (key, policy.check_seconds, policy.max_draft)
        if priced not in self._pricers:
            costs, source = self.costs(rows)
            self._pricers[priced] = CostPricer(costs.with_check(policy.check_seconds),
                                               self._cost_memory.setdefault(key, CostMemory()),
                                               0.2 if source in ("measured", "cache") else 0.0, policy.max_draft,
                                               source)
        return self._pricers[priced]

    def make_drafter(self, method: str | MethodRequest, **settings) -> Drafter:
        """The drafter of a :class:`~pacer.request.MethodRequest` (or of a method's name with its options as
        keywords); ``draft_vocab`` (every method) overrides the decoder's reduced draft vocabulary."""
        req = MethodRequest.of(method, **settings)
        m = req.record
        if not m.drafts:
            raise PacerError(f"method '{req.method}' drafts nothing")
        if self.pair.draft_info is None and m.needs_draft:
            raise PacerError(f"method '{req.method}' needs a draft model")
        options = dict(req.drafter_options)
        rows = self.draft_rows(options.pop("draft_vocab", self.draft_vocab)) if m.needs_draft else None
        if m.drafter is None:
            return TokenDrafter(self.pair.draft_backend(rows), self.pair.vocab)
        return m.drafter(methods.Build(self.pair, options, rows=rows))
