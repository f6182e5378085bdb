"""The docs say what the code does: the training page runs the same command as
launchers/quickstart.sh, its flag reference is `gpt_ds/train.py --help`'s flags (generated from
RunConfig, and current), every training command shown uses real flags, and so does every tool
command (`tools/X.py`, `gpt-ds-*`), the README stays short with the quick start on its first
screen and CI's test command in it, links and their #anchors resolve, and user docs carry no
internal issue numbers."""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from gpt_ds.base.cli import flag_reference
from gpt_ds.dsconfig.resolve import (
    DEFAULT_GRAD_ACCUM,
    DEFAULT_MICRO_BATCH,
    FLAG_DEFAULTS,
    RunSettings,
    resolve_ds_config,
)
from gpt_ds.dsconfig.schema import load_ds_config
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
    current = flag_reference(RunConfig, FLAG_DEFAULTS)
    assert block == current, "stale: run python tools/flag_reference.py"


def test_the_batch_flags_show_the_defaults_the_resolution_uses():
    """--micro_batch_size and --grad_accum are None ("not given") on the command line; their
    row shows what resolve.py then uses, from its own constants."""
    _, block, _ = reference_tool.split(TRAINING.read_text())
    cells = {row.split(" | ")[0][2:]: row.split(" | ")[1] for row in block.splitlines()[2:]}
    micro = cells["`--micro_batch_size MICRO_BATCH_SIZE`"]
    assert micro.startswith(f"`{DEFAULT_MICRO_BATCH}` (")
    assert cells["`--grad_accum GRAD_ACCUM`"].startswith(f"`{DEFAULT_GRAD_ACCUM}` (")
    settings = RunSettings(world_size=2, decay_iters=10)
    resolved = resolve_ds_config(load_ds_config(REPO / "ds_configs" / "zero2.json"), settings)
    assert resolved.config["train_micro_batch_size_per_gpu"] == DEFAULT_MICRO_BATCH
    assert resolved.config["gradient_accumulation_steps"] == DEFAULT_GRAD_ACCUM


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


LINKED_DOCS = [*USER_DOCS, REPO / "CONTRIBUTING.md", REPO / "ds_configs" / "README.md"]
CODE_BLOCK = re.compile(r"^```.*?^```", re.M | re.S)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: link texts kept, lowercase, every character but letters,
    digits, spaces, - and _ dropped, spaces to -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of `path`'s headings (not `#` lines of code blocks); a repeated heading's
    second anchor ends in -1, its third in -2, ..."""
    counts: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} +(.+?)[ #]*$", CODE_BLOCK.sub("", path.read_text()), re.M):
        base = slug(heading)
        found.add(f"{base}-{counts[base]}" if base in counts else base)
        counts[base] = counts.get(base, 0) + 1
    return found


def test_slugs_follow_githubs_rules():
    assert slug("Every flag of `gpt_ds/train.py`") == "every-flag-of-gpt_dstrainpy"
    assert slug("A hang that names its rank (`--hang_timeout`)") == (
        "a-hang-that-names-its-rank---hang_timeout"
    )
    assert slug("Recipe: fine-tune GPT-2 XL on 4 x 32 GB GPUs") == (
        "recipe-fine-tune-gpt-2-xl-on-4-x-32-gb-gpus"
    )


def test_every_anchor_of_a_relative_link_is_a_heading_of_its_page(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A\n## Notes\n```\n# not a heading\n```\n## Notes\n### Notes\n")
    assert anchors(page) == {"a", "notes", "notes-1", "notes-2"}
    broken = []
    for path in LINKED_DOCS:
        text = CODE_BLOCK.sub("", path.read_text())
        for target, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", text):
            web = target.startswith(("http://", "https://"))
            if web or (target and not target.endswith(".md")):  # not a page of ours
                continue
            linked = path.parent / target if target else path
            if anchor not in anchors(linked):
                broken.append(f"{path.relative_to(REPO)}: {target}#{anchor}")
    assert broken == []


def option_flags(help_text: str) -> set[str]:
    """The flags of a `--help` text's option lines (indented 2: not its prose), and --help."""
    options = help_text[re.search(r"^options:$", help_text, re.M).start() :]
    return {
        flag
        for line in options.splitlines()
        if line.startswith("  -")  # an option line: its flags, then its help after 2 spaces
        for flag in FLAG.findall(re.split(r"\s{2,}", line.strip())[0])
    } | {"--help"}


@functools.cache
def command_flags(module: str) -> frozenset[str]:
    """The flags `--help` of gpt_ds.commands.`module` lists, run in this process."""
    main = importlib.import_module(f"gpt_ds.commands.{module}").main
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(["--help"])
    return frozenset(option_flags(out.getvalue()))


def tool_flags() -> dict[str, frozenset[str]]:
    """Each tool as the docs name it (`tools/X.py`, `gpt-ds-Y`) -> the flags it takes: its
    command's `--help`, or a tool without one (flag_reference.py) its docstring's usage."""
    tools = {}
    for path in (REPO / "tools").glob("*.py"):
        source = path.read_text()
        command = re.search(r"^from gpt_ds\.commands\.(\w+) import main$", source, re.M)
        usage = source.split("\n", 1)[0]
        flags = command_flags(command[1]) if command else frozenset(FLAG.findall(usage))
        tools[f"tools/{path.name}"] = flags
    scripts = (REPO / "pyproject.toml").read_text()
    for name, module in re.findall(
        r'^(gpt-ds-[\w-]+) = "gpt_ds\.commands\.(\w+):main"$', scripts, re.M
    ):
        tools[name] = command_flags(module)
    return tools


TOOL_NAME = re.compile(r"(?<![\w.-])(tools/\w+\.py|gpt-ds-[a-z]+(?:-[a-z]+)*)")
COMMAND_END = re.compile(r"\s#|&&|\s\|\s|;|\$\(")  # a comment, the next command


def tool_uses(text: str) -> list[tuple[str, str]]:
    """(tool, its arguments) of every tool command in `text`'s code: blocks (continuation
    lines joined) and inline spans."""
    blocks = re.sub(
        r"\\\n\s*", " ", "\n".join(re.findall(r"^```\w*\n(.*?)^```", text, re.M | re.S))
    )
    spans = re.findall(r"`([^`\n]+)`", CODE_BLOCK.sub("", text))
    uses = []
    for code in [*blocks.splitlines(), *spans]:
        parts = TOOL_NAME.split(code)  # before, tool, what follows it, tool, ...
        for tool, after in zip(parts[1::2], parts[2::2], strict=True):
            uses.append((tool, COMMAND_END.split(after, 1)[0]))
    return uses


def test_every_flag_the_docs_give_a_tool_is_in_its_help():
    """`python tools/X.py ... --flag` and `gpt-ds-Y ... --flag` in the docs' code (blocks and
    inline), up to a comment or the next command: each flag is one the tool's --help lists."""
    known = tool_flags()
    assert {"tools/sample.py", "gpt-ds-sample", "tools/flag_reference.py"} <= set(known)
    assert (
        "--max_new_tokens" in known["tools/sample.py"]
        and "--check" in known["tools/flag_reference.py"]
    )
    wrong = [
        f"{path.relative_to(REPO)}: {tool} {flag}"
        for path in LINKED_DOCS
        for tool, args in tool_uses(path.read_text())
        for flag in FLAG.findall(args)
        if flag not in known.get(tool, {flag})
    ]
    assert wrong == []


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
