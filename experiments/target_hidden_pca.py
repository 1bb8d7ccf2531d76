"""Offline check: the pre-verification layer reading the target's hidden state reduced to ``k`` principal
directions (fitted on the training rounds, each scaled to unit variance), against the same layer without it - the
split, seed, recipe (b = 1, per-token loss weight 10) and costs of ``docs/bench/th-checkpoint``; ``k = 0``: without
it. Prints ``k``, the predicted speedup on the validation rounds and the block AUC.

Usage: python experiments/target_hidden_pca.py 0 4 16 64   (needs runs/tf-th-a,runs/tf-th-b: pacer collect
--target-hidden, see docs/pacer.md)
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

from pacer.costs import Costs
from pacer.preverify.collect import load_dataset
from pacer.preverify.features import FeatureSpec
from pacer.preverify.train import evaluate, fit, split, to_rounds

ROOT = Path(__file__).resolve().parent.parent


def main(ks: list[int]) -> None:
    cfg = json.loads((ROOT / "docs/bench/th-checkpoint/config.json").read_text())
    costs = Costs.from_dict(cfg["costs"])
    data, manifest = load_dataset(cfg["train"]["data"])
    spec = FeatureSpec.from_dict(manifest["feature_spec"])
    tr, va = split(to_rounds(data, spec.max_draft, target_hidden=True), cfg["train"]["val_frac"],
                   cfg["train"]["seed"])
    D = spec.hidden_dim
    t = tr.hidden[:, 0, D:]  # one target state a round, the same at every position
    mean = t.mean(0)
    _, s, v = torch.linalg.svd(t - mean, full_matrices=False)
    for k in ks:
        def reduced(r, k=k):
            z = ((r.hidden[..., D:] - mean) @ v[:k].T) / (s[:k] / len(t) ** 0.5)
            return replace(r, hidden=torch.cat([r.hidden[..., :D], z], -1))

        trk, vak = (reduced(tr), reduced(va)) if k else (replace(tr, hidden=tr.hidden[..., :D]),
                                                         replace(va, hidden=va.hidden[..., :D]))
        model, mu, sd = fit("pacer", trk, cfg["block"], cfg["train"]["epochs"], cfg["train"]["seed"], d=cfg["d"],
                            token_weight=cfg["train"]["token_loss_weight"], rank=cfg["rank"],
                            dropout=cfg["train"]["dropout"], weight_decay=cfg["train"]["weight_decay"], log=None)
        ev = evaluate("pacer", model, vak, mu, sd, cfg["block"], costs, cfg["min_draft"])
        print(k, ev["predicted_speedup"], ev["auc"], flush=True)


if __name__ == "__main__":
    main([int(x) for x in sys.argv[1:]] or [0, 64])
