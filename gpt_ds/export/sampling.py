"""Text generation from an exported Hugging Face directory or straight from a ZeRO checkpoint.

A training out dir (or one tag directory in it) is consolidated in memory by the same code as
the export (`gpt_ds.export.hf.consolidate`), so sampling needs no conversion step. Text goes in
and out through the packaged tiktoken GPT-2 encoding, the one the model was trained with.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gpt_ds.base.errors import CheckpointError
from gpt_ds.checkpoint.tags import is_checkpoint_dir
from gpt_ds.data.tokenizer import EOT_TOKEN, get_encoding


@dataclass
class LoadedModel:
    model: Any  # GPT2LMHeadModel (or any causal LM transformers loads), eval mode
    source: str  # what was loaded, for the user


def load_model(
    path: str | Path, tag: str | None = None, device: str = "cpu", allow_unverified: bool = False
) -> LoadedModel:
    """A GPT-2 from a training checkpoint (detected by `gpt_ds.json`/`latest`) or an HF dir."""
    from gpt_ds.export.hf import consolidate, resolve_checkpoint

    path = Path(path)
    if not path.is_dir():
        what = "is not a directory" if path.exists() else "does not exist"
        raise CheckpointError(f"--model {path} {what}")
    if is_checkpoint_dir(path):
        ref = resolve_checkpoint(path, tag, allow_unverified)
        model = consolidate(ref, progress=False)
        source = f"checkpoint {ref.tag_dir} (iteration {ref.manifest.iteration})"
    elif (path / "config.json").is_file():
        if tag is not None:
            raise CheckpointError(f"--tag applies to training checkpoints; {path} is an export")
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(path)
        source = f"Hugging Face directory {path}"
    else:
        raise CheckpointError(
            f"--model {path}: neither a training checkpoint (gpt_ds.json, latest) nor a "
            "Hugging Face model directory (config.json)"
        )
    return LoadedModel(model=model.to(device).eval(), source=source)


@torch.no_grad()
def generate(
    model,
    prompt: str,
    max_new_tokens: int = 100,
    temperature: float = 0.8,
    top_k: int | None = 200,
    num_samples: int = 1,
    seed: int = 1337,
) -> list[str]:
    """`num_samples` continuations of `prompt` (each returned with the prompt in front).

    temperature 0 = greedy decoding (deterministic: all samples equal). An empty prompt starts
    from <|endoftext|>. The prompt plus the new tokens must fit the model's context
    (`n_positions`): more new tokens than fit are cut; a prompt that fills it is an error.
    """
    enc = get_encoding()
    ids = enc.encode(prompt, allowed_special="all") or [EOT_TOKEN]
    context = model.config.n_positions
    if len(ids) >= context:
        raise CheckpointError(
            f"the prompt is {len(ids)} tokens; the model's context is {context}: shorten it"
        )
    max_new_tokens = min(max_new_tokens, context - len(ids))
    device = next(model.parameters()).device
    x = torch.tensor([ids], dtype=torch.long, device=device)  # (1, T)
    torch.manual_seed(seed)
    sampling = temperature > 0
    kwargs = {"temperature": temperature, "top_k": top_k or 0} if sampling else {}
    out = model.generate(
        x,
        attention_mask=torch.ones_like(x),
        max_new_tokens=max_new_tokens,
        eos_token_id=None,  # never stop early: <|endoftext|> is just another token here
        do_sample=sampling,
        num_return_sequences=num_samples if sampling else 1,
        pad_token_id=EOT_TOKEN,
        **kwargs,
    )  # (num_samples, T + max_new_tokens)
    skip = 0 if prompt else 1  # the <|endoftext|> we started from
    texts = [enc.decode(row[skip:].tolist()) for row in out]
    return texts if sampling else texts * num_samples  # greedy: every sample is the same
