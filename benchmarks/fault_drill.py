"""Requeue drill: one training job run as a scheduler runs it, killed hard again and again.

    python benchmarks/fault_drill.py                    # 5 kills, seed 0, ~2-3 min on 2 CPU cores
    python benchmarks/fault_drill.py --kills 10 --seed 3 --max_iters 24

Every launch is the same command, as a requeued job's: `gpt_ds/train.py ... --resume auto
--save_every_minutes M` on 2 CPU ranks (gloo), started by `deepspeed --num_gpus 2`: DeepSpeed's
runner, its per-node launcher and the ranks, one process group (support/faults.py's `Launch`,
which tests/test_faults.py uses too). Each launch but the last is SIGKILLed, every
process at once (a lost node, a hard preemption), at a random moment of one of three kinds,
each once in every three launches, in random order:
- "start-up": 0-6 s after the launch, but not past its first logged step (before the lock,
  while it plans or builds the engine, or in its first step);
- "train": 0-0.3 s after a random iteration of this launch was logged; while there is no
  checkpoint yet, one before the first save;
- "save": the instant a `TAG.partial/` directory appears, while DeepSpeed writes a checkpoint
  (0-1 of this launch's saves complete first).
After every kill the drill checks that each checkpoint that was complete before it still is
(manifest present, every file at its recorded size) and that `latest` names a complete one; the
next launch must continue from `latest` (or, that one damaged, the newest intact tag), or start
afresh when there is none. A launch refused (exit 2) fails the drill: a requeue must always
make progress.

Two more faults are mixed in, each at random half of the time: while a launch trains (paused
meanwhile, so the two overlap), a second launch into the same out dir, which must be refused
at once, the first going on untouched; and after a kill, 4 KiB of random bytes in a random file
of the tag `latest` names (same size): the next resume must notice before loading and continue
from the newest intact tag.

Prints one row per launch and a summary; exits 1 if a checkpoint was lost, a launch of the job
was refused, a second launch was not refused, a damaged tag was loaded, or the drilled run does
not end bit-identical to the uninterrupted one (same command, never killed): final weights, and
every train and eval record's numbers, each iteration logged once.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import re
import signal
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
from support.runs import consolidated_model  # noqa: E402

from gpt_ds.observe.metrics_file import read_metrics  # noqa: E402
from gpt_ds.run.lock import LOCK_NAME, LockOwner, stale_reason  # noqa: E402

# 2 layers, 128 wide: saves of 111 MB stay open long enough (~0.3 s) to be hit on purpose
MODEL = {"n_layer": 2, "n_head": 2, "n_embd": 128}
EVAL_INTERVAL = 4  # a step-count checkpoint every 4 iterations; --save_every_minutes adds more
RESUMED = re.compile(r"resumed from \S+/(\S+) at iteration (\d+)")
STARTED = "--resume auto: "  # the line of a launch that starts the run (afresh or anew)
MODES = ("start-up", "train", "save")  # a kill's moment (see the docstring)
EXACT = ("loss", "lr", "grad_norm", "batch", "tokens", "val_loss", "val_ppl")  # record numbers
TALLY = ("lost", "resumes", "afresh", "refused", "intruders", "stopped", "damaged")
LAUNCH_COLUMNS = [
    "launch",
    "started",
    "killed",
    "at",
    "latest after",
    "partial dirs left",
    "2nd launch",
    "then damaged",
    "lost",
]
SUMMARY_COLUMNS = [
    "kills",
    "resumes",
    "fresh starts",
    "launches refused",
    "checkpoints lost",
    "2nd launches refused",
    "damaged tags caught before loading",
    "final val loss (drilled / uninterrupted)",
    "bit-identical weights and metrics",
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


def live_lock_owner(out: Path) -> LockOwner | None:
    """The launch holding the out dir's lock now (None: no lock, or a killed launch's)."""
    owner = LockOwner.read(out / LOCK_NAME)
    with contextlib.suppress(OSError):  # removed meanwhile
        if owner is not None and stale_reason(owner, out / LOCK_NAME) is None:
            return owner
    return None


def latest_of(out: Path) -> str | None:
    return (out / "latest").read_text().strip() if (out / "latest").exists() else None


def run_args(data: Path, out: Path, max_iters: int, minutes: float, **more) -> list[str]:
    """The job's one command, every launch alike."""
    schedule = {"max_iters": max_iters, "lr_decay_iters": max_iters, "warmup_iters": 2}
    return tiny_run_args(
        data,
        out,
        **MODEL,
        **schedule,
        eval_interval=EVAL_INTERVAL,
        eval_iters=2,
        resume="auto",
        save_every_minutes=minutes,
        **more,
    )


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A Markdown table with padded columns."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


# --------------------------------------------------------------------------- the drill


@dataclass
class Drill:
    """The drilled job across its launches: where it runs, the random choices, the tags damaged
    on purpose, the counts and the table's rows so far."""

    data: Path
    out: Path
    work: Path
    max_iters: int
    minutes: float
    rng: random.Random
    tally: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TALLY, 0))
    damaged: dict[str, str] = field(default_factory=dict)  # tag -> its saved_at when damaged
    rows: list[tuple] = field(default_factory=list)
    modes: list[str] = field(default_factory=list)  # the kinds of kill left in this round
    caught: set[tuple[str, str]] = field(default_factory=set)  # (tag, saved_at) passed over

    def launch(self, name: str) -> Launch:
        """The job's command, started by `deepspeed` (see the docstring)."""
        args = run_args(self.data, self.out, self.max_iters, self.minutes)
        return Launch(args, self.work / f"{name}.log")

    def next_mode(self, start: int) -> str:
        """The next kill's kind: each of MODES once in every round of three, in random order;
        "save" only while a step-count save is left before `final`."""
        if not self.modes:
            self.modes = self.rng.sample(MODES, len(MODES))
        mode = self.modes.pop()
        return "train" if mode == "save" and not next_step_save(start, self.max_iters) else mode

    def catch(self, output: str) -> None:
        """Note the damaged tags a launch's output says it passed over (a tag stays damaged, and
        is passed over again, until it is saved anew: counted once)."""
        for tag, saved_at in self.damaged.items():
            if f"{self.out}/{tag}: damaged" in output:
                self.caught.add((tag, saved_at))


def usable_checkpoints(drill: Drill) -> dict[str, dict]:
    """tag -> manifest of the complete checkpoints the drill has not damaged. A damaged tag
    saved again since (another saved_at) is whole again, and forgotten."""
    complete = complete_checkpoints(drill.out) if drill.out.exists() else {}
    drill.damaged = {
        t: at for t, at in drill.damaged.items() if complete.get(t, {}).get("saved_at") == at
    }
    return {t: m for t, m in complete.items() if t not in drill.damaged}


def expected_start(drill: Drill) -> int:
    """The iteration the next launch must continue from: `latest`'s tag while it is usable, else
    the newest usable one; 0 (afresh) when there is none."""
    usable = usable_checkpoints(drill)
    latest = latest_of(drill.out)
    if latest in usable:
        return usable[latest]["iteration"]
    return max((m["iteration"] for m in usable.values()), default=0)


def start_of(drill: Drill, output: str, expected: int) -> str:
    """Where a launch started, by its output (the table's cell), tallied: a resume other than
    `expected`, or a fresh start past an intact checkpoint, counts as a lost checkpoint."""
    resumed = RESUMED.search(output)
    if resumed is not None:
        it = int(resumed.group(2))
        drill.tally["lost"] += it != expected
        drill.catch(output)
        drill.tally["resumes"] += 1
        return f"resumed {resumed.group(1)}"
    if STARTED in output:
        drill.tally["afresh"] += 1
        drill.tally["lost"] += expected != 0
        return "afresh" if "afresh" in output else "new"
    return "-"


def next_step_save(start: int, max_iters: int) -> int | None:
    """The first step-count checkpoint after iteration `start` (None: only `final` is left)."""
    nxt = (start // EVAL_INTERVAL + 1) * EVAL_INTERVAL
    return nxt if nxt < max_iters else None


def moment(drill: Drill, run: Launch, mode: str, start: int) -> str:
    """Wait for a random moment of kind `mode` ("train" or "save") of a launch that started at
    iteration `start`; where it is then. With no checkpoint yet, a "train" kill comes before
    the first save; a "save" kill lets 0-1 saves of this launch complete first."""
    out, rng = drill.out, drill.rng
    if mode == "train":
        span = 2 * EVAL_INTERVAL if start else EVAL_INTERVAL - 1
        target = min(start + rng.randint(1, span), drill.max_iters - 2)
        run.wait_for(lambda: live_lock_owner(out) is not None, "the out dir lock")
        run_id = live_lock_owner(out).run_id

        def trained() -> int:  # by this launch (earlier ones' records may not be rewound yet)
            records = read_metrics(out, tolerate_partial_last_line=True)
            mine = [r for r in records if r.get("run_id") == run_id and r.get("kind") == "train"]
            return max((r["iter"] for r in mine), default=start)

        run.wait_for(lambda: trained() >= target, f"iteration {target}")
        time.sleep(rng.uniform(0.0, 0.3))
        return f"iteration {trained()}"
    nxt = next_step_save(start, drill.max_iters)
    skip = rng.randint(0, 1) if nxt and next_step_save(nxt, drill.max_iters) else 0
    since = time.time() - 0.05  # file times are a few ms coarse

    def saved_here() -> int:
        return sum(m["iteration"] > start for m in complete_checkpoints(out).values())

    def saving() -> list[Path]:  # a save of this launch (a leftover of one may have its name)
        return [p for p in out.glob("iter_*.partial") if changed_since(p, since)]

    run.wait_for(lambda: saved_here() >= skip and bool(saving()), f"save {skip + 1}")
    return f"saving {saving()[0].name.removesuffix('.partial')}"


def changed_since(path: Path, since: float) -> bool:
    """Whether `path` was made or had an entry added since `since` (gone meanwhile: no)."""
    try:
        return path.stat().st_ctime >= since
    except FileNotFoundError:
        return False


def start_up(drill: Drill, run: Launch) -> str:
    """Wait a random 0-6 s, but not past this launch's first logged step; where it is then."""
    deadline = time.monotonic() + drill.rng.uniform(0.0, 6.0)
    while time.monotonic() < deadline and run.proc.poll() is None:
        owner = live_lock_owner(drill.out)
        if owner is not None and any(
            r.get("run_id") == owner.run_id and r.get("kind") == "train"
            for r in read_metrics(drill.out, tolerate_partial_last_line=True)
        ):
            return "start-up (its first step logged)"
        time.sleep(0.01)
    return "start-up"


def kill_everything(run: Launch) -> int:
    """SIGKILL the launch's process group (runner, launcher and ranks) and each of its
    processes, back to back; the launch's exit code."""
    procs = run.processes()  # remembered: finish waits for every one of them
    with contextlib.suppress(ProcessLookupError):
        os.killpg(run.proc.pid, signal.SIGKILL)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
    return run.finish()


def kill_round(drill: Drill, k: int) -> bool:
    """Launch k of the job, maybe a second launch beside it, a kill at a random moment, then
    the checks; False when the drill ends here (the launch ended or was refused first)."""
    expected = expected_start(drill)
    before = complete_checkpoints(drill.out) if drill.out.exists() else {}
    run = drill.launch(f"launch{k}")
    intruder, mode = "-", drill.next_mode(expected)
    try:
        if mode == "start-up":
            where = start_up(drill, run)
        else:
            run.wait_for(lambda: RESUMED.search(run.output) or STARTED in run.output, "its start")
            resumed = RESUMED.search(run.output)
            intruder = intrude(drill, run, k)
            where = moment(drill, run, mode, int(resumed.group(2)) if resumed else 0)
        ended = run.proc.poll()
        rc = run.finish() if ended is not None else kill_everything(run)
    except AssertionError as exc:  # wait_for: the launch ended before the moment came
        rc, where, ended = run.finish(), str(exc).splitlines()[0], 0
    finally:
        run.cleanup()
    started = start_of(drill, run.output, expected)
    if ended is not None:  # not killed: it finished (0) or was refused
        drill.tally["refused"] += rc != 0
        drill.rows.append((k, started, "no", f"ended first, exit {rc}", "", "", intruder, "", 0))
        return False
    record_kill(drill, (k, started, mode, where), before, intruder)
    return True


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


def intrude(drill: Drill, run: Launch, k: int) -> str:
    """Half of the time, a second launch into the out dir `run` holds (another seed, no
    --resume), which must be refused at once naming the run that holds it; `run` is paused
    meanwhile, so the two overlap however short it is. The table's cell."""
    if drill.rng.random() >= 0.5:
        return "-"
    drill.tally["intruders"] += 1
    run.wait_for(lambda: live_lock_owner(drill.out) is not None, "the out dir lock")
    args = tiny_run_args(drill.data, drill.out, **MODEL, seed=99)
    with paused(run):
        intruder = Launch(args, drill.work / f"intruder{k}.log")
        try:
            rc = intruder.finish(timeout=120)
        finally:
            intruder.cleanup()
    refused = rc == 2 and "is in use by run" in intruder.output
    drill.tally["stopped"] += refused
    return "refused" if refused else "NOT REFUSED"


def damage_latest(out: Path, rng: random.Random, damaged: dict[str, str]) -> str | None:
    """Overwrite 4 KiB in the middle of a random file of the tag `latest` names (same size),
    when an older complete tag exists to fall back to; 'TAG/FILE', or None."""
    latest = latest_of(out)
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


def record_kill(drill: Drill, kill: tuple, before: dict[str, dict], intruder: str) -> None:
    """After a kill: each checkpoint complete before it that no longer is, and a `latest` that
    names an incomplete tag, count as lost; half of the time the new `latest` is damaged for
    the next resume to catch. `kill` is the row's first cells (launch, started, mode, at)."""
    out = drill.out
    gone = [t for t, m in before.items() if not intact(out, t, m)]
    latest = latest_of(out)
    bad_latest = latest is not None and latest not in complete_checkpoints(out)
    lost_now = len(gone) + bad_latest
    drill.tally["lost"] += lost_now
    partial = ", ".join(sorted(d.name for d in out.glob("*.partial"))) or "-"
    hit = damage_latest(out, drill.rng, drill.damaged) if drill.rng.random() < 0.5 else None
    drill.tally["damaged"] += bool(hit)
    drill.rows.append((*kill, latest, partial, intruder, hit, lost_now))


def run_to_end(run: Launch) -> Launch:
    """A launch that must end normally (rc 0, no /dev/shm buffer left); it, for its output."""
    try:
        run.finish_ok()
    finally:
        run.cleanup()
    return run


def finish_drilled(drill: Drill, k: int) -> None:
    """The last launch, the same command: continue from whatever survived and train to the end."""
    expected = expected_start(drill)
    final = run_to_end(drill.launch(f"launch{k}"))
    started = start_of(drill, final.output, expected)
    drill.rows.append((k, started, "no", "ran to the end", latest_of(drill.out), "", "", "", 0))


# --------------------------------------------------------------------------- the verdict


@dataclass
class Outcome:
    """The drilled run's end against the uninterrupted run's."""

    val: tuple[float, float]  # the last validation loss: drilled, uninterrupted
    same_metrics: bool  # every train and eval record's numbers equal, each iteration once
    same_weights: bool  # the final weights equal, bit for bit


def record_numbers(out: Path) -> dict[tuple[str, int], dict]:
    """(kind, iteration) -> the numbers of that train or eval record (EXACT); an iteration
    logged twice (a rewind that failed) raises."""
    found: dict[tuple[str, int], dict] = {}
    for r in read_metrics(out):
        if r.get("kind") in ("train", "eval"):
            key = (r["kind"], r["iter"])
            assert key not in found, f"{out}/metrics.jsonl logs {key} twice"
            found[key] = {k: r[k] for k in EXACT if k in r}
    return found


def compare(out: Path, ref_out: Path, max_iters: int) -> Outcome:
    """Exact equality, not closeness: a resume replays the same stream, so any difference is
    a fault the drill found."""
    drilled, uninterrupted = record_numbers(out), record_numbers(ref_out)
    if not (out / "final" / "gpt_ds.json").is_file():  # the drill stopped early: refused
        return Outcome((math.nan, uninterrupted[("eval", max_iters)]["val_loss"]), False, False)
    wa = consolidated_model(ref_out, "final").state_dict()
    wb = consolidated_model(out, "final").state_dict()
    val = drilled[("eval", max_iters)]["val_loss"], uninterrupted[("eval", max_iters)]["val_loss"]
    return Outcome(
        val=val,
        same_metrics=drilled == uninterrupted,
        same_weights=all((wa[n] == wb[n]).all().item() for n in wa),
    )


def summary_row(drill: Drill, o: Outcome) -> list[str]:
    """The summary table's one row."""
    t = drill.tally
    kills = sum(1 for r in drill.rows if r[2] != "no")
    return [
        str(kills),
        str(t["resumes"]),
        str(t["afresh"]),
        str(t["refused"]),
        str(t["lost"]),
        f"{t['stopped']} of {t['intruders']}",
        f"{len(drill.caught)} of {t['damaged']}",
        f"{o.val[0]:.6f} / {o.val[1]:.6f}",
        "yes" if o.same_weights and o.same_metrics else "no",
    ]


def report(args: argparse.Namespace, drill: Drill, o: Outcome, elapsed: float) -> None:
    """The header, a row per launch, the summary, and where the runs are."""
    print(
        f"\nrequeue drill: seed {args.seed}, {args.kills} kills of every process, "
        f"{args.max_iters} iterations, --resume auto --save_every_minutes {args.minutes:g}, "
        f"2 ranks ZeRO-2 fp32 on CPU, model {MODEL}, {elapsed:.0f} s\n"
    )
    cells = [[str(c) if c is not None else "-" for c in row] for row in drill.rows]
    print(table(LAUNCH_COLUMNS, cells))
    print()
    print(table(SUMMARY_COLUMNS, [summary_row(drill, o)]))
    print(f"\nruns in {drill.work}")


def sound(drill: Drill, o: Outcome) -> bool:
    """Nothing lost, no launch of the job refused, every second launch refused, every damaged
    tag caught, and the drilled run ends exactly where the uninterrupted one does."""
    t = drill.tally
    kept = t["lost"] == 0 and t["refused"] == 0 and len(drill.caught) == t["damaged"]
    return kept and t["stopped"] == t["intruders"] and o.same_metrics and o.same_weights


# --------------------------------------------------------------------------- the command


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--kills", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max_iters", type=int, default=16)
    p.add_argument("--minutes", type=float, default=0.05, help="--save_every_minutes")
    p.add_argument("--data_dir", type=Path, help="prepared data (default: Tiny Shakespeare)")
    p.add_argument("--work_dir", type=Path, help="keep runs here (default: a temporary dir)")
    args = p.parse_args(argv)
    if args.max_iters < 2 * EVAL_INTERVAL:
        p.error(f"--max_iters must be >= {2 * EVAL_INTERVAL}: saves to kill before `final`")
    return args


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
    rng = random.Random(args.seed)
    ref = Drill(data, work / "uninterrupted", work, args.max_iters, args.minutes, rng)
    run_to_end(ref.launch("uninterrupted"))
    drill = Drill(data, work / "drilled", work, args.max_iters, args.minutes, rng)
    for k in range(1, args.kills + 1):
        if not kill_round(drill, k):
            break
    else:
        finish_drilled(drill, args.kills + 1)
    outcome = compare(drill.out, ref.out, args.max_iters)
    report(args, drill, outcome, time.time() - t0)
    return 0 if sound(drill, outcome) else 1


if __name__ == "__main__":
    sys.exit(main())
