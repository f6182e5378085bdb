"""gpt_ds/checkpoint: the manifest round trip and the one tag lookup that training, export,
sampling and the universal tool share (complete tags, `latest`, fall-back, file checks)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from helpers.messages import assert_names

from gpt_ds.base.errors import CheckpointError
from gpt_ds.checkpoint.batch import Batch, check_batch, check_continuable
from gpt_ds.checkpoint.manifest import Manifest
from gpt_ds.checkpoint.tags import (
    CheckpointRef,
    complete_tags,
    is_checkpoint_dir,
    partial_dirs,
    resolve,
)

COMPLETE_TAGS = "iter_2, iter_10, final"  # the run fixture's, by iteration
SHAPE = {"n_layer": 2, "n_head": 2, "n_embd": 64, "block_size": 32, "vocab_size": 50257}


def make_tag(
    out: Path, tag: str, iteration: int, manifest: bool = True, checksums: bool = True
) -> Path:
    """A tag directory with one 'DeepSpeed' file of 10 bytes, and its manifest (with the
    file's checksum, as gpt_ds writes it, unless `checksums` is false)."""
    d = out / tag
    d.mkdir(parents=True)
    (d / "mp_rank_00_model_states.pt").write_bytes(b"0123456789")
    digest = hashlib.sha256(b"0123456789").hexdigest()
    if manifest:
        Manifest(
            tag=tag,
            iteration=iteration,
            world_size=2,
            zero_stage=2,
            model=SHAPE,
            config={"seed": 1},
            files={"mp_rank_00_model_states.pt": 10},
            checksums={"mp_rank_00_model_states.pt": digest} if checksums else {},
            checksum_algorithm="sha256" if checksums else None,
        ).write(d)
    return d


@pytest.fixture
def run(tmp_path) -> Path:
    out = tmp_path / "run"
    make_tag(out, "iter_2", 2)
    make_tag(out, "iter_10", 10)
    make_tag(out, "final", 12)
    make_tag(out, "iter_4.partial", 4)  # a staging directory, even with a manifest
    make_tag(out, "iter_6", 6, manifest=False)  # a save that never finished
    (out / "latest").write_text("final")
    return out


def test_manifest_round_trip_keeps_the_file_format(run):
    data = json.loads((run / "final" / "gpt_ds.json").read_text())
    assert data["model"] == SHAPE and data["iteration"] == 12 and data["universal"] is False
    m = Manifest.read(run / "final")
    assert m.shape.n_embd == 64 and m.files == {"mp_rank_00_model_states.pt": 10}
    assert Manifest.read(run / "iter_6") is None
    (run / "iter_6" / "gpt_ds.json").write_text("{not json")
    assert Manifest.read(run / "iter_6") is None


def test_complete_tags_skip_partial_and_unfinished(run):
    assert complete_tags(run) == ["iter_2", "iter_10", "final"]  # by iteration, not by name
    assert [p.name for p in partial_dirs(run)] == ["iter_4.partial", "iter_6"]
    assert is_checkpoint_dir(run) and is_checkpoint_dir(run / "final")
    assert not is_checkpoint_dir(run / "iter_6")


def test_resolve_latest_a_named_tag_and_a_tag_directory(run):
    assert resolve(run).tag == "final"
    assert resolve(run, "iter_10").manifest.iteration == 10
    ref = resolve(run / "iter_2")
    assert (ref.out_dir, ref.tag) == (run, "iter_2")
    with pytest.raises(CheckpointError) as e:
        resolve(run / "iter_2", "final")
    assert_names(str(e.value), str(run / "iter_2"), "'iter_2'", "'final'")  # the dir's, asked


@pytest.mark.parametrize(
    "tag,facts",
    [
        ("iter_3", ["--tag iter_3", "{run}"]),
        ("iter_4.partial", ["--tag iter_4.partial", "{run}"]),
        ("iter_6", ["{run}/iter_6", "gpt_ds.json"]),  # the tag's directory, what it lacks
    ],
)
def test_a_named_tag_that_is_not_complete_is_refused(run, tag, facts):
    with pytest.raises(CheckpointError) as e:
        resolve(run, tag, fall_back=True)
    assert_names(str(e.value), *(f.format(run=run) for f in facts))
    assert_names(str(e.value), COMPLETE_TAGS)


def test_a_file_of_the_wrong_size_is_refused_when_named(run):
    (run / "final" / "mp_rank_00_model_states.pt").write_bytes(b"012")
    with pytest.raises(CheckpointError) as e:
        resolve(run, "final")
    # the tag, the file, its size and the manifest's (the run's path aside: it has numbers)
    message = str(e.value).replace(str(run), "RUN")
    assert_names(message, "RUN/final", "mp_rank_00_model_states.pt", "3", "10")
    (run / "final" / "mp_rank_00_model_states.pt").unlink()
    with pytest.raises(CheckpointError) as e:
        resolve(run)  # `latest` without fall-back: the same refusal
    assert_names(str(e.value), f"{run}/final", "mp_rank_00_model_states.pt", "missing")


def test_latest_falls_back_to_the_newest_loadable_tag_and_says_so(run):
    (run / "final" / "mp_rank_00_model_states.pt").unlink()
    notes: list[str] = []
    ref = resolve(run, fall_back=True, note=notes.append)
    assert ref.tag == "iter_10"
    assert len(notes) == 1
    # the tag used instead, and why `latest`'s is not: the file missing from it
    assert_names(notes[0], "'iter_10'", "mp_rank_00_model_states.pt", "missing")
    (run / "latest").unlink()
    assert resolve(run, fall_back=True, note=notes.append).tag == "iter_10"
    assert_names(notes[-1], "'iter_10'", "`latest`")


def test_no_latest_and_nothing_to_fall_back_to(run, tmp_path):
    (run / "latest").unlink()
    with pytest.raises(CheckpointError) as e:
        resolve(run)
    # the run, the file it lacks, the flag to give and the tags to give it
    assert_names(str(e.value), str(run), "`latest`", "--tag", COMPLETE_TAGS)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError) as e:
        resolve(empty, flag="--resume", fall_back=True, note=lambda _m: None)
    assert_names(str(e.value), "--resume", str(empty), "*/gpt_ds.json")  # what it looked for
    with pytest.raises(CheckpointError) as e:
        resolve(tmp_path / "nope")
    assert_names(str(e.value), str(tmp_path / "nope"), "does not exist")


# ---------------------------------------------------------------------------- batch changes
def saved_manifest(**fields) -> Manifest:
    base = dict(
        tag="iter_10",
        iteration=10,
        world_size=2,
        zero_stage=2,
        model=SHAPE,
        config={"seed": 1, "micro_batch_size": None, "grad_accum": None},
        files={},
        micro_batch_size=4,
        grad_accum=2,
        tokens=10 * 16 * SHAPE["block_size"],
        data={"train_tokens": 1000, "val_tokens": 100},
        early_stop={"best": None, "best_iter": None, "stale": 0},
    )
    return Manifest(**{**base, **fields})


def test_the_same_batch_resumes_silently():
    assert check_batch(saved_manifest(), Batch(2, 4, 2, 32), allowed=False) == []


def test_a_changed_global_batch_is_refused_naming_the_batch_that_resumes_exactly():
    with pytest.raises(CheckpointError) as err:
        check_batch(saved_manifest(), Batch(4, 4, 2, 32), allowed=False)
    # what changed, the global batch's sizes, the flags that resume exactly, the override
    assert_names(str(err.value), "world size 2 -> 4", "16 -> 32")
    assert_names(str(err.value), "--micro_batch_size 4 --grad_accum 2", "--allow_batch_change")


def test_an_allowed_change_of_the_global_batch_is_reported():
    lines = check_batch(saved_manifest(), Batch(2, 8, 2, 32), allowed=True)
    assert "micro-batch 4 -> 8" in lines[0] and "16 -> 32" in lines[1]
    assert "--allow_batch_change" in lines[-1]


def test_a_new_split_of_the_same_global_batch_goes_on_unasked():
    lines = check_batch(saved_manifest(), Batch(2, 8, 1, 32), allowed=False)
    assert "micro-batch 4 -> 8, gradient accumulation 2 -> 1" in lines[0]
    assert "the same sequences" in lines[-1]


@pytest.mark.parametrize(
    "fields", [{"data_stream": "per_rank"}, {"micro_batch_size": None, "grad_accum": None},
               {"tokens": None, "data": None, "early_stop": None}]
)  # fmt: skip
def test_a_checkpoint_of_the_per_rank_streams_is_not_resumed(fields, tmp_path):
    """A gpt_ds before the global stream drew each rank's windows from its own stream (and
    before that recorded no batch): --resume cannot continue it, and says what starts a new
    run from its weights."""
    ref = CheckpointRef(tmp_path, "iter_10", saved_manifest(**fields))
    with pytest.raises(CheckpointError) as err:
        check_continuable(ref)
    assert_names(str(err.value), str(ref.tag_dir), "--resume", f"--init_from {tmp_path}:iter_10")
    check_continuable(CheckpointRef(tmp_path, "iter_10", saved_manifest()))  # today's: resumes


def test_the_global_stream_resumes_the_same_global_batch_on_any_world_size_unasked():
    """Issue 25: with the run's one global stream, 2 ranks x 4 x 2 -> 1 rank x 4 x 4 (or 4
    ranks x 4 x 1) trains every step on the same sequences: said, and allowed without
    --allow_batch_change; a changed global batch is still refused."""
    saved = saved_manifest()
    lines = check_batch(saved, Batch(1, 4, 4, 32), allowed=False)
    assert lines == [
        "resuming iter_10 changes the batch: world size 2 -> 1, gradient accumulation 2 -> 4",
        "global batch 16 -> 16 sequences per step (512 -> 512 tokens); the 10 steps so far "
        "saw 5,120 tokens",
        "data: the global stream goes on where it stopped, each step its next 16 sequences "
        "split among 1 rank: the same sequences as without the change (gradients equal to "
        "float rounding)",
    ]
    assert check_batch(saved, Batch(4, 4, 1, 32), allowed=False)[0].endswith("2 -> 1")
    with pytest.raises(CheckpointError) as err:
        check_batch(saved, Batch(1, 4, 2, 32), allowed=False)
    # the global batch that changed, the saved batch's flags, the override
    assert_names(str(err.value), "16 -> 8", "2 ranks, --micro_batch_size 4 --grad_accum 2")
    assert_names(str(err.value), "--allow_batch_change")
    allowed = check_batch(saved, Batch(1, 4, 2, 32), allowed=True)
    assert_names(allowed[-1], "--allow_batch_change")
