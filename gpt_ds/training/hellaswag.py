"""HellaSwag accuracy of a GPT-2, in the trainer's evaluations and on any checkpoint.

Completion style, as build-nanogpt's hellaswag.py scores it: each of an example's four endings is
scored by the model's cross-entropy on the ending's own tokens after the context; the ending
with the lowest mean loss is the model's answer for acc_norm, the lowest summed loss for acc.
Examples are split round-robin across ranks, every rank runs the same number of forward passes
(under ZeRO-3 each forward gathers parameters from all ranks; a rank out of examples repeats one
with weight 0) and the counts are summed with one all-reduce: the same figures on any world size.
Imported only where `--hellaswag` (or the eval command) asks for it.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from gpt_ds.base import dist
from gpt_ds.data.hellaswag import Rendered, Rows


@dataclass(frozen=True)
class HellaSwagResult:
    acc: float  # lowest summed loss right, of the examples scored
    acc_norm: float  # lowest mean loss (per ending token) right
    examples: int  # scored
    skipped: int  # an ending too long for the block

    def line(self) -> str:
        skipped = ""
        if self.skipped:
            skipped = f", {self.skipped} skipped (an ending longer than the block)"
        return (
            f"hellaswag acc_norm {self.acc_norm:.4f} | acc {self.acc:.4f} | "
            f"{self.examples} examples{skipped}"
        )


def ending_losses(model, rows: Rows, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed, mean) cross-entropy of each ending's tokens, each a (4,) tensor on `device`.
    `model`: a GPT2LMHeadModel or a DeepSpeed engine around one (the forward goes through it)."""
    tokens = torch.from_numpy(rows.tokens).to(device)
    scored = torch.from_numpy(rows.scored[:, 1:]).to(device)
    logits = model(input_ids=tokens, use_cache=False).logits[:, :-1]
    picked = logits[scored].float()  # only the endings' positions: (n, V)
    module = getattr(model, "module", model)
    vocab = getattr(module.config, "token_vocab_size", None)
    if vocab:  # padding rows of the embedding are never a token
        picked[:, vocab:] = float("-inf")
    losses = torch.nn.functional.cross_entropy(picked, tokens[:, 1:][scored], reduction="none")
    row = torch.arange(rows.tokens.shape[0], device=device).unsqueeze(1).expand_as(scored)[scored]
    summed = torch.zeros(rows.tokens.shape[0], device=device).index_add_(0, row, losses)
    return summed, summed / scored.sum(dim=1)


@torch.no_grad()
def score_hellaswag(
    model,
    data: Rendered,
    device: torch.device,
    rank: int = 0,
    world_size: int = 1,
    progress: bool = False,
) -> HellaSwagResult:
    """acc and acc_norm of `model` on `data`'s examples, shared across ranks (every rank calls
    it); `progress`: a progress bar on rank 0's stderr (the eval command's long runs)."""
    was_training = model.training
    model.eval()
    kept = data.rows
    mine = kept[rank::world_size]
    right = torch.zeros(2, dtype=torch.float64, device=device)  # acc, acc_norm: no sync per item
    steps: Iterable[int] = range(math.ceil(len(kept) / world_size))
    if progress and rank == 0:
        from tqdm import tqdm

        steps = tqdm(steps, desc="hellaswag", unit="example", file=sys.stderr)
    for i in steps:
        rows, weight = (mine[i], 1.0) if i < len(mine) else (kept[0], 0.0)
        summed, mean = ending_losses(model, rows, device)
        right[0] += weight * (summed.argmin() == rows.label)
        right[1] += weight * (mean.argmin() == rows.label)
    acc, acc_norm = dist.all_reduce_sum([right[0], right[1]], device)
    if was_training:
        model.train()
    n = len(kept)
    return HellaSwagResult(acc=acc / n, acc_norm=acc_norm / n, examples=n, skipped=data.skipped)
