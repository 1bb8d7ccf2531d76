"""The cost-aware rule: whether one more draft token pays on this machine's measured costs
(:class:`pacer.costs.Costs`: ``c_d``, ``c_t(k)``, ``c_p``, see :mod:`pacer.costs`).

The rule (:class:`CostAwarePolicy`), in a round that has drafted ``n`` tokens. ``S_i`` is the probability that
``d_1..d_i`` are all accepted: the policy's survival score (:meth:`pacer.policies.base.DraftPolicy.survival`: the
pre-verifier's block score, the SpecDec++ head's product, a rule's proxy), mapped to a probability by a
:class:`SurvivalCalibrator` that learns from the verifier's verdicts; a policy without a score uses
``S_i = Π_{j<=i} α_j`` with ``α_j`` the running conditional acceptance at draft position ``j``. Both are kept in a
:class:`CostMemory` across the generations of a decoder. ``S_0 = 1``. The round so far is expected to yield

    ``E_n = 1 + Σ_{i<=n} S_i`` tokens in ``T_n = n (c_d + c_p) + c_t(n + 1)`` seconds.

Drafting ``d_{n+1}`` adds ``ΔE = S_{n+1}`` expected tokens (``S_n · S_n / S_{n-1}``: the last token's conditional
acceptance carried one step on; ``S_n · α_{n+1}`` without a score and at ``n = 0``) for
``ΔT = c_d + c_p + c_t(n + 2) - c_t(n + 1)`` seconds, and goes on only when it raises the round's throughput:
``ΔE / ΔT >= E_n / T_n``. At ``n = 0`` the right side is plain decoding's rate ``1 / c_t(1)``, so a draft token
is only spent where it is expected to beat plain decoding. On a machine whose ``c_t(k)`` grows like
``k · c_t(1)`` (verification not free) ``ΔT > c_t(1) >= ΔE · T_0``: no round drafts, and every round is a plain
decoding step. The first draft token of a round whose draft model lags behind the committed tokens also pays for its
catch-up (:func:`catch_up_pays`: the prompt's prefill through the draft, the first time), against what drafting
saves over the tokens the generation may still emit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..costs import Costs
from .base import DraftPolicy, DraftState, RoundResult


def gain_pays(S: list[float], S_next: float, costs: Costs, spent: float | None = None, free: bool = False) -> bool:
    """Does drafting ``d_{n+1}`` raise the round's expected throughput? ``S`` = ``[S_1..S_n]``, ``S_next`` =
    ``S_{n+1}`` (see the module docstring for the terms). ``spent``: the round's drafting seconds so far (default
    ``n (c_d + c_p)``); ``free``: ``d_{n+1}`` needs no draft forward (it came with a phrase), only ``c_p``."""
    n = len(S)
    E = 1.0 + sum(S)
    T = (n * (costs.draft + costs.policy_per_check) if spent is None else spent) + costs.target_cost(n + 1)
    dT = (0.0 if free else costs.draft) + costs.policy_per_check + costs.target_cost(n + 2) - costs.target_cost(n + 1)
    return S_next * T >= E * dT


def catch_up_pays(S_1: float, costs: Costs, catch_up: int, remaining: int) -> bool:
    """Before the first draft token of a round the draft must read ``catch_up`` committed tokens it has not seen
    (the prompt, the first time; the tokens of plain rounds since): a one-time ``C = catch_up · c_pre``. Drafting
    from now on saves per emitted token ``s = c_t(1) - T_1 / E_1`` (one-token rounds: ``E_1 = 1 + S_1``,
    ``T_1 = c_d + c_p + c_t(2)``; longer drafts save more, so this is conservative), over the ``remaining`` tokens
    the generation may still emit. It pays when ``remaining · s > C``; with ``remaining`` unknown (0) the catch-up
    is not counted."""
    if remaining <= 0 or costs.draft_prefill <= 0:
        return True
    T1 = costs.draft + costs.policy_per_check + costs.target_cost(2)
    saving = costs.target_cost(1) - T1 / (1.0 + S_1)
    return remaining * saving > catch_up * costs.draft_prefill


#: a typical per-token acceptance of the default pair: on the shipped layer's 1,987 held-out validation rounds,
#: the best fixed draft length (3 tokens) yields 2.75 tokens a round (the checkpoint's ``best_fixed_predicted_speedup``
#: 1.985x on its costs), which a constant acceptance of 0.75 gives (``tests/test_costs.py`` derives it again)
TYPICAL_ACCEPTANCE = 0.75


def predicted_round(costs: Costs, alpha: float = TYPICAL_ACCEPTANCE, max_draft: int = 16) -> tuple[int, float]:
    """What the rule expects of a round where every draft token is accepted with probability ``alpha``
    (``S_i = alpha^i``): the draft length it chooses (:func:`gain_pays`, token by token, at most ``max_draft``) and
    the predicted speedup of such rounds over plain decoding, ``E_n / T_n · c_t(1)`` (1.0 where it drafts
    nothing: every round a plain decoding step). Prefills and catch-ups are left out."""
    S: list[float] = []
    while len(S) < max_draft and gain_pays(S, alpha ** (len(S) + 1), costs):
        S.append(alpha ** (len(S) + 1))
    n = len(S)
    if not n:
        return 0, 1.0
    T = n * (costs.draft + costs.policy_per_check) + costs.target_cost(n + 1)
    return n, (1.0 + sum(S)) / T * costs.target_cost(1)


class SurvivalCalibrator:
    """Maps a policy's raw survival score in [0, 1] to a probability, from the verifier's verdicts.

    ``bins`` equal-width bins over the raw score; a bin's estimate is ``(a + w · s) / (m + w)`` for a raw score
    ``s`` with ``a`` of the bin's ``m`` observations survived and a prior of weight ``w`` on the raw score itself
    (so an unseen bin trusts the score). Each round adds one observation per drafted position ``i``: survived iff
    ``i <= n``. :attr:`error` is the expected calibration error of the raw scores seen so far (the mean absolute
    gap between a bin's mean raw score and its survival rate, weighted by the bin's observations)."""

    def __init__(self, bins: int = 10, prior: float = 4.0) -> None:
        self.bins, self.prior = bins, prior
        self.hits = [0.0] * bins
        self.seen = [0.0] * bins
        self.raw_sum = [0.0] * bins

    def _bin(self, s: float) -> int:
        return min(self.bins - 1, max(0, int(s * self.bins)))

    def __call__(self, s: float) -> float:
        b = self._bin(s)
        return (self.hits[b] + self.prior * s) / (self.seen[b] + self.prior)

    def update(self, raw: list[float | None], accepted: int) -> None:
        """``raw[i - 1]``: the score at draft position ``i`` (``None``: none there); ``accepted``: ``n``."""
        for i, s in enumerate(raw, 1):
            if s is None:
                continue
            b = self._bin(s)
            self.seen[b] += 1
            self.hits[b] += i <= accepted
            self.raw_sum[b] += s

    @property
    def observations(self) -> int:
        return int(sum(self.seen))

    @property
    def error(self) -> float:
        total = sum(self.seen)
        if not total:
            return float("nan")
        return sum(abs(self.raw_sum[b] - self.hits[b]) for b in range(self.bins) if self.seen[b]) / total


class CostMemory:
    """What the cost-aware rule learns about a pair from the verifier, kept across the generations of one method
    on one :class:`pacer.api.Decoder` (a fresh rule would relearn it every prompt): the score calibrator and the
    per-position conditional acceptance ``α_i = P(d_i accepted | d_1..d_{i-1} accepted)`` (Beta prior of weight
    ``prior`` at ``alpha``; position ``i`` counts the rounds that drafted ``i`` tokens or more and accepted at
    least ``i - 1``)."""

    def __init__(self, alpha: float = 0.6, prior: float = 4.0, positions: int = 64) -> None:
        self.alpha0, self.prior = alpha, prior
        self.calibrator = SurvivalCalibrator()
        self.hits = [prior * alpha] * (positions + 1)
        self.trials = [prior] * (positions + 1)
        self.branch_offered = self.branch_gained = 0.0  # candidate-branch tokens scored / accepted
        self.pool_offered = self.pool_gained = 0.0  # the same for branches in rounds that drafted nothing

    def alpha(self, i: int = 1) -> float:
        """``α_i``; a position seen rarely leans on the one before it (its prior is ``α_{i-1}``, weight
        ``prior``), so a position a short-drafting rule never reaches is not stuck at the initial prior."""
        i = min(max(i, 1), len(self.hits) - 1)
        a = self.hits[1] / self.trials[1]
        for j in range(2, i + 1):
            a = (self.hits[j] - self.prior * self.alpha0 + self.prior * a) / self.trials[j]
        return a

    #: prior of :meth:`branch_yield`: accepted tokens per branch token offered, weight in tokens
    BRANCH_PRIOR, BRANCH_WEIGHT = 0.25, 8.0

    def branch_yield(self) -> float:
        """Accepted tokens per candidate-branch token the target scored in rounds whose whole draft survived
        (shrunk towards :attr:`BRANCH_PRIOR`)."""
        return self._shrunk(self.branch_gained, self.branch_offered)

    @classmethod
    def _shrunk(cls, gained: float, offered: float) -> float:
        return (gained + cls.BRANCH_PRIOR * cls.BRANCH_WEIGHT) / (offered + cls.BRANCH_WEIGHT)

    def branch_update(self, offered: int, gained: int) -> None:
        self.branch_offered += offered
        self.branch_gained += gained

    def pool_yield(self) -> float:
        """:meth:`branch_yield` of the branches scored in rounds where the draft model drafted nothing (a phrase
        pool's continuations of the committed text): learnt apart, as they are read in other rounds."""
        return self._shrunk(self.pool_gained, self.pool_offered)

    def pool_update(self, offered: int, gained: int) -> None:
        self.pool_offered += offered
        self.pool_gained += gained

    #: how much of the acceptance evidence a round the rule declined to draft keeps (see :meth:`fade`)
    IDLE_FADE = 0.98

    def fade(self, keep: float = IDLE_FADE) -> None:
        """A round that drafted nothing because the rule declined observes nothing: without this, an acceptance
        learnt low (a warm-up on an odd prompt, a stretch of hard requests) would stop drafting on the decoder for
        good, since only drafting rounds teach. Each such round moves ``α_i``'s evidence towards the prior (keeping
        ``keep`` of it), so that the rule tries a draft again once the prior's hope outweighs what is left; a
        draft that fails there teaches it to wait again (on a curve where even the prior does not pay, nothing
        changes)."""
        for i in range(len(self.hits)):
            self.hits[i] = self.prior * self.alpha0 + keep * (self.hits[i] - self.prior * self.alpha0)
            self.trials[i] = self.prior + keep * (self.trials[i] - self.prior)

    def update(self, raw: list[float | None], drafted: int, accepted: int) -> None:
        self.calibrator.update(raw[:drafted], accepted)
        for i in range(1, min(accepted + 1, drafted, len(self.hits) - 1) + 1):
            self.trials[i] += 1
            self.hits[i] += i <= accepted


@dataclass
class CostReport:
    """What the cost-aware rule saw in one generation (``GenerationResult.extra["cost_aware"]``)."""

    costs: dict
    alpha: float
    zero_rounds: int = 0
    rounds: int = 0
    calibration_error: float = float("nan")
    calibration_observations: int = 0
    source: str = ""
    notes: list[str] = field(default_factory=list)
    #: the rule decided the draft length (``False``: a literal rule did, and the rule priced the extras alone)
    length: bool = True

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["calibration_error"] = None if math.isnan(self.calibration_error) else round(self.calibration_error, 4)
        d["alpha"] = round(self.alpha, 4)
        return d


class CostAwarePolicy(DraftPolicy):
    """Wraps a policy: drafting goes on only while the wrapped policy wants to *and* the next token pays on this
    machine's costs (:func:`gain_pays`). The wrapped policy's bounds, hidden layers and updates pass through.

    ``refine``: after every round (the first of a generation, which holds the draft's prefill, excepted) the measured
    draft time per token and target time of the round update running averages (weight ``refine``, each clipped to
    [1/4, 4]), as multipliers of the calibrated ``c_d`` and ``c_t`` curve: load on the machine shifts the
    decisions. 0 keeps the given costs as they are.

    ``length=False``: the wrapped policy alone decides the draft length (a literal rule: a threshold, a fixed
    ``γ``), and the rule only prices what a drafter may add to the round - phrases the draft checks, candidate
    branches and siblings the target scores (:meth:`phrase_room`, :meth:`branch_room`, :meth:`sibling_room`) - on
    the same costs and calibrated survival: extras pay like draft tokens whoever decides the length."""

    name = "cost-aware"

    def __init__(self, inner: DraftPolicy, costs: Costs, source: str = "", refine: float = 0.2,
                 memory: CostMemory | None = None, length: bool = True) -> None:
        super().__init__(inner.min_draft, inner.max_draft)
        self.inner, self.base, self.source, self.refine = inner, costs.monotone(), source, refine
        self.length = length
        self.hidden_layers = inner.hidden_layers
        self.draft_features = inner.draft_features
        self.needs_soft = inner.needs_soft
        self.needs_target_state = inner.needs_target_state
        self.needs_target_hidden = inner.needs_target_hidden
        self.greedy_only = inner.greedy_only
        self.check_seconds = inner.check_seconds
        self.memory = memory or CostMemory()
        self.calibrator = self.memory.calibrator
        self.reset()

    def reset(self) -> None:
        self.inner.reset()
        self.scale_d = self.scale_t = 1.0
        self.costs = self.base
        self.rounds = self.zero_rounds = 0
        #: this generation's own verdicts per draft position (:meth:`gen_alpha`): ``[accepted, trials]``
        self.gen_counts = [[0, 0] for _ in range(len(self.memory.hits))]
        self._new_round()

    def _new_round(self) -> None:
        self.spent = 0.0  # drafting seconds of this round so far (as the cost model counts them) ...
        self.counted = 0  # ... for its first ``counted`` tokens
        self.S: list[float] = []
        self.raw: list[float | None] = []
        self.declined = False  # the rule itself declined the round's first token (CostMemory.fade)

    @property
    def alpha(self) -> float:
        """The running acceptance of the first draft token."""
        return self.memory.alpha(1)

    def _survival(self, state: DraftState) -> None:
        """Extend ``S`` (and the raw scores ``raw``, ``None`` where the policy has none) to ``state.n`` entries;
        positions the loop did not ask about (below ``min_draft``) get the score of the first one asked. The
        wrapped policy is asked only where ``S`` is short (a layer's score costs a check)."""
        if len(self.S) >= state.n:
            return
        raw = self.inner.survival(state)
        while len(self.S) < state.n:
            i = len(self.S) + 1
            self.raw.append(raw)
            prev = self.S[-1] if self.S else 1.0
            self.S.append(prev * self.memory.alpha(i) if raw is None else min(prev, self.calibrator(raw)))

    def should_continue(self, state: DraftState) -> bool:
        if not self.inner.should_continue(state):
            return False
        self._survival(state)
        n = state.n
        if n > self.counted:  # tokens drafted below min_draft, without asking
            self.spent += (n - self.counted) * (self.costs.draft + self.costs.policy_per_check)
        go = not self.length or self._pays(state)
        if go:
            self.spent += (0.0 if state.next_is_free else self.costs.draft) + self.costs.policy_per_check
        self.counted = n + go
        return go

    def _pays(self, state: DraftState) -> bool:
        """Does ``d_{n+1}`` pay (:func:`gain_pays`; the first of a round also its catch-up, :func:`catch_up_pays`)?"""
        n = state.n
        exact = self.inner.survival_next(state)
        ahead = self.inner.survival_ahead(state) if exact is None else None
        S_n = self.S[-1] if n else 1.0
        S_prev = self.S[-2] if n > 1 else 1.0
        if exact is not None:
            S_next = exact
        elif ahead is not None:  # the policy scores d_{n+1} before it is drafted: calibrated like its survival
            S_next = min(S_n, self.calibrator(ahead))
        elif n == 0 or self.raw[-1] is None:  # no score: the learned acceptance of the next position
            S_next = S_n * self.memory.alpha(n + 1)
        else:  # the last token's conditional acceptance, carried one step on
            S_next = S_n * min(1.0, S_n / S_prev if S_prev > 0 else 0.0)
        go = gain_pays(self.S, S_next, self.costs, self.spent, state.next_is_free)
        if go and n == 0 and state.catch_up and not catch_up_pays(S_next, self.costs, state.catch_up,
                                                                   state.remaining):
            go = False
        self.declined = n == 0 and not go
        return go

    #: weight (in rounds) of the decoder's acceptance against this generation's own in :meth:`gen_alpha`
    GEN_WEIGHT = 4.0

    def gen_alpha(self, i: int) -> float:
        """``α_i`` of this generation: its own verdicts at draft position ``i``, shrunk towards the decoder's
        (:meth:`CostMemory.alpha`) with weight :attr:`GEN_WEIGHT` rounds."""
        a, c = self.gen_counts[min(max(i, 1), len(self.gen_counts) - 1)]
        return (a + self.GEN_WEIGHT * self.memory.alpha(i)) / (c + self.GEN_WEIGHT)

    def draft_rate(self, catch_up: int = 0, remaining: int = 0) -> float:
        """Expected committed tokens per second of a round that runs the draft model: the best over ``γ`` (within
        the wrapped policy's bound and the ``remaining`` tokens; 0 is plain decoding) of ``E_γ / T_γ`` with
        ``S_i = Π_{j<=i} α_j`` from this generation's acceptance (:meth:`gen_alpha`) and ``T_γ`` the round's priced
        seconds. The draft's reading of
        ``catch_up`` committed tokens it has not seen (``catch_up · c_pre``, as :func:`catch_up_pays` prices it) is
        a one-time cost: the round carries its share over the ``remaining`` tokens the generation may emit
        (``E_γ / remaining`` of it; all of it where ``remaining`` is unknown)."""
        c = self.costs
        once = catch_up * c.draft_prefill if catch_up > 0 else 0.0
        best = 1.0 / c.target_cost(1)
        S = E = 1.0
        most = min(self.max_draft, self.MAX_BRANCH, remaining - 1 if remaining > 0 else self.MAX_BRANCH)
        for g in range(1, most + 1):
            S *= self.gen_alpha(g)
            E += S
            share = once * min(1.0, E / remaining) if remaining > 0 else once
            best = max(best, E / (share + g * (c.draft + c.policy_per_check) + c.target_cost(g + 1)))
        return best

    def phrase_rate(self, accept: list[float]) -> tuple[int, float]:
        """A round that verifies a phrase alone, without the draft model: ``accept[j - 1]`` the chance that its
        first ``j`` tokens are all accepted. Returns the ``L`` (>= 1) of its tokens to score with the best expected
        committed tokens per second, ``(1 + Σ_{j<=L} accept) / c_t(1 + L)``, and that rate (``(0, 0.0)``: no
        phrase)."""
        best, best_rate, E = 0, 0.0, 1.0
        for L, a in enumerate(accept[: self.MAX_BRANCH], 1):
            E += a
            rate = E / self.costs.target_cost(1 + L)
            if rate > best_rate:
                best, best_rate = L, rate
        return best, best_rate

    def branch_room(self, drafted: int, yield_: float | None = None) -> int:
        """Candidate-branch tokens (Ouroboros) pay like draft tokens: the ``b`` that maximises the round's expected
        throughput ``(E_γ + S_γ · y · b) / (T_γ + c_tree(γ + 1 + b) - c_t(γ + 1))``, where a branch token is
        only read when all ``γ`` draft tokens survive (``S_γ``) and then yields ``y`` accepted tokens (learned
        from the verdicts, :meth:`CostMemory.branch_yield`); 0 when no ``b`` beats none (where verification costs
        ``∝ k``, or a tree forward takes a dearer kernel). Nothing drafted (``γ = 0``, a phrase pool's
        continuation of the committed text): ``E = 1``, ``T = c_t(1)``, every branch read, its yield learnt apart
        (:meth:`CostMemory.pool_yield`); the wrapped policy's bound does not apply (it prices nothing here).
        ``yield_``: the drafter's own estimate of ``y`` for these branches (this generation's evidence,
        :class:`pacer.drafters.sources.SourceEvidence`), in place of the learnt one."""
        if drafted <= 0:
            E, base = 1.0, self.costs.target_cost(1)
            y = self.memory.pool_yield() if yield_ is None else yield_
            return self._best_branch(E, base, base, y, 1, self.MAX_BRANCH)
        cap = min(self.inner.branch_room(drafted), self.MAX_BRANCH)
        S = self.S[:drafted] + [self.S[-1] if self.S else 1.0] * (drafted - len(self.S))
        E = 1.0 + sum(S)
        k = drafted + 1
        base = self.costs.target_cost(k)
        T = max(self.spent, drafted * (self.costs.draft + self.costs.policy_per_check)) + base
        y = self.memory.branch_yield() if yield_ is None else yield_
        return self._best_branch(E, T, base, S[-1] * y, k, cap)

    def _best_branch(self, E: float, T: float, base: float, gain: float, k: int, cap: int) -> int:
        """The ``b <= cap`` maximising ``(E + gain · b) / (T + c_tree(k + b) - base)`` (0: none beats the round)."""
        best, best_rate = 0, E / T
        for b in range(1, cap + 1):
            rate = (E + gain * b) / (T + self.costs.tree_cost(k + b) - base)
            if rate > best_rate:
                best, best_rate = b, rate
        return best

    #: the most candidate-branch tokens one verification may score
    MAX_BRANCH = 16

    def sibling_room(self, state: DraftState, hits: list[float]) -> list[int]:
        """Sibling branches pay like draft tokens: the sibling of ``d_{i+1}`` yields a token with probability
        ``(S_i - S_{i+1}) · hits[i]`` (the round's first rejection is at ``d_{i+1}``, calibrated survival ``S``,
        and the target's token is the sibling); the ``b`` likeliest are scored when
        ``(E_γ + Σ gains) / (T_γ + c_tree(γ + 1 + b) - c_t(γ + 1))`` beats the round without them (nothing where
        verification costs ``∝ k``)."""
        drafted = state.n
        if drafted <= 0:
            return []
        S = [1.0] + self.S[:drafted] + [self.S[-1] if self.S else 1.0] * (drafted - len(self.S))
        E = sum(S)
        k = drafted + 1
        base = self.costs.target_cost(k)
        T = max(self.spent, drafted * (self.costs.draft + self.costs.policy_per_check)) + base
        gains = sorted((((S[i] - S[i + 1]) * h, i) for i, h in enumerate(hits[:drafted])), reverse=True)
        best, best_rate, total = 0, E / T, 0.0
        for b, (g, _) in enumerate(gains[: self.MAX_BRANCH], start=1):
            total += g
            rate = (E + total) / (T + self.costs.tree_cost(k + b) - base)
            if rate > best_rate:
                best, best_rate = b, rate
        return [i for g, i in gains[:best] if g > 0]

    def phrase_room(self, fed: int, accept: list[float]) -> int:
        """A phrase (Ouroboros) pays like a draft token: the draft checks ``L`` phrase tokens in the forward that
        reads its ``fed`` unread tokens, for ``c_d(fed + L) - c_d(fed)`` more, and each phrase token it agrees with
        saves a draft forward of its own (``c_d(1)``). ``accept[j]``: the chance that the draft agrees with phrase
        token ``j + 1`` given the ones before (learned by the drafter). Returns the ``L`` with the largest expected
        saving, 0 when none saves (a dear draft curve, or phrases the draft rarely agrees with)."""
        c1, base = self.costs.draft_cost(1), self.costs.draft_cost(max(fed, 1))
        best, best_gain, expect, survive = 0, 0.0, 0.0, 1.0
        for L, a in enumerate(accept, 1):
            survive *= a
            expect += survive
            gain = expect * c1 - (self.costs.draft_cost(max(fed, 1) + L) - base)
            if gain > best_gain:
                best, best_gain = L, gain
        return min(best, self.inner.phrase_room(fed, accept))

    def update(self, state: DraftState, result: RoundResult) -> None:
        γ, n = result.drafted, result.accepted
        if γ:  # before the wrapped policy forgets the round (a layer's memo of the draft it has read)
            self._survival(state)
            self.memory.update(self.raw, γ, n)
            for i in range(1, min(n + 1, γ, len(self.gen_counts) - 1) + 1):  # as CostMemory.update counts
                self.gen_counts[i][1] += 1
                self.gen_counts[i][0] += i <= n
        elif self.declined:
            self.memory.fade()
        self.inner.update(state, result)
        if result.branched and n == γ:  # the branches were read: what they yielded
            (self.memory.branch_update if γ else self.memory.pool_update)(result.branched, result.extended)
        self.rounds += 1
        self.zero_rounds += γ == 0
        if self.rounds > 1 and self.refine:
            r = self.refine
            if result.draft_forwards and result.draft_seconds > 0 and self.base.draft > 0:
                obs = result.draft_seconds / result.draft_forwards / self.base.draft
                self.scale_d += r * (min(4.0, max(0.25, obs)) - self.scale_d)
            if result.verify_seconds > 0 and result.scored:
                obs = result.verify_seconds / self.base.target_cost(result.scored)
                self.scale_t += r * (min(4.0, max(0.25, obs)) - self.scale_t)
            self.costs = self.base.scaled(self.scale_d, self.scale_t)
        self._new_round()

    def prefilled(self, committed: int) -> None:
        self.inner.prefilled(committed)

    def prepare(self, greedy: bool) -> None:
        """Sampling: decide from the calibration only (no refinement from timings), so that a seeded sample is
        reproducible."""
        self.inner.prepare(greedy)
        if not greedy:
            self.refine = 0.0

    @property
    def needs_reference(self) -> bool:
        return self.inner.needs_reference

    def set_reference(self, agree: list[bool]) -> None:
        self.inner.set_reference(agree)

    def cost_report(self) -> CostReport:
        return CostReport(self.costs.to_dict(), self.alpha, self.zero_rounds, self.rounds, self.calibrator.error,
                          self.calibrator.observations, self.source, length=self.length)

    def report(self) -> dict[str, dict]:
        return {**self.inner.report(), "cost_aware": self.cost_report().to_dict()}

    def describe(self) -> str:
        return f"cost-aware({self.inner.describe()})" if self.length else f"{self.inner.describe()}, extras priced"
