"""ZeRO checkpoints -> Hugging Face / bare state dicts, and sampling from either.

The reference in each test is computed independently: DeepSpeed's own `zero_to_fp32.py` (the
copy it writes into the run directory, run as a script), a plain `GPT2LMHeadModel` holding its
output, the training run's own evaluation in metrics.jsonl, and tiktoken for the tokenizer.
One tiny 2-rank run per ZeRO stage, trained once per session (conftest.stage_run), is shared
with test_train.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from harness.launch import STAGE_RUN_ITERS, run_python
from support.launch import REPO

from gpt_ds.base.errors import CheckpointError
from gpt_ds.data.tokens import eval_windows, window_batch
from gpt_ds.export import hf as export
from gpt_ds.model.gpt2 import ModelShape, gpt2_config, unpadded
from gpt_ds.observe.metrics_file import read_metrics

TOOLS = REPO / "tools"
EVAL_ITERS, MICRO_BATCH, BLOCK = 4, 4, 64  # the stage runs' (support.launch.tiny_run_args)


# --------------------------------------------------------------------------- fixtures, helpers
@pytest.fixture(scope="module")
def trained(stage_run):
    """trained(stage) -> out dir of the session's 24-iteration 2-rank fp32 run of that stage."""
    return lambda stage: stage_run(stage)[0]


@pytest.fixture(scope="module")
def hf_export(trained, tmp_path_factory) -> Path:
    """The ZeRO-2 run exported (fp32, Hugging Face format) through the Python API."""
    out = tmp_path_factory.mktemp("export") / "hf"
    export.export_checkpoint(trained(2), out, progress=False, log=None)
    return out


def deepspeed_reference(out: Path, tmp: Path) -> dict[str, torch.Tensor]:
    """What DeepSpeed's own converter, the script it copies into the run dir, writes."""
    dest = tmp / "ds_zero_to_fp32"
    run_python([str(out / "zero_to_fp32.py"), str(out), str(dest), "--tag", "final"])
    return torch.load(dest / "pytorch_model.bin", weights_only=True)


def real_rows(state: dict[str, torch.Tensor], tokens: int) -> dict[str, torch.Tensor]:
    """`state` with the embedding and tied head cut to the tokenizer's rows (a run trained
    with a padded vocabulary; the padding rows are never predicted)."""
    cut = {"transformer.wte.weight", "lm_head.weight"}
    return {k: v[:tokens] if k in cut else v for k, v in state.items()}


def reference_model(out: Path, state: dict[str, torch.Tensor]):
    from transformers import GPT2LMHeadModel

    manifest = json.loads((out / "final" / "gpt_ds.json").read_text())
    model = GPT2LMHeadModel(gpt2_config(unpadded(ModelShape(**manifest["model"]))))
    model.load_state_dict(state, strict=True)
    return model.eval()


def load_hf(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path).eval()


def safetensors_state(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state = {}
    for f in sorted(folder.glob("*.safetensors")):
        state.update(load_file(f))
    return state


def val_batch(data_dir: Path):
    tokens = np.memmap(data_dir / "val.bin", dtype=np.uint16, mode="r")
    starts = eval_windows(len(tokens), BLOCK, EVAL_ITERS * MICRO_BATCH)
    return window_batch(tokens, starts, BLOCK)  # (12, 64) each


@torch.no_grad()
def val_loss(model, x, y) -> float:
    logits = model(input_ids=x).logits.float()
    return torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1)).item()


def tied(model) -> bool:
    return model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()


def _link_or_copy(src: str, dst: str) -> None:
    # weights are hard-linked (cheap; tests only delete them), small files copied (edited)
    (os.link if src.endswith(".pt") else shutil.copy2)(src, dst)


def linked_copy(src: Path, dst: Path) -> Path:
    """A cheap copy of a checkpoint directory that a test may mutilate."""
    shutil.copytree(src, dst, copy_function=_link_or_copy)
    return dst


def no_leftovers(output: Path) -> bool:
    """Neither the output nor a temporary sibling of it exists."""
    return not output.exists() and not list(output.parent.glob(f".{output.name}.*"))


# --------------------------------------------------------------------------- equivalence
@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_export_equals_deepspeed_zero_to_fp32(stage, trained, shakespeare_dir, tmp_path):
    out = trained(stage)
    dest = tmp_path / "hf"
    proc = run_python([str(TOOLS / "zero_to_fp32.py"), str(out), "--output", str(dest)])
    assert f"ZeRO-{stage}, world size 2" in proc.stdout and "peak RSS" in proc.stdout
    ref_state = deepspeed_reference(out, tmp_path)
    manifest = json.loads((out / "final" / "gpt_ds.json").read_text())
    shape = ModelShape(**manifest["model"])
    # trained with the default padded vocabulary: DeepSpeed's converter keeps the padding
    # rows, the export strips them (GPT-2's own shape)
    assert ref_state["transformer.wte.weight"].shape[0] == shape.vocab_size == 50304
    ref_state = real_rows(ref_state, shape.tokens)

    # tensor for tensor, DeepSpeed's fp32 weights (lm_head is wte: saved once, as HF does)
    exported = safetensors_state(dest)
    assert set(exported) == set(ref_state) - {"lm_head.weight"}
    for name, tensor in exported.items():
        assert tensor.dtype == torch.float32 and torch.equal(tensor, ref_state[name]), name
    assert torch.equal(ref_state["lm_head.weight"], ref_state["transformer.wte.weight"])

    config = json.loads((dest / "config.json").read_text())
    names = {"n_layer": "n_layer", "n_head": "n_head", "n_embd": "n_embd"}
    names |= {"block_size": "n_positions"}
    for ours, hf in names.items():
        assert config[hf] == manifest["model"][ours], hf
    assert config["vocab_size"] == shape.tokens == 50257 and "token_vocab_size" not in config
    # GPT-2's original key, which llama.cpp's convert_hf_to_gguf.py reads (issue 26)
    assert config["n_ctx"] == config["n_positions"] == manifest["model"]["block_size"]
    assert (dest / "generation_config.json").is_file()
    assert json.loads((dest / export.EXPORT_RECORD).read_text())["tag"] == "final"

    # Hugging Face loads it re-tied, with the reference's logits and the run's own val loss
    model, ref = load_hf(dest), reference_model(out, ref_state)
    assert tied(model)
    x, y = val_batch(shakespeare_dir)
    with torch.no_grad():
        assert torch.equal(model(input_ids=x).logits, ref(input_ids=x).logits)
    logged = [r for r in read_metrics(out) if "val_loss" in r][-1]
    assert logged["iter"] == STAGE_RUN_ITERS
    assert math.isclose(val_loss(model, x, y), logged["val_loss"], rel_tol=0, abs_tol=2e-5)


@pytest.mark.slow
def test_tokenizer_round_trips_like_tiktoken(hf_export):
    from transformers import AutoTokenizer

    from gpt_ds.data.tokenizer import get_encoding

    tok, enc = AutoTokenizer.from_pretrained(hf_export), get_encoding()
    assert len(tok) == 50257 and tok.eos_token_id == 50256 and tok.model_max_length == BLOCK
    texts = [
        "First Citizen:\nBefore we proceed any further, hear me speak.",
        "  leading spaces, tabs\t\tand trailing  \n\n",
        "ünïcödé, 日本語, emoji 🙂 and numbers 12345.678",
        "it's they're we'll I'd<|endoftext|>next document",
        "",
    ]
    for text in texts:
        ids = enc.encode(text, allowed_special="all")
        assert tok.encode(text) == ids, text
        assert tok.decode(ids) == text == enc.decode(ids)


@pytest.mark.slow
@pytest.mark.parametrize(("stage", "dtype"), [(2, "bf16"), (3, "fp16")])
def test_half_precision_export_is_the_fp32_weights_cast(stage, dtype, trained, tmp_path):
    out = trained(stage)
    export.export_checkpoint(out, tmp_path / "fp32", progress=False, log=None)
    export.export_checkpoint(out, tmp_path / dtype, dtype=dtype, progress=False, log=None)
    full, half = safetensors_state(tmp_path / "fp32"), safetensors_state(tmp_path / dtype)
    want = export.DTYPES[dtype]
    assert set(full) == set(half)
    for name in full:
        assert half[name].dtype == want and torch.equal(half[name], full[name].to(want)), name
    model = load_hf(tmp_path / dtype)
    assert model.dtype == want and tied(model)


@pytest.mark.slow
def test_sharded_export_loads(trained, hf_export, tmp_path):
    dest = tmp_path / "sharded"
    export.export_checkpoint(trained(2), dest, max_shard_size="5MB", progress=False, log=None)
    shards = sorted(dest.glob("model-*.safetensors"))
    index = json.loads((dest / "model.safetensors.index.json").read_text())
    assert len(shards) > 1 and set(index["weight_map"].values()) == {s.name for s in shards}
    assert not (dest / "model.safetensors").exists()
    model, whole = load_hf(dest), load_hf(hf_export)
    assert tied(model)
    x = torch.arange(32)[None]
    with torch.no_grad():
        assert torch.equal(model(input_ids=x).logits, whole(input_ids=x).logits)


@pytest.mark.slow
def test_bare_state_dict_formats(trained, hf_export, tmp_path):
    """safetensors: tied duplicate left out (recorded); pt: every name, tied ones shared."""
    from safetensors import safe_open
    from transformers import GPT2LMHeadModel

    reference = safetensors_state(hf_export)
    out = trained(2)  # ZeRO-2: parameters are views of one flat buffer until they are saved
    export.export_checkpoint(out, tmp_path / "st", fmt="safetensors", progress=False, log=None)
    state = safetensors_state(tmp_path / "st")
    assert set(state) == set(reference)
    assert all(torch.equal(state[k], reference[k]) for k in state)
    with safe_open(tmp_path / "st" / "model.safetensors", "pt") as f:
        assert json.loads(f.metadata()["tied"]) == {"lm_head.weight": "transformer.wte.weight"}

    dest = tmp_path / "pt"
    export.export_checkpoint(out, dest, fmt="pt", max_shard_size="5MB", progress=False, log=None)
    index = json.loads((dest / "pytorch_model.bin.index.json").read_text())
    state = {}
    for shard in sorted(set(index["weight_map"].values())):
        state.update(torch.load(dest / shard, weights_only=True))
    assert state["lm_head.weight"].data_ptr() == state["transformer.wte.weight"].data_ptr()
    model = GPT2LMHeadModel(gpt2_config(ModelShape(4, 4, 128, BLOCK)))
    model.load_state_dict(state, strict=True)
    assert all(torch.equal(state[k], reference[k]) for k in reference)
    # each shard holds its own tensors, not the whole flat buffer they were views of
    n_bytes = sum(t.numel() * 4 for k, t in state.items() if k != "lm_head.weight")
    on_disk = sum(p.stat().st_size for p in dest.glob("pytorch_model-*.bin"))
    assert n_bytes <= on_disk < n_bytes * 1.05


# --------------------------------------------------------------------------- refusals
@pytest.mark.slow
def test_bad_inputs_fail_before_any_work_and_write_nothing(
    trained, hf_export, tmp_path, monkeypatch
):
    run = linked_copy(trained(2), tmp_path / "run")
    (run / "iter_9").mkdir()  # a save that never finished: no manifest
    linked_copy(run / "final", run / "broken")
    manifest = json.loads((run / "broken" / "gpt_ds.json").read_text())
    (run / "broken" / "gpt_ds.json").write_text(json.dumps({**manifest, "tag": "broken"}))
    (run / "broken" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()

    def no_heavy_work(*_a, **_k):
        raise AssertionError("heavy work started before the inputs were checked")

    # the export's heavy work: reading the weights, and (a thread) config and tokenizer
    for heavy in ("read_weights", "write_model_files", "consolidate"):
        monkeypatch.setattr(export, heavy, no_heavy_work)
    output = tmp_path / "out"
    cases = [
        (dict(checkpoint=tmp_path / "nope"), "does not exist"),
        (
            dict(tag="iter_3"),
            f"--tag iter_3: no complete checkpoint with that tag in {run} "
            "(complete tags: iter_10, iter_20, broken, final)",
        ),
        (dict(tag="iter_9"), "incomplete checkpoint (no gpt_ds.json"),
        (dict(tag="broken"), "zero_pp_rank_1_mp_rank_00_optim_states.pt missing"),
        (dict(output=hf_export), "already holds a model (config.json"),
        (dict(output=run), "is the checkpoint directory or contains it"),
        (dict(dtype="fp8"), "--dtype 'fp8'"),
        (dict(max_shard_size="lots"), "--max_shard_size 'lots'"),
    ]
    for overrides, message in cases:
        kwargs = dict(checkpoint=run, output=output, progress=False, log=None) | overrides
        with pytest.raises(CheckpointError, match=message.replace("(", r"\(").replace(")", r"\)")):
            export.export_checkpoint(kwargs.pop("checkpoint"), kwargs.pop("output"), **kwargs)
        assert no_leftovers(output), overrides
    assert (hf_export / "model.safetensors").is_file()  # the refused output is untouched

    (run / "latest").write_text("iter_9")  # `latest` naming an incomplete tag
    with pytest.raises(CheckpointError, match="incomplete checkpoint"):
        export.export_checkpoint(run, output, progress=False, log=None)

    proc = run_python(
        [str(TOOLS / "zero_to_fp32.py"), str(tmp_path / "nope"), "--output", str(output)],
        check=False,
    )
    assert proc.returncode == 2 and proc.stderr.startswith("error: checkpoint directory")
    assert no_leftovers(output)


@pytest.mark.slow
def test_failure_while_writing_leaves_nothing_and_overwrite_replaces(
    trained, tmp_path, monkeypatch
):
    out, dest = trained(3), tmp_path / "hf"
    real_write = export.write_hf

    def failing_write(model, folder, max_shard_size):
        real_write(model, folder, max_shard_size)
        raise OSError("disk full (simulated)")

    with monkeypatch.context() as patch:
        patch.setattr(export, "write_hf", failing_write)
        with pytest.raises(OSError, match="simulated"):
            export.export_checkpoint(out, dest, progress=False, log=None)
    assert no_leftovers(dest)

    dest.mkdir()
    (dest / "config.json").write_text("{}")  # an old model in the way
    with pytest.raises(CheckpointError, match="--overwrite"):
        export.export_checkpoint(out, dest, progress=False, log=None)
    export.export_checkpoint(out, dest, overwrite=True, progress=False, log=None)
    assert load_hf(dest).config.n_positions == BLOCK
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


# --------------------------------------------------------------------------- sampling
@pytest.mark.slow
def test_sample_from_export_and_from_checkpoint(trained, hf_export):
    def sample(model: Path) -> str:
        args = ["--model", str(model), "--prompt", "ROMEO:", "--max_new_tokens", "12"]
        args += ["--temperature", "0", "--num_samples", "2", "--seed", "7"]
        return run_python([str(TOOLS / "sample.py"), *args]).stdout

    from_export, from_checkpoint = sample(hf_export), sample(trained(2))
    assert from_export == from_checkpoint  # greedy, same weights: identical text
    texts = from_export.split("-" * 40 + "\n")
    assert len(texts) == 3 and texts[-1] == "" and texts[0] == texts[1]
    assert texts[0].startswith("ROMEO:") and len(texts[0]) > len("ROMEO:\n")


@pytest.mark.slow
def test_sampling_is_seeded(hf_export):
    from gpt_ds.export.sampling import generate, load_model

    model = load_model(hf_export).model
    a, b, c = (generate(model, "KING:", 16, 1.0, 50, 2, seed=s) for s in (1, 1, 2))
    assert a == b and a != c and len(a) == 2
    with pytest.raises(CheckpointError, match="context"):
        generate(model, "word " * BLOCK, 4)
