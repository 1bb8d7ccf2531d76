#!/usr/bin/env bash
# The GPU check: every method on CUDA, and what speculative decoding costs and gains there.
# Usage: OUT=DIR bash scripts/gpu_check.sh        (OUT defaults to ./gpu_check_out; under 8 minutes on one GPU)
# Needs no network and no weights (tiny models and random-weight Qwen2.5 shapes are built in code), only a Python with
# torch (CUDA), transformers, tokenizers, safetensors, numpy, scipy and pytest: $PYTHON, else .venv/bin/python, else
# python3. Writes "$OUT/gpu_check.md" (the report), the logs and gpu_check.json (every number); exits non-zero if a
# step failed (the report says which). For a dry run elsewhere: GPU_CHECK_TESTS="tests/test_device.py" and
# GPU_CHECK_ARGS="--device cpu --quick" replace the test files and the sweep's arguments.
#   1. pytest on CUDA: tests/test_device.py's CUDA cases and refusals (every method greedy-exact on CUDA, the sampling
#      distribution test on CUDA, tensors on the backend's device; its CPU cases are left to the CPU runs) and
#      tests/test_exactness.py (device auto: CUDA here);
#   2. python scripts/gpu_check.py: target forward cost vs k, draft token cost and loop overhead per round for bf16
#      random-weight Qwen2.5-0.5B/1.5B/7B shapes, and the speedups the decoding loop reaches with those costs on
#      acceptance traces (fixed γ, cost-aware rule, oracle; the real loop, its forwards priced).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu_check_out}"
mkdir -p "$OUT"
REPORT="$OUT/gpu_check.md"
if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"; elif [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PACER_HOME="${PACER_HOME:-$(mktemp -d)}"   # caches of this run only
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
start=$(date +%s)
status=0

{
  echo "# pacer GPU check"
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); host: $(hostname)"
  echo "- git commit: $(git rev-parse --short HEAD 2>/dev/null || echo 'n/a (no .git)')"
  gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | paste -sd ';' -)
  echo "- GPU: ${gpu:-none found by nvidia-smi}"
  echo "- python: $("$PY" -c 'import sys; print(sys.version.split()[0])' 2>&1) ($PY)"
  echo "- $("$PY" -c 'import torch; print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuda available: {torch.cuda.is_available()}")' 2>&1 | tail -1)"
  echo "- $("$PY" -c 'import transformers; print(f"transformers {transformers.__version__}")' 2>&1 | tail -1)"
  echo
} > "$REPORT"

if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "**No CUDA device is visible to this Python: the CUDA tests skip and the sweep runs nowhere.**" >> "$REPORT"
  echo >> "$REPORT"
  status=1
fi

# 1. tests on CUDA
echo "## Tests on CUDA" >> "$REPORT"
echo >> "$REPORT"
read -r -a tests <<< "${GPU_CHECK_TESTS:-tests/test_device.py tests/test_exactness.py}"
read -r -a sweep <<< "${GPU_CHECK_ARGS:---device cuda}"
select="${GPU_CHECK_K:-not cpu}"
timeout 240 "$PY" -m pytest -q -p no:cacheprovider -rfEs -k "$select" "${tests[@]}" > "$OUT/pytest.log" 2>&1
rc=$?
summary=$(grep -E '[0-9]+ (passed|failed|error)' "$OUT/pytest.log" | tail -1)
echo "- \`pytest -k '$select' ${tests[*]}\`: ${summary:-no summary} (exit $rc$([ $rc = 124 ] && echo ', timed out after 240 s'))" \
  >> "$REPORT"
if [ $rc != 0 ]; then
  status=1
  { echo; echo '```'; grep -E '^(FAILED|ERROR)|Error|assert' "$OUT/pytest.log" | head -40; echo '```'; } >> "$REPORT"
fi
skipped=$(grep -E '^SKIPPED' "$OUT/pytest.log" | head -10)
[ -n "$skipped" ] && { echo; echo '```'; echo "$skipped"; echo '```'; } >> "$REPORT"
echo >> "$REPORT"

# 2. costs, loop overhead and the speedups on acceptance traces
timeout 180 "$PY" scripts/gpu_check.py "${sweep[@]}" --out "$OUT" > "$OUT/gpu_check.log" 2>&1
rc=$?
if [ $rc = 0 ] && [ -f "$OUT/gpu_check_costs.md" ]; then
  cat "$OUT/gpu_check_costs.md" >> "$REPORT"
else
  status=1
  { echo "## Costs"; echo; echo "\`python scripts/gpu_check.py ${sweep[*]}\` failed (exit $rc$([ $rc = 124 ] && \
      echo ', timed out after 180 s')):"; echo; echo '```'; tail -25 "$OUT/gpu_check.log"; echo '```'; } >> "$REPORT"
fi

echo >> "$REPORT"
echo "---" >> "$REPORT"
echo "gpu_check.sh took $(( $(date +%s) - start )) s; logs: pytest.log, gpu_check.log; numbers: gpu_check.json" \
  >> "$REPORT"
echo "report: $REPORT"
exit $status
