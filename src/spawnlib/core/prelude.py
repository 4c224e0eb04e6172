"""First in spawn.py: the fork server's stand-in, which a nested spawn runs before any other import.

Also the helpers it needs and that others share: unix_address for long
socket paths, and import_at_first_use for the heavy imports (psutil and kin).
"""

from __future__ import annotations

# --------------------------------------------------- fork server: stand-in --
# First in the file, before every other import: a nested spawn.py that a
# fork server will run costs only what runs up to here (see "fork server").
import os
import sys
import types
from typing import Any

from ..programs import program_text

FORKSERVER_SOCKET = "forkserver.sock"  # in the session directory, mode 0600
ENV_NO_FORKSERVER = "SPAWN_NO_FORKSERVER"  # 1: never use the session's fork server
# Seconds a stand-in waits for the server to fork; past it, the normal path.
# Generous: a loaded machine may take a while, and giving up after the fork
# would start the agent twice.
FORKSERVER_REPLY_S = 30.0
# Verbs the server runs too, besides a spawn: a background agent's runner, and
# `wait`, which a parent agent keeps running while its children work (forked,
# it shares the server's imports instead of holding ~12 MiB of its own).
FORKED_VERBS = ("_run", "wait")
# Signals a stand-in passes on to the agent it stands for.
FORWARDED_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
# Once the agent is forked, the stand-in execs this: a bare interpreter (-I -S,
# builtin modules only) holds ~3 MiB where one that has loaded spawn.py, json
# and socket holds ~6 MiB, and every running agent has one. Same pid, same
# environment; argv keeps the spawn's own arguments after ours. The signals
# are blocked across the exec (the mask survives it), so none is lost or
# takes its default action before the handlers are in place.
# With no exit code (the agent died of a signal) it dies of the last signal
# it passed on, as the agent did if that was what ended it, else of SIGKILL.
# The loop is programs/stand_in_wait.py (argv: socket fd, agent pid, what was
# already read (hex), signal numbers); a short stand-in runs it in-process.
STAND_IN_WAIT = program_text("stand_in_wait")
# Inside a sandboxed spawner, a spawn, kill, wait or send goes to its runner's
# broker; the stand-in runs that client, before spawn.py's imports, and
# compiles it only there (~5 ms, which a nested spawn elsewhere never pays).
SANDBOX_CLIENT = program_text("sandbox_client")


def unix_address(path: str) -> tuple[str, int | None]:
    """An address for path's socket: sun_path holds ~107 bytes, so a longer
    path is reached through an open fd of its directory (close the fd after)."""
    if len(os.fsencode(path)) < 100:
        return path, None
    fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY)
    return f"/proc/self/fd/{fd}/{os.path.basename(path)}", fd


def encode_json(value: object) -> str:
    """json.dumps for a fork request's str, bool, int, list and dict, on builtin modules only:
    json, socket and signal would import re, enum and selectors (~12 ms of CPU at every nested spawn)."""
    import _json

    if isinstance(value, str):
        return str(_json.encode_basestring_ascii(value))
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ",".join(map(encode_json, value)) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(encode_json(k) + ":" + encode_json(v) for k, v in value.items()) + "}"
    raise TypeError(type(value).__name__)


def forkserver_request(session: str, request: dict[str, object], fds: tuple[int, ...]) -> tuple[Any, int, bytes] | None:
    """Ask the session's fork server to fork for request, handing it fds as the child's stdio (SCM_RIGHTS).

    (the socket, the forked pid, what the server sent after its reply), or
    None: no server, a dead or refusing one, or no answer within
    FORKSERVER_REPLY_S. Builtin modules only, as the stand-in runs it.
    """
    import _socket

    try:
        data = encode_json(request).encode()
        data = len(data).to_bytes(4, "big") + data
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    except (OSError, ValueError, TypeError):
        return None
    try:
        sock.settimeout(FORKSERVER_REPLY_S)
        address, dir_fd = unix_address(os.path.join(session, FORKSERVER_SOCKET))
        try:
            sock.connect(address)
        finally:
            if dir_fd is not None:
                os.close(dir_fd)
        packed = b"".join(fd.to_bytes(4, sys.byteorder) for fd in fds)
        try:
            sent = sock.sendmsg([data], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, packed)])
            if sent < len(data):
                # Never an empty send: once the server has the whole request
                # it may fork, reply and close before we get here, and even
                # an empty send() to a closed socket fails (EPIPE).
                sock.sendall(data[sent:])
        except OSError:
            pass  # not all of it went: the reply (a refusal, or none) says so
        # Only the reply tells whether a child was forked for us: with one,
        # falling back to the normal path would run the spawn twice.
        got = b""
        while b"\n" not in got and (chunk := sock.recv(4096)):
            got += chunk
        line, _, got = got.partition(b"\n")
        line = line.replace(b" ", b"")
        if not (line.startswith(b'{"pid":') and line.endswith(b"}")):
            raise ValueError("no pid in the reply")  # a refusal: {"refused": ...}
        return sock, int(line[7:-1]), got
    except (OSError, ValueError):
        sock.close()  # a child forked too late finds it closed and ends itself, as for a killed stand-in
        return None  # nothing runs for us: the caller's normal path runs it


def inside_sandbox() -> bool:
    """Whether this process runs inside a bubblewrap sandbox (a parent agent's Bash).

    There bwrap is pid 1 of our own pid namespace, which an agent can't fake
    without a namespace of its own. A sandbox can't nest (it refuses new
    user namespaces), and everything started here is held by the outer one.
    """
    try:
        with open("/proc/1/cmdline", "rb") as fh:
            return os.path.basename(fh.read().split(b"\0")[0]) == b"bwrap"
    except OSError:
        return False


def sandbox_stand_in(argv: list[str], environ: dict[str, str] | os._Environ[str]) -> int | None:
    """The sandbox client (programs/sandbox_client.py), compiled here only inside a sandbox: its exit code, or None."""
    scope: dict[str, Any] = {"__name__": "sandbox_client"}
    exec(SANDBOX_CLIENT, scope)
    served = scope["sandbox_client"](argv, environ)
    return served if isinstance(served, int) else None


def forkserver_stand_in(argv: list[str], environ: dict[str, str] | os._Environ[str]) -> int | None:
    """Have the session's fork server run this spawn; stay as its stand-in. Its exit code, or None.

    None means: no server, a dead or refusing one, or a spawn it doesn't take
    (verbs, dry runs): run the normal path, no error. Inside a sandbox the
    runner's broker runs it instead (sandbox_stand_in).
    The server forks a process that runs exactly what this one would have,
    with our argv, environment, cwd and stdio; its limits come from OUR
    ancestry (the server reads our pid from the socket). We stay alive as
    the agent's stand-in in our parent's process tree: signals are passed
    on, its exit code becomes ours, and if we are killed the socket closes
    and the agent ends itself the same way.
    """
    if inside_sandbox():
        # In a parent's sandbox: the agent must stay inside it, and its
        # runner's broker starts it (the seccomp filter refuses unix sockets
        # anyway; the server refuses a client from another pid namespace too).
        return sandbox_stand_in(argv, environ)
    session = environ.get("SPAWN_SESSION")
    if environ.get(ENV_NO_FORKSERVER) == "1" or not session or not argv:
        return None
    if not (argv[0] in FORKED_VERBS or argv[0].startswith("-")) or {"--dry-run", "--help", "-h", "--version"} & set(argv):
        return None
    import _signal  # type: ignore[import-not-found]  # signal's C half, loaded at start-up

    try:
        stat = os.stat(__file__)
        request: dict[str, object] = {
            "argv": argv,
            "env": dict(environ),
            "cwd": os.getcwd(),
            "prefix": sys.prefix,
            "script": [os.path.realpath(__file__), stat.st_size, stat.st_mtime_ns],
        }
    except OSError:
        return None
    # Our cwd goes as a descriptor too: the path may name another folder by
    # the time the server's child changes into it (a folder a sandboxed agent
    # swapped for a link out after its runner checked it). Linux only (O_PATH).
    cwd_fd = None
    if hasattr(os, "O_PATH"):
        try:
            cwd_fd = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return None  # no cwd to hand over (removed): the normal path says so
    try:
        served = forkserver_request(session, request, (0, 1, 2) if cwd_fd is None else (0, 1, 2, cwd_fd))
    finally:
        if cwd_fd is not None:
            os.close(cwd_fd)
    if served is None:
        return None  # nothing runs for us: the normal path runs the agent
    sock, pid, got = served

    signals = [int(getattr(_signal, name)) for name in FORWARDED_SIGNALS]
    _signal.pthread_sigmask(_signal.SIG_BLOCK, signals)
    # A background launch is over in a moment: standing in from here costs
    # less than starting the small interpreter that a long stand-in is worth.
    if "--background" not in argv:
        try:
            if not sys.executable:
                raise OSError("no interpreter to exec")
            sock.settimeout(None)  # blocking, as the loop reads it
            os.set_inheritable(sock.fileno(), True)
            loop = [str(sock.fileno()), str(pid), got.hex(), ",".join(map(str, signals))]
            os.execve(sys.executable, [sys.executable, "-I", "-S", "-c", STAND_IN_WAIT, *loop, *sys.argv], environ)
        except OSError:
            pass

    # Stand in from here, with the same loop.
    sock.settimeout(None)  # blocking, as the loop reads it
    scope: dict[str, Any] = {"__name__": "stand_in_wait"}
    exec(STAND_IN_WAIT, scope)
    scope["stand_in_wait"](sock.fileno(), pid, got, signals)
    return None  # not reached: the loop ends the process with the agent's exit code or signal


if __name__ == "__main__" and (_served := forkserver_stand_in(sys.argv[1:], os.environ)) is not None:
    sys.stdout.flush()
    os._exit(_served)


class _ImportedAtFirstUse(types.ModuleType):
    """A placeholder in sys.modules that imports the real module when one of its names is first read."""

    def __getattr__(self, attr: str) -> object:
        import importlib

        if sys.modules.get(self.__name__) is self:
            # pop, not del: another thread's first use may have taken it out
            # since the line above (the SDK imports on a thread of its own).
            sys.modules.pop(self.__name__, None)
        return getattr(importlib.import_module(self.__name__), attr)


def import_at_first_use(name: str) -> None:
    """Put a placeholder for a module in sys.modules that imports it at first use.

    `import name` then binds the placeholder, and reading any name of it imports
    the module. (importlib's LazyLoader doesn't do: `import` itself touches
    the module's __spec__, which loads it.)
    """
    if name not in sys.modules:
        sys.modules[name] = module = _ImportedAtFirstUse(name)
        parent, _, child = name.rpartition(".")
        if parent in sys.modules:  # `import a.b` finds b in sys.modules, then reads it as a's attribute
            setattr(sys.modules[parent], child, module)


# ------------------------------------------------------- imports at first use --
# After the stand-in, before the combined imports: a spawn that goes on from
# here binds psutil to a placeholder, and imports it at first use. It reads the
# /proc files it needs before its CLI starts itself (supervise/supervisor.py: "/proc, as
# psutil reads it"), so a root's CLI starts ~20 ms sooner.
import_at_first_use("psutil")
import_at_first_use("inspect")  # for dataclasses, which ask it only for a class with no docstring
import_at_first_use("hashlib")  # task graphs alone hash
