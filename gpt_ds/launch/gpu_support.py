"""Whether this node's torch, driver and DeepSpeed can train on its GPUs, checked before launch.

A GPU torch cannot use does not fail loudly: with a driver too old for the wheel's CUDA,
`torch.cuda.is_available()` is False, DeepSpeed falls back to its CPU accelerator and the launch
"works" on CPU ranks; a GPU the wheel has no kernels for (PyPI's torch 2.13 is `+cu130`: no
sm_70, so no V100) fails at its first kernel. Preflight (`tools/preflight.py`, every node) and
the trainer's start-up (`probe_machine`, every rank, before any model) refuse both, with the fix.

`gather_facts` is the only part that touches torch, DeepSpeed and the system, and it is kept
tiny: it returns a plain dict (it is also shipped as source to every node by preflight, so it
is self-contained, standard library only, Python 3.6 syntax). Everything else is pure functions
over `GpuFacts`, so every branch can be tested on a CPU machine.
"""

from __future__ import annotations

import inspect
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpt_ds.base.errors import ConfigError

SKIP_ENV = "GPT_DS_SKIP_GPU_CHECK"  # "1": start anyway (e.g. a CUDA forward-compat package)
FACTS_MARK = "GPT_DS_GPU_FACTS "  # preflight's probe prints the facts on a line after this
WHEEL_INDEX = "https://download.pytorch.org/whl"
# The oldest driver each CUDA major version runs on (minor version compatibility, Linux): NVIDIA,
# "CUDA Compatibility", Table 1 "CUDA Toolkit 11.x, 12.x, and 13.x Minimum Required Driver
# Versions" (docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html; the
# CUDA Toolkit Release Notes' "CUDA Toolkit and Corresponding Driver Versions" table).
MIN_DRIVER = {13: (580,), 12: (525, 60, 13), 11: (450, 80, 2)}


@dataclass(frozen=True)
class Device:
    """One visible GPU: its name and its architecture (`sm_70`, or ROCm's `gfx90a`)."""

    name: str
    arch: str


@dataclass(frozen=True)
class GpuFacts:
    """What decides whether training can use the GPUs; `from_probe` builds it from the dict
    `gather_facts` returns."""

    torch_version: str = ""
    cuda: str | None = None  # torch.version.cuda: the wheel's CUDA ("13.0"); None: not CUDA
    hip: str | None = None  # torch.version.hip: a ROCm wheel
    arch_list: tuple[str, ...] = ()  # torch.cuda.get_arch_list(): the kernels the wheel carries
    cuda_available: bool = False
    devices: tuple[Device, ...] = ()
    nvidia_present: bool = False  # /proc/driver/nvidia/gpus/* or /dev/nvidia0
    driver: str | None = None  # "550.54.15"
    ds_accelerator: str | None = None  # DeepSpeed's get_accelerator().device_name()
    ds_accelerator_error: str | None = None  # why DeepSpeed could not pick one
    ds_accelerator_env: str | None = None  # DS_ACCELERATOR
    releases: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """This torch's published CUDA builds for this host: CUDA version -> compute capabilities
    (torch.cuda.PYTORCH_RELEASES_CODE_CC)."""

    @classmethod
    def from_probe(cls, raw: dict) -> GpuFacts:
        """The facts in `gather_facts`'s dict; the cards and the driver from nvidia-smi where
        torch cannot see them."""
        smi_driver, smi_devices = parse_smi(raw.get("smi_text") or "")
        devices = tuple(Device(d["name"], d["arch"]) for d in raw.get("devices") or ())
        return cls(
            torch_version=raw.get("torch_version") or "",
            cuda=raw.get("cuda"),
            hip=raw.get("hip"),
            arch_list=tuple(raw.get("arch_list") or ()),
            cuda_available=bool(raw.get("cuda_available")),
            devices=devices or smi_devices,
            nvidia_present=bool(raw.get("nvidia_gpus")) or bool(raw.get("dev_nvidia0")),
            driver=parse_driver_version(raw.get("driver_text") or "") or smi_driver,
            ds_accelerator=raw.get("ds_accelerator"),
            ds_accelerator_error=raw.get("ds_accelerator_error"),
            ds_accelerator_env=raw.get("ds_accelerator_env"),
            releases={k: tuple(sorted(v)) for k, v in (raw.get("releases") or {}).items()},
        )


# ----------------------------------------------------------------------------------------------
# Small pure helpers.


def parse_driver_version(text: str) -> str | None:
    """The driver version in /proc/driver/nvidia/version ("... Kernel Module  550.54.15  ...")
    or in `nvidia-smi --query-gpu=driver_version --format=csv,noheader` ("550.54.15")."""
    m = re.search(r"(?:^|\s)(\d{3,}\.\d+(?:\.\d+)?)(?:\s|$)", text)
    return m.group(1) if m else None


def parse_smi(text: str) -> tuple[str | None, tuple[Device, ...]]:
    """The driver and the cards in `nvidia-smi --query-gpu=driver_version,name,compute_cap
    --format=csv,noheader` ("550.54.15, Tesla V100-SXM2-32GB, 7.0" per GPU)."""
    driver, devices = None, []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        cap = re.fullmatch(r"(\d+)\.(\d)", parts[-1])
        if len(parts) < 3 or not cap or not parse_driver_version(parts[0]):
            continue
        driver = parts[0]
        devices.append(Device(", ".join(parts[1:-1]), f"sm_{cap.group(1)}{cap.group(2)}"))
    return driver, tuple(devices)


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version))


def min_driver(cuda: str) -> tuple[int, ...] | None:
    """The oldest driver a wheel built for CUDA `cuda` runs on (None: a major we do not know)."""
    return MIN_DRIVER.get(version_tuple(cuda)[0])


def code_cc(arch: str) -> int | None:
    """`sm_90a` -> 90, `compute_120` -> 120; None for a ROCm arch."""
    m = re.fullmatch(r"(sm|compute)_(\d+)[af]?", arch)
    return int(m.group(2)) if m else None


def device_ccs(facts: GpuFacts) -> list[int]:
    """The compute capabilities of the CUDA cards known (none for ROCm)."""
    return [c for c in (code_cc(d.arch) for d in facts.devices) if c is not None]


def runs_on(arch: str, device_cc: int) -> bool:
    """Whether a wheel's `arch` runs on a device of compute capability `device_cc`: a cubin
    (sm_XY) on the same major with a minor >= Y, PTX (compute_XY) on anything >= XY."""
    cc = code_cc(arch)
    if cc is None:
        return False
    if arch.startswith("compute_"):
        return device_cc >= cc
    return device_cc // 10 == cc // 10 and device_cc % 10 >= cc % 10


def pip_command(torch_version: str, cuda: str) -> str:
    base = torch_version.split("+")[0] or "<version>"
    return f"pip install torch=={base} --index-url {WHEEL_INDEX}/cu{cuda.replace('.', '')}"


def builds_for(facts: GpuFacts, device_ccs: list[int]) -> list[str]:
    """This torch's CUDA builds that carry kernels for every device and run on this driver,
    newest first."""
    driver = version_tuple(facts.driver) if facts.driver else None
    fits = []
    for cuda, ccs in facts.releases.items():
        needs = min_driver(cuda)
        if driver is not None and needs is not None and driver < needs:
            continue
        if all(any(runs_on(f"sm_{c}", d) for c in ccs) for d in device_ccs):
            fits.append(cuda)
    return sorted(fits, key=version_tuple, reverse=True)


def install_hint(facts: GpuFacts, device_ccs: list[int]) -> str:
    """`install the cuXYZ build: pip install ...`, or where to look when no build fits."""
    builds = builds_for(facts, device_ccs)
    if not builds:
        return "no CUDA build of this torch fits: see https://pytorch.org/get-started/locally/"
    tag = "cu" + builds[0].replace(".", "")
    return f"install the {tag} build: {pip_command(facts.torch_version, builds[0])}"


# ----------------------------------------------------------------------------------------------
# The checks: each returns problem strings that end with the fix.


def arch_problems(facts: GpuFacts) -> list[str]:
    """A visible GPU whose architecture the wheel has no kernels for: it fails at its first
    kernel ("no kernel image is available for execution on the device")."""
    if not facts.arch_list:  # a CPU wheel, or a build that does not say
        return []
    problems = []
    carries = ", ".join(facts.arch_list)
    for i, dev in enumerate(facts.devices):
        if facts.hip:
            if dev.arch.split(":")[0] in facts.arch_list:
                continue
            problems.append(
                f"this torch ({facts.torch_version}, ROCm {facts.hip}) has no kernels for "
                f"{dev.arch} (GPU {i}, {dev.name}); it carries {carries}: install a ROCm build "
                "of torch that lists it (https://pytorch.org/get-started/locally/)"
            )
            continue
        cc = code_cc(dev.arch)
        if cc is None or any(runs_on(a, cc) for a in facts.arch_list):
            continue
        problems.append(
            f"this torch ({facts.torch_version}, CUDA {facts.cuda}) has no kernels for "
            f"{dev.arch} (GPU {i}, {dev.name}); it carries {carries}: " + install_hint(facts, [cc])
        )
    return problems


def driver_problems(facts: GpuFacts) -> list[str]:
    """A driver older than the wheel's CUDA needs: torch then sees no GPU at all."""
    if not (facts.cuda and facts.driver):
        return []
    needs = min_driver(facts.cuda)
    if needs is None or version_tuple(facts.driver) >= needs:
        return []
    return [
        f"this torch ({facts.torch_version}) is built for CUDA {facts.cuda}, which needs an "
        f"NVIDIA driver >= {'.'.join(map(str, needs))}; this machine's driver is {facts.driver}: "
        f"update the driver, or {install_hint(facts, device_ccs(facts))}"
    ]


def cpu_fallback_problems(facts: GpuFacts, cause_found: bool) -> list[str]:
    """An NVIDIA GPU torch cannot use: DeepSpeed would pick its CPU accelerator and train there,
    slowly and without saying so."""
    if not facts.nvidia_present or facts.cuda_available:
        return []
    head = (
        "an NVIDIA GPU is present but torch.cuda.is_available() is False: DeepSpeed would "
        "train on CPU"
    )
    if cause_found:
        fix = "fix the problem above"
    elif facts.cuda is None and facts.hip is None:
        hint = install_hint(facts, device_ccs(facts))
        fix = f"this torch ({facts.torch_version}) is a CPU build: {hint}"
    else:
        fix = (
            "check the driver (`nvidia-smi` must list the GPU), CUDA_VISIBLE_DEVICES, and that "
            "a container was started with GPU access (docker --gpus all)"
        )
    return [f"{head}: {fix}; or set DS_ACCELERATOR=cpu to train on CPU on purpose"]


def accelerator_problems(facts: GpuFacts) -> list[str]:
    """DeepSpeed's accelerator disagreeing with torch: GPUs it will not use, or none to use."""
    if facts.ds_accelerator_error:
        return [f"DeepSpeed cannot pick its accelerator ({facts.ds_accelerator_error}): fix "
                "or unset DS_ACCELERATOR"]  # fmt: skip
    name, env = facts.ds_accelerator, facts.ds_accelerator_env
    how = f"DS_ACCELERATOR={env}" if env else "auto-detected"
    if facts.cuda_available and name not in (None, "cuda"):
        return [
            f"torch sees {len(facts.devices) or 'a'} GPU(s) but DeepSpeed's accelerator is "
            f"'{name}' ({how}), so it would not use them: unset DS_ACCELERATOR or set it to cuda"
        ]
    if not facts.cuda_available and name == "cuda" and not facts.nvidia_present:
        return [
            f"DeepSpeed's accelerator is 'cuda' ({how}) but torch sees no GPU: unset "
            "DS_ACCELERATOR (CPU ranks) or run where torch.cuda.is_available() is True"
        ]
    return []


def gpu_problems(facts: GpuFacts) -> list[str]:
    """Everything that keeps training off this node's GPUs, each with its fix; none when the
    user chose CPU ranks (DS_ACCELERATOR=cpu) or there is no GPU to miss."""
    if facts.ds_accelerator_env == "cpu":
        return []
    found = driver_problems(facts) + arch_problems(facts)
    found += cpu_fallback_problems(facts, cause_found=bool(found))
    return found + accelerator_problems(facts)


# ----------------------------------------------------------------------------------------------
# The live facts (the thin part), shipped as source to preflight's nodes.


def release_archs(table, host):
    """torch's table of the compute capabilities each CUDA release's wheels carry, for `host`:
    torch 2.13 nests it per host ({cuda: {host: ccs}}), torch 2.11 does not ({cuda: ccs})."""
    return {k: sorted(v.get(host, ()) if isinstance(v, dict) else v) for k, v in table.items()}


def gather_facts(device_index=None):
    """This process's facts as a plain dict (`GpuFacts.from_probe`); `device_index`: only that
    GPU (a rank's own), None: all. Self-contained: preflight runs its source on every node."""
    import glob
    import os
    import platform
    import subprocess

    out = {"ds_accelerator_env": os.environ.get("DS_ACCELERATOR")}  # type: dict
    out["nvidia_gpus"] = sorted(glob.glob("/proc/driver/nvidia/gpus/*"))
    out["dev_nvidia0"] = os.path.exists("/dev/nvidia0")
    try:
        with open("/proc/driver/nvidia/version") as f:
            out["driver_text"] = f.read()
    except OSError:
        pass
    import torch

    cuda = torch.cuda
    out.update(torch_version=torch.__version__, cuda=torch.version.cuda)
    out.update(hip=getattr(torch.version, "hip", None), arch_list=cuda.get_arch_list())
    out["cuda_available"] = cuda.is_available()
    if (out["nvidia_gpus"] or out["dev_nvidia0"]) and not out["cuda_available"]:
        try:  # what torch cannot tell: the driver and the cards (compute_cap: driver >= 510)
            query = "--query-gpu=driver_version,name,compute_cap"
            cmd = ["nvidia-smi", query, "--format=csv,noheader"]
            run = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=20)
            out["smi_text"] = run.stdout
        except Exception:
            pass
    table = getattr(cuda, "PYTORCH_RELEASES_CODE_CC", {})
    host = "aarch64" if platform.machine().lower() == "aarch64" else "x86_64"
    out["releases"] = release_archs(table, host)
    count = cuda.device_count() if out["cuda_available"] else 0
    out["devices"] = []
    for i in range(count) if device_index is None else [device_index]:
        if i < count:
            props = cuda.get_device_properties(i)
            arch = getattr(props, "gcnArchName", "") if out["hip"] else ""
            arch = arch or f"sm_{props.major}{props.minor}"
            out["devices"].append({"name": props.name, "arch": arch})
    try:
        from deepspeed.accelerator import get_accelerator

        out["ds_accelerator"] = get_accelerator().device_name()
    except ImportError:
        out["ds_accelerator"] = None
    except Exception as exc:  # DeepSpeed's ValueError for a DS_ACCELERATOR it cannot use
        out["ds_accelerator_error"] = type(exc).__name__ + ": " + str(exc)
    return out


def probe_source() -> str:
    """Python source that prints `gather_facts()` on one marked line (preflight appends it to
    its probe); a failure is printed as facts that no check reads."""
    return (
        "\n"
        + inspect.getsource(release_archs)
        + "\n"
        + inspect.getsource(gather_facts)
        + "\nimport json\n"
        "try:\n    _facts = gather_facts()\n"
        "except Exception as exc:\n    _facts = {'error': type(exc).__name__ + ': ' + str(exc)}\n"
        f"print({FACTS_MARK!r} + json.dumps(_facts))\n"
    )


def parse_probe_facts(stdout: str) -> GpuFacts | None:
    """The facts a node's probe printed (None: not printed, or gathering them failed)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(FACTS_MARK):
            raw = json.loads(line[len(FACTS_MARK) :])
            return None if "error" in raw else GpuFacts.from_probe(raw)
    return None


def check_gpu_support(device_index: int, env: Mapping[str, str] | None = None) -> None:
    """Raise a ConfigError, before any model is built, when this rank's GPU cannot be used or
    DeepSpeed would silently train on CPU; GPT_DS_SKIP_GPU_CHECK=1 starts anyway."""
    env = os.environ if env is None else env
    if env.get(SKIP_ENV) == "1":
        return
    problems = gpu_problems(GpuFacts.from_probe(gather_facts(device_index)))
    if problems:
        problems.append(f"to start anyway (you know it works here): {SKIP_ENV}=1")
        raise ConfigError(problems, source="GPU support")
