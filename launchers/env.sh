# shellcheck shell=bash
# Environment shared by every launcher: `source launchers/env.sh` (the launchers do it). Sets the
# variables below from a few knobs, only where you have not set them yourself. The knobs are
# GPT_DS_<NAME>; NAME alone, the older name, still works and is said (gpt_ds_setting, in
# launchers/settings.sh):
#
#   GPT_DS_NET_IF=eth0  the interface the nodes reach each other on (`ip -br addr`): sets
#                   NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME. Unset: NCCL/gloo guess, and may
#                   pick docker0, a VPN or lo, which hangs or fails at the first collective.
#   GPT_DS_USE_IB   1: allow InfiniBand/RoCE (NCCL_IB_DISABLE=0); 0: TCP sockets only. Unset:
#                   allowed where this node has RDMA devices (/sys/class/infiniband and
#                   /dev/infiniband/uverbs*), else TCP; the choice is printed (gpt_ds_choose_ib).
#   NCCL_DEBUG      NCCL/RCCL log level, default WARN (INFO shows interfaces, rings, transports).
#   OMP_NUM_THREADS default: this node's cores / ranks per node, at least 1 (gpt_ds_threads N).
#   TORCH_EXTENSIONS_DIR  default: <python prefix>/torch_extensions, one JIT cache per Python
#                   environment (a shared cache is rebuilt each time another environment uses it).
#   GPT_DS_PYTHON   the interpreter (default: .venv/bin/python of the project, else python3).
#   GPT_DS_MIN_FREE_GB  free disk the preflight check wants at --out_dir on every node (default 5).
#   GPT_DS_SKIP_PREFLIGHT=1  launch without the preflight check (gpt_ds_preflight).
#
# ROCm: RCCL reads the same NCCL_* variables. HSA_*, HIP_* (except HIP_VISIBLE_DEVICES),
# RCCL_* and MIOPEN_* you set are passed to remote ranks too, e.g. HSA_OVERRIDE_GFX_VERSION
# for consumer GPUs or HSA_FORCE_FINE_GRAIN_PCIE=1 for PCIe peer-to-peer (see docs/launching.md).
#
# Defines: gpt_ds_setting NAME DEFAULT, gpt_ds_local_devices, gpt_ds_rank_plan [NUM_GPUS],
# gpt_ds_threads RANKS_PER_NODE, gpt_ds_write_ds_env FILE, gpt_ds_preflight ARGS...,
# gpt_ds_out_dir ARGS... (the --out_dir among training arguments), gpt_ds_choose_ib [SYSFS DEV],
# gpt_ds_check_master_addr ADDR WHERE.

# shellcheck source=launchers/settings.sh
. "$(dirname "${BASH_SOURCE[0]}")/settings.sh"
GPT_DS_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export GPT_DS_ROOT

GPT_DS_PYTHON=$(gpt_ds_setting PYTHON "")
if [ -z "$GPT_DS_PYTHON" ]; then
    if [ -x "$GPT_DS_ROOT/.venv/bin/python" ]; then
        GPT_DS_PYTHON=$GPT_DS_ROOT/.venv/bin/python
    else
        GPT_DS_PYTHON=$(command -v python3 || command -v python)
    fi
fi
export GPT_DS_PYTHON
# The `deepspeed` runner next to that interpreter: the pdsh runner starts ranks with the runner's
# own interpreter, so this is what every node runs.
PYTHON_BIN=$(dirname "$GPT_DS_PYTHON")
case ":$PATH:" in *":$PYTHON_BIN:"*) ;; *) PATH="$PYTHON_BIN:$PATH" ;; esac
export PATH

GPT_DS_NET_IF=$(gpt_ds_setting NET_IF "")
if [ -n "$GPT_DS_NET_IF" ]; then
    export GPT_DS_NET_IF
    export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-$GPT_DS_NET_IF}"
    export GLOO_SOCKET_IFNAME="${GLOO_SOCKET_IFNAME:-$GPT_DS_NET_IF}"
fi
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"

# NCCL_IB_DISABLE for this node, said on stderr. IB/RoCE where the node has RDMA devices: a
# cluster with them would otherwise train over TCP, several times slower, without a word. Both
# the sysfs entries and the uverbs device files must be there: a container sees the host's
# /sys/class/infiniband even when the devices were not passed in. SYSFS/DEV: for tests.
gpt_ds_choose_ib() {
    local sysfs=${1:-/sys/class/infiniband} dev=${2:-/dev/infiniband} found="" why use_ib
    if [ -n "${NCCL_IB_DISABLE:-}" ]; then
        echo "network: NCCL_IB_DISABLE=$NCCL_IB_DISABLE (yours)" >&2
        return 0
    fi
    if compgen -G "$dev/uverbs*" >/dev/null && compgen -G "$sysfs/*" >/dev/null; then
        found=$(cd "$sysfs" && printf '%s ' *)
    fi
    use_ib=$(gpt_ds_setting USE_IB "")
    case "$use_ib:$found" in
        1:*) NCCL_IB_DISABLE=0 why="allowed (GPT_DS_USE_IB=1)" ;;
        0:*) NCCL_IB_DISABLE=1 why="off (GPT_DS_USE_IB=0): TCP sockets" ;;
        *:?*) NCCL_IB_DISABLE=0 why="allowed: RDMA devices ${found% } (GPT_DS_USE_IB=0 for TCP)" ;;
        *) NCCL_IB_DISABLE=1 why="off: no RDMA device in $sysfs and $dev, TCP sockets" ;;
    esac
    export NCCL_IB_DISABLE
    echo "network: InfiniBand/RoCE $why (NCCL_IB_DISABLE=$NCCL_IB_DISABLE)" >&2
}
gpt_ds_choose_ib /sys/class/infiniband /dev/infiniband

# Refuses (returns 1, says why) a detected master address other nodes cannot reach: empty,
# loopback, link-local, unspecified, or on Docker's default bridge (docker0, 172.17.0.0/16), as
# the first `hostname -I` address often is. WHERE says how ADDR was found, for the message.
gpt_ds_check_master_addr() {
    local addr=$1 where=$2 why=""
    case $addr in
        "") why="it is empty" ;;
        127.* | ::1 | localhost) why="it is a loopback address" ;;
        0.0.0.0 | ::) why="it is the unspecified address" ;;
        169.254.* | [fF][eE]80:*) why="it is link-local" ;;
        172.17.*) why="it is on Docker's default bridge (docker0)" ;;
    esac
    [ -n "$why" ] || return 0
    echo "error: MASTER_ADDR '$addr' ($where) cannot be reached from other nodes: $why. Set" \
        "MASTER_ADDR to node 0's address on the training network (\`ip -br addr\` there), or" \
        "GPT_DS_NET_IF to that network's interface" >&2
    return 1
}

if [ -z "${TORCH_EXTENSIONS_DIR:-}" ]; then
    TORCH_EXTENSIONS_DIR=$("$GPT_DS_PYTHON" -c 'import sys; print(sys.prefix)')/torch_extensions
    if ! mkdir -p "$TORCH_EXTENSIONS_DIR" 2>/dev/null || [ ! -w "$TORCH_EXTENSIONS_DIR" ]; then
        TORCH_EXTENSIONS_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/torch_extensions/$(
            "$GPT_DS_PYTHON" -c 'import hashlib, sys; print(hashlib.sha1(sys.prefix.encode()).hexdigest()[:12])'
        )"
    fi
fi
export TORCH_EXTENSIONS_DIR

# How many ranks this node runs: GPT_DS_GPUS_PER_NODE, else the GPUs torch sees (CUDA or ROCm),
# else 0.
gpt_ds_local_devices() {
    local gpus
    gpus=$(gpt_ds_setting GPUS_PER_NODE "")
    if [ -n "$gpus" ]; then
        echo "$gpus"
    else
        "$GPT_DS_PYTHON" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0
    fi
}

# The local launch's ranks and runner flags (gpt_ds/launch/ranks.py) for GPT_DS_NUM_GPUS=$1 (empty:
# every visible GPU, honouring CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES, or 2 CPU ranks).
# Sets GPT_DS_RANKS, GPT_DS_RUNNER_FLAGS and GPT_DS_UNSET (arrays: `deepspeed` flags, and the
# variables to unset before it), GPT_DS_RANK_NOTE; returns 2, saying why, before any process
# starts where a rank would have no GPU (DeepSpeed's runner would start it on a missing cuda:N).
gpt_ds_rank_plan() {
    local plan
    # shellcheck disable=SC2034  # read by the launchers that source this file
    GPT_DS_RANKS=0 GPT_DS_RUNNER_FLAGS=() GPT_DS_UNSET=() GPT_DS_RANK_NOTE=""
    plan=$("$GPT_DS_PYTHON" "$GPT_DS_ROOT/gpt_ds/launch/ranks.py" "${1:-}") || return 2
    eval "$plan"
    echo "ranks: $GPT_DS_RANK_NOTE" >&2
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
# blank lines. Add names of your own with GPT_DS_DS_ENV_EXTRA="WANDB_API_KEY HF_HOME".
#
# PATH depends on GPT_DS_LAUNCHER (default pdsh). pdsh: `PATH=<python bin>:$PATH`, expanded by the
# remote shell (DeepSpeed writes `export PATH="...:$PATH";` into the pdsh command), so each node
# keeps its own PATH. openmpi, mvapich, mpich, impi, slurm: DeepSpeed passes every line as one
# argument (`mpirun -x NAME=VALUE`, `-env`, `-genv`, `srun --export=ALL,NAME=VALUE`) with no
# shell, so a `$PATH` would arrive literally (and, as DeepSpeed double-quotes any value holding
# characters other than letters, digits and @%+=:,./-, with the quotes): the ranks then find
# neither ninja nor `hostname`. These get this shell's PATH, expanded here. They also get
# MASTER_ADDR and MASTER_PORT, which those runners do not pass (gpt_ds/base/launcher_world.py
# reads rank and world from the launcher's own variables); pdsh's per-node launcher sets both.
gpt_ds_write_ds_env() {
    local file=$1 name extra launcher
    launcher=$(gpt_ds_setting LAUNCHER pdsh)
    local names=(NCCL_SOCKET_IFNAME GLOO_SOCKET_IFNAME NCCL_IB_DISABLE NCCL_DEBUG OMP_NUM_THREADS
        TORCH_EXTENSIONS_DIR DEEPSPEED_TIMEOUT)
    [ "$launcher" = pdsh ] || names+=(MASTER_ADDR MASTER_PORT)
    read -r -a extra <<<"$(gpt_ds_setting DS_ENV_EXTRA "")"
    names+=("${extra[@]}")
    while IFS= read -r name; do
        case $name in HIP_VISIBLE_DEVICES | CUDA_VISIBLE_DEVICES | ROCR_VISIBLE_DEVICES) continue ;; esac
        names+=("$name")
    done < <(compgen -e | grep -E '^(NCCL_|HSA_|HIP_|RCCL_|MIOPEN_|TORCH_NCCL_|TORCH_FR_|TORCH_DISTRIBUTED_|PYTORCH_)' || true)
    {
        echo "GPT_DS_ENV_FILE=launchers"
        # the interpreter's bin first (ninja for JIT builds, the deepspeed tools): see above
        if [ "$launcher" = pdsh ]; then
            echo "PATH=$PYTHON_BIN:\$PATH"
        else
            echo "PATH=$PATH" # env.sh put $PYTHON_BIN first
        fi
        for name in $(printf '%s\n' "${names[@]}" | awk '!seen[$0]++'); do
            if [ -n "${!name+x}" ]; then
                printf '%s=%s\n' "$name" "${!name}"
            fi
        done
    } >"$file.tmp.$$"
    if [ -e "$file" ] && ! head -n 1 "$file" | grep -qx 'GPT_DS_ENV_FILE=launchers'; then
        rm -f "$file.tmp.$$"
        echo "error: $file exists and was not written by these launchers; move it, or set" \
            "DS_ENV_FILE to another path (and put your variables in GPT_DS_DS_ENV_EXTRA)" >&2
        return 1
    fi
    mv "$file.tmp.$$" "$file"
    if [ "$launcher" != pdsh ]; then
        # values DeepSpeed will double-quote: with no shell to remove them, the quotes arrive too
        local quoted
        quoted=$(grep -E '^[^=]*=.*[^[:alnum:]_@%+=:,./-]' "$file" || true)
        if [ -n "$quoted" ]; then
            echo "warning: $launcher ranks get these values of $file in literal quotes (DeepSpeed" \
                "quotes values with characters other than letters, digits and @%+=:,./-):" >&2
            printf '  %s\n' "$quoted" >&2
        fi
    fi
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

# tools/preflight.py with the given arguments, unless GPT_DS_SKIP_PREFLIGHT=1. Stops the launch on
# failure.
gpt_ds_preflight() {
    if [ "$(gpt_ds_setting SKIP_PREFLIGHT 0)" = 1 ]; then
        echo "preflight skipped (GPT_DS_SKIP_PREFLIGHT=1)" >&2
        return 0
    fi
    "$GPT_DS_PYTHON" "$GPT_DS_ROOT/tools/preflight.py" "$@" || {
        echo "preflight failed: fix the lines above, or launch anyway with GPT_DS_SKIP_PREFLIGHT=1" >&2
        return 1
    }
}
