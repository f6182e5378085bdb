"""Activation memory: what autograd keeps for backward on one GPU for one micro-batch."""

from __future__ import annotations

from gpt_ds.memory.constants import PRECISION_BYTES
from gpt_ds.model.chunked_loss import chunk_rows
from gpt_ds.model.gpt2 import ModelShape

# Saved activations per layer per (sequence position x batch x width), in bytes at 16 bits.
# Korthikanti et al. 2022 count 34 (+ 5*a*s/h for the attention matrix). Measured on this
# code's GPT2LMHeadModel (SDPA, dropout 0, torch's tanh GELU: model/gpt2.py use_fused_gelu)
# with saved-tensor hooks: 36. With dropout 0 no masks are kept (-2); SDPA keeps q, k, v and
# its output (+2); the GELU keeps its 4h-wide input, as Korthikanti count (transformers'
# own "gelu_new" keeps four such tensors: 60). tests/test_memory.py re-measures it.
ACT_BYTES_PER_SBH_16BIT = 36
KORTHIKANTI_SBH = 34
# SDPA (flash / memory-efficient kernels, on GPU and CPU) never materialises the a x s x s
# attention matrix: it keeps a log-sum-exp of a*s fp32 values. Eager attention would add
# 5*a*s*s*b bytes per layer (softmax output, dropout mask and output).
EAGER_ATTN_BYTES_PER_ASSB = 5
# Logits: cross-entropy keeps the fp32 log-softmax (4 bytes per vocabulary entry), and its
# backward holds two fp32 gradients of that size at once: 12 bytes x batch x seq x vocab.
LOGIT_BYTES_PER_ELEMENT = 12


def chunked_loss_bytes(shape: ModelShape, micro_batch_size: int, precision: str) -> tuple[int, int]:
    """(kept for backward, transient in forward) bytes of the chunked loss (chunked_loss.py).

    Kept: the gradients of the hidden states (tokens x width) and of the head's weight (vocab
    x width), in the run precision. Transient while they are built: one chunk of logits (fp32,
    plus the 16-bit matmul output it is upcast from) and, below fp32, the weight gradient's
    fp32 accumulator with one 16-bit chunk product (in fp32 runs the accumulator is the kept
    gradient). The chunk is a GPU's (on CPU it is smaller: an over-estimate there, which also
    covers a CPU's block of gathered 16-bit logit gradients, 64 MiB against 256 MiB).
    """
    tokens, vocab, width = micro_batch_size * shape.block_size, shape.vocab_size, shape.n_embd
    w = PRECISION_BYTES[precision]
    kept = tokens * width * w + vocab * width * w
    chunk = min(chunk_rows(vocab), tokens) * vocab * (4 + (w if w < 4 else 0))
    accumulator = vocab * width * (4 + w) if w < 4 else 0
    return kept, accumulator + chunk


def logit_bytes(shape: ModelShape, micro_batch_size: int, precision: str, chunked: bool) -> int:
    """Peak bytes of the LM head's loss for one micro-batch: the full logits'
    LOGIT_BYTES_PER_ELEMENT x tokens x vocab (GPT2LMHeadModel), or the chunked loss's."""
    if chunked:
        return sum(chunked_loss_bytes(shape, micro_batch_size, precision))
    return LOGIT_BYTES_PER_ELEMENT * micro_batch_size * shape.block_size * shape.vocab_size


def activation_bytes(
    shape: ModelShape,
    micro_batch_size: int,
    precision: str,
    activation_checkpointing: bool,
    sdpa: bool = True,
    chunked_loss: bool = False,
) -> dict[str, int]:
    """Bytes kept for backward on one GPU: {"layers", "logits", "other"}.

    Without checkpointing every layer keeps ACT_BYTES_PER_SBH_16BIT x s*b*h (x2 in fp32).
    With it (non-reentrant, per block) each layer keeps only its input, s*b*h values, and one
    layer's full set is rebuilt at a time during backward.
    """
    s, b, h = shape.block_size, micro_batch_size, shape.n_embd
    scale = PRECISION_BYTES[precision] / 2
    full_layer = ACT_BYTES_PER_SBH_16BIT * s * b * h * scale
    if not sdpa:
        full_layer += EAGER_ATTN_BYTES_PER_ASSB * shape.n_head * s * s * b * scale
    if activation_checkpointing:
        layers = shape.n_layer * 2 * s * b * h * scale + full_layer
    else:
        layers = shape.n_layer * full_layer
    return {
        "layers": int(layers),
        "logits": logit_bytes(shape, micro_batch_size, precision, chunked_loss),
        "other": int(4 * s * b * h * scale),  # embedding output, final LayerNorm in/out
    }
