"""gpt_ds.launch.ops: the DeepSpeed ops a launch would JIT-build, built once by setup_env.sh."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from harness.launch import run_checked, run_deepspeed
from support.launch import REPO, launch_env, tiny_run_args

from gpt_ds.dsconfig.settings import AdamFacts
from gpt_ds.launch.machine import adam_facts
from gpt_ds.launch.ops import CPU_ADAM, FUSED_ADAM, wanted_ops


@pytest.mark.parametrize(
    "facts,expected",
    [
        (AdamFacts("cpu"), [CPU_ADAM]),  # the shared-memory all-reduce: never built
        (AdamFacts("cuda", compiler="nvcc 13.0"), [CPU_ADAM, FUSED_ADAM]),
        (AdamFacts("cuda", rocm=True, compiler="hipcc"), [CPU_ADAM, FUSED_ADAM]),
        (AdamFacts("cuda"), [CPU_ADAM]),  # no compiler: torch's fused AdamW, nothing to build
        (AdamFacts("cuda", prebuilt=True), [CPU_ADAM]),
        (AdamFacts("cuda", compiler="nvcc 13.0", compiler_blocked="9.0a"), [CPU_ADAM]),
    ],
)
def test_the_ops_built_are_those_a_launch_would_build(facts, expected):
    assert wanted_ops(facts) == expected


def built_files(extensions: Path) -> dict[Path, int]:
    """Each built op library under the JIT cache, with its modification time (ns)."""
    return {so: so.stat().st_mtime_ns for so in extensions.glob("*/*.so")}


@pytest.mark.slow
def test_the_built_ops_are_the_ones_a_launch_loads(shakespeare_dir, tmp_path):
    """setup_env.sh built them (here: the first run of it builds them); run again it rebuilds
    nothing and says each op is ready, and a 2-rank launch of an offload preset loads them
    as built (a launch's ninja, the venv's, is the one that built them)."""
    extensions = Path(os.environ["TORCH_EXTENSIONS_DIR"])
    ops = [sys.executable, "-m", "gpt_ds.launch.ops"]
    run_checked(ops, REPO, launch_env(), timeout=900)
    built = built_files(extensions)
    said = run_checked(ops, REPO, launch_env())
    assert f"built once into {extensions}:" in said
    for name, used_by in wanted_ops(adam_facts(offload=False)):
        assert f"{name.removesuffix('Builder')} ({used_by}) ... ready" in said
    assert "cpu_adam" in {so.parent.name for so in built}
    args = tiny_run_args(shakespeare_dir, tmp_path / "run", dry_run=True, eval_iters=1)
    args += ["--deepspeed_config", "ds_configs/zero2_offload.json"]
    out = run_deepspeed(args, num_gpus=2).stdout
    assert "DeepSpeed CPU Adam" in out
    assert built_files(extensions) == built
