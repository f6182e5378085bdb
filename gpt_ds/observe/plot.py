"""Training curves from `OUT_DIR/metrics.jsonl`: runs loaded into series, drawn as one figure.

Both record formats are read. A record's kind is its "kind" field ("train", "eval", "event")
where it has one, else inferred: "val_loss" -> eval, "loss" -> train, "event" -> event.

Tokens seen: a record's own cumulative "tokens" where it has one. Otherwise it is computed per
launch (each "start" event begins one and carries the run config and world size): tokens per
iteration = micro_batch_size x grad_accum x world_size x block_size when the config gives all
four (exact), else the launch's median of tokens_per_sec x step_time_s (what each train record
logged per iteration, to the rounding of those two fields), snapped to a multiple of
block_size x world_size where those are known. A launch resumed at iteration s counts on from
the tokens the previous launch had seen at s, so a change of batch or world size bends the
line instead of rescaling the whole run.

Crashes and resumes: a launch that starts at iteration s replaces what earlier launches logged
after s (the newer launch's records win; a dead branch's later records are dropped), and an
iteration logged twice keeps its last record. A launch killed before its first checkpoint,
the run then started afresh by --resume auto, is drawn apart (dotted, by iteration): its
records are in metrics.jsonl.attempt-<run id>.

matplotlib (the `plot` extra) is imported only by `draw`, so loading stays light.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpt_ds.base.errors import GptDsError
from gpt_ds.observe.metrics_file import read_attempts, read_metrics, record_kind

INSTALL_HINT = "pip install 'gpt_ds[plot]'"
HELLASWAG = "hellaswag_acc_norm"  # an eval record's HellaSwag score (training/hellaswag.py)
SOURCE_PREFIX = "val_loss/"  # a mixture's per-source val loss in metrics.jsonl (metrics.py)
ATTEMPT_LABEL = "killed before its first checkpoint (run restarted)"
SOURCE_MARKERS = ("s", "^", "v", "D", "P", "X", "*", "<", ">")  # one per source, in order


@dataclass
class RunSeries:
    """One run's curves, each list in iteration order: what `draw` plots, nothing else."""

    label: str
    path: Path  # the metrics.jsonl read
    train_iters: list[int] = field(default_factory=list)
    train_tokens: list[float] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    tokens_per_sec: list[float] = field(default_factory=list)
    eval_iters: list[int] = field(default_factory=list)
    eval_tokens: list[float] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    val_by_source: dict[str, list[float]] = field(default_factory=dict)
    """A mixture's val loss of each source (`val_loss/<name>`), at eval_iters."""
    hellaswag: list[float] = field(default_factory=list)
    """HellaSwag acc_norm at eval_iters (NaN where not scored); empty without --hellaswag."""
    attempts: dict[str, tuple[list[int], list[float]]] = field(default_factory=dict)
    """Launches killed before their first checkpoint, the run then started afresh: run id ->
    (iterations, train losses), drawn apart from the run (metrics.jsonl.attempt-<run id>)."""


@dataclass
class _Launch:
    """One launch of the run: where it started, its tokens per iteration, its tokens there."""

    start_iter: int
    start: dict | None  # its "start" event, if the file has it
    records: list[dict] = field(default_factory=list)
    tokens_per_iter: float | None = None
    base_tokens: float = 0.0

    def tokens_at(self, iteration: int) -> float | None:
        if self.tokens_per_iter is None:
            return None
        return self.base_tokens + (iteration - self.start_iter) * self.tokens_per_iter


def _split_launches(records: list[dict]) -> list[_Launch]:
    """The records grouped by launch: a new one at each "start" event."""
    launches = [_Launch(start_iter=0, start=None)]
    for rec in records:
        if record_kind(rec) == "event" and rec.get("event") == "start":
            launches.append(_Launch(start_iter=int(rec.get("iter", 0)), start=rec))
        else:
            launches[-1].records.append(rec)
    return [x for x in launches if x.start is not None or x.records]


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _tokens_per_iter(launch: _Launch) -> float | None:
    """Exact from the start event's config, else estimated from the logged throughput."""
    start = launch.start or {}
    cfg = start.get("config") or {}
    world = _positive_int(start.get("world_size"))
    block = _positive_int(cfg.get("block_size"))
    micro, accum = _positive_int(cfg.get("micro_batch_size")), _positive_int(cfg.get("grad_accum"))
    if world and block and micro and accum:
        return float(micro * accum * world * block)
    per_iter = [
        r["tokens_per_sec"] * r["step_time_s"]
        for r in launch.records
        if record_kind(r) == "train" and "tokens_per_sec" in r and "step_time_s" in r
    ]
    if not per_iter:
        return None
    estimate = statistics.median(per_iter)
    unit = block * world if block and world else 1
    return float(max(1, round(estimate / unit)) * unit)


def _with_tokens(launches: list[_Launch]) -> list[dict]:
    """The records again, in file order, train and eval ones with "tokens" filled in where it
    can be computed (None where it cannot)."""
    out: list[dict] = []
    previous: _Launch | None = None
    for launch in launches:
        launch.tokens_per_iter = _tokens_per_iter(launch)
        # tokens seen when the launch began: the previous launch's count there, else (a file
        # that starts with a resumed launch) as many iterations at this launch's batch
        before = previous.tokens_at(launch.start_iter) if previous else None
        launch.base_tokens = (
            before if before is not None else launch.start_iter * (launch.tokens_per_iter or 0.0)
        )
        out += [launch.start] if launch.start is not None else []
        for rec in launch.records:
            if record_kind(rec) in ("train", "eval") and "iter" in rec:
                rec = {**rec, "tokens": rec.get("tokens", launch.tokens_at(int(rec["iter"])))}
            out.append(rec)
        previous = launch
    return out


def latest_records(records: list[dict]) -> list[dict]:
    """Of the records (train or eval, with the events between them) logged for an iteration,
    the last; in iteration order, events left out.

    A "start" event at iteration s (a resumed launch) first drops every earlier record after s:
    that branch of the run was abandoned when it crashed.
    """
    kept: dict[int, dict] = {}
    for rec in records:
        if record_kind(rec) != "event":
            kept[int(rec["iter"])] = rec
        elif rec.get("event") == "start":
            start = int(rec.get("iter", 0))
            kept = {i: r for i, r in kept.items() if i <= start}
    return [kept[i] for i in sorted(kept)]


def _read(out_dir: Path) -> tuple[Path, list[dict]]:
    path = Path(out_dir) / "metrics.jsonl"
    if not path.is_file():
        raise GptDsError(
            f"{path}: no such file: is {out_dir} the --out_dir of a gpt_ds run that has logged?"
        )
    try:
        records = read_metrics(out_dir, tolerate_partial_last_line=True)
    except ValueError as e:  # names the file and line
        raise GptDsError(f"{e}: fix or delete that line") from None
    except OSError as e:
        raise GptDsError(f"{path}: cannot read it ({e})") from None
    bad = next((r for r in records if not isinstance(r, dict)), None)
    if bad is not None:
        raise GptDsError(f"{path}: a line is not a JSON object: {str(bad)[:80]!r}")
    return path, records


def _kinds(records: list[dict], kind: str) -> list[dict]:
    """The records of one kind (that name their iteration) with the events, in file order."""
    return [
        r for r in records if record_kind(r) == "event" or (record_kind(r) == kind and "iter" in r)
    ]


def load_run(out_dir: str | Path, label: str | None = None) -> RunSeries:
    """One run's series from its metrics.jsonl (label: the out dir's name by default)."""
    path, records = _read(Path(out_dir))
    records = _with_tokens(_split_launches(records))
    train, evals = (latest_records(_kinds(records, kind)) for kind in ("train", "eval"))
    if not train:
        raise GptDsError(
            f"{path}: no training records: the run has not logged an iteration yet (it logs "
            "every --log_interval iterations); plot it once it has"
        )
    if any(r["tokens"] is None for r in train + evals):
        raise GptDsError(
            f'{path}: cannot tell the tokens seen: the records carry no "tokens", no '
            "tokens_per_sec and step_time_s, and no start event with the batch; is it a gpt_ds "
            "metrics file?"
        )
    return RunSeries(
        label=label if label is not None else Path(os.path.abspath(out_dir)).name,
        path=path,
        train_iters=[int(r["iter"]) for r in train],
        train_tokens=[float(r["tokens"]) for r in train],
        train_loss=[float(r["loss"]) for r in train],
        tokens_per_sec=[float(r.get("tokens_per_sec", math.nan)) for r in train],
        eval_iters=[int(r["iter"]) for r in evals],
        eval_tokens=[float(r["tokens"]) for r in evals],
        val_loss=[float(r["val_loss"]) for r in evals],
        val_by_source=_by_source(evals),
        hellaswag=_hellaswag(evals),
        attempts=_attempts(Path(out_dir)),
    )


def _attempts(out_dir: Path) -> dict[str, tuple[list[int], list[float]]]:
    """The train curve of each killed attempt set aside in `out_dir` (none logged: left out)."""
    curves = {}
    for run_id, records in read_attempts(out_dir).items():
        train = latest_records(_kinds(records, "train"))
        if train:
            curves[run_id] = ([int(r["iter"]) for r in train], [float(r["loss"]) for r in train])
    return curves


def _hellaswag(evals: list[dict]) -> list[float]:
    """acc_norm at each evaluation of a run scored with --hellaswag (NaN where one lacks it)."""
    if not any(HELLASWAG in r for r in evals):
        return []
    return [float(r.get(HELLASWAG, math.nan)) for r in evals]


def _by_source(evals: list[dict]) -> dict[str, list[float]]:
    """{source: its val loss at each evaluation} of a mixture run (NaN where one is absent)."""
    names = dict.fromkeys(k for r in evals for k in r if k.startswith(SOURCE_PREFIX))
    return {
        name.removeprefix(SOURCE_PREFIX): [float(r.get(name, math.nan)) for r in evals]
        for name in names
    }


def load_runs(out_dirs: Sequence[str | Path], labels: list[str] | None = None) -> list[RunSeries]:
    """Several runs' series; `labels` (one per out dir) name them in the legend."""
    if labels is not None and len(labels) != len(out_dirs):
        raise GptDsError(
            f"--labels: {len(labels)} label(s) for {len(out_dirs)} out dir(s); give one per "
            "out dir, in the same order, or none (then each run is named by its out dir)"
        )
    return [load_run(d, labels[i] if labels else None) for i, d in enumerate(out_dirs)]


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average over the last `window` logged values (fewer at the start);
    window <= 1 returns the values unchanged."""
    if window <= 1:
        return list(values)
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def _matplotlib():
    """matplotlib's Figure and ticker, with the Agg canvas (no display needed), or a clear
    error naming the extra that installs it."""
    try:
        from matplotlib import ticker
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.lines import Line2D
    except ImportError as e:
        raise GptDsError(
            f"plotting needs matplotlib, which is not installed ({e}): {INSTALL_HINT}"
        ) from None
    return Figure, FigureCanvasAgg, ticker, Line2D


def _title(runs: list[RunSeries]) -> str:
    if len(runs) > 1:
        return f"{len(runs)} runs: " + ", ".join(r.label for r in runs)
    run = runs[0]
    title = f"{run.label}: {run.train_iters[-1]:,} iterations, {_eng(run.train_tokens[-1])} tokens"
    if run.val_loss:
        title += f", val loss {run.val_loss[-1]:.3f} at iteration {run.eval_iters[-1]:,}"
    return title


def _eng(value: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.0f}"


def _draw_losses(ax, run: RunSeries, xs: list, val_xs: list, color: str, window: int) -> None:
    """One run's train loss (raw faint under the smoothed line when smoothing) and val loss."""
    if window > 1:
        ax.plot(xs, run.train_loss, color=color, alpha=0.25, lw=1, gid=f"{run.label}/train_raw")
    ys = smooth(run.train_loss, window)
    ax.plot(xs, ys, color=color, lw=1.6, label=run.label, gid=f"{run.label}/train")
    if run.val_loss:
        style = {"ls": "--", "marker": "o", "ms": 4, "lw": 1.2}
        ax.plot(val_xs, run.val_loss, color=color, gid=f"{run.label}/val", **style)
    for (name, losses), marker in zip(run.val_by_source.items(), SOURCE_MARKERS, strict=False):
        style = {"ls": ":", "marker": marker, "ms": 4, "lw": 1.0, "alpha": 0.8}
        ax.plot(val_xs, losses, color=color, gid=f"{run.label}/val/{name}", **style)


def _decorate(fig, axes: tuple, runs: list[RunSeries], window: int, log_y: bool) -> None:
    """Titles, axis labels and scales, grids, and the legend: colours are runs (when several),
    the line style tells train from val."""
    _, _, ticker, Line2D = _matplotlib()
    by_iter, by_tokens, speed = axes
    train_name = f"train (mean of {window})" if window > 1 else "train"
    styles = [
        Line2D([], [], color="0.35", lw=1.6, label=train_name),
        Line2D([], [], color="0.35", ls="--", marker="o", ms=4, label="val"),
    ]
    sources = dict.fromkeys(name for run in runs for name in run.val_by_source)
    styles += [
        Line2D([], [], color="0.35", ls=":", marker=marker, ms=4, label=f"val: {name}")
        for name, marker in zip(sources, SOURCE_MARKERS, strict=False)
    ]
    if any(run.attempts for run in runs):
        styles.append(Line2D([], [], color="0.35", ls=":", lw=1, label=ATTEMPT_LABEL))
    run_lines = by_iter.get_legend_handles_labels()[0] if len(runs) > 1 else []
    by_iter.legend(handles=run_lines + styles, fontsize="small")
    for ax, xlabel, title in (
        (by_iter, "iteration", "loss by iteration"),
        (by_tokens, "tokens seen", "loss by tokens seen"),
    ):
        ax.set(xlabel=xlabel, ylabel="loss (log scale)" if log_y else "loss")
        ax.set_yscale("log" if log_y else "linear")
        ax.set_title(title, fontsize="medium")
    by_tokens.xaxis.set_major_formatter(ticker.EngFormatter())
    speed.set(xlabel="iteration", ylabel="tokens/s", ylim=(0, None))
    speed.yaxis.set_major_formatter(ticker.EngFormatter())
    speed.set_title("throughput (all ranks)", fontsize="medium")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(_title(runs))


def draw(
    runs: list[RunSeries],
    smooth_window: int = 0,
    log_y: bool = False,
    width: int = 1200,
    height: int = 800,
    dpi: int = 100,
):
    """The figure (a matplotlib Figure, `width` x `height` pixels): loss against iterations
    and against tokens seen on top, tokens/s against iterations below (beside HellaSwag's
    acc_norm for runs scored with --hellaswag), one colour per run. Each line's gid is
    "LABEL/train", "LABEL/train_raw", "LABEL/val", "LABEL/tokens_per_sec" or
    "LABEL/hellaswag" (tests read the plotted data back by it); a killed attempt's train loss,
    on the iteration axis only, "LABEL/attempt/RUN_ID"."""
    Figure, FigureCanvasAgg, _, _ = _matplotlib()
    fig = Figure(figsize=(width / dpi, height / dpi), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)  # attaches itself: savefig renders with Agg, no display needed
    grid = fig.add_gridspec(2, 2, height_ratios=[3, 2])
    scored = any(run.hellaswag for run in runs)
    axes = (
        fig.add_subplot(grid[0, 0]),
        fig.add_subplot(grid[0, 1]),
        fig.add_subplot(grid[1, 0] if scored else grid[1, :]),
    )
    hellaswag = fig.add_subplot(grid[1, 1]) if scored else None
    for i, run in enumerate(runs):
        color = f"C{i % 10}"
        _draw_losses(axes[0], run, run.train_iters, run.eval_iters, color, smooth_window)
        _draw_losses(axes[1], run, run.train_tokens, run.eval_tokens, color, smooth_window)
        for run_id, (iters, losses) in run.attempts.items():
            gid = f"{run.label}/attempt/{run_id}"
            axes[0].plot(iters, losses, color=color, ls=":", lw=1, alpha=0.7, gid=gid)
        gid = f"{run.label}/tokens_per_sec"
        axes[2].plot(run.train_iters, run.tokens_per_sec, color=color, lw=1.4, gid=gid)
        if hellaswag is not None and run.hellaswag:
            style = {"ls": "--", "marker": "o", "ms": 4, "lw": 1.2}
            gid = f"{run.label}/hellaswag"
            hellaswag.plot(run.eval_iters, run.hellaswag, color=color, gid=gid, **style)
    _decorate(fig, axes, runs, smooth_window, log_y)
    if hellaswag is not None:
        hellaswag.axhline(0.25, color="0.5", ls=":", lw=1, label="chance (0.25)")
        hellaswag.set(xlabel="iteration", ylabel="acc_norm")
        hellaswag.set_title("HellaSwag acc_norm", fontsize="medium")
        hellaswag.legend(fontsize="small")
        hellaswag.grid(alpha=0.3)
    return fig


def save(fig, output: str | Path) -> Path:
    """Write the figure (PNG, or SVG/PDF by the suffix); makes the parent directory."""
    output = Path(output)
    if output.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise GptDsError(f"--output {output}: give a .png (or .svg, .pdf) file name")
    output.parent.mkdir(parents=True, exist_ok=True)
    try:
        fig.savefig(output)
    except OSError as e:
        raise GptDsError(f"--output {output}: cannot write the figure ({e})") from None
    return output
