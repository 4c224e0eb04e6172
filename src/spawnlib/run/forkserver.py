"""The session's fork server: a warm process that forks each nested spawn instead of a fresh exec."""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, cast

import psutil

from ..core.constants import SCRIPT_PATH
from ..core.errors import ExitCode, SpawnError
from ..core.forkstate import reset_after_fork
from ..core.prelude import ENV_NO_FORKSERVER, FORKED_VERBS, FORKSERVER_REPLY_S, FORKSERVER_SOCKET, forkserver_request
from ..core.pure import parse_json, utc_now_iso
from ..core.records import AgentMeta
from ..policy.channel import bind_private_socket
from ..session.protocol import load_meta
from ..supervise.fast_start import compiled_script
from ..supervise.supervisor import (
    ChildOf,
    ForkedFor,
    Supervised,
    ancestor_agents,
    ancestry_context,
    own_pid_namespace,
    pid_namespace_of,
    set_parent_death_signal,
)
from .running import STOP_SIGNALS, SdkLoader, import_sdk

# ------------------------------------------------------------- fork server --

# A session's fork server: one process, started by the root agent, that has
# imported everything a spawn needs. A nested spawn.py hands its whole
# invocation over the socket (forkserver_stand_in, at the top of this file)
# and the server forks a child that runs it: no interpreter start, no
# imports, and pages shared with the server. It is an accelerator only:
# with no server, every spawn takes the normal path and every guarantee is
# the same.
FORKSERVER_LOG = "forkserver.jsonl"  # in the session directory: one line per fork
FORKSERVER_NAME = "spawn-forksrv"  # its name in ps and top (/proc/PID/comm, at most 15 bytes)
FORKSERVER_POLL_S = 1.0  # how often the server checks that its root is still alive
# What a forked agent would otherwise import for itself, each a private copy
# (~4 MiB of each agent's private memory): anyio's asyncio backend and the
# streams the SDK opens at connect, and ctypes (prctl, the subreaper).
# (Not opentelemetry, which the SDK would import at connect: import_sdk
# keeps it out.)
FORKSERVER_PRELOAD = (
    "anyio._backends._asyncio",
    "anyio._core._subprocesses",
    "anyio.to_thread",
    "anyio.streams.memory",
    "anyio.streams.stapled",
    "anyio.streams.tls",
    "ctypes",
    "queue",
)


# What a forked child runs: spawn.py's main(), which sits above every module.
# The fork server is started from the runner, below the CLI, so main() hands
# itself down (main -> cmd_run -> run_agent -> start_forkserver) instead of
# the server importing up.
Entry = Callable[[Sequence[str]], int]


def forkserver_wanted(meta: AgentMeta, environ: Mapping[str, str]) -> bool:
    """Only a root that can have children starts one; SPAWN_NO_FORKSERVER=1 turns it off.

    Linux only: the server learns its peers from SO_PEERCRED.
    """
    return (
        sys.platform.startswith("linux")
        and meta.parent_id is None
        and ForkedFor.pid is None
        and meta.depth < meta.max_depth
        and "Bash" in meta.tools
        and environ.get(ENV_NO_FORKSERVER) != "1"
    )


def start_forkserver(meta: AgentMeta, sdk_loader: SdkLoader | None, entry: Entry) -> None:
    """Fork the session's fork server from the root (in its cgroup, below its subreaper).

    Forked, not started afresh: the root has imported nearly everything the
    server needs, so the server costs a fork instead of an interpreter that
    imports it all again (about 0.25 s of CPU, taken from the root's CLI
    while it starts). The SDK's import thread is joined first: a fork keeps
    only the calling thread, and an import lock held by another would stay
    held in the child. The root's end takes the server down with the rest
    of its subtree; it also exits by itself once the root's process is
    gone. A server that fails to start costs nothing but speed.
    """
    if sdk_loader is not None:
        try:
            sdk_loader.result()
        except BaseException:
            return  # run_sdk raises it where it is reported
    if threading.active_count() > 1:
        return  # another thread would be cut off mid-step in the child
    try:
        log = os.open(Path(meta.session) / "forkserver.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return
    with contextlib.suppress(OSError, ValueError):  # else the child would write the root's buffered output
        sys.stdout.flush()
        sys.stderr.flush()
    try:
        pid = os.fork()
    except OSError:
        pid = -1
    if pid != 0:
        os.close(log)
        return
    # From here this process is the server, and never returns to the root's code.
    try:
        become_forkserver(log)
        serve_forks(meta, entry)
    except SystemExit:
        pass
    except BaseException:  # into its log: the server is only ever an accelerator
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(0)


def become_forkserver(log: int) -> None:
    """In the root's fresh fork: let go of everything that is the root's.

    Its own session (a Ctrl-C reaches the root, which ends it), no stdio of
    the root's (a parent reading the root's stdout must see EOF when the
    root exits), no other descriptor (the guard's pipe must close when the
    root dies), default signal handling, and a name of its own in ps.
    """
    os.setsid()
    # As a fresh interpreter has them (the root's hold stop signals for its outcome).
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    reset_after_fork()  # a stop the root got, its guard, its capped logs: the root's, not its forked agents'
    # Gone with the root at once, even a SIGKILLed one (else within FORKSERVER_POLL_S).
    set_parent_death_signal(signal.SIGTERM)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 4096))
    for fd in fds:
        if fd > 2:
            with contextlib.suppress(OSError):
                os.close(fd)
    with contextlib.suppress(OSError), open("/proc/self/comm", "w") as fh:
        fh.write(FORKSERVER_NAME)
    print(f"spawn.py fork server {os.getpid()}", flush=True)


def forkserver_refusal(request: Mapping[str, Any], script_stat: os.stat_result) -> str | None:
    """Why this server must not run a request (then the stand-in takes the normal path)."""
    if request.get("prefix") != sys.prefix:
        return "another Python environment"
    argv = request.get("argv")
    # What a stand-in asks for, and nothing else: every other verb (approve,
    # kill, ...) decides by its caller's ancestry, which a fork would hide.
    if not (isinstance(argv, list) and argv and (argv[0].startswith("-") or argv[0] in FORKED_VERBS)):
        return "not a spawn"
    if request.get("detach") is True and not (len(argv) == 2 and argv[0] == "_run"):
        return "only a background runner is forked detached"
    if request.get("detach") is True and request.get("child_of") is True:
        return "a runner's child is never forked detached"
    path, size, mtime_ns = request["script"]  # its shape checked by request_problem
    if path == str(compiled_script()):
        return None
    if path == str(SCRIPT_PATH) and (size, mtime_ns) == (script_stat.st_size, script_stat.st_mtime_ns):
        return None
    return "another spawn.py"


# A request holds one spawn's argv and environment, which the kernel caps
# together at ARG_MAX (2 MiB on Linux); anything much longer is no stand-in's.
FORKSERVER_REQUEST_MAX = 8 << 20


def request_problem(request: object) -> str | None:
    """What makes a fork request malformed, or None (pure).

    The socket is the user's only, but the server must outlive whatever
    is sent to it: a field of the wrong type is refused here, not met as a
    TypeError in the serving loop, which would end the server.
    """
    if not isinstance(request, dict):
        return "not an object"
    argv, env, script = request.get("argv"), request.get("env"), request.get("script")
    if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
        return "argv"
    if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        return "env"
    if not (isinstance(request.get("cwd"), str) and isinstance(request.get("prefix"), str)):
        return "cwd or prefix"
    if not (isinstance(script, list) and len(script) == 3 and isinstance(script[0], str) and all(type(n) is int for n in script[1:])):
        return "script"
    if not isinstance(request.get("detach", False), bool) or not isinstance(request.get("child_of", False), bool):
        return "detach or child_of"
    return None


# A stand-in sends its whole request at once; a client still sending after
# this many seconds is dropped (it takes the normal path, if it is one).
FORKSERVER_REQUEST_S = 5.0
# Requests read at once; a client past them is closed unanswered (the normal path).
FORKSERVER_PENDING_MAX = 32


def closed_unanswered(client_pid: int, why: str) -> None:
    """Say in the server's log why a client was closed unanswered (it then takes the normal path)."""
    print(f"fork server {os.getpid()}: closed client {client_pid} unanswered: {why}", flush=True)


class PendingRequest:
    """A fork request being read: a 4-byte length, JSON, and the stdio fds, then the client's cwd (SCM_RIGHTS).

    The server reads every client's as it comes, each until its own
    deadline: one that trickles its bytes must not hold up another's spawn.
    """

    def __init__(self, conn: Any, client_pid: int) -> None:
        self.conn, self.client_pid = conn, client_pid
        self.deadline = time.monotonic() + FORKSERVER_REQUEST_S
        self.data = bytearray()
        self.fds: list[int] = []

    def feed(self) -> bool:
        """Take what has come; whether the request is whole. ValueError for one that never can be."""
        import socket

        try:
            data, fds, _flags, _addr = socket.recv_fds(self.conn, 1 << 16, 4)
        except BlockingIOError:
            return False
        self.fds += fds
        if len(self.fds) > 4:
            raise ValueError("more fds than stdio and a cwd")
        if not data:
            raise ValueError("request cut short")
        self.data += data
        if len(self.data) < 4:
            return False
        length = int.from_bytes(self.data[:4], "big")
        if length > FORKSERVER_REQUEST_MAX or len(self.data) > 4 + length:
            raise ValueError("no request's length")
        return len(self.data) == 4 + length

    def feed_all(self) -> bool:
        """feed() until nothing more has come; whether the request is whole."""
        for _ in range(FORKSERVER_REQUEST_MAX >> 16):  # at most a whole request's worth of reads
            before = len(self.data)
            if self.feed():
                return True
            if len(self.data) == before:
                return False
        return False

    def request(self) -> dict[str, Any]:
        """The whole request, checked; ValueError for a malformed one (parse_json: deep is malformed)."""
        request = parse_json(bytes(self.data[4:]), FORKSERVER_REQUEST_MAX)
        if len(self.fds) not in (3, 4) or request_problem(request) is not None:
            raise ValueError("malformed request")
        return cast("dict[str, Any]", request)

    def close(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = []
        self.conn.close()


def serve_forks(meta: AgentMeta, entry: Entry) -> None:
    """The fork server's loop: accept, check the peer, fork; until the root is gone."""
    path = Path(meta.session) / FORKSERVER_SOCKET
    server = bind_private_socket(path)  # 0600: only this user may connect
    bound = path.stat().st_ino
    # Listening before the imports: a spawn that comes meanwhile waits in the
    # backlog, no longer than its own imports would have taken it.
    server.listen(64)
    server.setblocking(False)
    preload_for_forks()
    loop = ForkServerLoop(meta, entry, server)

    def stop(_signum: int, _frame: Any) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGCHLD, loop.reap)
    signal.signal(signal.SIGTERM, stop)
    try:
        loop.run()
        # Only the poll gets here; the root's death signal (SIGTERM) ends the server before.
        print(f"spawn.py fork server {os.getpid()}: its root is gone", flush=True)
    finally:
        with contextlib.suppress(OSError):
            if path.stat().st_ino == bound:
                path.unlink()


def preload_for_forks() -> None:
    """Everything a spawn imports, once: the children share these pages.

    (The root, forked, has most of it: the SDK's and asyncio's imports are free.)
    """
    import asyncio  # noqa: F401
    import gc

    import jsonschema  # noqa: F401

    import_sdk(os.environ)
    import anyio  # noqa: F401

    psutil.Process  # noqa: B018  # imported at first use (core/prelude.py): here, once for every child

    for name in FORKSERVER_PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    compiled_script()
    # Out of the collector's reach: a child's collections then leave these
    # pages alone, so they stay shared with the server instead of copied.
    gc.freeze()


class ForkServerLoop:
    """The server's state between polls: the clients whose requests are still coming, the spawns it forked."""

    def __init__(self, meta: AgentMeta, entry: Entry, server: Any) -> None:
        import selectors

        self.meta, self.entry, self.server = meta, entry, server
        self.root = Supervised.of(meta)
        self.script_stat = SCRIPT_PATH.stat()
        self.namespace = own_pid_namespace()
        # The spawns this server forked, by pid: the stand-in each runs for (or
        # the runner it runs as a child of: child_of). A detached runner is
        # forked only for one of them (its launcher), and for that launcher's
        # caller, who is checked while it still lives.
        self.launched: dict[int, tuple[int, float, bool]] = {}
        self.pending: dict[Any, PendingRequest] = {}
        self.selector = selectors.DefaultSelector()
        self.selector.register(server, selectors.EVENT_READ)

    def reap(self, _signum: int, _frame: Any) -> None:
        with contextlib.suppress(ChildProcessError):
            while (pid := os.waitpid(-1, os.WNOHANG)[0]) != 0:
                self.launched.pop(pid, None)

    def run(self) -> None:
        """Poll until the root is gone."""
        while self.root.alive():
            now = time.monotonic()
            for client in [c for c in self.pending.values() if c.deadline <= now]:
                self.expire(client)
            wait_s = min([FORKSERVER_POLL_S, *(c.deadline - now for c in self.pending.values())])
            for key, _events in self.selector.select(max(0.0, wait_s)):
                if key.fileobj is self.server:
                    self.admit()
                else:
                    self.read_from(self.pending[key.fileobj])

    def expire(self, client: PendingRequest) -> None:
        """A client at its deadline: served if its whole request has come meanwhile, else dropped.

        The deadline is for a client that trickles, not for a server that was
        slow to look (busy with another client, or starved on a loaded
        machine): bytes already in the socket are read first.
        """
        try:
            whole = client.feed_all()
        except (OSError, ValueError) as exc:
            self.drop(client, f"its request can't be read: {exc}")
            return
        if whole:
            self.read_from(client, fed=True)
        else:
            self.drop(client, f"its request was not whole {FORKSERVER_REQUEST_S:g} s after it connected ({len(client.data)} bytes came)")

    def read_from(self, client: PendingRequest, *, fed: bool = False) -> None:
        try:
            whole = fed or client.feed()
        except (OSError, ValueError) as exc:
            self.drop(client, f"its request can't be read: {exc}")
            return
        if whole:
            self.selector.unregister(client.conn)
            del self.pending[client.conn]
            try:
                self.serve(client)
            except (OSError, ValueError, psutil.Error) as exc:
                closed_unanswered(client.client_pid, f"{type(exc).__name__} while serving it: {str(exc)[:200]}")
            client.close()

    def drop(self, client: PendingRequest, why: str) -> None:
        # Closed unanswered: that client takes the normal path.
        closed_unanswered(client.client_pid, why)
        self.selector.unregister(client.conn)
        del self.pending[client.conn]
        client.close()

    def admit(self) -> None:
        import selectors
        import socket
        import struct

        try:
            conn, _ = self.server.accept()
        except (BlockingIOError, InterruptedError):
            return
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        client_pid, client_uid, _gid = struct.unpack("3i", creds)
        # Another user's, or one inside an agent's sandbox (or unreadable),
        # whatever it says: what it spawns must stay in there, not be forked out.
        namespace = pid_namespace_of(client_pid)
        why = (
            f"its uid {client_uid} is not this server's"
            if client_uid != os.getuid()
            else f"its pid namespace {namespace} is not this server's {self.namespace}"
            if namespace != self.namespace
            else f"{FORKSERVER_PENDING_MAX} requests are being read already"
            if len(self.pending) >= FORKSERVER_PENDING_MAX
            else None
        )
        if why is not None:
            closed_unanswered(client_pid, why)
            conn.close()
            return
        conn.setblocking(False)
        self.pending[conn] = PendingRequest(conn, client_pid)
        self.selector.register(conn, selectors.EVENT_READ)

    def serve(self, client: PendingRequest) -> None:
        meta, entry = self.meta, self.entry
        conn, fds, client_pid = client.conn, client.fds, client.client_pid
        request = client.request()
        conn.settimeout(5.0)  # the reply's send; the client waits for it
        refusal = forkserver_refusal(request, self.script_stat)
        client_time = psutil.Process(client_pid).create_time()
        child_of = request.get("child_of") is True
        caller, ancestry = None, None
        if refusal is None:
            caller, refusal = caller_in_tree(
                client_pid, self.launched, meta.session, detach=request.get("detach") is True, child_of=child_of
            )
        if refusal is None and caller is not None and request.get("detach") is True:
            ancestry = ancestry_context(subject=caller)
        if refusal is not None:
            conn.sendall(json.dumps({"refused": refusal}).encode() + b"\n")
            return
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            try:
                self.server.close()
                self.selector.close()
                for other in self.pending.values():  # every other client is the server's to answer
                    other.close()
                if request.get("detach") is True:
                    ForkedFor.ancestry = ancestry
                    run_detached(conn, fds, request, entry)
                ForkedFor.child_of = child_of
                run_forked(conn, fds, request, client_pid, client_time, entry=entry)
            finally:
                os._exit(ExitCode.STATE)
        if request.get("detach") is not True:
            self.launched[pid] = (client_pid, client_time, child_of)
        line = {
            "time": utc_now_iso(),
            "pid": pid,
            "client_pid": client_pid,
            "verb": request["argv"][0] if request["argv"][:1] in (["_run"], ["wait"]) else "run",
        }
        if request.get("detach") is True:
            line["detached"] = True  # no stand-in: the pid is the runner's own (run_detached)
        if child_of:
            line["child_of"] = True  # no stand-in: client_pid is the runner whose broker asked
        with contextlib.suppress(OSError), open(Path(meta.session) / FORKSERVER_LOG, "a") as fh:
            fh.write(json.dumps(line) + "\n")


def caller_in_tree(
    client_pid: int, launched: Mapping[int, tuple[int, float, bool]], session: str, *, detach: bool, child_of: bool = False
) -> tuple[psutil.Process | ChildOf | None, str | None]:
    """(the process a request speaks for, None), or (None, why it is refused).

    The kernel names the client (SO_PEERCRED); a spawn this server forked
    speaks for the stand-in it runs for. A client that asks child_of (a
    runner's broker) is spoken for as a child of its own: the ancestry a
    process it started would have, which any process may have by starting
    one, so it grants nothing an exec would not. The caller must run under a
    registered runner of this server's own session: anything else (another
    tree, a process that only sets SPAWN_SESSION) takes the normal path,
    where its own ancestry decides. Only the server's own forked launchers
    may ask for a detached runner.
    """
    if detach and client_pid not in launched:
        return None, "only a launcher this server forked may ask for a detached runner"
    caller_pid, caller_time, child_of = launched.get(client_pid, (client_pid, None, child_of))
    try:
        proc = psutil.Process(caller_pid)
        if caller_time is not None and abs(proc.create_time() - caller_time) >= 0.05:
            return None, "its caller is gone"
    except psutil.Error:
        return None, "its caller is gone"
    caller = ChildOf(proc) if child_of else proc
    for agent_dir in ancestor_agents(caller)[:1]:
        with contextlib.suppress(OSError, SpawnError):
            if load_meta(agent_dir).session == session:
                return caller, None
    return None, "not a process of this server's tree"


def adopt_request(conn: Any, fds: Sequence[int], request: Mapping[str, Any]) -> list[str]:
    """In a forked child: take on the client's stdio, cwd, environment and argv, and send it our pid. The argv."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    reset_after_fork()
    os.setsid()  # its own group, as a runner has: never in the server's
    # The client's cwd by descriptor where it sent one (the 4th fd): the
    # folder it runs in, whatever its path names by now.
    if len(fds) > 3:
        os.fchdir(fds[3])
        os.close(fds[3])
    else:
        os.chdir(str(request["cwd"]))
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
        if fd != target:
            os.close(fd)
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in dict(request["env"]).items()})
    argv = [str(a) for a in request["argv"]]
    sys.argv = [str(compiled_script()), *argv]
    conn.settimeout(None)
    conn.sendall(json.dumps({"pid": os.getpid()}).encode() + b"\n")
    return argv


def run_forked(conn: Any, fds: Sequence[int], request: Mapping[str, Any], client_pid: int, client_time: float, *, entry: Entry) -> NoReturn:
    """In the forked child: become the spawn the stand-in would have run, then report its exit code."""
    ForkedFor.pid, ForkedFor.create_time = client_pid, client_time
    argv = adopt_request(conn, fds, request)
    finished = threading.Event()

    def watch_stand_in() -> None:
        # The stand-in never writes: this returns when it closes or dies.
        with contextlib.suppress(OSError):
            conn.recv(1)
        if not finished.is_set():
            Supervised.signal_self(signal.SIGKILL)  # as if our own spawn.py was SIGKILLed: the guard settles

    watcher = threading.Thread(target=watch_stand_in, name="stand-in", daemon=True)
    watcher.start()
    try:
        code = entry(argv)
    except SystemExit as exc:  # what the process would have exited with
        code = exc.code if isinstance(exc.code, int) else ExitCode.USAGE
    sys.stdout.flush()
    sys.stderr.flush()
    finished.set()
    # Let go of the caller's pipes before the stand-in exits, as a process that ends would.
    null = os.open(os.devnull, os.O_RDWR)
    for target in (0, 1, 2):
        os.dup2(null, target)
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps({"exit": int(code)}).encode() + b"\n")
    watcher.join(FORKSERVER_REPLY_S)  # our pid stays ours while the stand-in may still signal it
    os._exit(code)


def run_detached(conn: Any, fds: Sequence[int], request: Mapping[str, Any], entry: Entry) -> NoReturn:
    """In the forked child: a background agent's runner that a launcher (itself forked) asked for.

    No stand-in: the launcher exits at once, and the runner's own pid is what
    meta.json records, as for a runner the launcher would have started
    itself; that would be one more interpreter and stand-in per agent (~50 ms
    of CPU, ~3 MiB while the agent runs). In a session of its own, as then.
    """
    argv = adopt_request(conn, fds, request)
    conn.close()
    try:
        code = entry(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else ExitCode.USAGE
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def fork_detached_runner(agent_dir: Path, session: str, cwd: str, log: int) -> int | None:
    """From a launcher the fork server forked: have the server fork the agent's runner. Its pid, or None.

    None (no server any more, a refusal, a timeout) means: start the runner
    the normal way. The server forks before it answers, so after an answer
    the runner exists; after no answer, none was forked for us (a server
    that forks and then can't answer closes the socket, and a runner that
    was never registered gives up by itself: cmd_background_runner).
    """
    if ForkedFor.pid is None:
        return None  # not forked by a server: there may be none
    stat = SCRIPT_PATH.stat()
    request: dict[str, object] = {
        "argv": ["_run", str(agent_dir)],
        "detach": True,
        "env": dict(os.environ),
        "cwd": cwd,
        "prefix": sys.prefix,
        "script": [str(compiled_script()), stat.st_size, stat.st_mtime_ns],
    }
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        served = forkserver_request(session, request, (null, log, log))
    finally:
        os.close(null)
    if served is None:
        return None
    served[0].close()  # the runner is detached: nothing more comes on this socket
    return served[1]


def fork_as_child(
    session: str, argv: Sequence[str], env: Mapping[str, str], cwd: int | str, stdio: tuple[int, int, int]
) -> tuple[Any, int, bytes] | None:
    """From a runner's broker: have the session's server fork argv as this runner's child. (socket, pid, what followed), or None.

    The fork runs as the exec'd `"$SPAWN_PYTHON" "$SPAWN_PY" ARGV` would,
    with env and stdio, in the folder cwd holds (a descriptor, SCM_RIGHTS),
    admitted as this runner's child (child_of: ChildOf), without the
    interpreter's start, the stand-in and its wait. None (no server, a
    refusal, no answer) means: exec it; nothing was forked for us. The
    socket's {"exit": N} line is the child's exit code; closing the socket
    before it ends the child, as a killed stand-in would.
    """
    if not sys.platform.startswith("linux") or env.get(ENV_NO_FORKSERVER) == "1":
        return None
    if not (argv and (argv[0].startswith("-") or argv[0] in FORKED_VERBS)):
        return None  # kill and send decide by their own process's ancestry: exec'd
    stat = SCRIPT_PATH.stat()
    request: dict[str, object] = {
        "argv": list(argv),
        "env": dict(env),
        "cwd": cwd if isinstance(cwd, str) else f"/proc/self/fd/{cwd}",
        "prefix": sys.prefix,
        "script": [str(compiled_script()), stat.st_size, stat.st_mtime_ns],
        "child_of": True,
    }
    return forkserver_request(session, request, stdio if isinstance(cwd, str) else (*stdio, cwd))
