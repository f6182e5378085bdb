"""A ZeRO checkpoint's weights read where they lie, and streamed into safetensors files.

The weights are located by DeepSpeed's own consolidation code (the steps of
`deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint`), which knows every
ZeRO stage, offload setting, world size and precision DeepSpeed writes, but with no copy of the
model in host memory: every checkpoint file is memory-mapped, and each tensor is written (or
assigned to its parameter) from where it lies. DeepSpeed would first concatenate the ranks'
ZeRO-1/2 partitions into one flat fp32 copy of the model (and read the whole module state to
keep its buffers); here its layout code runs on `meta` tensors to learn each parameter's
offset, and the parameter is read from the one or two rank partitions holding it. ZeRO-3
tensors are gathered one at a time by DeepSpeed's lazy tensors. Safetensors files are
streamed, one tensor in memory at a time.
"""

from __future__ import annotations

import contextlib
import json
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gpt_ds.base.errors import CheckpointError
from gpt_ds.checkpoint.tags import CheckpointRef

# safetensors' names, in the order of its Rust `Dtype` enum (it sorts a file's tensors by it)
_SAFETENSORS_DTYPES = {
    torch.bool: "BOOL",
    torch.uint8: "U8",
    torch.int8: "I8",
    torch.int16: "I16",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int32: "I32",
    torch.float32: "F32",
    torch.float64: "F64",
    torch.int64: "I64",
}
_DTYPE_RANK = {dt: i for i, dt in enumerate(_SAFETENSORS_DTYPES)}


class FlatSlice:
    """One ZeRO-1/2 parameter where the checkpoint holds it: `shape.numel()` elements from
    `offset` of a parameter group's flat fp32 vector, stored as one partition per rank.

    DeepSpeed concatenates the partitions (a copy of the whole model) and takes views of the
    result; reading the one or two partitions a parameter spans copies nothing (one parameter,
    for the one straddling two ranks)."""

    def __init__(self, parts: list[torch.Tensor], offset: int, shape: torch.Size) -> None:
        self.parts, self.offset, self.shape = parts, offset, shape
        self.dtype = parts[0].dtype

    def contiguous(self) -> torch.Tensor:
        start, end = self.offset, self.offset + self.shape.numel()
        pieces, pos = [], 0
        for part in self.parts:
            lo, hi = max(start, pos), min(end, pos + part.numel())
            if lo < hi:
                pieces.append(part.detach()[lo - pos : hi - pos])
            pos += part.numel()
        if len(pieces) == 1:
            return pieces[0].view(self.shape)
        return torch.cat(pieces or [torch.empty(0, dtype=self.dtype)]).view(self.shape)


@contextlib.contextmanager
def _mmap_loads() -> Iterator[None]:
    """`torch.load` memory-maps by default: DeepSpeed's `parse_model_states` reads the whole
    module state (for ZeRO-1/2 a copy of the weights) to keep only its buffers."""
    from torch.utils.serialization import config

    before, config.load.mmap = config.load.mmap, True
    try:
        yield
    finally:
        config.load.mmap = before


class _MetaPartition(torch.Tensor):
    """A `meta` stand-in for a rank's partition whose `torch.cat` is a new `meta` tensor of the
    total size: the `meta` kernel of `cat` would import torch._dynamo (a second, and more at
    exit)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.cat:
            parts = args[0]
            numel = sum(p.numel() for p in parts)
            return torch.empty(numel, dtype=parts[0].dtype, device="meta")
        return super().__torch_function__(func, types, args, kwargs or {})


def _zero12_tensors(world: int, groups: list, model_states: list, paddings) -> dict[str, Any]:
    """DeepSpeed's ZeRO-1/2 consolidation run on `meta` partitions (its layout: each parameter's
    offset, alignment padding, the sanity check, shared parameters), mapped back to the real
    partitions as `FlatSlice`s."""
    from deepspeed.utils import zero_to_fp32 as ds

    meta = [
        [torch.empty_like(g, device="meta").as_subclass(_MetaPartition) for g in rank]
        for rank in groups
    ]
    layout = ds._get_fp32_state_dict_from_zero2_checkpoint(
        world, meta, model_states, False, paddings
    )
    group_of = {n: i for i, shapes in enumerate(model_states[0].param_shapes) for n in shapes}
    slices: dict[int, FlatSlice] = {}  # id(meta view) -> its slice: tied names share one
    tensors: dict[str, Any] = {}
    for name, t in layout.items():
        if t.device.type != "meta":  # buffers and frozen parameters: tensors already
            tensors[name] = t
            continue
        if id(t) not in slices:
            parts = [rank[group_of[name]] for rank in groups]
            slices[id(t)] = FlatSlice(parts, t.storage_offset(), t.shape)
        tensors[name] = slices[id(t)]
    return tensors


def _deepspeed_tensors(tag_dir: Path) -> dict[str, Any]:
    """name -> lazy tensor (`.shape`, `.dtype`, `.contiguous()`), by the steps of DeepSpeed's
    `_get_fp32_state_dict_from_zero_checkpoint` with every file memory-mapped."""
    from deepspeed.utils import zero_to_fp32 as ds

    d = str(tag_dir)
    with _mmap_loads():
        model_states = ds.parse_model_states(ds.get_model_state_files(d))
    stage, world, groups, paddings = ds.parse_optim_states(ds.get_optim_files(d), d)
    if stage <= 2:
        return _zero12_tensors(world, groups, model_states, paddings)
    return ds._get_fp32_state_dict_from_zero3_checkpoint(world, groups, model_states, False)


class RowSlice:
    """The first `rows` rows of a lazy tensor: the tokenizer's rows of a padded embedding
    (model.padded_vocab), so the export is GPT-2's own shape. A view: nothing is copied."""

    def __init__(self, lazy: Any, rows: int) -> None:
        self.lazy, self.rows = lazy, rows
        self.shape = torch.Size([rows, *lazy.shape[1:]])
        self.dtype = lazy.dtype

    def contiguous(self) -> torch.Tensor:
        return self.lazy.contiguous()[: self.rows]


def strip_vocab_padding(tensors: dict[str, Any], tokens: int) -> dict[str, Any]:
    """`tensors` with the embedding and the tied head cut to `tokens` rows (tied names keep
    sharing one object)."""
    cut: dict[int, RowSlice] = {}
    out = dict(tensors)
    for name in ("transformer.wte.weight", "lm_head.weight"):
        lazy = tensors.get(name)
        if lazy is not None and lazy.shape[0] > tokens:
            out[name] = cut.setdefault(id(lazy), RowSlice(lazy, tokens))
    return out


@dataclass
class Weights:
    """A checkpoint's consolidated weights, not yet read: name -> lazy tensor (a `FlatSlice`,
    DeepSpeed's ZeRO-3 `GatheredTensor`, or a tensor); tied names map to one object."""

    ref: CheckpointRef
    tensors: dict[str, Any]
    dtype: torch.dtype = torch.float32
    progress: bool = False  # a progress bar while writing

    def unique(self) -> tuple[dict[str, Any], dict[str, str]]:
        """The tensors without tied duplicates, and {duplicate: the name it aliases}."""
        unique, aliases = {}, {}
        first: dict[int, str] = {}  # id of a lazy tensor -> the first name it has
        for name, lazy in self.tensors.items():
            if id(lazy) in first:
                aliases[name] = first[id(lazy)]
            else:
                first[id(lazy)] = name
                unique[name] = lazy
        return unique, aliases

    @torch.no_grad()
    def read(self, lazy: Any) -> torch.Tensor:
        """One tensor in memory (a view of the checkpoint file where it can be), in `dtype`."""
        tensor = lazy.contiguous().detach()
        if tensor.is_floating_point() and tensor.dtype != self.dtype:
            tensor = tensor.to(self.dtype)
        return tensor


@torch.no_grad()  # DeepSpeed's saved partitions require grad: views would too
def read_weights(
    ref: CheckpointRef, dtype: torch.dtype = torch.float32, progress: bool = False
) -> Weights:
    """The checkpoint's weights located (files memory-mapped, nothing read yet)."""
    # DeepSpeed prints (and logs, to stdout) as it goes: keep stdout for our own output
    with contextlib.redirect_stdout(sys.stderr):
        try:
            tensors = _deepspeed_tensors(ref.tag_dir)
            tensors = strip_vocab_padding(tensors, ref.manifest.shape.tokens)
            return Weights(ref, tensors, dtype, progress)
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            raise CheckpointError(f"{ref.tag_dir}: DeepSpeed cannot read it: {exc}") from exc


def _out_dtype(lazy: Any, dtype: torch.dtype) -> torch.dtype:
    return dtype if lazy.dtype.is_floating_point else lazy.dtype


def write_safetensors(
    path: Path, tensors: dict[str, Any], weights: Weights, metadata: dict[str, str], bar=None
) -> None:
    """`tensors` (lazy) as one safetensors file, read and written one at a time.

    The layout of `safetensors.torch.save_file` (byte for byte): a little-endian u64 header
    size, the JSON header (each tensor's dtype, shape and byte range; sorted by dtype, then
    name) padded with spaces to 8 bytes, then the data. `save_file` needs every tensor in
    memory at once and holds the GIL while it writes; this needs one, and releases it.
    """
    order = sorted(tensors, key=lambda n: (-_DTYPE_RANK[_out_dtype(tensors[n], weights.dtype)], n))
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for name in order:
        lazy = tensors[name]
        dtype = _out_dtype(lazy, weights.dtype)
        end = offset + lazy.shape.numel() * dtype.itemsize
        header[name] = {
            "dtype": _SAFETENSORS_DTYPES[dtype],
            "shape": list(lazy.shape),
            "data_offsets": [offset, end],
        }
        offset = end
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for name in order:
            tensor = weights.read(tensors[name])
            # the tensor's bytes, no copy (numpy's stubs give ndarray the buffer protocol only
            # from Python 3.12 on)
            f.write(tensor.reshape(-1).view(torch.uint8).numpy())  # type: ignore[arg-type]
            del tensor
            if bar is not None:
                bar.update()


def progress_bar(total: int, progress: bool):
    """The writing progress bar (tqdm), or a silent one."""
    from tqdm import tqdm

    return tqdm(total=total, desc="writing", unit="tensor", disable=not progress)


def write_safetensors_shards(
    weights: Weights, folder: Path, metadata: dict[str, str], max_shard_size: int
):
    """The weights without tied duplicates as safetensors shards, `model{suffix}.safetensors`
    (Hugging Face's split); returns the split for the index."""
    unique, _ = weights.unique()
    split = split_shards(unique, weights.dtype, "model{suffix}.safetensors", max_shard_size)
    with progress_bar(len(unique), weights.progress) as bar:
        for shard, names in split.filename_to_tensors.items():
            shard_tensors = {n: unique[n] for n in names}
            write_safetensors(folder / shard, shard_tensors, weights, metadata, bar)
    return split


def split_shards(tensors: dict[str, Any], dtype: torch.dtype, pattern: str, max_shard_size: int):
    """Hugging Face's sharding of `tensors` (as `meta` tensors of the output dtype)."""
    from huggingface_hub import split_torch_state_dict_into_shards

    sizes = {
        n: torch.empty(t.shape, dtype=_out_dtype(t, dtype), device="meta")
        for n, t in tensors.items()
    }
    return split_torch_state_dict_into_shards(
        sizes, filename_pattern=pattern, max_shard_size=max_shard_size
    )


@contextlib.contextmanager
def quick_gil_handover(seconds: float = 0.0005) -> Iterator[None]:
    """A shorter GIL switch interval (default 5 ms) while a thread imports transformers: the
    writer takes the GIL back after each tensor's write, and waited up to 5 ms each time."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(before)
