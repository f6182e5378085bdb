"""What a resume changes about the batch, said before training, refused unless allowed.

Runs draw their windows from one global stream (data.TrainWindows): each step takes the next
global batch of sequences, split among the ranks. A resume with the same global batch on any
world size, micro-batch or accumulation trains on the same sequences in the same order, its
gradients summed in another order: equal to float rounding, not bit-identical. That is said and
allowed. A changed global batch changes the sequences and tokens per step: refused without
--allow_batch_change.

Checkpoints of gpt_ds before the global stream keep their per-rank streams (the manifest's
`data_stream` is absent): there another world size drops or adds streams, and any change needs
--allow_batch_change. A new split of the same per-rank batch (micro-batch 4 x accumulation 2 ->
8 x 1) keeps every step's sequences there too, equal to float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpt_ds.base.errors import CheckpointError
from gpt_ds.checkpoint.manifest import Manifest


@dataclass(frozen=True)
class Batch:
    world_size: int
    micro_batch_size: int | None  # None: not recorded (a checkpoint of an older gpt_ds)
    grad_accum: int | None
    block_size: int

    @classmethod
    def of(cls, manifest: Manifest) -> Batch:
        return cls(
            world_size=manifest.world_size,
            micro_batch_size=manifest.micro_batch_size,
            grad_accum=manifest.grad_accum,
            block_size=int(manifest.model["block_size"]),
        )

    @property
    def sequences(self) -> int | None:
        if self.micro_batch_size is None or self.grad_accum is None:
            return None
        return self.world_size * self.micro_batch_size * self.grad_accum

    def flags(self) -> str:
        ranks = f"{self.world_size} rank{'s' if self.world_size != 1 else ''}"
        return f"{ranks}, --micro_batch_size {self.micro_batch_size} --grad_accum {self.grad_accum}"


def _changed(name: str, old, new) -> str | None:
    return None if old is None or old == new else f"{name} {old} -> {new}"


def changes(saved: Batch, now: Batch) -> list[str]:
    """'world size 2 -> 1' etc. for what differs (unrecorded values are not compared)."""
    found = [
        _changed("world size", saved.world_size, now.world_size),
        _changed("micro-batch", saved.micro_batch_size, now.micro_batch_size),
        _changed("gradient accumulation", saved.grad_accum, now.grad_accum),
    ]
    return [c for c in found if c]


def _ranks(first: int, last: int) -> str:
    return f"rank {first}" if first == last else f"ranks {first}-{last}"


def data_position(saved: Batch, now: Batch, iteration: int) -> str:
    """Where each rank's stream of training windows goes on, in words."""
    kept = min(saved.world_size, now.world_size)
    verb = "continues its sample stream" if kept == 1 else "continue their sample streams"
    line = f"data: {_ranks(0, kept - 1)} {verb} after {_drawn(saved, iteration)}"
    if now.world_size > saved.world_size:
        verb = "starts a new stream" if now.world_size == saved.world_size + 1 else "start new ones"
        line += f"; {_ranks(saved.world_size, now.world_size - 1)} {verb}"
    elif now.world_size < saved.world_size:
        gone = _ranks(now.world_size, saved.world_size - 1)
        line += f"; the sample streams of {gone} end here"
    split = (saved.micro_batch_size, saved.grad_accum) != (now.micro_batch_size, now.grad_accum)
    if split and _per_rank(saved) is not None and _per_rank(saved) == _per_rank(now):
        line += (
            f" (each rank's step keeps its {_per_rank(now)} sequences, split into other "
            "micro-batches: equal to float rounding)"
        )
    return line


def _per_rank(batch: Batch) -> int | None:
    """Sequences one rank draws per step (None: not recorded)."""
    if batch.micro_batch_size is None or batch.grad_accum is None:
        return None
    return batch.micro_batch_size * batch.grad_accum


def _drawn(saved: Batch, iteration: int) -> str:
    """How far each rank's stream is at `iteration` of the saved batch."""
    per_rank = _per_rank(saved)
    if per_rank is None:
        return f"{iteration} steps"
    return f"{iteration * per_rank} sequences"


def migrated_windows_state(state: dict, manifest: Manifest, micro_batch_now: int) -> dict:
    """A rank file's training-window state in today's layout (`stream`, `sequences`), the
    rank file's side of manifest.migrate. Older gpt_ds saved no `stream` (each rank had its
    own), and before the per-sequence stream a `position` in micro-batches: it continues after
    position x the checkpoint's micro-batch (else this run's) sequences, as far along the stream
    as the old run had drawn but not the windows the old code would have drawn next."""
    new = {"stream": "per_rank", **state}
    if "sequences" not in new:
        micro = manifest.micro_batch_size or micro_batch_now
        new["sequences"] = int(new.pop("position")) * int(micro)
    return new


def batch_change_lines(manifest: Manifest, now: Batch) -> list[str]:
    """Lines describing how resuming `manifest` with `now` changes the batch ([] if it does
    not)."""
    saved = Batch.of(manifest)
    found = changes(saved, now)
    if not found:
        return []
    lines = [f"resuming {manifest.tag} changes the batch: {', '.join(found)}"]
    assert now.sequences is not None, "this run's own batch is always known"
    if saved.sequences is not None:
        old_tokens, new_tokens = saved.sequences * saved.block_size, now.sequences * now.block_size
        lines.append(
            f"global batch {saved.sequences} -> {now.sequences} sequences per step "
            f"({old_tokens:,} -> {new_tokens:,} tokens); the {manifest.iteration} steps so far "
            f"saw {manifest.iteration * old_tokens:,} tokens"
        )
    if manifest.data_stream == "global":
        lines.append(global_stream_line(saved, now))
    else:
        lines.append(data_position(saved, now, manifest.iteration))
    return lines


def same_sequences(manifest: Manifest, now: Batch) -> bool:
    """Whether resuming `manifest` with `now` trains every step on the same sequences: the
    global stream with the same global batch."""
    return manifest.data_stream == "global" and Batch.of(manifest).sequences == now.sequences


def global_stream_line(saved: Batch, now: Batch) -> str:
    """Where the global stream goes on, in words."""
    ranks = f"{now.world_size} rank{'s' if now.world_size != 1 else ''}"
    line = f"data: the global stream goes on where it stopped, each step its next {now.sequences}"
    if saved.sequences == now.sequences:
        why = "the same sequences as without the change (gradients equal to float rounding)"
    else:
        why = f"the same order of sequences, {saved.sequences} -> {now.sequences} a step"
    return f"{line} sequences split among {ranks}: {why}"


def check_batch(manifest: Manifest, now: Batch, allowed: bool) -> list[str]:
    """`batch_change_lines` when the change is allowed or keeps every step's sequences; a
    CheckpointError when it is neither."""
    lines = batch_change_lines(manifest, now)
    if not lines:
        return []
    if same_sequences(manifest, now):
        return lines
    if allowed:
        return [*lines, "--allow_batch_change: going on; this is not an exact continuation"]
    saved = Batch.of(manifest)
    keep = f"resume with {saved.flags()}" if saved.sequences else "resume with the same batch"
    raise CheckpointError(
        "\n  ".join(lines) + f"\n  a resume is exact only with the saved batch: {keep}; to "
        "accept the change, pass --allow_batch_change"
    )
