"""One command-line style for every entry point: a dataclass is the CLI.

Each field of an options dataclass becomes one argument; its metadata (set with `option()`)
holds the `--help` text and, where needed, `positional`, `choices`, `const` (an optional value:
`--resume` alone means `latest`), `group` (a titled section of `--help`) or `one_of` (a required
choice of exactly one of several flags). Types come from the annotations: `bool` is a switch
(`--no_NAME` turns off one a `--config` file turned on), `X | None` takes an X, `list[X]` takes
one or more (with `repeatable`, also from repeated flags: `--x a --x b`). Defaults are written
once, on the field.

`run_tool` is the one exit-code convention of the tools: 0 done, 2 on a `GptDsError` (printed
as `error: ...`), 130 on Ctrl-C. `tool` names a command in a hint the way the user runs it: a
checkout's `python tools/X.py`, or an installed `gpt-ds-X` script.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata, resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, get_type_hints

from gpt_ds.base.errors import GptDsError

# How a message or a printed command line names gpt_ds's commands: as a checkout runs them
# (`python tools/prepare_data.py`, `gpt_ds/train.py`, `ds_configs/zero2.json`) when this package
# is imported from its checkout, else as an installed package runs them (the console scripts of
# pyproject.toml, `--module gpt_ds.train`, the preset's name): an installed package has no
# tools/ or ds_configs/ folder beside it, so a hint naming one could not be followed.

CHECKOUT = Path(__file__).resolve().parents[2]


@functools.cache
def in_checkout() -> bool:
    """This package is the `gpt_ds/` folder of a source checkout (not site-packages)."""
    return (CHECKOUT / "pyproject.toml").is_file() and (CHECKOUT / "tools").is_dir()


def shipped_dir(folder: str) -> Path:
    """A folder shipped with the code (ds_configs/, recipes/): installed, gpt_ds/`folder`/
    (pyproject.toml maps the top-level folder there); in a source checkout or an editable
    install, the top-level `folder`/."""
    packaged = resources.files("gpt_ds") / folder
    if isinstance(packaged, Path) and packaged.is_dir():
        return packaged
    return CHECKOUT / folder


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


if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")
_SCALARS = (bool, int, float, Path, str)


def option(default: Any = dataclasses.MISSING, help: str = "", **cli: Any) -> Any:
    """A dataclass field with its command-line metadata (see the module docstring).

    `default_factory=` works as in `dataclasses.field`; no default makes the flag required.
    """
    factory = cli.pop("default_factory", dataclasses.MISSING)
    return dataclasses.field(
        default=default, default_factory=factory, metadata={"help": help, **cli}
    )


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults in `--help` (where there is one to show and the help does not already say it),
    the tool's docstring as written."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        said = "(default" in (action.help or "")
        if action.default in (None, False, "") or action.required or said:
            return action.help
        return super()._get_help_string(action)


class _Repeatable(argparse.Action):
    """Values of every use of the flag, in order. The first use replaces the default (a flag
    file's value, `--config`) rather than adding to it, as any other flag does."""

    def __call__(self, _parser, namespace, values, _option_string=None):
        current = getattr(namespace, self.dest, None)
        kept = [] if current is None or current is self.default else list(current)
        setattr(namespace, self.dest, kept + list(values))


def unwrap_hint(hint: Any) -> tuple[type, bool]:
    """(element type, is a list) of an annotation such as `int | None` or `list[Path] | None`."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    if typing.get_origin(hint) is list:
        return typing.get_args(hint)[0], True
    return hint, False


def _argument(f: dataclasses.Field, hint: Any) -> tuple[list[str], dict[str, Any]]:
    """The `add_argument` call for one field."""
    meta = f.metadata
    base, many = unwrap_hint(hint)
    if base not in _SCALARS:
        raise TypeError(f"{f.name}: no command-line form for {hint!r}")
    kwargs: dict[str, Any] = {"help": argparse.SUPPRESS if meta.get("hidden") else meta["help"]}
    if f.default is not dataclasses.MISSING:
        kwargs["default"] = f.default
    elif f.default_factory is not dataclasses.MISSING:
        kwargs["default"] = f.default_factory()
    elif not meta.get("positional") and not meta.get("one_of"):
        kwargs["required"] = True
    if base is bool:
        kwargs["action"] = "store_true"
    else:
        kwargs["type"] = base
        if many:
            kwargs["nargs"] = "+"
            if meta.get("repeatable"):  # --x a --x b: both
                kwargs["action"] = _Repeatable
        elif "const" in meta:
            kwargs.update(nargs="?", const=meta["const"])
    for key in ("choices", "metavar"):
        if key in meta:
            kwargs[key] = meta[key]
    if meta.get("positional"):
        kwargs.pop("required", None)
        if "default" in kwargs:
            kwargs["nargs"] = "?"
        return [f.name], kwargs
    return [f"--{f.name}", *meta.get("aliases", ())], kwargs


def build_parser(cls: type, description: str | None = None, prog: str | None = None):
    """An argparse parser with one argument per field of the dataclass `cls`."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description or inspect.cleandoc(cls.__doc__ or ""),
        formatter_class=_HelpFormatter,
        allow_abbrev=False,  # --max_iter must not silently mean --max_iters
    )
    hints = get_type_hints(cls)
    sections: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        flags, kwargs = _argument(f, hints[f.name])
        if "one_of" in f.metadata:
            name = f.metadata["one_of"]
            if name not in sections:
                sections[name] = parser.add_mutually_exclusive_group(required=True)
            target = sections[name]
        elif "group" in f.metadata:
            name = f.metadata["group"]
            if name not in sections:
                sections[name] = parser.add_argument_group(name)
            target = sections[name]
        else:
            target = parser
        if flags[0].startswith("-"):
            kwargs["dest"] = f.name
        target.add_argument(*flags, **kwargs)
        if kwargs.get("action") == "store_true" and _can_be_switched_off(f):
            target.add_argument(
                f"--no_{f.name}", dest=f.name, action="store_false", help=argparse.SUPPRESS
            )
    return parser


def _can_be_switched_off(f: dataclasses.Field) -> bool:
    """A switch a `--config` file may have turned on gets `--no_NAME` to turn it off again
    (the command line wins over the file); not for switches that are already negations
    (`--no_checkpoint`) or that choose one of a group."""
    return not f.name.startswith("no_") and "one_of" not in f.metadata


def parse(
    cls: type[T],
    argv: Sequence[str] | None = None,
    defaults: dict[str, Any] | None = None,
    **parser_kwargs: Any,
) -> T:
    """Parse `argv` (default: sys.argv) into an instance of the dataclass `cls`; `defaults`
    replace the fields' own (a flag file's values: the command line still wins)."""
    parser = build_parser(cls, **parser_kwargs)
    if defaults:
        parser.set_defaults(**defaults)
    namespace = parser.parse_args(argv)
    return cls(**{f.name: getattr(namespace, f.name) for f in dataclasses.fields(cls) if f.init})


def run_tool(main: Callable[[], int | None], interrupted: str = "interrupted") -> int:
    """Run a tool's body with the tools' exit codes: its own, 2 on a GptDsError, 130 on Ctrl-C.

    `interrupted` is what Ctrl-C prints (say whether anything was left written).
    """
    try:
        return main() or 0
    except GptDsError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        print(interrupted, file=sys.stderr, flush=True)
        return 130


def flag_reference(cls: type, resolved: Mapping[str, str] | None = None) -> str:
    """A Markdown table of the flags of the dataclass `cls`, from the same fields and metadata
    as `build_parser` (hidden ones left out, as `--help` leaves them out): what docs/ shows.

    `resolved`: by field name, the default cell of fields whose default is None ("not given")
    because their value is decided later (the batch flags: gpt_ds.dsconfig.resolve)."""
    hints = get_type_hints(cls)
    rows = ["| flag | default | meaning |", "|---|---|---|"]
    for f in dataclasses.fields(cls):
        if not f.init or f.metadata.get("hidden"):
            continue
        flags, kwargs = _argument(f, hints[f.name])
        default = (resolved or {}).get(f.name) or _default(kwargs)
        cells = [_usage(flags, kwargs), default, f.metadata["help"]]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows) + "\n"


def _usage(flags: list[str], kwargs: dict[str, Any]) -> str:
    """`--name VALUE` as a user types it: choices spelled out, an optional value in brackets."""
    name = flags[0]
    if kwargs.get("action") == "store_true":
        return f"`{name}`"
    value = kwargs.get("metavar") or name[2:].upper()  # as --help names it
    if "choices" in kwargs:
        value = "|".join(map(str, kwargs["choices"]))
    if kwargs.get("nargs") == "+":
        value += f" [{value} ...]"
    return f"`{name} [{value}]`" if kwargs.get("nargs") == "?" else f"`{name} {value}`"


def _default(kwargs: dict[str, Any]) -> str:
    if kwargs.get("required"):
        return "required"
    default = kwargs.get("default")
    if default is None or default is False:
        return ""
    return f"`{default}`"
