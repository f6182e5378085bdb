"""gpt_ds.dsconfig.optimization.choose_adam: every branch of the Adam(W) choice, for machines
this one is not (GPUs with and without nvcc, a prebuilt op, ROCm), and the chosen params
through DeepSpeed's own optimizer construction (`DeepSpeedEngine.get_optimizer_configuration`),
so that what is chosen is what DeepSpeed builds and no key it passes on makes torch raise."""

from __future__ import annotations

import pytest
import torch
from deepspeed.ops.op_builder.builder import CUDAOpBuilder
from deepspeed.runtime.engine import DeepSpeedEngine
from helpers.machine import here
from helpers.messages import assert_names

from gpt_ds.base.errors import ConfigError
from gpt_ds.dsconfig.optimization import choose_adam
from gpt_ds.dsconfig.resolve import resolve_ds_config
from gpt_ds.dsconfig.schema import load_ds_config, preset_path
from gpt_ds.dsconfig.settings import AdamFacts, RunSettings
from gpt_ds.launch.machine import adam_facts, arch_list_blocker, same_minor

CUDA_NO_NVCC = AdamFacts(accelerator="cuda")
ADAMW = {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}


def deepspeed_builds(params: dict) -> torch.optim.Optimizer:
    """The optimizer DeepSpeed's `_configure_basic_optimizer` makes from AdamW `params` when
    they select torch's AdamW (the branch that touches no engine state)."""
    params = dict(params)
    cls, kwargs = DeepSpeedEngine.get_optimizer_configuration(None, params, True)
    return cls([torch.nn.Parameter(torch.randn(4))], **params, **kwargs)


@pytest.mark.parametrize(
    "facts,expected,why",
    [
        (AdamFacts("cpu"), {"torch_adam": True}, "CPU ranks"),
        (AdamFacts("cpu", offload=True), {}, "CPU Adam (optimizer offload)"),
        (AdamFacts("cuda", offload=True), {}, "CPU Adam (optimizer offload)"),
        (CUDA_NO_NVCC, {"torch_adam": True, "fused": True}, "no nvcc matching"),
        (AdamFacts("cuda", rocm=True), {"torch_adam": True, "fused": True}, "no hipcc"),
        (AdamFacts("cuda", prebuilt=True), {}, "FusedAdam (op prebuilt)"),
        (AdamFacts("cuda", compiler="nvcc 13.0"), {}, "JIT-built once with nvcc 13.0"),
        (
            AdamFacts("cuda", compiler="nvcc 13.0", compiler_blocked=arch_list_blocker("9.0a")),
            {"torch_adam": True, "fused": True},
            "TORCH_CUDA_ARCH_LIST='9.0a'",  # why: the variable, as set
        ),
        (AdamFacts("xpu"), {}, "DeepSpeed's choice on xpu"),
    ],
)
def test_each_machine_gets_an_adam_it_can_run(facts, expected, why):
    choice = choose_adam(facts, dict(ADAMW))
    assert choice.params == expected
    assert why in choice.note
    assert choice.problems == []


def test_a_torch_adam_the_user_set_is_kept_either_way():
    for value in (True, False):
        choice = choose_adam(CUDA_NO_NVCC, {**ADAMW, "torch_adam": value})
        assert choice.params == {} and "set in the config" in choice.note


def test_without_a_compiler_deepspeed_builds_torchs_fused_adamw():
    choice = choose_adam(CUDA_NO_NVCC, dict(ADAMW))
    optimizer = deepspeed_builds({**ADAMW, **choice.params})
    assert type(optimizer) is torch.optim.AdamW
    assert optimizer.defaults["fused"] is True


def test_a_foreach_the_user_set_is_kept_and_fused_left_out():
    """torch refuses fused together with foreach: the user's foreach wins."""
    choice = choose_adam(CUDA_NO_NVCC, {**ADAMW, "foreach": True})
    assert choice.params == {"torch_adam": True} and choice.problems == []
    assert deepspeed_builds({**ADAMW, "foreach": True, **choice.params}).defaults["foreach"]


@pytest.mark.parametrize("key", ["bias_correction", "set_grad_none"])
def test_fused_adam_only_keys_are_refused_where_torch_adamw_runs(key):
    params = {**ADAMW, key: True}
    with pytest.raises(TypeError):  # what the run would die of, after building the model
        deepspeed_builds({**params, **choose_adam(CUDA_NO_NVCC, params).params})
    (problem,) = choose_adam(CUDA_NO_NVCC, params).problems
    assert_names(problem, f"optimizer.params.{key}", "FusedAdam", f"remove {key}")
    assert choose_adam(AdamFacts("cuda", prebuilt=True), params).problems == []


def test_fused_with_foreach_or_without_torch_adam_is_refused():
    both = choose_adam(AdamFacts("cpu"), {**ADAMW, "fused": True, "foreach": True}).problems
    assert len(both) == 1
    assert_names(both[0], "optimizer.params.fused", "optimizer.params.foreach", "remove foreach")
    with pytest.raises(RuntimeError, match="cannot be `True` together"):
        deepspeed_builds({**ADAMW, "torch_adam": True, "fused": True, "foreach": True})
    alone = choose_adam(AdamFacts("cuda", prebuilt=True), {**ADAMW, "fused": True}).problems
    assert len(alone) == 1
    assert_names(alone[0], "optimizer.params.fused", '"torch_adam": true')  # the key, the fix


class ArchListProbe(CUDAOpBuilder):
    """DeepSpeed's CUDA op builder with no sources: its own arch-list parsing, no build."""

    def __init__(self, arch_list: str):
        super().__init__(name="arch_list_probe")
        self.jit_mode, self._jit_arch_list = True, arch_list

    def absolute_name(self) -> str:
        return "arch_list_probe"

    def sources(self) -> list[str]:
        return []


@pytest.mark.parametrize(
    "arch_list", ["9.0a", "8.0;8.6+PTX 9.0", "10.0f", "9.0", "8.0 9.0a;10.0", " 7.5 "]
)
def test_an_arch_list_deepspeeds_jit_builder_cannot_parse_is_found_before_it_runs(
    arch_list, monkeypatch
):
    """An H200 node's image set TORCH_CUDA_ARCH_LIST=9.0a (torch's arch-specific Hopper target):
    DeepSpeed 0.19's FusedAdam JIT build raised ValueError on it after the model was built.
    The blocker agrees with DeepSpeed's own parser, run here without a GPU or a build (which
    sets TORCH_CUDA_ARCH_LIST in this process: monkeypatch restores it as the test found it)."""
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", arch_list)
    try:
        ArchListProbe(arch_list).compute_capability_args()
        deepspeed_parses = True
    except ValueError:
        deepspeed_parses = False
    blocker = arch_list_blocker(arch_list)
    assert (blocker is None) == deepspeed_parses, blocker
    if blocker:
        assert_names(blocker, f"TORCH_CUDA_ARCH_LIST={arch_list!r}", "unset")


def test_an_arch_list_blocker_names_the_entry_at_fault_and_what_to_write():
    assert_names(arch_list_blocker("8.0 9.0a;10.0"), "'9.0a'", "'9.0'")
    # empty: DeepSpeed parses nothing and probes the GPUs instead (no GPU here: its own error)
    assert arch_list_blocker("") is None and arch_list_blocker(" ") is None


def test_nvcc_must_match_torchs_cuda_minor_version():
    assert same_minor("13.0", "13.0") and same_minor("12.4", "12.4.1")
    assert not same_minor("12.8", "13.0") and not same_minor("12.4", "12.6")


def test_this_machine_and_the_resolved_presets_say_which_adam_runs():
    """The live facts here (CPU ranks), and the note and params a preset resolves to: what the
    start-up report prints."""
    assert adam_facts(offload=False) == AdamFacts("cpu")
    resolved = resolve_ds_config(
        load_ds_config(preset_path("ds_configs/zero2.json")),
        RunSettings(world_size=1, decay_iters=4, micro_batch_size=2, precision="fp32"),
        facts=here(),
    )
    assert resolved.config["optimizer"]["params"]["torch_adam"] is True
    assert any(n.startswith("optimizer: torch AdamW (CPU ranks") for n in resolved.notes)
    raw = load_ds_config(preset_path("ds_configs/zero2.json"))
    raw["optimizer"]["params"]["bias_correction"] = True
    with pytest.raises(ConfigError) as e:
        resolve_ds_config(
            raw,
            RunSettings(world_size=1, decay_iters=4, micro_batch_size=2, precision="fp32"),
            facts=here(),
        )
    assert_names(str(e.value), "optimizer.params.bias_correction", "remove bias_correction")
