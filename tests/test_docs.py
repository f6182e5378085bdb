"""The docs say what the code does: the training page runs the same command as
launchers/quickstart.sh, its flag reference is `gpt_ds/train.py --help`'s flags (generated from
RunConfig, and current), every training command shown uses real flags, and so does every tool
command (`tools/X.py`, `gpt-ds-*`), the README stays short with the quick start on its first
screen and CI's test command in it, links and their #anchors resolve, and user docs carry no
internal issue numbers. Every command a shell block or a recipe's header starts exists in the
environment setup_env.sh builds or is a named system tool; the README launches what its picker
command prints; and no page states a time or a speed that BENCHMARKS.md or CONTRIBUTING.md, where
figures are measured with their machine and date, does not."""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import io
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.machine import here

from gpt_ds.base.cli import flag_reference
from gpt_ds.dsconfig.resolve import resolve_ds_config
from gpt_ds.dsconfig.schema import load_ds_config
from gpt_ds.dsconfig.settings import (
    DEFAULT_GRAD_ACCUM,
    DEFAULT_MICRO_BATCH,
    FLAG_DEFAULTS,
    RunSettings,
)
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
    resolved = resolve_ds_config(
        load_ds_config(REPO / "ds_configs" / "zero2.json"), settings, facts=here()
    )
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


# ---------------------------------------------------------------- the commands the docs start
# Commands a shell block may start that are not in the environment setup_env.sh builds: the
# system's own, each named here (a node's python3 and pip, the schedulers, llama.cpp's tools)
# (in words, not a list of strings: test_system_changes looks for code that runs apt-get)
SYSTEM_TOOL_NAMES = """bash sh . cd cp mkdir curl sudo apt-get ssh ssh-keyscan ssh-copy-id scp
rsync git $EDITOR python3 srun sbatch scontrol mpirun pdsh docker nvidia-smi rocm-smi llama-cli
llama-perplexity"""
SYSTEM_TOOLS = set(SYSTEM_TOOL_NAMES.split())
SHELL_BLOCK = re.compile(r"^( *)```(?:bash|sh|shell)\n(.*?)^\1```", re.M | re.S)
RECIPES = sorted((REPO / "recipes").glob("*.yaml"))
OPERATORS = {"&&", "||", ";", "|", "&"}


def doc_commands(text: str) -> list[str]:
    """The command lines of a page's shell blocks, continuation lines joined."""
    lines = []
    for _, body in SHELL_BLOCK.findall(text):
        lines += re.sub(r"\\\n\s*", " ", body).splitlines()
    return [line.strip() for line in lines if line.strip()]


def recipe_commands(recipe: Path) -> tuple[list[str], list[str]]:
    """(commands, prose lines) of a recipe's header: a command is indented 5 spaces after its
    `#` (prose 1 or 3), and a line ending in `\\` continues it on the next."""
    commands, prose, going = [], [], False
    for line in recipe.read_text().splitlines():
        if not line.startswith("#"):
            break
        text = line[1:]
        if going:
            commands[-1] += " " + text.strip().rstrip("\\").strip()
        elif text.startswith(" " * 5) and not text.startswith(" " * 6):
            commands.append(text.strip().rstrip("\\").strip())
        else:
            prose.append(text.strip())
        going = text.rstrip().endswith("\\")
    return commands, prose


def started(line: str) -> list[tuple[str, list[str]]]:
    """(command, its arguments) of each command `line` starts: after `NAME=value` words, and
    after each `&&`, `||`, `;`, `|` standing apart (`[--format hf|pt]` in a synopsis is one
    word); a comment ends the line."""
    lexer = shlex.shlex(line, posix=True)
    lexer.whitespace_split = True
    try:
        words = list(lexer)
    except ValueError:  # an unclosed quote: the words before it
        words = line.split()
    found, current = [], None
    for word in words:
        if word in OPERATORS:
            current = None
        elif current is None:
            if re.fullmatch(r"[A-Za-z_]\w*=.*", word):
                continue
            current = (word, [])
            found.append(current)
        else:
            current[1].append(word)
    return found


def unknown_command(command: str, args: list[str], venv_bin: Path) -> str | None:
    """Why `command` is not one the environment or the system list has (None: it is). A
    script run by path, by `bash`/`sh`/`.` or by `python` must exist in the checkout (or, under
    .venv/bin, in the environment)."""

    def path_missing(word: str) -> str | None:
        if word.startswith(".venv/bin/"):
            return None if (venv_bin / word.removeprefix(".venv/bin/")).exists() else word
        return None if (REPO / word).exists() else word

    if "/" in command:
        return path_missing(command) and f"{command}: no such file"
    if command in {"python", "python3", "bash", "sh", "."}:
        script = next((a for a in args if not a.startswith("-")), None)
        if args and args[0] in ("-m", "-c"):
            script = None
        if script and "/" in script and (gone := path_missing(script)):
            return f"{command} {gone}: no such file"
    if command in SYSTEM_TOOLS or (venv_bin / command).exists():
        return None
    return f"{command}: neither in {venv_bin} nor a named system tool"


def test_every_command_the_docs_start_exists_here_or_is_a_named_system_tool():
    """Each command a shell block of README.md, docs/*.md or ds_configs/README.md starts, and
    each command of a recipe's header, is in the environment setup_env.sh built (this one:
    `hf`, `deepspeed`, `gpt-ds-*`, python, lm_eval, ...), a script of the checkout by path, or
    one of SYSTEM_TOOLS: a command huggingface_hub no longer installs is found."""
    venv_bin = Path(sys.prefix) / "bin"
    assert unknown_command("huggingface-cli", [], venv_bin), "huggingface_hub 2 has only `hf`"
    commands = [
        (path.relative_to(REPO), line)
        for path in [
            README,
            *sorted((REPO / "docs").glob("*.md")),
            REPO / "ds_configs" / "README.md",
        ]
        for line in doc_commands(path.read_text())
    ] + [(path.relative_to(REPO), line) for path in RECIPES for line in recipe_commands(path)[0]]
    assert len(commands) > 80
    wrong = [
        f"{where}: {why}"
        for where, line in commands
        for command, args in started(line)
        if (why := unknown_command(command, args, venv_bin))
    ]
    assert wrong == []


def test_a_recipes_commands_are_indented_as_commands():
    """The header's commands are found by their indentation: each recipe's data and start
    commands are, and no prose line reads like a command (a word, then a flag; or a `\\`)."""
    for recipe in RECIPES:
        commands, prose = recipe_commands(recipe)
        assert any(f"--config recipes/{recipe.name}" in c for c in commands), recipe.name
        assert any(c.startswith("curl ") for c in commands), recipe.name
        assert not any(re.match(r"\S+ -{1,2}[a-z]", p) or p.endswith("\\") for p in prose), (
            recipe.name
        )


def test_the_readme_launches_what_its_picker_command_prints(capsys):
    """Step 3 of "Your own data on N GPUs" starts with the command step 2's picker prints."""
    from gpt_ds.commands.pick_preset import main as pick_preset

    steps = re.sub(r"\\\n\s*", " ", README.read_text().split("## Your own data on N GPUs")[1])
    asked = re.search(r"python tools/pick_preset\.py (.*)", steps)[1]
    assert pick_preset(shlex.split(asked)) == 0
    printed = next(
        line.strip()
        for line in capsys.readouterr().out.splitlines()
        if line.strip().startswith("deepspeed ")
    )
    launched = next(line for line in steps.splitlines() if line.startswith("deepspeed --num_gpus"))
    assert launched.split()[: len(printed.split())] == printed.split(), (printed, launched)


# ---------------------------------------------------------------- figures live in two pages
NUMBER = r"(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)"
SECONDS = {"ms": 0.001, "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1, "min": 60,
           "mins": 60, "minute": 60, "minutes": 60}  # fmt: skip
UNIT = r"(ms|secs?|seconds?|s|mins?|minutes?)"
# `~15 min`, `13.4 s`, `10-minute`, `17 to 19.5 min`, `3 min 19 s`, `~20 ms`
TIME = re.compile(
    rf"(?<![\w./^-])~?{NUMBER}(?:\s*(?:-|–|to)\s*{NUMBER})?[\s-]?{UNIT}(?!\w)"
    rf"(?:\s+{NUMBER}\s?(ms|secs?|seconds?|s)(?!\w))?"
)
SPEED = re.compile(rf"(?<![\w./^-])~?{NUMBER}\s?(?:tokens|tok)(?:/s\b|\s+(?:per|a)\s+second\b)")
FIGURE_SOURCES = [REPO / "BENCHMARKS.md", REPO / "CONTRIBUTING.md"]
# Figures of seconds or minutes that are no measurement: a setting of gpt_ds, of DeepSpeed or of
# a command shown beside it (the file that sets it, and the setting, which it must still hold),
# or arithmetic on the page (None). Each phrase must be on its page: no entry outlives its text.
HANG_DEFAULT = ("gpt_ds/run/config.py", "max(300, 20 x the median step)")
LOCK_STALE = ("gpt_ds/run/lock.py", "STALE_AFTER_SECONDS = 600.0")
DS_KILL = ("deepspeed/launcher/launch.py", "wait_procs(children, timeout=30)")
DS_TIMEOUT = ("deepspeed/constants.py", 'os.getenv("DEEPSPEED_TIMEOUT", default=10)')
REFUSAL_WAIT = ("gpt_ds/base/dist.py", "REFUSAL_WAIT_S = 20.0")
SLURM_SIGNAL = ("launchers/slurm.sbatch", "--signal=B:TERM@120")
PICKER_STEP = ("tests/test_recipes.py", "s of communication in")
NOT_MEASURED = {
    "README.md": [("max(5 min, 20 x the median step)", HANG_DEFAULT)],
    "docs/checkpoints.md": [
        ("max(5 min, 20 x the median step)", HANG_DEFAULT),
        ("no heartbeat for 10 minutes", LOCK_STALE),
        ("kills ranks 30 s after forwarding a signal", DS_KILL),
    ],
    "docs/launching.md": [
        ("launchers kill ranks 30 s after the signal", DS_KILL),
        ("SIGTERM to the batch script 120 s before", SLURM_SIGNAL),
        ("to about 30 minutes of training", ("docs/launching.md", "--save_every_minutes 30")),
        ("Docker waits 120 s instead of its default 10", ("docs/launching.md", "stop -t 120")),
    ],
    "docs/troubleshooting.md": [
        ("max(5 min, 20 x the median step)", HANG_DEFAULT),
        ("kills ranks 30 s after it is signalled", DS_KILL),
        ("if a save takes longer than ~30 s", DS_KILL),
        ("10 minutes for NCCL and gloo alike", DS_TIMEOUT),
        ("(at most 20 s;", REFUSAL_WAIT),
        ("holds rank 0 back 2 s", ("tests/test_refusal.py", "HOLD_S = 2.0")),
        # the slow-network table: gradient bytes at line rate, 8 bits a byte; sums of it
        ("| 0.25 GB | 2.0 s | 0.20 s |", None),
        ("| 0.71 GB | 5.7 s | 0.57 s |", None),
        ("| 1.55 GB | 12.4 s | 1.24 s |", None),
        ("| 3.12 GB | 24.9 s | 2.49 s |", None),
        ("spends ~11 s per step on communication", None),
        ("makes the 11 s above 0.7 s per micro-batch", None),
    ],
    "recipes/gpt2_124m_two_nodes_1gbps.yaml": [
        ("~3.5 s at 1 Gbps", None),  # ~0.44 GB at 1 Gbps
        ("3.48 s of communication in 7.71 s", PICKER_STEP),  # the picker's estimate
        ("at that estimate of 7.71 s", PICKER_STEP),
    ],
}


def figures(text: str) -> set[tuple[str, float]]:
    """Every figure of time (in seconds) or speed (tokens/s) `text` states in words, and in
    tables under a column headed `tokens/s` or `seconds`: `3 min 19 s` is 199 s, `~15 min` 900,
    `13.4 s` 13.4, `245,637 tokens/s` 245637."""
    found = set()
    for m in TIME.finditer(text):
        first, last, unit, extra, extra_unit = m.groups()
        plus = float(extra.replace(",", "")) * SECONDS[extra_unit] if extra else 0
        for value in (first, last):
            if value:
                seconds = float(value.replace(",", "")) * SECONDS[unit] + plus
                found.add(("time", round(seconds, 3)))
    found |= {("speed", float(n.replace(",", ""))) for n in SPEED.findall(text)}
    for table in re.findall(r"(?:^\|.*\|\n)+", text, re.M):
        rows = [[c.strip() for c in row.strip("|").split("|")] for row in table.splitlines()]
        for col, head in enumerate(rows[0]):
            kind = "speed" if re.match(r"(tokens|tok)/s", head) else None
            kind = "time" if re.match(r"seconds\b", head) else kind
            for row in rows[2:] if kind else []:
                cell = row[col] if col < len(row) else ""
                found |= {(kind, float(n.replace(",", ""))) for n in re.findall(NUMBER, cell)}
    return found


def prose(text: str) -> str:
    """A page's words: no code blocks or inline code (commands and sample output), and its
    whitespace as one space."""
    text = re.sub(r"`[^`]*`", "", re.sub(r"^ *```.*?^ *```", "", text, flags=re.M | re.S))
    return re.sub(r"[ \t]*\n[ \t]*", "\n", text)


def setter_path(name: str) -> Path:
    """A file of the checkout, or of the installed DeepSpeed (`deepspeed/...`)."""
    if name.startswith("deepspeed/"):  # found, not imported
        return Path(importlib.util.find_spec("deepspeed").origin).parent.parent / name
    return REPO / name


def recipe_header(recipe: Path) -> str:
    return "\n".join(line[1:] for line in recipe.read_text().splitlines() if line.startswith("#"))


def test_times_and_speeds_are_stated_where_they_are_measured():
    """README.md, docs/, ds_configs/README.md and the recipes' headers state no figure of
    seconds, minutes or tokens/s that BENCHMARKS.md or CONTRIBUTING.md (measured, with machine
    and date) does not also state; a page links to them instead. NOT_MEASURED lists, with the
    file that sets each, the figures that are settings or arithmetic, not measurements."""
    sources = set().union(*(figures(p.read_text()) for p in FIGURE_SOURCES))
    assert ("time", 199.0) in figures("3 min 19 s") and ("time", 900.0) in figures("~15 min")
    assert figures("10-minute, 17 to 19.5 min") == {
        ("time", 600.0),
        ("time", 1020.0),
        ("time", 1170.0),
    }
    assert ("speed", 245637.0) in sources and ("time", 3136.0) in sources  # 52 min 16 s
    pages = {
        path.relative_to(REPO).as_posix(): prose(path.read_text())
        for path in [
            README,
            *sorted((REPO / "docs").glob("*.md")),
            REPO / "ds_configs" / "README.md",
        ]
    }
    pages |= {path.relative_to(REPO).as_posix(): prose(recipe_header(path)) for path in RECIPES}
    stale = []
    for page, entries in NOT_MEASURED.items():
        for phrase, set_by in entries:
            text = " ".join(pages[page].split())
            if phrase not in text:
                stale.append(f"{page}: {phrase!r} is not there")
            pages[page] = text.replace(phrase, "")
            if set_by and set_by[1] not in setter_path(set_by[0]).read_text():
                stale.append(f"{set_by[0]} no longer holds {set_by[1]!r}")
    assert stale == []
    unsourced = [
        f"{page}: {kind} {value:g}"
        for page, text in pages.items()
        for kind, value in sorted(figures(text) - sources)
    ]
    assert unsourced == []
