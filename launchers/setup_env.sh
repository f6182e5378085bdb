#!/usr/bin/env bash
# Create (or update) the project's virtual environment in .venv and install gpt_ds into it.
#
#   bash launchers/setup_env.sh            # CPU machine, or NVIDIA GPUs (PyPI's torch is CUDA)
#   GPT_DS_TORCH_SPEC="torch==2.13.0 --index-url <your ROCm wheel index>" bash launchers/setup_env.sh
#
# GPT_DS_VENV: where the environment goes (default .venv); GPT_DS_PYTHON: the interpreter that
# creates it (default python3); GPT_DS_BUILD_OPS=0: leave DeepSpeed's ops to their first use.
# The older names without GPT_DS_ still work, said.
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
# What a bare Debian or Ubuntu lacks, said before venv or the first launch fails on it:
# ensurepip, which `python3 -m venv` needs (Debian's pythonX.Y-venv; not needed for a venv
# already made), Python's headers and a C++ compiler (torch's: $CXX, else c++), with which
# DeepSpeed builds its ops (CPU Adam for offload, FusedAdam on GPUs) and torch.compile its kernels.
read -r version missing < <("$python" - "$venv" <<'PY'
import os, sys, sysconfig
venv = os.path.join(sys.argv[1], "bin", "python")
missing = []
try:
    import ensurepip  # noqa: F401
except ImportError:
    if not os.access(venv, os.X_OK):
        missing.append("venv")
if not os.path.isfile(os.path.join(sysconfig.get_path("include"), "Python.h")):
    missing.append("dev")
print("%d.%d" % sys.version_info[:2], ",".join(missing))
PY
)
command -v "${CXX:-c++}" >/dev/null 2>&1 || missing="${missing:+$missing,}cxx"
if [ -n "${missing:-}" ]; then
    what="" packages=()
    for item in ${missing//,/ }; do
        case $item in
            venv) what+="; the venv module's ensurepip" packages+=("python$version-venv") ;;
            dev) what+="; Python's headers (Python.h)" packages+=("python$version-dev") ;;
            cxx) what+="; a C++ compiler ('${CXX:-c++}' is not on PATH)" packages+=(g++) ;;
        esac
    done
    sudo=$([ "$(id -u)" = 0 ] || echo "sudo ")
    {
        echo "error: $python ($version) lacks what the set-up and the first launch need:" \
            "${what#; }. On Debian or Ubuntu:"
        echo "  ${sudo}apt-get install ${packages[*]}"
        echo "then run launchers/setup_env.sh again (another system: its packages for the" \
            "same; CXX names another compiler)"
    } >&2
    exit 2
fi
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
    # shellcheck disable=SC2086  # the spec may carry pip options on purpose
    "$venv/bin/pip" install --quiet $torch_spec
fi
"$venv/bin/pip" install --quiet -e '.[dev,bench,monitor,plot,data,gguf,eval]'
# DeepSpeed JIT-builds some ops at their first use (CPU ranks' all-reduce, CPU Adam, FusedAdam):
# built here once, so that no launch waits minutes for a compiler. GPT_DS_BUILD_OPS=0 skips it.
if [ "${GPT_DS_BUILD_OPS:-1}" != 0 ]; then
    "$venv/bin/python" -m gpt_ds.launch.ops
fi
"$venv/bin/python" - <<'PY'
import deepspeed, torch, transformers
print(f"ready: torch {torch.__version__}, deepspeed {deepspeed.__version__}, "
      f"transformers {transformers.__version__}")
PY
