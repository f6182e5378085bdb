"""tools/plot_metrics.py: the curves it draws are the records of metrics.jsonl.

Real runs (conftest.stage_run: 24 iterations, 2 ranks) are plotted alone and overlaid, and the
figure's lines are read back and compared with the file read independently (plain json). The
resume and format rules are checked on files written by the training's own MetricsLogger (the
older format) or by hand (the newer "kind"/"tokens" records).
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from harness.launch import STAGE_RUN_ITERS
from support.launch import REPO

from gpt_ds.base.errors import GptDsError
from gpt_ds.commands.plot_metrics import main
from gpt_ds.observe import metrics_file, plot

# the stage runs' batch (support.launch.tiny_run_args): micro 4 x accum 1 x 2 ranks x block 64
STAGE_TOKENS_PER_ITER = 4 * 1 * 2 * 64


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the PNG's IHDR chunk, read by hand (not by matplotlib)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path}: not a PNG"
    return struct.unpack(">II", data[16:24])


def lines(fig) -> dict[tuple[int, str], np.ndarray]:
    """(axes index, gid) -> the (x, y) points the line was drawn with."""
    return {
        (i, line.get_gid()): np.asarray(line.get_xydata())
        for i, ax in enumerate(fig.axes)
        for line in ax.get_lines()
        if line.get_gid()
    }


def records_by_iter(out: Path, field: str) -> dict[int, dict]:
    """iteration -> last record holding `field`, from the raw file."""
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["iter"]: r for r in rows if field in r}


def check_drawn(fig, label: str, out: Path, tokens_per_iter: int) -> None:
    """Every curve of `label` in `fig` equals the records of `out`'s metrics.jsonl."""
    drawn = lines(fig)
    train, evals = records_by_iter(out, "loss"), records_by_iter(out, "val_loss")
    iters, val_iters = sorted(train), sorted(evals)
    loss = [train[i]["loss"] for i in iters]
    val = [evals[i]["val_loss"] for i in val_iters]
    expected = {
        (0, f"{label}/train"): (iters, loss),
        (1, f"{label}/train"): ([i * tokens_per_iter for i in iters], loss),
        (0, f"{label}/val"): (val_iters, val),
        (1, f"{label}/val"): ([i * tokens_per_iter for i in val_iters], val),
        (2, f"{label}/tokens_per_sec"): (iters, [train[i]["tokens_per_sec"] for i in iters]),
    }
    scores = [evals[i].get("hellaswag_acc_norm") for i in val_iters]
    if any(x is not None for x in scores):  # --hellaswag: its panel, right of the throughput
        expected[3, f"{label}/hellaswag"] = (val_iters, scores)
    for key, (xs, ys) in expected.items():
        np.testing.assert_array_equal(drawn[key], np.column_stack([xs, ys]), err_msg=str(key))


@pytest.mark.slow
def test_plot_of_a_real_run_draws_its_records(stage_run, tmp_path, capsys):
    out = stage_run(2)[0]
    png = tmp_path / "one.png"
    assert main([str(out), "--output", str(png), "--width", "900", "--height", "600"]) == 0
    assert png_size(png) == (900, 600)
    assert f"wrote {png}" in capsys.readouterr().out
    runs = plot.load_runs([out])
    assert runs[0].label == out.name and runs[0].train_iters == list(range(1, 25))
    fig = plot.draw(runs)
    check_drawn(fig, out.name, out, STAGE_TOKENS_PER_ITER)
    assert f"{STAGE_RUN_ITERS} iterations" in fig.get_suptitle()
    assert fig.axes[3].get_title() == "HellaSwag acc_norm"  # the run scored --hellaswag

    # the same records in the older format, without "kind", "tokens" and the start event (no
    # config to read the batch from): kinds inferred, tokens from the logged throughput
    old = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    old = [{k: v for k, v in r.items() if k not in ("kind", "tokens")} for r in old]
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in old if r.get("event") != "start")
    )
    check_drawn(
        plot.draw(plot.load_runs([tmp_path / "old"], ["old"])), "old", out, STAGE_TOKENS_PER_ITER
    )


@pytest.mark.slow
def test_two_runs_overlaid_with_labels_smoothing_and_log_scale(stage_run, tmp_path):
    outs = [stage_run(2)[0], stage_run(3)[0]]
    png = tmp_path / "two.png"
    argv = [*map(str, outs), "--labels", "zero2", "zero3", "--smooth", "3", "--log_y"]
    assert main([*argv, "--output", str(png)]) == 0
    assert png_size(png) == (1200, 800)
    fig = plot.draw(plot.load_runs(outs, ["zero2", "zero3"]), smooth_window=3, log_y=True)
    drawn = lines(fig)
    for label, out in zip(["zero2", "zero3"], outs, strict=True):
        train = records_by_iter(out, "loss")
        raw = [train[i]["loss"] for i in sorted(train)]
        np.testing.assert_array_equal(drawn[0, f"{label}/train_raw"][:, 1], raw)
        mean3 = np.convolve(raw, np.ones(3) / 3, mode="valid")  # windows of 3 full points
        np.testing.assert_allclose(drawn[0, f"{label}/train"][2:, 1], mean3, rtol=1e-12)
        np.testing.assert_array_equal(drawn[2, f"{label}/tokens_per_sec"][:, 0], sorted(train))
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend == ["zero2", "zero3", "train (mean of 3)", "val"]
    # loss axes only: throughput and HellaSwag (both runs scored it) stay linear
    assert [ax.get_yscale() for ax in fig.axes] == ["log", "log", "linear", "linear"]
    assert fig.get_suptitle() == "2 runs: zero2, zero3"


START_CONFIG = {"micro_batch_size": 4, "grad_accum": 2, "block_size": 64}  # 1024 tokens/iter


def write_launch(
    out: Path,
    run_id: str,
    start_iter: int,
    iters: range,
    evals: tuple[int, ...] = (),
    config: dict | None = None,
    world_size: int = 2,
    loss_offset: float = 0.0,
    seconds: float = 0.25,
) -> None:
    """Append one launch's records in the older format (no "kind", no "tokens"; throughput
    rounded as that logger rounded it): one train record per iteration, each taking `seconds`,
    loss = 10 - iteration / 10 + loss_offset, a checkpoint event after each eval."""
    cfg = {**START_CONFIG, **(config or {})}
    per_iter = (cfg["micro_batch_size"] or 4) * (cfg["grad_accum"] or 2) * world_size * 64
    rows: list[dict] = [
        {"event": "start", "iter": start_iter, "world_size": world_size, "config": cfg}
    ]
    for it in iters:
        loss = 10 - it / 10 + loss_offset
        rows.append(
            {"iter": it, "loss": loss, "lr": 1e-3, "tokens_per_sec": round(per_iter / seconds, 1),
             "step_time_s": round(seconds, 4), "peak_mem_gib": 0.5}
        )  # fmt: skip
        if it in evals:
            rows.append({"iter": it, "val_loss": loss - 1, "val_ppl": 100.0})
            rows.append({"event": "checkpoint", "iter": it, "tag": f"iter_{it}"})
    with (out / "metrics.jsonl").open("a") as f:
        f.writelines(json.dumps({**r, "time": 0.0, "run_id": run_id}) + "\n" for r in rows)


def test_a_resumed_launch_replaces_what_the_crashed_one_logged_after_its_start(tmp_path):
    # launch a crashed at 9 after saving at 4; launch b resumed from 4 with 4 ranks and is at 8:
    # a's 5..9 are a dead branch, 9 included
    write_launch(tmp_path, "a", 0, range(1, 10), evals=(4,))
    write_launch(tmp_path, "b", 4, range(5, 9), evals=(8,), world_size=4, loss_offset=1.0)
    run = plot.load_run(tmp_path, "r")
    assert run.train_iters == list(range(1, 9))
    assert run.train_loss == [10 - i / 10 + (i > 4) for i in range(1, 9)]
    # 1024 tokens per iteration up to 4, then 2048 (4 ranks)
    assert run.train_tokens == [1024 * min(i, 4) + 2048 * max(i - 4, 0) for i in range(1, 9)]
    assert (run.eval_iters, run.eval_tokens) == ([4, 8], [4096, 4096 + 4 * 2048])
    assert run.val_loss == [10 - 0.4 - 1, 10 - 0.8 + 1 - 1]


def test_a_killed_attempt_set_aside_is_drawn_apart_from_the_run(tmp_path):
    """A launch killed before its first checkpoint (records to iteration 3, a torn last line),
    the run then started afresh by --resume auto: set_aside_attempt moves its file aside, the
    run's curves are the new launch's only, and the attempt's train loss is drawn dotted on the
    iteration axis under its run id, said by the tool."""
    write_launch(tmp_path, "killed", 0, range(1, 4), loss_offset=0.5)
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"iter": 4, "lo')
    aside = metrics_file.set_aside_attempt(tmp_path)
    assert aside == tmp_path / "metrics.jsonl.attempt-killed" and aside.is_file()
    assert not (tmp_path / "metrics.jsonl").exists()
    write_launch(tmp_path, "afresh", 0, range(1, 7))
    assert [r["iter"] for r in metrics_file.read_attempts(tmp_path)["killed"]] == [0, 1, 2, 3]
    run = plot.load_run(tmp_path, "r")
    assert run.train_iters == list(range(1, 7))
    assert run.attempts == {"killed": ([1, 2, 3], [10 - i / 10 + 0.5 for i in (1, 2, 3)])}
    drawn = lines(plot.draw([run]))
    expected = np.column_stack([[1, 2, 3], run.attempts["killed"][1]])
    np.testing.assert_array_equal(drawn[0, "r/attempt/killed"], expected)
    assert not any(gid.startswith("r/attempt") for ax, gid in drawn if ax != 0)
    legend = plot.draw([run]).axes[0].get_legend().get_texts()
    assert plot.ATTEMPT_LABEL in [t.get_text() for t in legend]


def test_an_iteration_logged_twice_keeps_its_last_record(tmp_path):
    write_launch(tmp_path, "a", 0, range(1, 7))
    with (tmp_path / "metrics.jsonl").open("a") as f:  # no start event: a hand-joined file
        f.write(json.dumps({"iter": 3, "loss": 1.5, "tokens_per_sec": 1.0, "step_time_s": 1024}))
        f.write("\n")
    run = plot.load_run(tmp_path)
    assert run.train_iters == list(range(1, 7))
    assert run.train_loss[2] == 1.5 and run.train_loss[3] == 10 - 0.4


def test_tokens_from_the_logged_throughput_when_the_config_leaves_the_batch_to_the_preset(
    tmp_path,
):
    cfg = {"micro_batch_size": None}
    write_launch(tmp_path, "a", 0, range(1, 11), config=cfg, seconds=0.01234)
    # tokens_per_sec x step_time_s = 82982.2 x 0.0123 = 1020.7 (both logged rounded), snapped
    # to a multiple of block x world = 128
    assert plot.load_run(tmp_path).train_tokens == [1024.0 * i for i in range(1, 11)]


def test_records_of_the_newer_format_use_their_kind_and_tokens(tmp_path):
    rows = [
        {"kind": "event", "event": "start", "iter": 0, "world_size": 2, "config": START_CONFIG},
        *(
            {
                "kind": "train",
                "iter": i,
                "loss": 5.0 - i,
                "tokens": 1000 * i,
                "grad_norm": 1.0,
                "tokens_per_sec": 3000.0,
                "step_time_s": 0.25,
            }
            for i in (1, 2, 3)
        ),
        # a kind overrides the fields: this event is no train record despite its "loss"
        {"kind": "event", "event": "note", "iter": 3, "loss": 99.0},
        {"kind": "eval", "iter": 3, "val_loss": 2.5, "tokens": 3000, "train_loss": 2.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = plot.load_run(tmp_path)
    assert (run.train_iters, run.train_loss) == ([1, 2, 3], [4.0, 3.0, 2.0])
    assert run.train_tokens == [1000, 2000, 3000] and run.eval_tokens == [3000]
    assert run.val_loss == [2.5]


def test_a_mixtures_sources_get_their_own_val_curves(tmp_path):
    """val_loss/<source> records (metrics.py, a --data_dir mixture) become one curve each."""
    rows = [
        {"kind": "event", "event": "start", "iter": 0, "world_size": 2, "config": START_CONFIG},
        *({"kind": "train", "iter": i, "loss": 5.0 - i, "tokens": 100 * i} for i in (1, 2, 3, 4)),
        *(
            {"kind": "eval", "iter": i, "tokens": 100 * i, "val_loss": 3.0 / i,
             "val_loss/web": 2.0 / i, "val_loss/books": 6.0 / i}
            for i in (2, 4)
        ),
    ]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = plot.load_run(tmp_path, "mix")
    assert run.val_by_source == {"web": [1.0, 0.5], "books": [3.0, 1.5]}
    drawn = lines(plot.draw([run]))
    np.testing.assert_array_equal(drawn[0, "mix/val/books"], [[2, 3.0], [4, 1.5]])
    np.testing.assert_array_equal(drawn[1, "mix/val/web"], [[200, 1.0], [400, 0.5]])


def test_smooth_is_the_trailing_mean():
    values = [4.0, 2.0, 6.0, 0.0, 8.0]
    assert plot.smooth(values, 2) == [4.0, 3.0, 4.0, 3.0, 4.0]
    assert plot.smooth(values, 0) == values == plot.smooth(values, 1)


@pytest.mark.parametrize(
    ("content", "argv", "message"),
    [
        (None, [], "metrics.jsonl: no such file"),
        ('{"iter": 1, "loss": 2.0}\nnot json\n{"iter": 2}\n', [], "metrics.jsonl:2: not a JSON"),
        ('{"event": "start", "iter": 0}\n', [], "no training records"),
        ('{"iter": 1, "loss": 2.0, "lr": 0.1}\n', [], "cannot tell the tokens seen"),
        ('{"iter": 1, "loss": 2.0, "tokens": 5}\n', ["--labels", "a", "b"], "1 out dir"),
        ('{"iter": 1, "loss": 2.0, "tokens": 5}\n', ["--smooth", "-1"], "--smooth must be"),
    ],
)
def test_bad_inputs_are_clear_errors(tmp_path, capsys, content, argv, message):
    run = tmp_path / "run"
    run.mkdir()
    if content is not None:
        (run / "metrics.jsonl").write_text(content)
    assert main([str(run), "--output", str(tmp_path / "x.png"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err, err
    assert not (tmp_path / "x.png").exists()


def test_a_bad_output_name_is_a_clear_error(tmp_path):
    write_launch(tmp_path, "a", 0, range(1, 3))
    with pytest.raises(GptDsError, match=r"--output .*x\.txt: give a \.png"):
        plot.save(plot.draw(plot.load_runs([tmp_path])), tmp_path / "x.txt")


def test_without_matplotlib_the_error_names_the_extra(tmp_path):
    write_launch(tmp_path, "a", 0, range(1, 3))
    code = (
        "import sys; sys.modules['matplotlib'] = None  # as if not installed\n"
        "from gpt_ds.commands.plot_metrics import main\n"
        f"sys.exit(main([{str(tmp_path)!r}, '--output', {str(tmp_path / 'x.png')!r}]))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert "pip install 'gpt_ds[plot]'" in proc.stderr
