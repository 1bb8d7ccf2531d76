"""The oracle length (measurement only): drafts exactly up to the draft's first disagreement with the target."""

from __future__ import annotations

from ..errors import PacerError
from ..rounds import DraftState, RoundResult
from .base import DraftPolicy


class OraclePolicy(DraftPolicy):
    """Measurement only: knows, for every generated position, whether the draft's greedy token there equals the
    target's greedy token (``agree``, from :meth:`pacer.decoding.Drafter.agreement`), and drafts exactly up to the
    first mismatch - the best any length policy can do on a pair. Greedy decoding only."""

    name = "oracle"
    draft_features = frozenset()
    greedy_only = True

    def __init__(self, agree: list[bool] | None = None, min_draft: int = 0, max_draft: int = 32) -> None:
        super().__init__(min_draft, max_draft)
        self.agree = agree
        self.produced = 0  # tokens generated before this round

    @property
    def needs_reference(self) -> bool:
        """Until it is given its agreement list (here or in the constructor)."""
        return self.agree is None

    def set_reference(self, agree: list[bool]) -> None:
        self.agree = list(agree)

    def reset(self) -> None:
        self.produced = 0

    def update(self, state: DraftState, result: RoundResult) -> None:
        if result.committed <= 0:  # every round commits a token: 0 is a caller that did not say how many
            raise PacerError("the oracle needs RoundResult.committed (the tokens a round appended to the output)")
        self.produced += result.committed

    def prefilled(self, committed: int) -> None:
        self.produced += committed

    def should_continue(self, state: DraftState) -> bool:
        if self.agree is None:
            raise PacerError("the oracle policy needs the target's continuation; use Decoder.generate(method='oracle')")
        j = self.produced + state.n  # index (among generated tokens) of the token that would be drafted next
        return j < len(self.agree) and self.agree[j]

    def survival(self, state: DraftState) -> float:
        return 1.0  # it drafted only agreeing tokens

    exact_survival = True  # survival_next is the verdict itself

    def survival_next(self, state: DraftState) -> float:
        return 1.0 if self.should_continue(state) else 0.0
