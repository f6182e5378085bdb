"""`--optimizer muon`: DeepSpeed's Muon on GPT-2's hidden matrices, AdamW on the rest.

The resolution (flags, defaults, what only Muon needs) is checked in-process; the split as the
engine holds it, on 2 CPU ranks under ZeRO-1, 2 and 3, by tests/scripts/optimizer_groups.py
(gpt_ds's own plan and engine build) against the model's parameter names."""

from __future__ import annotations

import json

import pytest
from harness.launch import run_deepspeed
from helpers.messages import assert_names
from support.launch import REPO, tiny_run_args

from gpt_ds.base.errors import CheckpointError, ConfigError
from gpt_ds.checkpoint.manifest import Manifest
from gpt_ds.checkpoint.tags import CheckpointRef
from gpt_ds.dsconfig.muon import MUON_DEFAULTS, split_line
from gpt_ds.launch.machine import probe_machine
from gpt_ds.model.gpt2 import is_muon_matrix, resolve_shape
from gpt_ds.model.training_model import build_model
from gpt_ds.run.config import parse_args
from gpt_ds.run.plan import check_optimizer, plan_run

HIDDEN = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")


def planned(shakespeare_dir, tmp_path, *flags: str):
    args = tiny_run_args(shakespeare_dir, tmp_path / "run", max_iters=10, warmup_iters=None)
    return plan_run(parse_args([*args, *flags]), probe_machine())


def refusals(shakespeare_dir, tmp_path, *flags: str) -> list[str]:
    with pytest.raises(ConfigError) as refused:
        planned(shakespeare_dir, tmp_path, *flags)
    return refused.value.problems


def test_muon_fills_its_half_from_the_recipe_and_leaves_adamw_its_own(shakespeare_dir, tmp_path):
    plan = planned(shakespeare_dir, tmp_path, "--optimizer", "muon", "--lr", "1e-3")
    optimizer = plan.ds.config["optimizer"]
    assert optimizer["type"] == "Muon" and plan.ds.optimizer == "muon"
    params = optimizer["params"]
    assert {k: params[k] for k in MUON_DEFAULTS} == MUON_DEFAULTS
    assert params["lr"] == 1e-3 and params["weight_decay"] == 0.1
    assert params["torch_adam"] is True  # the AdamW half, as AdamW gets it on CPU ranks
    assert plan.ds.config["gradient_clipping"] == 0.0  # Muon runs unclipped
    assert plan.ds.config["scheduler"]["type"] == "WarmupCosineLR"  # scales each group's lr
    assert any(
        n.startswith("optimizer: Muon on the hidden matrices: lr 0.02") for n in plan.ds.notes
    )
    assert split_line(plan.shape) in plan.notes


def test_muon_flags_override_its_defaults(shakespeare_dir, tmp_path):
    flags = ["--optimizer", "muon", "--muon_lr", "0.05", "--muon_momentum", "0.9",
             "--muon_weight_decay", "0"]  # fmt: skip
    params = planned(shakespeare_dir, tmp_path, *flags).ds.config["optimizer"]["params"]
    assert (params["muon_lr"], params["momentum"], params["muon_weight_decay"]) == (0.05, 0.9, 0)


def test_adamw_back_from_a_muon_config(shakespeare_dir, tmp_path):
    plan = planned(shakespeare_dir, tmp_path, "--optimizer", "adamw")
    assert plan.ds.config["optimizer"]["type"] == "AdamW" and plan.ds.optimizer == "adamw"
    assert plan.ds.config["gradient_clipping"] == 1.0


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--lr_schedule", "linear"], ["WarmupDecayLR", "--lr_schedule linear", "cosine or wsd"]),
        (["--lr_schedule", "constant"], ["WarmupLR", "--lr_schedule constant", "cosine or wsd"]),
        (["--grad_clip", "1.0"], ["gradient_clipping 1.0", "--grad_clip", "Muon", "set it to 0"]),
        (["--muon_momentum", "1.0"], ["--muon_momentum", "[0, 1)", "1.0"]),
        (["--muon_lr", "0"], ["--muon_lr", "> 0"]),
    ],
)
def test_what_muon_cannot_take_is_refused_by_name(shakespeare_dir, tmp_path, flags, named):
    problems = refusals(shakespeare_dir, tmp_path, "--optimizer", "muon", *flags)
    assert len(problems) == 1, problems
    assert_names(problems[0], *named)


def test_muon_flags_without_muon_are_refused(shakespeare_dir, tmp_path):
    (problem,) = refusals(shakespeare_dir, tmp_path, "--muon_lr", "0.05")
    assert_names(problem, "--muon_lr", "--optimizer muon")


def test_zero3_muon_turns_off_reduce_scatter(shakespeare_dir, tmp_path):
    """DeepSpeed's stage 3 raises on Muon with reduce_scatter (its optimizer's __init__)."""
    plan = planned(shakespeare_dir, tmp_path, "--optimizer", "muon", "--deepspeed_config", "zero3")
    assert plan.ds.config["zero_optimization"]["reduce_scatter"] is False


def test_the_split_line_counts_the_models_own_parameters():
    shape = resolve_shape("gpt2-tiny", block_size=64)
    halves = {"hidden": [0, 0], "embeddings": [0, 0], "vectors": [0, 0]}
    for name, p in build_model(shape).named_parameters():
        half = (
            "hidden"
            if is_muon_matrix(name, p.shape)
            else "embeddings"
            if p.ndim == 2
            else "vectors"
        )
        halves[half][0] += 1
        halves[half][1] += p.numel()
    line = split_line(shape)
    assert f"Muon {halves['hidden'][0]} hidden matrices ({halves['hidden'][1] / 1e6:.2f}M" in line
    assert f"AdamW wte and wpe ({halves['embeddings'][1] / 1e6:.2f}M)" in line
    assert f"and {halves['vectors'][0]} biases and LayerNorm tensors" in line
    assert f"({halves['vectors'][1] / 1e6:.2f}M)" in line


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["zero1", "zero2", "zero3"])
def test_the_engine_gives_muon_the_hidden_matrices_and_adamw_the_rest(
    preset, shakespeare_dir, tmp_path
):
    """2 CPU ranks: the engine's groups, as the ZeRO optimizer holds them, are GPT-2's split:
    every attention and MLP weight in the one Muon group (its weight decay), wte and wpe in
    AdamW's decayed group, biases and LayerNorms in AdamW's undecayed one; it trains, Muon's
    momentum is kept, and nothing is compiled in a run that trains eager."""
    out = tmp_path / "groups.json"
    args = tiny_run_args(shakespeare_dir, tmp_path / "run", deepspeed_config=preset)
    args += ["--optimizer", "muon", "--groups_json", str(out)]
    proc = run_deepspeed(
        args, num_gpus=2, script=REPO / "tests" / "scripts" / "optimizer_groups.py"
    )
    found = json.loads(out.read_text())
    # CPU ranks train eager (--compile auto), and so does Muon's Newton-Schulz, which DeepSpeed
    # compiles: no inductor build at the first step, none that needs a C++ compiler
    assert found["compiled_graphs"] == 0, found["compiled_graphs"]
    assert "Muon: its Newton-Schulz runs eager, as the model" in proc.stdout, proc.stdout[-3000:]
    by_name = {group["name"]: group for group in found["groups"]}
    assert list(by_name) == ["hidden-muon-params", "embeddings-adam-params", "vectors-adam-params"]
    layers = range(resolve_shape("gpt2-tiny").n_layer)
    hidden = {f"transformer.h.{i}.{m}.weight" for i in layers for m in HIDDEN}
    muon = by_name["hidden-muon-params"]
    assert muon["muon"] and set(muon["params"]) == hidden
    assert muon["weight_decay"] == MUON_DEFAULTS["muon_weight_decay"]
    embeddings = by_name["embeddings-adam-params"]
    assert not embeddings["muon"] and embeddings["weight_decay"] == 0.1
    assert set(embeddings["params"]) == {"transformer.wte.weight", "transformer.wpe.weight"}
    vectors = by_name["vectors-adam-params"]
    assert not vectors["muon"] and vectors["weight_decay"] == 0.0
    assert all(
        n.endswith((".bias", "ln_1.weight", "ln_2.weight", "ln_f.weight"))
        for n in vectors["params"]
    )
    assert len(vectors["params"]) == 8 * len(layers) + 2
    losses = found["losses"]
    assert all(loss == loss for loss in losses) and losses[-1] < losses[0], losses
    # Muon's momentum is committed at each step, under gpt_ds's sync-free ZeRO-1/2 step too
    # (its replacements leave the overflow test False for a device norm, so the commit runs)
    assert found["momentum_norm"] > 0, found


@pytest.mark.parametrize(
    ("plan", "saved"),
    [
        ({"optimizer": "muon"}, "muon"),
        ({"deepspeed_config": {"optimizer": {"type": "Adam"}}}, "adam"),  # before plan named it
        (None, None),  # older still: nothing says, nothing is checked
    ],
)
def test_a_resume_keeps_the_optimizer_that_saved_it(plan, saved, tmp_path):
    """Adam and AdamW keep the same moments and may follow each other; Muon and AdamW may not
    (tests/test_faults.py launches the refusal)."""
    manifest = Manifest(
        tag="iter_4", iteration=4, world_size=2, zero_stage=2, model={}, config={}, files={},
        plan=plan,
    )  # fmt: skip
    ref = CheckpointRef(out_dir=tmp_path, tag="iter_4", manifest=manifest)
    assert manifest.optimizer == saved
    for now in ("adam", "adamw", "muon"):
        same = saved in (None, now) or {saved, now} == {"adam", "adamw"}
        if same:
            check_optimizer(ref, now)
            continue
        with pytest.raises(CheckpointError) as refused:
            check_optimizer(ref, now)
        way_on = "--optimizer muon" if saved == "muon" else "--optimizer adamw"
        assert_names(str(refused.value), f"{saved} run", f"optimizer is {now}", way_on)
