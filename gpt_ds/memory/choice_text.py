"""The preset picker's choice as text: the table, the recommendation, the rule and
assumptions."""

from __future__ import annotations

from gpt_ds.memory.estimate import GiB
from gpt_ds.memory.picker import RULE, PresetChoice


def _gib(x: int | None) -> str:
    return "-" if x is None else f"{x / GiB:.2f}"


def format_choice(p: PresetChoice) -> str:
    """The picker's table, recommendation and assumptions as text."""
    out = [_head(p), *_table(p), ""]
    out += _recommendation(p)
    out.append(f"rule: {RULE}")
    out += [f"note: {n}" for n in p.notes]
    out.append("assumptions:")
    out += [f"  - {a}" for a in p.assumptions]
    return "\n".join(out)


def _head(p: PresetChoice) -> str:
    """Model, hardware and target batch, three lines."""
    s, hw = p.shape, p.hardware
    return (
        f"model: {p.model_name or 'custom'}: {s.num_params():,} params ({s.n_layer} layers, "
        f"{s.n_head} heads, {s.n_embd} wide, block {s.block_size}, vocab {s.vocab_size}), "
        f"{p.precision}\nhardware: {hw.nodes} node(s) x {hw.gpus_per_node} GPUs of "
        f"{hw.gpu_memory_gb:g} GiB (usable {hw.usable_gpu_bytes / GiB:.2f} GiB), CPU "
        + (f"{hw.cpu_memory_gb:g} GiB per node" if hw.cpu_memory_gb is not None else "not given")
        + f"\ntarget: {p.target_global_batch} sequences per optimizer step\n"
    )


def _table(p: PresetChoice) -> list[str]:
    """The header, a rule, and one row per candidate."""
    g = _gib
    cols = (
        f"{'candidate':<27} {'ckpt':<4} {'params':>6} {'grads':>6} {'optim':>6} {'activ':>6} "
        f"{'buffer':>6} {'total':>6} {'fits':<4} {'max mb':>6} {'mb x ga':>9} {'total@mb':>8} "
        f"{'GB sent':>8} {'comm s':>7} {'step s':>7} {'CPU/node':>8}  preset"
    )
    rows = [cols, "-" * len(cols)]
    for c in p.candidates:
        e = c.estimate
        split = f"{c.micro_batch_size} x {c.grad_accum}" if c.micro_batch_size else "-"
        rows.append(
            f"{c.name:<27} {'yes' if c.activation_checkpointing else 'no':<4} {g(e.params):>6} "
            f"{g(e.grads):>6} {g(e.optimizer_states):>6} {g(e.activations):>6} {g(e.buffers):>6} "
            f"{g(e.total):>6} {'yes' if c.fits else 'NO':<4} {c.max_micro_batch:>6} {split:>9} "
            f"{g(c.total_at_micro_batch):>8} {c.comm_bytes / 1e9:>8.2f} {c.comm_s:>7.3f} "
            f"{f'{c.step_s:.2f}' if c.max_micro_batch else '-':>7} {g(e.cpu_bytes):>8}  "
            f"{c.preset or '(none)'}" + (f"  <- {'; '.join(c.why_not)}" if c.why_not else "")
        )
    return rows


def _recommendation(p: PresetChoice) -> list[str]:
    """The recommendation and its command (nothing where no candidate fits)."""
    rec, hw = p.recommendation, p.hardware
    if rec is None:
        return []
    assert rec.total_at_micro_batch is not None, "a recommendation fits at its micro-batch"
    ckpt = " with activation checkpointing" if rec.activation_checkpointing else ""
    return [
        f"recommendation: {rec.name}{ckpt}: ds_configs/{rec.preset}, micro-batch "
        f"{rec.micro_batch_size} x grad_accum {rec.grad_accum} x {hw.world_size} GPUs = "
        f"{rec.global_batch} sequences per step; {rec.total_at_micro_batch / GiB:.2f} of "
        f"{hw.usable_gpu_bytes / GiB:.2f} GiB usable per GPU, ~{rec.step_s:.2f} s per step",
        f"  {p.command}",
    ]
