"""The model-backend interface: everything the decoding loop, the drafters and the diagnostics ask of a model.

A backend is one causal LM plus its KV cache. Terms:

* ``length`` - how many tokens are in the cache. The loop keeps the committed sequence ``tokens`` itself and
  feeds a backend ``tokens[length:]`` (what it has not seen yet) before the tokens it wants scored.
* :meth:`ModelBackend.forward` - score ``ids`` after the cached tokens (the cache grows by ``len(ids)``);
  returns float32 logits ``[keep, V]`` of the last ``keep`` rows (all rows when ``keep`` is 0; ``V`` =
  :attr:`~ModelBackend.vocab_size`) and, with ``hidden=True``, the hidden states (a tuple over layers, embeddings
  first, of ``[len(ids), H]``; a backend that gives fewer layers says which in
  :attr:`~ModelBackend.hidden_layers`). A :class:`Tree` replaces the causal chain over ``ids`` by a token tree
  (Ouroboros candidate branches, :mod:`pacer.decoding.tree`); after a tree forward the cache holds at least the
  tree's leading causal chain, and the caller crops it to what it keeps.
* :meth:`ModelBackend.forward_view` - the same, with logits that may be a view of the backend's memory, valid until
  its next forward, crop or reset (for rows read at once: the loop's verification, a drafter's token).
* :meth:`ModelBackend.crop` - forget every cached token past a length (the roll-back of a rejected draft).
* :meth:`ModelBackend.score` - logits of a whole sequence from scratch, full vocabulary, cache untouched (the
  oracle's teacher-forced pass and the divergence diagnosis; not on the hot path).

What must never happen: the loop or a drafter reaching past this interface into a runtime (``transformers``,
llama.cpp, CUDA graphs). Each backend of :mod:`pacer.backends` implements it in its own file
(:class:`pacer.backends.transformers.TransformersBackend`, :class:`pacer.backends.llamacpp.LlamaCppBackend`); a
test's pure-Python fake backend (``tests/test_backend.py``) runs the whole loop.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..errors import NonFiniteLogits

Hidden = tuple[torch.Tensor, ...]

#: the fewest unread tokens before a drafted token that a backend whose hidden-state forward scores every row
#: (:attr:`ModelBackend.hidden_scores_every_row`) is fed apart (a forward of its own costs about one token's
#: forward; scoring the rows of a long prompt costs more)
HIDDEN_SPLIT = 16


@dataclass(frozen=True)
class Tree:
    """Attention over ``N`` new tokens scored as a tree instead of a chain.

    ``attend``: ``[N, N]`` bool, ``attend[i, j]`` - new token ``i`` sees new token ``j`` (every new token sees
    every cached token). ``depth``: ``N`` ints, the position of new token ``i`` is ``length + depth[i]``. A chain
    is ``attend = tril(ones)``, ``depth = 0..N-1``. ``attend`` is host data (on the CPU); a backend moves it to
    its device."""

    attend: torch.Tensor
    depth: tuple[int, ...]

    @classmethod
    def chain(cls, n: int) -> Tree:
        return cls(torch.ones(n, n, dtype=torch.bool, device="cpu").tril(), tuple(range(n)))

    @classmethod
    def branching(cls, k: int) -> Tree:
        """``k`` tokens as a main chain of about half of them and two branches after it (as Ouroboros builds
        them): what a timed tree forward scores (a calibration, a profile)."""
        main = max(1, k // 2)
        att = torch.zeros(k, k, dtype=torch.bool)
        att[:main, :main] = torch.ones(main, main, dtype=torch.bool).tril()
        depth = list(range(main))
        o = main
        for b in (k - main + 1) // 2, (k - main) // 2:
            if b <= 0:
                continue
            att[o : o + b, :main] = True
            att[o : o + b, o : o + b] = torch.ones(b, b, dtype=torch.bool).tril()
            depth += range(main, main + b)
            o += b
        return cls(att, tuple(depth))


def finite(logits: torch.Tensor, model: str) -> torch.Tensor:
    """``logits`` (the rows a forward returns), checked: one reduction over them, each row's maximum (NaN
    propagates through it, ``+inf`` is it, a row of ``-inf`` alone leaves it ``-inf``), then the least and the
    largest of those, read back together; :class:`~pacer.errors.NonFiniteLogits` naming ``model`` and the likely
    cause where one is not finite. Every backend's :meth:`ModelBackend.forward` and
    :meth:`ModelBackend.score` return through it: a model whose numbers are NaN (a NaN weight, an ``rms_norm_eps``
    of NaN in its config) stops with that error, never decodes arbitrary ids."""
    if logits.numel() == 0:
        return logits
    lo, hi = torch.stack(torch.aminmax(logits.amax(-1))).tolist()
    if math.isfinite(lo) and math.isfinite(hi):
        return logits
    what = "NaN" if math.isnan(lo) or math.isnan(hi) else "+inf" if hi == math.inf else \
        "-inf everywhere in a row (no id scored)"
    raise NonFiniteLogits(f"the model {model} gave non-finite logits ({what}): its weights or its configuration "
                          f"produce non-finite numbers (a NaN or infinite weight, a config value such as "
                          f"rms_norm_eps set to NaN); check or replace the model's files")


class ModelBackend(ABC):
    """One causal LM and its KV cache, as the decoding loop sees it (see the module docstring).

    Attributes every backend sets: ``length`` (tokens in the cache), ``context`` (most positions the model
    takes), ``vocab_size`` (width of a logits row), ``device``, ``dtype`` (of the weights; logits come back as
    float32), ``identity`` (an object that stands for the weights: state shared by everything drafting with the
    same model, such as Ouroboros phrase pools, is keyed by it)."""

    length: int
    context: int
    vocab_size: int
    device: torch.device
    dtype: torch.dtype
    identity: object
    #: the hidden states ``forward(hidden=True)`` returns, as indices into transformers' ``hidden_states``
    #: (``None``: all of them, embeddings first; llama.cpp: ``(-1,)``, the final normed state only)
    hidden_layers: tuple[int, ...] | None = None
    #: ``forward`` scores any :class:`Tree`, also branches beside a draft token (siblings); ``False``: only a
    #: causal chain with branches after its end (llama.cpp's sequence ids), and the loop sends no other tree
    sibling_branches: bool = True
    #: ``forward(hidden=True)`` computes the logits of every row, kept or not (llama.cpp's embeddings mode: each
    #: row of a 152k-id LM head); a caller that needs the hidden state of the last rows of a long input feeds the
    #: rest without ``hidden`` first (:data:`HIDDEN_SPLIT` rows or more)
    hidden_scores_every_row: bool = False

    @abstractmethod
    def reset(self) -> None:
        """Empty the cache (a new sequence)."""

    @abstractmethod
    def forward(self, ids: Sequence[int], *, keep: int = 0, hidden: bool = False,
                tree: Tree | None = None) -> tuple[torch.Tensor, Hidden | None]:
        """Score ``ids`` after the cached tokens and cache them (see the module docstring)."""

    def forward_view(self, ids: Sequence[int], *, keep: int = 0, hidden: bool = False,
                     tree: Tree | None = None) -> tuple[torch.Tensor, Hidden | None]:
        """:meth:`forward`, except that the logits may be a view of the backend's own output memory, valid only
        until its next forward, crop or reset: for a caller that reads them at once and keeps nothing (the loop's
        verification, a drafter's token). A backend whose runtime hands out its output buffer (llama.cpp) saves a
        copy of every row (a 152k-id row is 600 KB); the default is :meth:`forward`."""
        return self.forward(ids, keep=keep, hidden=hidden, tree=tree)

    @abstractmethod
    def crop(self, length: int) -> None:
        """Drop every cached token past ``length`` (no-op when ``length >= self.length``)."""

    @abstractmethod
    def score(self, ids: Sequence[int]) -> torch.Tensor:
        """Float32 logits ``[len(ids), V]`` of ``ids`` from scratch over the full vocabulary; the cache is left
        as it is."""

    def block_noise(self, ids: Sequence[int]) -> float:
        """How far (max absolute logit difference) a token's logits scored inside a block can be from the same
        token scored alone on this backend, measured on the last positions of ``ids`` with a cache of its own
        (for the near-tie diagnosis, :mod:`pacer.decoding.diagnostics`). 0: a row is computed the same way
        whatever the block, up to the dtype's rounding."""
        return 0.0

    #: the reduced vocabulary a draft backend scores (sorted ids) before a sequence adds its own prompt's tokens;
    #: ``None``: the full vocabulary (see :mod:`pacer.draftvocab`)
    rows: torch.Tensor | None = None

    def scored_rows(self) -> torch.Tensor | None:
        """The vocabulary ids :meth:`forward` scores now (``None``: all; a reduced draft head scores fewer and
        gives ``-inf`` elsewhere, see :mod:`pacer.draftvocab`)."""
        return None
