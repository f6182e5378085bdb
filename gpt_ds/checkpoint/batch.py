"""What a resume changes about the batch, said before training, refused unless allowed; and
which checkpoints a resume can continue at all.

Runs draw their windows from one global stream (data.TrainWindows): each step takes the next
global batch of sequences, split among the ranks. A resume with the same global batch on any
world size, micro-batch or accumulation trains on the same sequences in the same order, its
gradients summed in another order: equal to float rounding, not bit-identical. That is said and
allowed. A changed global batch changes the sequences and tokens per step: refused without
--allow_batch_change.

Checkpoints of a gpt_ds before the global stream (the manifest's `data_stream` "per_rank")
drew each rank's windows from a stream of its own, which this gpt_ds does not draw: `--resume`
refuses them (`check_continuable`), and `--init_from` starts a new run from their weights.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpt_ds.base.errors import CheckpointError
from gpt_ds.checkpoint.manifest import MANIFEST, Manifest
from gpt_ds.checkpoint.tags import CheckpointRef
from gpt_ds.data.tokens import STREAM

# what a resume continues from, recorded by every gpt_ds since the global stream
RESUMED_FIELDS = ("micro_batch_size", "grad_accum", "tokens", "data", "early_stop")


def check_continuable(ref: CheckpointRef) -> None:
    """Refuse to resume a checkpoint whose data stream this gpt_ds cannot continue exactly,
    naming what works on it instead. A checkpoint that passes records every RESUMED_FIELDS."""
    m = ref.manifest
    missing = [name for name in RESUMED_FIELDS if getattr(m, name) is None]
    if m.data_stream == STREAM and not missing:
        return
    found = (
        f"data_stream {m.data_stream!r}"
        if m.data_stream != STREAM
        else "no " + (", ".join(missing))
    )
    raise CheckpointError(
        f"{ref.tag_dir}: its {MANIFEST} records {found}: saved by a gpt_ds before the run's "
        "one global data stream (each rank drew its own windows), which this gpt_ds cannot "
        "continue, so --resume refuses it; start a new run from its weights with --init_from "
        f"{ref.tag_dir.parent}:{ref.tag} (the export reads it too), or resume it with the "
        "gpt_ds that saved it"
    )


@dataclass(frozen=True)
class Batch:
    world_size: int
    micro_batch_size: int
    grad_accum: int
    block_size: int

    @classmethod
    def of(cls, manifest: Manifest) -> Batch:
        """The batch a continuable checkpoint (`check_continuable`) was saved with."""
        assert manifest.micro_batch_size and manifest.grad_accum, "check_continuable first"
        return cls(
            world_size=manifest.world_size,
            micro_batch_size=manifest.micro_batch_size,
            grad_accum=manifest.grad_accum,
            block_size=int(manifest.model["block_size"]),
        )

    @property
    def sequences(self) -> int:
        return self.world_size * self.micro_batch_size * self.grad_accum

    def flags(self) -> str:
        ranks = f"{self.world_size} rank{'s' if self.world_size != 1 else ''}"
        return f"{ranks}, --micro_batch_size {self.micro_batch_size} --grad_accum {self.grad_accum}"


def changes(saved: Batch, now: Batch) -> list[str]:
    """'world size 2 -> 1' etc. for what differs."""
    pairs = [
        ("world size", saved.world_size, now.world_size),
        ("micro-batch", saved.micro_batch_size, now.micro_batch_size),
        ("gradient accumulation", saved.grad_accum, now.grad_accum),
    ]
    return [f"{name} {old} -> {new}" for name, old, new in pairs if old != new]


def batch_change_lines(manifest: Manifest, now: Batch) -> list[str]:
    """Lines describing how resuming `manifest` with `now` changes the batch ([] if it does
    not)."""
    saved = Batch.of(manifest)
    found = changes(saved, now)
    if not found:
        return []
    old_tokens, new_tokens = saved.sequences * saved.block_size, now.sequences * now.block_size
    return [
        f"resuming {manifest.tag} changes the batch: {', '.join(found)}",
        f"global batch {saved.sequences} -> {now.sequences} sequences per step "
        f"({old_tokens:,} -> {new_tokens:,} tokens); the {manifest.iteration} steps so far "
        f"saw {manifest.iteration * old_tokens:,} tokens",
        global_stream_line(saved, now),
    ]


def global_stream_line(saved: Batch, now: Batch) -> str:
    """Where the global stream goes on, in words."""
    ranks = f"{now.world_size} rank{'s' if now.world_size != 1 else ''}"
    sequences = f"{now.sequences} sequence{'s' if now.sequences != 1 else ''}"
    line = f"data: the global stream goes on where it stopped, each step its next {sequences}"
    if saved.sequences == now.sequences:
        why = "the same sequences as without the change (gradients equal to float rounding)"
    else:
        why = f"the same order of sequences, {saved.sequences} -> {now.sequences} a step"
    return f"{line} split among {ranks}: {why}"


def check_batch(manifest: Manifest, now: Batch, allowed: bool) -> list[str]:
    """`batch_change_lines` when the change is allowed or keeps every step's sequences (the
    same global batch); a CheckpointError when it is neither."""
    lines = batch_change_lines(manifest, now)
    if not lines or Batch.of(manifest).sequences == now.sequences:
        return lines
    if allowed:
        return [*lines, "--allow_batch_change: going on; this is not an exact continuation"]
    raise CheckpointError(
        "\n  ".join(lines) + "\n  a resume is exact only with the saved batch: resume with "
        f"{Batch.of(manifest).flags()}; to accept the change, pass --allow_batch_change"
    )
