"""Tagged DeepSpeed checkpoints that are never half-visible, with retention and exact resume.

Protocol (every rank calls `save`; ZeRO needs all of them):
1. every rank writes `OUT/<tag>.partial/` through `engine.save_checkpoint(save_latest=False)`,
   plus its own `gpt_ds_rank{R}.pt` (RNG states and data-sampler position: DeepSpeed saves no
   RNG state, and under ZeRO-1/2 only rank 0's client_state is kept);
2. barrier; rank 0 checks that every rank's files exist and are non-empty, writes the manifest
   `gpt_ds.json` (the run config, model shape, iteration, losses, file sizes), renames the
   directory to `OUT/<tag>` and only then rewrites `OUT/latest` (atomically);
3. barrier; rank 0 prunes old `iter_*` tags beyond `--keep_last` (never `final`, never the best).
A tag is "complete" iff its manifest exists: a kill at any moment leaves the previous
checkpoint loadable and `latest` naming it. The checkpoint directory must be on a filesystem
every node sees (DeepSpeed's own loading needs that too).
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpt_ds import dist
from gpt_ds.errors import CheckpointError

MANIFEST = "gpt_ds.json"
LATEST = "latest"
PARTIAL = ".partial"
ITER_TAG = re.compile(r"^iter_(\d+)$")


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


def read_manifest(tag_dir: Path) -> dict | None:
    try:
        return json.loads((tag_dir / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def _publish(staging: Path, final: Path) -> None:
    """Swap a finished staging directory into place (replacing a same-named old tag)."""
    old = final.with_name(final.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        os.replace(final, old)
    os.replace(staging, final)
    if old.exists():
        shutil.rmtree(old)


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


@dataclass
class Resumed:
    """What a resumed run needs besides the engine's own state."""

    tag: str
    iteration: int
    best_val_loss: float | None
    best_tag: str | None
    sampler_state: dict | None
    manifest: dict


class Checkpointer:
    """Saves and loads tagged checkpoints of one run directory (see the module docstring)."""

    def __init__(self, out_dir: str | Path, keep_last: int = 0):
        self.out_dir = Path(out_dir)
        self.keep_last = keep_last

    # ----------------------------------------------------------------- queries
    def complete_tags(self) -> list[str]:
        """Tags with a manifest, oldest first by iteration."""
        if not self.out_dir.is_dir():
            return []
        found = [
            (m.get("iteration", -1), d.name)
            for d in self.out_dir.iterdir()
            if d.is_dir() and not d.name.endswith(PARTIAL) and (m := read_manifest(d))
        ]
        return [name for _, name in sorted(found)]

    def partial_dirs(self) -> list[Path]:
        """Leftovers of interrupted saves: any `TAG.partial/` (possibly still empty), and tag
        directories holding DeepSpeed files but no manifest."""
        if not self.out_dir.is_dir():
            return []
        return sorted(
            d
            for d in self.out_dir.iterdir()
            if d.is_dir()
            and (
                d.name.endswith(PARTIAL)
                or (not (d / MANIFEST).exists() and any(d.glob("*_states.pt")))
            )
        )

    def latest_tag(self) -> str | None:
        try:
            return (self.out_dir / LATEST).read_text().strip() or None
        except OSError:
            return None

    def resolve(self, requested: str) -> str:
        """The tag to resume from: `requested`, or for 'latest' the one `latest` names.

        Falls back to the newest complete tag when `latest` is missing or names an incomplete
        one, and reports it; a requested tag that is not complete is an error listing the
        tags that are.
        """
        complete = self.complete_tags()
        for d in self.partial_dirs():
            dist.print0(f"checkpoint: ignoring incomplete checkpoint directory {d} (no manifest)")
        if requested == "latest":
            named = self.latest_tag()
            if named and named in complete:
                return named
            if not complete:
                raise CheckpointError(
                    f"--resume: no complete checkpoint in {self.out_dir} "
                    f"(looked for */{MANIFEST}); start without --resume"
                )
            dist.print0(
                f"checkpoint: 'latest' names {named!r}, which is not complete; "
                f"using the newest complete tag {complete[-1]!r}"
            )
            return complete[-1]
        if requested not in complete:
            have = ", ".join(complete) or "none"
            raise CheckpointError(
                f"--resume {requested}: no complete checkpoint with that tag in {self.out_dir} "
                f"(complete tags: {have})"
            )
        return requested

    # ----------------------------------------------------------------- save
    def save(
        self,
        engine,
        tag: str,
        *,
        iteration: int,
        sampler,
        run_config: dict,
        model_shape: dict,
        extra: dict[str, Any],
    ) -> Path:
        """Write `tag` on every rank; returns its final directory once it is complete."""
        rank, world = dist.rank(), dist.world_size()
        staging_tag = tag + PARTIAL
        staging = self.out_dir / staging_tag
        client_state = {"gpt_ds": {"iteration": iteration, "tag": tag, **extra}}
        final = self.out_dir / tag
        try:
            if rank == 0 and staging.exists():
                shutil.rmtree(staging)  # leftover of a save that was killed
            dist.barrier()
            # made here, not by DeepSpeed: its makedirs logs a failure and carries on, and the
            # error a user then sees is torch's "Parent directory ... does not exist"
            staging.mkdir(parents=True, exist_ok=True)
            engine.save_checkpoint(
                str(self.out_dir), tag=staging_tag, client_state=client_state, save_latest=False
            )
            rank_file = staging / rank_state_name(rank)
            tmp = rank_file.with_suffix(".tmp")
            torch.save({"rng": capture_rng(), "sampler": sampler.state_dict()}, tmp)
            os.replace(tmp, rank_file)
            dist.barrier()
            if rank == 0:
                files = self._verify(staging, engine.zero_optimization_stage(), world)
                manifest = {
                    "tag": tag,
                    "iteration": iteration,
                    "world_size": world,
                    "zero_stage": engine.zero_optimization_stage(),
                    "model": model_shape,
                    "config": run_config,
                    "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "files": files,
                    **extra,
                }
                _atomic_write_text(staging / MANIFEST, json.dumps(manifest, indent=2))
                _publish(staging, final)
                _atomic_write_text(self.out_dir / LATEST, tag)
                self._prune(protect={tag, extra.get("best_tag") or ""})
            dist.barrier()
        except (OSError, RuntimeError) as exc:  # disk full, permissions, I/O, a rank died
            raise self._save_failed(tag, staging, rank, exc) from exc
        return final

    def _save_failed(self, tag: str, staging: Path, rank: int, exc: Exception) -> CheckpointError:
        """Remove this rank's staging files and say what happened, in words a user can act on."""
        shutil.rmtree(staging, ignore_errors=True)
        # NCCL raises DistBackendError when a peer dies; gloo a RuntimeError from its transport
        if isinstance(exc, torch.distributed.DistBackendError) or "gloo/transport" in str(exc):
            cause = "another rank failed during the save (its error is above)"
        else:
            cause = _io_failure(self.out_dir, exc, self._last_checkpoint_bytes())
        previous = self.latest_tag()
        return CheckpointError(
            f"saving checkpoint {tag!r} to {self.out_dir} failed on rank {rank}: {cause}. "
            f"`latest` still names the previous checkpoint ({previous or 'none'}), which is "
            "intact. Free space or fix permissions, then --resume."
        )

    def _last_checkpoint_bytes(self) -> int | None:
        tags = self.complete_tags()
        manifest = read_manifest(self.out_dir / tags[-1]) if tags else None
        return sum(manifest.get("files", {}).values()) if manifest else None

    def _verify(self, staging: Path, zero_stage: int, world: int) -> dict[str, int]:
        names = expected_files(zero_stage, world)
        if zero_stage > 0:
            for r in range(world):
                hits = sorted(staging.glob(expected_optim_pattern(r)))
                names += [h.name for h in hits] or [expected_optim_pattern(r)]
        sizes, bad = {}, []
        for name in names:
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
        iters = [t for t in self.complete_tags() if ITER_TAG.match(t)]
        for tag in iters[: max(0, len(iters) - self.keep_last)]:
            if tag not in protect:
                shutil.rmtree(self.out_dir / tag, ignore_errors=True)
                dist.print0(f"checkpoint: removed {tag} (--keep_last {self.keep_last})")

    # ----------------------------------------------------------------- load
    def check_model(self, tag: str, model_shape: dict) -> dict:
        """The manifest of `tag`; a CheckpointError if it holds another model's shape.

        Cheap (reads one JSON file): the entry point calls it before any rank builds a model.
        """
        tag_dir = self.out_dir / tag
        manifest = read_manifest(tag_dir)
        if manifest is None:
            raise CheckpointError(f"{tag_dir}: not a complete checkpoint (no {MANIFEST})")
        mismatched = {
            k: (manifest["model"].get(k), v)
            for k, v in model_shape.items()
            if manifest["model"].get(k) != v
        }
        if mismatched:
            detail = ", ".join(
                f"{k}: checkpoint {a} vs run {b}" for k, (a, b) in mismatched.items()
            )
            raise CheckpointError(
                f"{tag_dir}: checkpoint is of a different model ({detail}); "
                "resume with the same --model/--n_layer/--n_head/--n_embd/--block_size"
            )
        return manifest

    def load(self, engine, tag: str, model_shape: dict) -> Resumed:
        """Restore engine (weights, optimizer, LR schedule, loss scaler), RNG and sampler state."""
        tag_dir = self.out_dir / tag
        manifest = self.check_model(tag, model_shape)
        world = dist.world_size()
        universal = bool(manifest.get("universal"))
        if not universal and manifest["world_size"] != world:
            raise CheckpointError(
                f"{tag_dir}: saved by {manifest['world_size']} ranks, this run has {world}; "
                "convert it first: python tools/universal_checkpoint.py "
                f"{self.out_dir} --tag {tag} (then --resume {tag}_universal)"
            )
        if not universal and manifest["zero_stage"] != engine.zero_optimization_stage():
            raise CheckpointError(
                f"{tag_dir}: saved with ZeRO stage {manifest['zero_stage']}, this run uses "
                f"{engine.zero_optimization_stage()}; use the same --deepspeed_config preset"
            )
        path, _client = engine.load_checkpoint(
            str(self.out_dir), tag=tag, load_optimizer_states=True, load_lr_scheduler_states=True
        )
        if path is None:
            raise CheckpointError(f"{tag_dir}: DeepSpeed could not load this checkpoint")
        rank_file = tag_dir / rank_state_name(dist.rank())
        if rank_file.exists():
            state = torch.load(rank_file, weights_only=False)
            restore_rng(state["rng"])
        else:  # a universal checkpoint on another world size: ranks' streams start afresh
            state = torch.load(tag_dir / rank_state_name(0), weights_only=False)
            state["sampler"]["rank"] = dist.rank()
            seed = int(manifest["config"]["seed"]) + 1000 * dist.rank() + int(manifest["iteration"])
            torch.manual_seed(seed)
            np.random.seed(seed % 2**32)
            random.seed(seed)
        return Resumed(
            tag=tag,
            iteration=int(manifest["iteration"]),
            best_val_loss=manifest.get("best_val_loss"),
            best_tag=manifest.get("best_tag"),
            sampler_state=state["sampler"],
            manifest=manifest,
        )


# Manifest fields that identify the checkpoint a universal conversion was made from.
_SOURCE_IDENTITY = ("iteration", "world_size", "zero_stage", "saved_at", "files")


def universal_tag(tag: str) -> str:
    return f"{tag}_universal"


def convert_to_universal(out_dir: str | Path, tag: str) -> str:
    """Convert a complete tag with DeepSpeed's `ds_to_universal`, for another world size.

    The result `<tag>_universal` is published like any checkpoint (staging directory, then a
    manifest marked `"universal": true`) and carries rank 0's sampler position. Returns its tag.
    Runs in one process (rank 0, or by hand through tools/universal_checkpoint.py).
    """
    out_dir = Path(out_dir)
    src, dst_tag = out_dir / tag, universal_tag(tag)
    dst = out_dir / dst_tag
    manifest = read_manifest(src)
    if manifest is None:
        raise CheckpointError(f"{src}: not a complete checkpoint (no {MANIFEST})")
    if manifest.get("universal"):
        return tag
    existing = read_manifest(dst)
    if existing and all(existing.get(k) == manifest.get(k) for k in _SOURCE_IDENTITY):
        return dst_tag
    # none yet, or one made from an older checkpoint of the same name (`final` is rewritten
    # by every run that ends): convert again
    staging = out_dir / (dst_tag + PARTIAL)
    shutil.rmtree(staging, ignore_errors=True)
    cmd = [
        sys.executable,
        "-m",
        "deepspeed.checkpoint.ds_to_universal",
        "--input_folder",
        str(src),
        "--output_folder",
        str(staging),
        "--num_extract_workers",
        "1",
        "--num_merge_workers",
        "1",
    ]
    if manifest["zero_stage"] < 3:  # ZeRO-1/2 files lack the info block; injected in memory
        cmd.append("--inject_missing_state")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        raise CheckpointError(
            f"ds_to_universal failed on {src} (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
        )
    shutil.copy2(src / rank_state_name(0), staging / rank_state_name(0))
    universal = {**manifest, "tag": dst_tag, "universal": True, "source_tag": tag}
    _atomic_write_text(staging / MANIFEST, json.dumps(universal, indent=2))
    _publish(staging, dst)
    (out_dir / "latest_universal").unlink(missing_ok=True)  # ds_to_universal's own pointer
    return dst_tag
