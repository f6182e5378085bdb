"""Fault drill: SIGKILL a rank at random points of training and of checkpoint saves, resume
after each kill, and compare the end result with an uninterrupted run.

    python benchmarks/fault_drill.py                    # 4 kills, seed 0, ~2 min on 2 CPU cores
    python benchmarks/fault_drill.py --kills 8 --seed 3 --max_iters 24

Each launch is `deepspeed --num_gpus 2 gpt_ds/train.py ... [--resume]` on localhost (CPU, gloo).
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
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# This checkout's gpt_ds, and the tests' helpers package (tests/helpers/) the drill shares
# with tests/test_faults.py.
sys.path[:0] = [str(REPO), str(REPO / "tests")]

import psutil  # noqa: E402
from helpers.faults import Launch  # noqa: E402
from helpers.launch import run_python, tiny_run_args  # noqa: E402
from helpers.runs import consolidated_model, train_losses, val_losses  # noqa: E402

from gpt_ds.observe.metrics import read_metrics  # noqa: E402

# 2 layers, 128 wide: saves of 111 MB stay open long enough (~0.3 s) to be hit on purpose
MODEL = {"n_layer": 2, "n_head": 2, "n_embd": 128}
EVAL_INTERVAL = 2  # a checkpoint every 2 iterations: many saves to hit
RESUMED = re.compile(r"resumed from \S+/(\S+) at iteration (\d+)")


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--kills", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max_iters", type=int, default=16)
    p.add_argument("--data_dir", type=Path, help="prepared data (default: Tiny Shakespeare)")
    p.add_argument("--work_dir", type=Path, help="keep runs here (default: a temporary dir)")
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="fault_drill_"))
    work.mkdir(parents=True, exist_ok=True)
    data = args.data_dir
    if data is None:
        data = work / "data"
        if not (data / "meta.json").exists():
            run_python([str(REPO / "tools" / "prepare_data.py"), "--out_dir", str(data)])
    t0 = time.time()

    ref_out = work / "uninterrupted"
    ref = Launch(run_args(data, ref_out, args.max_iters), work / "uninterrupted.log")
    try:
        ref.finish_ok()
    finally:
        ref.cleanup()

    out = work / "drilled"
    rows, tally = (
        [],
        {"lost": 0, "resumes": 0, "refused": 0, "intruders": 0, "caught": 0, "damaged": 0},
    )
    damaged: dict[str, str] = {}  # tag -> saved_at of the manifest when we damaged it
    start = 0
    for k in range(1, args.kills + 1):
        mode = rng.choice(["train", "save"])
        complete = complete_checkpoints(out) if out.exists() else {}
        damaged = {t: at for t, at in damaged.items() if complete.get(t, {}).get("saved_at") == at}
        usable = {t: m for t, m in complete.items() if t not in damaged}
        newest = max((m["iteration"] for m in usable.values()), default=0)
        if newest >= args.max_iters - 1 - EVAL_INTERVAL:  # no iter_* save left before `final`
            mode = "train"
        resume = bool(usable)  # killed before the first checkpoint: start again
        run = Launch(run_args(data, out, args.max_iters, resume=resume), work / f"launch{k}.log")
        try:
            if resume:
                run.wait_for(lambda r=run: RESUMED.search(r.output), "the resume")
                _tag, it = RESUMED.search(run.output).groups()
                if int(it) != newest:
                    tally["lost"] += 1  # resumed from another than the newest intact checkpoint
                tally["caught"] += sum(f"{out}/{t}: damaged" in run.output for t in damaged)
                tally["resumes"] += 1
                start = int(it)
            else:
                run.wait_for(lambda: (out / "gpt_ds.lock").exists(), "the out dir lock")
                start = 0
            intruder = "-"
            if rng.random() < 0.5:  # a second launch into the same out dir, while this one runs
                tally["intruders"] += 1
                with paused(run):  # so that the two overlap however short the run is
                    refused = intruder_refused(data, out, work / f"intruder{k}.log", args.max_iters)
                tally["refused"] += refused
                intruder = "refused" if refused else "NOT REFUSED"
            before = complete_checkpoints(out)
            event = kill_once(run, out, mode, rng, start, args.max_iters)
        finally:
            run.cleanup()
        if not event["killed"]:
            rows.append((k, mode, event["rank"], event["where"], "run ended first", "", "", "", 0))
            break
        gone = [t for t, m in before.items() if not intact(out, t, m)]
        latest = (out / "latest").read_text().strip() if (out / "latest").exists() else None
        bad_latest = latest is not None and latest not in complete_checkpoints(out)
        tally["lost"] += len(gone) + int(bad_latest)
        partial = ", ".join(sorted(d.name for d in out.glob("*.partial"))) or "-"
        hit = damage_latest(out, rng, damaged) if rng.random() < 0.5 else None
        tally["damaged"] += bool(hit)
        lost_now = len(gone) + bad_latest
        rows.append(
            (k, mode, event["rank"], event["where"], latest, partial, intruder, hit, lost_now)
        )

    resume = bool(complete_checkpoints(out))
    final = Launch(run_args(data, out, args.max_iters, resume=resume), work / "final.log")
    try:
        final.finish_ok()
    finally:
        final.cleanup()
    tally["caught"] += sum(f"{out}/{t}: damaged" in final.output for t in damaged)
    tally["resumes"] += int(resume)
    drilled, uninterrupted = train_losses(out), train_losses(ref_out)
    same_losses = drilled == uninterrupted
    wa = consolidated_model(ref_out, "final").state_dict()
    wb = consolidated_model(out, "final").state_dict()
    same_weights = all((wa[n] == wb[n]).all().item() for n in wa)
    vd, vu = val_losses(out)[args.max_iters], val_losses(ref_out)[args.max_iters]
    elapsed = time.time() - t0

    print(
        f"\nfault drill: seed {args.seed}, {args.kills} kills, {args.max_iters} iterations, "
        f"2 ranks ZeRO-2 fp32 on CPU, model {MODEL}, {elapsed:.0f} s\n"
    )
    print(
        table(
            [
                "kill",
                "mode",
                "rank",
                "killed while",
                "latest after",
                "partial dirs left",
                "2nd launch",
                "then damaged",
                "lost",
            ],
            [[str(c) if c is not None else "-" for c in row] for row in rows],
        )
    )
    killed = sum(1 for r in rows if r[4] != "run ended first")
    same = "yes" if same_weights and same_losses else "no"
    print()
    print(
        table(
            [
                "runs killed",
                "resumes",
                "checkpoints lost",
                "2nd launches refused",
                "damaged tags caught before loading",
                "final train loss (drilled / uninterrupted)",
                "final val loss (drilled / uninterrupted)",
                "bit-identical losses and weights",
            ],
            [
                [
                    str(killed),
                    str(tally["resumes"]),
                    str(tally["lost"]),
                    f"{tally['refused']} of {tally['intruders']}",
                    f"{tally['caught']} of {tally['damaged']}",
                    f"{drilled[args.max_iters]:.6f} / {uninterrupted[args.max_iters]:.6f}",
                    f"{vd:.6f} / {vu:.6f}",
                    same,
                ]
            ],
        )
    )
    print(f"\nruns in {work}")
    sound = tally["lost"] == 0 and tally["refused"] == tally["intruders"]
    sound = sound and tally["caught"] == tally["damaged"]
    return 0 if sound and same_losses and same_weights else 1


if __name__ == "__main__":
    sys.exit(main())
