"""Each benchmark runs at a tiny size, so none can rot. Benchmarks are not tests: nothing here
asserts a speed, only that every row ran and the table is complete and consistent."""

from __future__ import annotations

import argparse
import json
import re
import time

import pytest
from harness.launch import run_benchmark, run_python
from support.launch import REPO

pytestmark = pytest.mark.bench  # the benchmark smoke tests: `pytest -m bench`

# The table's own code and each peer's (gpt_ds's flag rows, e.g. "gpt_ds --loss full", run the
# gpt_ds row's code with other flags: each is a real `deepspeed` launch, ~35 s here)
# ("gpt_ds unfused AdamW" is the gpt_ds row with torch_adam in its config: that choice and its
# line are test_optimizer_choice's)
ROWS = [
    "gpt_ds",
    "HF Trainer",
    "bare DeepSpeed loop",
    "plain PyTorch (nanoGPT recipe)",
    "plain PyTorch (GPT2LMHeadModel)",
]


@pytest.mark.slow
def test_throughput_benchmark_prints_every_row(shakespeare_dir, tmp_path):
    proc = run_benchmark(
        "throughput",
        "--models", "gpt2-tiny",
        "--stages", "2",
        "--block_size", "32",
        "--micro_batch_size", "2",
        "--grad_accum", "2",
        "--steps", "3",
        "--warmup", "1",
        "--reps", "1",
        "--rows", *ROWS,
        data_dir=shakespeare_dir,
        work_dir=tmp_path,
        timeout=1200,  # five launches of the real `deepspeed` command, each with fresh ranks
    )  # fmt: skip
    rows = re.findall(r"^\| (.+?) \| ([\d,]+) \| .* \| ([\d.]+) GiB \| ([\d.]+) \| ([\d.]+) \|$",
                      proc.stdout, re.M)  # fmt: skip
    names = [r[0] for r in rows]
    assert names == ROWS, proc.stdout
    for _, tps, gib, x_tps, x_mem in rows:
        assert int(tps.replace(",", "")) > 0 and float(gib) > 0.1
        assert float(x_tps) > 0 and float(x_mem) > 0
    hf = next(r for r in rows if r[0] == "HF Trainer")
    assert hf[3] == "1.00" and hf[4] == "1.00"  # the reference row
    # the anchor: gpt_ds against the faster plain PyTorch loop, and how each ran (CPU: eager)
    anchor = r"^- gpt_ds: [\d.]+× the tokens/s of the fastest plain loop, plain PyTorch \("
    assert re.search(anchor, proc.stdout, re.M), proc.stdout
    eager, ddp = "fp32, eager (--plain_compile on compiles)", "torch AdamW, DDP over 2 ranks"
    losses = ["nanoGPT's forward(idx, targets)", "GPT2LMHeadModel's labels="]
    for row, loss in zip(ROWS[-2:], losses, strict=True):
        note = f"{eager}, loss inside the model ({loss}), {ddp}"
        assert f"- {row}: {note}" in proc.stdout, proc.stdout


@pytest.mark.slow
def test_gpu_check_without_a_gpu_reports_the_machine_and_exits_0(tmp_path):
    """The no-GPU branch (conftest hides GPUs): the environment as the trainer decides it,
    written as markdown and JSON, and nothing launched."""
    import torch

    out = tmp_path / "check"
    proc = run_python([str(REPO / "benchmarks" / "gpu_check.py"), "--out", str(out)])
    assert "No GPU usable here" in proc.stdout
    env = json.loads((out / "gpu_check.json").read_text())["environment"]
    assert env["usable_gpu"] is False and env["gpus"] == [] and env["torch"] == torch.__version__
    assert env["precision"].split(":")[0] in ("bf16", "fp32")  # CPU ranks: by the CPU's flags
    assert env["optimizer"].startswith("optimizer: torch AdamW")
    assert "| deepspeed |" in (out / "gpu_check.md").read_text()
    assert not (out / "logs").exists()


def test_gpu_check_fills_the_card_by_the_trainers_memory_model(shakespeare_dir):
    """The throughput rows' micro-batch on a GPU: the largest power of two whose predicted
    peak with the full logits (the hungriest row, about the HF Trainer's need) fits 80% of the
    card, by the trainer's own memory model, for an 80 GiB and a 141 GiB card."""
    from gpu_check import card_filling_micro_batch, predicted_full_logits_peak

    seen: dict[int, int] = {}

    def predicted(micro: int) -> int:
        seen[micro] = seen.get(micro) or predicted_full_logits_peak(
            micro, "bf16", str(shakespeare_dir)
        )
        return seen[micro]

    for card_gib in (80, 141):
        card = card_gib * 2**30
        best = card_filling_micro_batch(card, predicted)
        assert predicted(best) <= 0.8 * card < predicted(2 * best), (card_gib, seen)
    assert predicted(1) < predicted(2) < predicted(4)  # activations grow with the batch
    assert card_filling_micro_batch(2**30, lambda m: 2**31) == 1  # nothing fits: 1


def test_chunked_loss_benchmark_prints_every_row_with_its_errors(tmp_path):
    proc = run_python(
        [str(REPO / "benchmarks" / "chunked_loss.py"), "--tokens", "48", "--widths", "32",
         "--reps", "1"]
    )  # fmt: skip
    rows = re.findall(r"^\| (.+?) \| ([\d,.]+) \| ([\d.]+) \| ([\d.]+) \| (\d+) "
                      r"\| ([\d.e+-]+) \| ([\d.e+-]+) \|$", proc.stdout, re.M)  # fmt: skip
    names = [r[0] for r in rows]
    kinds = ["full logits (HF)", "DeepSpeed's chunked cross-entropy"]
    assert names == [*kinds, "chunked, one product per chunk", "chunked (default)"] * 2
    for _, ms, ratio, passes, launches, err_hidden, err_weight in rows:
        assert float(ms.replace(",", "")) > 0 and float(ratio) > 0
        assert float(passes) > 0 and int(launches) > 0
        assert float(err_hidden) < 2e-2 and float(err_weight) < 2e-2  # bf16 and fp32 alike
    for table in (rows[:4], rows[4:]):  # the chunked loss streams its logits less than HF's
        assert float(table[3][3]) < float(table[0][3]), proc.stdout


def test_host_overhead_benchmark_prints_its_table(shakespeare_dir, tmp_path):
    proc = run_benchmark(
        "host_overhead", "--n_layer", "1", "--block_size", "64", "--rows", "gpt_ds",
        "DeepSpeed's bf16 defaults", work_dir=tmp_path, data_dir=shakespeare_dir,
    )  # fmt: skip
    rows = {line.split("|")[1].strip(): line for line in proc.stdout.splitlines() if "|" in line}
    assert {"gpt_ds", "DeepSpeed's bf16 defaults"} <= rows.keys(), proc.stdout
    ours = int(rows["gpt_ds"].split("|")[-3])
    theirs = int(rows["DeepSpeed's bf16 defaults"].split("|")[-3])
    assert ours < theirs, proc.stdout  # the overflow check and timer's syncs are gone
    assert "trainer: " not in proc.stdout.split("host syncs by phase")[1]


@pytest.mark.slow
def test_gpu_check_profiles_the_defaults_with_no_log_line_in_the_window(shakespeare_dir, tmp_path):
    """gpu_check's profile step at a tiny size on one CPU rank: the real `deepspeed` command it
    builds trains, its profiled steps (after the compiling first) hold no log line, whose loss
    read would be the trainer's sync, and the trainer's table of launches and syncs by phase
    is what the report lifts."""
    import subprocess

    from gpu_check import parse_args, profile_command, profile_table
    from support.launch import launch_env

    args = parse_args(["--model", "gpt2-tiny", "--block_size", "64"])
    cmd = profile_command(args, shakespeare_dir, "fp32", 2, tmp_path / "run")
    proc = subprocess.run(
        cmd, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = profile_table(proc.stdout)
    assert table[0] == "```" and "per optimizer step" in table[1], proc.stdout[-3000:]
    rows = {ln.split()[0]: ln.split()[1:] for ln in table[3:-3] if len(ln.split()) == 3}
    assert set(rows) >= {"forward", "loss", "backward", "step", "trainer", "total"}, table
    assert float(rows["trainer"][1]) == 0.0 and int(rows["loss"][0]) > 0, table
    assert table[-3].startswith("host syncs:"), table


@pytest.mark.slow
def test_gpu_check_stopped_by_its_budget_keeps_what_it_measured(shakespeare_dir, tmp_path):
    """The GPU check's own flow on CPU ranks at a tiny size (`--on_cpu`), its throughput step
    given more repetitions than its 45 s budget holds: the environment is written first, each
    repetition lands in throughput.jsonl and .md as it is measured, the step is stopped at the
    budget (rc 124) and the report names what it kept; the whole check ends inside the budget
    (plus the data preparation and the report)."""
    out = tmp_path / "check"
    rows = ["gpt_ds", "plain PyTorch (nanoGPT recipe)"]
    argv = [str(REPO / "benchmarks" / "gpu_check.py"), "--out", str(out), "--on_cpu"]
    argv += ["--budget", "45", "--model", "gpt2-tiny", "--block_size", "64"]
    reps = 40  # far more than 45 s holds on any machine (the fastest measured 12 in 37 s)
    argv += ["--micro_batch_size", "2", "--steps", "4", "--reps", str(reps), "--rows", *rows]
    argv += [
        "--skip",
        "gpu tests",
        "quick start",
        "gpt2-xl zero3",
        "--work_dir",
        str(tmp_path / "work"),
    ]
    argv += ["--data_dir", str(shakespeare_dir)]
    started = time.monotonic()
    proc = run_python(argv, check=False, timeout=300)
    assert time.monotonic() - started < 45 + 30, proc.stdout[-3000:]
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["environment"]["usable_gpu"] is False
    assert report["throughput"]["rc"] == 124, proc.stdout[-3000:]  # stopped at the budget
    measured = [json.loads(line) for line in (out / "throughput.jsonl").read_text().splitlines()]
    assert 1 <= len(measured) < len(rows) * reps, measured
    assert {m["row"] for m in measured} <= set(rows) and all(
        m["tokens_per_sec"] > 0 for m in measured
    )
    md = (out / "gpu_check.md").read_text()
    for m in measured:
        assert f"| gpt2-tiny ZeRO-2 | {m['row']} | {m['rep']} |" in md
    assert proc.returncode == 1  # a step that did not finish


@pytest.mark.slow
def test_optimizers_benchmark_sweeps_keeps_the_best_lr_and_prints_both_rows(
    shakespeare_dir, tmp_path
):
    """Two launches: AdamW and Muon at one lr each (the sweep's choice among lrs is the next
    test's); AdamW's row is its run, which reaches its final at its last evaluation: all its
    tokens."""
    proc = run_benchmark(
        "optimizers",
        "--model", "gpt2-tiny", "--block_size", "64", "--micro_batch_size", "2",
        "--max_iters", "4", "--warmup_iters", "1", "--eval_interval", "2", "--eval_iters", "1",
        "--seeds", "1", "--adamw_lrs", "2e-3", "--muon_lrs", "0.02",
        data_dir=shakespeare_dir,
        work_dir=tmp_path,
        timeout=900,
    )  # fmt: skip
    out = proc.stdout
    swept = dict(re.findall(r"^  adamw_lr([\d.e-]+)_seed1337: final val loss ([\d.]+)", out, re.M))
    assert len(swept) == 1, out
    (best,) = swept
    rows = re.findall(r"^\| (AdamW|Muon[^|]*) \| ([\d.e-]+) \| 1 \| ([\d.]+) \(1 seed\) \| "
                      r"([^|]+) \| ([\d,]+) \| ([\d.]+) GiB \|$", out, re.M)  # fmt: skip
    assert [r[0].split()[0] for r in rows] == ["AdamW", "Muon"], out
    adamw, muon = rows
    assert float(adamw[1]) == float(best) and adamw[2] == swept[best]
    assert adamw[3].strip() == "1,024 (100%)", out  # 4 steps of 2 ranks x 2 x 64 tokens
    assert float(muon[1]) == 0.02 and float(muon[5]) > 0.1
    assert "AdamW's final val loss" in out and f"{float(swept[best]):.4f} is the target" in out


def test_the_optimizers_sweep_keeps_the_lowest_final_loss_and_seeds_it(monkeypatch, tmp_path):
    """`sweep` trains every lr at the first seed, keeps the lr of the lowest final val loss and
    trains the other seeds at it (each launch stood in for by its result, set by lr)."""
    import optimizers

    finals = {6e-4: 5.0, 2e-3: 4.0, 6e-3: 4.5}
    launched = []

    def train(_args, _work, optimizer, lr, seed, _adamw_lr):
        launched.append((lr, seed))
        return optimizers.Run(optimizer, lr, seed, [(0, 11.0), (1024, finals[lr])], 1.0, 0.5)

    monkeypatch.setattr(optimizers, "train", train)
    args = argparse.Namespace(first_seed=1337, seeds=3)
    runs = optimizers.sweep(args, tmp_path, "adamw", list(finals), adamw_lr=6e-4)
    assert [(r.lr, r.seed) for r in runs] == [(2e-3, 1337), (2e-3, 1338), (2e-3, 1339)]
    assert launched == [(6e-4, 1337), (2e-3, 1337), (6e-3, 1337), (2e-3, 1338), (2e-3, 1339)]
