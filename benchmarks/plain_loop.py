"""Plain PyTorch loops, no DeepSpeed: the anchor benchmarks/throughput.py times gpt_ds against,
run one rank per `deepspeed --num_gpus` slot as the other peers are (the launcher only starts
the processes: several ranks are joined by torch's DDP, one is a single process):

    deepspeed --num_gpus 1 benchmarks/plain_loop.py --model nanogpt --ds_config RESOLVED.json ...

- `nanogpt`: `GPT`, a minimal GPT-2 written here as nanoGPT writes it: GPT2LMHeadModel's
  shapes and parameters, one qkv Linear, `F.scaled_dot_product_attention`, the head tied to
  wte, the vocabulary padded to 50304 (a multiple of 64, as nanoGPT and gpt_ds pad it);
- `hf`: `transformers.GPT2LMHeadModel` (sdpa attention, as peer_trainers.py builds it) and its
  own loss.

Both train by nanoGPT's recipe: fp32 weights under bf16 autocast where the DeepSpeed config
runs bf16 (fp32 otherwise: fp16 would need a loss scaler, so an fp16 table runs these in fp32),
the loss on the full logits upcast to fp32 taken inside the model (nanoGPT's
`model(idx, targets)`, GPT2LMHeadModel's `labels=`), so that a compiled model fuses it with the
head, torch's AdamW (fused on CUDA) with weight decay on
matrices only, gradients clipped, TF32 on CUDA, and `torch.compile` where inductor pays off
(CUDA; on CPU by `--compile on`: a minute's compile per launch). The lr (constant, as the HF
Trainer's), betas, eps, weight decay, clipping, micro-batch and accumulation are those of the
resolved DeepSpeed config the other rows run with; the model and the windows of train.bin come
from support/peers.py, as the peers'. Rank 0 writes the same `--times` JSON as
peer_trainers.py, with a note on how it ran that throughput.py prints under its table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from support.peers import RandomWindows, add_run_arguments, gpt2, train_windows  # noqa: E402

PADDED_VOCAB = 50304  # GPT-2's 50257 rounded up to a multiple of 64: faster matmuls
IGNORED = -100  # the target of each window's last position: no next token there

# (model, token ids (B, T)) -> the mean next-token loss
LossOf = Callable[[nn.Module, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class GPTShape:
    n_layer: int
    n_head: int
    n_embd: int
    block_size: int
    vocab_size: int = PADDED_VOCAB


class SelfAttention(nn.Module):
    """Causal multi-head attention: one Linear makes q, k and v, torch's fused kernel mixes."""

    def __init__(self, s: GPTShape):
        super().__init__()
        self.n_head = s.n_head
        self.c_attn = nn.Linear(s.n_embd, 3 * s.n_embd)
        self.c_proj = nn.Linear(s.n_embd, s.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)  # (B, T, C) each
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))  # (B, T, C)


class MLP(nn.Module):
    def __init__(self, s: GPTShape):
        super().__init__()
        self.c_fc = nn.Linear(s.n_embd, 4 * s.n_embd)
        self.c_proj = nn.Linear(4 * s.n_embd, s.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))  # (B, T, 4C) inside


class Block(nn.Module):
    """GPT-2's pre-LayerNorm residual block."""

    def __init__(self, s: GPTShape):
        super().__init__()
        self.ln_1 = nn.LayerNorm(s.n_embd)
        self.attn = SelfAttention(s)
        self.ln_2 = nn.LayerNorm(s.n_embd)
        self.mlp = MLP(s)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2 as nanoGPT writes it: GPT2LMHeadModel's parameters (its Conv1D weights as Linear
    ones, transposed), the head tied to wte, logits over `vocab_size` (padded) tokens."""

    def __init__(self, s: GPTShape):
        super().__init__()
        self.wte = nn.Embedding(s.vocab_size, s.n_embd)
        self.wpe = nn.Embedding(s.block_size, s.n_embd)
        self.h = nn.ModuleList(Block(s) for _ in range(s.n_layer))
        self.ln_f = nn.LayerNorm(s.n_embd)
        self.lm_head = nn.Linear(s.n_embd, s.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as in GPT-2
        self.apply(_init)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # GPT-2's smaller init of what joins the residual
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * s.n_layer))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) token ids -> (B, T, vocab_size) logits; with (B, T) `targets`, the loss on
        them instead, computed here as nanoGPT's `GPT.forward(idx, targets)` does, so that
        `torch.compile` of the model fuses the head, the fp32 upcast and the cross-entropy."""
        pos = torch.arange(idx.shape[1], device=idx.device)  # (T,)
        x = self.wte(idx) + self.wpe(pos)  # (B, T, C)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, V)
        if targets is None:
            return logits
        return cross_entropy(logits, targets)


def _init(m: nn.Module) -> None:
    """GPT-2's init: weights N(0, 0.02), biases 0 (LayerNorms keep their ones and zeros)."""
    if isinstance(m, nn.Linear | nn.Embedding):
        nn.init.normal_(m.weight, 0.0, 0.02)
    if isinstance(m, nn.Linear) and m.bias is not None:
        nn.init.zeros_(m.bias)


def shifted_targets(ids: torch.Tensor) -> torch.Tensor:
    """GPT2LMHeadModel's targets on the same windows: position t predicts token t + 1 and the
    last position nothing. (B, T) -> (B, T)."""
    return F.pad(ids[:, 1:], (0, 1), value=IGNORED)


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy on the full logits (B, T, V) upcast to fp32, as nanoGPT's model takes it."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORED)


def causal_lm_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """GPT2LMHeadModel's loss of `logits` on the windows `ids`."""
    return cross_entropy(logits, shifted_targets(ids))


def build(args: argparse.Namespace) -> tuple[nn.Module, LossOf]:
    """The model `--model` names, seeded by --seed, and how its loss is taken."""
    if args.model == "hf":
        return gpt2(args), lambda model, ids: model(input_ids=ids, labels=ids).loss
    torch.manual_seed(args.seed)
    shape = GPTShape(args.n_layer, args.n_head, args.n_embd, args.block_size)
    return GPT(shape), lambda model, ids: model(ids, shifted_targets(ids))  # loss inside


# where each model takes its loss: inside the module `torch.compile` wraps, for both
LOSS_TAKEN = {
    "nanogpt": "loss inside the model (nanoGPT's forward(idx, targets))",
    "hf": "loss inside the model (GPT2LMHeadModel's labels=)",
}


@dataclass
class Recipe:
    """How the loop trains: the resolved DeepSpeed config's batch and optimizer settings, and
    what this machine gets (fused AdamW and torch.compile where they pay off)."""

    micro: int
    accum: int
    clip: float
    adam: dict  # the config's optimizer params: lr, betas, eps, weight_decay
    bf16: bool
    compiled: bool
    fused: bool

    @classmethod
    def of(cls, ds: dict, compile_: str, device: torch.device) -> Recipe:
        cuda = device.type == "cuda"
        return cls(
            micro=ds["train_micro_batch_size_per_gpu"],
            accum=ds["gradient_accumulation_steps"],
            clip=ds.get("gradient_clipping", 0.0),
            adam=ds["optimizer"]["params"],
            bf16=ds.get("bf16", {}).get("enabled", False),
            compiled=compile_ == "on" or (compile_ == "auto" and cuda),
            fused=cuda,
        )

    def note(self, world: int, fp16: bool, model: str) -> str:
        """How the row ran, for the table's reader."""
        precision = "bf16 autocast" if self.bf16 else "fp32"
        if fp16:
            precision += " (not fp16: it would need a loss scaler)"
        compiled = "torch.compile" if self.compiled else "eager (--plain_compile on compiles)"
        ranks = f"DDP over {world} ranks" if world > 1 else "one process"
        adam = f"{'fused' if self.fused else 'torch'} AdamW"
        return f"{precision}, {compiled}, {LOSS_TAKEN[model]}, {adam}, {ranks}"


@dataclass
class Place:
    """Where this rank runs."""

    device: torch.device
    rank: int
    world: int


def place() -> Place:
    """This process's device, and a process group where the launcher started several (nccl on
    GPUs, gloo on CPU); TF32 matmuls and convolutions on CUDA, as nanoGPT sets them. CPU where
    DS_ACCELERATOR=cpu puts the other rows on CPU ranks (the launcher still shows the GPUs)."""
    world, local = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available() and os.environ.get("DS_ACCELERATOR") != "cpu"
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if world > 1:
        torch.distributed.init_process_group("nccl" if cuda else "gloo")
    return Place(device, int(os.environ.get("RANK", "0")), world)


def adamw(model: nn.Module, recipe: Recipe) -> torch.optim.AdamW:
    """torch's AdamW at the config's lr, betas and eps; its weight decay on matrices (dim >= 2:
    embeddings and Linear weights), none on biases and LayerNorms, as nanoGPT groups them."""
    params = list(model.parameters())  # the tied head once
    a = recipe.adam
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": a.get("weight_decay", 0)},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    fused = {"fused": True} if recipe.fused else {}  # on CPU: torch's default implementation
    betas = tuple(a.get("betas", (0.9, 0.999)))
    return torch.optim.AdamW(groups, lr=a["lr"], betas=betas, eps=a.get("eps", 1e-8), **fused)


def wrap(model: nn.Module, where: Place, compiled: bool) -> nn.Module:
    """Compiled if asked, then in DDP across several ranks (nanoGPT's order)."""
    if compiled:
        model = torch.compile(model)
    if where.world > 1:
        ids = [where.device.index] if where.device.type == "cuda" else None
        model = nn.parallel.DistributedDataParallel(model, device_ids=ids)
    return model


def train(
    model: nn.Module, loss_of: LossOf, optimizer: torch.optim.Optimizer, data: RandomWindows,
    recipe: Recipe, where: Place, steps: int,
) -> list[float]:  # fmt: skip
    """`steps` optimizer steps of `accum` micro-batches, the gradients all-reduced on the last
    only; rank r reads the windows from r * len / 2 on, as the bare DeepSpeed loop does. The
    wall-clock time at the end of each step."""
    times, index = [], where.rank * len(data) // 2
    for _ in range(steps):
        for m in range(recipe.accum):
            ids = torch.stack([data[index + j]["input_ids"] for j in range(recipe.micro)])
            ids, index = ids.to(where.device), index + recipe.micro  # (micro, T)
            if where.world > 1:
                model.require_backward_grad_sync = m == recipe.accum - 1
            with torch.autocast(where.device.type, torch.bfloat16, enabled=recipe.bf16):
                loss = loss_of(model, ids) / recipe.accum
            loss.backward()
        if recipe.clip:
            nn.utils.clip_grad_norm_(model.parameters(), recipe.clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()  # what a logging loop waits for once per step
        times.append(time.time())
    return times


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=("nanogpt", "hf"), required=True)
    p.add_argument(
        "--ds_config",
        required=True,
        help="the resolved DeepSpeed config (JSON) the other rows run with: its batch and "
        "optimizer settings are read, DeepSpeed is not run",
    )
    p.add_argument(
        "--compile",
        choices=("auto", "on", "off"),
        default="auto",
        help="torch.compile the model (auto: on CUDA only, where inductor pays off)",
    )
    add_run_arguments(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ds = json.loads(Path(args.ds_config).read_text())
    where = place()
    recipe = Recipe.of(ds, args.compile, where.device)
    batch, steps = ds["train_batch_size"], args.steps
    data = train_windows(args.data_dir, args.block_size, batch, steps, args.seed)
    model, loss_of = build(args)
    optimizer = adamw(model.to(where.device), recipe)
    model = wrap(model, where, recipe.compiled)
    times = train(model, loss_of, optimizer, data, recipe, where, steps)
    if where.rank == 0:
        cuda = where.device.type == "cuda"
        gpu = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
        note = recipe.note(where.world, ds.get("fp16", {}).get("enabled", False), args.model)
        Path(args.times).write_text(json.dumps({"times": times, "peak_gpu_gib": gpu, "note": note}))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
