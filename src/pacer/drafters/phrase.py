"""Ouroboros-style phrase drafting: a bounded phrase pool, phrase-by-phrase drafting and candidate branches.

**Phrase pool** (:class:`PhrasePool`). An entry is an n-gram split into a *key* (its first 1..``key_len``
tokens) and a *continuation* (the next ``ngram`` tokens, shorter only for one-shot sources). Entries live in
one LRU of at most ``capacity`` entries (each n-gram is stored once per key length, every copy counts); a
lookup takes the longest key that matches the end of the context and returns the most recently used
continuations. Sources:

* ``prompt``    - the prompt's n-grams (at the first proposal of a generation);
* ``output``    - the committed output (every committed token is the target's own choice);
* ``verify``    - the target's argmax *after the first mismatch* of a round, which plain SD throws away:
  ``[d_{n+1}, a_{n+1}, a_{n+2}, ...]`` is the target's own continuation of the rejected token;
* ``lookahead`` - Jacobi-style guesses of the draft: when the draft checks a phrase and disagrees at
  position ``k``, its argmax at positions ``k..m`` (computed by that same forward) is the next Jacobi
  iterate of the phrase;
* warm start    - with ``warm_start`` (default) the pool is shared by every :class:`PhraseDrafter` on the
  same draft model and settings in this process, so a prompt starts with what earlier generations left; hits
  on entries made by an earlier generation are counted as ``warm``. ``pool_file`` loads a pool at start and
  saves it (atomically: temporary file, then rename) after every generation.

**Phrase-by-phrase drafting** (greedy). When the pool has a continuation for the current draft context, the
draft checks the whole phrase in one forward (on a CPU a forward over 8 tokens costs about one over 1),
keeps the prefix that equals its own argmax plus its own next token, and asks the policy before each kept
token exactly as token-by-token drafting would (features - ``prob``, ``top_prob``, ``entropy``, hidden
states - come from the forward that checked the token; ``phrase=True`` marks pool tokens). The drafted
tokens are therefore the draft's own greedy tokens: only the number of draft forwards changes. Without a
phrase it drafts one token per forward. How much of a phrase to check is priced by the policy
(:meth:`~pacer.policies.DraftPolicy.phrase_room`) from how often the draft agreed with phrases of the same *kind* of
entry (its source and key length; :meth:`PhrasePool.agreement`): a source whose phrases the draft rarely agrees with
is not checked where a longer draft forward costs something.

**Sampling mode**: phrase drafting would only be lossless with ``q`` the distribution each token was drawn
from; this drafter keeps it simple and correct - with ``temperature > 0`` it drafts token by token exactly
like :class:`~pacer.drafters.token.TokenDrafter` (same random draws, so the same output as ``sd`` for a seed) and
proposes no candidate branches. The pool still learns from the prompt and output.

**Candidate branches** (greedy, ``candidates`` > 0). After the draft, up to ``candidates`` continuations of
the drafted context are attached after ``d_γ`` (first: the rest of a phrase the draft agreed with but the
policy cut; then pool continuations with distinct first tokens, each at most ``candidate_len`` tokens). The
loop verifies them with the draft in one target forward as a tree (see :class:`~pacer.decoding.Draft`); if
all ``γ`` draft tokens are accepted the longest matching branch extends the round. Accepted branch tokens
are not kept in the target's cache (it is cropped to the main draft) but re-fed with the next round's
forward: target cost is flat in the number of new tokens on this CPU, so this costs ~nothing and keeps the
rollback a plain crop.

**Pool rounds** (greedy, ``candidates`` > 0). Where the policy drafts nothing (e.g. the cost rule at a long context,
where a draft token is dear), the pool's continuations of the committed text are still verified after the pending
token when the policy prices them as paying (``branch_room(0)``: the cost rule with its own learnt yield for such
branches; never on a curve where a scored token costs a forward, never without a cost model): the round makes no
draft forward, and a matching continuation is committed as an extension. Otherwise a round that drafts nothing does
no pool work at all.
"""

from __future__ import annotations

import json
import time
import weakref
from collections import Counter, OrderedDict
from pathlib import Path

from ..decoding import Draft, ModelBackend, Proposal
from ..errors import PacerError
from ..io import atomic_write_text
from ..policies.base import DraftState
from ..sampling import argmax
from .sources import LOOKUP_LEN, SourceEvidence
from .token import TokenDrafter

SOURCES = ("prompt", "output", "verify", "lookahead")
#: a candidate branch found in the generation's own text (:class:`pacer.drafters.sources.LookupIndex`), not the pool
LOOKUP = "lookup"
Key = tuple[int, ...]


class PhrasePool:
    """N-grams keyed by their first token(s), at most ``capacity`` entries, least recently used evicted."""

    def __init__(self, ngram: int = 6, capacity: int = 20000, key_len: int = 2) -> None:
        if ngram < 1 or capacity < 1 or key_len < 1:
            raise PacerError(f"phrase pool needs ngram, pool size and key length >= 1 "
                             f"(got {ngram}, {capacity}, {key_len})")
        self.ngram, self.capacity, self.key_len = ngram, capacity, key_len
        #: (key, continuation) -> [source, generation that last added it]; order = recency (last = newest)
        self.entries: OrderedDict[tuple[Key, Key], list] = OrderedDict()
        #: key -> continuations in recency order (mirrors ``entries``)
        self.index: dict[Key, OrderedDict[Key, None]] = {}
        self.generation = 0
        self.added: Counter = Counter()
        #: how often the draft agreed with phrase token ``j`` (index ``j - 1``) after agreeing with the ones before:
        #: ``[agreed, checked]`` per position (:meth:`agreement`); kept with the pool across generations
        self.agreed = [[0, 0] for _ in range(ngram)]
        #: the same per *kind* of entry checked (:meth:`kind`: its source and key length), which says much of the
        #: draft's agreement: on the default pair the draft agreed with the first token of 10% of lookahead guesses
        #: and of 54% of output phrases found by a 2-token key (an ad hoc count on 8 held-out questions)
        self.agreed_by: dict[tuple[str, int], list[list[int]]] = {}
        self.skipped = 0  # lookups left out since the last phrase check (see PhraseDrafter._phrase_len)
        #: what each phrase source would have yielded, over the generations that used this pool
        #: (:class:`pacer.drafters.sources.SourceEvidence`; made by the first drafter that chooses sources)
        self.evidence = None

    #: prior of :meth:`agreement`: the chance, and its weight in phrase checks
    AGREE_PRIOR, AGREE_WEIGHT = 0.5, 2.0

    def agreement(self, n: int, kind: tuple[str, int] | None = None) -> list[float]:
        """The chance that the draft agrees with phrase token ``j`` given the ones before, ``j = 1..n``: over every
        phrase checked, or for an entry of ``kind`` (:meth:`kind`), that kind's own rate shrunk towards the overall
        one with the same weight as the prior."""
        by = self.agreed_by.get(kind) if kind is not None else None
        out = []
        for j in range(min(n, self.ngram)):
            a, c = self.agreed[j]
            p = (a + self.AGREE_PRIOR * self.AGREE_WEIGHT) / (c + self.AGREE_WEIGHT)
            if by is not None:
                a, c = by[j]
                p = (a + p * self.AGREE_WEIGHT) / (c + self.AGREE_WEIGHT)
            out.append(p)
        return out

    def learn_agreement(self, checked: int, agreed: int, kind: tuple[str, int] | None = None) -> None:
        """A phrase of ``checked`` tokens (an entry of ``kind``) of which the draft's argmax matched the first
        ``agreed``."""
        rows = [self.agreed]
        if kind is not None:
            rows.append(self.agreed_by.setdefault(kind, [[0, 0] for _ in range(self.ngram)]))
        for j in range(min(checked, agreed + 1, self.ngram)):
            for row in rows:
                row[j][1] += 1
                row[j][0] += j < agreed

    def kind(self, key: Key, cont: Key) -> tuple[str, int]:
        """An entry's kind for :meth:`agreement`: the source that added it last and its key's length."""
        return self.entries[(key, cont)][0], len(key)

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, key: Key, cont: Key, source: str) -> None:
        item = (key, cont)
        if item in self.entries:
            self.entries.move_to_end(item)
            self.entries[item] = [source, self.generation]
            self.index[key].move_to_end(cont)
            return
        self.entries[item] = [source, self.generation]
        self.index.setdefault(key, OrderedDict())[cont] = None
        self.added[source] += 1
        while len(self.entries) > self.capacity:
            (k, c), _ = self.entries.popitem(last=False)
            conts = self.index[k]
            del conts[c]
            if not conts:
                del self.index[k]

    def add_sequence(self, seq: list[int], source: str, first_cont: int = 1, min_end: int = 0,
                     partial: bool = False) -> None:
        """Add the n-grams of ``seq`` whose continuation starts at or after index ``first_cont`` and whose
        last token is at or after ``min_end`` (the part not added before). Continuations are ``ngram`` long;
        with ``partial`` a shorter one (>= 2 tokens) at the end of ``seq`` is kept too."""
        N = self.ngram
        for i in range(max(first_cont, 1) - 1, len(seq) - 1):  # i: last key token
            cont = tuple(seq[i + 1 : i + 1 + N])
            if len(cont) < N and not (partial and len(cont) >= min(2, N)):
                break
            if i + len(cont) < min_end:
                continue
            for k in range(1, self.key_len + 1):
                if i - k + 1 < 0:
                    break
                self.add(tuple(seq[i - k + 1 : i + 1]), cont, source)

    def lookup(self, context: list[int], k: int = 1,
               exclude_first: set[int] | None = None) -> list[tuple[Key, Key]]:
        """Up to ``k`` ``(key, continuation)`` pairs continuing ``context``: longest key first, newest first,
        distinct first tokens (none in ``exclude_first``)."""
        out: list[tuple[Key, Key]] = []
        firsts = set(exclude_first or ())
        for kl in range(min(self.key_len, len(context)), 0, -1):
            key = tuple(context[-kl:])
            for cont in reversed(self.index.get(key, ())):
                if cont[0] in firsts:
                    continue
                out.append((key, cont))
                firsts.add(cont[0])
                if len(out) >= k:
                    return out
        return out

    def touch(self, key: Key, cont: Key) -> str:
        """Mark an entry as used (newest); returns its source (``warm``: added by an earlier generation)."""
        item = (key, cont)
        if item not in self.entries:
            return "evicted"
        source, gen = self.entries[item]
        self.entries.move_to_end(item)
        self.index[key].move_to_end(cont)
        return source if gen == self.generation else "warm"

    def counts(self) -> dict[str, int]:
        c = Counter(s for s, _ in self.entries.values())
        return {s: c.get(s, 0) for s in SOURCES}

    # ------------------------------------------------------------------------------------------------ files
    def save(self, path: Path | str, vocab: int) -> None:
        """Write the pool as JSON, atomically (temporary file in the same folder, then rename); a place that cannot
        be written is a one-line error."""
        entries = [[list(k), list(c), s] for (k, c), (s, _) in self.entries.items()]
        data = {"format": "pacer-phrase-pool", "version": 1, "vocab": vocab, "ngram": self.ngram,
                "key_len": self.key_len, "entries": entries}
        try:
            atomic_write_text(Path(path), json.dumps(data, separators=(",", ":")))
        except OSError as e:
            raise PacerError(f"cannot write the phrase pool file {path} ({e.strerror or e}); pass another pool_file "
                             f"(in a folder you can write to)") from None

    def load(self, path: Path | str, vocab: int) -> int:
        """Add the entries of a saved pool (as made by an earlier generation); returns how many were read. Anything
        but such a file (:func:`read_pool_file`) is a one-line error, and the pool is left as it was."""
        entries = read_pool_file(path, vocab)
        gen, self.generation = self.generation, self.generation - 1  # loaded entries count as warm
        for k, c, s in entries:
            if s in SOURCES and 1 <= len(k) <= self.key_len and c:
                self.add(tuple(k), tuple(c[: self.ngram]), s)
        self.generation = gen
        return len(entries)


def read_pool_file(path: Path | str, vocab: int | None = None) -> list:
    """The entries of a saved phrase pool, checked: unreadable, not JSON text, not a pacer phrase pool, another
    vocabulary (where ``vocab`` is given: the models are loaded) or entries of the wrong shape or with ids outside
    the vocabulary are a one-line :class:`PacerError` saying what to do. Run before any model loads (the option's
    preflight, ``vocab=None``) and again at load."""
    path = Path(path)
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as e:
        raise PacerError(f"phrase pool file {path} cannot be read ({e.strerror or e}); pass another pool_file "
                         f"(or a new name)") from None
    except ValueError as e:  # UnicodeDecodeError, JSONDecodeError
        raise PacerError(f"phrase pool file {path} cannot be read (not JSON text: {type(e).__name__}); delete "
                         f"it or pass another pool_file (or a new name)") from None
    if not isinstance(data, dict) or data.get("format") != "pacer-phrase-pool" \
            or not isinstance(data.get("entries"), list):
        raise PacerError(f"phrase pool file {path} cannot be read (not a pacer phrase pool); delete it or pass "
                         f"another pool_file (or a new name)")
    size = data.get("vocab")
    if type(size) is not int or size < 1:
        raise PacerError(f"phrase pool file {path} cannot be read (its vocab is {size!r}, not a token count); "
                         f"delete it or pass another pool_file (or a new name)")
    if vocab is not None and size != vocab:
        raise PacerError(f"phrase pool file {path} was made for another vocabulary ({size} tokens, "
                         f"not {vocab}); delete it or pass another pool_file (or a new name)")

    def ids(x: object) -> bool:
        return isinstance(x, list) and all(type(i) is int and 0 <= i < size for i in x)

    entries = data["entries"]
    if not all(isinstance(e, list) and len(e) == 3 and ids(e[0]) and ids(e[1]) and isinstance(e[2], str)
               for e in entries):
        raise PacerError(f"phrase pool file {path} cannot be read (an entry is not [key ids, continuation ids, "
                         f"source] with ids below {size}); delete it or pass another pool_file (or a new "
                         f"name)")
    return entries


def check_pool_file(value: str) -> None:
    """The ``pool_file`` option's check before any model loads: a file that can be written and, where it exists,
    a phrase pool (:func:`read_pool_file`; its vocabulary is checked again once the models are loaded)."""
    from ..io import check_out_file

    path = check_out_file(value, "option pool_file")
    if path.exists():
        read_pool_file(path)


def learn_committed(pool: PhrasePool, tokens: list[int], seen: int, learn) -> int:
    """Hand ``learn(seq, source, **kw)`` the tokens committed since ``seen`` of them were (the prompt, ``seen == 0``;
    else the output's new n-grams, with enough context for their keys); returns the new ``seen``."""
    if seen == 0:
        learn(tokens, "prompt")
    elif len(tokens) > seen:
        lo = max(0, seen - pool.ngram - pool.key_len)
        learn(tokens[lo:], "output", min_end=seen - lo)
    return len(tokens)


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


def rejection_phrase(tokens: list[int], draft: list[int], target_argmax: list[int], accepted: int,
                     key_len: int) -> tuple[list[int], int] | None:
    """After ``d_{n+1}`` was rejected, the target's own greedy tokens continue the text: ``(sequence, index of its
    first continuation token)`` for the pool, keyed by the text before them; ``None`` when nothing was rejected."""
    γ, n = len(draft), accepted
    if n >= γ or len(target_argmax) < γ + 1:
        return None
    a = target_argmax[-(γ + 1) :]
    if len(a) - n - 1 < 1:
        return None
    ctx = (tokens + draft[: n + 1])[-key_len:]
    return ctx + a[n + 1 :], len(ctx)


#: pools shared by drafters on the same draft model (warm start): the backend's identity -> settings -> pool
_SHARED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def shared_pool(model: object, ngram: int, capacity: int, key_len: int, tag: str = "") -> PhrasePool:
    per_model = _SHARED.setdefault(model, {})
    key = (ngram, capacity, key_len, tag)
    if key not in per_model:
        per_model[key] = PhrasePool(ngram, capacity, key_len)
    return per_model[key]


def clear_shared_pools() -> None:
    """Forget every warm-start pool of this process (benchmarks use it between configurations)."""
    _SHARED.clear()


class SiblingRate:
    """How often the draft's second choice is the target's token where the target rejected its first choice,
    against the draft's own estimate of that, ``second / (1 - q)`` (optimistic: the draft's runner-up is not the
    target's): ``ratio`` (the hits over the estimates summed, shrunk towards ``PRIOR`` with ``WEIGHT`` estimated
    hits) scales the estimates a cost rule prices siblings with. Learnt from every greedy round with a rejection,
    whether a sibling was scored there or not, for the drafter's life (as its phrase pool)."""

    PRIOR, WEIGHT = 1.0, 2.0

    def __init__(self) -> None:
        self.estimated = self.hits = 0.0
        self.observations = 0

    @property
    def ratio(self) -> float:
        return (self.hits + self.PRIOR * self.WEIGHT) / (self.estimated + self.WEIGHT)

    def hits_of(self, raw: list[float]) -> list[float]:
        """The learnt chance per position that the sibling is the target's token, from the draft's estimates."""
        r = self.ratio
        return [min(1.0, r * h) for h in raw]

    def update(self, raw: float, hit: bool) -> None:
        self.estimated += raw
        self.hits += hit
        self.observations += 1


def sibling_estimates(st: DraftState) -> list[float]:
    """The draft's estimate per drafted position ``i`` that its second choice is the target's token, given that
    the target rejects its first: ``second_prob[i] / (1 - prob[i])``."""
    return [min(1.0, st.second_prob[i] / max(1.0 - st.prob[i], 1e-6)) for i in range(len(st.second_token))]


class PhraseDrafter(TokenDrafter):
    """Ouroboros drafter (see the module docstring). Options (registered in :mod:`pacer.methods.phrase`:
    ``Decoder.generate(options=...)`` keys, ``pacer bench`` keys, CLI flags):

    ``ngram`` phrase (continuation) length, ``pool_size`` pool capacity in entries, ``candidates`` candidate
    branches per round (0: none), ``candidate_len`` longest branch (default ``ngram``), ``key_len`` longest
    key,
    ``sources`` the pool sources used (a subset of ``prompt,output,verify,lookahead``; a comma string works),
    ``warm_start`` share the pool across generations, ``pool_file`` load/save the pool, ``phrases`` draft
    phrase by phrase (False: token by token, e.g. to measure candidates alone), ``tree_size`` most tokens
    one verification may score with the branches (default 10, ``None``: no cap): a target forward costs about
    the same for 1..8-10 tokens on this CPU and clearly more beyond, so branches only fill that flat part;
    ``siblings`` most sibling branches per round (default 0): the draft's second choice beside a draft token,
    where the policy prices it as paying (:meth:`pacer.policies.DraftPolicy.sibling_room`; a target backend
    that scores no such tree gets none); ``choose`` (default true; greedy, under a cost model) per round the
    draft model, a phrase verified alone or both, by predicted payoff (:mod:`pacer.drafters.sources`).
    """

    def __init__(self, backend: ModelBackend, vocab: int, ngram: int | None = None,
                 pool_size: int | None = None, candidates: int | None = None,
                 candidate_len: int | None = None, key_len: int = 2,
                 sources: str | tuple[str, ...] | list[str] = SOURCES, warm_start: bool = True,
                 pool_file: str | Path | None = None, phrases: bool = True, pool_tag: str = "",
                 tree_size: int | None = 10, siblings: int | None = None, choose: bool = True,
                 lookup_len: int | None = None) -> None:
        super().__init__(backend, vocab)
        self.lookup_len = LOOKUP_LEN if lookup_len is None else int(lookup_len)
        ngram = 6 if ngram is None else int(ngram)
        pool_size = 20000 if pool_size is None else int(pool_size)
        self.candidates = 2 if candidates is None else int(candidates)
        self.candidate_len = int(candidate_len) if candidate_len is not None else ngram
        self.siblings = 0 if siblings is None else int(siblings)
        if self.siblings:  # a sibling is the draft's second choice, priced from q(d_i) and the second's probability
            self.needs = frozenset({"prob", "second_prob", "second_token"})
        if self.candidates < 0 or self.candidate_len < 1 or self.siblings < 0 or self.lookup_len < 1:
            raise PacerError(f"candidates and siblings must be >= 0 (got {self.candidates}, {self.siblings}), "
                             f"candidate_len and lookup_len >= 1")
        self.tree_size = int(tree_size) if tree_size else None
        if isinstance(sources, str):
            sources = tuple(s.strip() for s in sources.replace("+", ",").split(",") if s.strip())
        bad = [s for s in sources if s not in SOURCES]
        if bad:
            raise PacerError(f"unknown phrase source(s) {', '.join(bad)}; choose from {', '.join(SOURCES)}")
        self.sources = set(sources)
        self.phrases = bool(phrases)
        if warm_start:
            tag = f"{pool_tag}|{','.join(sorted(self.sources))}"
            self.pool = shared_pool(backend.identity, ngram, pool_size, key_len, tag)
        else:
            self.pool = PhrasePool(ngram, pool_size, key_len)
        self.pool_file = Path(pool_file) if pool_file else None
        if self.pool_file is not None:  # it is saved after the generation: refuse a path that cannot be written now
            from ..io import check_out_file

            check_out_file(self.pool_file, "pool_file")
        if self.pool_file is not None and self.pool_file.exists() and len(self.pool) == 0:
            self.pool.load(self.pool_file, vocab)
        self.counts: Counter = Counter()
        self.phrase_hits: Counter = Counter()  # draft phrases with >= 1 kept token, by the entry's source
        self.candidate_hits: Counter = Counter()  # accepted branches, by source (``leftover``: cut phrase)
        self._leftover: list[int] = []
        self._last: Draft | None = None
        #: per branch scored, its pool entry (``None``: a phrase the draft agreed with; :data:`LOOKUP`: the lookup)
        self._branch_keys: list[tuple[Key, Key] | str | None] = []
        self._seen = 0
        self.sibling_rate = SiblingRate()
        self.choose = bool(choose)
        if self.pool.evidence is None:
            self.pool.evidence = SourceEvidence(self.lookup_len)
        self.evidence: SourceEvidence = self.pool.evidence
        self.index = LookupIndex(self.lookup_len)
        self._phrase_round = False

    # ----------------------------------------------------------------------------------------------- pool
    def _learn(self, seq: list[int], source: str, **kw) -> None:
        if source in self.sources:
            self.pool.add_sequence(seq, source, **kw)

    def _sync(self, tokens: list[int]) -> None:
        """Add the tokens committed since the last proposal (the prompt at the first one)."""
        self._seen = learn_committed(self.pool, tokens, self._seen, self._learn)

    # ------------------------------------------------------------------------------------------ interface
    def reset(self) -> None:
        super().reset()
        self.pool.generation += 1
        self.evidence.new_generation()
        self.index = LookupIndex(self.lookup_len)
        self._phrase_round = False
        self.counts = Counter()
        self.phrase_hits = Counter()
        self.candidate_hits = Counter()
        self._leftover = []
        self._last = None
        self._seen = 0

    def propose(self, tokens, policy, budget, sampling, gen, remaining: int = 0) -> Draft:
        """A round that drafts nothing does no pool work and proposes no branches (the pool catches up with the
        committed tokens at the next round that drafts: :func:`learn_committed` is incremental)."""
        self._pool_seconds = 0.0
        self._phrase_round = False
        if sampling.greedy and self.choose and budget > 0:
            draft = self._timed(self._choose, tokens, policy, budget, remaining)
            if draft is not None:
                self._phrase_round = True
                self.counts["rounds"] += 1
                self.counts["phrase_rounds"] += 1
                draft.pool_time = self._pool_seconds
                self._last = draft
                return draft
        if not sampling.greedy or not self.phrases:
            draft = super().propose(tokens, policy, budget, sampling, gen, remaining)
            if draft.tokens:
                self._timed(self._sync, tokens)
        else:
            draft = self._propose_phrases(tokens, policy, budget, remaining)
        self.counts["rounds"] += 1
        self.counts["draft_tokens"] += len(draft.tokens)
        self.counts["draft_forwards"] += draft.forwards
        if sampling.greedy and (self.candidates or self.siblings) and draft.tokens:
            self._timed(self._add_candidates, tokens, draft, policy)
        elif sampling.greedy and self.candidates and not draft.tokens and budget > 0 \
                and policy.branch_room(0, self._pool_yield(tokens)) > 0:
            self._timed(self._pool_candidates, tokens, draft)
            draft.branch_yield = self._pool_yield(tokens)
        draft.pool_time = self._pool_seconds
        self._last = draft
        return draft

    def _timed(self, fn, *args, **kw):
        """``fn(*args, **kw)``, its seconds counted as pool work (``Draft.pool_time``)."""
        t = time.perf_counter()
        try:
            return fn(*args, **kw)
        finally:
            self._pool_seconds += time.perf_counter() - t

    def _choose(self, tokens: list[int], policy, budget: int, remaining: int = 0) -> Draft | None:
        """Score the sources' earlier predictions against the committed ``tokens``, record theirs for this one, and
        return a round that verifies the best phrase alone (no draft forward) where its expected committed tokens
        per second beat a draft round's (:meth:`pacer.policies.DraftPolicy.phrase_rate`, ``draft_rate``); ``None``:
        the draft model drafts (with phrases and branches where they pay). See :mod:`pacer.drafters.sources`."""
        rate_d = policy.draft_rate(max(0, len(tokens) - self.backend.length - 1), remaining)
        if rate_d is None or policy.phrase_rate([1.0] * min(self.lookup_len, budget))[1] <= rate_d * (1 + 1e-9):
            return None  # no cost model, or not even a phrase all right would pay (a linear curve): no pool work
        ev = self.evidence
        if self.index.seen:  # every position committed since the last choice predicts too, from the text before it
            for pos in range(self.index.seen + 1, len(tokens)):
                self.index.sync(tokens, pos)
                k, cont = self.index.find(tokens[max(0, pos - self.index.pool.key_len) : pos])
                ev.predict(("lookup", k), pos, cont)
        ev.score(tokens)
        self.index.sync(tokens)
        self._sync(tokens)
        at = len(tokens)
        found: list[tuple[tuple[str, int], tuple[int, ...], tuple[Key, Key] | None]] = []
        k, cont = self.index.find(tokens)
        if cont:  # the generation's own text, the prompt first: the first phrase source
            found.append((("lookup", k), cont, None))
        for kc in self.pool.lookup(tokens, 1):
            found.append((("pool", len(kc[0])), kc[1], kc))
        for kind, phrase, _ in found:
            ev.predict(kind, at, phrase)
        if not found:
            return None
        best, best_rate = None, rate_d
        for kind, phrase, kc in found:
            L, rate = policy.phrase_rate(ev.accept(kind, min(len(phrase), budget)))
            if L and rate > best_rate:
                best, best_rate = (list(phrase[:L]), kc), rate
        if best is None:
            return None
        draft = Draft([], None, DraftState(), branches=[best[0]], anchors=[0])
        draft.branch_total = len(best[0])
        self._branch_keys = [best[1]]
        self._leftover = []
        return draft

    def _pool_yield(self, tokens: list[int]) -> float | None:
        """This generation's evidence of what the pool's continuation of ``tokens`` yields per token scored
        (``None``: not choosing sources, the policy's own yield)."""
        if not self.choose:
            return None
        found = self.pool.lookup(tokens, 1)
        kind = ("pool", len(found[0][0])) if found else ("pool", 1)
        return self.evidence.branch_yield(kind, self.candidate_len)

    def _propose_phrases(self, tokens, policy, budget, remaining: int = 0) -> Draft:
        p = Proposal(policy, budget, len(tokens) - self.backend.length - 1, remaining, needs=self.needs)  # greedy
        self._leftover = []
        synced = False
        while p.ask():
            if not synced:  # the first token of the round pays: the pool learns what was committed since
                self._timed(self._sync, tokens)
                synced = True
            ctx = tokens + p.state.tokens
            pending = p.feed_apart(self.backend, ctx[self.backend.length :])
            room = budget - p.n  # tokens this forward may still add (its phrase tokens + the draft's own)
            found = self._timed(self.pool.lookup, ctx, 1) if room > 1 else []
            key, phrase = found[0] if found else ((), ())
            kind = self.pool.kind(key, phrase) if found else None
            phrase = list(phrase[: self._phrase_len(policy, len(pending), min(room - 1, len(phrase)), kind)])
            start = self.backend.length + len(pending)  # cache length once pending is in
            # read before the next forward: the logits may be a view of the backend's memory
            logits, hidden = self.backend.forward_view(pending + phrase, hidden=p.layers is not None,
                                                       keep=len(phrase) + 1)
            p.forwards += 1
            # row j predicts the token after phrase[:j]; greedy over the scored ids alone (TokenDrafter.scored_ids)
            ids = self.scored_ids()
            rows = (logits[:, ids] if ids is not None else self.align(logits)).float()
            if not phrase:  # no phrase checked: the draft's own token, its argmax found with its features
                p.add(None, None, hidden, len(pending) - 1, ids=ids, logits=rows[0])
                continue
            at = argmax(rows)
            guess = at if ids is None else ids[at].tolist()
            k = 0
            while k < len(phrase) and phrase[k] == guess[k]:
                k += 1
            if phrase:
                self.pool.learn_agreement(len(phrase), k, kind)
            new = phrase[:k] + [guess[k]]  # the draft's own greedy tokens
            kept = 0
            for j, x in enumerate(new):
                if j and not p.ask(free=True):
                    break
                p.add(None, x, hidden, len(pending) - 1 + j, phrase=j < k,
                      index=at[j] if ids is not None else None, ids=ids, logits=rows[j])
                kept += 1
            self.backend.crop(start + min(kept, k))  # keep only kept phrase tokens in the cache
            if phrase:
                self.counts["phrase_forwards"] += 1
                self.counts["phrase_tokens"] += min(kept, k)
                if k:
                    self.phrase_hits[self.pool.touch(key, found[0][1])] += 1
                if k < len(phrase):
                    # Jacobi iterate: the draft's argmax at every position from the first disagreement on
                    tail = (ctx + phrase[:k])[-self.pool.key_len :]
                    self._timed(self._learn, tail + guess[k:], "lookahead", first_cont=len(tail), partial=True)
            if kept < len(new):
                self._leftover = new[kept:]  # agreed by the draft but cut by the policy / budget
                break
        return p.draft()

    #: where phrases do not pay, one lookup in this many still checks a one-token phrase (so that the agreement
    #: estimate keeps learning)
    EXPLORE = 16

    def _phrase_len(self, policy, fed: int, most: int, kind: tuple[str, int] | None = None) -> int:
        """The longest phrase worth checking in a draft forward that reads ``fed`` unread tokens (at most
        ``most``, of an entry of ``kind``): the policy prices it (:meth:`pacer.policies.DraftPolicy.phrase_room`)
        from the pool's learned agreement for that kind; where none pays, a one-token check now and then keeps the
        estimate learning."""
        if most <= 0:
            return 0
        n = policy.phrase_room(fed, self.pool.agreement(most, kind))
        if n > 0:
            self.pool.skipped = 0
            return n
        self.pool.skipped += 1
        if self.pool.skipped >= self.EXPLORE:
            self.pool.skipped = 0
            return 1
        return 0

    def _add_candidates(self, tokens: list[int], draft: Draft, policy) -> None:
        """Candidate continuations after ``d_γ`` and siblings (the draft's second choices where the policy prices
        them as paying), all within ``tree_size`` (siblings take their room first)."""
        ctx = tokens + draft.tokens
        γ = len(draft.tokens)
        left = self.tree_size - 1 - γ if self.tree_size else 1 << 30  # 1: the pending token
        st = draft.state
        sib: list[int] = []
        if self.siblings and len(st.second_token) == γ:
            hits = self.sibling_rate.hits_of(sibling_estimates(st))
            sib = sorted(policy.sibling_room(st, hits)[: min(self.siblings, max(left, 0))])
        left -= len(sib)
        found: list[tuple[tuple[Key, Key] | None, list[int]]] = []
        if self._leftover and self.candidates:
            found.append((None, self._leftover))
        firsts = {b[0] for _, b in found}
        if self.candidates > len(found):
            found += [(kc, list(kc[1])) for kc in self.pool.lookup(ctx, self.candidates - len(found), firsts)]
        kind = next((("pool", len(kc[0])) for kc, _ in found if kc is not None), None)
        if self.choose and self.candidates and not self._leftover:
            k, cont = self.index.find(ctx)  # the generation's own text, the prompt first, where it earned it
            if cont and (kind is None or self.evidence.accept(("lookup", k), 1)[0]
                         >= self.evidence.accept(kind, 1)[0]):
                found = [(LOOKUP, list(cont))] + [f for f in found if f[1][0] != cont[0]]
                found, kind = found[: self.candidates], ("lookup", k)
        branches, keys = self._fit(found, left)
        if self.choose and keys and keys[0] is not None and kind is not None:  # this generation's evidence prices
            draft.branch_yield = self.evidence.branch_yield(kind, self.candidate_len)
        self._leftover = []
        # siblings last: where the loop drops them (a backend without such trees), the others keep their index
        draft.branches = branches + [[st.second_token[i]] for i in sib]
        draft.anchors = [γ] * len(branches) + sib
        self._branch_keys = keys
        self.counts["siblings"] += len(sib)

    def _fit(self, found: list, left: int) -> tuple[list[list[int]], list[tuple[Key, Key] | None]]:
        """The ``(pool entry or None, tokens)`` continuations in ``found``, each cut to ``candidate_len`` and all
        together to ``left`` tokens: ``(branches, their pool entries)``."""
        branches: list[list[int]] = []
        keys: list[tuple[Key, Key] | None] = []
        for kc, b in found:
            b = list(b[: min(self.candidate_len, left)])
            if b:
                branches.append(b)
                keys.append(kc)
                left -= len(b)
        return branches, keys

    def _pool_candidates(self, tokens: list[int], draft: Draft) -> None:
        """A round whose draft model drafts nothing, where the policy prices pool continuations as paying
        (:meth:`pacer.policies.DraftPolicy.branch_room` of 0, e.g. a flat verification curve and a draft model too
        dear to run): up to ``candidates`` continuations of the committed text from the pool, each at most
        ``candidate_len`` tokens, within ``tree_size``, verified after the pending token (one alone is a chain).
        The pool catches up with the committed tokens first; no draft forward."""
        self._sync(tokens)
        left = self.tree_size - 1 if self.tree_size else 1 << 30
        branches, keys = self._fit([(kc, kc[1]) for kc in self.pool.lookup(tokens, self.candidates)], left)
        draft.branches, draft.anchors = branches, [0] * len(branches)
        self._branch_keys = keys
        self._leftover = []

    reads_target_argmax = True  # the target's text past a rejection is a phrase (rejection_phrase)

    def observe(self, tokens: list[int], target_argmax: list[int], accepted: int) -> None:
        draft, n = self._last, accepted
        if draft is None:
            return
        if self._phrase_round:  # a phrase verified alone (_choose)
            self.counts["phrase_round_tokens"] += sum(len(b) for b in draft.branches)
            self.counts["phrase_round_accepted"] += len(draft.extension)
            if draft.extension and self._branch_keys and self._branch_keys[0] is not None:
                self.candidate_hits[self.pool.touch(*self._branch_keys[0])] += 1
            return
        if not draft.tokens:  # a round of pool continuations alone (_pool_candidates)
            if draft.branches:
                self.counts["pool_rounds"] += 1
                self.counts["pool_tokens"] += sum(len(b) for b in draft.branches)
                self.counts["pool_accepted_tokens"] += len(draft.extension)
                if draft.extension and 0 <= draft.branch < len(self._branch_keys):
                    self.candidate_hits[self.pool.touch(*self._branch_keys[draft.branch])] += 1
            return
        if (found := rejection_phrase(tokens, draft.tokens, target_argmax, n, self.pool.key_len)) is not None:
            self._learn(found[0], "verify", first_cont=found[1], partial=True)
        st = draft.state
        if self.siblings and st.temperature == 0 and n < len(st.second_token) and n < len(target_argmax):
            self.sibling_rate.update(sibling_estimates(st)[n], target_argmax[n] == st.second_token[n])
        if draft.branches:
            self.counts["candidate_rounds"] += 1
            self.counts["candidates"] += len(draft.branches)
            self.counts["candidate_tokens"] += sum(len(b) for b in draft.branches)
            if draft.extension and draft.anchor(draft.branch) < len(draft.tokens):
                self.counts["siblings_accepted"] += 1
            elif draft.extension:
                self.counts["candidate_accepted_rounds"] += 1
                self.counts["candidate_accepted_tokens"] += len(draft.extension)
                item = self._branch_keys[draft.branch] if 0 <= draft.branch < len(self._branch_keys) else None
                self.candidate_hits["leftover" if item is None else item if item == LOOKUP
                                    else self.pool.touch(*item)] += 1

    def finish(self) -> None:
        if self.pool_file is not None:
            self.pool.save(self.pool_file, self.vocab)

    def report(self) -> dict:
        c = self.counts
        return {
            "rounds": c["rounds"],
            "draft_tokens": c["draft_tokens"],
            "draft_forwards": c["draft_forwards"],
            "phrase_forwards": c["phrase_forwards"],
            "phrase_hits": sum(self.phrase_hits.values()),
            "phrase_tokens": c["phrase_tokens"],
            "tokens_per_draft_forward": round(c["draft_tokens"] / max(c["draft_forwards"], 1), 3),
            "candidate_rounds": c["candidate_rounds"],
            "candidates_proposed": c["candidates"],
            "candidate_tokens_proposed": c["candidate_tokens"],
            "candidate_accepted_rounds": c["candidate_accepted_rounds"],
            "candidate_accepted_tokens": c["candidate_accepted_tokens"],
            "candidate_acceptance": round(c["candidate_accepted_rounds"] / c["candidate_rounds"], 4)
            if c["candidate_rounds"] else 0.0,
            "phrase_hits_by_source": dict(self.phrase_hits),
            "candidate_hits_by_source": dict(self.candidate_hits),
            "phrase_rounds": c["phrase_rounds"],
            "phrase_round_tokens": c["phrase_round_tokens"],
            "phrase_round_accepted": c["phrase_round_accepted"],
            "pool_rounds": c["pool_rounds"],
            "pool_tokens_proposed": c["pool_tokens"],
            "pool_accepted_tokens": c["pool_accepted_tokens"],
            "siblings_proposed": c["siblings"],
            "siblings_accepted": c["siblings_accepted"],
            "sibling_hit_ratio": round(self.sibling_rate.ratio, 4),
            "sibling_observations": self.sibling_rate.observations,
            "pool_size": len(self.pool),
            "pool_capacity": self.pool.capacity,
            "pool_by_source": self.pool.counts(),
            "pool_added_by_source": {s: self.pool.added.get(s, 0) for s in SOURCES},
            "sources": sorted(self.sources),
        }
