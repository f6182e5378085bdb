"""ZeRO presets, their schema and the resolver: every preset resolves, every bad config is named."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
from pathlib import Path

import jsonschema
import pytest
from harness.launch import run_python
from helpers.machine import here
from helpers.messages import assert_names, names
from support.launch import free_port, launch_env, remove_shm_buffers

from gpt_ds.base.errors import ConfigError
from gpt_ds.dsconfig.monitors import monitor_package_problems
from gpt_ds.dsconfig.optimization import choose_adam
from gpt_ds.dsconfig.resolve import ResolvedDsConfig, resolve_ds_config
from gpt_ds.dsconfig.schema import PRESETS, SCHEMA_PATH, load_ds_config, preset_path
from gpt_ds.dsconfig.settings import MachineFacts, RunSettings
from gpt_ds.launch.machine import adam_facts, cpu_precision, detect_precision

STAGES = {"zero1": 1, "zero2": 2, "zero2_offload": 2, "zero3": 3, "zero3_offload": 3}


def run_settings(**overrides) -> RunSettings:
    values = dict(world_size=1, decay_iters=2000, precision="fp32")
    values.update(overrides)
    return RunSettings(**values)


def zero2() -> dict:
    return load_ds_config(preset_path("zero2"))


def write(tmp_path: Path, cfg: dict | str, name: str = "x.json") -> Path:
    path = tmp_path / name
    path.write_text(cfg if isinstance(cfg, str) else json.dumps(cfg, indent=2))
    return path


def problems_of(excinfo: pytest.ExceptionInfo) -> str:
    return "\n".join(excinfo.value.problems)


def problem(excinfo: pytest.ExceptionInfo, subject: str) -> str:
    """The one problem of the raised ConfigError that names `subject` (a field, flag or file)."""
    found = [p for p in excinfo.value.problems if names(p, subject)]
    assert len(found) == 1, f"{len(found)} problems name {subject!r}:\n{problems_of(excinfo)}"
    return found[0]


def autos(obj, path="") -> list[str]:
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in autos(v, f"{path}.{k}")]
    if isinstance(obj, list):
        return [p for i, v in enumerate(obj) for p in autos(v, f"{path}[{i}]")]
    return [path] if obj == "auto" else []


# ---------------------------------------------------------------------------------------------
# Presets


def test_schema_is_valid_draft_2020_12():
    schema = json.loads(SCHEMA_PATH.read_text())
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize("world_size", [1, 2, 8])
@pytest.mark.parametrize("name", PRESETS)
def test_preset_validates_and_resolves(name, world_size):
    raw = load_ds_config(preset_path(name))
    before = copy.deepcopy(raw)
    r = resolve_ds_config(raw, run_settings(world_size=world_size), source=name, facts=here())

    assert raw == before, "resolve must not modify its input"
    assert isinstance(r, ResolvedDsConfig)
    assert autos(r.config) == []
    cfg = r.config
    assert r.zero_stage == STAGES[name] == cfg["zero_optimization"]["stage"]
    assert (r.micro_batch_size, r.grad_accum) == (4, 1)
    assert r.train_batch_size == 4 * world_size == cfg["train_batch_size"]
    assert cfg["train_micro_batch_size_per_gpu"] == 4 and cfg["gradient_accumulation_steps"] == 1
    assert cfg["bf16"]["enabled"] is False and cfg["fp16"]["enabled"] is False
    assert cfg["optimizer"]["params"]["lr"] == pytest.approx(6e-4)
    sched = cfg["scheduler"]["params"]
    assert sched["total_num_steps"] == 2000 and sched["warmup_num_steps"] == 100
    assert sched["cos_min_ratio"] == pytest.approx(0.1)
    assert cfg["gradient_clipping"] == 1.0
    offload = cfg["zero_optimization"]
    assert ("offload_optimizer" in offload) == name.endswith("offload")
    assert ("offload_param" in offload) == (name == "zero3_offload")
    assert any(n.startswith("precision: fp32") for n in r.notes)


@pytest.mark.parametrize("name", ["zero1", "zero2"])
def test_overlap_comm_auto_is_off_on_one_rank_and_a_users_value_stands(name, tmp_path):
    """The ZeRO-1/2 presets' "auto": off on one rank (nothing to overlap; on, DeepSpeed
    synchronizes the device after every backward), on with several, said in a note; a user's
    own config keeps its true."""
    raw = load_ds_config(preset_path(name))
    assert raw["zero_optimization"]["overlap_comm"] == "auto"
    for world, on in ((1, False), (2, True), (8, True)):
        r = resolve_ds_config(raw, run_settings(world_size=world), source=name, facts=here())
        assert r.config["zero_optimization"]["overlap_comm"] is on
        assert f'overlap_comm: {str(on).lower()} (was "auto": ' in "\n".join(r.notes)
    raw["zero_optimization"]["overlap_comm"] = True
    mine = load_ds_config(write(tmp_path, raw))
    r = resolve_ds_config(mine, run_settings(world_size=1), source="mine.json", facts=here())
    assert r.config["zero_optimization"]["overlap_comm"] is True
    assert not any(n.startswith("overlap_comm") for n in r.notes)


@pytest.mark.parametrize("name", PRESETS)
def test_resolved_preset_parses_in_deepspeed_config(name):
    """DeepSpeed's own config parser (pydantic models, batch assertion) accepts the result."""
    from deepspeed.runtime.config import DeepSpeedConfig

    r = resolve_ds_config(
        load_ds_config(preset_path(name)), run_settings(precision="bf16"), facts=here()
    )
    parsed = DeepSpeedConfig(r.config)  # no process group: DeepSpeed assumes world size 1
    assert parsed.zero_optimization_stage == STAGES[name]
    assert parsed.bfloat16_config.enabled and not parsed.float16_config.enabled
    assert parsed.train_batch_size == r.train_batch_size


PYDANTIC_SECTIONS = {
    "zeroOptimization": "deepspeed.runtime.zero.config:DeepSpeedZeroConfig",
    "offloadParam": "deepspeed.runtime.zero.offload_config:DeepSpeedZeroOffloadParamConfig",
    "offloadOptimizer": "deepspeed.runtime.zero.offload_config:DeepSpeedZeroOffloadOptimizerConfig",
    "bf16": "deepspeed.runtime.precision_config:DeepSpeedBF16Config",
    "fp16": "deepspeed.runtime.precision_config:DeepSpeedFP16Config",
    "tensorboard": "deepspeed.monitor.config:TensorBoardConfig",
    "wandb": "deepspeed.monitor.config:WandbConfig",
    "csvMonitor": "deepspeed.monitor.config:CSVConfig",
    "comet": "deepspeed.monitor.config:CometConfig",
    "commsLogger": "deepspeed.comm.config:CommsLoggerConfig",
}


@pytest.mark.parametrize("section", PYDANTIC_SECTIONS)
def test_schema_section_matches_deepspeed_model(section):
    """Each strict schema section lists exactly the keys DeepSpeed's pydantic model accepts
    (fields and aliases), so a DeepSpeed upgrade that adds or drops a key fails here."""
    import importlib

    module, cls = PYDANTIC_SECTIONS[section].split(":")
    model = getattr(importlib.import_module(module), cls)
    accepted = set(model.model_fields) | {f.alias for f in model.model_fields.values() if f.alias}
    schema = json.loads(SCHEMA_PATH.read_text())
    assert set(schema["$defs"][section]["properties"]) == accepted


# ---------------------------------------------------------------------------------------------
# Rejected configs: each message names the field (and the facts a user acts on; not sentences)


def test_misspelled_top_level_key(tmp_path):
    cfg = zero2()
    cfg["zero_optimisation"] = cfg.pop("zero_optimization")
    with pytest.raises(ConfigError) as e:
        load_ds_config(write(tmp_path, cfg))
    assert_names(problem(e, "zero_optimisation"), "zero_optimization")
    assert_names(str(e.value), str(tmp_path / "x.json"))


def test_misspelled_nested_key(tmp_path):
    cfg = zero2()
    cfg["zero_optimization"]["overlap_comms"] = cfg["zero_optimization"].pop("overlap_comm")
    cfg["optimizer"]["params"]["weight_decy"] = 0.1
    with pytest.raises(ConfigError) as e:
        load_ds_config(write(tmp_path, cfg))
    assert_names(problem(e, "zero_optimization.overlap_comms"), "overlap_comm")
    assert_names(problem(e, "optimizer.params.weight_decy"), "weight_decay")


def test_wrong_type(tmp_path):
    cfg = zero2()
    cfg["train_micro_batch_size_per_gpu"] = "4"
    cfg["zero_optimization"]["overlap_comm"] = "yes"
    with pytest.raises(ConfigError) as e:
        load_ds_config(write(tmp_path, cfg))
    assert_names(problem(e, "train_micro_batch_size_per_gpu"), "'4'", "integer")
    overlap = problem(e, "zero_optimization.overlap_comm")
    assert_names(overlap, "'yes'", "boolean", "null", '"auto"')


def test_stage_4(tmp_path):
    cfg = zero2()
    cfg["zero_optimization"]["stage"] = 4
    with pytest.raises(ConfigError) as e:
        load_ds_config(write(tmp_path, cfg))
    assert_names(problem(e, "zero_optimization.stage"), "4", "[0, 1, 2, 3]")


def test_bad_offload_device(tmp_path):
    cfg = load_ds_config(preset_path("zero3_offload"))
    cfg["zero_optimization"]["offload_param"]["device"] = "gpu"
    with pytest.raises(ConfigError) as e:
        load_ds_config(write(tmp_path, cfg))
    device = problem(e, "zero_optimization.offload_param.device")
    assert_names(device, "gpu", "cpu", "nvme", "none")


def test_every_schema_problem_reported_at_once(tmp_path):
    cfg = zero2()
    cfg["zero_optimization"]["stage"] = 4
    cfg["train_batch_size"] = 0
    cfg["optimizer"]["type"] = "OneBitAdam"  # removed from DeepSpeed 0.19
    cfg["amp"] = {"enabled": True}
    with pytest.raises(ConfigError) as e:
        load_ds_config(write(tmp_path, cfg))
    assert len(e.value.problems) == 4
    assert_names(problem(e, "train_batch_size"), "0", "1")  # the value, the minimum
    assert_names(problem(e, "optimizer.type"), "OneBitAdam")
    assert_names(problem(e, "amp"), "bf16")  # removed from DeepSpeed: what to use instead


def test_scheduler_params_checked_per_type(tmp_path):
    cfg = zero2()
    cfg["scheduler"]["params"]["warmup_steps"] = 10
    with pytest.raises(ConfigError) as e:
        load_ds_config(write(tmp_path, cfg))
    assert_names(problem(e, "scheduler.params.warmup_steps"), "warmup_num_steps")


def test_invalid_json_names_line_and_column(tmp_path):
    path = write(tmp_path, '{\n  "train_batch_size": 8,\n  "gradient_clipping": 1.0,\n}\n')
    with pytest.raises(ConfigError) as e:
        load_ds_config(path)
    assert_names(problems_of(e), f"{path}:4:1", "JSON")


def test_duplicate_key(tmp_path):
    path = write(tmp_path, '{"train_batch_size": 8, "train_batch_size": 16}')
    with pytest.raises(ConfigError) as e:
        load_ds_config(path)
    assert_names(problem(e, "train_batch_size"), "duplicate")


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_ds_config(tmp_path / "nope.json")
    assert_names(problem(e, str(tmp_path / "nope.json")), "no such file")


def test_batch_arithmetic_mismatch():
    cfg = zero2()
    cfg.update(train_batch_size=32, train_micro_batch_size_per_gpu=4, gradient_accumulation_steps=2)
    with pytest.raises(ConfigError) as e:
        resolve_ds_config(cfg, run_settings(world_size=2), source="x.json", facts=here())
    # each value with the key it is: the sides of train_batch_size = micro x accumulation x world
    assert_names(
        problem(e, "train_batch_size 32"),
        "train_micro_batch_size_per_gpu 4",
        "gradient_accumulation_steps 2",
        "world size 2",
        "16",
    )


def test_batch_not_divisible():
    cfg = zero2()
    cfg.update(train_batch_size=24)
    with pytest.raises(ConfigError) as e:
        resolve_ds_config(cfg, run_settings(world_size=4, micro_batch_size=4), facts=here())
    assert_names(
        problem(e, "train_batch_size 24"),
        "train_micro_batch_size_per_gpu 4",
        "world size 4",
    )


def test_config_and_cli_conflict():
    cfg = zero2()
    cfg["train_micro_batch_size_per_gpu"] = 8
    cfg["optimizer"]["params"]["lr"] = 3e-4
    with pytest.raises(ConfigError) as e:
        resolve_ds_config(
            cfg, run_settings(micro_batch_size=4, lr=1e-3), source="ds_configs/x.json", facts=here()
        )
    micro = problem(e, "--micro_batch_size 4")
    assert_names(micro, "train_micro_batch_size_per_gpu", "8", "ds_configs/x.json")
    assert_names(problem(e, "--lr 0.001"), "optimizer.params.lr", "0.0003", "ds_configs/x.json")


def test_equal_config_and_cli_values_agree():
    cfg = zero2()
    cfg["train_micro_batch_size_per_gpu"] = 8
    r = resolve_ds_config(cfg, run_settings(micro_batch_size=8), facts=here())
    assert r.micro_batch_size == 8


def test_fp16_and_bf16_both_enabled():
    cfg = zero2()
    cfg["bf16"]["enabled"] = True
    cfg["fp16"]["enabled"] = True
    with pytest.raises(ConfigError) as e:
        resolve_ds_config(cfg, run_settings(precision=None), source="x.json", facts=here())
    assert_names(problem(e, "bf16.enabled"), "fp16.enabled", "true", "x.json")


def test_pinned_precision_conflicts_with_cli():
    cfg = zero2()
    cfg["bf16"]["enabled"] = True
    with pytest.raises(ConfigError) as e:
        resolve_ds_config(cfg, run_settings(precision="fp32"), source="x.json", facts=here())
    assert_names(problem(e, "--precision fp32"), "bf16.enabled", "true", "x.json")


def _missing_monitor() -> tuple[str, str]:
    """A monitor section whose package this environment lacks (tensorboard, wandb or comet_ml)."""
    for section, module in (
        ("tensorboard", "tensorboard"),
        ("wandb", "wandb"),
        ("comet", "comet_ml"),
    ):
        if importlib.util.find_spec(module) is None:
            return section, module
    pytest.fail("tensorboard, wandb and comet_ml are all installed: patch find_spec instead")


def test_monitor_enabled_without_its_package():
    section, module = _missing_monitor()
    cfg = zero2()
    cfg[section] = {"enabled": True}
    with pytest.raises(ConfigError) as e:
        resolve_ds_config(cfg, run_settings(), facts=here())
    missing = problem(e, f"{section}.enabled")
    assert_names(missing, "true", "pip install")
    assert_names(missing.replace(f"{section}.enabled", ""), module)  # the package, not the key
    cfg[section]["enabled"] = False
    resolve_ds_config(cfg, run_settings(), facts=here())


def test_monitor_packages_are_checked_against_the_probed_versions():
    """The machine's probed versions decide, not this environment's: a missing package and one
    older than DeepSpeed needs (comet_ml 3.41) are each a problem naming the fix."""
    cfg = {"comet": {"enabled": True}, "wandb": {"enabled": True}, "tensorboard": {}}
    old = monitor_package_problems(cfg, {"comet_ml": "3.40.2", "wandb": None})
    assert len(old) == 2, old
    assert_names(old[0], "wandb.enabled", "'wandb' package is not installed", "--wandb_project")
    assert_names(old[1], "comet.enabled", 'pip install "comet_ml>=3.41.0"')
    assert monitor_package_problems(cfg, {"comet_ml": "3.41.0", "wandb": "0.19.1"}) == []
    # PEP 440, as DeepSpeed compares: a release candidate comes before its release
    assert len(monitor_package_problems(cfg, {"comet_ml": "3.41.0rc1", "wandb": "0.19.1"})) == 1
    assert monitor_package_problems(cfg, {"comet_ml": "3.100.2", "wandb": "0.19.1"}) == []


def test_all_resolution_problems_raised_together():
    cfg = zero2()
    cfg.update(train_batch_size=30, train_micro_batch_size_per_gpu=8)
    cfg["bf16"]["enabled"] = cfg["fp16"]["enabled"] = True
    cfg["scheduler"]["params"]["total_num_steps"] = 500
    with pytest.raises(ConfigError) as e:
        resolve_ds_config(
            cfg, run_settings(world_size=2, micro_batch_size=4, decay_iters=10), facts=here()
        )
    assert len(e.value.problems) == 4


def test_bad_run_values():
    """RunSettings' one check (the run config's validation reports it with its other flags)."""
    problems = run_settings(micro_batch_size=0, precision="fp8", lr=-1.0).problems()

    def one(subject: str) -> str:
        (found,) = [p for p in problems if names(p, subject)]
        return found

    assert_names(one("--micro_batch_size"), "0")
    assert_names(one("--precision"), "'fp8'", "auto", "bf16", "fp16", "fp32")
    assert_names(one("--lr"), "-1.0")


# ---------------------------------------------------------------------------------------------
# Resolution rules


def test_cli_values_fill_autos():
    run = run_settings(
        world_size=2, micro_batch_size=2, grad_accum=3, lr=1e-3, min_lr=2e-4,
        warmup_iters=7, decay_iters=50, grad_clip=0.5,
    )  # fmt: skip
    r = resolve_ds_config(zero2(), run, facts=here())
    cfg = r.config
    assert (r.micro_batch_size, r.grad_accum, r.train_batch_size) == (2, 3, 12)
    assert cfg["optimizer"]["params"]["lr"] == 1e-3
    assert cfg["scheduler"]["params"] == {
        "total_num_steps": 50,
        "warmup_num_steps": 7,
        "warmup_min_ratio": 0,
        "cos_min_ratio": pytest.approx(0.2),
        "warmup_type": "linear",
    }
    assert cfg["gradient_clipping"] == 0.5
    assert (r.lr, r.min_lr, r.warmup_iters, r.grad_clip) == (1e-3, 2e-4, 7, 0.5)


@pytest.mark.parametrize(
    "config_batch, world, expected",
    [
        ({"train_batch_size": 32}, 2, (4, 4, 32)),  # micro default 4, accumulation derived
        ({"train_batch_size": 6}, 2, (3, 1, 6)),  # 4 does not divide: accumulation 1
        ({"train_batch_size": 32, "gradient_accumulation_steps": 2}, 4, (4, 2, 32)),
        ({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 8}, 2, (8, 4, 64)),
        ({"gradient_accumulation_steps": 5}, 2, (4, 5, 40)),
    ],
)
def test_batch_derivation(config_batch, world, expected):
    cfg = zero2()
    cfg.update(config_batch)
    r = resolve_ds_config(cfg, run_settings(world_size=world), facts=here())
    assert (r.micro_batch_size, r.grad_accum, r.train_batch_size) == expected


def test_short_run_warmup_at_least_one():
    r = resolve_ds_config(zero2(), run_settings(decay_iters=5), facts=here())
    assert r.config["scheduler"]["params"]["warmup_num_steps"] == 1


def test_warmup_longer_than_run_rejected():
    with pytest.raises(ConfigError) as e:
        resolve_ds_config(zero2(), run_settings(decay_iters=10, warmup_iters=20), facts=here())
    assert_names(problem(e, "warmup_num_steps 20"), "--warmup_iters", "10")


def test_the_schedules_span_is_named_by_the_flag_it_comes_from():
    """A span from a budget is its steps and that flag, not a --max_iters the user never gave."""
    cfg = zero2()
    cfg["scheduler"]["params"]["total_num_steps"] = 500
    with pytest.raises(ConfigError) as e:
        resolve_ds_config(
            cfg, run_settings(decay_iters=10, decay_from="--max_tokens"), facts=here()
        )
    assert_names(problem(e, "scheduler.params.total_num_steps"), "500", "10", "--max_tokens")
    assert not names(problems_of(e), "--max_iters")
    with pytest.raises(ConfigError) as e:
        resolve_ds_config(
            cfg, run_settings(decay_iters=10, decay_from="--lr_decay_iters"), facts=here()
        )
    assert_names(problem(e, "scheduler.params.total_num_steps"), "--lr_decay_iters 10")


def test_min_lr_conflicts_with_concrete_cos_min_ratio():
    cfg = zero2()
    cfg["scheduler"]["params"]["cos_min_ratio"] = 0.05
    r = resolve_ds_config(cfg, run_settings(lr=1e-3), facts=here())
    assert r.min_lr == pytest.approx(5e-5)
    with pytest.raises(ConfigError) as e:
        resolve_ds_config(cfg, run_settings(lr=1e-3, min_lr=1e-4), facts=here())
    assert_names(problem(e, "scheduler.params.cos_min_ratio"), "0.05", "--min_lr 0.0001")


def test_config_without_optimizer_or_scheduler():
    cfg = zero2()
    del cfg["optimizer"], cfg["scheduler"]
    r = resolve_ds_config(cfg, run_settings(lr=3e-4), facts=here())
    assert "optimizer" not in r.config and r.lr == 3e-4
    assert any("the trainer must pass one" in n for n in r.notes)


def detecting(precision: str, why: str = "test") -> MachineFacts:
    """This machine's facts, but detecting `precision` and refusing nothing."""
    return dataclasses.replace(here(), precision=(precision, why), fp16_refusal=None)


def test_precision_both_disabled_is_fp32():
    cfg = zero2()
    cfg["bf16"]["enabled"] = cfg["fp16"]["enabled"] = False
    r = resolve_ds_config(cfg, run_settings(precision=None), facts=detecting("bf16"))
    assert r.precision == "fp32"


@pytest.mark.parametrize("detected", ["bf16", "fp16", "fp32"])
def test_precision_detected_when_auto(detected):
    facts = detecting(detected, "test hardware")
    r = resolve_ds_config(zero2(), run_settings(precision="auto"), facts=facts)
    assert r.precision == detected
    assert r.config["bf16"]["enabled"] is (detected == "bf16")
    assert r.config["fp16"]["enabled"] is (detected == "fp16")
    assert r.config["fp16"]["loss_scale"] == 0  # the preset's dynamic loss scaling is kept
    assert f"precision: {detected} (test hardware)" in r.notes


def test_detected_precision_disabled_by_config_falls_back_to_fp32():
    cfg = zero2()
    cfg["bf16"]["enabled"] = False
    facts = detecting("bf16")
    assert resolve_ds_config(cfg, run_settings(precision=None), facts=facts).precision == "fp32"


def test_cli_precision_forces():
    r = resolve_ds_config(zero2(), run_settings(precision="fp16"), facts=detecting("bf16"))
    assert r.config["fp16"]["enabled"] is True and r.config["bf16"]["enabled"] is False


@pytest.mark.parametrize(
    "cpuinfo, expected",
    [
        ("processor: 0\nflags\t\t: fpu sse avx512f avx512_bf16 amx_bf16 amx_tile\n", "bf16"),
        ("flags : fpu avx2 avx512_bf16\n", "bf16"),
        ("flags : fpu sse avx2 avx512f\n", "fp32"),
        ("Features : fp asimd bf16 sve\n", "bf16"),
        (None, "fp32"),
    ],
)
def test_cpu_precision_from_cpuinfo(cpuinfo, expected):
    precision, reason = cpu_precision(cpuinfo)
    assert precision == expected and reason


def test_detect_precision_on_this_machine():
    precision, reason = detect_precision()
    assert precision in ("bf16", "fp16", "fp32") and reason


# ---------------------------------------------------------------------------------------------
# DeepSpeed itself accepts every resolved preset

ACCEPT_SCRIPT = '''
"""Initialize DeepSpeed with each resolved preset on a tiny GPT-2 and take optimizer steps."""
import json
import sys

import deepspeed
import torch
from deepspeed.accelerator import get_accelerator
from transformers import GPT2Config, GPT2LMHeadModel

from gpt_ds.base.dist import skip_cpu_shm_op
from gpt_ds.dsconfig.resolve import resolve_ds_config
from gpt_ds.dsconfig.settings import RunSettings
from gpt_ds.dsconfig.schema import load_ds_config, preset_path
from gpt_ds.launch.machine import probe_machine

skip_cpu_shm_op()  # as gpt_ds's ranks start DeepSpeed
failed = False
for name in sys.argv[1:]:
    try:
        torch.manual_seed(0)
        model = GPT2LMHeadModel(
            GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=128, n_positions=32)
        )
        run = RunSettings(world_size=1, decay_iters=4, micro_batch_size=2, precision="fp32")
        facts = probe_machine()
        raw = load_ds_config(preset_path(name))
        resolved = resolve_ds_config(raw, run, source=name, facts=facts)
        engine, _, _, _ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=resolved.config
        )
        x = torch.randint(0, 128, (2, 16))
        losses, lrs = [], []
        for _ in range(3):
            lrs.append(engine.get_lr()[0])
            loss = engine(input_ids=x, labels=x).loss
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        out = {
            "preset": name,
            "ok": all(v == v for v in losses),
            "losses": losses,
            "lrs": lrs,
            "stage": engine.zero_optimization_stage(),
            "basic_optimizer": type(engine.basic_optimizer).__name__,
            "accelerator": get_accelerator().device_name(),
        }
    except Exception as e:  # report, then go on with the next preset
        out = {"preset": name, "ok": False, "error": f"{type(e).__name__}: {e}"[:3000]}
    failed |= not out["ok"]
    print("RESULT " + json.dumps(out), flush=True)

if torch.distributed.is_initialized():
    torch.distributed.destroy_process_group()
sys.exit(1 if failed else 0)
'''


@pytest.mark.slow
def test_deepspeed_initializes_every_resolved_preset(tmp_path):
    """One process, all presets: deepspeed.initialize + 3 steps each (fp32 on CPU). The offload
    presets build DeepSpeedCPUAdam, JIT-compiled once into TORCH_EXTENSIONS_DIR (~90 s cold)."""
    script = write(tmp_path, ACCEPT_SCRIPT, "accept_presets.py")
    port = free_port()
    env = launch_env()
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", LOCAL_RANK="0")
    env.update(WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
    try:
        proc = run_python([str(script), *PRESETS], timeout=900, check=False, env=env)
    finally:
        remove_shm_buffers("127.0.0.1", port)
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            out = json.loads(line[len("RESULT ") :])
            results[out["preset"]] = out
    detail = f"rc={proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    assert set(results) == set(PRESETS), detail
    for name, out in results.items():
        assert out["ok"], f"{name}: {out.get('error')}\n{detail}"
        assert out["stage"] == STAGES[name]
        # offload: DeepSpeed's CPU Adam; otherwise what optimizer_choice picks for the machine:
        # torch's AdamW on CPU ranks (bit-exact resume) and on GPUs without a compiler
        if name.endswith("offload"):
            expected = "DeepSpeedCPUAdam"
        else:
            torch_adam = choose_adam(adam_facts(offload=False), {}).params.get("torch_adam")
            expected = "AdamW" if torch_adam else "FusedAdam"
        assert out["basic_optimizer"] == expected
    # Same seed, same data, fp32: every ZeRO stage computes the same losses.
    reference = results["zero1"]["losses"]
    for out in results.values():
        assert out["losses"] == pytest.approx(reference, rel=1e-5)
    # A rare ZeRO-3 abort at interpreter exit after all work is done is tolerated (see notes).
    assert proc.returncode == 0 or "terminate called without an active exception" in proc.stderr


@pytest.mark.parametrize(
    "text,parts",
    [  # {path}: the file; an empty or YAML file also gets a preset to copy, zero2.json
        ("", ["{path}", "empty", "zero2.json"]),
        ("  \n", ["{path}", "empty", "zero2.json"]),
        (
            "# zero 2\nzero_optimization:\n  stage: 2\n",
            ["{path}:1:1", "YAML", "JSON", "zero2.json"],
        ),
        ('{"train_batch_size": 8,}', ["{path}:1:24", "JSON"]),
    ],
)
def test_empty_and_yaml_config_files_are_named(tmp_path, text, parts):
    path = tmp_path / "ds.json"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_ds_config(path)
    assert_names(problems_of(e), *(part.format(path=path) for part in parts))


@pytest.mark.parametrize(
    "stage,precision,torch_adam,said",
    [(0, "bf16", True, True), (0, "bf16", False, False), (0, "fp32", True, False),
     (1, "bf16", True, False)],
)  # fmt: skip
def test_stage_0_in_16_bits_says_deepspeed_steps_each_tensor_apart(
    stage, precision, torch_adam, said
):
    """At stage 0 in 16 bits DeepSpeed wraps any optimizer but its FusedAdam in
    FP16_UnfusedOptimizer (0.47x ZeRO-2 on an H200): the plan says so, and the memory model
    counts that wrapper's gradients (DeepSpeedRun.fused_adam) by the same rule."""
    from gpt_ds.memory.estimate import DeepSpeedRun

    raw = zero2()
    raw["zero_optimization"] = {"stage": stage}
    raw["optimizer"]["params"]["torch_adam"] = torch_adam
    settings = run_settings(precision=precision)
    r = resolve_ds_config(raw, settings, source="x.json", facts=here())
    note = [n for n in r.notes if n.startswith(f"stage 0 in {precision}:")]
    assert bool(note) == said, r.notes
    run = DeepSpeedRun.from_resolved(
        r, world_size=1, gpus_per_node=1, activation_checkpointing=False, loss="chunked"
    )
    assert run.fused_adam is not torch_adam
