"""What an earlier run left in the out dir, and what a launch may do with it.

A launch without `--resume` into a directory holding gpt_ds output (a tag directory, complete
or not, `latest`, `metrics.jsonl`) would replace that run's checkpoints and mix its metrics
with its own: it is refused before any work, naming what is there and the ways on.
`--resume auto` is the setting for a job a scheduler may start again: it continues the newest
complete checkpoint when there is one, starts the run when the out dir holds no gpt_ds output,
and refuses an out dir with output but no checkpoint to continue.
"""

from __future__ import annotations

import json
from pathlib import Path

from gpt_ds.base.errors import GptDsError
from gpt_ds.checkpoint import LATEST, Manifest, complete_tags, latest_tag, partial_dirs
from gpt_ds.observe.metrics import METRICS_FILE
from gpt_ds.run import lock as run_lock

AUTO = "auto"  # --resume auto: continue if there is a checkpoint, else start


class OutDirHasRun(GptDsError):
    """The out dir holds an earlier run's output that this launch would replace or mix into."""


def earlier_output(out_dir: Path) -> list[str]:
    """What gpt_ds output `out_dir` holds, one phrase each, newest checkpoint first; empty for
    a directory a run may start in."""
    found = [
        f"{tag}/ (iteration {iteration_of(out_dir / tag)})"
        for tag in reversed(complete_tags(out_dir))
    ]
    found += [f"{d.name}/ (an interrupted save, no manifest)" for d in partial_dirs(out_dir)]
    if (out_dir / LATEST).is_file():
        found.append(f"`{LATEST}` (naming {latest_tag(out_dir) or 'nothing'})")
    if (out_dir / METRICS_FILE).is_file():
        last = last_logged_iteration(out_dir / METRICS_FILE)
        found.append(f"{METRICS_FILE} ({'up to iteration ' + str(last) if last else 'no steps'})")
    return found


def iteration_of(tag_dir: Path) -> int | str:
    manifest = Manifest.read(tag_dir)
    return manifest.iteration if manifest else "?"


def last_logged_iteration(path: Path) -> int | None:
    """The highest `iter` of a metrics file's records (torn or foreign lines skipped)."""
    last = None
    for line in path.read_text(errors="replace").splitlines():
        try:
            it = json.loads(line).get("iter")
        except (json.JSONDecodeError, AttributeError):
            continue
        if isinstance(it, int):
            last = it if last is None else max(last, it)
    return last


def check_fresh_start(out_dir: Path) -> None:
    """A run without --resume may start in `out_dir` only when it holds no gpt_ds output."""
    found = earlier_output(out_dir)
    if not found:
        return
    refuse_if_busy(out_dir)
    continue_it = (
        f"continue it with --resume (the newest complete checkpoint) or --resume {AUTO}"
        if complete_tags(out_dir)
        else "it has no complete checkpoint to continue"
    )
    raise OutDirHasRun(
        f"--out_dir {out_dir} already holds a run: {', '.join(found)}. A new run there would "
        f"replace its checkpoints and mix its metrics. Ways on: {continue_it}; or start the "
        f"new run in another --out_dir (or delete {out_dir} first)."
    )


def auto_starts(out_dir: Path) -> bool:
    """`--resume auto`: True when the run starts (nothing of gpt_ds's in `out_dir`), False
    when it continues the newest complete checkpoint; refused with output but none."""
    if complete_tags(out_dir):
        return False
    found = earlier_output(out_dir)
    if not found:
        return True
    refuse_if_busy(out_dir)
    raise OutDirHasRun(
        f"--resume {AUTO}: --out_dir {out_dir} holds a run's output but no complete checkpoint "
        f"to continue: {', '.join(found)}. Start the run in another --out_dir, or delete "
        f"{out_dir} first."
    )


def refuse_if_busy(out_dir: Path) -> None:
    """A live run's output is that run's business: say who holds the out dir (lock.py)."""
    path = out_dir / run_lock.LOCK_NAME
    owner = run_lock.LockOwner.read(path)
    if owner is not None and run_lock.stale_reason(owner, path) is None:
        raise run_lock.OutDirBusy(run_lock.busy_message(out_dir, owner))
