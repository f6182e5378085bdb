"""recipes/: each flag file is taken by `--config` as it is and planned, in the world its header
names, by gpt_ds's own `plan_run` (model shapes from local configs, the data and outputs swapped
for the suite's: nothing downloaded) as its source sets the run; what a header says the picker
chooses is what it chooses; its hours follow BENCHMARKS.md; and tiny twins of the 124M recipe
and of the XL fine-tune (the same files, the model and batch shrunk on the command line) train
on 2 CPU ranks."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from harness.launch import run_deepspeed
from helpers.files import HELLASWAG_MINI
from support.launch import REPO, planned

from gpt_ds.base.flag_file import load_flag_file
from gpt_ds.commands.pick_preset import main as pick_preset
from gpt_ds.model.gpt2 import flops_per_token, resolve_shape
from gpt_ds.observe.metrics_file import read_metrics
from gpt_ds.observe.peak_flops import PEAK_TFLOPS
from gpt_ds.run.config import RunConfig, parse_args

RECIPES = REPO / "recipes"
GPT2_124M = RECIPES / "gpt2_124m_fineweb_edu_10b.yaml"
TWO_NODES = RECIPES / "gpt2_124m_two_nodes_1gbps.yaml"
BENCHMARKS = REPO / "BENCHMARKS.md"


@dataclass(frozen=True)
class Source:
    """A recipe's run as its source sets it, and the world its header names."""

    ranks: int
    layers_width: tuple[int, int]
    tokens_per_step: int
    steps: int
    warmup: int
    lr: float
    min_lr: float
    zero_stage: int
    hellaswag: bool = True
    optimizer: str = "adamw"
    grad_clip: float = 1.0


SOURCES = {  # llm.c's scripts/run_gpt2_*.sh and build-nanogpt's train_gpt2.py, as the headers say
    "gpt2_124m_fineweb_edu_10b.yaml": Source(8, (12, 768), 524_288, 19_073, 715, 6e-4, 6e-5, 1),
    "gpt2_350m_fineweb_30b.yaml": Source(8, (24, 1024), 524_288, 60_000, 700, 3e-4, 0.0, 1),
    "gpt2_774m_fineweb_150b.yaml": Source(8, (36, 1280), 524_288, 286_102, 700, 2.5e-4, 0.0, 1),
    "gpt2_xl_finetune_4x12gb.yaml": Source(
        4, (48, 1600), 65_536, 2_000, 100, 3e-5, 3e-6, 3, hellaswag=False
    ),
    "gpt2_124m_two_nodes_1gbps.yaml": Source(8, (12, 768), 1_048_576, 9_537, 358, 6e-4, 6e-5, 1),
    # the 124M recipe with Muon, 90% of its steps (the recipe's header says why)
    "gpt2_124m_muon.yaml": Source(
        8, (12, 768), 524_288, 17_166, 715, 6e-4, 6e-5, 1, optimizer="muon", grad_clip=0.0
    ),
}


def header(recipe: Path) -> str:
    """The recipe's leading comment block, without the '#'s."""
    lines = []
    for line in recipe.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(lines)


def flags(recipe: Path) -> dict:
    return load_flag_file(recipe, RunConfig)


def local_inputs(data_dir: Path, out: Path) -> list[str]:
    """Command-line flags replacing a recipe's data, HellaSwag file and out dir with the suite's."""
    return [
        "--data_dir", str(data_dir), "--out_dir", str(out), "--hellaswag", str(HELLASWAG_MINI),
    ]  # fmt: skip


def picked(command: str, capsys) -> dict:
    """The JSON of a `gpt-ds-pick-preset ...` command as a header writes it."""
    assert pick_preset([*shlex.split(command)[1:], "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def chosen_candidate(picked_json: dict) -> dict:
    choice = picked_json["recommendation"]
    return next(
        c
        for c in picked_json["candidates"]
        if c["settings_from"] == choice["preset"]
        and c["activation_checkpointing"] == choice["activation_checkpointing"]
        and c["micro_batch_size"] == choice["micro_batch_size"]
    )


def memory_of_choice(picked_json: dict) -> tuple[float, float]:
    """(GiB the picker's choice holds per GPU, GiB usable per GPU), as the picker prints them."""
    usable = re.search(r"= ([\d.]+) GiB usable", " ".join(picked_json["assumptions"]))
    assert usable, picked_json["assumptions"]
    return chosen_candidate(picked_json)["total_at_micro_batch"] / 2**30, float(usable[1])


def measured_mfu() -> float:
    """gpt_ds's MFU on one H200 (defaults row), as BENCHMARKS.md has it."""
    row = re.search(
        r"^\| H200 \| gpt_ds \(defaults[^|]*\| [\d,]+ \| ([\d.]+)% \|", BENCHMARKS.read_text(), re.M
    )
    assert row, "BENCHMARKS.md: no H200 row of gpt_ds's defaults"
    return float(row[1]) / 100


def sci(value: float) -> str:
    """1.03e10, as the headers write a count of FLOPs."""
    return f"{value:.2e}".replace("e+0", "e").replace("e+", "e")


def test_every_recipe_says_what_it_reproduces_and_how_to_run_it():
    recipes = sorted(p.name for p in RECIPES.glob("*.yaml"))
    assert recipes == sorted(SOURCES), "a recipe without its source's settings in SOURCES"
    for name in recipes:
        said = header(RECIPES / name)
        for part in ("Reproduces:", "What they report:", "Data", "GPUs:", "Hours:", "Start"):
            assert part in said, f"{name}: its header lacks {part!r}"
        assert f"--config recipes/{name}" in said, name
        assert flags(RECIPES / name)["resume"] == "auto", f"{name}: a requeued run needs it"


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_each_recipe_plans_its_sources_run(name, shakespeare_dir, tmp_path):
    """Planned on the ranks its header names: the model, tokens a step, steps, schedule,
    optimizer, precision and ZeRO stage its source sets (this machine is no GPU cluster:
    --ignore_memory_estimate)."""
    recipe, want = RECIPES / name, SOURCES[name]
    argv = ["--config", str(recipe), "--data_dir", str(shakespeare_dir)]
    argv += ["--out_dir", str(tmp_path / "out"), "--ignore_memory_estimate"]
    if "init_from" in flags(recipe):  # its shape from a local copy of the weights' config
        from transformers import GPT2Config

        shape = resolve_shape(flags(recipe)["init_from"], None, None, None, None)
        config = GPT2Config(n_layer=shape.n_layer, n_head=shape.n_head, n_embd=shape.n_embd)
        config.save_pretrained(tmp_path / "weights")
        argv += ["--init_from", str(tmp_path / "weights")]
    if want.hellaswag:
        argv += ["--hellaswag", str(HELLASWAG_MINI)]
    plan = planned(argv, ranks=want.ranks)
    assert (plan.shape.n_layer, plan.shape.n_embd) == want.layers_width
    assert plan.ds.train_batch_size * plan.shape.block_size == want.tokens_per_step
    assert (plan.length.max_iters, plan.ds.warmup_iters) == (want.steps, want.warmup)
    assert (plan.ds.lr, plan.ds.grad_clip) == (want.lr, want.grad_clip)
    assert plan.ds.optimizer == want.optimizer
    assert plan.ds.min_lr == pytest.approx(want.min_lr, abs=1e-12)
    params = plan.ds.config["optimizer"]["params"]
    assert params["betas"] == [0.9, 0.95] and params["weight_decay"] == 0.1
    assert plan.ds.precision == "bf16" and plan.ds.zero_stage == want.zero_stage
    assert (plan.hellaswag is not None) == want.hellaswag and plan.cfg.resume == "auto"


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_each_recipe_is_what_the_picker_recommends(name, capsys):
    """The header's picker command, run: its preset, micro-batch, accumulation and activation
    checkpointing are the recipe's, and the memory it prints is the header's."""
    recipe = RECIPES / name
    said = header(recipe)
    found = re.search(r"\(what (gpt-ds-pick-preset [^)]*?) recommends", said)
    assert found, said
    result = picked(found[1], capsys)
    choice, given = result["recommendation"], flags(recipe)
    assert choice["preset"] == f"ds_configs/{given['deepspeed_config']}.json"
    assert choice["activation_checkpointing"] == given.get("activation_checkpointing", False)
    assert (choice["micro_batch_size"], choice["grad_accum"]) == (
        given["micro_batch_size"],
        given["grad_accum"],
    )
    total, usable = memory_of_choice(result)
    stage = int(given["deepspeed_config"].removeprefix("zero"))
    assert f"{total:.1f} of {usable:.1f} GiB usable per GPU under ZeRO-{stage}" in said


def test_the_xl_recipes_larger_gpu_line_is_what_the_picker_recommends_there(capsys):
    """On 4 x 32 GB the header names the picker's other choice and the flags that take it:
    those flags after the recipe give the picker's preset, micro-batch, accumulation and no
    activation checkpointing (`--no_` turns off the recipe's)."""
    recipe = RECIPES / "gpt2_xl_finetune_4x12gb.yaml"
    said = header(recipe)
    found = re.search(r"on 4 x 32 GB (gpt-ds-pick-preset .*?) recommends .*?`(--[^`]*)`", said)
    assert found, said
    result = picked(found[1], capsys)
    choice = result["recommendation"]
    cfg = parse_args(["--config", str(recipe), *shlex.split(found[2])])
    assert f"ds_configs/{cfg.deepspeed_config}.json" == choice["preset"]
    assert (cfg.micro_batch_size, cfg.grad_accum) == (
        choice["micro_batch_size"],
        choice["grad_accum"],
    )
    assert cfg.activation_checkpointing == choice["activation_checkpointing"] is False
    memory_md = (REPO / "docs" / "memory.md").read_text()  # the same choice, in its figures
    total, usable = memory_of_choice(result)
    assert f"({total:.2f} of {usable:.2f} GiB usable)" in memory_md
    assert found[2] in " ".join(memory_md.split())


def test_the_two_node_recipe_keeps_communication_a_minority_of_the_step(capsys):
    """At the recipe's 1,024 sequences the picker's own step estimate spends less than half the
    step communicating over 1 Gbps; at 512 (the one-node recipe's) more than half; the GPUs'
    TFLOP/s it assumes is the measured MFU of the A10G's peak; the hours are its steps at that
    estimate."""
    said = header(TWO_NODES)
    command = re.search(r"\(what (gpt-ds-pick-preset [^)]*?) recommends", said)[1]
    a10g = next(peak for model, _, peak in PEAK_TFLOPS if model == "A10G")
    assert f"--gpu_tflops {measured_mfu() * a10g:.1f} " in command
    ours = chosen_candidate(picked(command, capsys))
    assert ours["comm_s"] < ours["step_s"] / 2
    assert f"{ours['comm_s']:.2f} s of communication in {ours['step_s']:.2f} s" in said
    halved = chosen_candidate(picked(command.replace("size 1024", "size 512"), capsys))
    assert halved["comm_s"] > halved["step_s"] / 2
    steps = flags(TWO_NODES)["max_iters"]
    assert f"{steps:,} steps at that estimate of {ours['step_s']:.2f} s is " in said
    assert f"is {steps * ours['step_s'] / 3600:.1f} h" in said


@pytest.mark.parametrize(
    "name",
    ["gpt2_350m_fineweb_30b.yaml", "gpt2_774m_fineweb_150b.yaml", "gpt2_xl_finetune_4x12gb.yaml"],
)
def test_the_larger_recipes_hours_follow_the_measured_mfu(name):
    """Tokens x FLOPs a token (x 4/3 where activations are recomputed) at the MFU BENCHMARKS.md
    measured on one H200, against that card's peak."""
    recipe, want = RECIPES / name, SOURCES[name]
    given = flags(recipe)
    shape = resolve_shape(given.get("model") or given["init_from"], None, None, None, 1024)
    flops = want.steps * want.tokens_per_step * flops_per_token(shape)
    flops *= 4 / 3 if given.get("activation_checkpointing") else 1
    h200 = next(peak for model, _, peak in PEAK_TFLOPS if model == "H200")
    mfu = measured_mfu()
    hours = flops / (mfu * h200 * 1e12) / 3600
    said = header(recipe)
    assert f"{sci(flops_per_token(shape))} FLOPs a token" in said
    assert f"at the {mfu:.1%} MFU BENCHMARKS.md" in said
    if want.ranks == 8:
        assert f"is {hours:,.1f} h on one H200; 8 would take ~{hours / 8:,.1f} h" in said
    else:
        assert f"is {sci(flops)} FLOPs: {hours:.1f} h of one H200" in said


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


@pytest.mark.slow
def test_a_tiny_twin_of_the_xl_fine_tune_trains_under_zero3(shakespeare_dir, tmp_path):
    """The XL recipe as it is (ZeRO-3, activation checkpointing, lr 3e-5 with warm-up and
    cosine, resume auto) from a small pretrained GPT-2 instead of `gpt2-xl`, block 64, 2 steps
    on 2 ranks: its weights are loaded into the shards and it trains."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    pretrained = tmp_path / "pretrained"
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=64, n_positions=64)).save_pretrained(
        pretrained
    )
    out = tmp_path / "twin"
    args = [
        "--config",
        str(RECIPES / "gpt2_xl_finetune_4x12gb.yaml"),
        "--init_from",
        str(pretrained),
    ]
    args += ["--data_dir", str(shakespeare_dir), "--out_dir", str(out), "--block_size", "64"]
    args += ["--micro_batch_size", "2", "--grad_accum", "1", "--max_iters", "2"]
    args += ["--warmup_iters", "1", "--eval_interval", "0", "--eval_iters", "1"]
    proc = run_deepspeed(args, num_gpus=2)
    assert "2 layers, 2 heads, 64 wide, block 64" in proc.stdout, proc.stdout[-3000:]
    assert "peak 3e-05 (--lr)" in proc.stdout
    manifest = json.loads((out / "final" / "gpt_ds.json").read_text())
    assert manifest["config"]["activation_checkpointing"] is True
    assert manifest["config"]["deepspeed_config"] == "zero3"
    train = [r for r in read_metrics(out) if r["kind"] == "train"]
    assert train[-1]["iter"] == 2 and all(0 < r["lr"] <= 3e-5 for r in train)


@pytest.mark.parametrize("name", ["gpt2_124m_fineweb_edu_10b.yaml", "gpt2_124m_muon.yaml"])
def test_the_124m_recipes_hours_follow_the_measured_throughput(name):
    """The header's hours: its tokens at gpt_ds's tokens/s on one H200 as BENCHMARKS.md has it."""
    table = BENCHMARKS.read_text()
    row = re.search(r"^\| H200 \| gpt_ds \(defaults[^|]*\| ([\d,]+) \|", table, re.M)
    assert row, "BENCHMARKS.md: no H200 row of gpt_ds's defaults"
    tokens_per_s = int(row[1].replace(",", ""))
    said = header(RECIPES / name)
    assert f"at the {tokens_per_s:,} tokens/s BENCHMARKS.md measured on one H200" in said
    hours = SOURCES[name].steps * SOURCES[name].tokens_per_step / tokens_per_s / 3600
    assert f"is {hours:.1f} h on one H200" in said and f"~{hours / 8:.1f} h" in said
