#!/usr/bin/env bash
# GPU check for a lent device machine (one H200), on the machine's own image and PyTorch.
#
#   bash training/tools/gpu_check.sh [gpu_check.py args]          # on the GPU
#   bash training/tools/gpu_check.sh --cpu-smoke --out x.json     # the same path on a CPU
#
# Runs training/tools/gpu_check.py (the real trainer: ~1B and ~3B Llama shapes; BF16, FP8
# tensorwise, FP8 rowwise; eager and torch.compile; a context-parallel case when the
# trainer has one) under an 8-minute wall limit. It writes bench/gpu/gpu-check-<gpu>-<time>.json
# (calibration rows for `make calibrate`) and, when $OUT is set, a copy into $OUT.
#
# The image has Python 3.12, torch 2.11 and transformers 5.17 but no pydantic, torchao or
# torchdata, and no network. Their wheels travel in ./.whl (`make gpu-wheels` fills it:
# about 8 MB) and are installed here with --no-deps into $TMPDIR/tt-gpu-deps/site, which
# goes on sys.path AFTER site-packages (training/__init__.py appends $TT_APPEND_SYSPATH):
# nothing carried can shadow the image's torch, and gpu_check.py fails if torch came from
# there. typing_extensions is the one exception: pydantic needs a recent one, so when the
# image's is older the carried copy goes in front ($TMPDIR/tt-gpu-deps/front), alone.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-python3}"
deps="${TT_GPU_DEPS:-${TMPDIR:-/tmp}/tt-gpu-deps}"  # outside the repository
wheels="$PWD/.whl"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "from", torch.__file__, "cuda", torch.version.cuda, "gpu", torch.cuda.is_available())'

if [ -d "$wheels" ] && ls "$wheels"/*.whl >/dev/null 2>&1; then
  rm -rf "$deps" && mkdir -p "$deps/site" "$deps/front"
  names=(pydantic pydantic-core annotated-types typing-inspection torchao torchdata typing-extensions)
  if "$PY" -m pip --version >/dev/null 2>&1; then
    "$PY" -m pip install --quiet --no-deps --no-index --find-links "$wheels" --target "$deps/site" "${names[@]}"
  else  # no pip in the image: a wheel is a zip archive; take the ones this interpreter can load
    "$PY" - "$wheels" "$deps/site" <<'PYEOF'
import sys, zipfile
from pathlib import Path
ours = f"cp{sys.version_info.major}{sys.version_info.minor}"
for wheel in sorted(Path(sys.argv[1]).glob("*.whl")):
    python, abi, _ = wheel.stem.split("-")[-3:]
    if python.startswith("py3") or abi == "abi3" or python == ours:
        zipfile.ZipFile(wheel).extractall(sys.argv[2])
PYEOF
  fi
  export TT_APPEND_SYSPATH="$deps/site"
  # pydantic's floor for typing_extensions; the image's copy stays unless it is older.
  if ! "$PY" - <<'PYEOF'
import sys
from importlib.metadata import version, PackageNotFoundError
try:
    have = tuple(int(x) for x in version("typing_extensions").split(".")[:2])
except PackageNotFoundError:
    sys.exit(0)  # none in the image: the appended copy serves
sys.exit(0 if have >= (4, 16) else 1)
PYEOF
  then
    mv "$deps/site/typing_extensions.py" "$deps/front/"
    export PYTHONPATH="$deps/front${PYTHONPATH:+:$PYTHONPATH}"
    echo "gpu_check: the image's typing_extensions is older than pydantic needs; the carried one goes first"
  fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTORCH_ALLOC_CONF=expandable_segments:True
"$PY" -c 'import training, sys, pydantic, torch; print("sys.path tail", sys.path[-2:]); print("pydantic", pydantic.__version__, "from", pydantic.__file__)'
exec timeout --signal=TERM --kill-after=20 470 "$PY" -m training.tools.gpu_check "$@"
