"""gpt_ds/base/cli.py: a dataclass becomes the command line, and the tools' exit codes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from gpt_ds.base.cli import build_parser, option, parse, run_tool
from gpt_ds.base.errors import ConfigError
from gpt_ds.run.config import RECIPE_DIR, RunConfig, config_file, parse_args


@dataclass(kw_only=True)
class Options:
    """Demo tool.

    Second paragraph."""

    out_dir: Path = option(help="where", positional=True)
    inputs: list[Path] | None = option(None, "input files", metavar="PATH")
    size: int | None = option(None, "a size", group="model")
    rate: float = option(help="required rate")
    resume: str | None = option(None, "a tag, or alone: latest", const="latest")
    quiet: bool = option(False, "no progress")
    hostfile: str | None = option(None, "a hostfile", one_of="where")
    local: bool = option(False, "this machine", one_of="where")
    precision: str = option("bf16", "dtype", choices=("bf16", "fp32"))
    python: str = option(help="interpreter", default_factory=lambda: "py")


def test_every_kind_of_field():
    argv = ["out", "--rate", "0.5", "--inputs", "a", "b", "--resume", "--local", "--size", "3"]
    opts = parse(Options, argv)
    assert opts == Options(
        out_dir=Path("out"),
        inputs=[Path("a"), Path("b")],
        size=3,
        rate=0.5,
        resume="latest",
        quiet=False,
        hostfile=None,
        local=True,
        precision="bf16",
        python="py",
    )
    assert parse(Options, ["o", "--rate", "1", "--resume", "iter_4", "--hostfile", "h"]).resume == (
        "iter_4"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["o", "--local"],  # --rate is required
        ["o", "--rate", "1"],  # one of --hostfile / --local is required
        ["o", "--rate", "1", "--local", "--hostfile", "h"],  # not both
        ["o", "--rate", "x", "--local"],  # not a float
        ["o", "--rate", "1", "--local", "--precision", "fp8"],  # not a choice
    ],
)
def test_bad_command_lines_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        parse(Options, argv)
    assert e.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_help_shows_defaults_groups_and_the_dedented_docstring():
    text = build_parser(Options).format_help()
    assert "Demo tool.\n\nSecond paragraph." in text
    assert "dtype (default: bf16)" in text
    assert "model:" in text and "--size SIZE" in text
    assert "(default: None)" not in text


def test_a_switch_a_flag_file_turned_on_is_turned_off_by_no_name(tmp_path):
    """A recipe that sets `activation_checkpointing: true` is overridden on the command line."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("activation_checkpointing: true\nno_checkpoint: true\n")
    assert parse_args(["--config", str(recipe)]).activation_checkpointing
    cfg = parse_args(["--config", str(recipe), "--no_activation_checkpointing"])
    assert not cfg.activation_checkpointing and cfg.no_checkpoint
    assert not parse(Options, ["o", "--rate", "1", "--local", "--quiet", "--no_quiet"]).quiet
    with pytest.raises(SystemExit):  # a choice of a group, and a negation, get no --no_
        parse(Options, ["o", "--rate", "1", "--local", "--no_local"])
    assert "--no_quiet" not in build_parser(Options).format_help()


def test_config_names_a_recipe_from_any_directory(tmp_path, monkeypatch):
    """`--config recipes/NAME.yaml` (the docs' form) or `--config NAME` where no such file is
    here: the shipped recipe; anything else missing is refused naming the recipes."""
    monkeypatch.chdir(tmp_path)
    name = "gpt2_124m_fineweb_edu_10b"
    for given in (f"recipes/{name}.yaml", name, f"{name}.yaml"):
        assert config_file(given) == RECIPE_DIR / f"{name}.yaml", given
        assert parse_args(["--config", given]).model == "gpt2"
    own = tmp_path / "recipes" / f"{name}.yaml"  # a file of that path here wins
    own.parent.mkdir()
    own.write_text("model: gpt2-tiny\n")
    assert parse_args(["--config", f"recipes/{name}.yaml"]).model == "gpt2-tiny"
    with pytest.raises(ConfigError) as refused:
        config_file("gpt2_125m")
    assert "gpt2_125m" in str(refused.value) and name in str(refused.value)


def test_run_config_cli_accepts_the_launchers_local_rank():
    cfg = parse_args(["--local_rank=1", "--max_iters", "5"])
    assert (cfg.local_rank, cfg.max_iters) == (1, 5)
    assert parse_args(["--local-rank=3"]).local_rank == 3
    assert parse_args([]) == RunConfig()


def test_run_tool_exit_codes(capsys):
    assert run_tool(lambda: 0) == 0
    assert run_tool(lambda: None) == 0
    assert run_tool(lambda: 1) == 1

    def bad():
        raise ConfigError(["--x must be > 0"], source="demo")

    assert run_tool(bad) == 2
    assert capsys.readouterr().err.startswith("error: invalid configuration (demo):")

    def interrupted():
        raise KeyboardInterrupt

    assert run_tool(interrupted, interrupted="interrupted: nothing was written") == 130
    assert "interrupted: nothing was written" in capsys.readouterr().err


def test_help_shows_no_empty_or_second_default():
    """An empty-string default shows nothing (it printed "(default: )"), and a help that states
    its default gets no second one."""

    @dataclass
    class Opts:
        prompt: str = option("", "text to continue (default: start of a document)")
        name: str = option("", "a name")

    text = build_parser(Opts).format_help()
    assert "(default: )" not in text
    assert text.count("(default:") == 1
