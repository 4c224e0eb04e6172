from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.machinery
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import types
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import importlib.abc
from .cli_start import StartedCli
from .constants import (
    BASH_TIMEOUT_MS,
    DEFAULT_API_HOST,
    ENV_AGENT_ID,
    ENV_ASK,
    ENV_BUDGET,
    ENV_DEADLINE,
    ENV_DENY,
    ENV_DEPTH,
    ENV_FULL_SDK_IMPORT,
    ENV_IDLE_TIMEOUT,
    ENV_MAX_DEPTH,
    ENV_MODEL,
    ENV_PERMISSION_MODE,
    ENV_PYTHON,
    ENV_SCRIPT,
    ENV_SESSION,
    ENV_TOOLS,
    ENV_TRACEPARENT,
    SANDBOX_INSTALL,
    SANDBOX_LOST,
    SANDBOX_MACOS_PROGRAM,
    SANDBOX_PROGRAMS,
)
from .core import utc_now_iso
from .errors import CorruptRecordError
from .executors import NodeResult
from .fast_start import compiled_script
from .forkstate import on_fork
from .processes import _int_or_none, cgroup_mounts, procfs_is_ours
from .protocol import AGENTS_DIR, META, SCRATCH_DIR, kill_request_reason, open_regular
from .records import AgentMeta, Status
from .steering import ENV_ON_BUDGET
from .verbs import MarkerEvents

# ------------------------------------------------------------------ running --


def spawn_command() -> str:
    """How an agent's Bash should call spawn.py: the interpreter already resolved.

    Skipping `uv run` below the root saves its resolution step at every level,
    and the compiled script its compilation.
    """
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(compiled_script()))}"


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
        f"Agents that --sandbox auto sandboxes (below the root, with Bash, that can't spawn) run unsandboxed: "
        f"{SANDBOX_LOST}. Pass --sandbox on to refuse them instead."
    )


def inside_sandbox() -> bool:
    """Whether this process runs inside a bubblewrap sandbox (a parent agent's Bash).

    There bwrap is pid 1 of our own pid namespace, which an agent can't fake
    without a namespace of its own. A sandbox can't nest (it refuses new
    user namespaces), and everything started here is held by the outer one.
    """
    try:
        first = Path("/proc/1/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return False
    return os.path.basename(first) == b"bwrap"


def sandbox_owner() -> Path | None:
    """The agent whose sandbox this process runs in, from that sandbox's bwrap.

    bwrap binds what the sandboxed agent may write: its agent directory if it
    may spawn, else that directory's scratch/ (sandbox_writes). bwrap's
    command line (pid 1 here, which nothing inside can replace) so names the
    agent, and that agent's meta.json is not writable inside.
    """
    if not inside_sandbox():
        return None
    try:
        args = Path("/proc/1/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    for i in range(len(args) - 1):
        flag, candidate = args[i], Path(args[i + 1])
        if flag == "--bind" and candidate.name == SCRATCH_DIR:
            candidate = candidate.parent
        if flag == "--bind" and candidate.parent.name == AGENTS_DIR and (candidate / META).is_file():
            return candidate
    return None


def api_host(environ: Mapping[str, str]) -> str:
    """The host the CLI sends model requests to."""
    from urllib.parse import urlsplit

    return urlsplit(environ.get("ANTHROPIC_BASE_URL", "")).hostname or DEFAULT_API_HOST


def proxied_loopback(environ: Mapping[str, str]) -> dict[str, str]:
    """Inside a sandbox, NO_PROXY without loopback: the sandbox has its own
    empty loopback, so a model on the host's (the scripted one, a local
    gateway) is only reachable through the sandbox's proxy, which lets
    through only the hosts the sandbox settings allow."""
    loopback = {"localhost", "127.0.0.1", "::1"}
    env = {}
    for name in ("NO_PROXY", "no_proxy"):
        if name in environ:
            env[name] = ",".join(h for h in environ[name].split(",") if h.strip() not in loopback)
    return env


def child_environment(meta: AgentMeta, agent_dir: Path) -> dict[str, str]:
    env = {
        ENV_SESSION: meta.session,
        ENV_AGENT_ID: meta.id,
        ENV_DEPTH: str(meta.depth),
        ENV_MAX_DEPTH: str(meta.max_depth),
        ENV_TOOLS: ",".join(meta.tools),
        ENV_TRACEPARENT: meta.traceparent,
        "TRACEPARENT": meta.traceparent,
        ENV_PYTHON: sys.executable,
        ENV_SCRIPT: str(compiled_script()),
        "BASH_DEFAULT_TIMEOUT_MS": os.environ.get("BASH_DEFAULT_TIMEOUT_MS", BASH_TIMEOUT_MS),
        "BASH_MAX_TIMEOUT_MS": os.environ.get("BASH_MAX_TIMEOUT_MS", BASH_TIMEOUT_MS),
    }
    env[ENV_DENY] = json.dumps(meta.permissions.get("deny", []))
    env[ENV_ASK] = json.dumps(meta.permissions.get("ask", []))
    env[ENV_PERMISSION_MODE] = meta.permission_mode
    env[ENV_MODEL] = meta.model
    if meta.deadline is not None:
        env[ENV_DEADLINE] = f"{meta.deadline:.3f}"
    if meta.max_budget_usd is not None:
        env[ENV_BUDGET] = str(meta.max_budget_usd)
    if meta.idle_timeout_s is not None:
        env[ENV_IDLE_TIMEOUT] = f"{meta.idle_timeout_s:g}"
    if meta.on_budget is not None:
        env[ENV_ON_BUDGET] = meta.on_budget
    if meta.sandbox == "inherited":
        env.update(proxied_loopback(os.environ))
    env.update(quiet_cli_environment(os.environ))
    # Claude Code's minimal mode (CLAUDE_CODE_SIMPLE=1, what `claude --bare`
    # sets) runs no hooks, not even the SDK's: PermissionGate would never see a
    # tool call, so ask rules and the audit trail would be skipped without a
    # word. Anything that can run Bash could set it for a child; it is off for
    # every agent, whatever was inherited.
    env["CLAUDE_CODE_SIMPLE"] = "0"
    return env


# Set for every agent's CLI unless the user set it (or the wider
# CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC) either way: the CLI's telemetry is
# ~0.2 s of CPU at every start (0.82 s against 1.08 s for a `claude -p`, 8
# interleaved runs), paid by every agent of a tree on a machine the tree
# shares. It changes nothing an agent does. DISABLE_AUTOUPDATER and
# DISABLE_ERROR_REPORTING were measured too and saved nothing: not set.
QUIET_CLI_ENV = {"DISABLE_TELEMETRY": "1"}


def quiet_cli_environment(environ: Mapping[str, str]) -> dict[str, str]:
    if "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC" in environ:
        return {}
    return {k: v for k, v in QUIET_CLI_ENV.items() if k not in environ}


STOP_SIGNALS = {signal.SIGTERM: Status.KILLED, signal.SIGHUP: Status.KILLED, signal.SIGINT: Status.INTERRUPTED}


def stopped_by(signum: int, agent_dir: Path) -> tuple[Status, str]:
    """The outcome a stop signal ends an agent with: its status and reason,
    which names who asked when `spawn.py kill` sent it (its KILL_REQUEST)."""
    status = STOP_SIGNALS[signal.Signals(signum)]
    asked = kill_request_reason(agent_dir) if status == Status.KILLED else None
    return status, asked or f"received {signal.Signals(signum).name}"


class EarlyStop:
    """A stop signal that came after registration but before run_agent's loop could serve it.

    Without this, a runner ended in that window (a parent finishing while
    its background child was still starting) died by the default action,
    and its guard could only record "died without writing an outcome".
    """

    pending: int | None = None
    """The first stop signal held, served (stopped_by) once the agent's loop runs."""

    @classmethod
    def arm(cls) -> None:
        def hold(signum: int, _frame: Any) -> None:
            if cls.pending is None:
                cls.pending = signum

        for signum in STOP_SIGNALS:
            signal.signal(signum, hold)

    @classmethod
    def forget(cls) -> None:
        """A stop the process forked from got is that process's, not its fork's."""
        cls.pending = None


on_fork("EarlyStop", EarlyStop.forget)


class RunState:
    """What a running agent has seen so far; survives cancellation."""

    def __init__(self) -> None:
        self.last_text: str | None = None
        self.last_structured_attempt: Any = None
        self.result: Any = None  # the SDK's ResultMessage
        self.cli_pid: int | None = None
        self.cli_pgid: int | None = None
        self.cli_started: Any = None
        """An asyncio.Event that started_cli sets, made by whoever waits for the CLI (asyncio is imported late)."""
        self.stop_reason: Status | None = None
        self.stop_detail: str = ""
        self.running_below: set[str] = set()
        """Descendant agents running when the agent was stopped: it ended them."""
        self.cli_killed = False
        """The CLI was ended by a signal from outside: the agent was killed, it didn't fail."""
        self.last_activity = time.time()
        """Last transcript event or CPU use of the CLI (or the start, or a live child)."""
        self.api_retries = 0
        self.api_error_status: int | None = None
        """The last API error the CLI retried (its api_retry messages): why a run stalled."""
        self.mcp_failed: list[str] = []
        """MCP servers the CLI's init message reports as not connected."""
        self.denied_asks: list[str] = []
        """This agent's asks that were answered no, as 'ask ID (rule R) denied by WHO': a failed run ended on one."""
        self.turns: dict[str, tuple[str, dict[str, Any]]] = {}
        """(model, usage) of each of its model turns so far, by message id: its own running spend."""
        self.request_stop: Callable[[Status, str], None] | None = None
        """run_agent's stop path, for run_sdk to end the agent between turns."""
        self.node_result: NodeResult | None = None
        """What a node of another kind than claude returned (see the executors section)."""
        self.stop_hooks: list[Callable[[], Awaitable[None]]] = []
        """Run by the stop path before the node's process group is ended: an a2a node cancels its remote task."""
        self.inbox: Any = None
        """steering.Inbox: the messages `spawn.py send` gives it (None: it takes none)."""
        self.pause: Any = None
        """steering.BudgetPause, under --on-budget pause."""
        self.refusals_recorded = 0
        """A sandboxed leaf's refused spawns its runner recorded from the drop box (record_dropped_refusals)."""

    def started_cli(self, pid: int) -> None:
        """The CLI (or a node's command) runs as pid, the leader of a group of its own."""
        self.cli_pid = self.cli_pgid = pid
        if self.cli_started is not None:
            self.cli_started.set()


def message_record(message: Any) -> dict[str, Any]:
    data = dataclasses.asdict(message) if dataclasses.is_dataclass(message) and not isinstance(message, type) else {"repr": repr(message)}
    return {"time": utc_now_iso(), "type": type(message).__name__, "message": data}


class _AbsentModule(types.ModuleType):
    """Stands in for a module of the mcp package: every name is an inert class."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        stand_in = type(name, (), {"__init__": _ignore, "__init_subclass__": classmethod(_ignore), "__class_getitem__": classmethod(_same)})
        setattr(self, name, stand_in)
        return stand_in


def _ignore(*_args: Any, **_kwargs: Any) -> None:
    return None


def _same(cls: Any, _item: Any) -> Any:
    return cls


class _AbsentMcpFinder:
    """Serves _AbsentModule for mcp and mcp_types, which the SDK imports eagerly.

    A meta path finder and loader by protocol; importlib.abc costs start-up.
    """

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] in ("mcp", "mcp_types"):
            return importlib.machinery.ModuleSpec(fullname, cast("importlib.abc.Loader", self), is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _AbsentModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []


def import_sdk(environ: Mapping[str, str]) -> types.ModuleType:
    """Import claude_agent_sdk, skipping the mcp package it loads at import time.

    The SDK imports mcp (with pydantic models and an HTTP server stack) only
    to host in-process MCP servers, which spawn.py never creates; external
    MCP servers are plain config for the CLI. That import is about 80% of a
    nested level's start-up, paid again at every depth, so stand-ins serve
    the mcp modules instead. If the SDK can't be imported that way, or
    SPAWN_FULL_SDK_IMPORT=1, it is imported normally.
    """
    if "claude_agent_sdk" in sys.modules:
        return sys.modules["claude_agent_sdk"]
    _import_lazily("jsonschema")
    # Imported by the SDK for the app name it derives, which spawn.py gives
    # it (run_sdk): about 15 ms of reading email and zip modules.
    _import_lazily("importlib.metadata")
    # Imported by connect(), when installed, only to pass on an in-process
    # span: spawn.py has none, and gives the CLI its TRACEPARENT itself
    # (child_environment). Absent, it is the ImportError the SDK expects
    # without the package: about 8 ms of every agent's start, before its CLI.
    sys.modules.setdefault("opentelemetry.propagate", None)  # type: ignore[arg-type]
    if environ.get(ENV_FULL_SDK_IMPORT) != "1" and not any(name.partition(".")[0] == "mcp" for name in sys.modules):
        finder = _AbsentMcpFinder()
        sys.meta_path.insert(0, finder)
        try:
            import claude_agent_sdk

            return claude_agent_sdk
        except Exception:
            sys.meta_path.remove(finder)
            for name in [n for n in sys.modules if n.partition(".")[0] in ("mcp", "mcp_types", "claude_agent_sdk")]:
                del sys.modules[name]
    import claude_agent_sdk

    return claude_agent_sdk


def _import_lazily(name: str) -> None:
    """Put a stand-in for a module in sys.modules that imports it at first use.

    The SDK imports jsonschema at import time only to validate the input of
    in-process MCP tools, which spawn.py never creates: a large part of the
    SDK's import, paid at every depth. (importlib's LazyLoader doesn't do:
    `import` itself touches the module's __spec__, which loads it.)
    """
    if name not in sys.modules:
        sys.modules[name] = module = _LazyModule(name)
        parent, _, child = name.rpartition(".")
        if parent in sys.modules:  # `import a.b` finds b in sys.modules, then reads it as a's attribute
            setattr(sys.modules[parent], child, module)


class _LazyModule(types.ModuleType):
    def __getattr__(self, attr: str) -> Any:
        import importlib

        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        return getattr(importlib.import_module(self.__name__), attr)


class SdkLoader:
    """Imports the SDK on a thread, once the agent's CLI has started (run_agent).

    Not sooner: the import holds the GIL for most of its ~100 ms of CPU, so
    started beside registration it only slowed that down, and the CLI,
    which doesn't need it, started no earlier. After the CLI's start it runs
    beside the CLI's own start-up, on another CPU.
    """

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._module: types.ModuleType | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._load, args=(dict(environ),), name="sdk-import", daemon=True)

    def start(self) -> None:
        if self._thread.ident is None:
            self._thread.start()

    def _load(self, environ: Mapping[str, str]) -> None:
        try:
            self._module = import_sdk(environ)
        except BaseException as exc:  # re-raised in the caller's thread by result()
            self._error = exc

    def result(self) -> types.ModuleType:
        self.start()
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._module is not None
        return self._module


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


async def free_slot_when_quiet(started: StartedCli, hold_s: float) -> None:
    """Let go of the CLI's start slot once it goes quiet, and after hold_s at the latest.

    Quiet: under START_SLOT_QUIET_SHARE of a core over START_SLOT_QUIET_S,
    as when it waits for the model. A start-up that lets go earlier, at its
    first message, leaves a fifth of its CPU to compete with the next one's.
    """
    import asyncio

    pid = started.process.pid
    quiet_ns = START_SLOT_QUIET_SHARE * START_SLOT_QUIET_S * 1e9
    limit = time.monotonic() + hold_s
    if not procfs_is_ours():  # its CPU can't be read: its first message frees it (consume_sdk), else the limit
        await asyncio.sleep(hold_s)
    last = cpu_demand_ns(pid)  # None: it is gone already
    while started.slot is not None and last is not None and time.monotonic() < limit:
        await asyncio.sleep(min(START_SLOT_QUIET_S, max(0.0, limit - time.monotonic())))
        demand = cpu_demand_ns(pid)
        if demand is None or demand - last < quiet_ns:
            break
        last = demand
    started.free_slot()


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
