"""The model and the DeepSpeed engine of a run, from its first weights (`--init_from`).

Every rank builds the same model (seeded) and hands it to `deepspeed.initialize`. Weights of an
earlier gpt_ds run are first exported by rank 0 into the new run's out dir (init_source.py);
the other ranks wait, check they see the export (multi-node: a shared --out_dir), and all load
it as pretrained weights; it is removed once every rank has.
"""

from __future__ import annotations

from pathlib import Path

import torch

from gpt_ds.base import dist
from gpt_ds.base.errors import CheckpointError, GptDsError
from gpt_ds.dsconfig.lr_schedule import wsd_scheduler
from gpt_ds.dsconfig.monitors import prepare_wandb
from gpt_ds.dsconfig.resolve import ResolvedDsConfig
from gpt_ds.model.gpt2 import (
    build_model,
    count_params,
    enable_activation_checkpointing,
    param_groups,
    shape_of,
)
from gpt_ds.run.config import RunConfig
from gpt_ds.run.init_source import (
    SCRATCH,
    InitSource,
    export_for_loading,
    remove_staging,
)
from gpt_ds.run.plan import RunPlan
from gpt_ds.training.compile_model import compile_engine, wants_compile
from gpt_ds.training.ds_syncs import make_sync_free


def build_engine(plan: RunPlan):
    """The DeepSpeed engine over a freshly built (or pretrained) GPT-2."""
    import deepspeed

    cfg, shape, ds, init = plan.cfg, plan.shape, plan.ds, plan.init

    if plan.resume is not None:  # its weights come from the checkpoint (--resume auto)
        init = InitSource(SCRATCH)
    weights = _weights_path(init, cfg.out_dir)
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    model = build_model(
        shape,
        cfg.dropout,
        weights,
        chunked_loss=cfg.loss == "chunked",
        zero3_config=ds.config if ds.zero_stage == 3 else None,  # built partitioned
    )
    if init.checkpoint is not None:
        dist.barrier()  # every rank has read the export
        if dist.is_main():
            remove_staging(cfg.out_dir)
    if cfg.activation_checkpointing:
        enable_activation_checkpointing(model)
    assert shape_of(model).num_params() == count_params(model)
    prepare_wandb(ds.config, cfg.out_dir, cfg.run_name)
    weight_decay = ds.config.get("optimizer", {}).get("params", {}).get("weight_decay", 0.0)
    engine, *_ = deepspeed.initialize(
        model=model,
        model_parameters=param_groups(model, weight_decay),
        config=ds.config,
        lr_scheduler=_own_scheduler(cfg, ds, plan.length.decay_iters),
    )
    if line := make_sync_free(engine, ds.precision):
        dist.print0(line)
    if wants_compile(cfg.compile, dist.device().type):
        dist.print0(compile_engine(engine, dist.device().type))
    return engine


def _own_scheduler(cfg: RunConfig, ds: ResolvedDsConfig, decay_iters: int):
    """The LambdaLR of a schedule DeepSpeed does not have (wsd), else None (the config's)."""
    if cfg.lr_schedule != "wsd":
        return None
    fraction = cfg.wsd_decay_fraction
    lr, min_lr, warmup = ds.lr, ds.min_lr, ds.warmup_iters
    assert lr is not None and min_lr is not None and warmup is not None  # resolve_ds_config's
    make, line = wsd_scheduler(lr, min_lr, warmup, decay_iters, fraction)
    dist.print0(line)
    return make


def _weights_path(init: InitSource, out_dir: str) -> str:
    """What `build_model` loads: "scratch", Hugging Face weights, or a checkpoint's export
    (made by rank 0; a failure there is raised on every rank, not left to hang them: a
    checkpoint or disk problem as its message, anything else by rank 0 as itself, with its
    traceback, and by the others as a pointer to it)."""
    ref = init.checkpoint
    if ref is None:
        return init.value
    error, path, crash = None, None, None
    if dist.is_main():
        dist.print0(f"init: weights of {init.describe()}, exported for loading")
        try:
            path = str(export_for_loading(ref, out_dir, log=None))
        except (GptDsError, OSError) as exc:
            error = f"--init_from {init.value}: {type(exc).__name__}: {exc}"
        except Exception as exc:  # a bug: it must still reach the ranks waiting in the gather
            crash = exc
            error = (
                f"--init_from {init.value}: rank 0 failed exporting {ref.tag_dir} "
                f"({type(exc).__name__}); see its error above"
            )
    error, path = dist.gather_objects((error, path))[0]
    if crash is not None:
        raise crash
    if error is not None:
        raise CheckpointError(error)
    unseen = [r for r, seen in enumerate(dist.gather_objects(Path(path).is_dir())) if not seen]
    if unseen:
        raise CheckpointError(
            f"ranks {unseen} cannot see {path}, written by rank 0: --out_dir must be on a file "
            "system every node sees (as checkpoints need too)"
        )
    return path
