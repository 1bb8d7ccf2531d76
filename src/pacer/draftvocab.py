"""A reduced draft vocabulary: the draft model scores only the ``S`` most frequent tokens (FR-Spec-style).

Why: the draft's LM head is a ``V x H`` matrix (151,936 x 896 in the default pair, 136M weights, as many as a third
of the rest of the 0.5B draft), and on a CPU a forward over one token reads every weight once. Measured on this
machine in bf16 (``pacer tune --measure-costs``), one draft token costs 63-64 ms with the full head and 44-54 ms
with a 32,768-row head: drafting is a quarter to a third cheaper. The rows kept are the tokens most frequent in a
held-out corpus (ShareGPT conversations, both sides; never the benchmark sets), plus every special token of the
tokenizer (EOS and the chat markers).

Lossless by construction, because only the *proposal* changes:

* greedy - the draft's token is the argmax over the kept rows; the target still scores the full vocabulary and
  verification is unchanged, so a token outside the rows is never proposed and the target emits it itself;
* sampling - ``q`` is the distribution the draft really sampled from (zero outside the rows, renormalised inside),
  and rejection sampling with ``min(1, p/q)`` and the residual ``norm(max(0, p - q))`` is exact for any ``q``.

What it costs: a target token outside the rows ends that round's draft (``coverage`` below measures how often).
The list is computed once per (draft model, size) and cached under ``$PACER_HOME/draft-vocab`` (a
:class:`pacer.cache.Store`; a list cached by an older pacer, without a checksum, is counted again).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from . import backends
from .cache import Store
from .errors import PacerError

if TYPE_CHECKING:
    from .pair import Pair

#: conversations of the corpus counted (all ~17.6k of the packaged file; ~35 s of tokenization on 2 cores, once)
CORPUS_CONVERSATIONS = 20000
MIN_SIZE = 16


def sharegpt_texts(conversations: int = CORPUS_CONVERSATIONS) -> list[str]:
    """Every turn (human and model) of the first ``conversations`` ShareGPT conversations."""
    from .data.sharegpt import sharegpt_conversations

    return [t.get("value", "") for c in sharegpt_conversations(conversations) for t in c if t.get("value")]


def frequent_ids(tokenizer, size: int, texts: Iterable[str], always: Iterable[int] = (),
                 vocab: int | None = None) -> list[int]:
    """The ``size`` ids most frequent in ``texts`` (ties: lower id first), always including ``always``; sorted.
    If the corpus holds fewer distinct tokens, the lowest unseen ids below ``vocab`` fill up (BPE vocabularies
    number their tokens roughly in merge order, i.e. by frequency)."""
    counts: Counter = Counter()
    batch: list[str] = []

    def flush() -> None:
        for ids in tokenizer(batch, add_special_tokens=False)["input_ids"]:
            counts.update(ids)
        batch.clear()

    for t in texts:
        batch.append(t)
        if len(batch) == 256:
            flush()
    if batch:
        flush()
    keep = set(int(i) for i in always)
    for i, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(keep) >= size:
            break
        keep.add(int(i))
    fill = iter(range(vocab or 0))
    while len(keep) < size:
        i = next(fill, None)
        if i is None:
            break
        keep.add(i)
    return sorted(keep)


def special_ids(tokenizer, eos: Iterable[int] = ()) -> set[int]:
    """EOS, the tokenizer's special and added tokens (chat markers): a draft must always be able to propose them."""
    out = set(int(i) for i in eos)
    out.update(int(i) for i in getattr(tokenizer, "all_special_ids", []) or [])
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    out.update(int(i) for i in added)
    return out


#: the size ``--draft-vocab auto`` uses, and the smallest draft vocabulary it reduces (below, the head is too small a
#: part of the draft for the misses to pay)
AUTO_SIZE = 32768
AUTO_MIN_VOCAB = 4 * AUTO_SIZE


def auto_size(pair: Pair) -> int:
    """What ``--draft-vocab auto`` means for a loaded pair's draft: :data:`AUTO_SIZE`, or 0 (the full vocabulary) for
    a draft vocabulary under :data:`AUTO_MIN_VOCAB` tokens or a pair without a tokenizer."""
    info = pair.draft_info
    if info is None or pair.tokenizer is None or not backends.of(info).reduced_head:
        return 0
    return AUTO_SIZE if info.vocab_size >= AUTO_MIN_VOCAB else 0


def check_size(size: int, vocab: int) -> None:
    if not MIN_SIZE <= size < vocab:
        raise PacerError(f"draft_vocab must be 0 (the full vocabulary) or between {MIN_SIZE} and {vocab - 1} "
                         f"(the draft's vocabulary has {vocab} tokens), got {size}")


def load_or_build(pair: Pair, size: int, home: Path | None = None,
                  texts: Iterable[str] | None = None) -> torch.Tensor:
    """The kept rows for a loaded pair's draft at ``size`` (a sorted ``[size]`` long tensor), from the cache or counted
    now from the held-out corpus (``texts``: another corpus, for tests) and cached atomically."""
    info = pair.draft_info
    if info is None:
        raise PacerError("a reduced draft vocabulary needs a draft model")
    if not backends.of(info).reduced_head:
        raise PacerError(f"the {info.backend} backend scores the whole vocabulary; drop --draft-vocab (or use "
                         f"--backend transformers)")
    vocab = info.vocab_size
    check_size(size, vocab)
    if pair.tokenizer is None:
        raise PacerError("a reduced draft vocabulary needs a tokenizer to count token frequencies; this pair has none")
    if texts is not None:  # another corpus (tests): counted each time, never cached
        return _count(pair, size, vocab, list(texts))
    store = Store("draft-vocab", "pacer-draft-vocab/1", home=home, name=_file_name)
    key = {"draft": info.fingerprint, "size": size, "corpus": "sharegpt", "conversations": CORPUS_CONVERSATIONS}
    cached, _ = store.get(key)
    ids = cached.get("ids") if cached is not None else None
    if isinstance(ids, list) and len(ids) == size and all(isinstance(i, int) and 0 <= i < vocab for i in ids):
        return torch.tensor(ids, dtype=torch.long, device="cpu")
    rows = _count(pair, size, vocab, sharegpt_texts())  # missing or damaged: count again and overwrite
    if note := store.keep(key, {"ids": rows.tolist()}, again="counted again"):
        print(f"pacer: note: {note}", file=sys.stderr)
    return rows


def _file_name(key: dict) -> str:
    return f"{key['draft'][:16]}-{key['size']}-{key['corpus']}"


def _count(pair, size: int, vocab: int, corpus: list[str]) -> torch.Tensor:
    ids = frequent_ids(pair.tokenizer, size, corpus, special_ids(pair.tokenizer, pair.eos), vocab)
    return torch.tensor([i for i in ids if i < vocab][:size], dtype=torch.long, device="cpu")


def coverage(rows: torch.Tensor, token_ids: Iterable[int]) -> float:
    """Share of ``token_ids`` (e.g. a target's outputs) inside ``rows``: how often the reduced draft can be right."""
    ids = list(token_ids)
    if not ids:
        return 1.0
    kept = set(rows.tolist())
    return sum(i in kept for i in ids) / len(ids)
