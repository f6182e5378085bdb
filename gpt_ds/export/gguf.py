"""A GGUF file for llama.cpp (ollama and LM Studio read the format too: untested), written
straight from a ZeRO checkpoint: `gpt-ds-export OUT --format gguf --output model.gguf
[--dtype q8_0]`.

What llama.cpp's own GPT-2 converter (`convert_hf_to_gguf.py`, conversion/gpt2.py) writes from a
Hugging Face directory, written here without one, through the same `gguf` package (the optional
extra `gpt_ds[gguf]`): architecture `gpt2` and its hyperparameters, the tokenizer (model
`gpt2`, pre-tokenizer `gpt-2`, tokens, types, merges and special ids, read by gguf's own
`SpecialVocab` from the files the HF export writes), and the tensors under llama.cpp's names,
Conv1D weights transposed, the vocabulary padding stripped, the tied head left out (llama.cpp
uses the embedding). Types follow the converter's rules: norms, biases and the position
embedding stay f32; the other matrices take `--dtype` (f32, f16, bf16, or q8_0 quantized by
gguf in numpy). Streamed: the header names every tensor first, then one tensor at a time is
read, converted and written, with no copy of the model in memory.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpt_ds.base.errors import CheckpointError, GptDsError
from gpt_ds.checkpoint.tags import CheckpointRef
from gpt_ds.export.stream import progress_bar
from gpt_ds.model.gpt2 import unpadded

INSTALL = "pip install 'gpt_ds[gguf]'"
GGUF_DTYPES = ("fp32", "fp16", "bf16", "q8_0")
TRANSPOSED = (".c_attn.weight", ".c_proj.weight", ".c_fc.weight")  # Conv1D: (in, out) in HF
TOKENIZER_PRE = "gpt-2"  # llama.cpp's name for GPT-2's pre-tokenizer (its hash of it)


def import_gguf():
    """The `gguf` package, or an error that says how to install it."""
    try:
        import gguf
    except ImportError as exc:
        raise GptDsError(f"--format gguf needs the gguf package: {INSTALL}") from exc
    return gguf


@dataclass
class PlannedTensor:
    """One tensor of the file: its checkpoint name and lazy tensor, its GGUF name and type."""

    source: str
    lazy: Any  # the checkpoint's lazy tensor (`.shape`; read on demand)
    name: str
    qtype: object  # gguf.GGMLQuantizationType
    transpose: bool

    def shape(self) -> tuple[int, ...]:
        shape = tuple(self.lazy.shape)
        return shape[::-1] if self.transpose else shape


def file_type(gguf, dtype: str):
    """(llama.cpp's file type, the type of its quantizable matrices) for `--dtype`."""
    q, f = gguf.GGMLQuantizationType, gguf.LlamaFileType
    return {
        "fp32": (f.ALL_F32, q.F32),
        "fp16": (f.MOSTLY_F16, q.F16),
        "bf16": (f.MOSTLY_BF16, q.BF16),
        "q8_0": (f.MOSTLY_Q8_0, q.Q8_0),
    }[dtype]


def tensor_type(gguf, name: str, n_dims: int, shape: tuple[int, ...], matrices):
    """The converter's rule: 1-D tensors, norms, biases and the position embedding in f32,
    the other matrices in the file's type (q8_0 needs rows of whole 32-value blocks, else
    f16, as the converter falls back)."""
    q = gguf.GGMLQuantizationType
    if n_dims <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight"):
        return q.F32
    if name.startswith("position_embd."):
        return q.F32
    block = gguf.GGML_QUANT_SIZES[matrices][0]
    return matrices if shape[-1] % block == 0 else q.F16


def plan_tensors(gguf, weights, n_layer: int, matrices) -> list[PlannedTensor]:
    """The checkpoint's tensors under llama.cpp's GPT-2 names (the tied head left out)."""
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GPT2, n_layer)
    unique, _aliases = weights.unique()
    planned = []
    for source, lazy in unique.items():
        if source == "lm_head.weight" or source.endswith((".attn.bias", ".attn.masked_bias")):
            continue
        name = names.get_name(source, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise CheckpointError(f"{source}: no llama.cpp GPT-2 tensor of that name")
        tensor = PlannedTensor(source, lazy, name, None, source.endswith(TRANSPOSED))
        shape = tensor.shape()
        tensor.qtype = tensor_type(gguf, name, len(shape), shape, matrices)
        planned.append(tensor)
    return planned


def converted(gguf, tensor: PlannedTensor, weights) -> np.ndarray:
    """One tensor read from the checkpoint in fp32, laid out and converted (quantized)."""
    data = weights.read(tensor.lazy).to(torch.float32)
    if tensor.transpose:
        data = data.t()
    array = data.contiguous().numpy()
    if tensor.qtype == gguf.GGMLQuantizationType.F32:
        return array
    return gguf.quants.quantize(array, tensor.qtype)


def stored_as(gguf, tensor: PlannedTensor) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, numpy dtype, bytes) of the converted array, before it exists."""
    q, shape = gguf.GGMLQuantizationType, tensor.shape()
    if tensor.qtype in (q.F32, q.F16):
        dtype = np.dtype(np.float32 if tensor.qtype == q.F32 else np.float16)
        return shape, dtype, math.prod(shape) * dtype.itemsize
    byte_shape = tuple(gguf.quant_shape_to_byte_shape(shape, tensor.qtype))
    return byte_shape, np.dtype(np.uint8), math.prod(byte_shape)


def check_gguf_output(output: Path, overwrite: bool) -> None:
    if output.suffix != ".gguf":
        raise CheckpointError(f"--output {output}: --format gguf writes one file: NAME.gguf")
    if output.is_dir():
        raise CheckpointError(f"--output {output} is a directory; name the .gguf file")
    if output.exists() and not overwrite:
        raise CheckpointError(f"--output {output} exists; pass --overwrite to replace it")


def write_gguf(ref: CheckpointRef, weights, output: Path, dtype: str, name: str, progress: bool):
    """The file, written to a temporary sibling and renamed into place."""
    gguf = import_gguf()
    shape = ref.manifest.shape
    ftype, matrices = file_type(gguf, dtype)
    planned = plan_tensors(gguf, weights, shape.n_layer, matrices)
    tmp = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    writer = gguf.GGUFWriter(tmp, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.GPT2])
    try:
        add_metadata(gguf, writer, ref, ftype, name)
        for tensor in planned:
            byte_shape, np_dtype, nbytes = stored_as(gguf, tensor)
            writer.add_tensor_info(
                tensor.name, byte_shape, np_dtype, nbytes, raw_dtype=tensor.qtype
            )
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        with progress_bar(len(planned), progress) as bar:
            for tensor in planned:
                writer.write_tensor_data(converted(gguf, tensor, weights))
                bar.update(1)
        writer.close()
        os.replace(tmp, output)
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    return planned


def add_metadata(gguf, writer, ref: CheckpointRef, ftype, name: str) -> None:
    """general.*, gpt2.* and tokenizer.ggml.*, as llama.cpp's GPT-2 converter writes them."""
    from gpt_ds.export.hf import describe_model

    config = describe_model(ref).config  # the export's config.json
    params = unpadded(ref.manifest.shape).num_params()
    writer.add_type(gguf.GGUFType.MODEL)
    meta = gguf.Metadata(name=name, size_label=gguf.size_label(params, 0, 0, 0))
    meta.set_gguf_meta_model(writer)
    writer.add_block_count(config.n_layer)
    writer.add_context_length(config.n_positions)
    writer.add_embedding_length(config.n_embd)
    writer.add_feed_forward_length(4 * config.n_embd)
    writer.add_head_count(config.n_head)
    writer.add_layer_norm_eps(config.layer_norm_epsilon)
    writer.add_file_type(ftype)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    add_tokenizer(gguf, writer, config)


def add_tokenizer(gguf, writer, config) -> None:
    """tokenizer.ggml.*: from the tokenizer and config files the HF export writes, read by
    gguf's SpecialVocab as the converter reads them (merges, special ids, add_* flags)."""
    from gpt_ds.export.hf import gpt2_tokenizer

    tokenizer = gpt2_tokenizer(config.n_positions)
    by_id = {i: t for t, i in tokenizer.get_vocab().items()}
    special = {i for i, added in tokenizer.added_tokens_decoder.items() if added.special}
    ids = range(len(by_id))
    tokens = [by_id[i] for i in ids]
    types = [gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL for i in ids]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(TOKENIZER_PRE)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    with tempfile.TemporaryDirectory() as folder:
        tokenizer.save_pretrained(folder)
        config.save_pretrained(folder)  # bos/eos ids, as in the export
        gguf.SpecialVocab(Path(folder), load_merges=True, n_vocab=len(tokens)).add_to_gguf(
            writer, quiet=True
        )


def export_gguf(
    checkpoint: str | Path,
    output: str | Path,
    *,
    tag: str | None = None,
    dtype: str = "fp32",
    name: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
    log=print,
    allow_unverified: bool = False,
) -> str:
    """Write one checkpoint tag as `output` (a .gguf file); returns the summary line."""
    from gpt_ds.export.hf import resolve_checkpoint
    from gpt_ds.export.stream import read_weights

    if dtype not in GGUF_DTYPES:
        raise CheckpointError(f"--dtype {dtype!r} with --format gguf: choose one of "
                              f"{', '.join(GGUF_DTYPES)}")  # fmt: skip
    import_gguf()  # before any work
    ref = resolve_checkpoint(checkpoint, tag, allow_unverified)
    output = Path(output).resolve()
    check_gguf_output(output, overwrite)
    name = name or ref.out_dir.resolve().name
    log(f"exporting {ref.tag_dir} (iteration {ref.manifest.iteration}) -> {output} "
        f"[gguf, {dtype}, name {name!r}]")  # fmt: skip
    start = time.perf_counter()
    planned = write_gguf(ref, read_weights(ref, torch.float32, progress), output, dtype, name,
                         progress)  # fmt: skip
    size = output.stat().st_size / 2**20
    return (
        f"wrote {output} ({size:,.1f} MiB, {len(planned)} tensors, {dtype}) in "
        f"{time.perf_counter() - start:.1f} s; run it: llama-cli -m {output} -p 'ROMEO:'"
    )
