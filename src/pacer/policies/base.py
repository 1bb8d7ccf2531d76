"""Draft-length policies: the decoding loop asks one after every drafted token "draft another?". This module holds
the interface the loop needs (:class:`DraftPolicy`; the round's data, :class:`DraftState` and :class:`RoundResult`,
are :mod:`pacer.rounds`'); the policies are in :mod:`.rules`, :mod:`.oracle`, :mod:`.learned` and
:mod:`.cost_aware`. What a round costs is not a policy's question: :mod:`pacer.pricing` answers it.

A policy sees a :class:`DraftState` (what the draft computed so far this round) and, after verification, a
:class:`RoundResult`. The loop itself enforces ``min_draft <= γ <= max_draft`` and the token budget, so a policy
only answers the question in between. Every method of the project uses the same loop; only the policy differs.
"""

from __future__ import annotations

from ..errors import PacerError
from ..rounds import DRAFT_FEATURES, DraftState, RoundResult


class DraftPolicy:
    """Base class. Subclasses override :meth:`should_continue` and optionally :meth:`update` / :meth:`reset`,
    and, to feed the cost-aware rule (:mod:`pacer.policies.cost_aware`), :meth:`survival`.

    What a policy needs from the loop is declared here, never probed: ``draft_features`` (which per-token features
    of :data:`DRAFT_FEATURES` it reads: every one unless a policy says less), ``hidden_layers`` (draft hidden states),
    ``needs_soft`` (soft acceptance ``min(1, p/q)`` in every :class:`RoundResult`), ``needs_target_state`` (the
    target's entropy and top-2 margin at the accepted and bonus positions in every :class:`RoundResult`),
    ``needs_target_hidden`` (the target's final hidden state at the bonus position), ``check_seconds`` (what one
    :meth:`should_continue` costs, for the cost model), ``needs_reference`` (before generating, the drafter's
    agreement with the target's own greedy continuation through :meth:`set_reference`: the oracle), ``greedy_only``
    (defined for greedy decoding only) and ``exact_survival``. Hooks the caller uses:
    :meth:`prepare` (before a generation, with the decoding mode) and :meth:`report` (after it)."""

    name = "policy"
    #: the per-token draft features (:data:`DRAFT_FEATURES`) the policy reads; the others are not computed
    draft_features: frozenset[str] = DRAFT_FEATURES
    #: draft layers whose hidden states the policy reads (``None``: no hidden states are gathered)
    hidden_layers: tuple[int, ...] | None = None
    #: the loop computes ``RoundResult.soft`` for this policy
    needs_soft: bool = False
    #: the loop computes ``RoundResult.target_entropy`` / ``target_margin`` for this policy
    needs_target_state: bool = False
    #: the loop passes the target's final hidden state at the bonus position (``RoundResult.target_hidden``)
    needs_target_hidden: bool = False
    #: seconds of one ``should_continue`` (``c_p``)
    check_seconds: float = 0.0
    #: the caller must pass the drafter's agreement with the target's greedy continuation (:meth:`set_reference`)
    needs_reference: bool = False
    #: defined for greedy decoding only
    greedy_only: bool = False
    #: :meth:`survival_next` is the exact probability, not a score to calibrate (the oracle)
    exact_survival: bool = False

    def __init__(self, min_draft: int = 1, max_draft: int = 16) -> None:
        if min_draft < 0 or max_draft <= 0 or min_draft > max_draft:
            raise PacerError(
                f"draft bounds must satisfy 0 <= min_draft <= max_draft and max_draft >= 1, "
                f"got min {min_draft}, max {max_draft}"
            )
        self.min_draft = min_draft
        self.max_draft = max_draft

    def reset(self) -> None:
        """Called at the start of each generation."""

    def should_continue(self, state: DraftState) -> bool:
        raise NotImplementedError

    def prepare(self, greedy: bool) -> None:
        """Called before a generation with its decoding mode (``greedy``: temperature 0)."""
        if self.greedy_only and not greedy:
            raise PacerError(f"the {self.name} policy is defined for greedy decoding only (temperature 0)")

    def set_reference(self, agree: list[bool]) -> None:
        """For a policy that ``needs_reference``: ``agree[j]`` - the drafter's greedy token at generated position ``j``
        equals the target's."""
        raise PacerError(f"the {self.name} policy takes no reference")

    def report(self) -> dict[str, dict]:
        """What the policy saw in the generation, for ``GenerationResult.extra`` (key: what it is about)."""
        return {}

    def update(self, state: DraftState, result: RoundResult) -> None:
        """Called after every verification with the round's draft state and outcome."""

    def prefilled(self, committed: int) -> None:
        """Called once a generation's first token is out, before its first round: the target's prefill alone
        committed ``committed`` tokens (the first token, or none where the output had already ended); no draft
        was proposed and the draft has read nothing yet. The default does nothing."""

    def survival(self, state: DraftState) -> float | None:
        """A score in [0, 1] that grows with the probability that ``d_1..d_n`` are all accepted (``None``: the
        policy has no such score). The cost-aware rule calibrates it against the verifier's verdicts."""
        return None

    def survival_next(self, state: DraftState) -> float | None:
        """A score, on :meth:`survival`'s scale, that ``d_1..d_{n+1}`` all survive, for a policy that can score the
        next token before it is drafted (prompt lookup knows its match; the oracle knows the answer: its score is
        the exact probability, :attr:`exact_survival`); ``None`` otherwise. The cost-aware rule calibrates it as
        it calibrates :meth:`survival` (an exact one is taken as it is)."""
        return None

    def describe(self) -> str:
        return f"{self.name}(min={self.min_draft}, max={self.max_draft})"
