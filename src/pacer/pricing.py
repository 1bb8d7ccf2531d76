"""What a round costs on this machine and what it is expected to yield: the one place that prices rounds.

A :class:`Pricer` is built once per generation from the costs (:class:`pacer.costs.Costs`: a calibration of this
machine or another machine's profile) and handed to the cost-aware length rule
(:class:`pacer.policies.cost_aware.CostAwarePolicy`) and to every drafter. It answers:

* **length** - does one more draft token raise the round's expected throughput (:meth:`Pricer.next_pays`), and does
  the draft's catch-up pay (:meth:`Pricer.catch_up_pays`)? The cost rule asks it token by token;
* **sources** - the expected committed tokens per second of a draft round (:meth:`Pricer.draft_rate`) and of a round
  that verifies a phrase alone (:meth:`Pricer.phrase_rate`): a phrase drafter chooses between them;
* **extras** - how many phrase tokens a draft forward may check (:meth:`Pricer.phrase_room`), candidate-branch
  tokens the target may score (:meth:`Pricer.branch_room`) and which siblings (:meth:`Pricer.sibling_room`).

What a round is expected to yield comes from what the verifier said: the acceptance the rule learns for a method on a
pair (:class:`CostMemory`, kept across a decoder's generations; the survival calibrator, the per-position acceptance,
what branches yielded), this generation's own acceptance (:meth:`Pricer.gen_alpha`) and, from a drafter, its own
evidence of a source (:class:`pacer.drafters.sources.SourceEvidence`) passed as an argument.

Without a cost model (a literal rule: fixed ``γ``, a threshold, with nothing to price) the drafters get
:data:`UNPRICED`, which never runs a phrase round, puts no bound on a draft round's extras and scores no branch in
a round that drafts nothing.

Terms: ``S_i`` is the probability that ``d_1..d_i`` are all accepted (``S_0 = 1``); a round that drafted ``n``
tokens is expected to yield ``E_n = 1 + Σ_{i<=n} S_i`` tokens in ``T_n = n (c_d + c_p) + c_t(n + 1)`` seconds
(:mod:`pacer.costs` for ``c_d``, ``c_t``, ``c_p``, ``c_tree``, ``c_pre``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .costs import ContextCosts, Costs
from .rounds import DraftState, RoundResult

if TYPE_CHECKING:
    from .policies.base import DraftPolicy


def token_seconds(costs: Costs, free: bool = False) -> float:
    """``c_d + c_p``: the drafting seconds of one draft token (``free``: it came with a phrase, no draft forward of
    its own: ``c_p``)."""
    return (0.0 if free else costs.draft) + costs.policy_per_check


def round_seconds(costs: Costs, n: int, spent: float | None = None, at_least: bool = False,
                  checks: int | None = None) -> float:
    """``T_n = n (c_d + c_p) + c_t(n + 1)``: the seconds of a round that drafted ``n`` tokens (the one place this
    formula is written). ``spent``: the round's drafting seconds as counted instead of ``n (c_d + c_p)``
    (``at_least``: never below it); ``checks``: the policy checks made, where not one a token
    (``n c_d + checks c_p``)."""
    drafting = n * token_seconds(costs) if checks is None else \
        n * costs.draft + checks * costs.policy_per_check
    if spent is not None:
        drafting = max(spent, drafting) if at_least else spent
    return drafting + costs.target_cost(n + 1)


def round_value(costs: Costs, S: list[float], spent: float | None = None,
                at_least: bool = False) -> tuple[float, float]:
    """``(E_n, T_n)`` of a round that drafted ``n = len(S)`` tokens with survivals ``S = [S_1..S_n]``:
    ``E_n = 1 + Σ S_i`` expected tokens in :func:`round_seconds`."""
    return sum(S, 1.0), round_seconds(costs, len(S), spent, at_least)


def _gain_pays(E: float, T: float, n: int, S_next: float, costs: Costs, free: bool) -> bool:
    """:func:`gain_pays` on a round of ``n`` drafted tokens already valued at ``(E, T)``."""
    dT = token_seconds(costs, free) + costs.target_cost(n + 2) - costs.target_cost(n + 1)
    return S_next * T >= E * dT


def gain_pays(S: list[float], S_next: float, costs: Costs, spent: float | None = None, free: bool = False) -> bool:
    """Does drafting ``d_{n+1}`` raise the round's expected throughput? ``S`` = ``[S_1..S_n]``, ``S_next`` =
    ``S_{n+1}`` (see the module docstring for the terms). ``spent``: the round's drafting seconds so far (default
    ``n (c_d + c_p)``); ``free``: ``d_{n+1}`` needs no draft forward (it came with a phrase), only ``c_p``."""
    E, T = round_value(costs, S, spent)
    return _gain_pays(E, T, len(S), S_next, costs, free)


def catch_up_pays(S_1: float, costs: Costs, catch_up: int, remaining: int) -> bool:
    """Before the first draft token of a round the draft must read ``catch_up`` committed tokens it has not seen
    (the prompt, the first time; the tokens of plain rounds since): a one-time ``C = catch_up · c_pre``. Drafting
    from now on saves per emitted token ``s = c_t(1) - T_1 / E_1`` (one-token rounds: ``E_1 = 1 + S_1``,
    ``T_1 = c_d + c_p + c_t(2)``; longer drafts save more, so this is conservative), over the ``remaining`` tokens
    the generation may still emit. It pays when ``remaining · s > C``; with ``remaining`` unknown (0) the catch-up
    is not counted."""
    if remaining <= 0 or costs.draft_prefill <= 0:
        return True
    E1, T1 = round_value(costs, [S_1])
    saving = costs.target_cost(1) - T1 / E1
    return remaining * saving > catch_up * costs.draft_prefill


def batch_lengths(S_rows: list[list[float]], costs: Costs, decoding: int | None = None) -> list[int]:
    """Each row's draft length: greedily the next draft token with the highest survival, while
    :func:`gain_pays` says it raises the batch's expected tokens per second.
    ``S_rows[r]``: row ``r``'s ``S_1..S_γ`` (non-increasing); ``decoding``: rows the forward scores one token for
    anyway (default: all rows).

    The batch as one round for ``gain_pays``: the ``B - 1`` other rows' certain tokens are survivals of 1, so
    ``E = 1 + (B - 1) + Σ S = B + Σ S`` and ``c_t(n + 1) = c_t(B + D)`` with ``D`` the drafted tokens: the forward that
    scores every row. Looked-up tokens are free (no draft forward)."""
    B = len(S_rows) if decoding is None else decoding
    lengths = [0] * len(S_rows)
    if B < 1:
        return lengths
    S_all = [1.0] * (B - 1)
    c_p = costs.policy_per_check
    while True:
        best, r_best = -1.0, -1
        for r, S in enumerate(S_rows):
            if lengths[r] < len(S) and S[lengths[r]] > best:
                best, r_best = S[lengths[r]], r
        if r_best < 0 or best <= 0.0:
            return lengths
        drafted = len(S_all) - (B - 1)
        if not gain_pays(S_all, best, costs, spent=drafted * c_p, free=True):
            return lengths
        S_all.append(best)
        lengths[r_best] += 1


#: a typical per-token acceptance of the default pair: on the shipped layer's 1,987 held-out validation rounds,
#: the best fixed draft length (3 tokens) yields 2.75 tokens a round (the checkpoint's ``best_fixed_predicted_speedup``
#: 1.985x on its costs), which a constant acceptance of 0.75 gives (``tests/test_costs.py`` derives it again)
TYPICAL_ACCEPTANCE = 0.75


def predicted_round(costs: Costs, alpha: float = TYPICAL_ACCEPTANCE, max_draft: int = 16) -> tuple[int, float]:
    """What the rule expects of a round where every draft token is accepted with probability ``alpha``
    (``S_i = alpha^i``): the draft length it chooses (:func:`gain_pays`, token by token, at most ``max_draft``) and
    the predicted speedup of such rounds over plain decoding, ``E_n / T_n · c_t(1)`` (1.0 where it drafts
    nothing: every round a plain decoding step). Prefills and catch-ups are left out."""
    n, E = 0, 1.0  # the round so far, extended token by token (E kept as it goes: linear in max_draft)
    while n < max_draft and _gain_pays(E, round_seconds(costs, n), n, alpha ** (n + 1), costs, False):
        n, E = n + 1, E + alpha ** (n + 1)
    if not n:
        return 0, 1.0
    return n, E / round_seconds(costs, n) * costs.target_cost(1)


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

    def fresh(self) -> CostMemory:
        """A memory as this one began: the same prior, nothing learnt."""
        return CostMemory(self.alpha0, self.prior, len(self.hits) - 1)

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
    """What pricing saw in one generation (``GenerationResult.extra["cost_aware"]``): the costs, the learnt
    acceptance and calibration, and (the cost-aware rule's) the rounds it left undrafted."""

    costs: dict
    alpha: float
    zero_rounds: int = 0
    rounds: int = 0
    calibration_error: float = float("nan")
    calibration_observations: int = 0
    source: str = ""
    notes: list[str] = field(default_factory=list)
    #: the cost rule decided the draft length (``False``: a literal rule did, and the pricer priced the extras alone)
    length: bool = True

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["calibration_error"] = None if math.isnan(self.calibration_error) else round(self.calibration_error, 4)
        d["alpha"] = round(self.alpha, 4)
        return d


class Pricer:
    """No cost model: what a drafter gets where no rule prices rounds. A draft round's extras are unbounded, a
    round that drafts nothing scores no branch, no phrase round runs, and siblings go likeliest first by the
    draft's own survival. :class:`CostPricer` prices all of them on measured costs."""

    #: rounds are priced (``False``: this unpriced base)
    priced = False

    def begin(self, greedy: bool) -> None:
        """A new generation in its decoding mode (``greedy``: temperature 0; the loop says so before its first
        token)."""

    def set_context(self, context: int) -> None:
        """The next round runs after ``context`` committed tokens: price it there (the loop says so before every
        round)."""

    def drafting(self, policy: DraftPolicy, state: DraftState) -> None:
        """``policy`` agreed to draft ``d_{n+1}`` after the round's ``state.n`` tokens (the drafter's handshake,
        :class:`pacer.decoding.drafter.Proposal`, says so)."""

    def learn(self, policy: DraftPolicy, state: DraftState, result: RoundResult) -> None:
        """The round ``state`` that ``policy`` drafted was verified: ``result`` (the loop says so before the policy
        hears it)."""

    def summary(self) -> dict[str, dict]:
        """What pricing saw in the generation, for ``GenerationResult.extra`` (nothing: no cost model)."""
        return {}

    def draft_rate(self, catch_up: int = 0, remaining: int = 0) -> float | None:
        """Expected committed tokens per second of a round that runs the draft model, its reading of ``catch_up``
        committed tokens it has not seen included (``None``: no cost model, no such estimate)."""
        return None

    def phrase_rate(self, accept: list[float]) -> tuple[int, float]:
        """How many tokens of a phrase to verify alone in a round without the draft model, and that round's
        expected committed tokens per second, from ``accept[j - 1]``, the chance that its first ``j`` tokens are
        all accepted (``(0, 0.0)``: never without a cost model)."""
        return 0, 0.0

    def branch_room(self, drafted: int, yield_: float | None = None) -> int:
        """How many candidate-branch tokens (Ouroboros) the target may score after a draft of ``drafted`` tokens;
        ``yield_``: the drafter's estimate of the accepted tokens per branch token (``None``: the learnt one).
        Unbounded after a draft; none after a draft of nothing."""
        return 1 << 30 if drafted > 0 else 0

    def sibling_room(self, state: DraftState, hits: list[float]) -> list[int]:
        """Which draft positions get a sibling branch (greedy): ``i`` - the draft's second choice for ``d_{i+1}``,
        scored beside it; ``hits[i]``: the drafter's estimate that the target picks that token once ``d_{i+1}`` is
        rejected. Every position, likeliest first by the draft's own survival."""
        surv, gains = 1.0, []
        for i, h in enumerate(hits):
            gains.append((surv * (1.0 - state.prob[i]) * h, i))
            surv *= state.prob[i]
        return [i for g, i in sorted(gains, reverse=True) if g > 0]

    def phrase_room(self, fed: int, accept: list[float]) -> int:
        """How many phrase tokens (Ouroboros) the draft may check in a forward that reads ``fed`` unread tokens,
        given ``accept[j]``, the chance it agrees with phrase token ``j + 1`` after the ones before: all of them."""
        return len(accept)


#: the pricer of a generation without a cost model (stateless: shared)
UNPRICED = Pricer()


class CostPricer(Pricer):
    """Prices rounds on ``costs`` (made non-decreasing in ``k``: :meth:`pacer.costs.Costs.monotone`) with what the
    verifier taught ``memory`` and this generation's own acceptance. Built by the method factory (its
    ``make_pricer``) and handed to the loop, which begins each generation (:meth:`begin`), prices each round at its
    context (:meth:`set_context`), hands it to the drafter and tells it what the verifier said (:meth:`learn`);
    the drafter's handshake and the cost rule tell it the round in progress (:meth:`drafting`): every question
    about a round is answered on the same numbers.

    ``refine``: after every round (but a generation's first, which holds the draft's prefill) the measured draft time
    per token and target time update running averages (weight ``refine``, clipped to [1/4, 4]) that scale ``c_d``
    and the ``c_t`` curve; 0 keeps the given costs. ``max_draft``: the length rule's longest draft."""

    priced = True
    #: the most candidate-branch tokens one verification may score
    MAX_BRANCH = 16
    #: weight (in rounds) of the decoder's acceptance against this generation's own in :meth:`gen_alpha`
    GEN_WEIGHT = 4.0

    def __init__(self, costs: Costs | ContextCosts, memory: CostMemory | None = None, refine: float = 0.0,
                 max_draft: int = 16, source: str = "") -> None:
        self.curve = costs if isinstance(costs, ContextCosts) else ContextCosts.fixed(costs)
        self.memory, self.max_draft, self.source = memory or CostMemory(), max_draft, source
        self.shared_memory = self.memory  # the decoder's, kept and extended by greedy generations
        self.refine_greedy = self.refine = refine
        self.reset()

    def begin(self, greedy: bool) -> None:
        """A new generation (:meth:`reset`); a sampled one unrefined, from a fresh memory (a seed reproduces)."""
        self.refine = self.refine_greedy if greedy else 0.0
        self.memory = self.shared_memory if greedy else self.shared_memory.fresh()
        self.reset()

    # --------------------------------------------------------------------------------------- a generation
    def reset(self) -> None:
        """A new generation: the given costs again, no acceptance of its own yet."""
        self.scale_d = self.scale_t = 1.0
        self.context = 0
        #: the costs at this round's context as given (:attr:`costs`: refined by this generation's timings)
        self.base = self.costs = self.curve.costs(0)
        self.rounds = 0
        self._learnt: DraftState | None = None  # the round last learnt (each is learnt once, whoever tells it)
        #: this generation's own verdicts per draft position (:meth:`gen_alpha`): ``[accepted, trials]``
        self.gen_counts = [[0, 0] for _ in range(len(self.memory.hits))]
        self.start_round()

    def set_context(self, context: int) -> None:
        """Price the next round at ``context`` (every forward of it: the target's chain and tree, the draft's
        forwards and its catch-up), refined by this generation's timings as before."""
        self.context = context
        base = self.curve.costs(context)
        if base is not self.base:
            self.base = base
            self.costs = base if self.scale_d == self.scale_t == 1.0 else base.scaled(self.scale_d, self.scale_t)

    def start_round(self) -> None:
        """A new round: nothing drafted, nothing spent (:meth:`drafted` fills the round: ``S_1..S_n``, the
        policy's raw scores at them, the drafting seconds ``spent`` over the ``counted`` tokens)."""
        self.S: list[float] = []
        self.raw: list[float | None] = []
        self.spent, self.counted = 0.0, 0
        self.declined = False  # the cost rule declined the round's first token (CostMemory.fade)

    def drafted(self, policy: DraftPolicy, state: DraftState) -> None:
        """The round drafted ``state.n`` tokens under ``policy``: ``S`` reaches ``n`` entries, each its calibrated
        :meth:`~pacer.policies.base.DraftPolicy.survival` (asked only where ``S`` is short: a layer's score costs a
        check; ``S_{i-1} α_i`` without one); the tokens not yet counted are spent."""
        if len(self.S) < state.n:
            raw = policy.survival(state)
            while len(self.S) < state.n:
                self.raw.append(raw)
                prev = self.S[-1] if self.S else 1.0
                self.S.append(prev * self.alpha(len(self.S) + 1) if raw is None
                              else min(prev, self.memory.calibrator(raw)))
        if state.n > self.counted:  # tokens drafted below min_draft, without asking: c_d + c_p each
            self.spent += (state.n - self.counted) * token_seconds(self.costs)
            self.counted = state.n

    def drafting(self, policy: DraftPolicy, state: DraftState) -> None:
        """:meth:`drafted`, and ``d_{n+1}`` is spent (``c_p`` alone where it is free); once per token, whoever
        tells it (the cost rule deciding, the drafter's handshake)."""
        self.drafted(policy, state)
        if self.counted <= state.n:
            self.spent += token_seconds(self.costs, free=state.next_is_free)
            self.counted = state.n + 1

    def decline(self) -> None:
        """The cost rule declined the round's first token (the memory fades when the round is learnt)."""
        self.declined = True

    def learn(self, policy: DraftPolicy, state: DraftState, result: RoundResult) -> None:
        """What the verified round ``state`` of ``policy`` teaches (once, whoever tells it): the verdicts per draft
        position (with the policy's survival scores at them, for the calibrator: :meth:`drafted`), what its
        branches yielded, and - unless ``refine`` is 0 - how long its forwards took; a round the cost rule
        declined (:meth:`decline`) fades the memory."""
        if state is self._learnt:
            return
        self._learnt = state
        γ, n = result.drafted, result.accepted
        if γ:
            self.drafted(policy, state)
            self.memory.update(self.raw, γ, n)
            for i in range(1, min(n + 1, γ, len(self.gen_counts) - 1) + 1):  # as CostMemory.update counts
                self.gen_counts[i][1] += 1
                self.gen_counts[i][0] += i <= n
        elif self.declined:
            self.memory.fade()
        if result.branched and n == γ:  # the branches were read: what they yielded
            (self.memory.branch_update if γ else self.memory.pool_update)(result.branched, result.extended)
        self.rounds += 1
        if self.rounds > 1 and self.refine:
            self.scale_d, self.scale_t = refined_scales(self.base, result, self.refine, self.scale_d, self.scale_t)
            self.costs = self.base.scaled(self.scale_d, self.scale_t)
        self.start_round()

    # ------------------------------------------------------------------------------------------- length
    def next_pays(self, S_next: float, free: bool = False) -> bool:
        """Does drafting ``d_{n+1}`` (survival ``S_next``) raise the round's expected throughput
        (:func:`gain_pays` on the round so far)?"""
        return gain_pays(self.S, S_next, self.costs, self.spent, free)

    def catch_up_pays(self, S_1: float, catch_up: int, remaining: int) -> bool:
        """Does the draft's reading of ``catch_up`` committed tokens pay before the round's first draft token
        (:func:`catch_up_pays`)?"""
        return catch_up_pays(S_1, self.costs, catch_up, remaining)

    def alpha(self, i: int = 1) -> float:
        """``α_i`` the decoder learnt for this method (:meth:`CostMemory.alpha`)."""
        return self.memory.alpha(i)

    def gen_alpha(self, i: int) -> float:
        """``α_i`` of this generation: its own verdicts at draft position ``i``, shrunk towards the decoder's
        (:meth:`CostMemory.alpha`) with weight :attr:`GEN_WEIGHT` rounds."""
        a, c = self.gen_counts[min(max(i, 1), len(self.gen_counts) - 1)]
        return (a + self.GEN_WEIGHT * self.memory.alpha(i)) / (c + self.GEN_WEIGHT)

    def summary(self) -> dict[str, dict]:
        """:func:`cost_report` of a literal rule's priced extras (the cost rule reports its own)."""
        return {"cost_aware": cost_report(self, length=False).to_dict()}

    # ---------------------------------------------------------------------------------- sources and extras
    def draft_rate(self, catch_up: int = 0, remaining: int = 0) -> float:
        """:func:`best_draft_rate` with this generation's acceptance (:meth:`gen_alpha`), up to the length rule's
        bound."""
        most = min(self.max_draft, self.MAX_BRANCH, remaining - 1 if remaining > 0 else self.MAX_BRANCH)
        return best_draft_rate(self.costs, [self.gen_alpha(g) for g in range(1, most + 1)], catch_up, remaining)

    def phrase_rate(self, accept: list[float]) -> tuple[int, float]:
        """:func:`best_phrase_rate` over at most :attr:`MAX_BRANCH` of the phrase's tokens."""
        return best_phrase_rate(self.costs, accept[: self.MAX_BRANCH])

    def branch_room(self, drafted: int, yield_: float | None = None) -> int:
        """Candidate-branch tokens (Ouroboros) pay like draft tokens: the ``b`` that maximises the round's expected
        throughput ``(E_γ + S_γ · y · b) / (T_γ + c_tree(γ + 1 + b) - c_t(γ + 1))``, where a branch token is
        only read when all ``γ`` draft tokens survive (``S_γ``) and then yields ``y`` accepted tokens (learned
        from the verdicts, :meth:`CostMemory.branch_yield`); 0 when no ``b`` beats none (where verification costs
        ``∝ k``, or a tree forward takes a dearer kernel). Nothing drafted (``γ = 0``, a phrase pool's
        continuation of the committed text): ``E = 1``, ``T = c_t(1)``, every branch read, its yield learnt apart
        (:meth:`CostMemory.pool_yield`).
        ``yield_``: the drafter's own estimate of ``y`` for these branches (this generation's evidence,
        :class:`pacer.drafters.sources.SourceEvidence`), in place of the learnt one."""
        if drafted <= 0:
            E, base = 1.0, self.costs.target_cost(1)
            y = self.memory.pool_yield() if yield_ is None else yield_
            return best_branch(self.costs, E, base, base, y, 1, self.MAX_BRANCH)
        S, E, T = self._drafted_round(drafted)
        y = self.memory.branch_yield() if yield_ is None else yield_
        k = drafted + 1
        return best_branch(self.costs, E, T, self.costs.target_cost(k), S[-1] * y, k, self.MAX_BRANCH)

    def _drafted_round(self, drafted: int) -> tuple[list[float], float, float]:
        """``(S, E, T)`` of this round once ``drafted`` tokens are out (positions the rule did not score carry the
        last survival on; the drafting seconds at least ``drafted (c_d + c_p)``)."""
        S = self.S[:drafted] + [self.S[-1] if self.S else 1.0] * (drafted - len(self.S))
        E, T = round_value(self.costs, S, self.spent, at_least=True)
        return S, E, T

    def sibling_room(self, state: DraftState, hits: list[float]) -> list[int]:
        """Sibling branches pay like draft tokens: the sibling of ``d_{i+1}`` yields a token with probability
        ``(S_i - S_{i+1}) · hits[i]`` (the round's first rejection is at ``d_{i+1}``, calibrated survival ``S``,
        and the target's token is the sibling); the ``b`` likeliest are scored when
        ``(E_γ + Σ gains) / (T_γ + c_tree(γ + 1 + b) - c_t(γ + 1))`` beats the round without them (nothing where
        verification costs ``∝ k``)."""
        drafted = state.n
        if drafted <= 0:
            return []
        drafted_S, E, T = self._drafted_round(drafted)
        S = [1.0, *drafted_S]
        gains = sorted((((S[i] - S[i + 1]) * h, i) for i, h in enumerate(hits[:drafted])), reverse=True)
        best = best_siblings(self.costs, E, T, [g for g, _ in gains[: self.MAX_BRANCH]], drafted + 1)
        return [i for g, i in gains[:best] if g > 0]

    def phrase_room(self, fed: int, accept: list[float]) -> int:
        """A phrase (Ouroboros) pays like a draft token: the draft checks ``L`` phrase tokens in the forward that
        reads its ``fed`` unread tokens, for ``c_d(fed + L) - c_d(fed)`` more, and each phrase token it agrees with
        saves a draft forward of its own (``c_d(1)``). ``accept[j]``: the chance that the draft agrees with phrase
        token ``j + 1`` given the ones before (learned by the drafter). Returns the ``L`` with the largest expected
        saving, 0 when none saves (a dear draft curve, or phrases the draft rarely agrees with)."""
        return best_phrase(self.costs, fed, accept)


def best_branch(costs: Costs, E: float, T: float, base: float, gain: float, k: int, cap: int) -> int:
    """The ``b <= cap`` maximising ``(E + gain · b) / (T + c_tree(k + b) - base)`` (0: none beats the round)."""
    best, best_rate = 0, E / T
    for b in range(1, cap + 1):
        rate = (E + gain * b) / (T + costs.tree_cost(k + b) - base)
        if rate > best_rate:
            best, best_rate = b, rate
    return best


def best_siblings(costs: Costs, E: float, T: float, gains: list[float], k: int) -> int:
    """How many of the sibling ``gains`` (likeliest first) maximise ``(E + Σ gains) / (T + c_tree(k + b) - c_t(k))``
    for a round of ``k`` chain tokens (0: none beats the round)."""
    base = costs.target_cost(k)
    best, best_rate, total = 0, E / T, 0.0
    for b, g in enumerate(gains, start=1):
        total += g
        rate = (E + total) / (T + costs.tree_cost(k + b) - base)
        if rate > best_rate:
            best, best_rate = b, rate
    return best


def best_phrase(costs: Costs, fed: int, accept: list[float]) -> int:
    """:meth:`CostPricer.phrase_room` on ``costs``: the ``L`` with the largest expected saving (0: none saves)."""
    c1, base = costs.draft_cost(1), costs.draft_cost(max(fed, 1))
    best, best_gain, expect, survive = 0, 0.0, 0.0, 1.0
    for L, a in enumerate(accept, 1):
        survive *= a
        expect += survive
        gain = expect * c1 - (costs.draft_cost(max(fed, 1) + L) - base)
        if gain > best_gain:
            best, best_gain = L, gain
    return best


def best_draft_rate(costs: Costs, alphas: list[float], catch_up: int = 0, remaining: int = 0) -> float:
    """Expected committed tokens per second of a round that runs the draft model: the best over ``γ <=
    len(alphas)`` (0 is plain decoding) of ``E_γ / T_γ`` with ``S_i = Π_{j<=i} alphas[j - 1]`` and ``T_γ`` the
    round's priced seconds. The draft's reading of ``catch_up`` committed tokens it has not seen (``catch_up ·
    c_pre``, as :func:`catch_up_pays` prices it) is a one-time cost: the round carries its share over the
    ``remaining`` tokens the generation may emit (``E_γ / remaining`` of it; all of it where ``remaining`` is
    unknown)."""
    once = catch_up * costs.draft_prefill if catch_up > 0 else 0.0
    best = 1.0 / costs.target_cost(1)
    S = E = 1.0
    for g, a in enumerate(alphas, 1):
        S *= a
        E += S
        share = once * min(1.0, E / remaining) if remaining > 0 else once
        best = max(best, E / (share + round_seconds(costs, g)))
    return best


def best_phrase_rate(costs: Costs, accept: list[float]) -> tuple[int, float]:
    """A round that verifies a phrase alone, without the draft model: ``accept[j - 1]`` the chance that its first
    ``j`` tokens are all accepted. Returns the ``L`` (>= 1) of its tokens to score with the best expected committed
    tokens per second, ``(1 + Σ_{j<=L} accept) / c_t(1 + L)``, and that rate (``(0, 0.0)``: no phrase)."""
    best, best_rate, E = 0, 0.0, 1.0
    for L, a in enumerate(accept, 1):
        E += a
        rate = E / costs.target_cost(1 + L)
        if rate > best_rate:
            best, best_rate = L, rate
    return best, best_rate


def cost_report(pricer: CostPricer, zero_rounds: int = 0, length: bool = True) -> CostReport:
    """What ``pricer`` saw in a generation; ``zero_rounds``: rounds the cost rule drafted nothing in, ``length``:
    the cost rule decided the draft length."""
    cal = pricer.memory.calibrator
    return CostReport(pricer.costs.to_dict(), pricer.alpha(1), zero_rounds, pricer.rounds, cal.error,
                      cal.observations, pricer.source, length=length)


def refined_scales(base: Costs, result: RoundResult, r: float, scale_d: float, scale_t: float) -> tuple[float, float]:
    """The running averages (weight ``r``) of the measured draft time per forward and target time of ``result``
    over ``base``'s, each observation clipped to [1/4, 4]: the scales of ``c_d`` and of the ``c_t`` curve."""
    if result.draft_forwards and result.draft_seconds > 0 and base.draft > 0:
        obs = result.draft_seconds / result.draft_forwards / base.draft
        scale_d += r * (min(4.0, max(0.25, obs)) - scale_d)
    if result.verify_seconds > 0 and result.scored:
        obs = result.verify_seconds / base.target_cost(result.scored)
        scale_t += r * (min(4.0, max(0.25, obs)) - scale_t)
    return scale_d, scale_t
