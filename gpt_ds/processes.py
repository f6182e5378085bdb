"""Is a process still there? For leftovers named after the process that made them (a
`.train.bin.PID.tmp` of a killed prepare_data, an export's `.OUT.tmp-PID`): only a dead
process's leftovers may be removed, never those of a run still writing."""

from __future__ import annotations

import os


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
