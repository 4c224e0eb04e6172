from __future__ import annotations

import enum
from collections.abc import Sequence
from pathlib import Path

from .constants import KNOWN_TOOLS

# --------------------------------------------------------------- exit codes --


@enum.unique
class ExitCode(enum.IntEnum):
    """Exit status of every spawn.py command; the table in README.md."""

    OK = 0  # the agent (or every waited agent) finished with status done
    AGENT_FAILED = 1  # an agent failed, including schema-invalid output
    USAGE = 2  # bad flags or input; nothing was started or written
    STATE = 3  # session or state error: unwritable root, corrupt record
    REFUSED = 4  # refused by a limit (depth, deadline, tools); recorded
    TIMEOUT = 124  # deadline reached; the agent's subtree was ended
    INTERRUPTED = 130  # SIGINT (Ctrl-C); the subtree was ended
    KILLED = 143  # SIGTERM/SIGHUP or `spawn.py kill`; the subtree was ended


# ------------------------------------------------------------------- errors --


class SpawnError(Exception):
    """Base error: carries a one-line message and the exit code it maps to."""

    exit_code: ExitCode = ExitCode.AGENT_FAILED

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UsageError(SpawnError, ValueError):
    """Bad flags or input (exit 2)."""

    exit_code = ExitCode.USAGE


class StateError(SpawnError, OSError):
    """The session directory can't be used (exit 3)."""

    exit_code = ExitCode.STATE


class RefusedError(SpawnError):
    """A limit forbids this spawn (exit 4)."""

    exit_code = ExitCode.REFUSED


class UnknownToolError(UsageError):
    def __init__(self, names: Sequence[str]) -> None:
        super().__init__(f"unknown tool {', '.join(names)}; use names like {','.join(sorted(KNOWN_TOOLS)[:6])},... or mcp__SERVER__TOOL")


class UnknownAgentError(UsageError):
    def __init__(self, agent_id: str, where: Path) -> None:
        super().__init__(f"no agent {agent_id!r} under {where}; run 'spawn.py status' to list agents, or pass --session DIR")


class CorruptRecordError(StateError):
    def __init__(self, path: Path | str, why: str) -> None:
        super().__init__(f"corrupt record {path}: {why}; inspect or remove it")


class InputError(UsageError):
    """A user's YAML or JSON input that can't be used (exit 2), and where in it (load_input)."""

    def __init__(self, source: str, line: int | None, why: str) -> None:
        self.source, self.line, self.why = source, line, why
        super().__init__(f"{source}:{line}: {why}; fix it" if line else f"{source}: {why}; fix it")
