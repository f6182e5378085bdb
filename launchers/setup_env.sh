#!/usr/bin/env bash
# Create (or update) the project's virtual environment in .venv and install gpt_ds into it.
#
#   bash launchers/setup_env.sh            # CPU machine, or NVIDIA GPUs (PyPI's torch is CUDA)
#   TORCH_SPEC="torch==2.13.0 --index-url <your ROCm wheel index>" bash launchers/setup_env.sh
#
# torch is installed first, pinned, so that pip never resolves an open range to a different
# build; the package's own range is then already satisfied. Idempotent: re-running is fast.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
VENV=${VENV:-.venv}

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    # shellcheck disable=SC2086  # TORCH_SPEC may carry pip options on purpose
    "$VENV/bin/pip" install --quiet $TORCH_SPEC
fi
"$VENV/bin/pip" install --quiet -e '.[dev,bench,monitor,plot,data,gguf]'
"$VENV/bin/python" - <<'PY'
import deepspeed, torch, transformers
print(f"ready: torch {torch.__version__}, deepspeed {deepspeed.__version__}, "
      f"transformers {transformers.__version__}")
PY
