"""recipes/: each flag file is taken by `--config` as it is and planned, in the world its header
names, by gpt_ds's own `plan_run` (model shapes from local configs, the data and outputs swapped
for the suite's: nothing downloaded); what a header says the picker chooses is what it chooses;
and a tiny twin of the 124M recipe (the same file, the model and batch shrunk on the command
line) trains on 2 CPU ranks."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from helpers.files import HELLASWAG_MINI
from support.launch import REPO, planned, run_deepspeed

from gpt_ds.commands.pick_preset import main as pick_preset
from gpt_ds.observe.metrics import read_metrics

RECIPES = REPO / "recipes"
GPT2_124M = RECIPES / "gpt2_124m_fineweb_edu_10b.yaml"
BENCHMARKS = REPO / "BENCHMARKS.md"


def header(recipe: Path) -> str:
    """The recipe's leading comment block, without the '#'s."""
    lines = []
    for line in recipe.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(lines)


def local_inputs(data_dir: Path, out: Path) -> list[str]:
    """Command-line flags replacing a recipe's data, HellaSwag file and out dir with the suite's."""
    return [
        "--data_dir", str(data_dir), "--out_dir", str(out), "--hellaswag", str(HELLASWAG_MINI),
    ]  # fmt: skip


def test_every_recipe_says_what_it_reproduces_and_how_to_run_it():
    recipes = sorted(RECIPES.glob("*.yaml"))
    assert recipes, "recipes/ is empty"
    for recipe in recipes:
        said = header(recipe)
        for part in ("Reproduces:", "What they report:", "Data", "GPUs:", "Hours:", "Start"):
            assert part in said, f"{recipe.name}: its header lacks {part!r}"
        assert f"--config recipes/{recipe.name}" in said, recipe.name


@pytest.mark.slow
def test_the_124m_recipe_plans_nanogpts_half_million_token_steps(shakespeare_dir, tmp_path):
    """Planned on 8 ranks (the GPUs it names): 524,288 tokens a step, 19,073 steps, the schedule
    and optimizer of build-nanogpt, HellaSwag at each evaluation."""
    argv = ["--config", str(GPT2_124M), *local_inputs(shakespeare_dir, tmp_path / "out")]
    plan = planned([*argv, "--ignore_memory_estimate"], ranks=8)  # this machine is no 8 x 80 GB
    assert plan.ds.train_batch_size * plan.shape.block_size == 524_288
    assert (plan.shape.n_layer, plan.shape.n_embd, plan.shape.block_size) == (12, 768, 1024)
    assert plan.length.max_iters == 19_073 and plan.ds.warmup_iters == 715
    assert (plan.ds.lr, plan.ds.min_lr, plan.ds.grad_clip) == (6e-4, 6e-5, 1.0)
    params = plan.ds.config["optimizer"]["params"]
    assert params["betas"] == [0.9, 0.95] and params["weight_decay"] == 0.1
    assert plan.ds.precision == "bf16" and plan.ds.zero_stage == 1
    assert plan.hellaswag is not None and plan.cfg.resume == "auto"


def test_the_124m_recipe_is_what_the_picker_recommends(capsys):
    """The header's picker command, run: its preset, micro-batch and accumulation are the
    recipe's, and the usable memory it prints is the header's."""
    said = header(GPT2_124M)
    found = re.search(r"\(what (gpt-ds-pick-preset [^)]*?) recommends", said)
    assert found, said
    assert pick_preset([*shlex.split(found[1])[1:], "--json"]) == 0
    picked = json.loads(capsys.readouterr().out)
    choice = picked["recommendation"]
    recipe = GPT2_124M.read_text()
    assert choice["preset"] == "ds_configs/zero1.json" and "deepspeed_config: zero1" in recipe
    for flag in ("micro_batch_size", "grad_accum"):
        assert f"{flag}: {choice[flag]}\n" in recipe, flag
    chosen = next(
        c
        for c in picked["candidates"]
        if c["settings_from"] == choice["preset"]
        and c["activation_checkpointing"] == choice["activation_checkpointing"]
        and not c["offload_optimizer"]
    )
    usable = re.search(r"= ([\d.]+) GiB usable", " ".join(picked["assumptions"]))
    assert usable, picked["assumptions"]
    total = chosen["total_at_micro_batch"] / 2**30
    assert f"{total:.1f} of {float(usable[1]):.1f} GiB usable per GPU under ZeRO-1" in said


@pytest.mark.slow
def test_a_tiny_twin_of_the_124m_recipe_trains(shakespeare_dir, tmp_path):
    """The 124M recipe with gpt2-tiny, a 64-token block and 4 steps on 2 ranks: its schedule,
    optimizer, evaluations and HellaSwag scoring run as the recipe sets them."""
    out = tmp_path / "twin"
    tiny = ["--model", "gpt2-tiny", "--block_size", "64", "--micro_batch_size", "4"]
    tiny += ["--max_iters", "4", "--warmup_iters", "1", "--eval_interval", "2", "--eval_iters", "1"]
    args = ["--config", str(GPT2_124M), *local_inputs(shakespeare_dir, out), *tiny]
    proc = run_deepspeed(args, num_gpus=2)
    assert "peak 0.0006 (--lr)" in proc.stdout and "down to 6e-05" in proc.stdout, proc.stdout
    evals = [r for r in read_metrics(out) if r["kind"] == "eval"]
    assert [r["iter"] for r in evals] == [2, 4]
    assert all(r["hellaswag_examples"] == 11 for r in evals)
    assert (out / "final" / "gpt_ds.json").is_file()


def test_the_124m_recipes_hours_follow_the_measured_throughput():
    """The header's hours: its tokens at gpt_ds's tokens/s on one H200 as BENCHMARKS.md has it."""
    table = BENCHMARKS.read_text()
    row = re.search(r"^\| H200 \| gpt_ds \(defaults[^|]*\| ([\d,]+) \|", table, re.M)
    assert row, "BENCHMARKS.md: no H200 row of gpt_ds's defaults"
    tokens_per_s = int(row[1].replace(",", ""))
    said = header(GPT2_124M)
    assert f"at the {tokens_per_s:,} tokens/s BENCHMARKS.md measured on one H200" in said
    hours = 19_073 * 524_288 / tokens_per_s / 3600
    assert f"is {hours:.1f} h on one H200" in said and f"~{hours / 8:.1f} h" in said
