"""The drafter interface: what proposes ``d_1..d_γ`` each round, behind one small interface (:class:`Drafter`); the
drafters themselves are in :mod:`pacer.drafters`.

A drafter owns its draft backend and asks the draft-length policy after every token whether to go on; the
per-token handshake (ask from ``min_draft`` on, time the policy, record the token's features) is
:class:`Proposal`, shared by every drafter so that a policy sees the same thing whoever drafts.
"""

from __future__ import annotations

import time

import torch

from ..errors import PacerError
from ..policies.base import DraftPolicy, DraftState
from ..sampling import SamplingConfig
from .tree import Draft


class Drafter:
    """Proposes draft tokens (the interface every drafting scheme implements)."""

    def reset(self) -> None:
        """Called at the start of each generation."""

    def propose(self, tokens: list[int], policy: DraftPolicy, budget: int, sampling: SamplingConfig,
                gen: torch.Generator, remaining: int = 0) -> Draft:
        """Draft at most ``budget`` tokens after the committed ``tokens``, asking ``policy`` after each;
        ``remaining``: tokens the generation may still emit (``DraftState.remaining``)."""
        raise NotImplementedError

    def rollback(self, keep: int) -> None:
        """The committed sequence now has ``keep`` tokens that the drafter may have cached; drop the rest."""

    def vocab_rows(self) -> torch.Tensor | None:
        """The draft vocabulary rows the drafter proposes from (``None``: the full vocabulary)."""
        return None

    def observe(self, tokens: list[int], target_argmax: list[int], accepted: int) -> None:
        """After verification: ``target_argmax[i]`` (``0 <= i <= γ``) is the target's greedy token after
        ``tokens + d_1..d_i`` (``γ + 1`` entries; branch rows are not included), ``accepted`` is ``n``. Phrase
        pools learn from it; the default does nothing."""

    def agreement(self, prompt: list[int], reference: list[int]) -> list[bool]:
        """For each position ``j`` of ``reference`` (the target's greedy continuation of ``prompt``): would this
        drafter's greedy proposal after ``prompt + reference[:j]`` be ``reference[j]``? Feeds the oracle."""
        raise PacerError(f"{type(self).__name__} cannot tell where it agrees with the target (no oracle for it)")

    def report(self) -> dict | None:
        """What the drafter did in the generation, for ``GenerationResult.extra["drafter"]`` (``None``: nothing)."""
        return None

    def finish(self) -> None:
        """Called once a generation has ended (e.g. to save state that outlives it)."""


def token_features(q: torch.Tensor, x: int, state: DraftState, index: int | None = None,
                   ids: torch.Tensor | None = None) -> None:
    """Append the cheap per-token features of draft token ``x`` drawn from ``q`` to ``state`` (computed where ``q``
    is and read back in one transfer). ``index``: where ``x`` is in ``q`` when ``q`` covers only the ids a reduced
    draft head scores (``ids``; every other id has probability 0; default: ``q`` is over the whole vocabulary)."""
    logq = torch.log(q.clamp_min(1e-30))
    if q.shape[-1] > 1:
        top2, where = torch.topk(q, 2)
    else:
        top2, where = torch.cat([q.max().reshape(1), q.new_zeros(1)]), torch.zeros(2, dtype=torch.long)
    at = x if index is None else index
    prob, top, second, entropy, alt = torch.stack([q[at], top2[0], top2[1], -(q * logq).sum(),
                                                   where[1].to(q.dtype)]).tolist()
    alt = int(alt) if ids is None else int(ids[int(where[1])])
    state.tokens.append(x)
    state.second_token.append(alt)
    state.prob.append(prob)
    state.top_prob.append(top)
    state.second_prob.append(second)
    state.entropy.append(entropy)


class Proposal:
    """One round's drafting in progress: the per-token handshake with the policy that every drafter shares.

    :meth:`ask` - may one more token be drafted? (below ``policy.min_draft`` without asking; the policy's time is
    counted apart from drafting); :meth:`add` - record a drafted token with its features; :meth:`draft` - the
    finished :class:`Draft`."""

    def __init__(self, policy: DraftPolicy, budget: int, catch_up: int = 0, remaining: int = 0,
                 temperature: float = 0.0) -> None:
        self.policy, self.budget = policy, budget
        self.layers = policy.hidden_layers
        self.state = DraftState(catch_up=max(0, catch_up), remaining=remaining, temperature=temperature)
        self.policy_time = 0.0
        self.forwards = 0
        self.qs: list[torch.Tensor] = []

    @property
    def n(self) -> int:
        return self.state.n

    def ask(self, free: bool = False, confidence: float | None = None) -> bool:
        """``free``: the token asked about is already computed (it costs no draft forward of its own);
        ``confidence``: the drafter's estimate that it is right (``DraftState.next_confidence``)."""
        if self.state.n >= self.budget:
            return False
        self.state.next_is_free = free
        self.state.next_confidence = confidence
        if self.state.n < self.policy.min_draft:
            return True
        t = time.perf_counter()
        ok = self.policy.should_continue(self.state)
        self.policy_time += time.perf_counter() - t
        return ok

    def add(self, q: torch.Tensor, x: int, hidden: tuple[torch.Tensor, ...] | None, row: int,
            phrase: bool = False, keep_q: bool = False, confidence: float | None = None,
            index: int | None = None, ids: torch.Tensor | None = None) -> None:
        """Token ``x`` drawn from ``q``; ``hidden[layer][row]`` are its hidden states (the forward's row that
        predicted it); ``keep_q``: sampling, the loop needs ``q`` for rejection sampling (over the whole
        vocabulary); ``confidence``: the drafter's own estimate that ``x`` is right (``DraftState.confidence``);
        ``index``: greedy, ``q`` covers only a reduced head's scored ids (``ids``) and ``x`` is at ``index`` in
        it."""
        token_features(q, x, self.state, index, ids)
        self.state.phrase.append(phrase)
        if confidence is not None:
            self.state.confidence.append(confidence)
        if self.layers is not None:  # kept on the draft's device; a policy moves them where its layer runs
            self.state.hidden.append(torch.cat([hidden[i][row] for i in self.layers]).float())
        if keep_q:
            self.qs.append(q)

    def draft(self) -> Draft:
        return Draft(self.state.tokens, torch.stack(self.qs) if self.qs else None, self.state, self.policy_time,
                     self.forwards)
