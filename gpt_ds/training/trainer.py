"""The training loop: a `Trainer` that owns the engine and the run's state.

`run()` reads top to bottom: `setup` (model, engine, start-up report, resume) -> `train_step`
per iteration -> `after_step` (the eval / save / stop rules, in one place) -> `finish` (the
final evaluation and the `final` checkpoint). Everything the run learns as it goes (iteration,
best validation loss and its tag) lives on the object, and goes into every checkpoint.

Beside it, the loop's own parts, each with a comment block saying why: `EarlyStop` (the
plateau rule), `SaveClock` / `Agreed` (--save_every_minutes, agreed in the step's vote),
`PendingSteps` / `LogWindow` (each step's loss and gradient norm kept on the device until the
host must read them). A stop asked from outside (signals, a vanished launcher) is
base/processes.py's `StopRequest`.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as tdist
from torch.autograd.profiler import record_function

from gpt_ds.base import dist
from gpt_ds.base.cli import tool
from gpt_ds.base.errors import GptDsError
from gpt_ds.base.phases import BACKWARD, FORWARD, STEP
from gpt_ds.base.processes import StopRequest, release_freed_blocks
from gpt_ds.checkpoint.checkpointer import Checkpointer
from gpt_ds.checkpoint.manifest import new_manifest
from gpt_ds.checkpoint.tags import CheckpointRef, latest_tag
from gpt_ds.data.mixture import DataMix, MixtureWindows
from gpt_ds.data.tokens import GlobalSplit, TrainWindows
from gpt_ds.dsconfig.monitors import describe
from gpt_ds.model.gpt2 import flops_per_token, lm_loss
from gpt_ds.observe import startup
from gpt_ds.observe.metrics import (
    EngineMonitor,
    MetricsLogger,
    RunFacts,
    peak_memory_gib,
)
from gpt_ds.observe.metrics_file import rewind, set_aside_attempt
from gpt_ds.observe.watchdog import Watchdog
from gpt_ds.run.lock import AUTO
from gpt_ds.run.plan import RunPlan
from gpt_ds.training.engine_build import build_engine
from gpt_ds.training.evaluation import evaluate_mix

if TYPE_CHECKING:
    from gpt_ds.observe.profile import StepProfiler

# Early stopping: end a run once its val loss has stopped improving (`--early_stop_patience`).
#
# Counted over evaluations, not checkpoints: an evaluation improves when its loss is below the
# best seen by more than `min_delta`; `patience` evaluations in a row that do not end the run.
# The count and the best are part of every checkpoint (Manifest.early_stop), so a resumed run
# stops where the uninterrupted one would have.


@dataclass
class EarlyStop:
    patience: int  # 0: never stops the run
    min_delta: float = 0.0
    best: float | None = None  # the best val loss seen, and where
    best_iter: int | None = None
    stale: int = 0  # evaluations since the last improvement

    def observe(self, val_loss: float, iteration: int) -> bool:
        """Count one evaluation; True when the run should stop here."""
        if self.best is None or val_loss < self.best - self.min_delta:
            self.best, self.best_iter, self.stale = val_loss, iteration, 0
            return False
        self.stale += 1
        return 0 < self.patience <= self.stale

    def reason(self) -> str:
        return (
            f"early stop: {self.stale} evaluations without a val loss below {self.best:.4f} "
            f"(iteration {self.best_iter}) by more than {self.min_delta:g}"
        )

    def state_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k not in ("patience", "min_delta")}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.best_iter = state["best"], state["best_iter"]
        self.stale = state["stale"]


# Each step's loss and gradient norm, kept on the device until the host needs them.
#
# Reading a device value waits for every kernel queued before it, and the GPU then idles while
# the host launches the next step: a per-step `.item()` costs a GPU run most of its lead. The
# trainer reads the steps it holds only where it must anyway: at a log line, before an
# evaluation or a checkpoint (a non-finite loss or gradient is caught before anything is saved),
# and at the end; one all-reduce and one copy for all of them.


@dataclass(frozen=True)
class StepResult:
    """One optimizer step as the host reads it: the loss averaged over ranks, the global
    gradient norm (None where the engine gives none) and whether DeepSpeed skipped it."""

    iteration: int
    loss: float
    grad_norm: float | None
    skipped: bool

    @property
    def finite(self) -> bool:
        norm_ok = self.grad_norm is None or math.isfinite(self.grad_norm)
        return math.isfinite(self.loss) and norm_ok and not self.skipped


class PendingSteps:
    """Steps trained but not read yet."""

    def __init__(self) -> None:
        self.iterations: list[int] = []
        self.losses: list[torch.Tensor] = []  # 0-d, on the device
        self.norms: list[torch.Tensor | float | None] = []
        self.skipped: list[bool] = []

    def clear(self) -> None:
        for pending in (self.iterations, self.losses, self.norms, self.skipped):
            pending.clear()

    def __len__(self) -> int:
        return len(self.iterations)

    def add(
        self, it: int, loss: torch.Tensor, grad_norm: torch.Tensor | float | None, skipped: bool
    ) -> None:
        """Step `it`: this rank's mean loss, the engine's gradient norm (a tensor, a float or
        None, as DeepSpeed gives it) and whether it skipped the step. Nothing is read."""
        self.iterations.append(it)
        self.losses.append(loss.detach().reshape(()))
        norm = grad_norm.detach().reshape(()) if isinstance(grad_norm, torch.Tensor) else grad_norm
        self.norms.append(norm)
        self.skipped.append(skipped)

    def read(self) -> list[StepResult]:
        """Every pending step, read: one all-reduce of the losses, one copy to the host."""
        if not self:
            return []
        losses = torch.stack(self.losses).to(torch.float64)
        if dist.world_size() > 1 and tdist.is_initialized():
            tdist.all_reduce(losses, op=tdist.ReduceOp.SUM)
            losses /= dist.world_size()
        norms = [n.to(losses) if isinstance(n, torch.Tensor) else n for n in self.norms]
        on_device = [n for n in norms if isinstance(n, torch.Tensor)]
        values = torch.cat([losses, *(n.reshape(1) for n in on_device)]).tolist()
        loss_values, device_norms = values[: len(losses)], iter(values[len(losses) :])
        results = [
            StepResult(it, loss, _host_norm(norm, device_norms), skipped)
            for it, loss, norm, skipped in zip(
                self.iterations, loss_values, norms, self.skipped, strict=True
            )
        ]
        self.clear()
        return results


def _host_norm(norm: torch.Tensor | float | None, read) -> float | None:
    """The host value of a norm: the next value read for a tensor, else the number itself."""
    if isinstance(norm, torch.Tensor):
        return next(read)
    return None if norm is None else float(norm)


# Saving on time (--save_every_minutes). A hard kill (SIGKILL, a lost node) loses everything
# since the last checkpoint; a step-count interval sized for a fast phase can be hours in a slow
# one. Each rank keeps its own clock and raises a flag in the step's stop vote (one all-reduce a
# step, read a step late: no host sync added) once M minutes have passed since the last save;
# every rank sees the same agreement at the same iteration and saves there. A vote cast before
# a save (the one in flight while it was written) asked for that save, not for another.


class SaveClock:
    """Whether `minutes` of training have passed since the last save (or the loop's start)."""

    def __init__(self, minutes: float | None):
        self.minutes = minutes
        self.since = time.monotonic()
        self.saved_at = 0  # the iteration of the last save, or of the loop's start

    def restart(self, iteration: int) -> None:
        self.since, self.saved_at = time.monotonic(), iteration

    def due(self) -> bool:
        return self.minutes is not None and time.monotonic() - self.since >= self.minutes * 60

    def asks_now(self, on_time: bool, cast_at: int) -> bool:
        """Whether an agreed `on_time` vote, cast at iteration `cast_at`, still asks for a
        save: not when that save has happened since (a save follows its step's vote)."""
        return on_time and cast_at > self.saved_at


@dataclass(frozen=True)
class Agreed:
    """What every rank agreed on after a step (a step late: `dist.DelayedAny`)."""

    stop: bool  # a stop was requested (a signal, a vanished launcher) on some rank
    save_on_time: bool  # --save_every_minutes ran out on some rank


@dataclass
class LogWindow:
    """Training iterations since the last log line (losses, time spent in steps only)."""

    loss_sum: float = 0.0
    steps: int = 0
    seconds: float = 0.0
    since_eval: list[float] = field(default_factory=list)  # losses since the last evaluation

    def add(self, results: list[StepResult], seconds: float) -> None:
        """Steps read from the device, and the training time they took."""
        for r in results:
            self.loss_sum += r.loss
            self.since_eval.append(r.loss)
        self.steps += len(results)
        self.seconds += seconds

    def take_log(self) -> tuple[float, int, float]:
        """(mean loss, steps, seconds) since the last log line, and start a new log window."""
        mean = self.loss_sum / self.steps
        taken = (mean, self.steps, self.seconds)
        self.loss_sum, self.steps, self.seconds = 0.0, 0, 0.0
        return taken

    def take_eval_mean(self) -> float | None:
        """The mean training loss since the last evaluation, and start a new eval window."""
        losses, self.since_eval = self.since_eval, []
        return sum(losses) / len(losses) if losses else None


class Trainer:
    """Trains one run on the process group `dist.init()` joined."""

    def __init__(self, plan: RunPlan):
        self.plan, self.cfg, self.shape = plan, plan.cfg, plan.shape
        self.max_iters = plan.length.max_iters  # the run's last step, as planned
        self.checkpointer = Checkpointer(plan.cfg.out_dir, plan.cfg.keep_last)
        self.stop_request = StopRequest()
        self.iteration = 0
        self.best_val: float | None = None
        self.best_tag: str | None = None
        self.last_val: float | None = None
        self.window = LogWindow()
        self.pending = PendingSteps()  # trained, not yet read from the device
        self.step_seconds = 0.0  # host time of the pending steps
        self.last_grad_norm: float | None = None  # of the latest step read
        self.votes = dist.DelayedAny(flags=2)  # (stop requested, save on time), see Agreed
        self.save_clock = SaveClock(plan.cfg.save_every_minutes)
        self.monitor: EngineMonitor | None = None
        self.last_val_iter = -1  # the iteration of `last_val`
        self.tokens_seen = 0  # trained on so far, all ranks (in checkpoints and records)
        self.early_stop = EarlyStop(plan.cfg.early_stop_patience, plan.cfg.early_stop_min_delta)
        self.patience_ran_out = False  # the latest evaluation ends the run (--early_stop_patience)
        self.profiler: StepProfiler | None = None  # --profile's window, once the loop starts
        self.watchdog: Watchdog | None = None  # --hang_timeout's, once the loop starts

    @property
    def tokens_per_iter(self) -> int:
        """Tokens one optimizer step trains on, all ranks."""
        return self.plan.ds.train_batch_size * self.shape.block_size

    @property
    def evaluated_now(self) -> bool:
        """Whether `last_val` is this iteration's (a save between evaluations has none)."""
        return self.last_val_iter == self.iteration

    # ------------------------------------------------------------------ the run
    def run(self) -> int:
        try:
            return self._run()
        finally:
            self.stop_request.close()
            if self.watchdog is not None:
                self.watchdog.close()
            if self.profiler is not None:
                self.profiler.close()
            if self.monitor is not None:
                self.monitor.close()

    def _run(self) -> int:
        self.setup()
        if self.cfg.dry_run:
            dist.print0("dry run: model and engine built on every rank; stopping before step 1")
            return 0
        if self.iteration >= self.max_iters:
            dist.print0(
                f"nothing to do: checkpoint is at iteration {self.iteration} >= --max_iters"
            )
            return 0
        self.metrics.event(
            {
                "event": "start",
                "iter": self.iteration,
                "world_size": dist.world_size(),
                "config": self.cfg.to_dict(),
            }
        )
        if self.iteration == 0 and not self.plan.init.is_scratch:
            self.evaluate(0)  # where the given weights start: the baseline of a fine-tune
        self.engine.train()
        first = self.iteration + 1
        if self.cfg.profile:  # only a profiled run loads the profiler and its trace analysis
            from gpt_ds.observe.profile import StepProfiler

            self.profiler = StepProfiler(self.cfg.out_dir, first, self.max_iters, enabled=True)
        self.watchdog = Watchdog.start(
            self.cfg.out_dir, dist.rank(), dist.world_size(), self.cfg.hang_timeout
        )
        self.save_clock.restart(self.iteration)  # training time: not start-up, not resume
        for it in range(first, self.max_iters + 1):
            t0 = time.perf_counter()
            with self.profiler.step(it) if self.profiler else contextlib.nullcontext():
                agreed = self.train_step(it)
            if it == first:
                self._first_step_report(time.perf_counter() - t0)
            elif self.watchdog is not None:  # the first step's compile and warm-up: not a measure
                self.watchdog.step_done(time.perf_counter() - t0)
            if self.after_step(it, agreed):
                return 0
        return self.finish()

    def _first_step_report(self, seconds: float) -> None:
        """Memory after the first step; with --compile, its time (compilation included)."""
        startup.model_states(self.engine, self.estimate)
        if self.engine.is_compiled:  # engine_build decided, and compiled or said why not
            self.metrics.event(
                {
                    "event": "compile",
                    "iter": self.iteration,
                    "seconds": round(seconds, 2),
                    "message": f"first iteration {seconds:.1f} s (torch.compile included)",
                }
            )

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        """Model -> engine -> start-up report -> training windows -> resume."""
        cfg, ds = self.cfg, self.plan.ds
        startup.rank_banner()
        init = self.plan.init
        name = cfg.model_preset if init.is_scratch else init.describe()
        startup.run_summary(name, self.shape, ds, self.plan.data)
        resume = self.plan.resume
        if resume is not None and self.plan.resumes_universal:
            from gpt_ds.checkpoint.universal import convert_on_rank0  # another world size only

            resume = convert_on_rank0(resume)  # plan.engine_config() loads it universal
        if self.plan.choices.release_host_memory:
            dist.print0(release_freed_blocks())  # every rank: before the model exists
        before = peak_memory_gib()  # the process itself: interpreter, imports, data
        self.engine = build_engine(self.plan)
        self.estimate = self.plan.estimate
        startup.print_memory_estimate(self.estimate)
        startup.startup_memory(self.estimate, before)
        self.comm_seconds = startup.communication_plan(self.shape, ds)
        torch.manual_seed(cfg.seed + 1000 * dist.rank())  # per-rank dropout streams
        make_windows = MixtureWindows if self.plan.data.is_mixture else _one_source_windows
        self.train_windows = make_windows(
            self.plan.data, self.shape.block_size, ds.micro_batch_size, cfg.seed, dist.rank(),
            GlobalSplit(dist.world_size(), ds.grad_accum),
        )  # fmt: skip
        if resume is not None:
            self._resume(resume)
        self.metrics = self._metrics_logger()

    def _metrics_logger(self) -> MetricsLogger:
        """The logger, its monitors and MFU peak; a resumed run's metrics.jsonl rewound."""
        cfg, ds = self.cfg, self.plan.ds
        peak = self.plan.choices.peak_flops
        dist.print0(self.plan.choices.peak_line)
        for line in describe(ds.config, self.plan.machine.wandb_mode):
            dist.print0(line)
        if EngineMonitor.wanted(ds.config):
            self.monitor = EngineMonitor(self.engine)
        if dist.is_main():
            self._metrics_of_earlier_launches()
        facts = RunFacts(
            max_iters=self.max_iters,
            tokens_per_iter=self.tokens_per_iter,
            flops_per_token=flops_per_token(self.shape),
            world_size=dist.world_size(),
            peak_flops=peak,
            start_iter=self.iteration,
            train_tokens=self.plan.data.train_tokens,
        )
        return MetricsLogger(
            cfg.out_dir, dist.is_main(), facts, run_id=self.plan.run_id, monitor=self.monitor
        )

    def _metrics_of_earlier_launches(self) -> None:
        """Rank 0, out dir locked: a resumed run's metrics.jsonl rewound to its checkpoint; a
        --resume auto start over a killed attempt's metrics sets them aside (run/lock.py)."""
        out_dir = self.cfg.out_dir
        if self.iteration and (moved := rewind(out_dir, self.iteration)):
            dist.print0(
                f"metrics.jsonl: {moved} records past iteration {self.iteration} (the launch "
                f"that stopped) moved to metrics.jsonl.rewound-{self.iteration}"
            )
        elif not self.iteration and self.cfg.resume == AUTO:
            set_aside_attempt(out_dir)  # said by the plan (run/lock.py start_over_line)

    def _resume(self, ref: CheckpointRef) -> None:
        resumed = self.checkpointer.load(self.engine, ref)
        self.iteration = resumed.iteration
        self.best_val, self.best_tag = resumed.best_val_loss, resumed.best_tag
        self.train_windows.load_state_dict(resumed.train_windows_state)
        m = resumed.manifest
        assert m.early_stop is not None and m.tokens is not None, "plan.check_continuable"
        self.early_stop.load_state_dict(m.early_stop)
        self.tokens_seen = m.tokens
        dist.print0(f"resumed from {self.cfg.out_dir}/{ref.tag} at iteration {self.iteration}")

    # ------------------------------------------------------------------ one iteration
    def train_step(self, it: int) -> Agreed:
        """One optimizer step (grad_accum micro-batches); returns what the ranks agreed on (a
        stop request or a save on time seen by any rank one step earlier). Nothing here waits
        for the device: the loss and gradient norm stay there until `read_steps`."""
        t0 = time.perf_counter()
        ga, dev = self.plan.ds.grad_accum, dist.device()
        skipped_before = self.engine.skipped_steps
        loss_sum = torch.zeros((), dtype=torch.float64, device=dev)
        for micro in range(1, ga + 1):
            self._progress(f"forward and backward of iter {it}, micro-step {micro}/{ga}", it)
            x, y = self.train_windows.next_batch()
            with record_function(FORWARD):
                loss = lm_loss(self.engine, *dist.to_device(x, y, dev=dev))
            with record_function(BACKWARD):
                self.engine.backward(loss)
            self._progress(f"engine step of iter {it}, micro-step {micro}/{ga}")
            with record_function(STEP):
                self.engine.step()
            loss_sum += loss.detach()
        # without fp16's loss scaler, a skipped step means inf/NaN gradients: DeepSpeed would
        # go on skipping every step silently while the (huge but finite) loss is logged
        skipped = self.plan.ds.precision != "fp16" and self.engine.skipped_steps > skipped_before
        self.pending.add(it, loss_sum / ga, self.engine.get_global_grad_norm(), skipped)
        self._progress(f"all_reduce of iter {it}'s stop vote")
        agreed = Agreed(*self.votes.vote(self.stop_request.requested, self.save_clock.due()))
        self.iteration = it
        self.tokens_seen += self.tokens_per_iter
        self.step_seconds += time.perf_counter() - t0
        if it % self.cfg.log_interval == 0 or it == self.max_iters:
            self._log_train(it)
        return agreed

    def read_steps(self) -> None:
        """Read the pending steps from the device (all ranks at once: a collective), add them
        to the log window; raise on the first non-finite one, so nothing after it is saved."""
        if not self.pending:
            return
        t0 = time.perf_counter()
        self._progress(f"all_reduce of iter {self.iteration}'s losses (read from the device)")
        results = self.pending.read()
        for r in results:
            if not r.finite:
                self._stop_non_finite(r)
        self.last_grad_norm = results[-1].grad_norm
        self.window.add(results, self.step_seconds + time.perf_counter() - t0)
        self.step_seconds = 0.0

    def _progress(self, next_work: str, it: int | None = None) -> None:
        """A unit of work done, and what comes next, for the hang watchdog."""
        if self.watchdog is not None:
            self.watchdog.progress(next_work, it)

    def _stop_non_finite(self, r: StepResult) -> None:
        good = latest_tag(self.cfg.out_dir)
        where = (
            f"the last good checkpoint is {self.cfg.out_dir}/{good}"
            if good
            else "no checkpoint yet"
        )
        if not math.isfinite(r.loss):
            what = f"loss became {r.loss}"
        elif r.skipped:
            what = "gradients became non-finite (DeepSpeed skipped the optimizer step)"
        else:
            what = f"the gradient norm became {r.grad_norm}"
        raise GptDsError(
            f"{what} at iteration {r.iteration}; stopping without saving ({where}). "
            "Lower --lr, raise warmup, or check the data."
        )

    def _log_train(self, it: int) -> None:
        self.read_steps()
        loss, steps, seconds = self.window.take_log()
        self.metrics.log_train(
            it,
            self.tokens_seen,
            loss,
            self.engine.get_lr()[-1],  # --lr's (with Muon: its AdamW half's, the last groups)
            steps,
            seconds,
            grad_norm=self.last_grad_norm,
            loss_scale=self._loss_scale(),
            comm_seconds_per_step=self.comm_seconds,
            batch=self.train_windows.last_step_hash(),
        )

    def _loss_scale(self) -> float | None:
        """fp16's dynamic loss scale (its drops show overflow), else None."""
        if self.plan.ds.precision != "fp16":
            return None
        return _as_float(getattr(self.engine.optimizer, "loss_scale", None))

    # ------------------------------------------------------------------ the rules
    def after_step(self, it: int, agreed: Agreed) -> bool:
        """Evaluate at eval points, checkpoint at save points and on time; on a stop request
        save (once) and stop. Returns True when the run stops here. The last iteration is
        `finish`'s."""
        if it == self.max_iters:
            return False
        on_time = self.save_clock.asks_now(agreed.save_on_time, it - self.votes.lag)
        why = self._save_reason(it, on_time)
        if agreed.stop or _due(it, self.cfg.eval_interval) or why:
            self.read_steps()  # a non-finite step stops the run before anything is saved
        if _due(it, self.cfg.eval_interval):
            self.evaluate(it)
            if self.patience_ran_out:
                self._end_on_plateau(it)
                return True
            why = self._save_reason(it, on_time)  # improved: known only now
        if why:
            self.save(f"iter_{it}", why)
        if not agreed.stop:
            return False
        reason = self.stop_reason()
        dist.print0(f"{reason}: saving")
        if not why:  # not twice: the launcher SIGKILLs ranks 30 s after its SIGTERM
            self.save(f"iter_{it}", f"stop: {reason}")
        dist.print0(f"stopped at iteration {it}; resume with --resume (tag iter_{it})")
        return True

    def stop_reason(self) -> str:
        """Why the run stops, as the first rank that asked says it (every rank agreed on the
        stop, so every rank is here: the gather is safe). The rank that noticed a vanished
        launch or a signal first need not be rank 0, whose line the user reads."""
        self._progress("gather of the stop's reasons")
        reasons = dist.gather_objects(self.stop_request.reason)
        rank = next((r for r, why in enumerate(reasons) if why), None)
        if rank is None:
            return "a stop was requested"
        return reasons[rank] if rank == 0 else f"rank {rank}: {reasons[rank]}"

    def _end_on_plateau(self, it: int) -> None:
        """--early_stop_patience ran out: the run ends here, `final` saved, the best checkpoint
        named."""
        self.metrics.event({"event": "early_stop", "iter": it, "message": self.early_stop.reason()})
        self.save("final", "early stop")
        best = f"{self.cfg.out_dir}/{self.best_tag}" if self.best_tag else "none saved"
        dist.print0(
            f"stopped early at iteration {it}; best checkpoint: {best} (val loss "
            f"{self.best_val}); export it with {tool('export')} {self.cfg.out_dir} --tag best"
        )

    def _save_reason(self, it: int, on_time: bool) -> str | None:
        """Why iteration `it` is a save point, for the log line before the save, or None: every
        --save_interval (default --eval_interval) iterations, or with
        --save_only_on_improvement the evaluations that improved on the best checkpoint; else
        --save_every_minutes since the last save."""
        cfg, choices = self.cfg, self.plan.choices
        if cfg.save_only_on_improvement:
            if self.evaluated_now and self._improves():
                return "the val loss improved, --save_only_on_improvement"
        elif _due(it, choices.save_interval):
            return f"every {choices.save_interval} iterations, {choices.save_interval_flag}"
        if on_time:
            return f"{cfg.save_every_minutes:g} minutes since the last save, --save_every_minutes"
        return None

    def _improves(self) -> bool:
        """Whether the latest evaluation beats the best checkpoint's val loss."""
        if self.last_val is None:
            return False
        return self.best_val is None or self.last_val < self.best_val

    def finish(self) -> int:
        """The final evaluation and the `final` checkpoint."""
        self.read_steps()
        self.votes.settle()  # every rank has joined the vote in flight: close it
        self.evaluate(self.max_iters)
        self.save("final", "the run's last iteration")
        dist.print0(f"done: {self.max_iters} iterations, val loss {self.last_val:.4f}")
        return 0

    def evaluate(self, it: int) -> None:
        """Validation loss at iteration `it`, logged; the next save at `it` carries it."""
        self._progress(f"evaluation at iter {it}")
        ds = self.plan.ds
        res = evaluate_mix(
            self.engine,
            self.plan.data,
            self.shape.block_size,
            self.cfg.eval_iters * ds.micro_batch_size * ds.grad_accum,
            micro_batch_size=ds.micro_batch_size,
            device=dist.device(),
            rank=dist.rank(),
            world_size=dist.world_size(),
        )
        train_loss = self.window.take_eval_mean()
        self.metrics.log_eval(
            it,
            self.tokens_seen,
            res.loss,
            train_loss,
            res.perplexity,
            res.by_source,
            self.hellaswag_scores(),
        )
        self.last_val, self.last_val_iter = res.loss, it
        self.patience_ran_out = self.early_stop.observe(res.loss, it)

    def hellaswag_scores(self) -> dict[str, float]:
        """--hellaswag's figures for this evaluation (none without the flag)."""
        if not self.plan.hellaswag:
            return {}
        from gpt_ds.training.hellaswag import score_hellaswag

        res = score_hellaswag(
            self.engine,
            self.plan.hellaswag,
            dist.device(),
            rank=dist.rank(),
            world_size=dist.world_size(),
        )
        return {
            "hellaswag_acc_norm": res.acc_norm,
            "hellaswag_acc": res.acc,
            "hellaswag_examples": res.examples,
        }

    def save(self, tag: str, why: str) -> None:
        """Checkpoint `tag`, saying `why` first; it becomes the best tag when evaluated here and
        better than any earlier checkpoint (a save between evaluations has no val loss of its
        own). Every save restarts --save_every_minutes' clock."""
        if self.cfg.no_checkpoint:
            return
        self._progress(f"save {tag}")
        dist.print0(f"checkpoint {tag}: saving ({why})")
        if self.evaluated_now and self._improves():
            self.best_val, self.best_tag = self.last_val, tag
        manifest = new_manifest(
            self.plan.run_record(),
            tag=tag,
            iteration=self.iteration,
            tokens=self.tokens_seen,
            val_loss=self.last_val if self.evaluated_now else None,
            best_val_loss=self.best_val,
            best_tag=self.best_tag,
            early_stop=self.early_stop.state_dict(),
        )
        path = self.checkpointer.save(self.engine, self.train_windows, manifest)
        self.save_clock.restart(self.iteration)
        self.metrics.event(
            {
                "event": "checkpoint",
                "iter": self.iteration,
                "tag": tag,
                "why": why,
                "message": f"saved {path}",
            }
        )


def _one_source_windows(data: DataMix, *args) -> TrainWindows:
    return TrainWindows(data.sources[0].train, *args)


def _as_float(value) -> float | None:
    """A DeepSpeed figure (tensor, float or None) as a float for the log."""
    if value is None:
        return None
    return float(value.item() if isinstance(value, torch.Tensor) else value)


def _due(it: int, interval: int) -> bool:
    """Every `interval` iterations; 0 means never (only at the end)."""
    return interval > 0 and it % interval == 0
