#!/usr/bin/env bash
# Train on several machines with DeepSpeed's hostfile runner: from this node, pdsh starts
# DeepSpeed's per-node launcher on every host of the hostfile over ssh (this node included).
#
#   GPT_DS_HOSTFILE=hostfile MASTER_ADDR=10.0.0.1 GPT_DS_NET_IF=eth0 launchers/multi_node.sh \
#       --deepspeed_config ds_configs/zero2.json --model gpt2-medium \
#       --data_dir /shared/data/owt --out_dir /shared/out/medium
#
# Every argument goes to gpt_ds/train.py. Needs: passwordless ssh to every host, pdsh here, and
# the project, its Python environment, data and --out_dir at the same paths on every host
# (tools/preflight.py checks all of it first; see hostfile.example and docs/launching.md).
#
# Knobs (environment): GPT_DS_HOSTFILE (default: hostfile), MASTER_ADDR (default: the first
# host's address on GPT_DS_NET_IF, else its first `hostname -I` address, as DeepSpeed picks),
# MASTER_PORT (29500), GPT_DS_SSH_PORT (sshd port, if not in ~/.ssh/config), GPT_DS_LAUNCHER
# (pdsh; or openmpi, mpich, impi, mvapich, slurm), GPT_DS_LAUNCHER_ARGS (options for that
# launcher), GPT_DS_DS_ARGS (more runner options, e.g. "--include worker-1:0,1@worker-2"),
# DS_ENV_FILE (DeepSpeed's own; default .deepspeed_env), GPT_DS_DS_ENV_EXTRA,
# GPT_DS_EXPECTED_DEVICES, GPT_DS_MIN_FREE_GB, GPT_DS_SKIP_PREFLIGHT=1, and those of
# launchers/env.sh (GPT_DS_NET_IF, GPT_DS_USE_IB, NCCL_DEBUG, ...). The older names without
# GPT_DS_ still work, said.
#
# It writes DS_ENV_FILE in the project directory: the variables remote ranks need (NCCL/RCCL,
# gloo, OpenMP, JIT cache, PATH; for GPT_DS_LAUNCHER other than pdsh also MASTER_ADDR/MASTER_PORT,
# which DeepSpeed's MPI and Slurm runners do not pass; see gpt_ds_write_ds_env in env.sh).
# DeepSpeed reads that file (and ~/.deepspeed_env) and exports its lines in the remote command,
# because ranks started over ssh do not inherit this shell's environment.
set -euo pipefail
# shellcheck source=launchers/env.sh
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$GPT_DS_ROOT"

hostfile=$(gpt_ds_setting HOSTFILE hostfile)
ssh_port=$(gpt_ds_setting SSH_PORT "")
GPT_DS_LAUNCHER=$(gpt_ds_setting LAUNCHER pdsh) # exported for gpt_ds_write_ds_env
export GPT_DS_LAUNCHER
MASTER_PORT=${MASTER_PORT:-29500}
export DS_ENV_FILE=${DS_ENV_FILE:-.deepspeed_env} # DeepSpeed's runner reads it too
if [ ! -f "$hostfile" ]; then
    echo "error: hostfile '$hostfile' not found: copy hostfile.example, or set GPT_DS_HOSTFILE" >&2
    exit 2
fi
ssh_opts=(-o BatchMode=yes -o ConnectTimeout=10)
[ -z "$ssh_port" ] || ssh_opts+=(-p "$ssh_port")

if [ -z "${MASTER_ADDR:-}" ]; then
    first=$(awk '!/^[[:space:]]*(#|$)/ {print $1; exit}' "$hostfile")
    if [ -n "${GPT_DS_NET_IF:-}" ]; then # env.sh read it
        query="ip -4 -o addr show dev $GPT_DS_NET_IF"
    else
        query="hostname -I"
    fi
    # shellcheck disable=SC2029  # the query is built here on purpose
    MASTER_ADDR=$(ssh "${ssh_opts[@]}" "$first" "$query" 2>/dev/null |
        awk '{ if ($4 ~ /\//) { split($4, a, "/"); print a[1] } else print $1; exit }') || true
    MASTER_ADDR=${MASTER_ADDR:-$first}
    echo "MASTER_ADDR=$MASTER_ADDR (first host $first; set MASTER_ADDR to choose)" >&2
    # `hostname -I` lists addresses in no promised order: docker0 or a link-local one may lead
    gpt_ds_check_master_addr "$MASTER_ADDR" "first $query address of $first" || exit 2
fi

# ranks per node = the largest slots value, for OMP_NUM_THREADS
slots=$(awk '!/^[[:space:]]*(#|$)/ { if (match($0, /slots=[0-9]+/)) { n = substr($0, RSTART + 6, RLENGTH - 6) + 0; if (n > m) m = n } } END { print m + 0 }' "$hostfile")
gpt_ds_threads "$slots"
gpt_ds_write_ds_env "$DS_ENV_FILE"

preflight=(--hostfile "$hostfile" --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT"
    --checkpoint_dir "$(gpt_ds_out_dir "$@")" --min_free_gb "$(gpt_ds_setting MIN_FREE_GB 5)")
[ -z "$ssh_port" ] || preflight+=(--ssh_port "$ssh_port")
expected=$(gpt_ds_setting EXPECTED_DEVICES "")
[ -z "$expected" ] || preflight+=(--expected_devices "$expected")
gpt_ds_preflight "${preflight[@]}"

runner=(--hostfile "$hostfile" --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT"
    --launcher "$GPT_DS_LAUNCHER")
[ -z "$ssh_port" ] || runner+=(--ssh_port "$ssh_port")
launcher_args=$(gpt_ds_setting LAUNCHER_ARGS "")
[ -z "$launcher_args" ] || runner+=(--launcher_args "$launcher_args")
read -r -a ds_args <<<"$(gpt_ds_setting DS_ARGS "")"
exec deepspeed "${runner[@]}" "${ds_args[@]}" gpt_ds/train.py "$@"
