"""`--config FILE`: a run's flags in a JSON or YAML file, the command line overriding them.

The file maps flag names (without `--`) to values, e.g. `{"model": "gpt2", "lr": 3e-4}` or the
same in YAML. A checkpoint's `gpt_ds.json` works too: its `config` (the run's flags as saved)
is replayed, so `--config out/final/gpt_ds.json --out_dir out2` repeats a run elsewhere.
Every key is checked against the flags and typed like them before any model is built.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_type_hints

from gpt_ds.base.cli import unwrap_hint
from gpt_ds.base.errors import ConfigError

_NOT_REPLAYED = {"config", "local_rank"}  # the file itself; set by the launcher


def load_flag_file(
    path: str | Path,
    cls: type,
    replayed: Callable[[dict[str, Any]], dict[str, Any]] = lambda manifest: manifest["config"],
) -> dict[str, Any]:
    """{field: value} from a JSON or YAML file, each value checked against `cls`'s field. A
    checkpoint manifest gives the flags `replayed` takes from it (its run config)."""
    path = Path(path)
    values = _read(path)
    if isinstance(values.get("config"), dict):  # a checkpoint manifest: replay its run config
        values = replayed(values)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = get_type_hints(cls)
    out, problems = {}, []
    for key, value in values.items():
        name = key.removeprefix("--")
        if name in _NOT_REPLAYED:
            continue
        if name not in fields:
            close = difflib.get_close_matches(name, list(fields), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            problems.append(f"{key}: not a flag of this command{hint}")
            continue
        try:
            out[name] = _typed(_from_bool(value, fields[name]), hints[name])
            _check_choice(out[name], fields[name])
        except (TypeError, ValueError) as exc:
            problems.append(f"{key}: {exc}")
    if problems:
        raise ConfigError(problems, source=str(path))
    return out


def _from_bool(value: Any, field: dataclasses.Field) -> Any:
    """A true/false saved for a flag that has since become a choice (`bool_values`: the
    choices false and true now mean)."""
    names = field.metadata.get("bool_values")
    return names[value] if names and isinstance(value, bool) else value


def _check_choice(value: Any, field: dataclasses.Field) -> None:
    choices = field.metadata.get("choices")
    if choices and value is not None and not isinstance(value, list) and value not in choices:
        also = " (or true/false)" if field.metadata.get("bool_values") else ""
        raise ValueError(f"must be one of {', '.join(map(str, choices))}{also}, got {value!r}")


def _read(path: Path) -> dict:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError([f"cannot read it ({exc.strerror or exc})"], source=str(path)) from None
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:  # its message names line and column
            raise ConfigError([f"not valid YAML: {exc}"], source=str(path)) from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            where = f"line {exc.lineno} column {exc.colno}"
            raise ConfigError([f"not valid JSON at {where}: {exc.msg}"], source=str(path)) from None
    if not isinstance(data, dict):
        raise ConfigError(
            ['must map flag names to values, e.g. {"model": "gpt2", "lr": 0.0003}'],
            source=str(path),
        )
    return data


def _typed(value: Any, hint: Any) -> Any:
    """`value` as the flag's type: ints for int flags (not 2.5), numbers for floats, etc."""
    optional = type(None) in typing.get_args(hint)
    if value is None:
        if optional:
            return None
        raise ValueError("may not be null")
    base, many = unwrap_hint(hint)
    if many:
        items = value if isinstance(value, list) else [value]
        return [_scalar(v, base) for v in items]
    return _scalar(value, base)


def _scalar(value: Any, base: type) -> Any:
    if base is bool:
        if isinstance(value, bool):
            return value
        raise ValueError(f"must be true or false, got {value!r}")
    if base is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ValueError(f"must be an integer, got {value!r}")
    if base is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML reads 3e-4 (no dot) as a string
            return float(value)
        raise ValueError(f"must be a number, got {value!r}")
    if isinstance(value, (dict, list, bool)):
        raise ValueError(f"must be a string, got {value!r}")
    return base(value)
