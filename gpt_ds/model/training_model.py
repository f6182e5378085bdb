"""The model gpt_ds builds and trains, and the LM loss its head takes.

`GPT2TrainingModel` is `GPT2LMHeadModel` whose forward also takes `targets` and then returns the
mean LM loss instead of the logits, taken the head's `kind` way (`--loss`):

- chunked: `chunked_cross_entropy`, from the hidden states, never the whole logits;
- deepspeed: the logits, then DeepSpeed's chunked cross-entropy (`deepspeed_cross_entropy`);
- full: the logits upcast to fp32, then torch's cross-entropy (`full_cross_entropy`), as
  nanoGPT's `model(idx, targets)`: under `--compile` inductor fuses head, upcast and
  cross-entropy in one graph.

Same modules, parameter names and weights as GPT-2 (checkpoints and exports are unchanged); only
the head's forward learns a second use. The loss is computed inside `lm_head`'s own forward so
that under ZeRO-3 its weight (the tied embedding) is gathered for it as for the plain head, and
the call goes through the DeepSpeed engine and the top-level forward, whose hooks ZeRO-3 needs.
`build_model` builds it, or a plain `GPT2LMHeadModel` for evaluation and export, with the
attention and GELU gpt_ds trains with. Imported lazily (transformers is slow to import): what
the plan and the memory model need to know of GPT-2 is in gpt2.py.

**The chunked loss.** On GPT-2 the LM head (hidden × 50257-row tied embedding) gives by far the
largest activation of a step: tokens × vocab logits, which autograd keeps (in fp32 once
upcast) until backward. `chunked_cross_entropy` computes the loss over chunks of tokens and,
when gradients are needed, the gradients of the hidden states and of the head's weight in the
same pass, as (softmax - one-hot) / tokens times the chunk's inputs. At most one chunk of
logits exists at a time, and backward keeps only the two gradients (tokens × width and vocab ×
width), not the logits. The softmax runs in fp32 as in `GPT2LMHeadModel`'s own loss (which
upcasts the logits), and the gradients are cast to the hidden states' dtype before the
matmuls, as autograd does there: same value and gradients to float rounding.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.autograd.profiler import record_function
from transformers import AttentionInterface, GPT2LMHeadModel
from transformers.activations import ACT2FN
from transformers.initialization import no_init_weights
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from gpt_ds.base.phases import LOSS
from gpt_ds.model import zero3
from gpt_ds.model.gpt2 import (
    LOSS_KINDS,
    ModelShape,
    chunk_rows,
    deepspeed_cross_entropy,
    full_cross_entropy,
    gpt2_config,
    mask_padding,
)

IGNORE_INDEX = -100


# 16-bit logit gradients gathered over several chunks before the head's two gradient matmuls
# (hidden and weight) run on them. Per chunk, the weight's gradient is a whole vocab x width
# product added into an fp32 accumulator: on CPU in bf16 that product and its add cost more
# than the chunk's own work (benchmarks/chunked_loss.py: gpt2-mini's 512 tokens took 3x as long
# as with one block). CPU: 64 MiB (~660 tokens of GPT-2's vocabulary). GPU: 0, each chunk its
# own block (its V x C add is cheap there; not yet measured).
GRAD_BLOCK_BYTES = {"cpu": 64 << 20, "gpu": 0}
# Benchmarks only: "gpu" makes CPU ranks walk the loss in a GPU's chunks, so that the kernel
# launches a GPU step makes can be counted on a CPU (benchmarks/host_overhead.py).
CHUNKS_ENV = "GPT_DS_LOSS_CHUNKS"
# Benchmarks only, until a GPU table decides (benchmarks/throughput.py's "gpt_ds fused loss
# chunks" row): "1" compiles each chunk's body (upcast, max, softmax minus one-hot, scaled cast
# back) with inductor, which may read the chunk's logits fewer times than the eager body's
# 6.5 fp32-equivalent passes (benchmarks/chunked_loss.py counts them). One graph per chunk
# length: the last, shorter chunk adds one. Only in a run that compiles (--compile; auto on
# GPUs): one that trains eager turns torch.compile off (training/engine_build.py run_eager).
FUSED_ENV = "GPT_DS_LOSS_FUSED"


def block_rows(vocab_size: int, rows: int, dtype: torch.dtype, device_type: str = "cuda") -> int:
    """Tokens per block of gathered logit gradients: a whole number of chunks of `rows`, their
    `dtype` gradients within GRAD_BLOCK_BYTES. fp32 keeps one chunk a block: its weight
    gradient is an in-place addmm, with no product to add."""
    budget = GRAD_BLOCK_BYTES["cpu" if device_type == "cpu" else "gpu"]
    if dtype == torch.float32:
        return rows
    per_token = torch.finfo(dtype).bits // 8 * vocab_size
    return max(1, budget // (per_token * rows)) * rows


@dataclass(frozen=True)
class _Chunking:
    """How the loss walks the tokens: `rows` per chunk of fp32 logits, `block` (a multiple of
    rows) per gathered gradient; `tokens`: the real vocabulary under padding, or None."""

    rows: int
    block: int
    tokens: int | None


def _chunk_logits(hidden: torch.Tensor, weight: torch.Tensor, tokens: int | None) -> torch.Tensor:
    """fp32 logits of a chunk, its vocabulary padding masked."""
    return mask_padding((hidden @ weight.t()).float(), tokens)


def _counted_tokens(labels: torch.Tensor) -> torch.Tensor:
    """How many labels count (not IGNORE_INDEX), at least 1: the mean's denominator."""
    return (labels != IGNORE_INDEX).sum().clamp(min=1).float()


def _targets(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(which rows count, their labels with ignored ones at 0, safe to index with)."""
    counted = labels != IGNORE_INDEX
    return counted, torch.where(counted, labels, 0)


def _loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum of -log p(label) over the chunk's counted tokens: torch's cross-entropy, one fused
    log-softmax (a read and a write of the chunk, where log-sum-exp's max, subtract, exp and
    sum make four passes)."""
    return F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="sum")


def _summed_loss(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, rows: int, tokens: int | None
) -> torch.Tensor:
    """The loss summed over every counted token, one chunk of `rows` fp32 logits at a time:
    the forward of a loss that keeps no logit gradients (no grad, or fp16's recompute)."""
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    for start in range(0, hidden.shape[0], rows):
        logits = _chunk_logits(hidden[start : start + rows], weight, tokens)
        total += _loss_sum(logits, labels[start : start + rows])
    return total


def _logit_grad(
    probs: torch.Tensor, safe: torch.Tensor, weights: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """(softmax - one-hot) x per-row `weights` in `dtype`: the gradient with respect to the
    chunk's logits, from their fp32 softmax `probs` (changed in place), scaled as it is cast
    back (one read of the fp32 chunk, one 16-bit write)."""
    probs[torch.arange(len(safe), device=safe.device), safe] -= 1.0
    grad = torch.empty(probs.shape, dtype=dtype, device=probs.device)
    return torch.mul(probs, weights[:, None], out=grad)


def _add_head_grads(
    grad: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, grad_weight: torch.Tensor
) -> torch.Tensor:
    """Add the block's weight gradient into fp32 `grad_weight`; return its hidden gradient.
    `grad` is already in the hidden states' dtype."""
    if h.dtype == torch.float32:
        grad_weight.addmm_(grad.t(), h)  # in place: no (vocab x width) temporary
    else:
        grad_weight.add_(grad.t() @ h)  # 16-bit product, summed in fp32
    return grad @ weight


def _chunk_loss_and_grad(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    count: torch.Tensor,
    tokens: int | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss sum, d(mean loss)/d(logits) in the hidden states' dtype) of one chunk of fp32
    logits: the body `chunk_body` may compile. A GPU runs it at memory speed, so it makes
    few passes over the logits: after the upcast a max, the softmax (read and written) and the
    scaled cast back, 4.5 fp32-equivalent passes, where log-sum-exp (six kernels), exp,
    scaling and the cast apart made 13.5."""
    logits = _chunk_logits(hidden, weight, tokens)
    counted, safe = _targets(labels)
    picked = logits.gather(1, safe[:, None]).squeeze(1)
    peak, top = logits.max(dim=-1)
    probs = torch.softmax(logits, dim=-1)
    del logits  # one fp32 chunk besides the softmax
    # log-sum-exp from the row's largest probability, 1 / sum(exp(logit - peak)): never tiny
    lse = peak - probs.gather(1, top[:, None]).squeeze(1).log()
    loss_sum = ((lse - picked) * counted).sum()
    return loss_sum, _logit_grad(probs, safe, counted.float() / count, hidden.dtype)


_compiled_chunk_body = None


def chunk_body():
    """The chunk body: compiled by inductor under FUSED_ENV=1 (built once, on first use),
    else eager."""
    global _compiled_chunk_body
    if os.environ.get(FUSED_ENV) != "1":
        return _chunk_loss_and_grad
    if _compiled_chunk_body is None:
        _compiled_chunk_body = torch.compile(_chunk_loss_and_grad, dynamic=False, fullgraph=True)
    return _compiled_chunk_body


def _block_loss_and_grad(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    chunk: _Chunking,
    count: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss sum, d(mean loss)/d(logits) in the hidden states' dtype) of one block, one chunk
    of fp32 logits at a time."""
    body = chunk_body()
    if len(hidden) <= chunk.rows:  # one chunk: its gradient needs no gathering buffer
        return body(hidden, weight, labels, count, chunk.tokens)
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    grad = torch.empty(len(hidden), weight.shape[0], dtype=hidden.dtype, device=hidden.device)
    for start in range(0, len(hidden), chunk.rows):  # one chunk of fp32 logits alive at a time
        end = start + chunk.rows
        loss_sum, grad[start:end] = body(
            hidden[start:end], weight, labels[start:end], count, chunk.tokens
        )
        total += loss_sum
    return total, grad


class _LinearCrossEntropy(torch.autograd.Function):
    """Loss and both gradients in one pass over the chunks; backward only scales them."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, chunk: _Chunking):
        count = _counted_tokens(labels)
        if len(hidden) <= chunk.block:  # one block: one product, as autograd's own
            total, grad = _block_loss_and_grad(hidden, weight, labels, chunk, count)
            grad_weight = (grad.t() @ hidden).to(weight.dtype)
            ctx.save_for_backward(grad @ weight, grad_weight)
            return total / count
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        for start in range(0, hidden.shape[0], chunk.block):
            h, y = hidden[start : start + chunk.block], labels[start : start + chunk.block]
            loss_sum, grad = _block_loss_and_grad(h, weight, y, chunk, count)
            total += loss_sum
            grad_hidden[start : start + chunk.block] = _add_head_grads(grad, h, weight, grad_weight)
            del grad  # one block alive at a time (memory/estimate.py counts it)
        ctx.save_for_backward(grad_hidden, grad_weight.to(weight.dtype))
        return total / count

    @staticmethod
    def backward(ctx, grad_output):
        grad_hidden, grad_weight = ctx.saved_tensors
        return grad_hidden * grad_output, grad_weight * grad_output, None, None


class _LinearCrossEntropyRecompute(torch.autograd.Function):
    """fp16: forward keeps no logits; backward recomputes each chunk's and scales its gradient
    by `grad_output` (the loss scale) in fp32, before the cast to fp16."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, rows: int, tokens: int | None):
        count = _counted_tokens(labels)
        ctx.save_for_backward(hidden, weight, labels, count)
        ctx.rows, ctx.tokens = rows, tokens
        return _summed_loss(hidden, weight, labels, rows, tokens) / count

    @staticmethod
    def backward(ctx, grad_output):
        hidden, weight, labels, count = ctx.saved_tensors
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        scale = grad_output.float() / count
        for start in range(0, hidden.shape[0], ctx.rows):
            end = start + ctx.rows
            h, y = hidden[start:end], labels[start:end]
            probs = torch.softmax(_chunk_logits(h, weight, ctx.tokens), dim=-1)
            counted, safe = _targets(y)
            grad = _logit_grad(probs, safe, counted.float() * scale, hidden.dtype)
            del probs
            grad_hidden[start:end] = _add_head_grads(grad, h, weight, grad_weight)
            del grad
        return grad_hidden, grad_weight.to(weight.dtype), None, None, None


@torch.compiler.disable  # eager under --compile: a loop of large matmuls, nothing to fuse
def chunked_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    rows: int | None = None,
    tokens: int | None = None,
    block: int | None = None,
) -> torch.Tensor:
    """Mean cross-entropy of `hidden @ weight.T` against `labels` (IGNORE_INDEX not counted).

    hidden: (..., C) last hidden states; weight: (V, C) the LM head; labels: (...) token ids;
    tokens: the real vocabulary when V is padded beyond it (the rest is never predicted);
    rows / block: tokens per chunk of logits / per block of gathered gradients (default: the
    device's, chunk_rows and block_rows).
    """
    # here too: under --compile, the model's own range around it is gone
    with record_function(LOSS):
        return _chunked_cross_entropy(hidden, weight, labels, rows, tokens, block)


def _chunked_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    rows: int | None,
    tokens: int | None,
    block: int | None,
) -> torch.Tensor:
    """`chunked_cross_entropy`'s work, inside its profiler range."""
    hidden = hidden.reshape(-1, hidden.shape[-1])
    labels = labels.reshape(-1)
    device = os.environ.get(CHUNKS_ENV) or hidden.device.type
    rows = rows or chunk_rows(weight.shape[0], device)
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        if hidden.dtype == torch.float16:
            return _LinearCrossEntropyRecompute.apply(hidden, weight, labels, rows, tokens)
        block = block or block_rows(weight.shape[0], rows, hidden.dtype, device)
        return _LinearCrossEntropy.apply(hidden, weight, labels, _Chunking(rows, block, tokens))
    return _summed_loss(hidden, weight, labels, rows, tokens) / _counted_tokens(labels)


# ------------------------------------------------------------------------ the head and the model
class LossHead(torch.nn.Linear):
    """GPT-2's LM head: logits as usual, or, given `targets`, their mean cross-entropy."""

    kind: str = "chunked"  # how the loss is taken: gpt2.LOSS_KINDS (build_model sets it)
    chunk_rows: int | None = None  # tokens per chunk; None: chunk_rows
    grad_block: int | None = None  # tokens per gathered gradient; None: block_rows
    tokens: int | None = None  # the real vocabulary when the rows are padded beyond it

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        if targets is None:
            return super().forward(hidden)
        with record_function(LOSS):
            if self.kind == "chunked":
                return chunked_cross_entropy(
                    hidden, self.weight, targets, self.chunk_rows, self.tokens, self.grad_block
                )
            logits = super().forward(hidden)  # (B, T, V) in the run's precision
            if self.kind == "deepspeed":
                return deepspeed_cross_entropy(logits, targets, self.tokens)
            return full_cross_entropy(logits, targets, self.tokens)


class GPT2TrainingModel(GPT2LMHeadModel):
    """`model(input_ids=x, targets=y)` -> mean next-token loss (y already shifted); any other
    call is GPT2LMHeadModel's."""

    takes_targets = True  # model.lm_loss routes the loss through forward(targets=...)

    @classmethod
    def is_custom_code(cls) -> bool:
        """GPT-2's own modules: initialise them as GPT-2's. For a class defined outside
        transformers, its initialize_weights skips a module whose own parameters are already
        set, so GPT-2's scaled c_proj init (std 0.02/sqrt(2 n_layer)) never ran."""
        return False

    def __init__(self, config):
        super().__init__(config)
        # the same Linear, still tied to the embedding: only its forward is extended
        self.lm_head.__class__ = LossHead
        self.lm_head.tokens = getattr(config, "token_vocab_size", None)

    def forward(self, input_ids=None, targets=None, **kwargs):
        if targets is None:
            return super().forward(input_ids=input_ids, **kwargs)
        hidden = self.transformer(input_ids=input_ids, use_cache=False).last_hidden_state
        return self.lm_head(hidden, targets)


# ------------------------------------------------------------------------------- building
# GPT-2's attention as gpt_ds trains it: transformers' own SDPA function under a name of its
# own. transformers builds no mask for an attention implementation without a mask function
# registered; for "sdpa" it checks, every forward, whether the position ids GPT2Model makes
# are packed sequences (`.all()`: a host sync), and under torch.compile builds a (B,1,T,T)
# mask and takes non-causal SDPA. gpt_ds trains on whole windows (no padding, no packing), so
# SDPA's causal flag is the whole mask: the same kernel, no mask, no sync, eager or compiled.
CAUSAL_SDPA = "gpt_ds_causal_sdpa"


def register_causal_sdpa() -> str:
    """Register CAUSAL_SDPA with transformers (idempotent); its name."""
    AttentionInterface.register(CAUSAL_SDPA, sdpa_attention_forward)
    return CAUSAL_SDPA


def use_fused_gelu(model) -> None:
    """Give every block torch's tanh GELU where GPT-2 says "gelu_new".

    transformers' "gelu_new" is a Python expression (NewGELUActivation): 8 kernels forward and
    ~12 backward per layer over tokens x 4 x width, four such tensors kept for backward. torch's
    `F.gelu(approximate="tanh")` is the same function in one kernel each way, keeping only its
    input (to fp32 rounding; closer than gelu_new's own bf16 steps). Swapped in the modules,
    not the config: the weights, config.json and every export stay GPT-2's.
    """
    if model.config.activation_function == "gelu_new":
        for block in model.transformer.h:
            block.mlp.act = ACT2FN["gelu_pytorch_tanh"]


def fresh_model(cls: type, config, zero3_config: dict | None = None) -> torch.nn.Module:
    """`cls(config)` with GPT-2's initialisation, drawn once from the caller's seed (no
    throw-away draws in the constructors); built partitioned when `zero3_config` is given
    (zero3.py: no rank holds it whole), with the same weights as an unpartitioned build."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(no_init_weights())
        if zero3_config is not None:
            import deepspeed

            stack.enter_context(deepspeed.zero.Init(config_dict_or_path=zero3_config))
        model = cls(config)
    with torch.no_grad():
        if zero3_config is None:
            model.initialize_weights()
        else:
            zero3.initialize_weights_zero3(model)
    model.tie_weights()
    return model


def build_model(
    shape: ModelShape,
    dropout: float = 0.0,
    init_from: str = "scratch",
    loss: str | None = None,
    zero3_config: dict | None = None,
):
    """A `GPT2LMHeadModel`: freshly initialised, or loaded from a Hugging Face directory/name,
    with causal SDPA attention that builds no mask (CAUSAL_SDPA: whole windows only) and
    torch's fused tanh GELU (`use_fused_gelu`).

    With a `loss` kind (LOSS_KINDS) it is GPT2TrainingModel, the same model whose forward also
    computes the loss that way (gpt2.py `lm_loss`). `init_from` other than
    "scratch" is passed to `from_pretrained`; the hub is only reached where the machine can,
    so offline clusters pass a local directory. With a ZeRO-3 DeepSpeed config the model is
    built partitioned (zero3.py): no rank ever holds it whole.
    """
    if loss not in (None, *LOSS_KINDS):
        raise ValueError(f"loss {loss!r}: expected one of {LOSS_KINDS} or None")
    cls = GPT2LMHeadModel if loss is None else GPT2TrainingModel
    attention = register_causal_sdpa()
    if init_from == "scratch":
        cfg = gpt2_config(shape, dropout)
        cfg._attn_implementation = attention
        model = fresh_model(cls, cfg, zero3_config)
    else:
        loading = contextlib.nullcontext() if zero3_config is None else zero3.hf_zero3(zero3_config)
        with loading:  # under ZeRO-3, transformers fills the shards as it reads the weights
            model = cls.from_pretrained(
                init_from,
                attn_implementation=attention,
                resid_pdrop=dropout,
                embd_pdrop=dropout,
                attn_pdrop=dropout,
            )
    use_fused_gelu(model)
    if loss is not None:
        head = model.lm_head
        assert isinstance(head, LossHead), type(head)  # GPT2TrainingModel's own head
        head.kind = loss
    return model
