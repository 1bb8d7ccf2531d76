"""The priced oracle (measurement only, greedy): the fastest sequence of rounds any policy could choose with a
method's drafters, on given costs, knowing the target's continuation. ``pacer bench`` reports each method's speedup
as a fraction of it: the limit on this machine, steep cost curve or flat.

Terms:

* **continuation** ``y_1..y_N``: the target's greedy tokens after a prompt of ``P`` tokens (plain decoding's output
  in the same run); **position** ``i`` (``0 <= i <= N``): ``y_1..y_i`` are committed; a forward at position ``i``
  runs at **context** ``P + i`` (the tokens cached before it).
* **source** ``s``: one drafter's offer at every position, :class:`Source`: ``agree[i]`` = ``L_s(i)``, how many
  tokens of what ``s`` proposes after ``y_1..y_i`` equal ``y_{i+1}, y_{i+2}, ...`` (its first disagreement), and
  whether its tokens are ``free`` (a looked-up phrase: no draft forward) or each costs a draft forward. The
  sources: ``draft`` (the draft model's greedy tokens given the true prefix: one teacher-forced forward over the
  prompt and the continuation, :meth:`pacer.decoding.Drafter.agreement`, gives ``L_draft`` at every position) and
  ``lookup`` (the n-gram continuation of the prompt and the output so far, as :class:`pacer.drafters.lookup.
  LookupDrafter` finds it: :func:`lookup_lengths`; the phrase drafters' text sources are priced by it too, their
  warm pool and lookahead are not replayed).
* **round** at position ``i``: a plain step (no draft, commits ``y_{i+1}``) or ``n`` tokens of one source with
  ``1 <= n <= L_s(i)`` (drafting past the first disagreement only costs more), all accepted, plus the target's
  own next token: it commits ``n + 1`` tokens (``i + n + 1 <= N``).
* **costs** ``C(i)`` = :meth:`pacer.costs.ContextCosts.at` ``(P + i)``: ``c_t(k)`` a target forward scoring ``k``
  tokens, ``c_d`` a draft token, ``c_p`` a policy check. A round of ``n`` tokens takes the round time of
  :mod:`pacer.pricing`, ``T_n = n (c_d + c_p) + c_t(n + 1)`` (:func:`round_time`; a free source's tokens cost
  ``c_p`` each, no ``c_d``); a plain step ``T_0 = c_t(1)``. The draft's catch-up after plain steps (``c_pre``) is
  not charged: the oracle is a limit.
* **oracle time** ``B(0)``: ``B(N) = 0``, ``B(i) = min(T_0 + B(i + 1), min_s min_{1 <= n <= L_s(i), i + n + 1 <= N}
  T_n + B(i + n + 1))``, exact by dynamic programming over positions (:func:`priced_oracle`); **plain time**
  ``Σ_i c_t(1)`` at each position; the oracle's **speedup** is plain time over oracle time (decoding only: the
  prefill is the same for every method).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..costs import ContextCosts, Costs
from ..pricing import round_seconds, token_seconds

#: the most tokens one round of a source may take (a bound on the search, far above the lengths that pay)
MAX_ROUND = 64
#: the plain step's name in a path
PLAIN = "plain"


@dataclass(frozen=True)
class Source:
    """One drafter's offer: ``agree[i]`` = ``L_s(i)`` at every position ``i`` (see the module docstring);
    ``free``: its tokens cost no draft forward."""

    name: str
    agree: tuple[int, ...]
    free: bool = False


def round_time(costs: Costs, n: int, free: bool = False) -> float:
    """``T_n = n (c_d + c_p) + c_t(n + 1)`` (:func:`pacer.pricing.round_seconds`; ``free``: looked-up tokens,
    ``n c_p + c_t(n + 1)``); ``n = 0`` is a plain step, ``c_t(1)``."""
    return round_seconds(costs, n, spent=n * token_seconds(costs, free))


@dataclass
class OraclePath:
    """The oracle's best rounds: ``seconds`` (oracle time), ``plain_seconds`` (plain time) and ``rounds``, each
    ``(position, source or "plain", n)``."""

    seconds: float
    plain_seconds: float
    rounds: list[tuple[int, str, int]] = field(default_factory=list)

    @property
    def speedup(self) -> float:
        return self.plain_seconds / self.seconds if self.seconds > 0 else 1.0


def priced_oracle(prompt_len: int, tokens: int, sources: Sequence[Source], costs: ContextCosts,
                  max_round: int = MAX_ROUND) -> OraclePath:
    """The fastest rounds over ``tokens`` positions (``N``) after a prompt of ``prompt_len`` (``P``), with
    ``sources`` on ``costs``: the recurrence of the module docstring, solved backwards from ``B(N) = 0``."""
    for s in sources:
        if len(s.agree) < tokens:
            raise ValueError(f"source {s.name} says how far it agrees at {len(s.agree)} positions, not {tokens}")
    best = [0.0] * (tokens + 1)
    choice: list[tuple[str, int]] = [(PLAIN, 0)] * (tokens + 1)
    plain = 0.0
    for i in range(tokens - 1, -1, -1):
        c = costs.costs(prompt_len + i)
        step = round_time(c, 0)
        plain += step
        best[i], choice[i] = step + best[i + 1], (PLAIN, 0)
        for s in sources:
            for n in range(1, min(s.agree[i], tokens - i - 1, max_round) + 1):
                t = round_time(c, n, s.free) + best[i + n + 1]
                if t < best[i]:
                    best[i], choice[i] = t, (s.name, n)
    rounds, i = [], 0
    while i < tokens:
        name, n = choice[i]
        rounds.append((i, name, n))
        i += n + 1
    return OraclePath(best[0], plain, rounds)


def replay_seconds(prompt_len: int, tokens: int, draft_lengths: Sequence[int], accept_lengths: Sequence[int],
                   costs: ContextCosts, free: bool = False) -> float:
    """A recorded turn's rounds priced as the oracle prices rounds: round ``r`` at position ``i`` drafted
    ``draft_lengths[r]`` tokens and committed ``accept_lengths[r]`` (its accepted tokens and the target's own),
    ``T_n`` at context ``P + i`` (``free`` as :func:`round_time`); the last round's commits are cut at ``tokens``."""
    i, seconds = 0, 0.0
    for n, a in zip(draft_lengths, accept_lengths, strict=True):
        if i >= tokens:
            break
        seconds += round_time(costs.costs(prompt_len + i), n, free)
        i += a
    return seconds


def run_lengths(agree: Sequence[bool]) -> list[int]:
    """``L(i)``: how many consecutive ``True`` start at each ``i`` of ``agree`` (a teacher-forced drafter's
    agreement at each position: its greedy proposal after the true prefix keeps agreeing that far)."""
    out = [0] * (len(agree) + 1)
    for i in range(len(agree) - 1, -1, -1):
        out[i] = out[i + 1] + 1 if agree[i] else 0
    return out[:-1]


def lookup_lengths(prompt: Sequence[int], reference: Sequence[int], ngram: int | None = None,
                   key_len: int | None = None, cap: int = MAX_ROUND) -> list[int]:
    """``L_lookup(i)`` at every position of ``reference`` (the continuation of ``prompt``): the prompt-lookup
    drafter's proposal after ``prompt + reference[:i]`` (the continuations of the longest matching n-gram of the
    text so far, chained as :meth:`pacer.drafters.lookup.LookupDrafter.propose` chains them; ``ngram`` and
    ``key_len`` default to its own) compared with ``reference[i:]``, at most ``cap`` tokens. Pure text: no forward."""
    from ..drafters.lookup import LookupDrafter
    from ..drafters.pool import PhrasePool, learn_committed

    own = LookupDrafter(1)
    pool = PhrasePool(ngram or own.ngram, 1 << 16, key_len or own.key_len)
    text, seen, out = list(prompt), 0, []
    for i in range(len(reference)):
        seen = learn_committed(pool, text, seen, pool.add_sequence)
        ctx, n, going = list(text), 0, True
        while going and n < min(cap, len(reference) - i):
            found = pool.lookup(ctx, 1)
            if not found:
                break
            for x in found[0][1]:
                if n >= min(cap, len(reference) - i) or x != reference[i + n]:
                    going = False
                    break
                n += 1
                ctx.append(x)
        out.append(n)
        text.append(reference[i])
    return out
