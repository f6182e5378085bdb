"""Fault drill: SIGKILL a rank at random points of training and of checkpoint saves, resume
after each kill, and compare the end result with an uninterrupted run.

    python benchmarks/fault_drill.py                    # 4 kills, seed 0, ~2 min on 2 CPU cores
    python benchmarks/fault_drill.py --kills 8 --seed 3 --max_iters 24

Each launch is `deepspeed --num_gpus 2 gpt_ds/train.py ... [--resume]` on localhost (CPU, gloo),
in the background (support/faults.py's `Launch`, which tests/test_faults.py uses too).
A kill is either "train" (a random moment after a random iteration) or "save" (the instant a
`TAG.partial/` directory appears, i.e. while DeepSpeed writes the checkpoint), of a random
rank. After every kill the drill checks that each checkpoint that was complete before it is
still complete (manifest present, every file at its recorded size) and that `latest` names a
complete one; the next launch must resume from the newest intact checkpoint. A checkpoint
that fails either check is "lost".

Two more faults are mixed in, each at random half of the time: while a launch trains (paused
meanwhile, so the two overlap), a second launch into the same out dir, which must be refused
at once, the first going on untouched; and
after a kill, 4 KiB of random bytes in a random file of the tag `latest` names (same size): the
next resume must notice before loading and continue from the newest intact tag.

Prints one row per kill and a summary; exits 1 if a checkpoint was lost, a second launch was
not refused, a damaged tag was loaded, or the drilled run does not end bit-identical to the
uninterrupted one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's gpt_ds

import psutil  # noqa: E402
from support.faults import Launch  # noqa: E402
from support.launch import run_python, tiny_run_args  # noqa: E402
from support.runs import consolidated_model, train_losses, val_losses  # noqa: E402

from gpt_ds.observe.metrics import read_metrics  # noqa: E402

# 2 layers, 128 wide: saves of 111 MB stay open long enough (~0.3 s) to be hit on purpose
MODEL = {"n_layer": 2, "n_head": 2, "n_embd": 128}
EVAL_INTERVAL = 2  # a checkpoint every 2 iterations: many saves to hit
RESUMED = re.compile(r"resumed from \S+/(\S+) at iteration (\d+)")
TALLY = ("lost", "resumes", "refused", "intruders", "caught", "damaged")
KILL_COLUMNS = [
    "kill",
    "mode",
    "rank",
    "killed while",
    "latest after",
    "partial dirs left",
    "2nd launch",
    "then damaged",
    "lost",
]
SUMMARY_COLUMNS = [
    "runs killed",
    "resumes",
    "checkpoints lost",
    "2nd launches refused",
    "damaged tags caught before loading",
    "final train loss (drilled / uninterrupted)",
    "final val loss (drilled / uninterrupted)",
    "bit-identical losses and weights",
]


def complete_checkpoints(out: Path) -> dict[str, dict]:
    """tag -> manifest, for every directory with a manifest."""
    found = {}
    for m in out.glob("*/gpt_ds.json"):
        with contextlib.suppress(OSError, json.JSONDecodeError):
            found[m.parent.name] = json.loads(m.read_text())
    return found


def intact(out: Path, tag: str, manifest: dict) -> bool:
    """The manifest is still there and every file it lists has its recorded size."""
    d = out / tag
    if not (d / "gpt_ds.json").is_file():
        return False
    return all(
        (d / f).is_file() and (d / f).stat().st_size == n for f, n in manifest["files"].items()
    )


def run_args(data: Path, out: Path, max_iters: int, **more) -> list[str]:
    schedule = {"max_iters": max_iters, "lr_decay_iters": max_iters, "warmup_iters": 2}
    return tiny_run_args(
        data, out, **MODEL, **schedule, eval_interval=EVAL_INTERVAL, eval_iters=2, **more
    )


def kill_once(
    run: Launch, out: Path, mode: str, rng: random.Random, start: int, max_iters: int
) -> dict:
    """Wait for the chosen moment, SIGKILL a random rank; what happened."""
    victim = rng.randrange(2)
    # earlier launches' records (a resumed launch rewinds the file, so not a line count)
    old = {r.get("run_id") for r in read_metrics(out, tolerate_partial_last_line=True)}

    def trained() -> int:
        records = read_metrics(out, tolerate_partial_last_line=True)
        new = [r for r in records if r.get("run_id") not in old]
        return max((r["iter"] for r in new if "loss" in r), default=start)

    if mode == "train":
        target = min(start + rng.randint(1, 6), max_iters - 1)
        run.wait_for(lambda: trained() >= target, f"iteration {target}")
        time.sleep(rng.uniform(0.0, 0.3))
        where = f"iteration {trained()}"
    else:
        # let 0-2 of the saves still to come (before `final`) complete, then hit the next one
        saves_left = (max_iters - 1) // EVAL_INTERVAL - start // EVAL_INTERVAL
        skip = rng.randint(0, min(2, saves_left - 1))
        before = {p.name for p in out.glob("*.partial")}

        def saved_since_start() -> int:
            return sum(m["iteration"] > start for m in complete_checkpoints(out).values())

        def saving():
            return [p for p in out.glob("iter_*.partial") if p.name not in before]

        run.wait_for(
            lambda: saved_since_start() >= skip and bool(saving()), f"save {skip + 1} after {start}"
        )
        tag = saving()[0].name.removesuffix(".partial")
        where = f"saving {tag}"
    if run.proc.poll() is not None:
        return {"rank": victim, "where": where, "killed": False}
    run.rank(victim).kill()
    rc = run.finish()
    if mode == "save" and (out / tag / "gpt_ds.json").exists():
        where += " (too late)"  # the kill landed after the save was published
    return {"rank": victim, "where": where, "killed": True, "rc": rc}


@contextlib.contextmanager
def paused(run: Launch):
    """SIGSTOP the run's processes for the duration (its lock holder stays alive)."""
    procs = run.processes()
    for p in procs:
        p.suspend()
    try:
        yield
    finally:
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.resume()


def intruder_refused(data: Path, out: Path, log: Path, max_iters: int) -> bool:
    """A second launch into `out` (another seed) while a run trains there: True when it is
    refused at once (exit 2, naming the run that holds the directory)."""
    intruder = Launch(run_args(data, out, max_iters, seed=99), log)
    try:
        rc = intruder.finish(timeout=120)
    finally:
        intruder.cleanup()
    return rc == 2 and "is in use by run" in intruder.output


def damage_latest(out: Path, rng: random.Random, damaged: dict[str, str]) -> str | None:
    """Overwrite 4 KiB in the middle of a random file of the tag `latest` names (same size),
    when an older complete tag exists to fall back to; 'TAG/FILE', or None."""
    latest = (out / "latest").read_text().strip() if (out / "latest").exists() else None
    complete = complete_checkpoints(out)
    if latest not in complete or len(complete) - len(damaged) < 2 or latest in damaged:
        return None
    name = rng.choice(sorted(complete[latest]["files"]))
    path = out / latest / name
    size = path.stat().st_size
    with path.open("r+b") as f:
        f.seek(max(0, size // 2 - 2048))
        f.write(rng.randbytes(min(4096, size)))
    damaged[latest] = complete[latest]["saved_at"]
    return f"{latest}/{name}"


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A Markdown table with padded columns."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


# --------------------------------------------------------------------------- the drill


@dataclass
class Drill:
    """The drilled run across its launches: where it runs, the random choices, the tags damaged
    on purpose, the counts and the table's rows so far."""

    data: Path
    out: Path
    work: Path
    max_iters: int
    rng: random.Random
    tally: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TALLY, 0))
    damaged: dict[str, str] = field(default_factory=dict)  # tag -> its saved_at when damaged
    rows: list[tuple] = field(default_factory=list)

    def run_args(self, **more) -> list[str]:
        return run_args(self.data, self.out, self.max_iters, **more)

    def caught(self, output: str) -> int:
        """How many damaged tags a launch's output says it passed over."""
        return sum(f"{self.out}/{t}: damaged" in output for t in self.damaged)


def usable_checkpoints(drill: Drill) -> dict[str, dict]:
    """tag -> manifest of the complete checkpoints the drill has not damaged. A damaged tag
    saved again since (another saved_at) is whole again, and forgotten."""
    complete = complete_checkpoints(drill.out) if drill.out.exists() else {}
    drill.damaged = {
        t: at for t, at in drill.damaged.items() if complete.get(t, {}).get("saved_at") == at
    }
    return {t: m for t, m in complete.items() if t not in drill.damaged}


def kill_round(drill: Drill, k: int) -> bool:
    """Launch k: resume (or start again), maybe a second launch, a kill, then the checks; False
    when the run ended before the kill could land (the drill stops there)."""
    mode = drill.rng.choice(["train", "save"])
    usable = usable_checkpoints(drill)
    newest = max((m["iteration"] for m in usable.values()), default=0)
    if newest >= drill.max_iters - 1 - EVAL_INTERVAL:  # no iter_* save left before `final`
        mode = "train"
    resume = bool(usable)  # killed before the first checkpoint: start again
    run = Launch(drill.run_args(resume=resume), drill.work / f"launch{k}.log")
    try:
        start = started_from(drill, run, resume, newest)
        intruder = intrude(drill, run, k)
        before = complete_checkpoints(drill.out)
        event = kill_once(run, drill.out, mode, drill.rng, start, drill.max_iters)
    finally:
        run.cleanup()
    if not event["killed"]:
        row = (k, mode, event["rank"], event["where"], "run ended first", "", "", "", 0)
        drill.rows.append(row)
        return False
    record_kill(drill, (k, mode, event["rank"], event["where"]), before, intruder)
    return True


def started_from(drill: Drill, run: Launch, resume: bool, newest: int) -> int:
    """The iteration `run` starts at, once it has started: a resume must take the newest intact
    checkpoint (another one counts as lost) and say which damaged tags it passed over."""
    if not resume:
        run.wait_for(lambda: (drill.out / "gpt_ds.lock").exists(), "the out dir lock")
        return 0
    run.wait_for(lambda: RESUMED.search(run.output), "the resume")
    _tag, it = RESUMED.search(run.output).groups()
    if int(it) != newest:
        drill.tally["lost"] += 1  # resumed from another than the newest intact checkpoint
    drill.tally["caught"] += drill.caught(run.output)
    drill.tally["resumes"] += 1
    return int(it)


def intrude(drill: Drill, run: Launch, k: int) -> str:
    """Half of the time, a second launch into the out dir `run` holds, which must be refused;
    `run` is paused meanwhile, so the two overlap however short it is. The table's cell."""
    if drill.rng.random() >= 0.5:
        return "-"
    drill.tally["intruders"] += 1
    log = drill.work / f"intruder{k}.log"
    with paused(run):
        refused = intruder_refused(drill.data, drill.out, log, drill.max_iters)
    drill.tally["refused"] += refused
    return "refused" if refused else "NOT REFUSED"


def record_kill(drill: Drill, kill: tuple, before: dict[str, dict], intruder: str) -> None:
    """After a kill: each checkpoint complete before it that no longer is, and a `latest` that
    names an incomplete tag, count as lost; half of the time the new `latest` is damaged for
    the next resume to catch. `kill` is the row's first cells (kill, mode, rank, where)."""
    out = drill.out
    gone = [t for t, m in before.items() if not intact(out, t, m)]
    latest = (out / "latest").read_text().strip() if (out / "latest").exists() else None
    bad_latest = latest is not None and latest not in complete_checkpoints(out)
    lost_now = len(gone) + bad_latest
    drill.tally["lost"] += lost_now
    partial = ", ".join(sorted(d.name for d in out.glob("*.partial"))) or "-"
    hit = damage_latest(out, drill.rng, drill.damaged) if drill.rng.random() < 0.5 else None
    drill.tally["damaged"] += bool(hit)
    drill.rows.append((*kill, latest, partial, intruder, hit, lost_now))


def run_to_end(args: list[str], log: Path) -> Launch:
    """A launch that must end normally (rc 0, no /dev/shm buffer left); it, for its output."""
    run = Launch(args, log)
    try:
        run.finish_ok()
    finally:
        run.cleanup()
    return run


def finish_drilled(drill: Drill) -> None:
    """The last launch: resume from whatever survived (or start again) and train to the end."""
    resume = bool(complete_checkpoints(drill.out))
    final = run_to_end(drill.run_args(resume=resume), drill.work / "final.log")
    drill.tally["caught"] += drill.caught(final.output)
    drill.tally["resumes"] += int(resume)


# --------------------------------------------------------------------------- the verdict


@dataclass
class Outcome:
    """The drilled run's end against the uninterrupted run's."""

    train: tuple[float, float]  # the last training loss: drilled, uninterrupted
    val: tuple[float, float]  # the last validation loss: drilled, uninterrupted
    same_losses: bool  # every logged training loss equal
    same_weights: bool  # the final weights equal, bit for bit


def compare(out: Path, ref_out: Path, max_iters: int) -> Outcome:
    """Exact equality, not closeness: a resume replays the same stream, so any difference is
    a fault the drill found."""
    drilled, uninterrupted = train_losses(out), train_losses(ref_out)
    wa = consolidated_model(ref_out, "final").state_dict()
    wb = consolidated_model(out, "final").state_dict()
    return Outcome(
        train=(drilled[max_iters], uninterrupted[max_iters]),
        val=(val_losses(out)[max_iters], val_losses(ref_out)[max_iters]),
        same_losses=drilled == uninterrupted,
        same_weights=all((wa[n] == wb[n]).all().item() for n in wa),
    )


def summary_row(drill: Drill, o: Outcome) -> list[str]:
    """The summary table's one row."""
    t = drill.tally
    killed = sum(1 for r in drill.rows if r[4] != "run ended first")
    return [
        str(killed),
        str(t["resumes"]),
        str(t["lost"]),
        f"{t['refused']} of {t['intruders']}",
        f"{t['caught']} of {t['damaged']}",
        f"{o.train[0]:.6f} / {o.train[1]:.6f}",
        f"{o.val[0]:.6f} / {o.val[1]:.6f}",
        "yes" if o.same_weights and o.same_losses else "no",
    ]


def report(args: argparse.Namespace, drill: Drill, o: Outcome, elapsed: float) -> None:
    """The header, a row per kill, the summary, and where the runs are."""
    print(
        f"\nfault drill: seed {args.seed}, {args.kills} kills, {args.max_iters} iterations, "
        f"2 ranks ZeRO-2 fp32 on CPU, model {MODEL}, {elapsed:.0f} s\n"
    )
    cells = [[str(c) if c is not None else "-" for c in row] for row in drill.rows]
    print(table(KILL_COLUMNS, cells))
    print()
    print(table(SUMMARY_COLUMNS, [summary_row(drill, o)]))
    print(f"\nruns in {drill.work}")


def sound(drill: Drill, o: Outcome) -> bool:
    """Nothing lost, every second launch refused, every damaged tag caught, and the drilled
    run ends exactly where the uninterrupted one does."""
    t = drill.tally
    kept = t["lost"] == 0 and t["refused"] == t["intruders"] and t["caught"] == t["damaged"]
    return kept and o.same_losses and o.same_weights


# --------------------------------------------------------------------------- the command


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--kills", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max_iters", type=int, default=16)
    p.add_argument("--data_dir", type=Path, help="prepared data (default: Tiny Shakespeare)")
    p.add_argument("--work_dir", type=Path, help="keep runs here (default: a temporary dir)")
    return p.parse_args(argv)


def prepared_data(work: Path) -> Path:
    """WORK/data: Tiny Shakespeare, prepared unless a kept --work_dir already holds it."""
    data = work / "data"
    if not (data / "meta.json").exists():
        run_python([str(REPO / "tools" / "prepare_data.py"), "--out_dir", str(data)])
    return data


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="fault_drill_"))
    work.mkdir(parents=True, exist_ok=True)
    data = args.data_dir or prepared_data(work)
    t0 = time.time()
    ref_out = work / "uninterrupted"
    run_to_end(run_args(data, ref_out, args.max_iters), work / "uninterrupted.log")
    drill = Drill(data, work / "drilled", work, args.max_iters, random.Random(args.seed))
    for k in range(1, args.kills + 1):
        if not kill_round(drill, k):
            break
    finish_drilled(drill)
    outcome = compare(drill.out, ref_out, args.max_iters)
    report(args, drill, outcome, time.time() - t0)
    return 0 if sound(drill, outcome) else 1


if __name__ == "__main__":
    sys.exit(main())
