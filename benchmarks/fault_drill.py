"""Fault drill: SIGKILL a rank at random points of training and of checkpoint saves, resume
after each kill, and compare the end result with an uninterrupted run.

    python benchmarks/fault_drill.py                    # 4 kills, seed 0, ~2 min on 2 CPU cores
    python benchmarks/fault_drill.py --kills 8 --seed 3 --max_iters 24

Each launch is `deepspeed --num_gpus 2 gpt_ds/train.py ... [--resume]` on localhost (CPU, gloo).
A kill is either "train" (a random moment after a random iteration) or "save" (the instant a
`TAG.partial/` directory appears, i.e. while DeepSpeed writes the checkpoint), of a random
rank. After every kill the drill checks that each checkpoint that was complete before it is
still complete (manifest present, every file at its recorded size) and that `latest` names a
complete one; the next launch must resume from the newest complete checkpoint. A checkpoint
that fails either check is "lost". Prints one row per kill and a summary; exits 1 if a
checkpoint was lost or the drilled run does not end bit-identical to the uninterrupted one.
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

from helpers.faults import Launch  # noqa: E402
from helpers.launch import run_python, tiny_run_args  # noqa: E402
from helpers.runs import consolidated_model, train_losses, val_losses  # noqa: E402

from gpt_ds.metrics import read_metrics  # noqa: E402

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
    old = len(read_metrics(out, tolerate_partial_last_line=True))  # lines of earlier launches

    def trained() -> int:
        new = read_metrics(out, tolerate_partial_last_line=True)[old:]
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
    rows, lost, resumes = [], 0, 0
    start = 0
    for k in range(1, args.kills + 1):
        mode = rng.choice(["train", "save"])
        complete = complete_checkpoints(out) if out.exists() else {}
        newest = max((m["iteration"] for m in complete.values()), default=0)
        if newest >= args.max_iters - 1 - EVAL_INTERVAL:  # no iter_* save left before `final`
            mode = "train"
        resume = bool(complete)  # killed before the first checkpoint: start again
        run = Launch(run_args(data, out, args.max_iters, resume=resume), work / f"launch{k}.log")
        try:
            if resume:
                run.wait_for(lambda r=run: RESUMED.search(r.output), "the resume")
                _tag, it = RESUMED.search(run.output).groups()
                if int(it) != newest:
                    lost += 1  # resumed from an older checkpoint than the newest complete one
                resumes += 1
                start = int(it)
            else:
                start = 0
            before = complete_checkpoints(out)
            event = kill_once(run, out, mode, rng, start, args.max_iters)
        finally:
            run.cleanup()
        if not event["killed"]:
            rows.append((k, mode, event["rank"], event["where"], "run ended first", "", 0))
            break
        gone = [t for t, m in before.items() if not intact(out, t, m)]
        latest = (out / "latest").read_text().strip() if (out / "latest").exists() else None
        bad_latest = latest is not None and latest not in complete_checkpoints(out)
        lost += len(gone) + int(bad_latest)
        partial = ", ".join(sorted(d.name for d in out.glob("*.partial"))) or "-"
        rows.append(
            (k, mode, event["rank"], event["where"], latest, partial, len(gone) + bad_latest)
        )

    resume = bool(complete_checkpoints(out))
    final = Launch(run_args(data, out, args.max_iters, resume=resume), work / "final.log")
    try:
        final.finish_ok()
    finally:
        final.cleanup()
    resumes += int(resume)
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
            ["kill", "mode", "rank", "killed while", "latest after", "partial dirs left", "lost"],
            [[str(c) for c in row] for row in rows],
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
                "final train loss (drilled / uninterrupted)",
                "final val loss (drilled / uninterrupted)",
                "bit-identical losses and weights",
            ],
            [
                [
                    str(killed),
                    str(resumes),
                    str(lost),
                    f"{drilled[args.max_iters]:.6f} / {uninterrupted[args.max_iters]:.6f}",
                    f"{vd:.6f} / {vu:.6f}",
                    same,
                ]
            ],
        )
    )
    print(f"\nruns in {work}")
    return 0 if lost == 0 and same_losses and same_weights else 1


if __name__ == "__main__":
    sys.exit(main())
