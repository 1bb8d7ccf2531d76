"""The ``transformers`` implementation of :class:`~pacer.decoding.backend.ModelBackend`: a ``DynamicCache``,
optional tree attention, and the restricted LM head of a reduced draft vocabulary.

The backend runs where its model is (:attr:`TransformersBackend.device`, see :mod:`pacer.devices`): the ids, the
tree mask and position ids of every forward are made there, and the restricted head keeps its row indices there
too (the host copies, ``rows`` and the ``_kept`` mask, are for bookkeeping), so that a forward copies nothing to the
device but its ids (and a tree's mask)."""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch
from transformers import DynamicCache

from ..errors import PacerError
from .backend import Hidden, ModelBackend, Tree

#: restricted LM heads (weight and bias rows) per LM head and row set: a drafter's backend lives for one
#: generation, and gathering 32,768 rows of the default draft's head (58 MB in bf16) took ~20 ms a request on a
#: 2-core Zen 5; the heads are read-only, so every backend on the same rows shares one
_HEADS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: row sets kept per head
_HEADS_KEPT = 2


def _restricted(head: torch.nn.Module, rows: torch.Tensor, rows_dev: torch.Tensor):
    """``(weight[rows], bias[rows] or None)`` of ``head``, made once per (weight, device, rows) and shared (a
    weight replaced in the module, as quantization does, makes its own)."""
    cache = _HEADS.setdefault(head, {})
    key = (str(rows_dev.device), rows.numpy().tobytes())
    hit = cache.get(key)
    if hit is None or hit[0] is not head.weight:
        if len(cache) >= _HEADS_KEPT:
            cache.pop(next(iter(cache)))
        bias = getattr(head, "bias", None)
        hit = cache[key] = (head.weight, head.weight.detach()[rows_dev].contiguous(),
                            bias.detach()[rows_dev] if bias is not None else None)
    return hit[1:]


class TransformersBackend(ModelBackend):
    """A ``transformers`` causal LM and its KV cache; ``rows`` restricts the LM head (a draft model only)."""

    def __init__(self, model: torch.nn.Module, rows: torch.Tensor | None = None) -> None:
        self.model = model
        self.identity = model
        self.context = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.rows = None
        if rows is not None:
            self.restrict_head(rows)
        self.reset()

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    # ------------------------------------------------------------------------------------- restricted head
    def restrict_head(self, rows: torch.Tensor) -> None:
        """Compute logits only for the vocabulary ids ``rows`` (``[S]``, sorted); every other id gets ``-inf``.

        The LM head is then ``S x H`` instead of ``V x H`` (see :mod:`pacer.draftvocab`). Only for a draft model:
        a target must score the whole vocabulary."""
        head = self.model.get_output_embeddings()
        cfg = self.model.config
        for attr in ("final_logit_softcapping", "logit_scale", "logits_scaling"):
            if getattr(cfg, attr, None) not in (None, 0, 1, 1.0):
                raise PacerError(f"a reduced draft vocabulary: this draft model transforms its logits ({attr}); "
                                 f"draft from the full vocabulary")
        rows = torch.as_tensor(rows, dtype=torch.long, device="cpu")
        V = self.vocab_size
        if rows.ndim != 1 or len(rows) == 0 or int(rows.min()) < 0 or int(rows.max()) >= V:
            raise PacerError(f"a reduced draft vocabulary: token ids must lie in [0, {V}) (the draft's vocabulary)")
        self.rows = rows.sort().values
        self._rows_dev = self.rows.to(self.device)
        self._w, self._b = _restricted(head, self.rows, self._rows_dev)
        self._kept = torch.zeros(V, dtype=torch.bool, device="cpu")
        self._kept[self.rows] = True
        self._extra: torch.Tensor | None = None
        self._extra_dev: torch.Tensor | None = None
        self._scored: tuple[int, torch.Tensor] | None = None

    def add_rows(self, ids: Sequence[int]) -> None:
        """Also score ``ids`` (e.g. the prompt's tokens, which a continuation often repeats) until :meth:`reset`."""
        new = torch.tensor(sorted(set(ids)), dtype=torch.long, device="cpu")
        new = new[(new >= 0) & (new < self.vocab_size)]
        new = new[~self._kept[new]]
        if len(new) == 0:
            return
        self._kept[new] = True
        self._extra = new if self._extra is None else torch.cat([self._extra, new])
        self._extra_dev = self._extra.to(self.device)
        head = self.model.get_output_embeddings()
        self._w_extra = head.weight.detach()[self._extra_dev].contiguous()
        self._b_extra = head.bias.detach()[self._extra_dev] if self._b is not None else None

    def scored_rows(self) -> torch.Tensor | None:
        if self.rows is None:
            return None
        key = 0 if self._extra is None else len(self._extra)
        if self._scored is None or self._scored[0] != key:  # made once per prompt, not once per drafted token
            ids = self.rows if self._extra is None else torch.cat([self.rows, self._extra]).sort().values
            self._scored = (key, ids)
        return self._scored[1]

    # ------------------------------------------------------------------------------------------ interface
    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)
        self.length = 0
        if self.rows is not None and self._extra is not None:
            self._kept[self._extra] = False
            self._extra = self._extra_dev = None

    def _tree_kwargs(self, tree: Tree) -> dict:
        """The 4D float mask ``(1, 1, N, length + N)`` (0 where attended, ``-inf`` elsewhere) and position ids."""
        n = len(tree.depth)
        allow = torch.ones(n, self.length + n, dtype=torch.bool, device=self.device)
        allow[:, self.length :] = tree.attend.to(self.device)
        mask = torch.zeros(allow.shape, dtype=self.dtype, device=self.device).masked_fill_(~allow, float("-inf"))
        return {"attention_mask": mask[None, None],
                "position_ids": torch.tensor([[self.length + d for d in tree.depth]], device=self.device)}

    @torch.inference_mode()
    def forward(self, ids: Sequence[int], *, keep: int = 0, hidden: bool = False,
                tree: Tree | None = None) -> tuple[torch.Tensor, Hidden | None]:
        """Keeping only the rows a caller reads spares the LM head over the prompt: on a 1.5B model with a 150k
        vocabulary that is ~0.5 GFLOP per prompt token."""
        kwargs = self._tree_kwargs(tree) if tree is not None else {}
        if self.rows is not None:
            return self._forward_restricted(ids, hidden, keep, kwargs)
        if keep:
            kwargs["logits_to_keep"] = keep
        out = self.model(input_ids=self._ids(ids), cache=self.cache, use_cache=True,
                         output_hidden_states=hidden, **kwargs)
        self.length += len(ids)
        hs = tuple(h[0] for h in out.hidden_states) if hidden else None
        return out.logits[0].float(), hs

    def _forward_restricted(self, ids, hidden, keep, kwargs):
        """:meth:`forward` with the LM head restricted to ``rows``: the decoder stack, then ``S x H`` logits
        scattered into a ``-inf`` row of the full vocabulary (same shapes and hidden states as the full head)."""
        if self.length == 0:  # a new sequence: its prompt's tokens join the scored rows
            self.add_rows(ids)
        out = self.model.get_decoder()(input_ids=self._ids(ids), cache=self.cache,
                                       use_cache=True, output_hidden_states=hidden, **kwargs)
        self.length += len(ids)
        h = out.last_hidden_state[0]
        h = h[-keep:] if keep else h
        sub = h @ self._w.T
        if self._b is not None:
            sub = sub + self._b
        logits = torch.full((h.shape[0], self.vocab_size), float("-inf"), device=h.device)
        logits[:, self._rows_dev] = sub.float()
        if self._extra_dev is not None:
            extra = h @ self._w_extra.T
            logits[:, self._extra_dev] = (extra + self._b_extra if self._b_extra is not None else extra).float()
        hs = tuple(x[0] for x in out.hidden_states) if hidden else None
        return logits, hs

    def crop(self, length: int) -> None:
        if length < self.length:
            self.cache.crop(length - self.length)
            self.length = length

    @torch.inference_mode()
    def score(self, ids: Sequence[int]) -> torch.Tensor:
        return self.model(input_ids=self._ids(ids)).logits[0].float()

    def _ids(self, ids: Sequence[int]) -> torch.Tensor:
        return torch.tensor([list(ids)], dtype=torch.long, device=self.device)
