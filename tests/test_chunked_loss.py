"""The training model's three ways to take the LM loss (`--loss`: chunked; deepspeed, DeepSpeed's
chunked cross-entropy over the logits; full, the fp32 logits whole; all in
gpt_ds.model.training_model) against a reference computed here:
transformers' GPT2LMHeadModel's logits, upcast to fp32, torch's `F.cross_entropy`. Same loss and
same gradients (of the last hidden states and of every parameter, the tied embedding/head
included) to float rounding, in fp32 and bf16, with uneven chunks and ignored tokens; padding
rows never predicted; what the chunked loss keeps for backward; and real 2-rank runs with
`--loss full` and `--loss deepspeed` following the chunked default under ZeRO-2 and ZeRO-3."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers.compared_runs import ITERS, WHOLE
from helpers.logged import train_losses, val_losses
from support.logit_traffic import logit_traffic
from torch._dynamo.utils import counters

from gpt_ds.data.tokenizer import get_encoding
from gpt_ds.model.gpt2 import (
    LOSS_KINDS,
    ModelShape,
    checkpoint_vocab,
    lm_loss,
    padded_vocab,
    unpadded,
)
from gpt_ds.model.training_model import (
    FUSED_ENV,
    IGNORE_INDEX,
    build_model,
    chunked_cross_entropy,
)

TEXT = (
    "First Citizen: Before we proceed any further, hear me speak. All: Speak, speak. First "
    "Citizen: You are all resolved rather to die than to famish? All: Resolved. resolved. "
    "First Citizen: First, you know Caius Marcius is chief enemy to the people."
)


def batch(block: int = 24, rows: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.tensor(get_encoding().encode_ordinary(TEXT))
    assert len(ids) > rows + block
    windows = torch.stack([ids[i : i + block + 1] for i in range(rows)])
    return windows[:, :-1], windows[:, 1:]


def model(dtype: torch.dtype = torch.float32, loss: str | None = None):
    """The same initial weights either way: plain GPT2LMHeadModel (`loss` None), or gpt_ds's
    training model taking the loss the `loss` way."""
    torch.manual_seed(0)
    shape = ModelShape(n_layer=2, n_head=2, n_embd=64, block_size=32, vocab_size=50257)
    return build_model(shape, loss=loss).to(dtype).train()


def reference_loss(m, x: torch.Tensor, y: torch.Tensor, tokens: int | None = None):
    """The loss as the test computes it, from a plain GPT2LMHeadModel's whole logits: upcast to
    fp32, the real vocabulary's columns only (`tokens`), torch's cross-entropy."""
    logits = m(input_ids=x, use_cache=False).logits.float()[..., :tokens]  # (B, T, V)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))


def backward(m, loss_fn) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """(loss, gradient of the last hidden states, every parameter's gradient) of `loss_fn()`
    on `m`, after backward."""
    kept = []

    def keep(module, args, out):
        out.last_hidden_state.retain_grad()
        kept.append(out.last_hidden_state)

    handle = m.transformer.register_forward_hook(keep)
    try:
        loss = loss_fn()
        loss.backward()
    finally:
        handle.remove()
    return loss, kept[0].grad, grads(m)


def ours(m, x, y, rows: int | None = None, block: int | None = None):
    """The loss through the training model's own forward (the path the engine calls); the
    chunked kind with `rows` tokens per chunk, `block` per gathered gradient (None: the
    device's)."""
    m.lm_head.chunk_rows, m.lm_head.grad_block = rows, block
    return lm_loss(m, x, y)


def grads(m) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in m.named_parameters()}


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.float(), want.float()
    return ((got - want).norm() / want.norm().clamp(min=1e-12)).item()


# chunked: uneven chunks; one chunk holding every token
@pytest.mark.parametrize("loss,rows", [("chunked", 7), ("chunked", 1000), ("deepspeed", None),
                                       ("full", None)])  # fmt: skip
def test_fp32_loss_and_gradients_equal_the_full_logits_reference(loss, rows):
    x, y = batch()
    ref, mine = model(), model(loss=loss)
    assert type(ref).__name__ == "GPT2LMHeadModel" and type(mine).__name__ == "GPT2TrainingModel"
    assert mine.lm_head.kind == loss
    assert all(torch.equal(a, b) for a, b in zip(ref.parameters(), mine.parameters(), strict=True))
    expected, want_hidden, want = backward(ref, lambda: reference_loss(ref, x, y))
    got, hidden, got_grads = backward(mine, lambda: ours(mine, x, y, rows))
    assert got.dtype == torch.float32
    assert abs(got.item() - expected.item()) < 1e-5, (got.item(), expected.item())
    torch.testing.assert_close(hidden, want_hidden, rtol=1e-4, atol=1e-7)
    for name, g in got_grads.items():
        torch.testing.assert_close(g, want[name], rtol=1e-4, atol=1e-6, msg=name)
    # the tied head/embedding weight receives both gradients
    assert mine.lm_head.weight is mine.transformer.wte.weight


# chunked, 72 tokens: one block (the CPU default gathers up to ~660 tokens); blocks of 2 and 3
# uneven chunks, the last one short; one chunk per block, as on GPUs
@pytest.mark.parametrize(
    "loss,rows,block",
    [("chunked", 10, None), ("chunked", 7, 21), ("chunked", 5, 10), ("chunked", 10, 10),
     ("deepspeed", None, None), ("full", None, None)],
)  # fmt: skip
def test_bf16_loss_and_gradients_equal_the_full_logits_reference_to_bf16_rounding(
    loss, rows, block
):
    x, y = batch()
    ref, mine = model(torch.bfloat16), model(torch.bfloat16, loss=loss)
    expected, want_hidden, want = backward(ref, lambda: reference_loss(ref, x, y))
    got, hidden, got_grads = backward(mine, lambda: ours(mine, x, y, rows, block))
    assert got.dtype == torch.float32 and hidden.dtype == torch.bfloat16
    assert abs(got.item() - expected.item()) < 1e-3 * expected.item()
    assert relative_error(hidden, want_hidden) < 2e-2
    for name, g in got_grads.items():
        assert relative_error(g, want[name]) < 2e-2, name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_chunk_body_follows_the_eager_one(dtype, monkeypatch):
    """FUSED_ENV=1: each chunk's body compiled by inductor (C++ on this CPU, Triton on a GPU)
    gives the eager body's loss and gradients to float rounding, with padding columns, an
    ignored token and a shorter last chunk (one chunk a block, as on GPUs); a second step
    compiles nothing new."""
    torch.manual_seed(0)
    hidden = torch.randn(50, 32, dtype=dtype, requires_grad=True)
    weight = torch.randn(96, 32, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, 90, (50,))
    labels[3] = IGNORE_INDEX

    def loss_and_grads(fused: bool) -> tuple[torch.Tensor, ...]:
        monkeypatch.setenv(FUSED_ENV, "1" if fused else "0")
        loss = chunked_cross_entropy(hidden, weight, labels, rows=16, tokens=90, block=16)
        return (loss, *torch.autograd.grad(loss, (hidden, weight)))

    eager = loss_and_grads(False)
    torch._dynamo.reset()
    before = counters["stats"]["unique_graphs"]
    fused = loss_and_grads(True)
    assert counters["stats"]["unique_graphs"] == before + 2  # 16 rows, then the last 2
    assert loss_and_grads(True)[0] == fused[0]
    assert counters["stats"]["unique_graphs"] == before + 2  # kept: nothing compiled again
    for got, want in zip(fused, eager, strict=True):
        assert relative_error(got, want) < (1e-6 if dtype == torch.float32 else 1e-2)


def test_ignored_tokens_do_not_count_and_no_grad_gives_the_same_value():
    x, y = batch()
    y = y.clone()
    y[0, :5] = IGNORE_INDEX
    m = model()
    hidden = m.transformer(input_ids=x).last_hidden_state
    logits = m.lm_head(hidden).float()
    expected = F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))
    got = chunked_cross_entropy(hidden, m.lm_head.weight, y, rows=9)
    with torch.no_grad():
        plain = chunked_cross_entropy(hidden, m.lm_head.weight, y, rows=9)
    assert abs(got.item() - expected.item()) < 1e-5
    assert plain.item() == pytest.approx(got.item(), abs=1e-6)


@pytest.mark.parametrize("loss", LOSS_KINDS)
def test_ignored_tokens_do_not_count_for_any_kind(loss):
    x, every = batch()
    y = every.clone()
    y[0, :5] = IGNORE_INDEX
    ref, mine = model(), model(loss=loss)
    expected = reference_loss(ref, x, y)
    got = ours(mine, x, y, rows=9)
    assert abs(got.item() - expected.item()) < 1e-5, (got.item(), expected.item())
    assert abs(got.item() - reference_loss(ref, x, every).item()) > 1e-4  # they were left out


def saved_bytes(loss_fn) -> int:
    """Bytes autograd keeps for backward while `loss_fn()` runs (each tensor once)."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss_fn()
    return sum(seen.values())


def test_backward_keeps_two_gradients_instead_of_the_logits():
    """The head's share of what backward keeps: the full path holds tokens x vocab logits
    (fp32), the chunked one the gradients of the hidden states and of the weight."""
    x, y = batch(block=24, rows=3)
    m = model()
    hidden = m.transformer(input_ids=x).last_hidden_state.detach().requires_grad_()
    weight = m.lm_head.weight
    tokens, vocab, width = y.numel(), weight.shape[0], weight.shape[1]

    def full():
        logits = (hidden @ weight.t()).float()
        return F.cross_entropy(logits.view(-1, vocab), y.reshape(-1))

    full_bytes = saved_bytes(full)
    chunked = saved_bytes(lambda: chunked_cross_entropy(hidden, weight, y, rows=16))
    assert full_bytes >= tokens * vocab * 4
    assert chunked <= (tokens * width + vocab * width) * 4 + 4096


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_chunked_loss_walks_its_logits_fewer_times_than_the_full_path(dtype):
    """Counted as a GPU runs it (one gradient product per chunk, `--loss chunked`'s GPU
    blocks): forward and backward stream the logits at most 8 fp32-equivalent passes (the
    head's product, the upcast, a max, the softmax, the scaled cast back, the two gradient
    products reading it), where torch's cross-entropy on the whole logits makes 12 (fp32) or
    13.5 (bf16), with no log-sum-exp, exp or scaling pass of its own; without gradients, at
    most 4 (the product, the upcast, torch's fused log-softmax)."""
    g = torch.Generator().manual_seed(0)
    vocab, padded = 50257, 50304
    hidden = torch.randn(96, 24, generator=g).to(dtype).requires_grad_()  # 24 wide, 32 a chunk
    weight = (torch.randn(padded, 24, generator=g) * 0.02).to(dtype).requires_grad_()
    labels = torch.randint(0, vocab, (96,), generator=g)
    labels[5] = IGNORE_INDEX

    def full(h, w, y):
        logits = (h @ w.t()).float()
        logits[:, vocab:] = float("-inf")
        return F.cross_entropy(logits, y)

    def chunked(h, w, y):
        return chunked_cross_entropy(h, w, y, rows=32, tokens=vocab, block=32)

    theirs = logit_traffic(full, hidden, weight, labels, vocab)
    ours = logit_traffic(chunked, hidden, weight, labels, vocab)
    assert theirs.passes == (13.5 if dtype == torch.bfloat16 else 12.0), theirs.ops
    assert 4.0 <= ours.passes <= 8.0 < theirs.passes, ours.ops
    assert not {"amax", "exp", "exp_", "sub", "sub_", "mul_"} & set(ours.ops), ours.ops
    with torch.no_grad():
        evaluating = logit_traffic(chunked, hidden, weight, labels, vocab)
    assert 1.0 <= evaluating.passes <= 4.0, evaluating.ops


@pytest.mark.slow
@pytest.mark.parametrize("stage,loss", [(2, "full"), (3, "full"), (3, "deepspeed")])
def test_a_chunked_run_follows_the_logits_runs(stage, loss, runs):
    """Real 2-rank runs, --loss chunked (the default: helpers.compared_runs' shared baseline)
    against --loss full and deepspeed: the same loss curve and val losses to float noise
    (under ZeRO-3 the tied head weight is gathered for each head kind as for the plain one)."""
    chunked, full = runs(stage, **WHOLE), runs(stage, **WHOLE, loss=loss)
    full_train, full_val = train_losses(full), val_losses(full)
    ours_train, ours_val = train_losses(chunked), val_losses(chunked)
    assert sorted(ours_train) == list(range(1, ITERS + 1)) and sorted(ours_val) == [2, ITERS]
    for it, value in full_train.items():
        assert abs(ours_train[it] - value) < 1e-4, (it, ours_train[it], value)
    for it, value in full_val.items():
        assert abs(ours_val[it] - value) < 1e-4, (it, ours_val[it], value)
    assert full_train[ITERS] < full_train[1] - 0.1  # it trained: the comparison means something


# ----------------------------------------------------------------------------- vocabulary padding


def padded_pair(loss: str | None, pad_to: int = 64):
    """A plain GPT2LMHeadModel with GPT-2's 50257 rows and the same model padded to a multiple
    of `pad_to` (the padding rows random, as a fresh init leaves them), equal on every real
    row; the padded one taking the loss the `loss` way (None: GPT2LMHeadModel, by lm_loss)."""
    shape = ModelShape(n_layer=2, n_head=2, n_embd=64, block_size=32, vocab_size=50257)
    padded = padded_vocab(shape, pad_to)
    torch.manual_seed(0)
    plain = build_model(shape).train()
    torch.manual_seed(1)
    big = build_model(padded, loss=loss).train()
    state = plain.state_dict()
    with torch.no_grad():
        for name, p in big.named_parameters():
            src = state[name]
            p[tuple(slice(0, n) for n in src.shape)].copy_(src)
    return plain, big, padded


def test_padding_rounds_the_vocabulary_up_and_keeps_the_tokens():
    shape = ModelShape(n_layer=2, n_head=2, n_embd=64)
    padded = padded_vocab(shape, 64)
    assert (padded.vocab_size, padded.tokens, padded.token_vocab_size) == (50304, 50257, 50257)
    assert padded_vocab(shape, 1) == shape and padded_vocab(padded, 1) == shape
    assert unpadded(padded) == shape
    assert padded.num_params() - shape.num_params() == 47 * 64


@pytest.mark.parametrize("loss", [None, *LOSS_KINDS])
def test_padding_rows_are_never_predicted(loss):
    """Same loss and gradients as the unpadded model's reference on every real row, each kind
    and lm_loss on a plain GPT2LMHeadModel (evaluation, export); the padding rows get exactly
    zero gradient (they take no probability)."""
    plain, big, padded = padded_pair(loss)
    x, y = batch()
    expected = reference_loss(plain, x, y)
    got = lm_loss(big, x, y)
    expected.backward()
    got.backward()
    assert abs(got.item() - expected.item()) < 1e-5
    wte_big, wte = big.transformer.wte.weight.grad, plain.transformer.wte.weight.grad
    torch.testing.assert_close(wte_big[: padded.tokens], wte, rtol=1e-4, atol=1e-6)
    assert torch.count_nonzero(wte_big[padded.tokens :]) == 0
    want = grads(plain)
    for name, g in grads(big).items():
        if "wte" not in name:
            torch.testing.assert_close(g, want[name], rtol=1e-4, atol=1e-6, msg=name)


def test_a_resumed_run_keeps_the_checkpoints_vocabulary():
    """A checkpoint saved unpadded (before --vocab_multiple, or with 1) resumes unpadded; one
    with other tokens is left for check_model to refuse."""
    from dataclasses import asdict

    run = padded_vocab(ModelShape(n_layer=2, n_head=2, n_embd=64), 64)
    old = {k: v for k, v in asdict(unpadded(run)).items() if k != "token_vocab_size"}
    assert checkpoint_vocab(run, old) == unpadded(run)
    assert checkpoint_vocab(run, asdict(run)) == run
    other = {**old, "vocab_size": 32000}
    assert checkpoint_vocab(run, other) == run


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_fp16_gradients_under_a_loss_scale_are_as_close_as_the_full_logits_paths(device):
    """fp16 with DeepSpeed's dynamic loss scale (65536 at the start): the scale-free gradient
    (softmax - one-hot) / tokens, ~1e-8 for most of the vocabulary at 2,048 tokens, must never
    exist in fp16 (it flushes to zero there: 2% off before the fix). Both gradients, unscaled,
    against an fp64 reference: no further off than autograd's full-logits fp16 path."""
    torch.manual_seed(0)
    tokens, vocab, width, scale = 2048, 50257, 32, 65536.0
    hidden = torch.randn(tokens, width, dtype=torch.float64).to(device)
    weight = (torch.randn(vocab, width, dtype=torch.float64) * 0.02).to(device)
    labels = torch.randint(0, vocab, (tokens,)).to(device)

    def gradients(loss_fn, dtype: torch.dtype, loss_scale: float):
        h = hidden.to(dtype, copy=True).requires_grad_()
        w = weight.to(dtype, copy=True).requires_grad_()
        (loss_fn(h, w) * loss_scale).backward()
        return [g.double() / loss_scale for g in (h.grad, w.grad)]

    def full(h, w):
        return F.cross_entropy((h @ w.t()).float(), labels)

    reference = gradients(full, torch.float64, 1.0)
    full16 = gradients(full, torch.float16, scale)
    chunked16 = gradients(
        lambda h, w: chunked_cross_entropy(h, w, labels, rows=700), torch.float16, scale
    )
    for name, ref, theirs, ours in zip(
        ("hidden", "weight"), reference, full16, chunked16, strict=True
    ):
        full_error = ((theirs - ref).norm() / ref.norm()).item()
        our_error = ((ours - ref).norm() / ref.norm()).item()
        # per-chunk fp16 products summed in fp32 round a little more often than one product
        assert our_error <= 1.25 * full_error, f"{name}: {our_error:.2e} vs full {full_error:.2e}"
