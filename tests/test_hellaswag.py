"""HellaSwag scoring (gpt_ds/data/hellaswag.py, gpt_ds/training/hellaswag.py) against a plain
one-process computation with transformers, written here as llm.c and build-nanogpt do it, on the
suite's own small file in HellaSwag's format (tests/data/hellaswag_mini.jsonl: one context longer
than a 64-token block, one ending too long for it)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from harness.launch import STAGE_RUN_ITERS, run_deepspeed, run_python, train_fails
from helpers.files import HELLASWAG_MINI
from helpers.hellaswag import reference_losses, reference_scores
from support.launch import REPO, tiny_run_args
from transformers import GPT2Config, GPT2LMHeadModel

from gpt_ds.base.errors import DataError
from gpt_ds.data.hellaswag import read_hellaswag, render, render_all
from gpt_ds.export.hf import export_checkpoint
from gpt_ds.observe.metrics_file import read_metrics
from gpt_ds.run.plan import hellaswag_rows
from gpt_ds.training.hellaswag import ending_losses, score_hellaswag

MINI = HELLASWAG_MINI
EVAL = REPO / "tools" / "evaluate.py"
BLOCK = 64


@pytest.fixture(scope="module")
def model() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=64, n_positions=BLOCK)
    return GPT2LMHeadModel(config).eval()


def test_each_endings_loss_and_the_accuracies_equal_the_reference(model):
    items = [json.loads(line) for line in MINI.read_text().splitlines()]
    examples = read_hellaswag(MINI)
    right = [0, 0]
    scored = 0
    for item, example in zip(items, examples, strict=True):
        expected = reference_losses(model, item, BLOCK)
        rows = render(example, BLOCK)
        assert (rows is None) == (expected is None)
        if rows is None:
            continue
        with torch.no_grad():
            summed, mean = ending_losses(model, rows, torch.device("cpu"))
        torch.testing.assert_close(summed, torch.tensor([s for s, _ in expected]))
        torch.testing.assert_close(mean, torch.tensor([m for _, m in expected]))
        right[0] += min(range(4), key=lambda i: expected[i][0]) == item["label"]
        right[1] += min(range(4), key=lambda i: expected[i][1]) == item["label"]
        scored += 1
    result = score_hellaswag(model, render_all(examples, BLOCK, MINI), torch.device("cpu"))
    assert (result.examples, result.skipped) == (scored, 1) == (11, 1)
    assert (result.acc, result.acc_norm) == (right[0] / scored, right[1] / scored)
    assert "11 examples, 1 skipped" in result.line()


def test_a_context_longer_than_the_block_loses_its_oldest_tokens():
    long_one = read_hellaswag(MINI)[7]
    rows = render(long_one, BLOCK)
    assert rows is not None and len(long_one.context) > BLOCK
    for i, ending in enumerate(long_one.endings):
        start = int(rows.scored[i].argmax())  # the ending's first token
        assert start + len(ending) == BLOCK  # the whole block used
        assert tuple(rows.tokens[i][:start]) == long_one.context[-start:]
        assert tuple(rows.tokens[i][start:BLOCK]) == ending


def test_malformed_lines_are_refused_by_line_number(tmp_path):
    good = MINI.read_text().splitlines()[0]
    bad = tmp_path / "val.jsonl"
    lines = [good, good, "{not json", good, json.dumps({"ctx": "x", "endings": ["a"], "label": 0})]
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as caught:
        read_hellaswag(bad)
    said = str(caught.value)
    assert str(bad) in said and "line 3:" in said and "line 5:" in said and "endings" in said
    assert "line 1:" not in said


def test_a_missing_or_empty_file_is_refused(tmp_path):
    with pytest.raises(DataError, match="cannot read"):
        read_hellaswag(tmp_path / "absent.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match="no examples"):
        read_hellaswag(tmp_path / "empty.jsonl")


@pytest.fixture(scope="module")
def exported(stage_run, tmp_path_factory):
    """exported(stage) -> (the session's 2-rank run of that stage, its `final` exported, the
    scores plain transformers computes on that export in one process)."""
    done: dict[int, tuple[Path, Path, dict[str, float]]] = {}

    def get(stage: int) -> tuple[Path, Path, dict[str, float]]:
        if stage not in done:
            out = stage_run(stage)[0]
            hf = tmp_path_factory.mktemp(f"hellaswag_zero{stage}") / "hf"
            export_checkpoint(out, hf, tag="final", progress=False, log=None)
            model = GPT2LMHeadModel.from_pretrained(hf, dtype=torch.float32).eval()
            done[stage] = (out, hf, reference_scores(model, BLOCK))
        return done[stage]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_a_two_rank_runs_score_equals_transformers_on_its_export(stage, stage_run, exported):
    """The session's 2-rank run (conftest.stage_run, --hellaswag on the mini file) logs at its
    last evaluation what plain transformers computes, in one process, on its exported `final`."""
    out, _, expected = exported(stage)
    stdout = stage_run(stage)[1]
    last = [r for r in read_metrics(out) if r.get("kind") == "eval"][-1]
    assert last["iter"] == STAGE_RUN_ITERS
    assert {key: last[key] for key in expected} == expected
    assert "hellaswag: 11 examples of" in stdout and "(1 skipped" in stdout
    assert f"hellaswag acc_norm {expected['hellaswag_acc_norm']:.4f}" in stdout


def said_scores(stdout: str) -> tuple[str, str, str]:
    """(acc_norm, acc, examples) as the eval command printed them."""
    found = re.search(r"hellaswag acc_norm (\S+) \| acc (\S+) \| (\d+) examples", stdout)
    assert found, stdout[-3000:]
    return found[1], found[2], found[3]


def as_said(expected: dict[str, float]) -> tuple[str, str, str]:
    return (
        f"{expected['hellaswag_acc_norm']:.4f}",
        f"{expected['hellaswag_acc']:.4f}",
        str(expected["hellaswag_examples"]),
    )


@pytest.mark.slow
def test_the_eval_command_scores_a_tag_on_one_rank_as_transformers(exported):
    out, _, expected = exported(2)
    proc = run_python([str(EVAL), "--model", str(out), "--tag", "final", "--hellaswag", str(MINI)])
    assert said_scores(proc.stdout) == as_said(expected)
    assert "| 1 rank |" in proc.stdout and f"checkpoint {out}/final" in proc.stderr


@pytest.mark.slow
def test_the_eval_command_scores_an_export_on_two_ranks_as_transformers(exported):
    _, hf, expected = exported(3)
    args = ["--model", str(hf), "--hellaswag", str(MINI)]
    proc = run_deepspeed(args, script="gpt_ds.commands.evaluate", extra_launcher_args=["--module"])
    assert said_scores(proc.stdout) == as_said(expected)
    assert "| 2 ranks |" in proc.stdout
    assert proc.stdout.count("hellaswag acc_norm") == 1  # said by rank 0 only


@pytest.mark.parametrize("ranks", [1, 2])
def test_the_eval_command_refuses_a_malformed_file_before_loading_a_model(ranks, tmp_path):
    """Said once, whatever the ranks (each finds it: only the node's local rank 0 says it)."""
    bad = tmp_path / "val.jsonl"
    bad.write_text("{}\n")
    args = ["--model", str(tmp_path / "absent"), "--hellaswag", str(bad)]
    if ranks == 1:
        proc = run_python([str(EVAL), *args], check=False)
    else:
        module = ["--module"]
        proc = run_deepspeed(
            args, script="gpt_ds.commands.evaluate", extra_launcher_args=module, check=False
        )
    assert proc.returncode == 2 and "line 1:" in proc.stderr and str(bad) in proc.stderr
    assert proc.stderr.count("error:") == 1, proc.stderr
    assert "absent" not in proc.stderr  # the model was never looked at


def test_the_trainer_refuses_a_malformed_file_before_anything_starts(shakespeare_dir, tmp_path):
    bad = tmp_path / "val.jsonl"
    bad.write_text(MINI.read_text().splitlines()[0] + "\n[1, 2]\n")
    err = train_fails(tiny_run_args(shakespeare_dir, tmp_path / "out", hellaswag=bad))
    assert "line 2:" in err and str(bad) in err and "line 1:" not in err
    assert not (tmp_path / "out").exists()  # refused before the out dir was made


def test_a_block_too_short_for_every_ending_is_refused_at_planning():
    """A 4-token block leaves no ending room for a context token: nothing to score."""
    notes: list[str] = []
    with pytest.raises(DataError) as caught:
        hellaswag_rows(str(MINI), block_size=4, notes=notes)
    assert notes == []  # refused: nothing said of examples that will not be scored
    assert str(MINI) in str(caught.value) and "4 tokens or more" in str(caught.value)
