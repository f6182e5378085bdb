"""`OUT_DIR/metrics.jsonl`, the run's records one JSON object per line (observe/metrics.py's
`MetricsLogger` appends them): its name, reading it back (a run still writing, a crashed
launch's torn last line), and the resume's housekeeping: records past a checkpoint moved aside
(`rewind`), a launch killed before its first checkpoint kept apart (`set_aside_attempt`,
`read_attempts`).

Every record has a `kind` ("train", "eval" or "event"; `record_kind` infers it for records
written before it existed), the wall-clock `time` and the launch's `run_id`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

METRICS_FILE = "metrics.jsonl"


def rewind(out_dir: str | Path, iteration: int) -> int:
    """Move the records past `iteration` (written by a launch that then crashed) from
    metrics.jsonl to metrics.jsonl.rewound-<iteration>, so a resumed run logs each iteration
    once. Returns how many records moved; the file is replaced atomically."""
    path = Path(out_dir) / METRICS_FILE
    if not path.is_file():
        return 0
    lines = path.read_text().splitlines(keepends=True)
    keep: list[str] = []
    drop: list[str] = []
    for line in lines:
        try:
            past = json.loads(line).get("iter", -1) > iteration
        except (json.JSONDecodeError, AttributeError, TypeError):
            past = not line.endswith("\n")  # a torn last line of the crash: aside with the rest
        (drop if past else keep).append(line)
    if not drop:
        return 0
    aside = path.with_name(f"{METRICS_FILE}.rewound-{iteration}")
    with aside.open("a") as f:
        f.writelines(line if line.endswith("\n") else line + "\n" for line in drop)
    tmp = path.with_name(f".{METRICS_FILE}.tmp")
    tmp.write_text("".join(keep))
    os.replace(tmp, path)
    return len(drop)


ATTEMPT_PREFIX = f"{METRICS_FILE}.attempt-"  # + the run id of a launch that left no checkpoint


def attempt_file(out_dir: str | Path) -> Path | None:
    """Where `set_aside_attempt` would move metrics.jsonl (named by the run id of its last
    record; its time stamp where no record has one), or None when there is no such file."""
    path = Path(out_dir) / METRICS_FILE
    if not path.is_file():
        return None
    ids = [r.get("run_id") for r in json_records(path)]
    name = next((i for i in reversed(ids) if isinstance(i, str) and i), None)
    name = name or time.strftime("%Y%m%d-%H%M%S", time.localtime(path.stat().st_mtime))
    aside, n = path.with_name(ATTEMPT_PREFIX + name), 1
    while aside.exists():  # a run id is unique; a time stamp need not be
        n += 1
        aside = path.with_name(f"{ATTEMPT_PREFIX}{name}.{n}")
    return aside


def set_aside_attempt(out_dir: str | Path) -> Path | None:
    """Move metrics.jsonl, the records of a launch killed before its first checkpoint, to
    `attempt_file`'s name, so the run started afresh logs each iteration once and the killed
    attempt's records stay readable apart (`read_attempts`). Returns the new path."""
    aside = attempt_file(out_dir)
    if aside is not None:
        os.replace(Path(out_dir) / METRICS_FILE, aside)
    return aside


def read_attempts(out_dir: str | Path) -> dict[str, list[dict]]:
    """The records of each launch that was set aside (killed before its first checkpoint, the
    run then started afresh), keyed by run id, oldest first; torn lines skipped."""
    files = sorted(Path(out_dir).glob(ATTEMPT_PREFIX + "*"), key=lambda f: f.stat().st_mtime)
    return {f.name.removeprefix(ATTEMPT_PREFIX): json_records(f) for f in files}


def json_records(path: Path) -> list[dict]:
    """The JSON objects of a metrics file; other lines (a torn last line, foreign text)
    skipped, for readers that must not fail on a crashed launch's file."""
    records = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


KINDS = ("train", "eval", "event")


def record_kind(record: dict) -> str | None:
    """ "train", "eval" or "event": the record's `kind`, else inferred (records written before
    `kind` existed); None for anything else."""
    if record.get("kind") in KINDS:
        return record["kind"]
    if "val_loss" in record:
        return "eval"
    if "loss" in record:
        return "train"
    return "event" if "event" in record else None


def read_metrics(out_dir: str | Path, tolerate_partial_last_line: bool = False) -> list[dict]:
    """Every record of `OUT_DIR/metrics.jsonl`, in file order.

    For a run still writing (`tolerate_partial_last_line=True`): a file not created yet reads as
    no records, and a last line not yet ended by its newline is left out (the next read gets it).
    Any other line that is not JSON raises ValueError naming the file and line.
    """
    path = Path(out_dir) / METRICS_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        if tolerate_partial_last_line:
            return []
        raise
    lines = text.splitlines()
    if tolerate_partial_last_line and lines and not text.endswith("\n"):
        lines.pop()
    records = []
    for n, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not a JSON record ({e.msg}): {line[:80]!r}") from None
    return records
