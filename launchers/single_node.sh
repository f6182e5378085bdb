#!/usr/bin/env bash
# Train on this machine with all its GPUs (CUDA or ROCm); on a machine with no GPU, 2 CPU ranks.
#
#   launchers/single_node.sh --deepspeed_config ds_configs/zero2.json --model gpt2 \
#       --data_dir data/owt --out_dir out/gpt2 [more gpt_ds/train.py arguments]
#
# Every argument goes to gpt_ds/train.py. Knobs (environment): NUM_GPUS (ranks; default: all
# GPUs, or 2 on CPU), MASTER_PORT (default 29500; change it to run two jobs on one machine),
# SKIP_PREFLIGHT=1, and those of launchers/env.sh (NCCL_DEBUG, OMP_NUM_THREADS, ...).
# Runs `deepspeed --num_gpus N --master_port P gpt_ds/train.py "$@"` from the project directory.
set -euo pipefail
# shellcheck source=launchers/env.sh
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$GPT_DS_ROOT"

if [ -z "${NUM_GPUS:-}" ]; then
    NUM_GPUS=$(gpt_ds_local_devices)
    [ "$NUM_GPUS" -gt 0 ] || NUM_GPUS=2  # CPU: 2 ranks (gloo + DeepSpeed's shared-memory op)
fi
MASTER_PORT=${MASTER_PORT:-29500}
gpt_ds_threads "$NUM_GPUS"

gpt_ds_preflight --local --slots "$NUM_GPUS" --master_port "$MASTER_PORT" \
    --checkpoint_dir "$(gpt_ds_out_dir "$@")" --min_free_gb "${MIN_FREE_GB:-5}"

exec deepspeed --num_gpus "$NUM_GPUS" --master_port "$MASTER_PORT" gpt_ds/train.py "$@"
