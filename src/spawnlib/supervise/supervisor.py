"""Supervision, its one home: Supervised (identity, liveness, stop), cgroups, guards, ancestry, the sandbox."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias, cast

import psutil  # imported at its first use (core/prelude.py); jsonschema and the SDK lazily too

from ..core.constants import (
    CGROUP_EMPTY_WAIT_S,
    CGROUP_PREFIX,
    ENV_AGENT_ID,
    ENV_ASK,
    ENV_BUDGET,
    ENV_DEADLINE,
    ENV_DENY,
    ENV_DEPTH,
    ENV_MAX_DEPTH,
    ENV_NO_CGROUP,
    ENV_PERMISSION_MODE,
    ENV_SESSION,
    ENV_TOOLS,
    HEARTBEAT,
    HEARTBEAT_S,
    HEARTBEAT_STALE_BEATS,
    KILL_GRACE_S,
    LEFTOVER_GRACE_S,
    PERMISSION_RANK,
    SANDBOX_INSTALL,
    SANDBOX_LOST,
    SANDBOX_MACOS_PROGRAM,
    SANDBOX_PROGRAMS,
    SCRIPT_PATH,
)
from ..core.errors import ExitCode, RefusedError, SpawnError, StateError
from ..core.forkstate import on_fork
from ..core.output import note
from ..core.prelude import inside_sandbox
from ..core.pure import float_or_none, parse_json
from ..core.records import AgentMeta
from ..programs import program_text
from ..programs.sandbox_client import bwrap_owner
from ..session.protocol import AGENTS_DIR, load_meta, read_outcome, read_text, write_json_atomic
from .fast_start import compiled_script

# ---------------------------------------------------------------- processes --


@dataclass(frozen=True)
class Supervised:
    """A process spawn.py watches or stops, known by its pid AND its start time.

    The one home of supervision: identity, liveness and the stop path. A bare
    pid may have been reused by an unrelated process, so nothing here trusts
    one. Whatever runs a node (today a local spawn.py; later an A2A or command
    executor, or a fork server) records one of these in meta.json, and the
    rest of spawn.py watches and stops it only through here.
    """

    pid: int
    create_time: float
    """Unix seconds, as psutil reports it: (pid, create_time) is unique for the boot."""
    pid_namespace: str | None = None
    """Where pid is valid; another one is an agent inside a sandbox, or its parent seen from there."""
    heartbeat: Path | None = None
    """Across pid namespaces, the heartbeat file tells liveness instead."""
    hosted: bool = False
    """An in-process agent: pid is its host's runner, alive while it runs,
    and never a process to signal or stop on its behalf."""
    host: str | None = None
    boot_id: str | None = None
    """Where pid is valid at all: another host's or another boot's pid is never looked up or signalled here."""

    @classmethod
    def of(cls, meta: AgentMeta) -> Supervised:
        """An agent's spawn.py (an in-process agent's: its host's, which it lives in)."""
        hosted = (meta.placement or {}).get("backend") == "inprocess"
        heartbeat = Path(meta.session) / AGENTS_DIR / meta.id / HEARTBEAT
        return cls(meta.pid, meta.create_time, meta.pid_namespace, heartbeat, hosted, meta.host, meta.boot_id)

    def elsewhere(self) -> bool:
        """Whether pid belongs to another host or another boot of this one.

        Checked before the pid namespace: the initial namespace has the same
        inode on every Linux host, so on a shared session directory it can't
        tell host A's pid 1234 from host B's.
        """
        return (self.boot_id is not None and self.boot_id != own_boot_id()) or (self.host is not None and self.host != own_host())

    def foreign(self) -> bool:
        """Whether pid can't be looked up here: another host's or boot's, another namespace's, or /proc isn't ours."""
        if self.elsewhere():
            return True
        return (self.pid_namespace is not None and self.pid_namespace != own_pid_namespace()) or not procfs_is_ours()

    def process(self) -> psutil.Process | None:
        """The running process, or None: it ended (a zombie has), or the pid is someone else's."""
        if self.hosted:
            return None  # its host's: ending that would end the host and every agent in it
        return self._same_process()

    def _same_process(self) -> psutil.Process | None:
        if self.foreign():
            return None  # that pid names another process here, or none: never signal it
        try:
            proc = psutil.Process(self.pid)
            if abs(proc.create_time() - self.create_time) < 0.05 and proc.status() != psutil.STATUS_ZOMBIE:
                return proc
        except psutil.Error:
            pass
        return None

    def alive(self) -> bool:
        if not self.foreign():
            # _same_process's answer, without psutil where /proc can give it.
            return running_here(self.pid, self.create_time) if procfs_readable() else self._same_process() is not None
        age = heartbeat_age(self.heartbeat) if self.heartbeat is not None else None
        if age is None:
            age = time.time() - self.create_time, HEARTBEAT_S  # not due yet
        return stale_in(age) > 0

    def signal(self, sig: int) -> psutil.Process | None:
        """Send sig if it is still the same process; that process (to wait on), or None.

        psutil.Process re-checks the identity itself before each signal, so a
        pid reused between the check and the kill is never hit.
        """
        proc = self.process()
        if proc is None:
            return None
        try:
            proc.send_signal(sig)
        except psutil.Error:
            return None
        return proc

    # The stop path's raw signals: every signal spawn.py sends to a process
    # goes through Supervised (tests/test_stop_path.py fails on any other).
    # These take a pid or group whose identity the caller holds otherwise
    # than by (pid, create_time): see each.

    @staticmethod
    def signal_pid(pid: int, sig: int) -> bool:
        """Signal a pid that can't have been reused: our own child not yet
        reaped, or a member of a cgroup we own, listed just now. False if it
        is gone (or not ours to signal)."""
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    @staticmethod
    def signal_group(pgid: int, sig: int) -> bool:
        """Signal a process group spawn.py made (a CLI's, a command's); sig 0
        only asks whether it has a member left. False if it has none."""
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    @staticmethod
    def signal_self(sig: int) -> None:
        """End (or stop) this very process by sig, as a signal from outside
        would: its guard and parent then see the same death."""
        os.kill(os.getpid(), sig)

    @staticmethod
    def stop(procs: Iterable[psutil.Process], groups: Iterable[int], grace: float) -> None:
        """The one stop path: SIGTERM, up to grace to exit, then SIGKILL what is left.

        Callers list processes deepest first, so a parent never outlives the
        signal to its children by much; process groups are signalled whole.
        spawn.py itself and its own group are never targets.
        """
        procs = [p for p in procs if p.pid != os.getpid()]
        groups = [g for g in set(groups) if g > 1 and g != os.getpgid(0)]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pgid in groups:
                Supervised.signal_group(pgid, sig)
            for proc in procs:
                with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                    proc.send_signal(sig)
            if sig == signal.SIGTERM:
                procs = wait_gone(procs, grace)
                if not procs and not any(group_alive(g) for g in groups):
                    return
        wait_gone(procs, 1.0)


def heartbeat_age(beat: Path) -> tuple[float, float] | None:
    """(seconds since the last beat, the beat interval) from a heartbeat file, or None without a readable one."""
    try:
        data = parse_json(read_text(beat))
        return time.time() - float(data["updated_at"]), float(data.get("interval_s", HEARTBEAT_S))
    except (OSError, SpawnError, KeyError, TypeError, ValueError):
        return None


def stale_in(age: tuple[float, float]) -> float:
    """Seconds until an agent whose last beat is age[0] old, beating every age[1] s, is stale:
    HEARTBEAT_STALE_BEATS beats missed. Below 0: stale now. The one rule for a stuck agent,
    for every reader (status, wait, an agent in another pid namespace)."""
    return HEARTBEAT_STALE_BEATS * age[1] - age[0]


def own_pid_namespace() -> str | None:
    return pid_namespace_of("self")


_BOOT_ID: list[str | None] = []  # one read per process: a boot never changes under it


def own_boot_id() -> str | None:
    """This boot's id (Linux), or None where there is none (macOS): then the host alone tells."""
    if not _BOOT_ID:
        try:
            with open("/proc/sys/kernel/random/boot_id") as fh:
                _BOOT_ID.append(fh.read().strip() or None)
        except OSError:
            _BOOT_ID.append(None)
    return _BOOT_ID[0]


def own_host() -> str:
    return os.uname().nodename


def stamp_where(meta: AgentMeta) -> None:
    """Record where meta.pid is valid: pid namespace, host and boot."""
    meta.pid_namespace, meta.host, meta.boot_id = own_pid_namespace(), own_host(), own_boot_id()


def pid_namespace_of(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


_PROCFS_OURS: dict[int, bool] = {}  # pid -> procfs_is_ours()


def procfs_is_ours() -> bool:
    """Whether /proc shows this process's own pid namespace.

    Inside Claude Code's sandbox it shows an outer one: a pid from in here
    names another process there, or none, so no pid can be checked by /proc.
    Cached per pid: a process never changes namespace, but a fork is another pid.
    """
    pid = os.getpid()
    if pid not in _PROCFS_OURS:
        try:
            _PROCFS_OURS[pid] = os.readlink("/proc/self") == str(pid)
        except OSError:
            _PROCFS_OURS[pid] = True  # no procfs (macOS): psutil asks the kernel by pid
    return _PROCFS_OURS[pid]


def child_running(pid: int) -> bool:
    """Whether our child pid has not exited, asked of the kernel, not /proc; it is not reaped."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:  # reaped already, or not our child
        return False


def own_identity() -> tuple[int, float, int]:
    return os.getpid(), own_create_time(), os.getpgid(0)


def own_create_time() -> float:
    """This process's start time, as psutil's create_time() gives it.

    Read through /proc/self: inside Claude Code's sandbox, /proc belongs to an
    outer pid namespace, so /proc/<getpid()> is another process, or none.
    """
    try:
        return proc_stat("self").since_boot_s + boot_time()
    except OSError:  # no procfs (macOS): psutil asks the kernel by pid
        return psutil.Process().create_time()


# ------------------------------------------------- /proc, as psutil reads it --
# Every spawn walks its process ancestry (ancestry_context) and checks the
# runner index before its CLI starts. psutil's import is ~20 ms of that
# start, so on Linux these read /proc themselves, exactly as psutil 7's
# Linux code does (the same fields, the same create time, the same parent
# check), and psutil is imported at its first use: for a root, beside its
# CLI's own start. Their errors are OSError (FileNotFoundError: no such
# process); elsewhere psutil answers.


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/PID/stat that spawn.py reads."""

    state: str
    """'Z' for a zombie (psutil's STATUS_ZOMBIE)."""
    ppid: int
    since_boot_s: float
    """Its start, in seconds after boot; psutil's create_time() adds boot_time()."""


def proc_stat(pid: int | str) -> ProcStat:
    """What /proc/PID/stat says of a process ("self": this one). OSError if there is none."""
    with open(f"/proc/{pid}/stat", "rb") as fh:
        stat = fh.read()
    fields = stat[stat.rindex(b")") + 2 :].split()  # from field 3 on: the name in (...) may hold spaces
    return ProcStat(fields[0].decode(), int(fields[1]), int(fields[19]) / os.sysconf("SC_CLK_TCK"))


def boot_time() -> float:
    """/proc/stat's btime, read each time as psutil does: a clock step moves it."""
    with open("/proc/stat", "rb") as fh:
        for line in fh:
            if line.startswith(b"btime"):
                return float(line.split()[1])
    raise OSError("no btime in /proc/stat")


class ProcfsProcess:
    """The part of psutil.Process the ancestry walk uses, from /proc (see above)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._since_boot_s = proc_stat(pid).since_boot_s  # its identity, as psutil.Process(pid) pins it

    def create_time(self) -> float:
        return self._since_boot_s + boot_time()

    def parent(self) -> ProcfsProcess | None:
        """psutil's parent(): None at pid 1 (lowest in every namespace: /proc lists no 0), for
        a parent gone, or for a pid reused by a process younger than this one."""
        if self.pid == 1:
            return None
        own = proc_stat(self.pid)  # read afresh, as psutil does: its ppid, and its start to check the parent's against
        ppid, created = own.ppid, own.since_boot_s + boot_time()
        try:
            parent = ProcfsProcess(ppid)
        except FileNotFoundError:
            return None
        return parent if parent.create_time() <= created else None

    def parents(self) -> list[ProcfsProcess]:
        found: list[ProcfsProcess] = []
        proc = self.parent()
        while proc is not None:
            found.append(proc)
            proc = proc.parent()
        return found

    def environ(self) -> dict[str, str]:
        """The environment it was started with, parsed as psutil's parse_environ_block does."""
        with open(f"/proc/{self.pid}/environ", "rb") as fh:
            data = fh.read().decode(sys.getfilesystemencoding(), sys.getfilesystemencodeerrors())
        found: dict[str, str] = {}
        pos = 0
        while (end := data.find("\0", pos)) > pos:  # a NUL first, or two in a row, ends it
            equal = data.find("=", pos, end)
            if equal > pos:
                found[data[pos:equal]] = data[equal + 1 : end]
            pos = end + 1
        return found


class ChildOf:
    """A child of proc, as the ancestry walk sees it: proc is its parent, and proc's ancestors are its own.

    What a runner's broker hands the fork server for a spawn it would
    otherwise exec as its own child: the fork then has the ancestry that
    child would have had, the runner's agent its parent agent (a process
    whose own parents are the server's would have the root's).
    """

    def __init__(self, proc: psutil.Process | ProcfsProcess) -> None:
        self.proc = proc

    @property
    def pid(self) -> int:
        """This process's own: it stands as proc's child (its call token's check sees proc right above it)."""
        return os.getpid()

    def create_time(self) -> float:
        return float(psutil.Process(os.getpid()).create_time())

    def parent(self) -> psutil.Process | ProcfsProcess:
        return self.proc

    def parents(self) -> list[psutil.Process | ProcfsProcess]:
        return [self.proc, *self.proc.parents()]


# A process whose ancestry is walked: this one's (from /proc where it can
# be), the one a server was handed on a socket (psutil's), or a child of that
# one (ChildOf). A string: the alias itself must not import psutil.
Subject: TypeAlias = "psutil.Process | ProcfsProcess | ChildOf"


def procfs_readable() -> bool:
    """Whether this system has Linux's /proc to read (psutil answers where it hasn't)."""
    return os.path.exists("/proc/self/stat")


def running_here(pid: int, create_time: float) -> bool:
    """Supervised._same_process's check, from /proc (procfs_readable): pid is that process,
    started at create_time, and not a zombie."""
    try:
        stat = proc_stat(pid)
        return abs(stat.since_boot_s + boot_time() - create_time) < 0.05 and stat.state != "Z"
    except OSError:
        return False


def become_subreaper() -> bool:
    """Make orphaned descendants re-parent to us instead of init (Linux only).

    A double-forked grandchild then stays in our subtree, where we can find
    and end it. Elsewhere this degrades to ending only what psutil still sees
    below us.
    """
    PR_SET_CHILD_SUBREAPER = 36
    return prctl(PR_SET_CHILD_SUBREAPER, 1)


def prctl(option: int, arg: int) -> bool:
    """Linux's prctl(2) with one argument; False where it fails or isn't there."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        return bool(ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


# Containment. A double fork, setsid and `env -i` leave the process tree,
# the process group and the environment, but not the cgroup: where cgroup v2
# is writable, a root agent's spawn.py makes a cgroup for its tree, moves
# itself in (so everything it starts is born inside), and its guard, which
# stays outside, ends the tree with cgroup.kill, as systemd ends a unit.
# Elsewhere spawn.py is the subreaper of what it starts.


def cgroup_mounts(mountinfo: str) -> tuple[list[Path], list[Path]]:
    """Where the unified (v2) hierarchy, and cgroup v1's cpu controller, are
    mounted, from /proc/self/mountinfo text: each in the order listed."""
    unified: list[Path] = []
    cpu: list[Path] = []
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, source = left.split(), right.split()  # source: type, source, super options
        if len(fields) <= 4 or not source:
            continue
        if source[0] == "cgroup2":
            unified.append(Path(fields[4]))
        elif source[0] == "cgroup" and len(source) > 2 and "cpu" in source[2].split(","):
            cpu.append(Path(fields[4]))
    return unified, cpu


def cgroup_v2_mount(mountinfo: str) -> Path | None:
    """Where the unified (v2) hierarchy is mounted, from /proc/self/mountinfo text."""
    unified, _ = cgroup_mounts(mountinfo)
    return unified[0] if unified else None


def own_cgroup() -> Path | None:
    """This process's cgroup v2 directory, if the unified hierarchy is mounted."""
    return process_cgroup("self")


def process_cgroup(pid: int | str) -> Path | None:
    """A process's cgroup v2 directory ("0::" in /proc/PID/cgroup, below the unified hierarchy's mount); None if unknown.

    Read by a process outside the caller's namespaces (the gateway), it is the
    place the caller can't hide: `unshare -C` changes what the caller itself
    reads, and `unshare -U` can't leave a cgroup.
    """
    try:
        mount = cgroup_v2_mount(Path("/proc/self/mountinfo").read_text())
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    rel = next((line[3:] for line in lines if line.startswith("0::")), None)
    if mount is None or rel is None or rel.endswith(" (deleted)"):
        return None
    return mount / rel.lstrip("/")


def in_tree_cgroup(pid: int, trees: Iterable[Path]) -> Path | None:
    """The tree cgroup (of trees, as owned_cgroup names them) that process pid is in or below; None when it is in
    none of them, or there are none (the decision is then ancestry's alone)."""
    caller = process_cgroup(pid)
    return None if caller is None else next((tree for tree in trees if caller == tree or tree in caller.parents), None)


def session_roots(session: Path) -> list[Path]:
    """The agent folders of the session's roots (depth 0): one for a tree, one per agent for an MCP server's session."""
    agents = session / AGENTS_DIR
    return sorted(agents.glob("a0-*")) if agents.is_dir() else []


def roots_running(session: Path, besides: str | None = None) -> bool:
    """Whether a root of the session but besides still runs (a runner alive, no outcome yet)."""
    for folder in session_roots(session):
        with contextlib.suppress(OSError, SpawnError):
            meta = load_meta(folder)
            if meta.id != besides and read_outcome(folder) is None and Supervised(meta.pid, meta.create_time).alive():
                return True
    return False


def tree_cgroup_name(session: str, agent_id: str) -> str:
    return f"{CGROUP_PREFIX}{Path(session).name}-{agent_id}"


def choose_containment(is_root: bool, session: str, agent_id: str, environ: Mapping[str, str], guard_above: bool | None = None) -> str:
    """The containment an agent will run under, as meta.json records it.

    A root makes a cgroup below its own (a root started inside another tree
    nests in that tree's cgroup, so the outer cgroup.kill still reaches it).
    A child is already inside its tree's cgroup by inheritance. A new cgroup
    below ours never breaks the "no internal processes" rule: ours holds
    processes (us), so it has no domain controllers enabled for children.
    Without one, a root runs below its guard if guard_above (by default:
    if this process was forked below one).
    """
    here = None if environ.get(ENV_NO_CGROUP, "") not in ("", "0") else own_cgroup()
    if here is not None and not is_root and here.name.startswith(CGROUP_PREFIX):
        return f"cgroup {here}"
    # Moving a process needs write access to cgroup.procs of the common
    # ancestor of both cgroups, which is ours (delegation rules).
    if here is not None and is_root and os.access(here, os.W_OK) and os.access(here / "cgroup.procs", os.W_OK):
        return f"cgroup {here / tree_cgroup_name(session, agent_id)}"
    if not sys.platform.startswith("linux"):
        return "none"
    return "guard" if is_root and (bool(GUARDS_ABOVE) if guard_above is None else guard_above) else "subreaper"


def owned_cgroup(meta: AgentMeta) -> Path | None:
    """The cgroup this agent made for its tree, if it is a tree's root with one."""
    if not (meta.containment or "").startswith("cgroup "):
        return None
    path = Path((meta.containment or "").removeprefix("cgroup "))
    return path if path.name == tree_cgroup_name(meta.session, meta.id) else None


def enter_tree_cgroup(meta: AgentMeta) -> None:
    """Make the tree's cgroup and move this process into it (the guard stays out).

    If that fails (cgroups remounted, a race with a cleaner), the agent still
    runs under the subreaper and its guard's search for leftovers.
    """
    path = owned_cgroup(meta)
    if path is None:
        return
    try:
        path.mkdir(exist_ok=True)
        (path / "cgroup.procs").write_text(f"{os.getpid()}\n")
    except OSError as exc:
        note(f"warning: can't enter cgroup {path}: {exc.strerror}; falling back to the subreaper")


def end_tree_cgroup(meta: AgentMeta) -> bool:
    """End every process left in the agent's tree cgroup, nested ones too, and remove it.

    True if there was a cgroup to end."""
    path = owned_cgroup(meta)
    if path is None or not path.is_dir():
        return False
    try:
        (path / "cgroup.kill").write_text("1\n")
    except OSError:  # kernels before 5.14: no cgroup.kill; signal what is listed
        for cgroup in cgroup_tree(path):
            with contextlib.suppress(OSError, ValueError):
                for pid in (cgroup / "cgroup.procs").read_text().split():
                    Supervised.signal_pid(int(pid), signal.SIGKILL)
    limit = time.monotonic() + CGROUP_EMPTY_WAIT_S
    while cgroup_populated(path) and time.monotonic() < limit:
        time.sleep(0.01)
    # rmdir only takes empty leaves, so nested trees' cgroups go first.
    for cgroup in cgroup_tree(path):
        with contextlib.suppress(OSError):
            cgroup.rmdir()
    return True


def cgroup_tree(path: Path) -> list[Path]:
    """path and the cgroups nested in it, deepest first.

    Whatever another process removes meanwhile is left out, not an error:
    a dead root's guard and a `wait` that settles it may both end its tree
    (Path.rglob raised FileNotFoundError for a directory removed under it).
    """
    return [Path(folder) for folder, _dirs, _files in os.walk(path, topdown=False)]


def cgroup_populated(path: Path) -> bool:
    try:
        return "populated 1" in (path / "cgroup.events").read_text()
    except OSError:
        return False


def wait_gone(procs: Iterable[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait up to timeout for procs to end; those still running. A zombie has ended.

    psutil.wait_procs waits for a process that isn't our child until its pid
    is free, and a zombie keeps its pid until its parent reaps it. An orphan's
    parent is init (or the subreaper above us), which may reap late or, in
    some containers, hardly at all: every stop path then waited out its full
    grace for processes long dead, and a guard settling a SIGKILLed root
    outlived the tree by seconds. Our own children we reap here.
    """
    left = list(procs)
    deadline = time.monotonic() + timeout
    pause = 0.001  # most end within milliseconds of their signal: look again soon, then less often
    while True:
        left = [proc for proc in left if _still_running(proc)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(pause)
        pause = min(pause * 2, 0.01)


def _still_running(proc: psutil.Process) -> bool:
    try:
        if not proc.is_running():
            return False
        if proc.status() != psutil.STATUS_ZOMBIE:
            return True
        if proc.ppid() == os.getpid():
            with contextlib.suppress(ChildProcessError):
                os.waitpid(proc.pid, os.WNOHANG)
        return False
    except psutil.AccessDenied:
        return True  # not ours to judge: wait for it as before
    except psutil.Error:
        return False


def group_alive(pgid: int) -> bool:
    return Supervised.signal_group(pgid, 0)


def end_own_subtree(extra_groups: Iterable[int] = (), grace: float = KILL_GRACE_S, spare: Iterable[int] = ()) -> None:
    """End every process below this one, deepest first, then extra groups."""
    try:
        below = psutil.Process().children(recursive=True)
    except psutil.Error:
        below = []
    keep = set(spare)
    Supervised.stop([p for p in reversed(below) if p.pid not in keep and not is_guard(p)], extra_groups, grace)


def is_guard(proc: psutil.Process) -> bool:
    """Guards are spared: each exits by itself once its agent's spawn.py is gone,
    and a guard killed early could no longer settle an agent that died."""
    try:
        cmdline = proc.cmdline()
    except psutil.Error:
        return False
    return "_guard" in cmdline and (str(SCRIPT_PATH) in cmdline or str(compiled_script()) in cmdline)


# The guard idles as a small process (no imports) until the pipe closes, and
# only then becomes `spawn.py _guard DIR` to do the work. Unless
# the runner wrote GUARD_SETTLED first: it did so right before its exit, with
# the outcome committed, its subtree ended and no tree cgroup to end, which
# leaves the full guard nothing to do (~0.2 s of CPU for every agent saved).
# Only the runner holds the write end; the kernel closes it with nothing
# written if the runner dies, and then the full guard runs as before.
GUARD_SETTLED = b"settled\n"
# It waits as a POSIX shell where there is one: ~0.3 MiB of PSS where even a
# bare interpreter holds ~3 MiB, for every running agent (and ~10 ms less CPU).
# argv: the interpreter ($0), then `spawn.py _guard DIR` for it to exec; either
# way its command line names `_guard` and the script (is_guard).
GUARD_SHELL = "/bin/sh"
GUARD_SHELL_WAIT = 'read -r said && [ "$said" = settled ] && exit 0; exec "$0" "$@"'
GUARD_BOOTSTRAP = program_text("guard_wait")  # reads GUARD_SETTLED as SETTLED


def start_guard(agent_dir: Path) -> tuple[int, int]:
    """Start the agent's guard: (its pid, the pipe end that keeps it waiting).

    If this spawn.py is SIGKILLed nothing in it runs, so a small process in a
    session of its own waits on a pipe whose only writer is us. The kernel
    closes the pipe however we exit; the guard wakes, and if no outcome was
    committed it ends what is left of the agent's subtree and commits one.

    A root without a cgroup also runs below a guard (fork_below_guard), which
    does this one's work while it lives. This one, in a session of its own,
    still settles the agent if both die at once (a SIGKILL of their group).
    """
    adopt_guard_above(agent_dir)
    read_end, write_end = os.pipe()  # not inheritable: the CLI never holds it
    guard = [str(compiled_script()), "_guard", str(agent_dir)]
    if os.path.exists(GUARD_SHELL):
        argv = [GUARD_SHELL, "-c", GUARD_SHELL_WAIT, sys.executable, *guard]
    else:  # -I -S: no site import for a process that only waits (~7 ms of CPU an agent)
        argv = [sys.executable, "-I", "-S", "-c", GUARD_BOOTSTRAP, *guard]
    try:
        proc = subprocess.Popen(
            argv,
            stdin=read_end,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    finally:
        os.close(read_end)
    return proc.pid, write_end


# A root without a cgroup runs below its guard, so that what it leaves can't
# outlive it even if it is SIGKILLed: the process the user started forks the
# runner, becomes the child subreaper above it, and execs a bare interpreter
# (a few MB, no imports) that waits for the runner. Orphans of the tree land
# on the runner (a subreaper too) while it lives, on the guard once it dies.
# The guard passes on the signals a process sends it (the terminal signals the
# whole foreground group, the runner included) and exits as the runner did.
# Only if the runner left no outcome does it become `spawn.py _guard --above`
# to end the tree and settle it. A runner that committed its outcome had
# ended its subtree and settled every agent first, so what is left then
# (child agents' guards, which exit by themselves, or a straggler) is just
# SIGKILLed. The runner gets SIGHUP if the guard dies (a SIGKILL of the pid
# the user sees).
GUARD_ABOVE_BOOTSTRAP = program_text("guard_above")

# Signals the guard above passes on to the runner (the bootstrap's `passed`).
GUARD_ABOVE_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

# (pid, pipe write end) of the guard this process forked itself below, until
# its agent adopts it: at most one, set in the runner by fork_below_guard.
GUARDS_ABOVE: list[tuple[int, int]] = []
on_fork("GUARDS_ABOVE", GUARDS_ABOVE.clear)  # the root's guard is the root's alone


def guard_above_possible() -> bool:
    return sys.platform.startswith("linux") and hasattr(signal, "sigwaitinfo")


def fork_below_guard() -> None:
    """Carry on as the runner, a child of this process, which becomes the guard above it.

    The caller's pid (what a shell's $! or a Popen holds) is the guard's: a
    SIGTERM or SIGINT sent there reaches the runner, and its exit status is
    the runner's. meta.json records the runner, the process that runs the agent.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    guard = os.getpid()
    read_end, write_end = os.pipe()
    # Before the fork, not after: the runner may start a double-forked process
    # before this process is scheduled again, and that orphan would re-parent
    # past a guard that is not yet a subreaper. (A fork clears it in the child:
    # the runner becomes one itself, for what it starts while it lives.)
    become_subreaper()
    try:
        runner = os.fork()
    except OSError as exc:  # out of processes: run as before, our own subreaper
        os.close(read_end)
        os.close(write_end)
        note(f"warning: can't start the guard above this run ({exc.strerror}); an escaped process could survive a SIGKILL")
        return
    if runner == 0:
        os.close(read_end)
        # SIGHUP, the signal for "whoever controlled you is gone": we end the
        # tree and record `killed`, as for any SIGHUP, since nobody else will.
        set_parent_death_signal(signal.SIGHUP)
        if os.getppid() != guard:  # it died before the line above: we are on our own
            Supervised.signal_self(signal.SIGHUP)
        GUARDS_ABOVE.append((guard, write_end))
        return
    # Blocked before the exec, so none is lost while the interpreter starts;
    # the bootstrap takes them with sigwaitinfo.
    signal.pthread_sigmask(signal.SIG_BLOCK, {*GUARD_ABOVE_SIGNALS, signal.SIGCHLD})
    os.close(write_end)
    os.set_inheritable(read_end, True)
    argv = [str(SCRIPT_PATH), str(read_end), str(runner)]
    with contextlib.suppress(OSError):
        os.execv(sys.executable, [sys.executable, "-c", GUARD_ABOVE_BOOTSTRAP, *argv])
    sys.argv = ["-c", *argv]  # no interpreter to exec: run the same code here
    exec(GUARD_ABOVE_BOOTSTRAP, {"__name__": "__guard__"})
    os._exit(ExitCode.STATE)


def set_parent_death_signal(sig: int) -> None:
    """Have the kernel send sig when our parent process dies (Linux)."""
    PR_SET_PDEATHSIG = 1
    prctl(PR_SET_PDEATHSIG, sig)


def adopt_guard_above(agent_dir: Path) -> None:
    """Make the guard above this runner, if there is one, the agent's guard.

    The guard learns the agent's directory and its own runner index entry:
    registered under the agent, orphans re-parented to it still find their
    tree (ancestor_agents), and it removes the entry when it exits.
    """
    if not GUARDS_ABOVE:
        return
    pid, pipe = GUARDS_ABOVE.pop()
    create_time = psutil.Process(pid).create_time()
    register_runner(pid, create_time, agent_dir)
    # The pipe stays open until we exit: the guard reads it once we are gone.
    os.write(pipe, f"{agent_dir}\n{_runner_entry(runner_index_dir(), pid, create_time)}\n".encode())


def end_everything_below(rounds: int = 10) -> None:
    """End every descendant of this process: the stop path, then SIGKILL whatever forked meanwhile."""
    grace = LEFTOVER_GRACE_S
    for _ in range(rounds):
        try:
            below = psutil.Process().children(recursive=True)
        except psutil.Error:
            return
        if not below:
            return
        Supervised.stop(list(reversed(below)), [], grace)
        grace = 0.0


def exit_as(code: int) -> int:
    """A runner's exit status, as os.waitstatus_to_exitcode gives it, to exit with.

    A runner killed by a signal had its status say so: the guard dies by the
    same signal (core-dumping ones become 128+N, without a core).
    """
    if code >= 0:
        return code
    sig = -code
    if sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL, signal.SIGPIPE):
        if sig != signal.SIGKILL:
            signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
        Supervised.signal_self(sig)
    return 128 + sig


# Where the runner index lives. Not taken from the environment: an agent
# controls its own (XDG_RUNTIME_DIR, TMPDIR), and an index it can move is one
# its children can escape. The user's runtime dir if the system made one, else
# a private directory of ours in /tmp.
RUNNERS_DIR = "runners"


def runner_index_dir() -> Path:
    """The per-user index of live agent runners, created private (0700) if absent.

    Refuses (StateError) a directory we don't own or others can write: another
    user could otherwise plant or hide runners.
    """
    uid = os.getuid()
    run_user = Path(f"/run/user/{uid}")
    base = run_user / "spawn" if _private_dir_of(run_user, uid, strict=False) else Path(f"/tmp/spawn-{uid}")
    index = base / RUNNERS_DIR
    for folder in (base, index):
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=0o700)
        if not _private_dir_of(folder, uid, strict=True):
            raise StateError(f"runner index {folder} is not a private directory of yours; remove it and retry")
    return index


def _private_dir_of(path: Path, uid: int, *, strict: bool) -> bool:
    """A real directory owned by uid; with strict, also closed to group and others."""
    import stat

    try:
        st = path.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == uid and (not strict or st.st_mode & 0o077 == 0)


def _runner_entry(index: Path, pid: int, create_time: float) -> Path:
    return index / f"{pid}-{create_time:.3f}.json"


def register_runner(pid: int, create_time: float, agent_dir: Path) -> None:
    """Record that the process (pid, create_time) runs the agent in agent_dir.

    The seam of process-identity ancestry: any spawn whose ancestor chain
    (reparenting included) meets this process is that agent's child, with
    its limits, whatever its environment says. spawn.py registers the
    process that runs the agent (foreground spawn or background `_run`);
    a supervisor that becomes the subreaper above it (the guard) may
    register itself under the same agent_dir, so that orphans reparented to
    it stay in the tree. Call unregister_runner when the process ends; an
    entry left by a crash is ignored, because readers check the identity.
    """
    index = runner_index_dir()
    namespace = own_pid_namespace()
    data = {"pid": pid, "create_time": create_time, "agent_dir": str(agent_dir), "pid_namespace": namespace}
    data |= {"host": own_host(), "boot_id": own_boot_id()}  # the cache may be on a home shared by hosts
    write_json_atomic(_runner_entry(index, pid, create_time), data)
    for stale in index.glob("*.json"):  # crashed runners' entries: keep the index small
        entry = _read_runner_entry(stale)
        # An entry from inside a sandbox has a pid we can't check from here.
        if entry is not None and _entry_namespace(stale) in (None, namespace) and not Supervised(entry[0], entry[1]).alive():
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()


def unregister_runner(pid: int, create_time: float) -> None:
    """Remove the entry register_runner wrote for (pid, create_time), if any."""
    with contextlib.suppress(FileNotFoundError, SpawnError):
        _runner_entry(runner_index_dir(), pid, create_time).unlink()


def _entry_namespace(path: Path) -> str | None:
    """The entry's pid namespace; one no process here is in when it names another host or boot."""
    with contextlib.suppress(OSError, SpawnError, ValueError, AttributeError):
        data = parse_json(read_text(path))
        if Supervised(0, 0.0, host=data.get("host"), boot_id=data.get("boot_id")).elsewhere():
            return f"elsewhere: {data.get('host')} boot {data.get('boot_id')}"
        return cast("str | None", data.get("pid_namespace"))
    return None


def _read_runner_entry(path: Path) -> tuple[int, float, Path] | None:
    try:
        # read_text: anything with Bash may write here, a FIFO too; every spawn reads it.
        data = parse_json(read_text(path))
        return int(data["pid"]), float(data["create_time"]), Path(str(data["agent_dir"]))
    except (OSError, SpawnError, ValueError, KeyError, TypeError):
        return None


def ancestor_agents(subject: Subject | None = None) -> list[Path]:
    """Agent directories of the registered runners among our ancestors (or subject's), nearest first.

    The chain is psutil's parents, as the kernel has them now: a double-forked
    orphan has been reparented to its nearest subreaper (the agent's runner),
    so it still finds that agent.
    """
    try:
        index = runner_index_dir()
        chain = (subject or ancestry_subject()).parents()
    except OSError:  # first, so a ProcfsProcess's error doesn't import psutil to be matched
        return []
    except psutil.Error:
        return []
    entries: dict[int, list[tuple[float, Path]]] = {}
    for path in index.glob("*.json"):
        entry = _read_runner_entry(path)
        if entry is not None:
            entries.setdefault(entry[0], []).append((entry[1], entry[2]))
    found = []
    for proc in chain:
        for create_time, agent_dir in entries.get(proc.pid, []):
            if Supervised(proc.pid, create_time).alive() and agent_dir not in found:
                found.append(agent_dir)
    # Inside a sandbox the chain stops at its bwrap: the agent that owns the
    # sandbox is the farthest ancestor we can see.
    owner = sandbox_owner() if subject is None else None
    if owner is not None and owner not in found:
        found.append(owner)
    return found


def nearest_ancestor_agent(subject: Subject | None = None) -> Path | None:
    """The directory of the nearest agent whose runner is among our ancestors (or subject's)."""
    found = ancestor_agents(subject)
    return found[0] if found else None


def ancestor_agent_context(subject: Subject | None = None) -> dict[str, Any] | None:
    """The nearest ancestor agent's limits, from its meta.json: the authority.

    None when no registered runner is among our ancestors (a root). An
    ancestor whose meta.json can't be read is refused, not ignored: ignoring
    it would let an agent shed its limits by damaging its own record.
    """
    agent_dir = nearest_ancestor_agent(subject)
    if agent_dir is None:
        return None
    try:
        meta = load_meta(agent_dir)
    except (OSError, SpawnError) as exc:
        raise RefusedError(f"the agent running this spawn ({agent_dir}) has no readable meta.json ({exc}); refusing") from None
    return agent_context(meta, agent_dir)


def agent_context(meta: AgentMeta, agent_dir: Path) -> dict[str, Any]:
    """What a child of the agent inherits, as ancestry_context's "runner" (pure)."""
    return {
        "agent_dir": str(agent_dir),
        "parent_id": meta.id,
        "session": meta.session,
        "depth": meta.depth,
        "max_depth": meta.max_depth,
        "deadline": meta.deadline,
        "budget": meta.max_budget_usd,
        "tools": list(meta.tools),
        "deny": list(meta.permissions.get("deny", [])),
        "ask": list(meta.permissions.get("ask", [])),
        "mode": meta.permission_mode,
        "on_budget": meta.on_budget,
        "model": meta.model,
        "traceparent": meta.traceparent,
        "placement": (meta.placement or {}).get("policy"),
        "sandbox": meta.sandbox,
        "pid": meta.pid,  # its runner: a spawn.py that is its child was started by its broker (supervise/calls.py)
        "create_time": meta.create_time,
    }


def calling_agents(subject: Subject | None = None) -> list[tuple[str, str, int]]:
    """(session, agent id, depth) of every agent this process (or subject) runs under.

    By process identity (the runner index) first, then by the environment
    each ancestor was started with, which its agent can't rewrite.
    """
    found: list[tuple[str, str, int]] = []
    for agent_dir in ancestor_agents(subject):
        with contextlib.suppress(OSError, SpawnError):
            meta = load_meta(agent_dir)
            found.append((meta.session, meta.id, meta.depth))
    with contextlib.suppress(OSError, psutil.Error):
        for proc in (subject or ancestry_subject()).parents():
            with contextlib.suppress(OSError, psutil.Error):
                env = proc.environ()
                depth = _int_or_none(env.get(ENV_DEPTH))
                if env.get(ENV_SESSION) and env.get(ENV_AGENT_ID) and depth is not None:
                    found.append((env[ENV_SESSION], env[ENV_AGENT_ID], depth))
    return found


def ancestry_context(environ_of: Callable[[Any], Mapping[str, str]] | None = None, subject: Subject | None = None) -> dict[str, Any]:
    """Depth limits as the process ancestry tells them, whatever our own env says.

    An agent controls its own Bash, so it can unset or rewrite SPAWN_* in the
    environment this process got. It can't rewrite the environment its CLI
    was started with by spawn.py (/proc/PID/environ is fixed at exec), so
    every ancestor is read: the deepest depth and the smallest max depth win.

    An agent can also leave the tree by double-fork and `env -i`, so the
    nearest agent among our ancestors by process identity (the runner index)
    is looked up too, under "runner" (see ancestor_agent_context). subject:
    another process's ancestry, that a server was handed on a socket.
    """
    found: dict[str, Any] = {}
    runner = ancestor_agent_context(subject)
    if runner is not None:
        found["runner"] = runner
    # OSError first in each handler: a ProcfsProcess's errors (a root's
    # own walk) are matched without importing psutil.
    proc: Subject | None
    try:
        own = subject or ancestry_subject()
        # This process and its ancestors, nearest first: which Bash call started it (supervise/calls.py).
        found["chain"] = [(own.pid, own.create_time())]
        proc = own.parent()
    except OSError:
        return found
    except psutil.Error:
        return found
    # Inside a parent's sandbox, pid 1 is its bwrap, whose environment the
    # parent's CLI fixed at exec: the one ancestor there an agent can't rewrite.
    in_sandbox = inside_sandbox() if subject is None else False
    while proc is not None and (proc.pid > 1 or (proc.pid == 1 and in_sandbox)):
        try:
            env = environ_of(proc) if environ_of else proc.environ()
        except OSError:  # another user's process, or gone
            env = {}
        except psutil.Error:
            env = {}
        depth = _int_or_none(env.get(ENV_DEPTH))
        if depth is not None and depth >= found.get("depth", -1):
            if depth > found.get("depth", -1):
                found["parent_id"] = env.get(ENV_AGENT_ID)
                found["session"] = env.get(ENV_SESSION)
            found["depth"] = depth
        max_depth = _int_or_none(env.get(ENV_MAX_DEPTH))
        if max_depth is not None:
            found["max_depth"] = min(max_depth, found.get("max_depth", max_depth))
        if env.get(ENV_TOOLS) is not None:
            tools = set(env[ENV_TOOLS].split(",")) - {""}
            found["tools"] = tools & found.get("tools", tools)
        deadline = float_or_none(env.get(ENV_DEADLINE))
        if deadline is not None:
            found["deadline"] = min(deadline, found.get("deadline", deadline))
        budget = float_or_none(env.get(ENV_BUDGET))
        if budget is not None:
            found["budget"] = min(budget, found.get("budget", budget))
        for name, key in ((ENV_DENY, "deny"), (ENV_ASK, "ask")):
            found[key] = sorted(set(found.get(key, [])) | set(_json_list(env.get(name))))
        mode = env.get(ENV_PERMISSION_MODE)
        if mode in PERMISSION_RANK and (found.get("mode") is None or PERMISSION_RANK[mode] < PERMISSION_RANK[found["mode"]]):
            found["mode"] = mode
        try:
            found["chain"].append((proc.pid, proc.create_time()))
            proc = proc.parent()
        except OSError:
            break
        except psutil.Error:
            break
    return found


def _json_list(value: str | None) -> list[str]:
    try:
        data = parse_json(value) if value else []
    except ValueError:
        return []
    return [str(v) for v in data] if isinstance(data, list) else []


def _int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value not in (None, "") else None
    except ValueError:
        return None


class ForkedFor:
    """In a child of the fork server: the stand-in it runs a spawn for (set once, after the fork)."""

    pid: int | None = None
    create_time: float = 0.0
    ancestry: dict[str, Any] | None = None
    """A detached runner's: its caller's ancestry, as the server saw it while the caller lived."""
    child_of: bool = False
    """pid is no stand-in but a runner whose broker asked: this process stands as that runner's child (ChildOf)."""


def ancestry_subject() -> Subject:
    """The process whose ancestry decides a spawn's parent agent and limits.

    This process, except in a fork server's child: there it is the stand-in,
    whose pid the kernel reported (SO_PEERCRED), since the child's own
    ancestry is the server's. If the stand-in is gone the spawn is over; the
    child must never go on as if it were a root.
    """
    if ForkedFor.pid is None:
        return ProcfsProcess(os.getpid()) if procfs_readable() else psutil.Process()
    with contextlib.suppress(psutil.Error):
        proc = psutil.Process(ForkedFor.pid)
        if abs(proc.create_time() - ForkedFor.create_time) < 0.05:
            return ChildOf(proc) if ForkedFor.child_of else proc
    Supervised.signal_self(signal.SIGKILL)
    raise AssertionError("unreachable")


def sandbox_problem(platform: str = sys.platform) -> str | None:
    """Why Claude Code's sandbox can't run here, and what would make it, or None.

    On Linux the CLI needs bwrap and socat on PATH, and a kernel that lets
    this user create namespaces; a one-shot bwrap tells (a few ms, only when
    asked for). On macOS it uses Seatbelt's sandbox-exec, part of the system.
    Elsewhere the CLI has no sandbox. (platform: for the tests of the others.)
    """
    import shutil

    if platform == "darwin":
        if shutil.which(SANDBOX_MACOS_PROGRAM) is None:
            return f"{SANDBOX_MACOS_PROGRAM} not found on PATH; it ships with macOS in /usr/bin"
        return None
    if not platform.startswith("linux"):
        return f"Claude Code has a sandbox only on Linux and macOS, not on {platform}"
    missing = [name for name in SANDBOX_PROGRAMS if shutil.which(name) is None]
    if missing:
        return f"{' and '.join(missing)} not found on PATH; install them: `{SANDBOX_INSTALL}`, or your distribution's equivalent"
    probe = ["bwrap", "--ro-bind", "/", "/", "--unshare-user", "--unshare-pid", "--unshare-net", "--proc", "/proc", "true"]
    try:
        proc = subprocess.run(probe, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap can't run: {exc}"
    if proc.returncode != 0:
        first = (proc.stderr.strip().splitlines() or ["exit " + str(proc.returncode)])[0]
        return f"bwrap can't create namespaces: {first}; the kernel must let this user create user namespaces"
    return None


def unsandboxed_warning(problem: str) -> str:
    """The one warning --sandbox auto gives when the sandbox it wanted can't run."""
    return (
        f"sandbox: Claude Code's sandbox can't run here ({problem}). "
        f"Agents that --sandbox auto sandboxes (every agent below the root that has Bash) run unsandboxed: "
        f"{SANDBOX_LOST}. Pass --sandbox on to refuse them instead."
    )


def sandbox_owner() -> Path | None:
    """The agent whose sandbox this process runs in, from that sandbox's bwrap (programs/sandbox_client.py's bwrap_owner)."""
    owner = bwrap_owner()
    return None if owner is None else Path(owner)
