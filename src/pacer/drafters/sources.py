"""Which source drafts a round: the draft model, a phrase, or both - chosen by what each source earned in this
generation (:class:`SourceEvidence`) and the generation's pricer (:meth:`pacer.pricing.CostPricer.draft_rate`,
:meth:`~pacer.pricing.CostPricer.phrase_rate`): :class:`SourceChoice`.

**Phrase sources.** A phrase is a continuation of the committed text found by an n-gram match:

* ``lookup`` - the generation's own text (the prompt first: an article to summarize, retrieved passages, code to
  edit; then the committed output) indexed with keys of up to 3 tokens, the longest match first (prompt lookup;
  :class:`LookupIndex`). A grounded prompt is the first phrase source;
* ``pool``   - the Ouroboros phrase pool (:class:`pacer.drafters.pool.PhrasePool`: also earlier generations'
  text and the draft's own guesses), keyed by one or two tokens.

**Evidence at no cost.** Decoding is greedy when phrases are used, so the committed text is the target's own:
the continuation each source would propose for the committed text is recorded (the pool's at every round, the
generation's own text's at every committed position, from the text before it alone), and once the text goes on
it is scored - how many of its tokens the target would have accepted had the phrase alone been verified.
This is exactly the acceptance of a round that verifies that phrase (a *phrase round*: no draft forward, the
phrase scored after the pending token), learnt from every round whether the phrase was used or not, so a source
turned off keeps being measured and comes back when the text starts to repeat. The rates are per generation,
shrunk towards what the source earned over the generations before (and those towards a prior), per *kind*: the
source and its key length (a 3-token match in the prompt is a far better bet than a 1-token one).

**The choice** (greedy, a cost model deciding; :class:`SourceChoice`, asked by
:class:`pacer.drafters.phrase.PhraseDrafter` at the start of a round). A round's expected
throughput is its expected committed tokens over its priced seconds:

* a phrase round with the best phrase found, ``L`` of its tokens scored: ``(1 + Σ_{j<=L} A_j) / c_t(1 + L)``,
  ``A_j`` the chance that its first ``j`` tokens are all accepted (:meth:`SourceEvidence.accept`), ``L`` the best;
* a draft round: the cost rule's own estimate from the draft's acceptance in this generation
  (:meth:`pacer.pricing.CostPricer.draft_rate`), its catch-up over committed tokens it has not
  read included.

The better one runs; a draft round still checks phrases and scores branches where the rule prices them as paying
(both sources), now with this generation's evidence of the pool (:meth:`SourceEvidence.branch_yield`), so a pool
whose continuations this text does not take is not verified after a few rounds.
"""

from __future__ import annotations

from collections.abc import Callable

from ..pricing import Pricer
from .pool import Key, PhrasePool

#: the longest phrase a lookup match proposes (:class:`LookupIndex`), a phrase round's longest
#: (option ``lookup_len``). 16 against 8 on the 15 grounded development questions (summarization, retrieval QA,
#: code editing; AMD EPYC Zen 4, transformers bf16, 256 new tokens): pacer+ouroboros 1.07x on the median question
#: (Zen 4 profile clock and wall clock), 1.00-1.46x each (profile clock); on 5 other kinds' questions the same
#: phrase rounds, as their phrases are shorter
LOOKUP_LEN = 16

Kind = tuple[str, int]


class SourceEvidence:
    """How often each kind of phrase (``(source, key length)``) would have been accepted at each of its positions:
    ``[accepted, scored]`` per position ``j`` (the chance that token ``j`` is right given the ones before), in this
    generation and over all earlier ones (:meth:`new_generation` moves one into the other)."""

    #: prior of the rate over all generations: the chance, and its weight in phrases scored
    PRIOR, PRIOR_WEIGHT = 0.2, 2.0
    #: weight (in phrases scored) of the earlier generations' rate against this generation's own
    GEN_WEIGHT = 3.0

    def __init__(self, length: int = LOOKUP_LEN) -> None:
        self.length = length
        self.total: dict[Kind, list[list[int]]] = {}
        self.gen: dict[Kind, list[list[int]]] = {}
        self._open: list[tuple[Kind, int, tuple[int, ...]]] = []  # (kind, position it continues, phrase)

    def new_generation(self) -> None:
        for kind, rows in self.gen.items():
            tot = self.total.setdefault(kind, [[0, 0] for _ in range(self.length)])
            for j, (a, c) in enumerate(rows):
                tot[j][0] += a
                tot[j][1] += c
        self.gen = {}
        self._open = []

    def predict(self, kind: Kind, at: int, phrase: tuple[int, ...] | list[int]) -> None:
        """``phrase`` would continue the committed text of ``at`` tokens (scored by :meth:`score`)."""
        if phrase:
            self._open.append((kind, at, tuple(phrase[: self.length])))

    def score(self, tokens: list[int]) -> None:
        """Score the predictions the committed ``tokens`` now settle (a mismatch seen, or the whole phrase)."""
        still = []
        for kind, at, phrase in self._open:
            known = tokens[at : at + len(phrase)]
            m = 0
            while m < len(known) and known[m] == phrase[m]:
                m += 1
            if m == len(known) and m < len(phrase):  # all right so far, not settled yet
                still.append((kind, at, phrase))
                continue
            rows = self.gen.setdefault(kind, [[0, 0] for _ in range(self.length)])
            for j in range(min(m + 1, len(phrase))):
                rows[j][1] += 1
                rows[j][0] += j < m
        self._open = still

    def accept(self, kind: Kind, n: int) -> list[float]:
        """``A_j``, ``j = 1..n``: the chance that a ``kind`` phrase's first ``j`` tokens are all accepted."""
        tot, gen = self.total.get(kind), self.gen.get(kind)
        out, survive = [], 1.0
        for j in range(min(n, self.length)):
            a, c = tot[j] if tot else (0, 0)
            p = (a + self.PRIOR * self.PRIOR_WEIGHT) / (c + self.PRIOR_WEIGHT)
            if gen is not None:
                a, c = gen[j]
                p = (a + p * self.GEN_WEIGHT) / (c + self.GEN_WEIGHT)
            survive *= p
            out.append(survive)
        return out

    def branch_yield(self, kind: Kind, n: int) -> float:
        """Expected accepted tokens per token of an ``n``-token ``kind`` phrase scored (a candidate branch)."""
        a = self.accept(kind, n)
        return sum(a) / len(a) if a else 0.0

    def scored(self, kind: Kind) -> int:
        """Phrases of ``kind`` scored in this generation."""
        rows = self.gen.get(kind)
        return rows[0][1] if rows else 0


class LookupIndex:
    """The generation's own text - its prompt, then what it commits - as n-grams with keys of up to
    ``key_len`` tokens (prompt lookup; what :class:`pacer.drafters.sources.SourceEvidence` scores as the ``lookup``
    source); :meth:`find` takes the longest key that matches."""

    def __init__(self, ngram: int = LOOKUP_LEN, key_len: int = 3) -> None:
        self.pool = PhrasePool(ngram, 1 << 16, key_len)
        self.seen = 0

    def sync(self, tokens: list[int], end: int | None = None) -> None:
        """Index the tokens committed since the last call, up to ``end`` (all: ``None``; the prompt at the first
        call; a short continuation at the end is kept, so text just committed is found at once)."""
        end = len(tokens) if end is None else end
        if end <= self.seen:
            return
        lo = max(0, self.seen - self.pool.ngram - self.pool.key_len)
        self.pool.add_sequence(tokens[lo:end], "output" if self.seen else "prompt", min_end=self.seen - lo,
                               partial=True)
        self.seen = end

    def find(self, context: list[int]) -> tuple[int, tuple[int, ...]]:
        """``(key length, continuation)`` of the longest match for the end of ``context`` (``(0, ())``: none)."""
        found = self.pool.lookup(context, 1)
        if not found:
            return 0, ()
        key, cont = found[0]
        return len(key), cont


class SourceChoice:
    """The per-round choice between the draft model and a phrase verified alone (see the module docstring), with
    what it learns from: the generation's own text (:attr:`index`) and each kind's evidence (:attr:`evidence`, kept
    with ``pool`` across generations). One per drafter; :meth:`new_generation` at the start of each generation."""

    def __init__(self, pool: PhrasePool, lookup_len: int = LOOKUP_LEN) -> None:
        self.pool, self.lookup_len = pool, lookup_len
        if pool.evidence is None:
            pool.evidence = SourceEvidence(lookup_len)
        self.evidence: SourceEvidence = pool.evidence
        self.index = LookupIndex(lookup_len)

    def new_generation(self) -> None:
        self.evidence.new_generation()
        self.index = LookupIndex(self.lookup_len)

    def choose(self, tokens: list[int], pricer: Pricer, budget: int, catch_up: int, remaining: int,
               sync: Callable[[list[int]], None]) -> tuple[list[int], tuple[Key, Key] | None] | None:
        """Score the sources' earlier predictions against the committed ``tokens``, record theirs for this one, and
        return the phrase to verify alone (no draft forward) and its pool entry (``None``: the generation's own
        text) where its expected committed tokens per second beat a draft round's, whose draft model would read
        ``catch_up`` committed tokens first (``pricer.phrase_rate``, ``draft_rate``); ``None``: the draft model
        drafts. ``sync(tokens)``: the pool learns the committed tokens (once the choice is worth making)."""
        rate_d = pricer.draft_rate(catch_up, remaining)
        if rate_d is None or pricer.phrase_rate([1.0] * min(self.lookup_len, budget))[1] <= rate_d * (1 + 1e-9):
            return None  # no cost model, or not even a phrase all right would pay (a linear curve): no pool work
        ev = self.evidence
        if self.index.seen:  # every position committed since the last choice predicts too, from the text before it
            for pos in range(self.index.seen + 1, len(tokens)):
                self.index.sync(tokens, pos)
                k, cont = self.index.find(tokens[max(0, pos - self.index.pool.key_len) : pos])
                ev.predict(("lookup", k), pos, cont)
        ev.score(tokens)
        self.index.sync(tokens)
        sync(tokens)
        at = len(tokens)
        found: list[tuple[Kind, tuple[int, ...], tuple[Key, Key] | None]] = []
        k, cont = self.index.find(tokens)
        if cont:  # the generation's own text, the prompt first: the first phrase source
            found.append((("lookup", k), cont, None))
        for kc in self.pool.lookup(tokens, 1):
            found.append((("pool", len(kc[0])), kc[1], kc))
        for kind, phrase, _ in found:
            ev.predict(kind, at, phrase)
        best, best_rate = None, rate_d
        for kind, phrase, kc in found:
            L, rate = pricer.phrase_rate(ev.accept(kind, min(len(phrase), budget)))
            if L and rate > best_rate:
                best, best_rate = (list(phrase[:L]), kc), rate
        return best
