"""Call tokens: which agent's Bash call a spawn.py runs in, inside a CLI that hosts in-process agents.

A host's in-process agents (Claude Code subagents, docs/inprocess.md) all run
inside its one CLI, so their Bash commands share its process ancestry and its
environment: process identity, which names every other spawn's parent, can't
tell one of them from another, or from the host. The host's runner sees each
Bash call in its PreToolUse hook, with the agent that makes it, so it mints a
token for that one call there and puts it at the head of the command
(updatedInput), which the agent's own text can't come before:

    export SPAWN_CALL=TOKEN
    <the agent's command>

and keeps a record of it, CALLS_DIR/<sha256 of TOKEN>.json in its own
directory, naming the agent the call is made by and that agent's limits, from
the runner's memory. A spawn.py under such a host (its nearest registered
runner's placement is inprocess or auto) starts only with a token whose record
holds, and then as a child of that record's agent, with its limits. Without
one (`unset SPAWN_CALL`, a process the call didn't start) it is refused.

A copy of another call's token is worth nothing where it is used:
- a record holds only while its call runs (the PostToolUse hook ends it), and
  its owner's;
- the spawn must run below the CLI through a process the CLI started for a
  call after the token was minted (not one that was there before: a poller
  another call left behind);
- the first spawn.py to present it binds it to its call's shell (the process
  right below the CLI), and every later one must run below that same shell.
A background runner (`_run`), whose launcher may have exited and so left the
call's process tree, is held to the record alone, for CALL_GRACE_S after its call ended.

The file name is the token's digest, so a listing of the folder gives no token.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.constants import CALLS_DIR, ENV_CALL
from ..core.errors import RefusedError, SpawnError
from ..core.placement import IN_PROCESS_POLICIES
from ..session.protocol import read_outcome, read_text, write_json_atomic

CALL_GRACE_S = 10.0  # a background runner its call's launcher started checks the record this long after the call ended
SAME_PROCESS_S = 0.05  # create times of one process, as two readers compute them, differ by less than this
CALL_TOKEN_BYTES = 24


@dataclass
class CallRecord:
    """One Bash call's token, as its host's runner wrote it: whose call, and that agent's limits."""

    owner: dict[str, Any]
    """The calling agent's context, in ancestor_agent_context's shape: the spawn's parent."""
    tool_use_id: str
    cli: tuple[int, float]
    """The host's CLI process (pid, create time): the call's processes are below it."""
    before: list[int] = field(default_factory=list)
    """The CLI's child processes when the token was minted: none of them is the call's."""
    ended: float | None = None
    """When its call ended (time.time()), else None."""


def new_call_token() -> tuple[str, str]:
    """(token, its digest): the digest names the record."""
    import secrets  # here: it imports hashlib, which a root's start never needs (tests/test_ancestry.py)

    token = secrets.token_hex(CALL_TOKEN_BYTES)
    return token, token_digest(token)


def token_digest(token: str) -> str:
    import hashlib

    return hashlib.sha256(token.encode()).hexdigest()


def with_call_token(command: str, token: str) -> str:
    """The Bash command with its call's token set first, where nothing the agent wrote comes before it (pure)."""
    return f"export {ENV_CALL}={token}\n{command}"


def call_record_path(host_dir: Path, digest: str) -> Path:
    return host_dir / CALLS_DIR / f"{digest}.json"


def write_call_record(host_dir: Path, digest: str, record: CallRecord) -> None:
    (host_dir / CALLS_DIR).mkdir(mode=0o700, exist_ok=True)
    data = {"owner": record.owner, "tool_use_id": record.tool_use_id, "cli": list(record.cli), "before": record.before}
    write_json_atomic(call_record_path(host_dir, digest), {**data, "ended": record.ended})


def read_call_record(host_dir: Path, digest: str) -> CallRecord | None:
    with contextlib.suppress(OSError, SpawnError, ValueError, TypeError, KeyError):
        data = json.loads(read_text(call_record_path(host_dir, digest)))
        cli = data["cli"]
        ended = data.get("ended")
        return CallRecord(
            owner=dict(data["owner"]),
            tool_use_id=str(data["tool_use_id"]),
            cli=(int(cli[0]), float(cli[1])),
            before=[int(p) for p in data.get("before") or []],
            ended=float(ended) if ended is not None else None,
        )
    return None


def end_call_record(host_dir: Path, digest: str, now: float) -> None:
    """Its call is over: no new spawn may present it (a background runner it launched, for CALL_GRACE_S)."""
    record = read_call_record(host_dir, digest)
    if record is not None and record.ended is None:
        record.ended = now
        write_call_record(host_dir, digest, record)


def drop_call_record(host_dir: Path, digest: str) -> None:
    for path in (call_record_path(host_dir, digest), call_record_path(host_dir, digest).with_suffix(".claim")):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def hosts_in_process(runner: Mapping[str, Any]) -> bool:
    """The nearest runner runs a CLI whose Bash calls may be its in-process agents' (pure)."""
    return runner.get("placement") in IN_PROCESS_POLICIES


def call_problem(
    record: CallRecord, chain: Sequence[tuple[int, float]], *, background_runner: bool, now: float, brokered: bool = False
) -> str | None:
    """Why this process may not use the token's record, or None (pure).

    chain: this process and its ancestors, nearest first, as (pid, create time).
    brokered: this process is the host runner's own child, which only its broker
    starts, for a request a sandboxed Bash call filed with its token.
    """
    if record.ended is not None and (not background_runner or brokered or now > record.ended + CALL_GRACE_S):
        return "its Bash call has ended"
    if background_runner or brokered:
        return None
    below = call_shell(record, chain)
    if below is None:
        return "this process was not started by that Bash call (it is not below the CLI)"
    if below[0] in record.before:
        return "this process runs below a process that was there before the Bash call started"
    return None


def run_by_host(runner: Mapping[str, Any], chain: Sequence[tuple[int, float]]) -> bool:
    """This process is the host runner's own child: its broker's spawn, for a sandboxed Bash call (pure).

    No agent's process is: the CLI is the runner's child, and every Bash call runs below it.
    """
    pid, created = runner.get("pid"), runner.get("create_time")
    if len(chain) < 2 or not isinstance(pid, int) or not isinstance(created, int | float):
        return False
    return chain[1][0] == pid and abs(chain[1][1] - created) < SAME_PROCESS_S


def call_shell(record: CallRecord, chain: Sequence[tuple[int, float]]) -> tuple[int, float] | None:
    """The process right below the host's CLI in chain: the call's shell, or None when chain doesn't reach the CLI (pure)."""
    for i, (pid, created) in enumerate(chain):
        if pid == record.cli[0] and abs(created - record.cli[1]) < SAME_PROCESS_S:
            return chain[i - 1] if i > 0 else None
    return None


def claim_call(host_dir: Path, digest: str, shell: tuple[int, float]) -> str | None:
    """Bind the token to its call's shell at its first use; why this shell may not use it, or None."""
    path = call_record_path(host_dir, digest).with_suffix(".claim")
    mine = json.dumps(list(shell))
    with contextlib.suppress(FileExistsError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(mine)
        return None
    try:
        pid, created = json.loads(read_text(path))
    except (OSError, SpawnError, ValueError, TypeError):
        return "its record is damaged"
    if pid == shell[0] and abs(created - shell[1]) < SAME_PROCESS_S:
        return None
    return "it was already used from another process's Bash call"


def call_owner(
    environ: Mapping[str, str], runner: Mapping[str, Any], chain: Sequence[tuple[int, float]], *, background_runner: bool = False
) -> dict[str, Any]:
    """The agent whose Bash call runs this spawn.py, under a runner whose CLI hosts in-process agents: its context.

    Raises RefusedError without a token that holds for this process.
    """
    host_dir = Path(str(runner["agent_dir"]))
    token = environ.get(ENV_CALL, "")
    advice = (
        f"spawn.py runs inside agent {runner['parent_id']}'s CLI, which hosts in-process agents: start it straight from "
        f"an agent's Bash command, which sets {ENV_CALL} for that call, and leave {ENV_CALL} set"
    )
    if not token:
        raise RefusedError(f"no {ENV_CALL} token: {advice}")
    digest = token_digest(token)
    record = read_call_record(host_dir, digest)
    if record is None:
        raise RefusedError(f"{ENV_CALL} names no Bash call of this CLI: {advice}")
    brokered = run_by_host(runner, chain)
    problem = call_problem(record, chain, background_runner=background_runner, now=time.time(), brokered=brokered)
    if problem is None and read_outcome(Path(str(record.owner["agent_dir"]))) is not None:
        problem = f"its agent {record.owner['parent_id']} has ended"
    if problem is None and not background_runner and not brokered:
        shell = call_shell(record, chain)
        problem = claim_call(host_dir, digest, shell) if shell is not None else "no call shell"
    if problem is not None:
        raise RefusedError(f"{ENV_CALL} token refused: {problem}; {advice}")
    return record.owner
