"""Train GPT-2 with DeepSpeed: `deepspeed [--num_gpus N | --hostfile H] gpt_ds/train.py ...`.

Also `deepspeed --module gpt_ds.train ...`, `python gpt_ds/train.py ...` (one process) and
`python -m gpt_ds.train ...`. The flow reads top to bottom: parse -> the machine's facts, probed
once (launch/machine.py) -> `plan_run` (run/plan.py: the run config, the model's shape, the
DeepSpeed config, the data, the checkpoint to resume and every choice left to gpt_ds: all
resolved and checked before any model exists, identically on every rank) -> process group ->
`Trainer(plan).run()` (training/trainer.py: model -> engine -> loop -> eval -> checkpoint).
"""

import logging
import os
import sys
import warnings
from pathlib import Path

if __package__ in (None, ""):
    # run as a script: Python put gpt_ds/ first on sys.path, where our module names could
    # shadow others; import the package from the repository root instead
    _HERE = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
    sys.path.insert(0, str(_HERE.parent))
if sys.prefix != sys.base_prefix:  # a venv: keep DeepSpeed's JIT-built ops inside it
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
# DeepSpeed 0.19 calls collectives that torch 2.13 marks deprecated, once per rank and step kind
warnings.filterwarnings("ignore", r"`torch\.distributed\.\w+` is deprecated", FutureWarning)

# (E402 is off for this file in pyproject.toml: these imports must follow the sys.path fix)
from gpt_ds.base import dist, logs
from gpt_ds.base.errors import GptDsError
from gpt_ds.launch.machine import probe_machine
from gpt_ds.run.config import parse_args
from gpt_ds.run.plan import claim_out_dir, finished, plan_run, verify_resume
from gpt_ds.training.trainer import Trainer


def main(argv: list[str] | None = None) -> int:
    from gpt_ds.base.launcher_world import adopt_launcher_world  # only mpirun/srun need it

    try:
        adopt_launcher_world()  # mpirun/srun ranks: RANK, WORLD_SIZE before planning
        cfg = parse_args(argv)
        logs.configure(cfg.log_level, dist.rank())  # the launcher's rank, before the group
        plan = plan_run(cfg, probe_machine(dist.local_rank()))
    except GptDsError as exc:
        return dist.refuse(exc)
    for line in plan.notes:
        dist.print0(line)
    os.environ.update(plan.choices.environment)  # before DeepSpeed starts NCCL or W&B
    dist.init()
    lock = None
    try:
        try:
            lock, plan = claim_out_dir(plan)
            plan = verify_resume(plan)
        except GptDsError as exc:
            return dist.refuse(exc)
        if done := finished(plan):  # a requeued job whose run had ended: nothing to train
            dist.print0(done)
            return 0
        return Trainer(plan).run()
    except GptDsError as exc:
        logs.whole_line(f"[rank {dist.rank()}] error: {exc}", sys.stderr)
        return 2
    finally:
        if lock is not None:
            lock.release()
        dist.shutdown()


def exit_now(code: int) -> None:
    """Leave without the interpreter's teardown, once the run's work is done and flushed.

    After a complete run (checkpoints published, process group destroyed) a rank would
    sometimes abort in C++ static destruction ("terminate called without an active exception",
    status -6; seen with ZeRO-2 and ZeRO-3 on CPU, a few launches in a hundred), turning a
    finished run into a failed launch. Nothing is left to flush but logs and stdio.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
