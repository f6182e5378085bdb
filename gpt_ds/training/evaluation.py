"""Distributed evaluation: a token-weighted mean loss over fixed validation windows.

Every rank must call `evaluate` (under ZeRO-3 each forward needs all ranks to gather the
parameters): ranks take windows round-robin, run the same number of forward passes (padding
with zero-weight batches), and sum (loss x tokens, tokens) with one all-reduce. The result is
the same, to float rounding, whatever the world size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from gpt_ds.base import dist
from gpt_ds.data.mixture import DataMix
from gpt_ds.data.tokens import eval_windows, window_batch
from gpt_ds.model.gpt2 import lm_loss


@dataclass
class EvalResult:
    loss: float
    perplexity: float
    tokens: int


@torch.no_grad()
def evaluate(
    model,
    tokens: np.ndarray,
    block_size: int,
    num_windows: int,
    micro_batch_size: int,
    device: torch.device,
    rank: int = 0,
    world_size: int = 1,
) -> EvalResult:
    """Mean next-token loss over `num_windows` fixed windows of `tokens`, shared across ranks."""
    was_training = model.training
    model.eval()
    starts = eval_windows(len(tokens), block_size, num_windows)
    mine = starts[rank::world_size]
    per_rank = math.ceil(len(starts) / world_size)
    steps = math.ceil(per_rank / micro_batch_size)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)  # no host sync per batch
    token_count = 0.0
    for i in range(steps):
        chunk = mine[i * micro_batch_size : (i + 1) * micro_batch_size]
        weight = 1.0 if len(chunk) else 0.0
        if not len(chunk):  # keep in step with the other ranks (ZeRO-3 gathers per forward)
            chunk = starts[:1]
        x, y = window_batch(tokens, chunk, block_size)
        loss = lm_loss(model, *dist.to_device(x, y, dev=device), reduction="sum")
        loss_sum += weight * loss.detach()
        token_count += weight * y.numel()
    total_loss, total_tokens = dist.all_reduce_sum([loss_sum, token_count], device)
    if was_training:
        model.train()
    mean = total_loss / total_tokens
    return EvalResult(loss=mean, perplexity=perplexity(mean), tokens=int(total_tokens))


def perplexity(loss: float) -> float:
    """exp(loss), capped where an untrained or diverged loss would overflow it."""
    return math.exp(min(loss, 50.0))


@dataclass
class MixResult:
    loss: float  # the sources' losses, weighted by the mixture's weights
    perplexity: float
    by_source: dict[str, float]  # empty for a single source


def evaluate_mix(model, mix: DataMix, block_size: int, num_windows: int, **where) -> MixResult:
    """`evaluate` on each source's val split (`num_windows` each); `where`: evaluate's
    micro_batch_size, device, rank and world_size. A mixture's loss weights each source as
    training draws it, so it tracks what the run optimises."""
    losses = [evaluate(model, s.val, block_size, num_windows, **where).loss for s in mix.sources]
    mean = sum(w * loss for w, loss in zip(mix.weights, losses, strict=True))
    by_source = dict(zip(mix.names, losses, strict=True)) if mix.is_mixture else {}
    return MixResult(loss=mean, perplexity=perplexity(mean), by_source=by_source)
