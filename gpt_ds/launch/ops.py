"""Build, once at set-up, the DeepSpeed ops a launch on this machine would JIT-compile at its
first use: otherwise that launch spends minutes in g++ (or nvcc) on every rank's clock, and a
compiler problem shows up mid-launch instead of at set-up.

`python -m gpt_ds.launch.ops` (launchers/setup_env.sh runs it; GPT_DS_BUILD_OPS=0 skips it)
builds into the TORCH_EXTENSIONS_DIR a launch reads (gpt_ds/train.py's default: the venv's
torch_extensions). An op already built is loaded from there in a second. An op that cannot
build here is said with DeepSpeed's reason and left to its first use.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from gpt_ds.dsconfig.optimization import choose_adam
from gpt_ds.dsconfig.settings import AdamFacts
from gpt_ds.launch.machine import adam_facts

# (DeepSpeed op builder, what uses it)
CPU_ADAM = ("CPUAdamBuilder", "the offload presets")
FUSED_ADAM = ("FusedAdamBuilder", "every GPU run's Adam")


def wanted_ops(facts: AdamFacts) -> list[tuple[str, str]]:
    """The ops a launch on a machine with these facts JIT-builds: the CPU Adam of optimizer
    offload, and FusedAdam where gpt_ds picks it (a GPU with a compiler that can build it; not
    when it is prebuilt). Not DeepSpeed's CPU shared-memory all-reduce: gpt_ds's ranks skip it
    (gpt_ds.base.dist.init)."""
    ops = [CPU_ADAM]
    gpu = facts.accelerator != "cpu"
    if gpu and not facts.prebuilt and "torch_adam" not in choose_adam(facts, {}).params:
        ops.append(FUSED_ADAM)
    return ops


def build(builder_name: str) -> str:
    """Build (or load the cached build of) one op; what happened, in a few words."""
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder(builder_name)
    if builder is None:
        return "not used by this accelerator"
    if not builder.is_compatible(verbose=False):
        return "cannot build here: DeepSpeed's op check fails (its first use says why)"
    start = time.perf_counter()
    try:
        builder.load(verbose=False)
    except (RuntimeError, OSError) as error:  # the compiler's failure, kept for its first use
        return f"failed to build ({str(error).splitlines()[0][:200]}): its first use will retry"
    return f"ready ({time.perf_counter() - start:.0f} s)"


def main() -> int:
    if sys.prefix != sys.base_prefix:  # as a launch from launchers/env.sh sees it
        os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
        # the venv's ninja, not the system's: a build by another ninja version is stale to it
        os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    ops = wanted_ops(adam_facts(offload=False))
    where = os.environ.get("TORCH_EXTENSIONS_DIR", "torch's default cache")
    print(f"DeepSpeed ops for this machine, built once into {where}:", flush=True)
    for builder_name, used_by in ops:
        name = builder_name.removesuffix("Builder")
        print(f"  {name} ({used_by}) ...", end=" ", flush=True)
        print(build(builder_name), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
