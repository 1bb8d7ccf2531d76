"""The check a new build of :mod:`pacer.native` must pass before it is trusted, run in a separate process (an
instruction the machine cannot run kills that process, not the caller)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..preverify.layer import PrefixState, PreVerifier
from . import Kernels


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
    for row in rows:
        m = float(row.max())
        z, s = k.exp_stats(row, m)
        d = row.astype(np.float64) - m
        e = np.exp(d)
        ref_z, ref_s = float(e.sum()), float(np.where(e > 0, e * d, 0.0).sum())
        if not (abs(z - ref_z) <= 1e-5 * ref_z and abs(s - ref_s) <= 1e-5 * max(abs(ref_s), ref_z)):
            return False
    return _layer_agrees(k)


def _layer_agrees(k: Kernels) -> bool:
    """The layer step against numpy's :class:`~pacer.preverify.layer.CpuExtend` on a random layer (both GELUs)."""
    for approximate in ("none", "tanh"):
        torch.manual_seed(0)
        layer = PreVerifier(40, 5, block=1, d=16, heads=2, max_draft=8, rank=4).eval()
        layer.mlp[1].approximate = approximate
        h, s = torch.randn(6, 40).numpy(), torch.randn(6, 5).numpy()
        cpu = layer.cpu()
        slow, fast = PrefixState(), PrefixState()
        for i in range(6):
            want = cpu.extend(slow, h[i : i + 1], s[i : i + 1], 1, kernels=None)
            got = cpu.extend(fast, h[i : i + 1], s[i : i + 1], 1, kernels=k)
            if not (abs(got - want) <= 1e-4 * max(1.0, abs(want)) and np.allclose(fast.z, slow.z, atol=1e-4)):
                return False
    return True
