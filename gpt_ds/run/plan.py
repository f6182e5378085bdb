"""The run's plan: everything a run needs, resolved and checked before any model exists,
identically on every rank (`plan_run`: the run config, the model's shape, the DeepSpeed
config, the data, the checkpoint to resume, GPU support, the memory guard), and the two steps
that need the process group (`claim_out_dir`, `verify_resume`). gpt_ds/train.py runs them in
order."""

from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from gpt_ds.base import dist
from gpt_ds.base.errors import CheckpointError, ConfigError, GptDsError
from gpt_ds.checkpoint import (
    MANIFEST,
    CheckpointRef,
    check_model,
    check_same_data,
    check_writable,
    complete_tags,
    damaged_files,
    needs_universal,
    partial_dirs,
    resolve,
)
from gpt_ds.checkpoint.batch import Batch, check_batch
from gpt_ds.data.mixture import DataMix, load_mix
from gpt_ds.dsconfig.lr_schedule import with_schedule
from gpt_ds.dsconfig.monitors import check_monitors, with_monitor_flags
from gpt_ds.dsconfig.resolve import ResolvedDsConfig, resolve_ds_config
from gpt_ds.dsconfig.run_length import has_budget, with_budget
from gpt_ds.dsconfig.schema import load_ds_config, preset_path
from gpt_ds.launch.gpu_support import check_gpu_support
from gpt_ds.memory import DeepSpeedRun, MemoryEstimate, estimate_run
from gpt_ds.memory.guard import check_fits, device_memory_bytes
from gpt_ds.model.gpt2 import (
    ModelShape,
    checkpoint_vocab,
)
from gpt_ds.run import lock as run_lock
from gpt_ds.run.config import RunConfig, run_settings, validate
from gpt_ds.run.init_source import InitSource, model_source
from gpt_ds.run.lock import RunLock


@dataclass(kw_only=True)
class RunPlan:
    """Everything decided and checked before any rank builds a model (`plan_run`)."""

    cfg: RunConfig
    shape: ModelShape
    ds: ResolvedDsConfig
    data: DataMix
    resume: CheckpointRef | None  # the checked checkpoint to continue from, if any
    init: InitSource  # the first weights of a run that does not resume (--init_from)
    estimate: MemoryEstimate  # predicted per-rank memory, checked against the machine
    run_id: str = ""  # this launch, in every metrics record and checkpoint (run_lock.py)


def plan_run(cfg: RunConfig, damaged: dict[str, str] | None = None) -> RunPlan:
    """Validate and resolve everything the run needs; raises a GptDsError naming what is wrong.
    `damaged` names checkpoint tags found damaged, which `--resume` must not use. The steps
    run from the run's own decisions down to the checks against checkpoint and machine."""
    validate(cfg)
    resume = resume_checkpoint(cfg, damaged)
    init, shape = model_source(cfg)
    if resume is not None:  # the run keeps the checkpoint's model, vocabulary padding included
        shape = checkpoint_vocab(shape, resume.manifest.model)
        check_model(resume, asdict(shape))
    world = dist.world_size()  # the launcher's, before the process group exists
    universal = resume is not None and needs_universal(resume.manifest, world)
    raw = with_monitor_flags(
        load_ds_config(preset_path(cfg.deepspeed_config)),
        cfg.out_dir,
        tensorboard_dir=cfg.tensorboard_dir,
        csv_dir=cfg.csv_dir,
        wandb_project=cfg.wandb_project,
        run_name=cfg.run_name,
    )
    raw = with_schedule(raw, cfg.lr_schedule)
    settings = functools.partial(
        run_settings, world_size=world, load_universal=universal, hidden_size=shape.n_embd
    )
    # a budget in tokens or epochs needs the batch first: resolved once for it, with room
    probe = dataclasses.replace(cfg, max_iters=10**9) if has_budget(cfg) else cfg
    ds = resolve_ds_config(raw, settings(probe), source=cfg.deepspeed_config)
    data = load_mix(cfg.data_dir, shape.tokens, shape.block_size)
    identity, length = data.identity(), []
    if has_budget(cfg):
        cfg, line = with_budget(cfg, ds.train_batch_size * shape.block_size, data.train_tokens)
        ds, length = resolve_ds_config(raw, settings(cfg), source=cfg.deepspeed_config), [line]
    check_monitors(ds.config)
    check_fresh_zero3(ds, init, resume, cfg.deepspeed_config)
    notes = check_resume(resume, cfg, ds, shape, identity) + length
    estimate = check_machine(cfg, ds, shape)
    for line in notes:
        dist.print0(line)
    return RunPlan(
        cfg=cfg, shape=shape, ds=ds, data=data, resume=resume, init=init, estimate=estimate
    )


def check_fresh_zero3(
    ds: ResolvedDsConfig, init: InitSource, resume: CheckpointRef | None, source: str
) -> None:
    """A model built fresh under ZeRO-3 needs a transformers whose ZeRO-3 init is GPT-2's."""
    if ds.zero_stage == 3 and init.is_scratch and resume is None:
        from importlib.metadata import version  # importing transformers here would take seconds

        from gpt_ds.model.zero3 import zero3_init_problem

        problem = zero3_init_problem(version("transformers"))
        if problem:
            raise ConfigError(problem, source)


def check_resume(
    resume: CheckpointRef | None,
    cfg: RunConfig,
    ds: ResolvedDsConfig,
    shape: ModelShape,
    data_identity: dict,
) -> list[str]:
    """A resume's batch (changed only with --allow_batch_change) and data (the same files)
    against the checkpoint; returns the lines saying what changed."""
    if resume is None:
        return []
    now = Batch(dist.world_size(), ds.micro_batch_size, ds.grad_accum, shape.block_size)
    lines = check_batch(resume.manifest, now, cfg.allow_batch_change)
    check_same_data(resume, data_identity)
    return lines


def check_machine(cfg: RunConfig, ds: ResolvedDsConfig, shape: ModelShape) -> MemoryEstimate:
    """The out dir writable, GPU support, and (unless ignored) the memory guard; returns the
    predicted per-rank memory."""
    check_writable(Path(cfg.out_dir))
    check_gpu_support(dist.local_rank())  # first: with a GPU unseen the guard would judge CPU
    run = DeepSpeedRun.from_resolved(
        ds,
        world_size=dist.world_size(),
        gpus_per_node=dist.local_world_size(),
        activation_checkpointing=cfg.activation_checkpointing,
        chunked_loss=cfg.loss == "chunked",
    )
    estimate = estimate_run(shape, run)
    if not cfg.ignore_memory_estimate:
        check_fits(
            estimate,
            ranks_per_node=dist.local_world_size(),
            device_bytes=device_memory_bytes(dist.local_rank()),
        )  # host: the RAM or the cgroup limit (node_ram)
    return estimate


def claim_out_dir(plan: RunPlan) -> tuple[RunLock | None, RunPlan]:
    """Rank 0 takes the out dir's lock (run_lock.py) before any rank writes there; every rank
    gets the outcome: the same OutDirBusy, or the plan with this launch's run id."""
    lock, error = None, None
    if dist.is_main():
        try:
            lock = run_lock.acquire(Path(plan.cfg.out_dir), run_lock.new_run_id())
        except GptDsError as exc:
            error = str(exc)
    error, run_id = dist.gather_objects((error, lock.owner.run_id if lock else None))[0]
    if error is not None:
        raise run_lock.OutDirBusy(error)
    return lock, dataclasses.replace(plan, run_id=run_id)


def verify_resume(plan: RunPlan) -> RunPlan:
    """`plan` once the checkpoint it resumes from passed its checksums (every rank verifies a
    share of the files). A damaged `latest` gives way to the newest intact tag, said; a damaged
    tag named with `--resume TAG` is refused."""
    damaged: dict[str, str] = {}
    while plan.resume is not None:
        started, ref = time.perf_counter(), plan.resume
        problems = damaged_files(ref)
        if not problems:
            size = sum(ref.manifest.files.values()) / 2**20
            seconds = time.perf_counter() - started
            dist.print0(f"checkpoint: {ref.tag} verified ({size:.1f} MiB in {seconds:.1f} s)")
            return plan
        damaged[ref.tag] = "; ".join(problems)
        # a named tag raises; `latest` falls back
        plan = dataclasses.replace(plan_run(plan.cfg, damaged), run_id=plan.run_id)
    return plan


def resume_checkpoint(
    cfg: RunConfig, damaged: dict[str, str] | None = None
) -> CheckpointRef | None:
    """The complete checkpoint `--resume` names (None without --resume); `latest` falls back
    to the newest complete tag when it names an incomplete one. Its model is plan_run's to
    check."""
    if not cfg.resume:
        return None
    out_dir = Path(cfg.out_dir)
    if not complete_tags(out_dir):
        raise CheckpointError(
            f"--resume: no complete checkpoint in {out_dir} (looked for */{MANIFEST}); "
            "start without --resume"
        )
    for leftover in partial_dirs(out_dir) if damaged is None else []:  # said once
        dist.print0(
            f"checkpoint: ignoring incomplete checkpoint directory {leftover} (no manifest)"
        )
    tag = None if cfg.resume == "latest" else cfg.resume
    return resolve(out_dir, tag, flag="--resume", fall_back=True, damaged=damaged, note=dist.print0)
