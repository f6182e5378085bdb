"""How many ranks a one-machine launch starts, and which `deepspeed` runner flags say so.

DeepSpeed's runner does not check a rank count against the devices: `--num_gpus N` becomes
`list(range(N))` (`deepspeed/launcher/runner.py`, `apply_num_nodes_and_gpus`), so asking for 2
ranks on a 1-GPU machine starts a rank that dies on `cuda:1`. And `--num_gpus` makes it drop
CUDA_VISIBLE_DEVICES (it warns, then trains on GPUs 0..N-1, whoever they belong to). So the
launchers (`launchers/env.sh`, `gpt_ds_rank_plan`) ask `plan_ranks` first, before any process
starts: a pure function of the requested count, the visible-devices variables and the device
count torch reports, tested on CPU for GPU machines it does not have.

Run as a script, it prints the plan as shell assignments for `eval` (exit 2 and the reason on
a refusal): `python gpt_ds/launch/ranks.py [REQUESTED]`.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass

CPU_RANKS = 2  # without a GPU: 2 processes (gloo)
VISIBLE_VARS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


class RankRefusal(ValueError):
    """The launch cannot start as asked; the message says what to change."""


@dataclass(frozen=True)
class RankPlan:
    """What the launcher runs: `ranks` processes, `deepspeed <flags> train.py ...`, with the
    variables in `unset` removed from the runner's environment; `note` says why, for the log."""

    ranks: int
    flags: tuple[str, ...]
    unset: tuple[str, ...]
    note: str


def parse_requested(text: str | None) -> int | None:
    """GPT_DS_NUM_GPUS as given (None where unset or empty); refuses anything but a positive
    integer."""
    if text is None or not text.strip():
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise RankRefusal(f"GPT_DS_NUM_GPUS must be a positive number of ranks, got {text!r}")
    return value


def plan_ranks(requested: int | None, visible: dict[str, str], device_count: int) -> RankPlan:
    """The plan for `requested` ranks (None: one per visible GPU, or CPU_RANKS without GPU).

    `visible` holds the set CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES values; `device_count`
    is `torch.cuda.device_count()`, which already honours them. Raises RankRefusal where a
    rank would have no GPU of its own, or where the variables cannot be passed on as they are.
    """
    if device_count == 0:
        # visible-devices variables stay: one that hides every GPU ("") keeps hiding them
        ranks = requested or CPU_RANKS
        return RankPlan(ranks, ("--num_gpus", str(ranks)), (), f"no GPU: {ranks} CPU ranks")
    ranks = device_count if requested is None else requested
    if ranks > device_count:
        raise RankRefusal(_too_many(ranks, visible, device_count))
    chosen = {name: value for name, value in visible.items() if value.strip()}
    if "CUDA_VISIBLE_DEVICES" in chosen:
        return _cuda_visible_plan(ranks, chosen, device_count)
    # HIP_VISIBLE_DEVICES (or nothing) renumbers the GPUs torch sees from 0, and DeepSpeed
    # leaves it in the ranks' environment: indices 0..ranks-1 are the visible ones.
    where = f" of HIP_VISIBLE_DEVICES={chosen['HIP_VISIBLE_DEVICES']}" if chosen else ""
    note = f"{ranks} ranks on GPUs 0..{ranks - 1}{where} ({device_count} visible)"
    return RankPlan(ranks, ("--num_gpus", str(ranks)), (), note)


def _too_many(ranks: int, visible: dict[str, str], device_count: int) -> str:
    """The refusal for more ranks than GPUs: what was asked, what is visible, what to set."""
    shown = ", ".join(f"{name}={value}" for name, value in visible.items())
    where = f" ({shown})" if shown else ""
    return (
        f"GPT_DS_NUM_GPUS={ranks} but only {device_count} GPU(s) are visible here{where}: each "
        f"rank needs a GPU of its own. Set GPT_DS_NUM_GPUS={device_count} or fewer (or leave it "
        "unset to use every visible GPU), or make more GPUs visible"
    )


def _cuda_visible_plan(ranks: int, chosen: dict[str, str], device_count: int) -> RankPlan:
    """CUDA_VISIBLE_DEVICES=2,3 -> `--include localhost:2,3` with the variable unset.

    Any of --num_gpus/--include makes DeepSpeed's runner drop the variable, and it accepts
    --include with none of --num_gpus/--num_nodes: so the chosen GPUs travel as --include
    (physical indices, what the variable holds) and DeepSpeed sets the variable per rank."""
    value = chosen["CUDA_VISIBLE_DEVICES"]
    if "HIP_VISIBLE_DEVICES" in chosen:
        raise RankRefusal(
            f"both CUDA_VISIBLE_DEVICES={value} and HIP_VISIBLE_DEVICES="
            f"{chosen['HIP_VISIBLE_DEVICES']} are set: DeepSpeed's runner reads only the first, "
            "as indices into all GPUs, while ROCm applies the second first. Unset one of them"
        )
    entries = [e.strip() for e in value.split(",")]
    if not all(e.isdigit() for e in entries):
        raise RankRefusal(
            f"CUDA_VISIBLE_DEVICES={value}: DeepSpeed's runner needs GPU indices (it passes them "
            "as --include localhost:0,1), not UUIDs or MIG names. Use the indices of "
            "`nvidia-smi -L`"
        )
    if len(entries) != device_count:
        raise RankRefusal(
            f"CUDA_VISIBLE_DEVICES={value} names {len(entries)} GPU(s) but torch sees "
            f"{device_count}: some of them do not exist here (see `nvidia-smi -L`). List only "
            "GPUs this machine has"
        )
    used = ",".join(entries[:ranks])
    note = f"{ranks} ranks on GPUs {used} (CUDA_VISIBLE_DEVICES={value}, as --include)"
    return RankPlan(ranks, ("--include", f"localhost:{used}"), ("CUDA_VISIBLE_DEVICES",), note)


def shell_lines(plan: RankPlan) -> str:
    """The plan as bash assignments for `eval`: GPT_DS_RANKS, GPT_DS_RUNNER_FLAGS (an array),
    GPT_DS_UNSET (an array) and GPT_DS_RANK_NOTE."""
    flags = " ".join(shlex.quote(f) for f in plan.flags)
    unset = " ".join(shlex.quote(n) for n in plan.unset)
    return (
        f"GPT_DS_RANKS={plan.ranks}\nGPT_DS_RUNNER_FLAGS=({flags})\n"
        f"GPT_DS_UNSET=({unset})\nGPT_DS_RANK_NOTE={shlex.quote(plan.note)}\n"
    )


def _device_count() -> int:
    """The GPUs torch sees here (CUDA or ROCm, after the visible-devices variables)."""
    try:
        import torch
    except ImportError as exc:
        raise RankRefusal(
            f"torch does not import in {sys.executable} ({exc}): run launchers/setup_env.sh, "
            "or set GPT_DS_PYTHON to the interpreter of your environment"
        ) from exc
    return torch.cuda.device_count()


def main(argv: list[str]) -> int:
    """Print this machine's plan for argv[0] ranks (GPT_DS_NUM_GPUS; empty: unset) as shell
    assignments."""
    try:
        requested = parse_requested(argv[0] if argv else None)
        visible = {name: os.environ[name] for name in VISIBLE_VARS if name in os.environ}
        plan = plan_ranks(requested, visible, _device_count())
    except RankRefusal as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(shell_lines(plan))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
