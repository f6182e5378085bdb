"""HellaSwag examples as token rows, scored the way build-nanogpt's hellaswag.py scores them.

The published validation file (hellaswag_val.jsonl) has one JSON object per line; each names a
context (`ctx`), four `endings` and the right one (`label`). Each ending is encoded with a
leading space after its context (GPT-2's byte-pair encoding joins the space to the word) and
scored on its own tokens only. A context too long for the model's block loses its oldest
tokens; an ending that alone leaves no room for one context token cannot be scored, and its
example is skipped (and counted). Scoring itself is gpt_ds/training/hellaswag.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpt_ds.base.errors import DataError

ENDINGS = 4
MAX_PROBLEMS_SHOWN = 10


@dataclass(frozen=True)
class Example:
    """One HellaSwag item, tokenized: the context, the four endings, the right ending's index."""

    context: tuple[int, ...]
    endings: tuple[tuple[int, ...], ...]
    label: int


@dataclass(frozen=True)
class Rows:
    """An example's four context+ending rows, padded to one length: `tokens` (4, L) int64 and
    `scored` (4, L) bool, true on the ending's tokens (each predicted from the token before)."""

    tokens: np.ndarray
    scored: np.ndarray
    label: int


@dataclass(frozen=True)
class Rendered:
    """A file's examples rendered for one block size, once: what scoring reads each time."""

    rows: list[Rows]  # the examples that fit, never empty
    skipped: int  # an ending too long for the block


def read_hellaswag(path: str | Path) -> list[Example]:
    """Every example of a HellaSwag JSONL file, tokenized. A malformed line is a DataError
    naming the file and line (all such lines, up to MAX_PROBLEMS_SHOWN), before any scoring."""
    from gpt_ds.data.tokenizer import get_encoding

    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"--hellaswag {path}: cannot read it ({exc})") from None
    enc = get_encoding()
    examples, problems = [], []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        item, problem = _parse(line)
        if problem:
            problems.append(f"line {number}: {problem}")
            continue
        endings = tuple(tuple(enc.encode_ordinary(" " + e)) for e in item["endings"])
        context = tuple(enc.encode_ordinary(item["ctx"]))
        examples.append(Example(context, endings, item["label"]))
    if problems:
        shown = problems[:MAX_PROBLEMS_SHOWN]
        more = len(problems) - len(shown)
        shown += [f"... and {more} more malformed lines"] if more else []
        raise DataError(f"--hellaswag {path}: not HellaSwag's format:\n  " + "\n  ".join(shown))
    if not examples:
        raise DataError(f"--hellaswag {path}: no examples in it")
    return examples


def _parse(line: str) -> tuple[dict, str | None]:
    """(the line's object, None) or ({}, what is wrong with it)."""
    try:
        item = json.loads(line)
    except json.JSONDecodeError as exc:
        return {}, f"not JSON ({exc.msg} at column {exc.colno})"
    if not isinstance(item, dict):
        return {}, "not a JSON object"
    if not (isinstance(item.get("ctx"), str) and item["ctx"].strip()):
        return {}, '"ctx" must be a non-empty string'
    endings = item.get("endings")
    if not (isinstance(endings, list) and len(endings) == ENDINGS):
        return {}, f'"endings" must be a list of {ENDINGS} strings'
    if not all(isinstance(e, str) and e for e in endings):
        return {}, f'"endings" must be a list of {ENDINGS} non-empty strings'
    label = item.get("label")
    if isinstance(label, str) and label.isdigit():  # some copies store it as text
        label = int(label)
    if not (isinstance(label, int) and not isinstance(label, bool) and 0 <= label < ENDINGS):
        return {}, f'"label" must be an integer from 0 to {ENDINGS - 1}'
    return {**item, "label": label}, None


def render(example: Example, block_size: int) -> Rows | None:
    """The example's rows for a model of `block_size` positions, or None when an ending alone
    leaves no room for a context token."""
    if max(len(e) for e in example.endings) >= block_size:
        return None
    rows = []
    for ending in example.endings:
        keep = block_size - len(ending)
        rows.append((example.context[-keep:], ending))
    width = max(len(c) + len(e) for c, e in rows)
    tokens = np.zeros((ENDINGS, width), dtype=np.int64)
    scored = np.zeros((ENDINGS, width), dtype=bool)
    for i, (context, ending) in enumerate(rows):
        tokens[i, : len(context) + len(ending)] = context + ending
        scored[i, len(context) : len(context) + len(ending)] = True
    return Rows(tokens, scored, example.label)


def render_all(examples: list[Example], block_size: int, path: str | Path) -> Rendered:
    """Every example of the file at `path` rendered for `block_size`; a DataError when none
    fits (an ending of every example fills the block)."""
    rendered = [render(e, block_size) for e in examples]
    rows = [r for r in rendered if r is not None]
    if not rows:
        raise DataError(
            f"--hellaswag {path}: every example has an ending of {block_size} tokens or more "
            f"(the model's block): nothing to score; use a model with a longer block"
        )
    return Rendered(rows, skipped=len(examples) - len(rows))
