"""Admission: who may run now. --max-concurrent's slot markers in the agents' directories.

Above supervision: a lent slot is taken back only while its agent lives.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from .constants import SLOT_LENT, SLOT_MARKER, SLOT_POLL_S
from .errors import SpawnError
from .processes import Supervised
from .protocol import DONE_MARKER, FAIL_MARKER, iter_agent_dirs, load_meta, session_lock, write_new_file
from .records import AgentMeta


def holds_slot(agent_dir: Path) -> bool:
    if not (agent_dir / SLOT_MARKER).exists() or (agent_dir / DONE_MARKER).exists() or (agent_dir / FAIL_MARKER).exists():
        return False
    try:
        meta = load_meta(agent_dir)
    except (FileNotFoundError, SpawnError):
        return False
    return Supervised.of(meta).alive()


def try_take_slot(agent_dir: Path, max_concurrent: int) -> bool:
    """Take one of the session's --max-concurrent slots if one is free."""
    session = agent_dir.parent.parent
    with session_lock(session):
        if sum(holds_slot(d) for d in iter_agent_dirs(session)) >= max_concurrent:
            return False
        with contextlib.suppress(FileExistsError):
            write_new_file(agent_dir / SLOT_MARKER, b"")
        return True


def lend_slot(agent_dir: Path) -> bool:
    """Give back a slot while its agent is blocked on children; False if it held none."""
    with session_lock(agent_dir.parent.parent):
        if not holds_slot(agent_dir):
            return False
        os.replace(agent_dir / SLOT_MARKER, agent_dir / SLOT_LENT)
        return True


def take_back_slot(agent_dir: Path, max_concurrent: int, meta: AgentMeta) -> None:
    """Wait for a slot again after lending it; stop if the agent ends meanwhile."""
    while not try_take_slot(agent_dir, max_concurrent):
        if (agent_dir / DONE_MARKER).exists() or (agent_dir / FAIL_MARKER).exists() or not Supervised.of(meta).alive():
            break
        time.sleep(SLOT_POLL_S)
    with contextlib.suppress(FileNotFoundError):
        (agent_dir / SLOT_LENT).unlink()
