#!/usr/bin/env bash
# Create (or update) the project's virtual environment in .venv and install gpt_ds into it.
#
#   bash launchers/setup_env.sh            # CPU machine, or NVIDIA GPUs (PyPI's torch is CUDA)
#   GPT_DS_TORCH_SPEC="torch==2.13.0 --index-url <your ROCm wheel index>" bash launchers/setup_env.sh
#
# GPT_DS_VENV: where the environment goes (default .venv); GPT_DS_PYTHON: the interpreter that
# creates it (default python3). The older names without GPT_DS_ still work, said.
# torch is installed first, pinned, so that pip never resolves an open range to a different
# build; the package's own range is then already satisfied. Idempotent: re-running is fast.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=launchers/settings.sh
. launchers/settings.sh
python=$(gpt_ds_setting PYTHON python3)
torch_spec=$(gpt_ds_setting TORCH_SPEC torch==2.13.0)
venv=$(gpt_ds_setting VENV .venv)

# DeepSpeed 0.19 and transformers 5 publish nothing for Python 3.10 or older: pip would fail deep
# inside its resolver ("No matching distribution"). Say so first, in one line.
if ! command -v "$python" >/dev/null 2>&1; then
    echo "error: no Python interpreter '$python': set GPT_DS_PYTHON to one of 3.11 or newer" >&2
    exit 2
fi
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    found=$("$python" -c 'import sys; print(".".join(map(str, sys.version_info[:3])))')
    echo "error: gpt_ds needs Python 3.11 or newer (DeepSpeed 0.19 and transformers 5 publish" \
        "nothing older); $python is $found: run GPT_DS_PYTHON=python3.11 bash" \
        "launchers/setup_env.sh (any 3.11+ interpreter's path)" >&2
    exit 2
fi
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
    # shellcheck disable=SC2086  # the spec may carry pip options on purpose
    "$venv/bin/pip" install --quiet $torch_spec
fi
"$venv/bin/pip" install --quiet -e '.[dev,bench,monitor,plot,data,gguf,eval]'
"$venv/bin/python" - <<'PY'
import deepspeed, torch, transformers
print(f"ready: torch {torch.__version__}, deepspeed {deepspeed.__version__}, "
      f"transformers {transformers.__version__}")
PY
