"""Errors keep their cause: a checkpoint save gives disk advice only for disk errors (torch's
writer's own messages included) and names a dead peer as such; anything else (a bug in a save)
is re-raised as itself, with its traceback, the previous checkpoint intact. A tag `--keep_last`
cannot remove is a warning naming it and the OS error. A bug while rank 0 exports
`--init_from` weights is raised as itself."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from harness.launch import run_python
from support.launch import free_port, launch_env, remove_shm_buffers

from gpt_ds.base.errors import CheckpointError
from gpt_ds.checkpoint.checkpointer import Checkpointer, is_disk_error, is_peer_failure
from gpt_ds.checkpoint.manifest import Manifest
from gpt_ds.checkpoint.tags import CheckpointRef, complete_tags
from gpt_ds.run.init_source import InitSource
from gpt_ds.training import engine_build

SHAPE = {"n_layer": 2, "n_head": 2, "n_embd": 64, "block_size": 32, "vocab_size": 50257}


def torch_save_error(path: str, numel: int) -> RuntimeError:
    """What torch.save raises writing `numel` floats to `path`."""
    with pytest.raises(RuntimeError) as info:
        torch.save({"x": torch.zeros(numel)}, path)
    return info.value


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
@pytest.mark.parametrize("numel", [10, 1_000_000])
def test_torch_writers_full_disk_is_a_disk_error(numel):
    """/dev/full: every write fails with ENOSPC, and torch's zip writer says so in words (a
    small file fails as the C++ stream's flush, a large one as "unexpected pos")."""
    exc = torch_save_error("/dev/full", numel)
    assert is_disk_error(exc), exc
    assert not is_peer_failure(exc)


@pytest.mark.parametrize("where", ["missing directory", "/proc"])
def test_a_file_torch_cannot_create_is_a_disk_error(where, tmp_path):
    path = tmp_path / "missing" / "x.pt" if where == "missing directory" else "/proc/x.pt"
    exc = torch_save_error(str(path), 10)
    assert is_disk_error(exc), exc
    assert is_disk_error(OSError(28, "No space left on device"))


def test_a_bug_is_neither_a_disk_error_nor_a_dead_peer():
    for exc in (
        RuntimeError("CUDA error: an illegal memory access was encountered"),
        RuntimeError("Can not pickle torch.futures.Future"),
        ValueError("bad value"),
    ):
        assert not is_disk_error(exc) and not is_peer_failure(exc), exc
    assert is_peer_failure(torch.distributed.DistBackendError("NCCL communicator was aborted"))
    peer = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed")
    assert is_peer_failure(peer) and not is_disk_error(peer)


# ------------------------------------------------------------------------------- a bug in a save
FAILING_SAVE = '''
"""Save iter_2 through a real DeepSpeed engine, then iter_4 of a model whose extra state holds a
pending torch.futures.Future (it cannot be pickled: a RuntimeError that is not I/O)."""
import sys

import deepspeed
import numpy as np
import torch

from gpt_ds.base import dist
from gpt_ds.checkpoint.manifest import Manifest
from gpt_ds.checkpoint.checkpointer import Checkpointer, is_disk_error, is_peer_failure
from gpt_ds.data.tokens import GlobalSplit, TrainWindows
from gpt_ds.dsconfig.resolve import resolve_ds_config
from gpt_ds.dsconfig.settings import RunSettings
from gpt_ds.dsconfig.schema import load_ds_config, preset_path
from gpt_ds.launch.machine import probe_machine


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.pending = None  # an async handle, saved with the module's state

    def forward(self, x):
        return self.linear(x)

    def get_extra_state(self):
        return {"pending": self.pending}

    def set_extra_state(self, state):
        self.pending = state["pending"]


out = sys.argv[1]
dist.init()
model = Model()
run = RunSettings(world_size=1, decay_iters=4, micro_batch_size=2, precision="fp32")
resolved = resolve_ds_config(
    load_ds_config(preset_path("zero1")), run, source="zero1", facts=probe_machine()
)
engine, *_ = deepspeed.initialize(
    model=model, model_parameters=model.parameters(), config=resolved.config
)
windows = TrainWindows(np.arange(1000, dtype=np.uint16), 8, 2, 1, 0, GlobalSplit(1, 1))
checkpointer = Checkpointer(out)
shape = {"n_layer": 1, "n_head": 1, "n_embd": 8, "block_size": 8, "vocab_size": 8}


def manifest(tag, iteration):
    return Manifest(
        tag=tag, iteration=iteration, world_size=1, zero_stage=1, model=shape,
        config={"seed": 1}, files={},
    )


checkpointer.save(engine, windows, manifest("iter_2", 2))
print("saved iter_2", flush=True)
model.pending = torch.futures.Future()
try:
    checkpointer.save(engine, windows, manifest("iter_4", 4))
finally:
    dist.shutdown()
'''


@pytest.mark.slow
def test_a_bug_during_a_save_is_raised_as_itself_and_keeps_the_previous_checkpoint(tmp_path):
    """A RuntimeError that is not I/O, raised inside DeepSpeed's save_checkpoint by torch's
    pickler, reaches the user as itself with its traceback (not as disk advice); the staging
    directory is gone and iter_2 stays `latest`, complete."""
    script = tmp_path / "failing_save.py"
    script.write_text(FAILING_SAVE)
    out = tmp_path / "run"
    port = free_port()
    env = launch_env()
    env.pop("RANK", None)
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        proc = run_python([str(script), str(out)], timeout=600, check=False, env=env)
    finally:
        remove_shm_buffers("127.0.0.1", port)
    detail = f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    assert proc.returncode == 1 and "saved iter_2" in proc.stdout, detail
    err = proc.stderr
    assert err.rstrip().endswith("RuntimeError: Can not pickle torch.futures.Future"), detail
    assert "Traceback" in err and "checkpointer.py" in err and "serialization.py" in err
    assert "CheckpointError" not in err and "Free space" not in err
    assert (out / "latest").read_text().strip() == "iter_2"
    assert complete_tags(out) == ["iter_2"]
    assert not list(out.glob("iter_4*"))  # this rank's staging directory removed


# ------------------------------------------------------------------------------ pruning
def make_tag(out: Path, tag: str, iteration: int) -> Path:
    d = out / tag
    d.mkdir(parents=True)
    (d / "mp_rank_00_model_states.pt").write_bytes(b"0123456789")
    Manifest(
        tag=tag,
        iteration=iteration,
        world_size=1,
        zero_stage=2,
        model=SHAPE,
        config={"seed": 1},
        files={"mp_rank_00_model_states.pt": 10},
    ).write(d)
    return d


def test_a_tag_that_cannot_be_pruned_is_a_warning_naming_it(tmp_path, capsys):
    """--keep_last 1 with iter_2 a symbolic link (to a directory elsewhere, which rmtree
    refuses to follow): one warning naming the tag and the error; iter_4 is still pruned."""
    out = tmp_path / "run"
    elsewhere = make_tag(tmp_path / "other_disk", "iter_2", 2)
    out.mkdir()
    (out / "iter_2").symlink_to(elsewhere, target_is_directory=True)
    make_tag(out, "iter_4", 4)
    make_tag(out, "iter_6", 6)
    Checkpointer(out, keep_last=1)._prune(protect={"iter_6"})
    captured = capsys.readouterr()
    warnings = [line for line in captured.err.splitlines() if line.startswith("warning:")]
    assert warnings == [
        f"warning: could not remove {out / 'iter_2'} (--keep_last 1): "
        "Cannot call rmtree on a symbolic link"
    ], captured
    assert "checkpoint: removed iter_4 (--keep_last 1)" in captured.out
    assert complete_tags(out) == ["iter_2", "iter_6"]


# ------------------------------------------------------------------------------ --init_from
def init_source(tmp_path: Path) -> InitSource:
    out = tmp_path / "earlier"
    make_tag(out, "final", 4)
    ref = CheckpointRef(out, "final", Manifest.read(out / "final"))
    return InitSource(str(out), ref)


def test_a_bug_while_exporting_init_from_weights_is_raised_as_itself(tmp_path, monkeypatch):
    """Rank 0 re-raises what broke the export (the other ranks, told through the gather, raise
    a CheckpointError pointing to it); a checkpoint or disk problem stays a message."""

    def broken_export(ref, out_dir, log=None):
        return hashlib.sha256(ref.tag_dir)  # a bug: a Path is not bytes

    monkeypatch.setattr(engine_build, "export_for_loading", broken_export)
    with pytest.raises(TypeError) as info:
        engine_build._weights_path(init_source(tmp_path), str(tmp_path / "new"))
    assert info.traceback[-1].name == "broken_export"

    def refused_export(ref, out_dir, log=None):
        raise CheckpointError(f"{ref.tag_dir}: checksum mismatch")

    monkeypatch.setattr(engine_build, "export_for_loading", refused_export)
    with pytest.raises(CheckpointError, match=r"--init_from .*: CheckpointError: .* mismatch"):
        engine_build._weights_path(init_source(tmp_path / "b"), str(tmp_path / "new"))


TWO_RANK_EXPORT = """
import hashlib
import sys
from pathlib import Path

from gpt_ds.base import dist
from gpt_ds.checkpoint.manifest import Manifest
from gpt_ds.checkpoint.tags import CheckpointRef
from gpt_ds.run.init_source import InitSource
from gpt_ds.training import engine_build


def broken_export(ref, out_dir, log=None):
    return hashlib.sha256(ref.tag_dir)  # a bug: a Path is not bytes


engine_build.export_for_loading = broken_export
out = Path(sys.argv[1])
dist.init()
try:
    ref = CheckpointRef(out, "final", Manifest.read(out / "final"))
    engine_build._weights_path(InitSource(str(out), ref), str(out.parent / "new"))
finally:
    dist.shutdown()
"""


@pytest.mark.slow
def test_on_two_ranks_rank_0_raises_the_bug_and_rank_1_points_to_it(tmp_path):
    source = init_source(tmp_path).value
    script = tmp_path / "export.py"
    script.write_text(TWO_RANK_EXPORT)
    port = free_port()
    procs = []
    for rank in (0, 1):
        env = launch_env()
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank))
        env.update(LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
        cmd = [sys.executable, str(script), source]
        procs.append(subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True))
    try:
        errs = [p.communicate(timeout=300)[1] for p in procs]
    finally:
        for p in procs:
            p.kill()
        remove_shm_buffers("127.0.0.1", port)
    assert [p.returncode for p in procs] == [1, 1], errs
    assert "in broken_export" in errs[0], errs[0]
    assert "TypeError: " in errs[0].rstrip().splitlines()[-1]  # the bug itself, last
    assert "CheckpointError" not in errs[0]
    assert "in broken_export" not in errs[1], errs[1]
    assert (
        f"CheckpointError: --init_from {source}: rank 0 failed exporting {source}/final "
        "(TypeError); see its error above"
    ) in errs[1]
