"""Shared test set-up: an isolated torch-extensions cache for DeepSpeed's JIT ops, the tools'
caches in a temp dir (nothing under $HOME), and the session fixtures (prepared data, one
training run per ZeRO stage) and `launch`, a run in the background. What only tests use lives
in helpers/, the suite's launch machinery (lean launches, the zygote) in harness/; what the
benchmarks use too (ports, the launches' environment, runs' files, a run in the background) in
benchmarks/support/, imported as `support.*` (pyproject.toml's pytest `pythonpath` names
benchmarks/)."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

# DeepSpeed JIT-compiles its CPU comm op on first use; a cache shared with another environment
# would be rebuilt at every launch. Keep it inside this virtual environment.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
# What the suite's tools would cache under $HOME (pip's downloads, built wheels and self-check,
# Hugging Face datasets, wandb, matplotlib) goes to a temp dir of this process, removed at its
# exit (below): `pytest` changes nothing outside the checkout and temp dirs
# (test_system_changes.py). Every process the tests start inherits it; every pip they spell
# also passes --no-cache-dir. Set before any import reads it (huggingface_hub's, at import).
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="gpt_ds-test-caches-")
os.environ.update(
    PIP_CACHE_DIR=os.path.join(os.environ["XDG_CACHE_HOME"], "pip"),  # above a pip.conf's
    MPLCONFIGDIR=os.path.join(os.environ["XDG_CACHE_HOME"], "matplotlib"),  # not ~/.config
)

import pytest  # noqa: E402
from harness.launch import (  # noqa: E402
    STAGE_RUN_ITERS,
    Launch,
    checkout_first,
    run_deepspeed,
    run_python,
    zygote,
)
from harness.zygote import ZYGOTE_ENV, differing_variables, read_served  # noqa: E402
from helpers.compared_runs import compared_run
from helpers.cpu_time import register_if_asked
from helpers.files import HELLASWAG_MINI
from helpers.shared import (
    both_workers,
    machine_turn,
    made_once,
    module_scheduling,
    run_order,
    shared_folder,
)
from helpers.venvs import floor_torch_venv
from support.launch import REPO, launch_env, tiny_run_args  # noqa: E402


@atexit.register
def _remove_test_caches(owner: int = os.getpid(), caches: str = os.environ["XDG_CACHE_HOME"]):
    """The temp dir of the caches, when the process that made it exits (not a forked child)."""
    if os.getpid() == owner:
        shutil.rmtree(caches, ignore_errors=True)


def selects_gpu_tests(markexpr: str) -> bool:
    """`pytest -m gpu` (or an expression naming gpu, not "not gpu"): the run meant for GPUs."""
    return "gpu" in markexpr and "not gpu" not in markexpr


def pytest_configure(config):
    """Every run but the GPU subset trains on CPU ranks, on any machine: the suite's numbers
    (gloo, CPU kernels, the CPU RNG of ZeRO-3's partitioned build) and its 2-rank launches
    assume them. Set before any test imports DeepSpeed or initialises CUDA; launched ranks
    inherit it (support/launch.py copies this environment)."""
    if not selects_gpu_tests(config.option.markexpr or ""):
        os.environ.update(CUDA_VISIBLE_DEVICES="", HIP_VISIBLE_DEVICES="", DS_ACCELERATOR="cpu")
    register_if_asked(config)  # $GPT_DS_TEST_CPU_LOG: each test's CPU seconds (CONTRIBUTING)


# The device files a GPU driver makes (NVIDIA, AMD ROCm): there without asking torch, whose
# CUDA the runs other than `pytest -m gpu` hide (pytest_configure)
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/kfd")


def skip_gpu_tests(config, items) -> None:
    """GPU tests run only in `pytest -m gpu` on a machine with a GPU; said with the reason the
    machine gives: it has no GPU, or it has one and this run keeps to CPU ranks."""
    import torch

    if not selects_gpu_tests(config.option.markexpr or ""):
        if not any(Path(f).exists() for f in GPU_DEVICE_FILES):
            reason = f"no GPU here (no {' or '.join(GPU_DEVICE_FILES)}): a GPU test"
        else:
            reason = "GPU test: run `pytest -m gpu` on this GPU machine (other runs use CPU ranks)"
    elif not torch.cuda.is_available():
        reason = "no GPU here: torch.cuda.is_available() is False"
    else:
        return
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_collection_modifyitems(config, items):
    # the sshd modules (one unit of work, ~14 min on 2 cores), then the longest modules: first,
    # so that neither worker of `pytest -n 2` ends alone on them (stable: each module's own
    # order is kept; helpers.shared.module_scheduling hands them out in this order).
    items.sort(key=lambda item: run_order(item.path.name))
    skip_gpu_tests(config, items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`pytest -n 2` (the README's command) gives each worker whole modules, so that a module
    fixture (a trained run, a wheelhouse) is made once, and the modules that use the loopback
    sshd to one worker (helpers.shared.worker_unit)."""
    if config.getvalue("dist") == "load":  # -n's default; another --dist is kept
        return module_scheduling(config, log)
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Under `pytest -n 2`, a test marked `alone` (its figures are timings, or it signals, reads
    or changes what is machine-wide) runs, fixtures and all, while the other worker waits
    between its tests."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    alone = item.get_closest_marker("alone") is not None
    with machine_turn(both_workers(Path(item.config.option.basetemp)) / "machine", alone):
        yield


@pytest.fixture(scope="session", autouse=True)
def rank_zygote(tmp_path_factory):
    """One process that imported a rank's modules, forking the ranks of every lean launch
    (harness.launch.zygote); tests/test_node_launcher.py holds its ranks to DeepSpeed's."""
    session_env = dict(os.environ)
    with zygote(tmp_path_factory.mktemp("zygote")):
        yield session_env


@pytest.fixture(autouse=True)
def zygote_env_kept(request, rank_zygote):
    """A test that leaves an import-time variable changed in this process (DeepSpeed's op
    builder sets TORCH_CUDA_ARCH_LIST as it parses it) would send every later launch to fresh
    processes: the zygote serves only the environment it imported under. Once it has imported,
    such a change is put back after the test, as the session began, with a warning."""
    yield
    path = os.environ.get(ZYGOTE_ENV)
    if not path or not os.path.exists(path + ".env"):
        return
    served = read_served(path)
    if not served["imported"]:
        return
    changed = differing_variables(served, checkout_first(launch_env()))
    for name in changed:
        if name in rank_zygote:
            os.environ[name] = rank_zygote[name]
        else:
            os.environ.pop(name, None)
    if changed:
        message = f"{request.node.nodeid} (or a test before it) changed {' '.join(changed)}"
        warnings.warn(message + ": put back", stacklevel=1)


@pytest.fixture(scope="session")
def shakespeare_dir(tmp_path_factory) -> Path:
    """The embedded Tiny Shakespeare corpus, tokenized once per test session."""
    out = shared_folder(tmp_path_factory, "data") / "shakespeare"
    prepare = [str(REPO / "tools" / "prepare_data.py"), "--out_dir", str(out)]
    made_once(out, lambda out: run_python(prepare, timeout=300).stdout)
    return out


@pytest.fixture(scope="session")
def floor_torch(tmp_path_factory) -> Path:
    """A venv holding only pip and pyproject.toml's floor torch (helpers.venvs), made once a
    session for both workers (a ~2.5 GB download); copy it (`venv_copy`), never install into it."""
    venv = shared_folder(tmp_path_factory, "floor-torch") / "venv"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "GPT_DS_"))}
    made_once(venv, lambda venv: str(floor_torch_venv(venv, REPO / "pyproject.toml", env)))
    return venv


@pytest.fixture(scope="session")
def stage_run(shakespeare_dir, tmp_path_factory):
    """stage_run(stage) -> (out_dir, stdout) of a 24-iteration, 2-rank fp32 gpt2-tiny run under
    ds_configs/zero{stage}.json (evaluations at 10, 20, 24, each with HellaSwag's score on
    tests/data/hellaswag_mini.jsonl), launched once per session on first use: test_train checks
    that it trained, test_export exports it. Read-only for its users."""

    def launch(out: Path, stage: int) -> str:
        args = tiny_run_args(
            shakespeare_dir,
            out,
            deepspeed_config=f"ds_configs/zero{stage}.json",
            max_iters=STAGE_RUN_ITERS,
            hellaswag=HELLASWAG_MINI,
        )
        return run_deepspeed(args, num_gpus=2).stdout

    def get(stage: int) -> tuple[Path, str]:
        out = shared_folder(tmp_path_factory, f"zero{stage}") / "run"
        return out, made_once(out, lambda out: launch(out, stage))

    return get


@pytest.fixture
def runs(shakespeare_dir, tmp_path_factory):
    """runs(stage, **overrides) -> the out dir of a 2-rank run of that configuration, launched
    once per session (helpers/compared_runs.py): tests comparing runs share their baselines."""
    root = shared_folder(tmp_path_factory, "compared_runs")
    return lambda stage, **o: compared_run(shakespeare_dir, root, stage, **o)[0]


@pytest.fixture
def launch(tmp_path):
    """`launch(args, name, num_gpus=2, runner=False, lean=False)` starts a run; whatever is left
    is killed afterwards. `runner=True` starts `deepspeed` itself, for the tests of what the
    runner does (signals to it); otherwise DeepSpeed's per-node launcher, as the runner would,
    or with `lean` the suite's (a run whose test is about the trainer: harness.launch.Launch)."""
    started: list[Launch] = []

    def start(
        args: list[str], name: str, num_gpus: int = 2, runner: bool = False, lean: bool = False
    ) -> Launch:
        run = Launch(args, tmp_path / f"{name}.log", num_gpus, runner, lean)
        started.append(run)
        return run

    yield start
    for run in started:
        run.cleanup()
