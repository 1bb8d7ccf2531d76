"""Where a speculative output first differs from plain decoding, and whether the target was near a tie there."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .backend import ModelBackend


@dataclass
class Divergence:
    """Where two greedy outputs ``a`` (plain decoding) and ``b`` first differ, and how close the target's logits
    were there when the common prefix is scored plainly (one forward).

    ``index``: first differing position; ``a``/``b``: the two tokens there (-1: that output had ended).
    ``top2_gap``: best minus second-best logit. ``gap``: best logit minus the lower of the logits of ``a`` and
    ``b`` (how far the worse of the two tokens is from being the argmax; the top-2 gap when one output ended).
    ``resolution``: the spacing of the model dtype's numbers at the best logit's magnitude (bf16 keeps 8
    significant bits: 0.125 for logits in [16, 32), 0.25 in [32, 64)); the model emits its logits in that dtype.
    ``noise``: the largest difference between a token's logits scored inside a block and scored alone that the
    backend showed on the last positions of the common prefix (:meth:`ModelBackend.block_noise`; 0 where a row is
    computed the same way whatever the block, up to the dtype's rounding: transformers. llama.cpp's quantized
    kernels take another path for blocks of 4 tokens or more, and its logits move by up to ~0.7 there).
    """

    index: int
    a: int
    b: int
    top2_gap: float
    gap: float = float("nan")
    resolution: float = 0.0
    noise: float = 0.0

    TIE_STEPS = 2  # how many resolution steps apart two logits may be and still count as tied

    @property
    def near_tie(self) -> bool:
        """Both differing tokens are within ``TIE_STEPS`` dtype resolution steps of the best logit, or within twice
        the backend's measured block noise (each of the two logits may move by ``noise``): scoring a token inside
        a block instead of alone (other matrix kernels, other rounding) can then flip the argmax. A differing token
        further away than that is a real losslessness failure."""
        gap = self.top2_gap if math.isnan(self.gap) else self.gap
        return self.steps <= self.TIE_STEPS or gap <= 2 * self.noise

    @property
    def steps(self) -> float:
        """``gap`` (the top-2 gap when one output ended) in dtype resolution steps (inf when the dtype has none)."""
        gap = self.top2_gap if math.isnan(self.gap) else self.gap
        return gap / self.resolution if self.resolution > 0 else (0.0 if gap == 0 else math.inf)

    def describe(self) -> str:
        """One line: the gap, in logits and in resolution steps, and the verdict."""
        verdict = "a near-tie" if self.near_tie else "NOT a near-tie"
        noise = f", block-vs-single noise {self.noise:.3f} (twice: {2 * self.noise:.3f})" if self.noise else ""
        return (f"logit gap {self.gap if not math.isnan(self.gap) else self.top2_gap:.4f} = {self.steps:.1f} "
                f"resolution steps of {self.resolution:g}{noise}: {verdict}")


def dtype_resolution(x: float, dtype: torch.dtype) -> float:
    """Spacing of ``dtype``'s numbers at magnitude ``|x|`` (one unit in the last place)."""
    if not dtype.is_floating_point:
        return 0.0
    e = math.floor(math.log2(abs(x))) if x else 0
    return float(torch.finfo(dtype).eps) * 2.0**e


def first_divergence(target: ModelBackend, prompt: list[int], a: list[int], b: list[int]) -> Divergence | None:
    """``None`` when ``a == b``; else the first differing index with the target's logit gaps there."""
    if a == b:
        return None
    i = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    x, y = (a[i] if i < len(a) else -1), (b[i] if i < len(b) else -1)  # -1: that output had ended
    logits = target.score(prompt + a[:i])[-1]
    top = torch.topk(logits, 2).values
    best = float(top[0])
    gap = best - min(float(logits[x]), float(logits[y])) if x >= 0 and y >= 0 else float("nan")
    return Divergence(i, x, y, best - float(top[1]), gap, dtype_resolution(best, target.dtype),
                      target.block_noise(prompt + a[:i]))
