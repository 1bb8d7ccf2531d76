"""The drafter interface: what proposes ``d_1..d_γ`` each round, behind one small interface (:class:`Drafter`); the
drafters themselves are in :mod:`pacer.drafters`.

A drafter owns its draft backend and asks the draft-length policy after every token whether to go on; the
per-token handshake (ask from ``min_draft`` on, time the policy, record the token's features) is
:class:`Proposal`, shared by every drafter so that a policy sees the same thing whoever drafts.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from ..errors import PacerError
from ..policies.base import DraftPolicy
from ..pricing import UNPRICED, Pricer
from ..rounds import DRAFT_FEATURES, DraftState
from ..sampling import SamplingConfig, argmax, softmax_stats, top_two
from .backend import HIDDEN_SPLIT
from .tree import Draft


class Drafter:
    """Proposes draft tokens (the interface every drafting scheme implements)."""

    #: :meth:`observe` reads the target's argmax at every verified row (phrase pools learn the target's text past a
    #: rejection); ``False``: the loop computes only the rows up to the first rejection (each a full pass over a
    #: vocabulary-wide row) and passes those
    reads_target_argmax: bool = False

    def reset(self) -> None:
        """Called at the start of each generation."""

    def propose(self, tokens: list[int], policy: DraftPolicy, budget: int, sampling: SamplingConfig,
                gen: torch.Generator, remaining: int = 0, pricer: Pricer = UNPRICED) -> Draft:
        """Draft at most ``budget`` tokens after the committed ``tokens``, asking ``policy`` after each;
        ``remaining``: tokens the generation may still emit (``DraftState.remaining``); ``pricer``: what the
        generation's rounds cost (:mod:`pacer.pricing`), for a drafter that adds work a round must pay for
        (phrases, branches, a round without the draft model)."""
        raise NotImplementedError

    def rollback(self, keep: int) -> None:
        """The committed sequence now has ``keep`` tokens that the drafter may have cached; drop the rest."""

    def vocab_rows(self) -> torch.Tensor | None:
        """The draft vocabulary rows the drafter proposes from (``None``: the full vocabulary)."""
        return None

    def observe(self, tokens: list[int], target_argmax: list[int], accepted: int) -> None:
        """After verification: ``target_argmax[i]`` (``0 <= i <= γ``) is the target's greedy token after
        ``tokens + d_1..d_i`` (``γ + 1`` entries where :attr:`reads_target_argmax`, else at least the first
        ``n + 1``; branch rows are not included), ``accepted`` is ``n``. Phrase pools learn from it; the default
        does nothing."""

    def agreement(self, prompt: list[int], reference: list[int]) -> list[bool]:
        """For each position ``j`` of ``reference`` (the target's greedy continuation of ``prompt``): would this
        drafter's greedy proposal after ``prompt + reference[:j]`` be ``reference[j]``? Feeds the oracle."""
        raise PacerError(f"{type(self).__name__} cannot tell where it agrees with the target (no oracle for it)")

    def report(self) -> dict | None:
        """What the drafter did in the generation, for ``GenerationResult.extra["drafter"]`` (``None``: nothing)."""
        return None

    def finish(self) -> None:
        """Called once a generation has ended (e.g. to save state that outlives it)."""


#: the features read from ``q``'s top two
_TOP = frozenset({"top_prob", "second_prob", "second_token"})
_ORDER = ("prob", "top_prob", "second_prob", "second_token", "entropy")


def token_features(q: torch.Tensor | None, x: int | None, state: DraftState, index: int | None = None,
                   ids: torch.Tensor | None = None, features: frozenset[str] = DRAFT_FEATURES,
                   logits: torch.Tensor | None = None) -> int:
    """Append draft token ``x`` drawn from ``q`` and the per-token ``features`` of it that are asked for
    (:data:`~pacer.policies.base.DRAFT_FEATURES`; ``q`` may be ``None`` when none is) to ``state``; returns ``x``.
    ``index``: where ``x`` is in ``q`` when ``q`` covers only the ids a reduced draft head scores (``ids``; every
    other id has probability 0; default: ``q`` is over the whole vocabulary). Greedy drafts may pass the ``logits``
    row instead of ``q = softmax(logits)``: a float32 row in CPU memory is then read without making ``q``
    (:func:`~pacer.sampling.softmax_stats`: one pass of :mod:`pacer.native`'s kernel, or numpy's exponential into a
    reused buffer), and ``x = None`` asks for the row's argmax (``ids[argmax]`` with ``ids``), which that same pass
    finds. A float32 ``q`` in CPU memory is read by numpy's vectorised kernels (two argmax passes for the top two,
    one log for the entropy: ~0.1 ms for 152k ids on a 2-core Zen 5 against ~0.5 ms for torch's log, top-k and
    products); elsewhere the values are computed where ``q`` is and read back in one transfer."""
    if not features:
        x = x if x is not None else _pick(argmax(logits), ids)
        state.tokens.append(x)
        return x
    top = not features.isdisjoint(_TOP)
    values = None
    if logits is not None:
        if logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.dim() == 1:
            values = _features_logits(logits.detach().numpy(), x if index is None else index, top,
                                      "entropy" in features)
        if values is None:
            q = torch.softmax(logits.float(), -1)
            if x is None:
                i = argmax(logits)
                index, x = (i if ids is not None else None), _pick(i, ids)
    if values is not None:
        prob, first, second, entropy, alt, at = values
        if x is None:
            x = _pick(at, ids)
    else:
        at = x if index is None else index
        if q.device.type == "cpu" and q.dtype == torch.float32 and q.dim() == 1:
            prob, first, second, entropy, alt = _features_numpy(q.detach().numpy(), at, top, "entropy" in features)
        else:
            prob, first, second, entropy, alt = _features_torch(q, at)
    state.tokens.append(x)
    if ids is not None and top:
        alt = int(ids[alt])
    values = {"prob": prob, "top_prob": first, "second_prob": second, "second_token": alt, "entropy": entropy}
    for name in _ORDER:
        if name in features:
            getattr(state, name).append(values[name])
    return x


def _pick(i: int, ids: torch.Tensor | None) -> int:
    """The token id at index ``i`` of a row over ``ids`` (``None``: the whole vocabulary, ``i`` itself)."""
    return i if ids is None else int(ids[i])


def _features_logits(row: np.ndarray, at: int | None, top: bool,
                     entropy: bool) -> tuple[float, float, float, float, int, int] | None:
    """:func:`_features_numpy`'s values from a logits row, without its probability row (the second choice only
    where ``top``; ``None``: not finite), and the index they are of: ``at``, or the row's argmax where ``at`` is
    ``None``."""
    st = softmax_stats(row, entropy, second=top)
    if st is None:
        return None
    at = st.i if at is None else at
    second, alt = (st.prob(st.j), st.j) if st.j >= 0 else (0.0, 0)
    return st.prob(at), 1.0 / st.z, second, 0.0 if not entropy else st.entropy, alt, at


def _features_numpy(a: np.ndarray, at: int, top: bool, entropy: bool) -> tuple[float, float, float, float, int]:
    """``q(x)``, the top two probabilities, the entropy and the second choice's index of a probability row ``a``
    (the top two and the entropy only where asked for; 0 otherwise)."""
    first = second = h = 0.0
    alt = 0
    if top:
        i, j = top_two(a)
        first = float(a[i])
        if j >= 0:
            alt, second = j, float(a[j])
    if entropy:
        h = -float(np.dot(a, np.log(np.maximum(a, 1e-30))))
    return float(a[at]), first, second, h, alt


def _features_torch(q: torch.Tensor, at: int) -> tuple[float, float, float, float, int]:
    """The same values of a row on any device, computed there and read back in one transfer."""
    logq = torch.log(q.clamp_min(1e-30))
    if q.shape[-1] > 1:
        top2, where = torch.topk(q, 2)
    else:
        top2, where = torch.cat([q.max().reshape(1), q.new_zeros(1)]), torch.zeros(2, dtype=torch.long)
    prob, first, second, entropy, alt = torch.stack([q[at], top2[0], top2[1], -(q * logq).sum(),
                                                     where[1].to(q.dtype)]).tolist()
    return prob, first, second, entropy, int(alt)


class Proposal:
    """One round's drafting in progress: the per-token handshake with the policy that every drafter shares.

    :meth:`ask` - may one more token be drafted? (below ``policy.min_draft`` without asking; the policy's time is
    counted apart from drafting); :meth:`add` - record a drafted token with its features; :meth:`draft` - the
    finished :class:`Draft`. ``features``: the per-token features computed, those the policy reads
    (``policy.draft_features``; ``q(d_i)`` too where it needs soft acceptance) and ``needs``, those the drafter
    reads itself; a drafter that draws greedily need not compute ``q`` at all when this is empty."""

    def __init__(self, policy: DraftPolicy, budget: int, catch_up: int = 0, remaining: int = 0,
                 temperature: float = 0.0, needs: frozenset[str] = frozenset(), pricer: Pricer = UNPRICED) -> None:
        self.policy, self.budget, self.pricer = policy, budget, pricer
        self.features = policy.draft_features | needs | ({"prob"} if policy.needs_soft else set())
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
        if ok:  # the pricer counts what the policy drafts (a literal rule's extras are priced on it)
            self.pricer.drafting(self.policy, self.state)
        self.policy_time += time.perf_counter() - t
        return ok

    def add(self, q: torch.Tensor | None, x: int | None, hidden: tuple[torch.Tensor, ...] | None, row: int,
            phrase: bool = False, keep_q: bool = False, confidence: float | None = None,
            index: int | None = None, ids: torch.Tensor | None = None, logits: torch.Tensor | None = None) -> int:
        """Token ``x`` drawn from ``q``; ``hidden[layer][row]`` are its hidden states (the forward's row that
        predicted it); ``keep_q``: sampling, the loop needs ``q`` for rejection sampling (over the whole
        vocabulary); ``confidence``: the drafter's own estimate that ``x`` is right (``DraftState.confidence``);
        ``index``: greedy, ``q`` covers only a reduced head's scored ids (``ids``) and ``x`` is at ``index`` in
        it. ``q`` may be ``None`` where no feature is computed (:attr:`features`) and it is not kept; a greedy
        draft may pass its ``logits`` row instead, and ``x = None`` for its argmax (see :func:`token_features`);
        returns ``x``."""
        x = token_features(q, x, self.state, index, ids, self.features, logits)
        self.state.phrase.append(phrase)
        if confidence is not None:
            self.state.confidence.append(confidence)
        if self.layers is not None:  # kept on the draft's device; a policy moves them where its layer runs
            rows = [hidden[i][row] for i in self.layers]
            # one layer: a row of the forward's own states (a view, not a copy; no backend reuses that memory)
            self.state.hidden.append((rows[0] if len(rows) == 1 else torch.cat(rows)).float())
        if keep_q:
            self.qs.append(q)
        return x

    def feed_apart(self, backend, pending: list[int]) -> list[int]:
        """The unread tokens a drafted token's forward reads: ``pending`` itself, or its last token alone after
        the rest is fed without hidden states where the policy reads them, there are :data:`HIDDEN_SPLIT` or more
        and ``backend``'s hidden-state forward scores every row (llama.cpp: a prompt's 152k-id rows)."""
        if self.layers is None or len(pending) < HIDDEN_SPLIT or not backend.hidden_scores_every_row:
            return pending
        backend.forward(pending[:-1], keep=1)
        self.forwards += 1
        return pending[-1:]

    def draft(self) -> Draft:
        return Draft(self.state.tokens, torch.stack(self.qs) if self.qs else None, self.state, self.policy_time,
                     self.forwards)
