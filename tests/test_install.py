"""`pip install .` (not editable) gives a working package: from a directory outside the checkout,
the console scripts prepare the bundled Tiny Shakespeare, `deepspeed --module gpt_ds.train` trains
with the `zero2` preset shipped inside the package, and `gpt-ds-export` writes a directory that
transformers loads.

The fresh venv sees the test environment's packages through a .pth file (offline, no download)
but not its editable gpt_ds: a .pth line adds a directory to sys.path without running the .pth
files in it, so the only gpt_ds it can import is the one pip installed into it.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import NamedTuple

import pytest
from harness.launch import run_checked
from helpers.messages import assert_names
from support.launch import REPO, free_port, launch_env, remove_shm_buffers, tiny_run_args

pytestmark = pytest.mark.slow

SCRIPTS = [
    "gpt-ds-prepare",
    "gpt-ds-export",
    "gpt-ds-sample",
    "gpt-ds-eval",
    "gpt-ds-pick-preset",
    "gpt-ds-preflight",
    "gpt-ds-plot",
    "gpt-ds-verify",
    "gpt-ds-universal",
]
# what a source checkout holds beside the project: never part of a build (data/ and out/ only
# at the top: gpt_ds/data/ is the package's own)
_NOT_SOURCE_ANYWHERE = shutil.ignore_patterns(
    ".venv", ".git", "build", "*.egg-info", "__pycache__", ".*_cache"
)


def not_source(directory: str, names: list[str]) -> set[str]:
    ignored = set(_NOT_SOURCE_ANYWHERE(directory, names))
    if Path(directory) == REPO:
        ignored |= {"data", "out"} & set(names)
    return ignored


def make_venv(venv: Path) -> Path:
    """A venv whose sys.path ends with this environment's site-packages; its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (Path(purelib) / "_test_env_deps.pth").write_text("".join(f"{p}\n" for p in ours))
    return python


def venv_env(venv: Path) -> dict[str, str]:
    """The launch environment, with the new venv's scripts first and nothing from the checkout."""
    env = launch_env()  # keeps the test venv's DeepSpeed JIT cache: same op sources, no rebuild
    env["PATH"] = f"{venv / 'bin'}:{env['PATH']}"
    env.pop("PYTHONPATH", None)
    env["VIRTUAL_ENV"] = str(venv)
    return env


def py_files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*.py") if "__pycache__" not in p.parts}


class Installed(NamedTuple):
    python: Path  # the new venv's
    work: Path  # an empty directory outside the checkout
    env: dict[str, str]
    source: Path  # the copy of the working tree that was installed


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    """`pip install .` of a copy of the working tree into a new venv (a fresh copy: a stale
    build/ could hide a package the wheel lacks)."""
    base = tmp_path_factory.mktemp("install")
    source = base / "src"
    shutil.copytree(REPO, source, ignore=not_source)
    python = make_venv(base / "venv")
    env = venv_env(base / "venv")
    pip = [python, "-m", "pip", "install", "--quiet", "--no-cache-dir"]
    pip += ["--no-deps", "--ignore-installed"]
    # offline with this environment's setuptools; where it has none (a venv of Python 3.12+
    # gets no setuptools) pip fetches the build requirements itself
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
    run_checked([*pip, *isolation, str(source)], base, env)
    work = base / "work"
    work.mkdir()
    return Installed(python, work, env, source)


def test_installed_package_is_complete_and_not_the_checkout(installed):
    python, work, env, source = installed
    code = "import gpt_ds, gpt_ds.dsconfig.schema as s; print(gpt_ds.__file__); print(s.PRESET_DIR)"
    package_file, preset_dir = run_checked([python, "-c", code], work, env).split()
    package = Path(package_file).parent
    venv = python.parent.parent
    assert package.is_relative_to(venv), package
    assert Path(preset_dir) == package / "ds_configs"
    assert sorted(p.name for p in Path(preset_dir).iterdir()) == sorted(
        p.name for p in (source / "ds_configs").iterdir()
    )
    assert py_files(package) == py_files(source / "gpt_ds"), "the wheel lacks modules of gpt_ds/"
    recipes = sorted(p.name for p in (source / "recipes").glob("*.yaml"))
    assert sorted(p.name for p in (package / "recipes").iterdir()) == recipes
    code = (  # the README's --config recipes/NAME.yaml, from a directory without recipes/
        "from gpt_ds.run.config import parse_args; "
        f"print(parse_args(['--config', 'recipes/{recipes[0]}']).out_dir)"
    )
    assert run_checked([python, "-c", code], work, env).strip().startswith("out/")
    for name in SCRIPTS:
        script = venv / "bin" / name
        assert script.read_text().startswith(f"#!{python}"), name


def test_preset_picker_reads_the_installed_presets(installed):
    python, work, env, _ = installed
    flags = ["--model", "gpt2", "--gpus_per_node", "4", "--gpu_memory_gb", "32"]
    out = run_checked(
        [python.parent / "gpt-ds-pick-preset", *flags, "--global_batch_size", "8", "--json"],
        work,
        env,
    )
    picked = json.loads(out)
    candidates = [c for c in picked["candidates"] if c["preset"]]
    assert candidates and all(c["settings_from"] == f"ds_configs/{c['preset']}" for c in candidates)
    # the printed command is one an installed package runs: no checkout paths in it
    command = picked["recommendation"]["command"]
    assert command.startswith("deepspeed --num_gpus 4 --module gpt_ds.train --deepspeed_config ")
    assert "ds_configs/" not in command and ".json" not in command


def test_hints_name_the_installed_commands(installed):
    python, work, env, _ = installed
    proc = subprocess.run(
        [python, "-m", "gpt_ds.train", "--model", "gpt2-tiny", "--data_dir", "nodata"],
        cwd=work, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    assert_names(proc.stderr, "--data_dir nodata", "gpt-ds-prepare --out_dir nodata")  # the fix


def test_prepare_train_export_from_outside_the_checkout(installed):
    python, work, env, _ = installed
    venv_bin = python.parent
    run_checked([venv_bin / "gpt-ds-prepare", "--out_dir", "data"], work, env)
    meta = json.loads((work / "data" / "meta.json").read_text())
    assert Path(meta["sources"][0]["path"]).name == "tinyshakespeare.txt"
    assert Path(meta["sources"][0]["path"]).is_relative_to(python.parent.parent)

    args = tiny_run_args(
        Path("data"), Path("out"), deepspeed_config="zero2", max_iters=2, warmup_iters=1
    )
    port = free_port()
    launcher = [python, "-m", "deepspeed.launcher.runner", "--num_gpus", "1"]
    try:
        run_checked(
            [*launcher, "--master_port", port, "--module", "gpt_ds.train", *args], work, env
        )
    finally:
        remove_shm_buffers("127.0.0.1", port)
    assert (work / "out" / "latest").read_text().strip() == "final"

    run_checked([venv_bin / "gpt-ds-export", "out", "--output", "hf", "--quiet"], work, env)
    from transformers import GPT2LMHeadModel

    model, info = GPT2LMHeadModel.from_pretrained(work / "hf", output_loading_info=True)
    assert (model.config.n_layer, model.config.n_embd) == (4, 128)  # gpt2-tiny
    assert not any(info.values()), info  # no missing, unexpected or mismatched weights

    sample = [venv_bin / "gpt-ds-sample", "--model", "hf", "--prompt", "ROMEO:", "--temperature"]
    text = run_checked([*sample, "0", "--max_new_tokens", "8"], work, env)
    continuation = text.split("\n" + "-" * 40 + "\n")[0]  # up to the sample's separator line
    assert continuation.startswith("ROMEO:") and len(continuation) > len("ROMEO:")
