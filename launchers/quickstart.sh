#!/usr/bin/env bash
# The README's main job: prepare the bundled Tiny Shakespeare, train gpt2-tiny with ZeRO-2 on 2
# local ranks (2 GPUs, or 2 CPU processes), evaluate and checkpoint as it goes, then export the
# final checkpoint to a Hugging Face directory and print a sample from it.
#
#   bash launchers/quickstart.sh [extra train.py flags, e.g. --max_iters 600]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${VENV:-.venv}/bin
DATA=${DATA:-data/shakespeare}
OUT=${OUT:-out/shakespeare}
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/${VENV:-.venv}/torch_extensions}
export PATH="$PWD/$BIN:$PATH"

[ -f "$DATA/meta.json" ] || python tools/prepare_data.py --out_dir "$DATA"
deepspeed --num_gpus 2 gpt_ds/train.py --deepspeed_config ds_configs/zero2.json \
    --model gpt2-tiny --block_size 128 --micro_batch_size 8 --grad_accum 1 \
    --data_dir "$DATA" --out_dir "$OUT" --max_iters 300 --eval_interval 100 --eval_iters 10 \
    --lr 2e-3 --warmup_iters 30 --log_interval 20 --keep_last 2 "$@"
rm -rf "$OUT/hf"
python tools/zero_to_fp32.py "$OUT" --output "$OUT/hf"
python tools/sample.py --model "$OUT/hf" --prompt "ROMEO:" --max_new_tokens 80 --seed 1
