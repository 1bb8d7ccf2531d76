"""The Ouroboros phrase pool: n-grams of text the target wrote or read, keyed by their first token(s).

An entry is an n-gram split into a *key* (its first 1..``key_len`` tokens) and a *continuation* (the next ``ngram``
tokens, shorter only for one-shot sources). Entries live in one LRU of at most ``capacity`` entries (each n-gram is
stored once per key length, every copy counts); a lookup takes the longest key that matches the end of the context
and returns the most recently used continuations. Sources:

* ``prompt``    - the prompt's n-grams (at the first proposal of a generation);
* ``output``    - the committed output (every committed token is the target's own choice);
* ``verify``    - the target's argmax *after the first mismatch* of a round, which plain SD throws away:
  ``[d_{n+1}, a_{n+1}, a_{n+2}, ...]`` is the target's own continuation of the rejected token
  (:func:`rejection_phrase`);
* ``lookahead`` - Jacobi-style guesses of the draft: when the draft checks a phrase and disagrees at
  position ``k``, its argmax at positions ``k..m`` (computed by that same forward) is the next Jacobi
  iterate of the phrase;
* warm start    - pools are shared by every drafter on the same draft model and settings in this process
  (:func:`shared_pool`), so a prompt starts with what earlier generations left; hits on entries made by an earlier
  generation are counted as ``warm``. A pool file (:meth:`PhrasePool.save`, :func:`read_pool_file`) keeps one
  between processes.

The pool also keeps how often the draft agreed with the phrases it checked, per kind of entry
(:meth:`PhrasePool.agreement`): what a phrase check is priced with.
"""

from __future__ import annotations

import json
import weakref
from collections import Counter, OrderedDict
from pathlib import Path

from ..bounds import MAX_KEY, MAX_PHRASE, MAX_POOL
from ..errors import PacerError
from ..io import atomic_write_text, read_json
from ..pricing import Pricer

SOURCES = ("prompt", "output", "verify", "lookahead")
Key = tuple[int, ...]


class PhrasePool:
    """N-grams keyed by their first token(s), at most ``capacity`` entries, least recently used evicted."""

    def __init__(self, ngram: int = 6, capacity: int = 20000, key_len: int = 2) -> None:
        if ngram < 1 or capacity < 1 or key_len < 1:
            raise PacerError(f"phrase pool needs ngram, pool size and key length >= 1 "
                             f"(got {ngram}, {capacity}, {key_len})")
        if ngram > MAX_PHRASE or capacity > MAX_POOL or key_len > MAX_KEY:  # each entry holds a continuation
            raise PacerError(f"phrase pool takes ngram <= {MAX_PHRASE}, pool size <= {MAX_POOL} and key length <= "
                             f"{MAX_KEY} (the most pacer takes), got {ngram}, {capacity}, {key_len}")
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
        self.skipped = 0  # lookups left out since the last phrase check (see check_len)
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

    #: where phrases do not pay, one lookup in this many still checks a one-token phrase (so that the agreement
    #: estimate keeps learning)
    EXPLORE = 16

    def check_len(self, pricer: Pricer, fed: int, most: int, kind: tuple[str, int] | None = None) -> int:
        """The longest phrase worth checking in a draft forward that reads ``fed`` unread tokens (at most
        ``most``, of an entry of ``kind``): ``pricer`` prices it (:meth:`pacer.pricing.Pricer.phrase_room`) from
        the learned agreement for that kind; where none pays, a one-token check now and then keeps the estimate
        learning."""
        if most <= 0:
            return 0
        n = pricer.phrase_room(fed, self.agreement(most, kind))
        if n > 0:
            self.skipped = 0
            return n
        self.skipped += 1
        if self.skipped >= self.EXPLORE:
            self.skipped = 0
            return 1
        return 0

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
    data = read_json(path, "phrase pool file", "delete it or pass another pool_file (or a new name)")
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
