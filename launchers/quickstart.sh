#!/usr/bin/env bash
# The README's main job: prepare the bundled Tiny Shakespeare, train gpt2-tiny with ZeRO-2 on
# every visible GPU (one rank each; CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES choose them), or
# 2 CPU processes where there is no GPU, evaluate and checkpoint as it goes, then export the
# final checkpoint to a Hugging Face directory and print a sample from it.
#
# Run again, it continues where it stopped (`--resume auto`): a stopped run goes on from its
# newest checkpoint, a finished one trains nothing and is exported and sampled again. To start
# over, delete the out dir or set GPT_DS_OUT to another.
#
#   bash launchers/quickstart.sh [extra train.py flags, e.g. --max_iters 600]
#   GPT_DS_NUM_GPUS=1 bash launchers/quickstart.sh   # fewer ranks; more than the GPUs is refused
#   GPT_DS_OUT=/scratch/run bash launchers/quickstart.sh   # where the run goes (GPT_DS_DATA: data)
#
# GPT_DS_VENV / GPT_DS_PYTHON: the environment (default .venv). The older names without GPT_DS_
# (NUM_GPUS, OUT, DATA, ...) still work, said: many shells and schedulers set OUT for another use.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=launchers/settings.sh
. launchers/settings.sh
GPT_DS_PYTHON=$(gpt_ds_setting PYTHON "$PWD/$(gpt_ds_setting VENV .venv)/bin/python")
# shellcheck source=launchers/env.sh
. launchers/env.sh  # PATH (python, deepspeed), the JIT cache, gpt_ds_rank_plan
DATA=$(gpt_ds_setting DATA data/shakespeare)
OUT=$(gpt_ds_setting OUT out/shakespeare)

gpt_ds_rank_plan "$(gpt_ds_setting NUM_GPUS "")" || exit 2
for name in "${GPT_DS_UNSET[@]}"; do unset "$name"; done
[ -f "$DATA/meta.json" ] || python tools/prepare_data.py --out_dir "$DATA"
deepspeed "${GPT_DS_RUNNER_FLAGS[@]}" gpt_ds/train.py --deepspeed_config ds_configs/zero2.json \
    --model gpt2-tiny --block_size 128 --micro_batch_size 8 --grad_accum 1 \
    --data_dir "$DATA" --out_dir "$OUT" --max_iters 300 --eval_interval 100 --eval_iters 10 \
    --lr 2e-3 --warmup_iters 30 --log_interval 20 --keep_last 2 --resume auto "$@"
rm -rf "$OUT/hf"
python tools/zero_to_fp32.py "$OUT" --output "$OUT/hf"
python tools/sample.py --model "$OUT/hf" --prompt "ROMEO:" --max_new_tokens 80 --seed 1
