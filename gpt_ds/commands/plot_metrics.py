"""Plot training runs from their OUT_DIR/metrics.jsonl: loss against iterations and against
tokens seen, and tokens/s; several runs are overlaid, one colour each.

    python tools/plot_metrics.py out/shakespeare --output loss.png
    python tools/plot_metrics.py out/lr1e-3 out/lr3e-3 --labels 1e-3 3e-3 --smooth 5 \\
        --log_y --output lr.png

A run that is still training can be plotted (its unfinished last line is left out). After a
crash and --resume the newer launch's records replace the older ones from the iteration it
resumed at; a launch killed before its first checkpoint (the run then started afresh by
--resume auto) is drawn dotted beside it. Needs matplotlib: pip install 'gpt_ds[plot]'.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from gpt_ds.base.cli import option, parse, run_tool
from gpt_ds.base.errors import ConfigError
from gpt_ds.observe.plot import draw, load_runs, save


@dataclass
class PlotOptions:
    out_dirs: list[Path] = option(
        help="training out dirs (each holding a metrics.jsonl)", positional=True, metavar="OUT_DIR"
    )
    output: Path = option(help="image to write (.png; .svg and .pdf work too)")
    labels: list[str] | None = option(
        None, "legend names, one per out dir (default: each out dir's name)", metavar="LABEL"
    )
    smooth: int = option(
        0,
        "plot the train loss as a moving mean of the last N logged values (raw shown faint)",
        metavar="N",
    )
    log_y: bool = option(False, "log-scale loss axes")
    width: int = option(1200, "image width in pixels")
    height: int = option(800, "image height in pixels")

    def check(self) -> None:
        problems = [
            f"--{name} must be >= {low}, got {getattr(self, name)}"
            for name, low in (("smooth", 0), ("width", 200), ("height", 200))
            if getattr(self, name) < low
        ]
        if problems:
            raise ConfigError(problems, source="tools/plot_metrics.py")


def plot(opts: PlotOptions) -> None:
    opts.check()
    runs = load_runs(opts.out_dirs, opts.labels)
    fig = draw(runs, opts.smooth, opts.log_y, opts.width, opts.height)
    path = save(fig, opts.output)
    for run in runs:
        print(
            f"{run.label}: {len(run.train_iters)} train and {len(run.eval_iters)} eval points "
            f"from {run.path}"
        )
        for run_id, (iters, _) in run.attempts.items():
            print(f"{run.label}: killed attempt {run_id}, {len(iters)} train points (dotted)")
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    opts = parse(PlotOptions, argv, description=__doc__)
    return run_tool(lambda: plot(opts), interrupted="interrupted: no image written")


if __name__ == "__main__":
    sys.exit(main())
