"""Tagged DeepSpeed checkpoints that are never half-visible, with retention and exact resume.

Protocol (every rank calls `save`; ZeRO needs all of them):
1. every rank writes `OUT/<tag>.partial/` through `engine.save_checkpoint(save_latest=False)`,
   plus its own `gpt_ds_rank{R}.pt` (RNG states and training-window position: DeepSpeed saves no
   RNG state, and under ZeRO-1/2 only rank 0's client_state is kept);
2. every rank hashes the files it wrote (integrity.py) and the digests are gathered; rank 0
   checks that every rank's files exist and are non-empty, writes the manifest `gpt_ds.json`
   (manifest.py: the run config, model shape, iteration, losses, file sizes and checksums),
   renames the directory to `OUT/<tag>` and only then rewrites `OUT/latest` (atomically);
3. barrier; rank 0 prunes old `iter_*` tags beyond `--keep_last` (never `final`, never the best).
A tag is "complete" iff its manifest exists: a kill at any moment leaves the previous
checkpoint loadable and `latest` naming it. The checkpoint directory must be on a filesystem
every node sees: rank 0 checks every rank's files before publishing, and DeepSpeed's own
loading reads other ranks' files too.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import random
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpt_ds.base import dist, logs
from gpt_ds.base.cli import tool
from gpt_ds.base.errors import CheckpointError
from gpt_ds.checkpoint.integrity import (
    ALGORITHM,
    checksum_problems,
    digests_of,
    share,
    writer_rank,
)
from gpt_ds.checkpoint.manifest import Manifest
from gpt_ds.checkpoint.tags import (
    ITER_TAG,
    PARTIAL,
    CheckpointRef,
    complete_tags,
    latest_tag,
    write_latest,
)

# the rank file's key for the training windows' state: the file key keeps its old name
# ("sampler"), so checkpoints saved before the rename still load
WINDOWS_KEY = "sampler"


def rank_state_name(rank: int) -> str:
    return f"gpt_ds_rank{rank}.pt"


def expected_files(zero_stage: int, world_size: int) -> list[str]:
    """The files DeepSpeed 0.19 writes for a data-parallel run (no tensor/pipeline parallel)."""
    names = [rank_state_name(r) for r in range(world_size)]
    if zero_stage == 3:
        names += [f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in range(world_size)]
    else:
        names.append("mp_rank_00_model_states.pt")
    return names


def expected_optim_pattern(rank: int) -> str:
    # "zero_pp_rank_R_..." or "bf16_zero_pp_rank_R_..." depending on precision
    return f"*zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"


def checkpoint_files(tag_dir: Path, zero_stage: int, world_size: int) -> list[str]:
    """Every file a checkpoint of this run must hold; a rank's optimizer shard is its glob
    pattern while no such file exists (its name depends on the precision)."""
    names = expected_files(zero_stage, world_size)
    if zero_stage > 0:
        for r in range(world_size):
            hits = sorted(tag_dir.glob(expected_optim_pattern(r)))
            names += [h.name for h in hits] or [expected_optim_pattern(r)]
    return names


def publish(staging: Path, final: Path) -> None:
    """Swap a finished staging directory into place (replacing a same-named old tag)."""
    old = final.with_name(final.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        os.replace(final, old)
    os.replace(staging, final)
    if old.exists():
        shutil.rmtree(old)


# How torch's zip writer (caffe2/serialize/inline_container.cc, torch 2.13) reports a failed
# write: a RuntimeError without errno. A full disk (measured on a full tmpfs): "[enforce fail at
# inline_container.cc:672] . unexpected pos N vs M" (a short write), or, once nothing fits, its
# C++ stream's "basic_ios::clear: iostream error"; miniz's "PytorchStreamWriter failed writing
# file ...: file write failed"; a file it cannot create: "[enforce fail at
# inline_container.cc:747] . open file failed with strerror: Permission denied", or, its
# directory gone, "Parent directory ... does not exist."
TORCH_WRITE_FAILURES = (
    "unexpected pos",
    "basic_ios::clear",
    "PytorchStreamWriter failed",
    "file write failed",
    "open file failed",
    "Parent directory",
)


def is_disk_error(exc: BaseException) -> bool:
    """An OSError, or torch's writer failing to write (TORCH_WRITE_FAILURES)."""
    if isinstance(exc, OSError):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in TORCH_WRITE_FAILURES)


def is_peer_failure(exc: BaseException) -> bool:
    """A collective that failed because another rank died: torch.distributed's own errors
    (NCCL's DistBackendError, a lost store), or a RuntimeError from gloo's transport."""
    return isinstance(exc, torch.distributed.DistError) or "gloo/transport" in str(exc)


def _io_failure(out_dir: Path, exc: Exception, checkpoint_bytes: int | None) -> str:
    """`exc` of a failed write, with the free space where it happened (torch's writer reports
    a full disk as "unexpected pos ...", without errno)."""
    reason = (exc.strerror if isinstance(exc, OSError) else None) or str(exc).strip()
    if isinstance(exc, OSError) and exc.strerror and exc.filename:
        reason = f"{exc.strerror}: {exc.filename}"
    reason = reason.splitlines()[0] if reason else type(exc).__name__
    try:
        free = shutil.disk_usage(out_dir).free
    except OSError:
        return reason
    full = (isinstance(exc, OSError) and exc.errno == errno.ENOSPC) or (
        checkpoint_bytes is not None and free < checkpoint_bytes
    )
    need = f", a checkpoint needs {checkpoint_bytes / 2**20:.1f} MiB" if checkpoint_bytes else ""
    space = f"{free / 2**20:.1f} MiB free on that filesystem{need}"
    return f"no space left on the device ({space}; {reason})" if full else f"{reason} ({space})"


def capture_rng() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def reseed(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


def check_model(ref: CheckpointRef, model_shape: dict) -> None:
    """A CheckpointError if `ref` holds another model's shape. Cheap (the manifest only): the
    entry point calls it before any rank builds a model."""
    saved = ref.manifest.model
    mismatched = {k: (saved.get(k), v) for k, v in model_shape.items() if saved.get(k) != v}
    if mismatched:
        detail = ", ".join(f"{k}: checkpoint {a} vs run {b}" for k, (a, b) in mismatched.items())
        raise CheckpointError(
            f"{ref.tag_dir}: checkpoint is of a different model ({detail}); "
            "resume with the same --model/--n_layer/--n_head/--n_embd/--block_size, or start a "
            f"new run from its weights: --init_from {ref.out_dir}:{ref.tag} --out_dir NEW_DIR"
        )


def check_same_data(ref: CheckpointRef, identity: dict[str, Any]) -> None:
    """A CheckpointError when `--resume` names a checkpoint trained on other data (`identity`:
    mixture.DataMix.identity, split sizes and input checksums, so moving a folder changes
    nothing; a mixture's names and weights too): resuming continues the same run (its
    training-window positions index that data); new data is a new run."""
    saved = ref.manifest.data
    assert saved is not None, "batch.check_continuable refuses a checkpoint without it"
    if saved == identity:
        return
    detail = ", ".join(
        f"{k}: checkpoint {saved.get(k)} vs --data_dir {identity.get(k)}"
        for k in ("train_tokens", "val_tokens")
        if saved.get(k) != identity.get(k)
    )
    raise CheckpointError(
        f"{ref.tag_dir}: checkpoint was trained on other data ({detail or 'other sources'}); "
        "--resume continues a run on its own data. To train these weights on new data start "
        f"a new run: --init_from {ref.out_dir}:{ref.tag} --out_dir NEW_DIR"
    )


def damaged_files(ref: CheckpointRef) -> list[str]:
    """What is damaged in `ref`, on every rank: each rank verifies the checksums of its share
    of the files (sizes were checked when the tag was resolved)."""
    mine = share(ref.manifest.files, dist.rank(), dist.world_size())
    found = dist.gather_objects(checksum_problems(ref.tag_dir, ref.manifest, mine))
    return sorted(p for part in found for p in part)


@dataclass(kw_only=True)
class Resumed:
    """What a resumed run needs besides the engine's own state."""

    tag: str
    iteration: int
    best_val_loss: float | None
    best_tag: str | None
    train_windows_state: dict
    manifest: Manifest


class Checkpointer:
    """Saves and loads tagged checkpoints of one run directory (see the module docstring)."""

    def __init__(self, out_dir: str | Path, keep_last: int = 0):
        self.out_dir = Path(out_dir)
        self.keep_last = keep_last

    # ----------------------------------------------------------------- save
    def save(self, engine, train_windows, manifest: Manifest) -> Path:
        """Write `manifest.tag` on every rank; returns its directory once it is complete.

        `manifest` says what to record; its `files` are filled in here, once verified.
        """
        rank, tag = dist.rank(), manifest.tag
        staging = self.out_dir / (tag + PARTIAL)
        try:
            if rank == 0 and staging.exists():
                shutil.rmtree(staging)  # leftover of a save that was killed
            dist.barrier()
            self._write_rank_files(engine, train_windows, staging)
            digests = self._own_digests(staging, engine.zero_optimization_stage())
            merged = {k: v for part in dist.gather_objects(digests) for k, v in part.items()}
            if rank == 0:
                self._publish(engine, dataclasses.replace(manifest, checksums=merged), staging)
            dist.barrier()
        except Exception as exc:
            shutil.rmtree(staging, ignore_errors=True)
            if not (is_disk_error(exc) or is_peer_failure(exc)):
                raise  # a bug (CUDA, DeepSpeed, ours): its own type, message and traceback
            raise self._save_failed(tag, rank, exc) from exc
        return self.out_dir / tag

    def _write_rank_files(self, engine, train_windows, staging: Path) -> None:
        # made here, not by DeepSpeed: its makedirs logs a failure and carries on, and the
        # error a user then sees is torch's "Parent directory ... does not exist"
        staging.mkdir(parents=True, exist_ok=True)
        # no client_state: the manifest holds gpt_ds's state, and the rank file what DeepSpeed
        # keeps of rank 0 only
        engine.save_checkpoint(str(self.out_dir), tag=staging.name, save_latest=False)
        rank_file = staging / rank_state_name(dist.rank())
        tmp = rank_file.with_suffix(".tmp")
        torch.save({"rng": capture_rng(), WINDOWS_KEY: train_windows.state_dict()}, tmp)
        os.replace(tmp, rank_file)

    def _own_digests(self, staging: Path, zero_stage: int) -> dict[str, str]:
        """Checksums of the files this rank wrote (still in the page cache)."""
        names = checkpoint_files(staging, zero_stage, dist.world_size())
        mine = [n for n in names if writer_rank(n) == dist.rank() and (staging / n).is_file()]
        return digests_of(staging, mine)

    def _publish(self, engine, manifest: Manifest, staging: Path) -> None:
        """Rank 0: verify every rank's files, write the manifest, swap in, move `latest`."""
        files = self._verify(staging, engine.zero_optimization_stage(), manifest.world_size)
        unhashed = [n for n in files if n not in manifest.checksums]  # none unless a new layout
        checksums = {**manifest.checksums, **digests_of(staging, unhashed)}
        checksums = {n: checksums[n] for n in files}
        dataclasses.replace(
            manifest, files=files, checksums=checksums, checksum_algorithm=ALGORITHM
        ).write(staging)
        publish(staging, self.out_dir / manifest.tag)
        write_latest(self.out_dir, manifest.tag)
        self._prune(protect={manifest.tag, manifest.best_tag or ""})

    def _save_failed(self, tag: str, rank: int, exc: Exception) -> CheckpointError:
        """A disk error or a dead peer (`exc`), in words a user can act on."""
        if is_peer_failure(exc):
            cause = "another rank failed during the save (its error is above)"
            advice = "Fix what stopped that rank, then --resume."
        else:
            cause = _io_failure(self.out_dir, exc, self._last_checkpoint_bytes())
            advice = "Free space or fix permissions, then --resume."
        previous = latest_tag(self.out_dir)
        return CheckpointError(
            f"saving checkpoint {tag!r} to {self.out_dir} failed on rank {rank}: {cause}. "
            f"`latest` still names the previous checkpoint ({previous or 'none'}), which is "
            f"intact. {advice}"
        )

    def _last_checkpoint_bytes(self) -> int | None:
        tags = complete_tags(self.out_dir)
        manifest = Manifest.read(self.out_dir / tags[-1]) if tags else None
        return sum(manifest.files.values()) if manifest else None

    def _verify(self, staging: Path, zero_stage: int, world: int) -> dict[str, int]:
        sizes, bad = {}, []
        for name in checkpoint_files(staging, zero_stage, world):
            p = staging / name
            size = p.stat().st_size if p.exists() else 0
            if size == 0:
                bad.append(name)
            sizes[name] = size
        if bad:
            raise CheckpointError(
                f"checkpoint {staging} is incomplete after saving (missing or empty: "
                f"{', '.join(bad)}); the previous checkpoint is untouched"
            )
        return sizes

    def _prune(self, protect: set[str]) -> None:
        if self.keep_last <= 0:
            return
        iters = [t for t in complete_tags(self.out_dir) if ITER_TAG.match(t)]
        for tag in iters[: max(0, len(iters) - self.keep_last)]:
            if tag not in protect:
                self._remove(tag)

    def _remove(self, tag: str) -> None:
        """Rank 0: delete an old tag; a failure is a warning (the save itself succeeded)."""
        try:
            shutil.rmtree(self.out_dir / tag)
        except OSError as exc:
            where = f"{self.out_dir / tag} (--keep_last {self.keep_last})"
            logs.whole_line(f"warning: could not remove {where}: {exc}", sys.stderr)
            return
        dist.print0(f"checkpoint: removed {tag} (--keep_last {self.keep_last})")

    # ----------------------------------------------------------------- load
    def load(self, engine, ref: CheckpointRef) -> Resumed:
        """Restore engine (weights, optimizer, LR schedule, loss scaler), RNG and training-window
        state. The plan checked the checkpoint against the run before any engine existed
        (run/plan.py `check_resume`: its ZeRO stage, batch and data)."""
        manifest, world = ref.manifest, dist.world_size()
        if not manifest.universal and manifest.world_size != world:
            raise CheckpointError(
                f"{ref.tag_dir}: saved by {manifest.world_size} ranks, this run has {world}; "
                f"convert it first: {tool('universal_checkpoint')} "
                f"{self.out_dir} --tag {ref.tag} (then --resume {ref.tag}_universal)"
            )
        decays = _group_weight_decays(engine)
        path, _client = engine.load_checkpoint(
            str(self.out_dir),
            tag=ref.tag,
            load_optimizer_states=True,
            load_lr_scheduler_states=True,
        )
        if path is None:
            raise CheckpointError(f"{ref.tag_dir}: DeepSpeed could not load this checkpoint")
        if manifest.universal:
            _repair_universal_load(engine, decays)
        return Resumed(
            tag=ref.tag,
            iteration=manifest.iteration,
            best_val_loss=manifest.best_val_loss,
            best_tag=manifest.best_tag,
            train_windows_state=self._load_rank_state(ref),
            manifest=manifest,
        )

    def _load_rank_state(self, ref: CheckpointRef) -> dict:
        """Restore this rank's RNG streams; returns its training-window state."""
        rank_file = ref.tag_dir / rank_state_name(dist.rank())
        if rank_file.exists():
            state = torch.load(rank_file, weights_only=False)
            restore_rng(state["rng"])
            return state[WINDOWS_KEY]
        # a universal checkpoint on another world size: the ranks' streams start afresh
        state = torch.load(ref.tag_dir / rank_state_name(0), weights_only=False)
        state[WINDOWS_KEY]["rank"] = dist.rank()
        seed = int(ref.manifest.config["seed"]) + 1000 * dist.rank() + ref.manifest.iteration
        reseed(seed)
        return state[WINDOWS_KEY]


def _group_weight_decays(engine) -> list[float]:
    """Each optimizer param group's weight decay, as the run configured them."""
    return [group["weight_decay"] for group in _inner_optimizer(engine).param_groups]


def _repair_universal_load(engine, decays: list[float]) -> None:
    """Undo what DeepSpeed 0.19's ZeRO-3 universal load gets wrong (stage3.py
    `load_hp_checkpoint_state_from_checkpoint_dir_stage3`; ZeRO-1/2 load right):

    - it gives every param group the first group's hyperparameters: biases and LayerNorm gains,
      gpt_ds's second group, would be weight-decayed from then on;
    - it hands every sub-group's optimizer state the *same* `step` tensor, and ZeRO-3 steps
      torch's AdamW once per sub-group, each `step += 1` in place (DeepSpeed's FusedAdam keeps
      an int, unaffected): the second group would see step n+1, n+3, ... and its bias
      correction drift (measured: a 2 -> 1 -> 2 resize was 5e-3 off in loss by the third step;
      repaired, bit-identical to the uninterrupted run)."""
    inner = _inner_optimizer(engine)
    for group, decay in zip(inner.param_groups, decays, strict=True):
        group["weight_decay"] = decay
    for state in inner.state.values():
        if torch.is_tensor(state.get("step")):
            state["step"] = state["step"].clone()


def _inner_optimizer(engine) -> torch.optim.Optimizer:
    """The torch optimizer under DeepSpeed's ZeRO wrapper (its param groups and state)."""
    optimizer = engine.optimizer
    return getattr(optimizer, "optimizer", optimizer)
