"""Replay the live cost-aware rule offline on a checkpoint's validation rounds, against the literal threshold.

``pacer train`` chooses the layer's threshold by sweeping it over the validation rounds (every round drafted
``max_draft`` tokens, so every stopping point is known). Live, ``pacer`` runs without a threshold: the cost-aware
rule (:class:`pacer.policies.cost_aware.CostAwarePolicy`) decides token by token from the layer's score through an
online calibrator. This script runs that very class over the same rounds, in the collection's prompt order, the
layer's per-position scores fed by a stand-in policy (sampled rounds: a verdict drawn from their soft survival,
seeded), and prices both with the checkpoint's costs (:func:`pacer.preverify.validation.predicted_speedup`).
The cumulative-probability rule (``Π max q``) is replayed the same way for comparison.

    python experiments/replay_cost_rule.py [CKPT] [--data RUNS]   (default: the shipped transformers checkpoint and
                                                                 the collection it records)
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from pacer.costs import Costs
from pacer.policies.base import DraftPolicy, DraftState, RoundResult
from pacer.policies.cost_aware import CostAwarePolicy
from pacer.policies.learned import default_checkpoint, load_checkpoint
from pacer.preverify.features import FeatureSpec, needs_target_hidden
from pacer.preverify.train import _sweep, load_dataset, scores, split, to_rounds
from pacer.preverify.validation import predicted_speedup, survival_cumsum


class Replayed(DraftPolicy):
    """Reads the survival score of draft position ``n`` from a precomputed row."""

    name = "replayed"

    def __init__(self) -> None:
        super().__init__(1, 16)
        self.row: np.ndarray = np.ones(16)

    def should_continue(self, state: DraftState) -> bool:
        return True

    def survival(self, state: DraftState) -> float:
        return float(self.row[state.n - 1]) if state.n else 1.0


def replay(score: np.ndarray, m, csum, sampled, n_star, order, sel, costs: Costs, seed: int = 0) -> np.ndarray:
    """Draft lengths the cost-aware rule chooses, round by round, learning from each round's verdict."""
    rng = np.random.default_rng(seed)
    inner = Replayed()
    rule = CostAwarePolicy(inner, costs, refine=0.0)
    lengths = np.zeros(len(m), dtype=np.int64)
    for r in order:
        if not sel[r]:
            continue
        inner.row, state = score[r], DraftState()
        while state.n < m[r] and rule.should_continue(state):
            state.tokens.append(0)
        n = state.n
        lengths[r] = n
        if sampled[r]:  # a realised verdict from the round's soft survival S_1 >= S_2 >= ...
            accepted = int((np.diff(csum[r, : n + 1]) >= rng.random()).sum())
        else:
            accepted = min(int(n_star[r]), n)
        rule.update(state, RoundResult(drafted=n, accepted=accepted))
    return lengths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ckpt", nargs="?", type=Path, default=default_checkpoint("pacer"))
    ap.add_argument("--data", default=None, help="the collection (default: the one the checkpoint records)")
    a = ap.parse_args()
    model, mu, sd, cfg = load_checkpoint(a.ckpt)
    if cfg["kind"] != "pacer" or cfg["block"] != 1:
        raise SystemExit("replay_cost_rule.py: needs a pacer checkpoint with block 1 (a score at every position)")
    spec = FeatureSpec.from_dict(cfg["feature_spec"])
    data, _ = load_dataset(Path(a.data or cfg["train"]["data"]))
    rounds = to_rounds(data, spec.max_draft, target_hidden=needs_target_hidden(spec))
    _, va = split(rounds, cfg["train"]["val_frac"], cfg["train"]["seed"])
    costs = Costs.from_dict(cfg["costs"])
    free = Costs(costs.draft, costs.target, 0.0)  # a rule's check is priced as free, as in the validation report
    layer = scores("pacer", model, va, mu, sd)
    cumprob = np.cumprod(va.scalars[..., list(spec.scalar_names).index("top_prob")].numpy(), 1)
    m, n_star, sampled = va.m.numpy(), va.n_star.numpy(), va.sampled.numpy()
    csum = survival_cumsum(va.survival().numpy())
    order = np.argsort(va.prompt.numpy(), kind="stable")
    print(f"{a.ckpt}: {len(m)} validation rounds of {a.data or cfg['train']['data']}, the checkpoint's costs")
    print("| rounds | layer, threshold | layer, cost rule | cumprob, threshold | cumprob, cost rule |")
    print("|---|---|---|---|---|")
    for name, sel in (("greedy", ~sampled), ("sampled", sampled), ("all", np.ones(len(m), bool))):
        cells = []
        for sc, c in ((layer, costs), (cumprob, free)):
            best = _sweep("pacer", sc[sel], m[sel], csum[sel], 1, c, 1)[1]
            L = replay(sc, m, csum, sampled, n_star, order, sel, c)[sel]
            live = predicted_speedup(L, csum[sel], c, L)
            cells += [f"{best[0]:.3f}x (θ {best[1]:.3f}, {best[2].mean():.2f} tokens)",
                      f"{live:.3f}x ({L.mean():.2f} tokens; {live / best[0]:.3f} of the threshold's)"]
        print(f"| {name} ({sel.sum()}) | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
