"""The peers benchmarks/throughput.py times gpt_ds against, run one rank each by `deepspeed`:

    deepspeed --num_gpus 2 benchmarks/peer_trainers.py --trainer hf --ds_config RESOLVED.json ...

- `hf`: the Hugging Face `Trainer` (needs `accelerate`, a runtime dependency), given the
  same DeepSpeed config with its optimizer settings repeated in `TrainingArguments` (the
  Trainer refuses a config that disagrees with them) and its own scheduler;
- `bare`: a bare loop around `deepspeed.initialize` with the same config: the least any
  trainer on this engine can add.

Both train `GPT2LMHeadModel` with its own loss (full logits), on random windows of the same
`train.bin`, at the same micro-batch and accumulation (the model and the windows come from
support/peers.py, as for plain_loop.py's loops without DeepSpeed). Rank 0 writes the
wall-clock time at the end of every optimizer step (and on GPUs the allocator's peak) to
`--times` (JSON), which throughput.py turns into tokens/s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from support.peers import RandomWindows, add_run_arguments, gpt2, train_windows  # noqa: E402

from gpt_ds.base.dist import skip_cpu_shm_op  # noqa: E402


def rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def run_hf(args: argparse.Namespace, ds: dict, data: RandomWindows, times: list[float]) -> None:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    ds = {k: v for k, v in ds.items() if k != "scheduler"}  # the Trainer brings its own
    opt = ds["optimizer"]["params"]
    training_args = TrainingArguments(
        output_dir=str(Path(args.times).parent / "hf_trainer"),
        per_device_train_batch_size=ds["train_micro_batch_size_per_gpu"],
        gradient_accumulation_steps=ds["gradient_accumulation_steps"],
        max_steps=args.steps,
        learning_rate=opt["lr"],
        weight_decay=opt.get("weight_decay", 0.0),
        adam_beta1=opt.get("betas", [0.9, 0.999])[0],
        adam_beta2=opt.get("betas", [0.9, 0.999])[1],
        adam_epsilon=opt.get("eps", 1e-8),
        max_grad_norm=ds.get("gradient_clipping", 1.0),
        lr_scheduler_type="constant",
        bf16=ds.get("bf16", {}).get("enabled", False),
        fp16=ds.get("fp16", {}).get("enabled", False),
        deepspeed=ds,
        save_strategy="no",
        eval_strategy="no",
        logging_strategy="no",
        report_to=[],
        dataloader_num_workers=0,
        seed=args.seed,
        disable_tqdm=True,
        use_cpu=not torch.cuda.is_available(),
    )

    class StepTimes(TrainerCallback):
        def on_step_end(self, *_, **__):
            times.append(time.time())

    trainer = Trainer(model=gpt2(args), args=training_args, train_dataset=data)
    trainer.add_callback(StepTimes())
    trainer.train()


def run_bare(args: argparse.Namespace, ds: dict, data: RandomWindows, times: list[float]) -> None:
    import deepspeed

    deepspeed.init_distributed()
    model = gpt2(args)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
    micro, accum = ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]
    device = engine.device
    index = rank() * len(data) // 2  # ranks draw different windows
    for _ in range(args.steps):
        for _ in range(accum):
            batch = torch.stack([data[index + j]["input_ids"] for j in range(micro)]).to(device)
            index += micro
            loss = engine(input_ids=batch, labels=batch).loss
            engine.backward(loss)
            engine.step()
        loss.item()  # what a logging loop waits for once per step
        times.append(time.time())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trainer", choices=("hf", "bare"), required=True)
    p.add_argument("--ds_config", required=True, help="a resolved DeepSpeed config (JSON)")
    add_run_arguments(p)
    args = p.parse_args(argv)
    ds = json.loads(Path(args.ds_config).read_text())
    data = train_windows(
        args.data_dir, args.block_size, ds["train_batch_size"], args.steps, args.seed
    )
    times: list[float] = []
    # on CPU ranks, without the shared-memory all-reduce gpt_ds's rows skip: a rank's memory
    # would count its two ~66 MB buffers, which training never uses
    skip_cpu_shm_op()
    (run_hf if args.trainer == "hf" else run_bare)(args, ds, data, times)
    if rank() == 0:
        gpu = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
        Path(args.times).write_text(json.dumps({"times": times, "peak_gpu_gib": gpu}))
    return 0


def exit_now(code: int) -> None:
    """Leave without C++ teardown, as gpt_ds/train.py does: a finished rank of either peer
    sometimes aborts there ("terminate called without an active exception")."""
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
