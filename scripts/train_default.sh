#!/usr/bin/env bash
# Reproduces the shipped pre-verifier checkpoints for the default pair: collect -> measure costs -> ablation/train.
# Usage: bash scripts/train_default.sh [N_PROMPTS] [BLOCK]   (resumable: rerun after an interruption)
# Run it on an otherwise idle machine: the costs it measures choose the thresholds.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-300}
block=${2:-2}
.venv/bin/pacer collect --out runs/collect --n "$n" --max-new-tokens 48 --max-draft 16 --layers -13,-1 --seed 0 \
  --threads 1
.venv/bin/pacer tune --measure-costs runs/costs.json
.venv/bin/python scripts/preverify_ablation.py --data runs/collect --costs runs/costs.json \
  --out docs/pacer-ablation.md --ckpts runs/ablation
.venv/bin/pacer train --data runs/collect --out src/pacer/checkpoints/pacer-default --block "$block" \
  --costs runs/costs.json
.venv/bin/pacer train --data runs/collect --out src/pacer/checkpoints/specdecpp-default --kind specdecpp \
  --costs runs/costs.json
