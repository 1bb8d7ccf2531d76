"""Timing a forward: the one place pacer measures what a forward costs (calibration, :mod:`pacer.calibration`; a
profile's export, :mod:`pacer.profiles`; a backend's automatic draft encoding; ``scripts/gpu_check.py``).

A timed forward runs between two :func:`synchronize` calls (on a GPU it then counts the kernels and not only their
launch; a no-op on the CPU) and its cache is cropped back after it, so the next one runs after the same context. A
point is the median of ``reps`` forwards after a warm-up forward of the same shape (:func:`median`); a prefill is
the faster of two from an empty cache (:func:`prefill`). Imports nothing of pacer's: the decoding loop's forward
ledger (:mod:`pacer.decoding.meter`) synchronises through it too.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch

#: the cached tokens a forward is timed after (a calibration's context, one draft token's)
CONTEXT = 32


def synchronize(device: torch.device | str) -> None:
    """Wait until ``device`` has finished its queued work (a no-op on the CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(backend: Any, tokens: Sequence[int], base: int, keep: int = 1, tree: Any = None) -> float:
    """Seconds of one forward of ``tokens`` on ``backend`` (a :class:`pacer.decoding.backend.ModelBackend` holding
    ``base`` cached tokens; ``keep`` rows of logits, as a ``tree`` where given), its device synchronised around it;
    then the cache is cropped back to ``base`` tokens."""
    synchronize(backend.device)
    t = time.perf_counter()
    backend.forward(tokens, keep=keep, tree=tree)
    synchronize(backend.device)
    dt = time.perf_counter() - t
    backend.crop(base)
    return dt


def median(backend: Any, tokens: Sequence[int], base: int, reps: int, keep: int = 1, tree: Any = None) -> float:
    """The median seconds of ``reps`` :func:`timed` forwards of ``tokens`` after ``base`` cached tokens, after one
    warm-up forward of this shape."""
    timed(backend, tokens, base, keep, tree)
    return statistics.median(timed(backend, tokens, base, keep, tree) for _ in range(reps))


def prefill(backend: Any, tokens: Sequence[int]) -> float:
    """Seconds per token of a prefill of ``tokens`` into ``backend``'s empty cache: the faster of two (a warm
    model's first forward of a shape can still stall)."""
    return min(timed(backend, tokens, 0) for _ in range(2)) / len(tokens)


def token_ids(vocab: int, n: int = CONTEXT, offset: int = 0) -> list[int]:
    """``n`` deterministic token ids below ``vocab`` (the ``offset``-th on): what a timed forward reads."""
    return [(1000 + 7 * (i + offset)) % max(2, vocab - 1) for i in range(n)]


def token_seconds(backend: Any, vocab: int, reps: int) -> float:
    """The median seconds of one new token on ``backend`` (empty; a model of ``vocab`` tokens) after
    :data:`CONTEXT` cached, ``reps`` times after a warm-up: what ``--draft-quant auto`` compares between a draft and
    its cheaper copy."""
    ctx = token_ids(vocab)
    backend.forward(ctx, keep=1)
    return median(backend, ctx[:1], len(ctx), reps)
