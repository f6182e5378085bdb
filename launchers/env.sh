# shellcheck shell=bash
# Environment shared by every launcher: `source launchers/env.sh` (the launchers do it). Sets the
# variables below from a few knobs, only where you have not set them yourself:
#
#   NET_IF=eth0     the interface the nodes reach each other on (`ip -br addr`): sets
#                   NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME. Unset: NCCL/gloo guess, and may
#                   pick docker0, a VPN or lo, which hangs or fails at the first collective.
#   USE_IB=1        allow InfiniBand/RoCE (NCCL_IB_DISABLE=0). Default 0: TCP sockets only,
#                   the safe choice on Ethernet and inside Docker without RDMA devices.
#   NCCL_DEBUG      NCCL/RCCL log level, default WARN (INFO shows interfaces, rings, transports).
#   OMP_NUM_THREADS default: this node's cores / ranks per node, at least 1 (gpt_ds_threads N).
#   TORCH_EXTENSIONS_DIR  default: <python prefix>/torch_extensions, one JIT cache per Python
#                   environment (a shared cache is rebuilt each time another environment uses it).
#   PYTHON          the interpreter (default: .venv/bin/python of the project, else python3).
#   MIN_FREE_GB     free disk the preflight check wants at --out_dir on every node (default 5).
#
# ROCm: RCCL reads the same NCCL_* variables. HSA_*, HIP_* (except HIP_VISIBLE_DEVICES),
# RCCL_* and MIOPEN_* you set are passed to remote ranks too, e.g. HSA_OVERRIDE_GFX_VERSION
# for consumer GPUs or HSA_FORCE_FINE_GRAIN_PCIE=1 for PCIe peer-to-peer (see docs/launching.md).
#
# Defines: gpt_ds_local_devices, gpt_ds_threads RANKS_PER_NODE, gpt_ds_write_ds_env FILE,
# gpt_ds_preflight ARGS..., gpt_ds_out_dir ARGS... (the --out_dir among training arguments).

GPT_DS_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export GPT_DS_ROOT

if [ -z "${PYTHON:-}" ]; then
    if [ -x "$GPT_DS_ROOT/.venv/bin/python" ]; then
        PYTHON=$GPT_DS_ROOT/.venv/bin/python
    else
        PYTHON=$(command -v python3 || command -v python)
    fi
fi
export PYTHON
# The `deepspeed` runner next to that interpreter: the pdsh runner starts ranks with the runner's
# own interpreter, so this is what every node runs.
PYTHON_BIN=$(dirname "$PYTHON")
case ":$PATH:" in *":$PYTHON_BIN:"*) ;; *) PATH="$PYTHON_BIN:$PATH" ;; esac
export PATH

if [ -n "${NET_IF:-}" ]; then
    export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-$NET_IF}"
    export GLOO_SOCKET_IFNAME="${GLOO_SOCKET_IFNAME:-$NET_IF}"
fi
if [ "${USE_IB:-0}" = 1 ]; then
    export NCCL_IB_DISABLE="${NCCL_IB_DISABLE:-0}"
else
    export NCCL_IB_DISABLE="${NCCL_IB_DISABLE:-1}"
fi
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"

if [ -z "${TORCH_EXTENSIONS_DIR:-}" ]; then
    TORCH_EXTENSIONS_DIR=$("$PYTHON" -c 'import sys; print(sys.prefix)')/torch_extensions
    if ! mkdir -p "$TORCH_EXTENSIONS_DIR" 2>/dev/null || [ ! -w "$TORCH_EXTENSIONS_DIR" ]; then
        TORCH_EXTENSIONS_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/torch_extensions/$(
            "$PYTHON" -c 'import hashlib, sys; print(hashlib.sha1(sys.prefix.encode()).hexdigest()[:12])'
        )"
    fi
fi
export TORCH_EXTENSIONS_DIR

# How many ranks this node runs: GPUS_PER_NODE, else the GPUs torch sees (CUDA or ROCm), else 0.
gpt_ds_local_devices() {
    if [ -n "${GPUS_PER_NODE:-}" ]; then
        echo "$GPUS_PER_NODE"
    else
        "$PYTHON" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0
    fi
}

# OMP_NUM_THREADS for RANKS ranks on this node: cores / ranks, at least 1 (unless already set).
gpt_ds_threads() {
    local ranks=${1:-1} cores
    cores=$(nproc 2>/dev/null || echo 1)
    [ "$ranks" -ge 1 ] 2>/dev/null || ranks=1
    OMP_NUM_THREADS=${OMP_NUM_THREADS:-$((cores / ranks > 0 ? cores / ranks : 1))}
    export OMP_NUM_THREADS
}

# Write the variables remote ranks need into FILE in DeepSpeed's `.deepspeed_env` format. The
# pdsh/OpenMPI runners start remote ranks in a fresh ssh session and export only PYTHON*, NCCL*
# (CUDA/ROCm) and what this file lists: gloo, OpenMP, the JIT cache, ROCm settings and PATH
# would otherwise not arrive. DeepSpeed's parser takes `NAME=VALUE` lines only: no comments, no
# blank lines. Add names of your own with DS_ENV_EXTRA="WANDB_API_KEY HF_HOME".
gpt_ds_write_ds_env() {
    local file=$1 name extra
    local names=(NCCL_SOCKET_IFNAME GLOO_SOCKET_IFNAME NCCL_IB_DISABLE NCCL_DEBUG OMP_NUM_THREADS
        TORCH_EXTENSIONS_DIR DEEPSPEED_TIMEOUT)
    read -r -a extra <<<"${DS_ENV_EXTRA:-}"
    names+=("${extra[@]}")
    while IFS= read -r name; do
        case $name in HIP_VISIBLE_DEVICES | CUDA_VISIBLE_DEVICES | ROCR_VISIBLE_DEVICES) continue ;; esac
        names+=("$name")
    done < <(compgen -e | grep -E '^(NCCL_|HSA_|HIP_|RCCL_|MIOPEN_|TORCH_NCCL_|TORCH_DISTRIBUTED_|PYTORCH_)' || true)
    {
        echo "GPT_DS_ENV_FILE=launchers"
        # the interpreter's bin first (ninja for JIT builds, the deepspeed tools); $PATH expands
        # on the remote node (DeepSpeed double-quotes values with '$')
        echo "PATH=$PYTHON_BIN:\$PATH"
        for name in $(printf '%s\n' "${names[@]}" | awk '!seen[$0]++'); do
            if [ -n "${!name+x}" ]; then
                printf '%s=%s\n' "$name" "${!name}"
            fi
        done
    } >"$file.tmp.$$"
    if [ -e "$file" ] && ! head -n 1 "$file" | grep -qx 'GPT_DS_ENV_FILE=launchers'; then
        rm -f "$file.tmp.$$"
        echo "error: $file exists and was not written by these launchers; move it, or set" \
            "DS_ENV_FILE to another path (and put your variables in DS_ENV_EXTRA)" >&2
        return 1
    fi
    mv "$file.tmp.$$" "$file"
}

# The value of --out_dir among training arguments (default: out), for the disk check.
gpt_ds_out_dir() {
    local out=out
    while [ $# -gt 0 ]; do
        case $1 in
            --out_dir) out=${2:-out}; shift ;;
            --out_dir=*) out=${1#--out_dir=} ;;
        esac
        shift
    done
    echo "$out"
}

# tools/preflight.py with the given arguments, unless SKIP_PREFLIGHT=1. Stops the launch on failure.
gpt_ds_preflight() {
    if [ "${SKIP_PREFLIGHT:-0}" = 1 ]; then
        echo "preflight skipped (SKIP_PREFLIGHT=1)" >&2
        return 0
    fi
    "$PYTHON" "$GPT_DS_ROOT/tools/preflight.py" "$@" || {
        echo "preflight failed: fix the lines above, or launch anyway with SKIP_PREFLIGHT=1" >&2
        return 1
    }
}
