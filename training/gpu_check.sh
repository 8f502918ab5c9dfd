#!/usr/bin/env bash
# GPU check for a lent device machine (one H200), with the machine's own PyTorch.
#
#   bash training/gpu_check.sh [results.json] [extra gpu_check.py args]
#
# Runs training/gpu_check.py (the real trainer: ~1B and ~3B Llama shapes; BF16, FP8
# tensorwise, FP8 rowwise; eager and torch.compile) under an 8-minute wall limit and
# writes JSON to the first argument, else $OUT/gpu_check.json. Extra packages the
# machine lacks (torchao, torchdata, transformers, aws-embedded-metrics) can be put in
# ./.gpu_deps (pip install --target .gpu_deps ...) and carried along; it goes on PYTHONPATH.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-.}/gpu_check.json"
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then out="$1"; shift; fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
[ -d .gpu_deps ] && export PYTHONPATH="$PYTHONPATH:$PWD/.gpu_deps"
export PYTORCH_ALLOC_CONF=expandable_segments:True
PY="${PYTHON:-python3}"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
listing=0; for arg in "$@"; do [ "$arg" = "--list" ] && listing=1; done
"$PY" -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.is_available()); sys.exit(0 if torch.cuda.is_available() or sys.argv[1] == "1" else 3)' "$listing"
"$PY" -c 'import torchao, torchdata, transformers' 2>/dev/null || echo "gpu_check: warning: torchao/torchdata/transformers missing; runs will record the ImportError"
exec timeout --signal=TERM --kill-after=20 470 "$PY" -m training.gpu_check --out "$out" "$@"
