"""The run's configuration: one dataclass, the command line generated from it, and validation.

Every field's docstring is its `--help` text. `validate()` collects every problem and raises
once, so a user fixes them all in one go, before any rank builds a model.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

from gpt_ds.ds_config import preset_path
from gpt_ds.errors import ConfigError
from gpt_ds.model import MODEL_PRESETS


def _f(default: Any, help: str, **extra: Any) -> Any:
    return field(default=default, metadata={"help": help, **extra})


@dataclass
class RunConfig:
    """Everything that defines a training run. Saved into every checkpoint."""

    # --- DeepSpeed and model
    deepspeed_config: str = _f(
        "ds_configs/zero2.json", "DeepSpeed JSON config (a ds_configs/ preset)."
    )
    model: str = _f("gpt2-tiny", "Model size preset: " + ", ".join(MODEL_PRESETS) + ".")
    n_layer: int | None = _f(None, "Override the preset's number of layers.")
    n_head: int | None = _f(None, "Override the preset's number of attention heads.")
    n_embd: int | None = _f(None, "Override the preset's embedding width.")
    block_size: int | None = _f(None, "Context length (default: the preset's).")
    dropout: float = _f(0.0, "Dropout probability (0 for pre-training).")
    init_from: str = _f("scratch", "'scratch', or a Hugging Face GPT-2 directory or hub name.")
    activation_checkpointing: bool = _f(False, "Recompute activations in backward (less memory).")
    precision: str = _f(
        "auto", "auto (bf16 where supported, fp16 on older GPUs, else fp32), bf16, fp16 or fp32."
    )
    # --- data and output
    data_dir: str = _f("data/shakespeare", "Directory with train.bin, val.bin, meta.json.")
    out_dir: str = _f("out", "Checkpoints, metrics.jsonl and logs go here.")
    # --- schedule
    max_iters: int = _f(200, "Optimizer steps to train for (one = grad_accum micro-batches).")
    lr: float | None = _f(None, "Peak learning rate (default: the config's, else 6e-4).")
    min_lr: float | None = _f(None, "Final learning rate of the cosine decay (default lr/10).")
    warmup_iters: int | None = _f(None, "Linear warm-up steps (default min(100, max_iters/10)).")
    lr_decay_iters: int | None = _f(
        None, "Iteration where the cosine decay reaches min_lr (default --max_iters)."
    )
    grad_clip: float | None = _f(None, "Gradient-norm clipping (default: the config's, 1.0).")
    micro_batch_size: int | None = _f(None, "Sequences per rank per forward pass.")
    grad_accum: int | None = _f(None, "Micro-batches accumulated per optimizer step.")
    seed: int = _f(1337, "Seed for initialisation, data order and dropout.")
    # --- evaluation, logging, checkpoints
    eval_interval: int = _f(
        50, "Evaluate (and checkpoint) every N iterations; 0 = only at the end."
    )
    eval_iters: int = _f(20, "Evaluation batches: eval_iters x micro_batch_size fixed val windows.")
    log_interval: int = _f(10, "Log training metrics every N iterations.")
    resume: str | None = _f(
        None, "Resume from a checkpoint tag in out_dir ('--resume' alone: the latest).", nargs="?"
    )
    keep_last: int = _f(0, "Keep only the newest N iter_* checkpoints (0 = keep all).")
    save_only_on_improvement: bool = _f(False, "At eval points, save only when val loss improves.")
    no_checkpoint: bool = _f(False, "Never write checkpoints (quick experiments).")
    local_rank: int = _f(-1, "Set by the DeepSpeed launcher; ignore.")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def build_parser() -> argparse.ArgumentParser:
    """An argparse parser with one flag per RunConfig field, help from the field metadata."""
    parser = argparse.ArgumentParser(
        description="Train GPT-2 with DeepSpeed ZeRO.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    hints = get_type_hints(RunConfig)
    for f in dataclasses.fields(RunConfig):
        flag = f"--{f.name}"
        help_text = f.metadata["help"]
        hint = hints[f.name]
        if hint is bool:
            parser.add_argument(flag, action="store_true", help=help_text)
        elif f.metadata.get("nargs") == "?":
            parser.add_argument(flag, nargs="?", const="latest", default=None, help=help_text)
        else:
            base = next(
                (t for t in (int, float, str) if t == hint or t in getattr(hint, "__args__", ())),
                str,
            )
            parser.add_argument(flag, type=base, default=f.default, help=help_text)
    # the launcher passes --local_rank=N; also accept the dashed spelling
    parser.add_argument("--local-rank", dest="local_rank", type=int, help=argparse.SUPPRESS)
    return parser


def parse_args(argv: list[str] | None = None) -> RunConfig:
    ns = build_parser().parse_args(argv)
    return RunConfig(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(RunConfig)})


def validate(cfg: RunConfig) -> None:
    """Raise one ConfigError listing every problem with the run config (files checked too)."""
    problems: list[str] = []

    def positive(name: str, allow_none: bool = True, allow_zero: bool = False) -> None:
        v = getattr(cfg, name)
        if v is None and allow_none:
            return
        if v is None or v < 0 or (v == 0 and not allow_zero):
            need = ">= 0" if allow_zero else "> 0"
            problems.append(f"--{name} must be {need}, got {v}")

    if cfg.model not in MODEL_PRESETS:
        problems.append(
            f"--model {cfg.model!r} is not a preset; choose one of {', '.join(MODEL_PRESETS)}"
        )
    for name in ("n_layer", "n_head", "n_embd", "block_size", "micro_batch_size", "grad_accum"):
        positive(name)
    positive("max_iters", allow_none=False)
    positive("log_interval", allow_none=False)
    positive("eval_iters", allow_none=False)
    positive("lr_decay_iters")
    for name in ("eval_interval", "keep_last", "warmup_iters"):
        positive(name, allow_zero=True)
    for name in ("lr", "min_lr", "grad_clip"):
        positive(name, allow_zero=name != "lr")
    if cfg.lr is not None and cfg.min_lr is not None and cfg.min_lr > cfg.lr:
        problems.append(f"--min_lr {cfg.min_lr} is above --lr {cfg.lr}")
    if cfg.warmup_iters is not None and cfg.warmup_iters > cfg.max_iters:
        problems.append(f"--warmup_iters {cfg.warmup_iters} exceeds --max_iters {cfg.max_iters}")
    if not 0.0 <= cfg.dropout < 1.0:
        problems.append(f"--dropout must be in [0, 1), got {cfg.dropout}")
    if cfg.precision not in ("auto", "bf16", "fp16", "fp32"):
        problems.append(f"--precision must be auto, bf16, fp16 or fp32, got {cfg.precision!r}")
    if cfg.model in MODEL_PRESETS:
        n_head = cfg.n_head or MODEL_PRESETS[cfg.model].n_head
        n_embd = cfg.n_embd or MODEL_PRESETS[cfg.model].n_embd
        if n_embd % n_head:
            problems.append(f"n_embd {n_embd} is not divisible by n_head {n_head}")
    if not preset_path(cfg.deepspeed_config).is_file():
        problems.append(
            f"--deepspeed_config {cfg.deepspeed_config}: file not found "
            "(give a path or a preset name: zero1, zero2, zero3, zero2_offload, zero3_offload)"
        )
    data = Path(cfg.data_dir)
    missing = [n for n in ("train.bin", "val.bin", "meta.json") if not (data / n).is_file()]
    if missing:
        problems.append(
            f"--data_dir {cfg.data_dir}: missing {', '.join(missing)} "
            "(make it with: python tools/prepare_data.py --out_dir " + cfg.data_dir + ")"
        )
    if cfg.init_from != "scratch" and cfg.resume:
        problems.append(
            "--init_from and --resume both given: a resumed run takes its weights "
            "from the checkpoint"
        )
    if problems:
        raise ConfigError(problems, source="command line")
