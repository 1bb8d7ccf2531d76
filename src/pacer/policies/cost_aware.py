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
catch-up (:func:`~pacer.pricing.catch_up_pays`: the prompt's prefill through the draft, the first time), against
what drafting saves over the tokens the generation may still emit.

Every cost and expected yield comes from the generation's :class:`~pacer.pricing.CostPricer` (the one place that
prices rounds; it also prices a drafter's phrases and branches); this rule decides the length from it.
"""

from __future__ import annotations

from ..costs import Costs
from ..pricing import CostMemory, CostPricer, CostReport, SurvivalCalibrator, cost_report
from ..rounds import DraftState, RoundResult
from .base import DraftPolicy


class CostAwarePolicy(DraftPolicy):
    """Wraps a policy: drafting goes on only while the wrapped policy wants to *and* the next token pays on this
    machine's costs (:meth:`pacer.pricing.CostPricer.next_pays`). The wrapped policy's bounds, hidden layers,
    survival score and updates pass through. ``costs``: the generation's :class:`~pacer.pricing.CostPricer`, or the
    costs to build one from (with ``source``, ``refine`` and ``memory``, :class:`~pacer.pricing.CostPricer`'s).
    A literal rule (a threshold, a fixed ``γ``) is not wrapped: the pricer the loop and the drafter receive prices
    its extras alone."""

    name = "cost-aware"

    def __init__(self, inner: DraftPolicy, costs: Costs | CostPricer, source: str = "", refine: float = 0.2,
                 memory: CostMemory | None = None) -> None:
        super().__init__(inner.min_draft, inner.max_draft)
        self.inner = inner
        self.pricer = costs if isinstance(costs, CostPricer) else \
            CostPricer(costs, memory, refine, inner.max_draft, source)
        self.hidden_layers = inner.hidden_layers
        self.draft_features = inner.draft_features
        self.needs_soft = inner.needs_soft
        self.needs_target_state = inner.needs_target_state
        self.needs_target_hidden = inner.needs_target_hidden
        self.greedy_only = inner.greedy_only
        self.check_seconds = inner.check_seconds
        self.reset()

    @property
    def costs(self) -> Costs:
        """The costs the rule decides on now (the pricer's, refined by this generation's timings)."""
        return self.pricer.costs

    @property
    def memory(self) -> CostMemory:
        return self.pricer.memory

    @property
    def shared_memory(self) -> CostMemory:
        """The decoder's memory of this method, kept across its greedy generations (a sampled one starts afresh:
        :meth:`pacer.pricing.CostPricer.begin`)."""
        return self.pricer.shared_memory

    @property
    def calibrator(self) -> SurvivalCalibrator:
        return self.pricer.memory.calibrator

    def reset(self) -> None:
        self.inner.reset()
        self.pricer.reset()
        self.zero_rounds = 0

    @property
    def alpha(self) -> float:
        """The running acceptance of the first draft token."""
        return self.pricer.alpha(1)

    def survival(self, state: DraftState) -> float | None:
        return self.inner.survival(state)

    def should_continue(self, state: DraftState) -> bool:
        if not self.inner.should_continue(state):
            return False
        self.pricer.drafted(self.inner, state)
        go = self._pays(state)
        if go:
            self.pricer.drafting(self.inner, state)
        return go

    def _pays(self, state: DraftState) -> bool:
        """Does ``d_{n+1}`` pay (:meth:`~pacer.pricing.CostPricer.next_pays`; the first of a round also its
        catch-up, :meth:`~pacer.pricing.CostPricer.catch_up_pays`)?"""
        n, S = state.n, self.pricer.S
        nxt = self.inner.survival_next(state)
        S_n = S[-1] if n else 1.0
        S_prev = S[-2] if n > 1 else 1.0
        if nxt is not None and self.inner.exact_survival:
            S_next = nxt
        elif nxt is not None:  # the policy scores d_{n+1} before it is drafted: calibrated like its survival
            S_next = min(S_n, self.calibrator(nxt))
        elif n == 0 or self.pricer.raw[-1] is None:  # no score: the learned acceptance of the next position
            S_next = S_n * self.pricer.alpha(n + 1)
        else:  # the last token's conditional acceptance, carried one step on
            S_next = S_n * min(1.0, S_n / S_prev if S_prev > 0 else 0.0)
        go = self.pricer.next_pays(S_next, state.next_is_free)
        if go and n == 0 and state.catch_up and not self.pricer.catch_up_pays(S_next, state.catch_up,
                                                                               state.remaining):
            go = False
        if n == 0 and not go:
            self.pricer.decline()
        return go

    def update(self, state: DraftState, result: RoundResult) -> None:
        self.pricer.learn(self.inner, state, result)  # before the wrapped policy forgets the round (a layer's memo)
        self.inner.update(state, result)
        self.zero_rounds += result.drafted == 0

    def prefilled(self, committed: int) -> None:
        self.inner.prefilled(committed)

    def prepare(self, greedy: bool) -> None:
        """Sampling: decide from the calibration only (no refinement from timings) and from the initial memory (a
        fresh :class:`CostMemory`, not what the decoder's earlier generations taught it, which greedy generations
        keep using and extending), so that a seeded sample is reproducible whatever ran before it on the decoder."""
        self.inner.prepare(greedy)
        self.pricer.begin(greedy)

    @property
    def needs_reference(self) -> bool:
        return self.inner.needs_reference

    def set_reference(self, agree: list[bool]) -> None:
        self.inner.set_reference(agree)

    def cost_report(self) -> CostReport:
        return cost_report(self.pricer, self.zero_rounds)

    def report(self) -> dict[str, dict]:
        return {**self.inner.report(), "cost_aware": self.cost_report().to_dict()}

    def describe(self) -> str:
        return f"cost-aware({self.inner.describe()})"
