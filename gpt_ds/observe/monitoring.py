"""DeepSpeed's monitors (TensorBoard, Weights & Biases, CSV) writing the run's own metrics.

The DeepSpeed config's monitor sections are dsconfig/monitors.py's. The trainer writes through
`engine.monitor` (metrics.py picks the tags), with the optimizer step as x axis. DeepSpeed's own
events (`Train/Samples/lr` against samples) are turned off: W&B wants one increasing step per
run, and the trainer logs the lr itself.
"""

from __future__ import annotations

from typing import Any

from gpt_ds.dsconfig.monitors import SECTIONS, enabled


class EngineMonitor:
    """Writes scalars through `engine.monitor` (rank 0 only, as DeepSpeed does)."""

    def __init__(self, engine: Any):
        self.master = engine.monitor
        # DeepSpeed logs lr (and fp16's loss scale) against samples when `enabled`; the
        # trainer logs both against the optimizer step instead
        self.master.enabled = False

    @staticmethod
    def wanted(ds_config: dict) -> bool:
        return any(enabled(ds_config, section) for section in SECTIONS)

    def __call__(self, step: int, values: dict[str, float]) -> None:
        self.master.write_events([(tag, value, step) for tag, value in values.items()])

    def close(self) -> None:
        """Flush and close the writers: the ranks leave with os._exit, which skips W&B's
        and TensorBoard's exit hooks."""
        tb = getattr(self.master, "tb_monitor", None)
        if tb is not None and tb.summary_writer is not None:
            tb.summary_writer.close()
        if getattr(self.master, "wandb_monitor", None) is not None:
            import wandb

            wandb.finish()
