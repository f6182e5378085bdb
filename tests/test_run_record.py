"""What a run records and what it loads: the run config as the user asked it beside the plan
computed from it, so a checkpoint's gpt_ds.json replays any run; a versioned checkpoint format
whose one `migrate` reads every earlier layout; checkpoints without checksums refused unless
`--allow_unverified`, and reported as unverified when allowed; a resume under another ZeRO
stage refused by the plan, before any model or engine.

Real runs: a 2-rank `--max_tokens` run of its own, and copies of the session's ZeRO-2 run
(conftest.stage_run). The reference for a replay or a resume is the first run's logged losses.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest
from harness.launch import STAGE_RUN_ITERS, run_deepspeed, run_python
from helpers.logged import train_losses
from helpers.messages import assert_names
from support.launch import REPO, tiny_run_args

from gpt_ds.base.errors import CheckpointError
from gpt_ds.checkpoint.integrity import UnverifiedCheckpoint, unverified_reason
from gpt_ds.checkpoint.manifest import FORMAT_VERSION, MANIFEST, Manifest
from gpt_ds.checkpoint.tags import CheckpointRef
from gpt_ds.launch.machine import probe_machine
from gpt_ds.run.config import parse_args
from gpt_ds.run.plan import check_zero_stage, plan_run

# the manifest's fields in the order gpt_ds came to write them: an earlier layout is today's
# without the fields of every later step
LAYOUT_STEPS = [
    ("first", []),
    ("batch", ["micro_batch_size", "grad_accum", "run_id", "precision", "val_loss",
               "best_val_loss", "best_tag", "universal", "source_tag"]),
    ("checksums", ["checksums", "checksum_algorithm"]),
    ("tokens", ["tokens"]),
    ("data", ["data", "early_stop"]),
    ("global stream", ["data_stream"]),
    ("format version", ["format_version", "plan", "source_digest"]),
]  # fmt: skip


def layout(today: dict, step: int) -> dict:
    """`today`'s manifest as the gpt_ds of LAYOUT_STEPS[step] wrote it."""
    later = {key for _, keys in LAYOUT_STEPS[step + 1 :] for key in keys}
    return {k: v for k, v in today.items() if k not in later}


def copied_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def rewrite_manifest(tag_dir: Path, change) -> None:
    path = tag_dir / MANIFEST
    path.write_text(json.dumps(change(json.loads(path.read_text())), indent=2))


def run_args(data_dir: Path, out: Path, **more) -> list[str]:
    """The session's ZeRO-2 run (conftest.stage_run) again, for another out dir."""
    return tiny_run_args(
        data_dir, out, deepspeed_config="ds_configs/zero2.json", max_iters=STAGE_RUN_ITERS, **more
    )


# ------------------------------------------------------------------------- the format
@pytest.mark.slow
@pytest.mark.parametrize("step", range(len(LAYOUT_STEPS)), ids=[s for s, _ in LAYOUT_STEPS])
def test_every_earlier_manifest_layout_reads_as_this_format(step, stage_run, tmp_path):
    """A real checkpoint's manifest, rewritten as each earlier gpt_ds wrote it, reads as
    today's: the batch from the flags, the tokens from the batch, the data stream of its time;
    one from before checksums is unverified."""
    src = stage_run(2)[0] / "final"
    today = json.loads((src / MANIFEST).read_text())
    assert today["format_version"] == FORMAT_VERSION == 2
    tag_dir = tmp_path / "final"
    tag_dir.mkdir()
    (tag_dir / MANIFEST).write_text(json.dumps(layout(today, step)))
    m = Manifest.read(tag_dir)
    assert m.format_version == FORMAT_VERSION
    assert (m.micro_batch_size, m.grad_accum) == (today["micro_batch_size"], today["grad_accum"])
    assert m.tokens == today["tokens"] == STAGE_RUN_ITERS * 2 * 4 * 64
    assert m.data_stream == ("global" if step >= 5 else "per_rank")
    assert m.config == today["config"]
    assert (unverified_reason(m) is None) == (step >= 2)


def test_a_version_1_manifest_keeps_each_fact_once_as_version_2(tmp_path):
    """Version 1's plan record repeated the batch split, precision and stage beside the
    manifest's own fields; read as version 2 it keeps them once, at the top."""
    plan = {"max_iters": 24, "micro_batch_size": 4, "grad_accum": 2, "precision": "bf16",
            "zero_stage": 2, "train_batch_size": 16}  # fmt: skip
    v1 = {"tag": "final", "iteration": 24, "world_size": 2, "zero_stage": 2, "model": {},
          "config": {}, "files": {}, "format_version": 1, "micro_batch_size": 4,
          "grad_accum": 2, "precision": "bf16", "plan": plan}  # fmt: skip
    (tmp_path / MANIFEST).write_text(json.dumps(v1))
    m = Manifest.read(tmp_path)
    assert m.format_version == 2 and m.plan == {"max_iters": 24, "train_batch_size": 16}
    assert (m.micro_batch_size, m.grad_accum, m.precision, m.zero_stage) == (4, 2, "bf16", 2)


def test_a_manifest_of_a_newer_format_is_refused_by_name(tmp_path):
    manifest = {"tag": "final", "iteration": 1, "world_size": 1, "zero_stage": 2, "model": {},
                "config": {}, "files": {}, "format_version": FORMAT_VERSION + 1}  # fmt: skip
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError) as newer:
        Manifest.read(tmp_path)
    # the file, its format, and the newest this gpt_ds reads
    assert_names(str(newer.value), str(tmp_path / MANIFEST), str(FORMAT_VERSION + 1))
    assert_names(str(newer.value), str(FORMAT_VERSION))


def test_a_budget_run_saved_before_the_format_replays_as_asked(tmp_path):
    """Version 0 wrote a budget's computed steps into the run config (max_iters beside
    max_tokens), and --compile as true/false; its replay asks what the user asked."""
    saved = {"model": "gpt2-tiny", "max_iters": 16, "max_tokens": 8192, "compile": True,
             "resume": "latest", "out_dir": "old"}  # fmt: skip
    path = tmp_path / MANIFEST
    path.write_text(json.dumps({"tag": "final", "iteration": 16, "config": saved}))
    cfg = parse_args(["--config", str(path), "--out_dir", "new"])
    assert (cfg.max_iters, cfg.max_tokens, cfg.compile) == (None, 8192, "on")
    assert cfg.resume is None  # a replay starts the run again, in its own out dir


# ------------------------------------------------------------------------- replays
@pytest.fixture
def replay_cases(shakespeare_dir, stage_run, tmp_path) -> dict[str, list[str]]:
    second = shutil.copytree(shakespeare_dir, tmp_path / "second")
    base = ["--data_dir", str(shakespeare_dir), "--block_size", "64", "--micro_batch_size", "4"]
    mixture = ["--data_dir", f"{shakespeare_dir}:0.75", "--data_dir", f"{second}:0.25"]
    return {
        "max_iters": [*base, "--model", "gpt2-tiny", "--max_iters", "30"],
        "max_tokens": [*base, "--model", "gpt2-tiny", "--max_tokens", "5000"],
        "max_epochs": [*base, "--model", "gpt2-tiny", "--max_epochs", "0.01"],
        "mixture": [*mixture, "--model", "gpt2-tiny", "--max_tokens", "3000", "--block_size", "64"],
        "init_from": [*base, "--init_from", f"{stage_run(2)[0]}:iter_10", "--max_iters", "5"],
        "resumed": [*base, "--model", "gpt2-tiny", "--max_tokens", "5000", "--resume"],
    }


@pytest.mark.slow
def test_every_kind_of_run_replays_through_its_manifest(replay_cases, tmp_path):
    """Planned in this process (no ranks): the manifest a run of each kind saves replays the
    same flags and plans the same length; the run config is never rewritten by planning."""
    for name, flags in replay_cases.items():
        out = tmp_path / name
        cfg = parse_args([*flags, "--out_dir", str(out)])
        asked = dataclasses.replace(cfg, resume=None)  # planned as the run's first launch
        plan = plan_run(asked, probe_machine())
        assert plan.cfg == asked, name
        path = tmp_path / f"{name}.json"
        record = {"tag": "final", "iteration": 1, "world_size": 1, "zero_stage": 2,
                  "model": {}, "files": {}, "format_version": FORMAT_VERSION,
                  "config": cfg.to_dict(), "plan": plan.record()}  # fmt: skip
        path.write_text(json.dumps(record))
        replayed = parse_args(["--config", str(path), "--out_dir", str(tmp_path / f"{name}2")])
        assert dataclasses.replace(replayed, out_dir=str(out), config=None) == asked, name
        assert plan_run(replayed, probe_machine()).length == plan.length, name
        assert plan.record()["max_iters"] == plan.length.max_iters


@pytest.mark.slow
def test_a_token_budget_run_falls_back_and_replays(shakespeare_dir, tmp_path):
    """The issue's reproduction: a `--max_tokens` run on 2 ranks. Its damaged `latest` gives
    way to the older tag without planning the run again (the budget's 8 steps kept), and the
    resumed run's own `final/gpt_ds.json` replays into a new out dir from the start: the same
    iterations and losses as the first run."""
    out, again = tmp_path / "run", tmp_path / "replayed"
    budget = {"max_iters": None, "max_tokens": 4096, "eval_interval": 4, "eval_iters": 1}
    first = run_deepspeed(tiny_run_args(shakespeare_dir, out, **budget)).stdout
    assert "run length: 8 iterations from --max_tokens 4,096 (512 tokens each)" in first
    losses = train_losses(out)
    assert sorted(losses) == list(range(1, 9))
    manifest = json.loads((out / "final" / MANIFEST).read_text())
    assert (manifest["config"]["max_iters"], manifest["config"]["max_tokens"]) == (None, 4096)
    assert (manifest["plan"]["max_iters"], manifest["format_version"]) == (8, FORMAT_VERSION)

    with (out / "final" / "mp_rank_00_model_states.pt").open("r+b") as f:
        f.seek(1000)
        f.write(os.urandom(64))
    resumed = run_deepspeed(tiny_run_args(shakespeare_dir, out, **budget, resume=True)).stdout
    assert "differs from its recorded sha256 checksum" in resumed
    assert "using the newest complete tag 'iter_4'" in resumed
    assert f"resumed from {out}/iter_4 at iteration 4" in resumed
    assert train_losses(out) == losses  # an exact resume, to the last bit
    assert json.loads((out / "final" / MANIFEST).read_text())["config"]["resume"] == "latest"

    replay = ["--config", str(out / "final" / MANIFEST), "--out_dir", str(again)]
    run_deepspeed(replay)
    assert train_losses(again) == losses


# ------------------------------------------------------------------------- integrity
@pytest.mark.slow
def test_a_checkpoint_without_checksums_is_refused_unless_allowed(
    stage_run, shakespeare_dir, tmp_path
):
    """`final`'s manifest stripped of its checksums (as an older gpt_ds or a hand edit leaves
    it): --resume (no fall-back to an older tag), --init_from and the export refuse it, saying
    it is unverified and naming --allow_unverified; allowed, the resume says UNVERIFIED and
    never "verified"; the verify tool marks it."""
    run = copied_run(stage_run(2)[0], tmp_path / "run")

    def strip(m: dict) -> dict:
        return {k: v for k, v in m.items() if k not in ("checksums", "checksum_algorithm")}

    rewrite_manifest(run / "final", strip)
    refused = run_deepspeed(run_args(shakespeare_dir, run, resume=True), check=False)
    assert refused.returncode == 2, refused.stdout[-3000:] + refused.stderr[-3000:]
    assert_names(refused.stdout + refused.stderr, f"{run}/final", "--allow_unverified")
    with pytest.raises(UnverifiedCheckpoint) as unverified:
        plan_run(parse_args(["--init_from", f"{run}:final", "--data_dir", str(shakespeare_dir),
                             "--out_dir", str(tmp_path / "new")]), probe_machine())  # fmt: skip
    assert_names(str(unverified.value), f"{run}/final", "--allow_unverified")
    export = [str(REPO / "tools" / "zero_to_fp32.py"), str(run), "--output", str(tmp_path / "hf")]
    proc = run_python(export, check=False)
    assert proc.returncode == 2 and "unverified checkpoint" in proc.stderr, proc.stderr
    verify = run_python([str(REPO / "tools" / "verify_checkpoint.py"), str(run)], check=False)
    assert "| final (latest) | 24 |" in verify.stdout and "UNVERIFIED" in verify.stdout

    allowed = run_args(shakespeare_dir, run, resume=True, allow_unverified=True)
    allowed[allowed.index("--max_iters") + 1] = str(STAGE_RUN_ITERS + 1)
    out = run_deepspeed([*allowed, "--lr_decay_iters", str(STAGE_RUN_ITERS)]).stdout
    assert "checkpoint: final UNVERIFIED (its manifest records no checksums" in out
    assert " verified (" not in out
    assert f"resumed from {run}/final at iteration {STAGE_RUN_ITERS}" in out


@pytest.mark.slow
def test_a_checkpoint_of_the_previous_layout_resumes_exactly(stage_run, shakespeare_dir, tmp_path):
    """`iter_20` as the gpt_ds before format_version wrote it resumes, verified, and its
    next step is the uninterrupted run's to the last bit."""
    src = stage_run(2)[0]
    run = copied_run(src, tmp_path / "run")
    rewrite_manifest(run / "iter_20", lambda m: layout(m, len(LAYOUT_STEPS) - 2))
    assert "format_version" not in json.loads((run / "iter_20" / MANIFEST).read_text())
    args = run_args(shakespeare_dir, run, resume="iter_20", lr_decay_iters=STAGE_RUN_ITERS)
    args[args.index("--max_iters") + 1] = "21"
    out = run_deepspeed(args).stdout
    assert "checkpoint: iter_20 verified (" in out
    assert train_losses(run)[21] == train_losses(src)[21]


@pytest.mark.slow
def test_a_checkpoint_of_the_per_rank_streams_starts_a_new_run_not_a_resume(
    stage_run, shakespeare_dir, tmp_path
):
    """`iter_20` as the gpt_ds before the global data stream wrote it: `--resume` refuses it
    before any work, naming `--init_from`; `--init_from` plans a new run from its weights.
    Planned in this process (no ranks)."""
    run = copied_run(stage_run(2)[0], tmp_path / "run")
    before_global = [name for name, _ in LAYOUT_STEPS].index("global stream") - 1
    rewrite_manifest(run / "iter_20", lambda m: layout(m, before_global))
    resumed = run_args(shakespeare_dir, run, resume="iter_20")
    with pytest.raises(CheckpointError) as err:
        plan_run(parse_args(resumed), probe_machine())
    assert f"{run}/iter_20" in str(err.value) and f"--init_from {run}:iter_20" in str(err.value)
    fresh = run_args(shakespeare_dir, tmp_path / "new", init_from=f"{run}:iter_20", model=None)
    planned = plan_run(parse_args(fresh), probe_machine())
    assert planned.resume is None and planned.init.checkpoint.tag == "iter_20"


# ------------------------------------------------------------------------- the ZeRO stage
def saved_under(stage: int, world_size: int, preset: str | None) -> CheckpointRef:
    config = {"deepspeed_config": preset} if preset else {}
    manifest = Manifest(
        tag="iter_4", iteration=4, world_size=world_size, zero_stage=stage, model={},
        config=config, files={},
    )  # fmt: skip
    return CheckpointRef(out_dir=Path("/runs/a"), tag="iter_4", manifest=manifest)


def test_a_resume_under_another_zero_stage_is_refused_naming_both_and_the_fix():
    """A checkpoint DeepSpeed would load as it saved it (this world size): its stage only. The
    refusal names the tag, both stages, the checkpoint's preset and `--init_from`; another
    world size converts to a universal checkpoint and is not refused here."""
    with pytest.raises(CheckpointError) as err:
        check_zero_stage(saved_under(2, 2, "zero2"), 3, 2, "zero3")
    assert_names(str(err.value), "/runs/a/iter_4", "ZeRO stage 2", "--deepspeed_config zero3")
    assert_names(
        str(err.value), "stage 3", "--deepspeed_config zero2", "--init_from /runs/a:iter_4"
    )
    with pytest.raises(CheckpointError) as err:  # a manifest without the preset's name
        check_zero_stage(saved_under(1, 2, None), 3, 2, "zero3")
    assert_names(str(err.value), "a ZeRO-1 preset")
    check_zero_stage(saved_under(2, 2, "zero2"), 2, 2, "ds_configs/zero2.json")  # same stage
    check_zero_stage(saved_under(2, 2, "zero2"), 3, 1, "zero3")  # converted first


@pytest.mark.slow
def test_the_plan_refuses_a_resume_under_another_zero_stage(
    stage_run, shakespeare_dir, tmp_path, monkeypatch
):
    """The session's 2-rank ZeRO-2 run resumed on 2 ranks under zero1: refused by plan_run,
    which runs before any rank builds a model or an engine (planned in this process)."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    run = copied_run(stage_run(2)[0], tmp_path / "run")
    args = tiny_run_args(
        shakespeare_dir, run, deepspeed_config="zero1", max_iters=30, resume="iter_20"
    )
    with pytest.raises(CheckpointError) as err:
        plan_run(parse_args(args), probe_machine())
    assert_names(str(err.value), f"{run}/iter_20", "ZeRO stage 2", "stage 1", "--init_from")
    plan = plan_run(
        parse_args([*args, "--deepspeed_config", "ds_configs/zero2.json"]), probe_machine()
    )
    assert plan.resume is not None and plan.resume.tag == "iter_20"
