"""The minimal GPT-2 of benchmarks/plain_loop.py, the throughput table's anchor: exactly
GPT2LMHeadModel's parameters at the same shape (but for the vocabulary padding), its loss, and
a loss at init of about ln(vocab), as an untrained model's must be."""

from __future__ import annotations

import math

import torch
from plain_loop import GPT, PADDED_VOCAB, GPTShape, causal_lm_loss, shifted_targets
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.loss.loss_utils import ForCausalLMLoss

SIZE = {"n_layer": 2, "n_head": 4, "n_embd": 64, "block_size": 32}
GPT2_VOCAB = 50257


def shapes(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    """Parameter name -> shape, the tied head once (as wte); a Linear weight transposed to
    (in, out), as GPT2LMHeadModel's Conv1D holds it."""
    linear = {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    return {
        n.removeprefix("transformer."): tuple(p.T.shape if n in linear else p.shape)
        for n, p in model.named_parameters()
    }


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_minimal_gpt2_has_exactly_gpt2lmheadmodels_parameters():
    size = {k: v for k, v in SIZE.items() if k != "block_size"}
    hf = GPT2LMHeadModel(GPT2Config(n_positions=SIZE["block_size"], **size))
    unpadded = GPT(GPTShape(**SIZE, vocab_size=GPT2_VOCAB))
    assert shapes(unpadded) == shapes(hf)
    assert n_params(unpadded) == n_params(hf)
    padding = (PADDED_VOCAB - GPT2_VOCAB) * SIZE["n_embd"]  # wte's extra rows (the head's too)
    assert n_params(GPT(GPTShape(**SIZE))) == n_params(hf) + padding
    assert PADDED_VOCAB % 64 == 0 and PADDED_VOCAB - 64 < GPT2_VOCAB


def test_its_loss_is_gpt2lmheadmodels_and_about_ln_vocab_at_init():
    torch.manual_seed(0)
    logits, ids = torch.randn(2, 8, 50), torch.randint(0, 50, (2, 8))
    assert torch.equal(causal_lm_loss(logits, ids), ForCausalLMLoss(logits, ids, vocab_size=50))
    model = GPT(GPTShape(**SIZE))
    ids = torch.randint(0, GPT2_VOCAB, (2, SIZE["block_size"]))
    for bf16 in (False, True):
        with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            loss = causal_lm_loss(model(ids), ids)
            inside = model(ids, shifted_targets(ids))  # nanoGPT's: the loss inside the model
        assert loss.dtype == inside.dtype == torch.float32  # the logits upcast, as HF does
        assert torch.equal(inside, loss)
        assert math.isfinite(loss.item()) and abs(loss.item() - math.log(PADDED_VOCAB)) < 0.05
