"""The trained draft-length policies: ``pacer`` (blockwise pre-verification layer) and ``specdecpp`` (a per-token
SpecDec++-style head); see :mod:`pacer.preverify`."""

from __future__ import annotations

from ..policies.base import DraftPolicy
from .registry import MAX_DRAFT, Build, Method, Option, register
from .rules import THRESHOLD


def _checkpoint_folder(value: str) -> None:
    from pathlib import Path

    from ..errors import PacerError

    p = Path(value).expanduser()
    if not (p / "config.json").is_file():  # written last by pacer train: the checkpoint is complete
        what = "does not exist" if not p.exists() else "is not a folder" if not p.is_dir() else "has no config.json"
        raise PacerError(f"option path {value} is not a pre-verifier checkpoint folder (it {what}); pass a folder "
                         f"made by `pacer train`")


PATH = Option("path", str, "pacer / specdecpp checkpoint folder (default: the shipped one)", flag="--preverifier",
              path=True, preflight=_checkpoint_folder)
BLOCK = Option("block", int, "pacer: block size b (default: the checkpoint's)", minimum=1, maximum=MAX_DRAFT)


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
