"""How a message or a printed command line names gpt_ds's commands: as a checkout runs them
(`python tools/prepare_data.py`, `gpt_ds/train.py`, `ds_configs/zero2.json`) when this package
is imported from its checkout, else as an installed package runs them (the console scripts of
pyproject.toml, `--module gpt_ds.train`, the preset's name): an installed package has no
tools/ or ds_configs/ folder beside it, so a hint naming one could not be followed."""

from __future__ import annotations

import functools
from importlib import metadata
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]


@functools.cache
def in_checkout() -> bool:
    """This package is the `gpt_ds/` folder of a source checkout (not site-packages)."""
    return (CHECKOUT / "pyproject.toml").is_file() and (CHECKOUT / "tools").is_dir()


# tools/ scripts not named like their gpt_ds/commands/ module: {command module: script}
SCRIPT_NAMES = {"export": "zero_to_fp32"}


@functools.cache
def _console_scripts() -> dict[str, str]:
    """{command module name: console script}, e.g. prepare_data -> gpt-ds-prepare."""
    prefix = "gpt_ds.commands."
    return {
        ep.value.removeprefix(prefix).split(":")[0]: ep.name
        for ep in metadata.entry_points(group="console_scripts")
        if ep.value.startswith(prefix)
    }


def tool(name: str) -> str:
    """The command for gpt_ds/commands/`name`.py: its tools/ script in a checkout (named
    `name`.py unless SCRIPT_NAMES says otherwise), else its console script."""
    if in_checkout() or name not in _console_scripts():
        return f"python tools/{SCRIPT_NAMES.get(name, name)}.py"
    return _console_scripts()[name]


def train_script() -> str:
    """What follows `deepspeed [launcher flags]` to run the trainer."""
    return "gpt_ds/train.py" if in_checkout() else "--module gpt_ds.train"


def preset_arg(preset_file: str) -> str:
    """--deepspeed_config's value for a shipped preset (`zero2.json`)."""
    return f"ds_configs/{preset_file}" if in_checkout() else Path(preset_file).stem
