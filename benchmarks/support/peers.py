"""What every peer of gpt_ds in benchmarks/throughput.py shares, whether it runs on DeepSpeed
(peer_trainers.py) or without it (plain_loop.py): the random windows of train.bin it trains on,
at the same offsets, and GPT2LMHeadModel at the table's shape. No row reads other data."""

from __future__ import annotations

import argparse

import numpy as np
import torch

from gpt_ds.data.tokens import load_token_data


class RandomWindows(torch.utils.data.Dataset):
    """`length` windows of `block` tokens at reproducible random offsets (labels = inputs:
    GPT2LMHeadModel shifts them itself)."""

    def __init__(self, tokens: np.ndarray, block: int, length: int, seed: int):
        self.tokens, self.block, self.length, self.seed = tokens, block, length, seed

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        start = np.random.default_rng([self.seed, i]).integers(0, len(self.tokens) - self.block)
        ids = torch.from_numpy(self.tokens[start : start + self.block].astype(np.int64))
        return {"input_ids": ids, "labels": ids}


def train_windows(data_dir: str, block: int, batch: int, steps: int, seed: int) -> RandomWindows:
    """The windows of train.bin in `data_dir`: twice what `steps` optimizer steps of `batch`
    windows (all ranks together) consume, so that the loops may start rank r at r * len / 2."""
    tokens = load_token_data(data_dir, 50257, block).train
    return RandomWindows(tokens, block, 2 * batch * steps, seed)


def gpt2(args: argparse.Namespace):
    """GPT2LMHeadModel at the peer's --n_layer/--n_head/--n_embd/--block_size, seeded by
    --seed, no dropout (gpt_ds trains without), attention by torch's sdpa."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(args.seed)
    config = GPT2Config(
        n_layer=args.n_layer,
        n_head=args.n_head,
        n_embd=args.n_embd,
        n_positions=args.block_size,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        attn_implementation="sdpa",
    )
    return GPT2LMHeadModel(config)


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The flags every peer of throughput.py takes: the model, the data, the steps timed."""
    p.add_argument("--data_dir", required=True)
    p.add_argument("--n_layer", type=int, required=True)
    p.add_argument("--n_head", type=int, required=True)
    p.add_argument("--n_embd", type=int, required=True)
    p.add_argument("--block_size", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--times", required=True, help="rank 0 writes step end times here")
    p.add_argument("--local_rank", type=int, default=0)  # from the deepspeed launcher
