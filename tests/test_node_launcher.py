"""The tests' per-node launcher (tests/harness/node_launcher.py) against DeepSpeed's own
(deepspeed/launcher/launch.py): the tests' launches start the former, so each rank must get the
same arguments and environment, and a failing rank must end the launch the same way."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from harness.launch import node_launch
from support.launch import free_port, launch_env

# A rank that records what it was given, waits until every rank has, then does what PROBE_ACT
# says for its rank.
PROBE = """
import json, os, sys, time
out = os.environ["PROBE_DIR"]
mine = os.path.join(out, f"rank{os.environ['RANK']}.json")
with open(mine + ".tmp", "w") as f:
    json.dump({"argv": sys.argv[1:], "env": dict(os.environ)}, f)
os.rename(mine + ".tmp", mine)
while len([n for n in os.listdir(out) if n.endswith(".json")]) < int(os.environ["WORLD_SIZE"]):
    time.sleep(0.05)
act = json.loads(os.environ.get("PROBE_ACT", "{}")).get(os.environ["RANK"])
if act == "sleep":
    time.sleep(300)
elif act is not None:
    sys.exit(act)
"""


def run_probe(tmp_path: Path, lean: bool, act: dict[str, object]) -> tuple[int, dict]:
    """Launch the probe on 2 ranks through one launcher; its exit status and what each rank got."""
    out = tmp_path / ("lean" if lean else "deepspeed")
    out.mkdir()
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    env = {**launch_env(), "PROBE_DIR": str(out), "PROBE_ACT": json.dumps(act)}
    cmd, env = node_launch(2, free_port(), script, ["--flag", "x"], env, lean=lean)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    return proc.returncode, {p.stem: json.loads(p.read_text()) for p in out.glob("rank*.json")}


def without_launch_own(env: dict[str, str]) -> dict[str, str]:
    """A rank's environment but for what differs between two launches: the probe's folder and
    the launch's free port."""
    return {k: v for k, v in env.items() if k not in ("PROBE_DIR", "MASTER_PORT")}


def test_each_rank_gets_what_deepspeeds_launcher_gives_it(tmp_path):
    rc_ds, by_deepspeed = run_probe(tmp_path, lean=False, act={})
    rc_lean, by_lean = run_probe(tmp_path, lean=True, act={})
    assert rc_ds == rc_lean == 0
    assert sorted(by_lean) == sorted(by_deepspeed) == ["rank0", "rank1"]
    for rank, given in by_deepspeed.items():
        lean = by_lean[rank]
        assert lean["argv"] == given["argv"]
        assert without_launch_own(lean["env"]) == without_launch_own(given["env"]), rank
    assert by_lean["rank1"]["argv"] == ["--local_rank=1", "--flag", "x"]


@pytest.mark.parametrize("lean", [False, True], ids=["deepspeed", "lean"])
def test_a_failing_rank_ends_the_launch_with_its_status(tmp_path, lean):
    """Rank 1 exits 3 while rank 0 sleeps: the launcher terminates rank 0 and exits 3 (the
    subprocess timeout, 120 s, would fail the test long before rank 0 woke)."""
    rc, given = run_probe(tmp_path, lean=lean, act={"0": "sleep", "1": 3})
    assert rc == 3 and sorted(given) == ["rank0", "rank1"]
