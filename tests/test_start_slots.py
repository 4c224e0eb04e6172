"""CLI start-ups take turns in a session (SPAWN_START_SLOTS): a start waits for a free slot,
and nothing about the slots can stop a spawn."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import fcntl
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import cast

import pytest
from conftest import agent_dirs, load, mock_task, run_spawn, spawn_in_bash

import spawn
from spawn import ExitCode

# A stand-in for another agent's start-up: it takes the session's only slot,
# says so, holds it for a while, writes the time it lets go, and exits.
HOLDER = """
import fcntl, os, sys, time
os.makedirs(os.path.dirname(sys.argv[1]), exist_ok=True)
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
open(sys.argv[2], "w").close()
time.sleep(float(sys.argv[4]))
with open(sys.argv[3], "w") as fh:
    fh.write(repr(time.time()))
"""


def iso_seconds(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_a_start_waits_for_the_free_slot_and_goes_once_it_is_freed(env: dict[str, str], tmp_path: Path, session_root: Path) -> None:
    holder = tmp_path / "holder.py"
    holder.write_text(HOLDER)
    held, released = tmp_path / "held", tmp_path / "released"
    slot = f'"$SPAWN_SESSION"/{spawn.START_SLOTS_DIR}/0'
    hold = f'"$SPAWN_PYTHON" {holder} {slot} {held} {released} 4 &'
    # The root's CLI let go of the slot once it went quiet (it waits on its
    # Bash here); the holder takes it, and only then is the child started.
    child = f"{spawn_in_bash('--tools', 'Read')} --task {shlex.quote(mock_task('slot child', [{'text': 'child-result'}]))}"
    script = f"{hold} for _ in $(seq 600); do [ -e {held} ] && break; sleep 0.05; done; {child}; wait"
    task = mock_task("slot root", [{"bash": script}, {"text": "root-result"}])
    proc = run_spawn(["--task", task, "--tools", "Bash,Read", "--max-depth", "1"], {**env, spawn.ENV_START_SLOTS: "1"})
    assert proc.returncode == ExitCode.OK, proc.stderr
    child_dir = next(d for d in agent_dirs(session_root) if load(d / "meta.json")["depth"] == 1)
    assert load(child_dir / "outcome.json")["status"] == "done"
    first = json.loads((child_dir / "transcript.jsonl").read_text().splitlines()[0])
    # The child's CLI said its first word only after the holder let go of the slot.
    assert iso_seconds(first["time"]) >= float(released.read_text())
    assert sorted(p.name for p in session_root.glob(f"*/{spawn.START_SLOTS_DIR}/*")) == ["0", spawn.START_SLOT_QUEUE]


def test_no_turns_when_slots_are_set_to_zero(tmp_path: Path) -> None:
    assert asyncio.run(spawn.take_start_slot(tmp_path, 0)) is None
    assert not (tmp_path / spawn.START_SLOTS_DIR).exists()


def test_slots_are_taken_one_each_and_freed_by_closing(tmp_path: Path) -> None:
    first = asyncio.run(spawn.take_start_slot(tmp_path, 2))
    second = asyncio.run(spawn.take_start_slot(tmp_path, 2))
    assert first is not None and second is not None
    # Both taken: a third start waits, then goes without a slot.
    assert asyncio.run(spawn.take_start_slot(tmp_path, 2, wait_s=0.2)) is None
    os.close(first)
    third = asyncio.run(spawn.take_start_slot(tmp_path, 2, wait_s=0.2))
    assert third is not None
    os.close(second)
    os.close(third)


@contextlib.contextmanager
def running(argv: Sequence[str]) -> Iterator[subprocess.Popen[bytes]]:
    """A process for the length of the block: killed and reaped however the block ends."""
    process = subprocess.Popen(argv)
    try:
        yield process
    finally:
        process.kill()
        process.wait()


@contextlib.contextmanager
def held_by_another_process(tmp_path: Path, path: Path, seconds: float) -> Iterator[Path]:
    """HOLDER takes the flock on path for `seconds`; yields, once it holds it, the file it writes as it lets go."""
    holder = tmp_path / "holder.py"
    holder.write_text(HOLDER)
    held, released = tmp_path / f"{path.name}.held", tmp_path / f"{path.name}.released"
    with running([sys.executable, str(holder), str(path), str(held), str(released), str(seconds)]) as process:
        while not held.exists():
            assert process.poll() is None
            time.sleep(0.01)
        yield released


BUSY = [sys.executable, "-c", "while True: pass"]


@pytest.mark.parametrize("woken_by", ["inotify", "polling"])
def test_a_waiter_takes_the_slot_once_another_process_lets_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, woken_by: str) -> None:
    """The waiter sleeps until a slot file is closed (or, without inotify, polls), and then takes it."""
    if woken_by == "polling":
        monkeypatch.setattr(spawn.MarkerEvents, "watch", lambda *_args, **_kw: False)
    with held_by_another_process(tmp_path, tmp_path / spawn.START_SLOTS_DIR / "0", 1) as released:
        fd = asyncio.run(spawn.take_start_slot(tmp_path, 1, wait_s=60))
        assert fd is not None
        # It was taken only after the holder let go, and is held now: another start can't take it.
        assert released.exists()
        assert asyncio.run(spawn.take_start_slot(tmp_path, 1, wait_s=0.1)) is None
        os.close(fd)


@pytest.mark.parametrize("queue", ["held by another waiter", "a fifo", "a symlink"])
def test_a_waiter_behind_the_queue_or_without_one_still_takes_the_slot(tmp_path: Path, queue: str) -> None:
    """The first waiter holds start-slots/queue; one behind it, or one where no queue can be had, looks by itself."""
    folder = tmp_path / spawn.START_SLOTS_DIR
    folder.mkdir()
    victim = tmp_path / "victim"
    with contextlib.ExitStack() as stack:
        if queue == "a fifo":
            os.mkfifo(folder / spawn.START_SLOT_QUEUE)
        elif queue == "a symlink":
            (folder / spawn.START_SLOT_QUEUE).symlink_to(victim)
        else:  # another process is first in the queue, for good
            stack.enter_context(held_by_another_process(tmp_path, folder / spawn.START_SLOT_QUEUE, 600))
        released = stack.enter_context(held_by_another_process(tmp_path, folder / "0", 1))
        fd = asyncio.run(spawn.take_start_slot(tmp_path, 1, wait_s=60))
        assert fd is not None
        assert released.exists()
        os.close(fd)
    assert not victim.exists()


def hold_a_slot(tmp_path: Path, process: subprocess.Popen[bytes]) -> spawn.StartedCli:
    fd = asyncio.run(spawn.take_start_slot(tmp_path, 1))
    assert fd is not None
    return spawn.StartedCli(cast(spawn.CliStart, None), process, fd)


def test_a_quiet_cli_lets_go_of_its_slot_before_the_hold_limit(tmp_path: Path) -> None:
    """A CLI that waits (here: a process that only sleeps, as one waiting for the model) frees its slot at once."""
    with running(["sleep", "600"]) as process:
        started = hold_a_slot(tmp_path, process)
        asyncio.run(asyncio.wait_for(spawn.free_slot_when_quiet(started, 300.0), 60))
        assert started.slot is None
        fd = asyncio.run(spawn.take_start_slot(tmp_path, 1, wait_s=0.1))
        assert fd is not None  # free for the next start
        os.close(fd)


def test_a_busy_cli_keeps_its_slot_until_the_hold_limit(tmp_path: Path) -> None:
    """A CLI still starting (here: a busy loop) holds its slot; running or waiting to run, it is busy either way."""
    with running(BUSY) as process:
        started = hold_a_slot(tmp_path, process)
        began = time.monotonic()
        asyncio.run(spawn.free_slot_when_quiet(started, 1.5))
        assert time.monotonic() - began >= 1.5
        assert started.slot is None


def test_a_cli_that_exits_lets_go_of_its_slot(tmp_path: Path) -> None:
    with running(BUSY) as process:
        started = hold_a_slot(tmp_path, process)
        process.kill()
        process.wait()
        asyncio.run(asyncio.wait_for(spawn.free_slot_when_quiet(started, 300.0), 60))
        assert started.slot is None


def test_a_slot_held_for_good_delays_a_start_but_never_stops_it(tmp_path: Path) -> None:
    (tmp_path / spawn.START_SLOTS_DIR).mkdir()
    fd = os.open(tmp_path / spawn.START_SLOTS_DIR / "0", os.O_RDONLY | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        assert asyncio.run(spawn.take_start_slot(tmp_path, 1, wait_s=0.3)) is None
    finally:
        os.close(fd)


@pytest.mark.parametrize("planted", ["fifo", "symlink", "directory", "file-for-folder"])
def test_planted_slot_files_are_skipped_not_followed_or_waited_on(tmp_path: Path, planted: str) -> None:
    folder = tmp_path / spawn.START_SLOTS_DIR
    victim = tmp_path / "victim"
    if planted == "file-for-folder":
        folder.write_text("not a folder")
    else:
        folder.mkdir()
        if planted == "fifo":
            os.mkfifo(folder / "0")
        elif planted == "symlink":
            (folder / "0").symlink_to(victim)
        else:
            (folder / "0").mkdir()
    fd = asyncio.run(spawn.take_start_slot(tmp_path, 2, wait_s=0.2))
    if planted == "file-for-folder":
        assert fd is None
    else:
        # Slot 0 is skipped, slot 1 is a plain file and is taken; nothing was followed.
        assert fd is not None
        assert os.path.samefile(f"/proc/self/fd/{fd}", folder / "1")
        os.close(fd)
    assert not victim.exists()


# The cgroup files a process sees, by path; absent paths read as None.
CGROUPS_V2 = {
    "/sys/fs/cgroup/cpu.max": "max 100000\n",
    "/sys/fs/cgroup/user/cpu.max": "300000 100000\n",
    "/sys/fs/cgroup/user/job/cpu.max": "max 100000\n",
}
# Where /proc/self/mountinfo says the hierarchies are mounted.
V2 = "30 25 0:26 / /sys/fs/cgroup rw,nosuid,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
V1 = (
    "35 25 0:31 / /sys/fs/cgroup/memory rw,nosuid,relatime shared:9 - cgroup cgroup rw,memory\n"
    "36 25 0:32 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,relatime shared:10 - cgroup cgroup rw,cpu,cpuacct\n"
)


@pytest.mark.parametrize(
    ("proc_cgroup", "mountinfo", "files", "limit"),
    [
        ("0::/user/job\n", V2, CGROUPS_V2, 3.0),  # the tightest quota on the way up
        ("0::/user/job\n", V2, {**CGROUPS_V2, "/sys/fs/cgroup/user/job/cpu.max": "50000 100000\n"}, 0.5),
        ("0::/\n", V2, CGROUPS_V2, None),  # no quota: affinity alone decides
        # In a container the mount is its own cgroup: the path above it isn't there.
        ("0::/docker/abc\n", V2, {"/sys/fs/cgroup/cpu.max": "200000 100000\n"}, 2.0),
        # Wherever mountinfo says v2 is: a hybrid host's unified tree, or elsewhere.
        (
            "0::/job\n",
            V1 + V2.replace("/sys/fs/cgroup ", "/sys/fs/cgroup/unified "),
            {"/sys/fs/cgroup/unified/job/cpu.max": "100000 100000\n"},
            1.0,
        ),
        (
            "0::/job\n",
            V2.replace("/sys/fs/cgroup ", "/run/cg "),
            {"/run/cg/job/cpu.max": "250000 100000\n", "/sys/fs/cgroup/job/cpu.max": "1 100000\n"},
            2.5,
        ),
        ("0::/job\n", "", {"/sys/fs/cgroup/job/cpu.max": "100000 100000\n"}, None),  # no v2 mounted
        # cgroup v1's cpu controller, next to other controllers' lines.
        (
            "5:memory:/x\n4:cpu,cpuacct:/docker/abc\n",
            V1,
            {"/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "150000\n", "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n"},
            1.5,
        ),
        (
            "4:cpu,cpuacct:/\n",
            V1,
            {"/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n"},
            None,
        ),
        # Damaged or unexpected files say nothing, rather than a wrong count.
        ("0::/\n", V2, {"/sys/fs/cgroup/cpu.max": "garbage\n"}, None),
        ("0::/\n", V2, {"/sys/fs/cgroup/cpu.max": "0 100000\n"}, None),
        ("0::/\n", V2, {"/sys/fs/cgroup/cpu.max": "100000 100000 7\n"}, None),
        ("", V2, CGROUPS_V2, None),
    ],
)
def test_the_cgroup_cpu_quota_caps_the_cpus_a_tree_may_use(
    proc_cgroup: str, mountinfo: str, files: dict[str, str], limit: float | None
) -> None:
    assert spawn.cgroup_cpu_limit(proc_cgroup, mountinfo, files.get) == limit


def test_the_default_slot_count_is_within_this_process_affinity() -> None:
    assert 1 <= spawn.usable_cpus() <= len(os.sched_getaffinity(0))
