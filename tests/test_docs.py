"""The docs say what the code does: the training page runs the same command as
launchers/quickstart.sh, its flag reference is `gpt_ds/train.py --help`'s flags (generated from
RunConfig, and current), every training command shown uses real flags, the README stays short
with the quick start on its first screen and CI's test command in it, links resolve, and user
docs carry no internal issue numbers."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

from gpt_ds.base.cli import flag_reference
from gpt_ds.run.config import RunConfig, build_parser

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
TRAINING = REPO / "docs" / "training.md"
USER_DOCS = [README, REPO / "BENCHMARKS.md", *sorted((REPO / "docs").glob("*.md"))]
FLAG = re.compile(r"(?<![\w-])--[a-z][\w-]*")

sys.path.insert(0, str(REPO / "tools"))
import flag_reference as reference_tool  # noqa: E402


def train_flags(text: str, data: str, out: str) -> list[str]:
    """The flags of the first `deepspeed ... gpt_ds/train.py ...` command in `text`."""
    joined = re.sub(r"\\\n\s*", " ", text)
    line = next(x for x in joined.splitlines() if "gpt_ds/train.py --" in x)
    words = shlex.split(line.replace('"$DATA"', data).replace('"$OUT"', out))
    flags = words[words.index("gpt_ds/train.py") + 1 :]
    return [w for w in flags if w != '"$@"' and w != "$@"]


def test_the_training_page_trains_like_the_quickstart():
    page = TRAINING.read_text()
    steps = page[page.index("## Step by step") :]
    quickstart = (REPO / "launchers" / "quickstart.sh").read_text()
    ours = train_flags(steps, "data/shakespeare", "out/shakespeare")
    theirs = train_flags(quickstart, "data/shakespeare", "out/shakespeare")
    assert ours == theirs
    build_parser().parse_args(ours)  # every flag exists and parses


def help_flags() -> set[str]:
    """The flags `gpt_ds/train.py --help` lists (its option lines, not its prose)."""
    out = subprocess.run(
        [sys.executable, "gpt_ds/train.py", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    options = out[out.index("options:") :]
    return {
        flag
        for line in options.splitlines()
        if re.match(r"\s+-", line)  # an option line: its flags, then its help after 2 spaces
        for flag in FLAG.findall(re.split(r"\s{2,}", line.strip())[0])
    } - {"--help"}


def test_the_flag_reference_lists_every_flag_of_help_and_no_other():
    _, block, _ = reference_tool.split(TRAINING.read_text())
    listed = {FLAG.match(row[3:]).group() for row in block.splitlines()[2:]}
    assert listed == help_flags()
    for flag in help_flags():  # whole words, anywhere in the block
        assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", block), flag
    assert set(FLAG.findall(block)) - help_flags() == set()


def test_the_committed_flag_reference_is_what_the_generator_writes_now():
    _, block, _ = reference_tool.split(TRAINING.read_text())
    assert block == flag_reference(RunConfig), "stale: run python tools/flag_reference.py"


def test_every_training_command_in_the_docs_uses_real_flags():
    known = {s for a in build_parser()._actions for s in a.option_strings}
    wrong = []
    for path in USER_DOCS:
        blocks = "\n".join(re.findall(r"^```\w*\n(.*?)^```", path.read_text(), re.M | re.S))
        for line in re.sub(r"\\\n\s*", " ", blocks).splitlines():  # commands, not prose
            entry = re.search(r"gpt_ds/train\.py|gpt_ds\.train ", line)
            if entry:  # the flags after it (the launcher's come before), up to a comment
                command = line[entry.end() :].split("#")[0]
                wrong += [f"{path.name}: {f}" for f in FLAG.findall(command) if f not in known]
    assert wrong == []


def test_the_readme_is_short_and_opens_with_the_two_commands():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250
    first_screen = "\n".join(lines[:60])
    assert "bash launchers/setup_env.sh && bash launchers/quickstart.sh" in first_screen
    assert "bash launchers/setup_env.sh && .venv/bin/python -m pytest" in first_screen


def test_the_readme_test_command_is_the_one_ci_runs():
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert f"\n{ci}\n" in README.read_text()


def test_relative_links_in_the_docs_resolve():
    broken = []
    for path in [*USER_DOCS, REPO / "CONTRIBUTING.md"]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text()):
            web = target.startswith(("http://", "https://"))
            if not web and not (path.parent / target).exists():
                broken.append(f"{path.relative_to(REPO)}: {target}")
    assert broken == []


def test_user_docs_name_no_internal_issue_numbers():
    found = [
        f"{path.relative_to(REPO)}:{n}: {line.strip()}"
        for path in USER_DOCS
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\bissue \d+", line, re.IGNORECASE)
    ]
    assert found == []


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
