"""Process-wide state that a fork resets, registered in one place (the fork server forks warm)."""

from __future__ import annotations

from collections.abc import Callable

# ------------------------------------------ process-wide state a fork resets --
# The session's fork server is a fork of the root, and every spawn it runs is
# a fork of the server: module-level state of the process forked from must not
# leak into what runs there. Each piece is registered with how to put it back
# as a fresh interpreter has it (on_fork), or named in KEPT_ACROSS_FORKS with
# why a copy is right. tests/test_fork_state.py reads spawn.py and fails on
# a module-level mutable that the code changes, a name a function rebinds
# (`global`), a module-level object or class whose attributes are assigned at
# run time, or a cached function, that is in neither.

FORK_RESETS: dict[str, Callable[[], None]] = {}
KEPT_ACROSS_FORKS: dict[str, str] = {
    "FORK_RESETS": "the registry itself: the same functions in every process",
    "KEPT_ACROSS_FORKS": "this list: constant",
    "_FIELDS": "dataclass field names by record type: the same in every process",
    "_PROCFS_OURS": "keyed by pid: a fork is another pid, so it never reads its parent's entry",
    "ForkedFor": "set in the fork server's child right after the fork; never set in the server it is forked from",
    "sdk_version_file": "the installed SDK's version: the same in every process of one environment",
    "verified_copy": "the compiled copy as checked; compiled_script checks the file again when it changes",
    "bounded_yaml_loader": "a loader class: no state of its own",
    "builtin_delegates": "the built-in definitions' names and descriptions, embedded in spawn.py: the same in every process",
    "_BOOT_ID": "this boot's id: the same in every process of one boot",
    "WORKFLOW_FOR": "a table filled in two statements at import: the same in every process",
}


def on_fork(name: str, reset: Callable[[], None]) -> None:
    """Register how to put name's state back as a fresh interpreter has it."""
    FORK_RESETS[name] = reset


def reset_after_fork() -> None:
    """In a fork's child (the fork server, and each spawn it forks): forget the parent's process-wide state."""
    for reset in FORK_RESETS.values():
        reset()
