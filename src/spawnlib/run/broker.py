"""A sandboxed spawner's broker: the client in its Bash files requests, the server in its runner starts them."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core.constants import ENV_CALL, ENV_PYTHON, ENV_SCRIPT, REQUESTS_DIR, SCRATCH_DIR
from ..core.errors import ExitCode, RefusedError, SpawnError
from ..core.output import note
from ..core.pure import AGENT_ID, parse_json, utc_now_iso
from ..core.records import AgentMeta
from ..policy.writable import below, fd_path, open_folder_beneath
from ..programs.sandbox_client import sandbox_client, split_flag
from ..session.protocol import AGENTS_DIR, MarkerEvents, load_meta, open_regular, write_file_atomic
from ..supervise.supervisor import sandbox_owner
from .forkserver import fork_as_child
from .running import child_environment

# ------------------------------------------------------------------ broker --

# A sandboxed spawner's Bash sees the session read-only, so the spawn.py it
# runs can't register a child. It leaves the spawn in its drop box instead,
# requests/<agent id>/ (the one place of the session it may write), as a
# request: the argv it was given and its cwd. The agent's runner, outside the
# sandbox, runs that argv as a spawn.py of its own, with its own agent's
# environment (child_environment, from the runner's memory): the child's
# process ancestry is then the runner, a registered runner of the agent, so
# the child is admitted as that agent's child by the one admission path, with
# limits from the runner index and the runner's memory, never from the
# request. The request is the agent's by construction (whose box it sits
# in). The runner writes the reply beside it: the child spawn.py's stdout,
# stderr and exit code.
#
# Claude Code's Linux sandbox blocks AF_UNIX sockets (seccomp), so the box is
# files, as refused spawns of a sandboxed leaf already are (refused/).

# The verbs a sandboxed spawner hands to its runner, beside a spawn: each
# acts on agents below it, through a channel its sandbox blocks (the inbox
# socket) or a record it can't write (wait's lent slot). approve and deny are
# not among them: an ask is answered by the person or the root, never by an
# agent of the tree, sandboxed or not.
BROKERED_VERBS = ("kill", "wait", "send")
# Verbs that write the session and have no runner to go through: inside a
# sandbox they are refused, at once and in a line, not left to fail on the
# first record they write (`dag validate` and `dag show` only read).
UNBROKERED_WRITERS = ("reap", "plan", "build", "explore", "run-plan-build", "run-all")
UNBROKERED_DAG_ACTIONS = ("run", "resume")
NUMBER = re.compile(r"[0-9]+(\.[0-9]+)?")
BROKER_POLL_S = 0.1  # how often a runner looks into its agent's box where inotify can't wake it
BROKER_IDLE_S = 1.0  # with inotify: how long a runner sleeps at most (stale temp files, a missed event)
BROKER_REQUEST_MAX_BYTES = 256 * 1024  # a request: argv (the task inline) and cwd
BROKER_ARGV_MAX = 200  # words in a request's argv
BROKER_RUNNING_MAX = 16  # requests a runner runs at once; more wait in the box
BROKER_REQUESTS_MAX = 1000  # requests a runner serves over its life; later ones are refused
BROKER_STDOUT_MAX_BYTES = 1024 * 1024  # what a reply carries of the child's stdout
BROKER_STDERR_MAX_BYTES = 64 * 1024  # and of its stderr (the end of it)
BROKER_TEMP_MAX_AGE_S = 60.0  # a writer's temp file older than this was abandoned: removed
BROKER_SEND_MAX_CHARS = 100_000  # a brokered message's text
PINNED_FOLDERS = sys.platform == "linux"  # O_PATH and /proc/self/fd: a folder held by descriptor
REQUEST_NAME = re.compile(r"([0-9a-f]{16})\.json")
REPLY_SUFFIX = ".reply.json"
CALL_TOKEN = re.compile(r"[0-9a-f]{16,128}")  # a Bash call's token (supervise/calls.py mints hex), as a request may carry it
# The request's spawn.py output as it comes, which the runner appends to and
# the client prints as it grows: <id>.stdout and <id>.stderr (Relay).
STREAMS = ("stdout", "stderr")
STREAM_NAME = re.compile(r"[0-9a-f]{16}\.(stdout|stderr)")
BROKER_STREAM_MAX_BYTES = 1024 * 1024  # what is streamed of each; past it, the reply carries the rest (stderr's end)
BROKER_LOG = "broker.jsonl"  # in the session directory: one line per request run, and where its time went

# The run path's flags a brokered spawn may pass, and whether each takes a
# value. Left out: what would let the child, running outside the sandbox,
# write or run where the agent's Bash can't (--output FILE, --cwd, --session,
# --no-settings, a definition or schema by path: the spawn.py in the sandbox
# inlines the files it reads), and root-only flags. --resume passes with an
# agent id of the agent's own session whose cwd is within its own
# (resumed_problem): the resumed agent runs in the original's cwd.
BROKER_FLAGS: Mapping[str, bool] = {
    "--task": True,
    "--topic": True,
    "--tools": True,
    "--disallowed-tools": True,
    # Rules only narrow below a parent's (deny over ask over allow, the parent's kept).
    "--allow": True,
    "--deny": True,
    "--ask": True,
    "--model": True,
    "--agent": True,
    "--route": True,
    "--schema": True,
    "--system-prompt": True,
    "--preset": True,
    "--sandbox": True,
    "--max-depth": True,
    "--timeout": True,
    "--idle-timeout": True,
    "--max-turns": True,
    "--max-budget-usd": True,
    "--confirm-over": True,
    "--on-budget": True,
    "--no-wait": False,
    "--parent-trace": True,
    "--background": False,
    "--print": True,
    "--resume": True,
    "--traceback": False,
}
PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


def flag_value(argv: Sequence[str], i: int, value: str | None) -> tuple[str | None, int]:
    """argv[i]'s value: after its '=', else the next word (None past the end); and the index of the word it came from."""
    if value is None:
        i += 1
        value = argv[i] if i < len(argv) else None
    return value, i


def checked_run_argv(argv: Sequence[str]) -> list[str] | str:
    """A brokered spawn's argv as the runner will run it, or why it is refused (pure).

    Only BROKER_FLAGS pass; --sandbox off becomes auto (the child of a
    sandboxed agent is never less held). Every limit is narrowed again by
    the child's own admission: this only keeps the child from doing, outside
    the sandbox, what the agent's Bash can't.
    """
    out: list[str] = []
    i = 0
    while i < len(argv):
        name, value = split_flag(argv[i])
        takes = BROKER_FLAGS.get(name)
        if not name.startswith("--") or takes is None:
            return f"{name[:80]!r} is not served to a sandboxed agent (allowed: {', '.join(sorted(BROKER_FLAGS))})"
        if takes:
            value, i = flag_value(argv, i, value)
            if value is None:
                return f"{name} needs a value"
        elif value is not None:
            return f"{name} takes no value"
        if name == "--agent" and value != "auto" and not PLAIN_NAME.fullmatch(value or ""):
            return "--agent takes a definition's name here, never a path or a node reference"
        if name == "--schema" and not (PLAIN_NAME.fullmatch(value or "") or (value or "").lstrip().startswith("{")):
            return "--schema takes a schema's name or inline JSON here"
        if name == "--resume" and not AGENT_ID.fullmatch(value or ""):
            return "--resume takes an agent id here (a1-0123ab...), never a path"
        if name == "--sandbox" and value == "off":
            value = "auto"
        out += [name] if value is None else [name, value]
        i += 1
    return out


# A request's cwd, resolved once: an O_PATH descriptor on Linux (the child
# starts in the folder it holds), its real path elsewhere.
Folder = int | str


def request_folder(cwd: str, homes: Sequence[str]) -> Folder | None:
    """The request's cwd, opened beneath one of homes (its real paths), or None if it leads out of them.

    The agent can rename anything below its cwd while its runner works: a
    path checked now and used later may name another folder by then (a
    link swapped in, outside). The folder is opened once, beneath the home,
    and the child started in it by descriptor.
    """
    if "\0" in cwd or not os.path.isabs(cwd):
        return None
    for home in homes:
        if not below(os.path.normpath(cwd), home):
            continue
        if not PINNED_FOLDERS:
            real = os.path.realpath(cwd)
            return real if below(real, home) and os.path.isdir(real) else None
        with contextlib.suppress(OSError):
            return open_folder_beneath(home, os.path.normpath(cwd))
    return None


def close_folder(folder: Folder) -> None:
    if isinstance(folder, int):
        with contextlib.suppress(OSError):
            os.close(folder)


def checked_request(data: Any, meta: AgentMeta) -> tuple[list[str], Folder] | str:
    """(argv to run, its cwd resolved once) from a request in meta's agent's box, or why it is refused.

    The cwd must be within the agent's own cwd or its scratch: the child's
    project (its definitions, its settings) is one the agent already works in.
    The caller closes the folder (close_folder).
    """
    if not isinstance(data, dict) or not isinstance(data.get("argv"), list) or not isinstance(data.get("cwd"), str):
        return "not a request: want an object with argv (a list of strings) and cwd"
    argv = data["argv"]
    if len(argv) > BROKER_ARGV_MAX or not all(isinstance(a, str) and "\0" not in a for a in argv):
        return f"argv must be at most {BROKER_ARGV_MAX} strings"
    homes = [os.path.realpath(meta.cwd), os.path.realpath(Path(meta.session) / AGENTS_DIR / meta.id / SCRATCH_DIR)]
    folder = request_folder(data["cwd"], homes)
    if folder is None:
        return f"cwd {data['cwd'][:200]!r} is outside the agent's working directory {meta.cwd}"
    checked = checked_argv(argv, folder)
    if not isinstance(checked, str) and checked[0][:1] not in (["kill"], ["wait"], ["send"]):
        checked = resumed_problem(checked[0], meta, homes) or checked
    if isinstance(checked, str):
        close_folder(folder)
    return checked


def checked_argv(argv: Sequence[str], cwd: Folder) -> tuple[list[str], Folder] | str:
    """A request's verb and arguments as the runner runs them, with its folder, or why they are refused (pure)."""
    if argv[:1] == ["kill"]:
        ids = argv[1:]
        if not ids or not all(AGENT_ID.fullmatch(i) for i in ids):
            return "kill takes agent ids here (a1-0123ab...)"
        return ["kill", *ids], cwd
    if argv[:1] == ["wait"]:
        waited = checked_wait_argv(argv[1:])
        return (["wait", *waited], cwd) if isinstance(waited, list) else waited
    if argv[:1] == ["send"]:
        steered = checked_send_argv(argv[1:])
        return (["send", *steered], cwd) if isinstance(steered, list) else steered
    # A definition the agent could have written, with hooks or MCP servers,
    # is refused by the child's own admission (writable.py), in the process
    # that then runs it: a check here would be one the agent could race.
    checked = checked_run_argv(argv)
    return checked if isinstance(checked, str) else (checked, cwd)


def resumed_problem(argv: Sequence[str], meta: AgentMeta, homes: Sequence[str]) -> str | None:
    """Why the agent a brokered --resume names can't be resumed for a sandboxed agent, or None.

    The resumed agent runs in the original's cwd, outside the sandbox: only
    an agent of the caller's own session that worked within the caller's
    own cwd may be continued from it.
    """
    ids = [argv[i + 1] for i, word in enumerate(argv[:-1]) if word == "--resume"]
    for agent_id in ids:
        try:
            original = load_meta(Path(meta.session) / AGENTS_DIR / agent_id)
        except (OSError, SpawnError):
            return f"--resume {agent_id}: no such agent in this agent's session {meta.session}"
        cwd = os.path.realpath(original.cwd)
        if not any(cwd == h or cwd.startswith(h.rstrip("/") + "/") for h in homes):
            return f"--resume {agent_id}: it ran in {original.cwd}, outside this sandboxed agent's working directory {meta.cwd}"
    return None


def checked_wait_argv(argv: Sequence[str]) -> list[str] | str:
    """A brokered wait's arguments (ids, --all or --any, --timeout S), or why it is refused (pure).

    wait is brokered because it lends the agent's --max-concurrent slot while
    it blocks, a marker in the agent's directory that its Bash can't write.
    """
    out: list[str] = []
    i = 0
    while i < len(argv):
        name, value = split_flag(argv[i])
        if name in ("--all", "--any") and value is None:
            out.append(name)
        elif name == "--timeout":
            value, i = flag_value(argv, i, value)
            if value is None or not NUMBER.fullmatch(value):
                return "wait --timeout takes seconds here"
            out += [name, value]
        elif AGENT_ID.fullmatch(argv[i]):
            out.append(argv[i])
        else:
            return f"wait takes agent ids, --all, --any and --timeout S here, not {argv[i][:80]!r}"
        i += 1
    if not any(AGENT_ID.fullmatch(word) for word in out):
        return "wait takes agent ids here (a1-0123ab...)"
    return out


def checked_send_argv(argv: Sequence[str]) -> list[str] | str:
    """A brokered send's arguments (ID TEXT, --as NAME), or why it is refused (pure).

    Whether the id is below the agent is the runner's check (Broker.checked);
    whether the sender may send is decided again by the inbox that accepts
    it, from the kernel's ancestry: the runner of the sandboxed agent's.
    """
    positional: list[str] = []
    flags: list[str] = []
    i = 0
    while i < len(argv):
        name, value = split_flag(argv[i])
        if name == "--as":
            value, i = flag_value(argv, i, value)
            if value is None or not PLAIN_NAME.fullmatch(value):
                return "send --as takes a plain name here"
            flags += [name, value]
        elif argv[i].startswith("--"):
            return f"send takes an agent id, its text and --as NAME here, not {argv[i][:80]!r}"
        else:
            positional.append(argv[i])
        i += 1
    if len(positional) != 2 or not AGENT_ID.fullmatch(positional[0]):
        return "send takes an agent id and the text here (spawn.py send a2-0123ab... TEXT)"
    if not positional[1].strip() or len(positional[1]) > BROKER_SEND_MAX_CHARS:
        return f"send's text must be 1 to {BROKER_SEND_MAX_CHARS} characters"
    return [*positional, *flags]


# --------------------------------------------------------------- the server --


class Broker:
    """A runner's service to its sandboxed agent: the requests in its box, run as its own spawns."""

    def __init__(
        self, meta: AgentMeta, agent_dir: Path, descendants: Callable[[Path, str], Sequence[Path]], environ: Mapping[str, str]
    ) -> None:
        """descendants: the agent directories below an agent, deepest first (the runner's descendants_of, above this module);
        environ: the runner's settings, which each request's spawn.py starts from."""
        self.environ = environ
        self.descendants = descendants
        self.meta = meta
        self.agent_dir = agent_dir
        self.box = Path(meta.session) / REQUESTS_DIR / meta.id
        self.served = 0
        self.stuck: set[str] = set()  # names in the box that could not be taken out
        self.running: dict[str, Any] = {}  # request id: the task that runs it
        self.calls: dict[str, str] = {}  # request id: the call token its request carried
        self.wake: Any = None  # an asyncio.Event: set by a new name in the box, or a request done (a free running slot)

    def take(self) -> list[tuple[str, bytes | None, float | None]]:
        """The requests waiting in the box, each taken out (never read twice).

        (request id, its bytes or None if unreadable, when it was written: its mtime, for broker.jsonl).
        """
        try:
            names = sorted(os.listdir(self.box))
        except OSError:
            return []
        taken: list[tuple[str, bytes | None, float | None]] = []
        for name in names:
            if name.startswith("."):
                self.drop_abandoned(self.box / name)
                continue  # a writer's temp file
            if name.endswith(REPLY_SUFFIX) or STREAM_NAME.fullmatch(name) or name in self.stuck:
                continue  # a reply (or its output so far) the agent has yet to read, or one already answered
            if len(self.running) + len(taken) >= BROKER_RUNNING_MAX:
                break
            path = self.box / name
            raw: bytes | None = None
            filed: float | None = None
            with contextlib.suppress(OSError, SpawnError, ValueError):
                fd, _ = open_regular(path, os.O_RDONLY | os.O_NOFOLLOW)
                try:
                    filed = os.fstat(fd).st_mtime
                    raw = os.read(fd, BROKER_REQUEST_MAX_BYTES + 1)
                finally:
                    os.close(fd)
            with contextlib.suppress(OSError):
                if path.is_dir() and not path.is_symlink():
                    os.rmdir(path)
                else:
                    path.unlink()
            if os.path.lexists(path):
                self.stuck.add(name)  # a full directory the agent left there: answered once, never again
            match = REQUEST_NAME.fullmatch(name)
            if match is None:
                note(f"warning: {self.meta.id}'s request box held {name[:80]!r}, not a request; removed")
                continue
            taken.append((match[1], raw, filed))
        return taken

    @staticmethod
    def drop_abandoned(path: Path) -> None:
        """A temp file its writer left (a client writes, then renames, at once): removed once it is old."""
        with contextlib.suppress(OSError):
            if time.time() - path.lstat().st_mtime > BROKER_TEMP_MAX_AGE_S:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()

    def reply(self, request_id: str, exit_code: int, stdout: bytes = b"", stderr: bytes = b"", relay: Relay | None = None) -> None:
        """The reply: exit code, stdout's head and stderr's end; with relay, what of each was streamed, and which was cut."""
        import json

        data: dict[str, Any] = {
            "exit_code": int(exit_code),
            "stdout": stdout[:BROKER_STDOUT_MAX_BYTES].decode(errors="replace"),
            "stderr": stderr[-BROKER_STDERR_MAX_BYTES:].decode(errors="replace"),
        }
        if relay is not None and relay.files:
            data["streamed"] = {name: relay.written[name] for name in relay.files}
            if relay.cut:
                data["cut"] = sorted(relay.cut)
        # A fresh temp file (O_EXCL) then a rename: a link the agent planted at either name is replaced, never written through.
        with contextlib.suppress(OSError):
            write_file_atomic(self.box / f"{request_id}{REPLY_SUFFIX}", json.dumps(data).encode())

    def refuse(self, request_id: str, why: str) -> None:
        """Reply with a refusal, and say so on the runner's stderr."""
        note(f"warning: {self.meta.id}'s request {request_id} refused: {why}")
        self.reply(request_id, ExitCode.REFUSED, stderr=f"spawn: error: refused by the agent's runner: {why}\n".encode())

    def checked(self, request_id: str, raw: bytes | None) -> tuple[list[str], Folder] | None:
        """One request's argv and cwd, or None once it is refused (with a reply)."""
        self.served += 1
        if self.served > BROKER_REQUESTS_MAX:
            self.refuse(request_id, f"more than {BROKER_REQUESTS_MAX} requests from one agent")
            return None
        if raw is None or len(raw) > BROKER_REQUEST_MAX_BYTES:
            self.refuse(request_id, f"not a readable request of at most {BROKER_REQUEST_MAX_BYTES} bytes")
            return None
        try:
            data = parse_json(raw, BROKER_REQUEST_MAX_BYTES)
        except ValueError as exc:
            self.refuse(request_id, f"not JSON: {str(exc)[:200]}")
            return None
        checked = checked_request(data, self.meta)
        if isinstance(checked, str):
            self.refuse(request_id, checked)
            return None
        # The Bash call the request was filed from, under a CLI that hosts in-process agents:
        # the spawn.py run here presents it, and runs as that call's agent (supervise/calls.py).
        call = data.get("call")
        if isinstance(call, str) and CALL_TOKEN.fullmatch(call):
            self.calls[request_id] = call
        verb = checked[0][0]
        if verb in BROKERED_VERBS:
            below = {d.name for d in self.descendants(Path(self.meta.session), self.meta.id)}
            ids = [word for word in checked[0][1 : 2 if verb == "send" else None] if AGENT_ID.fullmatch(word)]
            if outside := [i for i in ids if i not in below]:
                close_folder(checked[1])
                self.refuse(request_id, f"{verb}: {', '.join(outside)} not below {self.meta.id}")
                return None
        return checked

    async def run(self, request_id: str, argv: Sequence[str], cwd: Folder, *, filed: float | None = None) -> None:
        """Run one request as a spawn.py of this runner's, with its agent's environment, in the folder checked, and reply when it ends.

        Forked by the session's fork server where one serves (ForkedChild),
        else exec'd; either way the runner's child, with the same argv, env,
        folder, own process group, stdio and exit code.
        """
        import asyncio

        clock = {"filed": filed, "woke": time.time()}
        env = {**self.environ, **child_environment(self.meta, self.agent_dir, self.environ)}
        env.pop(ENV_CALL, None)  # the token of the call that started this runner: its parent's, worth nothing here
        if (call := self.calls.pop(request_id, None)) is not None:
            env[ENV_CALL] = call
        child: ForkedChild | asyncio.subprocess.Process | None = None
        try:
            child = await ForkedChild.start(self.meta.session, argv, env, cwd)
            if child is None:
                child = await asyncio.create_subprocess_exec(
                    env[ENV_PYTHON],
                    env[ENV_SCRIPT],
                    *argv,
                    cwd=fd_path(cwd) if isinstance(cwd, int) else cwd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,  # its own group, as a runner has
                )
        except OSError as exc:
            self.refuse(request_id, f"could not start spawn.py: {exc.strerror or exc}")
            return
        finally:
            close_folder(cwd)
        clock["started"] = time.time()
        relay = Relay(self.box, request_id)
        try:
            await relay.drain(child)
        finally:
            relay.close()
        clock["ended"] = time.time()
        code = child.returncode if child.returncode is not None else ExitCode.STATE
        self.reply(request_id, code, bytes(relay.kept["stdout"]), bytes(relay.kept["stderr"]), relay)
        clock["replied"] = time.time()
        self.log_run(request_id, argv[0] if argv[0] in BROKERED_VERBS else "run", child, code, clock)

    def log_run(self, request_id: str, verb: str, child: Any, code: int, clock: Mapping[str, float | None]) -> None:
        """One line of SESSION/broker.jsonl: how the request's spawn.py started, and where its time went (Unix seconds)."""
        import json

        line = {
            "time": utc_now_iso(),
            "agent": self.meta.id,
            "request": request_id,
            "verb": verb,
            "start": "fork" if isinstance(child, ForkedChild) else "exec",
            "pid": child.pid,
            "exit_code": int(code),
            **{k: round(v, 4) for k, v in clock.items() if v is not None},
        }
        with contextlib.suppress(OSError), open(Path(self.meta.session) / BROKER_LOG, "a") as fh:
            fh.write(json.dumps(line) + "\n")

    def done(self, request_id: str, _task: Any) -> None:
        self.running.pop(request_id, None)
        if self.wake is not None:
            self.wake.set()  # a request that waited for a running slot may go now

    async def serve(self) -> None:
        """While the agent runs: take its requests as they come, and reply to each when its spawn.py ends."""
        import asyncio

        # Woken by the request's rename into the box (inotify), not by a poll:
        # a brokered spawn starts as soon as it is filed.
        events = MarkerEvents()
        watching = events.watch(self.box, MarkerEvents.IN_MOVED_TO | MarkerEvents.IN_CREATE)
        self.wake = asyncio.Event()
        if watching:
            asyncio.get_running_loop().add_reader(events.fd, self.wake.set)
        try:
            while True:
                for request_id, raw, filed in self.take():
                    if (checked := self.checked(request_id, raw)) is not None:
                        task = asyncio.create_task(self.run(request_id, *checked, filed=filed))
                        self.running[request_id] = task
                        task.add_done_callback(functools.partial(self.done, request_id))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), BROKER_IDLE_S if watching else BROKER_POLL_S)
                self.wake.clear()
                events.drain()
        finally:
            if watching:
                asyncio.get_running_loop().remove_reader(events.fd)
            events.close()
            for task in list(self.running.values()):
                task.cancel()
            # The agent is done with its box: what it left there (unread
            # replies, temp files, junk) goes with it. rmtree works by file
            # descriptor here, so a link planted inside is removed, never followed.
            shutil.rmtree(self.box, ignore_errors=True)


class ForkedChild:
    """A request's spawn.py as the session's fork server forked it for this runner (fork_as_child).

    Stands where the exec's asyncio Process would: pid, returncode, and its
    output through pipes of ours (relay). Its exit code comes on the socket,
    which stays open while it runs (closed, the child ends itself).
    """

    def __init__(self, sock: Any, pid: int, got: bytes, out: int, err: int) -> None:
        import socket

        self.sock = socket.socket(fileno=sock.detach())
        self.sock.setblocking(False)
        self.pid, self.got, self.out, self.err = pid, got, out, err
        self.returncode: int | None = None

    @classmethod
    async def start(cls, session: str, argv: Sequence[str], env: Mapping[str, str], cwd: Folder) -> ForkedChild | None:
        """Ask the server (in a thread: the ask blocks until it has forked); None: no server took it, exec instead."""
        import asyncio

        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        try:
            served = await asyncio.to_thread(fork_as_child, session, argv, env, cwd, (null, out_w, err_w))
        except BaseException:
            os.close(out_r)
            os.close(err_r)
            raise
        finally:
            for fd in (null, out_w, err_w):  # the child holds its own copies now
                os.close(fd)
        if served is None:
            os.close(out_r)
            os.close(err_r)
            return None
        return cls(*served, out_r, err_r)

    async def relay(self, take: Callable[[str, bytes], None]) -> None:
        """Hand its stdout and stderr to take as they come, until it has ended (returncode set)."""
        import asyncio

        try:
            _, _, self.returncode = await asyncio.gather(
                read_fd(self.out, functools.partial(take, "stdout")), read_fd(self.err, functools.partial(take, "stderr")), self.exit_code()
            )
        finally:
            self.sock.close()  # before it ended: it ends itself (run_forked's watcher)

    async def exit_code(self) -> int:
        """The {"exit": N} line; a child that died without one died of a signal: SIGKILL's code, as the stand-in would."""
        import asyncio

        loop = asyncio.get_running_loop()
        got = self.got
        while b"\n" not in got and (chunk := await loop.sock_recv(self.sock, 4096)):
            got += chunk
        line = got.partition(b"\n")[0].replace(b" ", b"")
        self.sock.close()  # the child waits for this before it exits (its pid stays ours until then)
        with contextlib.suppress(ValueError):
            if line.startswith(b'{"exit":') and line.endswith(b"}"):
                return int(line[8:-1])
        return -signal.SIGKILL


class Relay:
    """A request's spawn.py output as it comes: kept for the reply, and appended to <id>.stdout and <id>.stderr
    in the box, which the spawn.py inside prints as they grow (the reply then says how much each holds).

    Each file is made fresh (O_EXCL, no link followed): one the agent planted
    at the name is never written through; that stream then goes in the
    reply only. Past BROKER_STREAM_MAX_BYTES a stream is cut: the reply
    carries the rest as it always has (stdout's head, stderr's end).
    """

    def __init__(self, box: Path, request_id: str) -> None:
        self.kept = {name: bytearray() for name in STREAMS}
        self.written = dict.fromkeys(STREAMS, 0)
        self.cut: set[str] = set()
        self.files: dict[str, int] = {}
        for name in STREAMS:
            with contextlib.suppress(OSError):
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                self.files[name] = os.open(box / f"{request_id}.{name}", flags, 0o644)

    def take(self, name: str, chunk: bytes) -> None:
        kept = self.kept[name]
        if name == "stdout":
            kept.extend(chunk[: BROKER_STDOUT_MAX_BYTES - len(kept)])
        else:
            kept.extend(chunk)
            del kept[:-BROKER_STDERR_MAX_BYTES]
        fd = self.files.get(name)
        if fd is None or name in self.cut:
            return
        part = chunk[: BROKER_STREAM_MAX_BYTES - self.written[name]]
        try:
            while part:
                done = os.write(fd, part)
                self.written[name] += done
                part = part[done:]
        except OSError:
            self.cut.add(name)  # a full disk: the reply has the rest
        if self.written[name] >= BROKER_STREAM_MAX_BYTES:
            self.cut.add(name)

    async def drain(self, child: ForkedChild | Any) -> None:
        """Take the child's output until it has ended: a ForkedChild's pipes, or an exec'd asyncio Process's."""
        import asyncio

        if isinstance(child, ForkedChild):
            await child.relay(self.take)
            return

        async def read(name: str, stream: asyncio.StreamReader) -> None:
            while chunk := await stream.read(1 << 16):
                self.take(name, chunk)

        await asyncio.gather(read("stdout", child.stdout), read("stderr", child.stderr))
        await child.wait()

    def close(self) -> None:
        for fd in self.files.values():
            with contextlib.suppress(OSError):
                os.close(fd)


async def read_fd(fd: int, keep: Callable[[bytes], None]) -> None:
    """Read a pipe to its end without blocking the loop, handing each chunk to keep; closes it."""
    import asyncio

    loop = asyncio.get_running_loop()
    readable = asyncio.Event()
    os.set_blocking(fd, False)
    loop.add_reader(fd, readable.set)
    try:
        while True:
            await readable.wait()
            readable.clear()
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                return
            keep(chunk)
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def has_broker(meta: AgentMeta) -> bool:
    return meta.sandbox == "on" and meta.depth < meta.max_depth


# --------------------------------------------------------------- the client --


def refuse_session_writer(argv: Sequence[str]) -> None:
    """A verb that writes the session, inside a sandbox that holds the session read-only: RefusedError, before it starts."""
    owner = sandbox_owner()
    if owner is None or os.access(owner.parent, os.W_OK):
        return  # not an agent's sandbox, or one that may write the session: the verb runs as usual
    verb = " ".join(argv[:2]) if argv[0] == "dag" else argv[0]
    if verb in ("approve", "deny"):
        raise RefusedError(
            f"'spawn.py {verb}' can't run in a sandbox: an ask is answered by the person or by the root, never by an agent "
            "below it, and the ask's socket is closed to a sandbox"
        )
    if verb == "budget":
        raise RefusedError(
            "'spawn.py budget' can't run in a sandbox: a tree's budget is changed by the person or from outside the tree "
            "(the MCP server, a script), never by an agent in it"
        )
    raise RefusedError(
        f"'spawn.py {verb}' writes the session, which this sandboxed agent sees read-only; a sandboxed agent spawns, waits, "
        "kills, sends and answers asks through its runner: run the tasks as spawns, or give this agent --sandbox off"
    )


def brokered(argv: Sequence[str], verbs: Sequence[str], environ: Mapping[str, str]) -> int | None:
    """Inside a sandboxed spawner: hand a spawn, a kill, a wait or a send to its runner, print its reply, and return its exit code.

    None where this spawn.py runs as usual: outside a sandbox, in one
    without a request box (a leaf's), and for every other verb (status and
    the like read the session, which is readable here); a verb that writes
    the session is refused here. wait goes to the runner for the slot it
    lends while it blocks (--max-concurrent).
    """
    if not argv or {"-h", "--help", "--version"} & set(argv):
        return None
    if argv[0] in verbs and argv[0] not in BROKERED_VERBS:
        writes = argv[0] in UNBROKERED_WRITERS or (argv[0] == "dag" and len(argv) > 1 and argv[1] in UNBROKERED_DAG_ACTIONS)
        if (writes and "--dry-run" not in argv) or argv[0] in ("approve", "deny", "budget"):
            refuse_session_writer(argv)
        return None
    # The client is a program of its own: spawn.py's stand-in runs the same
    # one before spawn.py's imports, so this runs it only where no stand-in did.
    return sandbox_client(list(argv), dict(environ))
