"""The model and the DeepSpeed engine of a run, from its first weights (`--init_from`).

Every rank builds the same model (seeded) and hands it to `deepspeed.initialize`. Weights of an
earlier gpt_ds run are first exported by rank 0 into the new run's out dir (init_source.py);
the other ranks wait, check they see the export (multi-node: a shared --out_dir), and all load
it as pretrained weights; it is removed once every rank has. The built engine is then
compiled where `--compile` asks (on GPUs by default) and its ZeRO-1/2 step made free of host
syncs where the DeepSpeed version is one checked (`make_sync_free`).
"""

from __future__ import annotations

import contextlib
import math
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from gpt_ds.base import dist
from gpt_ds.base.errors import CheckpointError, GptDsError
from gpt_ds.dsconfig.optimization import wsd_scheduler
from gpt_ds.dsconfig.resolve import ResolvedDsConfig
from gpt_ds.model.gpt2 import (
    count_params,
    enable_activation_checkpointing,
    param_groups,
    shape_of,
    tag_muon,
)
from gpt_ds.run.config import RunConfig
from gpt_ds.run.init_source import (
    SCRATCH,
    InitSource,
    export_for_loading,
    remove_staging,
)
from gpt_ds.run.plan import RunPlan

# DeepSpeed's ZeRO-1/2 optimizer step without its host syncs (on a GPU each drains the queue).
#
# DeepSpeed 0.19.8's DeepSpeedZeroOptimizer (deepspeed/runtime/zero/stage_1_and_2.py) makes, per
# optimizer step:
# - per parameter group, `mask_nan_or_inf_with_val_inplace` (deepspeed/runtime/utils.py): a
#   `torch.tensor(-1.0, device=...)` (a blocking host-to-device copy) used as `masked_fill_`'s
#   value (an `.item()` in ATen);
# - per parameter group, `unscale_and_clip_grads`: `bool()` of "is the norm invalid";
# - in `step`, in fp32 only (no loss scaler): the same `bool()`, to skip a step with inf/NaN
#   gradients.
# The replacements compute the same values with tensor ops (a Python number as the fill value,
# `torch.where` for the clip), and fp32 does not skip a step by itself: as in bf16, gpt_ds
# reads the gradient norm and the loss (training/trainer.py) and stops on a non-finite one
# before any save. Installed for bf16 and fp32 when the optimizer checks no overflow (fp16 keeps
# DeepSpeed's code: its loss scaler reads the overflow flag every step), and only on the
# DeepSpeed versions in CHECKED; on any other DeepSpeed's own code runs, said at start-up.

CHECKED = ("0.19.8",)  # DeepSpeed versions whose stage_1_and_2.py these replacements match


def mask_invalid_norm(norm: torch.Tensor, **_deepspeed_keywords: Any) -> None:
    """`mask_nan_or_inf_with_val_inplace` without a sync: an inf or NaN norm becomes -1, the
    sentinel DeepSpeed later reads as invalid. It stands in for DeepSpeed's, whose callers pass
    `device=`; as DeepSpeed's own does, it writes -1 on the norm's device whatever they pass."""
    norm.masked_fill_(norm.isnan() | norm.isinf(), -1.0)


def unscale_and_clip_grads(self, grad_groups_flat: list, total_norm: Any) -> None:
    """DeepSpeedZeroOptimizer.unscale_and_clip_grads for a device norm: an invalid one (inf,
    NaN or the -1 sentinel) made inf by `torch.where`, not by a `bool()` of it, for the same
    scale. A Python number (no caller passes one) goes to DeepSpeed's own."""
    if not torch.is_tensor(total_norm):
        return type(self).unscale_and_clip_grads(self, grad_groups_flat, total_norm)
    if self.clip_grad == 0.0 and self.loss_scale == 1.0:
        return None
    combined_scale = self.loss_scale
    if self.clip_grad > 0.0:
        invalid = ~torch.isfinite(total_norm) | (total_norm < 0)
        clip_norm = torch.where(invalid, torch.full_like(total_norm, math.inf), total_norm)
        clip = torch.clamp((clip_norm / self.loss_scale + 1e-6) / self.clip_grad, min=1.0)
        combined_scale = clip * self.loss_scale
    for grad in grad_groups_flat:
        for g in grad if isinstance(grad, list) else [grad]:
            g.data.mul_(1.0 / combined_scale)
    return None


def invalid_norm_unread(norm: Any) -> bool:
    """`is_invalid_grad_norm` as `step` uses it in fp32: a device norm is not read (False), so
    the step is not skipped on it; the caller reads the norm later, with the loss."""
    if torch.is_tensor(norm):
        return False
    return not math.isfinite(float(norm)) or norm < 0


def sync_free_plan(
    zero_1_or_2: bool, precision: str, checks_overflow: bool, version: str
) -> tuple[bool, str]:
    """Whether to install the replacements, and the start-up line that says what runs."""
    if not zero_1_or_2:
        return False, ""  # ZeRO-3 or no ZeRO: its syncs are counted, not removed
    if precision == "fp16" or checks_overflow:
        return (
            False,
            "host syncs: DeepSpeed's step reads its overflow flag (fp16 or check_grad_overflow)",
        )
    if version not in CHECKED:
        return False, (
            f"host syncs: DeepSpeed {version}'s own ZeRO step runs, with its syncs (gpt_ds's "
            f"sync-free one is checked against {', '.join(CHECKED)} only)"
        )
    return True, "host syncs: DeepSpeed's ZeRO step without its per-group syncs (sync_free_plan)"


def make_sync_free(engine: Any, precision: str) -> str:
    """Install the replacements for `engine`'s ZeRO-1/2 optimizer where they apply; returns
    the start-up line saying what runs."""
    import deepspeed
    from deepspeed.runtime.zero import stage_1_and_2

    optimizer: Any = getattr(engine, "optimizer", None)
    zero_1_or_2 = isinstance(optimizer, stage_1_and_2.DeepSpeedZeroOptimizer)
    checks = bool(getattr(optimizer, "check_grad_overflow", False))
    install, line = sync_free_plan(zero_1_or_2, precision, checks, deepspeed.__version__)
    if install:
        stage_1_and_2.mask_nan_or_inf_with_val_inplace = mask_invalid_norm
        stage_1_and_2.is_invalid_grad_norm = invalid_norm_unread
        optimizer.unscale_and_clip_grads = types.MethodType(unscale_and_clip_grads, optimizer)
    return line


# `--compile`: torch.compile of the model through the DeepSpeed engine (`engine.compile()`),
# on GPUs by default (`auto`), where inductor fuses the elementwise passes and cuts the kernels
# the host launches per step (one H100, GPT-2 124M: 1.24x the eager tokens/s at two thirds of the
# memory); off on CPU ranks, where it gained nothing measured and each launch's
# first iteration would carry the compile.
#
# The compiled graphs are built on the first forward and backward, so the first iteration
# carries the compile time (the trainer reports it apart from the steady-state speed). Where
# torch.compile cannot work, the run goes on eager and says so at start-up in a WARNING line
# naming why: no C++ compiler for inductor on CPU, no Triton for it on a GPU, or
# `engine.compile()` itself refusing. Nothing else is hidden: dynamo's process-wide
# `suppress_errors` is left as torch sets it, so a graph that fails to compile later is torch's to
# report, with its own error.
# The loss is taken inside the compiled forward (model/training_model.py), by `--loss` kind:
# - full: head, fp32 upcast and cross-entropy in the one graph, for inductor to fuse (as
#   nanoGPT's compiled `model(idx, targets)`);
# - deepspeed: eager (`torch.compiler.disable` on `deepspeed_cross_entropy`), after the compiled
#   head: its Triton kernels are already fused, and torch 2.11's dynamo failed inside its
#   version check on an H200 (BENCHMARKS.md); the graph breaks before it;
# - chunked stays eager (`torch.compiler.disable` on `chunked_cross_entropy`): a loop of large
#   matmuls that compile would only unroll; the graph breaks before it.


def compile_engine(engine, blocker: str | None) -> tuple[bool, str]:
    """Compile the engine's module unless the machine cannot (`blocker`, the plan's); returns
    whether it did, and the line for the log: compiled, or a WARNING saying why not and that
    the run trains eager."""
    if blocker is None:
        try:
            engine.compile()
        except (RuntimeError, ValueError) as exc:
            blocker = f"engine.compile() refused: {exc}"
    if blocker is not None:
        return False, f"WARNING: --compile: cannot compile, the run trains eager: {blocker}"
    line = "--compile: model compiled by torch.compile (inductor); the first iteration compiles"
    return True, line


# A run whose model trains eager compiles nothing else either. DeepSpeed's Muon runs its
# Newton-Schulz through torch.compile (deepspeed/runtime/zero/muon/original_muon.py,
# `zeropower_via_newtonschulz5`): left on, it builds inductor kernels at the first optimizer
# step of a run that chose eager: C++ on CPU ranks (~25 CPU s for each shape and dtype, cold), and
# an InductorError, not a warning, where the machine has no C++ compiler (or, on a GPU, no
# Triton): the `compile_blocker` the plan named. So where the model is not compiled, dynamo is
# off for the rank's process (`torch._dynamo.config.disable`, read at each frame), and Muon's
# Newton-Schulz runs eager, as the model does.
def run_eager(muon: bool) -> str | None:
    """Turn torch.compile off for this process; the start-up line saying so for a Muon run."""
    import torch._dynamo

    torch._dynamo.config.disable = True
    if muon:
        return "Muon: its Newton-Schulz runs eager, as the model (torch.compile off for this run)"
    return None


def build_engine(plan: RunPlan):
    """The DeepSpeed engine over a freshly built (or pretrained) GPT-2."""
    import deepspeed

    from gpt_ds.model.training_model import build_model  # transformers: after the plan

    cfg, shape, ds, init = plan.cfg, plan.shape, plan.ds, plan.init

    if plan.resume is not None:  # its weights come from the checkpoint (--resume auto)
        init = InitSource(SCRATCH)
    weights = _weights_path(init, cfg.out_dir)
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    model = build_model(
        shape,
        cfg.dropout,
        weights,
        loss=cfg.loss,
        zero3_config=ds.config if ds.zero_stage == 3 else None,  # built partitioned
    )
    if init.checkpoint is not None:
        dist.barrier()  # every rank has read the export
        if dist.is_main():
            remove_staging(cfg.out_dir)
    if cfg.activation_checkpointing:
        enable_activation_checkpointing(model)
    assert shape_of(model).num_params() == count_params(model)
    optimizer_params = ds.config.get("optimizer", {}).get("params", {})
    muon = ds.optimizer == "muon"
    groups = param_groups(
        model,
        optimizer_params.get("weight_decay", 0.0),
        optimizer_params["muon_weight_decay"] if muon else None,
    )
    with gpt2_muon_split() if muon else contextlib.nullcontext():
        engine, *_ = deepspeed.initialize(
            model=model,
            model_parameters=groups,
            config=plan.engine_config(),
            lr_scheduler=_own_scheduler(cfg, ds, plan.length.decay_iters),
        )
    if muon:
        dist.print0(groups_line(optimizer_groups(engine)))
    if line := make_sync_free(engine, ds.precision):
        dist.print0(line)
    compiled = False
    if plan.choices.compile:
        compiled, line = compile_engine(engine, plan.choices.compile_blocker)
        dist.print0(line)
    if not compiled and (eager := run_eager(muon)):
        dist.print0(eager)
    return engine


def optimizer_groups(engine) -> list[dict]:
    """The engine's optimizer param groups as built: each one's name, whether Muon updates it,
    its weight decay and the names of its parameters (ZeRO keeps each group's parameters
    itself: bit16_groups at stages 1-2, fp16_groups per sub-group at stage 3)."""
    names = {id(p): name for name, p in engine.module.named_parameters()}
    inner = engine.optimizer
    groups = [
        {
            "name": group.get("name"),
            "muon": bool(group.get("use_muon")),
            "weight_decay": group["weight_decay"],
            "params": [],
        }
        for group in engine.basic_optimizer.param_groups
    ]
    if hasattr(inner, "bit16_groups"):
        held = list(enumerate(inner.bit16_groups))
    elif hasattr(inner, "fp16_groups"):  # stage 3: sub-groups, each of one group
        held = [(inner.sub_group_to_group_id[i], g) for i, g in enumerate(inner.fp16_groups)]
    else:
        held = [(i, g["params"]) for i, g in enumerate(engine.basic_optimizer.param_groups)]
    for index, params in held:
        groups[index]["params"] += [names[id(p)] for p in params]
    return groups


def groups_line(groups: list[dict]) -> str:
    """The start-up report's line saying which parameters each optimizer group updates."""
    parts = [
        f"{group['name']}: {'Muon' if group['muon'] else 'AdamW'}, {len(group['params'])} "
        f"tensors, weight decay {group['weight_decay']:g}"
        for group in groups
    ]
    return "optimizer groups: " + "; ".join(parts)


@contextlib.contextmanager
def gpt2_muon_split() -> Iterator[None]:
    """GPT-2's Muon split in place of DeepSpeed's while `deepspeed.initialize` runs.

    initialize tags `use_muon` itself (`deepspeed.set_optimizer_flags`, looked up in the
    deepspeed module at the call): every 2-D parameter whose name lacks "embed" or "lm_head",
    which gives GPT-2's wte (the tied head, named transformer.wte.weight) and wpe to Muon.
    gpt2.py's `tag_muon` replaces its tags right after it, before the optimizer reads them."""
    import deepspeed

    deepspeeds = deepspeed.set_optimizer_flags

    def set_flags(config_class, model: torch.nn.Module) -> None:
        deepspeeds(config_class, model)
        tag_muon(model)

    deepspeed.set_optimizer_flags = set_flags
    try:
        yield
    finally:
        deepspeed.set_optimizer_flags = deepspeeds


def _own_scheduler(cfg: RunConfig, ds: ResolvedDsConfig, decay_iters: int):
    """The LambdaLR of a schedule DeepSpeed does not have (wsd), else None (the config's)."""
    if cfg.lr_schedule != "wsd":
        return None
    fraction = cfg.wsd_decay_fraction
    make, line = wsd_scheduler(ds.lr, ds.min_lr, ds.warmup_iters, decay_iters, fraction)
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
