"""The check a new build of :mod:`pacer.native` must pass before it is trusted, run in a separate process (an
instruction the machine cannot run kills that process, not the caller)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..preverify.layer import PrefixState, PreVerifier
from . import CLAMP_TERM, RELATIVE_BOUND, Kernels


def self_test(lib_path: str) -> bool:
    """Each kernel of the library at ``lib_path`` against float64 numpy / numpy's layer (run in a separate process
    by :func:`pacer.native._check`)."""
    k = Kernels(Path(lib_path))
    rng = np.random.default_rng(0)
    rows = [(rng.standard_normal(151_936) * 3).astype(np.float32), (rng.standard_normal(1000) * 30).astype(np.float32),
            np.zeros(7, np.float32), np.array([50.0, -1e30, 49.0], np.float32)]
    masked = (rng.standard_normal(4099) * 4).astype(np.float32)
    masked[::3] = -np.inf
    rows.append(masked)
    tied = np.array([1.0, 3.0, -2.0, 3.0, 3.0], np.float32)
    rows += [tied, np.tile(tied, 1000)]  # the first of equal maxima, then the next one: numpy's argmax order
    for row in rows:
        got = k.row_stats(row)
        i = int(row.argmax())
        rest = np.where(np.arange(row.size) == i, -np.inf, row)
        j = int(rest.argmax()) if row.size > 1 else -1
        m = float(row[i])
        d = row.astype(np.float64) - m
        e = np.exp(d)
        ref_z, ref_s = float(e.sum()), float(np.where(e > 0, e * d, 0.0).sum())
        if got is None or got[:3] != (i, j, m) or k.row_stats(row, False)[:2] != (i, -1):
            return False
        z, s = got[3:]
        slack = row.size * CLAMP_TERM
        if not (abs(z - ref_z) <= RELATIVE_BOUND * ref_z + slack
                and abs(s - ref_s) <= RELATIVE_BOUND * abs(ref_s) + slack):
            return False
    nan = rows[0].copy()
    nan[5000] = np.nan
    if k.row_stats(nan) is not None or k.row_stats(np.full(9, -np.inf, np.float32)) is not None:
        return False
    return _layer_agrees(k)


def _layer_agrees(k: Kernels) -> bool:
    """The layer check against numpy's :class:`~pacer.preverify.layer.CpuExtend` on a random layer (both GELUs;
    blocks of 1 and 3 tokens; scalars normalised by the call and already normalised)."""
    for approximate, block_size in (("none", 1), ("tanh", 1), ("none", 3)):
        torch.manual_seed(0)
        layer = PreVerifier(40, 5, block_size=block_size, d=16, heads=2, max_draft=8, rank=4).eval()
        layer.mlp[1].approximate = approximate
        with torch.no_grad():  # a trained block head (a new layer's starts at zero)
            layer.block_head.weight.normal_()
            layer.block_head.bias.fill_(0.3)
        h, raw = torch.randn(7, 40).numpy(), torch.randn(7, 5).numpy()
        mu, sd = torch.randn(5).numpy(), (torch.rand(5) + 0.5).numpy()
        s = (raw - mu) / sd
        cpu = layer.cpu()
        slow, fast, normed = PrefixState(), PrefixState(), PrefixState()
        for i in range(7):
            want = cpu.extend(slow, h[i : i + 1], s[i : i + 1], block_size, kernels=None)
            got = cpu.check(k, fast, h[i].ctypes.data, raw[i].ctypes.data, mu.ctypes.data, sd.ctypes.data, block_size)
            also = cpu.extend(normed, h[i : i + 1], s[i : i + 1], block_size, kernels=k)
            if (want is None) != (got is None) or (want is None) != (also is None):
                return False
            if want is not None and not all(abs(x - want) <= 1e-4 * max(1.0, abs(want)) for x in (got, also)):
                return False
            if not (np.allclose(fast.z, slow.z, atol=1e-4) and np.allclose(fast.log_survival, slow.log_survival,
                                                                             atol=1e-5)):
                return False
    return True
