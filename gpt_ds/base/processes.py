"""Is a process still there? For leftovers named after the process that made them (a
`.train.bin.PID.tmp` of a killed prepare_data, an export's `.OUT.tmp-PID`, an out dir's lock):
only a dead process's leftovers may be removed, never those of a run still writing."""

from __future__ import annotations

import os
from pathlib import Path


def pid_alive(pid: str | int) -> bool:
    """False only when no process `pid` exists on this machine; True when unsure."""
    try:
        os.kill(int(pid), 0)
    except ValueError:
        return True  # not a pid: not our naming, leave it alone
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


def _stat_fields(pid: int) -> list[str] | None:
    """Fields 3 onwards of `/proc/PID/stat` (index 0 is field 3, the state), None when the
    process is gone. Field 2, the command, may hold spaces: split after its closing ')'."""
    try:
        stat = Path(f"/proc/{int(pid)}/stat").read_text()
    except (OSError, ValueError):
        return None
    return stat.rsplit(")", 1)[1].split()


def process_identity(pid: int) -> str | None:
    """`BOOT_ID:START_TICKS` of a live process of this machine, None when there is no such
    process. A pid reused by another process, or a reboot, gives another identity."""
    fields = _stat_fields(pid)
    try:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    return None if fields is None else f"{boot_id}:{fields[19]}"  # field 22: start time


def parent_pid(pid: int) -> int | None:
    """The parent of a live process of this machine (None when it is gone)."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[1])  # field 4: ppid


def command_line(pid: int) -> str:
    """A live process's command line, arguments joined by spaces ('' when it is gone)."""
    try:
        raw = Path(f"/proc/{int(pid)}/cmdline").read_bytes()
    except (OSError, ValueError):
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()
