"""Per-generation statistics, with the field's definitions.

* **round** - one draft-then-verify cycle; it costs exactly one target forward (a *target call*).
* **draft length** ``γ_t`` - draft tokens proposed in round ``t`` (``draft_lengths``).
* **accepted count** ``n_t`` - draft tokens the target accepted in round ``t`` (``accepted_counts``). Spec-Bench's
  ``accept_lengths`` (benchmark records) are ``n_t + 1``: tokens a target call produced, its own token included.
* **acceptance rate** ``α = Σ n_t / Σ γ_t`` - accepted over proposed draft tokens.
* **mean accepted tokens** ``τ = Σ (n_t + 1) / rounds`` - tokens produced per target call, counting the target's
  bonus/correction token; plain decoding has ``τ = 1``. Counted before truncation at EOS / stop / max tokens.
* **wasted draft tokens** ``Σ (γ_t - n_t)`` - drafted and rejected.
* **per-position acceptance** - for draft position ``i`` (1-based), accepted / proposed among rounds that drafted
  at least ``i`` tokens (a token after the first rejection counts as not accepted).
* **tokens/s** - new tokens over wall time of the whole generation (prefill included).
* **ttft** - seconds to the first token: the first round's forwards (the target's prefill, which gives the first
  token; a drafting method's draft reads the prompt after it).
* **time_draft / time_verify / time_policy / time_pool** - seconds in draft forwards, target forwards plus the
  acceptance rule, the length policy's own work (feature building, the pre-verification layer, its updates), and
  a phrase drafter's pool work (lookups, learning, candidate branches).
* **calls** - every model forward of the generation (:class:`pacer.decoding.meter.Call`: role, new tokens,
  cached context, tree or chain, seconds); **breakdown** - the wall time split into target prefill, target
  chain and tree forwards, draft forwards, draft catch-up, policy, pool and the rest of the loop
  (:func:`pacer.decoding.meter.breakdown`; the parts add up to ``wall_time``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .meter import Call


@dataclass
class GenerationStats:
    method: str = ""
    new_tokens: int = 0
    prompt_tokens: int = 0
    target_calls: int = 0
    draft_forwards: int = 0
    draft_lengths: list[int] = field(default_factory=list)
    accepted_counts: list[int] = field(default_factory=list)
    wall_time: float = 0.0
    time_draft: float = 0.0
    time_verify: float = 0.0
    time_policy: float = 0.0
    time_pool: float = 0.0
    finish_reason: str = ""
    calls: list[Call] = field(default_factory=list)

    def record_round(self, drafted: int, accepted: int) -> None:
        self.target_calls += 1
        self.draft_lengths.append(drafted)
        self.accepted_counts.append(accepted)

    @property
    def draft_tokens(self) -> int:
        return sum(self.draft_lengths)

    @property
    def accepted_tokens(self) -> int:
        return sum(self.accepted_counts)

    @property
    def rounds(self) -> int:
        return len(self.accepted_counts)

    @property
    def tau(self) -> float:
        """Mean accepted tokens per target call, bonus token included (1.0 for plain decoding)."""
        return (self.accepted_tokens + self.rounds) / self.rounds if self.rounds else 1.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def wasted_draft_tokens(self) -> int:
        return self.draft_tokens - self.accepted_tokens

    @property
    def mean_draft_length(self) -> float:
        return self.draft_tokens / self.rounds if self.rounds else 0.0

    @property
    def ttft(self) -> float:
        """Seconds to the first token: the first round's forwards (:func:`pacer.decoding.meter.first_round_end`:
        the target's prefill, every method alike)."""
        from .meter import first_round_end

        return sum(c.seconds for c in self.calls[: first_round_end(c.role for c in self.calls)])

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_time if self.wall_time > 0 else 0.0

    def per_position_acceptance(self) -> list[float]:
        top = max(self.draft_lengths, default=0)
        out = []
        for i in range(1, top + 1):
            proposed = sum(1 for g in self.draft_lengths if g >= i)
            accepted = sum(1 for n in self.accepted_counts if n >= i)
            out.append(accepted / proposed if proposed else 0.0)
        return out

    def accepted_count_histogram(self) -> dict[int, int]:
        return dict(sorted(Counter(self.accepted_counts).items()))

    def breakdown(self) -> dict[str, float]:
        """Seconds by part of the wall time (see the module docstring); the parts add up to ``wall_time``."""
        from .meter import breakdown

        return breakdown(self.wall_time, self.calls, self.time_policy, self.time_pool)

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "calls"}
        d["draft_lengths"], d["accepted_counts"] = list(self.draft_lengths), list(self.accepted_counts)
        d.update(
            calls=[c.to_list() for c in self.calls],
            breakdown={k: round(v, 6) for k, v in self.breakdown().items()},
            draft_tokens=self.draft_tokens,
            accepted_tokens=self.accepted_tokens,
            tau=round(self.tau, 4),
            acceptance_rate=round(self.acceptance_rate, 4),
            wasted_draft_tokens=self.wasted_draft_tokens,
            mean_draft_length=round(self.mean_draft_length, 3),
            tokens_per_s=round(self.tokens_per_s, 3),
            ttft=round(self.ttft, 6),
            per_position_acceptance=[round(x, 4) for x in self.per_position_acceptance()],
            accepted_count_histogram=self.accepted_count_histogram(),
        )
        return d

    def summary(self) -> str:
        return (
            f"[{self.method}] {self.new_tokens} tokens in {self.wall_time:.2f}s = {self.tokens_per_s:.2f} tok/s, "
            f"first token {self.ttft:.2f}s | "
            f"target calls {self.target_calls}, tau {self.tau:.2f}, acceptance {self.acceptance_rate:.1%}, "
            f"mean draft {self.mean_draft_length:.2f}, wasted {self.wasted_draft_tokens} | "
            f"draft {self.time_draft:.2f}s verify {self.time_verify:.2f}s policy {self.time_policy:.3f}s"
        )
