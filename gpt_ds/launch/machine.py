"""This machine's `MachineFacts` (dsconfig/settings.py), probed once at start: everything the
run's resolution needs to know about the hardware, the installed packages and the environment,
asked here and nowhere else, and read into facts (the precision it trains best, whether fp16
can train, whether FusedAdam can be built) by pure functions tested for machines this one is
not. Choosing from the facts is the resolution's (dsconfig/), which asks the machine nothing."""

from __future__ import annotations

import functools
import importlib.util
import netrc
import os
import re
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

from gpt_ds.base import dist
from gpt_ds.dsconfig.monitors import MONITOR_PACKAGES, wandb_mode
from gpt_ds.dsconfig.settings import AdamFacts, MachineFacts
from gpt_ds.launch.gpu_support import check_gpu_support
from gpt_ds.memory.guard import NodeRam, ram_limit

ARCH_LIST = "TORCH_CUDA_ARCH_LIST"
CGROUP_ROOT = Path("/sys/fs/cgroup")
NO_CGROUP_LIMIT = 1 << 62  # cgroup v1 writes "no limit" as LONG_MAX rounded down to a page


def probe_machine(local_rank: int = 0) -> MachineFacts:
    """This machine's facts, asked once at start (before the process group exists: the world
    is the launcher's). A ConfigError first where this rank's GPU cannot be used or DeepSpeed
    would silently train on CPU (launch/gpu_support.py), before any other question to it."""
    import torch
    from deepspeed.accelerator import get_accelerator

    check_gpu_support(local_rank)  # first: a GPU unseen, or DS_ACCELERATOR set wrong
    ram = node_ram()

    device_type = get_accelerator().device_name()
    on_gpu = device_type == "cuda" and torch.cuda.is_available()
    return MachineFacts(
        device_type=device_type,
        world_size=dist.world_size(),  # the launcher's (or mpirun's, srun's: adopted)
        ranks_per_node=dist.local_world_size(),
        precision=detect_precision(),
        fp16_refusal=precision_refusal("fp16"),
        adam=adam_facts(offload=False),
        monitors={pkg: _installed_version(pkg) for pkg, _ in MONITOR_PACKAGES.values()},
        device_bytes=device_memory_bytes(local_rank) if on_gpu else None,
        device_name=torch.cuda.get_device_name(local_rank) if on_gpu else None,
        compile_blocker=compile_blocker(device_type),
        host_ram=(ram.bytes, ram.limit),
        wandb_mode=wandb_mode(os.environ),
        wandb_key=_wandb_key(),
        environ_names=frozenset(os.environ),
    )


def _installed_version(package: str) -> str | None:
    if importlib.util.find_spec(package) is None:
        return None
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:  # importable but not pip-installed: no version
        return "0"


def _wandb_key() -> bool:
    """Whether W&B finds an API key: WANDB_API_KEY, or ~/.netrc's entry for its host."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1]
    try:
        return netrc.netrc().authenticators(host.split("/")[0]) is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False


def compile_blocker(device_type: str) -> str | None:
    """Why torch.compile's default backend (inductor) cannot run on `device_type`, or None."""
    import torch

    if not hasattr(torch, "compile"):
        return f"torch {torch.__version__} has no torch.compile"
    if device_type == "cpu":
        cxx = os.environ.get("CXX") or "c++"
        if shutil.which(cxx) is None and shutil.which("g++") is None:
            return f"inductor needs a C++ compiler on CPU and {cxx!r}/'g++' is not on PATH"
        return None
    if device_type == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            return "inductor needs Triton on the GPU and it is not installed"
    return None


# ----------------------------------------------------------------------------------------------
# Precision: the one this machine trains best where the user said `auto` (bf16 where the hardware
# has it, fp16 on older GPUs DeepSpeed trains fp16 on: V100, T4; else fp32), and whether fp16 can
# train here at all (never on CPU ranks, nor on a GPU of compute capability below 7.0). The rules
# are pure functions of what the hardware reports (`gpu_precision`, `cpu_precision`,
# `fp16_refusal`), tested for GPUs this machine does not have; `detect_precision` and
# `precision_refusal` ask the accelerator DeepSpeed will use and hand its answers to them.


def detect_precision() -> tuple[str, str]:
    """The training precision this machine runs best, and why: ("bf16"|"fp16"|"fp32", reason).

    Uses the accelerator DeepSpeed will use: CUDA/ROCm by `gpu_precision`, CPU by
    `cpu_precision`, any other by what the accelerator says it supports.
    """
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    device = accelerator.device_name()
    if device == "cpu":
        return cpu_precision(_read_cpuinfo())
    if device == "cuda":
        import torch

        kind = "ROCm" if torch.version.hip else "CUDA"
        # The default including_emulation=True answers True on a V100, where bf16 is emulated.
        native = torch.cuda.is_bf16_supported(including_emulation=False)
        capability = torch.cuda.get_device_capability()
        return gpu_precision(kind, torch.cuda.get_device_name(), native, capability)
    if accelerator.is_bf16_supported():
        return "bf16", f"{device} accelerator supports bf16"
    if accelerator.is_fp16_supported():
        return "fp16", f"{device} accelerator supports fp16 but not bf16"
    return "fp32", f"{device} accelerator supports neither bf16 nor fp16"


@functools.cache  # the precision and the fp16 refusal both read it: once a process
def _read_cpuinfo() -> str | None:
    try:
        return Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def precision_refusal(precision: str) -> str | None:
    """`fp16_refusal` for this machine's accelerator when `precision` is fp16, else None."""
    if precision != "fp16":
        return None
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    device = accelerator.device_name()
    cpuinfo = _read_cpuinfo() if device == "cpu" else None
    capability = None
    if device == "cuda":
        import torch

        capability = torch.cuda.get_device_capability()
    return fp16_refusal(device, bool(accelerator.is_fp16_supported()), cpuinfo, capability)


def gpu_precision(
    kind: str, name: str, native_bf16: bool, capability: tuple[int, int]
) -> tuple[str, str]:
    """Precision for a CUDA or ROCm device (`kind`) named `name` of compute `capability`:
    bf16 where it computes bf16 natively (Ampere and newer, every ROCm GPU torch supports), else
    fp16 with DeepSpeed's dynamic loss scaling (V100, T4: bf16 would be emulated, several times
    slower), except where DeepSpeed's CUDA accelerator refuses fp16 (capability < 7.0: P100,
    GTX 10xx), which trains fp32: picking fp16 there would only fail later, in DeepSpeed."""
    if native_bf16:
        return "bf16", f"{kind} device {name} supports bf16"
    if cuda_fp16_refusal(kind, capability) is not None:
        major, minor = capability
        return "fp32", (
            f"{kind} device {name} (compute capability {major}.{minor}) has no native bf16, and "
            "DeepSpeed refuses fp16 below compute capability 7.0"
        )
    return "fp16", f"{kind} device {name} has no native bf16; fp16 with dynamic loss scaling"


def cpu_precision(cpuinfo: str | None) -> tuple[str, str]:
    """Precision for a CPU run from /proc/cpuinfo text (x86 `flags`, Arm `Features`)."""
    if cpuinfo is None:
        return "fp32", "no GPU and /proc/cpuinfo is unreadable: cannot tell whether bf16 is native"
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    if "amx_bf16" in flags:
        return "bf16", "CPU reports AMX-BF16"
    if "avx512_bf16" in flags:
        return "bf16", "CPU reports AVX512-BF16"
    if "bf16" in flags:
        return "bf16", "CPU reports Arm BF16"
    return "fp32", "no GPU, and the CPU reports neither amx_bf16 nor avx512_bf16 (bf16 is emulated)"


def cuda_fp16_refusal(kind: str, capability: tuple[int, int]) -> str | None:
    """Why DeepSpeed's CUDA accelerator refuses fp16 on a `kind` GPU of compute `capability`
    (None where it accepts it), with what to use instead.

    DeepSpeed's `accelerator/cuda_accelerator.py` `is_fp16_supported` answers False below
    capability 7.0 (fp16 on 6.x is deprecated; DS_ALLOW_DEPRECATED_FP16=1 lets 6.x through, and
    that answer reaches `fp16_refusal` instead), and `deepspeed.initialize` then raises "Type
    fp16 is not supported on your device." after the model is built. ROCm GPUs report
    capability >= 9.
    """
    major, minor = capability
    if kind != "CUDA" or major >= 7:
        return None
    return (
        f"fp16 needs compute capability 7.0 or newer: DeepSpeed refuses it on this GPU (compute "
        f"capability {major}.{minor}, e.g. P100 or GTX 10xx; it has no native bf16 either); use "
        "--precision fp32 (on 6.x, DS_ALLOW_DEPRECATED_FP16=1 makes DeepSpeed accept fp16)"
    )


def fp16_refusal(
    device: str, fp16_supported: bool, cpuinfo: str | None, capability: tuple[int, int] | None
) -> str | None:
    """Why fp16 cannot train on `device` (None where it can), with what to use instead.

    DeepSpeed's CUDA accelerator accepts fp16 only from compute `capability` 7.0
    (`cuda_fp16_refusal`); elsewhere `deepspeed.initialize` raises "Type fp16 is not supported
    on your device." after the model is built. On CPU ranks gpt_ds refuses fp16 whatever the
    CPU (`cpu_fp16_refusal`). Said here, before anything is built.
    """
    if device == "cpu":
        return cpu_fp16_refusal(fp16_supported, cpuinfo)
    if fp16_supported:
        return None
    if device == "cuda" and capability is not None:
        return cuda_fp16_refusal("CUDA", capability)
    return None


def cpu_fp16_refusal(fp16_supported: bool, cpuinfo: str | None) -> str:
    """Why gpt_ds trains no fp16 on CPU ranks, whether or not DeepSpeed's CPU accelerator would
    (`fp16_supported`: oneDNN computes fp16 on AVX512-FP16 / AMX-FP16 CPUs).

    fp16 with loss scaling exists for GPUs without bf16. Every x86 CPU with native fp16 also
    has native bf16 (Sapphire Rapids and newer: AMX-BF16), which needs no loss scaling; and one
    answer for every CPU keeps a command, and the suite, behaving the same on every machine.
    """
    best, why = cpu_precision(cpuinfo)
    instead = (
        f"--precision bf16 (native here: {why}) or --precision fp32"
        if best == "bf16"
        else "--precision fp32 (this CPU has no native bf16 either)"
    )
    here = (
        "gpt_ds does not train fp16 on CPU ranks (this CPU computes fp16, but bf16 needs no "
        "loss scaling)"
        if fp16_supported
        else "DeepSpeed's CPU accelerator refuses fp16 on this machine (the CPU has no native "
        "fp16 arithmetic)"
    )
    return f"fp16 with dynamic loss scaling needs a GPU: {here}; use {instead}"


# ----------------------------------------------------------------------------------------------
# Adam: what the installed torch and DeepSpeed can run (dsconfig/optimization.py chooses)


def adam_facts(offload: bool) -> AdamFacts:
    """`AdamFacts` of this machine, as DeepSpeed and torch will see them."""
    import torch
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    name = accelerator.device_name()
    if name != "cuda":
        return AdamFacts(accelerator=name, offload=offload)
    rocm = torch.version.hip is not None
    return AdamFacts(
        accelerator=name,
        rocm=rocm,
        prebuilt=_fused_adam_prebuilt(accelerator._name),
        compiler=_rocm_compiler() if rocm else _cuda_compiler(torch.version.cuda),
        offload=offload,
        compiler_blocked=None if rocm else arch_list_blocker(os.environ.get(ARCH_LIST, "")),
    )


def arch_list_blocker(arch_list: str) -> str | None:
    """Why DeepSpeed 0.19's JIT builder would fail on this TORCH_CUDA_ARCH_LIST, or None.

    Its `compute_capability_args` sorts the entries by `int()` of each dotted part, so torch's
    arch-specific entries ("9.0a", "10.0f", which Hopper/Blackwell builds set) raise ValueError
    when FusedAdam is constructed, after the model is built. torch's fused AdamW needs no build.
    """
    for entry in arch_list.replace(" ", ";").split(";"):
        entry = entry.strip()
        if entry and not re.fullmatch(r"\d+\.\d+(\+PTX)?", entry):
            return (
                f"{ARCH_LIST}={arch_list!r} has {entry!r}, which DeepSpeed's JIT builder cannot "
                f"parse (FusedAdam would fail to build; unset it or write {entry.rstrip('af')!r} "
                "to build it)"
            )
    return None


def _fused_adam_prebuilt(accelerator_name: str) -> bool:
    """DeepSpeed's own test before it imports a prebuilt op (op_builder/builder.py `load`)."""
    from deepspeed.git_version_info import accelerator_name as built_for
    from deepspeed.git_version_info import installed_ops

    return bool(installed_ops.get("fused_adam")) and built_for == accelerator_name


def _cuda_compiler(torch_cuda: str | None) -> str | None:
    """ "nvcc 12.4" when CUDA_HOME's nvcc and ninja can build for this torch (same CUDA major
    and minor version as torch was built with), else None."""
    from torch.utils.cpp_extension import CUDA_HOME

    if not CUDA_HOME or not torch_cuda or shutil.which("ninja") is None:
        return None
    version = nvcc_version(Path(CUDA_HOME) / "bin" / "nvcc")
    return f"nvcc {version}" if version and same_minor(version, torch_cuda) else None


def _rocm_compiler() -> str | None:
    from torch.utils.cpp_extension import ROCM_HOME

    if not ROCM_HOME or shutil.which("ninja") is None:
        return None
    hipcc = Path(ROCM_HOME) / "bin" / "hipcc"
    return "hipcc" if hipcc.exists() else None


def nvcc_version(nvcc: Path) -> str | None:
    """ "12.4" from `nvcc --version` ("Cuda compilation tools, release 12.4, V12.4.131")."""
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"release (\d+\.\d+)", out.stdout)
    return match.group(1) if match else None


def same_minor(a: str, b: str) -> bool:
    """ "12.4" and "12.4.1" agree; "12.4" and "13.0" do not."""
    return a.split(".")[:2] == b.split(".")[:2]


# ----------------------------------------------------------------------------------------------
# Memory: the node's RAM as the kernel enforces it, the GPU's (memory/guard.py judges the fit)


def node_ram() -> NodeRam:
    """This node's RAM as the kernel will enforce it: physical RAM, or the cgroup limit."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        proc_cgroup = Path("/proc/self/cgroup").read_text()
    except OSError:  # not Linux
        proc_cgroup = ""
    return ram_limit(physical, cgroup_memory_limit(proc_cgroup))


def node_ram_bytes() -> int:
    """node_ram()'s bytes (the smaller of the RAM and the cgroup limit)."""
    return node_ram().bytes


def device_memory_bytes(local_rank: int) -> int | None:
    """This rank's GPU memory, or None on CPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(local_rank).total_memory


def cgroup_paths(proc_cgroup: str) -> dict[str, str]:
    """This process's cgroup from /proc/self/cgroup: {"v2": path} from the `0::path` line,
    {"v1": path} from the line of v1's memory controller (`4:memory:/slurm/uid_1/job_7`)."""
    found = {}
    for line in proc_cgroup.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            found["v2"] = path
        elif "memory" in controllers.split(","):
            found["v1"] = path
    return found


def read_limit(path: Path) -> int | None:
    """A cgroup memory limit file's bytes; None: no file, no access, `max` or v1's no limit."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text.isdigit() or int(text) >= NO_CGROUP_LIMIT:
        return None
    return int(text)


def cgroup_memory_limit(proc_cgroup: str, root: Path = CGROUP_ROOT) -> int | None:
    """The tightest memory limit on this process's cgroup or a parent (a job's limit is often
    on the parent of its step's cgroup): v2 `memory.max` (at `root`, or `root/unified` on a
    hybrid host), v1 `memory/.../memory.limit_in_bytes`. None: no limit set. A path the mount
    does not show (a container's own cgroup namespace) is walked up to the mount's root."""
    paths = cgroup_paths(proc_cgroup)
    places = []
    if "v2" in paths:
        places += [(base, paths["v2"], "memory.max") for base in (root, root / "unified")]
    if "v1" in paths:
        places.append((root / "memory", paths["v1"], "memory.limit_in_bytes"))
    limits = []
    for base, path, name in places:
        here = base / path.lstrip("/")
        for d in [here, *here.parents]:
            if d != base and base not in d.parents:
                break
            limits.append(read_limit(d / name))
    return min((v for v in limits if v is not None), default=None)
