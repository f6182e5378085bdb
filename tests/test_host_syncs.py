"""Host overhead of a step, held by counts (never by timings): the model gpt_ds trains makes no
host sync in its forward and backward (transformers' plain GPT-2 does), torch's tanh GELU in
place of gelu_new computes GPT-2's function, and a profiled run's trace shows no sync of
gpt_ds's own per step, only DeepSpeed's and torch's, each named."""

from __future__ import annotations

import pytest
import torch
from harness.launch import run_deepspeed
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile
from transformers import GPT2LMHeadModel
from transformers.activations import GELUTanh, NewGELUActivation

from gpt_ds.base.phases import FORWARD, STEP
from gpt_ds.model.gpt2 import LOSS_KINDS, ModelShape, gpt2_config
from gpt_ds.model.training_model import build_model
from gpt_ds.observe.host_syncs import SYNC_PREFIX, marking_syncs
from gpt_ds.observe.step_ops import LOCAL_SCALAR, count_step_ops

SHAPE = ModelShape(n_layer=2, n_head=2, n_embd=64, block_size=32, vocab_size=96)


def plain_gpt2(model) -> GPT2LMHeadModel:
    """transformers' own GPT-2 (sdpa, gelu_new) with `model`'s weights."""
    cfg = gpt2_config(SHAPE)
    cfg._attn_implementation = "sdpa"
    plain = GPT2LMHeadModel(cfg)
    plain.load_state_dict(model.state_dict())
    return plain


def syncs_in(fn) -> int:
    """Host syncs `fn` makes: `_local_scalar_dense` and marked `.tolist()`/`.cpu()`/..."""
    with profile(activities=[ProfilerActivity.CPU]) as prof, marking_syncs():
        fn()
    names = [e.name for e in prof.events()]
    return sum(n == LOCAL_SCALAR or n.startswith(SYNC_PREFIX) for n in names)


def test_the_trained_model_is_gpt2_with_a_fused_gelu():
    torch.manual_seed(0)
    model = build_model(SHAPE).eval()
    assert model.config.activation_function == "gelu_new"  # what config.json and exports say
    assert all(isinstance(b.mlp.act, GELUTanh) for b in model.transformer.h)
    plain = plain_gpt2(model).eval()
    assert all(isinstance(b.mlp.act, NewGELUActivation) for b in plain.transformer.h)
    x = torch.randint(0, SHAPE.vocab_size, (2, SHAPE.block_size))
    ours, theirs = model(input_ids=x).logits, plain(input_ids=x).logits
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    ours16 = model.to(torch.bfloat16)(input_ids=x).logits.float()
    torch.testing.assert_close(ours16, theirs, rtol=0.05, atol=0.05)  # bf16's own rounding


def test_gelu_alone_matches_transformers_gelu_new():
    x = torch.randn(4096) * 4
    torch.testing.assert_close(GELUTanh()(x), NewGELUActivation()(x), rtol=1e-6, atol=1e-6)


# --loss deepspeed: DeepSpeed's target-range check, `torch._assert_async`, reads its flag on a
# CPU tensor (`.item()`); on CUDA the assert runs on the device, no sync
CPU_SYNCS = {"chunked": 0, "deepspeed": 1, "full": 0}


@pytest.mark.parametrize("loss", LOSS_KINDS)
def test_forward_and_backward_make_no_host_sync(loss):
    """The causal attention builds no mask: no packed-sequence `.all()` per forward, where
    transformers' own "sdpa" GPT-2 makes one (so the count can fail); no loss kind syncs but
    DeepSpeed's range check on CPU (CPU_SYNCS)."""
    torch.manual_seed(0)
    model = build_model(SHAPE, loss=loss).train()
    plain = plain_gpt2(model).train()
    x = torch.randint(0, SHAPE.vocab_size, (2, SHAPE.block_size))
    assert syncs_in(lambda: model(input_ids=x, targets=x).backward()) == CPU_SYNCS[loss]
    assert syncs_in(lambda: plain(input_ids=x, use_cache=False).logits.sum().backward()) >= 1
    ours = model(input_ids=x).logits
    torch.testing.assert_close(ours, plain(input_ids=x).logits, rtol=1e-5, atol=1e-5)


def test_step_ops_counts_leaves_by_phase(tmp_path):
    """A hand-made step: 2 kernel-launching operators in forward (mm, whose nested
    `resolve_conj` and the view do not count, and relu's clamp), one `.item()` and one
    `.tolist()` in step, an `add` outside any phase."""
    a = torch.ones(4, 4)
    with profile(activities=[ProfilerActivity.CPU]) as prof, marking_syncs():
        with record_function(FORWARD):
            b = (a @ a).view(16).relu()
        with record_function(STEP):
            b.sum().item()
            b.tolist()
        torch.add(a, 1)
    trace = tmp_path / "rank0.steps1-1.json"
    prof.export_chrome_trace(str(trace))
    ops = count_step_ops(trace)
    assert ops.steps == 1
    assert ops.launches["forward"] == 2 and ops.by_op["aten::mm"] == 1
    assert ops.by_op["aten::add"] == 1 and ops.launches["trainer"] >= 1  # outside the phases
    assert ops.syncs == {"step": 2} and ops.local_scalar == 1
    assert set(ops.by_sync) == {"step: item", "step: tolist"}


def test_marking_syncs_does_not_recompile_a_compiled_model():
    """A model compiled before the profiled steps runs them with the graphs it has: marking
    changes no state dynamo guards on (a TorchFunctionMode on the stack did, and an H200's
    profile of steps 3-5 timed their recompile), and still marks the syncs around it."""
    from torch._dynamo.testing import CompileCounter

    torch.manual_seed(0)
    model = build_model(SHAPE, loss="full").train()
    x = torch.randint(0, SHAPE.vocab_size, (2, SHAPE.block_size))
    counter = CompileCounter()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=counter)
    compiled(input_ids=x, targets=x).backward()
    frames = counter.frame_count
    assert frames >= 1

    def step() -> None:
        loss = compiled(input_ids=x, targets=x)
        loss.backward()
        loss.item()

    assert syncs_in(step) >= 1  # the .item() after it, marked
    assert counter.frame_count == frames, "recompiled under marking_syncs"


# Per optimizer step, with DeepSpeed's ZeRO-1/2 step made sync-free (training/engine_build.py): only
# torch's AdamW on CPU ranks reading its step count, per parameter group (gpt_ds passes two:
# decayed or not); a GPU's fused AdamW keeps it on the device. DeepSpeed's own step made 4 more
# (a masked_fill_ with a tensor value and a bool() in the clip, per group; test_ds_syncs).
NAMED_STEP_SYNCS = {"step: item in torch's optimizer": 2}


@pytest.mark.slow
@pytest.mark.parametrize("preset, precision", [("zero2", "bf16"), ("zero1", "fp32")])
def test_a_profiled_step_syncs_only_inside_torchs_optimizer(
    preset, precision, shakespeare_dir, tmp_path
):
    """A run on one rank, profiled at steps 3-5 with log lines every 10 steps: forward, loss,
    backward, DeepSpeed's step and the trainer's bookkeeping make no host sync; overlap_comm
    resolves off on one rank (on a GPU, DeepSpeed's device synchronize after backward)."""
    out = tmp_path / "run"
    args = [
        "--deepspeed_config", preset, "--model", "gpt2-tiny", "--n_layer", "2",
        "--block_size", "64", "--micro_batch_size", "2", "--precision", precision,
        "--max_iters", "6", "--warmup_iters", "2", "--eval_interval", "0", "--eval_iters", "1",
        "--data_dir", str(shakespeare_dir), "--out_dir", str(out), "--profile",
        "--no_checkpoint",
    ]  # fmt: skip
    stdout = run_deepspeed(args, num_gpus=1).stdout
    assert "per optimizer step (rank 0):" in stdout
    assert "host syncs: DeepSpeed's ZeRO step without its per-group syncs" in stdout
    assert 'overlap_comm: false (was "auto": one rank' in stdout
    ops = count_step_ops(next((out / "profile").glob("rank0.*.json")))
    per_step = {kind: ops.per_step(n) for kind, n in ops.by_sync.items()}
    assert per_step == NAMED_STEP_SYNCS, per_step
    assert ops.local_scalar_per_step == 2
