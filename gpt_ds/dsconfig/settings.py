"""`RunSettings`: what the run decides for the DeepSpeed config (command-line values and the
launcher's world size), and the one check of those values. The run config (run/config.py)
builds it; resolving a DeepSpeed config (resolve.py, schedule.py) reads it."""

from __future__ import annotations

from dataclasses import dataclass

from gpt_ds.dsconfig.precision import PRECISIONS

# The command-line flag behind each RunSettings field, for messages ("... but --lr 3e-4 was given").
CLI_FLAGS = {
    "micro_batch_size": "--micro_batch_size",
    "grad_accum": "--grad_accum",
    "lr": "--lr",
    "min_lr": "--min_lr",
    "warmup_iters": "--warmup_iters",
    "max_iters": "--max_iters",
    "grad_clip": "--grad_clip",
    "precision": "--precision",
    "world_size": "world size",
}


@dataclass(kw_only=True)
class RunSettings:
    """What the run decides for the DeepSpeed config: command-line values and the launcher's world
    size. None means "not given": the config's concrete value, or a default, is used."""

    world_size: int
    """Data-parallel ranks (WORLD_SIZE from the launcher)."""
    micro_batch_size: int | None = None
    """Sequences per rank per forward/backward (train_micro_batch_size_per_gpu)."""
    grad_accum: int | None = None
    """Micro batches per optimizer step (gradient_accumulation_steps)."""
    lr: float | None = None
    """Peak learning rate (optimizer.params.lr)."""
    min_lr: float | None = None
    """Learning rate at the end of the cosine (scheduler cos_min_ratio = min_lr / lr)."""
    warmup_iters: int | None = None
    """Linear warmup steps (scheduler warmup_num_steps)."""
    max_iters: int
    """Optimizer steps of the whole run (scheduler total_num_steps)."""
    grad_clip: float | None = None
    """Global gradient-norm clip (gradient_clipping); 0 disables it."""
    precision: str | None = None
    """None or "auto": detect from the hardware; "bf16", "fp16" or "fp32": forced."""
    load_universal: bool = False
    """Resume from a universal checkpoint (checkpoint.load_universal): another world size."""
    hidden_size: int | None = None
    """The model's width (n_embd): ZeRO bucket sizes set to "auto" derive from it."""

    def problems(self) -> list[str]:
        """Every out-of-range value, named by its command-line flag: the one check of the run's
        values that the DeepSpeed config depends on (config.validate uses it too)."""
        problems: list[str] = []

        def check(name: str, ok, what: str, optional: bool = True) -> None:
            value = getattr(self, name)
            if (value is None and optional) or (value is not None and ok(value)):
                return
            problems.append(f"{CLI_FLAGS[name]} must be {what}, got {value!r}")

        def positive_int(v) -> bool:
            return isinstance(v, int) and not isinstance(v, bool) and v >= 1

        check("world_size", positive_int, "a positive integer", optional=False)
        check("max_iters", positive_int, "a positive integer", optional=False)
        check("micro_batch_size", positive_int, "a positive integer")
        check("grad_accum", positive_int, "a positive integer")
        check("warmup_iters", lambda v: isinstance(v, int) and v >= 0, "an integer >= 0")
        check("lr", lambda v: v > 0, "> 0")
        check("min_lr", lambda v: v >= 0, ">= 0")
        check("grad_clip", lambda v: v >= 0, ">= 0 (0 disables clipping)")
        check("precision", lambda v: v in (*PRECISIONS, "auto"), "one of auto, bf16, fp16, fp32")
        return problems
