"""launchers/wheelhouse.sh: every wheel gpt_ds needs beyond torch, installed on a "node" with
no index at all; and gpt_ds/launch/wheelhouse.py's choice of packages from pip's report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from harness.launch import run_checked
from helpers.venvs import pip_installs, venv_copy
from support.launch import REPO

from gpt_ds.launch.wheelhouse import (
    canonical,
    freeze_versions,
    main,
    needed,
    target_env,
)

SCRIPT = REPO / "launchers" / "wheelhouse.sh"
# The kit for a GPU image (Python 3.12, its own torch 2.11 and transformers 5.17, what an H200
# node here had) is copied beside a checkout, at most 64 MiB in all
MAX_KIT_MIB = 48
IMAGE_PYTHON = "3.12"
IMAGE_FREEZE = REPO / "tests" / "data" / "gpu_image_freeze.txt"  # that image's `pip freeze`


def freeze_projects(text: str) -> set[str]:
    """The projects a `pip freeze` lists."""
    return set(freeze_versions(text))


def item(name: str, version: str, *requires: str, requested: bool = False) -> dict:
    meta = {"name": name, "version": version, "requires_dist": list(requires)}
    return {"metadata": meta, "requested": requested}


REPORT = {
    "install": [
        item(
            "gpt_ds",
            "0.1",
            "torch>=2",
            "Deep_Speed>=0.19",
            "tqdm",
            'pytest; extra == "dev"',
            'old-shim; python_version < "3.9"',
            requested=True,
        ),  # fmt: skip
        item("torch", "2.13", "filelock", "sympy", "nvidia-nccl; platform_system == 'Linux'"),
        item("Deep_Speed", "0.19", "torch", "filelock", "hjson>=3"),
        item("tqdm", "4"),
        item("pytest", "9", "pluggy"),
        item("pluggy", "1"),
        item("filelock", "3"),
        item("sympy", "1", "mpmath"),
        item("mpmath", "1"),
        item("nvidia-nccl", "2"),
        item("hjson", "3"),
        item("old-shim", "1"),
    ]
}


def names(found: list[tuple[str, str]]) -> list[str]:
    return [canonical(n) for n, _ in found]


def test_torch_and_what_only_torch_needs_stay_out():
    found = names(needed(REPORT, set(), {"torch"}, target_env(None)))
    assert found[0] == "gpt-ds"
    assert set(found) == {"gpt-ds", "deep-speed", "tqdm", "filelock", "hjson"}  # filelock: shared


def test_extras_and_markers_are_the_targets():
    with_dev = names(needed(REPORT, {"dev"}, {"torch"}, target_env(None)))
    assert {"pytest", "pluggy"} <= set(with_dev)
    old_python = names(needed(REPORT, set(), {"torch"}, target_env("3.8")))
    assert "old-shim" in old_python and "old-shim" not in with_dev


def test_what_the_target_has_is_left_out():
    have = freeze_projects(
        "tqdm==4.1\n# a comment\nHJSON @ file:///x.whl\n-e git+https://x#egg=y\n"
    )
    assert have == {"tqdm", "hjson"}
    found = names(needed(REPORT, set(), {"torch"} | have, target_env(None)))
    assert set(found) == {"gpt-ds", "deep-speed", "filelock"}


def test_what_the_target_has_too_old_goes_in_and_is_named(tmp_path, capsys):
    """An H200 node's image had transformers 5.17 where gpt_ds needs 5.23: left out by name,
    the node's pip would have refused the install. A version that meets it stays out."""
    have = freeze_versions("tqdm==4.1\nhjson==2.0\nfilelock @ file:///f.whl\n")
    assert have == {"tqdm": "4.1", "hjson": "2.0", "filelock": ""}
    found = names(needed(REPORT, set(), {"torch"}, target_env(None), have))
    assert set(found) == {"gpt-ds", "deep-speed", "hjson"}  # hjson>=3 is not met by 2.0
    report, freeze = tmp_path / "report.json", tmp_path / "freeze.txt"
    report.write_text(json.dumps(REPORT))
    freeze.write_text("hjson==2.0\ntqdm==4.1\n")
    assert main([str(report), "--have", str(freeze)]) == 0
    out, err = capsys.readouterr()
    assert "hjson==3" in out.split() and "tqdm==4" not in out.split()
    assert "hjson 3 replaces the target's 2.0" in err


def wheelhouse(*args, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "GPT_DS_PYTHON": sys.executable}
    proc = subprocess.run(
        ["bash", str(SCRIPT), *map(str, args)], env=env, capture_output=True, text=True, timeout=900
    )
    assert not check or proc.returncode == 0, proc.stderr[-4000:]
    return proc


def test_bad_arguments_are_refused_before_any_work(tmp_path):
    assert "wheelhouse.sh DIR" in wheelhouse(check=False).stderr
    missing = wheelhouse(tmp_path / "wh", "--have", tmp_path / "none.txt", check=False)
    assert missing.returncode == 2 and "none.txt: no such file" in missing.stderr
    assert not (tmp_path / "wh").exists()


@pytest.fixture(scope="module")
def house(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheelhouse") / "wheels"
    wheelhouse(out)
    return out


def wheel_names(folder: Path) -> set[str]:
    return {canonical(p.name.split("-")[0]) for p in folder.glob("*.whl")}


@pytest.mark.slow
def test_a_node_with_the_floor_torch_and_no_index_installs_and_trains_from_it(
    house, floor_torch, tmp_path
):
    """A node whose torch is pyproject's floor (conftest `floor_torch`): `pip install
    --no-index` from the wheelhouse installs gpt_ds and keeps that torch."""
    assert {"gpt-ds", "deepspeed", "transformers", "numpy"} <= wheel_names(house)
    assert "torch" not in wheel_names(house) and not any(
        n.startswith("nvidia") for n in wheel_names(house)
    )
    venv = tmp_path / "node"
    python = venv_copy(floor_torch, venv)  # the node's own torch (and what torch needs)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON", "GPT_DS_"))}
    env["PATH"] = f"{venv / 'bin'}:{env['PATH']}"
    # its own DeepSpeed's JIT builds, should a run make any (this one makes none): built from
    # other sources into the suite's cache, they would be rebuilt at its next launch
    env["TORCH_EXTENSIONS_DIR"] = str(venv / "torch_extensions")
    report = tmp_path / "report.json"
    pip = [python, "-m", "pip", "install", "--quiet", "--no-cache-dir", "--report", report]
    # --isolated: no pip config, no PIP_* variable (this machine's find-links), no index
    run_checked([*pip, "--isolated", "--no-index", "--find-links", house, "gpt_ds"], tmp_path, env)
    installed = {canonical(name) for name in pip_installs(report)}
    assert "gpt-ds" in installed and "torch" not in installed, installed
    where = run_checked(
        [python, "-c", "import gpt_ds, deepspeed; print(gpt_ds.__file__)"], tmp_path, env
    )
    assert str(venv) in where and str(REPO) not in where
    run_checked([venv / "bin" / "gpt-ds-prepare", "--out_dir", tmp_path / "data"], tmp_path, env)
    args = ["--data_dir", tmp_path / "data", "--out_dir", tmp_path / "out", "--model", "gpt2-tiny",
            "--block_size", 64, "--deepspeed_config", "zero2", "--dry_run"]  # fmt: skip
    out = run_checked([python, "-m", "gpt_ds.train", *args], tmp_path, env)
    assert "dry run: model and engine built on every rank" in out


@pytest.mark.slow
def test_the_kit_for_a_gpu_image_is_small_and_leaves_its_torch_and_transformers(tmp_path):
    """The kit for a GPU image (its Python, and its `pip freeze`: torch, transformers and what
    they pull in) holds what the image lacks, no torch, no CUDA library, no transformers (the
    image's meets the floor), in at most MAX_KIT_MIB."""
    have = freeze_versions(IMAGE_FREEZE.read_text())
    assert have["torch"] == "2.11.0" and have["transformers"] == "5.17.0"
    assert {"tokenizers", "numpy", "nvidia-nccl-cu13"} <= set(have)
    kit = tmp_path / "kit"
    wheelhouse(kit, "--python", IMAGE_PYTHON, "--have", IMAGE_FREEZE)
    names = wheel_names(kit)
    assert {"gpt-ds", "deepspeed", "tiktoken"} <= names, names
    assert "pydantic" not in have and {"pydantic", "pydantic-core"} <= names  # DeepSpeed's
    assert not {"torch", "transformers", "numpy"} & names and not any("nvidia" in n for n in names)
    mib = sum(p.stat().st_size for p in kit.iterdir()) / 2**20
    assert mib <= MAX_KIT_MIB, (mib, sorted(p.name for p in kit.iterdir()))
