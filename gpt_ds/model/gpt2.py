"""GPT-2 as `transformers` defines it, without importing transformers at the top: named size
presets and shapes, the config, parameter groups, and the LM loss from the whole logits. The
run's plan, the memory model and the preset picker read it before anything loads
transformers; training_model.py builds the model.

Using `GPT2LMHeadModel` itself (not a re-implementation) keeps every checkpoint loadable by
any inference stack that reads Hugging Face GPT-2.

**The losses from the whole logits.** DeepSpeed's keeps the 16-bit logits and one fp32
log-sum-exp per token for backward and writes the logits' gradient in their own dtype: no fp32
(tokens x vocab) tensor, where the full path keeps an fp32 log-softmax and makes two more fp32
tensors of that size in backward (memory/estimate.py `logit_bytes`). Both mask the padding rows
of a padded vocabulary (`tokens` on) to -inf in place, so they take no probability and get no
gradient, as the chunked loss does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from gpt_ds.base.errors import ConfigError

GPT2_VOCAB_SIZE = 50257
# How the training model takes the LM loss (--loss; training_model.py): from the hidden states a
# chunk at a time, DeepSpeed's chunked cross-entropy over the logits, or the fp32 logits whole.
LOSS_KINDS = ("chunked", "deepspeed", "full")


@dataclass(frozen=True)
class ModelShape:
    """The hyper-parameters that fix a GPT-2's size."""

    n_layer: int
    n_head: int
    n_embd: int
    block_size: int = 1024
    vocab_size: int = GPT2_VOCAB_SIZE
    """Rows of the token embedding (and of the tied LM head)."""
    token_vocab_size: int | None = None
    """Token ids the tokenizer produces, when below vocab_size: the rows above are padding
    (`padded_vocab`), never predicted, stripped on export. None: every row is a token."""

    @property
    def tokens(self) -> int:
        """The tokenizer's vocabulary: ids in [0, tokens) are real tokens."""
        return self.token_vocab_size or self.vocab_size

    def num_params(self) -> int:
        """Exact parameter count of GPT2LMHeadModel with tied embeddings (lm_head shares wte)."""
        d, L = self.n_embd, self.n_layer
        embed = self.vocab_size * d + self.block_size * d
        # per block: 2 LayerNorms (4d), attn c_attn (3d*d+3d) + c_proj (d*d+d),
        # mlp c_fc (4d*d+4d) + c_proj (4d*d+d)
        block = 4 * d + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
        return embed + L * block + 2 * d  # + final LayerNorm


# GPT-2's own sizes (OpenAI / Hugging Face hub names) plus small ones for CPU work.
MODEL_PRESETS: dict[str, ModelShape] = {
    "gpt2-tiny": ModelShape(n_layer=4, n_head=4, n_embd=128, block_size=256),
    "gpt2-mini": ModelShape(n_layer=6, n_head=6, n_embd=384, block_size=256),
    "gpt2": ModelShape(n_layer=12, n_head=12, n_embd=768),
    "gpt2-medium": ModelShape(n_layer=24, n_head=16, n_embd=1024),
    "gpt2-large": ModelShape(n_layer=36, n_head=20, n_embd=1280),
    "gpt2-xl": ModelShape(n_layer=48, n_head=25, n_embd=1600),
}


def resolve_shape(
    preset: str,
    n_layer: int | None = None,
    n_head: int | None = None,
    n_embd: int | None = None,
    block_size: int | None = None,
) -> ModelShape:
    """A preset with any of its fields overridden. Unknown preset names raise KeyError."""
    if preset not in MODEL_PRESETS:
        raise KeyError(f"unknown model preset {preset!r}; choose one of {', '.join(MODEL_PRESETS)}")
    base = MODEL_PRESETS[preset]
    return ModelShape(
        n_layer=n_layer or base.n_layer,
        n_head=n_head or base.n_head,
        n_embd=n_embd or base.n_embd,
        block_size=block_size or base.block_size,
        vocab_size=base.vocab_size,
    )


def padded_vocab(shape: ModelShape, multiple: int) -> ModelShape:
    """`shape` with its embedding padded to a multiple of `multiple` rows (50257 -> 50304 at
    64): GPU matmuls over an aligned dimension run faster. The padding rows are masked out of
    the loss (they are never predicted) and no token id reaches them."""
    rows = -(-shape.tokens // multiple) * multiple if multiple > 1 else shape.tokens
    return replace(
        shape, vocab_size=rows, token_vocab_size=shape.tokens if rows > shape.tokens else None
    )


def unpadded(shape: ModelShape) -> ModelShape:
    """The shape a Hugging Face GPT-2 of this model has: the tokenizer's rows only."""
    return replace(shape, vocab_size=shape.tokens, token_vocab_size=None)


def checkpoint_vocab(shape: ModelShape, saved: dict) -> ModelShape:
    """`shape` with the vocabulary padding of the checkpoint it resumes (a run keeps the
    embedding it started with, whatever --vocab_multiple says now), when both have the same
    tokens; otherwise `shape` as is, for check_model to refuse."""
    tokens = saved.get("token_vocab_size") or saved.get("vocab_size")
    if tokens != shape.tokens:
        return shape
    return replace(
        shape, vocab_size=saved["vocab_size"], token_vocab_size=saved.get("token_vocab_size")
    )


def shape_problems(shape: ModelShape) -> list[str]:
    """Why `shape` cannot be built (sizes below 1, heads that do not divide the width); the one
    place this is checked, for the run config, the memory model and the preset picker alike."""
    sizes = {name: getattr(shape, name) for name in ("n_layer", "n_head", "n_embd", "block_size")}
    problems = [f"{name} must be >= 1, got {v}" for name, v in sizes.items() if v < 1]
    if not problems and shape.n_embd % shape.n_head:
        problems.append(f"n_embd {shape.n_embd} is not divisible by n_head {shape.n_head}")
    return problems


def gpt2_config(shape: ModelShape, dropout: float = 0.0):
    """The `transformers.GPT2Config` for a shape (SDPA attention, GPT-2's defaults otherwise)."""
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=shape.vocab_size,
        n_positions=shape.block_size,
        n_embd=shape.n_embd,
        n_layer=shape.n_layer,
        n_head=shape.n_head,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
        bos_token_id=50256,
        eos_token_id=50256,
        tie_word_embeddings=True,
        # gpt_ds's own, only while training: rows from here on are padding, never predicted
        **({"token_vocab_size": shape.token_vocab_size} if shape.token_vocab_size else {}),
    )


def enable_activation_checkpointing(model) -> None:
    """Recompute each block's activations in backward (non-reentrant, so ZeRO-3 works).

    transformers 5 renamed `gradient_checkpointing_enable` (now a deprecated alias) to
    `activation_checkpointing_enable`; 4.x only has the old name.
    """
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def shape_of(model) -> ModelShape:
    """The shape of a built model (e.g. one loaded with `init_from`)."""
    c = model.config
    tokens = getattr(c, "token_vocab_size", None)
    return ModelShape(c.n_layer, c.n_head, c.n_embd, c.n_positions, c.vocab_size, tokens)


def count_params(model: torch.nn.Module) -> int:
    """Unique parameters (tied tensors counted once; ZeRO-3 partitioned ones at full size)."""
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += getattr(p, "ds_numel", p.numel())
    return total


def flops_per_token(shape: ModelShape) -> float:
    """Training FLOPs per token (6N + attention), as in the PaLM paper's MFU accounting."""
    n = shape.num_params() - shape.block_size * shape.n_embd
    return 6 * n + 12 * shape.n_layer * shape.n_embd * shape.block_size


# ------------------------------------------------------------------------------- the LM loss
# fp32 logits per chunk. CPU: 16 MiB (~80 tokens of GPT-2's vocabulary) measured fastest here
# (benchmarks/throughput.py: 64 MiB was 13% slower and 0.1 GiB larger, 4 MiB slower again; the
# chunk stays in cache). GPU: 256 MiB (~1,300 tokens), so that each chunk's three matmuls are
# large enough to keep the GPU busy between launches; not yet measured on a GPU.
CHUNK_LOGIT_BYTES = {"cpu": 16 << 20, "gpu": 256 << 20}


def chunk_rows(vocab_size: int, device_type: str = "cuda") -> int:
    """Tokens per chunk on a device of `device_type` ("cpu", "cuda", ...): one chunk's fp32
    logits fit in CHUNK_LOGIT_BYTES."""
    budget = CHUNK_LOGIT_BYTES["cpu" if device_type == "cpu" else "gpu"]
    return max(1, budget // (4 * vocab_size))


def mask_padding(logits: torch.Tensor, tokens: int | None) -> torch.Tensor:
    """`logits` with the columns from `tokens` on (vocabulary padding) at -inf, in place (a
    slice would copy them): they take no probability and get no gradient."""
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


def lm_loss(model, x: torch.Tensor, y: torch.Tensor, *, reduction: str = "mean") -> torch.Tensor:
    """Next-token cross-entropy of `model` (a GPT2LMHeadModel or a DeepSpeed engine around one).

    x, y: (B, T) token ids, y = x shifted by one. A GPT2TrainingModel computes it inside its
    forward, its head's way (LOSS_KINDS); any other GPT-2 from the full logits, upcast to fp32
    (`full_cross_entropy`), padding rows never predicted.
    """
    module = getattr(model, "module", model)
    if getattr(module, "takes_targets", False):
        loss = model(input_ids=x, targets=y)
        return loss * y.numel() if reduction == "sum" else loss
    logits = model(input_ids=x, use_cache=False).logits  # (B, T, V)
    tokens = getattr(module.config, "token_vocab_size", None)
    return full_cross_entropy(logits, y, tokens, reduction)


def pretrained_shape(init_from: str, block_size: int | None = None) -> ModelShape:
    """The shape of Hugging Face GPT-2 weights (`--init_from`), read from their config only.

    Raises ConfigError for a path that is no GPT-2, or a block_size beyond its positions.
    """
    from transformers import GPT2Config

    try:
        c = GPT2Config.from_pretrained(init_from)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"--init_from {init_from}: not a Hugging Face GPT-2 directory, and not a hub "
            f"name this machine can fetch ({str(exc).splitlines()[0]})"
        ) from exc
    if c.model_type != "gpt2":
        raise ConfigError(f"--init_from {init_from}: model_type {c.model_type!r}, not gpt2")
    if block_size and block_size > c.n_positions:
        raise ConfigError(
            f"--block_size {block_size} exceeds the pretrained model's {c.n_positions} "
            "positions (n_positions)"
        )
    return ModelShape(c.n_layer, c.n_head, c.n_embd, block_size or c.n_positions, c.vocab_size)


def is_muon_matrix(name: str, shape: tuple[int, ...] | torch.Size) -> bool:
    """GPT-2's hidden matrices, the Muon optimizer's half: the attention and MLP weights of
    every block. wte (tied to the head), wpe, biases and LayerNorm gains are not."""
    return name.startswith("transformer.h.") and len(shape) == 2


def layer_shape(p: torch.nn.Parameter) -> tuple[int, ...] | torch.Size:
    """A parameter's shape as a layer's: a ZeRO-3 partitioned one is flat, its own is ds_shape."""
    return getattr(p, "ds_shape", p.shape)


def tag_muon(model: torch.nn.Module) -> None:
    """Set `use_muon` on every parameter, which DeepSpeed's Muon reads (GPT-2's split)."""
    for name, p in model.named_parameters():
        p.use_muon = is_muon_matrix(name, layer_shape(p))  # type: ignore[attr-defined]


def param_groups(
    model: torch.nn.Module, weight_decay: float, muon_weight_decay: float | None = None
) -> list[dict]:
    """Weight decay on matrices only; biases and LayerNorm gains are not decayed. With
    `muon_weight_decay` (a Muon run), the hidden matrices form a group of their own with it."""
    muon: list[torch.nn.Parameter] = []
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        shape = layer_shape(p)
        if muon_weight_decay is not None and is_muon_matrix(name, shape):
            muon.append(p)
        else:
            (decay if len(shape) >= 2 else no_decay).append(p)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    if muon_weight_decay is None:
        return groups
    names = ("embeddings", "vectors")  # DeepSpeed names each half "<name>-adam-params"
    return [
        {"params": muon, "weight_decay": muon_weight_decay, "name": "hidden"},
        *({**group, "name": name} for group, name in zip(groups, names, strict=True)),
    ]
