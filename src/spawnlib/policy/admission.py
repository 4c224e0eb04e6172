"""Admission: who may run now, both kinds in one place.

- --max-concurrent: a slot marker in each running agent's directory, taken
  under the session lock, lent while the agent waits on its children;
- --max-agents and the tree's budget: admit(), under the session lock when
  a spawn registers (resolving.register);
- start slots: CLI start-ups take turns, a flock'ed file each in the session.

Above supervision: a lent slot is taken back only while its agent lives.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ..core.constants import MIN_HOLD_USD, OUTCOME, SLOT_LENT, SLOT_MARKER, SLOT_POLL_S
from ..core.errors import CorruptRecordError, SpawnError
from ..core.records import AgentMeta, Status
from ..session.protocol import (
    DONE_MARKER,
    FAIL_MARKER,
    MarkerEvents,
    budget_left,
    iter_agent_dirs,
    load_meta,
    open_regular,
    read_json,
    read_limits,
    session_lock,
    write_new_file,
)
from ..supervise.supervisor import Supervised, _int_or_none, cgroup_mounts, procfs_is_ours


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


# CLI start-ups take turns in a session, as many at once as there are CPUs.
# A CLI's start-up is most of what it costs when the model answers quickly
# (~85% of a leaf's CPU comes before its first message), and start-ups that
# all run at once compete: 16 bare `claude -p` on 2 cores took 15.8 s of CPU
# and 8.0 s started together, 11.3 s and 5.7 s when each waited for a slot
# until its first message (medians of 3 rounds, measured for issue 14).
# A slot is a flock on a file in the session, so it is free again the moment
# its holder releases it, exits or dies. It is held until the CLI goes quiet
# (free_slot_when_quiet) and never longer than START_SLOT_HOLD_S, and a start that waited
# START_SLOT_WAIT_S goes ahead without one: a frozen or hostile holder can
# delay a spawn, never stop it. Anything odd about the slot files (a
# read-only session, something planted there) means no turns, not an error.
ENV_START_SLOTS = "SPAWN_START_SLOTS"  # how many CLI start-ups at once; 0: no turns
START_SLOTS_DIR = "start-slots"  # in the session directory: one lock file a slot
START_SLOT_HOLD_S = 3.0
START_SLOT_QUIET_S = 0.1  # a holder's CPU is looked at this often
START_SLOT_QUIET_SHARE = 0.3  # under this share of a core over that time, it is quiet
START_SLOT_QUIET_LOOKS = 2  # at this many looks in a row
START_SLOT_WAIT_S = 30.0
START_SLOT_POLL_S = 0.02  # the first waiter, without inotify
START_SLOT_RECHECK_S = 0.25  # the first waiter, with it, in case a close went unseen
START_SLOT_QUEUE_POLL_S = 0.1  # the others
START_SLOT_QUEUE = "queue"  # in start-slots/: flock'ed by the first waiter


def start_slot_count(environ: Mapping[str, str]) -> int:
    value = _int_or_none(environ.get(ENV_START_SLOTS))
    return value if value is not None and value >= 0 else usable_cpus()


def usable_cpus() -> int:
    """The CPUs this process may keep busy at once: its affinity (else the
    machine's count), capped by its cgroups' CPU quota, rounded up."""
    count = os.cpu_count() or 1
    with contextlib.suppress(AttributeError, OSError):
        count = len(os.sched_getaffinity(0))
    limit = cgroup_cpu_limit(read_small_file("/proc/self/cgroup") or "", read_small_file("/proc/self/mountinfo") or "", read_small_file)
    return max(1, min(count, int(-(-limit // 1)))) if limit is not None else count  # -(-x // 1): ceil, without math


def read_small_file(path: str) -> str | None:
    """A kernel file's text (/proc, /sys), or None if it can't be read."""
    try:
        with open(path, encoding="ascii") as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError):
        return None


def cgroup_cpu_limit(proc_cgroup: str, mountinfo: str, read: Callable[[str], str | None]) -> float | None:
    """CPUs' worth of time this process's cgroups allow (the tightest quota on
    its way up to the root), or None when no quota applies or none can be read.

    proc_cgroup and mountinfo are /proc/self/cgroup's and /proc/self/mountinfo's
    text; read(path) a file's text or None. A container limited to 2 CPUs on a
    64-CPU host sees all 64 in its affinity: only the quota says how many it
    may use at once.
    """
    unified, cpu = cgroup_mounts(mountinfo)
    limits: list[float] = []
    mounts: list[Path]
    files: tuple[str, ...]
    for line in proc_cgroup.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:
            mounts, files = unified, ("cpu.max",)
        elif "cpu" in controllers.split(","):
            mounts, files = cpu, ("cpu.cfs_quota_us", "cpu.cfs_period_us")
        else:
            continue
        parts = [p for p in path.split("/") if p and p not in (".", "..")]
        for mount in mounts:
            # From the process's own cgroup up to the mount's root. Inside a
            # container the mount is often the container's cgroup itself, and
            # the path above it isn't there: its root then holds the limit.
            for depth in range(len(parts), -1, -1):
                folder = "/".join([str(mount), *parts[:depth]])
                texts = [read(f"{folder}/{name}") for name in files]
                if any(t is None for t in texts):
                    continue
                words = " ".join(t or "" for t in texts).split()
                if len(words) == 2 and words[0] not in ("max", "-1"):
                    with contextlib.suppress(ValueError):
                        quota, period = float(words[0]), float(words[1])
                        if quota > 0 and period > 0:
                            limits.append(quota / period)
    return min(limits) if limits else None


def open_start_slots(session: Path, count: int) -> list[int]:
    """The session's slot files, opened (created if need be); those that can't be opened are left out."""
    folder = session / START_SLOTS_DIR
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
    except OSError:
        return []
    return [fd for fd in (open_slot_file(folder / str(index)) for index in range(count)) if fd is not None]


def open_slot_file(path: Path) -> int | None:
    """One file of start-slots/, opened (created if need be), or None if it can't be."""
    # O_NOFOLLOW, and regular files only: a planted symlink or FIFO is skipped, never followed or waited on.
    with contextlib.suppress(OSError, CorruptRecordError):
        return open_regular(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)[0]
    return None


def grab_start_slot(fds: Sequence[int]) -> int | None:
    """One try at each slot: the fd whose flock now holds it, or None if all are taken (OSError: no locks here)."""
    import fcntl

    for fd in fds:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue
        return fd
    return None


async def take_start_slot(session: Path, count: int, wait_s: float = START_SLOT_WAIT_S) -> int | None:
    """Wait for a start slot: the open fd whose flock holds it, or None (no turns, or waited too long).

    The waiters of a session queue: the one holding the flock on
    `start-slots/queue` is first, and sleeps until a slot file is closed
    (inotify; a slot is let go by closing its file, or by its holder's death,
    which closes it too), looking again then or every START_SLOT_RECHECK_S.
    The others look every START_SLOT_QUEUE_POLL_S, for the queue or a slot.
    So a fan-out's waiting runners cost few wakes (each ~0.1-0.3 ms of CPU on
    a VM: 16 of them polling every 20 ms took ~2% of a core each), and a
    session holds at most one inotify instance for them (a user has 128,
    which their other programs' file watchers need too). Without the queue
    file or inotify, a waiter polls every START_SLOT_POLL_S, as all once did.
    """
    fds = open_start_slots(session, count) if count > 0 else []
    queue = open_slot_file(session / START_SLOTS_DIR / START_SLOT_QUEUE) if fds else None
    held = None
    first = queue is None  # no queue to take turns in: every waiter looks often
    events: MarkerEvents | None = None
    period = START_SLOT_POLL_S
    try:
        limit = time.monotonic() + wait_s
        while fds and held is None and time.monotonic() < limit:
            try:
                held = grab_start_slot(fds)
                if held is not None:
                    break
                if not first and queue is not None:
                    first = grab_start_slot([queue]) is not None
            except OSError:
                return None  # flock refused (a file system without locks): no turns
            if first and events is None:
                events = MarkerEvents()
                if events.watch(session / START_SLOTS_DIR, MarkerEvents.IN_CLOSE):
                    period = START_SLOT_RECHECK_S
                continue  # watched now: look once more, so a slot let go before the watch isn't missed
            wait = min(period if first else START_SLOT_QUEUE_POLL_S, max(0.0, limit - time.monotonic()))
            await readable(events.fd if events is not None else -1, wait)
            if events is not None:
                events.drain()
        return held
    finally:
        if events is not None:
            events.close()
        if queue is not None:
            os.close(queue)  # the next waiter is first now
        for fd in fds:
            if fd != held:
                os.close(fd)


async def readable(fd: int, timeout: float) -> None:
    """Sleep until fd is readable or timeout has passed (fd < 0: just the timeout)."""
    import asyncio

    if fd < 0:
        await asyncio.sleep(timeout)
        return
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    loop.add_reader(fd, lambda: None if ready.done() else ready.set_result(None))
    try:
        await asyncio.wait([ready], timeout=timeout)
    finally:
        loop.remove_reader(fd)


def cpu_demand_ns(pid: int) -> int | None:
    """How long a process's main thread has run or waited to run, in ns; None if /proc can't tell.

    Waiting counts: a start-up starved by others is not quiet, and a holder
    that let go then would crowd the CPUs with one more start-up.
    """
    if not procfs_is_ours():
        return None  # in a sandbox's pid namespace: the pid names another process there
    fields = (read_small_file(f"/proc/{pid}/schedstat") or "").split()
    try:
        return int(fields[0]) + int(fields[1])
    except (IndexError, ValueError):
        return None


def start_slot_now(session: Path, count: int) -> tuple[bool, int | None]:
    """Without waiting: whether a CLI may start now, and the slot's fd it then holds (None: no turns here)."""
    fds = open_start_slots(session, count) if count > 0 else []
    try:
        held = grab_start_slot(fds)
    except OSError:
        held, fds = None, []  # no locks on this file system: no turns
    for fd in fds:
        if fd != held:
            os.close(fd)
    return (held is not None or not fds), held


def counted_agents(session: Path) -> int:
    """Registered agents that were not refused."""
    count = 0
    for d in iter_agent_dirs(session):
        if (d / FAIL_MARKER).exists():
            with contextlib.suppress(FileNotFoundError, SpawnError):
                refused = read_json(d / OUTCOME)
                if refused.get("status") == Status.REFUSED and not refused.get("transcript"):  # refused before it ran
                    continue
        count += 1
    return count


def admit(meta: AgentMeta, session: Path) -> str | None:
    """Check the tree-wide caps (under the session lock); None admits the spawn.

    An admitted agent's budget is lowered to what is unreserved where it
    draws from; reserve_budget then holds it until the agent's charge.
    """
    limits = read_limits(session)
    if limits.max_budget_usd is not None:
        left, source, state = budget_left(session, meta, limits.max_budget_usd)
        if left < MIN_HOLD_USD:
            where = f"its parent {source}'s hold" if source else "the tree's remainder"
            return (
                f"budget: the tree has spent ${state.spent:.4f} of its ${limits.max_budget_usd:.4f} and running agents "
                f"hold ${state.reserved:.4f}; nothing is left in {where} (wait for agents to end, or raise --max-budget-usd at the root)"
            )
        meta.max_budget_usd = left if meta.max_budget_usd is None else min(meta.max_budget_usd, left)
    if limits.max_agents is not None and counted_agents(session) >= limits.max_agents:
        return f"agents: the session already has {limits.max_agents} agents (--max-agents {limits.max_agents})"
    return None
