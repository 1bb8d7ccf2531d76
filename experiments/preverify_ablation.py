"""Train the PACER variants on one collection and write the ablation table (docs/pacer-ablation.md).

Usage: .venv/bin/python experiments/preverify_ablation.py --data runs/collect --costs runs/costs.json \
           --out docs/pacer-ablation.md [--epochs 30] [--ckpts runs/ablation]
Every variant: same data, same seeded prompt split, same epochs; the threshold of each is chosen by the cost model.
Predicted speedups come from the validation rounds (held-out ShareGPT prompts) and the measured costs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from pacer.io import atomic_write_text
from pacer.preverify.train import Costs, train

VARIANTS = [
    # name, kwargs
    ("b=1", dict(block=1)),
    ("b=2", dict(block=2)),
    ("b=4", dict(block=4)),
    ("b=8", dict(block=8)),
    ("b=1, last layer only", dict(block=1, hidden_layers=(-1,))),
    ("b=1, middle layer only", dict(block=1, hidden_layers=(-13,))),
    ("b=1, unweighted loss", dict(block=1, weighted=False)),
    ("b=1, block labels only", dict(block=1, token_weight=0.0)),
    ("b=2, last layer only", dict(block=2, hidden_layers=(-1,))),
    ("b=1, no bottleneck/dropout (first design)", dict(block=1, rank=0, dropout=0.0, weight_decay=0.01)),
    ("b=2, no bottleneck/dropout (first design)", dict(block=2, rank=0, dropout=0.0, weight_decay=0.01)),
    ("SpecDec++ per-token head", dict(kind="specdecpp")),
]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--costs", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--ckpts", default="runs/ablation")
    args = ap.parse_args()
    costs = Costs.from_dict(json.loads(Path(args.costs).read_text()))
    rows = []
    for name, kw in VARIANTS:
        kw = dict(kw)
        kind = kw.pop("kind", "pacer")
        t = time.time()
        slug = name.replace(" ", "_").replace(",", "").replace("=", "").replace("+", "p")
        cfg = train(Path(args.data), Path(args.ckpts) / slug, kind, epochs=args.epochs, costs=costs, log=None, **kw)
        v = cfg["validation"]
        rows.append((name, cfg, v))
        print(f"{name}: auc {v['auc']} thr {v['threshold']} predicted {v['predicted_speedup']}x "
              f"({time.time() - t:.0f}s)", file=sys.stderr, flush=True)
    v0 = rows[0][2]
    lines = [
        "# PACER ablation (validation rounds, cost-model predicted speedup)",
        "",
        f"Command: `{' '.join(['.venv/bin/python', *sys.argv])}`",
        "",
        f"Data: `{args.data}` ({rows[0][1]['train']['prompts']} ShareGPT prompts, "
        f"{rows[0][1]['train']['rounds_train']} training / {rows[0][1]['train']['rounds_val']} validation rounds, "
        f"split by prompt, seed 0); costs: `{args.costs}` (draft {costs.draft * 1000:.0f} ms/token, target "
        f"{costs.target_cost(1) * 1000:.0f} ms for 1 token, {costs.target_cost(16) * 1000:.0f} ms for 16).",
        "",
        f"On these rounds: best fixed γ = {v0['best_fixed_gamma']} predicts {v0['best_fixed_predicted_speedup']}x, "
        f"the oracle length {v0['oracle_predicted_speedup']}x.",
        "",
        "| variant | params | block ROC-AUC | fail precision | fail recall | threshold | mean draft |"
        " predicted speedup | vs best fixed γ | share of oracle |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, cfg, v in rows:
        lines.append(
            f"| {name} | {cfg['params']:,} | {v['auc']} | {v['fail_precision']} | {v['fail_recall']} | "
            f"{v['threshold']} | {v['mean_draft']} | {v['predicted_speedup']}x | "
            f"{v['predicted_speedup'] / v['best_fixed_predicted_speedup']:.3f} | "
            f"{v['predicted_speedup'] / v['oracle_predicted_speedup']:.1%} |"
        )
    lines += ["", "SpecDec++'s AUC is over per-token conditional labels, PACER's over block labels.", ""]
    atomic_write_text(Path(args.out), "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
