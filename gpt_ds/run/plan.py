"""The run's plan: everything a run needs, resolved and checked before any model exists,
identically on every rank (`plan_run`: the run config, the model's shape, the DeepSpeed
config, the data, the checkpoint to resume, GPU support, the memory guard, and every choice
the trainer would otherwise make as it goes), and the two steps that need the process group
(`claim_out_dir`, `verify_resume`). gpt_ds/train.py runs them in order.

`plan_run` reads the run's flags, its files (data, checkpoints) and the machine's facts
(launch/machine.py probed them once); it probes and prints nothing: the lines it has for the log
are the plan's `notes`."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpt_ds.base import dist
from gpt_ds.base.errors import CheckpointError, ConfigError, GptDsError
from gpt_ds.base.processes import wants_release
from gpt_ds.checkpoint.batch import Batch, check_batch, check_continuable
from gpt_ds.checkpoint.checkpointer import check_model, check_same_data, damaged_files
from gpt_ds.checkpoint.integrity import unverified_reason
from gpt_ds.checkpoint.manifest import MANIFEST, RunRecord, needs_universal
from gpt_ds.checkpoint.tags import (
    CheckpointRef,
    check_writable,
    complete_tags,
    partial_dirs,
    resolve,
)
from gpt_ds.data.mixture import DataMix, load_mix
from gpt_ds.dsconfig.monitors import check_monitors, wandb_env, with_monitor_flags
from gpt_ds.dsconfig.optimization import with_schedule
from gpt_ds.dsconfig.resolve import ResolvedDsConfig, RunLength, resolve_ds_config
from gpt_ds.dsconfig.schema import load_ds_config, preset_path
from gpt_ds.dsconfig.settings import MachineFacts
from gpt_ds.memory.estimate import DeepSpeedRun, MemoryEstimate, estimate_run
from gpt_ds.memory.guard import NodeRam, check_fits
from gpt_ds.model.gpt2 import (
    ModelShape,
    checkpoint_vocab,
)
from gpt_ds.observe.metrics import resolve_peak
from gpt_ds.observe.watchdog import flight_recorder_env
from gpt_ds.run import lock as run_lock
from gpt_ds.run.config import RunConfig, run_settings, validate
from gpt_ds.run.init_source import InitSource, model_source
from gpt_ds.run.lock import AUTO, RunLock, auto_starts, check_fresh_start, start_over_line

if TYPE_CHECKING:  # imported where --hellaswag is given
    from gpt_ds.data.hellaswag import Rendered


@dataclass(frozen=True, kw_only=True)
class RunPlan:
    """Everything decided and checked before any rank builds a model (`plan_run`): the run
    config as the user gave it, and what was computed from it, apart."""

    cfg: RunConfig  # what the user asked, never rewritten
    shape: ModelShape
    ds: ResolvedDsConfig
    data: DataMix
    resume: CheckpointRef | None  # the checked checkpoint to continue from, if any
    init: InitSource  # the first weights of a run that does not resume (--init_from)
    estimate: MemoryEstimate  # predicted per-rank memory, checked against the machine
    machine: MachineFacts  # what the machine has, as probed at start
    choices: RunChoices  # what the trainer does where a flag says "auto" or nothing
    notes: tuple[str, ...] = ()  # the plan's lines for the log, in order
    run_id: str = ""  # this launch, in every metrics record and checkpoint (run/lock.py)
    hellaswag: Rendered | None = None  # --hellaswag's examples, checked and rendered

    @property
    def length(self) -> RunLength:
        """The steps it trains, from --max_iters or a token/epoch budget (the resolution's)."""
        assert self.ds.length is not None  # plan_run's settings carry the run's length flags
        return self.ds.length

    @property
    def resumes_universal(self) -> bool:
        """The checkpoint it resumes is a universal one, or was saved on another world size
        (the trainer converts it to one): the engine loads it as universal."""
        if self.resume is None:
            return False
        return needs_universal(self.resume.manifest, self.machine.world_size)

    def engine_config(self) -> dict[str, Any]:
        """The config `deepspeed.initialize` gets: the resolved one, set to load a universal
        checkpoint when the resume needs one (a fact of this launch, not of the run's config,
        so a fall-back to another tag changes it without resolving again)."""
        if not self.resumes_universal:
            return self.ds.config
        checkpoint = {**self.ds.config.get("checkpoint", {}), "load_universal": True}
        return {**self.ds.config, "checkpoint": checkpoint}

    def run_record(self) -> RunRecord:
        """What each checkpoint's manifest says of the run (checkpoint/manifest.py)."""
        return RunRecord(
            world_size=self.machine.world_size,
            zero_stage=self.ds.zero_stage,
            model=asdict(self.shape),
            config=self.cfg.to_dict(),
            plan=self.record(),
            precision=self.ds.precision,
            micro_batch_size=self.ds.micro_batch_size,
            grad_accum=self.ds.grad_accum,
            run_id=self.run_id,
            data=self.data.identity(),
        )

    def record(self) -> dict[str, Any]:
        """The computed values a checkpoint's manifest keeps beside the run config; the batch
        split, precision and ZeRO stage are the manifest's own fields, not repeated here."""
        ds = self.ds
        return {
            "max_iters": self.length.max_iters,
            "decay_iters": self.length.decay_iters,
            "train_batch_size": ds.train_batch_size,
            "lr": ds.lr,
            "min_lr": ds.min_lr,
            "warmup_iters": ds.warmup_iters,
            "grad_clip": ds.grad_clip,
            "optimizer": ds.optimizer,
            "deepspeed_config": ds.config,
        }


def plan_run(
    cfg: RunConfig, machine: MachineFacts, damaged: dict[str, str] | None = None
) -> RunPlan:
    """Validate and resolve everything the run needs on `machine`; raises a GptDsError naming
    what is wrong. `damaged` names checkpoint tags found damaged, which `--resume` must not use.
    The steps run from the run's own decisions down to the checks against checkpoint and
    machine; `cfg` is read, never rewritten."""
    preset = validate(cfg, machine.world_size)
    notes: list[str] = []
    init, shape = model_source(cfg, preset)  # first: --init_from naming this out dir says so
    resume = resume_checkpoint(cfg, damaged, notes.append)
    if resume is not None:  # the run keeps the checkpoint's model, vocabulary padding included
        shape = checkpoint_vocab(shape, resume.manifest.model)
        check_model(resume, asdict(shape))
    data = load_mix(cfg.data_dir, shape.tokens, shape.block_size)
    hellaswag = hellaswag_rows(cfg.hellaswag, shape.block_size, notes) if cfg.hellaswag else None
    ds = deepspeed_config(cfg, shape, data.train_tokens, machine)
    assert ds.length is not None  # run_settings gives the run's length flags
    check_monitors(ds.config, machine.wandb_mode, machine.wandb_key)
    check_not_past(resume, ds.length)
    notes += check_resume(resume, cfg, ds, shape, data.identity(), machine.world_size)
    estimate = check_machine(cfg, ds, shape, machine)
    notes += [ds.length.line] if ds.length.line else []
    if ds.optimizer == "muon":
        from gpt_ds.dsconfig.muon import split_line

        notes.append(split_line(shape))
    return RunPlan(
        cfg=cfg,
        shape=shape,
        ds=ds,
        data=data,
        resume=resume,
        init=init,
        estimate=estimate,
        machine=machine,
        choices=run_choices(cfg, machine, shape, ds.config),
        notes=tuple(notes),
        hellaswag=hellaswag,
    )


@dataclass(frozen=True)
class RunChoices:
    """What the run does where its flags leave the choice to gpt_ds, decided in the plan so the
    trainer, the engine build and the checkpointer only read it."""

    compile: bool  # torch.compile the model (--compile: auto compiles on GPUs)
    compile_blocker: str | None  # why it cannot, where it should (the run trains eager)
    release_host_memory: bool  # glibc returns freed blocks (--release_host_memory)
    save_interval: int  # iterations between saves (--save_interval, default --eval_interval)
    save_interval_flag: str  # the flag that gave it, for the log
    environment: dict[str, str]  # set before the process group: NCCL's flight recorder, W&B
    peak_flops: float | None  # per device, what MFU divides by (None: not reported)
    peak_line: str  # where that peak comes from, for the log


def run_choices(
    cfg: RunConfig, machine: MachineFacts, shape: ModelShape, ds_config: dict
) -> RunChoices:
    """Every "auto" and unset default of the flags below, from the run and the machine (the MFU
    peak: the table's, for the GPU the machine names); the environment variables the run sets,
    where the machine's environment does not set them already."""
    compile_ = cfg.compile == "on" or (cfg.compile == "auto" and machine.device_type == "cuda")
    release = wants_release(cfg.release_host_memory, machine.device_type, shape.num_params())
    if cfg.save_interval is None:
        interval, flag = cfg.eval_interval, "--eval_interval"
    else:
        interval, flag = cfg.save_interval, "--save_interval"
    peak_flops, peak_line = resolve_peak(cfg.peak_tflops, machine.device_name)
    environment = wandb_env(ds_config, cfg.out_dir, cfg.run_name, machine.environ_names)
    if cfg.hang_timeout != 0:  # NCCL's flight recorder dumps next to the hang's stacks
        environment.update(flight_recorder_env(cfg.out_dir, machine.environ_names))
    return RunChoices(
        peak_flops=peak_flops,
        peak_line=peak_line,
        environment=environment,
        compile=compile_,
        compile_blocker=machine.compile_blocker if compile_ else None,
        release_host_memory=release,
        save_interval=interval,
        save_interval_flag=flag,
    )


def hellaswag_rows(path: str, block_size: int, notes: list[str]) -> Rendered:
    """--hellaswag's examples, rendered for the run's block once; refused now if the file is
    malformed or none fits the block."""
    from gpt_ds.data.hellaswag import read_hellaswag, render_all

    data = render_all(read_hellaswag(path), block_size, path)
    skipped = f" ({data.skipped} skipped: an ending too long for the block)" if data.skipped else ""
    notes.append(
        f"hellaswag: {len(data.rows):,} examples of {path} scored at each evaluation{skipped}"
    )
    return data


def deepspeed_config(
    cfg: RunConfig, shape: ModelShape, train_tokens: int, machine: MachineFacts
) -> ResolvedDsConfig:
    """The run's DeepSpeed config: the preset with the monitor flags and the schedule, every
    "auto" filled from the run and the machine, and the run's length in steps (a budget in
    tokens or epochs follows from the resolved batch), resolved once."""
    raw = with_monitor_flags(
        load_ds_config(preset_path(cfg.deepspeed_config)),
        cfg.out_dir,
        tensorboard_dir=cfg.tensorboard_dir,
        csv_dir=cfg.csv_dir,
        wandb_project=cfg.wandb_project,
        run_name=cfg.run_name,
    )
    raw = with_schedule(raw, cfg.lr_schedule)
    if cfg.optimizer is not None:
        from gpt_ds.dsconfig.muon import with_optimizer  # imported only where a run asks

        raw = with_optimizer(raw, cfg.optimizer)
    settings = run_settings(
        cfg,
        world_size=machine.world_size,  # the launcher's, before the process group exists
        hidden_size=shape.n_embd,
        block_size=shape.block_size,
        train_tokens=train_tokens,
    )
    return resolve_ds_config(raw, settings, facts=machine, source=cfg.deepspeed_config)


def check_resume(
    resume: CheckpointRef | None,
    cfg: RunConfig,
    ds: ResolvedDsConfig,
    shape: ModelShape,
    data_identity: dict,
    world_size: int,
) -> list[str]:
    """A resume's ZeRO stage (the checkpoint's), batch (changed only with --allow_batch_change)
    and data (the same files) against the checkpoint; returns the lines saying what changed."""
    if resume is None:
        return []
    check_zero_stage(resume, ds.zero_stage, world_size, cfg.deepspeed_config)
    check_optimizer(resume, ds.optimizer)
    if needs_universal(resume.manifest, world_size):
        check_convertible(resume, world_size)
    now = Batch(world_size, ds.micro_batch_size, ds.grad_accum, shape.block_size)
    lines = check_batch(resume.manifest, now, cfg.allow_batch_change)
    check_same_data(resume, data_identity)
    return lines


def check_zero_stage(ref: CheckpointRef, zero_stage: int, world_size: int, preset: str) -> None:
    """A CheckpointError when a resume would load a checkpoint as DeepSpeed saved it (this world
    size, not universal) under another ZeRO stage than the one that saved it: its files are
    that stage's. Said before any model or engine is built; a checkpoint of another world size
    is converted to a universal one first and loads as that."""
    m = ref.manifest
    if m.zero_stage == zero_stage or needs_universal(m, world_size):
        return
    saved = m.config.get("deepspeed_config")
    saved_with = f"--deepspeed_config {saved}" if saved else f"a ZeRO-{m.zero_stage} preset"
    raise CheckpointError(
        f"--resume: {ref.tag_dir} was saved under ZeRO stage {m.zero_stage}, and this run's "
        f"--deepspeed_config {preset} is ZeRO stage {zero_stage}: a resume continues under the "
        f"stage that saved it; resume with {saved_with} (the checkpoint's), or start a new run "
        f"from its weights under stage {zero_stage}: --init_from {ref.out_dir}:{ref.tag} "
        "--out_dir NEW_DIR"
    )


def check_optimizer(ref: CheckpointRef, optimizer: str | None) -> None:
    """A CheckpointError when a resume would load one optimizer's state into another: Muon's
    momentum and AdamW's two moments are not each other's, and DeepSpeed would fail deep in
    its load or pair them wrongly. Said before any model or engine is built."""
    saved = ref.manifest.optimizer
    if saved is None or optimizer is None:
        return
    state = {"adam": "adamw"}  # Adam and AdamW keep the same two moments
    flag = state.get(saved, saved)
    if flag == state.get(optimizer, optimizer):
        return
    raise CheckpointError(
        f"--resume: {ref.tag_dir} was saved by a {saved} run and this run's optimizer is "
        f"{optimizer}: a resume continues the optimizer that saved it (its state is that "
        f"optimizer's); resume with --optimizer {flag}, or start a new run from its weights "
        f"with {optimizer}: --init_from {ref.out_dir}:{ref.tag} --out_dir NEW_DIR"
    )


def check_convertible(ref: CheckpointRef, world_size: int) -> None:
    """A CheckpointError, before any build, where a resume on another world size needs a
    universal checkpoint that DeepSpeed cannot make from `ref`."""
    from gpt_ds.checkpoint.universal import universal_refusal  # imported where one is needed

    reason = universal_refusal(ref.manifest)
    if reason is None:
        return
    raise CheckpointError(
        f"--resume: {ref.tag_dir} was saved by {ref.manifest.world_size} ranks and this run has "
        f"{world_size}, which needs a universal checkpoint, and {reason}; resume with "
        f"{ref.manifest.world_size} ranks, or start a new run from its weights: "
        f"--init_from {ref.out_dir}:{ref.tag} --out_dir NEW_DIR"
    )


def check_machine(
    cfg: RunConfig, ds: ResolvedDsConfig, shape: ModelShape, machine: MachineFacts
) -> MemoryEstimate:
    """The out dir writable and (unless ignored) the memory guard; returns the predicted
    per-rank memory."""
    check_writable(Path(cfg.out_dir))
    run = DeepSpeedRun.from_resolved(
        ds,
        world_size=machine.world_size,
        gpus_per_node=machine.ranks_per_node,
        activation_checkpointing=cfg.activation_checkpointing,
        loss=cfg.loss,
    )
    estimate = estimate_run(shape, run)
    if not cfg.ignore_memory_estimate:
        check_fits(
            estimate,
            ranks_per_node=machine.ranks_per_node,
            device_bytes=machine.device_bytes,
            ram=NodeRam(*machine.host_ram) if machine.host_ram else None,
        )
    return estimate


def claim_out_dir(plan: RunPlan) -> tuple[RunLock | None, RunPlan]:
    """Rank 0 takes the out dir's lock (run/lock.py) before any rank writes there; every rank
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
        if why := unverified_reason(ref.manifest):  # resolve refused it unless allowed
            dist.print0(f"checkpoint: {ref.tag} UNVERIFIED ({why}; loaded: --allow_unverified)")
            return plan
        problems = damaged_files(ref)
        if not problems:
            size = sum(ref.manifest.files.values()) / 2**20
            seconds = time.perf_counter() - started
            dist.print0(f"checkpoint: {ref.tag} verified ({size:.1f} MiB in {seconds:.1f} s)")
            return plan
        damaged[ref.tag] = "; ".join(problems)
        older = resume_checkpoint(plan.cfg, damaged)  # a named tag raises
        assert older is not None  # --resume is given: plan.resume was set from it
        plan = resume_instead(plan, older)
    return plan


def resume_instead(plan: RunPlan, ref: CheckpointRef) -> RunPlan:
    """`plan` continuing from `ref`, an older tag of its out dir, once `ref`'s own checks pass;
    nothing else is planned again (length, data, memory: the run's own, as planned)."""
    check_continuable(ref)
    check_model(ref, asdict(plan.shape))
    check_not_past(ref, plan.length)
    world = plan.machine.world_size
    for line in check_resume(ref, plan.cfg, plan.ds, plan.shape, plan.data.identity(), world):
        dist.print0(line)
    return dataclasses.replace(plan, resume=ref)


def resume_checkpoint(
    cfg: RunConfig, damaged: dict[str, str] | None = None, note: Callable[[str], None] = dist.print0
) -> CheckpointRef | None:
    """The complete checkpoint `--resume` names (None when the run starts: no --resume, or
    --resume auto in an out dir without a complete checkpoint); `latest` falls back to the newest
    complete tag when it names an incomplete one, said to `note`. Its model is plan_run's to
    check."""
    out_dir = Path(cfg.out_dir)
    if not cfg.resume:
        check_fresh_start(out_dir)  # never replaces an earlier run's output
        return None
    if cfg.resume == AUTO and auto_starts(out_dir):
        note(start_over_line(out_dir))  # the trainer sets the metrics aside
        return None
    if not complete_tags(out_dir):
        raise CheckpointError(
            f"--resume: no complete checkpoint in {out_dir} (looked for */{MANIFEST}); "
            f"start without --resume, or use --resume {AUTO} (continues if there is one)"
        )
    for leftover in partial_dirs(out_dir) if damaged is None else []:  # said once
        note(f"checkpoint: ignoring incomplete checkpoint directory {leftover} (no manifest)")
    tag = None if cfg.resume in ("latest", AUTO) else cfg.resume
    ref = resolve(
        out_dir,
        tag,
        flag="--resume",
        fall_back=True,
        damaged=damaged,
        note=note,
        allow_unverified=cfg.allow_unverified,
    )
    check_continuable(ref)
    return ref


def check_not_past(resume: CheckpointRef | None, length: RunLength) -> None:
    """A checkpoint past the run's last step cannot continue it: said before any work."""
    if resume is not None and resume.manifest.iteration > length.max_iters:
        raise ConfigError(
            f"--resume: {resume.tag_dir} is at iteration {resume.manifest.iteration}, past this "
            f"run's {length.max_iters} iterations; give a larger length (--max_iters, "
            "--max_tokens, --max_epochs) to train on from it"
        )


def finished(plan: RunPlan) -> str | None:
    """Why the verified checkpoint a run resumes leaves nothing to train (it is the run's last
    step), or None. A requeued job whose run ended exits 0 on this, having written nothing. (A
    `final` its early stop ended, earlier, is continued: its next evaluation stops it again.)"""
    ref = plan.resume
    if ref is None or ref.manifest.iteration != plan.length.max_iters:
        return None
    return (
        f"nothing to train: {ref.tag_dir} is at iteration {ref.manifest.iteration}, the run's "
        "last; exiting (a longer run: give a larger --max_iters / --max_tokens / --max_epochs)"
    )
