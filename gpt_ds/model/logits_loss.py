"""Next-token cross-entropy from the LM head's whole (tokens x vocab) logits, the two ways
besides chunked_loss.py: `full_cross_entropy`, the logits upcast to fp32 and torch's
cross-entropy (GPT2LMHeadModel's own loss, nanoGPT's `model(idx, targets)`), and
`deepspeed_cross_entropy`, DeepSpeed's `chunked_cross_entropy` over the logits as they are.

DeepSpeed's keeps the 16-bit logits and one fp32 log-sum-exp per token for backward and writes
the logits' gradient in their own dtype: no fp32 (tokens x vocab) tensor, where the full path
keeps an fp32 log-softmax and makes two more fp32 tensors of that size in backward
(memory/estimate.py `logit_bytes`). Both mask the padding rows of a padded vocabulary
(`tokens` on) to -inf in place, so they take no probability and get no gradient, as the
chunked loss does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def mask_padding(logits: torch.Tensor, tokens: int | None) -> torch.Tensor:
    """`logits` with the columns from `tokens` on (vocabulary padding) at -inf, in place: a
    slice would copy them."""
    if tokens is not None and tokens < logits.shape[-1]:
        logits[..., tokens:] = float("-inf")
    return logits


def full_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, tokens: int | None, reduction: str = "mean"
) -> torch.Tensor:
    """Cross-entropy of (..., V) `logits` upcast to fp32 against `targets` (-100 not counted);
    `tokens`: the real vocabulary when V is padded beyond it."""
    logits = mask_padding(logits.float(), tokens)
    return F.cross_entropy(
        logits.view(-1, logits.size(-1)), targets.reshape(-1), reduction=reduction
    )


@torch.compiler.disable  # its own kernels; dynamo of torch 2.11 fails inside its version check
def deepspeed_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, tokens: int | None
) -> torch.Tensor:
    """Mean cross-entropy of (..., V) `logits` by DeepSpeed's `chunked_cross_entropy` (a
    Triton kernel on CUDA, blocks of rows in PyTorch elsewhere), in fp32 from the logits as
    they are; `tokens` as in `full_cross_entropy`. Run eagerly under --compile: a compiled
    model breaks its graph here, as at the chunked loss."""
    from deepspeed.runtime.chunked_cross_entropy import chunked_cross_entropy

    logits = mask_padding(logits.view(-1, logits.size(-1)), tokens)  # (B*T, V)
    return chunked_cross_entropy(logits, targets.reshape(-1))
