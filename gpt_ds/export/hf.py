"""ZeRO checkpoint -> Hugging Face GPT-2 directory (or a bare safetensors / torch state dict).

The weights are located by DeepSpeed's own consolidation code (the steps of
`deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint`), which knows every
ZeRO stage, offload setting, world size and precision DeepSpeed writes. What this module adds
around it:

* checks first, before any heavy work: the checkpoint directory, the tag (no tag = the one
  `latest` names), completeness (the gpt_ds manifest and every file it lists, at its size and
  checksum, the files hashed in parallel), and an output directory that already holds
  something (`overwrite` to replace it);
* no copy of the model in host memory: the weights are read where they lie in the
  memory-mapped checkpoint files and streamed into the output (gpt_ds/export/stream.py);
* the run's real architecture (from the manifest) in `config.json`, tied input/output
  embeddings kept tied, the GPT-2 tokenizer from the packaged BPE files, written by a thread
  while the weights are (transformers is slow to import; writing releases the GIL);
* nothing half-written: everything goes into a temporary sibling directory that is renamed
  into place at the end, and removed on any error.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gpt_ds.base.errors import CheckpointError
from gpt_ds.base.processes import PeakSampler, peak_rss_gib, pid_alive
from gpt_ds.checkpoint.integrity import unverified_reason
from gpt_ds.checkpoint.tags import CheckpointRef, resolve
from gpt_ds.export.stream import (
    Weights,
    progress_bar,
    quick_gil_handover,
    read_weights,
    split_shards,
    write_safetensors_shards,
)
from gpt_ds.model.gpt2 import gpt2_config, unpadded

FORMATS = ("hf", "safetensors", "pt")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
EXPORT_RECORD = "gpt_ds_export.json"
# files whose presence means "this directory already holds a model"
_MODEL_FILE = re.compile(
    r"^(config\.json|.*\.safetensors|.*\.bin|.*\.pt|.*\.index\.json|tokenizer\.json)$"
)
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_UNITS.update({"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40})


# --------------------------------------------------------------------------- the checkpoint
def resolve_checkpoint(
    path: str | Path, tag: str | None = None, allow_unverified: bool = False
) -> CheckpointRef:
    """The checkpoint to export: `path` is a run's out dir (with `tag`, else the one `latest`
    names) or a tag directory itself. Checked (complete, every file at its recorded size and
    checksum, not a universal checkpoint) before any heavy work; loads no weights. One with no
    checksums is refused unless `allow_unverified`, then said to be unverified."""
    ref = resolve(path, tag, flag="--tag", verify=True, allow_unverified=allow_unverified)
    if why := unverified_reason(ref.manifest):
        print(f"warning: {ref.tag_dir} is unverified: {why}", file=sys.stderr)
    if ref.manifest.universal:
        raise CheckpointError(
            f"{ref.tag_dir} is a universal checkpoint (made to resume on another world size); "
            f"export the tag it was made from, {ref.manifest.source_tag!r}"
        )
    return ref


def describe_model(ref: CheckpointRef, dtype: torch.dtype = torch.float32):
    """The run's `GPT2LMHeadModel` on the `meta` device: names, config, no weights."""
    from transformers import GPT2LMHeadModel

    shape = unpadded(ref.manifest.shape)  # GPT-2's own shape: vocabulary padding stripped
    model_config = gpt2_config(shape, float(ref.manifest.config.get("dropout") or 0.0))
    with torch.device("meta"):
        model = GPT2LMHeadModel(model_config)
    model.config.dtype = dtype
    return model


def check_names(weights: Weights, model) -> None:
    """The checkpoint holds exactly the model's tensors, at the model's shapes."""
    expected = {n: tuple(t.shape) for n, t in model.state_dict().items()}
    found = {n: tuple(t.shape) for n, t in weights.tensors.items()}
    if found != expected:
        missing, extra = sorted(expected.keys() - found), sorted(found.keys() - expected)
        resized = sorted(n for n in expected.keys() & found if expected[n] != found[n])
        raise CheckpointError(
            f"{weights.ref.tag_dir}: weights do not match GPT-2 of shape "
            f"{weights.ref.manifest.shape} (missing {missing[:5]}, unexpected {extra[:5]}, "
            f"other shapes {resized[:5]})"
        )


# --------------------------------------------------------------------------- consolidation
def _own_storage(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor`, or for a view into a larger buffer, the same memory under a storage of its own.

    Parameters come back as views of a rank's memory-mapped partition. Savers treat tensors
    that share a storage as aliases: `save_pretrained` clones each (a copy of the model) and
    `torch.save` writes the whole buffer for each. Re-wrapping the view through DLPack copies
    nothing; the new storage keeps the buffer alive for as long as it lives.
    """
    if tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size():
        return tensor
    return torch.from_dlpack(tensor.detach())


@torch.no_grad()
def consolidate(ref: CheckpointRef, dtype: torch.dtype = torch.float32, progress: bool = True):
    """A `GPT2LMHeadModel` (eval mode, on CPU) holding the checkpoint's consolidated weights.

    fp32 weights are DeepSpeed's fp32 master weights bit for bit; other dtypes are them cast.
    fp32 ZeRO-1/2 parameters are views of the memory-mapped checkpoint files (copy on write).
    """
    from tqdm import tqdm

    model = describe_model(ref, dtype)
    weights = read_weights(ref, dtype)
    check_names(weights, model)
    state: dict[str, torch.Tensor] = {}
    done: dict[int, torch.Tensor] = {}  # id(lazy tensor) -> tensor: tied names share one
    for name in tqdm(
        list(weights.tensors), desc="consolidating", unit="tensor", disable=not progress
    ):
        lazy = weights.tensors.pop(name)
        if id(lazy) not in done:
            done[id(lazy)] = _own_storage(weights.read(lazy))
        state[name] = done[id(lazy)]
    del weights, done
    model.load_state_dict(state, strict=True, assign=True)
    del state
    model.tie_weights()  # assign=True gave lm_head its own Parameter object over wte's storage
    if model.lm_head.weight is not model.transformer.wte.weight:
        raise CheckpointError(f"{ref.tag_dir}: lm_head and wte could not be tied")
    return model.eval()


# --------------------------------------------------------------------------- writing
def parse_size(text: str | int) -> int:
    """'2GB' -> 2_000_000_000 (decimal units as Hugging Face uses; KiB/MiB/GiB binary)."""
    if isinstance(text, int):
        return text
    m = _SIZE.match(str(text))
    if not m or float(m.group(1)) <= 0:
        raise CheckpointError(f"--max_shard_size {text!r}: expected a size such as 500MB or 2GB")
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "B").upper()])


def gpt2_tokenizer(model_max_length: int | None = None):
    """`GPT2TokenizerFast` built from the packaged vocab.bpe/encoder.json (no network).

    transformers 5 ignores `vocab_file=`/`merges_file=` (it builds a 1-token tokenizer without
    a word), so the vocabulary and merges are passed as objects and the size is checked.
    """
    from transformers import GPT2TokenizerFast

    from gpt_ds.data.tokenizer import VOCAB_SIZE, assets_dir, tokenizer_fingerprint

    tokenizer_fingerprint()
    folder = assets_dir()
    vocab = json.loads((folder / "encoder.json").read_text(encoding="utf-8"))
    lines = (folder / "vocab.bpe").read_text(encoding="utf-8").split("\n")
    merges = [tuple(line.split()) for line in lines[1:] if line]  # line 0: "#version: 0.2"
    tok = GPT2TokenizerFast(vocab=vocab, merges=merges)
    if len(tok) != VOCAB_SIZE:
        raise CheckpointError(f"GPT-2 tokenizer has {len(tok)} tokens, expected {VOCAB_SIZE}")
    if model_max_length:
        tok.model_max_length = model_max_length
    return tok


def _holds_model(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if _MODEL_FILE.match(p.name))


def check_output(output: Path, overwrite: bool, ref: CheckpointRef | None = None) -> None:
    """Refuse an output that exists and is not empty (unless `overwrite`), or that is the
    checkpoint (or holds it)."""
    output = output.resolve()
    if ref is not None:
        src = ref.out_dir.resolve()
        if output == src or output in src.parents:
            raise CheckpointError(
                f"--output {output} is the checkpoint directory or contains it; choose another"
            )
    if output.exists() and not output.is_dir():
        raise CheckpointError(f"--output {output} exists and is not a directory")
    if output.is_dir() and any(output.iterdir()) and not overwrite:
        found = _holds_model(output)
        what = f"already holds a model ({', '.join(found[:4])})" if found else "is not empty"
        raise CheckpointError(f"--output {output} {what}; pass --overwrite to replace it")


@contextlib.contextmanager
def staged_output(output: Path):
    """Yield a temporary sibling of `output`; on success it replaces `output`, on error it goes."""
    output = output.resolve()
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(f"--output {output}: cannot create its parent: {exc}") from exc
    for stale in output.parent.glob(f".{output.name}.tmp-*"):  # left by a killed export
        if not pid_alive(stale.name.rsplit("-", 1)[-1]):
            shutil.rmtree(stale, ignore_errors=True)
    tmp = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    tmp.mkdir()
    try:
        yield tmp
        old = output.with_name(f".{output.name}.old-{os.getpid()}")
        if output.exists():
            os.replace(output, old)
        os.replace(tmp, output)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write_torch_shards(weights: Weights, folder: Path, max_shard_size: int):
    """`pytorch_model{suffix}.bin` shards, tied names saved once beside their target; returns
    (the split, the weight map with the tied names)."""
    unique, aliases = weights.unique()
    split = split_shards(unique, weights.dtype, "pytorch_model{suffix}.bin", max_shard_size)
    weight_map = dict(split.tensor_to_filename)
    with progress_bar(len(unique), weights.progress) as bar:
        for shard, names in split.filename_to_tensors.items():
            shard_state = {n: _own_storage(weights.read(unique[n])) for n in names}
            for alias, target in aliases.items():
                if target in shard_state:
                    shard_state[alias] = shard_state[target]  # saved once, as in the model
                    weight_map[alias] = shard
            torch.save(shard_state, folder / shard)
            bar.update(len(names))
            del shard_state
    return split, weight_map


def write_state_dict(weights: Weights, folder: Path, fmt: str, max_shard_size: int) -> list[str]:
    """A bare state dict: `model.safetensors` (tied duplicates left out, as Hugging Face does;
    recorded in the metadata) or `pytorch_model.bin` (all names, tied ones sharing storage),
    sharded with an index json past `max_shard_size`. Returns the files written."""
    if fmt == "safetensors":
        meta = {"format": "pt", "tied": json.dumps(weights.unique()[1])}
        split = write_safetensors_shards(weights, folder, meta, max_shard_size)
        weight_map, index_name = dict(split.tensor_to_filename), "model.safetensors.index.json"
    else:
        split, weight_map = _write_torch_shards(weights, folder, max_shard_size)
        index_name = "pytorch_model.bin.index.json"
    if split.is_sharded:
        index = {"metadata": split.metadata, "weight_map": dict(sorted(weight_map.items()))}
        (folder / index_name).write_text(json.dumps(index, indent=2) + "\n")
    return sorted(p.name for p in folder.iterdir())


def write_hf(weights: Weights, folder: Path, max_shard_size: int) -> None:
    """The weights as `save_pretrained` writes them: `model.safetensors` without the tied
    lm_head (or shards and `model.safetensors.index.json`), metadata {"format": "pt"}."""
    split = write_safetensors_shards(weights, folder, {"format": "pt"}, max_shard_size)
    if split.is_sharded:
        total = unpadded(weights.ref.manifest.shape).num_params()  # tied embeddings once
        index = {
            "metadata": {"total_parameters": total, **split.metadata},
            "weight_map": split.tensor_to_filename,
        }
        text = json.dumps(index, indent=2, sort_keys=True) + "\n"
        (folder / "model.safetensors.index.json").write_text(text)


def write_model_files(ref: CheckpointRef, dtype: torch.dtype, fmt: str, folder: Path):
    """config.json; for `hf` also generation_config.json and the tokenizer, as `save_pretrained`
    writes them. Returns the model on `meta` (its names check the weights)."""
    from gpt_ds.data.tokenizer import assets_dir

    model = describe_model(ref, dtype)
    # GPT-2's original context key, which transformers 5 no longer writes: llama.cpp's
    # convert_hf_to_gguf.py reads it (KeyError: 'n_ctx' without); transformers ignores it
    model.config.n_ctx = model.config.n_positions
    if fmt != "hf":
        model.config.save_pretrained(folder)
        return model
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(folder)
    model.generation_config.save_pretrained(folder)
    gpt2_tokenizer(model.config.n_positions).save_pretrained(folder)
    # the original GPT-2 file names too, for tools that read them instead of tokenizer.json
    shutil.copyfile(assets_dir() / "encoder.json", folder / "vocab.json")
    shutil.copyfile(assets_dir() / "vocab.bpe", folder / "merges.txt")
    return model


@dataclass
class ExportResult:
    output: Path
    ref: CheckpointRef
    files: dict[str, int]
    seconds: float
    peak_rss_gib: float
    peak_anon_gib: float | None


def _record(ref: CheckpointRef, fmt: str, dtype: str) -> dict[str, Any]:
    m = ref.manifest
    return {
        "source": str(ref.tag_dir.resolve()),
        "tag": ref.tag,
        "iteration": m.iteration,
        "zero_stage": m.zero_stage,
        "world_size": m.world_size,
        "trained_precision": m.precision,
        "val_loss": m.val_loss,
        "format": fmt,
        "dtype": dtype,
    }


def export_checkpoint(
    checkpoint: str | Path,
    output: str | Path,
    *,
    tag: str | None = None,
    fmt: str = "hf",
    dtype: str = "fp32",
    max_shard_size: str | int = "2GB",
    overwrite: bool = False,
    progress: bool = True,
    log=print,
    allow_unverified: bool = False,
) -> ExportResult:
    """Convert one checkpoint tag into `output` (see the module docstring)."""
    start = time.perf_counter()
    if fmt not in FORMATS:
        raise CheckpointError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if dtype not in DTYPES:
        raise CheckpointError(f"--dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    shard_bytes = parse_size(max_shard_size)
    ref = resolve_checkpoint(checkpoint, tag, allow_unverified)
    output = Path(output)
    check_output(output, overwrite, ref)
    m = ref.manifest
    log = log or (lambda _msg: None)
    log(
        f"exporting {ref.tag_dir} (iteration {m.iteration}, ZeRO-{m.zero_stage}, "
        f"world size {m.world_size}, trained in {m.precision}) "
        f"-> {output} [{fmt}, {dtype}]"
    )
    # RSS also counts the checkpoint files memory-mapped here: clean page cache the kernel can
    # drop at will. The anonymous part, sampled, is the memory the conversion really needs.
    with (
        PeakSampler("RssAnon") as anon,
        staged_output(output) as tmp,
        ThreadPoolExecutor(1) as pool,
    ):
        weights = read_weights(ref, DTYPES[dtype], progress)
        # config and tokenizer (mostly importing transformers, which holds the GIL) while the
        # weights are written (which releases it)
        with quick_gil_handover():
            model_files = pool.submit(write_model_files, ref, DTYPES[dtype], fmt, tmp)
            if fmt == "hf":
                write_hf(weights, tmp, shard_bytes)
            else:
                write_state_dict(weights, tmp, fmt, shard_bytes)
            model = model_files.result()
        check_names(weights, model)
        del weights
        (tmp / EXPORT_RECORD).write_text(json.dumps(_record(ref, fmt, dtype), indent=2) + "\n")
        files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir())}
    return ExportResult(
        output=output.resolve(),
        ref=ref,
        files=files,
        seconds=time.perf_counter() - start,
        peak_rss_gib=peak_rss_gib(),
        peak_anon_gib=None if anon.peak_bytes is None else anon.peak_bytes / 2**30,
    )


def export_summary(result: ExportResult) -> str:
    total = sum(result.files.values())
    lines = [f"wrote {result.output} ({len(result.files)} files, {total / 1e6:.1f} MB):"]
    lines += [f"  {name}  {size:,} bytes" for name, size in result.files.items()]
    n = unpadded(result.ref.manifest.shape).num_params()
    anon = (
        f" (anonymous memory {result.peak_anon_gib:.2f} GiB; RSS also counts the checkpoint "
        "files memory-mapped, page cache the kernel can reclaim)"
        if result.peak_anon_gib is not None
        else ""
    )
    lines.append(f"model: {n:,} parameters, {n * 4 / 2**30:.2f} GiB in fp32")
    lines.append(f"peak RSS {result.peak_rss_gib:.2f} GiB{anon}")
    lines.append(f"elapsed {result.seconds:.1f} s")
    return "\n".join(lines)
