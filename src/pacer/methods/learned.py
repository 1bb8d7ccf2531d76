"""The trained draft-length policies: ``pacer`` (blockwise pre-verification layer) and ``specdecpp`` (a per-token
SpecDec++-style head); see :mod:`pacer.preverify`."""

from __future__ import annotations

from ..policies.base import DraftPolicy
from .registry import Build, Method, Option, register
from .rules import THRESHOLD

PATH = Option("path", str, "pacer / specdecpp checkpoint folder (default: the shipped one)", flag="--preverifier",
              path=True)
BLOCK = Option("block", int, "pacer: block size b (default: the checkpoint's)", minimum=1)


def learned(kind: str):
    def build(b: Build) -> DraftPolicy:
        from ..policies.learned import load_policy

        opts = dict(b.options)
        if b.cost_aware and "threshold" not in opts:
            opts["threshold"] = None  # the cost rule decides on the layer's survival score
        return load_policy(b.pair, kind, b.bounds, opts)

    return build


register(Method("specdecpp", "per-token trained head (SpecDec++-style): stop once P(some rejection) > threshold",
                learned("specdecpp"), options=(THRESHOLD, PATH)))
register(Method("pacer", "PACER: a trained layer pre-verifies the draft block by block; stop at the first failing "
                "block", learned("pacer"), options=(THRESHOLD, PATH, BLOCK)))
