"""The training-free draft-length rules: fixed ``γ`` (and prompt lookup's fixed rule, which scores survival by the
lookup's confidence), Hugging Face's heuristic schedule, and the draft's confidence, entropy and cumulative
probability (llama.cpp's ``--draft-p-min`` is the confidence rule)."""

from __future__ import annotations

import math

from ..errors import PacerError
from ..rounds import DraftState, RoundResult
from .base import DraftPolicy


class FixedPolicy(DraftPolicy):
    """Classic speculative decoding: always draft ``γ`` tokens."""

    name = "sd"
    draft_features = frozenset()

    def __init__(self, gamma: int = 4, min_draft: int | None = None, max_draft: int | None = None) -> None:
        if gamma <= 0:
            raise PacerError(f"gamma must be >= 1, got {gamma}")
        super().__init__(min_draft if min_draft is not None else 1, max_draft if max_draft is not None else gamma)
        self.gamma = gamma

    def should_continue(self, state: DraftState) -> bool:
        return state.n < self.gamma

    def describe(self) -> str:
        return f"sd(gamma={self.gamma})"


class LookupPolicy(FixedPolicy):
    """The fixed rule (at most ``γ`` looked-up tokens a round) whose survival score is the product of the lookup's
    confidences, for the cost-aware rule, which also sees the next token's confidence before it is drafted (a
    rule that only learned from drafted rounds would never start drafting where the prior does not pay)."""

    name = "lookup"

    def survival(self, state: DraftState) -> float | None:
        return math.prod(state.confidence) if state.confidence else None

    def survival_next(self, state: DraftState) -> float | None:
        if state.next_confidence is None:
            return None
        return math.prod(state.confidence) * state.next_confidence


class HeuristicPolicy(DraftPolicy):
    """Hugging Face's ``heuristic`` schedule: γ += 2 after a fully accepted round, γ -= 1 otherwise (bounded)."""

    name = "heuristic"
    draft_features = frozenset()

    def __init__(self, gamma: int = 5, min_draft: int = 1, max_draft: int = 16) -> None:
        super().__init__(min_draft, max_draft)
        self.initial = gamma
        self.gamma = gamma

    def reset(self) -> None:
        self.gamma = self.initial

    def should_continue(self, state: DraftState) -> bool:
        return state.n < self.gamma

    def update(self, state: DraftState, result: RoundResult) -> None:
        if result.drafted == 0:
            return
        step = 2 if result.accepted == result.drafted else -1
        self.gamma = min(self.max_draft, max(max(self.min_draft, 1), self.gamma + step))


class ConfidencePolicy(DraftPolicy):
    """Stop once the draft's top probability for the last token falls below ``threshold`` (HF-style; llama.cpp's
    ``--draft-p-min``). ``threshold=None``: no threshold; the survival proxy ``Π max q`` feeds the cost rule."""

    name = "confidence"
    draft_features = frozenset({"top_prob"})

    def __init__(self, threshold: float | None = 0.4, min_draft: int = 1, max_draft: int = 16) -> None:
        super().__init__(min_draft, max_draft)
        if threshold is not None and not 0.0 <= threshold <= 1.0:
            raise PacerError(f"{self.name} threshold must be in [0, 1], got {threshold}")
        self.threshold = threshold

    def should_continue(self, state: DraftState) -> bool:
        return state.n == 0 or self.threshold is None or state.top_prob[-1] >= self.threshold

    def survival(self, state: DraftState) -> float:
        return math.prod(state.top_prob)


class EntropyPolicy(DraftPolicy):
    """AdaEDL / SVIP-like: stop once the draft's entropy for the last token exceeds ``threshold`` (nats).

    AdaEDL bounds the acceptance probability from below by ``1 - sqrt(γ_e * H)``; stopping when that bound drops
    under ``λ`` is the same as stopping when ``H > (1 - λ)^2 / γ_e``, i.e. an entropy threshold.
    """

    name = "entropy"
    draft_features = frozenset({"entropy"})

    def __init__(self, threshold: float | None = 1.0, min_draft: int = 1, max_draft: int = 16) -> None:
        super().__init__(min_draft, max_draft)
        if threshold is not None and (threshold < 0 or math.isnan(threshold)):
            raise PacerError(f"entropy threshold must be >= 0, got {threshold}")
        self.threshold = threshold

    def should_continue(self, state: DraftState) -> bool:
        return state.n == 0 or self.threshold is None or state.entropy[-1] <= self.threshold

    def survival(self, state: DraftState) -> float:
        """``exp(-Σ H_i)``: 1 for a draft certain of every token, falling with every nat of doubt."""
        return math.exp(-sum(state.entropy))


class CumProbPolicy(ConfidencePolicy):
    """Cumulative-probability stop: go on while the product of the draft's probabilities of its drafted tokens,
    ``Π q(d_i)``, stays at or above ``threshold`` (the one draft-side rule a 2026 audit of adaptive draft length
    found to keep a gain over the best fixed depth under held-out threshold choice). Under the cost-aware rule
    (``threshold=None``) it decides on the same survival proxy."""

    name = "cumprob"
    draft_features = frozenset({"prob"})

    def __init__(self, threshold: float | None = 0.3, min_draft: int = 1, max_draft: int = 16) -> None:
        super().__init__(threshold, min_draft, max_draft)

    def should_continue(self, state: DraftState) -> bool:
        return state.n == 0 or self.threshold is None or self.survival(state) >= self.threshold

    def survival(self, state: DraftState) -> float:
        """``Π q(d_i)``: the draft's own estimate that it drafted the whole block right."""
        return math.prod(state.prob)
