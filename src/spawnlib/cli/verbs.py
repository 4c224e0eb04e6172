"""What the verbs do on the session files: wait, status rows and their cache, kill, reap, end_tree."""

from __future__ import annotations

import contextlib
import functools
import json
import marshal  # builtin, loaded with the interpreter: status's forked workers answer in it
import os
import signal
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from ..core.constants import (
    ENV_AGENT_ID,
    ENV_SESSION,
    HEARTBEAT,
    HEARTBEAT_S,
    KILL_GRACE_S,
    LIVENESS_POLL_MAX_S,
    LIVENESS_POLL_S,
    META,
    OUTCOME,
    PROTOCOL_VERSION,
    SCRIPT_PATH,
    WAIT_NOISE_HOLDOFF_S,
    WAIT_POLL_BATCH,
    WAIT_POLL_MAX_S,
    WAIT_POLL_PER_AGENT_S,
    WAIT_POLL_S,
    WAIT_RESCAN_MAX_S,
    WAIT_RESCAN_S,
    WATCH_REFRESH_S,
)
from ..core.errors import ExitCode, SpawnError
from ..core.output import note
from ..core.prelude import FORKSERVER_SOCKET
from ..core.pure import parse_json, token_counts, token_hex
from ..core.records import EXIT_FOR_STATUS, AgentMeta, R, Status, record_to_json
from ..policy.admission import lend_slot, take_back_slot, usable_cpus
from ..policy.steering import SentMessages, paused_note
from ..run.runner import descendants_of, parent_gone, settle_agents
from ..session.ledger import read_ledger, read_model_calls
from ..session.protocol import (
    AGENTS_DIR,
    DONE_MARKER,
    FAIL_MARKER,
    STATUS_CACHE,
    STATUS_INDEX,
    MarkerEvents,
    agent_dir_names,
    iter_agent_dirs,
    load_meta,
    open_regular,
    pending_asks,
    read_json,
    read_limits,
    read_outcome,
    remove_stray_marker,
    request_kill,
)
from ..supervise.cluster import node_lost_reason
from ..supervise.commit import liveness, read_agent_rows
from ..supervise.supervisor import (
    Supervised,
    _entry_namespace,
    _read_runner_entry,
    ancestry_subject,
    end_everything_below,
    end_tree_cgroup,
    exit_as,
    heartbeat_age,
    own_create_time,
    runner_index_dir,
    stale_in,
    unregister_runner,
    wait_gone,
)

# -------------------------------------------------------------------- verbs --


def reap_agent(agent_dir: Path, by: str, secrets_: Sequence[str]) -> bool:
    """Settle an agent whose process died, or whose parent is gone, with its subtree."""
    if read_outcome(agent_dir) is not None:
        return False
    meta = load_meta(agent_dir)
    remove_stray_marker(agent_dir)  # else the outcome committed below would get the wrong marker
    session = Path(meta.session)
    if Supervised.of(meta).alive():
        if not parent_gone(session, meta):
            return False
        status, reason = Status.KILLED, f"its parent agent {meta.parent_id} is gone (found by {by})"
    elif parent_gone(session, meta):
        # Its parent's end took it down (a CLI kills its Bash commands hard).
        status, reason = Status.KILLED, f"process {meta.pid} ended with its parent agent {meta.parent_id} (found by {by})"
    else:
        status, reason = Status.FAILED, f"process {meta.pid} died without writing an outcome (found by {by})"
        if lost := node_lost_reason(meta, agent_dir):
            reason = f"{lost}: {reason}"
    below = [(child, Status.KILLED, f"ancestor {meta.id} ended without it (found by {by})") for child in descendants_of(session, meta.id)]
    settled = meta.id in settle_agents([*below, (agent_dir, status, reason)], by, secrets_)
    # Its spawn.py is gone now; if its guard died too, the tree's cgroup is ours to end.
    end_tree(meta, by, secrets_)
    return settled


def end_tree(meta: AgentMeta, by: str, secrets_: Sequence[str]) -> None:
    """End the tree's cgroup (if meta's agent owns one), then settle what it took down.

    cgroup.kill also ends the guards inside the tree, so an agent that
    registered while its root was being settled would be left with no
    outcome: it is committed here, as killed with its tree.
    """
    if not end_tree_cgroup(meta):
        return
    # The fork server was in that cgroup too: a socket it had no time to remove goes now.
    with contextlib.suppress(OSError):
        sock = Path(meta.session) / FORKSERVER_SOCKET
        if stat.S_ISSOCK(sock.lstat().st_mode):
            sock.unlink()
    late = []
    for d in descendants_of(Path(meta.session), meta.id):
        with contextlib.suppress(FileNotFoundError, SpawnError):
            if read_outcome(d) is None:
                late.append((d, Status.KILLED, f"ended with its tree when {meta.id} ended (found by {by})"))
    if late:
        settle_agents(late, by, secrets_)


def reap_session(session: Path, by: str, secrets_: Sequence[str]) -> list[str]:
    reaped = []
    for d in iter_agent_dirs(session):
        # A corrupt record is skipped (`status` shows it), never the end of the reap.
        with contextlib.suppress(FileNotFoundError, SpawnError):
            if not (d / OUTCOME).exists() and reap_agent(d, by, secrets_):
                reaped.append(d.name)
    return reaped


def calling_agent(environ: Mapping[str, str]) -> tuple[Path, AgentMeta] | None:
    """The agent whose Bash runs this command, if this process really is below its runner.

    SPAWN_AGENT_ID alone could name any agent; only a descendant of that
    agent's own spawn.py process may act for it (lend its slot).
    """
    session, agent_id = environ.get(ENV_SESSION), environ.get(ENV_AGENT_ID)
    if not session or not agent_id:
        return None
    agent_dir = Path(session) / AGENTS_DIR / agent_id
    try:
        meta = load_meta(agent_dir)
        ancestors = ancestry_subject().parents()
    except (FileNotFoundError, SpawnError, psutil.Error, OSError):
        return None
    for proc in ancestors:
        with contextlib.suppress(OSError, psutil.Error):
            if proc.pid == meta.pid and abs(proc.create_time() - meta.create_time) < 0.05:
                return agent_dir, meta
    return None


@contextlib.contextmanager
def slot_lent_by_caller(environ: Mapping[str, str]) -> Iterator[None]:
    """While the calling agent is blocked here, its --max-concurrent slot is free for others.

    Without this, ancestors waiting on their children hold every slot and a
    tree deeper than --max-concurrent stalls until its deadline.
    """
    caller = calling_agent(environ)
    max_concurrent = read_limits(Path(caller[1].session)).max_concurrent if caller else None
    if caller is None or max_concurrent is None or not lend_slot(caller[0]):
        yield
        return
    try:
        yield
    finally:
        take_back_slot(caller[0], max_concurrent, caller[1])


def corrupt_agents(session: Path) -> list[dict[str, str]]:
    """Agents of a session whose records can't be read: id, path and why."""
    found = []
    for d in iter_agent_dirs(session):
        try:
            load_meta(d)
            read_outcome(d)
        except FileNotFoundError:
            continue
        except SpawnError as exc:
            found.append({"id": d.name, "agent_dir": str(d), "error": exc.message})
    return found


@dataclass
class WaitResult:
    """What `wait` saw: the outcomes read, the agents gone without one, and whether all ended."""

    outcomes: dict[Path, dict[str, Any]]
    stale: list[Path]
    finished: bool
    """False when wait's own --timeout ran out first."""


def exit_fd(meta: AgentMeta) -> int | None:
    """A pidfd that turns readable when the agent's spawn.py exits, or None.

    None where there is none to have (not Linux, another pid namespace, no
    fds left) and when the process is already gone: then the caller checks it
    at once. The identity check comes after the open: if the recorded
    process still runs then, the pid was never reused, so the fd is its.
    """
    supervised = Supervised.of(meta)
    if supervised.foreign() or not hasattr(os, "pidfd_open"):
        return None
    try:
        fd = os.pidfd_open(supervised.pid)
    except OSError:
        return None
    if supervised.process() is None:
        os.close(fd)
        return None
    return fd


def allow_open_files(count: int) -> None:
    """Raise the soft open-file limit toward count (one pidfd per agent waited on), as far as the hard limit allows."""
    import resource

    with contextlib.suppress(ValueError, OSError):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < count:
            resource.setrlimit(resource.RLIMIT_NOFILE, (count if hard == resource.RLIM_INFINITY else min(count, hard), hard))


def wait_for_outcomes(agent_dirs: Sequence[Path], mode: str, timeout: float | None, secrets_: Sequence[str], *, polls: bool) -> WaitResult:
    """Block until outcomes exist (all, or any).

    Event-driven where the kernel can tell: the agent's process exit (pidfd)
    and, past WAIT_POLL_BATCH agents, a marker's creation (inotify) wake it,
    and each wake costs what it names, not a pass over every agent; so a
    thousand quiet agents cost almost no CPU. A few agents' outcomes, and
    what can't be watched, are polled with a period that grows with the
    number polled; watched outcomes are still re-read now and then in case
    an event was lost.

    Never hangs on a dead agent: its exit (or, unwatched, a check every
    LIVENESS_POLL_S or so) gets it reaped (failed outcome). A stuck one
    (stale heartbeat) is reported rather than waited for; its heartbeat is
    read again only when it could first have gone stale.
    """
    wait = OutcomeWait(agent_dirs, mode, timeout, secrets_, polls)
    try:
        wait.run()
    finally:
        wait.close()
    return wait.result


class OutcomeWait:
    """wait_for_outcomes' state: what is still pending, and how each agent is watched (see there)."""

    def __init__(self, agent_dirs: Sequence[Path], mode: str, timeout: float | None, secrets_: Sequence[str], polls: bool) -> None:
        """polls: SPAWN_WAIT_POLL, the user saying inotify can't see the writers."""
        import select

        self.mode, self.secrets = mode, secrets_
        self.pending = dict.fromkeys(agent_dirs)  # an ordered set
        pending = self.pending
        self.result = WaitResult({}, [], True)
        self.metas = {d: load_meta(d) for d in pending}
        self.deadline = None if timeout is None else time.monotonic() + timeout
        # inotify sees only this host's writes: an agent running elsewhere, or a
        # session directory on NFS (SPAWN_WAIT_POLL=1), is polled instead.
        elsewhere = any(Supervised.of(m).elsewhere() for m in self.metas.values())
        self.events = MarkerEvents(enabled=len(pending) > WAIT_POLL_BATCH and not elsewhere and not polls)
        allow_open_files(len(pending) + 64)
        # epoll: a wake costs what is ready, where poll() would scan every pidfd each time.
        self.epoll = hasattr(select, "epoll")
        self.poller: Any = select.epoll() if self.epoll else select.poll()
        if self.events.fd >= 0:
            self.poller.register(self.events.fd, select.POLLIN)
        self.unwatched = {d for d in pending if not self.events.watch(d)}  # outcomes polled
        self.exits: dict[int, Path] = {}
        self.exit_polled: set[Path] = set()  # no pidfd: liveness polled
        for d in pending:
            fd = exit_fd(self.metas[d])
            if fd is None:
                self.exit_polled.add(d)
            else:
                self.exits[fd] = d
                self.poller.register(fd, select.POLLIN)
        # Watches are set before this first look, so nothing committed between is missed.
        self.to_read: set[Path] = set(pending)
        # Polls and marker events only read an outcome whose marker is there: the
        # marker is the committer's last step, after the ledger charge, and a
        # wait that wrote it first (read_outcome does) would fsync it on its own
        # path to exit. An outcome left without one (its writer died) is read by
        # the exit event and rescans, which write the marker.
        self.to_peek: set[Path] = set()
        # A peek is two stats of paths built once (not pathlib): a poll of a few
        # agents runs every few ms for as long as they run, and pathlib's joins
        # were most of its CPU. A marker that can't be stat'ed is read by a rescan.
        self.markers = {d: (os.path.join(d, DONE_MARKER), os.path.join(d, FAIL_MARKER)) for d in pending}
        self.to_check: set[Path] = set(self.exit_polled)  # look at the process now: gone, or not watchable
        self.stale_checks = [(0.0, str(d), d) for d in pending]  # a heap: when each heartbeat is next worth reading
        now = time.monotonic()
        self.rescan_every, self.next_rescan = WAIT_RESCAN_S, now + WAIT_RESCAN_S
        self.next_poll = now + WAIT_POLL_S
        self.next_liveness = now + LIVENESS_POLL_S

    def settled(self, d: Path) -> None:
        self.pending.pop(d, None)
        self.unwatched.discard(d)
        self.exit_polled.discard(d)

    def run(self) -> None:
        while self.pending:
            self.read_outcomes()
            if not self.pending or (self.mode == "any" and self.result.outcomes):
                break
            now = time.monotonic()
            self.check_processes()
            self.check_heartbeats(now)
            if self.to_read:
                continue  # a reaped agent's outcome is read before anything else
            if not self.pending:
                break
            if self.deadline is not None and now >= self.deadline:
                self.result.finished = False
                break
            self.sleep_until_woken(now)
            self.schedule_polls(time.monotonic())

    def read_outcomes(self) -> None:
        """Read the outcomes there is reason to read: peeked markers, exits, rescans."""
        pending, to_read, to_peek, markers = self.pending, self.to_read, self.to_peek, self.markers
        to_peek -= to_read
        for d in to_peek:
            if d in pending and (os.path.exists(markers[d][0]) or os.path.exists(markers[d][1])):
                to_read.add(d)
        for d in [d for d in to_read if d in pending]:
            outcome = read_outcome(d)
            if outcome is not None:
                self.result.outcomes[d] = outcome
                self.settled(d)
        to_read.clear()
        to_peek.clear()

    def check_processes(self) -> None:
        """Look at the processes due a look: a dead one is reaped, a stuck one reported."""
        for d in [d for d in self.to_check if d in self.pending]:
            state = liveness(d, self.metas[d])
            if state == Status.FAILED:
                reap_agent(d, "wait", self.secrets)
                self.to_read.add(d)
            elif state == Status.STALE:
                self.result.stale.append(d)
                self.settled(d)
        self.to_check.clear()

    def check_heartbeats(self, now: float) -> None:
        """Read the heartbeats that could have gone stale by now."""
        import heapq

        stale_checks = self.stale_checks
        while stale_checks and stale_checks[0][0] <= now:
            _, _, d = heapq.heappop(stale_checks)
            if d not in self.pending or d in self.exit_polled:
                continue  # settled; or its liveness poll reads the heartbeat anyway
            age = heartbeat_age(d / HEARTBEAT)
            if age is not None and stale_in(age) < 0:
                self.result.stale.append(d)
                self.settled(d)
                continue
            # It can't go stale before its last beat is that old; none yet: not stale until it has one.
            after = HEARTBEAT_S if age is None else stale_in(age)
            heapq.heappush(stale_checks, (now + max(LIVENESS_POLL_S, after), str(d), d))

    def sleep_until_woken(self, now: float) -> None:
        """Block until an event, or the next poll, heartbeat, rescan or the deadline is due."""
        events, exits, poller = self.events, self.exits, self.poller
        wake = [self.next_rescan]
        wake += [self.stale_checks[0][0]] if self.stale_checks else []
        wake += [self.next_liveness] if self.exit_polled else []
        wake += [self.next_poll] if self.unwatched else []
        wake += [self.deadline] if self.deadline is not None else []
        ms = max(0, int((min(wake) - now) * 1000) + 1)
        ready = poller.poll(ms / 1000 if self.epoll else ms)
        before = len(self.to_read) + len(self.to_peek)
        for fd, _ in ready:
            if fd == events.fd:
                self.to_peek |= events.read()
            elif fd in exits:
                poller.unregister(fd)
                os.close(fd)
                gone = exits.pop(fd)
                self.to_read.add(gone)  # it most likely committed on its way out
                self.to_check.add(gone)
        if ready and len(self.to_read) + len(self.to_peek) == before and not (events.overflow or events.lost):
            time.sleep(WAIT_NOISE_HOLDOFF_S)  # only noise woke us
        if events.overflow or events.lost:
            self.to_read |= set(self.pending)
            self.unwatched |= events.lost & set(self.pending)
            events.overflow, events.lost = False, set()

    def schedule_polls(self, now: float) -> None:
        """Queue what the polls owe by now: unwatched outcomes, unwatched processes, a rescan."""
        if self.unwatched and now >= self.next_poll:
            self.to_peek |= self.unwatched
            self.next_poll = now + min(WAIT_POLL_MAX_S, max(WAIT_POLL_S, WAIT_POLL_PER_AGENT_S * len(self.unwatched)))
        if self.exit_polled and now >= self.next_liveness:
            self.to_check |= self.exit_polled
            self.next_liveness = now + min(LIVENESS_POLL_MAX_S, LIVENESS_POLL_S * max(1.0, len(self.exit_polled) / WAIT_POLL_BATCH))
        if now >= self.next_rescan:
            self.to_read |= set(self.pending)
            self.rescan_every = min(self.rescan_every * 2, WAIT_RESCAN_MAX_S)
            self.next_rescan = now + self.rescan_every

    def close(self) -> None:
        self.events.close()
        for fd in self.exits:
            os.close(fd)
        if self.epoll:
            self.poller.close()


# A finished agent's status row never changes: its meta.json and outcome.json
# are final. `status` keeps those rows in STATUS_CACHE, each with the identity
# (inode, size, mtime) of the two records, so a later `status` of a large
# session checks two stats per finished agent instead of reading and parsing
# both records. Anything that doesn't match is read again;
# an unreadable cache is ignored; the cache is never the only copy of anything.

STATUS_CACHE_MIN_ROWS = 200  # below this, reading the records is as fast as the cache
STATUS_CACHE_SETTLE_S = 2.0  # a record changed this recently may change again within the same mtime tick
ROW_TYPES: dict[str, tuple[type, ...]] = {
    "id": (str,),
    "parent_id": (str, type(None)),
    "depth": (int,),
    "state": (str,),
    "task": (str,),
    "duration_s": (int, float, type(None)),
    "cost_usd": (int, float, type(None)),
    "cost_known": (bool,),
    "pid": (int,),
    "agent_dir": (str,),
    "containment": (str, type(None)),
    "usage": (dict, type(None)),
}


def record_keys(agent_dir: str) -> list[int] | None:
    """(inode, size, mtime_ns) of an agent's meta.json and outcome.json; None if one is missing."""
    keys: list[int] = []
    for path in (f"{agent_dir}/{META}", f"{agent_dir}/{OUTCOME}"):
        try:
            st = os.stat(path)
        except OSError:
            return None
        keys += (st.st_ino, st.st_size, st.st_mtime_ns)
    return keys


def script_key() -> list[int]:
    """Rows are built by this spawn.py's code: another copy or version builds its own."""
    st = SCRIPT_PATH.stat()
    return [st.st_ino, st.st_size, st.st_mtime_ns]


def load_status_cache(session: Path) -> tuple[dict[str, Any], list[int]]:
    """Agent directory name -> [keys, row] from STATUS_CACHE, and how much of STATUS_INDEX
    it has taken in ([inode, bytes]); empty if it is missing, damaged or another version's."""
    try:
        data = read_json(session / STATUS_CACHE)
        agents, mark = data["agents"], data.get("index", [0, 0])
        if data.get("protocol") != PROTOCOL_VERSION or data.get("script") != script_key() or not isinstance(agents, dict):
            return {}, [0, 0]
    except (OSError, SpawnError, KeyError):
        return {}, [0, 0]
    if not (isinstance(mark, list) and len(mark) == 2 and all(type(n) is int and n >= 0 for n in mark)):
        mark = [0, 0]
    return agents, mark


# The first `status` of a session has no cache, and would read and parse
# every agent's two records: 10,000 of them take a second. So the committer
# of each outcome also appends that agent's finished row, keyed like the
# cache's, to STATUS_INDEX. status takes each line as a cache entry: checked
# against the records' identity and the settle time, and read from the
# records whenever it doesn't match. The index is a hint, never a record:
# it may lack lines (a commit that couldn't append), hold damaged ones, or
# be missing, and status answers the same.

STATUS_INDEX_MAX_BYTES = 64 << 20  # a bigger index (junk appended to it) is not read: the records are


def read_status_index(session: Path, mark: Sequence[int], settled_before: float) -> tuple[dict[str, list[Any]], list[int]]:
    """STATUS_INDEX's entries past mark, as the cache's (name -> [keys, row]), and the new mark.

    Only whole lines, each checked for its shape, and only rows whose
    records had settled: a line is written at commit, maybe within the
    mtime tick of the records' last change. Anything else in the file is
    skipped. A missing, oversized or irregular index gives nothing.
    """
    try:
        fd, st = open_regular(session / STATUS_INDEX, os.O_RDONLY | os.O_NOFOLLOW)
    except (OSError, SpawnError):
        return {}, [0, 0]
    try:
        start = mark[1] if mark[0] == st.st_ino and mark[1] <= st.st_size else 0
        if st.st_size - start > STATUS_INDEX_MAX_BYTES:
            return {}, [st.st_ino, st.st_size]
        data = os.pread(fd, st.st_size - start, start) if st.st_size > start else b""
    except OSError:
        return {}, [0, 0]
    finally:
        os.close(fd)
    whole = data.rfind(b"\n") + 1  # a line still being appended is taken next time
    lines = data[:whole].decode(errors="replace").splitlines()
    try:  # one parse for all: the usual, undamaged index
        parsed: list[Any] = parse_json("[" + ",".join(lines) + "]", STATUS_INDEX_MAX_BYTES + len(lines) + 2) if lines else []
    except ValueError:
        parsed = []
        for text in lines:
            with contextlib.suppress(ValueError):
                parsed.append(parse_json(text))
    agents = str(session / AGENTS_DIR)  # the path status spells (tree_rows)
    entries: dict[str, list[Any]] = {}
    for item in parsed:
        if not isinstance(item, dict):
            continue
        name, keys, row = item.get("name"), item.get("keys"), item.get("row")
        if (
            isinstance(name, str)
            and isinstance(row, dict)
            and isinstance(keys, list)
            and len(keys) == 6
            and all(type(k) is int for k in keys)
            and max(keys[2::3]) < settled_before
        ):
            entries[name] = [keys, {**row, "agent_dir": f"{agents}/{name}"}]
    return entries, [st.st_ino, start + whole]


def cached_row(entry: Any, agent_dir: str, keys: list[int] | None) -> dict[str, Any] | None:
    """The cached row of agent_dir if its records are unchanged, else None. A hand-edited cache can't break status."""
    if keys is None or not isinstance(entry, list) or len(entry) != 2 or entry[0] != keys:
        return None
    row = entry[1]
    if not isinstance(row, dict) or row.get("agent_dir") != agent_dir or row.get("id") != os.path.basename(agent_dir):
        return None
    for key, allowed in ROW_TYPES.items():
        if not isinstance(row.get(key), allowed):
            return None
    if not isinstance(row.get("resumed_from", ""), str):
        return None
    return row


def save_status_cache(session: Path, entries: Mapping[str, list[Any]], index_mark: Sequence[int]) -> None:
    data = {"protocol": PROTOCOL_VERSION, "script": script_key(), "index": list(index_mark), "agents": entries}
    tmp = session / f".{STATUS_CACHE}.{os.getpid()}.{token_hex(3)}.tmp"
    try:
        # Not write_json_atomic: no indent, no fsync; a cache lost in a crash is rebuilt.
        with open(tmp, "x", encoding="utf-8") as fh:
            fh.write(json.dumps(data, separators=(",", ":"), ensure_ascii=False))  # dumps: json.dump is the slow pure-Python encoder
        os.replace(tmp, session / STATUS_CACHE)
    except OSError:  # a read-only session, a full disk: status still answers
        with contextlib.suppress(OSError):
            tmp.unlink()


def tree_rows(session: Path) -> list[dict[str, Any]]:
    """The agents of a session with state and cost, parents before children."""
    queueing = read_limits(session).max_concurrent is not None
    settled_before = (time.time() - STATUS_CACHE_SETTLE_S) * 1e9
    cache, mark = load_status_cache(session)
    indexed, new_mark = read_status_index(session, mark, settled_before)
    agents = str(session / AGENTS_DIR)
    names = agent_dir_names(Path(agents))
    hits: dict[str, list[Any]] = {}
    for name in names:
        path = f"{agents}/{name}"  # a Path only for what isn't cached: 10,000 of them cost 0.1 s
        entry, indexed_entry = cache.get(name), indexed.get(name)
        if entry is None and indexed_entry is None:
            continue
        keys = record_keys(path)  # once, for either
        if (row := cached_row(entry, path, keys) or cached_row(indexed_entry, path, keys)) is not None:
            hits[name] = [keys, row]
    misses = [name for name in names if name not in hits]
    read = functools.partial(read_agent_rows, agents, queueing=queueing, settled_before=settled_before)
    found = {name: result for part in forked_map(read, misses, STATUS_PARALLEL_MIN) for name, result in part}
    rows: dict[str, dict[str, Any]] = {}
    finished: dict[str, list[Any]] = {}  # what the cache will hold: the finished agents found this time
    for name in names:  # in order: of two records that claim one id, the later wins
        if name in hits:
            rows[name] = hits[name][1]
            finished[name] = hits[name]
        elif name in found:
            agent_rows, entry = found[name]
            rows.update((row["id"], row) for row in agent_rows)
            if entry is not None:
                finished[name] = entry
    read_again = len(finished) - len(hits)
    children: dict[str | None, list[str]] = {}
    for row in rows.values():
        parent = row["parent_id"] if row["parent_id"] in rows else None
        children.setdefault(parent, []).append(row["id"])

    def subtree(agent_id: str) -> tuple[float, bool]:
        row = rows[agent_id]
        total, known = (row["cost_usd"] or 0.0), row["cost_known"] or row["state"] == Status.REFUSED
        for child in children.get(agent_id, []):
            c_total, c_known = subtree(child)
            total, known = total + c_total, known and c_known
        row["subtree_cost_usd"], row["subtree_cost_known"] = round(total, 6), known
        return total, known

    ordered: list[dict[str, Any]] = []

    def walk(agent_id: str, level: int) -> None:
        rows[agent_id]["level"] = level
        ordered.append(rows[agent_id])
        for child in sorted(children.get(agent_id, []), key=lambda i: rows[i]["agent_dir"]):
            walk(child, level + 1)

    # Saved before the walk below adds each run's level and subtree cost to the rows.
    if len(finished) >= STATUS_CACHE_MIN_ROWS and (read_again or len(finished) != len(cache) or new_mark != mark):
        save_status_cache(session, finished, new_mark)
    for root in sorted(children.get(None, []), key=lambda i: rows[i]["agent_dir"]):
        subtree(root)
        walk(root, 0)
    return ordered


STATUS_PARALLEL_MIN = 2_000  # records to read before status spreads the reading over the CPUs


def forked_map(fn: Callable[[Sequence[str]], R], items: Sequence[str], minimum: int) -> list[R]:
    """fn over slices of items, one per CPU, the first here and the others in forked children.

    Reading and parsing 10,000s of records is CPU-bound, and status's process
    holds nothing another process would need to share. Each child sends its
    result back marshalled through a pipe. A child that fails, or a fork that
    can't be made, costs only speed: that slice is done here. Below `minimum`
    items, in a process with threads (fork would copy their locks held), or
    on one CPU, everything is done here.
    """
    workers = min(usable_cpus(), 4, len(items) // max(minimum // 2, 1))
    if len(items) < minimum or workers < 2 or threading.active_count() > 1 or not hasattr(os, "fork"):
        return [fn(items)]
    size = -(-len(items) // workers)
    slices = [items[i : i + size] for i in range(0, len(items), size)]
    pending = [fork_worker(fn, part) for part in slices[1:]]  # (pid, read end), or None
    try:
        results = [fn(slices[0])]
        for i, part in enumerate(slices[1:]):
            child, pending[i] = pending[i], None
            got = join_worker(child) if child is not None else None
            results.append(got[0] if got is not None else fn(part))  # no result from the child: its slice is done here
    finally:
        for child in pending:  # left only by an exception here: end them (ours, by pid)
            if child is not None:
                Supervised.signal_pid(child[0], signal.SIGKILL)
                join_worker(child)
    return results


def join_worker(child: tuple[int, int]) -> tuple[Any] | None:
    """A forked worker's result, read to the end and reaped; None if it failed."""
    pid, fd = child
    data = b""
    with contextlib.suppress(OSError), os.fdopen(fd, "rb") as fh:
        data = fh.read()
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, 0)[1] != 0:
            return None
    try:
        return (marshal.loads(data),)
    except (EOFError, ValueError, TypeError):
        return None


def fork_worker(fn: Callable[[Sequence[str]], Any], part: Sequence[str]) -> tuple[int, int] | None:
    """A forked child that writes fn(part), marshalled, to a pipe: (pid, read end), or None if it can't be made."""
    try:
        read_end, write_end = os.pipe()
    except OSError:
        return None
    try:
        pid = os.fork()
    except OSError:
        os.close(read_end)
        os.close(write_end)
        return None
    if pid == 0:  # the child: never returns, never runs the parent's exit handlers or flushes its buffers
        code = 1
        try:
            os.close(read_end)
            data = marshal.dumps(fn(part))
            with os.fdopen(write_end, "wb") as fh:
                fh.write(data)
            code = 0
        except BaseException:  # a Ctrl-C, a broken pipe: the parent does the slice itself
            pass
        finally:
            os._exit(code)
    os.close(write_end)
    return pid, read_end


def format_cost(value: float | None, known: bool) -> str:
    if value is None and not known:
        return "?"
    text = f"${value or 0:.4f}"
    return text if known else f">={text}"


def session_summary(session: Path) -> dict[str, Any]:
    limits = read_limits(session)
    ledger = read_ledger(session)
    data: dict[str, Any] = {
        "spent_usd": round(ledger.spent, 6),
        "reserved_usd": round(ledger.reserved, 6),
        "agents_with_unknown_cost": ledger.unknown,
        "agents_with_estimated_cost": len(ledger.estimated),
    }
    data.update({k: v for k, v in record_to_json(limits).items() if k != "protocol"})
    return data


def tree_tokens(rows: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """The tree's token counts by kind, summed over its agents' own usage (a native
    subagent's row repeats what its parent's CLI counted)."""
    totals = token_counts(None)
    for row in rows:
        if row.get("kind") != "native":
            for key, count in token_counts(row.get("usage")).items():
                totals[key] += count
    return totals


def add_model_calls(session: Path, rows: Sequence[dict[str, Any]]) -> None:
    """status --json's `model_calls`: on each agent's row that has any, every call the tree's gateway
    metered for it (the ledger's spend lines), oldest first.

    All of them, however many: --json is what programs read, and a call is a
    short record. Rows without calls (trees without a gateway, native
    subagents, whose calls their parent's CLI makes) look as before.
    """
    calls = read_model_calls(session)
    for row in rows:
        if row.get("kind") != "native" and (found := calls.get(row["id"])):
            row["model_calls"] = [record_to_json(call) for call in found]


def format_tokens(tokens: Mapping[str, int]) -> str:
    """'tokens: input 1,200, output 80, cache read 26,000, cache write 3,100' (reads cost 0.1x input, writes 1.25x)."""
    names = {"input_tokens": "input", "output_tokens": "output", "cache_read_input_tokens": "cache read"}
    names["cache_creation_input_tokens"] = "cache write"
    return "tokens: " + ", ".join(f"{name} {tokens.get(key, 0):,}" for key, name in names.items())


def format_tree(session: Path, rows: Sequence[Mapping[str, Any]], totals: Mapping[str, Any]) -> str:
    spent = f"${totals['spent_usd']:.4f}" + (
        f" + {totals['agents_with_unknown_cost']} unknown" if totals["agents_with_unknown_cost"] else ""
    )
    if totals.get("agents_with_estimated_cost"):
        spent += f" ({totals['agents_with_estimated_cost']} estimated)"
    if totals.get("reserved_usd"):
        spent += f", reserved ${totals['reserved_usd']:.4f}"
    caps = [f"budget ${totals['max_budget_usd']:.4f}"] if "max_budget_usd" in totals else []
    caps += [f"{k.removeprefix('max_').replace('_', ' ')} <= {totals[k]}" for k in ("max_agents", "max_concurrent") if k in totals]
    lines = [f"session {session}", f"spent {spent}" + (f" ({', '.join(caps)})" if caps else "")]
    if any((tokens := tree_tokens(rows)).values()):
        lines.append(format_tokens(tokens))
    for row in rows:
        own = format_cost(row["cost_usd"], row["cost_known"] or row["state"] == Status.REFUSED)
        sub = format_cost(row["subtree_cost_usd"], row["subtree_cost_known"])
        chain = f" ⟲ {row['resumed_from']}" if row.get("resumed_from") else ""  # continues that agent's conversation
        lines.append(
            f"{'  ' * row['level']}{row['id']}{chain}  d{row['depth']}  {row['state']:<11} "
            f"{row['duration_s']:>7.1f}s  own {own}  tree {sub}  {row['task']}{paused_note(row)}"
        )
        # What holds the tree (containment) is for status --json, not this view.
    return "\n".join(lines)


def watch_frame(
    session: Path,
    rows: Sequence[Mapping[str, Any]],
    asks: Sequence[Mapping[str, Any]],
    size: tuple[int, int],
    messages: Sequence[str] = (),
) -> str:
    """One screen of `status --watch`: the tree cut to the terminal, so nothing wraps or scrolls."""
    columns, lines = size
    text = format_tree(session, rows, session_summary(session)).splitlines()
    text += [f"ask {a['id']}: agent {a['agent_id']} wants {a['tool']}: {a['input']}; spawn.py approve|deny {a['id']}" for a in asks]
    text += list(messages)
    if len(text) > lines - 1:
        text = [*text[: lines - 2], f"... {len(text) - lines + 2} more lines"]
    text.append(f"{time.strftime('%H:%M:%S')} watching; Ctrl-C stops watching, the agents keep running")
    # \x1b[K clears what the previous frame left on a line, \x1b[J the lines below.
    return "\x1b[H" + "".join(line[:columns] + "\x1b[K\n" for line in text) + "\x1b[J"


def watch_changes(previous: Mapping[str, str], rows: Sequence[Mapping[str, Any]], asks: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """What `status --watch` prints when stdout is no terminal: one line per new agent, state or ask."""
    now: dict[str, str] = {}
    for row in rows:
        own = format_cost(row["cost_usd"], row["cost_known"] or row["state"] == Status.REFUSED)
        sub = format_cost(row["subtree_cost_usd"], row["subtree_cost_known"])
        now[row["id"]] = f"{row['id']} d{row['depth']} {row['state']} own {own} tree {sub}" + paused_note(row)
    for ask in asks:
        now[ask["id"]] = f"ask {ask['id']} pending: agent {ask['agent_id']} wants {ask['tool']}: {ask['input']}"
    for key in previous:
        if key not in now and key.startswith("q-"):
            now[key] = f"ask {key} answered"
    return now


def watch_status(session: Path, out: Any) -> int:
    """Redraw the tree until every agent has an outcome; Ctrl-C only stops watching."""
    import shutil

    tty = out.isatty()
    seen: dict[str, str] = {}
    messages = SentMessages()
    if tty:
        out.write("\x1b[2J")
    try:
        while True:
            rows = tree_rows(session)
            asks = pending_asks(session)
            sent = messages.read(rows)
            if tty:
                size = shutil.get_terminal_size()
                out.write(watch_frame(session, rows, asks, (size.columns, size.lines), messages.recent))
            else:
                for line in sent:
                    out.write(f"{time.strftime('%H:%M:%S')} {line}\n")
                lines = watch_changes(seen, rows, asks)
                for key, line in lines.items():
                    if seen.get(key) != line:
                        out.write(f"{time.strftime('%H:%M:%S')} {line}\n")
                seen = {k: v for k, v in lines.items() if not v.endswith(" answered")}
            out.flush()
            if rows and all(row["state"] in EXIT_FOR_STATUS for row in rows):
                return ExitCode.OK
            time.sleep(WATCH_REFRESH_S)
    except KeyboardInterrupt:
        note("stopped watching; the agents keep running")
        return ExitCode.OK


def kill_agent(agent_dir: Path, secrets_: Sequence[str], caller: str | None = None) -> list[str]:
    """End an agent and its descendants, deepest first; record `killed`.

    With the caller (`spawn.py kill`'s), every outcome's reason names it, the
    runners' own too: each finds the reason beside its records (KILL_REQUEST).
    """
    meta = load_meta(agent_dir)
    targets = [*descendants_of(Path(meta.session), meta.id), agent_dir]
    reason = f"killed by spawn.py kill (from {caller})" if caller else "ended by spawn.py kill"
    if caller:
        for d in targets:
            if read_outcome(d) is None:
                request_kill(d, reason)
    return settle_agents([(d, Status.KILLED, reason) for d in targets], "kill", secrets_)


def kill_caller(environ: Mapping[str, str]) -> str:
    """Who runs this `spawn.py kill`: the agent whose Bash runs it, else the
    process that started it (past uv), and whether that is a terminal."""
    if environ.get(ENV_AGENT_ID):
        return f"agent {environ[ENV_AGENT_ID]}"
    try:
        proc = psutil.Process(os.getppid())
        while proc.name() in ("uv", "uvx") and (up := proc.parent()) is not None:
            proc = up
        args = proc.cmdline()
        # The program and its script, never its arguments: they may hold anything.
        words = [Path(args[0]).name, *(Path(a).name for a in args[1:2] if not a.startswith("-"))] if args else []
        described = f"pid {proc.pid} ({' '.join(words) or proc.name()})"
    except psutil.Error:
        described = f"pid {os.getppid()}"
    return f"a terminal, {described}" if sys.stdin is not None and sys.stdin.isatty() else described


def guard_above_ends_tree(agent_dir: Path | None, runner_exit: int, secrets_: Sequence[str]) -> int:
    """The guard above a runner that died or left processes: end the tree, settle it, exit as the runner did.

    Every process of the tree descends from the guard, since orphans only
    re-parent up to the nearest living subreaper: what is below it now is the
    whole tree, as a cgroup would hold it. The tree's live agents are asked to
    end first, so each commits its own outcome; then everything below is
    ended; only then is the root's outcome committed, so nothing the tree
    started still runs when its marker appears.
    """
    meta = None
    with contextlib.suppress(OSError, SpawnError):
        meta = load_meta(agent_dir) if agent_dir is not None else None
    try:
        if meta is not None:
            ask_tree_agents_to_end(meta)
        end_everything_below()
        if meta is not None and agent_dir is not None:
            reap_agent(agent_dir, "guard", secrets_)
    finally:
        with contextlib.suppress(psutil.Error):
            unregister_runner(os.getpid(), own_create_time())
    return exit_as(runner_exit)


def ask_tree_agents_to_end(meta: AgentMeta) -> None:
    """SIGTERM every live spawn.py of the tree, and give them the time they need to settle.

    Found by meta.json and by the runner index, which has an agent's entry
    before its meta.json is published.
    """
    agents = Path(meta.session) / AGENTS_DIR
    targets = []
    for d in descendants_of(Path(meta.session), meta.id):
        with contextlib.suppress(OSError, SpawnError):
            if read_outcome(d) is None:
                targets.append(Supervised.of(load_meta(d)))
    with contextlib.suppress(OSError, SpawnError):
        for path in runner_index_dir().glob("*.json"):
            entry = _read_runner_entry(path)
            if entry is not None and entry[2].parent == agents and entry[0] != os.getpid():
                targets.append(Supervised(entry[0], entry[1], _entry_namespace(path)))
    asked = [proc for target in targets if (proc := target.signal(signal.SIGTERM)) is not None]
    # As settle_agents: a spawn.py ends its own subtree (up to KILL_GRACE_S) first.
    wait_gone(asked, KILL_GRACE_S * 2)
