"""Every main path runs with the runtime dependencies alone, at their declared floors, in the
torch that was there first.

`launchers/setup_env.sh` installs every extra, so the rest of the suite cannot see a missing
runtime dependency (the ZeRO-3 fine-tuning recipe needed `accelerate`, declared only in an
extra) or a floor nothing proves (`transformers>=4.45` lacked what every ZeRO-3 build uses).
Here a venv that already holds the floor's torch (a GPU image's own: conftest `floor_torch`,
PyPI's build, which runs on the CPU) gets `pip install -e .` (no extras) with each other
dependency pinned to the floor pyproject.toml declares; pip must keep that torch. Each main
path then runs once from it: prepare, train under ZeRO-1/2/3, resume, `--init_from` a small
pretrained GPT-2 under ZeRO-3, export, sample, the picker.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from harness.launch import run_checked
from helpers.venvs import declared_floors, pip_installs, venv_copy
from support.launch import REPO, TRAIN, free_port, launch_env, tiny_run_args

pytestmark = pytest.mark.slow

EXTRAS_ABSENT = ("pytest", "tensorboard", "wandb", "matplotlib", "datasets", "pyarrow")
FLOORS = declared_floors(REPO / "pyproject.toml")


@pytest.fixture(scope="module")
def floor_venv(floor_torch, tmp_path_factory) -> tuple[Path, dict[str, str], list[str]]:
    """(venv, environment, what pip installed) of `pip install -e .` into a copy of the floor
    torch's venv, every other runtime dependency pinned to its floor."""
    folder = tmp_path_factory.mktemp("floor")
    venv = folder / "venv"
    python = venv_copy(floor_torch, venv)
    pins = folder / "floors.txt"
    pins.write_text("\n".join(pin for pin in FLOORS if not pin.startswith("torch==")) + "\n")
    env = launch_env()
    env["PATH"] = f"{venv / 'bin'}:{env['PATH']}"
    env["TORCH_EXTENSIONS_DIR"] = str(venv / "torch_extensions")  # its own DeepSpeed sources
    env.pop("PYTHONPATH", None)
    report = folder / "pip-report.json"
    pip = [python, "-m", "pip", "install", "--quiet", "--no-cache-dir", "--report", report]
    run_checked([*pip, "-c", pins, "-e", REPO], REPO, env, timeout=900)
    installed = list(pip_installs(report))
    return venv, env, installed


def test_pip_keeps_the_torch_that_was_there(floor_venv):
    """The floor's torch was installed first: `pip install -e .` downloads and replaces none."""
    venv, env, installed = floor_venv
    assert "gpt_ds" in installed or "gpt-ds" in installed, installed
    torches = [name for name in installed if name.lower() == "torch" or "nvidia" in name]
    assert not torches, installed


def test_the_venv_holds_the_floors_and_no_extra(floor_venv):
    venv, env, _ = floor_venv
    python = venv / "bin" / "python"
    listed = run_checked([python, "-m", "pip", "list", "--format=freeze"], REPO, env).lower()
    for pin in FLOORS:
        name, version = pin.lower().split("==")
        found = re.search(rf"^{re.escape(name).replace('_', '[-_]')}==([^\n]+)$", listed, re.M)
        assert found and found[1].startswith(version), f"{pin}: {found and found[0]}"
    probe = "import importlib.util as u, sys; print([m for m in sys.argv[1:] if u.find_spec(m)])"
    assert run_checked([python, "-c", probe, *EXTRAS_ABSENT], REPO, env).strip() == "[]"


def test_every_main_path_runs_without_extras(floor_venv, tmp_path):
    """Each path in its own processes of the floor venv, one rank each (OMP_NUM_THREADS=1):
    the independent chains run two at a time, one per core."""
    venv, env, _ = floor_venv
    python, deepspeed = venv / "bin" / "python", venv / "bin" / "deepspeed"
    data = tmp_path / "data"
    run_checked([venv / "bin" / "gpt-ds-prepare", "--out_dir", data], REPO, env)

    def train(out: Path, runner: bool = False, **flags) -> str:
        """One rank: `deepspeed --num_gpus 1` once (the runner at its floor), else plain
        `python train.py` (the same trainer, without the runner's and launcher's start-up)."""
        args = tiny_run_args(data, out, eval_interval=0, eval_iters=1, warmup_iters=0, **flags)
        port = ["--master_port", str(free_port())]  # not 29500: another test's launch may hold it
        start = [deepspeed, "--num_gpus", "1", *port] if runner else [python]
        return run_checked([*start, TRAIN, *args], REPO, env)

    def zero3_through_the_runner_gets_gpt2s_init() -> None:
        """`deepspeed` itself at its floor, and a fresh ZeRO-3 build at the floor gets GPT-2's
        init: one step at lr 1e-30 keeps it, and the residual projections' std is
        0.02/sqrt(2 x 4 layers) (gpt_ds's own ZeRO-3 init: transformers < 5.23's left them at
        0.02)."""
        zero3 = {"deepspeed_config": "ds_configs/zero3.json", "max_iters": 1, "lr": 1e-30}
        train(tmp_path / "zero3", runner=True, **zero3)
        std_ratio = (
            "import sys; from deepspeed.utils.zero_to_fp32 import "
            "get_fp32_state_dict_from_zero_checkpoint as load; "
            "w = load(sys.argv[1], tag='final')['transformer.h.0.mlp.c_proj.weight']; "
            "print(w.std().item() / (0.02 / 8 ** 0.5))"
        )
        said = run_checked([python, "-c", std_ratio, tmp_path / "zero3"], REPO, env)
        ratio = float(said.split()[-1])
        assert 0.95 < ratio < 1.05, ratio

    def zero2_resumes_exports_and_samples() -> None:
        run_dir, hf = tmp_path / "zero2", tmp_path / "hf"
        train(run_dir, max_iters=2)
        resumed = train(run_dir, max_iters=3, resume=True)
        assert f"resumed from {run_dir}/final at iteration 2" in resumed
        run_checked([venv / "bin" / "gpt-ds-export", run_dir, "--output", hf], REPO, env)
        sample = [venv / "bin" / "gpt-ds-sample", "--model", hf, "--prompt", "ROMEO:"]
        said = run_checked([*sample, "--seed", "1", "--max_new_tokens", "5"], REPO, env)
        assert "ROMEO:" in said

    def zero3_fine_tunes_a_pretrained_model() -> None:
        pretrained = tmp_path / "pretrained"
        make = (
            "import sys, torch; from transformers import GPT2Config, GPT2LMHeadModel; "
            "torch.manual_seed(0); GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=64, "
            "n_positions=64)).save_pretrained(sys.argv[1])"
        )
        run_checked([python, "-c", make, pretrained], REPO, env)
        zero3 = {"deepspeed_config": "ds_configs/zero3.json", "model": None, "max_iters": 2}
        tuned = train(tmp_path / "tuned", init_from=pretrained, **zero3)
        assert "2 layers, 2 heads, 64 wide, block 64" in tuned

    def the_picker_picks() -> None:
        hardware = ["--gpus_per_node", "1", "--gpu_memory_gb", "24", "--global_batch_size", "8"]
        picker = [venv / "bin" / "gpt-ds-pick-preset", "--model", "gpt2"]
        assert "zero" in run_checked([*picker, *hardware], REPO, env)

    paths = [
        zero2_resumes_exports_and_samples,
        zero3_fine_tunes_a_pretrained_model,
        zero3_through_the_runner_gets_gpt2s_init,
        the_picker_picks,
    ]
    with ThreadPoolExecutor(max_workers=2) as pool:
        for done in [pool.submit(path) for path in paths]:
            done.result()  # a failed path's assertion, raised here
