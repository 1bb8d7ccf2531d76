"""Draft-length policies: the decoding loop asks one after every drafted token "draft another?". This module holds
the interface the loop needs (:class:`DraftState`, :class:`RoundResult`, :class:`DraftPolicy`); the policies are
in :mod:`.rules`, :mod:`.oracle`, :mod:`.learned` and :mod:`.cost_aware`.

A policy sees a :class:`DraftState` (what the draft computed so far this round) and, after verification, a
:class:`RoundResult`. The loop itself enforces ``min_draft <= γ <= max_draft`` and the token budget, so a policy
only answers the question in between. Every method of the project uses the same loop; only the policy differs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import torch

from ..errors import PacerError

#: the per-token draft features a :class:`DraftState` can hold (its field names); a policy declares those it reads
#: (:attr:`DraftPolicy.draft_features`) and the drafter computes only those: over a 152k-id vocabulary the
#: entropy and the top two of ``q`` cost several times the draft's argmax
DRAFT_FEATURES = frozenset({"prob", "top_prob", "second_prob", "second_token", "entropy"})


@dataclass
class DraftState:
    """What the draft model computed for the tokens drafted so far in this round (all lists have length ``n``).

    ``prob`` is ``q(d_i)``, the draft's probability of its own token; ``top_prob`` is ``max q`` and ``second_prob`` the
    second-largest probability of ``q`` (the top-2 margin ``top_prob - second_prob`` says how contested the draft's
    choice was); ``entropy`` is the entropy of ``q`` in nats; ``hidden`` holds, per token, the draft's hidden state(s)
    at the position that predicted it (the layers the policy asked for, concatenated), only when
    ``policy.hidden_layers`` is set; ``phrase`` marks tokens that came from a phrase (Ouroboros); ``next_is_free`` says
    that the token asked about next needs no draft forward of its own; ``confidence`` is the drafter's own estimate that
    ``d_i`` is right, where it has one that is not ``q`` (prompt lookup: from the length of the matched n-gram), and
    ``next_confidence`` the same for the token asked about next (``None``: the drafter does not know it before drafting
    it).

    Only the features in :data:`DRAFT_FEATURES` that the policy (or the drafter itself) reads are computed; the
    lists of the others stay empty.
    """

    tokens: list[int] = field(default_factory=list)
    prob: list[float] = field(default_factory=list)
    top_prob: list[float] = field(default_factory=list)
    entropy: list[float] = field(default_factory=list)
    hidden: list[torch.Tensor] = field(default_factory=list)
    phrase: list[bool] = field(default_factory=list)
    confidence: list[float] = field(default_factory=list)
    next_confidence: float | None = None
    #: the token the policy is asked about next is already computed (an Ouroboros draft forward over a phrase
    #: gives several tokens): drafting it costs no draft forward, only its place in the verification
    next_is_free: bool = False
    #: committed tokens the draft model has not read yet beyond the one every round feeds it (the prompt, before the
    #: first draft of a generation; the tokens of plain-decoding rounds since): the first draft token of this round
    #: costs their prefill too
    catch_up: int = 0
    #: tokens the generation may still emit (0: not known)
    remaining: int = 0
    #: the second-largest probability of the draft's ``q`` per token (empty where a drafter has no ``q``)
    second_prob: list[float] = field(default_factory=list)
    #: the sampling temperature of this generation (0: greedy)
    temperature: float = 0.0
    #: the draft's second choice per token (the id of ``second_prob``; empty where a drafter has no ``q``)
    second_token: list[int] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.tokens)

    def prefix(self, n: int) -> DraftState:
        """The state of the first ``n`` drafted tokens (per-token lists cut, the rest kept)."""
        cut = {f.name: getattr(self, f.name)[:n] for f in fields(self) if isinstance(getattr(self, f.name), list)}
        return replace(self, **cut)


@dataclass
class RoundResult:
    """Verification outcome: ``accepted`` of ``drafted`` tokens, soft acceptance ``min(1, p/q)`` per token (when the
    policy ``needs_soft``), and the round's measured times: ``draft_seconds`` in draft forwards,
    ``verify_seconds`` in the target forward that scored ``scored`` tokens, ``draft_forwards`` draft forwards;
    ``committed``: tokens this round appended to the output (``n + 1`` plus any Ouroboros extension, fewer where the
    output ended inside the round); ``branched``: candidate-branch tokens the target scored after ``d_γ`` (a tree),
    ``extended``: how many of them were accepted (the extension); ``target_entropy`` / ``target_margin`` (when the
    policy ``needs_target_state``): the target's entropy (nats) and top-2 margin of its temperature-1 distribution at
    the positions of ``d_1..d_n`` and at the bonus position (``n + 1`` values, the bonus last) - what the
    verification already computed, read by the pre-verification layer's target-state features;
    ``target_hidden`` (when the policy ``needs_target_hidden``): the target's final hidden state ``[H]`` (float32, on
    the CPU) at the position whose distribution gave the bonus token, from the same forward."""

    drafted: int
    accepted: int
    soft: list[float] = field(default_factory=list)
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    scored: int = 0
    draft_forwards: int = 0
    committed: int = 0
    branched: int = 0
    extended: int = 0
    target_entropy: list[float] = field(default_factory=list)
    target_margin: list[float] = field(default_factory=list)
    target_hidden: torch.Tensor | None = None


class DraftPolicy:
    """Base class. Subclasses override :meth:`should_continue` and optionally :meth:`update` / :meth:`reset`,
    and, to feed the cost-aware rule (:mod:`pacer.policies.cost_aware`), :meth:`survival`.

    What a policy needs from the loop is declared here, never probed: ``draft_features`` (which per-token features
    of :data:`DRAFT_FEATURES` it reads: every one unless a policy says less), ``hidden_layers`` (draft hidden states),
    ``needs_soft`` (soft acceptance ``min(1, p/q)`` in every :class:`RoundResult`), ``needs_target_state`` (the
    target's entropy and top-2 margin at the accepted and bonus positions in every :class:`RoundResult`),
    ``needs_target_hidden`` (the target's final hidden state at the bonus position),
    ``check_seconds`` (what one
    :meth:`should_continue` costs, for the cost model), ``needs_reference`` (before generating, the drafter's
    agreement with the target's own greedy continuation through :meth:`set_reference`: the oracle), ``greedy_only``
    (defined for greedy decoding only). Hooks the caller uses: :meth:`prepare` (before a generation, with the
    decoding mode) and :meth:`report` (after it)."""

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

    def branch_room(self, drafted: int, yield_: float | None = None) -> int:
        """How many candidate-branch tokens (Ouroboros) the target may score after a draft of ``drafted`` tokens;
        unbounded unless a cost model says otherwise. After a draft of nothing (a phrase pool's continuation of the
        committed text in a round where the draft model drafts nothing): none unless a cost model prices them.
        ``yield_``: the drafter's estimate of the accepted tokens per branch token (``None``: the policy's own)."""
        return 1 << 30 if drafted > 0 else 0

    def draft_rate(self, catch_up: int = 0, remaining: int = 0) -> float | None:
        """Expected committed tokens per second of a round that runs the draft model, its reading of ``catch_up``
        committed tokens it has not seen included (its share over the ``remaining`` tokens the generation may
        emit; ``None``: no cost model, no such estimate)."""
        return None

    def phrase_rate(self, accept: list[float]) -> tuple[int, float]:
        """How many tokens of a phrase to verify alone in a round without the draft model, and that round's
        expected committed tokens per second, from ``accept[j - 1]``, the chance that its first ``j`` tokens are
        all accepted (``(0, 0.0)``: never without a cost model)."""
        return 0, 0.0

    def sibling_room(self, state: DraftState, hits: list[float]) -> list[int]:
        """Which draft positions get a sibling branch (greedy): ``i`` - the draft's second choice for ``d_{i+1}``,
        scored beside it; ``hits[i]``: the drafter's estimate that the target picks that token once ``d_{i+1}`` is
        rejected. A sibling adds a token to a round whose first rejection is at ``d_{i+1}`` and whose target token
        is the sibling. Default (no cost model): every position, likeliest first by the draft's own survival."""
        surv, gains = 1.0, []
        for i, h in enumerate(hits):
            gains.append((surv * (1.0 - state.prob[i]) * h, i))
            surv *= state.prob[i]
        return [i for g, i in sorted(gains, reverse=True) if g > 0]

    def phrase_room(self, fed: int, accept: list[float]) -> int:
        """How many phrase tokens (Ouroboros) the draft may check in a forward that reads ``fed`` unread tokens,
        given ``accept[j]``, the chance it agrees with phrase token ``j + 1`` after the ones before; unbounded
        unless a cost model says otherwise."""
        return len(accept)

    def survival_ahead(self, state: DraftState) -> float | None:
        """A raw score, on :meth:`survival`'s scale, that ``d_1..d_{n+1}`` all survive, for a policy that can
        score the next token before it is drafted (prompt lookup knows its match); ``None`` otherwise. The
        cost-aware rule calibrates it as it calibrates :meth:`survival`."""
        return None

    def survival_next(self, state: DraftState) -> float | None:
        """The exact probability that ``d_1..d_{n+1}`` would all be accepted, for a policy that knows it (the
        oracle); ``None`` otherwise."""
        return None

    def describe(self) -> str:
        return f"{self.name}(min={self.min_draft}, max={self.max_draft})"
