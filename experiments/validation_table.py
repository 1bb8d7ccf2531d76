"""Markdown tables of a checkpoint's validation report (``pacer train``): predicted speedups of the layer, the rules,
the features-only model, the best fixed γ and the oracle on the same held-out rounds, per cost profile and per group
(a rule the report does not hold - ``cumprob`` in checkpoints trained before it existed - is shown as ``-``).

    python experiments/validation_table.py CKPT [CKPT ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

COLS = ("layer", "layer-per-token", "cumprob", "entropy", "confidence", "features-only", "fixed", "oracle")
RATIOS = ("vs_cumprob", "vs_entropy")


def row(name: str, c: dict) -> str:
    cells = [f"{c[k]['predicted_speedup']:.3f}" if k in c else "-" for k in COLS]
    cells += [f"{c[k]:.3f}" if k in c else "-" for k in RATIOS]
    return f"| {name} | " + " | ".join(cells) + " |"


def table(path: Path) -> str:
    cfg = json.loads((path / "config.json").read_text())
    v = cfg["validation"]
    out = [f"### {path.name}: {cfg['kind']}, b={cfg['block']}, {cfg['train']['rounds_train']} training / "
           f"{cfg['train']['rounds_val']} validation rounds, {cfg['train']['prompts']} prompts",
           "", f"block AUC {v['auc']}, ECE {v.get('ece')}, survival AUC {v.get('survival_auc')}", "",
           "| profile / group | " + " | ".join(COLS) + " | layer / cumprob | layer / entropy |",
           "|---" * (len(COLS) + 3) + "|"]
    for name, c in v.get("compare", {}).items():
        out.append(row(name, c))
    for g, d in v.get("groups", {}).items():
        for p in ("measured", "flat"):
            if p in d:
                out.append(row(f"{g} ({d['rounds']} rounds), {p}", d[p]))
    return "\n".join(out)


if __name__ == "__main__":
    print("\n\n".join(table(Path(p)) for p in sys.argv[1:]))
