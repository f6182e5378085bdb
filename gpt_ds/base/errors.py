"""Errors a user can act on. Each names the field, file or flag at fault and what to change."""

from __future__ import annotations


class GptDsError(Exception):
    """Base class: the entry points print these as one clear message and exit non-zero."""


class ConfigError(GptDsError, ValueError):
    """A run or DeepSpeed config is invalid. Carries every problem found, not just the first."""

    def __init__(self, problems: list[str] | str, source: str | None = None):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.source = source
        head = f"invalid configuration ({source})" if source else "invalid configuration"
        super().__init__(head + ":\n" + "\n".join(f"  - {p}" for p in self.problems))


class DataError(GptDsError):
    """Input text or prepared token files are missing, empty, corrupt or inconsistent."""


class CheckpointError(GptDsError):
    """A checkpoint is missing, incomplete or does not match the run."""
