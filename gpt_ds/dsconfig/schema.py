"""DeepSpeed config files: find a preset, load it, check it against ds_configs/schema.json.

Every schema problem comes back as one line `json.path: what is wrong`, with "did you mean"
for misspelled keys and an explanation for keys DeepSpeed 0.19 removed.
"""

from __future__ import annotations

import difflib
import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema

from gpt_ds.base.cli import shipped_dir
from gpt_ds.base.errors import ConfigError

# installed: gpt_ds/ds_configs/ (pyproject maps the top-level ds_configs/ there)
PRESET_DIR = shipped_dir("ds_configs")
SCHEMA_PATH = PRESET_DIR / "schema.json"
PRESETS = ("zero1", "zero2", "zero2_offload", "zero3", "zero3_offload")
_JSON_EXAMPLE = f"a DeepSpeed config is one JSON object, e.g. {PRESET_DIR / 'zero2.json'}"
_YAML_KEY = re.compile(r'^(#.*\n\s*)*["\w-]+\s*:')  # `key: value`, after any # comments

# Keys DeepSpeed 0.19 dropped or renamed: a clearer message than "unknown key".
_REMOVED_KEYS = {
    "bfloat16": "old name of 'bf16'; rename it",
    "amp": "Apex AMP was removed from DeepSpeed 0.19; use 'bf16' or 'fp16'",
    "elasticity": "elastic training was removed from DeepSpeed 0.19; set the batch keys directly",
    "sparse_attention": "removed from DeepSpeed 0.19; delete it",
    "curriculum_learning": "removed from DeepSpeed 0.19 (use data_efficiency.data_sampling)",
    "progressive_layer_drop": "removed from DeepSpeed 0.19; delete it",
    "compression_training": "removed from DeepSpeed 0.19; delete it",
    "quantize_training": "removed from DeepSpeed 0.19; delete it",
    "sparse_gradients": "removed from DeepSpeed 0.19; delete it",
    "eigenvalue": "removed from DeepSpeed 0.19; delete it",
    "nebula": "removed from DeepSpeed 0.19; delete it",
    "graph_harvesting": "removed from DeepSpeed 0.19; delete it",
    "mics_shard_size": "MiCS was removed from DeepSpeed 0.19; delete it",
    "mics_hierarchical_params_gather": "MiCS was removed from DeepSpeed 0.19; delete it",
    "zeropp_loco_param": "LoCo-ZeRO++ was removed from DeepSpeed 0.19; delete it",
}


# ----------------------------------------------------------------------------------------------
# Loading and schema validation


def preset_path(name_or_path: str | Path) -> Path:
    """`zero2` -> PRESET_DIR/zero2.json; anything else is taken as a path. A missing
    `ds_configs/zero2.json` (the form the docs use, relative to a checkout) is the preset too,
    so the documented commands also work with an installed package, from any directory."""
    path = Path(name_or_path)
    if str(name_or_path) in PRESETS:
        return PRESET_DIR / f"{name_or_path}.json"
    documented = path.parts == ("ds_configs", f"{path.stem}.json") and path.stem in PRESETS
    if documented and not path.exists():
        return PRESET_DIR / path.name
    return path


def load_ds_config(path: str | Path) -> dict:
    """Read a DeepSpeed JSON config and check it against the schema; raise one ConfigError with
    every problem (missing file, JSON syntax with file:line:col, each schema violation)."""
    path = Path(path)
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            [f"{path}: no such file (presets in {PRESET_DIR}: {', '.join(PRESETS)})"], source
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError([f"{path}: cannot read: {e}"], source) from None

    duplicates: list[str] = []

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                duplicates.append(key)
            seen[key] = value
        return seen

    if not text.strip():
        raise ConfigError([f"{path}: the file is empty; {_JSON_EXAMPLE}"], source)
    try:
        raw = json.loads(text, object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as e:
        what = f"invalid JSON: {e.msg}"
        if not text.lstrip().startswith(("{", "[")) and _YAML_KEY.match(text.lstrip()):
            what = f"this looks like YAML, but DeepSpeed configs are JSON; {_JSON_EXAMPLE}"
        raise ConfigError([f"{path}:{e.lineno}:{e.colno}: {what}"], source) from None
    problems = [f"{key}: duplicate key (JSON keeps only the last one)" for key in duplicates]
    problems += validate_ds_config(raw)
    if problems:
        raise ConfigError(problems, source)
    return raw


@lru_cache(maxsize=1)
def _validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    return jsonschema.Draft202012Validator(schema)


def validate_ds_config(raw: Any) -> list[str]:
    """Every schema problem of a config, one line each, `json.path: what is wrong`."""
    errors = sorted(_validator().iter_errors(raw), key=lambda e: _json_path(e.absolute_path))
    lines: list[str] = []
    for error in errors:
        for line in _describe(error):
            if line not in lines:
                lines.append(line)
    return lines


def _json_path(parts) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _describe(error: jsonschema.ValidationError) -> list[str]:
    where = _json_path(error.absolute_path)
    if error.validator == "additionalProperties":
        known = sorted(error.schema.get("properties", {}))
        return [_unknown_key(where, key, known) for key in error.instance if key not in known]
    if error.validator in ("anyOf", "oneOf"):
        return _describe_alternatives(error, where)
    return [f"{where or '(top level)'}: {error.message}"]


def _unknown_key(where: str, key: str, known: list[str]) -> str:
    if key in _REMOVED_KEYS:
        return f"{_join(where, key)}: unknown key ({_REMOVED_KEYS[key]})"
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if close:
        return f"{_join(where, key)}: unknown key (did you mean '{close[0]}'?)"
    if len(known) <= 15:
        return f"{_join(where, key)}: unknown key (known here: {', '.join(known)})"
    return f"{_join(where, key)}: unknown key (see {SCHEMA_PATH})"


def _describe_alternatives(error: jsonschema.ValidationError, where: str) -> list[str]:
    """`anyOf` failures: report the branch that matched the value's kind (an object with a bad
    field), not "is not valid under any of the given schemas"."""
    branches: dict[int, list[jsonschema.ValidationError]] = {}
    for sub in error.context or []:
        branches.setdefault(sub.relative_schema_path[0], []).append(sub)

    def wrong_kind(errs: list[jsonschema.ValidationError]) -> bool:
        return (
            len(errs) == 1 and not errs[0].relative_path and errs[0].validator in ("type", "const")
        )

    relevant = [errs for errs in branches.values() if not wrong_kind(errs)]
    if relevant:
        return [line for sub in relevant[0] for line in _describe(sub)]
    # Wrong kind for every branch: '4' where an integer or "auto" is expected.
    types = [e.validator_value for errs in branches.values() for e in errs if e.validator == "type"]
    consts = [
        e.validator_value for errs in branches.values() for e in errs if e.validator == "const"
    ]
    wanted = [f"of type {t!r}" for t in types] + [f"the string {json.dumps(c)}" for c in consts]
    return [f"{where or '(top level)'}: {error.instance!r} is not {' or '.join(wanted)}"]
