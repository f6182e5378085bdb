"""A collective burn-in: the real backend over a launch's ranks, in under a minute, before the
run finds a slow device or link hours in.

    deepspeed --hostfile H --module gpt_ds.launch.burn_in [--hostfile H] [--deepspeed_config
        zero2] [--model gpt2]          # gpt-ds-preflight --burn_in launches it after its checks

Every rank joins the group the launcher set up (NCCL/RCCL on GPUs, gloo on CPU) and measures:
- matrix-product TFLOP/s of its device, one rank at a time (ranks sharing a machine's cores
  would otherwise measure each other);
- all-reduce and all-gather bus bandwidth at the preset's bucket sizes (capped at 64 MiB on
  CPU ranks, to stay in the minute);
- point-to-point bandwidth between each pair of nodes (their first ranks).
Rank 0 prints the figures per node; with three or more nodes it flags a device or link below
half the median of the others (with two it prints them side by side), and the communication
time the preset's optimizer step will take on the measured all-reduce bandwidth.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as tdist

SLOW_SHARE = 0.5  # flagged below this share of the others' median
PASSES = 2  # each matmul and link measured this many times, its best kept
CPU_CAP_BYTES = 64 << 20


def matmul_tflops(device: torch.device, seconds: float = 0.2, windows: int = 3) -> float:
    """Dense matrix-product TFLOP/s on `device` (bf16 on GPUs, fp32 on CPU): the best of
    `windows` timed windows, so a moment of interference does not flag a healthy device."""
    gpu = device.type != "cpu"
    n, dtype = (4096, torch.bfloat16) if gpu else (512, torch.float32)
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    a @ b  # warm-up
    best = 0.0
    for _ in range(windows):
        done, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            a @ b
            if gpu:
                torch.cuda.synchronize()
            done += 1
        best = max(best, done * 2 * n**3 / (time.perf_counter() - start) / 1e12)
    return best


def bus_gbps(kind: str, nbytes: int, device: torch.device, repeats: int = 3) -> float:
    """Bus bandwidth (GB/s) of an all-reduce or all-gather of `nbytes` per rank (NCCL-tests'
    definition: what each link carries, comparable across world sizes)."""
    n = tdist.get_world_size()
    t = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)
    out = [torch.empty_like(t) for _ in range(n)] if kind == "all_gather" else None

    def once() -> None:
        tdist.all_gather(out, t) if out is not None else tdist.all_reduce(t)

    once()
    tdist.barrier()
    start = time.perf_counter()
    for _ in range(repeats):
        once()
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = _slowest((time.perf_counter() - start) / repeats)
    factor = 2 * (n - 1) / n if kind == "all_reduce" else (n - 1)  # all-gather: n-1 shards in
    return factor * nbytes / seconds / 1e9


def _slowest(seconds: float) -> float:
    """The largest of every rank's `seconds` (a collective ends with its slowest rank)."""
    t = torch.tensor([seconds], dtype=torch.float64)
    tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
    return float(t[0])


def p2p_gbps(src: int, dst: int, nbytes: int, device: torch.device, repeats: int = 5) -> float:
    """GB/s from rank `src` to rank `dst`, the best of `repeats` transfers after one that sets
    up the connection (every rank calls; only the two take part; `dst` returns the rate)."""
    me = tdist.get_rank()
    t = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)
    best = 0.0
    for attempt in range(repeats + 1):
        start = time.perf_counter()
        if me == src:
            tdist.send(t, dst)
            tdist.recv(t[:1], dst)  # the receiver's word that the whole tensor arrived
        elif me == dst:
            tdist.recv(t, src)
            tdist.send(t[:1], src)
        if attempt and me == dst:
            best = max(best, nbytes / (time.perf_counter() - start) / 1e9)
    return best


def slow_flags(values: dict[str, float], what: str, unit: str, advice: str) -> list[str]:
    """A line for each entry below SLOW_SHARE of the median of the others (3+ entries)."""
    if len(values) < 3:
        return []
    lines = []
    for name, value in values.items():
        others = statistics.median(v for k, v in values.items() if k != name)
        if value < SLOW_SHARE * others:
            lines.append(f"{name}: {what} {value:.3g} {unit} vs median {others:.3g}: {advice}")
    return lines


# ------------------------------------------------------------------------------ the launch
def node_names(hostfile: str | None) -> list[str]:
    """Each rank's node name: the hostfile's host of its node rank (DeepSpeed's launcher
    numbers nodes in hostfile order), else `node N`."""
    from gpt_ds.base import dist
    from gpt_ds.launch.hostfile import read_hostfile

    hosts = [e.host for e in read_hostfile(hostfile)] if hostfile else []
    node = int(os.environ.get("CROSS_RANK", 0))
    mine = hosts[node] if node < len(hosts) else f"node {node}"
    return dist.gather_objects(mine)


def measure(names: list[str], bucket_bytes: dict[str, int], device: torch.device) -> dict:
    """Every figure, on every rank (rank 0's copy is the one printed)."""
    from gpt_ds.base import dist

    me, world = dist.rank(), dist.world_size()
    mine = 0.0
    # two passes, each device and link at its best of both: a moment of interference (another
    # process, the scheduler) seldom hits the same entry twice, a slow device or link does
    for _ in range(PASSES):
        for r in range(world):  # one rank at a time: co-located ranks share cores
            dist.barrier()
            if r == me:
                mine = max(mine, matmul_tflops(device))
    tflops = dist.gather_objects(mine)
    collectives = {
        f"{kind} {nbytes / 2**20:.0f} MiB": bus_gbps(kind, nbytes, device)
        for kind, nbytes in bucket_bytes.items()
    }
    firsts = {names[r]: r for r in reversed(range(world))}  # each node's first rank
    links: dict[str, float] = {}
    for _ in range(PASSES):
        for a in firsts:
            for b in firsts:
                if a < b:
                    got = max(dist.gather_objects(p2p_gbps(firsts[a], firsts[b], 16 << 20, device)))
                    links[f"{a} -> {b}"] = max(links.get(f"{a} -> {b}", 0.0), got)
    return {"tflops": tflops, "collectives": collectives, "links": links}


def zero_section(preset: str) -> dict:
    """The preset's `zero_optimization` section (bucket sizes, stage)."""
    from gpt_ds.dsconfig.schema import load_ds_config, preset_path

    return load_ds_config(preset_path(preset)).get("zero_optimization", {})


def bucket_sizes(zero: dict, device: torch.device) -> dict[str, int]:
    """Bytes of the preset's reduce and all-gather buckets (fp32 elements x 4 on CPU ranks,
    16-bit x 2 on GPUs), capped on CPU ranks."""
    width = 4 if device.type == "cpu" else 2
    sizes = {
        "all_reduce": int(zero.get("reduce_bucket_size", 5e8)) * width,
        "all_gather": int(zero.get("allgather_bucket_size", 5e8)) * width,
    }
    cap = CPU_CAP_BYTES if device.type == "cpu" else 1 << 30
    return {k: min(v, cap) for k, v in sizes.items()}


def report(names: list[str], figures: dict, zero: dict, model: str, device: torch.device):
    """The lines rank 0 prints: figures per node, flags, the preset's communication time."""
    from gpt_ds.memory.estimate import comm_bytes_per_step
    from gpt_ds.model.gpt2 import resolve_shape

    hosts = list(dict.fromkeys(names))
    devices = {
        (names[r] if names.count(names[r]) == 1 else f"{names[r]} rank {r}"): t
        for r, t in enumerate(figures["tflops"])
    }
    lines = [f"burn-in: {len(names)} ranks on {len(hosts)} node(s), {tdist.get_backend()}"]
    lines += [f"  matmul {name}: {t:.3g} TFLOP/s" for name, t in devices.items()]
    lines += [f"  {k} bus bandwidth: {v:.3g} GB/s" for k, v in figures["collectives"].items()]
    lines += [f"  point-to-point {k}: {v:.3g} GB/s" for k, v in figures["links"].items()]
    if len(hosts) >= 3:
        flags = slow_flags(devices, "matmul", "TFLOP/s", "check its clocks, power and load")
        flags += slow_flags(figures["links"], "link", "GB/s", "check its NIC, cable, switch port")
        lines += [f"  slow: {f}" for f in flags] or ["  no device or link below half the median"]
    elif len(hosts) == 2:
        lines.append("  two nodes: compare their figures above side by side")
    stage = zero.get("stage", 0)
    precision = "fp32" if device.type == "cpu" else "bf16"
    nbytes = comm_bytes_per_step(resolve_shape(model), stage, precision, len(names))
    busbw = next(v for k, v in figures["collectives"].items() if k.startswith("all_reduce"))
    if nbytes:
        lines.append(
            f"  expected communication per optimizer step ({model}, ZeRO-{stage}, {precision}, "
            f"no accumulation): {nbytes / 1e6:,.0f} MB per rank -> "
            f"~{nbytes / (busbw * 1e9) * 1000:,.0f} ms at the measured all-reduce bandwidth"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    from gpt_ds.base import dist

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hostfile", help="the launch's hostfile: names the nodes")
    p.add_argument("--deepspeed_config", default="zero2", help="preset: bucket sizes, volume")
    p.add_argument("--model", default="gpt2", help="model preset for the time per step")
    p.add_argument("--local_rank", type=int, help=argparse.SUPPRESS)  # DeepSpeed's launcher
    args = p.parse_args(argv)
    dist.init()
    try:
        device = dist.device()
        names, zero = node_names(args.hostfile), zero_section(args.deepspeed_config)
        figures = measure(names, bucket_sizes(zero, device), device)
        if dist.is_main():
            print("\n".join(report(names, figures, zero, args.model, device)))
    finally:
        dist.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
