"""The run's configuration: one dataclass, the command line generated from it, and validation.

Every field's help is its `--help` text (gpt_ds/base/cli.py turns the dataclass into the parser).
`RunSettings` is the part of it the DeepSpeed config depends on (dsconfig/resolve.py fills "auto"
from it); `RunSettings.problems` is the one check of those values. `validate()` collects every
problem and raises once, so a user fixes them all in one go, before any rank builds a model.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpt_ds.base import cli, logs
from gpt_ds.base.cli import tool
from gpt_ds.base.errors import ConfigError
from gpt_ds.base.processes import RELEASE_CHOICES
from gpt_ds.checkpoint.integrity import ALLOW_HELP
from gpt_ds.checkpoint.manifest import replayed_flags
from gpt_ds.data.mixture import DEFAULT_DATA_DIR, data_specs
from gpt_ds.data.tokens import rebuild_command
from gpt_ds.dsconfig.optimization import SCHEDULES
from gpt_ds.dsconfig.schema import PRESETS, preset_path
from gpt_ds.dsconfig.settings import (
    DEFAULT_GRAD_ACCUM,
    DEFAULT_GRAD_CLIP,
    DEFAULT_MAX_ITERS,
    DEFAULT_MICRO_BATCH,
    RunSettings,
    decay_flag,
)
from gpt_ds.model.gpt2 import (
    LOSS_KINDS,
    MODEL_PRESETS,
    ModelShape,
    resolve_shape,
    shape_problems,
)

option = cli.option
_SHAPE_FIELDS = ("n_layer", "n_head", "n_embd", "block_size")
DEFAULT_MODEL = "gpt2-tiny"


@dataclass(frozen=True)
class RunConfig:
    """Train GPT-2 with DeepSpeed ZeRO.

    What the user asked, as given (None: not given); frozen, so nothing computed while
    planning (run/plan.py) is written back: a checkpoint's copy replays the same request."""

    config: str | None = option(
        None,
        'A JSON or YAML file of these flags ({"model": "gpt2", ...}), a recipe of recipes/ by '
        "name, or a checkpoint's gpt_ds.json to replay its run; flags on the command line "
        "override it.",
    )
    # --- DeepSpeed and model
    deepspeed_config: str = option(
        "zero2",
        "DeepSpeed JSON config: a preset name (" + ", ".join(PRESETS) + "; ds_configs/) or a path.",
    )
    model: str | None = option(
        None, "Model size preset: " + ", ".join(MODEL_PRESETS) + f" (default: {DEFAULT_MODEL})."
    )
    n_layer: int | None = option(None, "Override the preset's number of layers.")
    n_head: int | None = option(None, "Override the preset's number of attention heads.")
    n_embd: int | None = option(None, "Override the preset's embedding width.")
    block_size: int | None = option(None, "Context length (default: the preset's).")
    dropout: float = option(0.0, "Dropout probability (0 for pre-training).")
    init_from: str = option(
        "scratch",
        "'scratch'; a Hugging Face GPT-2 directory or hub name; or an earlier gpt_ds run, "
        "OUT_DIR[:TAG] (TAG: its latest if left out): a new run from those weights, at "
        "iteration 0 with a fresh optimizer and schedule (--resume continues the same run).",
    )
    activation_checkpointing: bool = option(
        False, "Recompute activations in backward (less memory)."
    )
    loss: str = option(
        "chunked",
        "How the model's forward takes the LM loss, the same value each way to float rounding. "
        "chunked: a chunk of tokens at a time, never the whole tokens x vocabulary logits "
        "(least memory; the default on GPUs too, until a GPU table shows another kind faster "
        "at no more peak memory than nanoGPT's recipe); deepspeed: the logits, then "
        "DeepSpeed's chunked cross-entropy (a Triton kernel on GPUs; no fp32 copy of them); "
        "full: the logits upcast to fp32 and torch's cross-entropy, as nanoGPT does "
        "(--compile fuses head, upcast and loss).",
        choices=LOSS_KINDS,
    )
    vocab_multiple: int = option(
        64,
        "Pad the token embedding to a multiple of this many rows when training from scratch "
        "(50257 -> 50304 at 64: aligned GPU matmuls); padding rows are never predicted and are "
        "stripped on export. 1: no padding.",
    )
    compile: str = option(
        "auto",
        "torch.compile the model through the DeepSpeed engine: on, off, or auto (on GPUs; off "
        "on CPU ranks, where it gained nothing measured). --compile alone: on. The first "
        "iteration compiles; where inductor cannot work, the run trains eager and says why. A "
        "run that trains eager compiles nothing, DeepSpeed's Muon Newton-Schulz included.",
        choices=("auto", "on", "off"),
        const="on",
        bool_values=("off", "on"),  # a saved false / true replays as off / on
    )
    log_level: str = option(
        "info",
        "What rank 0 logs: debug, info, warning or error; the other ranks log only warnings "
        "and errors, and each its one start-up line. debug also lets DeepSpeed's and "
        "transformers' own INFO lines through.",
        choices=logs.LEVELS,
    )
    profile: bool = option(
        False,
        "torch.profiler over 3 training steps after 2 of warm-up: each rank's Chrome/Perfetto "
        "trace in OUT_DIR/profile/, the top operators by self time printed (rank 0).",
    )
    precision: str = option(
        "auto", "auto (bf16 where supported, fp16 on older GPUs, else fp32), bf16, fp16 or fp32."
    )
    # --- data and output
    data_dir: list[str] | None = option(
        None,
        "Prepared data (train.bin, val.bin, meta.json); repeat for a mixture, each as "
        "DIR[:WEIGHT] (weights: all or none; none = by train tokens). Default: "
        f"{DEFAULT_DATA_DIR}.",
        repeatable=True,
    )
    out_dir: str = option("out", "Checkpoints, metrics.jsonl and logs go here.")
    # --- schedule
    max_iters: int | None = option(
        None,
        "Optimizer steps to train for (one = grad_accum micro-batches). Default: "
        f"{DEFAULT_MAX_ITERS}, unless --max_tokens or --max_epochs gives the run's length.",
    )
    max_tokens: int | None = option(
        None, "Train on this many tokens (all ranks) instead of --max_iters steps."
    )
    max_epochs: float | None = option(
        None,
        "Train for this many epochs (as many tokens as the train split holds, windows drawn "
        "at random with replacement) instead of --max_iters steps.",
    )
    optimizer: str | None = option(
        None,
        "adamw, or muon: Muon for GPT-2's attention and MLP matrices, AdamW for embeddings, "
        "biases and LayerNorms (default: the DeepSpeed config's optimizer; the presets': adamw).",
        choices=("adamw", "muon"),
    )
    lr: float | None = option(
        None, "Peak learning rate (default: the config's, else 6e-4); with Muon, its AdamW half's."
    )
    muon_lr: float | None = option(
        None, "--optimizer muon: the Muon half's peak lr (default: the config's, else 0.02)."
    )
    muon_momentum: float | None = option(
        None, "--optimizer muon: the Muon half's momentum (default: the config's, else 0.95)."
    )
    muon_weight_decay: float | None = option(
        None, "--optimizer muon: the Muon half's weight decay (default: the config's, else 0.01)."
    )
    lr_schedule: str | None = option(
        None,
        "cosine, linear, constant or wsd (warmup-stable-decay), each after a linear warmup "
        "(default: the DeepSpeed config's scheduler; gpt_ds's presets: cosine).",
        choices=SCHEDULES,
    )
    min_lr: float | None = option(
        None, "Final learning rate of the decay (default: lr/10; --lr_schedule linear: 0)."
    )
    wsd_decay_fraction: float = option(
        0.2, "--lr_schedule wsd: the share of the steps at the end that decay to --min_lr."
    )
    warmup_iters: int | None = option(
        None, "Linear warm-up steps (default min(100, max_iters/10))."
    )
    lr_decay_iters: int | None = option(
        None, "Iteration where the cosine decay reaches min_lr (default --max_iters)."
    )
    grad_clip: float | None = option(
        None,
        f"Gradient-norm clipping (default: the config's, else {DEFAULT_GRAD_CLIP}; "
        "--optimizer muon: 0, the only value it takes).",
    )
    micro_batch_size: int | None = option(
        None,
        f"Sequences per rank per forward pass (default: the config's, else {DEFAULT_MICRO_BATCH}).",
    )
    grad_accum: int | None = option(
        None,
        "Micro-batches accumulated per optimizer step (default: the config's, else "
        f"{DEFAULT_GRAD_ACCUM}).",
    )
    seed: int = option(1337, "Seed for initialisation, data order and dropout.")
    # --- evaluation, logging, checkpoints
    eval_interval: int = option(50, "Evaluate every N iterations; 0 = only at the end.")
    save_interval: int | None = option(
        None,
        "Checkpoint every N iterations; 0 = only at the end (and on a stop request). "
        "Default: --eval_interval.",
    )
    save_every_minutes: float | None = option(
        None,
        "Also checkpoint once M minutes of training have passed since the last save, so a "
        "hard kill (SIGKILL, a lost node) loses at most about M minutes; these are iter_* tags, "
        "counted by --keep_last. Every rank agrees on the iteration in the step's existing vote "
        "(no extra sync). Default: off.",
        metavar="M",
    )
    eval_iters: int = option(
        20,
        "Evaluation batches: eval_iters x micro_batch_size x grad_accum fixed val windows "
        "(one rank's sequences per step: the split into micro-batches leaves the set as is), "
        "shared among the ranks.",
    )
    hellaswag: str | None = option(
        None,
        "HellaSwag's validation file (hellaswag_val.jsonl, one JSON object a line): its "
        "acc_norm and acc scored at each evaluation, completion style as llm.c does "
        "(docs/evaluation.md), logged beside the val loss.",
    )
    log_interval: int = option(10, "Log training metrics every N iterations.")
    hang_timeout: float | None = option(
        None,
        "Seconds without progress on a rank (a micro-step, an evaluation, a checkpoint write) "
        "after which every rank still running writes its stacks to OUT_DIR/hang/, one names "
        "the silent rank and the run exits non-zero (default: max(300, 20 x the median step), "
        "judged from the second step on; 0: off).",
    )
    peak_tflops: float | None = option(
        None,
        "Dense bf16 peak TFLOP/s of one GPU, for MFU (default: from the GPU's name; "
        "needed for a GPU gpt_ds does not know).",
    )
    # --- monitors (DeepSpeed's; the DeepSpeed config's sections work too)
    tensorboard_dir: str | None = option(
        None,
        "Write TensorBoard events under DIR/<run name> (pip install 'gpt_ds[monitor]').",
        group="monitors",
    )
    wandb_project: str | None = option(
        None,
        "Log to this Weights & Biases project (WANDB_MODE=offline works without an API key).",
        group="monitors",
    )
    wandb_run_name: str | None = option(
        None, "The W&B run's name (default: the --out_dir folder's name).", group="monitors"
    )
    csv_dir: str | None = option(
        None, "Write one CSV file per metric under DIR/<run name>.", group="monitors"
    )
    resume: str | None = option(
        None,
        "Resume from a checkpoint tag in out_dir ('--resume' alone: the latest; 'best': the "
        "best by val loss; 'auto': the latest if there is one, else start the run, as a "
        "requeued job needs). Without it, an out dir holding a run's output is refused.",
        const="latest",
    )
    keep_last: int = option(0, "Keep only the newest N iter_* checkpoints (0 = keep all).")
    save_only_on_improvement: bool = option(
        False, "At eval points, save only when val loss improves."
    )
    early_stop_patience: int = option(
        0,
        "Stop after N evaluations in a row whose val loss is not below the best so far by "
        "more than --early_stop_min_delta; saves `final` and names the best tag (0 = off).",
    )
    early_stop_min_delta: float = option(
        0.0, "The val loss improvement an evaluation needs to reset --early_stop_patience."
    )
    no_checkpoint: bool = option(False, "Never write checkpoints (quick experiments).")
    allow_batch_change: bool = option(
        False,
        "Let --resume continue with another global batch than the checkpoint's (not an exact "
        "continuation; the change is logged). Another world size, micro-batch or accumulation "
        "with the same global batch needs no flag.",
    )
    allow_unverified: bool = option(False, ALLOW_HELP + " For --resume and --init_from.")
    release_host_memory: str = option(
        "auto",
        "Give freed host memory blocks (1 MiB and up) back to the kernel at once: on, off, or "
        "auto (on for CPU ranks and models of 100M+ parameters; see "
        "gpt_ds/base/processes.py).",
        choices=RELEASE_CHOICES,
    )
    dry_run: bool = option(
        False,
        "Build the model and the engine, report the memory every rank holds, and exit before "
        "the first step (nothing written): does this run start, and fit?",
    )
    ignore_memory_estimate: bool = option(
        False, "Start even when the memory estimate says the run does not fit."
    )
    # the launcher passes --local_rank=N (newer ones --local-rank)
    local_rank: int = option(
        -1, "Set by the DeepSpeed launcher.", aliases=("--local-rank",), hidden=True
    )

    @property
    def model_preset(self) -> str:
        """--model, or the default preset when none was given."""
        return self.model or DEFAULT_MODEL

    @property
    def run_name(self) -> str:
        """What the monitors call this run: --wandb_run_name, else the out dir's name."""
        return self.wandb_run_name or Path(self.out_dir).resolve().name

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def build_parser():
    """The training command line: one flag per RunConfig field."""
    return cli.build_parser(RunConfig)


RECIPE_DIR = cli.shipped_dir("recipes")  # installed: gpt_ds/recipes/ (pyproject.toml)


def config_file(value: str) -> Path:
    """`--config`'s file: the path as given where it exists; else a recipe, by its name or in
    the form the docs write it (`recipes/NAME.yaml`, relative to a checkout), so the documented
    commands also work with an installed package, from any directory."""
    path = Path(value)
    if path.exists():
        return path
    if path.parent in (Path("."), Path("recipes")):
        for name in (path.name, f"{path.name}.yaml"):
            if (RECIPE_DIR / name).is_file():
                return RECIPE_DIR / name
    recipes = ", ".join(sorted(p.stem for p in RECIPE_DIR.glob("*.yaml")))
    raise ConfigError(
        [f"no such file, and no recipe of that name (recipes: {recipes or 'none installed'})"],
        source=value,
    )


def parse_args(argv: list[str] | None = None) -> RunConfig:
    """The run's flags: `--config FILE`'s values (flag_file.py), then the command line's."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    defaults = None
    if known.config:  # only such runs read a flag file
        from gpt_ds.base.flag_file import load_flag_file

        defaults = load_flag_file(config_file(known.config), RunConfig, replayed=replayed_flags)
    return cli.parse(RunConfig, argv, defaults=defaults)


def run_settings(
    cfg: RunConfig,
    world_size: int,
    hidden_size: int | None = None,
    block_size: int = 0,
    train_tokens: int = 0,
) -> RunSettings:
    """What the run decides for the DeepSpeed config, with the run's length flags: resolving
    the config turns them into steps once the batch is known (`block_size`-token sequences
    over `train_tokens`)."""
    return RunSettings(
        hidden_size=hidden_size,
        world_size=world_size,
        length=cfg,
        block_size=block_size,
        train_tokens=train_tokens,
        micro_batch_size=cfg.micro_batch_size,
        grad_accum=cfg.grad_accum,
        lr=cfg.lr,
        min_lr=cfg.min_lr,
        warmup_iters=cfg.warmup_iters,
        grad_clip=cfg.grad_clip,
        precision=None if cfg.precision == "auto" else cfg.precision,
        muon_lr=cfg.muon_lr,
        muon_momentum=cfg.muon_momentum,
        muon_weight_decay=cfg.muon_weight_decay,
        decay_from=decay_flag(cfg),
    )


def validate(cfg: RunConfig, world_size: int) -> ModelShape | None:
    """Raise one ConfigError listing every problem with the run config (files checked too),
    for a launch of `world_size` ranks. Returns the shape of the model preset with the shape
    flags (the model a run from scratch trains), resolved here once; None with --init_from."""
    problems = _range_problems(cfg, world_size) + length_problems(cfg) + _file_problems(cfg)
    shape = None
    if cfg.model_preset not in MODEL_PRESETS:
        problems.append(
            f"--model {cfg.model!r} is not a preset; choose one of {', '.join(MODEL_PRESETS)}"
        )
    elif cfg.init_from == "scratch" and all(
        getattr(cfg, n) is None or getattr(cfg, n) > 0 for n in _SHAPE_FIELDS
    ):
        shape = resolve_shape(cfg.model_preset, cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.block_size)
        problems += shape_problems(shape)
    if cfg.init_from != "scratch":
        sizes = ("model", "n_layer", "n_head", "n_embd")
        given = [f"--{n}" for n in sizes if getattr(cfg, n) is not None]
        if given:
            problems.append(
                f"--init_from {cfg.init_from} and {', '.join(given)} both given: the model's "
                f"shape comes from the weights; drop {', '.join(given)}"
            )
    if cfg.save_only_on_improvement and cfg.save_interval is not None:
        problems.append(
            "--save_only_on_improvement and --save_interval both given: the former saves at "
            "evaluations that improve the val loss; drop one"
        )
    if cfg.no_checkpoint and cfg.save_every_minutes is not None:
        problems.append(
            "--no_checkpoint and --save_every_minutes both given: the latter saves checkpoints; "
            "drop one"
        )
    if not 0.0 < cfg.wsd_decay_fraction <= 1.0:
        problems.append(f"--wsd_decay_fraction must be in (0, 1], got {cfg.wsd_decay_fraction}")
    if cfg.early_stop_patience and not cfg.eval_interval:
        problems.append(
            "--early_stop_patience needs evaluations during the run: give --eval_interval N"
        )
    if cfg.init_from != "scratch" and cfg.resume and cfg.resume != "auto":
        problems.append(
            "--init_from and --resume both given: a resumed run takes its weights "
            "from the checkpoint (--resume auto applies --init_from only when the run starts)"
        )
    if problems:
        raise ConfigError(problems, source="command line")
    return shape


def length_problems(cfg: RunConfig) -> list[str]:
    """Conflicting or out-of-range run-length flags (dsconfig/resolve.py's `run_length` turns a
    budget into steps)."""
    problems = []
    given = [f for f in ("max_tokens", "max_epochs") if getattr(cfg, f) is not None]
    if len(given) > 1:
        problems.append("--max_tokens and --max_epochs both given: give one")
    if given and cfg.max_iters is not None:
        problems.append(f"--max_iters and --{given[0]} both given: give one")
    for name in given:
        if getattr(cfg, name) <= 0:
            problems.append(f"--{name} must be > 0, got {getattr(cfg, name)}")
    return problems


def _range_problems(cfg: RunConfig, world_size: int) -> list[str]:
    """Out-of-range numbers: those the DeepSpeed config depends on are RunSettings' to check
    (here, the one check of them), the rest here."""
    problems = run_settings(cfg, world_size).problems()
    rules = {  # field: (allow None, allow 0)
        "n_layer": (True, False),
        "n_head": (True, False),
        "n_embd": (True, False),
        "block_size": (True, False),
        "max_iters": (True, False),
        "lr_decay_iters": (True, False),
        "log_interval": (False, False),
        "eval_iters": (False, False),
        "eval_interval": (False, True),
        "save_interval": (True, True),
        "save_every_minutes": (True, False),
        "peak_tflops": (True, False),
        "hang_timeout": (True, True),
        "keep_last": (False, True),
        "vocab_multiple": (False, False),
        "early_stop_patience": (False, True),
        "early_stop_min_delta": (False, True),
    }
    for name, (allow_none, allow_zero) in rules.items():
        v = getattr(cfg, name)
        if v is None and allow_none:
            continue
        if v is None or v < 0 or (v == 0 and not allow_zero):
            problems.append(f"--{name} must be {'>= 0' if allow_zero else '> 0'}, got {v}")
    if not 0.0 <= cfg.dropout < 1.0:
        problems.append(f"--dropout must be in [0, 1), got {cfg.dropout}")
    return problems


def _file_problems(cfg: RunConfig) -> list[str]:
    problems = []
    if not preset_path(cfg.deepspeed_config).is_file():
        problems.append(
            f"--deepspeed_config {cfg.deepspeed_config}: file not found "
            f"(give a path or a preset name: {', '.join(PRESETS)})"
        )
    try:
        specs = data_specs(cfg.data_dir)
    except ConfigError as exc:
        return [*problems, *exc.problems]
    for spec in specs:
        data = Path(spec.path)
        make_it = f"make it with: {tool('prepare_data')} --out_dir {spec.path}"
        fresh = not data.is_dir() or not any(data.iterdir())  # else: re-create it, same inputs
        # no meta.json: gpt_ds.data.tokens reads the folder as nanoGPT's, or says why it cannot
        missing = [n for n in ("train.bin", "val.bin") if not (data / n).is_file()]
        if missing:
            problems.append(
                f"--data_dir {spec.path}: missing {', '.join(missing)} "
                f"({make_it if fresh else rebuild_command(data)})"
            )
    return problems
