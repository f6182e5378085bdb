"""Each step's loss and gradient norm, kept on the device until the host needs them.

Reading a device value waits for every kernel queued before it, and the GPU then idles while
the host launches the next step: a per-step `.item()` costs a GPU run most of its lead. The
trainer reads the steps it holds only where it must anyway: at a log line, before an
evaluation or a checkpoint (a non-finite loss or gradient is caught before anything is saved),
and at the end; one all-reduce and one copy for all of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.distributed as tdist

from gpt_ds.base import dist


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
