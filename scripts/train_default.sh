#!/usr/bin/env bash
# Reproduces the shipped pre-verifier checkpoints for the default pair: collect -> measure costs -> ablation/train.
# Usage: bash scripts/train_default.sh [N_PROMPTS] [BLOCK]   (resumable: rerun after an interruption)
# Two single-threaded collections run side by side (one per core; different ShareGPT conversations via --skip).
# Then, on an otherwise idle machine, the costs are measured: they choose the thresholds.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-300}
block=${2:-1}
common=(--max-new-tokens 48 --max-draft 16 --layers=-13,-1 --seed 0 --shard-size 2 --threads 1)
.venv/bin/pacer collect --out runs/collect --n "$n" "${common[@]}" &
.venv/bin/pacer collect --out runs/collect_b --n "$n" --skip 3000 "${common[@]}" &
wait
data=runs/collect,runs/collect_b
.venv/bin/pacer tune --measure-costs runs/costs.json
.venv/bin/python scripts/preverify_ablation.py --data $data --costs runs/costs.json \
  --out docs/pacer-ablation.md --ckpts runs/ablation
.venv/bin/pacer train --data $data --out src/pacer/checkpoints/pacer-default --block "$block" \
  --costs runs/costs.json
.venv/bin/pacer train --data $data --out src/pacer/checkpoints/specdecpp-default --kind specdecpp \
  --costs runs/costs.json
