"""DeepSpeed's per-node launcher (deepspeed/launcher/launch.py) without its start-up: the same
ranks with the same environment and arguments, the same exit, in a process that imports neither
torch nor deepspeed.

`python -m deepspeed.launcher.launch` imports deepspeed, and with it torch, before it starts a
rank (2.4 s here), polls its ranks once a second and sleeps a second more once they are gone:
about 4.5 s of a 2-iteration launch that takes 17. The tests' launches (harness.launch's
`run_deepspeed`) start this instead; tests/test_node_launcher.py holds it to DeepSpeed's launcher
(each rank's environment and arguments, the exit status when a rank fails), and what only
DeepSpeed's launcher does stays tested through it (tests/test_faults.py's `Launch`, the runner's
tests). The benchmarks never start it: they launch through the `deepspeed` command. Run as a
script (`python -u node_launcher.py --world_info=... script args`): it imports only its sibling
zygote.py, so nothing heavy.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys

import psutil

# a sibling script's: this one runs as a script too
from zygote import RANK_PIDS_ENV, Forked, serving, write_pids

# How long the ranks get after SIGTERM before SIGKILL (launch.py's terminate_process_tree).
TERMINATE_WAIT_S = 30


def parse_args(argv: list[str]) -> argparse.Namespace:
    """launch.py's flags that a single node's launch uses, spelled as it spells them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--node_rank", type=int, default=0)
    parser.add_argument("--master_addr", default="127.0.0.1")
    parser.add_argument("--master_port", type=int, default=29500)
    parser.add_argument("--world_info", required=True)
    parser.add_argument("--module", action="store_true")
    parser.add_argument("training_script")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return parser.parse_args(argv)


def rank_commands(args: argparse.Namespace) -> list[tuple[list[str], dict[str, str]]]:
    """Each local rank's command and environment, as launch.py's `main` builds them."""
    world: dict[str, list[int]] = json.loads(base64.urlsafe_b64decode(args.world_info))
    nodes = list(world)
    first_rank = sum(len(world[n]) for n in nodes[: args.node_rank])
    local_ids = world[nodes[args.node_rank]]
    env = dict(os.environ)
    env.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # deepspeed/__init__.py sets it on import
    env.update(
        CUDA_VISIBLE_DEVICES=",".join(map(str, local_ids)),
        MASTER_ADDR=args.master_addr,
        MASTER_PORT=str(args.master_port),
        WORLD_SIZE=str(sum(len(ids) for ids in world.values())),
        CROSS_RANK=str(args.node_rank),
        CROSS_SIZE=str(len(nodes)),
        LOCAL_SIZE=str(len(local_ids)),
    )
    commands = []
    for local_rank in range(len(local_ids)):
        rank_env = {**env, "RANK": str(first_rank + local_rank), "LOCAL_RANK": str(local_rank)}
        cmd = [sys.executable, "-u", *(["-m"] if args.module else []), args.training_script]
        cmd += [f"--local_rank={local_rank}", *args.training_script_args]
        commands.append((cmd, rank_env))
    return commands


def start_ranks(commands: list[tuple[list[str], dict[str, str]]]) -> list:
    """Popen each rank, or have the suite's zygote fork it where one serves this launcher's
    environment (each rank's extends it with the rank's world)."""
    path = serving(dict(os.environ), sys.executable)
    if path is None:
        return [subprocess.Popen(cmd, env=env) for cmd, env in commands]
    return [Forked(path, cmd[2:], env, os.getcwd()) for cmd, env in commands]


def terminate(ranks: list[subprocess.Popen]) -> None:
    """SIGTERM every rank and what it started, SIGKILL what is left after TERMINATE_WAIT_S."""
    procs: list[psutil.Process] = []
    for rank in ranks:
        try:
            parent = psutil.Process(rank.pid)
            procs += [*parent.children(recursive=True), parent]
        except psutil.NoSuchProcess:
            continue
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, alive = psutil.wait_procs(procs, timeout=TERMINATE_WAIT_S)
    for p in alive:
        p.kill()


def main(argv: list[str]) -> int:
    """Start the node's ranks; 0 once all exit 0, else the first failing rank's status (the
    others terminated); a SIGINT/SIGTERM here terminates the ranks and exits 1, as launch.py."""
    ranks = start_ranks(rank_commands(parse_args(argv)))
    if os.environ.get(RANK_PIDS_ENV):
        write_pids(os.environ[RANK_PIDS_ENV], [rank.pid for rank in ranks])

    def on_signal(signum: int, frame: object) -> None:
        terminate(ranks)
        sys.exit(1)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    running = list(ranks)
    while running:
        rank = next_exit(running)
        running.remove(rank)
        if rank.returncode != 0:
            terminate(ranks)
            return rank.returncode
    return 0


def next_exit(running: list) -> subprocess.Popen | Forked:
    """The next of `running` to exit, its returncode set."""
    if isinstance(running[0], Forked):
        with selectors.DefaultSelector() as sel:
            for rank in running:
                sel.register(rank.conn, selectors.EVENT_READ, rank)
            rank = sel.select()[0][0].data
        rank.wait()
        return rank
    by_pid = {rank.pid: rank for rank in running}
    while True:
        pid, status = os.wait()
        if pid in by_pid:
            by_pid[pid].returncode = os.waitstatus_to_exitcode(status)
            return by_pid[pid]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
