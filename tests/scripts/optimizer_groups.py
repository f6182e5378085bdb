"""Build a run's engine as gpt_ds/train.py does (plan_run, build_engine), train four steps and
write, from rank 0, the optimizer's groups as the engine holds them, the losses and the norm of
Muon's committed momentum (rank 0's part) and how many graphs torch.compile built in the
rank, as JSON: what tests/test_muon.py compares with GPT-2's Muon split. Arguments:
train.py's flags, then `--groups_json PATH`."""

from __future__ import annotations

import json
import sys

import torch
from torch._dynamo.utils import counters


def main() -> None:
    argv = sys.argv[1:]
    where = argv.index("--groups_json")
    out = argv[where + 1]
    argv = [a for i, a in enumerate(argv) if i not in (where, where + 1)]
    argv = [a for a in argv if not a.startswith("--local_rank")]

    from gpt_ds.base import dist
    from gpt_ds.launch.machine import probe_machine
    from gpt_ds.model.gpt2 import lm_loss
    from gpt_ds.run.config import parse_args
    from gpt_ds.run.plan import plan_run
    from gpt_ds.training.engine_build import build_engine, optimizer_groups

    plan = plan_run(parse_args(argv), probe_machine())
    dist.init()
    engine = build_engine(plan)
    groups = optimizer_groups(engine)
    torch.manual_seed(0)
    size = (plan.ds.micro_batch_size, plan.shape.block_size + 1)
    tokens = torch.randint(0, plan.shape.tokens, size)
    losses = []
    for _ in range(4):  # the warm-up's first steps have lr 0
        loss = lm_loss(engine, tokens[:, :-1], tokens[:, 1:])
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    inner = getattr(engine.optimizer, "optimizer", engine.optimizer)
    momenta = [s["momentum_buffer"] for s in inner.state.values() if "momentum_buffer" in s]
    momentum = sum(m.float().norm().item() ** 2 for m in momenta) ** 0.5
    if dist.is_main():
        with open(out, "w") as f:
            graphs = counters["stats"]["unique_graphs"]  # dynamo's own count, this process
            found = {"groups": groups, "losses": losses, "momentum_norm": momentum}
            json.dump({**found, "compiled_graphs": graphs}, f)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
