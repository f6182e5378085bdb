"""Early stopping: end a run once its val loss has stopped improving (`--early_stop_patience`).

Counted over evaluations, not checkpoints: an evaluation improves when its loss is below the
best seen by more than `min_delta`; `patience` evaluations in a row that do not end the run.
The count and the best are part of every checkpoint (Manifest.early_stop), so a resumed run
stops where the uninterrupted one would have.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


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

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """A checkpoint's state; None (saved before it was kept) starts counting afresh."""
        if state:
            self.best, self.best_iter = state["best"], state["best_iter"]
            self.stale = state["stale"]
