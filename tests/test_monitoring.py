"""What users watch: the monitors (TensorBoard, CSV, W&B offline) fed from a real 2-rank run
and read back with each tool's own reader against metrics.jsonl; the log line; the MFU table;
checkpoints on their own interval; W&B refused at start without an API key."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
from harness.launch import run_deepspeed, run_python
from helpers.files import HELLASWAG_MINI
from helpers.messages import assert_names
from support.launch import launch_env, tiny_run_args

from gpt_ds.observe.metrics import format_duration
from gpt_ds.observe.metrics_file import read_metrics
from gpt_ds.observe.peak_flops import lookup

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "name, model, tflops",
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.4),
        ("NVIDIA H100 PCIe", "H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", "H100 NVL", 835.0),
        ("NVIDIA H200", "H200", 989.4),
        ("NVIDIA B200", "B200", 2250.0),
        ("NVIDIA GB200", "GB200", 2500.0),
        ("NVIDIA A100-SXM4-80GB", "A100", 312.0),
        ("NVIDIA L40S", "L40S", 362.1),
        ("NVIDIA L40", "L40", 181.0),
        ("NVIDIA L4", "L4", 121.0),
        ("NVIDIA A10G", "A10G", 125.0),
        ("Tesla V100-SXM2-32GB", "V100", 125.0),
        ("AMD Instinct MI300X", "MI300X", 1307.4),
        ("AMD Instinct MI325X", "MI325X", 1307.4),
        ("AMD Instinct MI355X", "MI355X", 2500.0),
        # per GCD (a rank's device), not the two-GCD package's 383.0 / 362.1
        ("AMD Instinct MI250X/MI250", "MI250X (1 GCD)", 191.5),
        ("AMD Instinct MI250X", "MI250X (1 GCD)", 191.5),
        ("AMD Instinct MI250", "MI250 (1 GCD)", 181.0),
        ("AMD Instinct MI210", "MI210", 181.0),
        ("AMD Instinct MI100", "MI100", 92.3),  # bf16, not its 184.6 fp16 peak
        ("AMD Radeon AI PRO R9700", "Radeon AI PRO R9700", 191.0),
        ("AMD Radeon RX 7900 XTX", "RX 7900 XTX", 122.8),
        ("AMD Radeon RX 7900 XT", "RX 7900 XT", 103.0),
        ("AMD Radeon RX 7900 GRE", "RX 7900 GRE", 91.96),
    ],
)
def test_peak_table_matches_the_exact_model(name, model, tflops):
    assert lookup(name) == (model, tflops)


def test_unknown_devices_get_no_peak():
    assert lookup("NVIDIA GeForce GTX 1080") is None
    assert lookup("NVIDIA L4000") is None  # "L4" is not a prefix match


def test_eta_reads_at_a_glance():
    assert [format_duration(s) for s in (0, 45, 160, 11_100, 187_200)] == [
        "0s",
        "45s",
        "2m40s",
        "3h05m",
        "2d04h",
    ]


@pytest.fixture(scope="module")
def monitored_run(shakespeare_dir, tmp_path_factory):
    """6 iterations on 2 ranks with TensorBoard, CSV and W&B (offline) monitors, evaluations at
    3 and 6 (HellaSwag scored on the suite's mini file), checkpoints every 2 iterations."""
    root = tmp_path_factory.mktemp("monitored")
    out = root / "run"
    args = tiny_run_args(
        shakespeare_dir,
        out,
        max_iters=6,
        eval_interval=3,
        save_interval=2,
        log_interval=1,
        eval_iters=2,
        tensorboard_dir=root / "tb",
        csv_dir=root / "csv",
        wandb_project="gpt-ds-test",
        hellaswag=HELLASWAG_MINI,
    )
    env = {**launch_env(), "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    proc = run_deepspeed(args, num_gpus=2, env=env)
    return root, out, proc.stdout


def _records(out: Path, kind: str) -> list[dict]:
    return [r for r in read_metrics(out) if r["kind"] == kind]


@pytest.mark.slow
def test_metrics_records_have_kind_time_and_tokens(monitored_run, shakespeare_dir):
    _, out, stdout = monitored_run
    train, evals = _records(out, "train"), _records(out, "eval")
    assert [r["iter"] for r in train] == [1, 2, 3, 4, 5, 6]
    assert [r["iter"] for r in evals] == [3, 6]
    per_iter = 4 * 2 * 64  # micro-batch x ranks x block
    assert all(r["tokens"] == r["iter"] * per_iter for r in train + evals)
    assert all(r["grad_norm"] > 0 and r["time"] > 1e9 for r in train)
    assert all(r["kind"] == "event" for r in read_metrics(out) if "event" in r)
    line = re.search(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d iter 6/6 \| loss .*$", stdout, re.M)
    assert line, stdout[-3000:]
    for part in ("gnorm", "tok/s", "ms/it", "GiB", "TFLOP/s", "ETA 0s", "3.07K tok, epoch"):
        assert part in line.group(0)
    train_tokens = json.loads((shakespeare_dir / "meta.json").read_text())["train_tokens"]
    assert all(r["epoch"] == round(r["tokens"] / train_tokens, 4) for r in train)
    assert "MFU: not reported on CPU" in stdout
    # measured memory beside the prediction, at start-up and after the first step
    assert re.search(r"memory after start-up, peak per rank .*rank 1 [\d.]+ \([\d.]+\) GiB", stdout)
    assert re.search(r"peak memory per rank after step 1: rank 0 [\d.]+ GiB, rank 1", stdout)


@pytest.mark.slow
def test_checkpoints_follow_save_interval_and_best_tag_is_an_evaluated_one(monitored_run):
    _, out, _ = monitored_run
    saved = [r["tag"] for r in read_metrics(out) if r.get("event") == "checkpoint"]
    assert saved == ["iter_2", "iter_4", "final"]
    manifest = json.loads((out / "final" / "gpt_ds.json").read_text())
    val = {r["iter"]: r["val_loss"] for r in _records(out, "eval")}
    assert manifest["val_loss"] == val[6] and manifest["best_tag"] == "final"
    # iter_2 and iter_4 were saved between evaluations: no val loss of their own
    assert json.loads((out / "iter_4" / "gpt_ds.json").read_text())["val_loss"] is None


@pytest.mark.slow
def test_tensorboard_holds_the_metrics_at_their_steps(monitored_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    root, out, _ = monitored_run
    events = EventAccumulator(str(root / "tb" / "run"))
    events.Reload()
    scalars = {t: {e.step: e.value for e in events.Scalars(t)} for t in events.Tags()["scalars"]}
    train, evals = _records(out, "train"), _records(out, "eval")
    for key, tag in [
        ("loss", "train/loss"),
        ("lr", "train/lr"),
        ("grad_norm", "train/grad_norm"),
        ("tokens_per_sec", "train/tokens_per_sec"),
        ("peak_mem_gib", "train/memory_gib"),
        ("epoch", "train/epoch"),
    ]:
        assert scalars[tag] == pytest.approx({r["iter"]: r[key] for r in train}, rel=1e-6), tag
    assert scalars["val/loss"] == pytest.approx({r["iter"]: r["val_loss"] for r in evals})
    assert scalars["val/perplexity"] == pytest.approx({r["iter"]: r["val_ppl"] for r in evals})
    for key in ("hellaswag_acc_norm", "hellaswag_acc"):
        assert scalars[f"val/{key}"] == pytest.approx({r["iter"]: r[key] for r in evals}), key
    assert "val/hellaswag_examples" not in scalars  # a count, in metrics.jsonl only
    assert not any(t.startswith("Train/Samples") for t in scalars)  # DeepSpeed's own: off


@pytest.mark.slow
def test_csv_files_hold_the_same_values(monitored_run):
    root, out, _ = monitored_run
    with (root / "csv" / "run" / "train_loss.csv").open() as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["step", "loss"]
    logged = {r["iter"]: r["loss"] for r in _records(out, "train")}
    assert {int(s): float(v) for s, v in rows[1:]} == pytest.approx(logged)
    with (root / "csv" / "run" / "val_loss.csv").open() as f:
        assert [int(row[0]) for row in list(csv.reader(f))[1:]] == [3, 6]
    with (root / "csv" / "run" / "val_hellaswag_acc_norm.csv").open() as f:
        rows = list(csv.reader(f))[1:]
    scores = {r["iter"]: r["hellaswag_acc_norm"] for r in _records(out, "eval")}
    assert {int(s): float(v) for s, v in rows} == pytest.approx(scores)


@pytest.mark.slow
def test_wandb_offline_writes_its_run_directory(monitored_run):
    """The offline run's log (W&B's binary format, which `wandb sync` uploads; its Python reader
    left with 0.2x) holds every logged value, as the JSON W&B stores history values in."""
    _, out, _ = monitored_run
    runs = list((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, list((out / "wandb").iterdir())
    data = next(runs[0].glob("run-*.wandb")).read_bytes()
    assert b"train/loss" in data and b"val/loss" in data and b"gpt-ds-test" in data
    assert b"val/hellaswag_acc_norm" in data
    for r in _records(out, "train"):
        assert json.dumps(r["loss"]).encode() in data, r
    for r in _records(out, "eval"):
        assert json.dumps(r["val_loss"]).encode() in data, r


@pytest.mark.slow
def test_wandb_online_without_a_key_is_refused_before_training(shakespeare_dir, tmp_path):
    args = tiny_run_args(shakespeare_dir, tmp_path / "run", wandb_project="p")
    env = {k: v for k, v in launch_env().items() if not k.startswith("WANDB_")}
    env["HOME"] = str(tmp_path)  # no ~/.netrc
    proc = run_python([str(REPO / "gpt_ds" / "train.py"), *args], check=False, env=env)
    assert proc.returncode == 2
    assert_names(proc.stderr, "wandb", "WANDB_API_KEY", "WANDB_MODE=offline")  # the ways on
    assert not (tmp_path / "run").exists()


def test_a_configs_own_monitor_sections_write_under_the_out_dir():
    from gpt_ds.dsconfig.monitors import describe, wandb_mode, with_monitor_flags

    user = {"tensorboard": {"enabled": True, "output_path": ""}, "csv_monitor": {"enabled": False}}
    cfg = with_monitor_flags(
        user, "out/run", tensorboard_dir=None, csv_dir=None, wandb_project=None, run_name="run"
    )
    assert cfg["tensorboard"] == {
        "enabled": True,
        "output_path": "out/run/tensorboard",
        "job_name": "run",
    }
    assert cfg["csv_monitor"] == {"enabled": False} and user["tensorboard"]["output_path"] == ""
    flags = with_monitor_flags(
        {}, "out/run", tensorboard_dir="tb", csv_dir="csv", wandb_project="p", run_name="r1"
    )
    assert describe(flags, wandb_mode({"WANDB_MODE": "dryrun"})) == [
        "monitor: tensorboard -> tb/r1",
        "monitor: W&B project p (offline mode)",
        "monitor: csv_monitor -> csv/r1",
    ]
    assert flags["wandb"] == {"enabled": True, "project": "p"}
