#!/usr/bin/env bash
# Train on several machines with OpenMPI's mpirun instead of pdsh (DeepSpeed `--launcher
# openmpi`): one process per slot of the hostfile, started by mpirun over its own ssh/rsh agent.
#
#   GPT_DS_HOSTFILE=hostfile MASTER_ADDR=10.0.0.1 GPT_DS_NET_IF=eth0 launchers/openmpi.sh \
#       --deepspeed_config ds_configs/zero2.json --model gpt2 --data_dir /shared/data/owt ...
#
# Every argument goes to gpt_ds/train.py. Needs OpenMPI (`ompi_info` on PATH) on every node;
# not mpi4py. DeepSpeed's OpenMPI runner sets no RANK/WORLD_SIZE/MASTER_*: each rank reads its
# rank and world from mpirun's OMPI_COMM_WORLD_* (gpt_ds/base/launcher_world.py), and
# MASTER_ADDR/MASTER_PORT and an expanded PATH come from .deepspeed_env (launchers/env.sh).
# With one host in the hostfile DeepSpeed skips mpirun and launches locally.
# DeepSpeed's OpenMPI runner supports no --include/--exclude/--num_gpus: edit the hostfile.
# mpirun's TCP traffic is pinned to GPT_DS_NET_IF (default: this node's default-route
# interface); as root (Docker) --allow-run-as-root is added. GPT_DS_MPI_ARGS adds mpirun options.
# Otherwise as launchers/multi_node.sh (same knobs, same .deepspeed_env, same preflight); the
# older names without GPT_DS_ still work, said.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=launchers/settings.sh
. "$here/settings.sh"
net_if=$(gpt_ds_setting NET_IF "")
if [ -z "$net_if" ]; then
    net_if=$(ip route show default 2>/dev/null | awk '{ for (i = 1; i < NF; i++) if ($i == "dev") { print $(i + 1); exit } }')
    if [ -z "$net_if" ]; then
        echo "error: set GPT_DS_NET_IF to the interface the nodes share (see: ip -br addr)" >&2
        exit 2
    fi
    echo "GPT_DS_NET_IF=$net_if (default route; set GPT_DS_NET_IF to choose)" >&2
fi
mpi_args="--mca btl_tcp_if_include $net_if --mca oob_tcp_if_include $net_if"
[ "$(id -u)" != 0 ] || mpi_args+=" --allow-run-as-root"
mpi_args+=" $(gpt_ds_setting MPI_ARGS "")"
# for multi_node.sh, which prefers GPT_DS_ names to the older ones
export GPT_DS_NET_IF=$net_if GPT_DS_LAUNCHER=openmpi GPT_DS_LAUNCHER_ARGS="$mpi_args"
exec "$here/multi_node.sh" "$@"
