"""The README says what the code does: its usage section runs the same training command as
launchers/quickstart.sh, and every flag it shows exists."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from gpt_ds.run.config import build_parser

REPO = Path(__file__).resolve().parents[1]


def train_flags(text: str, data: str, out: str) -> list[str]:
    """The flags of the first `deepspeed ... gpt_ds/train.py ...` command in `text`."""
    joined = re.sub(r"\\\n\s*", " ", text)
    line = next(x for x in joined.splitlines() if "gpt_ds/train.py --" in x)
    words = shlex.split(line.replace('"$DATA"', data).replace('"$OUT"', out))
    flags = words[words.index("gpt_ds/train.py") + 1 :]
    return [w for w in flags if w != '"$@"' and w != "$@"]


def test_readme_usage_trains_like_the_quickstart():
    readme = (REPO / "README.md").read_text()
    usage = readme[readme.index("## Usage") :]
    quickstart = (REPO / "launchers" / "quickstart.sh").read_text()
    ours = train_flags(usage, "data/shakespeare", "out/shakespeare")
    theirs = train_flags(quickstart, "data/shakespeare", "out/shakespeare")
    assert ours == theirs
    build_parser().parse_args(ours)  # every flag exists and parses


MACHINE_PROBES = re.compile(
    r"pytest\.skip\(|is_fp16_supported|detect_precision\(\)|sshd_fixture|ensure_packages"
    r'|Path\("/sys|torch\.cuda\.is_available|gather_facts\(|shutil\.which|compile_blocker\("'
)


def test_every_test_module_that_probes_the_machine_is_listed():
    """CONTRIBUTING's table of machine-dependent tests names every module that asks the machine
    (skips, CPU/GPU facts, sshd, packages installed at test time): none can be added unseen."""
    table = (REPO / "CONTRIBUTING.md").read_text()
    table = table[table.index("## Tests that depend on the machine") :]
    listed = set(re.findall(r"`(\w+\.py)`", table))
    probing = {
        p.name
        for p in (REPO / "tests").glob("*.py")
        if p.name != "test_docs.py" and MACHINE_PROBES.search(p.read_text())
    }
    assert probing - listed == set()
    assert listed - {p.name for p in (REPO / "tests").glob("*.py")} == set()  # no stale rows
