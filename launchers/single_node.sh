#!/usr/bin/env bash
# Train on this machine with all its GPUs (CUDA or ROCm); on a machine with no GPU, 2 CPU ranks.
#
#   launchers/single_node.sh --deepspeed_config ds_configs/zero2.json --model gpt2 \
#       --data_dir data/owt --out_dir out/gpt2 [more gpt_ds/train.py arguments]
#
# Every argument goes to gpt_ds/train.py. Knobs (environment): GPT_DS_NUM_GPUS (ranks; default:
# every visible GPU, or 2 CPU ranks without one; more ranks than visible GPUs is refused before
# anything starts), CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES (which GPUs: honoured, passed
# to DeepSpeed as --include), MASTER_PORT (default 29500; change it to run two jobs on one
# machine), GPT_DS_SKIP_PREFLIGHT=1, GPT_DS_MIN_FREE_GB, and those of launchers/env.sh
# (NCCL_DEBUG, OMP_NUM_THREADS, ...). The older names without GPT_DS_ still work, said.
# Runs `deepspeed <--num_gpus N | --include localhost:LIST> --master_port P gpt_ds/train.py "$@"`
# from the project directory (gpt_ds/launch/ranks.py decides the flags).
set -euo pipefail
# shellcheck source=launchers/env.sh
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$GPT_DS_ROOT"

gpt_ds_rank_plan "$(gpt_ds_setting NUM_GPUS "")" || exit 2
MASTER_PORT=${MASTER_PORT:-29500}
gpt_ds_threads "$GPT_DS_RANKS"

gpt_ds_preflight --local --slots "$GPT_DS_RANKS" --master_port "$MASTER_PORT" \
    --checkpoint_dir "$(gpt_ds_out_dir "$@")" --min_free_gb "$(gpt_ds_setting MIN_FREE_GB 5)"

for name in "${GPT_DS_UNSET[@]}"; do unset "$name"; done
exec deepspeed "${GPT_DS_RUNNER_FLAGS[@]}" --master_port "$MASTER_PORT" gpt_ds/train.py "$@"
