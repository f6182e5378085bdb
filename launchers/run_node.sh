#!/usr/bin/env bash
# One node of a multi-node run when the nodes cannot ssh to each other (containers, locked-down
# clusters): start this on EVERY node with the same arguments except NODE_RANK. DeepSpeed's
# `--no_ssh --node_rank` mode: each node launches its own ranks; they meet at MASTER_ADDR.
#
#   node 0:  launchers/run_node.sh 0 10.0.0.1 2 -- --deepspeed_config ds_configs/zero2.json ...
#   node 1:  launchers/run_node.sh 1 10.0.0.1 2 -- --deepspeed_config ds_configs/zero2.json ...
#
# NODE_RANK: 0..NNODES-1, 0 on the node that owns MASTER_ADDR (global ranks 0..G-1 live there).
# MASTER_ADDR: node 0's address on the training network. NNODES: number of nodes (default: the
# hosts in GPT_DS_HOSTFILE). Everything after `--` goes to gpt_ds/train.py.
# Ranks per node: GPT_DS_GPUS_PER_NODE (default: the GPUs this node sees; 1 on a CPU-only node),
# the same on every node. Nodes with different GPU counts: set GPT_DS_HOSTFILE to a hostfile
# listing them in node-rank order (the same file on every node; names are labels only).
# Knobs: MASTER_PORT (29500), GPT_DS_SKIP_PREFLIGHT=1 (each node checks itself: devices, master
# reachability, disk), GPT_DS_MIN_FREE_GB, and those of launchers/env.sh (older names: said).
#
# SIGTERM/SIGINT (Slurm's warning signal, `docker stop`, Ctrl-C) are passed to the ranks, which
# save a checkpoint and stop (gpt_ds/train.py); DeepSpeed's launcher then exits.
set -euo pipefail
usage() {
    sed -n '2,18p' "${BASH_SOURCE[0]}" >&2
    exit 2
}
[ $# -ge 2 ] || usage
NODE_RANK=$1 MASTER_ADDR=$2
shift 2
NNODES=""
if [ $# -gt 0 ] && [ "$1" != "--" ]; then
    NNODES=$1
    shift
fi
[ $# -eq 0 ] || [ "$1" != "--" ] || shift
# shellcheck source=launchers/env.sh
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$GPT_DS_ROOT"
MASTER_PORT=${MASTER_PORT:-29500}

hostfile=$(gpt_ds_setting HOSTFILE "")
if [ -n "$hostfile" ]; then
    hosts=$(awk '!/^[[:space:]]*(#|$)/' "$hostfile" | wc -l)
    NNODES=${NNODES:-$hosts}
    if [ "$NNODES" != "$hosts" ]; then
        echo "error: NNODES=$NNODES but $hostfile lists $hosts hosts" >&2
        exit 2
    fi
    slots=$(awk '!/^[[:space:]]*(#|$)/ { if (++n == r) { sub(/.*slots=/, ""); print $1 + 0 } }' r=$((NODE_RANK + 1)) "$hostfile")
else
    if [ -z "$NNODES" ]; then
        echo "error: give NNODES (or set GPT_DS_HOSTFILE)" >&2
        usage
    fi
    slots=$(gpt_ds_local_devices)
    [ "$slots" -gt 0 ] || slots=1  # CPU-only node: one rank
    hostfile=$(mktemp "${TMPDIR:-/tmp}/gpt_ds_hostfile.XXXXXX")
    trap 'rm -f "$hostfile"' EXIT
    for ((i = 0; i < NNODES; i++)); do echo "node-$i slots=$slots"; done >"$hostfile"
fi
if ! [ "$NODE_RANK" -ge 0 ] 2>/dev/null || [ "$NODE_RANK" -ge "$NNODES" ]; then
    echo "error: NODE_RANK must be 0..$((NNODES - 1)), got '$NODE_RANK'" >&2
    exit 2
fi
gpt_ds_threads "$slots"
echo "node $NODE_RANK of $NNODES: $slots ranks, master $MASTER_ADDR:$MASTER_PORT" >&2

gpt_ds_preflight --local --node_rank "$NODE_RANK" --slots "$slots" --master_addr "$MASTER_ADDR" \
    --master_port "$MASTER_PORT" --checkpoint_dir "$(gpt_ds_out_dir "$@")" \
    --min_free_gb "$(gpt_ds_setting MIN_FREE_GB 5)"

deepspeed --hostfile "$hostfile" --no_ssh --node_rank "$NODE_RANK" \
    --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" gpt_ds/train.py "$@" &
runner=$!
# shellcheck disable=SC2317,SC2329  # called by the trap (SC2329: shellcheck 0.11 names it so)
stop() {
    # the ranks are the children of DeepSpeed's launch.py, itself the child of the runner
    local launch ranks=""
    for launch in $(pgrep -P "$runner" || true); do
        ranks+=" $(pgrep -P "$launch" | tr '\n' ' ')"
    done
    echo "run_node.sh: stop requested, signalling ranks:$ranks" >&2
    # shellcheck disable=SC2086  # a list of pids
    kill -TERM $ranks 2>/dev/null || kill -TERM "$runner" 2>/dev/null || true
}
trap stop TERM INT
status=0
wait "$runner" || status=$?
while kill -0 "$runner" 2>/dev/null; do # `wait` returns early when a trapped signal arrives
    status=0
    wait "$runner" || status=$?
done
exit "$status"
