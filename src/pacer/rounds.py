"""What one round of speculative decoding is made of, as the length policy, the pricer and the drafters see it:
:class:`DraftState` (what the draft computed for the tokens drafted so far) and :class:`RoundResult` (what the
verification said)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import torch

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
