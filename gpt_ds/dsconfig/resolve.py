"""A DeepSpeed config resolved: every "auto" filled from the run and the machine, checked.

    raw = load_ds_config("ds_configs/zero2.json")           # schema.py: every problem at once
    run = RunSettings(world_size=2, decay_iters=2000)         # run.problems(): checked first
    resolved = resolve_ds_config(raw, run, facts=probe_machine(), source=path)
    deepspeed.initialize(model=..., config=resolved.config)  # no "auto" left

Every "auto" a config written for the Hugging Face Trainer may hold is filled as the Trainer's
integration fills it (ds_configs/README.md, "Configs written for the HF Trainer"); the optimizer
and LR-schedule sections are filled from the run's lr, warmup and length by
dsconfig/optimization.py (`fill_optimizer_and_schedule`). A run whose length is a budget in
tokens or epochs gets its steps here, once the batch is resolved (`RunSettings.length`).
Everything here is a pure function of the config, the run's settings and the machine's facts
(dsconfig/settings.py: probed once, before): no process group, no model, no probing, so a bad
config or batch arithmetic fails in a second, before DeepSpeed starts.
DeepSpeed's own validation is partial: it ignores a misspelled top-level section and coerces "2"
to 2; the schema rejects both.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from gpt_ds.base.errors import ConfigError
from gpt_ds.dsconfig.monitors import monitor_package_problems
from gpt_ds.dsconfig.optimization import (
    fill_optimizer_and_schedule,
    optimizer_type,
    steps_fused_adam,
)
from gpt_ds.dsconfig.schema import validate_ds_config
from gpt_ds.dsconfig.settings import (
    DEFAULT_GRAD_ACCUM,
    DEFAULT_GRAD_CLIP,
    DEFAULT_MICRO_BATCH,
    LengthFlags,
    MachineFacts,
    RunSettings,
    has_budget,
    is_set,
    steps_asked,
)

# ZeRO sizes "auto" may take, derived from the model's width h as the HF Trainer derives them
# (transformers' HfTrainerDeepSpeedConfig.trainer_config_finalize): (rule, formula, fallback).
# Without a model (a tool resolving a config alone) the presets' sizes stand in; see
# ds_configs/README.md for why those sizes.
_WIDTH_SIZES = {
    "reduce_bucket_size": (lambda h: h * h, "h*h", 50_000_000),
    "stage3_prefetch_bucket_size": (lambda h: int(0.9 * h * h), "0.9*h*h", 50_000_000),
    "stage3_param_persistence_threshold": (lambda h: 10 * h, "10*h", 100_000),
}
# DeepSpeed's own "auto", which DeepSpeed resolves itself.
_DEEPSPEED_AUTOS = ("data_types.keep_in_fp32_modules",)


def zero_stage(ds_config: dict) -> int:
    """A DeepSpeed config's ZeRO stage (0 where it names none, as DeepSpeed reads it)."""
    return int(ds_config.get("zero_optimization", {}).get("stage", 0))


@dataclass(frozen=True)
class RunLength:
    """The run's length in optimizer steps, as planned."""

    max_iters: int  # the step the run trains up to
    decay_iters: int  # where the schedule's decay ends: --lr_decay_iters, else max_iters
    line: str | None = None  # the log line of a budget turned into steps


@dataclass(frozen=True)
class ResolvedDsConfig:
    """A DeepSpeed config with every "auto" filled, and what was decided, for the run's log."""

    config: dict
    """Ready for deepspeed.initialize(config=...)."""
    precision: str
    """"bf16", "fp16" or "fp32"."""
    micro_batch_size: int
    grad_accum: int
    train_batch_size: int
    """micro_batch_size x grad_accum x world_size."""
    lr: float
    """The peak learning rate, as the optimizer section or the scheduler resolved it."""
    min_lr: float
    """The learning rate at the end of the schedule (the scheduler's own, e.g. its ratio)."""
    warmup_iters: int
    grad_clip: float
    length: RunLength | None = None
    """The run's steps, when `RunSettings.length` was given."""
    notes: list[str] = field(default_factory=list)
    """Human-readable lines: each decision and where it came from."""

    @property
    def zero_stage(self) -> int:
        return zero_stage(self.config)

    @property
    def optimizer(self) -> str | None:
        """The optimizer's type, lower case ("adamw", "muon", ...); None without one."""
        return optimizer_type(self.config.get("optimizer"))


# ----------------------------------------------------------------------------------------------
# Resolution


def resolve_ds_config(
    raw: dict,
    run: RunSettings,
    *,
    facts: MachineFacts,
    source: str = "the DeepSpeed config",
) -> ResolvedDsConfig:
    """Fill every "auto" of a config from `run` (or a default) and the machine's `facts`, check
    the schema and the batch arithmetic, pick the precision and the Adam implementation, check
    that enabled monitors are installed, and (given `run.length`) turn the run's length into
    steps. A value set both in the config and on the command line must agree. Raises one
    ConfigError with every problem; `raw` is not modified. `run` is already checked
    (`RunSettings.problems()`, with the run config's other flags: run/config.py)."""
    problems = validate_ds_config(raw)
    if problems:
        raise ConfigError(problems, source)

    r = _Resolver(copy.deepcopy(raw), run, source, facts)
    micro, accum, total = r.batch()
    length = None
    if run.length is not None:  # the run's steps, and the span of its schedule
        length = run_length(run.length, total * run.block_size, run.train_tokens)
        r.run = dataclasses.replace(run, decay_iters=length.decay_iters)
    precision = r.precision()
    lr, min_lr, warmup = fill_optimizer_and_schedule(r)
    grad_clip = r.grad_clip()
    r.zero_sizes()
    r.overlap_comm()
    r.monitors()
    r.host_syncs()
    r.unfused_stage0(precision)
    r.leftover_autos()
    if not r.problems:  # each filled value must satisfy the schema like a written one
        r.problems = [f'{p} (after filling "auto")' for p in validate_ds_config(r.ds_config)]
    if r.problems:
        raise ConfigError(r.problems, source)
    return ResolvedDsConfig(
        config=r.ds_config,
        length=length,
        precision=precision,
        micro_batch_size=micro,
        grad_accum=accum,
        train_batch_size=total,
        notes=r.notes,
        lr=lr,
        min_lr=min_lr,
        warmup_iters=warmup,
        grad_clip=grad_clip,
    )


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9)
    return a == b


class _Resolver:
    """One resolution: the config being filled, with the problems and notes collected so far."""

    def __init__(self, ds_config: dict, run: RunSettings, source: str, facts: MachineFacts):
        self.ds_config, self.run, self.source, self.facts = ds_config, run, source, facts
        self.problems: list[str] = []
        self.notes: list[str] = []

    def pick(self, key: str, ds_value: Any, run_field: str, default: Any = None):
        """The value for `key` and where it came from: the config if concrete, else the command
        line, else `default`. Concrete in both places and different: a problem."""
        run_value = getattr(self.run, run_field)
        flag = self.run.flag(run_field)
        if is_set(ds_value):
            if run_value is not None and not _same(ds_value, run_value):
                self.problems.append(
                    f"{key} is {ds_value} in {self.source} but {self.run.given(run_field)} was "
                    f'given; remove one (or set {key} to "auto")'
                )
            return ds_value, self.source
        if run_value is not None:
            return run_value, flag
        return default, "default"

    # -- batch ---------------------------------------------------------------------------------

    def batch(self) -> tuple[int, int, int]:
        ds_config, world = self.ds_config, self.run.world_size
        micro, micro_from = self.pick(
            "train_micro_batch_size_per_gpu",
            ds_config.get("train_micro_batch_size_per_gpu"),
            "micro_batch_size",
        )
        accum, accum_from = self.pick(
            "gradient_accumulation_steps",
            ds_config.get("gradient_accumulation_steps"),
            "grad_accum",
        )
        total = (
            ds_config.get("train_batch_size") if is_set(ds_config.get("train_batch_size")) else None
        )

        if total is None:
            micro = micro if micro is not None else DEFAULT_MICRO_BATCH
            accum = accum if accum is not None else DEFAULT_GRAD_ACCUM
            total = micro * accum * world
        elif micro is not None and accum is not None:
            if total != micro * accum * world:
                self.problems.append(
                    f"train_batch_size {total} != train_micro_batch_size_per_gpu {micro} "
                    f"({micro_from}) x gradient_accumulation_steps {accum} ({accum_from}) x "
                    f"world size {world} (= {micro * accum * world}); "
                    'change one of them or set train_batch_size to "auto"'
                )
        elif micro is not None:
            accum = self._derive(total, micro, world, "train_micro_batch_size_per_gpu")
        elif accum is not None:
            micro = self._derive(total, accum, world, "gradient_accumulation_steps")
        elif total % (DEFAULT_MICRO_BATCH * world) == 0:
            micro, accum = DEFAULT_MICRO_BATCH, total // (DEFAULT_MICRO_BATCH * world)
        else:
            accum = DEFAULT_GRAD_ACCUM
            micro = self._derive(total, accum, world, "gradient_accumulation_steps")

        micro, accum = micro or 1, accum or 1  # only None/0 after a reported problem
        ds_config["train_batch_size"] = total
        ds_config["train_micro_batch_size_per_gpu"] = micro
        ds_config["gradient_accumulation_steps"] = accum
        self.notes.append(
            f"batch: {micro} per rank x {accum} accumulation steps x {world} ranks "
            f"= {total} sequences per optimizer step"
        )
        return micro, accum, total

    def _derive(self, total: int, known: int, world: int, known_key: str) -> int | None:
        """The missing factor of total = known x missing x world, if it is a whole number."""
        if total % (known * world) == 0:
            return total // (known * world)
        missing = (
            "gradient_accumulation_steps"
            if known_key == "train_micro_batch_size_per_gpu"
            else "train_micro_batch_size_per_gpu"
        )
        self.problems.append(
            f"train_batch_size {total} is not divisible by {known_key} {known} x world size "
            f"{world} (= {known * world}), so {missing} cannot be derived; change "
            f"train_batch_size or {known_key}"
        )
        return None

    # -- precision -----------------------------------------------------------------------------

    def precision(self) -> str:
        ds_config = self.ds_config
        bf16 = ds_config.get("bf16", {}).get("enabled")
        fp16 = ds_config.get("fp16", {}).get("enabled")
        forced = self.run.precision if self.run.precision not in (None, "auto") else None

        pinned, why = None, ""
        if bf16 is True and fp16 is True:
            self.problems.append(
                f"bf16.enabled and fp16.enabled are both true in {self.source}; enable at most one"
            )
            return "fp32"
        if bf16 is True:
            pinned, why = "bf16", "bf16.enabled is true"
        elif fp16 is True:
            pinned, why = "fp16", "fp16.enabled is true"
        elif bf16 is False and fp16 is False:
            pinned, why = "fp32", "bf16.enabled and fp16.enabled are false"
        disabled = {p for p, v in (("bf16", bf16), ("fp16", fp16)) if v is False}

        if pinned is not None:
            if forced is not None and forced != pinned:
                self.problems.append(
                    f"{why} in {self.source} (precision {pinned}) but --precision {forced} was "
                    'given; remove one (or set bf16.enabled and fp16.enabled to "auto")'
                )
            precision, reason = pinned, f"{why} in {self.source}"
        elif forced is not None:
            if forced in disabled:
                self.problems.append(
                    f"{forced}.enabled is false in {self.source} but --precision {forced} was "
                    f'given; remove one (or set {forced}.enabled to "auto")'
                )
            precision, reason = forced, f"--precision {forced}"
        else:
            precision, reason = self.facts.precision
            if precision in disabled:
                reason = f"{reason}, but {precision}.enabled is false in {self.source}"
                precision = "fp32"

        if precision == "fp16" and self.facts.fp16_refusal:  # before any rank builds a model
            self.problems.append(f"{reason}: {self.facts.fp16_refusal}")
        ds_config.setdefault("bf16", {})["enabled"] = precision == "bf16"
        ds_config.setdefault("fp16", {})["enabled"] = precision == "fp16"
        self.notes.append(f"precision: {precision} ({reason})")
        return precision

    def grad_clip(self) -> float:
        """The clip, off by default with Muon: DeepSpeed's ZeRO takes the norm of the step's
        gradients after Muon has orthogonalised its half (DeepSpeedZeroOptimizer's
        `get_flat_partition`), so a clip would scale the whole step by about 1 / that norm,
        which grows with the model (~50 for gpt2-tiny); the Muon recipes clip nothing."""
        muon = optimizer_type(self.ds_config.get("optimizer")) == "muon"
        clip, clip_from = self.pick(
            "gradient_clipping",
            self.ds_config.get("gradient_clipping"),
            "grad_clip",
            0.0 if muon else DEFAULT_GRAD_CLIP,
        )
        if muon and clip:
            self.problems.append(
                f"gradient_clipping {clip} ({clip_from}) with the Muon optimizer: DeepSpeed "
                "takes the gradient norm after Muon orthogonalises its half's gradients, so a "
                "clip would shrink the whole step; set it to 0 or drop it (Muon runs unclipped)"
            )
        self.ds_config["gradient_clipping"] = clip
        state = "off" if clip == 0 else f"global norm {clip:g}"
        why = "; Muon runs unclipped" if muon and clip_from == "default" else ""
        self.notes.append(f"gradient clipping: {state} ({clip_from}{why})")
        return clip

    # -- ZeRO sizes ------------------------------------------------------------------------------

    def zero_sizes(self) -> None:
        """ZeRO sizes set to "auto": from the model's width, as the HF Trainer sets them. The
        stage3_ ones are filled below ZeRO-3 too (DeepSpeed ignores them there)."""
        zero = self.ds_config.get("zero_optimization") or {}
        keys = [key for key in _WIDTH_SIZES if zero.get(key) == "auto"]
        if not keys:
            return
        h = self.run.hidden_size
        for key in keys:
            rule, _, fallback = _WIDTH_SIZES[key]
            zero[key] = rule(h) if h else fallback
        if h:
            sizes = ", ".join(f"{k} {zero[k]:,} ({_WIDTH_SIZES[k][1]})" for k in keys)
            why = f"h = the model's width {h}, as the HF Trainer derives them"
        else:
            sizes = ", ".join(f"{k} {zero[k]:,}" for k in keys)
            why = "the model's width is unknown here: the presets' sizes"
        self.notes.append(f'ZeRO sizes (were "auto"): {sizes}; {why}')

    def overlap_comm(self) -> None:
        """`overlap_comm: "auto"` (the ZeRO-1/2 presets): on one rank there is no reduction to
        overlap with backward, and with it on DeepSpeed synchronizes the device at the end of
        every backward (deepspeed/runtime/zero/stage_1_and_2.py, on GPUs only): off there, on
        with several ranks. A true or false in the config stands."""
        zero = self.ds_config.get("zero_optimization") or {}
        if zero.get("overlap_comm") != "auto":
            return
        ranks = self.run.world_size
        zero["overlap_comm"] = ranks > 1
        why = (
            f"{ranks} ranks: gradient reduction overlaps backward"
            if ranks > 1
            else "one rank: nothing to overlap, and no device synchronize after backward"
        )
        self.notes.append(f'overlap_comm: {str(ranks > 1).lower()} (was "auto": {why})')

    # -- monitors and leftovers ----------------------------------------------------------------

    def host_syncs(self) -> None:
        """Turn off DeepSpeed's per-step host syncs that gpt_ds does without, unless the config
        sets them: bf16's gradient overflow check (a pass over every gradient ending in
        `.item()`; with no loss scale to adjust, the trainer itself stops on a non-finite loss
        or gradient norm, before any save) and the throughput timer (a device synchronize at
        each forward and step; gpt_ds times its own steps)."""
        off = []
        bf16 = self.ds_config.get("bf16", {})
        if bf16.get("enabled") is True and "check_grad_overflow" not in bf16:
            bf16["check_grad_overflow"] = False
            off.append("bf16.check_grad_overflow")
        throughput = self.ds_config.setdefault("timers", {}).setdefault("throughput", {})
        if "enabled" not in throughput:
            throughput["enabled"] = False
            off.append("timers.throughput.enabled")
        if off:
            self.notes.append(
                f"host syncs: {' and '.join(off)} false (set in the config to keep them)"
            )

    def unfused_stage0(self, precision: str) -> None:
        """Say where DeepSpeed will step each tensor apart: stage 0 in 16 bits with any
        optimizer but its FusedAdam (0.47x ZeRO-2's tokens/s on an H200, BENCHMARKS.md)."""
        stage0 = zero_stage(self.ds_config) == 0
        if stage0 and precision != "fp32" and not steps_fused_adam(self.ds_config):
            self.notes.append(
                f"stage 0 in {precision}: DeepSpeed steps this optimizer one tensor at a time "
                "(FP16_UnfusedOptimizer); ZeRO-1 or 2 step one flat tensor, on one GPU too"
            )

    def monitors(self) -> None:
        self.problems += monitor_package_problems(self.ds_config, self.facts.monitors)

    def leftover_autos(self) -> None:
        """An "auto" the schema allows but nothing above filled (e.g. in a torch scheduler)."""
        for where in _auto_paths(self.ds_config):
            if where in _DEEPSPEED_AUTOS:
                continue
            section = self.ds_config.get(where.split(".")[0])
            kind = section.get("type") if isinstance(section, dict) else None
            of = f" for {kind}" if isinstance(kind, str) else ""
            self.problems.append(f'{where}: "auto" is not filled by gpt_ds{of}; set a value')


def _auto_paths(node: Any, where: str = "") -> list[str]:
    """The JSON path of every "auto" in `node`."""
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _auto_paths(v, f"{where}.{k}".lstrip("."))]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in _auto_paths(v, f"{where}[{i}]")]
    return [where] if node == "auto" else []


# ------------------------------------------------------------------ the run's length
# A budget is rounded up to whole steps; each launch derives its steps from its own batch, so a
# resume with the same batch stops at the same step. The result is the plan's (`RunLength`),
# never written back into the run config: a replayed config asks for the same budget again.
def run_length(cfg: LengthFlags, tokens_per_iter: int, train_tokens: int) -> RunLength:
    """The steps `cfg` asks for; a budget in tokens or epochs becomes whole steps of
    `tokens_per_iter` (all ranks), said in `line`."""
    if not has_budget(cfg):
        iters, line = steps_asked(cfg), None
    else:
        if cfg.max_tokens is not None:
            budget, what = cfg.max_tokens, f"--max_tokens {cfg.max_tokens:,}"
        else:
            assert cfg.max_epochs is not None  # has_budget: one of the two is given
            budget = math.ceil(cfg.max_epochs * train_tokens)
            what = f"--max_epochs {cfg.max_epochs:g} of {train_tokens:,} train tokens"
        iters = math.ceil(budget / tokens_per_iter)
        line = f"run length: {iters:,} iterations from {what} ({tokens_per_iter:,} tokens each)"
        if cfg.lr_decay_iters is not None and cfg.lr_decay_iters > iters:
            raise ConfigError(
                f"--lr_decay_iters {cfg.lr_decay_iters} is beyond the {iters} steps of {what}"
            )
    return RunLength(max_iters=iters, decay_iters=cfg.lr_decay_iters or iters, line=line)
