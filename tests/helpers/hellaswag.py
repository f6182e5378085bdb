"""HellaSwag scored the way llm.c and build-nanogpt score it, one row at a time with plain
transformers: the reference gpt_ds's scoring is compared with (test_hellaswag, test_train)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from gpt_ds.data.tokenizer import get_encoding
from helpers.files import HELLASWAG_MINI


def reference_losses(model, item: dict, block: int) -> list[tuple[float, float]] | None:
    """(summed, mean) loss of each ending after its context, one row at a time; None when an
    ending alone fills the block."""
    enc = get_encoding()
    context = enc.encode_ordinary(item["ctx"])
    out = []
    for ending in item["endings"]:
        end = enc.encode_ordinary(" " + ending)
        if len(end) >= block:
            return None
        row = context[max(0, len(context) - (block - len(end))) :] + end
        with torch.no_grad():
            logits = model(torch.tensor([row])).logits[0]
        start = len(row) - len(end)
        losses = torch.nn.functional.cross_entropy(
            logits[start - 1 : -1], torch.tensor(row[start:]), reduction="none"
        )
        out.append((losses.sum().item(), losses.mean().item()))
    return out


def reference_scores(model, block: int, path: Path = HELLASWAG_MINI) -> dict[str, float]:
    """acc, acc_norm and the examples scored, as metrics.jsonl's eval records name them."""
    right, right_norm, scored = 0, 0, 0
    for line in path.read_text().splitlines():
        item = json.loads(line)
        losses = reference_losses(model, item, block)
        if losses is None:
            continue
        right += min(range(4), key=lambda i: losses[i][0]) == item["label"]
        right_norm += min(range(4), key=lambda i: losses[i][1]) == item["label"]
        scored += 1
    return {
        "hellaswag_acc": right / scored,
        "hellaswag_acc_norm": right_norm / scored,
        "hellaswag_examples": scored,
    }
