"""gpt_ds: train GPT-2 models on DeepSpeed, from a toy on a laptop CPU to GPT-2 XL on a cluster."""

__version__ = "0.1.0"
