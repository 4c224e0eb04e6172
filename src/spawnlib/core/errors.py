"""ExitCode and the SpawnError family: what went wrong, as main() turns it into an exit code."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from pathlib import Path

from .constants import KNOWN_TOOLS

# --------------------------------------------------------------- exit codes --


@enum.unique
class ExitCode(enum.IntEnum):
    """Exit status of every spawn.py command; the table in docs/exit-codes.md."""

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


def close_match(word: str, candidates: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The candidate closest to a mistyped word, if any is close (pure).

    Python 3.11's argparse suggests nothing (3.14's does); difflib is
    imported here, on the error path only.
    """
    import difflib

    close = difflib.get_close_matches(word, sorted(candidates), n=1, cutoff=cutoff)
    return close[0] if close else None


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """ "; did you mean 'X'?" for the closest candidate to a mistyped word, or "" (pure)."""
    match = close_match(word, candidates)
    return f"; did you mean {match!r}?" if match else ""


class UnknownToolError(UsageError):
    def __init__(self, names: Sequence[str]) -> None:
        hint = did_you_mean(names[0], KNOWN_TOOLS) if len(names) == 1 else ""
        known = f"use names like {','.join(sorted(KNOWN_TOOLS)[:6])},... or mcp__SERVER__TOOL"
        super().__init__(f"unknown tool {', '.join(names)}{hint} {known}" if hint else f"unknown tool {', '.join(names)}; {known}")


class UnknownVerbError(UsageError):
    def __init__(self, word: str, verbs: Sequence[str]) -> None:
        hint = did_you_mean(word, verbs)
        rest = f"verbs are {', '.join(verbs)}; a task goes in --task TEXT (see 'spawn.py --help')"
        super().__init__(f"unknown verb {word!r}{hint}" if hint else f"unknown verb {word!r}; {rest}")


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
