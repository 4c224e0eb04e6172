"""Liveness across hosts: a record names its host and boot, and another's pid is never ours.

On a session directory shared by several hosts (NFS), host A reads records
whose pid is host B's. The pid namespace can't tell them apart (the initial
one has the same inode on every Linux host), so meta.json records host and
boot_id, and every liveness decision compares them first. These tests plant
records whose pid is a real live process of the test's and check that
kill, reap and status never touch it when the record says it lives elsewhere;
and the same record without that claim is signalled, so the tests can fail.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import agent_dirs, mock_task, plant_agent, run_spawn, start_spawn, stdout_json

import spawn

HANG_S = 60
FOREIGN_BOOT = "00000000-0000-4000-8000-000000000000"
SESSION = "20260101-0000-hosts"


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """A live process in a group of its own, standing for another host's agent that has the same pid."""
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def untouched(proc: subprocess.Popen[bytes]) -> bool:
    """Whether proc still runs, unstopped (a SIGSTOP/SIGTERM would show)."""
    time.sleep(0.3)
    return proc.poll() is None and psutil.Process(proc.pid).status() != psutil.STATUS_STOPPED


@pytest.mark.parametrize(
    "where",
    [
        {"host": spawn.own_host(), "boot_id": FOREIGN_BOOT},
        {"host": "another-host.example", "boot_id": spawn.own_boot_id()},
    ],
    ids=["other-boot", "other-host"],
)
@pytest.mark.parametrize("verb", ["kill", "reap", "status"])
def test_a_record_from_elsewhere_is_never_signalled(
    verb: str, where: dict[str, str], base_env: dict[str, str], session_root: Path, bystander: subprocess.Popen[bytes]
) -> None:
    agent_dir = plant_agent(session_root / SESSION, "a1-00beef", bystander.pid, where=where)
    session = agent_dir.parent.parent
    args = {"kill": ["kill", "--session", str(session), agent_dir.name], "reap": ["reap", str(session)], "status": ["status", str(session)]}
    proc = run_spawn(args[verb], base_env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert untouched(bystander), f"`spawn.py {verb}` signalled another host's pid"
    if verb == "kill":  # recorded killed all the same: its own runner, there, sees the request
        assert stdout_json(proc)["killed"] == [agent_dir.name]


def test_the_same_record_on_this_host_is_signalled(
    base_env: dict[str, str], session_root: Path, bystander: subprocess.Popen[bytes]
) -> None:
    """The control: what the tests above plant is a kill target when it says it is ours."""
    agent_dir = plant_agent(session_root / SESSION, "a1-00beef", bystander.pid)
    proc = run_spawn(["kill", "--session", str(agent_dir.parent.parent), agent_dir.name], base_env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert bystander.wait(timeout=HANG_S) != 0


def test_a_fresh_agent_records_its_host_and_boot(env: dict[str, str], session_root: Path) -> None:
    proc = run_spawn(["--task", mock_task("hosts", [{"text": "hi"}]), "--tools", "Read"], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    (meta,) = (spawn.load_meta(d) for d in agent_dirs(session_root))
    assert (meta.host, meta.boot_id) == (os.uname().nodename, Path("/proc/sys/kernel/random/boot_id").read_text().strip())


def inotify_fds(pid: int) -> int:
    fds = Path(f"/proc/{pid}/fd")
    return sum(1 for fd in fds.iterdir() if "inotify" in os.readlink(fd)) if fds.exists() else 0


@pytest.mark.parametrize("forced", [False, True], ids=["watched", "polled"])
def test_wait_polls_when_told_and_still_returns(
    forced: bool, base_env: dict[str, str], session_root: Path, bystander: subprocess.Popen[bytes]
) -> None:
    """SPAWN_WAIT_POLL=1 (a session directory other hosts write): no inotify, and wait still sees outcomes land."""
    dirs = [
        plant_agent(session_root / SESSION, f"a1-{i:06x}", bystander.pid)
        for i in range(spawn.WAIT_POLL_BATCH + 5)  # past the batch, wait would watch
    ]
    env = {**base_env, **({"SPAWN_WAIT_POLL": "1"} if forced else {})}
    waiter = start_spawn(["wait", "--session", str(dirs[0].parent.parent), "--all", *(d.name for d in dirs)], env)
    limit = time.monotonic() + HANG_S
    while not any(w in Path(f"/proc/{waiter.pid}/wchan").read_text() for w in ("poll", "nanosleep")):
        assert time.monotonic() < limit
        time.sleep(0.05)
    assert (inotify_fds(waiter.pid) == 0) is forced
    for d in dirs:
        done = spawn.Outcome(id=d.name, status="done", reason="", exit_code=0, ended_at=spawn.utc_now_iso(), duration_s=1.0)
        spawn.commit_outcome(d, done, [])
    _out, err = waiter.communicate(timeout=HANG_S)
    assert waiter.returncode == spawn.ExitCode.OK, err
    assert bystander.poll() is None
