"""Measure the model-state bytes each rank of a live DeepSpeed engine holds; print with predictions.

Launched by tests/test_memory_measured.py through `deepspeed --num_gpus N`. For each
`STAGE:PRECISION[:muon]` in --configs it builds a fresh GPT-2
(gpt_ds.model.training_model.build_model), runs `deepspeed.initialize` with an inline config
(torch's AdamW, as gpt_ds picks on CPU ranks, so no FusedAdam is built; or Muon with gpt_ds's
split and groups; no "auto"), takes one full step so the optimizer has its state, then on a
second step measures twice with gpt_ds.memory.measured_model_state_bytes: after backward, and
from inside the inner optimizer's step (when the fp32 gradient partition exists; the largest of
the calls, as DeepSpeed steps param groups or sub-groups one at a time). Each rank prints one
line per config to --out_dir/rank{R}.jsonl (one file per rank: launcher output interleaves)
with both measurements and gpt_ds.memory.estimate_run's prediction for that rank
(`phase_bytes`).

A step is one sequence of 16 tokens by default: model states do not depend on the tokens, and
on CPUs without AVX-512 BF16 bf16 is emulated, so every token costs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path

import deepspeed
import torch
import torch.distributed as tdist

from gpt_ds.base.dist import skip_cpu_shm_op
from gpt_ds.memory.estimate import DeepSpeedRun, MemoryEstimate, ZeroSettings, estimate_run
from gpt_ds.memory.measure import measured_model_state_bytes
from gpt_ds.model.gpt2 import param_groups, resolve_shape
from gpt_ds.model.training_model import build_model
from gpt_ds.training.engine_build import gpt2_muon_split, run_eager

REDUCE_BUCKET = 5_000_000  # small: the buckets are not measured, and CPU RAM is shared


# torch's AdamW for Muon's AdamW half too, as gpt_ds picks on CPU ranks: without `torch_adam`
# DeepSpeed JIT-builds its FusedAdam for it (~60 CPU s in a fresh venv)
MUON = {
    "type": "Muon",
    "params": {"lr": 1e-4, "muon_lr": 0.02, "momentum": 0.95, "torch_adam": True},
}


def ds_config(stage: int, precision: str, world: int, micro: int, optimizer: str) -> dict:
    zero = {"stage": stage, "reduce_bucket_size": REDUCE_BUCKET}
    if optimizer == "muon" and stage == 3:
        zero["reduce_scatter"] = False  # DeepSpeed's ZeRO-3 Muon refuses it
    return {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": 1,
        "train_batch_size": micro * world,
        "optimizer": MUON
        if optimizer == "muon"
        else {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.0, "torch_adam": True}},
        "zero_optimization": zero,
        "bf16": {"enabled": precision == "bf16"},
        "steps_per_print": 1_000_000,
    }


def measure(stage: int, precision: str, optimizer: str, args: argparse.Namespace) -> dict:
    shape = resolve_shape(args.model, block_size=args.block_size)
    world, rank = tdist.get_world_size(), tdist.get_rank()
    torch.manual_seed(0)
    model = build_model(shape)
    cfg = ds_config(stage, precision, world, args.micro_batch_size, optimizer)
    groups = model.parameters()
    split = contextlib.nullcontext()
    if optimizer == "muon":  # gpt_ds's split and groups, as engine_build makes them
        groups, split = param_groups(model, 0.0, muon_weight_decay=0.0), gpt2_muon_split()
    with split:
        engine = deepspeed.initialize(model=model, model_parameters=groups, config=cfg)[0]
    tokens = torch.randint(0, shape.vocab_size, (args.micro_batch_size, shape.block_size))

    def forward_backward() -> None:
        engine.backward(engine(input_ids=tokens, labels=tokens).loss)

    forward_backward()
    engine.step()  # Adam's moments exist from here on
    forward_backward()
    after_backward = measured_model_state_bytes(engine)
    inner = getattr(engine.optimizer, "optimizer", None) or engine.optimizer
    at_step: dict[str, int] = {}
    real_step = inner.step

    def step_and_measure(*a, **kw):  # ZeRO-3 steps each sub-group: keep the largest
        now = measured_model_state_bytes(engine)
        if now["total"] > at_step.get("total", 0):
            at_step.update(now)
        return real_step(*a, **kw)

    inner.step = step_and_measure
    engine.step()
    inner.step = real_step
    run = DeepSpeedRun(
        zero_stage=stage,
        offload_optimizer=False,
        offload_param=False,
        world_size=world,
        gpus_per_node=world,
        micro_batch_size=args.micro_batch_size,
        precision=precision,
        activation_checkpointing=False,
        zero=ZeroSettings(reduce_bucket_size=REDUCE_BUCKET),
        rank=rank,
        optimizer=optimizer,
        fused_adam=False,  # torch's AdamW, as gpt_ds picks on CPU ranks, or Muon
    )
    est = estimate_run(shape, run)
    result = {
        "rank": rank,
        "stage": stage,
        "precision": precision,
        "optimizer": optimizer,
        "num_params": shape.num_params(),
        "measured": {"after_backward": after_backward, "optimizer_step": at_step},
        "predicted": phase_bytes(est),
        "detail": {k: v for k, v in est.detail.items() if not k.startswith(("cpu", "activ"))},
    }
    return result


def phase_bytes(est: MemoryEstimate) -> dict[str, int]:
    """The estimate's model states alive at the two moments measured.

    "after_backward": weights, the reduced gradient buffer, master and moments;
    "optimizer_step": weights, the fp32 step gradient and whatever reduced gradients are
    still alive (ZeRO-3's permanent buffer), master and moments. Offloaded states and
    gathered ZeRO-3 modules are excluded.
    """
    d, base = est.detail, est.resident_model_state_bytes
    return {
        "after_backward": base + d["grads_reduced"],
        "optimizer_step": base + d["grads_fp32_step"] + d["grads_reduced_alive_at_step"],
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--configs", default="1:bf16,2:bf16,3:bf16,1:fp32,2:fp32,3:fp32")
    p.add_argument("--model", default="gpt2-tiny")
    p.add_argument("--block_size", type=int, default=16)
    p.add_argument("--micro_batch_size", type=int, default=1)
    p.add_argument("--out_dir", required=True)
    p.add_argument("--local_rank", type=int, default=-1)  # set by the DeepSpeed launcher
    args = p.parse_args()
    skip_cpu_shm_op()  # as gpt_ds's ranks start: its buffers are no model state
    run_eager(muon=False)  # as gpt_ds's eager ranks: Muon's Newton-Schulz not compiled
    deepspeed.init_distributed()
    out = Path(args.out_dir) / f"rank{tdist.get_rank()}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        for spec in args.configs.split(","):
            stage, precision, *optimizer = spec.split(":")
            result = measure(int(stage), precision, optimizer[0] if optimizer else "adamw", args)
            f.write(json.dumps(result) + "\n")
            f.flush()
            tdist.barrier()
    tdist.destroy_process_group()


if __name__ == "__main__":
    main()
