"""The model gpt_ds trains: `GPT2LMHeadModel`, whose forward also takes `targets` and then
returns the mean LM loss instead of the logits, taken the head's `kind` way (`--loss`):

- chunked: chunked_loss.py, from the hidden states, never the whole logits;
- deepspeed: the logits, then DeepSpeed's chunked cross-entropy (logits_loss.py);
- full: the logits upcast to fp32, then torch's cross-entropy, as nanoGPT's `model(idx,
  targets)`: under `--compile` inductor fuses head, upcast and cross-entropy in one graph.

Same modules, parameter names and weights as GPT-2 (checkpoints and exports are unchanged); only
the head's forward learns a second use. The loss is computed inside `lm_head`'s own forward so
that under ZeRO-3 its weight (the tied embedding) is gathered for it as for the plain head, and
the call goes through the DeepSpeed engine and the top-level forward, whose hooks ZeRO-3 needs.
Imported lazily (transformers is slow to import).
"""

from __future__ import annotations

import torch
from transformers import GPT2LMHeadModel

from gpt_ds.base.phases import phase
from gpt_ds.model.chunked_loss import chunked_cross_entropy
from gpt_ds.model.logits_loss import deepspeed_cross_entropy, full_cross_entropy


class LossHead(torch.nn.Linear):
    """GPT-2's LM head: logits as usual, or, given `targets`, their mean cross-entropy."""

    kind: str = "chunked"  # how the loss is taken: gpt2.LOSS_KINDS (build_model sets it)
    chunk_rows: int | None = None  # tokens per chunk; None: chunked_loss.chunk_rows
    grad_block: int | None = None  # tokens per gathered gradient; None: chunked_loss.block_rows
    tokens: int | None = None  # the real vocabulary when the rows are padded beyond it

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        if targets is None:
            return super().forward(hidden)
        with phase("loss"):
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
