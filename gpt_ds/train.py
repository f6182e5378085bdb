"""Train GPT-2 with DeepSpeed: `deepspeed [--num_gpus N | --hostfile H] gpt_ds/train.py ...`.

Also runs as one process: `python gpt_ds/train.py ...`. The flow reads top to bottom:
parse -> validate (run config, DeepSpeed config, data: all before any model exists) ->
process group -> data -> model -> engine -> (resume) -> loop {train, log, eval, checkpoint}.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# `python gpt_ds/train.py` puts gpt_ds/ first on sys.path, where our module names could shadow
# others; import the package from the repository root instead.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))
if sys.prefix != sys.base_prefix:  # a venv: keep DeepSpeed's JIT-built ops inside it
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))

import math  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from dataclasses import asdict  # noqa: E402

import torch  # noqa: E402

# DeepSpeed 0.19 calls collectives that torch 2.13 marks deprecated, once per rank and step kind
warnings.filterwarnings("ignore", r"`torch\.distributed\.\w+` is deprecated", FutureWarning)

from gpt_ds import dist  # noqa: E402
from gpt_ds.checkpoint import (  # noqa: E402
    Checkpointer,
    convert_to_universal,
    read_manifest,
    universal_tag,
)
from gpt_ds.config import RunConfig, parse_args, validate  # noqa: E402
from gpt_ds.data import TrainSampler, load_token_data  # noqa: E402
from gpt_ds.ds_config import RunSettings, load_ds_config, preset_path, resolve_ds_config  # noqa: E402
from gpt_ds.errors import ConfigError, GptDsError  # noqa: E402
from gpt_ds.evaluation import evaluate  # noqa: E402
from gpt_ds.memory import (  # noqa: E402
    comm_bytes_per_step,
    estimate_run,
    measured_model_state_bytes,
)
from gpt_ds.metrics import MetricsLogger  # noqa: E402
from gpt_ds.model import (  # noqa: E402
    ModelShape,
    build_model,
    count_params,
    enable_activation_checkpointing,
    flops_per_token,
    lm_loss,
    resolve_shape,
    shape_of,
)


class StopRequest:
    """Set by SIGTERM/SIGINT (preemption, Ctrl-C, Slurm's warning signal); checked per step."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum, _frame) -> None:
        self.signal_name = signal.Signals(signum).name


def model_shape_for(cfg: RunConfig) -> ModelShape:
    """The shape the run trains: a preset with overrides, or that of `--init_from` weights."""
    if cfg.init_from == "scratch":
        return resolve_shape(cfg.model, cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.block_size)
    from transformers import GPT2Config

    try:
        c = GPT2Config.from_pretrained(cfg.init_from)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"--init_from {cfg.init_from}: not a Hugging Face GPT-2 directory, and not a hub "
            f"name this machine can fetch ({str(exc).splitlines()[0]})"
        ) from exc
    if c.model_type != "gpt2":
        raise ConfigError(f"--init_from {cfg.init_from}: model_type {c.model_type!r}, not gpt2")
    if cfg.block_size and cfg.block_size > c.n_positions:
        raise ConfigError(
            f"--block_size {cfg.block_size} exceeds the pretrained model's {c.n_positions} "
            "positions (n_positions)"
        )
    return ModelShape(c.n_layer, c.n_head, c.n_embd, cfg.block_size or c.n_positions, c.vocab_size)


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices only; biases and LayerNorm gains are not decayed."""
    decay, no_decay = [], []
    for _name, p in model.named_parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    try:
        validate(cfg)
        shape = model_shape_for(cfg)
        raw_ds = load_ds_config(preset_path(cfg.deepspeed_config))
        resolved = resolve_ds_config(
            raw_ds,
            RunSettings(
                world_size=world,
                micro_batch_size=cfg.micro_batch_size,
                grad_accum=cfg.grad_accum,
                lr=cfg.lr,
                min_lr=cfg.min_lr,
                warmup_iters=cfg.warmup_iters,
                max_iters=cfg.lr_decay_iters or cfg.max_iters,
                grad_clip=cfg.grad_clip,
                precision=None if cfg.precision == "auto" else cfg.precision,
            ),
            source=cfg.deepspeed_config,
        )
        data = load_token_data(cfg.data_dir, shape.vocab_size, shape.block_size)
        ckpt = Checkpointer(cfg.out_dir, cfg.keep_last)
        resume_tag = ckpt.resolve(cfg.resume) if cfg.resume else None
        if resume_tag:
            ckpt.check_model(resume_tag, asdict(shape))
        check_writable(Path(cfg.out_dir))
    except GptDsError as exc:  # identical on every rank: let rank 0 say it
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    dist.init()
    try:
        return train(cfg, shape, resolved, data, ckpt, resume_tag)
    except GptDsError as exc:
        print(f"[rank {dist.rank()}] error: {exc}", file=sys.stderr, flush=True)
        return 2
    finally:
        dist.shutdown()


def check_writable(out_dir: Path) -> None:
    """Fail before training, not at the first checkpoint, when out_dir cannot be written."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / f".write_probe_{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise GptDsError(f"--out_dir {out_dir}: not writable ({exc.strerror or exc})") from exc


def train(cfg: RunConfig, shape: ModelShape, resolved, data, ckpt: Checkpointer, resume_tag) -> int:
    import deepspeed

    rank, world, dev = dist.rank(), dist.world_size(), dist.device()
    stop = StopRequest()
    node = os.environ.get("CROSS_RANK", os.environ.get("GROUP_RANK", "0"))
    print(
        f"rank {rank}/{world} on host {socket.gethostname()} node {node} "
        f"local_rank {dist.local_rank()} device {dev}",
        flush=True,
    )
    mb, ga = resolved.micro_batch_size, resolved.grad_accum
    tokens_per_iter = mb * ga * world * shape.block_size
    dist.print0(
        f"model {cfg.model if cfg.init_from == 'scratch' else cfg.init_from}: "
        f"{shape.n_layer} layers, {shape.n_head} heads, {shape.n_embd} wide, "
        f"block {shape.block_size}, {shape.num_params() / 1e6:.2f}M parameters"
    )
    for note in resolved.notes:
        dist.print0(note)
    dist.print0(
        f"tokens per iteration: {tokens_per_iter:,}; data: {len(data.train):,} train / "
        f"{len(data.val):,} val tokens"
    )

    if resume_tag:
        resume_tag = universal_if_resized(ckpt, resume_tag, resolved.config)
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    model = build_model(shape, cfg.dropout, cfg.init_from)
    if cfg.activation_checkpointing:
        enable_activation_checkpointing(model)
    assert shape_of(model).num_params() == count_params(model)
    weight_decay = resolved.config.get("optimizer", {}).get("params", {}).get("weight_decay", 0.0)
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=param_groups(model, weight_decay), config=resolved.config
    )
    estimate = print_memory_estimate(cfg, shape, resolved, engine, world)
    comm_seconds = communication_plan(shape, resolved, engine, world)
    torch.manual_seed(cfg.seed + 1000 * rank)  # per-rank dropout streams

    sampler = TrainSampler(data.train, shape.block_size, mb, cfg.seed, rank)
    shape_dict = asdict(shape)
    start_iter, best_val, best_tag = 0, None, None
    if resume_tag:
        resumed = ckpt.load(engine, resume_tag, shape_dict)
        start_iter, best_val, best_tag = resumed.iteration, resumed.best_val_loss, resumed.best_tag
        sampler.load_state_dict(resumed.sampler_state)
        dist.print0(f"resumed from {cfg.out_dir}/{resume_tag} at iteration {start_iter}")
    if start_iter >= cfg.max_iters:
        dist.print0(f"nothing to do: checkpoint is at iteration {start_iter} >= --max_iters")
        return 0

    metrics = MetricsLogger(cfg.out_dir, dist.is_main(), flops_per_token(shape), world)
    metrics.event(
        {"event": "start", "iter": start_iter, "world_size": world, "config": cfg.to_dict()}
    )

    def do_eval(it: int, train_loss: float | None) -> float:
        res = evaluate(
            engine, data.val, shape.block_size, cfg.eval_iters * mb, mb, dev, rank, world
        )
        metrics.log_eval(it, res.loss, train_loss, res.perplexity)
        return res.loss

    def save(tag: str, it: int, val_loss: float | None) -> None:
        if cfg.no_checkpoint:
            return
        path = ckpt.save(
            engine,
            tag,
            iteration=it,
            sampler=sampler,
            run_config=cfg.to_dict(),
            model_shape=shape_dict,
            extra={
                "val_loss": val_loss,
                "best_val_loss": best_val,
                "best_tag": best_tag,
                "precision": resolved.precision,
            },
        )
        metrics.event({"event": "checkpoint", "iter": it, "tag": tag, "message": f"saved {path}"})

    engine.train()
    log_loss, log_steps, log_seconds, since_eval = 0.0, 0, 0.0, []
    last_val = None
    for it in range(start_iter + 1, cfg.max_iters + 1):
        t0 = time.perf_counter()
        loss_sum, skipped_before = 0.0, engine.skipped_steps
        for _ in range(ga):
            x, y = sampler.next_batch()
            loss = lm_loss(engine, x.to(dev), y.to(dev))
            engine.backward(loss)
            engine.step()
            loss_sum += loss.item()
        # one tiny all-reduce per iteration: the mean loss for the log, NaN detection and the
        # stop flag, so every rank takes the same branch below
        total, stopping = dist.all_reduce_sum([loss_sum / ga, float(stop.signal_name is not None)])
        mean_loss = total / world
        # without fp16's loss scaler, a skipped step means inf/NaN gradients: DeepSpeed would
        # go on skipping every step silently while the (huge but finite) loss is logged
        skipped = resolved.precision != "fp16" and engine.skipped_steps > skipped_before
        if not math.isfinite(mean_loss) or skipped:
            good = ckpt.latest_tag()
            where = (
                f"the last good checkpoint is {cfg.out_dir}/{good}" if good else "no checkpoint yet"
            )
            what = (
                f"loss became {mean_loss}"
                if not math.isfinite(mean_loss)
                else "gradients became non-finite (DeepSpeed skipped the optimizer step)"
            )
            raise GptDsError(
                f"{what} at iteration {it}; stopping without saving ({where}). "
                "Lower --lr, raise warmup, or check the data."
            )
        log_loss += mean_loss
        log_steps += 1
        log_seconds += time.perf_counter() - t0
        if it == start_iter + 1:
            report_model_states(engine, estimate)
        since_eval.append(mean_loss)
        if it % cfg.log_interval == 0 or it == cfg.max_iters:
            lr = engine.get_lr()[0]
            metrics.log_train(
                it,
                log_loss / log_steps,
                lr,
                tokens_per_iter * log_steps,
                log_steps,
                log_seconds,
                comm_seconds,
            )
            log_loss, log_steps, log_seconds = 0.0, 0, 0.0
        if it == cfg.max_iters:
            break
        saved = False
        if cfg.eval_interval and it % cfg.eval_interval == 0:
            last_val = do_eval(it, sum(since_eval) / len(since_eval))
            since_eval = []
            improved = best_val is None or last_val < best_val
            if improved:
                best_val, best_tag = last_val, f"iter_{it}"
            if improved or not cfg.save_only_on_improvement:
                save(f"iter_{it}", it, last_val)
                saved = True
        if stopping:
            dist.print0(f"received {stop.signal_name or 'a stop signal on another rank'}: saving")
            if not saved:  # not twice: the launcher SIGKILLs ranks 30 s after its SIGTERM
                save(f"iter_{it}", it, last_val)
            dist.print0(f"stopped at iteration {it}; resume with --resume (tag iter_{it})")
            return 0

    train_loss = sum(since_eval) / len(since_eval) if since_eval else None
    last_val = do_eval(cfg.max_iters, train_loss)
    if best_val is None or last_val < best_val:
        best_val, best_tag = last_val, "final"
    save("final", cfg.max_iters, last_val)
    dist.print0(f"done: {cfg.max_iters} iterations, val loss {last_val:.4f}")
    return 0


def universal_if_resized(ckpt: Checkpointer, tag: str, ds_config: dict) -> str:
    """The tag to load: `tag` itself, or its universal conversion when the world size changed.

    Rank 0 converts (DeepSpeed's ds_to_universal) while the others wait; the engine is then
    told to load a universal checkpoint. A failure on rank 0 is raised on every rank.
    """
    manifest = read_manifest(ckpt.out_dir / tag) or {}
    universal = bool(manifest.get("universal"))
    if not universal and manifest.get("world_size") == dist.world_size():
        return tag
    error = None
    if dist.is_main() and not universal:
        dist.print0(
            f"checkpoint {tag} was saved by {manifest.get('world_size')} ranks, this run has "
            f"{dist.world_size()}: converting it to a universal checkpoint"
        )
        try:
            convert_to_universal(ckpt.out_dir, tag)
        except GptDsError as exc:
            error = exc
    if dist.any_rank(error is not None):
        raise error or GptDsError("universal checkpoint conversion failed on rank 0")
    ds_config.setdefault("checkpoint", {})["load_universal"] = True
    return tag if universal else universal_tag(tag)


def print_memory_estimate(cfg: RunConfig, shape: ModelShape, resolved, engine, world: int):
    """Predicted per-rank memory for this run (the model behind tools/pick_preset.py)."""
    zero = resolved.config.get("zero_optimization", {})
    est = estimate_run(
        shape,
        zero_stage=engine.zero_optimization_stage(),
        offload_optimizer=zero.get("offload_optimizer", {}).get("device", "none") != "none",
        offload_param=zero.get("offload_param", {}).get("device", "none") != "none",
        world_size=world,
        gpus_per_node=int(os.environ.get("LOCAL_SIZE", os.environ.get("LOCAL_WORLD_SIZE", world))),
        micro_batch_size=resolved.micro_batch_size,
        precision=resolved.precision,
        activation_checkpointing=cfg.activation_checkpointing,
        zero_config=zero,
    )
    dist.print0("memory estimate per rank:\n" + est.format())
    return est


def report_model_states(engine, estimate) -> None:
    """Measured model-state bytes of each rank next to the prediction, after the first step
    (when Adam's moments exist and the step's gradient buffers are released)."""
    measured = measured_model_state_bytes(engine)
    held = measured["params"] + measured["optimizer_states"]
    one_hot = [0.0] * dist.world_size()
    one_hot[dist.rank()] = held
    per_rank = dist.all_reduce_sum(one_hot)
    predicted = estimate.resident_model_state_bytes
    dist.print0(
        f"model states per rank between steps (weights + optimizer): predicted "
        f"{predicted / 2**30:.3f} GiB, measured "
        + ", ".join(f"rank {r} {b / 2**30:.3f} GiB" for r, b in enumerate(per_rank))
        + f"; predicted peak during the step {estimate.model_state_bytes / 2**30:.3f} GiB"
    )


def communication_plan(shape: ModelShape, resolved, engine, world: int) -> float | None:
    """Print the bytes each rank sends per optimizer step and the time that implies on the
    measured all-reduce rate; returns the expected seconds per step (None on one rank)."""
    nbytes = comm_bytes_per_step(
        shape, engine.zero_optimization_stage(), resolved.precision, world, resolved.grad_accum
    )
    rate = dist.allreduce_send_rate()
    if rate is None:
        return None
    seconds = nbytes / rate
    dist.print0(
        f"communication: {nbytes / 1e6:,.1f} MB sent per rank per optimizer step "
        f"(ZeRO-{engine.zero_optimization_stage()}, {resolved.precision}, grad_accum "
        f"{resolved.grad_accum}); measured all-reduce rate {rate * 8 / 1e9:.2f} Gbit/s "
        f"-> ~{seconds * 1000:.0f} ms per step. On slow networks raise --grad_accum."
    )
    return seconds


if __name__ == "__main__":
    sys.exit(main())
