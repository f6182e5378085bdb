"""--compile: a real 2-rank run compiled by torch.compile follows the eager run to float noise,
reports its first (compiling) iteration apart, and a machine where inductor cannot work trains
eager, saying so in a WARNING line; dynamo's process-wide `suppress_errors` is never set; the
loss kind `full` compiles in the model's one graph, `chunked` and `deepspeed` stay eager."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch._dynamo
from helpers.compared_runs import ITERS, WHOLE, compared_run
from helpers.logged import train_losses, val_losses
from helpers.shared import shared_folder
from torch.profiler import ProfilerActivity, profile

from gpt_ds.base.phases import PHASE_PREFIX
from gpt_ds.dsconfig.settings import MachineFacts
from gpt_ds.launch.machine import compile_blocker
from gpt_ds.model.gpt2 import LOSS_KINDS, ModelShape, padded_vocab
from gpt_ds.model.training_model import build_model
from gpt_ds.observe.metrics_file import read_metrics
from gpt_ds.run.config import parse_args
from gpt_ds.run.plan import run_choices
from gpt_ds.training.engine_build import compile_engine


def test_no_cpp_compiler_is_named(monkeypatch):
    monkeypatch.setenv("CXX", "no-such-c++")
    monkeypatch.setenv("PATH", "/nonexistent")
    why = compile_blocker("cpu")
    assert why is not None and "C++ compiler" in why and "no-such-c++" in why


def test_a_cpu_with_a_compiler_can_compile():
    assert compile_blocker("cpu") is None  # g++ is installed on every machine this runs on


def test_compiling_leaves_dynamos_suppress_errors_alone():
    """Compiled or not (whether inductor works on this CPU does not matter), a graph that fails
    later is torch's to report: `suppress_errors` keeps its value. `nn.Module.compile` is the
    in-place compile `engine.compile()` does for DeepSpeed's module."""
    before = torch._dynamo.config.suppress_errors
    compiled, line = compile_engine(torch.nn.Linear(4, 4), compile_blocker("cpu"))
    assert torch._dynamo.config.suppress_errors == before, line
    assert compiled == ("compiled by torch.compile" in line), line
    assert compiled or line.startswith("WARNING: --compile"), line


def test_a_machine_that_cannot_compile_warns_that_it_trains_eager(monkeypatch):
    monkeypatch.setenv("CXX", "no-such-c++")
    monkeypatch.setenv("PATH", "/nonexistent")
    before = torch._dynamo.config.suppress_errors
    compiled, line = compile_engine(torch.nn.Linear(4, 4), compile_blocker("cpu"))
    assert not compiled
    assert line.startswith("WARNING: --compile: cannot compile, the run trains eager: "), line
    assert "C++ compiler" in line and "no-such-c++" in line
    assert torch._dynamo.config.suppress_errors == before


@pytest.mark.slow
def test_a_compiled_run_follows_the_eager_run(shakespeare_dir, tmp_path_factory):
    """Against the eager baseline other tests share (helpers.compared_runs' WHOLE, ZeRO-2)."""
    root = shared_folder(tmp_path_factory, "compared_runs")  # conftest's `runs` too
    eager, eager_log = compared_run(shakespeare_dir, root, 2, **WHOLE)
    compiled, compiled_log = compared_run(shakespeare_dir, root, 2, **WHOLE, compile=True)
    assert "model compiled by torch.compile" in compiled_log
    assert "torch.compile" not in eager_log
    eager_train, eager_val = train_losses(eager), val_losses(eager)
    comp_train, comp_val = train_losses(compiled), val_losses(compiled)
    assert sorted(comp_train) == list(range(1, ITERS + 1))
    for it, value in eager_train.items():
        assert abs(comp_train[it] - value) < 1e-4, (it, comp_train[it], value)
    for it, value in eager_val.items():
        assert abs(comp_val[it] - value) < 1e-4, (it, comp_val[it], value)
    events = [r for r in read_metrics(compiled) if r.get("event") == "compile"]
    assert len(events) == 1 and events[0]["seconds"] > 0


@pytest.mark.parametrize("loss", LOSS_KINDS)
def test_the_logits_losses_compile_in_the_models_one_graph(loss):
    """dynamo over the training model's forward with targets (the call `engine.compile()`'s
    module gets): full traces whole, head and loss in one graph with no break; chunked and
    deepspeed break before their disabled losses. Compiled (aot_eager: dynamo and AOT autograd,
    without inductor's minutes of C++ here), loss and gradients equal eager's."""
    shape = padded_vocab(ModelShape(n_layer=1, n_head=2, n_embd=32, block_size=16), 64)
    torch.manual_seed(0)
    model = build_model(shape, loss=loss).train()
    x = torch.randint(0, shape.tokens, (2, 16))
    y = torch.roll(x, -1, dims=1)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(input_ids=x, targets=y)
    reasons = [str(b.reason) for b in explained.break_reasons]
    if loss != "full":
        assert any(f"{loss}_cross_entropy" in r for r in reasons), reasons
    else:
        assert (explained.graph_count, reasons) == (1, []), reasons
    eager = model(input_ids=x, targets=y)
    eager.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager")(input_ids=x, targets=y)
    compiled.backward()
    torch.testing.assert_close(compiled, eager, rtol=1e-6, atol=1e-6)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[name], rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize("loss", ["chunked", "deepspeed"])
def test_a_compiled_models_eager_loss_is_profiled_as_the_loss_phase(loss):
    """--profile's phases under --compile: the model's own `loss` range is traced away with
    the compiled graph, so each eager loss opens its own; a GPU trace then counts the loss's
    kernels apart from the forward's (an H200's profile had none in `loss`)."""
    shape = padded_vocab(ModelShape(n_layer=1, n_head=2, n_embd=32, block_size=16), 64)
    model = build_model(shape, loss=loss).train()
    x = torch.randint(0, shape.tokens, (2, 16))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager")
    compiled(input_ids=x, targets=x).backward()  # compiled before the profiled step
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        compiled(input_ids=x, targets=x).backward()
    ranges = [e for e in prof.events() if e.name == PHASE_PREFIX + "loss"]
    assert ranges and all(e.cpu_children for e in ranges), [e.name for e in prof.events()][:50]


def test_auto_compiles_on_gpus_only():
    """The plan's choice, from --compile and the machine's facts (a GPU machine's stated)."""
    shape = ModelShape(n_layer=1, n_head=2, n_embd=32, block_size=16)
    gpu = MachineFacts.gpu_cluster(world_size=1, gpus_per_node=1, precision="bf16")
    cpu = dataclasses.replace(gpu, device_type="cpu", compile_blocker="no C++ compiler")

    def compiles(mode: str, machine: MachineFacts) -> tuple[bool, str | None]:
        choices = run_choices(parse_args(["--compile", mode]), machine, shape, {})
        return choices.compile, choices.compile_blocker

    assert [compiles("auto", m)[0] for m in (gpu, cpu)] == [True, False]
    assert compiles("on", cpu) == (True, "no C++ compiler") and not compiles("off", gpu)[0]


@pytest.mark.parametrize(("saved", "mode"), [(False, "off"), (True, "on"), ("auto", "auto")])
def test_manifests_saved_before_auto_still_replay(saved, mode, tmp_path):
    """A checkpoint's gpt_ds.json of a run saved `compile: false` or `true`."""
    manifest = tmp_path / "gpt_ds.json"
    manifest.write_text(json.dumps({"tag": "final", "config": {"compile": saved}}))
    assert parse_args(["--config", str(manifest)]).compile == mode


@pytest.mark.parametrize("saved", ["chunked", "full"])
def test_manifests_saved_before_the_deepspeed_loss_still_replay(saved, tmp_path):
    """A checkpoint's gpt_ds.json from when --loss had two kinds keeps its own."""
    manifest = tmp_path / "gpt_ds.json"
    manifest.write_text(json.dumps({"tag": "final", "config": {"loss": saved}}))
    assert parse_args(["--config", str(manifest)]).loss == saved


def test_the_flag_alone_means_on_and_the_default_is_auto():
    assert parse_args(["--compile"]).compile == "on"
    assert parse_args([]).compile == "auto"
    assert parse_args(["--compile", "off"]).compile == "off"
