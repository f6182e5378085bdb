"""`gpt-ds-export --format gguf`: the file read back with gguf's own GGUFReader against the
Hugging Face export of the same checkpoint (every tensor in llama.cpp's layout, f32 exact, f16
and bf16 the casts, q8_0 within its quantization step), the metadata llama.cpp's GPT-2
converter writes, and the refusals. llama.cpp itself converts and runs these files by hand
(docs/export.md "Run it with llama.cpp"), not here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from harness.launch import run_python
from helpers.messages import assert_names
from safetensors.torch import load_file
from support.launch import REPO, launch_env

gguf = pytest.importorskip("gguf", reason="the gguf extra: pip install 'gpt_ds[gguf]'")

pytestmark = pytest.mark.slow
TOOL = REPO / "tools" / "zero_to_fp32.py"
# checkpoint name -> (GGUF name, transposed): llama.cpp's GPT-2 names (conversion/gpt2.py)
LAYER = {
    "ln_1.weight": ("attn_norm.weight", False),
    "ln_1.bias": ("attn_norm.bias", False),
    "attn.c_attn.weight": ("attn_qkv.weight", True),
    "attn.c_attn.bias": ("attn_qkv.bias", False),
    "attn.c_proj.weight": ("attn_output.weight", True),
    "attn.c_proj.bias": ("attn_output.bias", False),
    "ln_2.weight": ("ffn_norm.weight", False),
    "ln_2.bias": ("ffn_norm.bias", False),
    "mlp.c_fc.weight": ("ffn_up.weight", True),
    "mlp.c_fc.bias": ("ffn_up.bias", False),
    "mlp.c_proj.weight": ("ffn_down.weight", True),
    "mlp.c_proj.bias": ("ffn_down.bias", False),
}
TOP = {
    "transformer.wte.weight": "token_embd.weight",
    "transformer.wpe.weight": "position_embd.weight",
    "transformer.ln_f.weight": "output_norm.weight",
    "transformer.ln_f.bias": "output_norm.bias",
}


def gguf_name(hf: str) -> tuple[str, bool]:
    if hf in TOP:
        return TOP[hf], False
    _, _, layer, rest = hf.split(".", 3)  # transformer.h.N.rest
    name, transposed = LAYER[rest]
    return f"blk.{layer}.{name}", transposed


@pytest.fixture(scope="module")
def exported(stage_run, tmp_path_factory):
    """(HF export's tensors, {dtype: .gguf path}) of the session's ZeRO-2 run."""
    out, folder = stage_run(2)[0], tmp_path_factory.mktemp("gguf")
    run_python([str(TOOL), str(out), "--output", str(folder / "hf"), "--quiet"])
    files = {}
    for dtype in ("fp32", "fp16", "bf16", "q8_0"):
        files[dtype] = folder / f"tiny-{dtype}.gguf"
        args = ["--format", "gguf", "--dtype", dtype, "--output", str(files[dtype]), "--quiet"]
        proc = run_python([str(TOOL), str(out), *args])
        assert f"wrote {files[dtype]}" in proc.stdout and "llama-cli -m" in proc.stdout
    return load_file(folder / "hf" / "model.safetensors"), files, out


def tensors(path: Path) -> dict[str, tuple[str, np.ndarray]]:
    reader = gguf.GGUFReader(path)
    return {t.name: (t.tensor_type.name, np.array(t.data)) for t in reader.tensors}


def fields(path: Path) -> dict:
    reader = gguf.GGUFReader(path)
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def test_every_tensor_is_the_hf_exports_in_llama_cpps_layout(exported):
    hf, files, _ = exported
    got = tensors(files["fp32"])
    assert set(got) == {gguf_name(n)[0] for n in hf}  # the tied head left out, as llama.cpp
    for name, tensor in hf.items():
        gname, transposed = gguf_name(name)
        kind, data = got[gname]
        want = (tensor.t() if transposed else tensor).contiguous().numpy()
        assert kind == "F32" and data.shape == want.shape and np.array_equal(data, want), name
    assert got["token_embd.weight"][1].shape[0] == 50257  # the vocabulary padding stripped


def test_half_types_are_the_casts_and_norms_biases_positions_stay_f32(exported):
    hf, files, _ = exported
    for dtype, torch_dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        got = tensors(files[dtype])
        for name, tensor in hf.items():
            gname, transposed = gguf_name(name)
            kind, data = got[gname]
            want = (tensor.t() if transposed else tensor).contiguous()
            if tensor.dim() == 1 or gname.startswith("position_embd"):
                assert kind == "F32" and np.array_equal(data, want.numpy()), gname
                continue
            assert kind == ("F16" if dtype == "fp16" else "BF16"), gname
            raw = torch.from_numpy(np.ascontiguousarray(data)).view(torch_dtype)
            assert torch.equal(raw.reshape(want.shape), want.to(torch_dtype)), gname


def test_q8_0_is_within_its_quantization_step(exported):
    hf, files, _ = exported
    got = tensors(files["q8_0"])
    for name, tensor in hf.items():
        gname, transposed = gguf_name(name)
        kind, data = got[gname]
        want = (tensor.t() if transposed else tensor).contiguous().numpy()
        if tensor.dim() == 1 or gname.startswith("position_embd"):
            assert kind == "F32", gname
            continue
        assert kind == "Q8_0", gname
        back = gguf.quants.dequantize(data, gguf.GGMLQuantizationType.Q8_0).reshape(want.shape)
        blocks = np.abs(want).reshape(-1, 32).max(axis=1)  # each 32 values share one scale
        err = np.abs(back - want).reshape(-1, 32).max(axis=1)
        assert np.all(err <= blocks / 127 * 0.5 + 1e-3 * blocks + 1e-8), gname
    assert files["q8_0"].stat().st_size < 0.4 * files["fp32"].stat().st_size


def test_the_metadata_is_llama_cpps_gpt2_converters(exported):
    _, files, out = exported
    meta = fields(files["q8_0"])
    manifest = json.loads((out / "final" / "gpt_ds.json").read_text())["model"]
    assert meta["general.architecture"] == "gpt2" and meta["general.type"] == "model"
    assert meta["general.name"] == out.name  # the run directory's, not the output folder's
    assert meta["general.file_type"] == int(gguf.LlamaFileType.MOSTLY_Q8_0)
    assert meta["general.quantization_version"] == gguf.GGML_QUANT_VERSION
    assert meta["gpt2.context_length"] == manifest["block_size"]
    assert meta["gpt2.embedding_length"] == manifest["n_embd"]
    assert meta["gpt2.feed_forward_length"] == 4 * manifest["n_embd"]
    assert meta["gpt2.block_count"] == manifest["n_layer"]
    assert meta["gpt2.attention.head_count"] == manifest["n_head"]
    assert meta["gpt2.attention.layer_norm_epsilon"] == pytest.approx(1e-5)
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "gpt-2"
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    assert len(tokens) == len(types) == 50257
    assert tokens[50256] == "<|endoftext|>" and tokens[464] == "The"
    assert types[50256] == gguf.TokenType.CONTROL and set(types[:50256]) == {1}
    merges = meta["tokenizer.ggml.merges"]
    assert len(merges) == 50000 and merges[0] == "Ġ t"
    for key in ("bos", "eos", "unknown"):
        assert meta[f"tokenizer.ggml.{key}_token_id"] == 50256, key


def test_bad_gguf_requests_are_refused_before_any_work(exported, tmp_path):
    _, files, out = exported

    def fails(*args: str) -> str:
        proc = subprocess.run([sys.executable, str(TOOL), str(out), *args], cwd=REPO,
                              env=launch_env(), capture_output=True, text=True)  # fmt: skip
        assert proc.returncode == 2, proc.stdout + proc.stderr
        return proc.stderr

    gguf_out = str(tmp_path / "m.gguf")
    # each names the flag at fault and the fix or the format it needs
    said = fails("--format", "gguf", "--output", str(tmp_path))
    assert_names(said, f"--output {tmp_path}", "NAME.gguf")
    said = fails("--format", "gguf", "--output", str(files["fp32"]))
    assert_names(said, f"--output {files['fp32']}", "--overwrite")
    assert_names(fails("--dtype", "q8_0", "--output", gguf_out), "--dtype q8_0", "--format gguf")
    assert not (tmp_path / "m.gguf").exists()


def test_without_the_gguf_package_it_says_how_to_install_it(exported, tmp_path):
    _, _, out = exported
    hide = (
        "import sys; sys.modules['gguf'] = None; sys.argv = sys.argv[1:]; "
        "from gpt_ds.commands.export import main; sys.exit(main())"
    )
    cmd = [sys.executable, "-c", hide, "export", str(out), "--format", "gguf", "--output",
           str(tmp_path / "m.gguf")]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=launch_env(), capture_output=True, text=True)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert_names(proc.stderr, "--format gguf", "pip install 'gpt_ds[gguf]'")  # the fix
    assert not (tmp_path / "m.gguf").exists()
