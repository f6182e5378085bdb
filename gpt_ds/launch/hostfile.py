"""DeepSpeed hostfiles (`HOST slots=N` per line): parse them, report every bad line at once.

The accepted syntax is DeepSpeed's own (`deepspeed/launcher/runner.py`, `_parse_hostfile`):
each line is stripped; blank lines and lines starting with `#` are skipped; every other line
must match `^(\\S+)\\s+slots=(\\d+)`, and anything after that is ignored (so `max_slots=8` for
OpenMPI and a trailing `# comment` are fine). A host may appear once. DeepSpeed stops at the
first bad line; this parser lists all of them with their line numbers, and also rejects what
DeepSpeed lets through only to fail later: `slots=0`, `slots=4x`, and host names containing
the separators of pdsh and `--include/--exclude` (`,` `@` `:`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from gpt_ds.base.errors import ConfigError

# DeepSpeed's pattern, verbatim: a host, whitespace, then `slots=` and digits.
DS_HOSTFILE_PATTERN = re.compile(r"^(\S+)\s+slots=(\d+)")
_SLOTS_TOKEN = re.compile(r"^\S+\s+slots=(\S*)")
_HOST_SEPARATORS = ",@:"


@dataclass(frozen=True)
class HostEntry:
    """One `HOST slots=N` line: N is the number of ranks (GPUs) DeepSpeed starts on HOST."""

    host: str
    slots: int
    line: int


def _bad_entry_hint(line: str) -> str:
    """Why a line does not match DeepSpeed's pattern, in words."""
    if line.startswith("slots"):
        return "the host name is missing before 'slots='"
    if "slots" not in line:
        return "'slots=N' is missing"
    if re.search(r"slots\s*=\s*-", line):
        return "slots must be a whole number >= 1"
    if re.search(r"slots\s+=|slots=\s", line):
        return "write 'slots=N' with no spaces around '='"
    return "the second field must be 'slots=N'"


def _check_entry(match: re.Match, line: str, lineno: int) -> list[str]:
    """Problems DeepSpeed lets through on a line that matches its pattern."""
    host, slots = match.group(1), int(match.group(2))
    problems = []
    token_match = _SLOTS_TOKEN.match(line)
    assert token_match is not None  # `match` (DeepSpeed's pattern) matched: so does this one
    token = token_match.group(1)
    if not token.isdigit():
        problems.append(
            f"line {lineno}: {line!r}: slots value {token!r} is not a whole number "
            f"(DeepSpeed would silently read it as {slots})"
        )
    elif slots == 0:
        problems.append(f"line {lineno}: {line!r}: slots=0 starts no rank; remove the line")
    bad = sorted({c for c in host if c in _HOST_SEPARATORS})
    if bad:
        problems.append(
            f"line {lineno}: host {host!r} contains {' '.join(repr(c) for c in bad)}, which "
            "pdsh and --include/--exclude read as separators; use a plain hostname or IPv4 address"
        )
    return problems


def parse_hostfile_text(text: str, source: str = "hostfile") -> list[HostEntry]:
    """Entries in file order. Raises ConfigError naming every malformed line (1-based)."""
    entries: list[HostEntry] = []
    first_seen: dict[str, int] = {}
    problems: list[str] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = DS_HOSTFILE_PATTERN.search(line)
        if not match:
            problems.append(
                f"line {lineno}: {line!r} is not 'HOST slots=N' ({_bad_entry_hint(line)}), "
                "e.g. 'worker-1 slots=8'"
            )
            continue
        host = match.group(1)
        if host in first_seen:
            problems.append(
                f"line {lineno}: host {host!r} is listed again (first on line {first_seen[host]}); "
                "DeepSpeed refuses duplicate hosts: keep one line with the total slots"
            )
            continue
        first_seen[host] = lineno
        line_problems = _check_entry(match, line, lineno)
        problems.extend(line_problems)
        if not line_problems:
            entries.append(HostEntry(host, int(match.group(2)), lineno))
    if not first_seen and not problems:
        problems.append("no hosts: every line is blank or a comment; add 'worker-1 slots=8' lines")
    if problems:
        raise ConfigError(problems, source=source)
    return entries


def read_hostfile(path: str | Path) -> list[HostEntry]:
    """Parse a hostfile on disk; a missing file is a ConfigError too (DeepSpeed would only warn
    and silently train on the local node alone)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(
            f"hostfile {str(p)!r} not found; create it with one 'HOST slots=N' line per node "
            "(see hostfile.example)",
            source=str(p),
        )
    return parse_hostfile_text(p.read_text(encoding="utf-8"), source=str(p))


def world_size(entries: list[HostEntry]) -> int:
    """Ranks a plain `deepspeed --hostfile` launch starts (no --include/--exclude/--num_gpus)."""
    return sum(e.slots for e in entries)
