"""lm-evaluation-harness on an export (docs/evaluation.md): the commands and the local task file
docs/evaluation.md shows, run offline on the export of the session's 2-rank ZeRO-2 run over the
suite's HellaSwag examples that fit its 64 positions; lm-eval's log-likelihood of every ending
and its acc equal a one-process transformers computation on the same export."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.files import HELLASWAG_MINI
from helpers.hellaswag import reference_losses
from support.launch import REPO
from transformers import GPT2LMHeadModel

from gpt_ds.data.tokenizer import get_encoding
from gpt_ds.export.hf import export_checkpoint

EVALUATION_MD = REPO / "docs" / "evaluation.md"
BLOCK = 64  # the stage run's block: its export's positions


def documented(language: str, contains: str) -> str:
    """The code block of docs/evaluation.md in `language` that contains `contains`."""
    blocks = re.findall(rf"```{language}\n(.*?)```", EVALUATION_MD.read_text(), re.S)
    return next(block for block in blocks if contains in block)


def fitting_examples(path: Path) -> list[dict]:
    """The file's examples whose context and every ending fit the block: lm-eval keeps one more
    context token than gpt_ds where they do not, and stops at an ending that alone does not."""
    enc = get_encoding()
    items = [json.loads(line) for line in path.read_text().splitlines()]
    return [
        item
        for item in items
        if all(
            len(enc.encode_ordinary(item["ctx"])) + len(enc.encode_ordinary(" " + end)) <= BLOCK
            for end in item["endings"]
        )
    ]


def lm_eval_command(export: Path, tasks: Path, out: Path) -> list[str]:
    """docs/evaluation.md's offline command, on this machine's CPU and these paths."""
    command = documented("bash", "--include_path").replace("\\\n", " ")
    argv = shlex.split(command)
    assert argv[:2] == ["HF_HUB_OFFLINE=1", "HF_DATASETS_OFFLINE=1"] and argv[2] == "lm_eval"
    swap = {
        "pretrained=export/,dtype=float32": f"pretrained={export},dtype=float32",
        "tasks/": str(tasks),
        "cuda:0": "cpu",
        "lm_eval/": str(out),
    }
    lm_eval = Path(sys.executable).with_name("lm_eval")
    return [str(lm_eval)] + [swap.get(arg, arg) for arg in argv[3:]]


@pytest.mark.slow
def test_lm_eval_scores_an_export_as_transformers_does(stage_run, tmp_path):
    hf = tmp_path / "export"
    export_checkpoint(stage_run(2)[0], hf, tag="final", progress=False, log=None)
    examples = fitting_examples(HELLASWAG_MINI)
    assert 5 <= len(examples) < len(HELLASWAG_MINI.read_text().splitlines())
    data = tmp_path / "hellaswag_fit.jsonl"
    data.write_text("".join(json.dumps(item) + "\n" for item in examples))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    task = documented("yaml", "task: hellaswag_local")
    (tasks / "hellaswag_local.yaml").write_text(task.replace("data/hellaswag_val.jsonl", str(data)))

    out = tmp_path / "lm_eval"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run(
        lm_eval_command(hf, tasks, out), env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]

    model = GPT2LMHeadModel.from_pretrained(hf, dtype=torch.float32).eval()
    (samples,) = out.glob("*/samples_hellaswag_local_*.jsonl")
    right = 0
    records = [json.loads(line) for line in samples.read_text().splitlines()]
    assert sorted(r["doc_id"] for r in records) == list(range(len(examples)))
    for record in records:
        item = examples[record["doc_id"]]
        summed = [s for s, _ in reference_losses(model, item, BLOCK)]
        loglikelihoods = [float(ll) for ll, _ in record["filtered_resps"]]
        torch.testing.assert_close(
            torch.tensor(loglikelihoods), -torch.tensor(summed), rtol=1e-4, atol=1e-4
        )
        right += min(range(4), key=lambda i: summed[i]) == item["label"]
        assert record["acc"] == float(min(range(4), key=lambda i: summed[i]) == item["label"])
    (results,) = out.glob("*/results_*.json")
    scored = json.loads(results.read_text())["results"]["hellaswag_local"]
    assert scored["acc,none"] == pytest.approx(right / len(examples))
    assert "acc_norm,none" in scored
