"""DeepSpeed configs: load a preset, check it against the schema, fill "auto" from the run.

    raw = load_ds_config("ds_configs/zero2.json")            # every schema problem at once
    resolved = resolve_ds_config(raw, RunSettings(world_size=2, max_iters=2000), source=path)
    deepspeed.initialize(model=..., config=resolved.config)  # no "auto" left

Everything here is pure Python (no process group, no model), so a bad config or batch arithmetic
fails in a second, before DeepSpeed starts. DeepSpeed's own validation is partial: it ignores a
misspelled top-level section and coerces "2" to 2; the schema rejects both.
"""

from __future__ import annotations

import copy
import importlib.util
import math
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from gpt_ds.config import CLI_FLAGS, RunSettings
from gpt_ds.ds_schema import validate_ds_config
from gpt_ds.errors import ConfigError
from gpt_ds.precision import detect_precision

DEFAULT_MICRO_BATCH = 4
DEFAULT_GRAD_ACCUM = 1
DEFAULT_LR = 6e-4
DEFAULT_MIN_LR_FRACTION = 0.1  # min_lr = lr / 10, as in GPT-3 / nanoGPT
DEFAULT_MAX_WARMUP = 100  # warmup = min(100, max_iters // 10)
DEFAULT_GRAD_CLIP = 1.0


# Monitor sections whose package DeepSpeed imports only inside deepspeed.initialize.
_MONITOR_PACKAGES = {
    "tensorboard": ("tensorboard", "tensorboard", None),
    "wandb": ("wandb", "wandb", None),
    "comet": ("comet_ml", "comet_ml", (3, 41, 0)),
}


@dataclass
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
    notes: list[str] = field(default_factory=list)
    """Human-readable lines: each decision and where it came from."""
    lr: float | None = None
    min_lr: float | None = None
    warmup_iters: int | None = None
    grad_clip: float | None = None

    @property
    def zero_stage(self) -> int:
        return int(self.config.get("zero_optimization", {}).get("stage", 0))


# ----------------------------------------------------------------------------------------------
# Resolution


def resolve_ds_config(
    raw: dict, run: RunSettings, source: str = "the DeepSpeed config"
) -> ResolvedDsConfig:
    """Fill every "auto" of a schema-valid config from `run` (or a default), check the batch
    arithmetic, pick the precision and check that enabled monitors can be imported. A value set
    both in the config and on the command line must agree. Raises one ConfigError with every
    problem; `raw` is not modified."""
    problems = validate_ds_config(raw)
    if problems:
        raise ConfigError(problems, source)
    problems = run.problems()
    if problems:
        raise ConfigError(problems, source)

    r = _Resolver(copy.deepcopy(raw), run, source)
    micro, accum, total = r.batch()
    precision = r.precision()
    lr, min_lr, warmup = r.optimizer_and_schedule()
    grad_clip = r.grad_clip()
    r.monitors()
    r.leftover_autos()
    if run.load_universal:
        r.cfg.setdefault("checkpoint", {})["load_universal"] = True
    if r.problems:
        raise ConfigError(r.problems, source)
    return ResolvedDsConfig(
        config=r.cfg,
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


def _is_set(value: Any) -> bool:
    """A concrete config value: present and not "auto"."""
    return value is not None and value != "auto"


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9)
    return a == b


class _Resolver:
    """One resolution: the config being filled, with the problems and notes collected so far."""

    def __init__(self, cfg: dict, run: RunSettings, source: str):
        self.cfg, self.run, self.source = cfg, run, source
        self.problems: list[str] = []
        self.notes: list[str] = []

    def pick(self, key: str, cfg_value: Any, run_field: str, default: Any = None):
        """The value for `key` and where it came from: the config if concrete, else the command
        line, else `default`. Concrete in both places and different: a problem."""
        run_value = getattr(self.run, run_field)
        flag = CLI_FLAGS[run_field]
        if _is_set(cfg_value):
            if run_value is not None and not _same(cfg_value, run_value):
                self.problems.append(
                    f"{key} is {cfg_value} in {self.source} but {flag} {run_value} was given; "
                    f'remove one (or set {key} to "auto")'
                )
            return cfg_value, self.source
        if run_value is not None:
            return run_value, flag
        return default, "default"

    # -- batch ---------------------------------------------------------------------------------

    def batch(self) -> tuple[int, int, int]:
        cfg, world = self.cfg, self.run.world_size
        micro, micro_from = self.pick(
            "train_micro_batch_size_per_gpu",
            cfg.get("train_micro_batch_size_per_gpu"),
            "micro_batch_size",
        )
        accum, accum_from = self.pick(
            "gradient_accumulation_steps", cfg.get("gradient_accumulation_steps"), "grad_accum"
        )
        total = cfg.get("train_batch_size") if _is_set(cfg.get("train_batch_size")) else None

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
        cfg["train_batch_size"] = total
        cfg["train_micro_batch_size_per_gpu"] = micro
        cfg["gradient_accumulation_steps"] = accum
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
        cfg = self.cfg
        bf16 = cfg.get("bf16", {}).get("enabled")
        fp16 = cfg.get("fp16", {}).get("enabled")
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
            precision, reason = detect_precision()
            if precision in disabled:
                reason = f"{reason}, but {precision}.enabled is false in {self.source}"
                precision = "fp32"

        cfg.setdefault("bf16", {})["enabled"] = precision == "bf16"
        cfg.setdefault("fp16", {})["enabled"] = precision == "fp16"
        self.notes.append(f"precision: {precision} ({reason})")
        return precision

    # -- optimizer and LR schedule ----------------------------------------------------------------

    def _cpu_adam(self, optimizer: dict) -> None:
        """On a CPU-only run, Adam(W) without offload becomes torch's own (`torch_adam`).

        DeepSpeed's CPU Adam kernel updates its bias-correction powers incrementally, so a
        resumed run (which recomputes them) drifts by float rounding from an uninterrupted one;
        torch's AdamW recomputes them every step, making resume bit-exact. It also skips a
        JIT compile. GPU runs keep DeepSpeed's fused kernel.
        """
        from deepspeed.accelerator import get_accelerator

        offload = self.cfg.get("zero_optimization", {}).get("offload_optimizer", {})
        if (
            get_accelerator().device_name() == "cpu"
            and optimizer.get("type", "").lower() in ("adam", "adamw")
            and offload.get("device", "none") == "none"
            and "torch_adam" not in optimizer["params"]
        ):
            optimizer["params"]["torch_adam"] = True
            self.notes.append("optimizer: torch AdamW on CPU (exact resume; no kernel compile)")

    def optimizer_and_schedule(self) -> tuple[float, float, int]:
        run, cfg = self.run, self.cfg
        optimizer = cfg.get("optimizer")
        opt_params = optimizer.setdefault("params", {}) if optimizer is not None else {}
        scheduler = cfg.get("scheduler")
        sched_type = scheduler["type"] if scheduler is not None else None
        params = scheduler.setdefault("params", {}) if scheduler is not None else {}

        lr_cfg = opt_params.get("lr")
        if not _is_set(lr_cfg) and sched_type in ("WarmupLR", "WarmupDecayLR"):
            lr_cfg = params.get("warmup_max_lr")
        lr, lr_from = self.pick("optimizer.params.lr", lr_cfg, "lr", DEFAULT_LR)

        min_lr, min_lr_from = self._min_lr(params.get("cos_min_ratio"), lr)
        default_warmup = max(1, min(DEFAULT_MAX_WARMUP, run.max_iters // 10))
        warmup, warmup_from = self.pick(
            "scheduler.params.warmup_num_steps",
            params.get("warmup_num_steps"),
            "warmup_iters",
            default_warmup,
        )
        total, _ = self.pick(
            "scheduler.params.total_num_steps", params.get("total_num_steps"), "max_iters"
        )
        if warmup == 0:
            warmup = 1
            self.notes.append("warmup: 0 given; DeepSpeed's warmup schedules need >= 1, using 1")
        if scheduler is not None and warmup > run.max_iters:
            self.problems.append(
                f"warmup_num_steps {warmup} ({warmup_from}) exceeds the run's {run.max_iters} "
                "steps (--max_iters): the learning rate would never reach its peak"
            )
        if min_lr > lr:
            self.problems.append(f"min lr {min_lr} ({min_lr_from}) is above lr {lr} ({lr_from})")

        if optimizer is not None:
            opt_params["lr"] = lr
            self._cpu_adam(optimizer)
        else:
            self.notes.append("optimizer: none in the config; the trainer must pass one")
        fills = {
            "total_num_steps": total,
            "warmup_num_steps": warmup,
            "cos_min_ratio": min_lr / lr,
            "warmup_max_lr": lr,
        }
        for key, value in fills.items():
            if params.get(key) == "auto":
                params[key] = value
        if scheduler is not None:
            self.notes.append(
                f"lr: {sched_type}, peak {lr:g} ({lr_from}), {warmup} warmup steps "
                f"({warmup_from}), down to {min_lr:g} ({min_lr_from}) at step {total}"
            )
        else:
            self.notes.append(f"lr: {lr:g} ({lr_from}), no scheduler in the config")
        return lr, min_lr, warmup

    def _min_lr(self, ratio: Any, lr: float) -> tuple[float, str]:
        run_min = self.run.min_lr
        if _is_set(ratio):
            if run_min is not None and not math.isclose(ratio * lr, run_min, rel_tol=1e-6):
                self.problems.append(
                    f"scheduler.params.cos_min_ratio is {ratio} in {self.source} (min lr "
                    f"{ratio * lr:g} at lr {lr:g}) but --min_lr {run_min} was given; remove one "
                    '(or set cos_min_ratio to "auto")'
                )
            return ratio * lr, f"cos_min_ratio {ratio} in {self.source}"
        if run_min is not None:
            return run_min, "--min_lr"
        return lr * DEFAULT_MIN_LR_FRACTION, "default lr/10"

    def grad_clip(self) -> float:
        clip, clip_from = self.pick(
            "gradient_clipping", self.cfg.get("gradient_clipping"), "grad_clip", DEFAULT_GRAD_CLIP
        )
        self.cfg["gradient_clipping"] = clip
        state = "off" if clip == 0 else f"global norm {clip:g}"
        self.notes.append(f"gradient clipping: {state} ({clip_from})")
        return clip

    # -- monitors and leftovers ----------------------------------------------------------------

    def monitors(self) -> None:
        for section, (module, package, min_version) in _MONITOR_PACKAGES.items():
            if not self.cfg.get(section, {}).get("enabled"):
                continue
            if importlib.util.find_spec(module) is None:
                self.problems.append(
                    f"{section}.enabled is true but the '{package}' package is not installed: "
                    f"pip install {package}, or set {section}.enabled to false"
                )
            elif min_version and _version_tuple(metadata.version(package)) < min_version:
                need = ".".join(map(str, min_version))
                self.problems.append(
                    f"{section}.enabled is true but DeepSpeed needs {package}>={need}: "
                    f'pip install "{package}>={need}", or set {section}.enabled to false'
                )

    def leftover_autos(self) -> None:
        """An "auto" the schema allows but nothing above filled (e.g. in a torch scheduler)."""
        for section in ("optimizer", "scheduler"):
            params = self.cfg.get(section, {}).get("params", {})
            for key, value in params.items():
                if value == "auto":
                    self.problems.append(
                        f'{section}.params.{key}: "auto" is not filled by gpt_ds for '
                        f"{self.cfg[section]['type']}; set a value"
                    )


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)
