#!/usr/bin/env -S uv run --script
# /// script
# requires-python = ">=3.11"
# dependencies = [
#     "a2a-sdk>=1.3,<2",
#     "claude-agent-sdk>=0.2.180,<0.3",
#     "jsonschema>=4.23,<5",
#     "psutil>=6,<8",
#     "pyyaml>=6,<7",
# ]
#
# [tool.uv]
# exclude-newer = "2026-11-20T00:00:00Z"
# ///
"""spawn.py: run Claude agents that can start their own children, to any depth.

One self-contained script. Copy it next to your project and run::

    uv run spawn.py --task "Research auth patterns" --tools Read,Grep,Bash \\
        --model medium-tier --max-depth 3 --schema findings --output result.json

The agent runs through the claude-agent-sdk package. It sees only the tools it
was given, and its answer is validated against a JSON Schema. From its own Bash
tool it can run the same command to start children, which can start theirs.

Every agent lives in a directory on disk (the session protocol, documented in
sessions/README.md): who it is (meta.json), what happened (outcome.json), the
transcript, the CLI's stderr, and exactly one marker, ``.done`` or ``.fail``.

Verbs: ``wait``, ``status``, ``kill``, ``reap``, ``approve``, ``deny`` and
``agents`` read and act on that protocol; ``spawn.py VERB --help`` describes
each. ``--agent NAME`` runs a Claude Code agent definition from
.claude/agents; ``--agent a2a:URL`` a remote A2A agent and ``--agent
command:EXE`` an executable, as nodes of the same tree (the executors
section); ``--allow/--deny/--ask`` take Claude Code's permission rules.
``dag run FILE`` runs a task graph (blockedBy) as children of one runner agent;
``plan``, ``build``, ``explore``, ``run-plan-build`` and ``run-all`` run the
shipped workflows over a shared state file.
"""

from __future__ import annotations

__version__ = "0.1.0"

# ==================== begin src/spawnlib/standin.py ====================
# >>> stand-in: the fast-start hook runs from here to the end marker >>>


# --------------------------------------------------- fork server: stand-in --
# First in the file, before every other import: a nested spawn.py that a
# fork server will run costs only what runs up to here (see "fork server").
import os
import sys
import types




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
STAND_IN_WAIT = (  # src/spawnlib/programs/stand_in_wait.py, inlined by tools/bundle.py
    '"""A stand-in\'s wait for the agent its fork server forked: run by `python -I -S -c`, or exec\'d in-pr'
    'ocess.\n'
    '\n'
    'argv: socket fd, agent pid, what was already read (hex), signal numbers. It\n'
    'passes those signals on to the agent and ends as the agent did: its exit\n'
    'code, else the last signal it passed on, else SIGKILL.\n'
    '"""\n'
    '\n'
    "import _signal  # type: ignore[import-not-found]  # signal's C half: builtin, unlike signal\n"
    'import posix\n'
    'import sys\n'
    '\n'
    '\n'
    'def stand_in_wait(fd: int, pid: int, got: bytes, signals: "list[int]") -> None:\n'
    '    """Pass signals on to pid until its exit code (a line of JSON) arrives on fd, then end as it did'
    '."""\n'
    '    last = [9]\n'
    '\n'
    '    def forward(signum: int, frame: object) -> None:\n'
    '        last[0] = signum\n'
    '        try:\n'
    '            posix.kill(pid, signum)\n'
    '        except OSError:\n'
    '            pass\n'
    '\n'
    '    for signum in signals:\n'
    '        _signal.signal(signum, forward)\n'
    '    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, signals)\n'
    '    while b"\\n" not in got:\n'
    '        try:\n'
    '            chunk = posix.read(fd, 4096)\n'
    '        except OSError:\n'
    '            chunk = b""\n'
    '        if not chunk:\n'
    '            break\n'
    '        got += chunk\n'
    '    line = got.partition(b"\\n")[0].replace(b" ", b"")\n'
    '    if line.startswith(b\'{"exit":\') and line.endswith(b"}"):\n'
    '        try:\n'
    '            posix._exit(int(line[8:-1]))\n'
    '        except ValueError:\n'
    '            pass\n'
    '    if last[0] != 9:\n'
    '        _signal.signal(last[0], _signal.SIG_DFL)\n'
    '    posix.kill(posix.getpid(), last[0])\n'
    '    posix.kill(posix.getpid(), 9)\n'
    '\n'
    '\n'
    'if __name__ == "__main__":\n'
    '    stand_in_wait(int(sys.argv[1]), int(sys.argv[2]), bytes.fromhex(sys.argv[3]), [int(n) for n in s'
    'ys.argv[4].split(",")])\n'
)


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


def forkserver_request(session: str, request: dict[str, object], fds: tuple[int, int, int]) -> tuple[Any, int, bytes] | None:
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


def forkserver_stand_in(argv: list[str], environ: dict[str, str] | os._Environ[str]) -> int | None:
    """Have the session's fork server run this spawn; stay as its stand-in. Its exit code, or None.

    None means: no server, a dead or refusing one, or a spawn it doesn't take
    (verbs, dry runs, inside a sandbox): run the normal path, no error.
    The server forks a process that runs exactly what this one would have,
    with our argv, environment, cwd and stdio; its limits come from OUR
    ancestry (the server reads our pid from the socket). We stay alive as
    the agent's stand-in in our parent's process tree: signals are passed
    on, its exit code becomes ours, and if we are killed the socket closes
    and the agent ends itself the same way.
    """
    session = environ.get("SPAWN_SESSION")
    if environ.get(ENV_NO_FORKSERVER) == "1" or not session or not argv:
        return None
    if not (argv[0] in FORKED_VERBS or argv[0].startswith("-")) or {"--dry-run", "--help", "-h", "--version"} & set(argv):
        return None
    try:
        with open("/proc/1/cmdline", "rb") as fh:
            if os.path.basename(fh.read().split(b"\0")[0]) == b"bwrap":
                # In a parent's sandbox: the agent must stay inside it. (Its
                # seccomp filter refuses unix sockets anyway; the server
                # refuses a client from another pid namespace too.)
                return None
    except OSError:
        pass
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
    served = forkserver_request(session, request, (0, 1, 2))
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


# <<< end of the stand-in: forkserver_stand_in(argv, environ) -> int | None <<<
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
# /proc files it needs before its CLI starts itself (processes.py: "/proc, as
# psutil reads it"), so a root's CLI starts ~20 ms sooner.
import_at_first_use("psutil")
import_at_first_use("inspect")  # for dataclasses, which ask it only for a class with no docstring
import_at_first_use("hashlib")  # task graphs alone hash
# ==================== end src/spawnlib/standin.py ====================

# ==================== imports of every module ====================
import argparse
import collections
import contextlib
import dataclasses
import datetime as dt
import enum
import errno
import functools
import hashlib
import importlib
import importlib.machinery
import itertools
import json
import marshal  # builtin, loaded with the interpreter: status's forked workers answer in it
import math
import re
import select
import shlex
import shutil
import signal
import stat
import subprocess
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NoReturn, TypeAlias, TypeVar, TypedDict, Unpack, cast

import psutil  # imported at its first use (standin.py); jsonschema and the SDK lazily too

if TYPE_CHECKING:
    import importlib.abc
    import socket


# ==================== begin src/spawnlib/constants.py ====================






# ---------------------------------------------------------------- constants --

# The source file, also when the interpreter runs the compiled copy children
# get (compiled_script): the code's own file name survives compilation,
# __file__ would name the .pyc.
SCRIPT_PATH = Path(sys._getframe(0).f_code.co_filename).resolve()
SCRIPT_DIR = SCRIPT_PATH.parent


def project_dir(script: Path) -> Path:
    """Where the project's schemas/, workflows/ and sessions/ are: beside spawn.py.

    Installed as the package spawn (pyproject.toml), the script is
    site-packages/spawn/__init__.py, with no project beside it: the working
    directory's then, as a copy of spawn.py is run from beside them.
    """
    if script.name != "__init__.py":
        return script.parent
    try:
        return Path.cwd()
    except OSError:  # a working directory deleted under us
        return script.parent


PROJECT_DIR = project_dir(SCRIPT_PATH)
SCHEMA_DIR = PROJECT_DIR / "schemas"
DEFAULT_SESSION_ROOT = PROJECT_DIR / "sessions"

# Version of the on-disk records; bump when a field changes meaning.
PROTOCOL_VERSION = 1

# Environment variables: the only channel from a parent agent to the children
# its Bash starts. Documented in docs/environment.md.
ENV_SESSION_ROOT = "SPAWN_SESSION_ROOT"  # where root invocations create sessions
ENV_SESSION = "SPAWN_SESSION"  # the session directory a tree shares
ENV_AGENT_ID = "SPAWN_AGENT_ID"  # id of the agent whose Bash runs this command
ENV_DEPTH = "SPAWN_DEPTH"  # depth of that agent (root = 0)
ENV_MAX_DEPTH = "SPAWN_MAX_DEPTH"  # deepest depth the tree may reach
ENV_DEADLINE = "SPAWN_DEADLINE"  # absolute deadline, Unix seconds
ENV_BUDGET = "SPAWN_MAX_BUDGET_USD"  # that agent's budget, children get no more
ENV_TOOLS = "SPAWN_TOOLS"  # that agent's tools, children get a subset
ENV_TRACEPARENT = "SPAWN_TRACEPARENT"  # W3C traceparent of that agent
ENV_MODEL_TIERS = "SPAWN_MODEL_TIERS"  # "high-tier=ID,medium-tier=ID,..."
ENV_CLI = "SPAWN_CLI"  # path to a claude CLI instead of the bundled one
ENV_PYTHON = "SPAWN_PYTHON"  # interpreter children should use (set for the CLI)
ENV_SCRIPT = "SPAWN_PY"  # path of this script (set for the CLI)
ENV_HEARTBEAT = "SPAWN_HEARTBEAT_S"  # heartbeat period in seconds
ENV_DENY = "SPAWN_DENY"  # JSON list: deny rules every descendant inherits
ENV_ASK = "SPAWN_ASK"  # JSON list: ask rules every descendant inherits
ENV_PERMISSION_MODE = "SPAWN_PERMISSION_MODE"  # the agent's mode; children get no more
ENV_MODEL = "SPAWN_MODEL"  # the agent's model, for `model: inherit`
ENV_ASK_TIMEOUT = "SPAWN_ASK_TIMEOUT_S"  # seconds before an unanswered ask is denied
ENV_FULL_SDK_IMPORT = "SPAWN_FULL_SDK_IMPORT"  # 1: import the SDK with its mcp package
ENV_CACHE_DIR = "SPAWN_CACHE_DIR"  # per-user cache (CLI tool lists); default $XDG_CACHE_HOME/spawn
ENV_NO_CGROUP = "SPAWN_NO_CGROUP"  # 1: don't put trees in cgroups; fall back to the subreaper
ENV_IDLE_TIMEOUT = "SPAWN_IDLE_TIMEOUT_S"  # that agent's idle timeout; children get no longer
ENV_WAIT_POLL = "SPAWN_WAIT_POLL"  # 1: wait polls outcomes (a session directory other hosts write)
ENV_SPAWN_PLACEMENT = "SPAWN_PLACEMENT"  # ray:ADDRESS places agents on a Ray cluster (docs/cluster.md)
ENV_RAY_SIBLING = "SPAWN_RAY_SIBLING"  # path of tools/ray_place.py when it is not beside spawn.py
ENV_RAY_PYTHON = "SPAWN_RAY_PYTHON"  # a python with the sibling's lock installed (else `uv run --script`)
ENV_RAY_STANDIN = "SPAWN_RAY_STANDIN"  # set by the host actor: the stand-in pid a placed runner's meta.json names
RAY_SIBLING = "ray_place.py"
# Connecting to a cluster and starting an actor's worker takes seconds (a
# fresh worker imports Ray); past this the agent is not placed at all.
RAY_PLACE_TIMEOUT_S = 120.0
# OpenTelemetry's own variables: set, the root exports the tree's spans when it ends.
ENV_OTLP_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")

# Tiers are aliases the CLI itself resolves to the current model of each
# family, so the table does not go stale when models are released.
DEFAULT_MODEL_TIERS: dict[str, str] = {
    "high-tier": "opus",
    "medium-tier": "sonnet",
    "low-tier": "haiku",
}
DEFAULT_MODEL = "medium-tier"
# What --model accepts besides a tier: the CLI's own aliases (a [1m] suffix
# asks for the long context), and ids of the shapes Anthropic's API, Vertex
# (@version) and Bedrock (region.anthropic.…:N, ARNs) use. A typo like
# "opsu" would otherwise reach the CLI and fail only after the agent started.
CLI_MODEL_ALIASES = ("default", "opus", "sonnet", "haiku", "opusplan")
MODEL_ID_PATTERN = (
    r"(?:[a-z]{2,4}\.)?(?:anthropic\.)?claude-[a-z0-9][a-z0-9.\-]*(?:@[a-z0-9.\-]+|:[0-9]+)?(?:\[1m\])?"
    r"|(?:opus|sonnet|haiku)\[1m\]"
    r"|arn:aws:bedrock:\S+"
)

# Three levels below the root covers the deep workflows we know of; deeper
# trees must ask for it explicitly.
DEFAULT_MAX_DEPTH = 3

# Largest sane value of each number a user or a definition gives. Anything
# above is a typo (1e99 overflows timers) and is refused, not clamped.
MAX_SECONDS = 366 * 86400.0  # a deadline a year out is already "none"
MAX_BUDGET_USD = 1_000_000.0
MAX_COUNT = 1_000_000  # turns, agents
MAX_TOKENS = 100_000_000  # a context window; 100x today's largest is a typo
MAX_CONCURRENT = 10_000
MAX_DEPTH_LIMIT = 1000

# Read-only by default: Bash (and so nesting) must be asked for.
DEFAULT_TOOLS = ("Read", "Grep", "Glob")

# Built-in tool names of Claude Code; MCP tools are accepted as mcp__server__tool.
# A seed only: the tools the CLI reports in its init message are cached per CLI
# version (remember_cli_tools) and added to these, so new tools aren't unknown.
KNOWN_TOOLS = frozenset(
    {
        "Agent", "AskUserQuestion", "Bash", "BashOutput", "CronCreate", "CronDelete", "CronList", "DesignSync",
        "Edit", "EnterPlanMode", "EnterWorktree", "ExitPlanMode", "ExitWorktree", "Glob", "Grep",
        "KillShell", "LS", "ListAgents", "ListMcpResourcesTool", "LSP", "Monitor", "MultiEdit",
        "NotebookEdit", "NotebookRead", "Read", "ReadMcpResourceTool", "ReportFindings", "ScheduleWakeup",
        "SendMessage", "Skill", "SlashCommand", "Task", "TaskCreate", "TaskGet", "TaskList",
        "TaskOutput", "TaskStop", "TaskUpdate", "TodoWrite", "ToolSearch", "WebFetch",
        "WebSearch", "Workflow", "Write",
    }
)  # fmt: skip

# Legacy tool names Claude Code still accepts, and the name it uses now. A
# name is canonicalised wherever it is read (tools, disallowed tools, rules),
# so `--deny 'Task(*)'` also stops `Agent`.
TOOL_ALIASES: dict[str, str] = {"Task": "Agent", "KillShell": "TaskStop"}

# Claude Code's agent frontmatter (CLI 2.1.x), and what spawn.py adds to it
# (docs/agents.md has one row per field).
CLAUDE_AGENT_FIELDS = frozenset(
    {
        "name", "description", "tools", "disallowedTools", "model", "permissionMode", "mcpServers",
        "hooks", "maxTurns", "skills", "memory", "background", "effort", "isolation", "color",
        "initialPrompt", "omitClaudeMd", "autoCompactWindow",
    }
)  # fmt: skip
SPAWN_AGENT_FIELDS = frozenset({"schema", "max_depth", "timeout", "max_budget_usd", "permissions", "kind", "url", "command"})
EFFORT_LEVELS = ("low", "medium", "high", "xhigh", "max")
MEMORY_SCOPES = ("user", "project", "local")
PERMISSION_KINDS = ("allow", "deny", "ask")

# From most to least restrictive; a child's mode is never further down than
# its parent's. "auto" lets a classifier approve calls, so it ranks with
# acceptEdits; bypassPermissions only where the root had it.
PERMISSION_MODES = ("plan", "dontAsk", "default", "acceptEdits", "auto", "bypassPermissions")
PERMISSION_RANK = {"plan": 0, "dontAsk": 1, "default": 2, "acceptEdits": 3, "auto": 3, "bypassPermissions": 4}
# Nobody answers a prompt in a nested agent: what isn't granted is denied.
DEFAULT_PERMISSION_MODE = "dontAsk"
# --sandbox: auto puts the Bash of agents below the root in Claude Code's
# sandbox (they run commands a model wrote); the root is the user's own call.
SANDBOX_CHOICES = ("on", "off", "auto")
# What Linux needs for Claude Code's sandbox, and how Debian/Ubuntu install it.
# macOS needs only sandbox-exec (Seatbelt), which ships with it.
SANDBOX_PROGRAMS = ("bwrap", "socat")
SANDBOX_INSTALL = "apt-get install bubblewrap socat"
SANDBOX_MACOS_PROGRAM = "sandbox-exec"
# What an agent's Bash loses when --sandbox auto can't sandbox it (docs/guarantees.md
# threat model): said once on the root's stderr and in each such meta.json.
SANDBOX_LOST = (
    "their Bash runs as you, so it can write outside their allowed paths, "
    "write the session's records other agents trust (outcomes, the ledger), "
    "and start processes outside their tree"
)
# Where the CLI talks to when ANTHROPIC_BASE_URL is unset: a nested spawn in
# Bash must still reach it through the sandbox's proxy.
DEFAULT_API_HOST = "api.anthropic.com"

# Tools a file rule of Claude Code's covers: Read rules cover the tools that
# read files, Edit rules the ones that change them.
READ_TOOLS = frozenset({"Read", "Grep", "Glob", "LS", "NotebookRead"})
EDIT_TOOLS = frozenset({"Edit", "Write", "MultiEdit", "NotebookEdit"})

# An `ask` nobody answers is denied after this long (or at the deadline).
ASK_TIMEOUT_S = 300.0
ASK_POLL_S = 0.1

# Claude Code shows an agent the first 200 lines of its MEMORY.md.
MEMORY_HEAD_LINES = 200

# Routing: below this BM25 score (about one distinctive word matched) the task
# goes to the default agent. K1 and B are BM25's usual term-frequency
# saturation and length normalisation.
ROUTE_THRESHOLD = 1.5
ROUTE_K1 = 1.2
ROUTE_B = 0.75
ROUTE_NAME_WEIGHT = 1.5  # a word of the agent's name counts this much more
# Words that say nothing about which agent fits, including the boilerplate of
# public collections' <example> blocks (user:, assistant:, commentary:).
ROUTE_STOPWORDS = frozenset(
    "a about after all also an and any are as ask asks assistant at be been before but by can commentary context "
    "could do does done each example examples for from get has have help here how i if in into is it its just launch "
    "let like ll make me more my need needs new now of on one or our out please proactively should so some such "
    "sure task tasks than that the their them then there these they this to tool use used user uses using via want "
    "wants we what when where which while who why will with work would you your agent agents "
    # Words that say nothing of a task's field: "Say hello" is for the default agent.
    "not no nor never say says said tell hello hi hey thanks thank".split()
)


# A parent reads a child's stdout into its context window: keep it bounded.
# 16 KiB is about 4k tokens, enough for a structured result, small enough to
# read a dozen children. The full output is always in outcome.json.
STDOUT_OUTPUT_LIMIT = 16 * 1024

# A parent needs time after its child's deadline to read the result and answer.
PARENT_GRACE_S = 5.0

# Between SIGTERM and SIGKILL: long enough for spawn.py to commit an outcome
# and end its own subtree (which itself waits this long), short enough that a
# kill feels immediate.
KILL_GRACE_S = 3.0

# Between SIGTERM and SIGKILL for what is not a live agent's spawn.py (a CLI
# whose spawn.py is gone, its tools, leftovers after a normal end): nothing
# there commits an outcome, so it only gets a moment to flush and exit.
LEFTOVER_GRACE_S = 1.0

# A tree's cgroup is named spawn-SESSION-AGENT, so trees of different
# sessions (and users of one machine) never share one, and the name says who
# made it. After cgroup.kill the kernel empties it within milliseconds; the
# limit only bounds a guard facing a process stuck in the kernel (D state).
CGROUP_PREFIX = "spawn-"
CGROUP_EMPTY_WAIT_S = 5.0

# How often `wait` looks for outcomes and how often it checks that the
# processes it waits for still exist (2 s target). Where the kernel tells
# wait of process exits (pidfd) and new files (inotify), liveness is only
# polled for what it can't watch.
# Outcomes: a few pending agents are polled often, each poll reading one
# small file per agent (~10 us), which beats inotify for latency: the kernel
# waits out an RCU grace period (6-12 ms measured) when a process holding
# watches exits, and a parent waits for that exit. The period grows by
# WAIT_POLL_PER_AGENT_S per agent, so CPU stays flat (<3% of a core); past
# WAIT_POLL_BATCH agents, inotify is used instead and costs ~0 while idle.
WAIT_POLL_S = 0.005
WAIT_POLL_PER_AGENT_S = 0.0004
WAIT_POLL_BATCH = 50
WAIT_POLL_MAX_S = 1.0
LIVENESS_POLL_S = 0.5
LIVENESS_POLL_MAX_S = 2.0
# With events, every pending outcome is still re-read now and then, in case
# an event was lost; the period doubles up to the cap (a missed event then
# costs at most that long, never a hang).
WAIT_RESCAN_S = 1.0
WAIT_RESCAN_MAX_S = 8.0
# Agents' heartbeats wake wait too (a file renamed into their directory):
# after a wake that brought nothing, wait lets such events pile up this long,
# so a thousand beating agents cost 20 wakes a second, not hundreds (only
# waits over WAIT_POLL_BATCH agents watch). A marker that lands meanwhile
# is seen at most this late.
WAIT_NOISE_HOLDOFF_S = 0.05

# Heartbeat refresh period (SPAWN_HEARTBEAT_S overrides it, e.g. in tests);
# an agent is stale after 6 missed beats: long enough to ride out a busy
# machine, short enough that `wait` doesn't sit on a wedged agent for long.
HEARTBEAT_S = 5.0
HEARTBEAT_STALE_BEATS = 6

# The Bash tool's default 2-minute command timeout would kill nested spawns
# that take longer; spawn.py enforces its own deadlines instead.
BASH_TIMEOUT_MS = "3600000"

# Without a deadline, a spawn waits at most this long for a --max-concurrent
# slot; then it ends with status timeout rather than waiting forever.
SLOT_WAIT_S = 600.0
SLOT_POLL_S = 0.2

# A background runner waits this long for its launcher to register it.
REGISTER_WAIT_S = 10.0

# A root given no --timeout still ends: an hour covers the long workflows we
# know of, and a stuck tree costs at most that. `--timeout 0` means none.
DEFAULT_ROOT_TIMEOUT_S = 3600.0

# An agent whose CLI wrote no transcript event and used no CPU for this long
# is stalled (a hung model stream, a stopped process): it is ended. Five
# minutes is longer than any model turn or quiet tool call we have seen.
IDLE_TIMEOUT_S = 300.0
# An idle node process still ticks: below this share of one core, the CLI's
# process group counts as using no CPU.
IDLE_CPU_SHARE = 0.02
# How often the idle watch looks (at most; shorter for short idle timeouts).
IDLE_CHECK_S = 5.0

# USD per million tokens (input, output), to estimate what an agent spent when
# it ended without the CLI's own total (killed, timed out, died). List prices
# of each family; a model the table doesn't name is priced as medium-tier,
# which is also what the CLI charges for a model it doesn't know. Cache reads
# cost 0.1x input and cache writes 1.25x, as on the API.
MODEL_PRICES_USD_PER_MTOK: dict[str, tuple[float, float]] = {
    "opus": (5.0, 25.0),
    "sonnet": (3.0, 15.0),
    "haiku": (1.0, 5.0),
}
FALLBACK_PRICE_FAMILY = "sonnet"
CACHE_READ_FACTOR = 0.1
CACHE_WRITE_FACTOR = 1.25
CACHE_WRITE_1H_FACTOR = 2.0  # a write kept for an hour (cache_control ttl "1h")
# The token counts usage records carry (outcome, ledger, status), each priced differently.
USAGE_COUNTS = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")

# The header above an agent's own facts (id, deadline, time left, budget) in its
# first message, after its task. They differ from sibling to sibling, so they stay
# out of the system prompt: tools and system prompt are the head the CLI marks for
# the prompt cache, which siblings then share byte for byte. tools/mock_model.py
# keys its scripted retries on the text before this header.
AGENT_FACTS_HEADER = "## spawn.py: this agent"
# `estimate`: tokens of the head (tool definitions, system prompt, briefing) that
# the tasks of one fan-out share in the prompt cache. Roughly Claude Code's
# definitions of a few tools plus spawn.py's system prompt; the first task of the
# level writes it (1.25x), the others read it (0.1x). Applied to default
# estimates only: a median of ended agents already holds what their reads saved.
FANOUT_HEAD_TOKENS = 3_000
# Task options that change neither tools nor system prompt: tasks of a level
# that differ only in these send the same head.
HEAD_NEUTRAL_OPTIONS = frozenset({"timeout", "max_budget_usd", "topic", "output", "idle_timeout"})

# What one agent is expected to cost, by price family, when the session has no
# ended agent of that family to take a median from (--confirm-over, `estimate`).
# Roughly a short agent's few turns (~40k input, ~4k output tokens, much of it
# cache reads) at MODEL_PRICES_USD_PER_MTOK, rounded up: an estimate that errs
# high asks a person once too often, one that errs low lets a fan-out through.
DEFAULT_AGENT_COST_USD: dict[str, float] = {
    "haiku": 0.02,
    "sonnet": 0.10,
    "opus": 0.50,
}
# And how long it takes, for a graph's critical path: a few model turns and
# tool calls. Per-session medians replace it with `estimate --session`.
DEFAULT_AGENT_SECONDS = 60.0

# A budget hold smaller than this can't pay for one turn: admission refuses
# rather than start an agent that is stopped by its first answer.
MIN_HOLD_USD = 0.01

# The OTLP exporter is a sibling with its own dependencies (tools/), run once
# per tree by the root; a collector that hangs must not hold the root for long.
OTEL_EXPORTER = Path("tools") / "otel_export.py"
OTEL_EXPORT_TIMEOUT_S = 120.0

# `status --watch` redraws twice a second: live enough to see a state change
# at once, and each redraw only reads a few small files per agent.
WATCH_REFRESH_S = 0.5

DEFAULT_SYSTEM_PROMPT = """\
You are an agent started by spawn.py to do one task. Work with the tools you \
have, do not ask questions (nobody is watching), and keep the final answer \
short and factual. When an output schema is set, give your final answer by \
calling the StructuredOutput tool exactly once."""

# Environment variable names whose values are secrets. Values of these (and of
# any variable whose name looks secret) are scrubbed from every record.
SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL)", re.IGNORECASE)
SECRET_PATTERN = re.compile(r"sk-ant-[A-Za-z0-9_\-]{8,}")
SECRET_MIN_LEN = 8  # shorter values are too likely to match ordinary text
REDACTED = "[REDACTED]"

# ------------------------------------------------------- on-disk protocol --

META = "meta.json"
OUTCOME = "outcome.json"
SCRATCH_DIR = "scratch"  # a sandboxed leaf's own writable directory, its records beside it read-only
# refused/<leaf id>/: a sandboxed leaf's refused spawns, each <child id>.json,
# until the leaf's runner, outside the sandbox, records them in agents/.
REFUSED_DIR = "refused"
# requests/<agent id>/: a sandboxed spawner's drop box. The spawn.py in its
# Bash leaves each spawn or kill there as a request; its runner, outside the
# sandbox, runs it as its own agent's and writes the reply beside it (broker).
REQUESTS_DIR = "requests"
# What a leaf's runner takes from its drop box: a hostile leaf gets no more
# agent directories than this, nor bigger records, by writing there.
DROPPED_REFUSALS_MAX = 64
DROPPED_REFUSAL_MAX_BYTES = 256 * 1024
DROP_BOX_POLL_S = 1.0  # a listing of a directory that is nearly always empty
OUTCOME_KEPT = "outcome.kept.json"  # the runner's own, when outcome.json turned out not to be an outcome
TRANSCRIPT = "transcript.jsonl"
STDERR_LOG = "stderr.log"
# An agent's transcript and stderr.log each stop growing at this size: a
# flooding peer or process can't fill the disk (a remote A2A agent's endless
# status updates wrote 379 MB in 20 s). Far above a long agent's transcript;
# SPAWN_TRANSCRIPT_MAX_BYTES sets it lower, never higher.
LOG_MAX_BYTES = 64 * 1024 * 1024
ENV_LOG_MAX = "SPAWN_TRANSCRIPT_MAX_BYTES"
TRUNCATED_LINE = "TranscriptTruncated"  # the transcript's last line once it reached the cap
NATIVE_LOG = "native.jsonl"  # Claude Code's own subagents (the Agent tool) started by this agent
HEARTBEAT = "heartbeat.json"
PAUSED = "paused.json"  # while an agent waits at its budget (--on-budget pause; docs/steering.md)
# Written by `spawn.py kill` before its SIGTERM: the runner's outcome then
# says who ended it, which a signal alone can't tell it.
KILL_REQUEST = "kill.json"
RUNNER_LOG = "runner.log"
SESSION_INFO = "session.json"
LIMITS = "limits.json"
LEDGER = "ledger.jsonl"
SESSION_LOCK = ".lock"
SLOT_MARKER = ".slot"


# Deepest nesting of any JSON or YAML spawn.py parses. The parser recurses
# once per level (RecursionError near 1,000, sooner on a deep stack), and so
# does whatever walks the value after it (jsonschema, json.dumps): 64 is
# deeper than any record, schema or task graph, and far from either limit.
JSON_MAX_DEPTH = 64
# Largest record read: an outcome's output or a transcript line is at most a
# few MiB (SDK_MAX_MESSAGE); a bigger file is junk, and never read into memory.
RECORD_MAX_BYTES = 64 << 20
# Largest YAML or JSON input a user gives (a task graph, a schema, an agent's
# frontmatter): hand-written files are KiBs.
INPUT_MAX_BYTES = 4 << 20
# YAML aliases share one node in the parsed document, but whatever walks it
# (variables, json.dumps) meets every copy: "billion laughs" is a few lines
# that expand to 10**9 nodes. A document may expand to this many at most.
YAML_MAX_NODES = 1_000_000

SLOT_LENT = ".slot-lent"
# ==================== end src/spawnlib/constants.py ====================

# ==================== begin src/spawnlib/programs/fast_start_hook.py ====================
"""Written by spawn.py (docs/benchmarks.md: "Fast start"); SPAWN_NO_FAST_START=1 turns it off.

Runs at every interpreter start in this environment, from _spawn_fast_start.pth.
If the script on the command line has a compiled copy in spawn.py's cache,
run that copy instead of compiling the source: in this interpreter once site
has finished, else by exec'ing the same interpreter on it.
Remove _spawn_fast_start.pth to remove it.
"""

# spawn.py runs this module's code too (bundled, as src/spawnlib/programs/fast_start_hook.py):
# the cache's place, a copy's name and the trust in a copy are defined here
# alone. Builtin modules only: for every other program in the environment it
# costs a look at sys.argv, or for a .py file one read and a few stats.





FAST_START_MODULE = "_spawn_fast_start"  # this file's name in site-packages, and its .pth's
ENV_NO_FAST_START = "SPAWN_NO_FAST_START"  # 1: neither install nor use the hook
# A copy is named by the source's path and bytes: the path because the code
# finds schemas/ and sessions/ beside the file it was compiled from, so two
# projects' identical copies must not share one.
COMPILED_DIR = "compiled"
COMPILED_HASH_KEY = 0x7370_6177_6E  # any fixed key: the name carries the cache tag too
# A copy is run or handed out only when copy_is_trusted: the cache folder and
# the copy are the user's and nobody else's to replace, the copy is a regular
# file, and its header says it was compiled from the source's own bytes (a
# checked-hash pyc, PEP 552): the name alone is no proof, as any file can be
# put at a name. The header is no signature either: what keeps a forged copy
# out is that no contained agent can write the cache (docs/guarantees.md).
COMPILED_MODE_FORBIDDEN = 0o022  # group- or other-writable: another user's to replace
PYC_CHECKED_HASH = (3).to_bytes(4, "little")  # PEP 552 flags: hash-based, checked against the source
# spawn.py's own names for these, which this file can't import when it runs
# as the hook (test_fast_start checks they agree).
HOOK_ENV_CACHE_DIR = "SPAWN_CACHE_DIR"  # ENV_CACHE_DIR
HOOK_ENV_SESSION = "SPAWN_SESSION"  # ENV_SESSION
HOOK_ENV_NO_FORKSERVER = "SPAWN_NO_FORKSERVER"  # ENV_NO_FORKSERVER
HOOK_FORKSERVER_SOCKET = "forkserver.sock"  # FORKSERVER_SOCKET
# For a nested spawn, the hook runs spawn.py's stand-in itself, from the
# script's own bytes: when the session's fork server takes the spawn, no second
# interpreter starts to load the copy (~20 ms a level). tools/bundle.py writes
# these two lines around the stand-in's code, which defines
# forkserver_stand_in(argv, environ) -> exit code or None; a spawn.py without
# them (another version's) is run as a copy only. A later version that changes
# the contract changes the markers.
STAND_IN_BEGIN = b"\n# >>> stand-in: the fast-start hook runs from here to the end marker >>>\n"
STAND_IN_END = b"\n# <<< end of the stand-in: forkserver_stand_in(argv, environ) -> int | None <<<\n"
ANNOTATIONS_FLAG = 0x1000000  # __future__.annotations.compiler_flag: the stand-in's own future import


def cache_folder(environ: "dict[str, str] | os._Environ[str]") -> str:
    """The per-user cache: $SPAWN_CACHE_DIR, else $XDG_CACHE_HOME/spawn, else ~/.cache/spawn."""
    if environ.get(HOOK_ENV_CACHE_DIR):
        return os.path.expanduser(environ[HOOK_ENV_CACHE_DIR])
    base = environ.get("XDG_CACHE_HOME") or os.path.join(environ.get("HOME") or os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.expanduser(base), "spawn")


def compiled_name(path: "str | os.PathLike[str]", source: bytes) -> str:
    """The file name of the compiled copy of the spawn.py at path (resolved) with these bytes."""
    import _imp

    digest = _imp.source_hash(COMPILED_HASH_KEY, os.fsencode(path) + b"\0" + source).hex()
    return "spawn-" + digest + "." + str(sys.implementation.cache_tag) + ".pyc"


def pyc_header(source: bytes) -> bytes:
    """The 16-byte header of a copy compiled from source: magic, checked-hash flags, the source's hash."""
    import _frozen_importlib_external as bootstrap
    import _imp

    magic = bootstrap.MAGIC_NUMBER
    return magic + PYC_CHECKED_HASH + _imp.source_hash(int.from_bytes(magic, "little"), source)


def copy_is_trusted(folder: "str | os.PathLike[str]", copy: "str | os.PathLike[str]", source: bytes) -> bool:
    """Ours, a regular file (not a link), nobody else's to replace, and compiled from source.

    The copy is opened without following a link, and its owner and mode are
    read from that open file, so what is checked is what was read."""
    try:
        fd = os.open(copy, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        for st in (os.stat(folder), os.fstat(fd)):
            if st.st_uid != os.getuid() or st.st_mode & COMPILED_MODE_FORBIDDEN:
                return False
        header = os.read(fd, 16) if stat.S_ISREG(st.st_mode) else b""
    except OSError:
        return False
    finally:
        os.close(fd)
    return header == pyc_header(source)


def compiled_copy(script: str, environ: "dict[str, str] | os._Environ[str]") -> "tuple[str, bytes] | None":
    """The compiled copy to run for script, and the script's bytes; or None."""
    if not script.endswith(".py") or environ.get(ENV_NO_FAST_START) == "1" or sys.flags.optimize:
        return None
    try:
        path = os.path.realpath(script)
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None  # a FIFO's bytes are the script's: Python must read them, not us
        with open(path, "rb") as fh:
            source = fh.read()
        folder = os.path.join(cache_folder(environ), COMPILED_DIR)
        copy = os.path.join(folder, compiled_name(path, source))
    except (OSError, ValueError):
        return None
    # A planted or stale copy is never run: the source runs instead.
    return (copy, source) if copy_is_trusted(folder, copy, source) else None


def hook_stand_in(copy: str, source: bytes) -> None:
    """Hand this spawn to its session's fork server from here, as the copy's
    first lines would: the same code, compiled from the script's own bytes
    (its stand-in, between the markers), minus an interpreter's start.
    Returns only if the server doesn't take it (none, a refusal, a verb it
    doesn't run): then the copy runs, and asks again itself.
    """
    start = source.find(STAND_IN_BEGIN)
    end = source.find(STAND_IN_END, start)
    if start < 0 or end < 0:
        return
    try:
        # The file's own future import, and its own line numbers in a traceback.
        code = compile(b"\n" * source.count(b"\n", 0, start) + source[start:end], sys.argv[0], "exec", ANNOTATIONS_FLAG, True)
        scope: dict[str, object] = {"__name__": FAST_START_MODULE + ".stand_in", "__file__": copy}
        exec(code, scope)
        ask = scope["forkserver_stand_in"]
    except Exception:
        return
    if not callable(ask):
        return
    try:
        served = ask(sys.argv[1:], os.environ)
    except BaseException:
        # As an error in the copy's first lines ends it: never a second try
        # at a spawn that may already be running.
        import traceback

        traceback.print_exc()
        os._exit(1)
    if isinstance(served, int):
        os._exit(served)


def run_at_file_start(copy: str, source: bytes) -> bool:
    """Have this interpreter run the copy where it would run the script; False
    where that can't be arranged, and the caller execs the copy instead.

    Python raises the audit event cpython.run_file once it has started up
    (site done: every .pth file, sitecustomize) and holds no import lock: the
    hook runs the copy there and exits, so no second interpreter starts (~20
    ms a spawn). Not for -i, which wants the interpreter after the script.
    """
    if sys.flags.inspect or sys.flags.interactive or "__main__" not in sys.modules:
        return False
    header = pyc_header(source)
    pending = [copy]

    def at_event(event: str, args: tuple[object, ...]) -> None:
        if event == "cpython.run_file" and pending:
            run_copy(pending.pop(), header)  # returns only if the copy changed since: the script runs instead

    sys.addaudithook(at_event)  # for the process's life, as every audit hook: one comparison an event
    return True


def run_copy(copy: str, header: bytes) -> None:
    """Run the copy as `python COPY ARGS` would, then exit as it would: never
    returns, unless the copy's header is no longer the one that was trusted."""
    import marshal

    try:
        with open(copy, "rb") as fh:
            data = fh.read()
        if data[:16] != header:
            return
        code = marshal.loads(memoryview(data)[16:])
    except (OSError, ValueError, EOFError, TypeError):
        return
    sys.argv[0] = copy
    if not sys.flags.safe_path and sys.path:
        # The copy's folder, as `python COPY` has it, not the script's: a
        # project's own mcp/ or anyio/ beside spawn.py never shadows a dependency.
        sys.path[0] = os.path.dirname(copy)
    import _frozen_importlib_external as bootstrap

    scope = sys.modules["__main__"].__dict__
    scope.update(__file__=copy, __cached__=None, __loader__=bootstrap.SourcelessFileLoader("__main__", copy))
    status, interrupted = 0, False
    try:
        exec(code, scope)
    except SystemExit as exc:
        status = exit_status(exc.code)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        status, interrupted = 130, True
    except BaseException:
        sys.excepthook(*sys.exc_info())
        status = 1
    finish(status, interrupted)


def exit_status(code: object) -> int:
    """SystemExit's code as Python's exit status: None 0, an int itself, anything else printed and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def finish(status: int, interrupted: bool) -> None:
    """End as the interpreter would after the script: threads joined, atexit
    run, streams flushed; a KeyboardInterrupt's end is by SIGINT."""
    import atexit

    if "threading" in sys.modules:
        sys.modules["threading"]._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            continue
    if interrupted:  # as Python ends on an uncaught one: by SIGINT
        import _signal  # type: ignore[import-not-found,unused-ignore]

        _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
        os.kill(os.getpid(), _signal.SIGINT)
    os._exit(status & 0xFF)


def hook_main() -> None:
    argv = list(getattr(sys, "orig_argv", ()))
    at = len(argv) - len(sys.argv)
    # Only where exec keeps the pid: the process is its parent's child and an agent's stand-in.
    if os.name != "posix" or not sys.argv or at < 1 or argv[at] != sys.argv[0] or not sys.executable:
        return
    found = compiled_copy(sys.argv[0], os.environ)
    if found is None:
        return
    copy, source = found
    session = os.environ.get(HOOK_ENV_SESSION)  # a nested spawn's; compile nothing for a root or a session with no server
    if session and os.environ.get(HOOK_ENV_NO_FORKSERVER) != "1" and os.path.exists(os.path.join(session, HOOK_FORKSERVER_SOCKET)):
        hook_stand_in(copy, source)
    if run_at_file_start(copy, source):
        return
    import _signal  # type: ignore[import-not-found,unused-ignore]  # signal's C half: builtin (spawn.py's stand-in imports it too)

    # Python ignores these at start; the new interpreter does it again, and a
    # failed exec puts them back as they were.
    saved = [(n, _signal.signal(n, _signal.SIG_DFL)) for n in (_signal.SIGPIPE, _signal.SIGXFSZ)]
    try:
        os.execv(sys.executable, [*argv[:at], copy, *argv[at + 1 :]])
    except OSError:
        for n, handler in saved:
            _signal.signal(n, handler)


if __name__ == FAST_START_MODULE:  # as the hook; spawn.py only uses the functions above
    hook_main()
# ==================== end src/spawnlib/programs/fast_start_hook.py ====================

# ==================== begin src/spawnlib/embedded.py ====================


# --------------------------------------------------------- built-in files --

# spawn.py copied alone into a project must still run README's commands, so it
# carries the default output schemas (schemas/*.json but RECORD_SCHEMAS), agent
# definitions (.claude/agents/*.md) and workflows (workflows/*.yaml). A file of
# the project's own wins: schemas/ beside the script, .claude/agents upward
# from the working directory or in HOME, workflows/ beside the script.


def builtin_files(folder: str) -> dict[str, str]:
    """The built-in files of folder (schemas, .claude/agents, workflows): file name -> text."""
    prefix = folder.rstrip("/") + "/"
    return {path.removeprefix(prefix): text for path, text in BUILTIN_FILES.items() if path.startswith(prefix)}


def builtin_label(path: str) -> str:
    """How messages and records name a built-in file: what to create to override it."""
    return f"built-in {path}"


# Repository path -> text. tools/bundle.py writes it into spawn.py from the
# files themselves, which stay the only copy to edit; in the package, which
# is never run, it stays empty. This assignment must stay the module's last.
BUILTIN_FILES: dict[str, str] = {
    'schemas/build.json': (
        '{\n'
        '  "$schema": "https://json-schema.org/draft/2020-12/schema",\n'
        '  "$id": "spawn.py/build.json",\n'
        '  "title": "The result of a build or change",\n'
        '  "type": "object",\n'
        '  "required": [\n'
        '    "status",\n'
        '    "summary"\n'
        '  ],\n'
        '  "properties": {\n'
        '    "status": {\n'
        '      "enum": [\n'
        '        "success",\n'
        '        "partial",\n'
        '        "failed"\n'
        '      ]\n'
        '    },\n'
        '    "summary": {\n'
        '      "type": "string"\n'
        '    },\n'
        '    "files_changed": {\n'
        '      "type": "array",\n'
        '      "items": {\n'
        '        "type": "string"\n'
        '      }\n'
        '    },\n'
        '    "tests": {\n'
        '      "type": "string"\n'
        '    }\n'
        '  },\n'
        '  "additionalProperties": false\n'
        '}\n'
    ),
    'schemas/design.json': (
        '{\n'
        '  "$schema": "https://json-schema.org/draft/2020-12/schema",\n'
        '  "$id": "spawn.py/design.json",\n'
        '  "title": "A software design",\n'
        '  "type": "object",\n'
        '  "required": [\n'
        '    "summary",\n'
        '    "components",\n'
        '    "decisions"\n'
        '  ],\n'
        '  "properties": {\n'
        '    "summary": {\n'
        '      "type": "string"\n'
        '    },\n'
        '    "components": {\n'
        '      "type": "array",\n'
        '      "items": {\n'
        '        "type": "object",\n'
        '        "required": [\n'
        '          "name",\n'
        '          "responsibility"\n'
        '        ],\n'
        '        "properties": {\n'
        '          "name": {\n'
        '            "type": "string"\n'
        '          },\n'
        '          "responsibility": {\n'
        '            "type": "string"\n'
        '          },\n'
        '          "interfaces": {\n'
        '            "type": "array",\n'
        '            "items": {\n'
        '              "type": "string"\n'
        '            },\n'
        '            "description": "Functions, APIs, messages or files through which others use it."\n'
        '          }\n'
        '        },\n'
        '        "additionalProperties": false\n'
        '      }\n'
        '    },\n'
        '    "decisions": {\n'
        '      "type": "array",\n'
        '      "items": {\n'
        '        "type": "object",\n'
        '        "required": [\n'
        '          "decision",\n'
        '          "rationale"\n'
        '        ],\n'
        '        "properties": {\n'
        '          "decision": {\n'
        '            "type": "string"\n'
        '          },\n'
        '          "rationale": {\n'
        '            "type": "string"\n'
        '          },\n'
        '          "alternatives": {\n'
        '            "type": "array",\n'
        '            "items": {\n'
        '              "type": "string"\n'
        '            }\n'
        '          }\n'
        '        },\n'
        '        "additionalProperties": false\n'
        '      }\n'
        '    },\n'
        '    "risks": {\n'
        '      "type": "array",\n'
        '      "items": {\n'
        '        "type": "string"\n'
        '      }\n'
        '    }\n'
        '  },\n'
        '  "additionalProperties": false\n'
        '}\n'
    ),
    'schemas/diagnosis.json': (
        '{\n'
        '  "$schema": "https://json-schema.org/draft/2020-12/schema",\n'
        '  "$id": "spawn.py/diagnosis.json",\n'
        '  "title": "A bug diagnosis",\n'
        '  "type": "object",\n'
        '  "required": [\n'
        '    "symptom",\n'
        '    "root_cause",\n'
        '    "evidence",\n'
        '    "confidence"\n'
        '  ],\n'
        '  "properties": {\n'
        '    "symptom": {\n'
        '      "type": "string",\n'
        '      "description": "What goes wrong, as observed or reproduced."\n'
        '    },\n'
        '    "root_cause": {\n'
        '      "type": "string",\n'
        '      "description": "Why it goes wrong, naming the file and code responsible."\n'
        '    },\n'
        '    "evidence": {\n'
        '      "type": "array",\n'
        '      "items": {\n'
        '        "type": "string"\n'
        '      },\n'
        '      "description": "Reproductions, log lines, code references and experiments that support the roo'
        't cause."\n'
        '    },\n'
        '    "fix": {\n'
        '      "type": "string",\n'
        '      "description": "The change that would remove the root cause (or was made, if allowed)."\n'
        '    },\n'
        '    "confidence": {\n'
        '      "enum": [\n'
        '        "low",\n'
        '        "medium",\n'
        '        "high"\n'
        '      ]\n'
        '    }\n'
        '  },\n'
        '  "additionalProperties": false\n'
        '}\n'
    ),
    'schemas/docs.json': (
        '{\n'
        '  "$schema": "https://json-schema.org/draft/2020-12/schema",\n'
        '  "$id": "spawn.py/docs.json",\n'
        '  "title": "A documentation change",\n'
        '  "type": "object",\n'
        '  "required": [\n'
        '    "summary",\n'
        '    "files_changed"\n'
        '  ],\n'
        '  "properties": {\n'
        '    "summary": {\n'
        '      "type": "string"\n'
        '    },\n'
        '    "files_changed": {\n'
        '      "type": "array",\n'
        '      "items": {\n'
        '        "type": "string"\n'
        '      }\n'
        '    },\n'
        '    "gaps": {\n'
        '      "type": "array",\n'
        '      "items": {\n'
        '        "type": "string"\n'
        '      },\n'
        '      "description": "What is still undocumented, unclear or could not be verified."\n'
        '    }\n'
        '  },\n'
        '  "additionalProperties": false\n'
        '}\n'
    ),
    'schemas/findings.json': (
        '{\n'
        '  "$schema": "https://json-schema.org/draft/2020-12/schema",\n'
        '  "$id": "spawn.py/findings.json",\n'
        '  "title": "Research findings",\n'
        '  "type": "object",\n'
        '  "required": [\n'
        '    "summary",\n'
        '    "findings"\n'
        '  ],\n'
        '  "properties": {\n'
        '    "summary": {\n'
        '      "type": "string"\n'
        '    },\n'
        '    "findings": {\n'
        '      "type": "array",\n'
        '      "items": {\n'
        '        "type": "object",\n'
        '        "required": [\n'
        '          "claim"\n'
        '        ],\n'
        '        "properties": {\n'
        '          "claim": {\n'
        '            "type": "string"\n'
        '          },\n'
        '          "evidence": {\n'
        '            "type": "string"\n'
        '          },\n'
        '          "source": {\n'
        '            "type": "string"\n'
        '          },\n'
        '          "confidence": {\n'
        '            "enum": [\n'
        '              "low",\n'
        '              "medium",\n'
        '              "high"\n'
        '            ]\n'
        '          }\n'
        '        },\n'
        '        "additionalProperties": false\n'
        '      }\n'
        '    },\n'
        '    "open_questions": {\n'
        '      "type": "array",\n'
        '      "items": {\n'
        '        "type": "string"\n'
        '      }\n'
        '    }\n'
        '  },\n'
        '  "additionalProperties": false\n'
        '}\n'
    ),
    'schemas/plan.json': (
        '{\n'
        '  "$schema": "https://json-schema.org/draft/2020-12/schema",\n'
        '  "$id": "spawn.py/plan.json",\n'
        '  "title": "An implementation plan",\n'
        '  "type": "object",\n'
        '  "required": [\n'
        '    "goal",\n'
        '    "steps"\n'
        '  ],\n'
        '  "properties": {\n'
        '    "goal": {\n'
        '      "type": "string"\n'
        '    },\n'
        '    "steps": {\n'
        '      "type": "array",\n'
        '      "minItems": 1,\n'
        '      "items": {\n'
        '        "type": "object",\n'
        '        "required": [\n'
        '          "title"\n'
        '        ],\n'
        '        "properties": {\n'
        '          "title": {\n'
        '            "type": "string"\n'
        '          },\n'
        '          "files": {\n'
        '            "type": "array",\n'
        '            "items": {\n'
        '              "type": "string"\n'
        '            }\n'
        '          },\n'
        '          "detail": {\n'
        '            "type": "string"\n'
        '          }\n'
        '        },\n'
        '        "additionalProperties": false\n'
        '      }\n'
        '    },\n'
        '    "risks": {\n'
        '      "type": "array",\n'
        '      "items": {\n'
        '        "type": "string"\n'
        '      }\n'
        '    }\n'
        '  },\n'
        '  "additionalProperties": false\n'
        '}\n'
    ),
    'schemas/result.json': (
        '{\n'
        '  "$schema": "https://json-schema.org/draft/2020-12/schema",\n'
        '  "$id": "spawn.py/result.json",\n'
        '  "title": "stdout of a foreground run: one bounded JSON object",\n'
        '  "type": "object",\n'
        '  "required": [\n'
        '    "id",\n'
        '    "status",\n'
        '    "exit_code",\n'
        '    "reason",\n'
        '    "output",\n'
        '    "duration_s",\n'
        '    "agent_dir",\n'
        '    "outcome",\n'
        '    "transcript"\n'
        '  ],\n'
        '  "properties": {\n'
        '    "id": {\n'
        '      "type": "string"\n'
        '    },\n'
        '    "status": {\n'
        '      "enum": [\n'
        '        "done",\n'
        '        "failed",\n'
        '        "refused",\n'
        '        "timeout",\n'
        '        "killed",\n'
        '        "interrupted"\n'
        '      ]\n'
        '    },\n'
        '    "exit_code": {\n'
        '      "type": "integer"\n'
        '    },\n'
        '    "reason": {\n'
        '      "type": "string"\n'
        '    },\n'
        '    "output": {\n'
        '      "description": "Truncated past 16 KiB with a marker naming outcome.json."\n'
        '    },\n'
        '    "output_truncated": {\n'
        '      "const": true\n'
        '    },\n'
        '    "validation_errors": {\n'
        '      "type": "array",\n'
        '      "items": {\n'
        '        "type": "string"\n'
        '      }\n'
        '    },\n'
        '    "cost_usd": {\n'
        '      "type": "number"\n'
        '    },\n'
        '    "duration_s": {\n'
        '      "type": "number"\n'
        '    },\n'
        '    "agent_dir": {\n'
        '      "type": "string"\n'
        '    },\n'
        '    "outcome": {\n'
        '      "type": "string"\n'
        '    },\n'
        '    "transcript": {\n'
        '      "type": "string"\n'
        '    },\n'
        '    "worktree": {\n'
        '      "type": "string",\n'
        '      "description": "with isolation: worktree, the worktree the agent changed, kept"\n'
        '    }\n'
        '  },\n'
        '  "additionalProperties": false\n'
        '}\n'
    ),
    'schemas/review.json': (
        '{\n'
        '  "$schema": "https://json-schema.org/draft/2020-12/schema",\n'
        '  "$id": "spawn.py/review.json",\n'
        '  "title": "A code review",\n'
        '  "type": "object",\n'
        '  "required": [\n'
        '    "verdict",\n'
        '    "issues"\n'
        '  ],\n'
        '  "properties": {\n'
        '    "verdict": {\n'
        '      "enum": [\n'
        '        "approve",\n'
        '        "request_changes",\n'
        '        "comment"\n'
        '      ]\n'
        '    },\n'
        '    "issues": {\n'
        '      "type": "array",\n'
        '      "items": {\n'
        '        "type": "object",\n'
        '        "required": [\n'
        '          "severity",\n'
        '          "description"\n'
        '        ],\n'
        '        "properties": {\n'
        '          "severity": {\n'
        '            "enum": [\n'
        '              "blocker",\n'
        '              "major",\n'
        '              "minor",\n'
        '              "nit"\n'
        '            ]\n'
        '          },\n'
        '          "file": {\n'
        '            "type": "string"\n'
        '          },\n'
        '          "line": {\n'
        '            "type": "integer"\n'
        '          },\n'
        '          "description": {\n'
        '            "type": "string"\n'
        '          },\n'
        '          "suggestion": {\n'
        '            "type": "string"\n'
        '          }\n'
        '        },\n'
        '        "additionalProperties": false\n'
        '      }\n'
        '    }\n'
        '  },\n'
        '  "additionalProperties": false\n'
        '}\n'
    ),
    'schemas/summary.json': (
        '{\n'
        '  "$schema": "https://json-schema.org/draft/2020-12/schema",\n'
        '  "$id": "spawn.py/summary.json",\n'
        '  "title": "A short answer",\n'
        '  "type": "object",\n'
        '  "required": [\n'
        '    "summary"\n'
        '  ],\n'
        '  "properties": {\n'
        '    "summary": {\n'
        '      "type": "string"\n'
        '    },\n'
        '    "details": {\n'
        '      "type": "array",\n'
        '      "items": {\n'
        '        "type": "string"\n'
        '      }\n'
        '    }\n'
        '  },\n'
        '  "additionalProperties": false\n'
        '}\n'
    ),
    'schemas/test-report.json': (
        '{\n'
        '  "$schema": "https://json-schema.org/draft/2020-12/schema",\n'
        '  "$id": "spawn.py/test-report.json",\n'
        '  "title": "A test run and the tests written for it",\n'
        '  "type": "object",\n'
        '  "required": [\n'
        '    "status",\n'
        '    "summary"\n'
        '  ],\n'
        '  "properties": {\n'
        '    "status": {\n'
        '      "enum": [\n'
        '        "passed",\n'
        '        "failed",\n'
        '        "partial"\n'
        '      ]\n'
        '    },\n'
        '    "summary": {\n'
        '      "type": "string"\n'
        '    },\n'
        '    "tests_added": {\n'
        '      "type": "array",\n'
        '      "items": {\n'
        '        "type": "object",\n'
        '        "required": [\n'
        '          "file",\n'
        '          "name"\n'
        '        ],\n'
        '        "properties": {\n'
        '          "file": {\n'
        '            "type": "string"\n'
        '          },\n'
        '          "name": {\n'
        '            "type": "string"\n'
        '          }\n'
        '        },\n'
        '        "additionalProperties": false\n'
        '      }\n'
        '    },\n'
        '    "failures": {\n'
        '      "type": "array",\n'
        '      "items": {\n'
        '        "type": "object",\n'
        '        "required": [\n'
        '          "test",\n'
        '          "message"\n'
        '        ],\n'
        '        "properties": {\n'
        '          "test": {\n'
        '            "type": "string"\n'
        '          },\n'
        '          "message": {\n'
        '            "type": "string"\n'
        '          }\n'
        '        },\n'
        '        "additionalProperties": false\n'
        '      }\n'
        '    }\n'
        '  },\n'
        '  "additionalProperties": false\n'
        '}\n'
    ),
    '.claude/agents/architect.md': (
        '---\n'
        'name: architect\n'
        'description: "Architecture and system design: design components, module boundaries, interfaces, APIs'
        ' and data flow, and weigh trade-offs and alternatives for a new system or a large restructuring."\n'
        'tools: Read, Grep, Glob\n'
        'model: opus\n'
        'schema: design\n'
        'max_depth: 2\n'
        'timeout: 1800\n'
        '---\n'
        'You are a software architect. You produce a design, not code and not a\n'
        'step-by-step task list.\n'
        '\n'
        'How to work:\n'
        '- Read the existing system first (Glob, Grep, Read): its modules, dependencies,\n'
        '  data model, and the constraints it already imposes. Fit the design to it.\n'
        '- Split the system into `components`, each with one clear `responsibility` and\n'
        '  the `interfaces` (functions, APIs, messages, files) others use it through.\n'
        '  Keep coupling low and data ownership unambiguous.\n'
        '- Record every significant `decision` with its `rationale` and the\n'
        '  `alternatives` you rejected, considering simplicity, performance, security,\n'
        '  operability and cost of change.\n'
        '- List `risks`: unknowns, scaling limits, migration pain, assumptions.\n'
        '- Prefer the simplest design that meets the requirements; say what you left out.\n'
        '\n'
        'Nobody is watching: do not ask questions; choose the most reasonable reading of\n'
        'the requirements and record your assumptions as risks.\n'
        'If your spawn.py briefing says you have Bash and depth left, you may hand a\n'
        'self-contained subtask to a child agent with the command it gives; otherwise do\n'
        'all the work yourself.\n'
        '\n'
        'Finish by calling the StructuredOutput tool once with an object matching the\n'
        '`design` schema. If no StructuredOutput tool exists, reply with that JSON object alone.\n'
    ),
    '.claude/agents/build.md': (
        '---\n'
        'name: build\n'
        'description: "Implementation: implement, add, modify, refactor or migrate a feature in the source, t'
        'hen build and lint it."\n'
        'tools: Read, Edit, Write, Bash, Grep, Glob\n'
        'model: sonnet\n'
        'schema: build\n'
        'max_depth: 2\n'
        'timeout: 1800\n'
        'permissions:\n'
        '  deny:\n'
        '    - "Bash(git push:*)"\n'
        '    - "Bash(rm -rf:*)"\n'
        '    - "Read(**/.env*)"\n'
        '---\n'
        'You are an implementation engineer. You make the requested change in the\n'
        'repository and leave it working.\n'
        '\n'
        'How to work:\n'
        '- Read the surrounding code first and follow its style, naming, error handling\n'
        '  and structure. Prefer the smallest change that fully does the job.\n'
        '- Edit existing files with Edit; create files with Write only when needed.\n'
        "- After changing code, run the project's own checks with Bash (build, type\n"
        '  check, linter, the relevant tests) and fix what you broke.\n'
        '- Do not commit, push, delete unrelated files, or touch secrets or `.env` files.\n'
        '  Stay inside the task: no drive-by refactors.\n'
        '\n'
        'Nobody is watching: do not ask questions; make reasonable assumptions and\n'
        'mention them in the summary.\n'
        'If your spawn.py briefing says you have Bash and depth left, you may hand a\n'
        'self-contained subtask (e.g. a separate module, or research) to a child agent\n'
        'with the command it gives; check its result before relying on it.\n'
        '\n'
        'Finish by calling the StructuredOutput tool once with an object matching the\n'
        '`build` schema: `status` (success, partial or failed), `summary` (what changed\n'
        'and why), `files_changed`, and `tests` (what you ran and its result).\n'
        'If no StructuredOutput tool exists, reply with that JSON object alone.\n'
    ),
    '.claude/agents/code-reviewer.md': (
        '---\n'
        'name: code-reviewer\n'
        'description: "Review: critique a diff, commit, branch or pull request for correctness, security, sty'
        'le and maintainability, and give an approve or request-changes verdict."\n'
        'tools: Read, Grep, Glob, Bash\n'
        'model: sonnet\n'
        'schema: review\n'
        'max_depth: 2\n'
        'timeout: 1800\n'
        'permissions:\n'
        '  allow:\n'
        '    - "Bash(git diff:*)"\n'
        '    - "Bash(git log:*)"\n'
        '    - "Bash(git show:*)"\n'
        '  deny:\n'
        '    - "Read(**/.env*)"\n'
        '    - "Bash(git push:*)"\n'
        '---\n'
        'You are a code reviewer. You judge a change; you do not modify it.\n'
        '\n'
        'How to work:\n'
        '- Find the change under review (`git diff`, `git log`, `git show`, or the files\n'
        '  named in the task), then Read enough surrounding code to understand its context\n'
        '  and its callers.\n'
        '- Look for, in order: bugs and wrong behaviour, security problems (injection,\n'
        '  secrets, unsafe input), missing error handling, races, missing or weak tests,\n'
        '  API and compatibility breaks, then readability and style.\n'
        '- Report each issue with a `severity` (blocker, major, minor, nit), the `file`\n'
        '  and `line`, a precise `description` and, where you can, a concrete `suggestion`.\n'
        '  Do not pad the list: no issue without a real reason.\n'
        '- `verdict`: request_changes if any blocker or major issue, approve if none,\n'
        '  comment when you could not review enough to decide.\n'
        '- Do not edit files, commit, push or check out other revisions.\n'
        '\n'
        'Nobody is watching: do not ask questions; review what you can find.\n'
        'If your spawn.py briefing says you have Bash and depth left, you may hand a\n'
        'self-contained subtask (e.g. reviewing one large file) to a child agent with the\n'
        'command it gives; otherwise do all the work yourself.\n'
        '\n'
        'Finish by calling the StructuredOutput tool once with an object matching the\n'
        '`review` schema. If no StructuredOutput tool exists, reply with that JSON object alone.\n'
    ),
    '.claude/agents/debugger.md': (
        '---\n'
        'name: debugger\n'
        'description: "Debugging: diagnose a bug, crash, error message, exception, stack trace or regression,'
        ' reproduce it and pinpoint its root cause."\n'
        'tools: Read, Grep, Glob, Bash\n'
        'model: sonnet\n'
        'schema: diagnosis\n'
        'max_depth: 2\n'
        'timeout: 1800\n'
        'permissions:\n'
        '  allow:\n'
        '    - "Bash(git diff:*)"\n'
        '    - "Bash(git log:*)"\n'
        '    - "Bash(git show:*)"\n'
        '    - "Bash(git blame:*)"\n'
        '  deny:\n'
        '    - "Read(**/.env*)"\n'
        '    - "Bash(git push:*)"\n'
        '    - "Bash(rm -rf:*)"\n'
        '---\n'
        'You are a debugger. You find out why something goes wrong and say how to fix it.\n'
        '\n'
        'How to work:\n'
        '- Pin down the `symptom` exactly: the error text, the input, expected versus\n'
        '  actual behaviour.\n'
        '- Reproduce it with Bash (run the failing command or test) before theorising.\n'
        '- Trace from the symptom back to its cause: read the stack trace and the code it\n'
        '  names, grep for the error message, check recent history with `git log` and\n'
        '  `git blame`. Form a hypothesis, then test it with a targeted experiment.\n'
        '- The `root_cause` must name the responsible code (`path:line`) and explain the\n'
        '  mechanism, not just restate the symptom.\n'
        '- Record each reproduction, log line and experiment in `evidence`.\n'
        '- Describe the `fix` (the minimal change, as a patch sketch); do not edit the\n'
        '  source files yourself. Temporary scratch files outside the repo are fine.\n'
        '- `confidence`: high only if you reproduced the bug and confirmed the cause.\n'
        '\n'
        'Nobody is watching: do not ask questions; make reasonable assumptions and state them.\n'
        'If your spawn.py briefing says you have Bash and depth left, you may hand a\n'
        'self-contained subtask (e.g. checking one hypothesis) to a child agent with the\n'
        'command it gives; otherwise do all the work yourself.\n'
        '\n'
        'Finish by calling the StructuredOutput tool once with an object matching the\n'
        '`diagnosis` schema. If no StructuredOutput tool exists, reply with that JSON object alone.\n'
    ),
    '.claude/agents/documentation-writer.md': (
        '---\n'
        'name: documentation-writer\n'
        'description: "Documentation: write or update the README, user guides, reference docs, docstrings, co'
        'mments, changelog entries and usage examples."\n'
        'tools: Read, Write, Edit, Grep, Glob\n'
        'model: sonnet\n'
        'schema: docs\n'
        'max_depth: 2\n'
        'timeout: 1800\n'
        '---\n'
        'You are a technical writer. You write documentation that is accurate to the\n'
        'code as it is now.\n'
        '\n'
        'How to work:\n'
        '- Read the code you document and the existing docs first; match their tone,\n'
        '  structure, heading style and formatting conventions.\n'
        '- Every command, option, default, path and example you write must be checked\n'
        '  against the source. Never document behaviour you have not verified.\n'
        '- Lead with what the reader needs: what it is, how to use it, a working example,\n'
        '  then details and edge cases. Keep it short; prefer tables and examples to prose.\n'
        '- Edit existing documents with Edit rather than rewriting them; change only\n'
        '  documentation (docs, README, docstrings, comments), never program logic.\n'
        '- Put what remains undocumented, unclear or unverifiable in `gaps`.\n'
        '\n'
        'Nobody is watching: do not ask questions; make reasonable assumptions and list\n'
        'them as gaps.\n'
        'If your spawn.py briefing says you have Bash and depth left, you may hand a\n'
        'self-contained subtask to a child agent with the command it gives; otherwise do\n'
        'all the work yourself.\n'
        '\n'
        'Finish by calling the StructuredOutput tool once with an object matching the\n'
        '`docs` schema: `summary`, `files_changed` and `gaps`.\n'
        'If no StructuredOutput tool exists, reply with that JSON object alone.\n'
    ),
    '.claude/agents/explore.md': (
        '---\n'
        'name: explore\n'
        'description: "Read-only exploration: find, search, locate and explain code, files, symbols and how t'
        'hings work in a codebase."\n'
        'tools: Read, Grep, Glob\n'
        'model: haiku\n'
        'schema: findings\n'
        'max_depth: 1\n'
        'timeout: 600\n'
        '---\n'
        'You are a read-only code explorer. You answer questions about an existing codebase:\n'
        'where something lives, what calls what, how a feature works, which files matter.\n'
        '\n'
        'How to work:\n'
        '- Start broad with Glob and Grep (names, strings, imports), then Read only the\n'
        '  files and line ranges that matter. Follow call chains to their ends.\n'
        '- Never guess: every claim must rest on code you actually read. Cite it as\n'
        "  `path:line` in the finding's `source`, and quote or paraphrase the decisive\n"
        '  lines in `evidence`.\n'
        '- Set `confidence` honestly: high when you read the code path end to end,\n'
        '  low when you infer from names or partial reads.\n'
        '- Put anything you could not settle in `open_questions` instead of speculating.\n'
        '- You change nothing: no edits, no commands.\n'
        '\n'
        'Nobody is watching: do not ask questions; make reasonable assumptions and note them.\n'
        'If your spawn.py briefing says you have Bash and depth left, you may hand a\n'
        'self-contained subtask to a child agent with the command it gives; otherwise do\n'
        'all the work yourself.\n'
        '\n'
        'Finish by calling the StructuredOutput tool once with an object matching the\n'
        '`findings` schema: `summary` (the direct answer, a few sentences) and `findings`.\n'
        'If no StructuredOutput tool exists, reply with that JSON object alone.\n'
    ),
    '.claude/agents/plan.md': (
        '---\n'
        'name: plan\n'
        'description: "Planning: draft an ordered step-by-step plan that breaks a goal into small tasks, list'
        'ing the paths each step touches and the risks, before any coding starts."\n'
        'tools: Read, Grep, Glob\n'
        'model: opus\n'
        'schema: plan\n'
        'max_depth: 2\n'
        'timeout: 1800\n'
        '---\n'
        'You are an implementation planner. You turn a requested change into a concrete,\n'
        'ordered plan that another agent can carry out step by step. You do not write code.\n'
        '\n'
        'How to work:\n'
        '- Read the relevant code first (Glob, Grep, Read) so the plan fits what exists:\n'
        '  its conventions, module boundaries, tests and build setup.\n'
        '- State the `goal` in one or two sentences, as the finished result.\n'
        '- Make each step small, verifiable and in dependency order. Give it a short\n'
        '  imperative `title`, the exact `files` it touches (existing or new), and a\n'
        '  `detail` saying what to change and how to check it worked (test, command).\n'
        '- Include the steps for tests and docs, not just the code.\n'
        '- List `risks`: breaking changes, migrations, unclear requirements, edge cases,\n'
        '  and the assumptions you made.\n'
        '\n'
        'Nobody is watching: do not ask questions; choose the most reasonable reading of\n'
        'the task and record your assumptions as risks.\n'
        'If your spawn.py briefing says you have Bash and depth left, you may hand a\n'
        'self-contained subtask to a child agent with the command it gives; otherwise do\n'
        'all the work yourself.\n'
        '\n'
        'Finish by calling the StructuredOutput tool once with an object matching the\n'
        '`plan` schema. If no StructuredOutput tool exists, reply with that JSON object alone.\n'
    ),
    '.claude/agents/test-engineer.md': (
        '---\n'
        'name: test-engineer\n'
        'description: "Testing: create unit, integration and end-to-end tests, execute the test suite, measur'
        'e coverage and report which tests pass or fail."\n'
        'tools: Read, Write, Edit, Bash, Grep, Glob\n'
        'model: sonnet\n'
        'schema: test-report\n'
        'max_depth: 2\n'
        'timeout: 1800\n'
        'permissions:\n'
        '  allow:\n'
        '    - "Bash(git diff:*)"\n'
        '    - "Bash(git status:*)"\n'
        '  deny:\n'
        '    - "Read(**/.env*)"\n'
        '    - "Bash(git push:*)"\n'
        '    - "Bash(rm -rf:*)"\n'
        '---\n'
        'You are a test engineer. You write and run tests; you do not change the code\n'
        'under test.\n'
        '\n'
        'How to work:\n'
        "- Find the project's test framework, layout, fixtures and the command that runs\n"
        '  the tests (CI config, noxfile, Makefile, pyproject, package.json) and follow them.\n'
        '- Write focused tests: one behaviour each, clear names, the normal case, edge\n'
        '  cases and error paths. No sleeps, no network, no dependence on test order.\n'
        '- Run the tests you added and the affected part of the suite with Bash.\n'
        '- If a test fails because of a bug in the code under test, keep the test, do\n'
        '  not "fix" the code, and report the failure with its message.\n'
        '- Do not commit or push.\n'
        '\n'
        'Nobody is watching: do not ask questions; make reasonable assumptions and state\n'
        'them in the summary.\n'
        'If your spawn.py briefing says you have Bash and depth left, you may hand a\n'
        'self-contained subtask (e.g. tests for one module) to a child agent with the\n'
        'command it gives; otherwise do all the work yourself.\n'
        '\n'
        'Finish by calling the StructuredOutput tool once with an object matching the\n'
        '`test-report` schema: `status` (passed, failed or partial), `summary`,\n'
        '`tests_added` (file, name) and `failures` (test, message).\n'
        'If no StructuredOutput tool exists, reply with that JSON object alone.\n'
    ),
    'workflows/plan-build-explore.yaml': (
        '# plan -> build -> explore over one state file (spawn.py run-all "TASK").\n'
        '# Copy and change freely: any spawn option can go on a task or under defaults.\n'
        'vars: {task: ""}\n'
        'tasks:\n'
        '  - id: plan\n'
        '    agent: plan\n'
        '    task: "Write an implementation plan for: {{var.task}}"\n'
        '  - id: build\n'
        '    agent: build\n'
        '    task: "Carry out the plan below, step by step, and report the files you created and modified."\n'
        '    blockedBy: [plan]\n'
        '    ask: ["Write", "Edit(lines>50)", "Bash(rm:*)", "Bash(git rm:*)", "Bash(mv:*)", "Edit(**/pyprojec'
        't.toml)", "Edit(**/package.json)", "Edit(**/requirements*.txt)", "Edit(**/Cargo.toml)", "Edit(**/go.'
        'mod)"]\n'
        '  - id: explore\n'
        '    agent: explore\n'
        '    task: "Explore the codebase after the change below: findings and recommendations."\n'
        '    blockedBy: [build]\n'
    ),
    'workflows/plan-build.yaml': (
        '# plan -> build over one state file. Copy and change freely; run it with\n'
        '#   spawn.py run-plan-build "TASK"            (records results in .spawn-state.json)\n'
        '#   spawn.py dag run workflows/plan-build.yaml --var task="TASK"   (graph only)\n'
        '# Build asks before it creates or deletes a file, changes more than 50 lines (Edit(lines>50)) or tou'
        'ches a dependency\n'
        '# manifest: answer with `spawn.py approve|deny ASK_ID` (see `spawn.py status`).\n'
        'vars: {task: ""}\n'
        'tasks:\n'
        '  - id: plan\n'
        '    agent: plan\n'
        '    task: "Write an implementation plan for: {{var.task}}"\n'
        '  - id: build\n'
        '    agent: build\n'
        '    task: "Carry out the plan below, step by step, and report the files you created and modified."\n'
        '    blockedBy: [plan]\n'
        '    ask: ["Write", "Edit(lines>50)", "Bash(rm:*)", "Bash(git rm:*)", "Bash(mv:*)", "Edit(**/pyprojec'
        't.toml)", "Edit(**/package.json)", "Edit(**/requirements*.txt)", "Edit(**/Cargo.toml)", "Edit(**/go.'
        'mod)"]\n'
    ),
}
# ==================== end src/spawnlib/embedded.py ====================

# ==================== begin src/spawnlib/errors.py ====================








# --------------------------------------------------------------- exit codes --


@enum.unique
class ExitCode(enum.IntEnum):
    """Exit status of every spawn.py command; the table in docs/exit-codes.md."""

    OK = 0  # the agent (or every waited agent) finished with status done
    AGENT_FAILED = 1  # an agent failed, including schema-invalid output
    USAGE = 2  # bad flags or input; nothing was started or written
    STATE = 3  # session or state error: unwritable root, corrupt record
    REFUSED = 4  # refused by a limit (depth, deadline, tools); recorded
    TIMEOUT = 124  # deadline reached; the agent's subtree was ended
    INTERRUPTED = 130  # SIGINT (Ctrl-C); the subtree was ended
    KILLED = 143  # SIGTERM/SIGHUP or `spawn.py kill`; the subtree was ended


# ------------------------------------------------------------------- errors --


class SpawnError(Exception):
    """Base error: carries a one-line message and the exit code it maps to."""

    exit_code: ExitCode = ExitCode.AGENT_FAILED

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UsageError(SpawnError, ValueError):
    """Bad flags or input (exit 2)."""

    exit_code = ExitCode.USAGE


class StateError(SpawnError, OSError):
    """The session directory can't be used (exit 3)."""

    exit_code = ExitCode.STATE


class RefusedError(SpawnError):
    """A limit forbids this spawn (exit 4)."""

    exit_code = ExitCode.REFUSED


def close_match(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate closest to a mistyped word, if any is close (pure).

    Python 3.11's argparse suggests nothing (3.14's does); difflib is
    imported here, on the error path only.
    """
    import difflib

    close = difflib.get_close_matches(word, sorted(candidates), n=1, cutoff=0.6)
    return close[0] if close else None


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """ "; did you mean 'X'?" for the closest candidate to a mistyped word, or "" (pure)."""
    match = close_match(word, candidates)
    return f"; did you mean {match!r}?" if match else ""


class UnknownToolError(UsageError):
    def __init__(self, names: Sequence[str]) -> None:
        hint = did_you_mean(names[0], KNOWN_TOOLS) if len(names) == 1 else ""
        known = f"use names like {','.join(sorted(KNOWN_TOOLS)[:6])},... or mcp__SERVER__TOOL"
        super().__init__(f"unknown tool {', '.join(names)}{hint} {known}" if hint else f"unknown tool {', '.join(names)}; {known}")


class UnknownVerbError(UsageError):
    def __init__(self, word: str, verbs: Sequence[str]) -> None:
        hint = did_you_mean(word, verbs)
        rest = f"verbs are {', '.join(verbs)}; a task goes in --task TEXT (see 'spawn.py --help')"
        super().__init__(f"unknown verb {word!r}{hint}" if hint else f"unknown verb {word!r}; {rest}")


class UnknownAgentError(UsageError):
    def __init__(self, agent_id: str, where: Path) -> None:
        super().__init__(f"no agent {agent_id!r} under {where}; run 'spawn.py status' to list agents, or pass --session DIR")


class CorruptRecordError(StateError):
    def __init__(self, path: Path | str, why: str) -> None:
        super().__init__(f"corrupt record {path}: {why}; inspect or remove it")


class InputError(UsageError):
    """A user's YAML or JSON input that can't be used (exit 2), and where in it (load_input)."""

    def __init__(self, source: str, line: int | None, why: str) -> None:
        self.source, self.line, self.why = source, line, why
        super().__init__(f"{source}:{line}: {why}; fix it" if line else f"{source}: {why}; fix it")
# ==================== end src/spawnlib/errors.py ====================

# ==================== begin src/spawnlib/output.py ====================
"""What spawn.py says: data on stdout (a parent agent's Bash reads it), notes on stderr.

Low in the layers because every layer above reports progress through note().
"""









def stdout_json_text(value: Any) -> str:
    """JSON for stdout: indented for a person at a terminal; one line when piped,
    as a parent agent's Bash and CI read it."""
    return json.dumps(value, ensure_ascii=False, default=str, indent=2 if sys.stdout.isatty() else None)


def emit(data: Mapping[str, Any]) -> None:
    sys.stdout.write(stdout_json_text(data) + "\n")
    sys.stdout.flush()


def note(message: str) -> None:
    print(f"spawn: {message}", file=sys.stderr, flush=True)
# ==================== end src/spawnlib/output.py ====================

# ==================== begin src/spawnlib/forkstate.py ====================




# ------------------------------------------ process-wide state a fork resets --
# The session's fork server is a fork of the root, and every spawn it runs is
# a fork of the server: module-level state of the process forked from must not
# leak into what runs there. Each piece is registered with how to put it back
# as a fresh interpreter has it (on_fork), or named in KEPT_ACROSS_FORKS with
# why a copy is right. tests/test_fork_state.py reads spawn.py and fails on
# a module-level mutable that the code changes, a name a function rebinds
# (`global`), a module-level object or class whose attributes are assigned at
# run time, or a cached function, that is in neither.

FORK_RESETS: dict[str, Callable[[], None]] = {}
KEPT_ACROSS_FORKS: dict[str, str] = {
    "FORK_RESETS": "the registry itself: the same functions in every process",
    "KEPT_ACROSS_FORKS": "this list: constant",
    "_FIELDS": "dataclass field names by record type: the same in every process",
    "_PROCFS_OURS": "keyed by pid: a fork is another pid, so it never reads its parent's entry",
    "ForkedFor": "set in the fork server's child right after the fork; never set in the server it is forked from",
    "sdk_version": "the installed SDK's version: the same in every process of one environment",
    "verified_copy": "the compiled copy as checked; compiled_script checks the file again when it changes",
    "bounded_yaml_loader": "a loader class: no state of its own",
    "builtin_delegates": "the built-in definitions' names and descriptions, embedded in spawn.py: the same in every process",
    "_BOOT_ID": "this boot's id: the same in every process of one boot",
    "WORKFLOW_FOR": "a table filled in two statements at import: the same in every process",
}


def on_fork(name: str, reset: Callable[[], None]) -> None:
    """Register how to put name's state back as a fresh interpreter has it."""
    FORK_RESETS[name] = reset


def reset_after_fork() -> None:
    """In a fork's child (the fork server, and each spawn it forks): forget the parent's process-wide state."""
    for reset in FORK_RESETS.values():
        reset()
# ==================== end src/spawnlib/forkstate.py ====================

# ==================== begin src/spawnlib/records.py ====================












# ------------------------------------------------------------------ records --


class Status(enum.StrEnum):
    """Lifecycle of an agent. Only DONE to INTERRUPTED are outcomes (final).

    The others are what `status` and `wait` observe of an agent with no
    outcome yet; they are never written to outcome.json.
    """

    RUNNING = "running"
    STALE = "stale"  # no outcome, process alive, heartbeat old
    QUEUED = "queued"  # no outcome, alive, waiting for a --max-concurrent slot
    LOST = "lost"  # no outcome, process gone; `reap` or `wait` records it
    STALLED = "stalled?"  # no outcome, idle over half its idle timeout; ended as stalled at the full one
    WAITING = "waiting"  # no outcome, blocked on its children, its --max-concurrent slot lent to them
    PAUSED = "paused"  # no outcome, alive, waiting at its budget for a raise (--on-budget pause)
    CORRUPT = "corrupt"  # its meta.json can't be read; inspect or remove it
    DONE = "done"
    FAILED = "failed"
    REFUSED = "refused"
    TIMEOUT = "timeout"
    KILLED = "killed"
    INTERRUPTED = "interrupted"


EXIT_FOR_STATUS: dict[Status, ExitCode] = {
    Status.DONE: ExitCode.OK,
    Status.FAILED: ExitCode.AGENT_FAILED,
    Status.REFUSED: ExitCode.REFUSED,
    Status.TIMEOUT: ExitCode.TIMEOUT,
    Status.KILLED: ExitCode.KILLED,
    Status.INTERRUPTED: ExitCode.INTERRUPTED,
}


@dataclass(frozen=True)
class Trace:
    """W3C trace context: one trace id per tree, one span id per agent."""

    trace_id: str
    span_id: str
    parent_span_id: str | None = None
    flags: str = "01"
    """trace-flags, kept from the parent: an unsampled trace stays unsampled."""

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{self.flags}"


@dataclass
class AgentMeta:
    """Who an agent is and what it was asked: meta.json (schemas/meta.json).

    Written once, before the model is called, and never changed.
    """

    id: str
    """Agent id, unique within its session."""
    parent_id: str | None
    """Id of the agent whose Bash started this one; None for the root."""
    depth: int
    """0 for the root, parent's depth + 1 below."""
    max_depth: int
    """Deepest depth this agent's subtree may reach."""
    pid: int
    """Process running this agent (spawn.py itself)."""
    create_time: float
    """That process's start time; with pid it identifies the process."""
    pgid: int
    """Process group of that process."""
    trace_id: str
    span_id: str
    traceparent: str
    task: str
    tools: list[str]
    disallowed_tools: list[str]
    model: str
    """Resolved model id or CLI alias."""
    cwd: str
    started_at: str
    """ISO 8601 UTC."""
    session: str
    """Session directory."""
    system_prompt: str
    preset: str | None = None
    schema: dict[str, Any] | None = None
    schema_source: str | None = None
    deadline: float | None = None
    """Absolute deadline, Unix seconds."""
    max_turns: int | None = None
    max_budget_usd: float | None = None
    idle_timeout_s: float | None = None
    """Seconds without a transcript event or CPU use before the agent counts as stalled."""
    on_budget: str | None = None
    """pause: wait at its budget for a raise (docs/steering.md); None or fail: fail there."""
    topic: str | None = None
    output_file: str | None = None
    background: bool = False
    parent_span_id: str | None = None
    agent: str | None = None
    """Name of the agent definition used, if any."""
    agent_source: str | None = None
    """Path of that definition file."""
    routing: dict[str, Any] | None = None
    """With --agent auto: the choice, the candidates and their scores."""
    permissions: dict[str, list[str]] = field(default_factory=lambda: {k: [] for k in PERMISSION_KINDS})
    """Effective rules (allow, deny, ask) in Claude Code's syntax."""
    permission_mode: str = DEFAULT_PERMISSION_MODE
    mcp_servers: list[str] = field(default_factory=list)
    """Names of the definition's MCP servers (their config stays in the definition file)."""
    skills: list[str] | None = None
    effort: str | int | None = None
    """The definition's effort (low ... max), passed to the CLI."""
    initial_prompt: str | None = None
    """The definition's initialPrompt, sent before the task."""
    isolation: str | None = None
    """worktree: the agent runs in a fresh git worktree of cwd."""
    memory: str | None = None
    """The definition's memory scope (user, project, local)."""
    hooks: list[str] = field(default_factory=list)
    """Events of the definition's hooks (their commands stay in the definition file)."""
    resumed_from: str | None = None
    """With --resume: the agent whose conversation this one continues."""
    pid_namespace: str | None = None
    """The pid namespace pid is valid in (readlink /proc/self/ns/pid). An
    agent started inside a parent's sandbox has a pid only that sandbox knows."""
    host: str | None = None
    """The host name pid runs on (os.uname().nodename)."""
    boot_id: str | None = None
    """That host's boot (/proc/sys/kernel/random/boot_id). With host, it says
    whether pid can be looked up here at all: pid namespaces have the same
    inode on every host, so only these tell another machine's pid apart."""
    sandbox: str = "off"
    """on: the agent's Bash runs inside Claude Code's sandbox (writes only in
    cwd, the agent and session directories; network only to allowed hosts).
    inherited: it runs inside its parent's sandbox already. off: no sandbox."""
    warnings: list[str] = field(default_factory=list)
    containment: str | None = None
    """What keeps the tree's processes from outliving it: "cgroup PATH" (a root
    creates PATH, children run inside it), "subreaper", or "none"."""
    kind: str = "claude"
    """What runs the node: claude (the local CLI), a2a (a remote A2A agent) or command (an executable)."""
    endpoint: str | None = None
    """a2a: the agent card's URL; command: the command line. Absent for claude."""
    placement: dict[str, Any] | None = None
    """Where it runs and why (placement.PlacementDecision): backend local, inprocess
    (a Claude Code subagent inside its parent's CLI) or ray; reason; policy (what
    its children inherit); on Ray also node_id, host and boot_id of the node its
    runner runs on (pid, host and boot_id above are the stand-in's, on the
    launcher's host). Absent in records written before placements."""
    spawn_version: str = __version__
    protocol: int = PROTOCOL_VERSION


@dataclass
class Outcome:
    """What happened: outcome.json (schemas/outcome.json). Written once."""

    id: str
    status: str
    reason: str
    exit_code: int
    ended_at: str
    duration_s: float
    output: Any = None
    """Validated structured output, or the final text when no schema."""
    text: str | None = None
    """The agent's last assistant text (kept even when it failed)."""
    validation_errors: list[str] = field(default_factory=list)
    cost_usd: float | None = None
    """Absent, not 0, when unknown."""
    cost_estimated: bool | None = None
    """True when cost_usd was priced from the transcript (no result from the CLI)."""
    usage: dict[str, Any] | None = None
    turns: int | None = None
    sdk_session_id: str | None = None
    api_error_status: int | None = None
    transcript: str | None = None
    """Path of transcript.jsonl: what the agent did, kept whatever the status."""
    warnings: list[str] = field(default_factory=list)
    committed_by: str = "self"
    """self, or who committed it on the agent's behalf: guard, parent, wait, reap, kill, spawn."""
    worktree: str | None = None
    """With `isolation: worktree`: the worktree the agent changed, kept (branch spawn/ID)."""
    truncated: list[str] | None = None
    """The logs (transcript.jsonl, stderr.log) that reached SPAWN_TRANSCRIPT_MAX_BYTES and stopped growing."""
    protocol: int = PROTOCOL_VERSION


@dataclass
class Heartbeat:
    """heartbeat.json: the live CLI process, rewritten while it runs."""

    cli_pid: int
    cli_create_time: float
    cli_pgid: int
    updated_at: float
    interval_s: float
    """Readers call the agent stale after HEARTBEAT_STALE_BEATS missed beats."""
    last_activity_at: float | None = None
    """Unix seconds of the CLI's last transcript event or CPU use."""
    idle_timeout_s: float | None = None
    """The agent is ended as stalled once idle this long; `status` shows `stalled?` at half."""


@dataclass
class Limits:
    """limits.json: caps for the whole tree, set by the root, read by every spawn."""

    max_budget_usd: float | None = None
    """One budget shared by every agent of the session."""
    max_agents: int | None = None
    """Agents the session may register (refusals don't count)."""
    max_concurrent: int | None = None
    """Agents that may run at once; a spawn over it waits for a slot."""
    confirm_over_usd: float | None = None
    """A spawn that would take the tree's projected spend past this asks the root first."""
    protocol: int = PROTOCOL_VERSION


@dataclass
class LedgerEntry:
    """One line of ledger.jsonl: a budget hold taken, or what an ended agent spent.

    With a tree budget, an admitted agent first holds its cap (`reserve`);
    the outcome's commit, whoever makes it, charges what it spent (`charge`),
    which releases the hold. Lines without `kind` are charges (older ledgers).
    """

    id: str
    time: str
    kind: str = "charge"
    """reserve or charge."""
    status: str | None = None
    """charge: the committed status."""
    cost_usd: float | None = None
    """charge: absent when unknown, the tree's spend is then a lower bound."""
    cost_estimated: bool | None = None
    """charge: True when cost_usd was priced from the transcript's usage."""
    amount_usd: float | None = None
    """reserve: the agent's cap, held until its charge."""
    drawn_from: str | None = None
    """reserve: id of the ancestor whose hold pays for it; absent: the tree's remainder."""
    usage: dict[str, int] | None = None
    """charge: its token counts (USAGE_COUNTS), cache reads and writes beside input and output."""


@dataclass
class AskRecord:
    """asks/ID.json: a tool call waiting for a person's or an ancestor's answer."""

    id: str
    agent_id: str
    tool: str
    input: str
    """A summary of the call's input (a command, a path)."""
    rule: str
    created_at: str
    expires_at: float
    """Unix seconds; unanswered by then, the call is denied."""
    protocol: int = PROTOCOL_VERSION


@dataclass
class AskAnswer:
    """asks/ID.answer.json: the first answer wins."""

    id: str
    verdict: str
    """approve or deny"""
    by: str
    """Who answered: approve or deny (the verbs, unnamed), the NAME of `--as NAME`
    (a root process, an MCP client), timeout, or terminal (the person at the root)."""
    at: str
    text: str | None = None
    """`approve --text TEXT`: the reply an a2a node sends its remote agent (input-required)."""
    protocol: int = PROTOCOL_VERSION


@dataclass
class AskAttempt:
    """One line of asks/ID.attempts.jsonl: an answer that was refused.

    An agent, or a process it started, tried to answer an ask of its own tree.
    """

    ask: str
    verdict: str
    """approve or deny: what the attempt asked for."""
    by: str
    """The name it gave (approve, deny, or --as NAME)."""
    at: str
    pid: int
    """The process that tried."""
    refused: str
    """Why it was refused."""
    protocol: int = PROTOCOL_VERSION


@dataclass
class SessionInfo:
    """session.json: written by the root agent when it creates the session."""

    id: str
    created_at: str
    topic: str
    root_agent: str
    protocol: int = PROTOCOL_VERSION


R = TypeVar("R")


def record_to_json(record: Any) -> dict[str, Any]:
    """A record as JSON, leaving out unknown (None) values."""
    return {k: v for k, v in dataclasses.asdict(record).items() if v is not None}


def record_from_json(cls: type[R], data: Mapping[str, Any]) -> R:
    """The inverse of record_to_json: absent values are None, unknown keys ignored."""
    names, required = _record_fields(cls)
    if data.keys() <= names and data.keys() >= required:  # the usual record: no key to drop or fill in
        return cls(**data)
    return cls(**{name: data.get(name) for name in names if name in data or name in required})


_FIELDS: dict[type, tuple[frozenset[str], frozenset[str]]] = {}


def _record_fields(cls: type) -> tuple[frozenset[str], frozenset[str]]:
    """A record's field names and those without a default, looked up once:
    `status` reads 10,000 records and dataclasses.fields() is slow."""
    if cls not in _FIELDS:
        fields = dataclasses.fields(cls)
        required = {f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
        _FIELDS[cls] = (frozenset(f.name for f in fields), frozenset(required))
    return _FIELDS[cls]
# ==================== end src/spawnlib/records.py ====================

# ==================== begin src/spawnlib/schemafast.py ====================






# ------------------------------------------------ schemas without jsonschema --

# Importing jsonschema costs about 0.1 s of CPU (referencing, attrs, rpds and
# every draft's meta-schema read from disk): at `--schema`, it came before the
# root's CLI could start, and every nested level checked its schema again.
# The schemas agents are given are mostly plain: objects of typed properties,
# required names, enums, arrays of the same. For those, the two checks below
# answer here. Each answers only "certainly yes": a schema or an output they
# can't vouch for goes to jsonschema, which then gives the verdict and its
# own messages, so what users see is jsonschema's in every case. Soundness is
# what matters: "yes" here must never be "no" there (test_schemafast holds
# both sides to it over the shipped schemas and edge cases).

# The drafts whose meaning this module knows for the keywords it takes (the
# same for all four); draft 4 and 3 differ (exclusiveMinimum, integer), and an
# unknown $schema makes jsonschema warn: those go to it.
FAST_DRAFTS = frozenset(
    f"{uri}{tail}"
    for uri in (
        "https://json-schema.org/draft/2020-12/schema",
        "https://json-schema.org/draft/2019-09/schema",
        "http://json-schema.org/draft-07/schema",
        "http://json-schema.org/draft-06/schema",
    )
    for tail in ("", "#")
)
FAST_TYPES = frozenset(("object", "array", "string", "number", "integer", "boolean", "null"))
FAST_ANNOTATIONS = frozenset(("title", "description", "$comment", "format"))  # strings; format is not asserted
FAST_FLAGS = frozenset(("readOnly", "writeOnly", "deprecated", "uniqueItems"))  # booleans
FAST_COUNTS = frozenset(("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"))
FAST_BOUNDS = frozenset(("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"))
# An $id the meta-schemas' uri-reference format and "no fragment" pattern
# surely accept: an absolute http(s) URL or a relative path with no colon.
FAST_ID = re.compile(r"(?:https?://[A-Za-z0-9._~-]+(?:/[A-Za-z0-9._~-]*)*|[A-Za-z0-9._~-]+(?:/[A-Za-z0-9._~-]*)*)#?")


def schema_surely_valid(schema: Mapping[str, Any]) -> bool:
    """True only if jsonschema's check_schema surely accepts schema (False: ask it)."""
    draft = schema.get("$schema")
    if draft is not None and draft not in FAST_DRAFTS:
        return False
    schema_id = schema.get("$id")
    if schema_id is not None and not (isinstance(schema_id, str) and FAST_ID.fullmatch(schema_id)):
        return False
    return _subschema_ok({k: v for k, v in schema.items() if k not in ("$schema", "$id")})


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _scalars_ok(values: object) -> bool:
    """An enum this module can compare: a non-empty list of distinct strings, integers, booleans or nulls."""
    if not isinstance(values, list) or not values:
        return False
    if not all(v is None or isinstance(v, (str, bool)) or _is_int(v) for v in values):
        return False
    return len({(type(v), v) for v in values}) == len(values)


def _subschema_ok(schema: object) -> bool:
    if isinstance(schema, bool):
        return True
    if not isinstance(schema, dict):
        return False
    for key, value in schema.items():
        if key in FAST_ANNOTATIONS:
            ok = isinstance(value, str)
        elif key in FAST_FLAGS:
            ok = isinstance(value, bool)
        elif key in FAST_COUNTS:
            ok = _is_int(value) and value >= 0
        elif key in FAST_BOUNDS:
            ok = _is_number(value)
        elif key == "default":
            ok = True
        elif key == "examples":
            ok = isinstance(value, list)
        elif key == "type":
            names = value if isinstance(value, list) else [value]
            ok = bool(names) and all(isinstance(n, str) and n in FAST_TYPES for n in names) and len(set(names)) == len(names)
        elif key == "properties":
            ok = isinstance(value, dict) and all(_subschema_ok(sub) for sub in value.values())
        elif key == "required":
            ok = isinstance(value, list) and all(isinstance(n, str) for n in value) and len(set(value)) == len(value)
        elif key in ("additionalProperties", "items"):
            ok = _subschema_ok(value)
        elif key in ("allOf", "anyOf"):
            ok = isinstance(value, list) and bool(value) and all(_subschema_ok(sub) for sub in value)
        elif key == "enum":
            ok = _scalars_ok(value)
        elif key == "const":
            ok = _scalars_ok([value])
        elif key == "pattern":
            ok = isinstance(value, str) and _compiles(value)
        else:
            return False  # $ref, oneOf, if/then, patternProperties...: jsonschema's
        if not ok:
            return False
    return True


def _compiles(pattern: str) -> bool:
    """jsonschema's "regex" format: what re compiles."""
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError):
        return False
    return True


def output_surely_valid(schema: Mapping[str, Any], value: Any) -> bool:
    """True only if jsonschema finds no error in value under schema (False: ask it).

    For a schema schema_surely_valid accepted; any other answers False.
    """
    return schema_surely_valid(schema) and _matches({k: v for k, v in schema.items() if k not in ("$schema", "$id")}, value)


def _type_is(name: str, value: object) -> bool:
    """A JSON value's type; an integral float counts as no integer here (jsonschema's call)."""
    if name == "object":
        return isinstance(value, dict)
    if name == "array":
        return isinstance(value, list)
    if name == "string":
        return isinstance(value, str)
    if name == "number":
        return _is_number(value)
    if name == "integer":
        return _is_int(value)
    if name == "boolean":
        return isinstance(value, bool)
    return value is None  # "null"


def _same_scalar(a: object, b: object) -> bool:
    return type(a) is type(b) and a == b


def _matches(schema: object, value: Any) -> bool:
    """Whether value surely satisfies schema (a subschema _subschema_ok accepted)."""
    if isinstance(schema, bool):
        return schema
    assert isinstance(schema, dict)
    for key, rule in schema.items():
        if key == "type":
            if not any(_type_is(n, value) for n in (rule if isinstance(rule, list) else [rule])):
                return False
        elif key == "enum":
            if not any(_same_scalar(value, option) for option in rule):
                return False
        elif key == "const":
            if not _same_scalar(value, rule):
                return False
        elif key in ("allOf", "anyOf"):
            hits = [_matches(sub, value) for sub in rule]
            if not (all(hits) if key == "allOf" else any(hits)):
                return False
        elif isinstance(value, dict):
            if not _object_matches(key, rule, schema, value):
                return False
        elif isinstance(value, list):
            if not _array_matches(key, rule, value):
                return False
        elif isinstance(value, str):
            if not _string_matches(key, rule, value):
                return False
        elif _is_number(value) and not _number_matches(key, rule, value):
            return False
    return True


def _object_matches(key: str, rule: Any, schema: Mapping[str, Any], value: dict[str, Any]) -> bool:
    if key == "properties":
        return all(_matches(sub, value[name]) for name, sub in rule.items() if name in value)
    if key == "required":
        return all(name in value for name in rule)
    if key == "additionalProperties":
        known = schema.get("properties", {})
        return all(_matches(rule, item) for name, item in value.items() if name not in known)
    if key == "minProperties":
        return bool(len(value) >= rule)
    if key == "maxProperties":
        return bool(len(value) <= rule)
    return True  # a keyword for other types


def _array_matches(key: str, rule: Any, value: list[Any]) -> bool:
    if key == "items":
        return all(_matches(rule, item) for item in value)
    if key == "minItems":
        return bool(len(value) >= rule)
    if key == "maxItems":
        return bool(len(value) <= rule)
    if key == "uniqueItems":
        # Distinct by this module's own equality only for strings and integers;
        # anything else (1 against true, 1 against 1.0, nested values) is jsonschema's.
        if not rule:
            return True
        if not all(isinstance(item, str) or _is_int(item) for item in value):
            return False
        return len({(type(item), item) for item in value}) == len(value)
    return True


def _string_matches(key: str, rule: Any, value: str) -> bool:
    if key == "minLength":
        return bool(len(value) >= rule)
    if key == "maxLength":
        return bool(len(value) <= rule)
    if key == "pattern":
        return re.search(rule, value) is not None
    return True


def _number_matches(key: str, rule: Any, value: float) -> bool:
    if key == "minimum":
        return bool(value >= rule)
    if key == "maximum":
        return bool(value <= rule)
    if key == "exclusiveMinimum":
        return bool(value > rule)
    if key == "exclusiveMaximum":
        return bool(value < rule)
    return True
# ==================== end src/spawnlib/schemafast.py ====================

# ==================== begin src/spawnlib/core.py ====================





















































# ---------------------------------------------------------------- pure core --


def utc_now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def started_timestamp(meta: AgentMeta) -> float:
    """meta.started_at (ISO 8601 UTC) as Unix seconds."""
    return dt.datetime.fromisoformat(meta.started_at.replace("Z", "+00:00")).timestamp()


def is_finite(value: float) -> bool:
    # False for NaN too: every comparison with NaN is false. (Not math.isfinite:
    # one more import at every level of nesting.)
    return -float("inf") < value < float("inf")


def number_problem(name: str, value: object, *, maximum: float, integer: bool = False, zero_ok: bool = False) -> str | None:
    """What is wrong with a number from a flag, the environment or a definition, or None.

    NaN is the case that matters: it compares false, so a NaN limit would
    silently disable every check that uses it.
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or (integer and not isinstance(value, int)):
        return f"{name} must be {'an integer' if integer else 'a number'}, got {value!r}"
    if not is_finite(value):
        return f"{name} must be a finite number, got {value}"
    if value < 0 or (value == 0 and not zero_ok):
        return f"{name} must be {'>= 0' if zero_ok else '> 0'}, got {value}"
    if value > maximum:
        return f"{name} must be at most {maximum:g}, got {value:g}"
    return None


# (flag, attribute, maximum, integer, zero_ok) of every numeric flag of a run.
RUN_NUMBER_FLAGS: tuple[tuple[str, str, float, bool, bool], ...] = (
    ("--timeout", "timeout", MAX_SECONDS, False, True),  # 0: no deadline of its own
    ("--idle-timeout", "idle_timeout", MAX_SECONDS, False, False),
    ("--max-budget-usd", "max_budget_usd", MAX_BUDGET_USD, False, False),
    ("--max-turns", "max_turns", MAX_COUNT, True, False),
    ("--max-depth", "max_depth", MAX_DEPTH_LIMIT, True, True),
    ("--max-agents", "max_agents", MAX_COUNT, True, False),
    ("--max-concurrent", "max_concurrent", MAX_CONCURRENT, True, False),
    ("--confirm-over", "confirm_over", MAX_BUDGET_USD, False, False),
)

# (variable, maximum, integer, zero_ok) of every numeric environment variable.
ENV_NUMBERS: tuple[tuple[str, float, bool, bool], ...] = (
    ("SPAWN_DEADLINE", float("9e12"), False, False),  # Unix seconds; past year 2255 is a typo
    ("SPAWN_MAX_BUDGET_USD", MAX_BUDGET_USD, False, False),
    ("SPAWN_HEARTBEAT_S", 3600.0, False, False),
    ("SPAWN_ASK_TIMEOUT_S", MAX_SECONDS, False, False),
    ("SPAWN_IDLE_TIMEOUT_S", MAX_SECONDS, False, False),
    ("SPAWN_DEPTH", MAX_DEPTH_LIMIT, True, True),
    ("SPAWN_MAX_DEPTH", MAX_DEPTH_LIMIT, True, True),
)


# MCP server kinds Claude Code accepts in mcpServers (stdio when no type is given).
MCP_SERVER_TYPES = ("stdio", "http", "sse")

# (field, attribute, maximum, integer, zero_ok) of every numeric field of an
# agent definition. A bad one is an error, as the matching flag is: unset, a
# limit such as maxTurns would be no limit at all.
DEFINITION_NUMBERS: tuple[tuple[str, str, float, bool, bool], ...] = (
    ("max_depth", "max_depth", MAX_DEPTH_LIMIT, True, True),
    ("timeout", "timeout", MAX_SECONDS, False, False),
    ("max_budget_usd", "max_budget_usd", MAX_BUDGET_USD, False, False),
    ("maxTurns", "max_turns", MAX_COUNT, True, False),
    ("autoCompactWindow", "auto_compact_window", MAX_TOKENS, True, False),
)


def env_number_warnings(environ: Mapping[str, str]) -> list[str]:
    """A warning for each malformed numeric SPAWN_* variable; readers ignore those values.

    An agent's own environment is not trusted (its Bash can rewrite it), so a
    bad value is not fatal: it is ignored, and the ancestry's value applies.
    """
    warnings = []
    for name, maximum, integer, zero_ok in ENV_NUMBERS:
        raw = environ.get(name)
        if raw in (None, ""):
            continue
        try:
            value: object = int(raw) if integer else float(raw)
        except ValueError:
            value = raw
        why = number_problem(name, value, maximum=maximum, integer=integer, zero_ok=zero_ok)
        if why is not None:
            warnings.append(f"{why}; ignored")
    return warnings


def slugify(text: str, max_len: int = 40) -> str:
    words = re.findall(r"[a-z0-9]+", text.lower())
    slug = ""
    for word in words:
        candidate = f"{slug}-{word}" if slug else word
        if len(candidate) > max_len:
            break
        slug = candidate
    return slug or "agent"


def token_hex(nbytes: int) -> str:
    """secrets.token_hex without importing secrets (hmac, hashlib, random: ~5 ms of every start)."""
    return os.urandom(nbytes).hex()


def new_agent_id(depth: int) -> str:
    # Depth in the id makes `status` and logs readable at a glance.
    return f"a{depth}-{token_hex(3)}"


AGENT_ID = re.compile(r"a(\d{1,4})-[0-9a-f]{6}")


def id_depth(agent_id: str) -> int | None:
    """The depth an id made by new_agent_id carries; None for any other name."""
    m = AGENT_ID.fullmatch(agent_id)
    return int(m.group(1)) if m else None


def parse_traceparent(value: str) -> tuple[str, str] | None:
    """(trace_id, parent span id) from a W3C traceparent, or None if malformed."""
    m = re.fullmatch(r"[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}", value.strip())
    if not m or set(m.group(1)) == {"0"} or set(m.group(2)) == {"0"}:
        return None
    return m.group(1), m.group(2)


def new_trace(parent: str | None) -> Trace:
    span = token_hex(8)
    if parent:
        parsed = parse_traceparent(parent)
        if parsed:
            return Trace(parsed[0], span, parsed[1], parent.strip()[-2:])
    return Trace(token_hex(16), span)


def canonical_tool(name: str) -> str:
    """A tool's current name: legacy aliases (Task, KillShell) map to today's."""
    return TOOL_ALIASES.get(name, name)


def parse_tools(value: str, known: frozenset[str] = KNOWN_TOOLS) -> list[str]:
    tools = [canonical_tool(t.strip()) for t in value.split(",") if t.strip()]
    unknown = [t for t in tools if t not in known and not t.startswith("mcp__")]
    if unknown:
        raise UnknownToolError(unknown)
    return list(dict.fromkeys(tools))


def parse_model_tiers(value: str | None) -> dict[str, str]:
    tiers = dict(DEFAULT_MODEL_TIERS)
    if not value:
        return tiers
    for item in value.split(","):
        name, sep, model = item.partition("=")
        if not sep or not name.strip() or not model.strip():
            raise UsageError(f"{ENV_MODEL_TIERS}={value!r} is malformed; use 'high-tier=MODEL,medium-tier=MODEL,low-tier=MODEL'")
        tiers[name.strip()] = model.strip()
    return tiers


def resolve_model(name: str, tiers: Mapping[str, str], source: str = "--model") -> str:
    """The model id or CLI alias a tier, alias or id names; a name none of them matches is a UsageError."""
    if not name.strip():
        raise UsageError(f"{source} is empty; use high-tier, medium-tier, low-tier or a model id")
    model = tiers.get(name, name)
    if name in tiers or model in tiers.values() or model in CLI_MODEL_ALIASES or re.fullmatch(MODEL_ID_PATTERN, model):
        return model
    listed = ", ".join(f"{tier} ({target})" for tier, target in tiers.items())
    hint = did_you_mean(name, [*tiers, *CLI_MODEL_ALIASES])
    raise UsageError(
        f"{source} {name!r} is no known model{hint or ';'} use a tier: {listed}, an alias: {', '.join(CLI_MODEL_ALIASES)}, "
        f"or a model id like claude-sonnet-4-5"
    )


def narrow_tools(requested: Sequence[str], allowed: Sequence[str] | None) -> tuple[list[str], list[str]]:
    """(tools kept, tools dropped): a child never gets a tool its parent lacks."""
    if allowed is None:
        return list(requested), []
    allowed_set = set(allowed)
    kept = [t for t in requested if t in allowed_set]
    return kept, [t for t in requested if t not in allowed_set]


def child_deadline(own_timeout: float | None, parent_deadline: float | None, now: float) -> float | None:
    """A child's deadline: its own, capped by the parent's minus a grace."""
    candidates = []
    if own_timeout is not None:
        candidates.append(now + own_timeout)
    if parent_deadline is not None:
        candidates.append(parent_deadline - PARENT_GRACE_S)
    return min(candidates) if candidates else None


def price_family(model: str) -> str:
    """opus, sonnet or haiku for a model id or alias (medium-tier's for one the table doesn't name)."""
    name = DEFAULT_MODEL_TIERS.get(model, model).lower()  # recorded models, checked when they were chosen
    return next((f for f in MODEL_PRICES_USD_PER_MTOK if f in name), FALLBACK_PRICE_FAMILY)


def price_per_mtok(model: str) -> tuple[float, float]:
    """(input, output) USD per million tokens for a model id or alias."""
    return MODEL_PRICES_USD_PER_MTOK[price_family(model)]


def estimate_agent(model: str, history: Mapping[str, Sequence[tuple[float, float]]]) -> tuple[float, float, str]:
    """(USD, seconds, basis) one agent of this model is expected to take.

    history maps a price family to (cost, duration) of its ended agents; the
    median of those resists the one runaway agent, else the tier default.
    """
    import statistics  # stdlib, but every level pays for module-top imports

    family = price_family(model)
    seen = history.get(family) or []
    if not seen:
        return DEFAULT_AGENT_COST_USD[family], DEFAULT_AGENT_SECONDS, f"default for {family}"
    cost = statistics.median(c for c, _ in seen)
    seconds = statistics.median(d for _, d in seen)
    return cost, seconds, f"median of {len(seen)} ended {family} agent(s)"


def estimate_cost(turns: Iterable[tuple[str, Mapping[str, Any]]]) -> float:
    """USD for (model, usage) per turn, priced from MODEL_PRICES_USD_PER_MTOK."""

    def tokens(usage: Mapping[str, Any], key: str) -> float:
        value = usage.get(key)
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else 0.0

    total = 0.0
    for model, usage in turns:
        price_in, price_out = price_per_mtok(model)
        read_in = tokens(usage, "input_tokens") + CACHE_READ_FACTOR * tokens(usage, "cache_read_input_tokens")
        written, split = tokens(usage, "cache_creation_input_tokens"), usage.get("cache_creation")
        # Of the writes, those kept for an hour cost more (the CLI says which in cache_creation).
        one_hour = min(tokens(split, "ephemeral_1h_input_tokens"), written) if isinstance(split, Mapping) else 0.0
        read_in += CACHE_WRITE_FACTOR * (written - one_hour) + CACHE_WRITE_1H_FACTOR * one_hour
        total += (read_in * price_in + tokens(usage, "output_tokens") * price_out) / 1e6
    return round(total, 6)


@dataclass
class LedgerState:
    """The tree budget as ledger.jsonl tells it (see sessions/README.md, "Budget")."""

    charges: dict[str, float | None] = field(default_factory=dict)
    """id -> what it spent (None: unknown)."""
    estimated: set[str] = field(default_factory=set)
    holds: dict[str, tuple[str | None, float]] = field(default_factory=dict)
    """id -> (drawn_from, amount) for every reserve line, charged or not."""

    def live(self, agent_id: str | None) -> bool:
        return agent_id is not None and agent_id in self.holds and agent_id not in self.charges

    def draws(self, source: str | None) -> list[str]:
        return [i for i, (src, _) in self.holds.items() if src == source]

    def used_by(self, agent_id: str) -> float:
        """What a hold takes from where it was drawn: all of it while live,
        then what it and the holds drawn from it were charged."""
        if self.live(agent_id):
            return self.holds[agent_id][1]
        return (self.charges.get(agent_id) or 0.0) + sum(self.used_by(c) for c in self.draws(agent_id))

    def free(self, source: str | None, budget: float, own_spend: float = 0.0) -> float:
        """Unreserved USD of a live hold (less its owner's own spend so far), or of the tree (source None)."""
        if source is None:
            unheld = sum(c or 0.0 for i, c in self.charges.items() if i not in self.holds)
            return budget - unheld - sum(self.used_by(t) for t in self.draws(None))
        return self.holds[source][1] - own_spend - sum(self.used_by(c) for c in self.draws(source))

    @property
    def spent(self) -> float:
        return sum(c for c in self.charges.values() if c is not None)

    @property
    def unknown(self) -> int:
        return sum(c is None for c in self.charges.values())

    @property
    def reserved(self) -> float:
        """Held by live agents and not yet charged to anyone."""
        # An agent that overran its hold (by its last turn) holds nothing more.
        return sum(max(0.0, self.holds[i][1] - sum(self.used_by(c) for c in self.draws(i))) for i in self.holds if self.live(i))


def ledger_state(lines: Iterable[str]) -> LedgerState:
    """Fold ledger.jsonl lines; unreadable lines are skipped (each write is one whole line)."""
    import math  # builtin, but every level pays for module-top imports

    state = LedgerState()
    for line in lines:
        try:
            entry = parse_json(line)
        except ValueError:
            continue
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            continue
        if entry.get("kind") == "reserve":
            amount = entry.get("amount_usd")
            if isinstance(amount, int | float) and math.isfinite(amount):
                source = entry.get("drawn_from")
                state.holds[entry["id"]] = (source if isinstance(source, str) else None, float(amount))
        elif entry["id"] not in state.charges:  # first charge wins; a commit happens once
            cost = entry.get("cost_usd")
            state.charges[entry["id"]] = float(cost) if isinstance(cost, int | float) and math.isfinite(cost) else None
            if entry.get("cost_estimated"):
                state.estimated.add(entry["id"])
    return state


def truncate_for_stdout(output: Any, full_path: Path) -> tuple[Any, bool]:
    """Output bounded for a parent's context; the full text stays on disk."""
    text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
    if len(text.encode()) <= STDOUT_OUTPUT_LIMIT:
        return output, False
    cut = text.encode()[:STDOUT_OUTPUT_LIMIT].decode(errors="ignore")
    return f"{cut}\n...[truncated: {len(text.encode())} bytes in all; full output in {full_path}]", True


def validate_output(schema: Mapping[str, Any], output: Any) -> list[str]:
    if output_surely_valid(schema, output):
        return []  # no jsonschema to import (schemafast); any error is its to word
    import jsonschema

    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = sorted(validator.iter_errors(output), key=lambda e: list(e.absolute_path))
    return [f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in errors]


def check_schema(schema: Any, source: str) -> dict[str, Any]:
    if not isinstance(schema, dict):
        raise UsageError(f"schema {source} is not a JSON object; give a JSON Schema object")
    if schema_surely_valid(schema):
        return schema  # before the root's CLI starts: jsonschema's import would delay it (schemafast)
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise UsageError(f"schema {source} is not a valid JSON Schema: {exc.message}") from None
    return schema


def schema_for_cli(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The schema as the CLI accepts it.

    The CLI's validator rejects a draft 2020-12 "$schema" URI it has no copy
    of; spawn.py validates the output itself with the full schema afterwards.
    """
    return {k: v for k, v in schema.items() if k not in ("$schema", "$id")}


def secret_values(environ: Mapping[str, str]) -> list[str]:
    values = {v for k, v in environ.items() if SECRET_NAME.search(k) and len(v) >= SECRET_MIN_LEN}
    return sorted(values, key=len, reverse=True)


def redact(text: str, secrets_: Sequence[str]) -> str:
    for value in secrets_:
        text = text.replace(value, REDACTED)
    return SECRET_PATTERN.sub(REDACTED, text)


def self_answer_refusal(ask_agent: str, session: Path, callers: Iterable[tuple[str, str, int]]) -> str | None:
    """Why an answer must be refused, given the agents the answering process runs under.

    callers are (session, agent id, depth) of those agents. An agent can't
    answer its own ask, and no agent of the tree below the root answers any:
    they run code a model wrote. The person, the root's own process and
    clients outside the tree can.
    """
    for caller_session, agent_id, depth in callers:
        if Path(caller_session).resolve() != session.resolve():
            continue
        if agent_id == ask_agent:
            return f"agent {agent_id} can't answer its own ask"
        if depth > 0:
            return f"agent {agent_id} (depth {depth}) of the same tree can't answer asks; the person or the root does"
    return None


def redact_values(value: Any, secrets_: Sequence[str]) -> Any:
    """value with every string in it redacted, before it is serialised.

    Redacting JSON text instead would miss a secret holding `"` or `\\`,
    which the encoder escapes into a different string.
    """
    if isinstance(value, str):
        return redact(value, secrets_)
    if isinstance(value, Mapping):
        return {redact_values(k, secrets_) if isinstance(k, str) else k: redact_values(v, secrets_) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_values(v, secrets_) for v in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    return redact(str(value), secrets_)  # what json.dumps(default=str) would write


def redacted_json(value: Any, secrets_: Sequence[str], **dumps: Any) -> str:
    return json.dumps(redact_values(value, secrets_), ensure_ascii=False, **dumps)


def briefing(meta: AgentMeta, spawn_cmd: str, delegates: Sequence[tuple[str, str]] = ()) -> str:
    """What every agent is told at start, whatever its system prompt: the part of it
    (after that prompt) that is the same for agents of the same tools, definition and
    depth, so siblings share it in the prompt cache. Its own facts are agent_facts."""
    remaining = meta.max_depth - meta.depth
    lines = [
        "## spawn.py briefing",
        f"You are an agent at depth {meta.depth} (max depth {meta.max_depth}); your id and limits follow your task.",
        f"Your tools: {', '.join(meta.tools) or 'none'}.",
    ]
    policy = (meta.placement or {}).get("policy")
    if remaining <= 0:
        lines.append("You cannot start child agents: the depth limit is reached.")
    elif policy in ("inprocess", "auto") and "Agent" in meta.tools:
        # Its children are the CLI's own subagents, which spawn.py records and governs.
        lines += [
            f"You may start child agents {remaining} level(s) deep with the Agent tool; spawn.py records and limits each.",
            "Pass run_in_background: false unless you have other work meanwhile.",
        ]
        if policy == "auto" and "Bash" in meta.tools:
            lines.append(
                f"Only a child that needs its own sandbox, directory, deadline or budget: from Bash, {spawn_cmd} --task 'SUBTASK' ..."
            )
    elif "Bash" not in meta.tools:
        lines.append("You cannot start child agents: you have no Bash tool.")
    elif any(rule.startswith("Bash(") for rule in meta.permissions.get("allow", [])):
        lines.append("You cannot start child agents: your Bash is limited by allow rules that don't include spawn.py.")
    else:
        lines += [
            f"You may start child agents {remaining} level(s) deep. From Bash, run:",
            f"  {spawn_cmd} --task 'SUBTASK' --tools {','.join(meta.tools)} [--schema NAME] [--timeout S]",
            "It prints one JSON object: id, status, output, cost. Children get at most your tools; list fewer to narrow them.",
            "For parallel work add --background (prints the id at once), then wait for all:",
            f"  {spawn_cmd} wait ID1 ID2 --all",
        ]
        if delegates:
            lines.append("Agents you may delegate to (add --agent NAME, or --agent auto to pick by task):")
            lines += [f"  {name}: {description}" for name, description in delegates]
    rules = [f"{kind} {', '.join(texts)}" for kind, texts in meta.permissions.items() if texts]
    lines.append(f"Your rights: permission mode {meta.permission_mode}" + (f"; rules: {'; '.join(rules)}" if rules else "") + ".")
    lines.append("A denied tool call is final: do not retry it another way.")
    return "\n".join(lines)


def agent_facts(meta: AgentMeta, now: float | None = None) -> str:
    """What differs between an agent and its siblings: it follows the task in its first
    message (a resumed agent's, in its new one), outside the cached head (pure but for the clock)."""
    lines = [AGENT_FACTS_HEADER, f"You are agent {meta.id}."]
    if meta.deadline is not None:
        left = max(0, int(meta.deadline - (time.time() if now is None else now)))
        deadline_iso = dt.datetime.fromtimestamp(meta.deadline, dt.UTC).isoformat(timespec="seconds")
        lines.append(f"Deadline: {deadline_iso} ({left} s from now); finish before it.")
    if meta.max_budget_usd is not None:
        lines.append(f"Budget: ${meta.max_budget_usd:.4f} for you and any children.")
    return "\n".join(lines)


def first_message(meta: AgentMeta, now: float | None = None) -> str:
    """The agent's first user message: its definition's initialPrompt, its task, then its facts."""
    parts = [meta.initial_prompt, meta.task, agent_facts(meta, now)]
    return "\n\n".join(p for p in parts if p)


def prompt_layout(meta: AgentMeta) -> dict[str, list[str]]:
    """Where each part of what the agent is told goes (cli_start), as --dry-run shows it (pure)."""
    system = ["claude_code preset"] if meta.preset == "claude_code" else []
    system += ["system_prompt", "briefing"]
    system += ["memory"] if meta.agent_source and meta.memory else []
    system += ["skills"] if meta.skills else []
    first = ["initial_prompt"] if meta.initial_prompt else []
    return {"system": system, "first_message": [*first, "task", "agent_facts"]}


def token_counts(usage: Any) -> dict[str, int]:
    """The four token counts of a usage record (USAGE_COUNTS), 0 for what is missing (pure)."""
    found = usage if isinstance(usage, Mapping) else {}
    return {
        key: int(value) if isinstance(value := found.get(key), int | float) and not isinstance(value, bool) and value > 0 else 0
        for key in USAGE_COUNTS
    }


def round_usd(value: float | None) -> float | None:
    """Money as records and stdout carry it: to the micro-dollar, below any price, so
    float sums' noise (0.013656000000000001) stays out (pure)."""
    return None if value is None else round(value, 6)


def claude_config_dir(environ: Mapping[str, str]) -> Path:
    """Claude Code's config directory, as the CLI finds it (pure)."""
    return Path(environ.get("CLAUDE_CONFIG_DIR") or Path(environ.get("HOME", "~")) / ".claude").expanduser()


def sandbox_wanted(requested: str, depth: int, max_depth: int, tools: Sequence[str]) -> bool:
    """Whether --sandbox (on, off, auto) puts this agent's Bash in the sandbox.

    auto: every agent below the root that has Bash, spawners too. A
    sandboxed spawner's spawns go through its runner (the broker), outside
    the sandbox, whose process identity vouches for them.
    """
    if requested == "auto":
        return depth >= 1 and "Bash" in tools
    return requested == "on"


def sandbox_writes(
    may_spawn: bool, agent_dir: Path, session: str, runner_index: Path, *, session_entries: Sequence[str], drop_boxes: Sequence[str]
) -> tuple[list[str], list[str]]:
    """Where a sandboxed agent's Bash may write beyond its cwd, and what stays read-only in there (pure).

    It may write only its drop box and its scratch/. A spawner's drop box is
    requests/<its id>/, where the spawn.py in its Bash leaves its spawns and
    kills for its runner to run outside the sandbox (the broker); a leaf's
    is refused/<its id>/, where its refused spawns wait for its runner to
    record them (record_dropped_refusals). drop_boxes: the boxes there are,
    each as folder/name.

    Every other entry of the session (all of agents/, so its own, its
    ancestors' and its siblings' records, even those made after it started;
    the ledger, limits, asks, the fork server's socket, the other agents'
    drop boxes) is read-only, as is the runner index, even where they lie
    inside its cwd (sessions/ beside spawn.py, in a project). So a hostile
    agent can't publish an outcome before the runner that owns it, nor
    register a child of its own choosing. Its scratch/ also names the agent
    on bwrap's command line (sandbox_owner); inside its read-only agent
    directory it stays writable.
    The caller keeps only paths that exist: for a file not there yet the CLI
    would hold an empty placeholder at its path on the host while each
    command runs, and an empty .done is an outcome to every reader.
    """
    own_box = f"{REQUESTS_DIR if may_spawn else REFUSED_DIR}/{agent_dir.name}"
    others = [f"{session}/{name}" for name in session_entries if name not in (REFUSED_DIR, REQUESTS_DIR, SESSION_LOCK)]
    boxes = [f"{session}/{box}" for box in drop_boxes if box != own_box]
    writable = [f"{session}/{own_box}", str(agent_dir / SCRATCH_DIR)]
    return writable, [str(agent_dir), *others, *boxes, str(runner_index)]


def sandbox_settings(
    write_dirs: Sequence[str], api_host: str, web_domains: Sequence[str], deny_write: Sequence[str] = ()
) -> dict[str, Any]:
    """Claude Code's `sandbox` settings for an agent (pure).

    failIfUnavailable and no unsandboxed fallback: a sandbox that can't start
    must stop the agent, never let its Bash run bare. Bash stays subject to
    our tool list and rules (no auto-allow). The API host is allowed so a
    nested spawn in Bash reaches the model through the sandbox's proxy.
    """
    return {
        "enabled": True,
        "failIfUnavailable": True,
        "autoAllowBashIfSandboxed": False,
        "allowUnsandboxedCommands": False,
        "filesystem": {"allowWrite": sorted(set(write_dirs)), "denyWrite": sorted(deny_write)},
        "network": {"allowedDomains": sorted({api_host, *web_domains})},
    }


def cli_settings(**parts: Any) -> str | None:
    """The CLI's --settings JSON: one object with every key spawn.py sets
    (hooks, sandbox, permissions...). Empty parts are left out; None when
    there is nothing to set, so the CLI reads no settings flag at all."""
    settings = {key: value for key, value in parts.items() if value}
    return json.dumps(settings) if settings else None


_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')


_NOT_BRACKETS = re.compile(r"[^\[\]{}]+")


def parse_json(data: str | bytes, max_bytes: int = RECORD_MAX_BYTES) -> Any:
    """json.loads, bounded in size and depth: ValueError (a JSONDecodeError, with
    its line, where there is one) for whatever can't be parsed, never a RecursionError.

    Every record reader parses through here: a record anything with Bash can
    write must make that one record corrupt, not end its reader.
    """
    if len(data) > max_bytes:
        raise json.JSONDecodeError(f"larger than {max_bytes} bytes", "", 0)
    text = data.decode() if isinstance(data, bytes) else data  # UnicodeDecodeError is a ValueError
    # Fewer openers can't nest deeper: no scan. Else the strings' text is cut
    # out, then all but the brackets, in C: status parses 10,000s of lines.
    if text.count("[") + text.count("{") > JSON_MAX_DEPTH:
        brackets = _NOT_BRACKETS.sub("", _JSON_STRING.sub("", text))
        if max(itertools.accumulate(1 if c in "[{" else -1 for c in brackets)) > JSON_MAX_DEPTH:
            raise json.JSONDecodeError(f"nested deeper than {JSON_MAX_DEPTH} levels", text, too_deep_at(text))
    try:
        return json.loads(text)
    except RecursionError:  # not expected past the scan; a deep stack of the caller's own
        raise json.JSONDecodeError("nested too deep", text, 0) from None


def too_deep_at(text: str) -> int:
    """Where in JSON text a level past JSON_MAX_DEPTH opens (its index; 0 if none)."""
    depth = 0
    for match in re.finditer(rf"{_JSON_STRING.pattern}|[\[\]{{}}]", text):
        if match.group() in ("[", "{"):
            depth += 1
            if depth > JSON_MAX_DEPTH:
                return match.start()
        elif match.group() in ("]", "}"):
            depth -= 1
    return 0


def float_or_none(value: str | None) -> float | None:
    # NaN and infinity are ignored like any malformed value: min() with a NaN
    # first returns NaN, which would widen a deadline (env_number_warnings says so).
    try:
        number = float(value) if value not in (None, "") else None
    except ValueError:
        return None
    return number if number is not None and is_finite(number) else None


def native_usage(transcript: Path) -> dict[str, int]:
    """Token totals of a native subagent, from the CLI's own transcript of it.

    Read when asked, not at SubagentStop: the CLI writes the last lines after the hook.
    """
    totals: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for raw in transcript.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError, AttributeError):  # a line that isn't a message
                usage = (parse_json(raw).get("message") or {}).get("usage") or {}
                for key in ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
                    if isinstance(usage.get(key), int):
                        totals[key] = totals.get(key, 0) + usage[key]
    return totals


def outcome_problem(data: Mapping[str, Any], agent_id: str) -> str | None:
    """Why a published outcome.json is not an outcome of agent_id, or None (pure)."""
    if data.get("id") != agent_id:
        return f"its id is {data.get('id')!r}"
    if data.get("status") not in EXIT_FOR_STATUS:
        return f"its status is {data.get('status')!r}"
    for name in ("reason", "ended_at"):
        if not isinstance(data.get(name), str):
            return f"no {name}"
    duration: Any = data.get("duration_s")
    if type(data.get("exit_code")) is not int or type(duration) not in (int, float) or not is_finite(duration):
        return "no exit_code or duration_s"
    # Summed over the tree by status and the ledger: a string or NaN here would
    # stop, or silently poison, every total above it.
    if (cost := data.get("cost_usd")) is not None and (type(cost) not in (int, float) or not is_finite(cost)):
        return f"its cost_usd is {cost!r}"
    return None
# ==================== end src/spawnlib/core.py ====================

# ==================== begin src/spawnlib/placement.py ====================
"""Placement: where an agent runs (pure).

One seam for every way of running a node: as its own local process (local),
inside its parent's Claude Code process as a native subagent (inprocess), or
on a cluster (ray:ADDRESS). `auto` lets spawn.py choose between the first two.

A *policy* is what an agent was started under and what its children inherit
(--placement, else SPAWN_PLACEMENT, else local). The *backend* is where this
one agent actually runs, and meta.json records it with the reason.

Policies only narrow down the tree, in this order (widest first):

    ray:ADDRESS  >  local  >  auto  >  inprocess

A child may ask for its parent's policy or a narrower one, never a wider one;
under ray:A it may narrow to local (or below) but never move to ray:B. Under
inprocess every descendant is in-process: an in-process agent lives inside
its parent's CLI, and its children can only be that CLI's subagents too.
"""









ENV_PLACEMENT = "SPAWN_PLACEMENT"  # the policy an agent runs under, inherited by its children
# The CLI's own limit on nesting its subagents (see subagent_depth_limit).
ENV_SUBAGENT_DEPTH = "CLAUDE_CODE_MAX_SUBAGENT_SPAWN_DEPTH"
IN_PROCESS_POLICIES = ("inprocess", "auto")  # policies under which the Agent tool starts governed children
DEFAULT_POLICY = "local"
POLICY_NAMES = ("local", "inprocess", "auto", "ray")
# Wider placements give a child more separation from its parent; a child may only go down.
POLICY_RANK = {"inprocess": 0, "auto": 1, "local": 2, "ray": 3}
BACKENDS = ("local", "inprocess", "ray")


class PlacementError(UsageError):
    """A --placement value or narrowing spawn.py can't honour (exit 2)."""


@dataclass(frozen=True)
class PlacementPolicy:
    """A parsed --placement value."""

    name: str
    """local, inprocess, auto or ray."""
    address: str | None = None
    """ray only: the cluster's address, as given."""

    def __str__(self) -> str:
        return f"ray:{self.address}" if self.name == "ray" else self.name


@dataclass(frozen=True)
class PlacementDecision:
    """Where one agent runs, and why: meta.json's `placement` (schemas/meta.json)."""

    backend: str
    """local, inprocess or ray."""
    reason: str
    policy: str
    """The policy it ran under and passes on to its children."""

    def as_record(self) -> dict[str, Any]:
        return {"backend": self.backend, "reason": self.reason, "policy": self.policy}


def parse_policy(text: str, source: str = "--placement") -> PlacementPolicy:
    """`local`, `inprocess`, `auto` or `ray:ADDRESS` (pure)."""
    value = text.strip()
    name, sep, address = value.partition(":")
    if name == "ray":
        if not sep or not address.strip():
            raise PlacementError(f"{source} ray needs the cluster's address: ray:HOST:PORT (or ray:auto)")
        if any(c.isspace() for c in address):
            raise PlacementError(f"{source} {value!r}: the address may not hold spaces")
        return PlacementPolicy("ray", address.strip())
    if sep or name not in POLICY_NAMES:
        raise PlacementError(f"{source} {value!r} is not a placement; use local, inprocess, auto or ray:ADDRESS")
    return PlacementPolicy(name)


def narrow_policy(requested: PlacementPolicy | None, inherited: PlacementPolicy | None) -> tuple[PlacementPolicy, str | None]:
    """(the policy to run under, a warning): a child never widens its parent's (pure).

    A wider request is lowered to the inherited policy, with a warning, as
    permission modes are. Moving from one cluster to another is no narrowing:
    that is refused.
    """
    if inherited is None:
        return requested or PlacementPolicy(DEFAULT_POLICY), None
    if requested is None:
        return inherited, None
    if requested.name == "ray" and inherited.name == "ray" and requested.address != inherited.address:
        raise PlacementError(
            f"--placement {requested} under the parent's {inherited}: a child may leave its parent's cluster "
            f"for local or inprocess, never move to another; drop --placement or use {inherited}"
        )
    if POLICY_RANK[requested.name] > POLICY_RANK[inherited.name]:
        return inherited, f"placement {requested} lowered to the parent's {inherited} (placement only narrows)"
    return requested, None


def process_needs(
    *,
    sandbox: bool = False,
    own_cwd: bool = False,
    deadline: bool = False,
    budget: bool = False,
    kind: str = "claude",
    cluster: bool = False,
) -> list[str]:
    """What a child asks for that only a process of its own can give (pure).

    A subagent shares its parent's CLI: its sandbox, its working directory, its
    node kind; and spawn.py can stop it only between tool calls, so a deadline
    or budget it was given explicitly is kept hard only by a process.
    """
    needs = []
    if sandbox:
        needs.append("its own sandbox")
    if own_cwd:
        needs.append("its own working directory")
    if deadline:
        needs.append("a hard deadline")
    if budget:
        needs.append("a hard budget")
    if kind != "claude":
        needs.append(f"another kind of node ({kind})")
    if cluster:
        needs.append("a cluster placement")
    return needs


def decide_placement(policy: PlacementPolicy, needs: Sequence[str], *, by_agent_tool: bool, is_root: bool) -> PlacementDecision:
    """Where an agent runs under policy (pure).

    by_agent_tool: started by a parent's Agent tool (a native subagent), not as
    a spawn.py command. Raises PlacementError where the policy can't be kept.
    """
    if policy.name == "ray":
        if by_agent_tool:
            return PlacementDecision("inprocess", f"started with the Agent tool inside its parent's CLI (under {policy})", str(policy))
        return PlacementDecision("ray", f"placement {policy}", str(policy))
    if by_agent_tool:
        if policy.name == "local":
            raise PlacementError("placement local: a Claude Code subagent runs inside its parent's CLI, not as a process")
        if needs and policy.name == "auto":
            raise PlacementError(f"placement auto: this child needs a process ({', '.join(needs)}); start it with spawn.py from Bash")
        why = "nothing it needs requires a process" if policy.name == "auto" else "placement inprocess"
        return PlacementDecision("inprocess", f"{why}: a Claude Code subagent in its parent's CLI", str(policy))
    if is_root:
        return PlacementDecision("local", "a root runs as the process it was started as", str(policy))
    if policy.name == "inprocess":
        raise PlacementError(
            "placement inprocess: this agent's children run inside its CLI as Claude Code subagents (the Agent tool), "
            "not as spawn.py processes; use the Agent tool, or start the tree with --placement auto or local"
        )
    if policy.name == "auto":
        if needs:
            return PlacementDecision("local", f"placement auto: it needs a process ({', '.join(needs)})", str(policy))
        return PlacementDecision("local", "placement auto: started as a spawn.py command, so it is a process already", str(policy))
    return PlacementDecision("local", "placement local", str(policy))


def subagent_depth_limit(depth: int, max_depth: int) -> int:
    """How many levels of subagents an agent's CLI may nest below it (pure).

    The CLI's CLAUDE_CODE_MAX_SUBAGENT_SPAWN_DEPTH=N offers the Agent tool to
    subagents at levels 0..N-1 below the main thread: level N has no Agent
    tool (measured on CLI 2.1.329: N=1 gives the main thread alone the tool,
    unset means 3). 0 or less counts as unset, so at the limit the Agent tool
    is withheld from the tool list instead (0 returned here).
    """
    return max(0, max_depth - depth)
# ==================== end src/spawnlib/placement.py ====================

# ==================== begin src/spawnlib/protocol.py ====================






















































AGENTS_DIR = "agents"
DONE_MARKER = ".done"
FAIL_MARKER = ".fail"
STATUS_CACHE = ".status-cache.json"  # status's own, disposable: see sessions/README.md
STATUS_INDEX = ".status-rows.jsonl"  # finished agents' rows, appended at commit: a hint for status, see sessions/README.md


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_new_file(path: Path, data: bytes) -> None:
    """Create path with data, durably; fails if it exists (O_EXCL, no check-then-act)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def publish_once(path: Path, data: bytes) -> bool:
    """Create path whole, or not at all; False if it already exists.

    The data goes to a private temp file, is fsynced, then hard-linked to its
    name: link() fails if the name exists, so of several writers exactly one
    wins, and readers never see a partial file. The directory is fsynced after.
    """
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.{token_hex(3)}.tmp")
    write_new_file(tmp, data)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)
    fsync_dir(path.parent)
    return True


def write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    """Replace path with data; readers see the old or the new file, never half."""
    write_file_atomic(path, json.dumps(data, indent=2, ensure_ascii=False).encode())


def write_file_atomic(path: Path, data: bytes) -> None:
    """Replace path with data, durably: a fresh temp file (O_EXCL, so a link
    planted at its name is never written through), then a rename. A failed
    write leaves neither half a file nor the temp behind."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{token_hex(3)}.tmp")
    try:
        write_new_file(tmp, data)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def read_input(path: Path | str) -> str:
    """A user's input file's text; past INPUT_MAX_BYTES an InputError, without reading it all (OSError as open raises it)."""
    with open(path, "rb") as fh:
        data = fh.read(INPUT_MAX_BYTES + 1)
    if len(data) > INPUT_MAX_BYTES:
        raise InputError(str(path), None, f"larger than {INPUT_MAX_BYTES} bytes")
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise InputError(str(path), None, "not UTF-8 text") from None


def load_input(text: str, source: str, fmt: str) -> Any:
    """A user's YAML or JSON input (fmt "YAML" or "JSON"), bounded in size, depth and alias expansion.

    The one loader of what users write (task graphs, workflows, schemas,
    agent frontmatter): an InputError names the source and, where the
    parser knows it, the line (1-based, in text).
    """
    if len(text) > INPUT_MAX_BYTES:
        raise InputError(source, None, f"larger than {INPUT_MAX_BYTES} bytes")
    if fmt == "JSON":
        try:
            return parse_json(text, INPUT_MAX_BYTES)
        except json.JSONDecodeError as exc:
            raise InputError(source, exc.lineno, f"not valid JSON: {exc.msg} (column {exc.colno})") from None
    import yaml

    loader = bounded_yaml_loader()(text)
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        why = " ".join(str(part) for part in (exc.context, exc.problem) if part)
        raise InputError(source, mark.line + 1 if mark is not None else None, f"not valid YAML: {why}") from None
    except yaml.YAMLError as exc:
        raise InputError(source, None, f"not valid YAML: {str(exc).splitlines()[0]}") from None
    except RecursionError:  # the scanner's own, on a deep stack of the caller's
        raise InputError(source, None, f"not valid YAML: nested deeper than {JSON_MAX_DEPTH} levels") from None
    finally:
        loader.dispose()


@functools.cache
def bounded_yaml_loader() -> type[Any]:
    """yaml.SafeLoader that refuses, while it composes, a document nested past
    JSON_MAX_DEPTH or expanding past YAML_MAX_NODES once every alias is counted
    as the copy its readers will see. Built on first use: yaml is imported lazily."""
    import yaml

    class BoundedLoader(yaml.SafeLoader):
        def __init__(self, stream: str) -> None:
            super().__init__(stream)
            self.level = 0
            self.expanded: dict[int, tuple[int, int]] = {}  # id(node): (nodes, depth) it stands for

        def refuse(self, why: str, mark: Any) -> NoReturn:
            raise yaml.composer.ComposerError(None, None, why, mark)

        def compose_node(self, parent: Any, index: Any) -> Any:
            event = self.peek_event()  # type: ignore[no-untyped-call]
            if isinstance(event, yaml.AliasEvent):
                anchored = self.anchors.get(event.anchor)
                if anchored is not None and id(anchored) not in self.expanded:
                    self.refuse(f"alias *{event.anchor} is inside the node it names", event.start_mark)
            self.level += 1
            try:
                if self.level > JSON_MAX_DEPTH:
                    self.refuse(f"nested deeper than {JSON_MAX_DEPTH} levels", event.start_mark)
                node = super().compose_node(parent, index)
            finally:
                self.level -= 1
            if id(node) not in self.expanded:  # else an alias: counted when its anchor was composed
                if isinstance(node, yaml.SequenceNode):
                    children = node.value
                elif isinstance(node, yaml.MappingNode):
                    children = [part for pair in node.value for part in pair]
                else:
                    children = []
                nodes = 1 + sum(self.expanded[id(c)][0] for c in children)
                depth = 1 + max((self.expanded[id(c)][1] for c in children), default=0)
                if nodes > YAML_MAX_NODES:
                    self.refuse(f"its aliases expand it past {YAML_MAX_NODES} nodes", event.start_mark)
                if depth > JSON_MAX_DEPTH:
                    self.refuse(f"its aliases nest it deeper than {JSON_MAX_DEPTH} levels", event.start_mark)
                self.expanded[id(node)] = (nodes, depth)
            return node

    return BoundedLoader


def request_kill(agent_dir: Path, reason: str) -> None:
    """Leave the reason of a kill for the agent's runner; the first request's stands."""
    with contextlib.suppress(OSError):  # there already, or not ours to write: the kill goes on
        write_new_file(agent_dir / KILL_REQUEST, json.dumps({"reason": reason, "at": time.time()}).encode())


def kill_request_reason(agent_dir: Path) -> str | None:
    """The reason `spawn.py kill` left in agent_dir, if it asked for the stop."""
    try:
        reason = read_json(agent_dir / KILL_REQUEST).get("reason")
    except (OSError, SpawnError):
        return None
    return reason if isinstance(reason, str) else None


def read_json(path: Path | str) -> dict[str, Any]:
    return read_record(path)[0]


def read_record(path: Path | str) -> tuple[dict[str, Any], list[int]]:
    """A JSON record, and the (inode, size, mtime_ns) of the very file it was read from.

    Decoded as the UTF-8 records are written in. status reads two records per
    agent, 10,000s of them: a stat of the open file costs no second path lookup.
    """
    raw, st = read_regular_file(path, RECORD_MAX_BYTES)
    try:
        data = parse_json(raw)
    except ValueError as exc:  # JSONDecodeError, and UnicodeDecodeError for binary junk
        raise CorruptRecordError(path, str(exc).splitlines()[0][:200]) from None
    if not isinstance(data, dict):
        raise CorruptRecordError(path, "not a JSON object")
    return data, [st.st_ino, st.st_size, st.st_mtime_ns]


def read_text(path: Path | str, *, shared_lock: bool = False) -> str:
    """A file's text, read as records are (read_regular_file): CorruptRecordError, never a hang."""
    return read_regular_file(path, shared_lock=shared_lock)[0].decode(errors="replace")


def open_regular(path: Path | str, flags: int, mode: int = 0o644) -> tuple[int, os.stat_result]:
    """An fd open on a regular file, and its stat; CorruptRecordError for anything else.

    O_NONBLOCK: a FIFO put where a record or a log belongs (anything with Bash
    can) must not hang whoever opens it; it is refused, as a directory is.
    """
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a FIFO that nothing reads, opened to write
            raise CorruptRecordError(path, "not a regular file") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise CorruptRecordError(path, "not a regular file")
    return fd, st


def read_regular_file(path: Path | str, max_bytes: int | None = None, *, shared_lock: bool = False) -> tuple[bytes, os.stat_result]:
    """A file's bytes and its stat: one open, one fstat and one sized read (open_regular).

    With max_bytes, a bigger file is a CorruptRecordError, not read into memory.
    With shared_lock, it is read under a shared POSIX lock of the file (the ledger's; see there).
    """
    fd, st = open_regular(path, os.O_RDONLY)
    try:
        if shared_lock:
            posix_lock(fd, shared=True)
        if max_bytes is not None and st.st_size > max_bytes:
            raise CorruptRecordError(path, f"larger than {max_bytes} bytes")
        raw = os.read(fd, st.st_size + 1)  # sized: os.read allocates all it is asked for
        if len(raw) != st.st_size:  # a short read (a network file system), or it grew: read to the end
            while (max_bytes is None or len(raw) <= max_bytes) and (more := os.read(fd, 1 << 16)):
                raw += more
    finally:
        os.close(fd)
    return raw, st


def append_jsonl(path: Path, record: Mapping[str, Any], secrets_: Sequence[str], *, locked: bool = False) -> None:
    # O_APPEND keeps concurrent writers' lines whole on one host; locked adds
    # the file's exclusive POSIX lock, which holds across NFS clients (the
    # ledger's; see there). A FIFO in a log's place must not hang its writer,
    # the session's committers above all (open_regular).
    line = redacted_json(record, secrets_) + "\n"
    fd, _ = open_regular(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        if locked:
            posix_lock(fd, shared=False)
        os.write(fd, line.encode())
    finally:
        os.close(fd)  # releases a lock, after the line is flushed


def posix_lock(fd: int, *, shared: bool) -> None:
    """A POSIX (fcntl) lock of the whole file, held until fd is closed; none on a file system without locks (NFS nolock)."""
    import fcntl

    with contextlib.suppress(OSError):
        fcntl.lockf(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)


# --------------------------------------------------------------- the ledger --
# ledger.jsonl is shared by every host of a tree placed on a cluster. O_APPEND is
# atomic on one host only: an NFS client appends at the file size it has cached.
# So each line is written under a POSIX lock of the ledger itself (fcntl; NFSv4
# keeps such locks on the server): taking it makes the Linux NFS client fetch
# the file's current size, and releasing it (at close) flushes the line first.
# Readers take it shared, so they see every line written before.


def append_ledger(session: Path, record: Mapping[str, Any], secrets_: Sequence[str]) -> None:
    """One ledger line, under the ledger's exclusive POSIX lock (callers hold the session lock too)."""
    append_jsonl(session / LEDGER, record, secrets_, locked=True)


def ledger_text(session: Path) -> str:
    """The ledger, read whole under its shared POSIX lock; FileNotFoundError when nothing was written yet."""
    return read_text(session / LEDGER, shared_lock=True)


# The agent logs this process stopped writing at the cap: each gets its one
# truncation line, and the outcome names them (only an agent's runner writes its logs).
LOGS_TRUNCATED: set[Path] = set()
on_fork("LOGS_TRUNCATED", LOGS_TRUNCATED.clear)  # which logs this process capped


def log_max_bytes(environ: Mapping[str, str]) -> int:
    value = float_or_none(environ.get(ENV_LOG_MAX))
    return int(min(value, LOG_MAX_BYTES)) if value is not None and value >= 1 else LOG_MAX_BYTES


def append_capped(path: Path, data: bytes, last: Callable[[int], bytes]) -> bool:
    """Append data to one of an agent's logs, unless that takes it past the cap:
    then append last(cap) instead, once, and nothing more. False once truncated."""
    if path in LOGS_TRUNCATED:
        return False
    cap = log_max_bytes(os.environ)
    fd, st = open_regular(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        if st.st_size + len(data) <= cap:
            os.write(fd, data)
            return True
        LOGS_TRUNCATED.add(path)
        os.write(fd, last(cap))
    finally:
        os.close(fd)
    return False


def append_transcript(path: Path, record: Mapping[str, Any], secrets_: Sequence[str]) -> bool:
    """One line of an agent's transcript.jsonl (capped; False once truncated)."""

    def truncated(cap: int) -> bytes:
        line = {"time": utc_now_iso(), "type": TRUNCATED_LINE, "message": {"max_bytes": cap, "setting": ENV_LOG_MAX}}
        return (json.dumps(line) + "\n").encode()

    return append_capped(path, (redacted_json(record, secrets_) + "\n").encode(), truncated)


def append_log_line(path: Path, line: str) -> bool:
    """One line of an agent's stderr.log (capped, as the transcript; the caller redacts)."""
    data = (line + "\n").encode(errors="replace")
    return append_capped(path, data, lambda cap: f"spawn: truncated at {cap} bytes ({ENV_LOG_MAX})\n".encode())


def truncated_logs(agent_dir: Path) -> list[str]:
    """Which of this agent's logs reached the cap in this process (for its outcome)."""
    return sorted(p.name for p in LOGS_TRUNCATED if p.parent == agent_dir)


def marker_for(status: str) -> str:
    return DONE_MARKER if status == Status.DONE else FAIL_MARKER


def charge(agent_dir: Path, outcome: Outcome, secrets_: Sequence[str]) -> None:
    """The ledger line of a committed outcome: it releases the agent's budget hold."""
    if outcome.status == Status.REFUSED and outcome.transcript is None:
        return  # refused before it ran: it held and spent nothing
    entry = LedgerEntry(
        id=outcome.id, time=outcome.ended_at, status=outcome.status, cost_usd=outcome.cost_usd, cost_estimated=outcome.cost_estimated,
        usage=token_counts(outcome.usage) if outcome.usage else None,
    )  # fmt: skip
    try:
        with session_lock(agent_dir.parent.parent):
            append_ledger(agent_dir.parent.parent, record_to_json(entry), secrets_)
    except CorruptRecordError as exc:
        # Something replaced the ledger (a FIFO, a directory): the outcome
        # is committed and must still get its marker and be reported.
        note(f"warning: {exc.message}; {outcome.id}'s charge is not in the ledger")


def asks_dir(session: Path) -> Path:
    return session / "asks"


def pending_asks(session: Path) -> list[dict[str, Any]]:
    folder = asks_dir(session)
    if not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.glob("q-*.json")):
        if path.name.endswith(".answer.json") or (folder / f"{path.stem}.answer.json").exists():
            continue
        with contextlib.suppress(FileNotFoundError, SpawnError):
            found.append(read_json(path))
    return found


@contextlib.contextmanager
def session_lock(session: Path) -> Iterator[None]:
    """The session's lock: flock, so a crashed holder never leaves it stale."""
    import fcntl

    fd = os.open(session / SESSION_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def read_limits(session: Path) -> Limits:
    try:
        return record_from_json(Limits, read_json(session / LIMITS))
    except FileNotFoundError:
        return Limits()


def read_ledger(session: Path) -> LedgerState:
    try:
        return ledger_state(ledger_text(session).splitlines())
    except FileNotFoundError:
        return LedgerState()


def tree_spend(session: Path) -> tuple[float, int]:
    """(USD charged to ended agents, how many of them have an unknown cost)."""
    state = read_ledger(session)
    return state.spent, state.unknown


def transcript_turns(agent_dir: Path, default_model: str) -> list[tuple[str, dict[str, Any]]]:
    """(model, usage) of each model turn in the transcript, one per message id."""
    turns: dict[str, tuple[str, dict[str, Any]]] = {}
    try:
        lines = (agent_dir / TRANSCRIPT).read_text(errors="replace").splitlines()
    except OSError:
        return []
    for n, line in enumerate(lines):
        with contextlib.suppress(ValueError, AttributeError):
            record = parse_json(line)
            if record.get("type") != "AssistantMessage" or not isinstance(record["message"].get("usage"), dict):
                continue
            message = record["message"]
            # One line per content block, each repeating its turn's usage.
            key = str(message.get("message_id") or f"line{n}")
            turns[key] = (str(message.get("model") or default_model), message["usage"])
    return list(turns.values())


def transcript_spend(agent_dir: Path, default_model: str) -> float:
    """What the transcript's turns cost at list price: an estimate, not the CLI's total."""
    return estimate_cost(transcript_turns(agent_dir, default_model))


def with_estimated_cost(outcome: Outcome, agent_dir: Path, model: str) -> Outcome:
    """Price the transcript when the CLI gave no total (killed, timed out, died), so the ledger never leaks."""
    if outcome.cost_usd is None:
        outcome.cost_usd = transcript_spend(agent_dir, model)
        outcome.cost_estimated = True
    return outcome


def budget_source(state: LedgerState, meta: AgentMeta) -> str | None:
    """Whose hold pays for a new agent: its parent's while that is live, else the tree's remainder."""
    return meta.parent_id if state.live(meta.parent_id) else None


def budget_left(session: Path, meta: AgentMeta, budget: float) -> tuple[float, str | None, LedgerState]:
    """(unreserved USD a new agent may hold, where it is drawn from, the ledger)."""
    state = read_ledger(session)
    source = budget_source(state, meta)
    own = 0.0
    if source is not None:
        # The parent is still spending from its own hold: count its turns so far.
        with contextlib.suppress(FileNotFoundError, SpawnError):
            own = transcript_spend(session / AGENTS_DIR / source, load_meta(session / AGENTS_DIR / source).model)
    return state.free(source, budget, own), source, state


def over_hold(session: Path, agent_id: str, own_spend: float, last_turn: float = 0.0) -> str | None:
    """Why an agent may take no further turn, or None: its own spend and what
    its children hold or were charged have reached its hold, or leave less of
    it than its last turn cost.

    The CLI's own cap (its max_budget_usd, the hold) sees only the agent's own
    turns; without this a parent that gave its hold to children could spend
    it again itself, and a subtree up to about twice its hold. The CLI also
    checks only after a turn, so every agent could overrun by one; a turn
    costs at least about what the last one did (the context only grows), so
    an agent that can't afford another is stopped before it, and the tree
    stays within its budget unless a turn costs much more than the one before.
    """
    state = read_ledger(session)
    if not state.live(agent_id):
        return None  # no tree budget, or already charged
    hold = state.holds[agent_id][1]
    children = sum(state.used_by(c) for c in state.draws(agent_id))
    spent = f"budget: its own turns (${own_spend:.4f}, estimated) and its children (${children:.4f} held or spent)"
    if own_spend + children >= hold:
        return f"{spent} reached its hold of ${hold:.4f}; stopped before another turn"
    if own_spend + children + last_turn > hold:
        left = hold - own_spend - children
        return (
            f"{spent} leave ${left:.4f} of its hold of ${hold:.4f}, less than its last turn cost (${last_turn:.4f}); "
            "stopped before another turn"
        )
    return None


def reserve_budget(session: Path, meta: AgentMeta, secrets_: Sequence[str]) -> None:
    """Hold an admitted agent's cap (under the session lock, right after admit)."""
    if read_limits(session).max_budget_usd is None or meta.max_budget_usd is None:
        return
    entry = LedgerEntry(
        id=meta.id,
        time=utc_now_iso(),
        kind="reserve",
        amount_usd=meta.max_budget_usd,
        drawn_from=budget_source(read_ledger(session), meta),
    )
    append_ledger(session, record_to_json(entry), secrets_)


def agent_history(session: Path) -> tuple[dict[str, list[tuple[float, float]]], list[str]]:
    """(price family -> (cost, duration) of its ended agents, models of the running ones).

    Refused agents never ran and DAG runners call no model: neither counts.
    """
    ended: dict[str, list[tuple[float, float]]] = {}
    running: list[str] = []
    for d in iter_agent_dirs(session):
        with contextlib.suppress(FileNotFoundError, SpawnError):
            meta = load_meta(d)
            if meta.agent == "dag":
                continue
            if not (d / DONE_MARKER).exists() and not (d / FAIL_MARKER).exists():
                running.append(meta.model)
                continue
            outcome = read_json(d / OUTCOME)
            cost, duration = outcome.get("cost_usd"), outcome.get("duration_s")
            if outcome.get("status") != Status.REFUSED and isinstance(cost, int | float) and isinstance(duration, int | float):
                ended.setdefault(price_family(meta.model), []).append((float(cost), float(duration)))
    return ended, running


def ensure_marker(agent_dir: Path | str, status: Any = None) -> None:
    """Write the marker for a committed outcome if a crash left it missing.

    status: the outcome's, when the caller has just read it (saves a read)."""
    for name in (DONE_MARKER, FAIL_MARKER):
        if os.path.exists(f"{agent_dir}/{name}"):  # not pathlib: status asks this of every agent
            return
    agent_dir = Path(agent_dir)
    if status is None:
        try:
            status = read_json(agent_dir / OUTCOME).get("status", "")
        except FileNotFoundError:
            return
    marker = agent_dir / marker_for(str(status))
    with contextlib.suppress(FileExistsError):
        write_new_file(marker, f"{status}\n".encode())
        fsync_dir(agent_dir)


def read_outcome(agent_dir: Path) -> dict[str, Any] | None:
    return read_outcome_keyed(agent_dir)[0]


def read_outcome_keyed(agent_dir: Path | str) -> tuple[dict[str, Any] | None, list[int] | None]:
    """An agent's outcome (None while it has none), and the keys of the file read (read_record)."""
    # outcome.json is always published before its marker, so a marker alone
    # is stray (anything with Bash can write one): no outcome, and `reap`
    # removes it (remove_stray_marker).
    try:
        data, keys = read_record(f"{agent_dir}/{OUTCOME}")
    except FileNotFoundError:
        return None, None
    ensure_marker(agent_dir, data.get("status", ""))
    return data, keys


def remove_stray_marker(agent_dir: Path) -> bool:
    """Remove .done/.fail markers that have no outcome.json; True if there were any."""
    if (agent_dir / OUTCOME).exists():
        return False
    found = False
    for name in (DONE_MARKER, FAIL_MARKER):
        with contextlib.suppress(FileNotFoundError):
            (agent_dir / name).unlink()
            found = True
    return found


def resumed_sdk_session(meta: AgentMeta) -> str | None:
    """The SDK session a --resume agent continues: the one its original's outcome recorded."""
    if not meta.resumed_from:
        return None
    for session in (Path(meta.session), *Path(meta.session).parent.glob("*")):  # under a caller, another session
        outcome = read_outcome(session / AGENTS_DIR / meta.resumed_from)
        if outcome is not None:
            return outcome.get("sdk_session_id")
    return None


def resolve_session_root(flag: str | None, environ: Mapping[str, str]) -> Path:
    """Flag, then environment variable, then sessions/ beside spawn.py."""
    for value, name in ((flag, "--session"), (environ.get(ENV_SESSION_ROOT), ENV_SESSION_ROOT)):
        if value:
            try:
                return Path(value).expanduser().resolve()
            except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop, before Python 3.13
                raise UsageError(f"{name} {value} can't be resolved ({exc}); give another directory") from None
    return DEFAULT_SESSION_ROOT


def ensure_writable_dir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StateError(f"can't create session root {path}: {exc.strerror}; pass --session DIR or set {ENV_SESSION_ROOT}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise StateError(f"session root {path} is not writable; pass --session DIR or set {ENV_SESSION_ROOT}")


def create_session_dir(root: Path, topic: str, now: dt.datetime) -> Path:
    ensure_writable_dir(root)
    base = f"{now:%Y%m%d-%H%M}-{slugify(topic, 32)}"
    for n in range(1, 1000):
        path = root / (base if n == 1 else f"{base}-{n}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        except OSError as exc:
            raise StateError(f"can't create session {path}: {exc.strerror}") from None
        (path / AGENTS_DIR).mkdir()
        return path
    raise StateError(f"too many sessions named {base} in {root}; remove old ones")


def create_agent_dir(session: Path, depth: int) -> tuple[str, Path]:
    agents = session / AGENTS_DIR
    try:
        agents.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StateError(f"can't write session {session}: {exc.strerror}; pass --session DIR") from None
    while True:
        agent_id = new_agent_id(depth)
        try:
            (agents / agent_id).mkdir()
            return agent_id, agents / agent_id
        except FileExistsError:
            continue
        except OSError as exc:
            raise StateError(f"can't write session {session}: {exc.strerror}; pass --session DIR") from None


def iter_agent_dirs(session: Path) -> Iterator[Path]:
    agents = session / AGENTS_DIR
    yield from (agents / name for name in agent_dir_names(agents))


def agent_dir_names(agents: Path) -> list[str]:
    try:
        # scandir's entry type comes with the listing: no stat per agent.
        with os.scandir(agents) as entries:
            return sorted(e.name for e in entries if e.is_dir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def latest_session(root: Path) -> Path | None:
    if not root.is_dir():
        return None
    sessions = [p for p in root.iterdir() if (p / AGENTS_DIR).is_dir()]
    return max(sessions, key=lambda p: p.stat().st_mtime, default=None)


def find_agent_dir(agent_id: str, session: Path | None, root: Path) -> Path:
    """An agent's directory from its id (or a path to it)."""
    as_path = Path(agent_id)
    if (as_path / META).exists() or (as_path.is_dir() and as_path.parent.name == AGENTS_DIR):
        return as_path.resolve()
    if session is not None:
        candidate = session / AGENTS_DIR / agent_id
        if candidate.is_dir():
            return candidate
    if root.is_dir():
        hits = sorted(root.glob(f"*/{AGENTS_DIR}/{agent_id}"), key=lambda p: p.stat().st_mtime)
        if hits:
            return hits[-1]
    raise UnknownAgentError(agent_id, session or root)


def load_meta(agent_dir: Path) -> AgentMeta:
    return load_meta_keyed(agent_dir)[0]


_NONE = type(None)
# The exact JSON types of the meta fields other agents' readers use (schemas/meta.json
# has them all): a dataclass takes any value, and one forged meta.json with a
# number for a task must make that agent corrupt, not stop status, wait or
# reap for the whole tree. type(), not isinstance: True is no depth.
META_TYPES: dict[str, tuple[type, ...]] = {
    "id": (str,),
    "parent_id": (str, _NONE),
    "depth": (int,),
    "max_depth": (int,),
    "pid": (int,),
    "create_time": (float, int),
    "pgid": (int,),
    "task": (str,),
    "tools": (list,),
    "model": (str,),
    "cwd": (str,),
    "started_at": (str,),
    "session": (str,),
    "deadline": (float, int, _NONE),
    "background": (bool,),
    "resumed_from": (str, _NONE),
    "pid_namespace": (str, _NONE),
    "host": (str, _NONE),
    "boot_id": (str, _NONE),
    "sandbox": (str,),
    "containment": (str, _NONE),
    "kind": (str,),
}


def load_meta_keyed(agent_dir: Path | str) -> tuple[AgentMeta, list[int]]:
    """An agent's meta.json, and the keys of the file read (read_record)."""
    data, keys = read_record(f"{agent_dir}/{META}")  # str joins: status loads 10,000s
    try:
        meta = record_from_json(AgentMeta, data)
        for name, allowed in META_TYPES.items():
            if type(getattr(meta, name)) not in allowed:
                raise TypeError(f"{name} is {type(getattr(meta, name)).__name__}, not {' or '.join(t.__name__ for t in allowed)}")
        started_timestamp(meta)  # every reader does arithmetic on it
    except (TypeError, ValueError, AttributeError) as exc:
        raise CorruptRecordError(Path(agent_dir) / META, str(exc)) from None
    return meta, keys


def cache_dir(environ: Mapping[str, str]) -> Path:
    """The per-user cache: $SPAWN_CACHE_DIR, else $XDG_CACHE_HOME/spawn, else ~/.cache/spawn (cache_folder: the fast-start hook's too)."""
    return Path(cache_folder(dict(environ)))


class MarkerEvents:
    """Which agent directories got a .done/.fail marker: inotify (Linux), else unavailable.

    (take_start_slot uses it too, to sleep until a slot file is closed:
    watch(folder, IN_CLOSE), then drain() at each wake.)

    A marker is the committer's last step (created O_EXCL after outcome.json
    is published and charged), so its IN_CREATE says the outcome is whole.
    Renames into place (IN_MOVED_TO) count too. Heartbeat refreshes also
    wake the fd; they are read and dropped, never acted on.
    """

    IN_CLOSE = 0x08 | 0x10  # IN_CLOSE_WRITE | IN_CLOSE_NOWRITE
    IN_MOVED_TO = 0x80
    IN_CREATE = 0x100
    IN_IGNORED = 0x8000  # the watch is gone (directory removed): poll it instead
    IN_Q_OVERFLOW = 0x4000  # events were lost: look at everything
    IN_ONLYDIR = 0x1000000
    IN_NONBLOCK = 0o4000
    IN_CLOEXEC = 0o2000000
    HEADER = "iIII"  # struct inotify_event: wd, mask, cookie, len; then the name

    def __init__(self, *, enabled: bool = True) -> None:
        self.fd = -1
        self.dirs: dict[int, Path] = {}
        self.lost: set[Path] = set()
        """Directories whose watch went away since the last read."""
        self.overflow = False
        if not enabled or not sys.platform.startswith("linux"):
            return
        import ctypes

        try:
            self.libc = ctypes.CDLL(None, use_errno=True)
            self.fd = int(self.libc.inotify_init1(self.IN_NONBLOCK | self.IN_CLOEXEC))
        except (OSError, AttributeError):
            self.fd = -1

    def watch(self, agent_dir: Path, events: int = IN_CREATE | IN_MOVED_TO) -> bool:
        """Watch agent_dir; False if it can't be (no inotify, watch limit reached, no such dir)."""
        if self.fd < 0:
            return False
        wd = int(self.libc.inotify_add_watch(self.fd, os.fsencode(agent_dir), events | self.IN_ONLYDIR))
        if wd < 0:
            return False
        self.dirs[wd] = agent_dir
        return True

    def read(self) -> set[Path]:
        """Directories with a new marker since the last read (sets overflow/lost as they happen)."""
        import struct

        found: set[Path] = set()
        size = struct.calcsize(self.HEADER)
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return found
            offset = 0
            while offset + size <= len(data):
                wd, mask, _, length = struct.unpack_from(self.HEADER, data, offset)
                name = data[offset + size : offset + size + length].rstrip(b"\0")
                offset += size + length
                if mask & self.IN_Q_OVERFLOW:
                    self.overflow = True
                elif mask & self.IN_IGNORED and wd in self.dirs:
                    self.lost.add(self.dirs.pop(wd))
                elif name in (DONE_MARKER.encode(), FAIL_MARKER.encode()) and wd in self.dirs:
                    found.add(self.dirs[wd])

    def drain(self) -> None:
        """Read and drop what has come (for a watch whose events all mean one thing: look again)."""
        with contextlib.suppress(OSError):
            while os.read(self.fd, 65536):
                pass

    def close(self) -> None:
        if self.fd >= 0:
            # Closing an fd that still watches waits out an RCU grace period
            # (7-17 ms measured); with its watches removed first, that wait
            # is the kernel's, in the background (0.1 ms).
            for wd in self.dirs:
                self.libc.inotify_rm_watch(self.fd, wd)
            os.close(self.fd)
            self.fd = -1
# ==================== end src/spawnlib/protocol.py ====================

# ==================== begin src/spawnlib/fast_start.py ====================























# ------------------------------------------------------------- fast start --

# A script run as `python spawn.py` is compiled on every start (only imported
# modules get cached bytecode): ~200 ms of this 9,000-line file, at every
# level. So the first spawn.py of a tree compiles it once into the per-user
# cache, and children, guards and runners run that copy. Where the copies go,
# their names and when one is trusted: programs/fast_start_hook.py, which
# both spawn.py and the hook run.
# `uv run spawn.py`, as users and agents write it, would still compile the
# source at every level. So a run from source puts a start-up hook into the
# virtual environment running it (uv's own, for `uv run`): a .pth line that
# site runs at every interpreter start there. When the script named on the
# command line has a compiled copy, the hook runs that copy, with the same
# argv and pid, in the same interpreter once site has finished; anything
# else starts as usual.
FAST_START_HOOK = (  # src/spawnlib/programs/fast_start_hook.py, inlined by tools/bundle.py
    '"""Written by spawn.py (docs/benchmarks.md: "Fast start"); SPAWN_NO_FAST_START=1 turns it off.\n'
    '\n'
    'Runs at every interpreter start in this environment, from _spawn_fast_start.pth.\n'
    "If the script on the command line has a compiled copy in spawn.py's cache,\n"
    'run that copy instead of compiling the source: in this interpreter once site\n'
    "has finished, else by exec'ing the same interpreter on it.\n"
    'Remove _spawn_fast_start.pth to remove it.\n'
    '"""\n'
    '\n'
    "# spawn.py runs this module's code too (bundled, as src/spawnlib/programs/fast_start_hook.py):\n"
    "# the cache's place, a copy's name and the trust in a copy are defined here\n"
    '# alone. Builtin modules only: for every other program in the environment it\n'
    '# costs a look at sys.argv, or for a .py file one read and a few stats.\n'
    '\n'
    'import os\n'
    'import stat\n'
    'import sys\n'
    '\n'
    'FAST_START_MODULE = "_spawn_fast_start"  # this file\'s name in site-packages, and its .pth\'s\n'
    'ENV_NO_FAST_START = "SPAWN_NO_FAST_START"  # 1: neither install nor use the hook\n'
    "# A copy is named by the source's path and bytes: the path because the code\n"
    '# finds schemas/ and sessions/ beside the file it was compiled from, so two\n'
    "# projects' identical copies must not share one.\n"
    'COMPILED_DIR = "compiled"\n'
    'COMPILED_HASH_KEY = 0x7370_6177_6E  # any fixed key: the name carries the cache tag too\n'
    '# A copy is run or handed out only when copy_is_trusted: the cache folder and\n'
    "# the copy are the user's and nobody else's to replace, the copy is a regular\n"
    "# file, and its header says it was compiled from the source's own bytes (a\n"
    '# checked-hash pyc, PEP 552): the name alone is no proof, as any file can be\n'
    '# put at a name. The header is no signature either: what keeps a forged copy\n'
    '# out is that no contained agent can write the cache (docs/guarantees.md).\n'
    "COMPILED_MODE_FORBIDDEN = 0o022  # group- or other-writable: another user's to replace\n"
    'PYC_CHECKED_HASH = (3).to_bytes(4, "little")  # PEP 552 flags: hash-based, checked against the sourc'
    'e\n'
    "# spawn.py's own names for these, which this file can't import when it runs\n"
    '# as the hook (test_fast_start checks they agree).\n'
    'HOOK_ENV_CACHE_DIR = "SPAWN_CACHE_DIR"  # ENV_CACHE_DIR\n'
    'HOOK_ENV_SESSION = "SPAWN_SESSION"  # ENV_SESSION\n'
    'HOOK_ENV_NO_FORKSERVER = "SPAWN_NO_FORKSERVER"  # ENV_NO_FORKSERVER\n'
    'HOOK_FORKSERVER_SOCKET = "forkserver.sock"  # FORKSERVER_SOCKET\n'
    "# For a nested spawn, the hook runs spawn.py's stand-in itself, from the\n"
    "# script's own bytes: when the session's fork server takes the spawn, no second\n"
    '# interpreter starts to load the copy (~20 ms a level). tools/bundle.py writes\n'
    "# these two lines around the stand-in's code, which defines\n"
    '# forkserver_stand_in(argv, environ) -> exit code or None; a spawn.py without\n'
    "# them (another version's) is run as a copy only. A later version that changes\n"
    '# the contract changes the markers.\n'
    'STAND_IN_BEGIN = b"\\n# >>> stand-in: the fast-start hook runs from here to the end marker >>>\\n"\n'
    'STAND_IN_END = b"\\n# <<< end of the stand-in: forkserver_stand_in(argv, environ) -> int | None <<<\\n'
    '"\n'
    "ANNOTATIONS_FLAG = 0x1000000  # __future__.annotations.compiler_flag: the stand-in's own future impo"
    'rt\n'
    '\n'
    '\n'
    'def cache_folder(environ: "dict[str, str] | os._Environ[str]") -> str:\n'
    '    """The per-user cache: $SPAWN_CACHE_DIR, else $XDG_CACHE_HOME/spawn, else ~/.cache/spawn."""\n'
    '    if environ.get(HOOK_ENV_CACHE_DIR):\n'
    '        return os.path.expanduser(environ[HOOK_ENV_CACHE_DIR])\n'
    '    base = environ.get("XDG_CACHE_HOME") or os.path.join(environ.get("HOME") or os.path.expanduser("'
    '~"), ".cache")\n'
    '    return os.path.join(os.path.expanduser(base), "spawn")\n'
    '\n'
    '\n'
    'def compiled_name(path: "str | os.PathLike[str]", source: bytes) -> str:\n'
    '    """The file name of the compiled copy of the spawn.py at path (resolved) with these bytes."""\n'
    '    import _imp\n'
    '\n'
    '    digest = _imp.source_hash(COMPILED_HASH_KEY, os.fsencode(path) + b"\\0" + source).hex()\n'
    '    return "spawn-" + digest + "." + str(sys.implementation.cache_tag) + ".pyc"\n'
    '\n'
    '\n'
    'def pyc_header(source: bytes) -> bytes:\n'
    '    """The 16-byte header of a copy compiled from source: magic, checked-hash flags, the source\'s ha'
    'sh."""\n'
    '    import _frozen_importlib_external as bootstrap\n'
    '    import _imp\n'
    '\n'
    '    magic = bootstrap.MAGIC_NUMBER\n'
    '    return magic + PYC_CHECKED_HASH + _imp.source_hash(int.from_bytes(magic, "little"), source)\n'
    '\n'
    '\n'
    'def copy_is_trusted(folder: "str | os.PathLike[str]", copy: "str | os.PathLike[str]", source: bytes)'
    ' -> bool:\n'
    '    """Ours, a regular file (not a link), nobody else\'s to replace, and compiled from source.\n'
    '\n'
    '    The copy is opened without following a link, and its owner and mode are\n'
    '    read from that open file, so what is checked is what was read."""\n'
    '    try:\n'
    '        fd = os.open(copy, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)\n'
    '    except OSError:\n'
    '        return False\n'
    '    try:\n'
    '        for st in (os.stat(folder), os.fstat(fd)):\n'
    '            if st.st_uid != os.getuid() or st.st_mode & COMPILED_MODE_FORBIDDEN:\n'
    '                return False\n'
    '        header = os.read(fd, 16) if stat.S_ISREG(st.st_mode) else b""\n'
    '    except OSError:\n'
    '        return False\n'
    '    finally:\n'
    '        os.close(fd)\n'
    '    return header == pyc_header(source)\n'
    '\n'
    '\n'
    'def compiled_copy(script: str, environ: "dict[str, str] | os._Environ[str]") -> "tuple[str, bytes] |'
    ' None":\n'
    '    """The compiled copy to run for script, and the script\'s bytes; or None."""\n'
    '    if not script.endswith(".py") or environ.get(ENV_NO_FAST_START) == "1" or sys.flags.optimize:\n'
    '        return None\n'
    '    try:\n'
    '        path = os.path.realpath(script)\n'
    '        if not stat.S_ISREG(os.stat(path).st_mode):\n'
    "            return None  # a FIFO's bytes are the script's: Python must read them, not us\n"
    '        with open(path, "rb") as fh:\n'
    '            source = fh.read()\n'
    '        folder = os.path.join(cache_folder(environ), COMPILED_DIR)\n'
    '        copy = os.path.join(folder, compiled_name(path, source))\n'
    '    except (OSError, ValueError):\n'
    '        return None\n'
    '    # A planted or stale copy is never run: the source runs instead.\n'
    '    return (copy, source) if copy_is_trusted(folder, copy, source) else None\n'
    '\n'
    '\n'
    'def hook_stand_in(copy: str, source: bytes) -> None:\n'
    '    """Hand this spawn to its session\'s fork server from here, as the copy\'s\n'
    "    first lines would: the same code, compiled from the script's own bytes\n"
    "    (its stand-in, between the markers), minus an interpreter's start.\n"
    "    Returns only if the server doesn't take it (none, a refusal, a verb it\n"
    "    doesn't run): then the copy runs, and asks again itself.\n"
    '    """\n'
    '    start = source.find(STAND_IN_BEGIN)\n'
    '    end = source.find(STAND_IN_END, start)\n'
    '    if start < 0 or end < 0:\n'
    '        return\n'
    '    try:\n'
    "        # The file's own future import, and its own line numbers in a traceback.\n"
    '        code = compile(b"\\n" * source.count(b"\\n", 0, start) + source[start:end], sys.argv[0], "exec'
    '", ANNOTATIONS_FLAG, True)\n'
    '        scope: dict[str, object] = {"__name__": FAST_START_MODULE + ".stand_in", "__file__": copy}\n'
    '        exec(code, scope)\n'
    '        ask = scope["forkserver_stand_in"]\n'
    '    except Exception:\n'
    '        return\n'
    '    if not callable(ask):\n'
    '        return\n'
    '    try:\n'
    '        served = ask(sys.argv[1:], os.environ)\n'
    '    except BaseException:\n'
    "        # As an error in the copy's first lines ends it: never a second try\n"
    '        # at a spawn that may already be running.\n'
    '        import traceback\n'
    '\n'
    '        traceback.print_exc()\n'
    '        os._exit(1)\n'
    '    if isinstance(served, int):\n'
    '        os._exit(served)\n'
    '\n'
    '\n'
    'def run_at_file_start(copy: str, source: bytes) -> bool:\n'
    '    """Have this interpreter run the copy where it would run the script; False\n'
    "    where that can't be arranged, and the caller execs the copy instead.\n"
    '\n'
    '    Python raises the audit event cpython.run_file once it has started up\n'
    '    (site done: every .pth file, sitecustomize) and holds no import lock: the\n'
    '    hook runs the copy there and exits, so no second interpreter starts (~20\n'
    '    ms a spawn). Not for -i, which wants the interpreter after the script.\n'
    '    """\n'
    '    if sys.flags.inspect or sys.flags.interactive or "__main__" not in sys.modules:\n'
    '        return False\n'
    '    header = pyc_header(source)\n'
    '    pending = [copy]\n'
    '\n'
    '    def at_event(event: str, args: tuple[object, ...]) -> None:\n'
    '        if event == "cpython.run_file" and pending:\n'
    '            run_copy(pending.pop(), header)  # returns only if the copy changed since: the script ru'
    'ns instead\n'
    '\n'
    "    sys.addaudithook(at_event)  # for the process's life, as every audit hook: one comparison an eve"
    'nt\n'
    '    return True\n'
    '\n'
    '\n'
    'def run_copy(copy: str, header: bytes) -> None:\n'
    '    """Run the copy as `python COPY ARGS` would, then exit as it would: never\n'
    '    returns, unless the copy\'s header is no longer the one that was trusted."""\n'
    '    import marshal\n'
    '\n'
    '    try:\n'
    '        with open(copy, "rb") as fh:\n'
    '            data = fh.read()\n'
    '        if data[:16] != header:\n'
    '            return\n'
    '        code = marshal.loads(memoryview(data)[16:])\n'
    '    except (OSError, ValueError, EOFError, TypeError):\n'
    '        return\n'
    '    sys.argv[0] = copy\n'
    '    if not sys.flags.safe_path and sys.path:\n'
    "        # The copy's folder, as `python COPY` has it, not the script's: a\n"
    "        # project's own mcp/ or anyio/ beside spawn.py never shadows a dependency.\n"
    '        sys.path[0] = os.path.dirname(copy)\n'
    '    import _frozen_importlib_external as bootstrap\n'
    '\n'
    '    scope = sys.modules["__main__"].__dict__\n'
    '    scope.update(__file__=copy, __cached__=None, __loader__=bootstrap.SourcelessFileLoader("__main__'
    '", copy))\n'
    '    status, interrupted = 0, False\n'
    '    try:\n'
    '        exec(code, scope)\n'
    '    except SystemExit as exc:\n'
    '        status = exit_status(exc.code)\n'
    '    except KeyboardInterrupt:\n'
    '        sys.excepthook(*sys.exc_info())\n'
    '        status, interrupted = 130, True\n'
    '    except BaseException:\n'
    '        sys.excepthook(*sys.exc_info())\n'
    '        status = 1\n'
    '    finish(status, interrupted)\n'
    '\n'
    '\n'
    'def exit_status(code: object) -> int:\n'
    '    """SystemExit\'s code as Python\'s exit status: None 0, an int itself, anything else printed and 1'
    '."""\n'
    '    if code is None:\n'
    '        return 0\n'
    '    if isinstance(code, int):\n'
    '        return code\n'
    '    print(code, file=sys.stderr)\n'
    '    return 1\n'
    '\n'
    '\n'
    'def finish(status: int, interrupted: bool) -> None:\n'
    '    """End as the interpreter would after the script: threads joined, atexit\n'
    '    run, streams flushed; a KeyboardInterrupt\'s end is by SIGINT."""\n'
    '    import atexit\n'
    '\n'
    '    if "threading" in sys.modules:\n'
    '        sys.modules["threading"]._shutdown()\n'
    '    atexit._run_exitfuncs()\n'
    '    for stream in (sys.stdout, sys.stderr):\n'
    '        try:\n'
    '            stream.flush()\n'
    '        except (AttributeError, OSError, ValueError):\n'
    '            continue\n'
    '    if interrupted:  # as Python ends on an uncaught one: by SIGINT\n'
    '        import _signal  # type: ignore[import-not-found,unused-ignore]\n'
    '\n'
    '        _signal.signal(_signal.SIGINT, _signal.SIG_DFL)\n'
    '        os.kill(os.getpid(), _signal.SIGINT)\n'
    '    os._exit(status & 0xFF)\n'
    '\n'
    '\n'
    'def hook_main() -> None:\n'
    '    argv = list(getattr(sys, "orig_argv", ()))\n'
    '    at = len(argv) - len(sys.argv)\n'
    "    # Only where exec keeps the pid: the process is its parent's child and an agent's stand-in.\n"
    '    if os.name != "posix" or not sys.argv or at < 1 or argv[at] != sys.argv[0] or not sys.executable'
    ':\n'
    '        return\n'
    '    found = compiled_copy(sys.argv[0], os.environ)\n'
    '    if found is None:\n'
    '        return\n'
    '    copy, source = found\n'
    "    session = os.environ.get(HOOK_ENV_SESSION)  # a nested spawn's; compile nothing for a root or a "
    'session with no server\n'
    '    if session and os.environ.get(HOOK_ENV_NO_FORKSERVER) != "1" and os.path.exists(os.path.join(ses'
    'sion, HOOK_FORKSERVER_SOCKET)):\n'
    '        hook_stand_in(copy, source)\n'
    '    if run_at_file_start(copy, source):\n'
    '        return\n'
    "    import _signal  # type: ignore[import-not-found,unused-ignore]  # signal's C half: builtin (spaw"
    "n.py's stand-in imports it too)\n"
    '\n'
    '    # Python ignores these at start; the new interpreter does it again, and a\n'
    '    # failed exec puts them back as they were.\n'
    '    saved = [(n, _signal.signal(n, _signal.SIG_DFL)) for n in (_signal.SIGPIPE, _signal.SIGXFSZ)]\n'
    '    try:\n'
    '        os.execv(sys.executable, [*argv[:at], copy, *argv[at + 1 :]])\n'
    '    except OSError:\n'
    '        for n, handler in saved:\n'
    '            _signal.signal(n, handler)\n'
    '\n'
    '\n'
    'if __name__ == FAST_START_MODULE:  # as the hook; spawn.py only uses the functions above\n'
    '    hook_main()\n'
)
# `uv` on a sandboxed agent's PATH (programs/uv_shim.py says why): the
# program, and the sh that runs it with the tree's Python, in a folder of
# the cache named by their hash. The cache is read-only in every sandbox.
UV_SHIM = (  # src/spawnlib/programs/uv_shim.py, inlined by tools/bundle.py
    '"""`uv` in an agent\'s Bash: `uv run [options] PATH/spawn.py ARGS` without uv, where uv adds nothing.'
    '\n'
    '\n'
    '`uv run spawn.py ...` is how users, skills and scripts start a child. uv\n'
    "would resolve the script's environment again at every level (0.15 to 0.3 s),\n"
    'and find the one the tree already runs: $SPAWN_PYTHON.\n'
    '\n'
    "- Outside a sandbox, when the script has the very bytes the tree's spawn.py\n"
    "  has (the checked hash in $SPAWN_PY's header, PEP 552: the same PEP 723\n"
    '  block, so the same environment) and no option but INERT ones is given,\n'
    "  the tree's interpreter runs that script. Anything else is uv's.\n"
    "- Inside a sandbox uv can't open its cache: the cache is read-only there, as\n"
    '  it must be (an agent that could write it would run its code outside the\n'
    '  sandbox at the next `uv run`). So `uv run [options] PATH/spawn.py` runs the\n'
    "  tree's own spawn.py, $SPAWN_PY, whatever the options.\n"
    '\n'
    'Anything else goes to the next uv on PATH, which says for itself what it\n'
    "can't do. Run as `python -I -S` from its folder's `uv` (a two-line sh):\n"
    'builtin modules only.\n'
    '"""\n'
    '\n'
    'import os\n'
    'import sys\n'
    '\n'
    '# `uv run` options that come before the script: those that take a value\n'
    "# (uv run --help), and those that don't. Any other option is left to uv.\n"
    'VALUED = (\n'
    '    "--python", "-p", "--with", "--with-editable", "--with-requirements", "--directory", "--project"'
    ', "--cache-dir",\n'
    '    "--env-file", "--index", "--default-index", "--index-url", "--extra-index-url", "--find-links", '
    '"-f", "--exclude-newer",\n'
    '    "--config-file", "--color", "--python-preference", "--index-strategy", "--resolution", "--prerel'
    'ease", "--link-mode",\n'
    ')  # fmt: skip\n'
    'FLAGS = (\n'
    '    "--script", "-s", "-q", "--quiet", "-v", "--verbose", "--no-project", "--frozen", "--locked", "-'
    '-offline", "--no-sync",\n'
    '    "--isolated", "--no-config", "--no-progress", "--native-tls", "--no-cache", "-n", "--active", "-'
    '-no-env-file",\n'
    '    "--exact", "--all-extras", "--no-dev", "--compile-bytecode", "--refresh", "--managed-python", "-'
    '-no-managed-python",\n'
    ')  # fmt: skip\n'
    '# Options that change nothing about what runs, nor where: with any other,\n'
    '# outside a sandbox, uv runs it.\n'
    'INERT = ("--script", "-s", "-q", "--quiet", "--no-progress", "--offline", "--frozen", "--no-project"'
    ')\n'
    'SCRIPT_NAME = "spawn.py"\n'
    'PYC_CHECKED_HASH = (3).to_bytes(4, "little")  # fast_start_hook\'s: a hash-based pyc, checked against'
    ' its source\n'
    '\n'
    '\n'
    'def spawn_run(argv: "list[str]") -> "tuple[list[str], str, list[str]] | None":\n'
    '    """(uv\'s options, PATH/spawn.py, the arguments after it) when argv is\n'
    '    `run [options] [--] PATH/spawn.py ARGS`; None for anything else."""\n'
    '    if argv[:1] != ["run"]:\n'
    '        return None\n'
    '    i = 1\n'
    '    while i < len(argv):\n'
    '        word = argv[i]\n'
    '        if word == "--":\n'
    '            i += 1\n'
    '            break\n'
    '        if not word.startswith("-"):\n'
    '            break\n'
    '        if word in VALUED:\n'
    '            i += 2\n'
    '        elif word in FLAGS or (word.startswith("--") and "=" in word and word.split("=", 1)[0] in VA'
    'LUED):\n'
    '            i += 1\n'
    '        else:\n'
    '            return None\n'
    '    if i < len(argv) and os.path.basename(argv[i]) == SCRIPT_NAME:\n'
    '        return [w for w in argv[1:i] if w != "--"], argv[i], argv[i + 1 :]\n'
    '    return None\n'
    '\n'
    '\n'
    'def same_bytes(script: str, copy: str) -> bool:\n'
    '    """Whether script holds the bytes the tree\'s spawn.py has: copy\'s, or those its header\'s checked'
    ' hash was taken of."""\n'
    '    import _frozen_importlib_external as bootstrap\n'
    '    import _imp\n'
    '\n'
    '    try:\n'
    '        with open(script, "rb") as fh:\n'
    '            source = fh.read()\n'
    '        with open(copy, "rb") as fh:\n'
    '            header = fh.read(16) if copy.endswith(".pyc") else fh.read()\n'
    '    except OSError:\n'
    '        return False\n'
    '    if not copy.endswith(".pyc"):  # the tree runs its source: no copy was made\n'
    '        return header == source\n'
    '    magic = bootstrap.MAGIC_NUMBER\n'
    '    return header == magic + PYC_CHECKED_HASH + _imp.source_hash(int.from_bytes(magic, "little"), so'
    'urce)\n'
    '\n'
    '\n'
    'def inside_sandbox() -> bool:\n'
    '    """bwrap is pid 1 of a sandbox\'s own pid namespace (processes.inside_sandbox)."""\n'
    '    try:\n'
    '        with open("/proc/1/cmdline", "rb") as fh:\n'
    '            return os.path.basename(fh.read().split(b"\\0")[0]) == b"bwrap"\n'
    '    except OSError:\n'
    '        return False\n'
    '\n'
    '\n'
    'def tree_command(argv: "list[str]", environ: "dict[str, str] | os._Environ[str]", sandboxed: bool) -'
    '> "list[str] | None":\n'
    '    """What runs `uv argv` with the tree\'s interpreter instead; None: uv\'s to run."""\n'
    '    found = spawn_run(argv)\n'
    '    python, copy = environ.get("SPAWN_PYTHON"), environ.get("SPAWN_PY")\n'
    '    if found is None or not python or not copy:\n'
    '        return None\n'
    '    options, script, rest = found\n'
    '    if sandboxed:\n'
    '        return [python, copy, *rest]\n'
    '    if all(option in INERT for option in options) and same_bytes(script, copy):\n'
    '        return [python, script, *rest]  # its own path: schemas/ beside it, its own compiled copy\n'
    '    return None\n'
    '\n'
    '\n'
    'def real_uv(here: str) -> "str | None":\n'
    '    """The next uv on PATH after this one\'s folder."""\n'
    '    for folder in os.environ.get("PATH", "").split(os.pathsep):\n'
    '        if not folder or os.path.realpath(folder) == here:\n'
    '            continue\n'
    '        candidate = os.path.join(folder, "uv")\n'
    '        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):\n'
    '            return candidate\n'
    '    return None\n'
    '\n'
    '\n'
    'def main() -> None:\n'
    '    argv = sys.argv[1:]\n'
    '    here = os.path.realpath(os.path.dirname(os.path.abspath(sys.argv[0])))\n'
    '    command = tree_command(argv, os.environ, inside_sandbox())\n'
    '    if command is not None:\n'
    '        os.execv(command[0], command)\n'
    '    uv = real_uv(here)\n'
    '    if uv is None:\n'
    '        sys.stderr.write("uv: command not found\\n")\n'
    '        sys.exit(127)\n'
    '    os.execv(uv, [uv, *argv])\n'
    '\n'
    '\n'
    'if __name__ == "__main__":\n'
    '    main()\n'
)
# The sh hands a command naming a spawn.py to the program, and any other
# straight to the next uv on PATH, with no interpreter's start (~25 ms) for
# an agent's other uv commands.
UV_SHIM_SH = """#!/bin/sh
for word; do
    case $word in *spawn.py) exec "${SPAWN_PYTHON:-python3}" -I -S "${0%/uv}/uv_shim.py" "$@" ;; esac
done
set -f
IFS=:
for folder in $PATH; do
    [ -n "$folder" ] && [ "$folder" != "${0%/uv}" ] && [ -x "$folder/uv" ] && [ ! -d "$folder/uv" ] && exec "$folder/uv" "$@"
done
echo "uv: command not found" >&2
exit 127
"""


def copy_fingerprint(path: Path) -> tuple[int, ...]:
    """What changes when a file is written or replaced: a write moves its
    ctime, which no user can set back; a rename brings another inode."""
    st = os.lstat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def compile_copy(folder: Path, target: Path) -> None:
    """Compile this spawn.py into target: under a fresh name first (py_compile
    renames its own temporary file onto it), made writable by the user alone
    whatever the source's mode, then renamed over whatever is at target, a
    link included, which is replaced and never followed."""
    import py_compile

    fresh = folder / f".{target.name}.{os.getpid()}.tmp"
    try:
        py_compile.compile(
            str(SCRIPT_PATH),
            cfile=str(fresh),
            dfile=str(SCRIPT_PATH),
            doraise=True,
            invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
        )
        os.chmod(fresh, 0o644)
        os.replace(fresh, target)
    except py_compile.PyCompileError as exc:
        raise OSError(str(exc)) from None
    finally:
        with contextlib.suppress(OSError):
            fresh.unlink()


@functools.cache
def verified_copy() -> tuple[Path, tuple[int, ...]] | None:
    """The compiled copy to hand out and its fingerprint when checked, or None for the source.

    A process already running a compiled copy hands on that same copy, so a
    whole tree runs one version even if the source is edited meanwhile. Any
    other copy is checked (copy_is_trusted), and one that fails is compiled
    afresh. Any failure (a read-only cache, inside a sandbox) falls back to
    the source.
    """
    try:
        if Path(__file__).suffix == ".pyc":
            own = Path(__file__).resolve()
            return own, copy_fingerprint(own)
        source = SCRIPT_PATH.read_bytes()
        folder = cache_dir(os.environ) / COMPILED_DIR
        target = folder / compiled_name(SCRIPT_PATH, source)
        if not copy_is_trusted(folder, target, source):
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            st = os.lstat(folder)
            if st.st_uid == os.getuid() and st.st_mode & COMPILED_MODE_FORBIDDEN:
                # Made by an older spawn.py under a umask of 002: every copy in it is checked one by one.
                os.chmod(folder, st.st_mode & ~COMPILED_MODE_FORBIDDEN)
            compile_copy(folder, target)
            if not copy_is_trusted(folder, target, source):
                return None
        return target, copy_fingerprint(target)
    except OSError:
        return None


def compiled_script() -> Path:
    """The file to execute for this spawn.py: its compiled copy, else its source.

    Every call hands it out afresh (to a runner, a guard, the CLI's
    environment, a briefing): a copy changed since it was checked is checked
    again, and compiled again if it fails, rather than handed on.
    """
    found = verified_copy()
    if found is None:
        return SCRIPT_PATH
    with contextlib.suppress(OSError):
        if copy_fingerprint(found[0]) == found[1]:
            return found[0]
    if Path(__file__).suffix == ".pyc":
        return SCRIPT_PATH  # the copy this process runs changed under it: never hand that on
    verified_copy.cache_clear()
    found = verified_copy()
    return found[0] if found is not None else SCRIPT_PATH


def uv_shim_folder(environ: Mapping[str, str]) -> Path | None:
    """The cache's folder holding the `uv` shim, written if absent or not ours as it should be; None where it can't be."""
    import _imp  # builtin: every agent's start writes or checks the shim, and hashlib's import is ~4 ms of it

    files = {"uv_shim.py": (UV_SHIM.encode(), 0o644), "uv": (UV_SHIM_SH.encode(), 0o755)}
    digest = _imp.source_hash(COMPILED_HASH_KEY, UV_SHIM.encode() + UV_SHIM_SH.encode()).hex()
    folder = cache_dir(environ) / f"uv-shim-{digest}"
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        for name, (body, mode) in files.items():
            path = folder / name
            with contextlib.suppress(OSError, SpawnError):
                st = os.lstat(path)
                ours = st.st_uid == os.getuid() and not st.st_mode & COMPILED_MODE_FORBIDDEN and st.st_mode & 0o777 == mode
                if ours and read_regular_file(path, len(body) + 1)[0] == body:
                    continue
            write_file_atomic(path, body)
            os.chmod(path, mode)
        st = os.lstat(folder)
        return folder if st.st_uid == os.getuid() and not st.st_mode & COMPILED_MODE_FORBIDDEN else None
    except OSError:
        return None


def fast_start_site() -> Path | None:
    """The site-packages of the virtual environment running us, or None for a base interpreter."""
    if sys.prefix == sys.base_prefix:
        return None
    import sysconfig

    site = Path(sysconfig.get_path("purelib"))
    return site if site.is_relative_to(sys.prefix) else None


def install_fast_start(environ: Mapping[str, str]) -> None:
    """Put the start-up hook (FAST_START_HOOK) into the virtual environment running this source.

    Never into a base interpreter's site-packages, which every program on
    the machine shares. The module goes first: a .pth line naming a missing
    module would print an error at every start. Best effort: a read-only
    environment (inside a sandbox) just keeps compiling.
    """
    if environ.get(ENV_NO_FAST_START) == "1" or Path(__file__).suffix != ".py":
        return  # and a compiled copy never pays for the sysconfig import below
    site = fast_start_site()
    if site is None:
        return
    files = ((f"{FAST_START_MODULE}.py", FAST_START_HOOK), (f"{FAST_START_MODULE}.pth", f"import {FAST_START_MODULE}\n"))
    for name, text in files:
        path = site / name
        # read_regular_file and write_file_atomic: a FIFO or a link planted
        # at either name is neither waited on nor followed.
        with contextlib.suppress(OSError, SpawnError):
            if read_regular_file(path)[0] == text.encode():
                continue
        try:
            write_file_atomic(path, text.encode())
        except OSError:
            return
# ==================== end src/spawnlib/fast_start.py ====================

# ==================== begin src/spawnlib/processes.py ====================




















































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


# A process whose ancestry is walked: this one's (from /proc where it can
# be), or the one a server was handed on a socket (psutil's). A string: the
# alias itself must not import psutil.
Subject: TypeAlias = "psutil.Process | ProcfsProcess"


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
    try:
        mount = cgroup_v2_mount(Path("/proc/self/mountinfo").read_text())
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    rel = next((line[3:] for line in lines if line.startswith("0::")), None)
    if mount is None or rel is None or rel.endswith(" (deleted)"):
        return None
    return mount / rel.lstrip("/")


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
GUARD_BOOTSTRAP = (  # src/spawnlib/programs/guard_wait.py, inlined by tools/bundle.py
    '"""An agent\'s guard where there is no /bin/sh: run by `python -I -S -c`, argv `spawn.py _guard DIR`.'
    '\n'
    '\n'
    'The runner writes SETTLED (processes.GUARD_SETTLED) to our stdin right before\n'
    'its exit when it left the guard nothing to do; otherwise (EOF: it died) the\n'
    'full guard runs.\n'
    '"""\n'
    '\n'
    'import os\n'
    'import sys\n'
    '\n'
    'SETTLED = b"settled\\n"  # processes.GUARD_SETTLED: test_forkserver checks they agree\n'
    '\n'
    'if sys.stdin.buffer.read() == SETTLED:\n'
    '    os._exit(0)\n'
    'os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n'
)


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
GUARD_ABOVE_BOOTSTRAP = (  # src/spawnlib/programs/guard_above.py, inlined by tools/bundle.py
    '"""The guard above a root without a cgroup: run by `python -c` in the process the user started.\n'
    '\n'
    "argv: the script, the pipe's read end, the runner's pid (processes.fork_below_guard\n"
    'says why). It passes the terminal signals on to the runner and exits as the\n'
    'runner did; if the runner left no outcome, it becomes `spawn.py _guard --above`.\n'
    '"""\n'
    '\n'
    'import os\n'
    'import signal\n'
    'import sys\n'
    '\n'
    'script, pipe, runner = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])\n'
    'passed = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}\n'
    'status: int | None = None\n'
    'while status is None:\n'
    '    try:\n'
    '        while status is None:\n'
    '            pid, st = os.waitpid(-1, os.WNOHANG)\n'
    '            if pid == 0:\n'
    '                break\n'
    '            if pid == runner:\n'
    '                status = st\n'
    '    except ChildProcessError:\n'
    '        break\n'
    '    if status is None:\n'
    '        info = signal.sigwaitinfo(passed | {signal.SIGCHLD})\n'
    "        if info.si_signo in passed and info.si_code != 0x80:  # 0x80, SI_KERNEL: the terminal's\n"
    '            try:\n'
    '                os.kill(runner, info.si_signo)\n'
    '            except OSError:\n'
    '                pass\n'
    'code = os.waitstatus_to_exitcode(status) if status is not None else 3  # ExitCode.STATE\n'
    'os.set_blocking(pipe, False)\n'
    'said = b""\n'
    'try:\n'
    '    while chunk := os.read(pipe, 65536):\n'
    '        said += chunk\n'
    'except BlockingIOError:\n'
    '    pass\n'
    'agent_dir, entry = [*said.decode(errors="replace").splitlines(), "", ""][:2]\n'
    'if agent_dir and not os.path.exists(os.path.join(agent_dir, "outcome.json")):\n'
    '    null = os.open(os.devnull, os.O_RDWR)\n'
    '    for fd in (0, 1, 2):\n'
    '        os.dup2(null, fd)\n'
    '    os.execv(sys.executable, [sys.executable, script, "_guard", agent_dir, f"--above={code}"])\n'
    '\n'
    '\n'
    'def below() -> "list[int]":\n'
    '    """Every process below us, from /proc."""\n'
    '    parents: dict[int, list[int]] = {}\n'
    '    for name in os.listdir("/proc"):\n'
    '        try:\n'
    '            with open(f"/proc/{name}/stat", "rb") as stat:\n'
    '                fields = stat.read().rpartition(b")")[2].split()\n'
    '            parents.setdefault(int(fields[1]), []).append(int(name))\n'
    '        except (OSError, ValueError, IndexError):\n'
    '            continue\n'
    '    found: list[int] = []\n'
    '    todo = [os.getpid()]\n'
    '    while todo:\n'
    '        kids = parents.get(todo.pop(), [])\n'
    '        found += kids\n'
    '        todo += kids\n'
    '    return found\n'
    '\n'
    '\n'
    'for _ in range(100):  # orphans re-parent to us as their parents die\n'
    '    try:\n'
    '        while os.waitpid(-1, os.WNOHANG)[0]:\n'
    '            pass\n'
    '    except ChildProcessError:\n'
    '        break\n'
    '    for pid in below():\n'
    '        try:\n'
    '            os.kill(pid, signal.SIGKILL)\n'
    '        except OSError:\n'
    '            pass\n'
    '    signal.sigtimedwait({signal.SIGCHLD}, 0.05)\n'
    'if entry:\n'
    '    try:\n'
    '        os.unlink(entry)\n'
    '    except OSError:\n'
    '        pass\n'
    'if code < 0 and -code in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL, signal.SIGPI'
    'PE):\n'
    '    if -code != signal.SIGKILL:\n'
    '        signal.signal(-code, signal.SIG_DFL)\n'
    '        signal.pthread_sigmask(signal.SIG_UNBLOCK, {-code})\n'
    '    os.kill(os.getpid(), -code)\n'
    'os._exit(code if code >= 0 else 128 - code)\n'
)

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
    become_subreaper()  # the runner will be one too, for what it starts while it lives
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
        proc = (subject or ancestry_subject()).parent()
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
            return proc
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

    bwrap binds what the sandboxed agent may write: its agent directory's
    scratch/ among them (sandbox_writes). bwrap's
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
# ==================== end src/spawnlib/processes.py ====================

# ==================== begin src/spawnlib/cluster.py ====================


























# ------------------------------------------------------------------ cluster --
#
# The Ray backend's seam in spawn.py: Ray itself lives in the sibling
# tools/ray_place.py (its own lock), which spawn.py runs, never imports. For
# an agent placed on Ray, the launcher starts the sibling instead of its own
# runner; the sibling (the stand-in) is the agent's process here, and the
# runner it has started on a node names it (SPAWN_RAY_STANDIN).


def ray_address(meta: AgentMeta, environ: Mapping[str, str]) -> str | None:
    """The Ray cluster an agent is placed on, or None (local).

    From meta.json's placement when the resolver set one (backend ray, policy
    ray:ADDRESS), else from SPAWN_PLACEMENT.
    """
    placement = meta.placement or {}
    if placement.get("backend") not in (None, "ray"):
        return None
    policy = str(placement.get("policy") or environ.get(ENV_SPAWN_PLACEMENT, ""))
    name, _, address = policy.strip().partition(":")
    return address.strip() or None if name == "ray" else None


def ray_sibling_command(environ: Mapping[str, str]) -> list[str]:
    """How to run tools/ray_place.py: SPAWN_RAY_SIBLING (path), else tools/ beside spawn.py;
    with SPAWN_RAY_PYTHON (its venv's python), else `uv run --script` (its own lock)."""
    sibling = Path(environ.get(ENV_RAY_SIBLING) or SCRIPT_DIR / "tools" / RAY_SIBLING)
    if not sibling.is_file():
        raise UsageError(
            f"placement ray: {sibling} is not there; copy tools/{RAY_SIBLING} (and tools/spawn_claims.py) beside spawn.py, "
            f"or set {ENV_RAY_SIBLING}"
        )
    python = environ.get(ENV_RAY_PYTHON)
    return [python, str(sibling)] if python else ["uv", "run", "--quiet", "--script", str(sibling)]


def launch_on_ray(agent_dir: Path, address: str, runner: list[str], log_fd: int, asked: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
    """Start the stand-in for agent_dir; its pid and where Ray placed the agent (node_id, host, boot_id).

    asked (the agent's meta.json to be) goes to the stand-in on stdin: under a
    placed parent, the stand-in asks the parent's host actor for its claim with
    it while this launcher, a descendant of the parent's runner, still waits.
    The stand-in reports one JSON line on a pipe, then points its own stdout
    at the runner log: nothing Ray prints reaches ours.
    """
    argv = [*ray_sibling_command(os.environ), "run", "--address", address, "--spawn", *runner, "--", str(agent_dir)]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log_fd, start_new_session=True)
    assert proc.stdin is not None and proc.stdout is not None
    feed_stdin(proc.stdin, json.dumps(dict(asked)).encode())
    line = b""
    limit = time.monotonic() + RAY_PLACE_TIMEOUT_S
    while not line.endswith(b"\n") and time.monotonic() < limit and proc.poll() is None:
        if select.select([proc.stdout], [], [], 0.2)[0]:
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            line += chunk
    proc.stdout.close()
    try:
        where = json.loads(line)
        if not isinstance(where, dict) or "node_id" not in where:
            raise ValueError(where.get("error") if isinstance(where, dict) else "no placement")
    except ValueError as exc:
        if proc.poll() is None:
            Supervised.signal_pid(proc.pid, signal.SIGKILL)  # our own child, not yet reaped
        raise StateError(f"placement ray:{address}: the agent was not placed ({exc}); see {agent_dir}/runner.log") from None
    return proc.pid, {"backend": "ray", "node_id": str(where["node_id"]), "host": where.get("host"), "boot_id": where.get("boot_id")}


def feed_stdin(pipe: Any, data: bytes) -> None:
    """Write data to a child's stdin and close it, from a thread: a big task must not block the placement line."""
    import threading

    def feed() -> None:
        with contextlib.suppress(OSError):  # a stand-in that died at once: its missing line says so
            pipe.write(data)
        with contextlib.suppress(OSError):
            pipe.close()

    threading.Thread(target=feed, name="stand-in stdin", daemon=True).start()


def ray_standin(meta: AgentMeta, environ: Mapping[str, str]) -> int | None:
    """The stand-in pid a placed runner may run under: meta.json names it, not the runner."""
    if (meta.placement or {}).get("backend") != "ray":
        return None
    try:
        return int(environ.get(ENV_RAY_STANDIN, ""))
    except ValueError:
        return None


def node_lost_reason(meta: AgentMeta) -> str | None:
    """Why a placed agent's stand-in ended without an outcome: its node, named."""
    placement = meta.placement or {}
    if placement.get("backend") != "ray":
        return None
    return f"the Ray node {placement.get('node_id')} (host {placement.get('host')}) running it was lost, or its runner died"
# ==================== end src/spawnlib/cluster.py ====================

# ==================== begin src/spawnlib/commit.py ====================
"""The one commit point of an agent's outcome, and the status row it leaves in the session's index.

Above supervision: a status row says whether an unfinished agent still
lives, which only its process identity tells.
"""































def idle_for(agent_dir: Path) -> float | None:
    """Seconds a running agent has been idle, when that is over half its idle timeout."""
    try:
        beat = read_json(agent_dir / HEARTBEAT)
        idle, limit = time.time() - float(beat["last_activity_at"]), float(beat["idle_timeout_s"])
    except (FileNotFoundError, SpawnError, KeyError, TypeError, ValueError):
        return None
    return idle if idle > limit / 2 else None


def liveness(agent_dir: Path, meta: AgentMeta) -> Status:
    """RUNNING, STALE or FAILED (gone) for an agent that has no outcome yet."""
    if not Supervised.of(meta).alive():
        return Status.FAILED
    age = heartbeat_age(agent_dir / HEARTBEAT)
    if age is not None and stale_in(age) < 0:
        return Status.STALE
    return Status.RUNNING


def corrupt_row(agent_dir: Path, error: SpawnError, meta: AgentMeta | None = None) -> dict[str, Any]:
    """A `status` row for an agent whose records can't be read."""
    return {
        "id": meta.id if meta else agent_dir.name,
        "parent_id": meta.parent_id if meta else None,
        "depth": meta.depth if meta else int(agent_dir.name[1:].split("-")[0]) if re.fullmatch(r"a\d+-\w+", agent_dir.name) else 0,
        "state": Status.CORRUPT.value,
        "task": "",
        "duration_s": 0.0,
        "cost_usd": None,
        "cost_known": False,
        "pid": meta.pid if meta else 0,
        "agent_dir": str(agent_dir),
        "error": error.message,
    }


def read_agent_rows(
    agents: str, names: Sequence[str], *, queueing: bool, settled_before: float
) -> list[tuple[str, tuple[list[dict[str, Any]], list[Any] | None]]]:
    """The status rows of each named agent directory (its own, then its native
    subagents'; none while its meta.json isn't written), and its cache entry
    when it is finished and settled."""
    found: list[tuple[str, tuple[list[dict[str, Any]], list[Any] | None]]] = []
    for name in names:
        path = f"{agents}/{name}"
        try:
            meta, meta_keys = load_meta_keyed(path)
        except FileNotFoundError:
            continue  # a background launch between mkdir and meta.json
        except SpawnError as exc:
            # One damaged record must not hide the rest of the tree.
            found.append((name, ([corrupt_row(Path(path), exc)], None)))
            continue
        try:
            outcome, outcome_keys = read_outcome_keyed(path)
            if outcome is not None and (why := outcome_problem(outcome, name)):
                raise CorruptRecordError(f"{path}/{OUTCOME}", f"not an outcome of {name}: {why}")
        except SpawnError as exc:
            found.append((name, ([corrupt_row(Path(path), exc, meta)], None)))
            continue
        state = outcome["status"] if outcome else unfinished_state(Path(path), meta, queueing=queueing).value
        started = started_timestamp(meta)
        row = {
            "id": meta.id,
            "parent_id": meta.parent_id,
            "depth": meta.depth,
            "state": state,
            "task": meta.task.strip().splitlines()[0][:60] if meta.task.strip() else "",
            "duration_s": outcome.get("duration_s") if outcome else round(time.time() - started, 1),
            "cost_usd": outcome.get("cost_usd") if outcome else None,
            "cost_known": bool(outcome and "cost_usd" in outcome),
            "usage": token_counts(outcome["usage"]) if outcome and isinstance(outcome.get("usage"), dict) else None,
            "pid": meta.pid,
            "agent_dir": path,
            "containment": meta.containment,
        }
        if meta.resumed_from:
            row["resumed_from"] = meta.resumed_from
        if state == Status.PAUSED:
            with contextlib.suppress(OSError, SpawnError, ValueError):
                row["paused"] = read_json(Path(path) / PAUSED)  # what it spent, what its next turn needs
        natives = native_rows(path, meta, parent_ended=outcome is not None)
        # Cached: a finished agent whose records were settled before we read them,
        # keyed by the very files read, so a record replaced meanwhile is read
        # again next time. Native subagents' rows come from a log: not cached.
        keys = meta_keys + outcome_keys if outcome_keys is not None else None
        settled = outcome is not None and keys is not None and not natives and max(keys[2::3]) < settled_before
        found.append((name, ([row, *natives], [keys, row] if settled and meta.id == name else None)))
    return found


def unfinished_state(agent_dir: Path, meta: AgentMeta, *, queueing: bool) -> Status:
    """What status shows for an agent without an outcome: running, or why not."""
    state = liveness(agent_dir, meta)
    if state == Status.FAILED:
        return Status.LOST  # gone without an outcome
    if state != Status.RUNNING:
        return state
    if (agent_dir / PAUSED).exists():
        return Status.PAUSED
    if idle_for(agent_dir) is not None:
        return Status.STALLED
    if queueing and (agent_dir / SLOT_LENT).exists():
        return Status.WAITING
    if queueing and not (agent_dir / SLOT_MARKER).exists():
        return Status.QUEUED
    return state


def native_rows(agent_dir: Path | str, meta: AgentMeta, *, parent_ended: bool) -> list[dict[str, Any]]:
    """Claude Code's own subagents of an agent (NATIVE_LOG), as child rows of kind `native`.

    Their cost is part of the parent's (the CLI counts it in its total), so a
    native row adds nothing to the subtree's cost and is never `unknown`.
    """
    nodes: dict[str, dict[str, Any]] = {}
    log = f"{agent_dir}/{NATIVE_LOG}"
    if not os.path.exists(log):  # most agents have none: a stat is cheaper than a failed open
        return []
    lines: list[str] = []
    with contextlib.suppress(OSError, UnicodeDecodeError, CorruptRecordError):
        lines = read_regular_file(log)[0].decode().splitlines()
    for raw in lines:
        with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):  # skip a line that isn't one
            line = parse_json(raw)
            node = nodes.setdefault(line["agent_id"], {"agent_type": line.get("agent_type", "")})
            node[line["event"]] = line
    rows = []
    for native_id, node in nodes.items():
        start = node.get("start") or node.get("stop") or {}
        stop = node.get("stop")
        began = parse_iso(start.get("time")) or time.time()
        ended = parse_iso(stop["time"]) if stop else None
        transcript = stop.get("transcript_path") if stop else None
        rows.append(
            {
                "id": f"n-{native_id}",
                "parent_id": meta.id,
                "depth": meta.depth + 1,
                "kind": "native",
                "agent_type": node["agent_type"],
                # Without a stop, it was cut off when its parent's CLI ended.
                "state": Status.DONE.value if stop else (Status.KILLED.value if parent_ended else Status.RUNNING.value),
                "task": f"native {node['agent_type']} subagent",
                "duration_s": round((ended or time.time()) - began, 1),
                "cost_usd": None,
                "cost_known": True,
                "usage": native_usage(Path(transcript)) if transcript else {},
                "transcript": transcript,
                "pid": meta.pid,
                "agent_dir": f"{agent_dir}/{NATIVE_LOG}#{native_id}",
            }
        )
    return rows


def parse_iso(value: Any) -> float | None:
    try:
        return dt.datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def commit_outcome(agent_dir: Path, outcome: Outcome, secrets_: Sequence[str]) -> bool:
    """The one commit point of an agent. Returns False if another writer won.

    Of the agent itself, its deadline, a parent's `wait`, `reap` or `kill`,
    exactly one publishes outcome.json. The marker follows from the committed
    outcome, so .done and .fail can't both exist.
    """
    data = redacted_json(record_to_json(outcome), secrets_, indent=2)
    won = publish_once(agent_dir / OUTCOME, data.encode())
    if won:
        charge(agent_dir, outcome, secrets_)
    ensure_marker(agent_dir)
    if won:
        index_status_row(agent_dir)
    return won


def index_status_row(agent_dir: Path) -> None:
    """Append a just-committed agent's row to its session's STATUS_INDEX; best effort.

    The entry status would cache for it (read_agent_rows, with nothing left
    to settle): its row from the records as they are on disk, keyed by the
    very files read. None for a damaged record, or an agent with Claude Code
    subagents, whose rows come from a log.
    """
    try:
        found = read_agent_rows(str(agent_dir.parent), [agent_dir.name], queueing=False, settled_before=float("inf"))
        entry = found[0][1][1] if found else None
        if entry is None:
            return
        keys, row = entry
        row = {k: v for k, v in row.items() if k != "agent_dir"}  # status puts in its own spelling of the path
        line = json.dumps({"name": agent_dir.name, "keys": keys, "row": row}, separators=(",", ":"), ensure_ascii=False) + "\n"
        # O_APPEND keeps concurrent committers' lines whole; O_NOFOLLOW and
        # open_regular: a link or a FIFO planted at the index is never written through.
        fd, _ = open_regular(agent_dir.parent.parent / STATUS_INDEX, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW)
    except Exception:  # a hint, after the commit: nothing in a record, however odd, may fail the commit
        return
    try:
        os.write(fd, line.encode())
    except OSError:
        pass  # a full disk: status reads this agent's records instead
    finally:
        os.close(fd)
# ==================== end src/spawnlib/commit.py ====================

# ==================== begin src/spawnlib/admission.py ====================
"""Admission: who may run now, both kinds in one place.

- --max-concurrent: a slot marker in each running agent's directory, taken
  under the session lock, lent while the agent waits on its children;
- --max-agents and the tree's budget: admit(), under the session lock when
  a spawn registers (resolving.register);
- start slots: CLI start-ups take turns, a flock'ed file each in the session.

Above supervision: a lent slot is taken back only while its agent lives.
"""




























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
# ==================== end src/spawnlib/admission.py ====================

# ==================== begin src/spawnlib/agents.py ====================





































# ------------------------------------------------- agents and permissions --


@dataclass(frozen=True)
class Rule:
    """A permission rule in Claude Code's syntax: Tool or Tool(specifier)."""

    tool: str
    spec: str | None
    text: str
    source: str = field(default="", compare=False)
    """where the rule came from: a flag, a definition or a settings file"""


@dataclass
class RuleSet:
    """An agent's permission rules, parsed, by kind."""

    allow: list[Rule] = field(default_factory=list)
    deny: list[Rule] = field(default_factory=list)
    ask: list[Rule] = field(default_factory=list)

    def texts(self) -> dict[str, list[str]]:
        return {kind: [r.text for r in getattr(self, kind)] for kind in PERMISSION_KINDS}


@dataclass
class AgentDefinition:
    """A .claude/agents/NAME.md file: frontmatter settings, body as system prompt."""

    name: str
    path: str
    source: str
    """project, user or built-in"""
    description: str = ""
    prompt: str = ""
    tools: list[str] | None = None
    disallowed_tools: list[str] = field(default_factory=list)
    model: str | None = None
    permission_mode: str | None = None
    skills: list[str] | None = None
    mcp_servers: dict[str, Any] = field(default_factory=dict)
    mcp_server_refs: list[str] = field(default_factory=list)
    """Servers named but configured elsewhere (.mcp.json); resolve_mcp_refs fills them in."""
    schema: str | None = None
    max_depth: int | None = None
    timeout: float | None = None
    max_budget_usd: float | None = None
    permissions: RuleSet = field(default_factory=RuleSet)
    max_turns: int | None = None
    effort: str | int | None = None
    initial_prompt: str | None = None
    background: bool = False
    isolation: str | None = None
    """worktree: run in a fresh git worktree of the project."""
    memory: str | None = None
    """user, project or local: the agent's persistent memory directory."""
    hooks: dict[str, Any] | None = None
    """Claude Code's hooks setting (event -> matchers), passed to the CLI as settings."""
    color: str | None = None
    omit_claude_md: bool = False
    auto_compact_window: int | None = None
    kind: str = "claude"
    """claude, or a2a (with url) or command (with command): see the executors section."""
    endpoint: str | None = None
    """The definition's url (a2a) or command (command)."""


@dataclass(frozen=True)
class Problem:
    """A lint finding: file, line, message; errors fail lint, warnings don't."""

    path: str
    line: int
    message: str
    severity: str = "error"

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.severity}: {self.message}"


class RuleSyntaxError(UsageError):
    def __init__(self, text: str, why: str = "") -> None:
        why = f" ({why})" if why else ""
        super().__init__(f"bad permission rule {text!r}{why}; use Tool or Tool(specifier), e.g. 'Bash(git diff:*)' or 'Read(./src/**)'")


class UnknownAgentDefinitionError(UsageError):
    def __init__(self, name: str, searched: Sequence[Path], known: Iterable[str] = ()) -> None:
        where = ", ".join([*(str(p) for p in searched), "the built-in agents"])
        if hint := did_you_mean(name, known):
            super().__init__(f"no agent definition {name!r}{hint} (searched {where}; for a new one: 'spawn.py agents new {name}')")
        else:
            super().__init__(f"no agent definition {name!r} in {where}; run 'spawn.py agents list' or 'spawn.py agents new {name}'")


def parse_rule(text: str, source: str = "") -> Rule:
    """A rule in Claude Code's syntax, checked as Claude Code checks it.

    Rules may span lines (settings files hold long Bash commands); legacy tool
    names are canonicalised so `Task(*)` also covers `Agent`.
    """
    m = re.fullmatch(r"\s*([A-Za-z][A-Za-z0-9_\-]*(?:__\*)?)(?:\((.*)\))?\s*", text, re.DOTALL)
    if not m:
        raise RuleSyntaxError(text)
    tool, spec = canonical_tool(m.group(1)), m.group(2)
    if tool.endswith("__*") and (not tool.startswith("mcp__") or tool.count("__") != 2):
        raise RuleSyntaxError(text, "a wildcard is only allowed as mcp__server__*")
    if tool not in KNOWN_TOOLS and not tool.startswith("mcp__"):
        raise RuleSyntaxError(text, f"unknown tool {tool!r}")
    if tool.startswith("mcp__") and spec not in (None, "*"):
        raise RuleSyntaxError(text, "MCP rules take no parentheses; use mcp__server, mcp__server__* or mcp__server__tool")
    if spec is not None and spec.strip() == "" and "(" in text:
        raise RuleSyntaxError(text, "empty parentheses; write the tool name alone to cover all of it")
    if tool == "WebFetch" and spec not in (None, "*") and not spec.startswith("domain:"):
        raise RuleSyntaxError(text, "WebFetch rules take 'domain:HOST'")
    if tool == "Bash" and spec is not None and ":*" in spec and not spec.endswith(":*"):
        raise RuleSyntaxError(text, "':*' is only allowed at the end of a Bash rule")
    return Rule(tool, None if spec in (None, "", "*") else spec, text.strip(), source)


def cli_rule(rule: Rule) -> str:
    """The rule as the CLI reads it: canonical tool name, same specifier."""
    return rule.tool if rule.spec is None else f"{rule.tool}({rule.spec})"


def rule_covers_tool(rule: Rule, tool: str) -> bool:
    tool = canonical_tool(tool)
    if rule.tool == tool:
        return True
    if rule.tool == "Read" and tool in READ_TOOLS:
        return True
    if rule.tool == "Edit" and tool in EDIT_TOOLS:
        return True
    if rule.tool.startswith("mcp__") and rule.tool.endswith("__*"):
        return tool.startswith(rule.tool[:-1])
    return rule.tool.startswith("mcp__") and rule.tool.count("__") == 1 and tool.startswith(rule.tool + "__")


# A shell command, cut into the parts a rule must hold for. Every command a
# line can run counts: each simple command, the ones inside $(...), `...`,
# <(...) and >(...), the strings given to sh -c and eval, and each redirection
# into a file. A command whose name is only known at run time ($x, rm${IFS})
# becomes DYNAMIC_COMMAND: it matches every deny rule and no allow rule.
DYNAMIC_COMMAND = "\0dynamic"
SUBSTITUTED = "\0subst"
SHELL_SEPARATORS = frozenset({";", "&&", "||", "|", "&", "|&", ";;", "(", ")", "{", "}", "\n"})
SHELL_KEYWORDS = frozenset({"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "!", "time", "case", "esac"})
# Commands that run their arguments as a command: their options are skipped.
COMMAND_WRAPPERS = frozenset(
    {"command", "builtin", "exec", "env", "nohup", "nice", "time", "timeout", "xargs", "sudo", "doas", "setsid",
     "stdbuf", "ionice", "chrt", "taskset", "unbuffer"}
)  # fmt: skip
SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh", "fish"})
OUTPUT_REDIRECTS = frozenset({">", ">>", ">|", "&>", "&>>", "<>"})
SAFE_REDIRECT_TARGETS = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})


def _closing(command: str, start: int, opener: str, closer: str) -> int:
    """Index of the closer matching an opener just before start (quotes respected)."""
    depth, i, quote = 1, start, ""
    while i < len(command):
        c = command[i]
        if quote:
            if c == "\\" and quote == '"':
                i += 1
            elif c == quote:
                quote = ""
        elif c == "\\":
            i += 1
        elif c in "'\"":
            quote = c
        elif c == opener:
            depth += 1
        elif c == closer:
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return len(command)


def _lift_substitutions(command: str) -> tuple[str, list[str]]:
    """command with each substitution replaced by a placeholder word, and their bodies."""
    out, inner, i, quote = [], [], 0, ""
    while i < len(command):
        c = command[i]
        if quote == "'":
            quote = "" if c == "'" else quote
            out.append(c)
        elif c == "\\" and i + 1 < len(command):
            out.append(command[i : i + 2])
            i += 2
            continue
        elif command.startswith("$((", i):
            end = _closing(command, i + 3, "(", ")")
            out.append(SUBSTITUTED)  # arithmetic: no command, but not a literal either
            i = end + 2
            continue
        elif command.startswith(("$(", "<(", ">("), i):
            end = _closing(command, i + 2, "(", ")")
            inner.append(command[i + 2 : end])
            out.append(SUBSTITUTED)
            i = end + 1
            continue
        elif c == "`":
            end = command.find("`", i + 1)
            end = len(command) if end < 0 else end
            inner.append(command[i + 1 : end])
            out.append(SUBSTITUTED)
            i = end + 1
            continue
        elif c == "'" and quote != '"':
            quote = "'"
            out.append(c)
        elif c == '"':
            quote = "" if quote == '"' else '"'
            out.append(c)
        elif c == "\n" and not quote:
            out.append(" ; ")
        else:
            out.append(c)
        i += 1
    return "".join(out), inner


def _shell_words(command: str) -> list[str] | None:
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|()<>")
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:  # unbalanced quotes: the shell would refuse too, but don't guess
        return None


def _expand_name(name: str, environ: Mapping[str, str] | None, assigned: set[str]) -> str | None:
    """A command name built from variables the agent's shell inherits ("$SPAWN_PYTHON"),
    or None when the line itself could have set them (x=rm; $x) or they are unknown."""
    if environ is None:
        return None
    refs = re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", name)
    if not re.fullmatch(r"(?:[^$`\\]|\$[A-Za-z_][A-Za-z0-9_]*|\$\{[A-Za-z_][A-Za-z0-9_]*\})*", name):
        return None
    if any(r in assigned or r not in environ for r in refs):
        return None
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: environ[m.group(1)], name)


def _simple_command(words: list[str], depth: int, environ: Mapping[str, str] | None = None, assigned: set[str] | None = None) -> list[str]:
    """The parts of one simple command, after wrappers and assignments."""
    while words and (re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*\+?=.*", words[0], re.DOTALL) or words[0] in SHELL_KEYWORDS):
        words = words[1:]
    while words and os.path.basename(words[0]) in COMMAND_WRAPPERS:
        words = words[1:]
        while words and (words[0].startswith("-") or re.fullmatch(r"[0-9.]+[smhd]?|[A-Za-z_][A-Za-z0-9_]*=.*", words[0], re.DOTALL)):
            words = words[1:]
    if not words:
        return []
    name = words[0]
    if "$" in name and SUBSTITUTED not in name:
        name = _expand_name(name, environ, assigned or set()) or name
    if "$" in name or SUBSTITUTED in name or any(ch in name for ch in "*?["):
        return [DYNAMIC_COMMAND]
    name = os.path.basename(name) if "/" in name else name
    args = words[1:]
    if name == "eval":
        return shell_command_parts(" ".join(args), depth + 1, environ)
    if name in SHELLS:
        for n, arg in enumerate(args):
            if arg.startswith("-") and not arg.startswith("--") and "c" in arg and n + 1 < len(args):
                return shell_command_parts(args[n + 1], depth + 1, environ)
    return [" ".join([name, *args])]


def shell_command_parts(command: str, depth: int = 0, environ: Mapping[str, str] | None = None) -> list[str]:
    """Every command a shell line runs, normalised ('/bin/rm' -> 'rm', quotes removed).

    environ is the agent's shell environment: a command name made of its
    variables is read through it, unless the line could assign them itself.
    """
    assigned = set(re.findall(r"(?:^|[\s;&|(`])([A-Za-z_][A-Za-z0-9_]*)\+?=", command))
    setters = r"\b(?:read|for|export|declare|local|typeset|readonly|let|unset|printf\s+-v)\s+(?:-\S+\s+)*([A-Za-z_][A-Za-z0-9_]*)"
    assigned |= set(re.findall(setters, command))
    if depth > 8:
        return [DYNAMIC_COMMAND]  # deeper nesting than any honest command
    flat, inner = _lift_substitutions(command)
    words = _shell_words(flat)
    if words is None:
        return [DYNAMIC_COMMAND]
    parts: list[str] = []
    current: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word in SHELL_SEPARATORS or (set(word) <= set(";&|()") and word not in OUTPUT_REDIRECTS):
            parts += _simple_command(current, depth, environ, assigned)
            current = []
        elif word in OUTPUT_REDIRECTS or word in ("<", "<<", "<<<", ">&", "<&"):
            target = words[i + 1] if i + 1 < len(words) else ""
            if current and current[-1].isdigit() and word in (">", ">>", ">&", "<&"):
                current.pop()  # 2>file: the 2 is the redirection's, not an argument
            if word in OUTPUT_REDIRECTS and target not in SAFE_REDIRECT_TARGETS and not target.isdigit():
                parts.append(f"> {target}")
            i += 2
            continue
        else:
            current.append(word)
        i += 1
    parts += _simple_command(current, depth, environ, assigned)
    for body in inner:
        parts += shell_command_parts(body, depth + 1, environ)
    return parts or [""]


def glob_to_regex(pattern: str) -> str:
    """A gitignore-style glob (**, *, ?) as a regex over a whole path."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return out


def path_rule_matches(spec: str, path: str, cwd: str, home: str) -> bool:
    """Claude Code's path specifiers: //abs, ~/home, /project-root, ./rel, or a bare glob."""
    anchored = anchored_pattern(spec, cwd, home)
    if anchored is None:
        bare = "**/" + spec if not spec.startswith("**") else spec  # matches at any depth, as in gitignore
        return re.fullmatch(glob_to_regex(bare), path.lstrip("/")) is not None
    regex = glob_to_regex(anchored)
    # A directory (Grep's or Glob's path) matches when its contents do.
    return any(re.fullmatch(regex, candidate) for candidate in (path, path + "/")) or re.fullmatch(regex + "/.*", path) is not None


def bash_spec_matches(spec: str, command: str) -> bool:
    """One normalised command against a Bash specifier: `x:*` and `x *` are prefixes."""
    for suffix in (":*", " *"):
        if spec.endswith(suffix):
            prefix = spec[: -len(suffix)]
            return command == prefix or command.startswith(prefix + " ")
    return re.fullmatch(glob_to_regex(spec).replace("[^/]*", ".*").replace("[^/]", "."), command, re.DOTALL) is not None


def rule_matches(
    rule: Rule, tool: str, tool_input: Mapping[str, Any], cwd: str, home: str, *, all_parts: bool, environ: Mapping[str, str] | None = None
) -> bool:
    """Does rule cover this call? all_parts for allow rules: every part of a
    Bash command, and every spelling of a path, must match; for deny and ask
    rules one is enough."""
    tool = canonical_tool(tool)
    if not rule_covers_tool(rule, tool):
        return False
    if rule.spec is None:
        return True
    if tool == "Bash":
        parts = shell_command_parts(str(tool_input.get("command", "")), 0, environ)
        if all_parts:
            return all(p != DYNAMIC_COMMAND and bash_spec_matches(rule.spec, p) for p in parts)
        return any(p == DYNAMIC_COMMAND or bash_spec_matches(rule.spec, p) for p in parts)
    if tool in EDIT_TOOLS and (size := EDIT_SIZE_SPEC.fullmatch(rule.spec)):
        return changed_lines(tool, tool_input, cwd) > int(size.group(1))
    if tool in READ_TOOLS | EDIT_TOOLS:
        paths = tool_paths(tool, tool_input, cwd)
        if all_parts:
            return bool(paths) and all(path_rule_matches(rule.spec, p, cwd, home) for p in paths)
        return any(path_rule_matches(rule.spec, p, cwd, home) for p in paths) or search_reaches(rule, tool, tool_input, cwd, home)
    if tool == "WebFetch" and rule.spec.startswith("domain:"):
        host = re.sub(r"^[a-z]+://", "", str(tool_input.get("url", ""))).split("/")[0].split(":")[0]
        domain = rule.spec.removeprefix("domain:")
        return host == domain or host.endswith("." + domain)
    if tool == "Agent":
        return fnmatch_name(rule.spec, str(tool_input.get("subagent_type", "")))
    return re.fullmatch(glob_to_regex(rule.spec), json.dumps(tool_input, sort_keys=True)) is not None


# `Edit(lines>N)`: spawn.py's own specifier (Claude Code's Edit rules are paths
# only) for an edit that changes more than N existing lines: a refactor worth
# asking about. Meant for ask and deny rules, which spawn.py's hook decides.
EDIT_SIZE_SPEC = re.compile(r"lines>(\d+)")


def changed_lines(tool: str, tool_input: Mapping[str, Any], cwd: str) -> int:
    """How many existing lines an Edit, MultiEdit or Write would change (a new file changes none)."""
    import difflib

    def diff(old: str, new: str) -> int:
        ops = difflib.SequenceMatcher(None, old.splitlines(), new.splitlines(), autojunk=False).get_opcodes()
        return sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in ops if tag != "equal")

    path = str(tool_input.get("file_path") or tool_input.get("notebook_path") or "")
    try:
        current = Path(path if os.path.isabs(path) else os.path.join(cwd, path)).read_text(errors="replace") if path else ""
    except OSError:
        current = ""
    edits = tool_input.get("edits") if tool == "MultiEdit" else [tool_input]
    if tool == "Write":
        return diff(current, str(tool_input.get("content", ""))) if current else 0
    if tool == "NotebookEdit":
        return len(str(tool_input.get("new_source", "")).splitlines())
    total = 0
    for e in edits if isinstance(edits, list) else []:
        if not isinstance(e, dict):
            continue
        old, new = str(e.get("old_string", "")), str(e.get("new_string", ""))
        times = max(1, current.count(old)) if e.get("replace_all") and old else 1
        total += diff(old, new) * times
    return total


def fnmatch_name(spec: str, name: str) -> bool:
    """Agent(a, b): any listed name (globs allowed) is the subagent's."""
    return any(re.fullmatch(glob_to_regex(s.strip()), name) for s in spec.split(",") if s.strip())


def tool_paths(tool: str, tool_input: Mapping[str, Any], cwd: str) -> list[str]:
    """The paths a call touches, each as written (normalised) and as resolved.

    Resolving follows symlinks, so `link/a.txt` with link -> secret is checked
    as secret/a.txt too: a rule must hold for both spellings of a target.
    """
    keys = ("file_path", "notebook_path", "path")
    found = [str(tool_input[k]) for k in keys if isinstance(tool_input.get(k), str)]
    if not found and tool in READ_TOOLS:
        found = [cwd]  # Grep and Glob search the working directory by default
    paths: list[str] = []
    for p in found:
        written = os.path.normpath(p if os.path.isabs(p) else os.path.join(cwd, p))
        paths += dict.fromkeys([written, os.path.realpath(written)])
    return paths


def anchored_pattern(spec: str, cwd: str, home: str) -> str | None:
    """A path rule as an absolute glob, or None for a bare glob that matches at any depth."""
    if spec.startswith("//"):
        return spec[1:]
    if spec.startswith("~/"):
        return home.rstrip("/") + spec[1:]
    if spec.startswith("/"):
        return cwd.rstrip("/") + spec
    if spec.startswith("./"):
        return cwd.rstrip("/") + spec[1:]
    if "/" not in spec.rstrip("/") or spec.startswith("**"):
        return None
    return cwd.rstrip("/") + "/" + spec


def search_reaches(rule: Rule, tool: str, tool_input: Mapping[str, Any], cwd: str, home: str) -> bool:
    """Could a Grep or Glob call read what a deny rule protects?

    A search whose root holds the rule's directory can list or read the
    files under it (with no path, or a glob such as secret/**), whatever the
    rule matches on the root itself. spawn.py doesn't trust the search to
    filter, so such a call is denied as a whole: narrow the path instead.
    Bare globs (`**/.env*`) have no directory to compare, so are left to the
    CLI's own filtering of results (it has the rule too).
    """
    if tool not in ("Grep", "Glob", "LS") or rule.spec is None:
        return False
    pattern = anchored_pattern(rule.spec, cwd, home)
    if pattern is None:
        return False
    fixed = re.split(r"[*?\[]", pattern)[0]
    if fixed == pattern or fixed.endswith("/"):
        protected = os.path.realpath(fixed.rstrip("/") or "/")
    else:  # secret* : whatever sits next to it
        protected = os.path.realpath(os.path.dirname(fixed) or "/")
    return any(protected == root or protected.startswith(root.rstrip("/") + "/") for root in tool_paths(tool, tool_input, cwd))


def kept_by_spawn_py(tool: str, tool_input: Mapping[str, Any], cwd: str, kept: Sequence[str], exempt: Sequence[str]) -> str | None:
    """The folder of spawn.py's own (kept: the session, the compiled copies'
    cache) that an Edit or Write call would write in, or None.

    No rule of a user's can grant these: every record there is trusted by
    other agents, and a copy there is run by every agent of every tree. An
    agent's own scratch/ and worktree are exempt; a link from them into a
    kept folder is not (tool_paths checks the resolved spelling too).
    """
    if canonical_tool(tool) not in EDIT_TOOLS:
        return None

    def inside(path: str, folder: str) -> bool:
        return path == folder or path.startswith(folder.rstrip("/") + "/")

    for path in tool_paths(tool, tool_input, cwd):
        if any(inside(path, e) for e in exempt):
            continue
        for folder in kept:
            if inside(path, folder):
                return folder
    return None


def settings_files(cwd: Path, environ: Mapping[str, str]) -> list[Path]:
    """Claude Code's settings files that hold a user's permission rules, lowest precedence first."""
    config = claude_config_dir(environ)
    return [config / "settings.json", cwd / ".claude" / "settings.json", cwd / ".claude" / "settings.local.json"]


def load_settings_rules(cwd: Path, environ: Mapping[str, str]) -> RuleSet:
    """The allow, deny and ask rules of a user's settings files, each tagged with its file.

    Precedence between files doesn't matter for rules: deny beats ask beats
    allow whatever file each comes from, as in Claude Code.
    """
    found = RuleSet()
    for path in settings_files(cwd, environ):
        try:
            text = read_input(path)
            # Empty is no settings, as Claude Code reads it. Its own sandbox
            # makes one: bwrap binds /dev/null over a settings file that is
            # absent (so the sandboxed Bash can't create it), and the empty
            # mount point it leaves on the host lives as long as that Bash.
            data = load_input(text, str(path), "JSON") if text.strip() else {}
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as exc:
            raise UsageError(f"can't read settings file {path}: {exc}; fix it or pass --no-settings") from None
        permissions = data.get("permissions") if isinstance(data, dict) else None
        if not isinstance(permissions, dict):
            continue
        for kind in PERMISSION_KINDS:
            texts = permissions.get(kind) or []
            if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
                raise UsageError(f"{path}: permissions.{kind} must be a list of rule strings; fix it or pass --no-settings")
            for text in texts:
                try:
                    getattr(found, kind).append(parse_rule(text, str(path)))
                except RuleSyntaxError as exc:
                    raise UsageError(f"{path}: {exc}; fix it or pass --no-settings") from None
    return found


def most_specific_first(rules: Iterable[Rule]) -> list[Rule]:
    """Within one kind, the rule reported is the most specific that matches."""
    return sorted(rules, key=lambda r: (r.spec is None, -len(r.spec or "")))


def decide(
    tool: str,
    tool_input: Mapping[str, Any],
    rules: RuleSet,
    granted: Sequence[str],
    *,
    cwd: str,
    home: str,
    environ: Mapping[str, str] | None = None,
) -> tuple[str, str | None]:
    """(allow|deny|ask, the rule or reason): deny wins, then ask, then allow.

    A granted tool with no allow rule of its own is allowed whole. Once a tool
    has specific allow rules, only calls matching one are allowed, as in
    Claude Code's dontAsk mode. environ is the agent's shell environment
    (see shell_command_parts).
    """
    tool = canonical_tool(tool)
    if tool == "StructuredOutput":
        return "allow", "the answer tool"
    for rule in most_specific_first(rules.deny):
        if rule_matches(rule, tool, tool_input, cwd, home, all_parts=False, environ=environ):
            return "deny", rule.text
    for rule in most_specific_first(rules.ask):
        if rule_matches(rule, tool, tool_input, cwd, home, all_parts=False, environ=environ):
            return "ask", rule.text
    own = most_specific_first(r for r in rules.allow if rule_covers_tool(r, tool))
    for rule in own:
        if rule_matches(rule, tool, tool_input, cwd, home, all_parts=True, environ=environ):
            return "allow", rule.text
    if any(r.spec is not None for r in own):
        return "deny", f"no allow rule of {tool} matches"
    if tool in granted or any(tool.startswith(g + "__") for g in granted if g.startswith("mcp__")):
        return "allow", f"{tool} is granted"
    return "deny", f"{tool} is not granted"


def cli_permissions(tools: Sequence[str], disallowed: Sequence[str], rules: RuleSet) -> tuple[list[str], list[str]]:
    """(allowed_tools, disallowed_tools) that give the CLI the allow and deny rules in its own form.

    The CLI then runs its own command and path checks too, and the stricter of
    the two layers wins: a call is made only if spawn.py's hook and the CLI
    both let it through. A granted tool with allow rules of its own is granted
    only through them, as in decide(). Ask rules stay with the hook alone: the
    CLI honours its own ask rule over a hook's answer, and in dontAsk mode
    that is a refusal, so an approved ask could never run.
    """
    allowed: list[str] = []
    for tool in tools:
        own = [cli_rule(r) for r in rules.allow if r.tool == tool and r.spec is not None]
        allowed += own or [tool]
    denied = [*disallowed, *(cli_rule(r) for r in rules.deny)]
    return list(dict.fromkeys(allowed)), list(dict.fromkeys(denied))


def bash_bypassable(rule: Rule) -> bool:
    """Can a Bash rule be got round by a command it doesn't name? Every deny or
    ask rule on Bash can: find -delete, an interpreter one-liner, a script."""
    return rule.tool == "Bash" and rule.spec is not None


def describe_rules(rules: RuleSet, tools: Sequence[str], disallowed: Sequence[str]) -> list[dict[str, Any]]:
    """Each effective rule, where it came from, and what reaches the CLI (for --dry-run)."""
    allowed_cli, denied_cli = cli_permissions(tools, disallowed, rules)
    rows: list[dict[str, Any]] = []
    for kind in PERMISSION_KINDS:
        for rule in most_specific_first(getattr(rules, kind)):
            cli = cli_rule(rule)
            row: dict[str, Any] = {"kind": kind, "rule": rule.text, "source": rule.source or "?"}
            row["cli"] = cli if cli in (allowed_cli if kind == "allow" else denied_cli) else None
            if kind != "allow" and bash_bypassable(rule):
                row["warning"] = (
                    "a Bash rule stops the commands it names, however spelled, but not another program doing the same "
                    "(find -delete, python -c, a script); only the sandbox is a boundary"
                )
            rows.append(row)
    return rows


def summarize_input(tool_input: Mapping[str, Any], limit: int = 300) -> str:
    text = tool_input.get("command") or tool_input.get("file_path") or tool_input.get("path") or json.dumps(tool_input)
    text = str(text)
    return text if len(text) <= limit else text[:limit] + "..."


def narrow_mode(requested: str | None, parent: str | None, is_root: bool) -> tuple[str, str | None]:
    """(mode, warning): a child's permission mode is never more permissive."""
    mode = requested or (parent if parent is not None else DEFAULT_PERMISSION_MODE)
    if parent is not None and PERMISSION_RANK[mode] > PERMISSION_RANK[parent]:
        return parent, f"permission mode {mode} lowered to the parent's {parent}"
    if mode == "bypassPermissions" and not is_root and parent != "bypassPermissions":
        return DEFAULT_PERMISSION_MODE, "bypassPermissions only where the root had it"
    return mode, None


ROUTE_SUFFIXES = (
    "ations", "ation", "ments", "ment", "ities", "ity", "ings", "ing", "ers", "er", "ance", "ence",
    "ures", "ure", "ies", "ate", "ize", "ise", "ed", "es", "ly", "s", "e",
)  # fmt: skip


def route_stem(word: str) -> str:
    """A small suffix stripper: debug, debugging and debugger share `debug`,
    optimize and optimization share `optimiz`. Crude, but the same on both sides.
    A suffix whose stem would be a stopword stays on: notes is no `not`."""
    for _ in range(2):  # again after a derivation: documentation -> document -> docu, as documents
        stripped = next(
            (
                x
                for x in ROUTE_SUFFIXES
                if word.endswith(x)
                and len(word) - len(x) >= (4 if x.startswith("ur") else 3)
                and not (x == "s" and word.endswith("ss"))
                and word[: -len(x)] not in ROUTE_STOPWORDS  # notes -> note, never not
            ),
            None,
        )  # (failure -> fail, but secure -> secur, as security)
        if stripped is None:
            break
        word = word[: -len(stripped)] + ("y" if stripped == "ies" else "")
        if stripped not in ("ations", "ation", "ities", "ity", "ance", "ence"):
            break
    if len(word) > 5 and word.endswith(("iz", "is")):
        word = word[:-2]  # optimiz(ation) -> optim, as optimize
    if len(word) > 4 and word[-1] == word[-2] and word[-1] not in "lsz":
        word = word[:-1]  # debugg(ing) -> debug
    return word


def route_terms(text: str) -> list[str]:
    """Stems of the words of text; hyphens and underscores split, stopwords go."""
    words = re.findall(r"[a-z][a-z0-9]*", text.lower().replace("'", ""))
    return [route_stem(w) for w in words if len(w) >= 2 and w not in ROUTE_STOPWORDS]


def route(task: str, definitions: Mapping[str, AgentDefinition]) -> dict[str, Any]:
    """Pick the definition that best matches the task (pure, deterministic).

    Each definition is a document: its name (split at hyphens), its
    description and its body's first paragraph; a word of the name also earns
    a bonus, since a name is the most deliberate summary. Documents are ranked by BM25 over stems, so a word
    that every agent mentions counts little and long descriptions full of
    <example> blocks don't win by size. Below ROUTE_THRESHOLD the task goes to
    the default agent.
    """
    import math

    task_terms = set(route_terms(task.split(" MOCK[", maxsplit=1)[0]))
    docs: dict[str, list[str]] = {}
    names: dict[str, set[str]] = {}
    for name, d in sorted(definitions.items()):
        names[name] = set(route_terms(name))
        docs[name] = route_terms(name) + route_terms(d.description) + route_terms(first_paragraph(d.prompt))
    n = len(docs)
    avg_len = sum(map(len, docs.values())) / n if n else 1.0
    holders = {t: sum(1 for doc in docs.values() if t in doc) for t in task_terms}
    scored: list[tuple[float, str, list[str]]] = []
    for name, doc in docs.items():
        score, matched = 0.0, []
        for term in sorted(task_terms):
            tf = doc.count(term)
            if not tf:
                continue
            idf = math.log(1 + (n + 1) / (holders[term] + 0.5))
            score += idf * tf * (ROUTE_K1 + 1) / (tf + ROUTE_K1 * (1 - ROUTE_B + ROUTE_B * len(doc) / (avg_len or 1.0)))
            if term in names[name]:
                score += idf * ROUTE_NAME_WEIGHT  # outside BM25's saturation: a name is a deliberate summary
            matched.append(term)
        scored.append((round(score, 3), name, matched))
    scored.sort(key=lambda c: (-c[0], c[1]))
    chosen = scored[0][1] if scored and scored[0][0] >= ROUTE_THRESHOLD else None
    candidates = [{"name": name, "score": score, "matched": matched} for score, name, matched in scored[:3]]
    return {"chosen": chosen, "threshold": ROUTE_THRESHOLD, "candidates": candidates}


def describe_routing(routing: Mapping[str, Any]) -> str:
    scores = ", ".join(f"{c['name']} {c['score']} ({' '.join(c['matched']) or '-'})" for c in routing["candidates"][:3])
    chosen = routing["chosen"] or f"the default agent: no candidate reached the confidence threshold {routing['threshold']}"
    return f"routed to {chosen}; top candidates: {scores}"


def _line_of(key: str, frontmatter: str) -> int:
    for n, line in enumerate(frontmatter.splitlines(), start=2):  # line 1 is the opening ---
        if re.match(rf"\s*{re.escape(key)}\s*:", line):
            return n
    return 1


def split_tool_entries(value: str) -> list[str]:
    """Claude Code's tools grammar: commas separate entries, except inside
    parentheses, so `Agent(explore, plan)` is one entry."""
    entries, depth, current = [], 0, ""
    for char in value:
        if char == "," and depth == 0:
            entries.append(current)
            current = ""
            continue
        depth += {"(": 1, ")": -1}.get(char, 0)
        current += char
    entries.append(current)
    return [e.strip() for e in entries if e.strip()]


def _as_list(value: Any) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return split_tool_entries(value)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return [e for v in value for e in split_tool_entries(v)]
    raise TypeError("must be a comma-separated string or a list of strings")


def _fallback_scalar(value: str) -> Any:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    if value in ("true", "false"):
        return value == "true"
    if re.fullmatch(r"-?\d+", value):
        return int(value)
    if value.startswith("[") and value.endswith("]"):
        return [v.strip().strip("'\"") for v in value[1:-1].split(",") if v.strip()]
    return value


def fallback_frontmatter(frontmatter: str) -> dict[str, Any]:
    """Claude Code's reading of frontmatter that isn't YAML: `key: value` lines,
    the value being everything after the first `: ` (so `description: Use when:
    the build breaks` works), `- item` lines as a list, indented lines continuing
    the value above."""
    data: dict[str, Any] = {}
    key: str | None = None
    for line in frontmatter.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        m = re.fullmatch(r"([A-Za-z_][\w\-]*):(?: (.*))?\s*", line)
        if m and not line[0].isspace():
            key, value = m.group(1), (m.group(2) or "").strip()
            data[key] = _fallback_scalar(value) if value else None
        elif key is not None and stripped.startswith("- "):
            items = data[key] if isinstance(data[key], list) else []
            data[key] = [*items, str(_fallback_scalar(stripped[2:].strip()))]
        elif key is not None and isinstance(data[key], str | None):
            data[key] = f"{data[key] or ''} {stripped}".strip()
    return data


def first_paragraph(text: str) -> str:
    """The body's first paragraph that isn't a heading: what routing reads of the prompt."""
    for block in re.split(r"\n\s*\n", text.strip()):
        lines = [line for line in block.splitlines() if not line.lstrip().startswith("#")]
        if " ".join(lines).strip():
            return " ".join(line.strip() for line in lines)
    return ""


def tool_entry(entry: str) -> tuple[str, str | None]:
    """(canonical tool, specifier) of one tools entry such as Agent(explore, plan)."""
    m = re.fullmatch(r"([A-Za-z][A-Za-z0-9_\-]*)(?:\((.*)\))?", entry.strip(), flags=re.DOTALL)
    if m is None:
        return entry.strip(), None
    return canonical_tool(m.group(1)), (m.group(2).strip() if m.group(2) is not None else None)


def parse_definition(
    text: str, path: str, source: str, known_tools: frozenset[str] = KNOWN_TOOLS
) -> tuple[AgentDefinition | None, list[Problem]]:
    """An agent file's definition and what is wrong with it (pure).

    Read as Claude Code reads it: YAML frontmatter, or when that fails the
    `key: value` fallback; fields spawn.py doesn't know are warnings.
    """
    stem = Path(path).stem
    problems: list[Problem] = []
    lines = text.lstrip("\ufeff").splitlines()
    if not lines or lines[0].strip() != "---":
        # Claude Code skips such files (a collection's README.md, say): a warning, not an error.
        return None, [Problem(path, 1, "no frontmatter (the file must start with a line '---'): not an agent, skipped", "warning")]
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    except StopIteration:
        return None, [Problem(path, 1, "the frontmatter is not closed by a line '---'")]
    frontmatter = "\n".join(lines[1:end])

    def problem(key: str, message: str, severity: str = "error") -> None:
        problems.append(Problem(path, _line_of(key, frontmatter), message, severity))

    try:
        data = load_input(frontmatter, path, "YAML") or {}
    except InputError as exc:
        line = exc.line + 1 if exc.line is not None else 1  # after the opening '---'
        data = fallback_frontmatter(frontmatter)
        reason = exc.why.removeprefix("not valid YAML: ")
        if not data:
            return None, [Problem(path, line, f"bad YAML: {reason}")]
        problems.append(Problem(path, line, f"bad YAML ({reason}); read with Claude Code's 'key: value' fallback", "warning"))
    if not isinstance(data, dict):
        return None, [Problem(path, 2, "the frontmatter must be a mapping of fields")]
    d = AgentDefinition(name=str(data.get("name") or stem), path=path, source=source, prompt="\n".join(lines[end + 1 :]).strip())

    for key in data:
        if key not in CLAUDE_AGENT_FIELDS | SPAWN_AGENT_FIELDS:
            problem(str(key), f"unknown field {key!r} (ignored)", "warning")
    if d.name != stem:
        problem("name", f"name {d.name!r} differs from the file name {stem!r}; Claude Code and spawn.py use the name", "warning")
    if not isinstance(data.get("description", ""), str) or not data.get("description"):
        problem("description", "description is missing: routing and 'agents list' need it")
    d.description = str(data.get("description") or "")
    _parse_tool_lists(data, d, problem, known_tools)
    model = data.get("model")
    if model is not None:
        d.model = str(model)
    mode = data.get("permissionMode")
    if mode is not None:
        if mode not in PERMISSION_RANK:
            problem("permissionMode", f"unknown permissionMode {mode!r}; use one of {', '.join(PERMISSION_MODES)}")
        else:
            d.permission_mode = str(mode)
    _parse_mcp_servers(data, d, problem)
    _parse_schema_field(data, d, problem)
    for key, attr, maximum, integer, zero_ok in DEFINITION_NUMBERS:
        value = data.get(key)
        if value is None:
            continue
        why = number_problem(key, value, maximum=maximum, integer=integer, zero_ok=zero_ok)
        if why is not None:
            problem(key, why)
        else:
            setattr(d, attr, int(value) if integer else float(value))
    _parse_claude_fields(data, d, problem)
    parse_node_fields(data, d, problem)
    _parse_permissions(data, d, problem)
    return d, problems


def _parse_tool_lists(data: Mapping[str, Any], d: AgentDefinition, problem: Callable[..., None], known_tools: frozenset[str]) -> None:
    """tools, disallowedTools and skills: lists, the tools checked against the known ones."""
    for key, attr in (("tools", "tools"), ("disallowedTools", "disallowed_tools"), ("skills", "skills")):
        try:
            value = _as_list(data.get(key))
        except TypeError as exc:
            problem(key, f"{key} {exc}")
            continue
        if value == ["*"] and key == "tools":
            value = None  # Claude Code's "all tools": here, as without the field, it inherits
        if value is not None and key != "skills":
            names: list[str] = []
            for entry in value:
                tool, spec = tool_entry(entry)
                if tool not in known_tools and not tool.startswith("mcp__"):
                    problem(key, f"unknown tool {tool} (kept: the CLI may know it)", "warning")
                names.append(tool)
                if spec is not None and key == "tools":
                    # Agent(explore, plan): the tool, narrowed to those specifiers.
                    for one in split_tool_entries(spec) if tool == "Agent" else [spec]:
                        d.permissions.allow.append(Rule(tool, one, f"{tool}({one})"))
            value = list(dict.fromkeys(names))
        if value is not None and key == "skills":
            bad = [v for v in value if not re.fullmatch(r"[A-Za-z0-9][\w.:\-]*", v)]
            if bad:
                # The SDK refuses such names outright; drop them rather than fail the run.
                problem(key, f"skill names {', '.join(map(repr, bad))} are not skill directory names; ignored", "warning")
                value = [v for v in value if v not in bad]
        if value is not None:
            setattr(d, attr, value)


def _parse_mcp_servers(data: Mapping[str, Any], d: AgentDefinition, problem: Callable[..., None]) -> None:
    """mcpServers, in Claude Code's mapping or list form."""
    servers = data.get("mcpServers")
    if servers is not None:
        if isinstance(servers, list):
            # Claude Code's list form: names of servers configured elsewhere, or {name: config} items.
            d.mcp_server_refs = [str(item) for item in servers if not isinstance(item, dict)]
            servers = {k: v for item in servers if isinstance(item, dict) for k, v in item.items()}
        if isinstance(servers, dict) and all(isinstance(v, dict) for v in servers.values()):
            d.mcp_servers = {str(k): v for k, v in servers.items()}
            for server_name, server in servers.items():
                kind = server.get("type", "stdio")
                if kind not in MCP_SERVER_TYPES:
                    problem("mcpServers", f"mcpServers.{server_name}: unknown type {kind!r}; use one of {', '.join(MCP_SERVER_TYPES)}")
                elif kind in ("http", "sse") and not isinstance(server.get("url"), str):
                    problem("mcpServers", f"mcpServers.{server_name}: a {kind} server needs a url")
                elif kind == "stdio" and not isinstance(server.get("command"), str):
                    problem("mcpServers", f"mcpServers.{server_name}: a stdio server needs a command")
        else:
            problem("mcpServers", "mcpServers must map server names to {command, args, env} or {type, url} objects")


def _parse_schema_field(data: Mapping[str, Any], d: AgentDefinition, problem: Callable[..., None]) -> None:
    """schema: a NAME from schemas/ (or built in), a path, or inline JSON."""
    schema = data.get("schema")
    if schema is not None:
        if not isinstance(schema, str):
            problem("schema", "schema must be a schema NAME from schemas/ or a path")
        else:
            d.schema = schema
            if re.fullmatch(r"[A-Za-z0-9_.\-]+", schema) and not schema.endswith(".json"):
                if not (SCHEMA_DIR / f"{schema}.json").is_file() and f"{schema}.json" not in builtin_files("schemas"):
                    problem("schema", f"schema {schema!r} is neither in {SCHEMA_DIR} nor built in")
            elif not schema.lstrip().startswith(("{", "[")) and not Path(schema).expanduser().is_file():
                problem("schema", f"schema file {schema} does not exist")


def _parse_permissions(data: Mapping[str, Any], d: AgentDefinition, problem: Callable[..., None]) -> None:
    """permissions: allow, deny and ask lists of rules."""
    perms = data.get("permissions")
    if perms is not None:
        if not isinstance(perms, dict):
            problem("permissions", "permissions must be a mapping with allow, deny and ask lists")
        else:
            for kind in perms:
                if kind not in PERMISSION_KINDS:
                    problem(str(kind), f"unknown permissions list {kind!r}; use allow, deny or ask")
            for kind in PERMISSION_KINDS:
                for rule_text in _as_list(perms.get(kind)) or []:
                    try:
                        getattr(d.permissions, kind).append(parse_rule(rule_text))
                    except RuleSyntaxError as exc:
                        problem(kind, exc.message)


def _parse_claude_fields(data: Mapping[str, Any], d: AgentDefinition, problem: Callable[..., None]) -> None:
    """The fields Claude Code added for subagents; a bad value is ignored with a
    warning, as Claude Code ignores it, so the file still loads. Its numbers
    (maxTurns, autoCompactWindow) are checked with spawn.py's own, in
    DEFINITION_NUMBERS."""
    effort = data.get("effort")
    if effort is not None:
        if effort in EFFORT_LEVELS or (isinstance(effort, int) and not isinstance(effort, bool)):
            d.effort = effort
        else:
            problem("effort", f"effort must be one of {', '.join(EFFORT_LEVELS)}, got {effort!r}; ignored", "warning")
    for key, attr, choices in (("isolation", "isolation", ("worktree",)), ("memory", "memory", MEMORY_SCOPES)):
        value = data.get(key)
        if value is None:
            continue
        if value in choices:
            setattr(d, attr, value)
        else:
            problem(key, f"{key} must be {' or '.join(choices)}, got {value!r}; ignored", "warning")
    for key, attr in (("background", "background"), ("omitClaudeMd", "omit_claude_md")):
        value = data.get(key)
        if value is not None:
            if isinstance(value, bool):
                setattr(d, attr, value)
            else:
                problem(key, f"{key} must be true or false, got {value!r}; ignored", "warning")
    for key, attr in (("initialPrompt", "initial_prompt"), ("color", "color")):
        value = data.get(key)
        if value is not None:
            setattr(d, attr, str(value))
    hooks = data.get("hooks")
    if hooks is not None:
        if isinstance(hooks, dict) and all(isinstance(v, list) for v in hooks.values()):
            d.hooks = {str(k): v for k, v in hooks.items()}
        else:
            problem("hooks", "hooks must map events (PreToolUse, ...) to lists of matchers, as in settings.json; ignored", "warning")


def remember_cli_tools(init: Mapping[str, Any], environ: Mapping[str, str]) -> None:
    """Cache the tool names a CLI's init message lists, one file per CLI version,
    so that lint knows that CLI's tools offline. An init message lists only the
    tools that run enabled, so the file keeps the union of every run's. Best
    effort: a cache that can't be written only costs warnings later."""
    version, tools = init.get("claude_code_version"), init.get("tools")
    if not isinstance(version, str) or not isinstance(tools, list) or not re.fullmatch(r"[\w.\-]+", version):
        return
    names = {canonical_tool(t) for t in tools if isinstance(t, str) and not t.startswith("mcp__")}
    path = cache_dir(environ) / f"cli-tools-{version}.json"
    old: set[str] = set()
    with contextlib.suppress(OSError, ValueError, AttributeError, TypeError):  # absent or unreadable: start afresh
        old = {t for t in parse_json(path.read_text()).get("tools", []) if isinstance(t, str)}
    if names <= old:
        return
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        # Readers see the old list or the new one, never half.
        write_file_atomic(path, (json.dumps({"claude_code_version": version, "tools": sorted(names | old)}) + "\n").encode())


def known_tools(environ: Mapping[str, str]) -> frozenset[str]:
    """The seed list plus every tool a CLI on this machine has reported."""
    names = set(KNOWN_TOOLS)
    with contextlib.suppress(OSError):
        for path in sorted(cache_dir(environ).glob("cli-tools-*.json")):
            with contextlib.suppress(OSError, ValueError, AttributeError, TypeError):
                names |= {t for t in parse_json(path.read_text()).get("tools", []) if isinstance(t, str)}
    return frozenset(names)


# The default agents spawn.py carries (the embedded module), listed with this source.
BUILTIN_AGENTS = ".claude/agents"
BUILTIN_SOURCE = "built-in"


def agent_dirs_for(cwd: Path, environ: Mapping[str, str]) -> list[tuple[Path, str]]:
    """Where definitions live: the project's .claude/agents (nearest upwards), then the user's."""
    found: list[tuple[Path, str]] = []
    for folder in (cwd, *cwd.parents):
        candidate = folder / ".claude" / "agents"
        if candidate.is_dir():
            found.append((candidate, "project"))
            break
    home = Path(environ.get("HOME") or Path.home()).expanduser()
    user = home / ".claude" / "agents"
    if user.is_dir() and all(user.resolve() != p.resolve() for p, _ in found):
        found.append((user, "user"))
    return found


def skill_file(name: str, project: Path | None, environ: Mapping[str, str]) -> Path | None:
    """Where Claude Code finds skill NAME: the project's .claude/skills, then the user's."""
    home = Path(environ.get("HOME") or Path.home()).expanduser()
    for root in (project, home):
        if root is not None and (root / ".claude" / "skills" / name / "SKILL.md").is_file():
            return root / ".claude" / "skills" / name / "SKILL.md"
    return None


def project_of(definition_path: str) -> Path:
    """The project a definition file belongs to: the folder holding its .claude."""
    folder = Path(definition_path).resolve().parent
    while folder.name != ".claude" and folder != folder.parent:
        folder = folder.parent
    return folder.parent


def resolve_mcp_refs(d: AgentDefinition, environ: Mapping[str, str]) -> list[str]:
    """Fill in the servers a definition names but doesn't configure, from where
    Claude Code configures them: the project's .mcp.json, then ~/.claude.json.
    Returns the names found nowhere (their tools are then unavailable)."""
    home = Path(environ.get("HOME") or Path.home()).expanduser()
    missing = []
    for name in d.mcp_server_refs:
        for config_file in (project_of(d.path) / ".mcp.json", home / ".claude.json"):
            with contextlib.suppress(OSError, ValueError, AttributeError):
                config = parse_json(read_input(config_file)).get("mcpServers", {}).get(name)
                if isinstance(config, dict):
                    d.mcp_servers.setdefault(name, config)
                    break
        else:
            missing.append(name)
    return missing


def load_definitions(cwd: Path, environ: Mapping[str, str]) -> tuple[dict[str, AgentDefinition], list[Problem]]:
    """Every definition by name (the project's win over the user's, the user's over
    the built-in ones), and the problems found."""
    definitions: dict[str, AgentDefinition] = {}
    problems: list[Problem] = []
    tools = known_tools(environ)
    for folder, source in agent_dirs_for(cwd, environ):
        seen_here: dict[str, str] = {}
        for path in sorted(folder.rglob("*.md")):  # subfolders too, as Claude Code finds them
            try:
                text = path.read_text()
            except (OSError, UnicodeDecodeError) as exc:
                problems.append(Problem(str(path), 1, f"unreadable: {exc}"))
                continue
            d, found = parse_definition(text, str(path), source, tools)
            problems += found
            if d is None:
                continue
            for name in resolve_mcp_refs(d, environ):
                problems.append(Problem(str(path), 1, f"MCP server {name!r} is in neither .mcp.json nor ~/.claude.json", "warning"))
            for name in d.skills or []:
                if skill_file(name, project_of(d.path), environ) is None:
                    problems.append(Problem(str(path), 1, f"skill {name!r} is in no .claude/skills/{name}/SKILL.md", "warning"))
            if d.name in seen_here:
                problems.append(Problem(str(path), 1, f"duplicate agent name {d.name!r} (also {seen_here[d.name]})"))
                continue
            seen_here[d.name] = str(path)
            definitions.setdefault(d.name, d)
    for name, text in builtin_files(BUILTIN_AGENTS).items():
        if Path(name).stem not in definitions:  # a file's definition overrides a built-in one
            d, found = parse_definition(text, builtin_label(f"{BUILTIN_AGENTS}/{name}"), BUILTIN_SOURCE, tools)
            problems += found
            if d is not None:
                definitions.setdefault(d.name, d)
    return definitions, problems


AGENT_TEMPLATE = """\
---
# Claude Code's fields (this file works in Claude Code too).
name: {name}
# One sentence on WHEN to use this agent: `--agent auto` routes tasks by it.
description: Use for ... (distinctive words that match the tasks it should get)
# Tools it sees, comma-separated; a spawn can narrow them, never widen.
tools: Read, Grep, Glob
# sonnet, opus, haiku, a model id, or inherit (the parent's): names Claude Code
# knows too. spawn.py also takes its tiers here (high-tier, medium-tier, low-tier).
model: sonnet
# plan, dontAsk (spawn.py's default), default, acceptEdits, bypassPermissions.
# permissionMode: dontAsk
# maxTurns: 20              # its turn limit
# effort: medium            # low, medium, high, xhigh, max
# background: true          # start in the background unless --no-background
# isolation: worktree       # work in a fresh git worktree, kept only if changed
# memory: project           # user, project or local: notes kept across runs
# mcpServers:
#   docs:
#     command: python
#     args: [docs_server.py]

# spawn.py's additions.
# schema: findings          # schemas/NAME.json, or a path
# max_depth: 1              # deepest depth below the root its subtree may reach
# timeout: 600              # seconds
# max_budget_usd: 0.50
# permissions:              # Claude Code's rule syntax: deny, then ask, then allow
#   allow: ["Bash(git diff:*)"]
#   deny: ["Read(**/.env*)"]
#   ask: ["Bash(git push:*)"]
---
You are the {name} agent. Describe its job, its method, and what a good answer
contains. When an output schema is set, answer with the StructuredOutput tool.
"""


# What a node can be; executors.EXECUTORS has one class for each, in this order.
NODE_KINDS = ("claude", "a2a", "command")
A2A_CARD_PATH = "/.well-known/agent-card.json"


@dataclass(frozen=True)
class Node:
    """What runs a node: its kind and, for a2a and command, where it lives."""

    kind: str
    endpoint: str | None = None
    """a2a: the agent card's URL; command: the command line."""


@dataclass
class NodeResult:
    """What a node of another kind than claude came back with (RunState.node_result)."""

    status: Status
    reason: str
    output: Any = None
    text: str | None = None
    cost_usd: float | None = None
    """As the node reported it; None (unknown) otherwise."""


class NodeReferenceError(UsageError):
    def __init__(self, reference: str, why: str) -> None:
        super().__init__(f"--agent {reference}: {why}")


def parse_reference(value: str | None) -> Node | None:
    """The node an --agent value names directly, or None for a definition NAME (pure).

    a2a:URL (the agent's base URL, or its card's), an http(s) URL of an agent
    card, or command:EXE [ARGS].
    """
    if not value:
        return None
    if value.startswith("command:"):
        command = value.removeprefix("command:").strip()
        command_argv(command, value)
        return Node("command", command)
    if value.startswith("a2a:"):
        return Node("a2a", a2a_card_url(value.removeprefix("a2a:"), value))
    if re.match(r"[A-Za-z][A-Za-z0-9+.\-]*://", value):
        from urllib.parse import urlsplit

        if not urlsplit(value).path.endswith(A2A_CARD_PATH):
            raise NodeReferenceError(
                value, f"a URL must be an A2A agent card (...{A2A_CARD_PATH}); or write a2a:URL for an agent's base URL"
            )
        return Node("a2a", a2a_card_url(value, value))
    return None


def a2a_card_url(url: str, reference: str) -> str:
    """The agent card's URL: URL itself when it names a .json file, else URL + the well-known path (pure)."""
    from urllib.parse import urlsplit

    url = url.strip()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise NodeReferenceError(reference, "an A2A agent is an http(s) URL, e.g. a2a:https://host/path")
    return url if parts.path.endswith(".json") else url.rstrip("/") + A2A_CARD_PATH


def command_argv(command: str, reference: str) -> list[str]:
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise NodeReferenceError(reference, f"can't split the command line ({exc}); check its quoting") from None
    if not argv:
        raise NodeReferenceError(reference, "give the executable, e.g. command:/path/to/exe")
    return argv


def parse_node_fields(data: Mapping[str, Any], d: AgentDefinition, problem: Callable[..., None]) -> None:
    """A definition's kind, with its url (a2a) or command (command)."""
    kind = data.get("kind")
    if kind is None:
        for key in ("url", "command"):
            if key in data:
                problem(key, f"{key} needs 'kind: {'a2a' if key == 'url' else 'command'}'; ignored", "warning")
        return
    if kind not in NODE_KINDS:
        problem("kind", f"kind must be one of {', '.join(NODE_KINDS)}, got {kind!r}")
        d.kind = str(kind)  # an agent that can't run as what it says is not run as claude
        return
    d.kind = str(kind)
    if d.kind == "claude":
        return
    key = "url" if d.kind == "a2a" else "command"
    value = data.get(key)
    if not isinstance(value, str) or not value.strip():
        problem("kind", f"kind {kind} needs {key}: {'the agent URL' if key == 'url' else 'the executable and its arguments'}")
        return
    try:
        d.endpoint = a2a_card_url(value, value) if key == "url" else " ".join(map(shlex.quote, command_argv(value, value)))
    except NodeReferenceError as exc:
        problem(key, exc.message.removeprefix(f"--agent {value}: "))


def node_of_definition(definition: AgentDefinition | None) -> Node:
    if definition is None or definition.kind == "claude":
        return Node("claude")
    if definition.kind not in NODE_KINDS or definition.endpoint is None:
        raise UsageError(f"agent definition {definition.path} has a bad kind or no url/command; fix it (see 'spawn.py agents lint')")
    return Node(definition.kind, definition.endpoint)
# ==================== end src/spawnlib/agents.py ====================

# ==================== begin src/spawnlib/delegates.py ====================










# ------------------------------------------------- definitions in a briefing --

# An agent that may spawn is told which definitions it can delegate to, by
# name and description, in the briefing its CLI starts with. Reading them
# means YAML: its import and eight frontmatters took about 30 ms of CPU at the
# root, before its CLI could start, and again at every level that may spawn.
# The built-in definitions spell both fields in one plain form, which these
# patterns read exactly as YAML does (test_delegates holds the two reads to
# the same answer); anything else, and every file of the user's or the
# project's, is read by load_definitions.
BUILTIN_NAME = re.compile(r"^name: ([a-z][a-z0-9-]*)$", re.MULTILINE)
BUILTIN_DESCRIPTION = re.compile(r'^description: "([^"\\\n]+)"$', re.MULTILINE)
# Plain scalars YAML 1.1 reads as something other than a string.
YAML_NOT_STRINGS = frozenset(("y", "n", "yes", "no", "true", "false", "on", "off", "null"))


def delegates_in(cwd: Path, environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """(name, description) of every definition load_definitions finds from cwd, in its order."""
    if not any(any(folder.rglob("*.md")) for folder, _ in agent_dirs_for(cwd, environ)):
        fast = builtin_delegates()
        if fast is not None:
            return list(fast)
    definitions, _ = load_definitions(cwd, environ)
    return [(d.name, d.description) for d in definitions.values()]


@functools.cache
def builtin_delegates() -> tuple[tuple[str, str], ...] | None:
    """The built-in definitions' names and descriptions, without YAML; None if one isn't in the plain form."""
    found: list[tuple[str, str]] = []
    for file_name, text in builtin_files(BUILTIN_AGENTS).items():
        lines = text.splitlines()
        # Where parse_definition finds the frontmatter: the first line that strips to '---' closes it.
        end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), None)
        if lines[0] != "---" or end is None:
            return None
        frontmatter = "\n".join(lines[1:end])
        names, descriptions = BUILTIN_NAME.findall(frontmatter), BUILTIN_DESCRIPTION.findall(frontmatter)
        if len(names) != 1 or len(descriptions) != 1 or names[0] != Path(file_name).stem or names[0] in YAML_NOT_STRINGS:
            return None
        if any(name == names[0] for name, _ in found):
            return None
        found.append((names[0], descriptions[0]))
    return tuple(found)
# ==================== end src/spawnlib/delegates.py ====================

# ==================== begin src/spawnlib/channel.py ====================



























# ------------------------------------------------------- who is calling --
# A record anyone can write is believed by no one. What decides for an agent
# (an answer to its ask) reaches the process that accepts it over a Unix
# socket, where the kernel names the peer (SO_PEERCRED), and that process
# checks the peer's ancestry itself: the answer file is its record of the
# decision, written by it, never the way a decision arrives.

ASK_SOCKET = "{ask_id}.sock"  # in asks/, mode 0600, while the asking runner waits
# An answer is one short JSON line; a peer that sends more, or sends it
# slower than this, is hung up on and the runner goes on waiting.
ANSWER_MAX_BYTES = 64 << 10
ANSWER_READ_S = 2.0


def peer_process(conn: socket.socket) -> psutil.Process | None:
    """The process at the other end of a Unix socket, as the kernel reports it; None for another user's."""
    import socket
    import struct

    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    if uid != os.getuid():
        return None
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid)
    return None


def read_line(conn: socket.socket, limit: int, timeout: float) -> bytes:
    """One newline-ended line from conn, within limit bytes and timeout seconds; ValueError otherwise."""
    conn.settimeout(timeout)
    ends = time.monotonic() + timeout
    got = b""
    while b"\n" not in got:
        if len(got) > limit or time.monotonic() > ends:
            raise ValueError("too long, or too slow")
        chunk = conn.recv(4096)
        if not chunk:
            raise ValueError("closed before a whole line")
        got += chunk
    return got.partition(b"\n")[0]


def ask_socket_path(session: Path, ask_id: str) -> Path:
    return asks_dir(session) / ASK_SOCKET.format(ask_id=ask_id)


def bind_private_socket(path: Path) -> Any:
    """A Unix stream socket bound at path, mode 0600: only this user may connect (an ask's, an inbox's)."""
    import socket

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    address, dir_fd = unix_address(str(path))
    mask = os.umask(0o177)
    try:
        sock.bind(address)
    finally:
        os.umask(mask)
        if dir_fd is not None:
            os.close(dir_fd)
    return sock


class AnswerChannel:
    """The socket an asking runner takes its ask's answer on: bound before the ask is published."""

    def __init__(self, session: Path, ask_id: str) -> None:
        self.session, self.ask_id = session, ask_id
        import threading

        self.path = ask_socket_path(session, ask_id)
        self.closed = False
        # One answer, whoever comes first: an answerer on the socket, the
        # timeout, or close() from a stopping agent, which must leave the ask
        # answered before its process exits (the waiting thread may never run again).
        self.lock = threading.Lock()
        self.answer: dict[str, Any] | None = None
        self.server = bind_private_socket(self.path)
        self.server.listen(8)
        self.server.settimeout(ASK_POLL_S)  # how soon close() is seen

    def close(self) -> None:
        """End a wait early (the agent is stopping): the ask is denied, by timeout, now."""
        self.closed = True
        self.deny_by_timeout()

    def deny_by_timeout(self) -> dict[str, Any]:
        """The answer, recording the timeout's denial unless an answer came first."""
        with self.lock:
            if self.answer is None:
                self.answer = record_answer(self.session, AskAnswer(self.ask_id, "deny", "timeout", ""))
            return self.answer

    def wait(self, ask_agent: str, timeout: float, secrets_: Sequence[str]) -> dict[str, Any]:
        """Wait for an answer from outside the asking agent's tree; the answer record, as written here.

        Blocking: an async caller runs it in a thread. The first answer whose
        caller may give it (self_answer_refusal, on the peer's own ancestry)
        wins; a refused one is recorded in asks/ID.attempts.jsonl and the wait
        goes on. At the timeout the ask is denied, by "timeout". Whatever an
        answer file said before (anything with Bash can write one) is replaced.
        """
        limit = time.monotonic() + timeout
        try:
            while time.monotonic() < limit and not self.closed:
                try:
                    conn, _ = self.server.accept()
                except TimeoutError:
                    continue
                with conn, self.lock:
                    if self.answer is not None:  # close() denied it meanwhile
                        break
                    self.answer = take_answer(conn, self.session, self.ask_id, ask_agent, secrets_)
                if self.answer is not None:
                    return self.answer
        finally:
            self.server.close()
            with contextlib.suppress(OSError):
                self.path.unlink()
        return self.deny_by_timeout()


def record_answer(session: Path, answer: AskAnswer) -> dict[str, Any]:
    """Write the answer record (replacing whatever file was there); the record."""
    answer.at = utc_now_iso()
    record = record_to_json(answer)
    write_json_atomic(asks_dir(session) / f"{answer.id}.answer.json", record)
    return record


def open_ask(
    meta: AgentMeta,
    tool: str,
    tool_input: Mapping[str, Any],
    rule: str,
    *,
    timeout: float,
    secrets_: Sequence[str],
    asker: str | None = None,
) -> AnswerChannel:
    """Publish an ask for the tree to answer, its answer channel already listening; asker: the asking agent's id (meta's)."""
    session = Path(meta.session)
    folder = asks_dir(session)
    folder.mkdir(exist_ok=True)
    ask_id = f"q-{token_hex(3)}"
    channel = AnswerChannel(session, ask_id)  # before the ask is seen: an answer never finds no one
    record = AskRecord(
        ask_id, asker if asker is not None else meta.id, tool, summarize_input(tool_input), rule, utc_now_iso(), time.time() + timeout
    )
    publish_once(folder / f"{ask_id}.json", redacted_json(record_to_json(record), secrets_, indent=2).encode())
    return channel


def take_answer(conn: socket.socket, session: Path, ask_id: str, ask_agent: str, secrets_: Sequence[str]) -> dict[str, Any] | None:
    """One caller's answer as recorded, if it may give it; it is told either way, once the record is written
    (whoever watches the asks, such as the A2A server, must not see the ask pending after its answer returned)."""

    def reply(data: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps(data).encode() + b"\n")

    try:
        given = parse_json(read_line(conn, ANSWER_MAX_BYTES, ANSWER_READ_S))
        verdict, by, text = given["verdict"], given["by"], given.get("text")
        if verdict not in ("approve", "deny") or not isinstance(by, str) or not isinstance(text, str | None):
            raise ValueError("not an answer")
    except (OSError, ValueError, KeyError, TypeError):
        reply({"refused": "not an answer: send one JSON line with verdict (approve|deny), by and text"})
        return None
    peer = peer_process(conn)
    refusal = "its caller can't be told apart" if peer is None else self_answer_refusal(ask_agent, session, calling_agents(peer))
    if refusal is not None:
        attempt = AskAttempt(ask_id, verdict, by, utc_now_iso(), peer.pid if peer else 0, refusal)
        append_jsonl(asks_dir(session) / f"{ask_id}.attempts.jsonl", record_to_json(attempt), secrets_)
        reply({"refused": refusal})
        return None
    record = record_answer(session, AskAnswer(ask_id, verdict, by, "", text))
    reply({"answered": verdict})
    return record


def send_answer(session: Path, ask_id: str, verdict: str, by: str, text: str | None) -> None:
    """Give the waiting runner an answer to ask_id; RefusedError if it refuses this caller, StateError if none waits."""
    import socket

    path = ask_socket_path(session, ask_id)
    address, dir_fd = unix_address(str(path))
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(10.0)
            try:
                client.connect(address)
            except (FileNotFoundError, ConnectionRefusedError):
                raise StateError(
                    f"no agent is waiting for an answer to ask {ask_id}; it was answered, timed out, or its agent ended"
                ) from None
            client.sendall(json.dumps({"verdict": verdict, "by": by, "text": text}).encode() + b"\n")
            said = parse_json(read_line(client, ANSWER_MAX_BYTES, 10.0))
    except (OSError, ValueError) as exc:
        raise StateError(f"ask {ask_id}'s agent did not take the answer ({exc}); run 'spawn.py status' to see if it still asks") from None
    finally:
        if dir_fd is not None:
            os.close(dir_fd)
    if "refused" in said:
        raise RefusedError(f"refused: {said['refused']}; the attempt is recorded in {asks_dir(session) / f'{ask_id}.attempts.jsonl'}")


def ask_timeout(environ: Mapping[str, str]) -> float:
    value = float_or_none(environ.get(ENV_ASK_TIMEOUT))
    return value if value is not None and value > 0 else ASK_TIMEOUT_S


def prompt_person(meta: AgentMeta, tool: str, tool_input: Mapping[str, Any], rule: str, timeout: float) -> tuple[str, str]:
    """Ask the person at the root's terminal; no answer before timeout is a no."""
    import select

    sys.stderr.write(f"spawn: agent {meta.id} wants to use {tool}: {summarize_input(tool_input, 200)}\n  (rule {rule}) allow? [y/N] ")
    sys.stderr.flush()
    ready, _, _ = select.select([sys.stdin], [], [], timeout)
    answer = sys.stdin.readline().strip().lower() if ready else ""
    return ("allow" if answer in ("y", "yes") else "deny"), "terminal"


def confirm_spawn(meta: AgentMeta, session: Path, secrets_: Sequence[str]) -> str | None:
    """Ask the root before a spawn that would take the tree past --confirm-over; None lets it go on.

    Called before admission, without the session lock: the answer may take
    minutes, and other spawns and outcome commits must not wait for it. Two
    spawns racing under the threshold may both pass; the threshold is a
    prompt for a person, --max-budget-usd is the hard cap.
    """
    threshold = read_limits(session).confirm_over_usd
    if threshold is None:
        return None
    ended, running = agent_history(session)
    estimate, _, basis = estimate_agent(meta.model, ended)
    # A running agent's spend so far is in neither the ledger nor its estimate; the estimate stands for all of it.
    projected = read_ledger(session).spent + sum(estimate_agent(m, ended)[0] for m in running) + estimate
    if projected <= threshold:
        return None
    summary = (
        f"start a {meta.model} agent, estimated ${estimate:.4f} ({basis}): the tree's projected spend "
        f"${projected:.4f} passes --confirm-over ${threshold:g}; task: {summarize_input({'command': meta.task}, 120)}"
    )
    rule = f"--confirm-over {threshold:g}"
    timeout = ask_timeout(os.environ)
    if meta.deadline is not None:
        timeout = min(timeout, max(0.0, meta.deadline - time.time()))
    if sys.stdin is not None and sys.stdin.isatty():
        verdict, _ = prompt_person(meta, "Spawn", {"command": summary}, rule, timeout)
        return None if verdict == "allow" else f"confirm: the person at the terminal did not approve ({summary})"
    # The spawner asks: its parent's id (the root has none, but the root never passes through here).
    asker = meta.parent_id or ""
    channel = open_ask(meta, "Spawn", {"command": summary}, rule, timeout=timeout, secrets_=secrets_, asker=asker)
    ask_id = channel.ask_id
    note(f"spawn asks to {summary}: run 'spawn.py approve {ask_id}' or 'spawn.py deny {ask_id}' within {timeout:.0f} s")
    answer = channel.wait(asker, timeout, secrets_)
    if answer.get("verdict") == "approve":
        return None
    how = "timed out unanswered" if answer.get("by") == "timeout" else f"was denied by {answer.get('by')}"
    return f"confirm: ask {ask_id} {how} (projected ${projected:.4f} > --confirm-over ${threshold:g})"
# ==================== end src/spawnlib/channel.py ====================

# ==================== begin src/spawnlib/steering.py ====================








































# ----------------------------------------------------------------- steering --
# Steering a running tree: a message to an agent while it works (`send`), and
# a budget that pauses the tree instead of failing it (`--on-budget pause`,
# `budget`). Both go through the runner that owns the agent, over a socket
# where the kernel names the caller (as answers to asks do, see channel), so
# a record that anything with Bash can write never decides for an agent.

INBOX_SOCKET = "inbox.sock"  # in the agent's directory, 0600, while its runner takes messages
BUDGET_ATTEMPTS = "budget.attempts.jsonl"  # in the session: `budget` calls refused (from inside the tree)
STOPPING = "is being stopped"  # why an inbox closed when its agent is stopped
# A message is a prompt someone typed or a script wrote: 256 KiB is far above
# that, and bounds what one caller makes the runner hold and record.
SEND_MAX_BYTES = 256 << 10
SEND_READ_S = 2.0  # as for answers: a caller that dawdles is hung up on
# The runner reads the caller's process ancestry (psutil, a few ms to tens of
# ms on a loaded machine) before it replies; a reply slower than this means
# the runner is wedged or frozen (a SIGSTOP), which `send` reports.
SEND_REPLY_S = 30.0
# A runner that has no inbox yet is starting (its socket is bound before the
# model is called); `send` waits this long for it before giving up.
INBOX_WAIT_S = 10.0
# A message that came too late (the runner had closed its inbox) is answered
# with the outcome, which the runner commits within about this long.
FINISHED_WAIT_S = 60.0

# Transcript lines (sessions/README.md, "Steering"):
SENT_LINE = "UserSent"  # {seq, text, from, by, pid, delivery}
SEND_REFUSED_LINE = "SendRefused"  # {from, by, pid, refused, chars}
# An a2a node's messages become the next messages of its remote task, marked as
# steering (A2A metadata spawn.steer) so a spawn.py A2A server never takes one as an answer.
REMOTE_DELIVERY = "next message of its remote task"
PAUSED_LINE = "BudgetPaused"  # {reason, spent_usd, hold_usd, needed_usd}
RESUMED_LINE = "BudgetResumed"  # {paused_s, hold_usd, topped_up_usd}

ENV_ON_BUDGET = "SPAWN_ON_BUDGET"  # fail|pause: what the tree does at its budget; children get no wider
ON_BUDGET_DEFAULT = "fail"
# pause keeps a half-done tree; fail ends it. A child may go pause -> fail,
# never fail -> pause: a parent that chose to fail at its budget must not get
# a subtree that sits paused, waiting for someone to pay.
ON_BUDGET_RANK = {"fail": 0, "pause": 1}
# A paused runner looks at the ledger this often for a raise (or a child's
# charge that freed its hold): a paused tree waits for a person, so half a
# second is quick, and an idle look costs one small file read.
PAUSE_POLL_S = 0.5
# A paused agent waits inside the CLI's PreToolUse hook, so the hook's timeout
# bounds a pause: past it the CLI gives up on the hook and makes its request.
# Measured with the bundled CLI: a 2,000,000 s timeout is honoured (a hook
# held 75 s got no request meanwhile); above 2**31 ms Node's timers overflow
# to 1 ms. A pause that nears it without a deadline ends the agent `failed`.
PAUSE_HOOK_TIMEOUT_S = 2_000_000.0
PAUSE_MARGIN_S = 60.0  # ended this long before the hook's timeout, so the CLI never meets it
# consume_sdk sees a turn's tool call (and decides on a pause) a moment after
# the CLI asks its PreToolUse hook about it: the hook waits this long for that.
TURN_CHECK_WAIT_S = 5.0


class FinishedError(SpawnError):
    """The agent has an outcome: it takes no more messages (exit 1)."""

    def __init__(self, agent_id: str, status: str, reason: str) -> None:
        super().__init__(
            f"agent {agent_id} has finished ({status}: {reason[:200]}); it takes no more messages. "
            f"Continue its conversation with 'spawn.py --resume {agent_id} --task TEXT'"
        )
        self.status = status


@dataclass
class PausedRecord:
    """paused.json: an agent stopped before a turn its hold can't pay for (schemas/paused.json)."""

    id: str
    since: str
    """When it paused (ISO 8601)."""
    reason: str
    spent_usd: float
    """Its own turns (priced) and what its children hold or were charged."""
    hold_usd: float
    """Its hold in the ledger."""
    needed_usd: float
    """How much more its hold needs for its next turn (that turn priced as its last)."""
    deadline: float | None = None
    """Unix seconds: it ends `timeout` then, paused or not."""


@dataclass
class BudgetChange:
    """A `budget` line of ledger.jsonl: the tree's budget from now on.

    It has no `id`, so a spawn.py that predates it skips the line (readers
    take a line with an id and no kind for a charge).
    """

    time: str
    max_budget_usd: float
    previous_usd: float
    by: str
    kind: str = "budget"


# ------------------------------------------------------------ who may steer --


def send_refusal(target: str, session: Path, callers: Sequence[tuple[str, str, int]], chain_of: Callable[[str], list[str]]) -> str | None:
    """Why a message to target must be refused, given the agents the sender runs under (pure but for chain_of).

    Neither the agent nor anything in its subtree may steer it: they run
    code its own model wrote. callers are (session, agent id, depth), nearest
    first (calling_agents): a process below the agent's runner has it among
    them; chain_of(id) gives an agent's ancestors by its meta.json, for one
    that escaped the process tree but not its record.
    """
    same = [agent for caller_session, agent, _depth in callers if _same_dir(caller_session, session)]
    if not same:
        return None
    if same[0] == target:
        return f"agent {target} can't send a message to itself"
    for agent in same:
        if agent == target or target in chain_of(agent):
            return f"agent {same[0]} is in {target}'s subtree and can't steer it; its parent, the person or a client outside can"
    return None


def tree_caller_refusal(session: Path, callers: Sequence[tuple[str, str, int]]) -> str | None:
    """Why a caller may not change its tree's budget: it runs under one of the tree's agents (pure)."""
    for caller_session, agent, depth in callers:
        if _same_dir(caller_session, session):
            return f"agent {agent} (depth {depth}) runs in this tree and can't change its budget; the person or a client outside can"
    return None


def _same_dir(a: str, b: Path) -> bool:
    with contextlib.suppress(OSError):
        return Path(a).resolve() == b.resolve()
    return False


def meta_chain(session: Path) -> Callable[[str], list[str]]:
    """chain_of for send_refusal: an agent's ancestors as meta.json's parent_id links them."""

    def chain(agent_id: str) -> list[str]:
        found: list[str] = []
        current: str | None = agent_id
        while current is not None and current not in found and len(found) < 256:
            try:
                current = load_meta(session / AGENTS_DIR / current).parent_id
            except (OSError, SpawnError):
                break
            if current is not None:
                found.append(current)
        return found

    return chain


def sender_name(pid: int, callers: Sequence[tuple[str, str, int]]) -> str:
    """Who sent a message, for the record: the agent it runs under, else its process."""
    if callers:
        return f"agent {callers[0][1]}"
    try:
        # Past the interpreter that runs spawn.py (and uv): the program that asked for it.
        proc = psutil.Process(pid)
        while proc.name().startswith(("uv", "python")) and (up := proc.parent()) is not None and up.pid > 1:
            proc = up
        return f"pid {proc.pid} ({proc.name()})"
    except psutil.Error:
        return f"pid {pid}"


def check_name(as_name: str | None, default: str) -> str:
    """`--as NAME` as recorded; names spawn.py uses itself are reserved."""
    import re

    if as_name is None:
        return default
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.:@\-]{0,63}", as_name) or as_name in ("timeout", "terminal", "rules"):
        raise UsageError(f"--as {as_name!r} is not a usable name; use letters, digits and _.:@- (not timeout, terminal or rules)")
    return as_name


def user_message(text: str) -> dict[str, Any]:
    """One prompt of the SDK's streaming input."""
    return {"type": "user", "session_id": "", "message": {"role": "user", "content": text}, "parent_tool_use_id": None}


# ---------------------------------------------------------------- the inbox --


class Inbox:
    """A running agent's socket for messages (`spawn.py send`), served on the runner's event loop.

    A message accepted while the run is open is recorded in the transcript
    (SENT_LINE) and handed to the CLI at once: the CLI puts it into its next
    model request, or, when its turn has ended, runs another turn for it.
    Closed (the run's last turn ended with nothing queued, or the agent is
    stopping), it answers `finished`; the sender then reports the outcome.
    """

    def __init__(self, meta: AgentMeta, agent_dir: Path, secrets_: Sequence[str]) -> None:
        import asyncio

        self.meta, self.agent_dir, self.secrets = meta, agent_dir, secrets_
        self.queue: deque[str] = deque()
        self.wake = asyncio.Event()
        self.closed: str | None = None
        self.seq = 0
        self.turn_ended = False
        """The CLI's last turn has a result: a message now reopens the run."""
        self.before_reopen: Callable[[], Any] | None = None
        """Awaited before a message reopens a finished turn (the budget pause's gate)."""
        self.delivery = REMOTE_DELIVERY if meta.kind == "a2a" else None
        """What every accepted message becomes, where it isn't the CLI's next request (an a2a node's remote task)."""
        self.path = agent_dir / INBOX_SOCKET
        self.server: Any = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # a runner that died left it: nothing listens there
        self.sock = bind_private_socket(self.path)
        self.sock.listen(16)
        self.sock.setblocking(False)

    async def start(self) -> None:
        import asyncio

        self.server = await asyncio.start_unix_server(self._serve, sock=self.sock, limit=SEND_MAX_BYTES + 2)

    def close(self, why: str, *, drop: bool = False) -> None:
        """Take no more messages; the prompt stream ends once the queue is empty (at once with drop: a stop)."""
        if drop:
            self.queue.clear()  # an agent being stopped is handed nothing more
            why = STOPPING
        if self.closed is None:
            self.closed = why
            with contextlib.suppress(OSError):
                self.path.unlink()
            if self.server is not None:
                self.server.close()
        self.wake.set()

    def result_seen(self) -> None:
        """The CLI's turn ended (a ResultMessage): with nothing queued, the run is over."""
        self.turn_ended = True
        if not self.queue:
            self.close("finished its turn")

    async def wait_for_message(self) -> bool:
        """Until a message is queued (True), or the inbox is closed with none left (False)."""
        while not self.queue and self.closed is None:
            self.wake.clear()
            await self.wake.wait()
        return bool(self.queue)

    async def prompts(self, first: str) -> AsyncIterator[dict[str, Any]]:
        """The SDK's streaming input: the task, then each accepted message."""
        yield user_message(first)
        while True:
            if not await self.wait_for_message():
                return
            if self.turn_ended and self.before_reopen is not None:
                await self.before_reopen()
                if not self.queue or self.closed == STOPPING:
                    return  # stopped while it waited
            self.turn_ended = False
            yield user_message(self.queue.popleft())

    async def _serve(self, reader: Any, writer: Any) -> None:
        import asyncio

        try:
            reply = await asyncio.wait_for(self._take(reader, writer), SEND_READ_S + SEND_REPLY_S)
        except (TimeoutError, OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            reply = {"refused": "not a message: send one JSON line with text and by, whole, within 2 s"}
        with contextlib.suppress(OSError, ConnectionError):
            writer.write(json.dumps(reply).encode() + b"\n")
            await writer.drain()
            writer.close()

    async def _take(self, reader: Any, writer: Any) -> dict[str, Any]:
        import asyncio

        line = await asyncio.wait_for(reader.readline(), SEND_READ_S)
        given = parse_json(line.decode(errors="replace"))
        text, by = given.get("text") if isinstance(given, dict) else None, given.get("by") if isinstance(given, dict) else None
        if not isinstance(text, str) or not text.strip() or not isinstance(by, str | None):
            return {"refused": "not a message: send one JSON line with a non-empty text"}
        by = by[:64] if by is not None else None  # a name, as `--as` takes it; the socket takes anything
        sock = writer.get_extra_info("socket")
        peer = peer_process(sock) if sock is not None else None
        callers = await asyncio.to_thread(calling_agents, peer) if peer is not None else []
        session = Path(self.meta.session)
        refusal = "its sender can't be told apart" if peer is None else send_refusal(self.meta.id, session, callers, meta_chain(session))
        pid = peer.pid if peer is not None else 0
        sender = sender_name(pid, [c for c in callers if _same_dir(c[0], session)] or callers)
        if refusal is not None:
            record = {"from": sender, "by": by, "pid": pid, "refused": refusal, "chars": len(text)}
            self._line(SEND_REFUSED_LINE, record)
            return {"refused": refusal}
        if self.closed is not None:
            return {"finished": self.closed}
        self.seq += 1
        delivery = self.delivery or ("reopens the run" if self.turn_ended else "next request")
        self._line(SENT_LINE, {"seq": self.seq, "text": text, "from": sender, "by": by, "pid": pid, "delivery": delivery})
        self.queue.append(text)
        self.wake.set()
        return {"queued": self.seq, "delivery": delivery}

    def _line(self, kind: str, message: Mapping[str, Any]) -> None:
        record = {"time": utc_now_iso(), "type": kind, "message": {k: v for k, v in message.items() if v is not None}}
        append_transcript(self.agent_dir / TRANSCRIPT, record, self.secrets)


def open_inbox(meta: AgentMeta, agent_dir: Path, secrets_: Sequence[str]) -> Inbox | None:
    """The agent's inbox, bound; None where no socket can be made (the run goes on without one)."""
    try:
        return Inbox(meta, agent_dir, secrets_)
    except OSError:
        return None


# ------------------------------------------------------------ `spawn.py send` --


def send_message(agent_dir: Path, text: str, by: str | None) -> dict[str, Any]:
    """Hand text to the agent's runner; its reply ({"queued": N, "delivery"}).

    RefusedError: the runner refused the sender (recorded in the transcript).
    FinishedError: the agent has (or is about to have) an outcome.
    StateError: no runner takes messages for it.
    """
    import socket

    meta = load_meta(agent_dir)
    finished = _outcome_of(agent_dir, meta.id)
    if finished is not None:
        raise finished
    if meta.kind == "command":
        raise UsageError(
            f"agent {meta.id} is a command node: a command reads its one task on stdin and takes no messages; "
            "kill it and spawn another with the new task"
        )
    path = agent_dir / INBOX_SOCKET
    limit = time.monotonic() + INBOX_WAIT_S
    while True:
        address, dir_fd = unix_address(str(path))
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.settimeout(SEND_REPLY_S)
                client.connect(address)
                client.sendall(json.dumps({"text": text, "by": by}).encode() + b"\n")
                said = parse_json(read_line(client, SEND_MAX_BYTES, SEND_REPLY_S))
            break
        except (FileNotFoundError, ConnectionRefusedError):
            finished = _outcome_of(agent_dir, meta.id)
            if finished is not None:
                raise finished from None
            if time.monotonic() > limit:
                raise StateError(
                    f"agent {meta.id} takes no messages: its runner has no inbox ({path}); it may be a spawn.py older than 'send', "
                    "or have died (run 'spawn.py status')"
                ) from None
            time.sleep(0.1)
        except (OSError, ValueError) as exc:
            raise StateError(f"agent {meta.id}'s runner did not take the message ({exc}); run 'spawn.py status' to see how it is") from None
        finally:
            if dir_fd is not None:
                os.close(dir_fd)
    if "refused" in said:
        raise RefusedError(f"refused: {said['refused']}; the attempt is recorded in {agent_dir / TRANSCRIPT}")
    if "finished" in said:
        limit = time.monotonic() + FINISHED_WAIT_S
        while (finished := _outcome_of(agent_dir, meta.id)) is None and time.monotonic() < limit:
            time.sleep(0.1)
        raise finished or StateError(f"agent {meta.id} {said['finished']} but has no outcome yet; run 'spawn.py wait {meta.id}'")
    return {"id": meta.id, "seq": said.get("queued"), "delivery": said.get("delivery")}


def _outcome_of(agent_dir: Path, agent_id: str) -> FinishedError | None:
    with contextlib.suppress(SpawnError):
        outcome = read_outcome(agent_dir)
        if outcome is not None:
            return FinishedError(agent_id, str(outcome.get("status")), str(outcome.get("reason") or ""))
    return None


# -------------------------------------------------------------- the budget --


@dataclass
class BudgetState:
    """The tree budget's changes as the ledger's `budget` lines tell them."""

    budget: float | None = None
    """The last budget line's max_budget_usd; None: limits.json's stands."""
    raised: float = 0.0
    """What the budget lines added in all: the pool that paused agents' holds grow from."""
    topped_up: float = 0.0
    """What holds grew by from that pool (reserve lines with topped_up_usd)."""


def budget_state(lines: Iterable[str]) -> BudgetState:
    """Fold ledger.jsonl's budget and top-up lines (pure); other lines are ledger_state's."""
    state = BudgetState()
    for line in lines:
        with contextlib.suppress(ValueError):
            entry = parse_json(line)
            if not isinstance(entry, dict):
                continue
            if entry.get("kind") == "budget" and "id" not in entry:
                new, old = entry.get("max_budget_usd"), entry.get("previous_usd")
                if isinstance(new, int | float) and isinstance(old, int | float) and _finite(new) and _finite(old):
                    state.budget = float(new)
                    state.raised += float(new) - float(old)
            elif entry.get("kind") == "reserve" and _finite(entry.get("topped_up_usd")):
                state.topped_up += float(entry["topped_up_usd"])
    return state


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def read_budget_state(session: Path) -> BudgetState:
    try:
        return budget_state(ledger_text(session).splitlines())
    except FileNotFoundError:
        return BudgetState()


def tree_budget(session: Path) -> float | None:
    """The tree's budget now: the last `budget` line's, else limits.json's."""
    changed = read_budget_state(session).budget
    return changed if changed is not None else read_limits(session).max_budget_usd


def change_budget(session: Path, raise_usd: float | None, set_usd: float | None, by: str, secrets_: Sequence[str]) -> dict[str, Any]:
    """Append the tree's new budget to its ledger (under the session lock); what changed."""
    for flag, value in (("--raise", raise_usd), ("--set", set_usd)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise UsageError(f"{flag} {value}: give a non-negative number of USD")
    with session_lock(session):
        limits = read_limits(session)
        budget = tree_budget(session)
        if budget is None or limits.max_budget_usd is None:
            raise UsageError(f"session {session.name} has no budget (its root ran without --max-budget-usd); there is nothing to raise")
        ledger = read_ledger(session)
        new = budget + raise_usd if raise_usd is not None else float(set_usd or 0.0)
        floor = ledger.spent + ledger.reserved
        if new + 1e-9 < floor:
            raise UsageError(
                f"--set {new:g} is below what the tree has spent and holds (${floor:.4f}); set at least that, or wait for agents to end"
            )
        change = BudgetChange(utc_now_iso(), round_usd(new) or 0.0, round_usd(budget) or 0.0, by)
        append_ledger(session, record_to_json(change), secrets_)
        # limits.json follows, so that every reader of the cap (admission,
        # status, the MCP server) sees it; the ledger line, first, is the record.
        write_json_atomic(session / LIMITS, record_to_json(dataclasses.replace(limits, max_budget_usd=change.max_budget_usd)))
    return {
        "session": str(session),
        "max_budget_usd": change.max_budget_usd,
        "previous_usd": change.previous_usd,
        "paused": paused_agents(session),
    }


def record_budget_refusal(session: Path, by: str, refusal: str, secrets_: Sequence[str]) -> None:
    attempt = {"at": utc_now_iso(), "by": by, "pid": os.getpid(), "refused": refusal}
    append_jsonl(session / BUDGET_ATTEMPTS, attempt, secrets_)


def paused_agents(session: Path) -> list[dict[str, Any]]:
    """The paused.json of every agent of the session that is paused now (its runner alive)."""
    found = []
    agents = session / AGENTS_DIR
    for path in sorted(agents.glob(f"*/{PAUSED}")) if agents.is_dir() else []:
        with contextlib.suppress(OSError, ValueError, SpawnError):
            record = parse_json(read_text(path))
            meta = load_meta(path.parent)
            if read_outcome(path.parent) is None and Supervised(meta.pid, meta.create_time).alive():
                found.append(record)
    return found


def hold_chain(ledger: Any, agent_id: str) -> list[str]:
    """The live holds a top-up of agent_id's hold passes through: its own, then each live one it draws from (pure)."""
    chain, current, seen = [], agent_id, set()
    while current is not None and current in ledger.holds and current not in seen:
        seen.add(current)
        if ledger.live(current):
            chain.append(current)
        current = ledger.holds[current][0]
    return chain


def top_up_hold(session: Path, agent_id: str, needed: float, secrets_: Sequence[str]) -> float | None:
    """Grow a paused agent's hold by needed from what `budget` raised, under the session lock; the new hold, or None.

    The holds it draws from grow by as much (their own room is unchanged),
    and the tree's remainder must have it: a raise is spent by the paused
    agents that need it, a turn at a time, and never more than was raised.
    """
    with session_lock(session):
        text = ledger_text(session) if (session / LEDGER).exists() else ""
        lines = text.splitlines()
        ledger, changes = ledger_state(lines), budget_state(lines)
        budget = changes.budget if changes.budget is not None else read_limits(session).max_budget_usd
        chain = hold_chain(ledger, agent_id)
        if budget is None or not chain or changes.raised - changes.topped_up + 1e-9 < needed:
            return None
        if ledger.free(None, budget) + 1e-9 < needed:
            return None
        now = utc_now_iso()
        for n, holder in enumerate(chain):
            source, amount = ledger.holds[holder]
            line: dict[str, Any] = {"id": holder, "time": now, "kind": "reserve", "amount_usd": round_usd(amount + needed)}
            if source is not None:
                line["drawn_from"] = source
            if n == 0:
                line["topped_up_usd"] = round_usd(needed)
            append_ledger(session, line, secrets_)
        return float(round_usd(ledger.holds[agent_id][1] + needed) or 0.0)


def hold_need(session: Path, agent_id: str, own_spend: float, last_turn: float) -> tuple[float, float, float] | None:
    """(spent, hold, needed) of an agent whose next turn its hold can't pay for, else None."""
    ledger = read_ledger(session)
    if not ledger.live(agent_id):
        return None
    hold = ledger.holds[agent_id][1]
    spent = own_spend + sum(ledger.used_by(c) for c in ledger.draws(agent_id))
    needed = spent + last_turn - hold
    if spent < hold and needed <= 0:
        return None
    # At least a cent, rounded up to the micro-dollar: a hold that grows by a
    # hair's breadth would pause again at once.
    return spent, hold, max(0.01, math.ceil(max(needed, 0.0) * 1e6) / 1e6)


class BudgetPause:
    """An agent under `--on-budget pause`: it waits before a turn its hold can't pay for.

    consume_sdk sees each turn's tool calls (check_turn); the CLI asks its
    PreToolUse hook about each call before it runs it, and so before its next
    model request. The hook (pre_tool_use) waits while the agent is paused,
    so the CLI makes no request and its processes stay as they are. A poll
    grows the hold from a `budget` raise, or sees that a child's charge freed
    it, and lets the hook answer. The CLI runs with no max_budget_usd of its
    own under pause: its cap is fixed at its start, and a raise could never
    lift it; the hold is kept by this check before each turn instead.
    """

    def __init__(self, meta: AgentMeta, agent_dir: Path, secrets_: Sequence[str]) -> None:
        import asyncio

        self.meta, self.agent_dir, self.secrets = meta, agent_dir, secrets_
        self.session = Path(meta.session)
        self.checked: set[str] = set()
        self.seen = asyncio.Event()
        self.resumed = asyncio.Event()
        self.resumed.set()
        self.paused: PausedRecord | None = None
        self.paused_at = 0.0
        self.stopping = False
        """The run is being stopped: the hook is never answered again (the CLI would take a turn), only abandoned."""
        self.spend: tuple[float, float] = (0.0, 0.0)
        self.poller: Any = None
        self.on_fail: Callable[[str], None] | None = None
        """The run's stop path (failed): a pause that nears the hook's timeout ends the agent."""
        self.stopped: Callable[[], bool] = lambda: False
        """Whether the run is being stopped (its stop_reason is set): then nothing resumes."""

    @property
    def is_paused(self) -> bool:
        return self.paused is not None

    def check_turn(self, tool_use_ids: Iterable[str], turns: Iterable[tuple[str, dict[str, Any]]]) -> None:
        """After a turn that calls tools: pause if its hold can't pay for the next one."""
        self.check(list(turns))
        self.checked.update(tool_use_ids)
        self.seen.set()

    def check(self, turns: list[tuple[str, dict[str, Any]]]) -> None:
        """Pause unless its hold pays for a turn like its last, or can grow from a raise to pay for it."""
        if self.is_paused:
            return
        own, last = estimate_cost(turns), estimate_cost(turns[-1:])
        need = hold_need(self.session, self.meta.id, own, last)
        if need is not None and top_up_hold(self.session, self.meta.id, need[2], self.secrets) is not None:
            # A raise made before it ran short is drawn at once, a turn at a time, without a pause.
            need = hold_need(self.session, self.meta.id, own, last)
        if need is not None:
            why = over_hold(self.session, self.meta.id, own, last) or "budget: its hold can't pay for its next turn"
            self.pause(why.replace("stopped before another turn", "paused before another turn"), need, (own, last))

    def pause(self, reason: str, need: tuple[float, float, float], spend: tuple[float, float]) -> None:
        import asyncio

        spent, hold, needed = need
        self.spend = spend
        self.paused = PausedRecord(
            self.meta.id, utc_now_iso(), reason, round_usd(spent) or 0.0, round_usd(hold) or 0.0, needed, self.meta.deadline
        )
        self.paused_at = time.monotonic()
        self.resumed.clear()
        with contextlib.suppress(OSError):
            write_json_atomic(self.agent_dir / PAUSED, record_to_json(self.paused))
        message = {k: v for k, v in record_to_json(self.paused).items() if k in ("reason", "spent_usd", "hold_usd", "needed_usd")}
        self._line(PAUSED_LINE, message)
        self.poller = asyncio.ensure_future(self._poll())

    async def _poll(self) -> None:
        import asyncio

        topped = 0.0
        while self.paused is not None:
            await asyncio.sleep(PAUSE_POLL_S)
            if time.monotonic() - self.paused_at > PAUSE_HOOK_TIMEOUT_S - PAUSE_MARGIN_S and self.on_fail is not None:
                self.on_fail(f"budget: paused for {PAUSE_HOOK_TIMEOUT_S - PAUSE_MARGIN_S:.0f} s and nobody raised it; {self.paused.reason}")
                return
            own, last = self.spend
            need = await asyncio.to_thread(hold_need, self.session, self.meta.id, own, last)
            if need is not None:
                grown = await asyncio.to_thread(top_up_hold, self.session, self.meta.id, need[2], self.secrets)
                if grown is None:
                    continue
                topped += need[2]
                if await asyncio.to_thread(hold_need, self.session, self.meta.id, own, last) is not None:
                    continue
            self.resume(topped)

    def resume(self, topped: float) -> None:
        if self.stopping or self.stopped():
            return
        paused_s = round(time.monotonic() - self.paused_at, 3)
        self.paused = None
        with contextlib.suppress(OSError):
            (self.agent_dir / PAUSED).unlink()
        ledger = read_ledger(self.session)
        hold = ledger.holds.get(self.meta.id, (None, 0.0))[1]
        self._line(RESUMED_LINE, {"paused_s": paused_s, "hold_usd": round_usd(hold), "topped_up_usd": round_usd(topped)})
        self.resumed.set()

    def freeze(self) -> None:
        """The run is being stopped (deadline, kill, signal): every hook waiting here answers "stop".

        Left unanswered, the hook fails once the CLI's stdin closes, and the
        CLI (which handles its SIGTERM on its event loop) runs the tool and
        makes the very request the pause held back (seen under load). A hook
        output with continue false ends the CLI's turn instead.
        """
        self.stopping = True
        if self.poller is not None:
            self.poller.cancel()
        self.resumed.set()

    def close(self) -> None:
        """The run ends: a pause ends with it (its record goes; the outcome says what happened)."""
        if self.poller is not None:
            self.poller.cancel()
        if self.paused is not None:
            self.paused = None
            with contextlib.suppress(OSError):
                (self.agent_dir / PAUSED).unlink()
        self.stopping = True  # a hook asked from here on answers "stop" too
        self.resumed.set()

    async def pre_tool_use(self, hook_input: Any, tool_use_id: str | None, context: Any) -> Any:
        """The CLI's PreToolUse hook: answer once the agent may take its next turn."""
        import asyncio

        limit = time.monotonic() + TURN_CHECK_WAIT_S
        while tool_use_id is not None and tool_use_id not in self.checked and time.monotonic() < limit:
            self.seen.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.seen.wait(), max(0.0, limit - time.monotonic()))
        await self.resumed.wait()
        if self.stopping or self.stopped():
            return {"continue_": False, "stopReason": "spawn.py: the agent is being stopped (its deadline, a kill or a signal)"}
        return {}

    async def before_turn(self, turns: Iterable[tuple[str, dict[str, Any]]]) -> None:
        """Before a message reopens a finished run: the same check, and wait while paused."""
        self.check(list(turns))
        await self.resumed.wait()

    def _line(self, kind: str, message: Mapping[str, Any]) -> None:
        record = {"time": utc_now_iso(), "type": kind, "message": dict(message)}
        append_transcript(self.agent_dir / TRANSCRIPT, record, self.secrets)


def narrow_on_budget(requested: str | None, inherited: Sequence[str | None]) -> tuple[str, str | None]:
    """(the agent's --on-budget, a warning) from its flag and what it inherits (pure): never wider than a parent's."""
    known = [v for v in inherited if v in ON_BUDGET_RANK]
    ceiling = min(known, key=ON_BUDGET_RANK.__getitem__) if known else None
    if requested is None:
        return ceiling or ON_BUDGET_DEFAULT, None
    if ceiling is not None and ON_BUDGET_RANK[requested] > ON_BUDGET_RANK[ceiling]:
        return ceiling, f"--on-budget {requested} is wider than the parent's {ceiling}; using {ceiling}"
    return requested, None


def ancestry_on_budget(ancestry: Mapping[str, Any]) -> str | None:
    """The --on-budget of the agent this spawn runs under (its runner's meta.json): absent there is fail."""
    runner = ancestry.get("runner")
    return (runner.get("on_budget") or ON_BUDGET_DEFAULT) if isinstance(runner, Mapping) else None


def paused_reason(session: Path, paused: Mapping[str, Any]) -> str:
    return (
        f"budget: the tree is paused at its budget (agent {paused.get('id')} needs ${paused.get('needed_usd')} more); "
        f"raise it with 'spawn.py budget {session} --raise USD'"
    )


def wait_while_paused(session: Path, deadline: float | None, *, no_wait: bool) -> str | None:
    """Before admission: wait while an agent of the tree is paused at its budget; the refusal, or None.

    A paused tree is waiting for someone to pay: a new agent would draw on
    what is left, or pause at once. With --no-wait it is refused now.
    """
    paused = paused_agents(session)
    if not paused:
        return None
    why = paused_reason(session, paused[0])
    if no_wait:
        return f"{why}; --no-wait"
    print(f"spawn: waiting for admission: {why}", file=sys.stderr, flush=True)
    while paused_agents(session):
        if deadline is not None and time.time() >= deadline:
            return f"{why}; the deadline passed while waiting"
        time.sleep(PAUSE_POLL_S)
    return None


# ------------------------------------------------------------- in the runner --


async def open_steering(meta: AgentMeta, agent_dir: Path, state: Any, secrets_: Sequence[str]) -> None:
    """Before a claude agent's or an a2a node's run: its inbox, and a claude agent's pause under --on-budget pause (state: the RunState).

    The run's stop path (state.request_stop, and its stop hooks, which run
    while the CLI is frozen) closes the inbox and answers a paused hook "stop".
    """
    if meta.kind not in ("claude", "a2a"):
        return  # a command reads its one task on stdin and takes no messages
    # An a2a node's messages go on to its remote task (A2AConversation.forward); its remote pauses on its own.
    if meta.on_budget == "pause" and meta.kind == "claude":
        state.pause = BudgetPause(meta, agent_dir, secrets_)
        state.pause.stopped = lambda: state.stop_reason is not None
        if state.request_stop is not None:
            state.pause.on_fail = lambda why: state.request_stop(Status.FAILED, why)

    async def on_stop() -> None:
        stop_steering(state)

    state.stop_hooks.append(on_stop)
    inbox = open_inbox(meta, agent_dir, secrets_)
    if inbox is None:
        return
    await inbox.start()
    pause = state.pause
    if pause is not None:
        inbox.before_reopen = lambda: pause.before_turn(state.turns.values())
    state.inbox = inbox


def stop_steering(state: Any) -> None:
    """The run is being stopped: no message is handed on, and a paused hook answers "stop"."""
    if state.inbox is not None:
        state.inbox.close(STOPPING, drop=True)
    if state.pause is not None:
        state.pause.freeze()


def close_steering(state: Any) -> None:
    """The run is over: its inbox takes no more, and a pause ends with it."""
    if state.inbox is not None:
        state.inbox.close("has ended")
    if state.pause is not None:
        state.pause.close()


def pause_hooks(sdk: Any, pause: BudgetPause | None) -> list[Any]:
    """The PreToolUse matcher a paused agent waits in, with a timeout no pause reaches (PAUSE_HOOK_TIMEOUT_S)."""
    if pause is None:
        return []
    return [sdk.HookMatcher(matcher=None, hooks=[pause.pre_tool_use], timeout=PAUSE_HOOK_TIMEOUT_S)]


# ------------------------------------------------------------ what status shows --


def paused_note(row: Mapping[str, Any]) -> str:
    """`status`'s words for a paused agent: what it spent and what its next turn needs."""
    paused = row.get("paused")
    if not isinstance(paused, Mapping):
        return ""
    return f"  [paused: spent ${paused.get('spent_usd')}, needs ${paused.get('needed_usd')} more; spawn.py budget SESSION --raise USD]"


class SentMessages:
    """`status --watch`'s view of the messages sent to the tree's agents: what is new since its last look."""

    RECENT = 5  # messages a terminal frame shows, newest last

    def __init__(self) -> None:
        self.offsets: dict[str, int] = {}
        self.recent: list[str] = []

    def read(self, rows: Iterable[Mapping[str, Any]]) -> list[str]:
        """One line for each message (or refused one) recorded since the last call."""
        new: list[str] = []
        for row in rows:
            path = Path(str(row.get("agent_dir", ""))) / TRANSCRIPT
            with contextlib.suppress(OSError):
                size = path.stat().st_size
                start = self.offsets.get(str(path), 0)
                if size <= start:
                    continue
                with path.open("rb") as fh:
                    fh.seek(start)
                    chunk = fh.read(size - start)
                whole = chunk[: chunk.rfind(b"\n") + 1]  # a line being written is read next time
                self.offsets[str(path)] = start + len(whole)
                for line in whole.splitlines():
                    if b'"UserSent"' in line or b'"SendRefused"' in line:
                        new += self._describe(str(row.get("id")), line)
        self.recent = [*self.recent, *new][-self.RECENT :]
        return new

    @staticmethod
    def _describe(agent_id: str, line: bytes) -> list[str]:
        with contextlib.suppress(ValueError, AttributeError):
            record = parse_json(line.decode(errors="replace"))
            message = record.get("message") or {}
            if record.get("type") == SENT_LINE:
                text = " ".join(str(message.get("text", "")).split())[:120]
                return [f"message {message.get('seq')} to {agent_id} from {message.get('from')}: {text}"]
            if record.get("type") == SEND_REFUSED_LINE:
                return [f"message to {agent_id} from {message.get('from')} refused: {message.get('refused')}"]
        return []


def cli_budget_cap(meta: AgentMeta) -> float | None:
    """The CLI's own max_budget_usd: the agent's hold, but none under --on-budget pause in a tree with a budget.

    A running CLI's cap can't be raised, so after a raise it would still stop
    at the old one; the runner's check before each turn (BudgetPause) holds the
    agent to its hold instead. A tree without a budget has no holds to pause
    on: there an agent's own --max-budget-usd stays the CLI's cap, as under fail.
    """
    if meta.on_budget == "pause" and read_limits(Path(meta.session)).max_budget_usd is not None:
        return None
    return meta.max_budget_usd
# ==================== end src/spawnlib/steering.py ====================

# ==================== begin src/spawnlib/running.py ====================

















































# ------------------------------------------------------------------ running --


def spawn_command() -> str:
    """How an agent's Bash should call spawn.py: the interpreter already resolved.

    Skipping `uv run` below the root saves its resolution step at every level,
    and the compiled script its compilation.
    """
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(compiled_script()))}"


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
    env.update(placement_environment(meta))
    env.update(quiet_cli_environment(os.environ))
    # Claude Code's minimal mode (CLAUDE_CODE_SIMPLE=1, what `claude --bare`
    # sets) runs no hooks, not even the SDK's: PermissionGate would never see a
    # tool call, so ask rules and the audit trail would be skipped without a
    # word. Anything that can run Bash could set it for a child; it is off for
    # every agent, whatever was inherited.
    env["CLAUDE_CODE_SIMPLE"] = "0"
    return env


def placement_environment(meta: AgentMeta) -> dict[str, str]:
    """The policy the agent's children inherit and, where its CLI starts them
    in-process, how deep its subagents may nest (what --max-depth leaves)."""
    policy = (meta.placement or {}).get("policy")
    if not isinstance(policy, str):
        return {}
    env = {ENV_PLACEMENT: policy}
    levels = subagent_depth_limit(meta.depth, meta.max_depth)
    if policy in IN_PROCESS_POLICIES and levels > 0:
        env[ENV_SUBAGENT_DEPTH] = str(levels)
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

    def __init__(self, in_process: Any = None) -> None:
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
        self.in_process: Any = in_process
        """The InProcessTree of its in-process children, under --placement inprocess or auto."""
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


def imported_modules(*packages: str) -> list[str]:
    """The names in sys.modules of these top-level packages and their modules.

    import_sdk runs on the SDK-import thread while the runner's own thread
    may import too (psutil at its first use), so sys.modules is copied by
    list(), one C call under the GIL, never iterated while it can change
    size ("dictionary changed size during iteration" failed a root).
    """
    return [name for name in list(sys.modules) if name.partition(".")[0] in packages]


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
    # The SDK imports jsonschema at import time only to validate the input of
    # in-process MCP tools, which spawn.py never creates: a large part of the
    # SDK's import, paid at every depth.
    import_at_first_use("jsonschema")
    # Imported by the SDK for the app name it derives, which spawn.py gives
    # it (run_sdk): about 15 ms of reading email and zip modules.
    import_at_first_use("importlib.metadata")
    # Imported by connect(), when installed, only to pass on an in-process
    # span: spawn.py has none, and gives the CLI its TRACEPARENT itself
    # (child_environment). Absent, it is the ImportError the SDK expects
    # without the package: about 8 ms of every agent's start, before its CLI.
    sys.modules.setdefault("opentelemetry.propagate", None)  # type: ignore[arg-type]
    if environ.get(ENV_FULL_SDK_IMPORT) != "1" and not imported_modules("mcp"):
        finder = _AbsentMcpFinder()
        sys.meta_path.insert(0, finder)
        try:
            import claude_agent_sdk

            return claude_agent_sdk
        except Exception:
            sys.meta_path.remove(finder)
            for name in imported_modules("mcp", "mcp_types", "claude_agent_sdk"):
                del sys.modules[name]
    import claude_agent_sdk

    return claude_agent_sdk


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
# ==================== end src/spawnlib/running.py ====================

# ==================== begin src/spawnlib/inprocess.py ====================
"""In-process children: Claude Code's own subagents, governed as agents of the session.

Under --placement inprocess or auto, an agent's CLI starts its children itself
with the Agent tool, inside its own process, and they nest (the CLI's
CLAUDE_CODE_MAX_SUBAGENT_SPAWN_DEPTH). spawn.py's runner of that agent sees
every one of them through the SDK's hooks and makes each an agent of the
session: its own directory and meta.json, exactly one outcome, a copy of its
transcript. What the hooks carry, measured on CLI 2.1.329:

- PreToolUse/PostToolUse carry `agent_id` for a call a subagent makes (none
  for the main thread's); SubagentStart carries the new subagent's
  `agent_id` and `agent_type` but not who started it, so the Agent call that
  started it is the oldest one not yet matched (`pending`).
- SubagentStop carries `last_assistant_message` and `agent_transcript_path`;
  answering {"decision": "block", "reason": R} gives the subagent the user
  turn "Stop hook feedback:\\nR" and it goes on (stop_hook_active is then true).
- A PreToolUse deny reaches the model as the tool result
  "PreToolUse:TOOL hook error: REASON" (is_error): the call never runs.
  Deny plus {"continue": false} ends the subagent's turn there, and no
  SubagentStop follows: its outcome is committed at that boundary.

Its limits hold at those boundaries only (soft): a model call under way is
never cut short. The runner's own deadline and kill stay hard for the whole CLI.
"""












































AGENT_TOOL = "Agent"
SUBAGENT_TRANSCRIPT = "subagent.jsonl"  # the CLI's own transcript of an in-process agent, copied at its end
SUBAGENT_SCHEMA_RETRIES = 2  # answers refused for their schema before the agent fails, as the CLI's StructuredOutput retries
GENERAL_PURPOSE = "general-purpose"


@dataclass
class InProcessChild:
    """One in-process agent, as its host runner knows it."""

    meta: AgentMeta
    agent_dir: Path
    native_id: str
    rules: RuleSet
    started: float
    transcript: Path | None = None
    """The CLI's transcript of it (known from its first hook on)."""
    refused_answers: int = 0
    ended: bool = False
    """Its outcome is committed: no further turn of it is let through."""
    finished: tuple[Status, str, Any, list[str]] | None = None
    """What its SubagentStop decided, committed at the next hook (the CLI writes its last lines after the hook)."""


@dataclass
class InProcessTree:
    """The in-process agents below one runner's agent (its host)."""

    host: AgentMeta
    host_dir: Path
    policy: PlacementPolicy
    secrets: Sequence[str]
    definitions: Mapping[str, AgentDefinition]
    schemas: Mapping[str, tuple[dict[str, Any], str]]
    """Each definition's schema, resolved (NAME, path or inline) by the host's runner."""
    shell_env: Mapping[str, str]
    home: str = field(default_factory=lambda: os.environ.get("HOME") or str(Path.home()))
    pending: collections.deque[tuple[str | None, str, dict[str, Any]]] = field(default_factory=collections.deque)
    """Agent calls let through, not yet matched to a SubagentStart: (caller's native id, tool_use_id, input)."""
    children: dict[str, InProcessChild] = field(default_factory=dict)
    """By the CLI's agent_id."""

    # ------------------------------------------------------------ the hooks --

    async def pre_tool_use(self, hook_input: Mapping[str, Any], tool_use_id: str | None) -> dict[str, Any] | None:
        """A verdict for a call an in-process agent makes; None for the host's own calls."""
        self.flush()
        native_id = str(hook_input.get("agent_id") or "")
        child = self.children.get(native_id)
        if child is None:
            return None
        tool = str(hook_input.get("tool_name", ""))
        tool_input = hook_input.get("tool_input") or {}
        stop = self.stop_reason(child)
        if stop is not None:
            status, reason = stop
            self.record_decision(child, tool, tool_input, rule=reason, verdict="deny", by="limits", tool_use_id=tool_use_id)
            self.end(child, status, reason)
            return end_turn(f"stopped by spawn.py: {reason}")
        verdict, rule, by = await self.permission(child, tool, tool_input)
        self.record_decision(child, tool, tool_input, rule=rule, verdict=verdict, by=by, tool_use_id=tool_use_id)
        if verdict != "allow":
            return deny_call(f"denied by spawn.py ({by}): {rule}")
        if canonical_tool(tool) == AGENT_TOOL:
            refused = self.agent_call_problem(child.meta, tool_input)
            if refused is not None:
                self.record_decision(child, tool, tool_input, rule=refused, verdict="deny", by="placement", tool_use_id=tool_use_id)
                return deny_call(f"denied by spawn.py (placement): {refused}")
            self.pending.append((native_id, str(tool_use_id or ""), dict(tool_input)))
        return {}

    def host_agent_call(self, tool_input: Mapping[str, Any], tool_use_id: str | None) -> str | None:
        """The host's own Agent call, which its rules allowed: why it can't start a child, or None."""
        self.flush()
        refused = self.agent_call_problem(self.host, tool_input)
        if refused is None:
            self.pending.append((None, str(tool_use_id or ""), dict(tool_input)))
        return refused

    async def subagent_start(self, hook_input: Mapping[str, Any]) -> dict[str, Any]:
        self.flush()
        native_id = str(hook_input.get("agent_id") or "")
        if not native_id or native_id in self.children:
            return {}
        caller, _, tool_input = self.pending.popleft() if self.pending else (None, "", {})
        parent = self.children[caller].meta if caller in self.children else self.host
        agent_type = str(hook_input.get("agent_type") or tool_input.get("subagent_type") or GENERAL_PURPOSE)
        child = self.register(parent, native_id, agent_type, tool_input)
        self.children[native_id] = child
        self.locate_transcripts(str(hook_input.get("transcript_path") or ""))
        return {}

    async def subagent_stop(self, hook_input: Mapping[str, Any]) -> dict[str, Any]:
        self.flush()
        child = self.children.get(str(hook_input.get("agent_id") or ""))
        if child is None or child.ended:
            return {}
        child.transcript = Path(str(hook_input.get("agent_transcript_path") or "")) or child.transcript
        text = str(hook_input.get("last_assistant_message") or "")
        stop = self.stop_reason(child)
        if stop is not None:
            child.finished = (stop[0], stop[1], text, [])
            return {}
        if child.meta.schema is None:
            child.finished = (Status.DONE, "completed", text, [])
            return {}
        output, errors = checked_answer(child.meta.schema, text)
        if errors and child.refused_answers < SUBAGENT_SCHEMA_RETRIES:
            child.refused_answers += 1
            reason = "Your answer must be one JSON value matching the schema; it does not: " + "; ".join(errors[:10])
            return {"decision": "block", "reason": reason}
        if errors:
            why = f"structured output does not match the schema ({len(errors)} error(s)) after {child.refused_answers} retries"
            child.finished = (Status.FAILED, why, output if output is not None else text, errors)
        else:
            child.finished = (Status.DONE, "completed", output, [])
        return {}

    # ------------------------------------------------------------ the limits --

    def stop_reason(self, child: InProcessChild) -> tuple[Status, str] | None:
        """Why child may take no further turn: a kill, an ancestor's end, its deadline or budget."""
        if read_outcome(child.agent_dir) is not None:
            return Status.KILLED, kill_request_reason(child.agent_dir) or "its outcome was committed by another (spawn.py kill)"
        ancestor = self.ended_ancestor(child)
        if ancestor is not None:
            return Status.KILLED, f"ended with its ancestor {ancestor}"
        if child.meta.deadline is not None and time.time() >= child.meta.deadline:
            return Status.TIMEOUT, "deadline reached (at a tool-call boundary)"
        spent = self.spend(child) if child.meta.max_budget_usd is not None else 0.0
        if child.meta.max_budget_usd is not None and spent >= child.meta.max_budget_usd:
            return Status.FAILED, f"budget: its own turns (${spent:.4f}, estimated) reached its ${child.meta.max_budget_usd:.4f}"
        return None  # the tree's budget is its host's hold, which the host's runner keeps

    def ended_ancestor(self, child: InProcessChild) -> str | None:
        by_id = {c.meta.id: c for c in self.children.values()}
        cursor = by_id.get(child.meta.parent_id or "")
        while cursor is not None:
            if cursor.ended or read_outcome(cursor.agent_dir) is not None:
                return cursor.meta.id
            cursor = by_id.get(cursor.meta.parent_id or "")
        return None

    async def permission(self, child: InProcessChild, tool: str, tool_input: Mapping[str, Any]) -> tuple[str, str, str]:
        """(allow|deny, rule, who decided) under child's own tools and rules."""
        meta = child.meta
        verdict, rule = decide(tool, tool_input, child.rules, meta.tools, cwd=meta.cwd, home=self.home, environ=self.shell_env)
        if verdict == "ask":
            verdict, by = await self.ask(child, tool, tool_input, rule or "")
            return verdict, rule or "", by
        return verdict, rule or "", "rules"

    async def ask(self, child: InProcessChild, tool: str, tool_input: Mapping[str, Any], rule: str) -> tuple[str, str]:
        """(allow|deny, who answered) for a call an ask rule matched: delegated up the tree as the
        child's own ask (`spawn.py approve|deny ID`), as a process child's is; no answer is a no."""
        import asyncio

        timeout = ask_timeout(os.environ)
        if child.meta.deadline is not None:
            timeout = min(timeout, max(0.0, child.meta.deadline - time.time()))
        channel = open_ask(child.meta, tool, tool_input, rule, timeout=timeout, secrets_=self.secrets)
        what = f"{tool} ({summarize_input(tool_input, 80)}; rule {rule})"
        ask = channel.ask_id
        note(f"agent {child.meta.id} asks to use {what}: run 'spawn.py approve {ask}' or 'spawn.py deny {ask}' within {timeout:.0f} s")
        try:
            answer = await asyncio.to_thread(channel.wait, child.meta.id, timeout, self.secrets)
        finally:
            channel.close()  # a stop while waiting denies the ask, by timeout
        return ("allow" if answer.get("verdict") == "approve" else "deny"), str(answer.get("by", "?"))

    def agent_call_problem(self, caller: AgentMeta, tool_input: Mapping[str, Any]) -> str | None:
        """Why caller's Agent call can't start an in-process child, or None."""
        if caller.depth + 1 > caller.max_depth:
            return f"max depth {caller.max_depth} reached: agent {caller.id} is at depth {caller.depth}"
        definition = self.definitions.get(str(tool_input.get("subagent_type") or ""))
        needs = definition_needs(definition) if definition is not None else []
        try:
            decide_placement(self.policy, needs, by_agent_tool=True, is_root=False)
        except PlacementError as exc:
            return exc.message
        return None

    def spend(self, child: InProcessChild) -> float:
        return estimate_cost(cli_transcript_turns(child.transcript, child.meta.model)) if child.transcript else 0.0

    # ------------------------------------------------------------ records --

    def register(self, parent: AgentMeta, native_id: str, agent_type: str, tool_input: Mapping[str, Any]) -> InProcessChild:
        """Make a started subagent an agent of the session: its directory and meta.json."""
        definition = self.definitions.get(agent_type)
        meta = child_meta(parent, self.host, definition, tool_input, now=time.time(), schema_of=self.schemas.get(agent_type))
        decision = decide_placement(self.policy, [], by_agent_tool=True, is_root=False)
        meta.placement = PlacementDecision(
            decision.backend, f"{decision.reason} (Claude Code agent {native_id}, {agent_type})", decision.policy
        ).as_record()
        session = Path(meta.session)
        # No admission to the tree's budget and no hold of its own: what it
        # spends is spent by its host's CLI, inside the host's hold (and that
        # CLI's own cap). Its own budget, if its definition sets one, is kept
        # at its tool calls (stop_reason). The session's agent cap counts it.
        with session_lock(session):
            cap = read_limits(session).max_agents
            refusal = (
                f"agents: the session already has {cap} agents (--max-agents {cap})"
                if cap is not None and counted_agents(session) >= cap
                else None
            )
            meta.id, agent_dir = create_agent_dir(session, meta.depth)
        publish_once(agent_dir / META, redacted_json(record_to_json(meta), self.secrets, indent=2).encode())  # a fresh directory: first
        rules = RuleSet(*([parse_rule(t) for t in meta.permissions.get(kind, [])] for kind in ("allow", "deny", "ask")))
        child = InProcessChild(meta=meta, agent_dir=agent_dir, native_id=native_id, rules=rules, started=time.time())
        if refusal is not None:
            self.end(child, Status.REFUSED, f"refused: {refusal}")
        return child

    def locate_transcripts(self, session_transcript: str) -> None:
        """The CLI keeps a subagent's transcript beside its session's: SESSION/subagents/agent-ID.jsonl."""
        if not session_transcript:
            return
        folder = Path(session_transcript).with_suffix("") / "subagents"
        for child in self.children.values():
            if child.transcript is None:
                child.transcript = folder / f"agent-{child.native_id}.jsonl"

    def record_decision(
        self,
        child: InProcessChild,
        tool: str,
        tool_input: Mapping[str, Any],
        *,
        rule: str | None,
        verdict: str,
        by: str,
        tool_use_id: str | None,
    ) -> None:
        record = {
            "tool": tool,
            "input": summarize_input(tool_input),
            "rule": rule,
            "verdict": verdict,
            "by": by,
            "tool_use_id": tool_use_id,
        }
        append_transcript(
            child.agent_dir / TRANSCRIPT, {"time": utc_now_iso(), "type": "PermissionDecision", "message": record}, self.secrets
        )

    def end(self, child: InProcessChild, status: Status, reason: str, output: Any = None, errors: Sequence[str] = ()) -> None:
        """Commit child's one outcome (another writer's, such as a kill's, stands)."""
        if child.ended:
            return
        child.ended = True
        usage = cli_transcript_usage(child.transcript) if child.transcript else {}
        turns = cli_transcript_turns(child.transcript, child.meta.model) if child.transcript else []
        copied = copy_cli_transcript(child)
        outcome = Outcome(
            id=child.meta.id,
            status=status,
            reason=reason[:2000],
            exit_code=EXIT_FOR_STATUS[status],
            ended_at=utc_now_iso(),
            duration_s=round(time.time() - child.started, 3),
            output=output if status == Status.DONE or errors else None,
            text=cli_last_text(child.transcript) if child.transcript else None,
            validation_errors=list(errors),
            cost_usd=estimate_cost(turns) if turns else None,
            cost_estimated=True if turns else None,
            usage=usage or None,
            turns=len(turns) or None,
            transcript=str(copied or child.agent_dir / TRANSCRIPT),
        )
        commit_outcome(child.agent_dir, outcome, self.secrets)

    def host_share(self, outcome: Outcome) -> None:
        """The host's outcome keeps its own cost only: the CLI's total counts its subagents' turns,
        which their own outcomes (and ledger charges) already hold, so a tree's sum counts each once."""
        spent = sum(c for child in self.children.values() if (c := committed_cost(child.agent_dir)) is not None)
        if outcome.cost_usd is not None and spent:
            outcome.cost_usd = round(max(0.0, outcome.cost_usd - spent), 6)

    def flush(self) -> None:
        """Commit the outcomes SubagentStop decided, now that the CLI has written their transcripts."""
        for child in self.children.values():
            if child.finished is not None and not child.ended:
                status, reason, output, errors = child.finished
                self.end(child, status, reason, output, errors)

    def settle(self, host_status: Status | None, host_reason: str) -> None:
        """At the host's end: every in-process agent has its one outcome, deepest first."""
        self.flush()
        for child in sorted(self.children.values(), key=lambda c: -c.meta.depth):
            if child.ended:
                continue
            if host_status is not None and host_status != Status.DONE:
                self.end(child, Status.KILLED, f"ended with its ancestor {self.host.id} ({host_reason})")
            else:
                self.end(child, Status.FAILED, f"its host {self.host.id}'s CLI ended before it finished")
        for child in self.children.values():
            copy_cli_transcript(child)  # again, whole: one stopped at a boundary was copied before the CLI's last lines


# ------------------------------------------------------------- the wiring --


def withheld_agent_tool(meta: AgentMeta, tool: str) -> bool:
    """The Agent tool at the depth limit, where in-process children would start (see subagent_depth_limit)."""
    policy = (meta.placement or {}).get("policy")
    return tool == AGENT_TOOL and policy in IN_PROCESS_POLICIES and subagent_depth_limit(meta.depth, meta.max_depth) == 0


Hook = Callable[[Any, "str | None", Any], Awaitable[Any]]


def in_process_hooks(sdk: Any, tree: InProcessTree, gate: Hook, timeout: float) -> dict[str, Any]:
    """The SDK hooks of a host: its in-process agents' calls go to the tree, its own to its gate."""

    async def pre_tool_use(hook_input: Any, tool_use_id: str | None, context: Any) -> Any:
        verdict = await tree.pre_tool_use(hook_input, tool_use_id)
        if verdict is not None:
            return verdict
        verdict = await gate(hook_input, tool_use_id, context)
        if not verdict and hook_input.get("tool_name") == AGENT_TOOL:
            refused = tree.host_agent_call(hook_input.get("tool_input") or {}, tool_use_id)
            if refused is not None:
                return deny_call(f"denied by spawn.py (placement): {refused}")
        return verdict

    async def start(hook_input: Any, _tool_use_id: str | None, _context: Any) -> Any:
        return await tree.subagent_start(hook_input)

    async def stop(hook_input: Any, _tool_use_id: str | None, _context: Any) -> Any:
        return await tree.subagent_stop(hook_input)

    return {
        "PreToolUse": [sdk.HookMatcher(matcher=None, hooks=[pre_tool_use], timeout=timeout)],
        "SubagentStart": [sdk.HookMatcher(matcher=None, hooks=[start])],
        "SubagentStop": [sdk.HookMatcher(matcher=None, hooks=[stop])],
    }


def in_process_tree(
    meta: AgentMeta, agent_dir: Path, secrets_: Sequence[str], load_schema: Callable[[str], tuple[dict[str, Any], str]]
) -> InProcessTree | None:
    """The governor of an agent's in-process children, under --placement inprocess or auto; None otherwise.

    load_schema resolves a definition's schema as --schema does (it lives above this layer).
    """
    policy = (meta.placement or {}).get("policy")
    if policy not in IN_PROCESS_POLICIES:
        return None
    definitions = file_definitions(Path(meta.cwd), os.environ)
    schemas = {name: load_schema(d.schema) for name, d in definitions.items() if d.schema}
    shell_env = {**os.environ, **child_environment(meta, agent_dir)}  # what the host's Bash, and its subagents', inherit
    return InProcessTree(meta, agent_dir, parse_policy(str(policy)), secrets_, definitions, schemas, shell_env)


def file_definitions(cwd: Path, environ: Mapping[str, str]) -> dict[str, AgentDefinition]:
    """The project's and the user's agent definitions: the subagent types spawn.py governs.

    Not the built-in ones: those would shadow the CLI's own types of the same
    names (explore, plan), and parsing them is most of the cost, paid before
    the CLI's first request, by a host that may have no definitions at all.
    """
    if not agent_dirs_for(cwd, environ):
        return {}
    definitions, _ = load_definitions(cwd, environ)
    return {name: d for name, d in definitions.items() if d.source != BUILTIN_SOURCE}


def subagent_definitions(sdk: Any, tree: InProcessTree) -> dict[str, Any]:
    """spawn.py's agent definitions, offered to the CLI as subagent types (it reads no settings files here).

    Each within the host's tools; its limits, rules and schema are spawn.py's to keep (InProcessTree).
    """
    offered = {}
    for name, d in tree.definitions.items():
        if d.kind != "claude":
            continue
        tools = [t for t in tree.host.tools if d.tools is None or t in d.tools]
        offered[name] = sdk.AgentDefinition(description=d.description or name, prompt=d.prompt or f"You are the {name} agent.", tools=tools)
    return offered


# ---------------------------------------------------------------- pure parts --


def committed_cost(agent_dir: Path) -> float | None:
    with contextlib.suppress(OSError, SpawnError):
        cost = (read_outcome(agent_dir) or {}).get("cost_usd")
        return float(cost) if isinstance(cost, int | float) else None
    return None


def deny_call(reason: str) -> dict[str, Any]:
    return {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny", "permissionDecisionReason": reason}}


def end_turn(reason: str) -> dict[str, Any]:
    """Deny the call and end the subagent's turn there (no SubagentStop follows)."""
    return {"continue": False, "stopReason": reason, **deny_call(reason)}


def definition_needs(definition: AgentDefinition) -> list[str]:
    """What a definition asks for that only a process gives, under --placement auto."""
    return process_needs(
        own_cwd=definition.isolation == "worktree",
        deadline=definition.timeout is not None,
        budget=definition.max_budget_usd is not None,
        kind=definition.kind,
    )


def narrowed_tools(parent: Sequence[str], requested: Sequence[str] | None, depth: int, max_depth: int) -> list[str]:
    """A child's tools: its definition's within its parent's, and no Agent tool at the depth limit (pure)."""
    tools = [t for t in parent if requested is None or t in requested]
    return [t for t in tools if t != AGENT_TOOL or depth < max_depth]


def child_meta(
    parent: AgentMeta,
    host: AgentMeta,
    definition: AgentDefinition | None,
    tool_input: Mapping[str, Any],
    *,
    now: float,
    schema_of: tuple[dict[str, Any], str] | None = None,
) -> AgentMeta:
    """The meta.json of an in-process child of parent, run by host's runner (pure but for the clock)."""
    depth = parent.depth + 1
    max_depth = (
        parent.max_depth if definition is None or definition.max_depth is None else min(parent.max_depth, depth + definition.max_depth)
    )
    trace = new_trace(parent.traceparent)
    permissions = {kind: list(parent.permissions.get(kind, [])) for kind in ("allow", "deny", "ask")}
    deadline, budget, schema, schema_source = parent.deadline, None, None, None
    if definition is not None:
        permissions["deny"] += [r.text for r in definition.permissions.deny if r.text not in permissions["deny"]]
        permissions["ask"] += [r.text for r in definition.permissions.ask if r.text not in permissions["ask"]]
        if definition.permissions.allow:
            permissions["allow"] = [r.text for r in definition.permissions.allow]
        if definition.timeout is not None:
            deadline = min(d for d in (parent.deadline, now + definition.timeout) if d is not None)
        budget = definition.max_budget_usd
        if schema_of is not None:
            schema, schema_source = schema_of
    return AgentMeta(
        id="",
        parent_id=parent.id,
        depth=depth,
        max_depth=max_depth,
        pid=host.pid,
        create_time=host.create_time,
        pgid=host.pgid,
        pid_namespace=host.pid_namespace,
        trace_id=trace.trace_id,
        span_id=trace.span_id,
        parent_span_id=trace.parent_span_id,
        traceparent=trace.traceparent,
        task=str(tool_input.get("prompt") or tool_input.get("description") or ""),
        tools=narrowed_tools(parent.tools, definition.tools if definition else None, depth, max_depth),
        disallowed_tools=list(parent.disallowed_tools),
        model=(definition.model if definition and definition.model else parent.model),
        cwd=parent.cwd,
        started_at=utc_now_iso(),
        session=parent.session,
        system_prompt=definition.prompt if definition else "",
        schema=schema,
        schema_source=schema_source,
        deadline=deadline,
        max_budget_usd=budget,
        topic=str(tool_input.get("description") or "") or None,
        agent=definition.name if definition else None,
        agent_source=definition.path if definition else None,
        permissions=permissions,
        permission_mode=parent.permission_mode,
        sandbox="inherited" if parent.sandbox != "off" else "off",
        containment=host.containment,
        kind="claude",
    )


def checked_answer(schema: Mapping[str, Any], text: str) -> tuple[Any, list[str]]:
    """(the answer as JSON, its schema errors): a subagent answers in text, so its JSON is its last message (pure)."""
    body = text.strip()
    if body.startswith("```"):
        body = body.strip("`").removeprefix("json").strip()
    try:
        output = parse_json(body)
    except (SpawnError, ValueError):
        return None, ["(root): the answer is not JSON"]
    return output, validate_output(schema, output)


def cli_transcript_messages(path: Path) -> list[dict[str, Any]]:
    """The assistant messages of a CLI transcript, one per message id (the CLI writes a line per block)."""
    seen: dict[str, dict[str, Any]] = {}
    with contextlib.suppress(OSError):
        for raw in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError, AttributeError, TypeError, SpawnError):
                line = json.loads(raw)
                message = line.get("message") or {}
                if line.get("type") == "assistant" and isinstance(message, dict):
                    key = str(message.get("id") or len(seen))
                    merged = seen.setdefault(key, {**message, "content": []})
                    merged["content"] = [*merged["content"], *(message.get("content") or [])]
                    merged["usage"] = message.get("usage") or merged.get("usage")
    return list(seen.values())


def cli_transcript_turns(path: Path | None, model: str) -> list[tuple[str, dict[str, Any]]]:
    if path is None:
        return []
    return [(str(m.get("model") or model), m["usage"]) for m in cli_transcript_messages(path) if isinstance(m.get("usage"), dict)]


def cli_transcript_usage(path: Path) -> dict[str, int]:
    totals: dict[str, int] = {}
    for _, usage in cli_transcript_turns(path, ""):
        for key in ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
            if isinstance(usage.get(key), int):
                totals[key] = totals.get(key, 0) + usage[key]
    return totals


def cli_last_text(path: Path) -> str | None:
    for message in reversed(cli_transcript_messages(path)):
        texts = [b.get("text", "") for b in message.get("content") or [] if isinstance(b, dict) and b.get("type") == "text"]
        if any(t.strip() for t in texts):
            return "\n".join(texts)
    return None


def copy_cli_transcript(child: InProcessChild) -> Path | None:
    """The CLI's transcript of child, copied beside its records: the CLI's config dir may go."""
    if child.transcript is None or not child.transcript.is_file():
        return None
    target = child.agent_dir / SUBAGENT_TRANSCRIPT
    with contextlib.suppress(OSError):
        shutil.copyfile(child.transcript, target)
        return target
    return None
# ==================== end src/spawnlib/inprocess.py ====================

# ==================== begin src/spawnlib/claude.py ====================
"""The claude executor's engine: the bundled claude CLI started for an agent, its permission
gate, the SDK conversation with it, and the outcome that conversation makes.

Below the executors (ClaudeExecutor runs through it) and the runner (run_agent),
above the running state it fills in.
"""



























































































# spawn.py starts the agent's CLI itself, and hands the SDK its pipes as a
# transport (CliPipes). The SDK's own transport would start it only once the
# SDK and asyncio are imported, about 100 ms of CPU at every agent that isn't
# forked (a root above all), and the CLI's own start-up (~0.4 s) can't begin
# before. So the command line and environment are built here exactly as the
# SDK's SubprocessCLITransport builds them, for the options spawn.py sets
# (test_cli_start checks both against the SDK's), and the CLI starts before
# the SDK is imported when it can (run_agent), else as the run begins.
SDK_CLIENT_APP_ENV = "CLAUDE_AGENT_SDK_CLIENT_APP"  # the caller names its app (the SDK's EXPLICIT_CLIENT_APP_ENV)


SDK_DERIVED_CLIENT_APP_ENV = "CLAUDE_AGENT_SDK_DERIVED_CLIENT_APP"


SDK_READS_SESSION_STATE_ENV = "CLAUDE_CODE_SDK_READS_SESSION_STATE"


SDK_MAX_MESSAGE = 1 << 20  # the SDK's limit on one message from the CLI (_DEFAULT_MAX_BUFFER_SIZE)


CLI_CLOSE_WAIT_S = 5.0  # as the SDK's close(): after stdin's end, then after SIGTERM


def cli_argv(cli: str, options: Mapping[str, Any]) -> list[str]:
    """The CLI's command line for these ClaudeAgentOptions fields, as the SDK's transport builds it (pure)."""
    argv = [cli, "--output-format", "stream-json", "--verbose"]
    prompt = options.get("system_prompt")
    if prompt is None:
        argv += ["--system-prompt", ""]
    elif isinstance(prompt, str):
        argv += ["--system-prompt", prompt]
    elif prompt.get("type") == "preset" and "append" in prompt:
        argv += ["--append-system-prompt", prompt["append"]]
    tools = options.get("tools")
    if tools is not None:
        argv += ["--tools", ",".join(tools)]
    allowed = list(options.get("allowed_tools") or [])
    sources = options.get("setting_sources")
    skills = options.get("skills")
    if skills is not None:
        # Skill names were checked as a definition was read (parse_agent_fields).
        allowed += [rule for rule in (["Skill"] if skills == "all" else [f"Skill({name})" for name in skills]) if rule not in allowed]
        sources = ["user", "project"] if sources is None else sources
    if allowed:
        argv += ["--allowedTools", ",".join(allowed)]
    if options.get("max_turns"):
        argv += ["--max-turns", str(options["max_turns"])]
    if options.get("max_budget_usd") is not None:
        argv += ["--max-budget-usd", str(options["max_budget_usd"])]
    if options.get("disallowed_tools"):
        argv += ["--disallowedTools", ",".join(options["disallowed_tools"])]
    if options.get("model"):
        argv += ["--model", options["model"]]
    if options.get("permission_mode"):
        argv += ["--permission-mode", options["permission_mode"]]
    if options.get("resume"):
        argv.append(f"--resume={options['resume']}")  # one token: a value never reads as a flag
    if options.get("settings"):
        argv += ["--settings", options["settings"]]
    servers = options.get("mcp_servers")
    if servers:
        argv += ["--mcp-config", json.dumps({"mcpServers": dict(servers)})]
    if options.get("strict_mcp_config"):
        argv.append("--strict-mcp-config")
    if sources is not None:
        argv.append(f"--setting-sources={','.join(sources)}")
    if options.get("effort") is not None:
        argv += ["--effort", options["effort"]]
    output_format = options.get("output_format")
    if isinstance(output_format, dict) and output_format.get("type") == "json_schema" and output_format.get("schema") is not None:
        argv += ["--json-schema", json.dumps(output_format["schema"])]
    return [*argv, "--input-format", "stream-json"]


def cli_environment(
    environ: Mapping[str, str], env: Mapping[str, str], cwd: str | None, client_app: str | None, version: str
) -> dict[str, str]:
    """The CLI's environment, as the SDK's transport makes it (pure)."""
    out = {k: v for k, v in environ.items() if k != "CLAUDECODE"}  # the CLI must not think it runs inside Claude Code
    out["CLAUDE_CODE_ENTRYPOINT"] = "sdk-py"
    out.update(env)
    out["CLAUDE_AGENT_SDK_VERSION"] = version
    out.pop(SDK_DERIVED_CLIENT_APP_ENV, None)
    if client_app is not None:
        out[SDK_CLIENT_APP_ENV] = client_app
    # The query waits for the CLI's "idle" before it closes stdin; the CLI sends it only if asked.
    if not any(k.upper() == SDK_READS_SESSION_STATE_ENV for k in out):
        out[SDK_READS_SESSION_STATE_ENV] = "1"
    if cwd:
        out["PWD"] = cwd
    return out


@functools.cache
def sdk_version() -> str:
    """claude-agent-sdk's version, read from its _version.py without importing the package (about 1 s)."""
    import importlib.util

    spec = importlib.util.find_spec("claude_agent_sdk")
    with contextlib.suppress(OSError, TypeError):
        text = (Path(str(spec.origin)).parent / "_version.py").read_text() if spec else ""
        if m := re.search(r"""^__version__\s*=\s*["']([^"']+)["']""", text, re.M):
            return m.group(1)
    return str(import_sdk(os.environ).__version__)


class StartedCli:
    """An agent's CLI, started by spawn.py (start_cli), and the start slot it holds until its first message."""

    def __init__(self, plan: CliStart, process: subprocess.Popen[bytes], slot: int | None) -> None:
        self.plan = plan
        self.process = process
        self.slot = slot
        self.returncode: int | None = None
        self.waiter: Any = None  # the task that reaps it

    def free_slot(self) -> None:
        if self.slot is not None:
            os.close(self.slot)
            self.slot = None

    async def wait(self) -> int:
        """Its exit status, as asyncio gives it (-N: signal N); one waiter however many ask."""
        import asyncio

        if self.waiter is None:
            self.waiter = asyncio.ensure_future(self._wait())
        return await asyncio.shield(self.waiter)

    async def _wait(self) -> int:
        import asyncio

        pid = self.process.pid
        pidfd = None
        with contextlib.suppress(AttributeError, OSError):
            pidfd = os.pidfd_open(pid)
        if pidfd is not None:
            # Readable when it exits: no thread, no poll.
            try:
                while child_running(pid):
                    await readable(pidfd, 1.0)
            finally:
                os.close(pidfd)
        else:
            pause = 0.005
            while child_running(pid):
                await asyncio.sleep(pause)
                pause = min(pause * 2, 0.1)
        try:
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        except ChildProcessError:
            self.returncode = 255  # reaped by someone else: asyncio's answer for it
        self.process.returncode = self.returncode  # so Popen doesn't reap or warn again
        return self.returncode


def start_cli(plan: CliStart, state: RunState, slot: int | None) -> StartedCli:
    """Start the agent's CLI, in a session and process group of its own.

    Ending an agent must reach everything its CLI started (Bash commands,
    their children) without signalling spawn.py itself. On failure the slot
    is let go and the SDK's error is raised.
    """
    try:
        process = subprocess.Popen(
            plan.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=plan.options["cwd"],
            env=plan.env,
            start_new_session=True,
        )
    except BaseException:
        if slot is not None:
            os.close(slot)
        raise
    state.started_cli(process.pid)
    return StartedCli(plan, process, slot)


class CliPipes:
    """The SDK's transport to a CLI that spawn.py started: its stdin, stdout and stderr pipes.

    It behaves as the SDK's SubprocessCLITransport once that has started the
    CLI: the same messages, the same errors (the SDK's own classes) and the
    same end: stdin closed, then SIGTERM after 5 s, SIGKILL after 5 more.
    """

    def __init__(self, sdk: Any, cli: StartedCli, on_stderr: Callable[[str], None]) -> None:
        self.sdk = sdk
        self.cli = cli
        self.on_stderr = on_stderr
        self.ready = False
        self.stdout: Any = None
        self.stdin: Any = None
        self.relay: Any = None  # the task that copies stderr to on_stderr
        self.pipes: list[Any] = []

    async def connect(self) -> None:
        import asyncio

        loop = asyncio.get_running_loop()
        process = self.cli.process
        self.stdout = asyncio.StreamReader(limit=SDK_MAX_MESSAGE + 1)
        out, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(self.stdout), process.stdout)
        stderr = asyncio.StreamReader()
        err, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stderr), process.stderr)
        # A StreamReaderProtocol gives the writer its flow control (drain), as asyncio's subprocesses have.
        pipe, protocol = await loop.connect_write_pipe(lambda: asyncio.StreamReaderProtocol(asyncio.StreamReader()), process.stdin)
        self.stdin = asyncio.StreamWriter(pipe, protocol, None, loop)
        self.pipes = [out, err]
        self.relay = asyncio.ensure_future(self._relay_stderr(stderr))
        self.ready = True

    async def _relay_stderr(self, stderr: Any) -> None:
        while line := await stderr.readline():
            text = line.decode(errors="replace").rstrip()
            if text:
                with contextlib.suppress(Exception):
                    self.on_stderr(text)

    def is_ready(self) -> bool:
        return self.ready

    async def write(self, data: str) -> None:
        if not self.ready or self.stdin is None:
            raise self.sdk.CLIConnectionError("ProcessTransport is not ready for writing")
        if self.cli.returncode is not None:
            raise self.sdk.CLIConnectionError(f"Cannot write to terminated process (exit code: {self.cli.returncode})")
        try:
            self.stdin.write(data.encode())
            await self.stdin.drain()
        except Exception as exc:
            self.ready = False
            raise self.sdk.CLIConnectionError(f"Failed to write to process stdin: {exc}") from exc

    async def end_input(self) -> None:
        if self.stdin is not None:
            with contextlib.suppress(Exception):
                self.stdin.close()
            self.stdin = None

    def read_messages(self) -> AsyncIterator[dict[str, Any]]:
        return self._read_messages()

    async def _read_messages(self) -> AsyncIterator[dict[str, Any]]:
        pending = b""
        while chunk := await self.stdout.read(1 << 16):
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                if (message := self._message(line)) is not None:
                    yield message
            if len(pending) > SDK_MAX_MESSAGE:
                raise self.sdk.CLIJSONDecodeError(
                    pending[:100].decode(errors="replace"), ValueError(f"message over {SDK_MAX_MESSAGE} bytes")
                )
        # The CLI ends every message with a newline: a tail without one was cut off.
        tail = None
        with contextlib.suppress(Exception):
            tail = self._message(pending)
        if tail is not None:
            yield tail
        code = await self.cli.wait()
        if code != 0:
            await self._drain_stderr()  # what it said last is the reason's second half (describe_sdk_error)
            raise self.sdk.ProcessError(f"Command failed with exit code {code}", exit_code=code, stderr="Check stderr output for details")

    def _message(self, line: bytes) -> dict[str, Any] | None:
        text = line.decode(errors="replace").strip()
        if not text.startswith("{"):
            return None  # a blank line, or a CLI's debug line on stdout
        try:
            message = json.loads(text)
        except ValueError as exc:
            raise self.sdk.CLIJSONDecodeError(text[:100], exc) from exc
        return message if isinstance(message, dict) else None

    async def _drain_stderr(self, timeout: float = 1.0) -> None:
        """Let the relay reach stderr's end (the CLI's last words), unless something the CLI started holds it open."""
        import asyncio

        if self.relay is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait([self.relay], timeout=timeout)

    async def close(self) -> None:
        import asyncio

        self.ready = False
        await self.end_input()
        try:
            for sig in (None, signal.SIGTERM, signal.SIGKILL):
                if sig is not None and self.cli.returncode is None:
                    # By pid, not Popen's send_signal: that would reap it, and the status would be lost to wait().
                    Supervised.signal_pid(self.cli.process.pid, sig)
                try:
                    await asyncio.wait_for(asyncio.shield(self.cli.wait()), CLI_CLOSE_WAIT_S)
                    break
                except TimeoutError:
                    continue
            await self._drain_stderr(0.2)
        finally:
            if self.relay is not None:
                self.relay.cancel()
            for pipe in self.pipes:
                pipe.close()


def delegates_for(meta: AgentMeta, environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """The definitions an agent that may spawn can delegate to: (name, description)."""
    if meta.depth >= meta.max_depth or "Bash" not in meta.tools or any(r.startswith("Bash(") for r in meta.permissions.get("allow", [])):
        return []
    return delegates_in(Path(meta.cwd), environ)  # without YAML where it can (delegates)


class PermissionGate:
    """spawn.py's own enforcement of permission rules, and their audit trail.

    A PreToolUse hook sees every tool call, including those the CLI would
    approve by itself. Deny and ask rules are decided here; allowed calls are
    left to the CLI (so its permission mode still applies). Every decision is
    appended to the transcript.
    """

    def __init__(self, meta: AgentMeta, agent_dir: Path, secrets_: Sequence[str], denied_asks: list[str] | None = None) -> None:
        self.meta = meta
        self.agent_dir = agent_dir
        self.secrets = secrets_
        self.denied_asks = denied_asks if denied_asks is not None else []
        """Appended to on every ask answered no (the run's RunState.denied_asks)."""
        self.rules = RuleSet(*([parse_rule(t) for t in meta.permissions.get(kind, [])] for kind in PERMISSION_KINDS))
        self.home = os.environ.get("HOME") or str(Path.home())
        # Both spellings of each: tool_paths gives a path as written and as resolved.
        folders = (meta.session, str(cache_dir(os.environ)))
        self.kept = list(dict.fromkeys([*folders, *map(os.path.realpath, folders)]))
        own = (str(agent_dir / SCRATCH_DIR), str(agent_dir / "worktree"))
        self.own = list(dict.fromkeys([*own, *map(os.path.realpath, own)]))
        # What the agent's Bash inherits: the CLI gets os.environ plus this.
        self.shell_env = {**os.environ, **child_environment(meta, agent_dir)}

    async def pre_tool_use(self, hook_input: Any, tool_use_id: str | None, context: Any) -> Any:
        tool = str(hook_input.get("tool_name", ""))
        tool_input = hook_input.get("tool_input") or {}
        kept = kept_by_spawn_py(tool, tool_input, self.meta.cwd, self.kept, self.own)
        rule: str | None
        if kept is not None:
            verdict, rule = "deny", f"only spawn.py writes {kept}"
        else:
            verdict, rule = decide(tool, tool_input, self.rules, self.meta.tools, cwd=self.meta.cwd, home=self.home, environ=self.shell_env)
        decided_by = "rules"
        if verdict == "ask":
            verdict, decided_by = await self.escalate(tool, tool_input, rule or "")
        record = {
            "tool": tool,
            "input": summarize_input(tool_input),
            "rule": rule,
            "verdict": verdict,
            "by": decided_by,
            "tool_use_id": tool_use_id,
        }
        decision = {"time": utc_now_iso(), "type": "PermissionDecision", "message": record}
        append_transcript(self.agent_dir / TRANSCRIPT, decision, self.secrets)
        if verdict == "allow":
            return {}
        reason = f"denied by spawn.py ({decided_by}): {rule}"
        return {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny", "permissionDecisionReason": reason}}

    async def escalate(self, tool: str, tool_input: Mapping[str, Any], rule: str) -> tuple[str, str]:
        """(allow|deny, who decided) for a call an ask rule matched."""
        import asyncio

        timeout = ask_timeout(os.environ)
        if self.meta.deadline is not None:
            timeout = min(timeout, max(0.0, self.meta.deadline - time.time()))
        if self.meta.depth == 0 and sys.stdin is not None and sys.stdin.isatty():
            verdict, by = await asyncio.to_thread(prompt_person, self.meta, tool, tool_input, rule, timeout)
            if verdict == "deny":
                self.denied_asks.append(f"ask at the terminal (rule {rule}) denied by {by}")
            return verdict, by
        channel = open_ask(self.meta, tool, tool_input, rule, timeout=timeout, secrets_=self.secrets)
        ask = channel.ask_id
        what = f"{tool} ({summarize_input(tool_input, 80)}; rule {rule})"
        note(f"agent {self.meta.id} asks to use {what}: run 'spawn.py approve {ask}' or 'spawn.py deny {ask}' within {timeout:.0f} s")
        try:
            answer = await asyncio.to_thread(channel.wait, self.meta.id, timeout, self.secrets)
        finally:
            channel.close()  # a stop while waiting denies the ask, by timeout
        verdict, by = ("allow" if answer.get("verdict") == "approve" else "deny"), str(answer.get("by", "?"))
        if verdict == "deny":
            self.denied_asks.append(f"ask {ask} (rule {rule}) denied by {by}")
        return verdict, by


def native_subagent_hooks(sdk: Any, agent_dir: Path, secrets_: Sequence[str]) -> dict[str, list[Any]]:
    """Record Claude Code's own subagents (the Agent tool) in NATIVE_LOG: one line at start, one at stop."""

    async def record(hook_input: Any, _tool_use_id: str | None, _context: Any) -> Any:
        event = str(hook_input.get("hook_event_name", ""))
        line: dict[str, Any] = {
            "time": utc_now_iso(),
            "event": "start" if event == "SubagentStart" else "stop",
            "agent_id": str(hook_input.get("agent_id", "")),
            "agent_type": str(hook_input.get("agent_type", "")),
        }
        if event == "SubagentStop":
            line["transcript_path"] = str(hook_input.get("agent_transcript_path", ""))
            line["last_message"] = str(hook_input.get("last_assistant_message") or "")[:2000]
        append_jsonl(agent_dir / NATIVE_LOG, line, secrets_)
        return {}

    return {name: [sdk.HookMatcher(matcher=None, hooks=[record])] for name in ("SubagentStart", "SubagentStop")}


def memory_dir(meta: AgentMeta, definition_path: Path, environ: Mapping[str, str]) -> Path:
    """Claude Code's agent memory directories: user, project, or local (not committed)."""
    name = meta.agent or definition_path.stem
    if meta.memory == "user":
        return Path(environ.get("HOME") or Path.home()).expanduser() / ".claude" / "agent-memory" / name
    return project_of(str(definition_path)) / ".claude" / ("agent-memory-local" if meta.memory == "local" else "agent-memory") / name


def memory_section(meta: AgentMeta, definition_path: Path, environ: Mapping[str, str]) -> str:
    """What Claude Code tells an agent with `memory:`: where its memory lives and
    the head of its MEMORY.md, so what it learnt last time is in front of it."""
    folder = memory_dir(meta, definition_path, environ)
    with contextlib.suppress(OSError):
        folder.mkdir(parents=True, exist_ok=True)
    try:
        head = "\n".join((folder / "MEMORY.md").read_text().splitlines()[:MEMORY_HEAD_LINES])
    except (OSError, UnicodeDecodeError):
        head = "(empty)"
    return (
        f"# Agent memory\nYour persistent memory directory is {folder}. Keep notes worth keeping across runs "
        f"in {folder / 'MEMORY.md'} (only its first {MEMORY_HEAD_LINES} lines are shown here).\n"
        f"MEMORY.md now:\n{head}"
    )


def skill_sections(meta: AgentMeta, environ: Mapping[str, str]) -> list[str]:
    """A definition's skills, preloaded whole into the system prompt, as Claude
    Code does for a subagent's `skills:` (no settings files need loading)."""
    project = project_of(meta.agent_source) if meta.agent_source else Path(meta.cwd)
    sections = []
    for name in meta.skills or []:
        path = skill_file(name, project, environ)
        with contextlib.suppress(OSError, UnicodeDecodeError):
            if path is not None:
                sections.append(f"# Skill: {name}\n{path.read_text().strip()}")
    return sections


@dataclass
class CliStart:
    """What an agent's CLI is started with, worked out without the SDK (cli_start)."""

    options: dict[str, Any]
    """ClaudeAgentOptions' fields, but hooks and stderr (they need the SDK)."""
    gate: PermissionGate
    prompt: str
    argv: list[str]
    env: dict[str, str]


def project_claude_dir(cwd: str) -> str:
    """The working directory's .claude/, made if absent: held read-only in a sandbox as one existing folder.

    Claude Code's sandbox protects files there (settings, agents, commands,
    launch.json, ...); for each one that doesn't exist it makes an empty
    placeholder on the host while a Bash runs, and removes it after. Two
    sandboxed agents in one folder then race for the same placeholders
    ("bwrap: Can't bind mount .../.claude/launch.json"). The folder held
    read-only whole needs none. (The CLI makes .claude/ itself, for its own
    .cc-writes, so making it adds nothing to the project.)
    """
    folder = os.path.join(os.path.realpath(cwd), ".claude")
    with contextlib.suppress(OSError):
        os.mkdir(folder)
    return folder


def uv_shim_path(environ: Mapping[str, str]) -> dict[str, str]:
    """An agent's PATH, the `uv` shim first: `uv run spawn.py` in its Bash runs the tree's spawn.py without
    uv's resolution, the same environment again (programs/uv_shim.py says when); {} where it can't be written."""
    shim = uv_shim_folder(environ)
    return {"PATH": os.pathsep.join([str(shim), environ.get("PATH", os.defpath)])} if shim is not None else {}


def cli_start(meta: AgentMeta, agent_dir: Path, cli: Path, state: RunState, secrets_: Sequence[str]) -> CliStart:
    """The CLI's options, command line and environment for this agent."""
    system_prompt: Any
    brief = briefing(meta, spawn_command(), delegates_for(meta, os.environ))
    if meta.preset == "claude_code":
        system_prompt = {"type": "preset", "preset": "claude_code", "append": (meta.system_prompt + "\n\n" + brief).strip()}
    else:
        system_prompt = f"{meta.system_prompt}\n\n{brief}".strip()
    builtin = [t for t in meta.tools if not t.startswith("mcp__") and not withheld_agent_tool(meta, t)]
    mcp_servers: dict[str, Any] = {}
    hooks: dict[str, Any] | None = None
    if meta.agent_source and (meta.mcp_servers or meta.hooks):
        # The servers' config (which may hold tokens) and the hooks' commands
        # are read from the definition, never copied into meta.json.
        definition, _ = parse_definition(Path(meta.agent_source).read_text(), meta.agent_source, "project")
        if definition is not None:
            resolve_mcp_refs(definition, os.environ)
        mcp_servers = definition.mcp_servers if definition and meta.mcp_servers else {}
        if definition and definition.hooks and meta.hooks:
            # Claude Code's hooks format is a settings key: the CLI runs them.
            hooks = definition.hooks
    sandbox = None
    if meta.sandbox == "on":
        with contextlib.suppress(FileExistsError):
            (agent_dir / SCRATCH_DIR).mkdir()  # bwrap binds only what exists
        # The CLI holds its config dir's projects/ read-only in the sandbox,
        # binding /dev/null there while it is absent; the CLI's own first
        # transcript write makes it a directory, and a Bash whose bwrap line
        # was built just before then fails ("Can't create file at
        # .../projects: Is a directory"). Made now, it is a directory throughout.
        with contextlib.suppress(OSError):
            (claude_config_dir(os.environ) / "projects").mkdir(mode=0o700, parents=True, exist_ok=True)
        session = Path(meta.session)
        # Made now if absent, so the sandbox can hold them read-only (sandbox_writes).
        with contextlib.suppress(OSError):
            asks_dir(session).mkdir(exist_ok=True)
            # (An empty status cache is one status ignores, and replaces whole.)
            for name in (LEDGER, STATUS_INDEX, STATUS_CACHE):
                os.close(open_regular(session / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW)[0])
        # Its drop box: made now, since bwrap binds only what exists (sandbox_writes).
        (session / (REFUSED_DIR if meta.depth >= meta.max_depth else REQUESTS_DIR) / meta.id).mkdir(parents=True, exist_ok=True)
        boxes = [f"{f}/{n}" for f in (REFUSED_DIR, REQUESTS_DIR) if (session / f).is_dir() for n in os.listdir(session / f)]
        writable, read_only = sandbox_writes(
            meta.depth < meta.max_depth,
            agent_dir,
            meta.session,
            runner_index_dir(),
            session_entries=os.listdir(session),
            drop_boxes=boxes,
        )
        # The compiled copies every tree runs, never the sandbox's to write, even inside its cwd; its project's .claude/.
        read_only += [os.path.realpath(cache_dir(os.environ)), project_claude_dir(meta.cwd)]
        read_only = [p for p in read_only if os.path.lexists(p)]  # never a placeholder (sandbox_writes)
        domains = [m.group(1) for r in meta.permissions.get("allow", []) if (m := re.fullmatch(r"WebFetch\(domain:(.+)\)", r))]
        sandbox = sandbox_settings(writable, api_host(os.environ), domains, read_only)
    settings = cli_settings(hooks=hooks, sandbox=sandbox)
    sections = [memory_section(meta, Path(meta.agent_source), os.environ)] if meta.agent_source and meta.memory else []
    sections += skill_sections(meta, os.environ)
    if sections:
        if isinstance(system_prompt, dict):
            system_prompt["append"] += "\n\n" + "\n\n".join(sections)
        else:
            system_prompt += "\n\n" + "\n\n".join(sections)
    gate = PermissionGate(meta, agent_dir, secrets_, state.denied_asks)
    allowed, disallowed = cli_permissions(meta.tools, meta.disallowed_tools, gate.rules)
    options: dict[str, Any] = dict(
        tools=builtin,
        allowed_tools=allowed,
        mcp_servers=mcp_servers,
        strict_mcp_config=True,
        skills=meta.skills,
        disallowed_tools=disallowed,
        system_prompt=system_prompt,
        model=meta.model,
        max_turns=meta.max_turns,
        max_budget_usd=cli_budget_cap(meta),
        effort=meta.effort if isinstance(meta.effort, str) else None,
        settings=settings,
        cwd=meta.cwd,
        cli_path=str(cli),
        env=child_environment(meta, agent_dir),
        # dontAsk by default: nobody answers the CLI's prompts in a nested
        # agent, so what the tool list doesn't grant is denied, not awaited.
        permission_mode=meta.permission_mode,
        # Without the preset, skip settings files: they add prompt bytes and
        # project hooks at every depth. The preset keeps Claude Code's defaults.
        setting_sources=None if meta.preset == "claude_code" else [],
        output_format={"type": "json_schema", "schema": schema_for_cli(meta.schema)} if meta.schema else None,
        resume=resumed_sdk_session(meta),
        # The app in the CLI's User-Agent, unless the caller named theirs.
        client_app=None if os.environ.get(SDK_CLIENT_APP_ENV) else f"spawn.py/{__version__}",
    )
    # initialPrompt comes first, in the same user turn, so the task's own text
    # (and any scripted MOCK[...]) stays part of the first message; the agent's
    # own facts follow it, after the head siblings share in the prompt cache.
    prompt = first_message(meta)
    options["env"].update(uv_shim_path(os.environ))
    argv = cli_argv(str(cli), options)
    env = cli_environment(os.environ, options["env"], meta.cwd, options["client_app"], sdk_version())
    return CliStart(options, gate, prompt, argv, env)


async def run_sdk(
    meta: AgentMeta,
    agent_dir: Path,
    cli: Path,
    state: RunState,
    secrets_: Sequence[str],
    *,
    sdk_loader: SdkLoader | None,
    started: StartedCli | None = None,
) -> None:
    """Run the agent's CLI through the SDK: the one started early (start_cli), else one started now."""
    import asyncio

    not_started: OSError | None = None
    try:
        if started is None:
            plan = cli_start(meta, agent_dir, cli, state, secrets_)
            slot = await take_start_slot(Path(meta.session), start_slot_count(os.environ))
            try:
                started = start_cli(plan, state, slot)
            except OSError as exc:
                not_started = exc
        sdk = sdk_loader.result() if sdk_loader is not None else import_sdk(os.environ)
    except BaseException:
        if started is not None:
            started.free_slot()
        raise
    if started is None:
        # The SDK's own words for it, as when its transport started the CLI.
        if not Path(meta.cwd).is_dir():
            raise sdk.CLIConnectionError(f"Working directory does not exist: {meta.cwd}") from not_started
        if isinstance(not_started, FileNotFoundError):
            raise sdk.CLINotFoundError(f"Claude Code not found at: {cli}") from not_started
        raise sdk.CLIConnectionError(f"Failed to start Claude Code: {not_started}") from not_started
    stderr_path = agent_dir / STDERR_LOG

    def on_stderr(line: str) -> None:
        append_log_line(stderr_path, redact(line, secrets_))

    plan = started.plan
    # The same options as for the SDK's own transport: the query still reads
    # its hooks, skills and env from them (the flags are already the CLI's).
    timeout = ask_timeout(os.environ) + 60
    if state.in_process is None:
        hooks = {
            "PreToolUse": [sdk.HookMatcher(matcher=None, hooks=[plan.gate.pre_tool_use], timeout=timeout)],
            **native_subagent_hooks(sdk, agent_dir, secrets_),
        }
    else:  # its subagents are its in-process children: governed, not only recorded
        hooks = in_process_hooks(sdk, state.in_process, plan.gate.pre_tool_use, timeout)
    # --on-budget pause waits in a PreToolUse matcher of its own (its own timeout: a pause outlasts an ask).
    hooks["PreToolUse"] = [*hooks.get("PreToolUse", []), *pause_hooks(sdk, state.pause)]
    options = sdk.ClaudeAgentOptions(**plan.options, hooks=hooks, stderr=on_stderr)
    if state.in_process is not None:
        options.agents = subagent_definitions(sdk, state.in_process)
    # Freed once the CLI goes quiet (or, where its CPU can't be read, at its
    # first message), after START_SLOT_HOLD_S, or by whatever ends the run.
    cpu_readable = procfs_is_ours()
    release = asyncio.create_task(free_slot_when_quiet(started, START_SLOT_HOLD_S))
    try:
        await consume_sdk(
            sdk,
            # Streaming input while the agent takes messages (spawn.py send): its stdin stays open for them.
            sdk.query(
                prompt=state.inbox.prompts(plan.prompt) if state.inbox is not None else plan.prompt,
                options=options,
                transport=CliPipes(sdk, started, on_stderr),
            ),
            meta=meta,
            transcript=agent_dir / TRANSCRIPT,
            state=state,
            secrets_=secrets_,
            first=(lambda: None) if cpu_readable else started.free_slot,
        )
    finally:
        release.cancel()
        started.free_slot()


async def consume_sdk(
    sdk: Any,
    messages: AsyncIterator[Any],
    *,
    meta: AgentMeta,
    transcript: Path,
    state: RunState,
    secrets_: Sequence[str],
    first: Callable[[], None],
) -> None:
    """Record the CLI's messages as they come; `first` is called at each (it frees the start slot)."""
    AssistantMessage, ResultMessage, TextBlock, ToolUseBlock = sdk.AssistantMessage, sdk.ResultMessage, sdk.TextBlock, sdk.ToolUseBlock
    async for message in messages:
        first()
        state.last_activity = time.time()
        # Past the cap a claude agent goes on unrecorded: its outcome says so.
        append_transcript(transcript, message_record(message), secrets_)
        if isinstance(message, sdk.SystemMessage) and message.subtype == "init":
            remember_cli_tools(message.data, os.environ)
        if isinstance(message, AssistantMessage):
            texts = [b.text for b in message.content if isinstance(b, TextBlock) and b.text.strip()]
            if texts:
                state.last_text = "\n".join(texts)
            for block in message.content:
                if isinstance(block, ToolUseBlock) and block.name == "StructuredOutput":
                    state.last_structured_attempt = block.input
            if isinstance(message.usage, dict):
                state.turns[message.message_id or f"turn{len(state.turns)}"] = (message.model or meta.model, message.usage)
            # A tool call means another turn follows; a final answer is let through.
            calls = [b.id for b in message.content if isinstance(b, ToolUseBlock) and b.name != "StructuredOutput"]
            if calls and state.pause is not None:
                state.pause.check_turn(calls, state.turns.values())  # under --on-budget pause: wait, not fail
            elif calls and state.request_stop:
                last = list(state.turns.values())[-1:]
                why = over_hold(Path(meta.session), meta.id, estimate_cost(state.turns.values()), estimate_cost(last))
                if why is not None:
                    state.request_stop(Status.FAILED, why)
        elif isinstance(message, ResultMessage):
            if state.result is not None and isinstance(message.num_turns, int):
                message.num_turns += state.result.num_turns or 0  # a reopened run's result counts its own turns only
            state.result = message
            if state.inbox is not None:
                state.inbox.result_seen()
        else:
            observe_system_message(state, getattr(message, "subtype", None), getattr(message, "data", None))


def observe_system_message(state: RunState, subtype: Any, data: Any) -> None:
    """Keep what the CLI's system messages say about API retries and MCP servers."""
    if not isinstance(data, dict):
        return
    if subtype == "api_retry":
        state.api_retries = max(state.api_retries, int(data.get("attempt") or 0))
        status = data.get("error_status")
        state.api_error_status = status if isinstance(status, int) else state.api_error_status
    elif subtype == "init":
        servers = data.get("mcp_servers") or []
        failed = [
            f"{s.get('name')} ({s.get('status')})" for s in servers if isinstance(s, dict) and s.get("status") not in ("connected", None)
        ]
        for server in failed:
            if server not in state.mcp_failed:
                state.mcp_failed.append(server)
                print(f"spawn: warning: MCP server {server} did not start", file=sys.stderr, flush=True)


API_ERRORS = {
    401: "rejected the credentials",
    403: "refused access",
    429: "rate limit reached",
    500: "internal error",
    529: "overloaded",
}


def describe_api_error(status: int, retries: int) -> str:
    """`model API overloaded (529) after 3 retries`: what the user must know first."""
    what = API_ERRORS.get(status, "error")
    return f"model API {what} ({status})" + (f" after {retries} retries" if retries else "")


def describe_sdk_error(exc: Exception, stderr_log: Path) -> str:
    """One readable reason: the SDK's message plus what the CLI said on stderr."""
    message = str(exc).split("\n")[0].strip()
    try:
        tail = [line.strip() for line in read_text(stderr_log).splitlines() if line.strip()][-3:]
    except (OSError, SpawnError):
        tail = []
    reason = f"{type(exc).__name__}: {message}"
    if tail:
        reason += "; CLI stderr: " + " | ".join(tail)
    return reason[:2000]


def outcome_from_run(meta: AgentMeta, state: RunState, started: float, error: str | None) -> Outcome:
    """Turn what the run saw into the outcome record (pure).

    A run that would end `failed` after one of its own asks was answered no
    ended on that answer: it is `refused` (exit 4), naming the ask. A failure
    that isn't the agent's own (API error, CLI crash, no result) stays `failed`.
    """
    outcome = _outcome_from_run(meta, state, started, error)
    api_failed = outcome.api_error_status is not None or state.api_error_status is not None
    if outcome.status == Status.FAILED and state.denied_asks and state.result is not None and error is None and not api_failed:
        outcome.status, outcome.exit_code = Status.REFUSED, ExitCode.REFUSED
        outcome.reason = f"{state.denied_asks[-1]}, and the agent ended without a result ({outcome.reason})"[:2000]
    return outcome


def _outcome_from_run(meta: AgentMeta, state: RunState, started: float, error: str | None) -> Outcome:
    result = state.result
    duration = round(time.time() - started, 3)
    base: dict[str, Any] = {
        "id": meta.id,
        "ended_at": utc_now_iso(),
        "duration_s": duration,
        "text": state.last_text,
        "transcript": str(Path(meta.session) / AGENTS_DIR / meta.id / TRANSCRIPT),
    }
    if result is not None:
        base.update(
            cost_usd=round_usd(result.total_cost_usd),
            usage=result.usage,
            turns=result.num_turns,
            sdk_session_id=result.session_id,
            api_error_status=getattr(result, "api_error_status", None),
        )
        if result.result and not state.last_text:
            base["text"] = result.result
    if state.mcp_failed:
        base["warnings"] = [f"MCP server {server} did not start" for server in state.mcp_failed]
    if state.stop_reason is not None:
        status = state.stop_reason
        reason = state.stop_detail
        if state.api_error_status is not None and (result is None or result.is_error):
            # A deadline that lands while the CLI retries a failing API: say so.
            reason += f"; the {describe_api_error(state.api_error_status, state.api_retries)}"
        return Outcome(status=status, reason=reason, exit_code=EXIT_FOR_STATUS[status], **base)
    if result is not None and result.is_error:
        # The CLI's own account (subtype, API status, errors) beats the SDK's
        # exception, which only says that the CLI exited non-zero.
        detail = "; ".join(getattr(result, "errors", None) or []) or (result.result or "")
        api = getattr(result, "api_error_status", None)
        if api:
            reason = describe_api_error(api, state.api_retries)
        else:
            # "success" is the subtype of every run that ended with a turn; it says nothing.
            reason = "agent failed" + (f" ({result.subtype})" if result.subtype and result.subtype != "success" else "")
        reason += f": {detail}" if detail else ""
        return Outcome(status=Status.FAILED, reason=reason[:2000], exit_code=ExitCode.AGENT_FAILED, **base)
    if error is not None and state.cli_killed:
        return Outcome(status=Status.KILLED, reason=f"the claude CLI was ended by a signal: {error}", exit_code=ExitCode.KILLED, **base)
    if error is not None:
        return Outcome(status=Status.FAILED, reason=error, exit_code=ExitCode.AGENT_FAILED, **base)
    if result is None:
        return Outcome(status=Status.FAILED, reason="the CLI ended without a result", exit_code=ExitCode.AGENT_FAILED, **base)
    if meta.schema is not None:
        output = result.structured_output
        if output is None:
            output = state.last_structured_attempt
        if output is None:
            return Outcome(
                status=Status.FAILED,
                reason="no structured output: the agent never called StructuredOutput",
                exit_code=ExitCode.AGENT_FAILED,
                validation_errors=["(root): no structured output was produced"],
                **base,
            )
        errors = validate_output(meta.schema, output)
        if errors:
            return Outcome(
                status=Status.FAILED,
                reason=f"structured output does not match the schema ({len(errors)} error(s))",
                exit_code=ExitCode.AGENT_FAILED,
                output=output,
                validation_errors=errors,
                **base,
            )
        return Outcome(status=Status.DONE, reason="completed", exit_code=ExitCode.OK, output=output, **base)
    return Outcome(status=Status.DONE, reason="completed", exit_code=ExitCode.OK, output=result.result or state.last_text or "", **base)


async def free_slot_when_quiet(started: StartedCli, hold_s: float) -> None:
    """Let go of the CLI's start slot once it goes quiet, and after hold_s at the latest.

    Quiet: under START_SLOT_QUIET_SHARE of a core over START_SLOT_QUIET_S, START_SLOT_QUIET_LOOKS times in a row,
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
    quiet_looks = 0
    while started.slot is not None and last is not None and time.monotonic() < limit:
        await asyncio.sleep(min(START_SLOT_QUIET_S, max(0.0, limit - time.monotonic())))
        demand = cpu_demand_ns(pid)
        if demand is None:
            break
        # Quiet at START_SLOT_QUIET_LOOKS looks in a row: a look alone can fall
        # in a stretch where the whole machine was held back (a CPU quota's
        # throttling, a hypervisor's steal), which the run queue doesn't count.
        quiet_looks = quiet_looks + 1 if demand - last < quiet_ns else 0
        if quiet_looks >= START_SLOT_QUIET_LOOKS:
            break
        last = demand
    started.free_slot()
# ==================== end src/spawnlib/claude.py ====================

# ==================== begin src/spawnlib/executors.py ====================
































# ---------------------------------------------------------------- executors --
# The seam between a node of the tree and what runs it. A reference (an
# --agent value, or a definition's `kind:`) resolves to a Node; the Executor
# of its kind checks it at resolve time and runs it. Everything else about a
# node (meta, admission, deadline, signals, kill, guard, cgroup, the one
# outcome) is run_agent's and the same for every kind. A new kind is one
# Executor subclass in this section and its name in EXECUTORS. The kinds'
# constants live here too, so that adding one touches this section only.

# A card that takes longer than this to fetch counts as unreachable; a live
# agent serves it in milliseconds, and a dead host should fail the spawn fast.
A2A_CARD_TIMEOUT_S = 15.0
# The bearer token a2a nodes send to the agent they call (tools/a2a_server.py
# requires one): the path of a file holding it, so the token itself stays out
# of argv, meta.json and the transcript.
ENV_A2A_TOKEN_FILE = "SPAWN_A2A_TOKEN_FILE"
# Without streaming, the remote task is polled this often: a short remote
# task waits little, and the remote sees at most two requests a second.
A2A_POLL_S = 0.5
# The A2A transports this client speaks (gRPC would need a2a-sdk's grpc extra).
A2A_BINDINGS = ("JSONRPC", "HTTP+JSON")
# Message metadata that carries a tree's limits and trace across an A2A hop
# (sessions/README.md, "Node kinds"); tools/a2a_server.py reads the same keys.
A2A_META_DEPTH = "spawn.depth"
A2A_META_MAX_DEPTH = "spawn.max_depth"
A2A_META_DEADLINE = "spawn.deadline"
A2A_META_BUDGET = "spawn.max_budget_usd"
A2A_META_TRACEPARENT = "spawn.traceparent"
A2A_META_COST = "spawn.cost_usd"
# A message `spawn.py send` gave an a2a node, sent on to its remote task: a steer,
# never an answer (tools/a2a_server.py hands it to the served agent's inbox).
A2A_META_STEER = "spawn.steer"
A2A_META_SENT_BY = "spawn.sent_by"
# Remote task states (A2A's TaskState without its TASK_STATE_ prefix) and what
# they end as; input-required and auth-required become asks; submitted and
# working mean "not yet"; anything else is unknown and fails the node.
A2A_FINAL_STATES: dict[str, Status] = {
    "completed": Status.DONE,
    "failed": Status.FAILED,
    "rejected": Status.FAILED,
    "canceled": Status.KILLED,
}
A2A_ASK_STATES = ("input-required", "auth-required")
A2A_RUNNING_STATES = ("submitted", "working")
# A command's stdout is one JSON result: bounded, so a runaway command can't
# fill spawn.py's memory. 16 MiB is far above any result a parent reads.
COMMAND_RESULT_LIMIT = 16 * 1024 * 1024


class Executor:
    """Runs one kind of node inside run_agent's supervision."""

    kind = ""

    def check(self, node: Node, deadline: float | None) -> None:
        """At resolve time: UsageError (exit 2, nothing written) when the node can't be run.

        It returns by the spawn's deadline (Unix seconds) whatever a remote does:
        a check that runs out of time leaves the rest to the run, which records the timeout.
        """

    def start(self, meta: AgentMeta, agent_dir: Path, cli: Path, state: RunState, secrets_: Sequence[str]) -> None:
        """Before run's event loop (and the SDK's import): start what may start at once. Best effort: run starts the rest."""

    async def run(
        self, meta: AgentMeta, agent_dir: Path, cli: Path, state: RunState, secrets_: Sequence[str], *, sdk_loader: SdkLoader | None
    ) -> None:
        """Run the task; leave what came back in state (a claude run: state.result; others: state.node_result)."""
        raise NotImplementedError

    def describe_error(self, exc: Exception, agent_dir: Path) -> str:
        """The reason of a failed outcome for an exception run raised."""
        return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"[:2000]

    def outcome(self, meta: AgentMeta, agent_dir: Path, state: RunState, started: float, error: str | None) -> Outcome:
        return node_outcome(meta, state, started, error)


class ClaudeExecutor(Executor):
    """Today's path: the claude CLI through the SDK (run_sdk)."""

    kind = "claude"

    def __init__(self) -> None:
        self.started: StartedCli | None = None

    def start(self, meta: AgentMeta, agent_dir: Path, cli: Path, state: RunState, secrets_: Sequence[str]) -> None:
        """Start the CLI while the SDK is still being imported, if nothing makes it wait.

        A --max-concurrent slot or a start slot to wait for, or a stop
        already asked for, leave it to run_sdk, whose loop can serve a stop
        meanwhile; so does anything that fails here, which run_sdk then
        meets again and reports.
        """
        if EarlyStop.pending is not None or read_limits(Path(meta.session)).max_concurrent is not None:
            return
        try:
            plan = cli_start(meta, agent_dir, cli, state, secrets_)
        except Exception:
            return
        free, slot = start_slot_now(Path(meta.session), start_slot_count(os.environ))
        if free:
            with contextlib.suppress(OSError):
                self.started = start_cli(plan, state, slot)

    async def run(
        self, meta: AgentMeta, agent_dir: Path, cli: Path, state: RunState, secrets_: Sequence[str], *, sdk_loader: SdkLoader | None
    ) -> None:
        await open_steering(meta, agent_dir, state, secrets_)  # spawn.py send's inbox; --on-budget pause
        try:
            await run_sdk(meta, agent_dir, cli, state, secrets_, sdk_loader=sdk_loader, started=self.started)
        finally:
            close_steering(state)

    def describe_error(self, exc: Exception, agent_dir: Path) -> str:
        return describe_sdk_error(exc, agent_dir / STDERR_LOG)

    def outcome(self, meta: AgentMeta, agent_dir: Path, state: RunState, started: float, error: str | None) -> Outcome:
        # The CLI's usage prices a run it gave no total for; other kinds have no turns to price.
        outcome = with_estimated_cost(outcome_from_run(meta, state, started, error), agent_dir, meta.model)
        if state.in_process is not None:
            state.in_process.host_share(outcome)  # its CLI's total holds its in-process children's turns too
        return outcome


def node_outcome(meta: AgentMeta, state: RunState, started: float, error: str | None) -> Outcome:
    """The outcome of a node of another kind than claude (pure).

    As for a claude agent: a stop (kill, deadline, signal) wins; a failure
    after one of the node's own asks was answered no is `refused`; the output
    is validated against the schema (a JSON text is parsed first).
    """
    result = state.node_result
    base: dict[str, Any] = {
        "id": meta.id,
        "ended_at": utc_now_iso(),
        "duration_s": round(time.time() - started, 3),
        "text": result.text if result else None,
        "cost_usd": result.cost_usd if result else None,
        "transcript": str(Path(meta.session) / AGENTS_DIR / meta.id / TRANSCRIPT),
    }
    if state.stop_reason is not None:
        return Outcome(status=state.stop_reason, reason=state.stop_detail, exit_code=EXIT_FOR_STATUS[state.stop_reason], **base)
    if error is None and result is None:
        error = f"the {meta.kind} node ended without a result"
    if error is not None or (result is not None and result.status != Status.DONE):
        status, reason = (Status.FAILED, error or "") if error is not None or result is None else (result.status, result.reason)
        if status == Status.FAILED and state.denied_asks:
            status, reason = Status.REFUSED, f"{state.denied_asks[-1]}, and the node ended without a result ({reason})"
        return Outcome(status=status, reason=reason[:2000], exit_code=EXIT_FOR_STATUS[status], **base)
    assert result is not None
    output = result.output
    if meta.schema is not None:
        if isinstance(output, str):
            with contextlib.suppress(ValueError):
                output = parse_json(output)
        errors = validate_output(meta.schema, output)
        if errors:
            reason = f"output does not match the schema ({len(errors)} error(s))"
            return Outcome(
                status=Status.FAILED, reason=reason, exit_code=ExitCode.AGENT_FAILED, output=output, validation_errors=errors, **base
            )
    return Outcome(status=Status.DONE, reason=result.reason or "completed", exit_code=ExitCode.OK, output=output, **base)


def node_line(agent_dir: Path, kind: str, message: Mapping[str, Any], secrets_: Sequence[str]) -> bool:
    """One transcript line of a node of another kind: {time, type, message}; False once the transcript is truncated."""
    return append_transcript(agent_dir / TRANSCRIPT, {"time": utc_now_iso(), "type": kind, "message": dict(message)}, secrets_)


class CommandExecutor(Executor):
    """An executable: one JSON task on stdin, one JSON result on stdout (sessions/README.md)."""

    kind = "command"

    def check(self, node: Node, deadline: float | None) -> None:
        import shutil

        argv = command_argv(node.endpoint or "", f"command:{node.endpoint}")
        found = argv[0] if "/" in argv[0] else shutil.which(argv[0])
        if found is None or not Path(found).is_file() or not os.access(found, os.X_OK):
            raise NodeReferenceError(
                f"command:{node.endpoint}", f"{argv[0]} is not an executable file; give its path, e.g. command:/path/to/exe"
            )

    async def run(
        self, meta: AgentMeta, agent_dir: Path, cli: Path, state: RunState, secrets_: Sequence[str], *, sdk_loader: SdkLoader | None
    ) -> None:
        import asyncio

        argv = command_argv(meta.endpoint or "", f"command:{meta.endpoint}")
        # Its own session and group: the stop path ends the group, never spawn.py.
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=meta.cwd,
            env={**os.environ, **child_environment(meta, agent_dir)},
            start_new_session=True,
            limit=COMMAND_RESULT_LIMIT,
        )
        state.started_cli(proc.pid)
        node_line(agent_dir, "CommandStart", {"argv": argv, "pid": proc.pid}, secrets_)
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        stderr_tail: list[str] = []

        async def pump_stderr(stream: asyncio.StreamReader) -> None:
            async for raw in stream:
                line = redact(raw.decode(errors="replace").rstrip("\n"), secrets_)
                if line.strip():
                    del stderr_tail[:-2]
                    stderr_tail.append(line)
                state.last_activity = time.time()
                append_log_line(agent_dir / STDERR_LOG, line)

        async def feed(stdin: asyncio.StreamWriter) -> None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # a command may not read its task
                stdin.write(json.dumps(command_task(meta, agent_dir)).encode() + b"\n")
                await stdin.drain()
            stdin.close()

        _, out, _ = await asyncio.gather(feed(proc.stdin), proc.stdout.read(COMMAND_RESULT_LIMIT + 1), pump_stderr(proc.stderr))
        if len(out) > COMMAND_RESULT_LIMIT:
            Supervised.signal_group(proc.pid, signal.SIGKILL)  # it would block on a pipe nobody reads
        code = await proc.wait()
        result = command_result(out, code, stderr_tail)
        node_line(agent_dir, "CommandResult", {"exit_code": code, "status": result.status.value, "reason": result.reason}, secrets_)
        state.node_result = result


def command_task(meta: AgentMeta, agent_dir: Path) -> dict[str, Any]:
    """The JSON a command node reads on stdin (sessions/README.md, "Node kinds")."""
    task: dict[str, Any] = {
        "task": meta.task,
        "schema": meta.schema,
        "depth": meta.depth,
        "max_depth": meta.max_depth,
        "deadline": meta.deadline,
        "max_budget_usd": meta.max_budget_usd,
        "session": meta.session,
        "agent_id": meta.id,
        "parent_id": meta.parent_id,
        "agent_dir": str(agent_dir),
        "cwd": meta.cwd,
        "traceparent": meta.traceparent,
        "protocol": PROTOCOL_VERSION,
    }
    return task


def command_result(out: bytes, code: int, stderr_tail: Sequence[str]) -> NodeResult:
    """What a command's exit status and stdout say (pure)."""
    said = f"; stderr: {' | '.join(stderr_tail)}" if stderr_tail else ""
    if len(out) > COMMAND_RESULT_LIMIT:  # checked first: spawn.py ended such a command itself
        return NodeResult(Status.FAILED, f"the command's result is over {COMMAND_RESULT_LIMIT} bytes")
    if code < 0:
        name = next((sig.name for sig in signal.Signals if sig == -code), f"signal {-code}")
        return NodeResult(Status.KILLED, f"the command was ended by {name}")
    try:
        result = parse_json(out)
    except ValueError:
        result = None
    error = result.get("error") if isinstance(result, dict) else None
    cost = result.get("cost_usd") if isinstance(result, dict) else None
    cost = float(cost) if isinstance(cost, int | float) and not isinstance(cost, bool) and is_finite(cost) and cost >= 0 else None
    if code != 0:
        return NodeResult(Status.FAILED, f"the command exited {code}" + (f": {error}" if error else said), cost_usd=cost)
    if not isinstance(result, dict) or ("output" not in result and not error):
        head = out[:200].decode(errors="replace").strip()
        return NodeResult(
            Status.FAILED, f'the command wrote no JSON result on stdout ({{"output": ...}}); it wrote {head!r}{said}', cost_usd=cost
        )
    if error:
        return NodeResult(Status.FAILED, f"the command failed: {error}", output=result.get("output"), cost_usd=cost)
    output = result["output"]
    return NodeResult(Status.DONE, "completed", output=output, text=output if isinstance(output, str) else None, cost_usd=cost)


def a2a_token(environ: Mapping[str, str]) -> str | None:
    """The bearer token in $SPAWN_A2A_TOKEN_FILE, or None when it is unset."""
    path = environ.get(ENV_A2A_TOKEN_FILE)
    if not path:
        return None
    try:
        token = Path(path).expanduser().read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise UsageError(f"can't read {ENV_A2A_TOKEN_FILE} {path}: {why}; point it at the token file") from None
    if not token or not token.isprintable() or not token.isascii():
        raise UsageError(f"{ENV_A2A_TOKEN_FILE} {path} holds no token (one line of ASCII); point it at the server's token file")
    return token


def read_url_by(url: str, until: float) -> bytes:
    """GET url's body (at most COMMAND_RESULT_LIMIT bytes), all of it read by `until`
    (Unix seconds), else TimeoutError.

    urllib's own timeout bounds each socket call, so a peer that sends one byte
    a second never trips it: here each read gets only the time left.
    """
    import http.client
    import io
    import urllib.request

    class Reads(io.RawIOBase):
        def __init__(self, sock: socket.socket) -> None:
            self.sock = sock

        def readable(self) -> bool:
            return True

        def readinto(self, buffer: Any) -> int:
            left = until - time.time()
            if left <= 0:
                raise TimeoutError("out of time")
            self.sock.settimeout(left)
            return self.sock.recv_into(buffer)

        def close(self) -> None:
            super().close()
            self.sock.close()

    class Bounded:
        """The connection's socket as http.client uses it, every read bounded.

        urllib closes the connection once the headers are read, leaving the
        response's reader to close the socket: the reader owns it from then.
        """

        def __init__(self, sock: socket.socket) -> None:
            self.sock = sock
            self.reader: io.BufferedReader | None = None

        def makefile(self, mode: str, *args: Any, **kwargs: Any) -> io.BufferedReader:
            self.reader = io.BufferedReader(Reads(self.sock))
            return self.reader

        def close(self) -> None:
            if self.reader is None:
                self.sock.close()

        def __getattr__(self, name: str) -> Any:
            return getattr(self.sock, name)

    class HTTPConnection(http.client.HTTPConnection):
        def connect(self) -> None:
            super().connect()
            self.sock = cast("socket.socket", Bounded(self.sock))

    class HTTPSConnection(http.client.HTTPSConnection):
        def connect(self) -> None:
            super().connect()  # the TLS handshake too, within the connect timeout
            self.sock = cast("socket.socket", Bounded(self.sock))

    class HTTP(urllib.request.HTTPHandler):
        def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
            return self.do_open(HTTPConnection, req)

    class HTTPS(urllib.request.HTTPSHandler):
        def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
            return self.do_open(HTTPSConnection, req)

    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    with urllib.request.build_opener(HTTP, HTTPS).open(request, timeout=max(0.001, until - time.time())) as response:
        return cast("bytes", response.read(COMMAND_RESULT_LIMIT))


def fetch_agent_card(url: str, deadline: float | None = None) -> dict[str, Any] | None:
    """The agent card at url, checked enough to be worth a client (resolve time; no SDK import).

    It is read within A2A_CARD_TIMEOUT_S and by the deadline: None when the
    deadline came first, so that the run records the timeout.
    """
    import urllib.error

    until = time.time() + A2A_CARD_TIMEOUT_S
    by_deadline = deadline is not None and deadline < until
    try:
        body = read_url_by(url, min(until, deadline) if deadline is not None else until)
    except urllib.error.HTTPError as exc:
        raise UsageError(f"no A2A agent card at {url} (HTTP {exc.code}); check the URL (is it an A2A agent?)") from None
    except (urllib.error.URLError, OSError) as exc:
        why = getattr(exc, "reason", exc)
        if isinstance(why, TimeoutError):
            if by_deadline:
                return None
            raise UsageError(f"the A2A agent at {url} sent no card within {A2A_CARD_TIMEOUT_S:.0f} s; check the host and port") from None
        raise UsageError(f"can't reach the A2A agent at {url}: {why}; check the host and port") from None
    try:
        card = parse_json(body)
    except ValueError:
        raise UsageError(f"{url} is not an A2A agent card (not JSON); check the URL") from None
    problem = a2a_card_problem(card)
    if problem is not None:
        raise UsageError(f"{url} is not a valid A2A agent card: {problem}")
    return cast("dict[str, Any]", card)


def a2a_card_problem(card: Any) -> str | None:
    """What keeps this client from using a card, or None (pure)."""
    if not isinstance(card, dict):
        return "it is not a JSON object"
    if not isinstance(card.get("name"), str) or not card.get("name"):
        return "it has no name"
    interfaces = card.get("supportedInterfaces")
    if interfaces is None and isinstance(card.get("url"), str):  # a 0.3 card
        interfaces = [{"url": card["url"], "protocolBinding": card.get("preferredTransport", "JSONRPC")}]
        interfaces += [
            {"url": i.get("url"), "protocolBinding": i.get("transport")}
            for i in card.get("additionalInterfaces") or []
            if isinstance(i, dict)
        ]
    if not isinstance(interfaces, list) or not interfaces:
        return "it lists no interface (supportedInterfaces)"
    usable = [i for i in interfaces if isinstance(i, dict) and i.get("protocolBinding") in A2A_BINDINGS and isinstance(i.get("url"), str)]
    if not usable:
        return f"none of its interfaces speaks {' or '.join(A2A_BINDINGS)}"
    return None


def a2a_metadata(meta: AgentMeta) -> dict[str, Any]:
    """Message metadata: the node's depth, limits and trace, for the remote to narrow to."""
    data: dict[str, Any] = {A2A_META_DEPTH: meta.depth, A2A_META_MAX_DEPTH: meta.max_depth, A2A_META_TRACEPARENT: meta.traceparent}
    if meta.deadline is not None:
        data[A2A_META_DEADLINE] = meta.deadline
    if meta.max_budget_usd is not None:
        data[A2A_META_BUDGET] = meta.max_budget_usd
    return data


def a2a_state_name(value: int, names: Mapping[int, str]) -> str:
    """completed, input-required, ...: A2A's TaskState without its prefix; an unknown value as its number (pure)."""
    name = names.get(value)
    return name.removeprefix("TASK_STATE_").lower().replace("_", "-") if name else str(value)


def whole_numbers(value: Any) -> Any:
    """JSON from protobuf's Struct, whose numbers are all doubles: 3.0 back to 3 (pure)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [whole_numbers(v) for v in value]
    if isinstance(value, dict):
        return {k: whole_numbers(v) for k, v in value.items()}
    return value


def parts_output(parts: Sequence[Mapping[str, Any]]) -> tuple[Any, str | None]:
    """(output, text) of A2A parts as JSON (pure).

    One data part alone is the output (so --schema can check it); text parts
    are joined; both together are {"text", "data": [...]}. A file part counts
    as data: {url or filename, media_type}.
    """
    texts = [str(p["text"]) for p in parts if "text" in p]
    data = [whole_numbers(p["data"]) for p in parts if "data" in p]
    data += [{k: p[k] for k in ("url", "filename", "mediaType") if k in p} for p in parts if "url" in p or "raw" in p]
    text = "\n".join(texts) if texts else None
    if not data:
        return text, text
    if text is None:
        return (data[0] if len(data) == 1 else data), None
    return {"text": text, "data": data}, text


class A2ATask:
    """What the client has seen of its remote task, from events or polls (JSON, as ProtoJSON)."""

    def __init__(self, state_names: Mapping[int, str]) -> None:
        self.names = state_names
        self.task_id: str | None = None
        self.context_id: str | None = None
        self.state: str | None = None
        self.status_parts: list[dict[str, Any]] = []
        self.artifacts: dict[str, list[dict[str, Any]]] = {}
        self.reply: list[dict[str, Any]] | None = None
        """The parts of a direct Message reply: the remote answered without a task."""
        self.cost_usd: float | None = None

    def observe(self, event: Mapping[str, Any], raw_state: int | None) -> None:
        """Take in one StreamResponse (or a polled Task as {"task": ...}); raw_state is its numeric state."""
        if "message" in event:
            self.reply = list(event["message"].get("parts") or [])
            self.state = "completed"
            return
        body = event.get("task") or event.get("statusUpdate") or event.get("artifactUpdate") or {}
        self.task_id = body.get("id") or body.get("taskId") or self.task_id
        self.context_id = body.get("contextId") or self.context_id
        self._cost(body.get("metadata"))
        if "task" in event:
            for artifact in body.get("artifacts") or []:
                self.artifacts[str(artifact.get("artifactId"))] = list(artifact.get("parts") or [])
        if "artifactUpdate" in event:
            artifact = body.get("artifact") or {}
            key = str(artifact.get("artifactId"))
            parts = list(artifact.get("parts") or [])
            self.artifacts[key] = [*self.artifacts.get(key, []), *parts] if body.get("append") else parts
        if "task" in event or "statusUpdate" in event:
            status = body.get("status") or {}
            self.state = a2a_state_name(raw_state or 0, self.names)
            message = status.get("message") or {}
            self.status_parts = list(message.get("parts") or [])
            self._cost(message.get("metadata"))

    def _cost(self, metadata: Any) -> None:
        cost = metadata.get(A2A_META_COST) if isinstance(metadata, dict) else None
        if isinstance(cost, int | float) and not isinstance(cost, bool) and is_finite(cost) and cost >= 0:
            self.cost_usd = float(cost)

    def settled(self) -> bool:
        """Past working: final, waiting for an answer, or in a state this client doesn't know."""
        return self.state is not None and self.state not in A2A_RUNNING_STATES

    def status_text(self) -> str:
        return parts_output(self.status_parts)[1] or ""

    def result(self) -> NodeResult:
        state = self.state or "unknown"
        status = A2A_FINAL_STATES.get(state)
        said = self.status_text()
        if status == Status.DONE:
            parts = self.reply if self.reply is not None else [p for ps in self.artifacts.values() for p in ps]
            output, text = parts_output(parts or self.status_parts)
            return NodeResult(Status.DONE, "completed", output=output, text=text or said or None, cost_usd=self.cost_usd)
        if status == Status.KILLED:
            return NodeResult(
                Status.KILLED,
                "the remote agent canceled the task" + (f": {said}" if said else ""),
                text=said or None,
                cost_usd=self.cost_usd,
            )
        if status == Status.FAILED:
            return NodeResult(
                Status.FAILED, f"the remote agent's task {state}" + (f": {said}" if said else ""), text=said or None, cost_usd=self.cost_usd
            )
        return NodeResult(
            Status.FAILED, f"the remote task is in a state this client doesn't know: {state!r}", text=said or None, cost_usd=self.cost_usd
        )


class A2AExecutor(Executor):
    """A remote agent over A2A (a2a-sdk, imported only when an a2a node runs)."""

    kind = "a2a"

    def check(self, node: Node, deadline: float | None) -> None:
        a2a_token(os.environ)  # an unreadable token file is exit 2, before anything is written
        fetch_agent_card(node.endpoint or "", deadline)

    def describe_error(self, exc: Exception, agent_dir: Path) -> str:
        return f"A2A: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"[:2000]

    async def run(
        self, meta: AgentMeta, agent_dir: Path, cli: Path, state: RunState, secrets_: Sequence[str], *, sdk_loader: SdkLoader | None
    ) -> None:
        import asyncio
        from urllib.parse import urlsplit

        import httpx
        from a2a.client import A2ACardResolver, ClientConfig, ClientFactory

        url = meta.endpoint or ""
        parts = urlsplit(url)
        # No timeout of its own on a stream's reads: the deadline (run_agent's
        # stop, which cancels this task) bounds the card, the send, the stream and every poll.
        async with httpx.AsyncClient(
            timeout=httpx.Timeout(A2A_CARD_TIMEOUT_S, read=None), auth=a2a_bearer(url, a2a_token(os.environ))
        ) as http:
            card = await A2ACardResolver(http, f"{parts.scheme}://{parts.netloc}", parts.path).get_agent_card()
            streaming = bool(card.capabilities.streaming)
            conversation = A2AConversation(meta, agent_dir, state, secrets_)
            conversation.line("A2ACard", {"url": url, "name": card.name, "version": card.version, "streaming": streaming})
            config = ClientConfig(
                streaming=streaming, polling=not streaming, httpx_client=http, supported_protocol_bindings=list(A2A_BINDINGS)
            )
            conversation.client = ClientFactory(config).create(card)
            task = conversation.task
            state.stop_hooks.append(conversation.cancel)
            await open_steering(meta, agent_dir, state, secrets_)  # spawn.py send's inbox
            forwarding = asyncio.ensure_future(conversation.forward(state.inbox)) if state.inbox is not None else None
            try:
                state.node_result = await conversation.converse(remote=card.name)
            except A2AFlooded as exc:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(conversation.cancel(), KILL_GRACE_S)
                state.node_result = NodeResult(Status.FAILED, str(exc), cost_usd=task.cost_usd)
            finally:
                close_steering(state)
                if forwarding is not None:  # what was accepted before the close is sent, or recorded as not sent
                    await asyncio.wait([forwarding], timeout=KILL_GRACE_S)
                    forwarding.cancel()
                # A remote that reports itself canceled ends the stream while the
                # stop path's cancel still waits on this client for its reply:
                # closing the client now would cut that reply (and its record) off.
                if conversation.cancels:
                    await asyncio.wait(conversation.cancels, timeout=KILL_GRACE_S)


def a2a_bearer(url: str, token: str | None) -> Any:
    """An httpx.Auth that sends the token to the card's own origin only: a card may name interfaces anywhere."""
    from collections.abc import Generator

    import httpx

    card_origin = httpx.URL(url)

    class Bearer(httpx.Auth):
        def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
            there = request.url
            if token is not None and (there.scheme, there.host, there.port) == (card_origin.scheme, card_origin.host, card_origin.port):
                request.headers["Authorization"] = f"Bearer {token}"
            yield request

    return Bearer()


class A2AFlooded(Exception):
    """The remote sent more than the transcript holds: a peer that floods is ended, not followed."""


class A2AConversation:
    """One a2a node's exchange with its remote: send, follow the task to a settled state, answer its asks, cancel."""

    def __init__(self, meta: AgentMeta, agent_dir: Path, state: RunState, secrets_: Sequence[str]) -> None:
        import asyncio

        from a2a.types import TaskState

        self.meta, self.agent_dir, self.state, self.secrets = meta, agent_dir, state, secrets_
        # protobuf ships no type hints: its JSON codec is used untyped.
        self.json_format: Any = importlib.import_module("google.protobuf.json_format")
        self.names = {int(v): n for n, v in TaskState.items()}
        self.task = A2ATask(self.names)
        self.client: Any = None
        self.cancels: list[asyncio.Future[None]] = []

    def line(self, kind: str, message: Mapping[str, Any]) -> bool:
        self.state.last_activity = time.time()
        return node_line(self.agent_dir, kind, message, self.secrets)

    async def cancel(self) -> None:
        import asyncio

        from a2a.types import CancelTaskRequest

        task, cancels, line = self.task, self.cancels, self.line
        if task.task_id is None or task.state in A2A_FINAL_STATES:
            line(
                "A2ACancel",
                {"task_id": task.task_id, "sent": False, "why": "no remote task yet" if task.task_id is None else task.state},
            )
            return
        if cancels:  # the run's own cancel (an ask denied) and the stop path's can meet: one is sent
            await asyncio.wait(cancels, timeout=KILL_GRACE_S)
            return
        done = asyncio.get_running_loop().create_future()
        cancels.append(done)
        try:
            answer = await self.client.cancel_task(CancelTaskRequest(id=task.task_id))
        except Exception as exc:
            line("A2ACancel", {"task_id": task.task_id, "sent": True, "error": f"{type(exc).__name__}: {exc}"[:500]})
            raise
        finally:
            done.set_result(None)
        line("A2ACancel", {"task_id": task.task_id, "sent": True, "state": a2a_state_name(answer.status.state, self.names)})

    async def forward(self, inbox: Any) -> None:
        """Each message the inbox accepted, in order, as the next message of the remote task (an A2ASteer line each)."""
        import asyncio
        import uuid

        from a2a.types import Message, Part, Role, SendMessageConfiguration, SendMessageRequest

        task, seq = self.task, 0
        while await inbox.wait_for_message():
            text, seq = inbox.queue.popleft(), seq + 1
            while task.task_id is None and task.state not in A2A_FINAL_STATES:
                await asyncio.sleep(0.1)  # the remote has not named its task yet
            if task.state in A2A_FINAL_STATES:
                self.line("A2ASteer", {"seq": seq, "sent": False, "why": f"the remote task is {task.state}"})
                continue
            metadata = {**a2a_metadata(self.meta), A2A_META_STEER: True, A2A_META_SENT_BY: f"spawn:{self.meta.id}"}
            message = Message(
                message_id=uuid.uuid4().hex, role=Role.ROLE_USER, parts=[Part(text=text)], metadata=metadata,
                task_id=task.task_id or "", context_id=task.context_id or "",
            )  # fmt: skip
            request = SendMessageRequest(message=message, configuration=SendMessageConfiguration(return_immediately=True))
            try:
                events = self.client.send_message(request)
                async for event in events:  # the first event says it was taken; the task's progress is follow()'s
                    said = event.task.status if event.HasField("task") else event.status_update.status
                    state = a2a_state_name(said.state, self.names)
                    self.line("A2ASteer", {"seq": seq, "sent": True, "task_id": task.task_id, "state": state})
                    break
                close = getattr(events, "aclose", None)
                if close is not None:
                    await close()
            except Exception as exc:  # a remote that refuses it: recorded, and the node goes on
                self.line("A2ASteer", {"seq": seq, "sent": False, "error": f"{type(exc).__name__}: {exc}"[:500]})

    async def converse(self, *, remote: str) -> NodeResult:
        """Send the task, then each answer to the remote's asks, until the task settles; its result."""
        import uuid

        from a2a.types import Message, Part, Role

        meta, task = self.meta, self.task
        text = meta.task
        while True:
            message = Message(
                message_id=uuid.uuid4().hex,
                role=Role.ROLE_USER,
                parts=[Part(text=text)],
                metadata=a2a_metadata(meta),
                task_id=task.task_id or "",
                context_id=task.context_id or "",
            )
            await self.follow(message)
            if task.state not in A2A_ASK_STATES:
                break
            reply = await a2a_ask(meta, self.agent_dir, self.state, task, remote=remote, secrets_=self.secrets)
            if reply is None:
                await self.cancel()
                return NodeResult(Status.FAILED, f"the remote agent's {task.state} was answered no", cost_usd=task.cost_usd)
            text = reply
        return task.result()

    async def follow(self, message: Any) -> None:
        """Send one message; follow its stream, then poll, until the task settles."""
        import asyncio

        from a2a.types import GetTaskRequest, SendMessageRequest

        task, line, json_format = self.task, self.line, self.json_format
        line("A2ASend", json_format.MessageToDict(message))
        events = self.client.send_message(SendMessageRequest(message=message))
        try:
            async for event in events:
                raw = event.task.status.state if event.HasField("task") else event.status_update.status.state
                event_json = json_format.MessageToDict(event)
                if not line("A2AEvent", event_json):
                    raise A2AFlooded(
                        f"the remote agent sent over {log_max_bytes(os.environ)} bytes of events ({ENV_LOG_MAX}); its task was canceled"
                    )
                task.observe(event_json, raw)
                if task.settled():
                    break
        finally:
            close = getattr(events, "aclose", None)  # the stream's connection, now, not at collection
            if close is not None:
                await close()
        seen = task.state
        while not task.settled():
            if task.task_id is None:
                raise RuntimeError("the remote agent answered with neither a task nor a message")
            await asyncio.sleep(A2A_POLL_S)
            polled = await self.client.get_task(GetTaskRequest(id=task.task_id))
            task.observe({"task": json_format.MessageToDict(polled)}, polled.status.state)
            if task.state != seen:  # a poll that saw nothing new is no event
                line("A2ATask", json_format.MessageToDict(polled))
                seen = task.state


async def a2a_ask(meta: AgentMeta, agent_dir: Path, state: RunState, task: A2ATask, *, remote: str, secrets_: Sequence[str]) -> str | None:
    """Raise the remote's input-required/auth-required as an ask; the reply to send, or None when denied."""
    import asyncio

    timeout = ask_timeout(os.environ)
    if meta.deadline is not None:
        timeout = min(timeout, max(0.0, meta.deadline - time.time()))
    question = task.status_text() or f"the remote agent {remote} needs {task.state}"
    rule = f"A2A {task.state} from {remote}"
    channel = open_ask(meta, f"A2A:{task.state}", {"command": question}, rule, timeout=timeout, secrets_=secrets_)
    ask = channel.ask_id
    node_line(agent_dir, "A2AAsk", {"ask": ask, "state": task.state, "question": question}, secrets_)
    how = f"run 'spawn.py approve {ask} --text REPLY' or 'spawn.py deny {ask}' within {timeout:.0f} s"
    note(f"agent {meta.id}: {remote} asks: {question[:200]}; {how}")
    try:
        answer = await asyncio.to_thread(channel.wait, meta.id, timeout, secrets_)
    finally:
        channel.close()  # never left pending by a stop: denied, by timeout
    verdict, by = str(answer.get("verdict")), str(answer.get("by", "?"))
    node_line(agent_dir, "A2AAnswer", {"ask": ask, "verdict": verdict, "by": by}, secrets_)
    if verdict != "approve":
        state.denied_asks.append(f"ask {ask} ({rule}) denied by {by}")
        return None
    return str(answer.get("text") or "approved")


def names_another_kind(argv: Sequence[str]) -> bool:
    """Whether argv's --agent is an a2a or command reference: a run with nothing of the claude SDK to import."""
    values = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--agent"]
    values += [arg.removeprefix("--agent=") for arg in argv if arg.startswith("--agent=")]
    try:
        return any(node is not None and node.kind != "claude" for node in map(parse_reference, values))
    except UsageError:
        return False  # reported by the run's own resolution


# One class per agents.NODE_KINDS, in its order (definitions check a kind against
# that list, below this module).
EXECUTORS: dict[str, type[Executor]] = {"claude": ClaudeExecutor, "a2a": A2AExecutor, "command": CommandExecutor}


def executor_for(kind: str) -> Executor:
    if kind not in EXECUTORS:
        raise UsageError(f"unknown node kind {kind!r}; use one of {', '.join(EXECUTORS)} (this spawn.py is {__version__})")
    return EXECUTORS[kind]()
# ==================== end src/spawnlib/executors.py ====================

# ==================== begin src/spawnlib/resolving.py ====================



























































































































# ---------------------------------------------------------------- resolving --


@dataclass
class Inherited:
    """What the parent agent passes down: through env, checked against ancestry."""

    parent_id: str | None = None
    session: Path | None = None
    depth: int = -1  # the parent's depth; -1 when this is a root
    max_depth: int | None = None
    deadline: float | None = None
    budget: float | None = None
    tools: list[str] | None = None
    traceparent: str | None = None
    deny: list[str] = field(default_factory=list)
    ask: list[str] = field(default_factory=list)
    permission_mode: str | None = None
    model: str | None = None
    idle_timeout: float | None = None
    sandboxed: bool = False
    """The parent runs sandboxed: its children's requests come through its broker."""


def inherited_context(environ: Mapping[str, str], ancestry: Mapping[str, Any]) -> Inherited:
    """What this spawn inherits: the narrowest of its env, its ancestors' envs, and its runner.

    The nearest ancestor agent found by process identity (ancestry["runner"],
    from its meta.json) is the parent whenever there is one: its id and its
    session, whatever the environment claims. Every limit is the smallest
    any source gives, and the tools are those every source allows.
    """
    inh = Inherited()
    runner: Mapping[str, Any] = ancestry.get("runner") or {}
    env_depth = _int_or_none(environ.get(ENV_DEPTH))
    anc_depth = ancestry.get("depth")
    if env_depth is not None and (anc_depth is None or env_depth >= anc_depth):
        inh.depth = env_depth
        inh.parent_id = environ.get(ENV_AGENT_ID)
        inh.session = Path(environ[ENV_SESSION]) if environ.get(ENV_SESSION) else None
    elif anc_depth is not None:
        inh.depth = anc_depth
        inh.parent_id = ancestry.get("parent_id")
        inh.session = Path(ancestry["session"]) if ancestry.get("session") else None
    if runner:
        inh.parent_id = runner["parent_id"]
        inh.session = Path(runner["session"])
        inh.depth = max(inh.depth, int(runner["depth"]))
    inh.max_depth = min_known(_int_or_none(environ.get(ENV_MAX_DEPTH)), ancestry.get("max_depth"), runner.get("max_depth"))
    inh.deadline = min_known(float_or_none(environ.get(ENV_DEADLINE)), ancestry.get("deadline"), runner.get("deadline"))
    inh.budget = min_known(float_or_none(environ.get(ENV_BUDGET)), ancestry.get("budget"), runner.get("budget"))
    tool_sets: list[set[str]] = []
    if environ.get(ENV_TOOLS) is not None:
        tool_sets.append(set(environ[ENV_TOOLS].split(",")) - {""})
    for source in (ancestry, runner):
        if source.get("tools") is not None:
            tool_sets.append(set(source["tools"]))
    if tool_sets:
        inh.tools = sorted(set.intersection(*tool_sets))
    inh.traceparent = environ.get(ENV_TRACEPARENT) or environ.get("TRACEPARENT") or runner.get("traceparent")
    # Rules only accumulate: an agent can drop them from its own env, not from its ancestors'.
    for kind, name in (("deny", ENV_DENY), ("ask", ENV_ASK)):
        rules = set(_json_list(environ.get(name))) | set(ancestry.get(kind, [])) | set(runner.get(kind, []))
        setattr(inh, kind, sorted(rules))
    modes = [m for m in (environ.get(ENV_PERMISSION_MODE), ancestry.get("mode"), runner.get("mode")) if m in PERMISSION_RANK]
    inh.permission_mode = min(modes, key=lambda m: PERMISSION_RANK[m]) if modes else None
    inh.model = environ.get(ENV_MODEL) or runner.get("model")
    inh.sandboxed = runner.get("sandbox") in ("on", "inherited")
    idle = float_or_none(environ.get(ENV_IDLE_TIMEOUT))
    inh.idle_timeout = idle if idle is not None and 0 < idle < float("inf") else None
    return inh


# Clocks and float sums differ a little between the admission that wrote a
# record and the check of it; a widening worth refusing is larger than this.
ADMISSION_SLACK_S = 1.0
ADMISSION_SLACK_USD = 1e-6


def canonical_rules(texts: Iterable[str]) -> set[str]:
    """Rule texts as parse_rule spells them, so a record and an environment compare alike."""
    canonical = set()
    for text in texts:
        try:
            canonical.add(parse_rule(text).text)
        except SpawnError:
            canonical.add(text)
    return canonical


def admission_problem(meta: AgentMeta, inh: Inherited) -> str | None:
    """Why a registered agent's record is wider than admission under its verified parent allows; None if it is not.

    inh is what this process's own ancestry gives (inherited_context): the
    nearest registered runner above it, and the environments its ancestors
    were started with. That runner is the agent's parent, or an ancestor of
    it whose own parent ended meanwhile; limits only shrink down a tree, so
    an honest record is within them either way. A record written by anyone
    else (a forged meta.json, one changed after registration) must not
    choose its own limits: with no verified parent, the caller is a person
    or a CI job starting a root, who may choose any.
    """
    if inh.parent_id is None and inh.depth < 0:
        return None
    # With no parent agent on this machine (one served to an A2A caller
    # elsewhere), the caller's depth and limits still bind it.
    if inh.parent_id is not None:
        if inh.session is not None and Path(meta.session) != inh.session:
            return f"its meta.json names session {meta.session}, but its parent runs in {inh.session}"
        if meta.parent_id is None:
            return f"its meta.json names no parent, but it runs under agent {inh.parent_id}"
    if meta.depth < inh.depth + 1:
        return f"its meta.json puts it at depth {meta.depth}, above its parent at depth {inh.depth}"
    wider: list[str] = []
    if inh.max_depth is not None and meta.max_depth > inh.max_depth:
        wider.append(f"max depth {meta.max_depth} > {inh.max_depth}")
    if inh.tools is not None and (extra := sorted(set(meta.tools) - set(inh.tools))):
        wider.append(f"tools {','.join(extra)} its parent lacks")
    if inh.deadline is not None and (meta.deadline is None or meta.deadline > inh.deadline + ADMISSION_SLACK_S):
        wider.append("a later deadline")
    if inh.budget is not None and (meta.max_budget_usd is None or meta.max_budget_usd > inh.budget + ADMISSION_SLACK_USD):
        wider.append(f"a budget of {meta.max_budget_usd} > {inh.budget}")
    for kind, texts in (("deny", inh.deny), ("ask", inh.ask)):
        if missing := sorted(canonical_rules(texts) - canonical_rules(meta.permissions.get(kind, []))):
            wider.append(f"no {kind} rule {missing[0]}")
    mode, parent_mode = meta.permission_mode, inh.permission_mode
    if parent_mode in PERMISSION_RANK and PERMISSION_RANK.get(mode or "", 99) > PERMISSION_RANK[parent_mode]:
        wider.append(f"permission mode {mode} > {parent_mode}")
    return f"its meta.json is wider than its parent allows: {'; '.join(wider)}" if wider else None


def read_task(args: argparse.Namespace) -> str:
    if args.task is not None and args.task_file is not None:
        raise UsageError("give --task or --task-file, not both")
    if args.task_file is not None:
        if args.task_file == "-":
            task = sys.stdin.read()
        else:
            try:
                task = Path(args.task_file).read_text()
            except OSError as exc:
                raise UsageError(f"can't read --task-file {args.task_file}: {exc.strerror}; check the path") from None
            except UnicodeDecodeError:
                raise UsageError(f"--task-file {args.task_file} is not UTF-8 text") from None
    else:
        task = args.task or ""
    if not task.strip():
        raise UsageError("the task is empty; pass --task TEXT or --task-file PATH ('-' for stdin)")
    try:
        task.encode()  # argv bytes that aren't UTF-8 arrive as lone surrogates
    except UnicodeEncodeError:
        raise UsageError("the task is not valid UTF-8 text; fix its encoding or pass it with --task-file") from None
    return task


# Schemas of spawn.py's own records in schemas/: not output schemas for an agent,
# so neither listed as such nor built into spawn.py (tools/bundle.py reads this).
RECORD_SCHEMAS = frozenset(
    {
        "ask", "ask-answer", "ask-attempt", "broker-reply", "broker-request", "dag-journal-line", "forkserver-line", "heartbeat",
        "kill", "ledger-line", "limits", "meta", "native-line", "outcome", "paused", "session", "state", "status", "transcript-line",
    }
)  # fmt: skip


def load_schema(value: str) -> tuple[dict[str, Any], str]:
    """A schema from NAME (schemas/NAME.json beside the script, else built in), a path, or inline JSON."""
    text: str
    source: str
    stripped = value.strip()
    if stripped.startswith(("{", "[")):
        text, source = stripped, "inline"
    elif re.fullmatch(r"[A-Za-z0-9_.\-]+", stripped) and not stripped.endswith(".json"):
        path = SCHEMA_DIR / f"{stripped}.json"
        builtin = builtin_files("schemas")
        if path.is_file():
            text, source = path.read_text(), str(path)
        elif f"{stripped}.json" in builtin:
            text, source = builtin[f"{stripped}.json"], builtin_label(f"schemas/{stripped}.json")
        else:
            names = {p.stem for p in SCHEMA_DIR.glob("*.json") if p.stem not in RECORD_SCHEMAS} if SCHEMA_DIR.is_dir() else set()
            names |= {Path(name).stem for name in builtin}
            raise UsageError(f"unknown schema {stripped!r}; use one of {', '.join(sorted(names)) or '(none)'}, a path, or inline JSON")
    else:
        path = Path(stripped).expanduser()
        try:
            text, source = path.read_text(), str(path.resolve())
        except OSError as exc:
            raise UsageError(f"can't read schema {stripped}: {exc.strerror}; give a NAME, a path or inline JSON") from None
    return check_schema(load_input(text, f"schema {source}", "JSON"), source), source


def find_cli(environ: Mapping[str, str]) -> Path:
    """The claude CLI: $SPAWN_CLI, else the one bundled in the SDK wheel.

    Found without importing the SDK (importing it costs about a second).
    """
    if environ.get(ENV_CLI):
        path = Path(environ[ENV_CLI])
    else:
        import importlib.util

        spec = importlib.util.find_spec("claude_agent_sdk")
        if spec is None or spec.origin is None:
            raise UsageError("claude-agent-sdk is not installed; run with 'uv run spawn.py' or pip install claude-agent-sdk")
        path = Path(spec.origin).parent / "_bundled" / ("claude.exe" if os.name == "nt" else "claude")
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise UsageError(f"claude CLI not found at {path}; reinstall claude-agent-sdk or set {ENV_CLI}")
    return path


def check_credentials(environ: Mapping[str, str]) -> None:
    # ANTHROPIC_BASE_URL is not among them: a proxy or the mock model still
    # needs a key, and without one the CLI starts, then fails "Not logged in".
    names = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN",
             "CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX", "CLAUDE_CODE_USE_FOUNDRY")  # fmt: skip
    if any(environ.get(n) for n in names):
        return
    config = claude_config_dir(environ)
    if (config / ".credentials.json").is_file() or sys.platform == "darwin":  # macOS keeps them in the keychain
        return
    raise UsageError(
        "no credentials for the model; set ANTHROPIC_API_KEY, run 'claude login', "
        "or for offline runs set ANTHROPIC_BASE_URL to tools/mock_model.py and any ANTHROPIC_API_KEY"
    )


@dataclass
class Plan:
    """Everything a run needs, resolved before anything is written."""

    meta: AgentMeta
    inherited: Inherited
    refusal: str | None
    session_root: Path
    new_session: bool
    cli: Path
    secrets: list[str]
    limits: Limits = field(default_factory=Limits)
    """Tree-wide caps; written to limits.json when this spawn creates the session."""
    guard: tuple[int, int] | None = None
    """(pid, pipe) of the guard started for an agent this process runs."""
    rules: RuleSet = field(default_factory=RuleSet)
    """The effective rules, each with where it came from (for --dry-run)."""
    no_wait: bool = False
    """--no-wait: refused at once, not queued, when the tree is paused at its budget."""


def positive(name: str, value: float | None, integer: bool = False) -> None:
    """A count (>= 0) or an amount (> 0), checked like every other number."""
    maximum = MAX_COUNT if integer else MAX_SECONDS
    why = None if value is None else number_problem(name, value, maximum=maximum, integer=integer, zero_ok=integer)
    if why is not None:
        raise UsageError(why)


def check_run_input(args: argparse.Namespace, environ: Mapping[str, str]) -> list[str]:
    """Every number, path and trace a run was given, checked before anything starts.

    Bad flags are usage errors (exit 2, nothing written). Malformed SPAWN_*
    and TRACEPARENT variables come back as warnings: their readers ignore
    them, and an ignored limit is still bounded by the ancestry.
    """
    for flag, attr, maximum, integer, zero_ok in RUN_NUMBER_FLAGS:
        value = getattr(args, attr)
        why = None if value is None else number_problem(flag, value, maximum=maximum, integer=integer, zero_ok=zero_ok)
        if why is not None:
            raise UsageError(why)
    if args.parent_trace is not None and parse_traceparent(args.parent_trace) is None:
        raise UsageError(f"--parent-trace {args.parent_trace!r} is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)")
    if args.output:
        check_output_path(args.output)
    warnings = env_number_warnings(environ)
    for name in (ENV_TRACEPARENT, "TRACEPARENT"):
        value = environ.get(name)
        if value and parse_traceparent(value) is None:
            warnings.append(f"{name} {value[:80]!r} is not a W3C traceparent; ignored, a new trace is started")
    return warnings


def check_output_path(value: str) -> None:
    """--output must be a file we can write, known before the model is called and paid."""
    path = Path(value).expanduser()
    try:
        if path.is_dir():
            raise UsageError(f"--output {value} is a directory; give a file path")
        parent = path.resolve().parent
    except (OSError, RuntimeError) as exc:
        raise UsageError(f"--output {value} can't be resolved: {exc}") from None
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"--output {value} is not writable; give another path")
    # Missing directories are created when the output is written: the nearest
    # existing one must let us do that.
    existing = next(p for p in (parent, *parent.parents) if p.exists())
    if not existing.is_dir():
        raise UsageError(f"--output {value}: {existing} is not a directory; give another path")
    if not path.exists() and not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"--output {value}: directory {existing} is not writable; give another path")


def plan_run(args: argparse.Namespace, environ: Mapping[str, str], ancestry: Mapping[str, Any]) -> Plan:
    """Flags, environment and this process's ancestry -> the Plan that register and run_agent follow; nothing is written."""
    task = read_task(args)
    asked = asked_by_flags(args, environ)
    flag_rules = RuleSet(*([parse_rule(r, f"--{kind}") for r in getattr(args, kind) or []] for kind in PERMISSION_KINDS))
    input_warnings = check_run_input(args, environ)
    asked.system_prompt = read_system_prompt(args)
    cwd = Path(args.cwd).expanduser().resolve() if args.cwd else Path.cwd()
    if not cwd.is_dir():
        raise UsageError(f"--cwd {args.cwd} is not a directory")
    cli = find_cli(environ)
    # A reference (a2a:URL, an agent-card URL, command:EXE) names its node
    # directly; a NAME is a definition, which may itself say its kind.
    node = parse_reference(args.agent)

    inh = inherited_context(environ, ancestry)
    warnings: list[str] = input_warnings
    depth = inh.depth + 1
    definition, routing, yaml_problems = choose_definition(args.agent, task, cwd, environ) if node is None else (None, None, [])
    warnings += yaml_problems
    node = node or node_of_definition(definition)
    if not args.dry_run and node.kind == "claude":
        check_credentials(environ)  # only the claude kind calls the model from here
    asked = narrow_by_definition(definition, asked, flag_rules, warnings)
    system_prompt, requested_tools, disallowed = asked.system_prompt, asked.tools, asked.disallowed
    max_depth_arg, timeout, budget_arg = asked.max_depth, asked.timeout, asked.budget
    max_turns, background = asked.max_turns, asked.background
    model = choose_model(args, environ, definition, inh)
    schema_arg = args.schema or (definition.schema if definition else None)
    schema, schema_source = load_schema(schema_arg) if schema_arg else (None, None)
    rules = tree_rules(args, environ, cwd, inh=inh, definition=definition, flag_rules=flag_rules, warnings=warnings)
    mode = tree_mode(definition, inh, warnings)
    max_depth = narrow_to_inherited("--max-depth", max_depth_arg, inh.max_depth, "the tree's", warnings)
    max_depth = DEFAULT_MAX_DEPTH if max_depth is None else max_depth
    tools = tree_tools(requested_tools, definition, inh, warnings)
    budget = narrow_to_inherited("--max-budget-usd", budget_arg, inh.budget, "the parent's", warnings)
    on_budget = choose_on_budget(args, environ, ancestry, warnings)
    now = time.time()
    deadline = child_deadline(own_timeout(args, timeout, inh), inh.deadline, now)
    # A bad reference is exit 2 before anything is written; the check's time
    # (an A2A card's fetch) counts against the deadline.
    executor_for(node.kind).check(node, deadline)
    idle_timeout = min_known(args.idle_timeout if args.idle_timeout is not None else IDLE_TIMEOUT_S, inh.idle_timeout)

    refusal = refusal_for(depth, max_depth, deadline, now, requested_tools=requested_tools, tools=tools)
    sandbox, sandbox_refusal = choose_sandbox(
        args, node.kind, depth, max_depth, tools, is_root=inh.depth < 0, parent_sandboxed=inh.sandboxed, warnings=warnings
    )
    refusal = refusal or sandbox_refusal

    session_root, session = choose_session(args, environ, inh, warnings)
    trace = new_trace(args.parent_trace or inh.traceparent)
    topic = args.topic or task
    meta = AgentMeta(
        id="(assigned at registration)",
        parent_id=inh.parent_id,
        depth=depth,
        max_depth=max_depth,
        pid=0,
        create_time=0.0,
        pgid=0,
        trace_id=trace.trace_id,
        span_id=trace.span_id,
        parent_span_id=trace.parent_span_id,
        traceparent=trace.traceparent,
        task=task,
        tools=tools,
        disallowed_tools=disallowed,
        model=model,
        cwd=str(cwd),
        started_at=utc_now_iso(),
        session=str(session) if session else "(created at registration)",
        system_prompt=system_prompt if system_prompt is not None else ("" if args.preset else DEFAULT_SYSTEM_PROMPT),
        preset=args.preset,
        schema=schema,
        schema_source=schema_source,
        deadline=deadline,
        max_turns=max_turns,
        max_budget_usd=budget,
        idle_timeout_s=idle_timeout,
        on_budget=on_budget if on_budget != ON_BUDGET_DEFAULT else None,
        # Redacted before slugify lowercases it out of the secret's shape.
        topic=slugify(redact(topic, secret_values(environ)), 32),
        output_file=str(Path(args.output).expanduser().resolve()) if args.output else None,
        background=bool(background),
        routing=routing,
        permissions=rules.texts(),
        permission_mode=mode,
        sandbox=sandbox,
        warnings=warnings,
        kind=node.kind,
        endpoint=node.endpoint,
    )
    meta.placement = plan_placement(args, environ, ancestry, is_root=inh.depth < 0, kind=node.kind, warnings=warnings).as_record()
    if definition is not None:
        take_definition_settings(meta, definition)
    limits = Limits(budget_arg, args.max_agents, args.max_concurrent, args.confirm_over)
    warn_about_tree_limits(args, session is None, max_depth, warnings)
    return Plan(meta, inh, refusal, session_root, session is None, cli, secret_values(environ), limits, rules=rules, no_wait=args.no_wait)


def read_system_prompt(args: argparse.Namespace) -> str | None:
    """--system-prompt, or --system-prompt-file's text; None for neither."""
    system_prompt: str | None
    if args.system_prompt is not None and args.system_prompt_file is not None:
        raise UsageError("give --system-prompt or --system-prompt-file, not both")
    system_prompt = args.system_prompt
    if args.system_prompt_file is not None:
        try:
            system_prompt = Path(args.system_prompt_file).read_text()
        except OSError as exc:
            raise UsageError(f"can't read --system-prompt-file {args.system_prompt_file}: {exc.strerror}") from None
    return system_prompt


@dataclass
class AskedLimits:
    """What the flags ask for, before the tree narrows it: a definition's settings narrow these first."""

    system_prompt: str | None
    tools: list[str] | None
    disallowed: list[str]
    max_depth: int | None
    timeout: float | None
    budget: float | None
    max_turns: int | None
    background: bool | None


def narrow_by_definition(definition: AgentDefinition | None, asked: AskedLimits, flag_rules: RuleSet, warnings: list[str]) -> AskedLimits:
    """The flags' values as a definition narrows them (it can't be widened by them); flag_rules may lose its allow rules."""
    system_prompt, requested_tools, disallowed = asked.system_prompt, asked.tools, asked.disallowed
    max_depth_arg, timeout, budget_arg, max_turns, background = (
        asked.max_depth,
        asked.timeout,
        asked.budget,
        asked.max_turns,
        asked.background,
    )
    if definition is not None:
        # A definition's settings are defaults the flags override, but the
        # flags can't widen what it allows: tools, depth, time, budget, rules.
        system_prompt = system_prompt if system_prompt is not None else definition.prompt
        if definition.tools is not None:
            if requested_tools is not None:
                dropped = [t for t in requested_tools if t not in definition.tools]
                if dropped:
                    warnings.append(f"tools not in the {definition.name} definition were dropped: {','.join(dropped)}")
                requested_tools = [t for t in requested_tools if t in definition.tools]
            else:
                requested_tools = list(definition.tools)
        disallowed = list(dict.fromkeys([*definition.disallowed_tools, *disallowed]))
        max_depth_arg = min_known(max_depth_arg, definition.max_depth)
        timeout = min_known(timeout, definition.timeout)
        budget_arg = min_known(budget_arg, definition.max_budget_usd)
        max_turns = min_known(max_turns, definition.max_turns)
        if background is None:
            background = definition.background
        if isinstance(definition.effort, int):
            warnings.append(f"numeric effort {definition.effort} is not passed: the SDK takes low, medium, high, xhigh or max")
        if flag_rules.allow and definition.permissions.allow:
            warnings.append(f"--allow can't widen the {definition.name} definition's allow rules; ignored")
            flag_rules.allow = []
    return AskedLimits(system_prompt, requested_tools, disallowed, max_depth_arg, timeout, budget_arg, max_turns, background)


def tree_rules(
    args: argparse.Namespace,
    environ: Mapping[str, str],
    cwd: Path,
    *,
    inh: Inherited,
    definition: AgentDefinition | None,
    flag_rules: RuleSet,
    warnings: list[str],
) -> RuleSet:
    """The agent's permission rules: its definition's, the flags', the user's settings and the tree's inherited ones."""
    own = definition.permissions if definition else RuleSet()
    if definition is not None:
        own = RuleSet(*([dataclasses.replace(r, source=definition.path) for r in getattr(own, k)] for k in PERMISSION_KINDS))
    # A user's settings files bind the whole tree: its first agent on this
    # machine reads them (a root, or one served to a caller elsewhere, which
    # arrives with the caller's depth but no parent here), and their deny and
    # ask rules reach every child as inherited rules.
    first_here = inh.parent_id is None
    user = load_settings_rules(cwd, environ) if first_here and not args.no_settings else RuleSet()
    if args.no_settings and not first_here:
        warnings.append("--no-settings applies at the root only; the tree's rules still hold")
    inherited = [[parse_rule(t, "inherited from the parent") for t in texts] for texts in (inh.deny, inh.ask)]
    rules = RuleSet(
        allow=[*own.allow, *flag_rules.allow, *user.allow],
        deny=unique_rules([*own.deny, *flag_rules.deny, *user.deny, *inherited[0]]),
        ask=unique_rules([*own.ask, *flag_rules.ask, *user.ask, *inherited[1]]),
    )
    return rules


def warn_about_tree_limits(args: argparse.Namespace, is_root: bool, max_depth: int, warnings: list[str]) -> None:
    """The tree-wide limits' warnings: too few slots for the depth, or set below the root where they don't apply."""
    if is_root and args.max_concurrent is not None and args.max_concurrent <= max_depth:
        warnings.append(
            f"--max-concurrent {args.max_concurrent} is fewer than the {max_depth + 1} levels --max-depth {max_depth} allows: "
            "a parent lends its slot only while blocked in a foreground spawn or 'spawn.py wait'"
        )
    if not is_root and (args.max_agents is not None or args.max_concurrent is not None or args.confirm_over is not None):
        warnings.append("--max-agents, --max-concurrent and --confirm-over apply to a whole tree and are set by its root; ignored here")


def plan_placement(
    args: argparse.Namespace, environ: Mapping[str, str], ancestry: Mapping[str, Any], *, is_root: bool, kind: str, warnings: list[str]
) -> PlacementDecision:
    """Where this agent runs: --placement narrowed by what the tree allows, then decided.

    The parent's runner (its meta.json) is the authority, as for the other
    limits: an agent can unset SPAWN_PLACEMENT in its own Bash, not its record.
    """
    requested = parse_policy(args.placement) if args.placement else None
    if requested is None and is_root and environ.get(ENV_PLACEMENT):
        requested = parse_policy(environ[ENV_PLACEMENT], ENV_PLACEMENT)  # a user's default
    sources = [(environ.get(ENV_PLACEMENT), ENV_PLACEMENT), ((ancestry.get("runner") or {}).get("placement"), "the parent's placement")]
    inherited = None
    for text, source in sources:
        if isinstance(text, str) and text and not is_root:
            policy = parse_policy(text, source)
            inherited = policy if inherited is None else narrow_policy(policy, inherited)[0]
    policy, warning = narrow_policy(requested, inherited)
    if warning:
        warnings.append(warning)
    needs = process_needs(
        sandbox=args.sandbox == "on",
        own_cwd=args.cwd is not None,
        deadline=bool(args.timeout),
        budget=args.max_budget_usd is not None,
        kind=kind,
        cluster=policy.name == "ray",
    )
    decision = decide_placement(policy, needs, by_agent_tool=False, is_root=is_root)
    if not args.dry_run and decision.backend == "ray":
        ray_sibling_command(environ)  # a missing Ray sibling is exit 2 before anything is written
    return decision


def choose_on_budget(args: argparse.Namespace, environ: Mapping[str, str], ancestry: Mapping[str, Any], warnings: list[str]) -> str:
    """--on-budget, narrowed by what the tree runs under (pause may become fail, never the other way)."""
    on_budget, on_budget_warning = narrow_on_budget(args.on_budget, [environ.get(ENV_ON_BUDGET), ancestry_on_budget(ancestry)])
    if on_budget_warning:
        warnings.append(on_budget_warning)
    return on_budget


def asked_by_flags(args: argparse.Namespace, environ: Mapping[str, str]) -> AskedLimits:
    """What the flags ask for; args stays as parsed. (The system prompt is read after the other flags' checks.)"""
    requested_tools, disallowed = read_tool_flags(args, environ)
    # --timeout 0: no deadline of its own, explicitly.
    timeout: float | None = args.timeout or None
    return AskedLimits(None, requested_tools, disallowed, args.max_depth, timeout, args.max_budget_usd, args.max_turns, args.background)


def own_timeout(args: argparse.Namespace, timeout: float | None, inh: Inherited) -> float | None:
    """The agent's own timeout: a root given none gets the default; --timeout 0 keeps none."""
    if args.timeout is None and timeout is None and inh.depth < 0:
        return DEFAULT_ROOT_TIMEOUT_S
    return timeout


def choose_session(args: argparse.Namespace, environ: Mapping[str, str], inh: Inherited, warnings: list[str]) -> tuple[Path, Path | None]:
    """(where a new session goes, the tree's session if this agent has one)."""
    session_root = resolve_session_root(args.session, environ)
    # A child stays in its tree's session, whatever --session says: there it
    # shares the tree's limits file and ledger, and `kill` finds it.
    session = inh.session
    if session is not None and args.session:
        warnings.append(f"--session {args.session} ignored: this agent is registered in its tree's session {session}")
    return session_root, session


def read_tool_flags(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[list[str] | None, list[str]]:
    """(--tools, None for not given; --disallowed-tools), checked against the tools known."""
    catalogue = known_tools(environ) if args.tools or args.disallowed_tools else KNOWN_TOOLS  # with what the CLI reported
    requested_tools = parse_tools(args.tools, catalogue) if args.tools is not None else None
    disallowed = parse_tools(args.disallowed_tools, catalogue) if args.disallowed_tools else []
    return requested_tools, disallowed


def choose_model(args: argparse.Namespace, environ: Mapping[str, str], definition: AgentDefinition | None, inh: Inherited) -> str:
    """--model, else the definition's, else the default; "inherit" is the parent's; a tier name resolved."""
    model_name = args.model if args.model is not None else (definition.model if definition and definition.model else DEFAULT_MODEL)
    if model_name == "inherit":
        model_name = inh.model or DEFAULT_MODEL
    model_source = "--model" if args.model is not None else (f"the model of {definition.path}" if definition else "the model")
    model = resolve_model(model_name, parse_model_tiers(environ.get(ENV_MODEL_TIERS)), model_source)
    return model


def tree_tools(requested_tools: list[str] | None, definition: AgentDefinition | None, inh: Inherited, warnings: list[str]) -> list[str]:
    """The agent's tools: those asked for (or the parent's), with its definition's MCP servers, within the parent's."""
    tools = list(requested_tools) if requested_tools is not None else list(inh.tools or DEFAULT_TOOLS)
    if definition is not None:
        # A definition's MCP servers are granted whole unless it names their tools.
        tools += [f"mcp__{s}" for s in definition.mcp_servers if not any(t.startswith(f"mcp__{s}") for t in tools)]
    tools, dropped = narrow_tools(tools, inh.tools)
    if dropped:
        warnings.append(f"tools not held by the parent were dropped: {','.join(dropped)}")
    return tools


def choose_sandbox(
    args: argparse.Namespace,
    kind: str,
    depth: int,
    max_depth: int,
    tools: list[str],
    *,
    is_root: bool,
    parent_sandboxed: bool,
    warnings: list[str],
) -> tuple[str, str | None]:
    """(the sandbox, a refusal or None)."""
    sandbox_refusal = None
    # Inside a parent's sandbox an agent is held by it, whatever it asks.
    sandbox = "inherited" if inside_sandbox() else "off"
    if sandbox == "off" and kind == "claude":
        requested = args.sandbox
        if requested == "off" and parent_sandboxed:
            # A sandboxed parent's children come out of its sandbox only by its runner: never less held than auto.
            requested = "auto"
            warnings.append("--sandbox off raised to auto: the parent runs sandboxed")
        sandbox, sandbox_refusal = sandbox_choice(requested, depth, max_depth, tools, is_root=is_root, warnings=warnings)
    return sandbox, sandbox_refusal


def take_definition_settings(meta: AgentMeta, definition: AgentDefinition) -> None:
    """The settings a definition gives its agent as they are (its limits are narrowed with the flags', in plan_run)."""
    meta.agent = definition.name
    meta.agent_source = definition.path
    meta.mcp_servers = sorted(definition.mcp_servers)
    meta.skills = definition.skills
    meta.effort = definition.effort
    meta.initial_prompt = definition.initial_prompt
    meta.isolation = definition.isolation
    meta.memory = definition.memory
    meta.hooks = sorted(definition.hooks or {})


def tree_mode(definition: AgentDefinition | None, inh: Inherited, warnings: list[str]) -> str:
    """The permission mode: the definition's, within the tree's."""
    mode, mode_warning = narrow_mode(definition.permission_mode if definition else None, inh.permission_mode, is_root=inh.depth < 0)
    if mode_warning:
        warnings.append(mode_warning)
    return mode


def narrow_to_inherited(flag: str, requested: Any, inherited: Any, whose: str, warnings: list[str]) -> Any:
    """A limit: the inherited one when none was asked for, else the smaller, with a warning if lowered."""
    if inherited is None:
        return requested
    if requested is not None and requested > inherited:
        warnings.append(f"{flag} {requested} lowered to {whose} {inherited}")
    return inherited if requested is None else min(requested, inherited)


def sandbox_choice(
    requested: str, depth: int, max_depth: int, tools: Sequence[str], *, is_root: bool, warnings: list[str]
) -> tuple[str, str | None]:
    """The agent's sandbox (on or off) and, for --sandbox on where it can't run, the refusal.

    auto never refuses: where the platform has no working sandbox the agents
    it would sandbox run unsandboxed, each with the warning in its meta.json.
    The root says it once, on the person's stderr, for the tree below it (its
    descendants' stderr goes to their parents' Bash, not to the person).
    """
    if sandbox_wanted(requested, depth, max_depth, tools):
        problem = sandbox_problem()
        if problem is None:
            return "on", None
        if requested == "on":
            return "on", f"sandbox: --sandbox on, but Claude Code's sandbox can't run here: {problem}; or pass --sandbox auto or off"
        warnings.append(unsandboxed_warning(problem))
    elif requested == "auto" and is_root and depth < max_depth and "Bash" in tools and (problem := sandbox_problem()) is not None:
        warnings.append(unsandboxed_warning(problem))
    return "off", None


def refusal_for(
    depth: int, max_depth: int, deadline: float | None, now: float, *, requested_tools: Sequence[str] | None, tools: Sequence[str]
) -> str | None:
    """Why a resolved spawn may not run, or None."""
    if depth > max_depth:
        return f"depth limit: this agent would be at depth {depth}, the tree's max depth is {max_depth}"
    if deadline is not None and deadline <= now:
        return "deadline: the parent has no time left for a child"
    if requested_tools and not tools:
        return f"tools: none of {','.join(requested_tools)} is held by the parent"
    return None


def min_known(*values: Any) -> Any:
    known = [v for v in values if v is not None]
    return min(known) if known else None


def unique_rules(rules: Iterable[Rule]) -> list[Rule]:
    return list({r.text: r for r in rules}.values())


def choose_definition(
    name: str | None, task: str, cwd: Path, environ: Mapping[str, str]
) -> tuple[AgentDefinition | None, dict[str, Any] | None, list[str]]:
    """The definition --agent names, or the one routing picks for --agent auto, and
    its YAML's problems (read with the 'key: value' fallback), each as FILE:LINE: text."""
    if name is None:
        return None, None, []
    if not name.strip():
        raise UsageError("--agent is empty; name a definition (see 'spawn.py agents list'), or auto to route by description")
    definitions, problems = load_definitions(cwd, environ)
    routing = None
    if name == "auto":
        routing = route(task, definitions)
        chosen = definitions[routing["chosen"]] if routing["chosen"] else None
    elif name not in definitions:
        # A file of that name that didn't parse: its own error, with its line, says why.
        unreadable = [p for p in problems if p.severity == "error" and Path(p.path).stem == name]
        if unreadable:
            raise UsageError(f"{unreadable[0]}; fix the definition (see 'spawn.py agents lint')")
        raise UnknownAgentDefinitionError(name, [p for p, _ in agent_dirs_for(cwd, environ)], definitions)
    else:
        chosen = definitions[name]
    # A bad limit is left unset by the parser, and an unset limit is no limit:
    # running with it would widen what the definition meant to allow.
    numeric = {key for key, *_ in DEFINITION_NUMBERS}
    bad = [p for p in problems if chosen is not None and p.path == chosen.path and p.message.split(" ", 1)[0] in numeric]
    if bad:
        raise UsageError(f"{bad[0]}; fix the definition (see 'spawn.py agents lint')")
    yaml_problems = [str(p) for p in problems if chosen is not None and p.path == chosen.path and "bad YAML" in p.message]
    return chosen, routing, yaml_problems


def resolve_resume(args: argparse.Namespace, environ: Mapping[str, str]) -> AgentMeta:
    """The agent --resume names, after checking it can be continued; its settings become defaults.

    Tools and model default to the original's and can only narrow; the run
    stays in the original's cwd, where the CLI keeps the conversation.
    """
    caller_session = Path(environ[ENV_SESSION]) if environ.get(ENV_SESSION) else None
    agent_dir = find_agent_dir(args.resume, caller_session, resolve_session_root(args.session, environ))
    original = load_meta(agent_dir)
    outcome = read_outcome(agent_dir)
    if outcome is None:
        raise UsageError(f"agent {original.id} is still running; 'spawn.py wait {original.id}' first, then resume it")
    if not outcome.get("sdk_session_id"):
        raise UsageError(f"agent {original.id} has no SDK session to resume (status {outcome.get('status')}); start a new agent")
    if args.cwd is not None and Path(args.cwd).expanduser().resolve() != Path(original.cwd):
        raise UsageError(f"--resume runs in the original's cwd {original.cwd}; drop --cwd")
    args.cwd = original.cwd
    if args.tools is None:
        args.tools = ",".join(original.tools)  # narrowed to the original's in place_resumed
    args.model = args.model or original.model
    args.agent = args.agent or original.agent
    args.max_depth = min_known(args.max_depth, original.max_depth)
    # Its rules stay: a resumed agent may not do what the original was denied or had to ask.
    args.deny = [*(args.deny or []), *original.permissions.get("deny", [])]
    args.ask = [*(args.ask or []), *original.permissions.get("ask", [])]
    return original


def place_resumed(plan: Plan, original: AgentMeta) -> None:
    """A resumed agent sits under the original's parent in its session, unless an agent is the caller."""
    meta = plan.meta
    meta.resumed_from = original.id
    dropped = [t for t in meta.tools if t not in original.tools]
    if dropped:
        meta.warnings.append(f"tools the resumed agent didn't have were dropped: {','.join(dropped)}")
        meta.tools = [t for t in meta.tools if t in original.tools]
        if not meta.tools and plan.refusal is None:
            plan.refusal = f"tools: none of {','.join(dropped)} was held by the resumed agent {original.id}"
    if plan.new_session:
        plan.new_session = False
        meta.session, meta.parent_id, meta.depth = original.session, original.parent_id, original.depth
        meta.max_depth = min(meta.max_depth, original.max_depth)
        if plan.refusal and plan.refusal.startswith("depth limit"):
            plan.refusal = None


def register(plan: Plan, pid_info: tuple[int, float, int] | None) -> Path:
    """Create the session (for a root), admit the agent and write its meta.json.

    Admission and the new directory happen under the session lock, so two
    spawns racing for the last agent or the last dollar can't both get it.
    A spawn refused here gets plan.refusal set and its meta written at once.
    """
    meta = plan.meta
    if plan.refusal is None:
        runner_index_dir()  # a broken runner index fails the spawn before anything is written
    if plan.new_session:
        session = create_session_dir(plan.session_root, meta.topic or "agent", dt.datetime.now())
        write_json_atomic(session / LIMITS, record_to_json(plan.limits))
    else:
        session = Path(meta.session)
        if not (session / AGENTS_DIR).is_dir():
            raise StateError(f"session {session} does not exist; unset {ENV_SESSION} or pass --session DIR")
    meta.session = str(session)
    if plan.refusal is not None and not plan.new_session and not os.access(session / AGENTS_DIR, os.W_OK):
        # A sandboxed agent sees agents/ read-only (sandbox_writes); a spawner's spawns go through its runner instead.
        raise RefusedError(f"refused: {plan.refusal}; not recorded: the session directory is read-only here")
    if plan.refusal is None and not plan.new_session:
        plan.refusal = confirm_spawn(meta, session, plan.secrets)
    if plan.refusal is None and not plan.new_session:
        plan.refusal = wait_while_paused(session, meta.deadline, no_wait=plan.no_wait)
    with session_lock(session):
        if plan.refusal is None:
            plan.refusal = admit(meta, session)
        meta.id, agent_dir = create_agent_dir(session, meta.depth)
        if plan.refusal is None:
            reserve_budget(session, meta, plan.secrets)
    meta.containment = choose_containment(meta.parent_id is None, meta.session, meta.id, os.environ)
    if plan.refusal is not None and pid_info is None:
        pid_info = own_identity()
    if pid_info is not None:
        meta.pid, meta.create_time, meta.pgid = pid_info
        stamp_where(meta)
    if plan.new_session:
        info = SessionInfo(id=session.name, created_at=meta.started_at, topic=meta.topic or "", root_agent=meta.id)
        write_json_atomic(session / SESSION_INFO, redact_values(record_to_json(info), plan.secrets))
    if pid_info is not None:
        if plan.refusal is None:
            # The guard exists before the agent does: a SIGKILL right after
            # meta.json is published still leaves someone to settle it.
            plan.guard = start_guard(agent_dir)
            # Before meta.json: nothing this agent starts can predate its entry.
            register_runner(meta.pid, meta.create_time, agent_dir)
        write_meta(agent_dir, meta, plan.secrets)
    return agent_dir


def write_meta(agent_dir: Path, meta: AgentMeta, secrets_: Sequence[str]) -> None:
    data = redacted_json(record_to_json(meta), secrets_, indent=2)
    if not publish_once(agent_dir / META, data.encode()):
        raise StateError(f"{agent_dir / META} already exists; agent ids must be unique")


def wants_guard_above(argv: Sequence[str], environ: Mapping[str, str]) -> bool:
    """True for a run that will be a tree's root without a cgroup, on Linux.

    Checked first thing, before any thread starts, so it is cheap where it
    says no: a child's environment names its agent, and a cgroup is a quick look.
    """
    if environ.get(ENV_AGENT_ID) or not guard_above_possible():
        return False
    if {"--dry-run", "--background", "-h", "--help", "--version"} & set(argv):
        return False
    if choose_containment(True, "s", "a", environ, guard_above=False) != "subreaper":
        return False
    return inherited_context(environ, ancestry_context()).parent_id is None
# ==================== end src/spawnlib/resolving.py ====================

# ==================== begin src/spawnlib/forkserver.py ====================





































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
    if not isinstance(request.get("detach", False), bool):
        return "detach"
    return None


# A stand-in sends its whole request at once; a client still sending after
# this many seconds is dropped (it takes the normal path, if it is one).
FORKSERVER_REQUEST_S = 5.0
# Requests read at once; a client past them is closed unanswered (the normal path).
FORKSERVER_PENDING_MAX = 32


class PendingRequest:
    """A fork request being read: a 4-byte length, JSON, and the stdio fds (SCM_RIGHTS).

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
            data, fds, _flags, _addr = socket.recv_fds(self.conn, 1 << 16, 3)
        except BlockingIOError:
            return False
        self.fds += fds
        if len(self.fds) > 3:
            raise ValueError("more fds than stdio")
        if not data:
            raise ValueError("request cut short")
        self.data += data
        if len(self.data) < 4:
            return False
        length = int.from_bytes(self.data[:4], "big")
        if length > FORKSERVER_REQUEST_MAX or len(self.data) > 4 + length:
            raise ValueError("no request's length")
        return len(self.data) == 4 + length

    def request(self) -> dict[str, Any]:
        """The whole request, checked; ValueError for a malformed one (parse_json: deep is malformed)."""
        request = parse_json(bytes(self.data[4:]), FORKSERVER_REQUEST_MAX)
        if len(self.fds) != 3 or request_problem(request) is not None:
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

    psutil.Process  # noqa: B018  # imported at first use (standin.py): here, once for every child

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
        # The spawns this server forked, by pid: the stand-in each runs for. A
        # detached runner is forked only for one of them (its launcher), and for
        # that launcher's caller, who is checked while it still lives.
        self.launched: dict[int, tuple[int, float]] = {}
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
                self.drop(client)
            wait_s = min([FORKSERVER_POLL_S, *(c.deadline - now for c in self.pending.values())])
            for key, _events in self.selector.select(max(0.0, wait_s)):
                if key.fileobj is self.server:
                    self.admit()
                else:
                    self.read_from(self.pending[key.fileobj])

    def read_from(self, client: PendingRequest) -> None:
        try:
            whole = client.feed()
        except (OSError, ValueError):
            self.drop(client)
            return
        if whole:
            self.selector.unregister(client.conn)
            del self.pending[client.conn]
            with contextlib.suppress(OSError, ValueError, psutil.Error):
                self.serve(client)
            client.close()

    def drop(self, client: PendingRequest) -> None:
        # Closed unanswered: that client takes the normal path.
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
        if client_uid != os.getuid() or pid_namespace_of(client_pid) != self.namespace or len(self.pending) >= FORKSERVER_PENDING_MAX:
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
        caller, ancestry = None, None
        if refusal is None:
            caller, refusal = caller_in_tree(client_pid, self.launched, meta.session, detach=request.get("detach") is True)
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
                run_forked(conn, fds, request, client_pid, client_time, entry=entry)
            finally:
                os._exit(ExitCode.STATE)
        if request.get("detach") is not True:
            self.launched[pid] = (client_pid, client_time)
        line = {
            "time": utc_now_iso(),
            "pid": pid,
            "client_pid": client_pid,
            "verb": request["argv"][0] if request["argv"][:1] in (["_run"], ["wait"]) else "run",
        }
        if request.get("detach") is True:
            line["detached"] = True  # no stand-in: the pid is the runner's own (run_detached)
        with contextlib.suppress(OSError), open(Path(meta.session) / FORKSERVER_LOG, "a") as fh:
            fh.write(json.dumps(line) + "\n")


def caller_in_tree(
    client_pid: int, launched: Mapping[int, tuple[int, float]], session: str, *, detach: bool
) -> tuple[psutil.Process | None, str | None]:
    """(the process a request speaks for, None), or (None, why it is refused).

    The kernel names the client (SO_PEERCRED); a spawn this server forked
    speaks for the stand-in it runs for. The caller must run under a
    registered runner of this server's own session: anything else (another
    tree, a process that only sets SPAWN_SESSION) takes the normal path,
    where its own ancestry decides. Only the server's own forked launchers
    may ask for a detached runner.
    """
    if detach and client_pid not in launched:
        return None, "only a launcher this server forked may ask for a detached runner"
    caller_pid, caller_time = launched.get(client_pid, (client_pid, None))
    try:
        caller = psutil.Process(caller_pid)
        if caller_time is not None and abs(caller.create_time() - caller_time) >= 0.05:
            return None, "its caller is gone"
    except psutil.Error:
        return None, "its caller is gone"
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
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        if fd != target:
            os.close(fd)
    os.chdir(str(request["cwd"]))
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
# ==================== end src/spawnlib/forkserver.py ====================

# ==================== begin src/spawnlib/broker.py ====================
























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
BROKER_POLL_S = 0.1  # how often a runner looks into its agent's box; a spawn waits this long at most
BROKER_REQUEST_MAX_BYTES = 256 * 1024  # a request: argv (the task inline) and cwd
BROKER_ARGV_MAX = 200  # words in a request's argv
BROKER_RUNNING_MAX = 16  # requests a runner runs at once; more wait in the box
BROKER_REQUESTS_MAX = 1000  # requests a runner serves over its life; later ones are refused
BROKER_STDOUT_MAX_BYTES = 1024 * 1024  # what a reply carries of the child's stdout
BROKER_STDERR_MAX_BYTES = 64 * 1024  # and of its stderr (the end of it)
BROKER_CLIENT_POLL_S = 0.05  # how often the spawn.py in the sandbox looks for its reply
BROKER_TEMP_MAX_AGE_S = 60.0  # a writer's temp file older than this was abandoned: removed
BROKER_SEND_MAX_CHARS = 100_000  # a brokered message's text
REQUEST_NAME = re.compile(r"([0-9a-f]{16})\.json")
REPLY_SUFFIX = ".reply.json"

# The run path's flags a brokered spawn may pass, and whether each takes a
# value. Left out: what would let the child, running outside the sandbox,
# write or run where the agent's Bash can't (--output FILE, --cwd, --session,
# --resume, --no-settings, a definition or schema by path: the spawn.py in
# the sandbox inlines the files it reads), and root-only flags.
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
    "--print": False,
    "--traceback": False,
}
# Files the sandboxed spawn.py reads itself and passes inline: the runner
# must never read a path for the agent (it may read what the sandbox hides).
INLINED_FILES = {"--task-file": "--task", "--system-prompt-file": "--system-prompt"}
PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


def split_flag(word: str) -> tuple[str, str | None]:
    name, eq, value = word.partition("=")
    return name, (value if eq else None)


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
        if name == "--sandbox" and value == "off":
            value = "auto"
        out += [name] if value is None else [name, value]
        i += 1
    return out


def checked_request(data: Any, meta: AgentMeta) -> tuple[list[str], str] | str:
    """(argv to run, cwd) from a request in meta's agent's box, or why it is refused (pure but for the cwd's realpath).

    The cwd must be within the agent's own cwd or its scratch: the child's
    project (its definitions, its settings) is one the agent already works in.
    """
    if not isinstance(data, dict) or not isinstance(data.get("argv"), list) or not isinstance(data.get("cwd"), str):
        return "not a request: want an object with argv (a list of strings) and cwd"
    argv = data["argv"]
    if len(argv) > BROKER_ARGV_MAX or not all(isinstance(a, str) and "\0" not in a for a in argv):
        return f"argv must be at most {BROKER_ARGV_MAX} strings"
    cwd = os.path.realpath(data["cwd"]) if "\0" not in data["cwd"] else ""
    homes = [os.path.realpath(meta.cwd), os.path.realpath(Path(meta.session) / AGENTS_DIR / meta.id / SCRATCH_DIR)]
    if not any(cwd == h or cwd.startswith(h.rstrip("/") + "/") for h in homes) or not os.path.isdir(cwd):
        return f"cwd {data['cwd'][:200]!r} is outside the agent's working directory {meta.cwd}"
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
    checked = checked_run_argv(argv)
    if isinstance(checked, str):
        return checked
    problem = writable_definition_problem(checked, cwd, homes, os.environ)
    return problem if problem is not None else (checked, cwd)


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


def writable_definition_problem(argv: Sequence[str], cwd: str, homes: Sequence[str], environ: Mapping[str, str]) -> str | None:
    """Why the definition a brokered spawn names can't be run for a sandboxed agent, or None.

    A definition's hooks and MCP servers are commands the child's CLI runs
    outside any sandbox. One that lies where the agent may write (its cwd,
    its scratch) could be the agent's own: run, it would carry the agent's
    commands out of its sandbox. (--agent auto may pick any of them.)
    """
    names = [argv[i + 1] for i, word in enumerate(argv[:-1]) if word == "--agent"]
    if not names:
        return None
    definitions, _ = load_definitions(Path(cwd), environ)
    candidates = list(definitions.values()) if "auto" in names else [definitions[n] for n in names if n in definitions]
    for definition in candidates:
        real = os.path.realpath(definition.path)
        if (definition.hooks or definition.mcp_servers) and any(real == h or real.startswith(h.rstrip("/") + "/") for h in homes):
            return (
                f"definition {definition.name} ({definition.path}) has hooks or MCP servers and lies where this sandboxed agent "
                "can write: they would run outside its sandbox; keep such definitions outside the agent's working directory"
            )
    return None


# --------------------------------------------------------------- the server --


class Broker:
    """A runner's service to its sandboxed agent: the requests in its box, run as its own spawns."""

    def __init__(self, meta: AgentMeta, agent_dir: Path, descendants: Callable[[Path, str], Sequence[Path]]) -> None:
        """descendants: the agent directories below an agent, deepest first (cli_start's descendants_of, above this module)."""
        self.descendants = descendants
        self.meta = meta
        self.agent_dir = agent_dir
        self.box = Path(meta.session) / REQUESTS_DIR / meta.id
        self.served = 0
        self.stuck: set[str] = set()  # names in the box that could not be taken out
        self.running: dict[str, Any] = {}  # request id: the task that runs it

    def take(self) -> list[tuple[str, bytes | None]]:
        """The requests waiting in the box, each taken out (never read twice): (request id, its bytes or None if unreadable)."""
        try:
            names = sorted(os.listdir(self.box))
        except OSError:
            return []
        taken: list[tuple[str, bytes | None]] = []
        for name in names:
            if name.startswith("."):
                self.drop_abandoned(self.box / name)
                continue  # a writer's temp file
            if name.endswith(REPLY_SUFFIX) or name in self.stuck:
                continue  # a reply the agent has yet to read, or one already answered
            if len(self.running) + len(taken) >= BROKER_RUNNING_MAX:
                break
            path = self.box / name
            raw: bytes | None = None
            with contextlib.suppress(OSError, SpawnError, ValueError):
                fd, _ = open_regular(path, os.O_RDONLY | os.O_NOFOLLOW)
                try:
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
            taken.append((match[1], raw))
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

    def reply(self, request_id: str, exit_code: int, stdout: bytes = b"", stderr: bytes = b"") -> None:
        import json

        data = {
            "exit_code": int(exit_code),
            "stdout": stdout[:BROKER_STDOUT_MAX_BYTES].decode(errors="replace"),
            "stderr": stderr[-BROKER_STDERR_MAX_BYTES:].decode(errors="replace"),
        }
        # A fresh temp file (O_EXCL) then a rename: a link the agent planted at either name is replaced, never written through.
        with contextlib.suppress(OSError):
            write_file_atomic(self.box / f"{request_id}{REPLY_SUFFIX}", json.dumps(data).encode())

    def refuse(self, request_id: str, why: str) -> None:
        """Reply with a refusal, and say so on the runner's stderr."""
        note(f"warning: {self.meta.id}'s request {request_id} refused: {why}")
        self.reply(request_id, ExitCode.REFUSED, stderr=f"spawn: error: refused by the agent's runner: {why}\n".encode())

    def checked(self, request_id: str, raw: bytes | None) -> tuple[list[str], str] | None:
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
        verb = checked[0][0]
        if verb in BROKERED_VERBS:
            below = {d.name for d in self.descendants(Path(self.meta.session), self.meta.id)}
            ids = [word for word in checked[0][1 : 2 if verb == "send" else None] if AGENT_ID.fullmatch(word)]
            if outside := [i for i in ids if i not in below]:
                self.refuse(request_id, f"{verb}: {', '.join(outside)} not below {self.meta.id}")
                return None
        return checked

    async def run(self, request_id: str, argv: Sequence[str], cwd: str) -> None:
        """Run one request as a spawn.py of this runner's, with its agent's environment, and reply when it ends."""
        import asyncio

        env = {**os.environ, **child_environment(self.meta, self.agent_dir)}
        try:
            proc = await asyncio.create_subprocess_exec(
                env[ENV_PYTHON],
                env[ENV_SCRIPT],
                *argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own group, as a runner has
            )
        except OSError as exc:
            self.refuse(request_id, f"could not start spawn.py: {exc.strerror or exc}")
            return
        stdout, stderr = await proc.communicate()
        self.reply(request_id, proc.returncode if proc.returncode is not None else ExitCode.STATE, stdout, stderr)

    def done(self, request_id: str, _task: Any) -> None:
        self.running.pop(request_id, None)

    async def serve(self) -> None:
        """While the agent runs: take its requests as they come, and reply to each when its spawn.py ends."""
        import asyncio

        try:
            while True:
                for request_id, raw in self.take():
                    if (checked := self.checked(request_id, raw)) is not None:
                        task = asyncio.create_task(self.run(request_id, *checked))
                        self.running[request_id] = task
                        task.add_done_callback(functools.partial(self.done, request_id))
                await asyncio.sleep(BROKER_POLL_S)
        finally:
            for task in list(self.running.values()):
                task.cancel()
            # The agent is done with its box: what it left there (unread
            # replies, temp files, junk) goes with it. rmtree works by file
            # descriptor here, so a link planted inside is removed, never followed.
            shutil.rmtree(self.box, ignore_errors=True)


def has_broker(meta: AgentMeta) -> bool:
    return meta.sandbox == "on" and meta.depth < meta.max_depth


# --------------------------------------------------------------- the client --


def broker_box() -> Path | None:
    """Our sandbox's agent's request box, if we run inside a sandbox that has one we may write."""
    if not inside_sandbox():
        return None
    owner = sandbox_owner()
    if owner is None:
        return None
    try:
        session = load_meta(owner).session
    except (OSError, SpawnError, ValueError):
        return None
    box = Path(session) / REQUESTS_DIR / owner.name
    return box if os.access(box, os.W_OK) else None


def inlined_argv(argv: Sequence[str]) -> list[str]:
    """argv with the files it names read here, in the sandbox, and passed inline (INLINED_FILES, --schema PATH)."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        name, value = split_flag(argv[i])
        if name in (*INLINED_FILES, "--schema") and value is None and i + 1 < len(argv):
            i += 1
            value = argv[i]
        if name in INLINED_FILES and value is not None:
            try:
                text = sys.stdin.read() if value == "-" else Path(value).read_text()
            except (OSError, UnicodeDecodeError) as exc:
                raise RefusedError(f"can't read {name} {value}: {exc}; check the path") from None
            out += [INLINED_FILES[name], text]
        elif name == "--schema" and value is not None and not value.lstrip().startswith("{") and os.path.isfile(value):
            out += [name, Path(value).read_text()]
        else:
            out += [argv[i]] if value is None or "=" in argv[i] else [name, value]
        i += 1
    return out


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
    raise RefusedError(
        f"'spawn.py {verb}' writes the session, which this sandboxed agent sees read-only; a sandboxed agent spawns, waits, "
        "kills, sends and answers asks through its runner: run the tasks as spawns, or give this agent --sandbox off"
    )


def steering_argv(argv: Sequence[str]) -> list[str]:
    """A brokered verb's argv as its runner takes it: --session dropped (the runner's is the agent's), send's '-' read here."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        name, value = split_flag(argv[i])
        if name == "--session":
            i += 1 if value is not None else 2
            continue
        out.append(argv[i])
        i += 1
    if out[:1] == ["send"] and "-" in out[2:]:
        out[out.index("-", 2)] = sys.stdin.read()
    return out


def brokered(argv: Sequence[str], verbs: Sequence[str]) -> int | None:
    """Inside a sandboxed spawner: hand a spawn, a kill, a wait or a send to its runner, print its reply, and return its exit code.

    None where this spawn.py runs as usual: outside a sandbox, in one
    without a request box (a leaf's), and for every other verb (status and
    the like read the session, which is readable here). wait goes to the
    runner for the slot it lends while it blocks (--max-concurrent).
    """
    if not argv or {"-h", "--help", "--version"} & set(argv):
        return None
    if argv[0] in verbs and argv[0] not in BROKERED_VERBS:
        writes = argv[0] in UNBROKERED_WRITERS or (argv[0] == "dag" and len(argv) > 1 and argv[1] in UNBROKERED_DAG_ACTIONS)
        if (writes and "--dry-run" not in argv) or argv[0] in ("approve", "deny"):
            refuse_session_writer(argv)
        return None
    if argv[0] not in verbs and "--dry-run" in argv:
        return None
    box = broker_box()
    if box is None:
        return None
    import json

    request_id = token_hex(8)
    data = json.dumps({"argv": inlined_argv(argv) if argv[0] not in verbs else steering_argv(argv), "cwd": os.getcwd()}).encode()
    tmp = box / f".{request_id}.tmp"
    with open(tmp, "xb") as f:
        f.write(data)
    os.rename(tmp, box / f"{request_id}.json")
    reply_path = box / f"{request_id}{REPLY_SUFFIX}"
    owner = box.parents[1] / AGENTS_DIR / box.name
    while True:
        with contextlib.suppress(FileNotFoundError):
            reply = parse_json(reply_path.read_bytes(), BROKER_STDOUT_MAX_BYTES * 8)
            with contextlib.suppress(OSError):
                reply_path.unlink()
            sys.stdout.write(str(reply.get("stdout", "")))
            sys.stderr.write(str(reply.get("stderr", "")))
            return int(reply.get("exit_code", ExitCode.STATE))
        if read_outcome(owner) is not None:
            raise StateError(f"the runner of {box.name} ended before it answered request {request_id}")
        time.sleep(BROKER_CLIENT_POLL_S)
# ==================== end src/spawnlib/broker.py ====================

# ==================== begin src/spawnlib/cli_start.py ====================


















































































































# ------------------------------------------------------------ the CLI's start --


def heartbeat_interval(environ: Mapping[str, str]) -> float:
    value = float_or_none(environ.get(ENV_HEARTBEAT))
    return value if value is not None and value > 0 else HEARTBEAT_S


async def heartbeat_loop(agent_dir: Path, state: RunState, interval: float, idle_timeout: float | None = None) -> None:
    """Refresh heartbeat.json while the CLI is alive; a wedged agent stops beating."""
    import asyncio

    if state.cli_pid is None:
        # An event, not a poll: a runner can wait seconds for a start slot,
        # and each wake of a sleeping process costs ~0.1-0.3 ms of CPU on a VM.
        state.cli_started = asyncio.Event()
        await state.cli_started.wait()
    cli = state.cli_pid
    assert cli is not None
    if procfs_is_ours():
        try:
            create_time = psutil.Process(cli).create_time()
        except psutil.Error:
            return
        # Supervised.alive, not is_running() then status(): the CLI can exit
        # between the two, and the status call would raise out of this task.
        alive = Supervised(cli, create_time).alive
    else:  # in a sandbox: the CLI is our child, which the kernel answers for
        create_time, alive = time.time(), functools.partial(child_running, cli)
    while alive():
        beat = Heartbeat(cli, create_time, state.cli_pgid or cli, time.time(), interval, state.last_activity, idle_timeout)
        with contextlib.suppress(OSError):
            write_json_atomic(agent_dir / HEARTBEAT, record_to_json(beat))
        await asyncio.sleep(interval)


def cli_cpu_seconds(cli_pid: int) -> float:
    """CPU time used so far by the CLI and everything below it."""
    total = 0.0
    try:
        cli = psutil.Process(cli_pid)
        procs = [cli, *cli.children(recursive=True)]
    except psutil.Error:
        return total
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            times = proc.cpu_times()
            total += times.user + times.system
    return total


async def idle_watch(meta: AgentMeta, state: RunState, idle_timeout: float, stop: Callable[[Status, str], None]) -> None:
    """End the agent once its CLI has been idle for idle_timeout (no event, no CPU, no live child)."""
    import asyncio

    check = min(IDLE_CHECK_S, idle_timeout / 4)
    last_cpu: float | None = None
    while True:
        await asyncio.sleep(check)
        if state.cli_pid is None or (state.pause is not None and state.pause.is_paused):
            # Queued for a slot, the CLI starting, or paused at the budget: waiting, not stalled.
            state.last_activity = time.time()
            continue
        cpu = await asyncio.to_thread(cli_cpu_seconds, state.cli_pid)
        if last_cpu is not None and cpu - last_cpu > IDLE_CPU_SHARE * check:
            state.last_activity = time.time()
        last_cpu = cpu
        if time.time() - state.last_activity < idle_timeout:
            continue
        if await asyncio.to_thread(live_descendants, meta):
            state.last_activity = time.time()  # waiting on its children is work
            continue
        stop(Status.FAILED, f"stalled: no activity for {idle_timeout:g} s")
        return


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=False)


def create_worktree(cwd: Path, agent_dir: Path, agent_id: str) -> Path:
    """A fresh git worktree of cwd's repository on branch spawn/ID, for `isolation: worktree`."""
    path = agent_dir / "worktree"
    proc = _git(cwd, "worktree", "add", "-q", "-b", f"spawn/{agent_id}", str(path), "HEAD")
    if proc.returncode != 0:
        raise StateError(f"isolation: worktree needs a git repository with a commit at {cwd}: {proc.stderr.strip()}")
    # Keep the agent's place below the top, so relative paths in the task still mean the same.
    top = _git(cwd, "rev-parse", "--show-toplevel").stdout.strip()
    return path / cwd.resolve().relative_to(Path(top).resolve()) if top else path


def settle_worktree(cwd: Path, agent_dir: Path, agent_id: str) -> str | None:
    """Remove an unchanged worktree and its branch; keep a changed one. Returns the kept path."""
    path = agent_dir / "worktree"
    if not path.is_dir():
        return None
    status = _git(path, "status", "--porcelain")
    if status.returncode != 0 or status.stdout.strip() or _git(path, "rev-parse", "HEAD").stdout != _git(cwd, "rev-parse", "HEAD").stdout:
        return str(path)
    _git(cwd, "worktree", "remove", "--force", str(path))
    _git(cwd, "branch", "-D", f"spawn/{agent_id}")
    return None


def run_agent(
    agent_dir: Path,
    cli: Path,
    secrets_: Sequence[str],
    sdk_loader: SdkLoader | None = None,
    guard: tuple[int, int] | None = None,
    *,
    admitted: AgentMeta | None = None,
    entry: Entry,
) -> Outcome:
    """Run a registered agent to its one committed outcome.

    admitted: the record as admission checked it; the file is not read
    again, so nothing written there afterwards changes what runs.
    """
    meta = admitted or load_meta(agent_dir)
    executor = executor_for(meta.kind)
    state = RunState(in_process_tree(meta, agent_dir, secrets_, load_schema))
    started = time.time()
    guard_pid, guard_pipe, error, home_cwd = start_agent_run(
        meta, agent_dir, cli=cli, executor=executor, state=state, secrets_=secrets_, sdk_loader=sdk_loader, guard=guard, entry=entry
    )
    import asyncio  # loaded by now (start_agent_run)

    async def main_task() -> None:
        nonlocal error
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        def stop(status: Status, detail: str) -> None:
            if state.stop_reason is None:
                state.stop_reason, state.stop_detail = status, detail
                state.running_below = live_descendants(meta)
                stopping.append(asyncio.ensure_future(shut_down_agent(meta, state, task)))

        state.request_stop = stop

        stopping: list[asyncio.Future[None]] = []

        def on_signal(signum: int) -> None:
            stop(*stopped_by(signum, agent_dir))  # read at the signal: a kill leaves its reason just before

        for signum in STOP_SIGNALS:
            loop.add_signal_handler(signum, on_signal, signum)
        if EarlyStop.pending is not None:
            on_signal(EarlyStop.pending)
        if meta.deadline is not None:
            loop.call_at(loop.time() + max(0.0, meta.deadline - time.time()), stop, Status.TIMEOUT, "deadline reached")
        beat = asyncio.create_task(heartbeat_loop(agent_dir, state, heartbeat_interval(os.environ), meta.idle_timeout_s))
        idle = asyncio.create_task(idle_watch(meta, state, meta.idle_timeout_s, stop)) if meta.idle_timeout_s else None
        drops = asyncio.create_task(service) if (service := drop_box_service(meta, agent_dir, state, secrets_)) else None
        try:
            await wait_for_slot(meta, agent_dir, stop)
            if error is None:
                await executor.run(meta, agent_dir, cli, state, secrets_, sdk_loader=sdk_loader)
            # A node that ended while being stopped (a remote task that reports
            # itself canceled) waits for the stop to finish: its hooks, such as
            # the A2A cancel, still record what they did.
            if stopping:
                await asyncio.gather(*stopping)
        except asyncio.CancelledError:
            if state.stop_reason is None:
                raise
        except Exception as exc:  # the SDK's errors become a failed outcome
            error = executor.describe_error(exc, agent_dir)
            # -N: killed by signal N; 128+N: a shell's way of saying the same.
            state.cli_killed = getattr(exc, "exit_code", None) in (-signal.SIGTERM, -signal.SIGKILL, 143, 137)
        finally:
            beat.cancel()
            for watcher in (idle, drops):
                if watcher is not None:
                    watcher.cancel()
            # Closing the loop resets its signal handlers to the default
            # action: held back from here, a late stop signal (a parent
            # ending its subtree) can't end us before the outcome is written.
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)

    try:
        with contextlib.suppress(asyncio.CancelledError):
            asyncio.run(main_task())
    finally:
        EarlyStop.arm()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    return finish_agent_run(
        meta,
        agent_dir,
        executor=executor,
        state=state,
        started=started,
        error=error,
        home_cwd=home_cwd,
        guard=(guard_pid, guard_pipe),
        secrets_=secrets_,
    )


def start_agent_run(
    meta: AgentMeta,
    agent_dir: Path,
    *,
    cli: Path,
    executor: Executor,
    state: RunState,
    secrets_: Sequence[str],
    sdk_loader: SdkLoader | None,
    guard: tuple[int, int] | None,
    entry: Entry,
) -> tuple[int, int, str | None, Path]:
    """run_agent's start: the guard, the cgroup, the worktree, the node's start, the SDK's import, the fork server.

    (guard pid, guard pipe, the error that ends the run before it starts or None, the project's own cwd).
    """
    become_subreaper()
    guard_pid, guard_pipe = guard or start_guard(agent_dir)
    enter_tree_cgroup(meta)  # after the guard starts, so the guard stays outside
    error: str | None = None
    home_cwd = Path(meta.cwd)
    if meta.isolation == "worktree":
        try:
            meta.cwd = str(create_worktree(home_cwd, agent_dir, meta.id))  # this run only; meta.json keeps the project's
        except StateError as exc:
            error = exc.message
    if error is None:
        executor.start(meta, agent_dir, cli, state, secrets_)  # inside the cgroup, with the rest of the tree
    # Not at the top of the file (the verbs and --dry-run don't need it), and
    # not before the CLI's start: ~30 ms that a root's CLI would wait for.
    # Before the SDK's import thread, which then finds it loaded, and before
    # the fork server, which inherits it (and ssl with it) ready to serve.
    import asyncio  # noqa: F401

    if sdk_loader is not None:
        sdk_loader.start()
    if forkserver_wanted(meta, os.environ):
        start_forkserver(meta, sdk_loader, entry)  # after entering the cgroup: it ends with the tree
    return guard_pid, guard_pipe, error, home_cwd


def finish_agent_run(
    meta: AgentMeta,
    agent_dir: Path,
    *,
    executor: Executor,
    state: RunState,
    started: float,
    error: str | None,
    home_cwd: Path,
    guard: tuple[int, int],
    secrets_: Sequence[str],
) -> Outcome:
    """run_agent's end: end what the agent left, settle its descendants, commit its outcome, release the guard."""
    guard_pid, guard_pipe = guard
    # Whatever happened, nothing the agent started may outlive it.
    groups = [g for g in (state.cli_pgid,) if g]
    running_below = state.running_below if state.stop_reason else live_descendants(meta)
    end_own_subtree(groups, grace=KILL_GRACE_S if state.stop_reason else LEFTOVER_GRACE_S, spare=[guard_pid])
    settle_below(meta, state, secrets_, running_below)
    if has_drop_box(meta):
        record_dropped_refusals(meta, secrets_, DROPPED_REFUSALS_MAX - state.refusals_recorded, final=True)
    outcome = executor.outcome(meta, agent_dir, state, started, error)
    outcome.truncated = truncated_logs(agent_dir) or None
    if meta.isolation == "worktree":
        outcome.worktree = settle_worktree(home_cwd, agent_dir, meta.id)
    foreign = None
    if not commit_outcome(agent_dir, outcome, secrets_):
        asked_to_stop = state.stop_reason is not None or EarlyStop.pending is not None
        committed, foreign = outcome_committed_instead(agent_dir, outcome, secrets_, asked_to_stop=asked_to_stop)
        outcome = committed or outcome
    if owned_cgroup(meta) is None:
        # Outcome committed, subtree ended: nothing is left for the guard (see GUARD_SETTLED).
        with contextlib.suppress(OSError):
            os.write(guard_pipe, GUARD_SETTLED)
        os.close(guard_pipe)
    # With a tree cgroup, which holds us too, the pipe stays open until we
    # exit: only then does the guard wake and end that cgroup, so our summary
    # is never cut short, and an exiting process's status is already set.
    # (Moving out of the cgroup instead costs a cgroup migration, 10-30 ms.)
    if foreign is not None:
        raise foreign
    if meta.output_file and outcome.status == Status.DONE:
        write_output_file(Path(meta.output_file), outcome.output)
    return outcome


def settle_below(meta: AgentMeta, state: RunState, secrets_: Sequence[str], running_below: set[str]) -> None:
    """Every agent below an ending one gets its outcome: its in-process children
    first, from what its runner saw of them (nothing else knows they are gone)."""
    if state.in_process is not None:
        state.in_process.settle(state.stop_reason, state.stop_detail)
    settle_descendants(meta, secrets_, running_below)


async def shut_down_agent(meta: AgentMeta, state: RunState, task: Any) -> None:
    """Stop a running agent: child agents first, so they can record their own outcome; then our CLI.

    The CLI is frozen meanwhile, so the agent takes no further turn.

    The CLI kills its Bash commands hard when it is ended, and a child
    agent's spawn.py runs inside one. Cancelled without this, the SDK
    would also give the CLI 5 s to exit on its own, and a stopped agent
    must be gone well within its parent's grace.
    """
    import asyncio

    try:
        # Freeze the CLI (not its group, where child agents run): it
        # must not start another model turn while the children end.
        if state.cli_pid:
            Supervised.signal_pid(state.cli_pid, signal.SIGSTOP)
        children = []
        for d in descendants_of(Path(meta.session), meta.id):
            with contextlib.suppress(FileNotFoundError, SpawnError):
                child_meta = load_meta(d)
                child = Supervised.of(child_meta)
                if child_meta.id in state.running_below and child.signal(signal.SIGTERM):
                    children.append(child)
        # The SIGKILL half of the stop path comes after the CLI's end,
        # in end_own_subtree; until then the loop keeps serving signals.
        loop = asyncio.get_running_loop()
        limit = loop.time() + KILL_GRACE_S
        while loop.time() < limit and any(c.alive() for c in children):
            await asyncio.sleep(0.05)
        for hook in state.stop_hooks:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(hook(), KILL_GRACE_S)
        if state.cli_pgid:
            Supervised.signal_group(state.cli_pgid, signal.SIGTERM)
    finally:
        if state.cli_pid:
            Supervised.signal_pid(state.cli_pid, signal.SIGCONT)  # so it can act on the SIGTERM
        task.cancel()


async def wait_for_slot(meta: AgentMeta, agent_dir: Path, stop: Callable[[Status, str], None]) -> None:
    """Take a --max-concurrent slot, if the session has that limit."""
    import asyncio

    max_concurrent = read_limits(Path(meta.session)).max_concurrent
    if max_concurrent is not None:
        # Waits with the deadline and signal handlers armed, so a queued
        # agent can still be killed or time out with an outcome.
        limit = time.monotonic() + SLOT_WAIT_S
        while not try_take_slot(agent_dir, max_concurrent):
            if meta.deadline is None and time.monotonic() > limit:
                stop(Status.TIMEOUT, f"no --max-concurrent slot within {SLOT_WAIT_S:.0f} s")
            await asyncio.sleep(SLOT_POLL_S)


def outcome_committed_instead(
    agent_dir: Path, own: Outcome, secrets_: Sequence[str], *, asked_to_stop: bool
) -> tuple[Outcome | None, StateError | None]:
    """The outcome another writer committed first, which stands (a deadline, a
    parent's kill); or, when outcome.json is no outcome spawn.py committed for
    this agent, the error to end with.

    spawn.py commits for a live runner only after asking it to stop (a stop
    signal, then a grace): a runner never asked that loses the race lost it
    to something else, however well-formed the record (a sibling's Bash can
    forge one that passes for a kill). Either way this agent's own outcome is
    kept beside it in OUTCOME_KEPT and charged to the ledger, so what it found
    and spent is not lost. (The ledger counts an agent's first charge only:
    a winner spawn.py charged already is not charged twice.)
    """
    try:
        committed = read_outcome(agent_dir)
        why = "missing" if committed is None else outcome_problem(committed, own.id)
    except CorruptRecordError as exc:
        committed, why = None, exc.message
    if why is None and not asked_to_stop:
        why = f"nothing asked {own.id} to stop, so no spawn.py settled it"
    kept = agent_dir / OUTCOME_KEPT
    where = f"is kept in {kept}"
    if publish_once(kept, redacted_json(record_to_json(own), secrets_, indent=2).encode()):
        charge(agent_dir, own, secrets_)  # what it spent is spent, whoever wrote outcome.json
    else:
        where = f"could not be kept: {kept} exists too; its transcript is {agent_dir / TRANSCRIPT}"
    if committed is not None and why is None:
        winner = record_from_json(Outcome, committed)
        by = str(winner.committed_by)[:40]
        note(f"warning: {own.id}'s outcome.json was committed first by {by!r} ({winner.status}); its own outcome ({own.status}) {where}")
        return winner, None
    return None, StateError(
        f"{agent_dir / OUTCOME} was published by something other than spawn.py ({why}); {own.id}'s own outcome ({own.status}) {where}"
    )


def write_output_file(path: Path, output: Any) -> None:
    text = output if isinstance(output, str) else json.dumps(output, indent=2, ensure_ascii=False)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_file_atomic(path, (text + ("" if text.endswith("\n") else "\n")).encode())
    except OSError as exc:
        raise StateError(f"can't write --output {path}: {exc.strerror}; the result is in outcome.json") from None


def summary(agent_dir: Path, outcome: Mapping[str, Any]) -> dict[str, Any]:
    """The one bounded JSON object a parent reads from stdout."""
    out, truncated = truncate_for_stdout(outcome.get("output"), agent_dir / OUTCOME)
    data: dict[str, Any] = {
        "id": outcome.get("id") or agent_dir.name,
        "status": outcome.get("status"),
        "exit_code": outcome.get("exit_code"),
        "reason": outcome.get("reason"),
        "output": out,
    }
    if truncated:
        data["output_truncated"] = True
    if outcome.get("validation_errors"):
        data["validation_errors"] = outcome["validation_errors"][:20]
    if "cost_usd" in outcome:  # other nodes' costs come as their servers or commands wrote them
        cost = outcome["cost_usd"]
        data["cost_usd"] = round_usd(cost) if isinstance(cost, float) else cost
    if outcome.get("worktree"):
        data["worktree"] = outcome["worktree"]  # the changes to review and merge
    data["duration_s"] = outcome.get("duration_s")
    data["agent_dir"] = str(agent_dir)
    data["outcome"] = str(agent_dir / OUTCOME)
    data["transcript"] = str(agent_dir / TRANSCRIPT)
    return data


def launch_background(agent_dir: Path, plan: Plan) -> dict[str, Any]:
    """Start the runner detached; it is registered under its own pid."""
    # A session of its own: the launcher's caller (a Bash tool call, a CI
    # step) may end its process group as soon as the launcher returns.
    address = ray_address(plan.meta, os.environ)
    pid: int | None
    with open(agent_dir / RUNNER_LOG, "ab") as log:
        if address is not None:  # the stand-in (tools/ray_place.py) is the runner here; the agent runs on a node
            runner = [sys.executable, str(compiled_script())]
            pid, where = launch_on_ray(agent_dir, address, runner, log.fileno(), record_to_json(plan.meta))
            plan.meta.placement = {**(plan.meta.placement or {"reason": f"placement ray:{address}", "policy": f"ray:{address}"}), **where}
        else:
            # Forked by the session's fork server if this launcher was too.
            pid = fork_detached_runner(agent_dir, plan.meta.session, plan.meta.cwd, log.fileno())
        if pid is None:
            pid = subprocess.Popen(
                [sys.executable, str(compiled_script()), "_run", str(agent_dir)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                cwd=plan.meta.cwd,
            ).pid
    try:
        create_time = psutil.Process(pid).create_time()
    except psutil.Error:
        create_time = time.time()
    plan.meta.pid, plan.meta.create_time, plan.meta.pgid = pid, create_time, pid
    stamp_where(plan.meta)
    if address is None:  # a stand-in is no agent's process: the runner it starts on a node registers itself there
        # Before meta.json, which the runner waits for before it starts the agent.
        register_runner(pid, create_time, agent_dir)
    write_meta(agent_dir, plan.meta, plan.secrets)
    return {
        "id": plan.meta.id,
        "status": Status.RUNNING.value,
        "pid": pid,
        "agent_dir": str(agent_dir),
        "outcome": str(agent_dir / OUTCOME),
        "done_marker": str(agent_dir / DONE_MARKER),
        "fail_marker": str(agent_dir / FAIL_MARKER),
        "wait": f"{spawn_command()} wait {plan.meta.id}",
    }


def export_trace(meta: AgentMeta, environ: Mapping[str, str]) -> None:
    """Send the finished tree's spans to OTLP, when OTEL_EXPORTER_OTLP_ENDPOINT is set.

    Once per tree, by the root, whose outcome means its subtree is settled.
    The exporter runs in a process of its own with its own pinned
    dependencies, so no agent at any depth imports OpenTelemetry. A failed
    export is a note on stderr: it never changes the agent's outcome.
    """
    if meta.depth != 0 or not any(environ.get(name) for name in ENV_OTLP_ENDPOINTS):
        return
    import shutil

    exporter, uv = SCRIPT_DIR / OTEL_EXPORTER, shutil.which("uv")
    if uv is None or not exporter.exists():
        note(f"warning: no OpenTelemetry export: it needs uv on PATH and {OTEL_EXPORTER} beside spawn.py")
        return
    try:
        done = subprocess.run(
            [uv, "run", "--quiet", "--script", str(exporter), meta.session],
            env=dict(environ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            timeout=OTEL_EXPORT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        note(f"warning: OpenTelemetry export failed: {exc}")
        return
    if done.returncode != 0:
        note(f"warning: OpenTelemetry export failed: {done.stderr.strip()[-500:]}")


def refusal_outcome(meta: AgentMeta, reason: str) -> Outcome:
    return Outcome(
        id=meta.id,
        status=Status.REFUSED,
        reason=reason,
        exit_code=ExitCode.REFUSED,
        ended_at=utc_now_iso(),
        duration_s=0.0,
        warnings=meta.warnings,
    )


def record_refusal(agent_dir: Path, plan: Plan) -> Outcome:
    outcome = refusal_outcome(plan.meta, plan.refusal or "refused")
    commit_outcome(agent_dir, outcome, plan.secrets)
    return outcome


# A sandboxed leaf sees agents/ read-only (sandbox_writes), so the spawn.py it
# runs can't record a refused child there, and a hostile leaf can't forge its
# siblings' records. That spawn.py writes the refused child's meta into the
# leaf's drop box instead, and the leaf's runner, outside the sandbox, checks
# it and records it: while the leaf runs (once a second), when it ends, and,
# if the runner died, when the agent is settled.


def drop_refusal(plan: Plan) -> tuple[Path, Outcome, str] | None:
    """A spawn refused inside a sandboxed leaf: hand its record to the leaf's runner.

    (where the runner will record it, its outcome, the leaf's id), or None
    where agents/ is writable (the normal path records it). RefusedError
    when there is no drop box to write either.
    """
    meta = plan.meta
    session = Path(meta.session)
    if os.access(session / AGENTS_DIR, os.W_OK) or not inside_sandbox():
        return None
    owner = sandbox_owner()
    box = session / REFUSED_DIR / (owner.name if owner is not None else "")
    if owner is None or not os.access(box, os.W_OK):
        raise RefusedError(f"refused: {plan.refusal}; not recorded: the session directory is read-only here")
    meta.id = new_agent_id(meta.depth)
    meta.pid, meta.create_time, meta.pgid = own_identity()
    stamp_where(meta)
    reason = plan.refusal or "refused"
    data = redacted_json({"meta": record_to_json(meta), "reason": reason}, plan.secrets)
    if not publish_once(box / f"{meta.id}.json", data.encode()):
        raise StateError(f"{box / meta.id}.json already exists; agent ids must be unique")
    return session / AGENTS_DIR / meta.id, refusal_outcome(meta, reason), owner.name


def dropped_refusal(
    leaf: AgentMeta, name: str, raw: bytes, meta_schema: Mapping[str, Any], host_namespace: str | None
) -> tuple[AgentMeta, str] | str:
    """A refused child's meta and reason from a file in leaf's drop box, or what is wrong with it (pure).

    The leaf wrote it, so nothing in it is trusted: it must be a valid meta
    record of a child one level below, and what the leaf could not have been
    given by its own spawn.py (who the parent is, where it is, how deep, what
    tools and depth it may have) is set from the leaf's own meta.
    """
    match = re.fullmatch(r"(a(\d{1,4})-[0-9a-f]{6})\.json", name)
    if match is None or int(match[2]) != leaf.depth + 1:
        return f"{name}: not the record of a child at depth {leaf.depth + 1}"
    try:
        data = parse_json(raw)
    except ValueError:
        return f"{name}: not JSON"
    if not isinstance(data, dict) or not isinstance(data.get("reason"), str) or not isinstance(data.get("meta"), dict):
        return f"{name}: not a refused spawn's record"
    errors = validate_output(meta_schema, data["meta"])
    if errors:
        return f"{name}: not a meta record: {errors[0]}"
    try:
        meta = record_from_json(AgentMeta, data["meta"])
        started_timestamp(meta)
    except (TypeError, ValueError, AttributeError) as exc:
        return f"{name}: not a meta record: {exc}"
    meta.id, meta.session, meta.parent_id, meta.depth = match[1], leaf.session, leaf.id, leaf.depth + 1
    meta.max_depth = min(meta.max_depth, leaf.max_depth)
    meta.tools = [t for t in meta.tools if t in leaf.tools]
    meta.sandbox, meta.containment, meta.background = "inherited", None, False
    if meta.pid_namespace is None or meta.pid_namespace == host_namespace:
        # Its pid was the sandbox's (and is only what the leaf says): never one to look up or signal here.
        meta.pid_namespace = f"sandbox of {leaf.id}"
    return meta, data["reason"][:2000] or "refused"


def has_drop_box(meta: AgentMeta) -> bool:
    return meta.sandbox == "on" and meta.depth >= meta.max_depth


def record_dropped_refusals(leaf: AgentMeta, secrets_: Sequence[str], room: int = DROPPED_REFUSALS_MAX, *, final: bool = False) -> int:
    """Record the refused spawns in leaf's drop box, at most room of them; how many were recorded.

    Every file is taken out of the box, recorded or not: a file the leaf put
    there is never read twice, and one that isn't a refused child's record
    is named in a warning on stderr. final: nothing of the leaf runs any
    more, and the emptied box goes too.
    """
    session = Path(leaf.session)
    box = session / REFUSED_DIR / leaf.id
    try:
        names = sorted(os.listdir(box))
    except OSError:
        return 0
    recorded, schema = 0, None
    for name in names:
        path = box / name
        if name.startswith("."):
            if final:  # publish_once's temp file, left by a writer that died
                with contextlib.suppress(OSError):
                    path.unlink()
            continue  # publish_once's temp file, there only while it writes
        try:
            fd, _ = open_regular(path, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                raw = os.read(fd, DROPPED_REFUSAL_MAX_BYTES + 1)
            finally:
                os.close(fd)
        except (OSError, CorruptRecordError):
            raw = None
        with contextlib.suppress(OSError):
            path.unlink()
        if recorded >= room:
            note(f"warning: {leaf.id}'s refused spawn {name} not recorded: more than {DROPPED_REFUSALS_MAX} of them")
            continue
        if raw is None or len(raw) > DROPPED_REFUSAL_MAX_BYTES:
            note(f"warning: {leaf.id}'s drop box held {name}, not a refused spawn's record of at most {DROPPED_REFUSAL_MAX_BYTES} bytes")
            continue
        if schema is None:
            schema = json.loads((SCHEMA_DIR / "meta.json").read_text())
        found = dropped_refusal(leaf, name, raw, schema, own_pid_namespace())
        if isinstance(found, str):
            note(f"warning: {leaf.id}'s drop box: {found}; not recorded")
            continue
        meta, reason = found
        agent_dir = session / AGENTS_DIR / meta.id
        try:
            agent_dir.mkdir()
        except OSError as exc:
            note(f"warning: {leaf.id}'s refused spawn {meta.id} not recorded: {exc.strerror or exc}")
            continue
        write_meta(agent_dir, meta, secrets_)
        commit_outcome(agent_dir, refusal_outcome(meta, reason), secrets_)
        recorded += 1
    if final:
        with contextlib.suppress(OSError):
            box.rmdir()
    return recorded


def drop_box_service(meta: AgentMeta, agent_dir: Path, state: RunState, secrets_: Sequence[str]) -> Coroutine[Any, Any, None] | None:
    """What serves a sandboxed agent's drop box while it runs: a leaf's refused spawns, a spawner's requests (the broker)."""
    if has_drop_box(meta):
        return drop_box_loop(meta, state, secrets_)
    if has_broker(meta):
        return Broker(meta, agent_dir, descendants_of).serve()
    return None


async def drop_box_loop(leaf: AgentMeta, state: RunState, secrets_: Sequence[str]) -> None:
    """While a sandboxed leaf runs, record its refused spawns as they come."""
    import asyncio

    while True:
        await asyncio.sleep(DROP_BOX_POLL_S)
        state.refusals_recorded += record_dropped_refusals(leaf, secrets_, DROPPED_REFUSALS_MAX - state.refusals_recorded)


def agent_leftovers(agent_dir: Path, meta: AgentMeta) -> tuple[list[psutil.Process], list[int]]:
    """What is left of an agent: its spawn.py, its CLI, the CLI's descendants and group."""
    procs: list[psutil.Process] = []
    groups: list[int] = []
    if Supervised.of(meta).elsewhere():
        return procs, groups  # its pids, groups and environments name other processes here, or none
    if spawn_py := Supervised.of(meta).process():
        procs.append(spawn_py)
    with contextlib.suppress(FileNotFoundError, SpawnError, KeyError, TypeError, ValueError, psutil.Error):
        beat = read_json(agent_dir / HEARTBEAT)
        cli = Supervised(int(beat["cli_pid"]), float(beat["cli_create_time"])).process()
        if cli is not None:
            procs += [*reversed(cli.children(recursive=True)), cli]
            groups.append(int(beat["cli_pgid"]))
    seen = {p.pid for p in procs}
    procs += [p for p in processes_started_for(meta) if p.pid not in seen]
    return procs, groups


def processes_started_for(meta: AgentMeta) -> list[psutil.Process]:
    """Processes carrying the environment spawn.py gave this agent's CLI.

    Finds the CLI and what it started even when no heartbeat names it yet
    (spawn.py killed just as the CLI started) or their parent links are
    gone. Guards are left alone: each settles its own agent.
    """
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            env = proc.environ()
        except psutil.Error:
            continue
        if env.get(ENV_AGENT_ID) == meta.id and env.get(ENV_SESSION) == meta.session and not is_guard(proc):
            found.append(proc)
    return found


def last_text_in_transcript(agent_dir: Path) -> str | None:
    """The agent's last assistant text, so an outcome committed for it keeps it."""
    try:
        lines = read_text(agent_dir / TRANSCRIPT).splitlines()  # a child's file, read by whoever settles it
    except (OSError, SpawnError):
        return None
    for line in reversed(lines):
        with contextlib.suppress(ValueError, AttributeError):
            record = parse_json(line)
            if record.get("type") == "AssistantMessage":
                texts = [b["text"] for b in record["message"].get("content", []) if isinstance(b, dict) and b.get("text")]
                if texts:
                    return "\n".join(texts)
    return None


def settle_agents(verdicts: Sequence[tuple[Path, Status, str]], by: str, secrets_: Sequence[str]) -> list[str]:
    """End what is left of several agents at once, and commit an outcome for each without one.

    Live spawn.py processes are asked first (SIGTERM), all together: each ends
    its own subtree and commits its own outcome, keeping everything it knows.
    After the grace, what remains of them is killed and the outcome given
    here (agent dir, status, reason) is committed for agents that still have
    none. Returns the ids that had no outcome when called.
    """
    pending = [(d, load_meta(d), status, reason) for d, status, reason in verdicts if read_outcome(d) is None]
    asked = []
    for _, meta, _, _ in pending:
        if proc := Supervised.of(meta).signal(signal.SIGTERM):
            asked.append(proc)
    # spawn.py answers SIGTERM by ending its own subtree (up to KILL_GRACE_S)
    # and settling it; give it that twice over before taking its place.
    wait_gone(asked, KILL_GRACE_S * 2)
    still_running = {meta.id for _, meta, _, _ in pending if Supervised.of(meta).alive()}

    def commit(which: Callable[[AgentMeta], bool]) -> None:
        for d, meta, status, reason in pending:
            if not which(meta):
                continue
            started = started_timestamp(meta)
            outcome = Outcome(
                id=meta.id,
                status=status,
                reason=reason,
                exit_code=EXIT_FOR_STATUS[status],
                ended_at=utc_now_iso(),
                duration_s=round(max(0.0, time.time() - started), 3),
                text=last_text_in_transcript(d),
                transcript=str(d / TRANSCRIPT),
                committed_by=by,
            )
            if has_drop_box(meta) and meta.id not in still_running:
                record_dropped_refusals(meta, secrets_, final=True)  # its runner is gone, and whatever it ran
            commit_outcome(d, with_estimated_cost(outcome, d, meta.model), secrets_)

    # A spawn.py about to be SIGKILLed gets its outcome first, so its guard
    # finds it rather than recording the kill as a crash. The others are
    # committed after their leftovers are gone, so an outcome is never seen
    # while what the agent left still runs.
    commit(lambda meta: meta.id in still_running)
    procs: list[psutil.Process] = []
    groups: list[int] = []
    for d, meta, _, _ in pending:
        more_procs, more_groups = agent_leftovers(d, meta)
        procs += more_procs
        groups += more_groups
    if procs or groups:
        Supervised.stop(procs, groups, grace=LEFTOVER_GRACE_S)
    commit(lambda meta: meta.id not in still_running)
    return [meta.id for _, meta, _, _ in pending]


def live_descendants(meta: AgentMeta) -> set[str]:
    """Ids of the agents below meta whose process is running and have no outcome."""
    live = set()
    for d in descendants_of(Path(meta.session), meta.id):
        if (d / OUTCOME).exists():  # one stat: most children of an ending agent have finished
            continue
        with contextlib.suppress(FileNotFoundError, SpawnError):
            child = load_meta(d)
            if Supervised.of(child).alive():
                live.add(child.id)
    return live


def settle_descendants(meta: AgentMeta, secrets_: Sequence[str], ended: set[str]) -> None:
    """Before an agent commits, every agent below it has an outcome too.

    Its subtree has been ended; what has no outcome yet was ended by it
    before recording one (those in `ended`, alive when it began), died
    unseen, or escaped the process tree. So a parent's marker means its
    whole subtree is settled, and no child's result is left hanging.
    """
    verdicts = []
    for d in descendants_of(Path(meta.session), meta.id):
        if (d / OUTCOME).exists():  # settled already: no need to look at its process
            continue
        with contextlib.suppress(FileNotFoundError):
            child = load_meta(d)
            if Supervised.of(child).alive() or child.id in ended:
                verdicts.append((d, Status.KILLED, f"ended with its ancestor {meta.id}"))
            else:
                verdicts.append((d, Status.FAILED, f"process {child.pid} died without writing an outcome (found by {meta.id})"))
    settle_agents(verdicts, "parent", secrets_)


def descendants_of(session: Path, agent_id: str) -> list[Path]:
    """Agent directories below agent_id, deepest first."""
    parents: dict[str, tuple[str | None, int, Path]] = {}
    own = id_depth(agent_id)
    for d in iter_agent_dirs(session):
        # Every agent calls this as it ends: in a fan-out of N leaves, reading
        # every record each time was N x N reads. An id carries its depth
        # (new_agent_id), and nothing at or above an agent's depth is below it.
        # A directory named otherwise is read, whatever it claims.
        if own is not None and (depth := id_depth(d.name)) is not None and depth <= own:
            continue
        with contextlib.suppress(FileNotFoundError, SpawnError):
            meta = load_meta(d)
            parents[meta.id] = (meta.parent_id, meta.depth, d)
    found = []
    for aid, (_, depth, d) in parents.items():
        cursor: str | None = aid
        while cursor is not None and cursor in parents:
            cursor = parents[cursor][0]
            if cursor == agent_id:
                found.append((depth, d))
                break
    return [d for _, d in sorted(found, key=lambda x: -x[0])]
# ==================== end src/spawnlib/cli_start.py ====================

# ==================== begin src/spawnlib/verbs.py ====================






















































































# -------------------------------------------------------------------- verbs --


def parent_gone(session: Path, meta: AgentMeta) -> bool:
    """True if a live agent's parent agent has ended or died: it escaped its tree."""
    if meta.parent_id is None:
        return False
    parent_dir = session / AGENTS_DIR / meta.parent_id
    try:
        parent = load_meta(parent_dir)
    except (FileNotFoundError, SpawnError):
        return False
    return read_outcome(parent_dir) is not None or not Supervised.of(parent).alive()


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
        if lost := node_lost_reason(meta):
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


def wait_polls(environ: Mapping[str, str]) -> bool:
    """Whether wait must poll outcomes, not watch them: the user says inotify can't see the writers."""
    return environ.get(ENV_WAIT_POLL, "") not in ("", "0")


def wait_for_outcomes(agent_dirs: Sequence[Path], mode: str, timeout: float | None, secrets_: Sequence[str]) -> WaitResult:
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
    wait = OutcomeWait(agent_dirs, mode, timeout, secrets_)
    try:
        wait.run()
    finally:
        wait.close()
    return wait.result


class OutcomeWait:
    """wait_for_outcomes' state: what is still pending, and how each agent is watched (see there)."""

    def __init__(self, agent_dirs: Sequence[Path], mode: str, timeout: float | None, secrets_: Sequence[str]) -> None:
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
        self.events = MarkerEvents(enabled=len(pending) > WAIT_POLL_BATCH and not elsewhere and not wait_polls(os.environ))
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
# ==================== end src/spawnlib/verbs.py ====================

# ==================== begin src/spawnlib/options.py ====================
"""The run command's options: the argument parser of `spawn.py [flags] TASK`.

Below dag, whose task graphs' nodes take the same flags, and the CLI.
"""





















class Parser(argparse.ArgumentParser):
    """argparse with spawn's error format and exit code."""

    def error(self, message: str) -> NoReturn:
        hint = self.suggestion(message)
        raise UsageError(f"{message}{hint}{' ' if hint else '; '}see '{self.prog} --help'")

    def suggestion(self, message: str) -> str:
        """The close match to a mistyped flag or choice, as did_you_mean words it."""
        if message.startswith("unrecognized arguments: "):
            flags = [a.split("=", 1)[0] for a in message.removeprefix("unrecognized arguments: ").split() if a.startswith("--")]
            return did_you_mean(flags[0], self.long_flags()) if flags else ""
        if m := re.search(r"invalid choice: '(.*?)' \(choose from (.*)\)$", message):
            return did_you_mean(m[1], re.findall(r"'(.*?)'", m[2]))
        return ""

    def long_flags(self) -> list[str]:
        """Every --flag of this parser and of its sub-commands' (argparse reports theirs here)."""
        flags = [f for f in self._option_string_actions if f.startswith("--")]
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                flags += [f for sub in action.choices.values() for f in sub._option_string_actions if f.startswith("--")]
        return flags


EXIT_TABLE = """\
exit codes:
  0    success (every agent waited for is done)
  1    an agent failed (including schema-invalid output)
  2    bad usage or input; nothing was written
  3    session/state error (unwritable root, corrupt record)
  4    refused by a limit (depth, deadline, tools); recorded in the session
  124  timeout; the agent's subtree was ended
  130  interrupted (SIGINT); the subtree was ended
  143  killed (SIGTERM/SIGHUP or 'spawn.py kill'); the subtree was ended"""


def build_run_parser() -> Parser:
    p = Parser(
        prog="spawn.py",
        description=(
            "Run a Claude agent that can spawn child agents to any depth. "
            f"Verbs: {', '.join(v for v in VERBS if not v.startswith('_'))} (spawn.py VERB --help)."
        ),
        epilog=EXIT_TABLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"spawn.py {__version__}")
    task = p.add_argument_group("task")
    task.add_argument("--task", metavar="TEXT", help="the prompt")
    task.add_argument("--task-file", metavar="PATH", help="read the prompt from PATH ('-' for stdin)")
    task.add_argument("--topic", metavar="WORDS", help="names the session directory (default: the task's first words)")
    task.add_argument("--resume", metavar="AGENT_ID", help="continue a finished agent's conversation with --task, as a new agent beside it")
    agent = p.add_argument_group("agent")
    agent.add_argument(
        "--tools", metavar="A,B", help=f"tools the agent sees, auto-approved (default {','.join(DEFAULT_TOOLS)}; a child: its parent's)"
    )
    agent.add_argument("--disallowed-tools", metavar="A,B", help="tools removed from the agent, as in Claude Code")
    for kind, what in (
        ("allow", "allow calls matching RULE"),
        ("deny", "deny calls matching RULE"),
        ("ask", "ask before calls matching RULE"),
    ):
        agent.add_argument(f"--{kind}", action="append", metavar="RULE", help=f"{what}, e.g. 'Bash(git diff:*)' (repeatable)")
    agent.add_argument(
        "--model",
        metavar="TIER|ID",
        help=f"high-tier, medium-tier, low-tier or a model id (default {DEFAULT_MODEL}; tiers: ${ENV_MODEL_TIERS})",
    )
    agent.add_argument(
        "--agent", metavar="NAME|auto", help="use .claude/agents/NAME.md (project, then user, then built in); auto routes by description"
    )
    agent.add_argument(
        "--schema", metavar="NAME|PATH|JSON", help="JSON Schema for the output: schemas/NAME.json (else built in), a file, or inline JSON"
    )
    agent.add_argument("--output", metavar="FILE", help="also write the validated output (or final text) to FILE")
    agent.add_argument("--system-prompt", metavar="TEXT", help="replace the default short system prompt")
    agent.add_argument("--system-prompt-file", metavar="PATH", help="read the system prompt from PATH")
    agent.add_argument("--preset", choices=["claude_code"], help="use Claude Code's full system prompt and settings (costly at depth)")
    agent.add_argument(
        "--sandbox",
        choices=SANDBOX_CHOICES,
        default="auto",
        help="run the agent's Bash in Claude Code's sandbox (auto: for agents below the root that have Bash)",
    )
    agent.add_argument("--cwd", metavar="DIR", help="working directory of the agent")
    agent.add_argument(
        "--placement",
        metavar="local|inprocess|auto|ray:ADDRESS",
        help="where children run: own processes (local), inside the CLI as its subagents (inprocess), spawn.py's choice (auto); "
        "inherited, only narrows (default $SPAWN_PLACEMENT, else local)",
    )
    add_limit_flags(p)
    where = p.add_argument_group("session")
    where.add_argument("--session", metavar="DIR", help=f"session root (default ${ENV_SESSION_ROOT}, else sessions/ beside spawn.py)")
    where.add_argument("--parent-trace", metavar="TRACEPARENT", help="W3C traceparent to join (default $TRACEPARENT)")
    mode = p.add_argument_group("mode")
    mode.add_argument(
        "--background",
        action=argparse.BooleanOptionalAction,
        help="register, start detached, print the id and outcome paths, exit 0 (default: the definition's background)",
    )
    mode.add_argument("--no-settings", action="store_true", help="at the root: ignore the permission rules of Claude Code's settings files")
    mode.add_argument(
        "--print",
        choices=["id", "status", "output", "agent_dir", "outcome"],
        help="print only this field of the result, as plain text (e.g. A=$(spawn.py --background --print id ...))",
    )
    mode.add_argument("--dry-run", action="store_true", help="print the resolved options as JSON; call nothing, write nothing")
    mode.add_argument("--traceback", action="store_true", help="on an error, show the Python traceback (for bug reports)")
    return p


def add_limit_flags(p: Parser) -> None:
    """The limits group: what a child never gets more of than its parent has left."""
    limits = p.add_argument_group("limits (a child never gets more than its parent has left)")
    limits.add_argument(
        "--max-depth", type=int, metavar="N", help=f"deepest depth the tree may reach; root is 0 (default {DEFAULT_MAX_DEPTH})"
    )
    limits.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help=f"deadline for this agent and its subtree (root default {DEFAULT_ROOT_TIMEOUT_S:g}; 0: none)",
    )
    limits.add_argument(
        "--idle-timeout",
        type=float,
        metavar="SECONDS",
        help=f"end the agent as stalled after this long with no transcript event and no CPU use (default {IDLE_TIMEOUT_S:g})",
    )
    limits.add_argument("--max-turns", type=int, metavar="N", help="maximum agent turns")
    limits.add_argument(
        "--max-budget-usd", type=float, metavar="X", help="spending limit in USD; at the root, one budget for the whole tree"
    )
    limits.add_argument(
        "--on-budget",
        choices=["fail", "pause"],
        help="at its hold: fail (default), or pause until 'spawn.py budget SESSION --raise USD' (inherited; only narrows to fail)",
    )
    limits.add_argument("--no-wait", action="store_true", help="in a tree paused at its budget: be refused (exit 4) rather than wait")
    limits.add_argument("--max-agents", type=int, metavar="N", help="root only: agents the whole session may register")
    limits.add_argument("--max-concurrent", type=int, metavar="N", help="root only: agents running at once; more wait for a slot")
    limits.add_argument(
        "--confirm-over",
        type=float,
        metavar="USD",
        help="root only: a spawn that would take the tree's projected spend past USD asks first (spawn.py approve|deny)",
    )


WORKFLOW_VERBS = ("plan", "build", "explore", "run-plan-build", "run-all", "state")


VERBS = (
    *("wait", "status", "kill", "reap", "approve", "deny", "send", "budget", "agents", "dag", "estimate"),
    *WORKFLOW_VERBS,
    *("_run", "_guard"),
)
# ==================== end src/spawnlib/options.py ====================

# ==================== begin src/spawnlib/dag.py ====================







































































# ------------------------------------------------ task graphs and workflows --
# `dag run FILE` registers itself as an agent node ("dag") and starts every
# task as a background child of that node, through spawn.py's own CLI, so
# limits, asks, status, kill and the timeline apply to tasks as to any agent.
# The pure part (parse, check, levels, templating) is testable without processes.

DAG_TASK_KEYS = frozenset({"id", "task", "blockedBy", "retries"})
DAG_FLAG_OPTIONS = frozenset({"task", "task_file", "background", "dry_run", "session", "output", "help", "version", "traceback"})
DAG_VAR = re.compile(r"\{\{\s*var\.([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
DAGS_DIR = "dags"  # journals: SESSION/dags/<runner id>.jsonl
DAG_POLL_S = 0.05  # how often the runner looks for new outcomes
ON_FAIL = ("ask", "skip", "abort")  # --on-fail: what is done with a task that failed once its retries are used


@dataclass
class DagTask:
    """One resolved task of a graph: its prompt, its blockers and its spawn options."""

    id: str
    task: str
    blocked_by: list[str]
    options: dict[str, Any]
    retries: int | None = None
    """How many times a failed run of it is started again before --on-fail applies; None: --retries, else 0."""


def spawn_option_names(parser: argparse.ArgumentParser | None = None) -> set[str]:
    """Option names a DAG may set: every run flag's dest except the ones the runner owns."""
    return {a.dest for a in (parser or build_run_parser())._actions} - DAG_FLAG_OPTIONS


DagPath = tuple[str | int, ...]
"""Where in a graph document: ("tasks", 2, "blockedBy", 0) is task #3's first blocker."""


class DagProblems(UsageError):
    """Every problem of a graph file at once (exit 2), one `spawn: error: FILE:LINE: ...` line each.

    main() prints `spawn: error: ` before the message; the lines after the
    first carry their own, so a file with four problems takes one run to see them.
    """

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\nspawn: error: ".join(self.problems))


def meant(word: str, choices: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the closest choice, or '': an aside inside a problem's sentence."""
    match = close_match(word, choices)
    return f" (did you mean {match!r}?)" if match else ""


def document_lines(text: str) -> dict[DagPath, int]:
    """The 1-based line of every mapping, key and sequence item of a YAML (or JSON) document, by its path.

    Composed again, after load_input took the data, by the same bounded
    loader: JSON is YAML too, so one walk gives lines for both. A document
    the composer refuses gives no lines (load_input has said why already).
    """
    import yaml

    loader = bounded_yaml_loader()(text)
    try:
        root = loader.get_single_node()
    except (yaml.YAMLError, RecursionError):
        return {}
    finally:
        loader.dispose()
    lines: dict[DagPath, int] = {}
    seen: set[int] = set()

    def walk(node: Any, path: DagPath) -> None:
        if node is None or id(node) in seen:
            return  # an alias: its anchor's lines stand; walked once, however often it is named
        seen.add(id(node))
        lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    lines[(*path, key.value)] = key.start_mark.line + 1
                    walk(value, (*path, key.value))
        elif isinstance(node, yaml.SequenceNode):
            for n, item in enumerate(node.value):
                walk(item, (*path, n))

    walk(root, ())  # nested at most JSON_MAX_DEPTH deep: the loader refused deeper
    return lines


def undefined_vars(value: Any, variables: Mapping[str, str]) -> list[str]:
    """Names of the {{var.x}} in value (every string in it) that variables lacks, in order, once each."""
    if isinstance(value, str):
        return list(dict.fromkeys(m.group(1) for m in DAG_VAR.finditer(value) if m.group(1) not in variables))
    if isinstance(value, list | dict):
        parts = value.values() if isinstance(value, dict) else value
        return list(dict.fromkeys(name for v in parts for name in undefined_vars(v, variables)))
    return []


def fill_vars(value: Any, variables: Mapping[str, str]) -> Any:
    """{{var.x}} replaced in every string of value; an undefined one stays (undefined_vars reports it)."""
    if isinstance(value, str):
        return DAG_VAR.sub(lambda m: variables.get(m.group(1), m.group(0)), value)
    if isinstance(value, list):
        return [fill_vars(v, variables) for v in value]
    if isinstance(value, dict):
        return {k: fill_vars(v, variables) for k, v in value.items()}
    return value


def find_cycle(edges: Mapping[str, Sequence[str]]) -> list[str] | None:
    """A cycle of the blockedBy graph as [a, b, ..., a], or None."""
    color: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        color[node] = 1
        stack.append(node)
        for nxt in edges.get(node, ()):
            if color.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in color and (found := visit(nxt)):
                return found
        stack.pop()
        color[node] = 2
        return None

    for node in edges:
        if node not in color and (found := visit(node)):
            return found
    return None


def dag_levels(tasks: Sequence[DagTask]) -> list[list[str]]:
    """Tasks grouped by level: a task's level is one more than its deepest blocker's."""
    level: dict[str, int] = {}
    by_id = {t.id: t for t in tasks}

    def depth(tid: str) -> int:
        if tid not in level:
            level[tid] = 1 + max((depth(b) for b in by_id[tid].blocked_by), default=-1)
        return level[tid]

    out: list[list[str]] = [[] for _ in range(1 + max((depth(t.id) for t in tasks), default=-1))]
    for t in tasks:
        out[level[t.id]].append(t.id)
    return out


def retries_ok(value: Any) -> bool:
    """Is a `retries:` value usable: absent, or a whole number >= 0?"""
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)


class DagChecker:
    """Resolves a graph document's tasks and collects every problem, each at its line, instead of stopping at the first."""

    def __init__(self, source: str, lines: Mapping[DagPath, int], variables: Mapping[str, str]) -> None:
        self.source, self.lines, self.variables = source, lines, variables
        self.problems: list[tuple[int, str]] = []  # (line, text): reported in the file's order
        self.parser = build_run_parser()
        self.allowed = spawn_option_names(self.parser)

    def problem(self, where: DagPath, what: str) -> None:
        """Note a problem at where's line (or its nearest enclosing node's)."""
        line = next((self.lines[where[:n]] for n in range(len(where), -1, -1) if where[:n] in self.lines), None)
        self.problems.append((line or 0, f"{self.source}:{line}: {what}" if line else f"{self.source}: {what}"))

    def filled(self, value: Any, where: DagPath, name: str) -> Any:
        for var in undefined_vars(value, self.variables):
            self.problem(where, f"{name}: undefined variable {{{{var.{var}}}}}; define it under 'vars:' or pass --var {var}=VALUE")
        return fill_vars(value, self.variables)

    def options(self, raw: Mapping[str, Any], where: DagPath, name: str) -> dict[str, Any]:
        """A task's (or the defaults') spawn options, vars filled; unknown ones reported with the closest name."""
        opts: dict[str, Any] = {}
        for key, value in raw.items():
            if key in DAG_TASK_KEYS:
                continue
            opt = str(key).replace("-", "_")
            if opt not in self.allowed:
                near = meant(opt, self.allowed).replace("_", "-") if "-" in str(key) else meant(opt, self.allowed)
                self.problem((*where, key), f"{name}: unknown option {key!r}{near}; use spawn.py's flag names (spawn.py --help)")
                continue
            opts[opt] = self.filled(value, (*where, key), name)
        if not retries_ok(raw.get("retries")):
            self.problem((*where, "retries"), f"{name}: 'retries:' must be a whole number >= 0, got {raw.get('retries')!r}")
        return opts

    def flags_parse(self, task: DagTask, where: DagPath) -> None:
        """Report option values spawn.py's own parser refuses (a word for --max-turns, ...), as it would at the start."""
        try:
            self.parser.parse_args(dag_argv(task, task.task))
        except UsageError as exc:
            self.problem(where, f"task {task.id!r}: {exc.message}")

    def task(self, raw: Any, n: int, base: Mapping[str, Any], seen: Mapping[str, int]) -> DagTask | None:
        """Task #n+1 resolved, or None when it has no usable id; its other problems are noted."""
        where: DagPath = ("tasks", n)
        if not isinstance(raw, dict) or not isinstance(raw.get("id"), str) or not raw["id"]:
            at = (*where, "id") if isinstance(raw, dict) and "id" in raw else where
            self.problem(at, f"task #{n + 1} needs an 'id:' string; add 'id: NAME'")
            return None
        name = f"task {raw['id']!r}"
        if raw["id"] in seen:
            self.problem((*where, "id"), f"{name}: duplicate id (task #{seen[raw['id']] + 1} has it too); give each task its own id")
            return None
        prompt = raw.get("task")
        if not isinstance(prompt, str) or not prompt.strip():
            self.problem(where, f"{name}: needs a 'task:' prompt; add 'task: TEXT'")
            prompt = ""
        blocked = raw.get("blockedBy") or []
        blocked = [blocked] if isinstance(blocked, str) else blocked
        if not isinstance(blocked, list) or not all(isinstance(b, str) for b in blocked):
            self.problem((*where, "blockedBy"), f"{name}: 'blockedBy:' must be a list of task ids")
            blocked = []
        before = len(self.problems)
        task = DagTask(raw["id"], self.filled(prompt, (*where, "task"), name), list(blocked), {**base, **self.options(raw, where, name)})
        task.retries = raw.get("retries") if retries_ok(raw.get("retries")) else None
        if len(self.problems) == before:
            self.flags_parse(task, where)
        return task

    def graph(self, tasks: Sequence[DagTask], index: Mapping[str, int]) -> None:
        """Unknown ids in blockedBy, each at its line, and a cycle at the entry that closes it."""
        ids = set(index)
        for t in tasks:
            for i, b in enumerate(t.blocked_by):
                if b not in ids:
                    where = ("tasks", index[t.id], "blockedBy", i)
                    self.problem(where, f"task {t.id!r}: unknown id {b!r} in blockedBy{meant(b, ids)}; use one of the tasks' ids")
        cycle = find_cycle({t.id: [b for b in t.blocked_by if b in ids] for t in tasks})
        if cycle:
            first = next(t for t in tasks if t.id == cycle[0])
            where = ("tasks", index[first.id], "blockedBy", first.blocked_by.index(cycle[1]))
            self.problem(where, f"cycle in blockedBy: {' -> '.join(cycle)}; remove one of these blockedBy entries")


def parse_dag(data: Any, cli_vars: Mapping[str, str], source: str, lines: Mapping[DagPath, int] | None = None) -> list[DagTask]:
    """Check a DAG document and resolve its tasks; DagProblems lists every problem, each at its line (lines: document_lines)."""
    if not isinstance(data, dict) or not isinstance(data.get("tasks"), list) or not data["tasks"]:
        raise DagProblems([f"{source}: expected a mapping with a non-empty 'tasks:' list; add 'tasks:' with '- id: NAME' and 'task: TEXT'"])
    raw_vars = data.get("vars") or {}
    check = DagChecker(source, lines or {}, {})
    if not isinstance(raw_vars, dict):
        check.problem(("vars",), "'vars:' must be a mapping of names to values")
        raw_vars = {}
    check.variables = {**{str(k): str(v) for k, v in raw_vars.items()}, **cli_vars}
    top = ("tasks", "defaults", "vars")
    for key in data:
        if key not in top:
            check.problem((key,), f"unknown top-level key {key!r}{meant(str(key), top)}; use tasks, defaults, vars")
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        check.problem(("defaults",), "'defaults:' must be a mapping of spawn options")
        defaults = {}
    base = check.options(defaults, ("defaults",), "defaults")
    default_retries = defaults.get("retries") if retries_ok(defaults.get("retries")) else None
    tasks: list[DagTask] = []
    index: dict[str, int] = {}
    for n, raw in enumerate(data["tasks"]):
        task = check.task(raw, n, base, index)
        if task is not None:
            task.retries = default_retries if task.retries is None else task.retries
            tasks.append(task)
            index[task.id] = n
    check.graph(tasks, index)
    if check.problems:
        raise DagProblems([text for _, text in sorted(check.problems, key=lambda p: p[0])])
    return tasks


def dag_estimate(tasks: Sequence[DagTask], history: Mapping[str, Sequence[tuple[float, float]]]) -> dict[str, Any]:
    """Projected cost (every task runs once) and critical-path time (blockers end before a task starts)."""
    per_task: dict[str, dict[str, Any]] = {}
    finish: dict[str, float] = {}
    via: dict[str, str | None] = {}
    by_id = {t.id: t for t in tasks}
    for level in dag_levels(tasks):
        for tid in level:
            t = by_id[tid]
            model = str(t.options.get("model") or DEFAULT_MODEL)
            cost, seconds, basis = estimate_agent(model, history)
            per_task[tid] = {"model": model, "cost_usd": round(cost, 6), "seconds": round(seconds, 3), "basis": basis}
            prior = via[tid] = max(t.blocked_by, key=lambda b: finish[b], default=None)
            finish[tid] = seconds + (finish[prior] if prior is not None else 0.0)
    cache = fanout_cache(tasks, per_task)
    last: str | None = max(finish, key=lambda k: finish[k])
    path: list[str] = []
    while last is not None:
        path.append(last)
        last = via[last]
    return {
        "tasks": len(tasks),
        "cost_usd": round(sum(e["cost_usd"] for e in per_task.values()), 6),
        "critical_path_s": round(max(finish.values()), 3),
        "critical_path": path[::-1],
        "per_task": per_task,
        "cache": cache,
    }


def fanout_cache(tasks: Sequence[DagTask], per_task: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Price each level's fan-outs with the prompt cache: tasks with the same model and
    head-shaping options send the same tools and system prompt, so the first writes that
    head and the others read it. Lowers the readers' default estimates in per_task."""
    by_id = {t.id: t for t in tasks}
    groups: dict[tuple[int, str], list[str]] = {}
    for n, level in enumerate(dag_levels(tasks)):
        for tid in level:
            shaping = {k: v for k, v in by_id[tid].options.items() if k not in HEAD_NEUTRAL_OPTIONS}
            groups.setdefault((n, json.dumps({**shaping, "model": per_task[tid]["model"]}, sort_keys=True)), []).append(tid)
    saved, shared = 0.0, 0
    for writer, *readers in groups.values():
        if not readers or not str(per_task[writer]["basis"]).startswith("default"):
            continue
        shared += 1
        each = FANOUT_HEAD_TOKENS * (CACHE_WRITE_FACTOR - CACHE_READ_FACTOR) * price_per_mtok(per_task[writer]["model"])[0] / 1e6
        per_task[writer]["cache"] = "writes the head its siblings read"
        for reader in readers:
            per_task[reader]["cost_usd"] = round(max(0.0, per_task[reader]["cost_usd"] - each), 6)
            per_task[reader]["cache"] = f"reads the head {writer} writes"
            saved += each
    return {"shared_heads": shared, "head_tokens": FANOUT_HEAD_TOKENS, "saved_usd": round(saved, 6)}


def dag_argv(t: DagTask, prompt: str) -> list[str]:
    """The spawn.py flags that start task t with the given prompt."""
    argv = ["--task", prompt, "--topic", t.id]
    for key, value in t.options.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            argv += [flag] if value else []
        elif key in PERMISSION_KINDS:
            argv += [x for rule in ([value] if isinstance(value, str) else value) for x in (flag, str(rule))]
        elif isinstance(value, list):
            argv += [flag, ",".join(map(str, value))]
        else:
            argv += [flag, value if isinstance(value, str) else json.dumps(value)]
    return argv


def dag_prompt(t: DagTask, results: Mapping[str, Mapping[str, Any]]) -> str:
    """The task's prompt with its blockers' outputs appended, each under its id."""
    if not t.blocked_by:
        return t.task
    parts = [t.task, "", "Outputs of the tasks this one was blocked by:"]
    for b in t.blocked_by:
        out = results[b].get("output")
        if results[b].get("status") != "done":  # skipped by choice: say so rather than print null
            out = f"(no output: {results[b].get('reason')})"
        parts += ["", f"## {b}", out if isinstance(out, str) else json.dumps(out, ensure_ascii=False)]
    return "\n".join(parts)


def dag_vars(items: Sequence[str]) -> dict[str, str]:
    """--var KEY=VALUE values by key."""
    variables = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--var {item!r}: expected KEY=VALUE")
        variables[key] = value
    return variables


def read_dag_text(path: str) -> str:
    try:
        return read_input(path)
    except OSError as exc:
        raise UsageError(f"can't read DAG file {path}: {exc.strerror}") from None


def dag_from_text(text: str, source: str, variables: Mapping[str, str]) -> list[DagTask]:
    """A graph file's text checked and resolved: every problem at once, each at its line (DagProblems)."""
    data = load_input(text, source, "JSON" if source.endswith(".json") else "YAML")
    return parse_dag(data, variables, source, document_lines(text))


def load_dag_file(path: str, cli_vars: Sequence[str], text: str | None = None) -> list[DagTask]:
    """The tasks of the DAG file at path, or of text (a built-in workflow) named path."""
    return dag_from_text(read_dag_text(path) if text is None else text, path, dag_vars(cli_vars))


def journal_path(session: Path, runner_id: str) -> Path:
    return session / DAGS_DIR / f"{runner_id}.jsonl"


def read_journal(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise StateError(f"can't read DAG journal {path}: {exc.strerror}") from None
    records = []
    for line in lines:
        try:
            records.append(parse_json(line))
        except ValueError:
            continue  # a runner SIGKILLed mid-append leaves at most one torn last line
    return records


def journal_state(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The last record of each task in a journal: its state ("started", "done", "failed", "skipped")."""
    state: dict[str, dict[str, Any]] = {}
    for r in records:
        if r.get("event") == "task" and isinstance(r.get("task"), str):
            state[r["task"]] = dict(r)
    return state


class DagStopped(Exception):
    """SIGTERM/SIGHUP reached the runner: end every running task."""


def start_dag_task(t: DagTask, prompt: str, runner: AgentMeta, runner_dir: Path, environ: Mapping[str, str]) -> dict[str, Any]:
    """Launch one task as a background child of the runner's node; its launcher's JSON, or an error."""
    env = {**environ, **child_environment(runner, runner_dir)}
    proc = subprocess.run(
        [sys.executable, str(compiled_script()), *dag_argv(t, prompt), "--background"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        cwd=runner.cwd,
    )
    try:
        data = cast(dict[str, Any], parse_json(proc.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        data = {}
    if proc.returncode != ExitCode.OK or "agent_dir" not in data:
        reason = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"launcher exited {proc.returncode}"
        return {"status": data.get("status") or Status.FAILED.value, "reason": reason, "agent_id": data.get("id")}
    return data


def went_on_without(result: Mapping[str, Any]) -> bool:
    """Does a finished blocker let its dependents start: done, or skipped by choice after it failed?"""
    return result.get("status") == "done" or bool(result.get("skipped_by"))


def run_dag(
    tasks: Sequence[DagTask],
    runner_dir: Path,
    journal: Path,
    *,
    done_before: Mapping[str, Mapping[str, Any]],
    max_concurrent: int | None,
    on_fail: str | None,
    environ: Mapping[str, str],
    on_idle: Callable[[], None] | None = None,
    choose: Callable[[DagTask, Mapping[str, Any]], str] | None = None,
    go_on: Callable[[DagTask], bool] | None = None,
) -> dict[str, dict[str, Any]]:
    """Schedule tasks as their blockers finish; journal every state change. Results by task id.

    A task that did not end done is started again while it has retries left.
    Then on_fail decides: None is the graph's rule (its dependents are skipped,
    the rest goes on); "skip" skips it and starts its dependents anyway;
    "abort" kills what runs and skips the rest; "ask" lets choose() return
    retry, skip or abort. go_on(task), if given, is asked before a task whose
    blockers all ended: False declines it, and the run stops there.
    """
    run = DagRun(tasks, runner_dir, journal, done_before, environ, rules=DagRules(max_concurrent, on_fail, on_idle, choose, go_on))

    def on_signal(signum: int, _frame: Any) -> None:
        raise DagStopped(signal.Signals(signum).name)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        while len(run.results) < len(tasks):
            for t in tasks:
                run.consider(t)
            if run.running:
                run.collect()
    except DagStopped as stopped:
        note(f"dag: {stopped}: ending {len(run.running)} running task(s)")
    finally:
        for s in old:
            signal.signal(s, signal.SIG_IGN)  # a second SIGTERM must not cut the cleanup short
        run.stopped()
        for s, handler in old.items():
            signal.signal(s, handler)
    return run.results


@dataclass
class DagRules:
    """How a run goes on (run_dag's keyword arguments, see there)."""

    max_concurrent: int | None = None
    on_fail: str | None = None
    on_idle: Callable[[], None] | None = None
    choose: Callable[[DagTask, Mapping[str, Any]], str] | None = None
    go_on: Callable[[DagTask], bool] | None = None


class DagRun:
    """run_dag's state: the results so far, the tasks running, the attempts; and each step it takes (see there)."""

    def __init__(
        self,
        tasks: Sequence[DagTask],
        runner_dir: Path,
        journal: Path,
        done_before: Mapping[str, Mapping[str, Any]],
        environ: Mapping[str, str],
        *,
        rules: DagRules,
    ) -> None:
        self.tasks, self.runner_dir, self.journal, self.environ = tasks, runner_dir, journal, environ
        self.runner = load_meta(runner_dir)
        self.secrets = secret_values(environ)
        self.by_id = {t.id: t for t in tasks}
        self.results: dict[str, dict[str, Any]] = {k: dict(v) for k, v in done_before.items()}
        self.running: dict[str, Path] = {}
        # Attempts count across resumes (the journal has every start); retries are per runner.
        self.attempts: dict[str, int] = {t.id: 0 for t in tasks}
        for r in read_journal(journal):
            if r.get("event") == "task" and r.get("status") == "started" and r.get("task") in self.attempts:
                self.attempts[r["task"]] += 1
        self.retried: dict[str, int] = {t.id: 0 for t in tasks}
        self.stop: dict[str, str] = {}  # set by an abort or a decline: why nothing more starts
        self.rules = rules

    def record(self, tid: str, **fields: Any) -> None:
        entry = {"event": "task", "task": tid, "time": utc_now_iso(), **fields}
        append_jsonl(self.journal, entry, self.secrets)
        if fields["status"] != "started":
            self.results[tid] = {k: v for k, v in fields.items() if k != "agent_dir"}

    def ended(self, tid: str, d: Path, outcome: Mapping[str, Any], **why: str) -> None:
        """Record a task's agent outcome; why (reason, aborted_by) overrides a failure's own reason."""
        if outcome.get("status") == Status.DONE:
            out, _ = truncate_for_stdout(outcome.get("output"), d / OUTCOME)
            self.record(tid, status="done", agent_id=d.name, output=out, outcome=str(d / OUTCOME), attempt=self.attempts[tid])
        else:
            fields = {"reason": outcome.get("reason") or "", **why}
            self.record(tid, status=outcome.get("status") or "failed", agent_id=d.name, attempt=self.attempts[tid], **fields)

    def decide(self, t: DagTask) -> tuple[str, str]:
        """(retry|skip|abort|fail, who chose) for a task that did not end done; fail is the graph's rule."""
        if self.retried[t.id] < (t.retries or 0):
            return "retry", f"retries: {t.retries}"
        if self.rules.on_fail == "ask" and self.rules.choose is not None:
            return self.rules.choose(t, self.results[t.id]), "terminal"
        if self.rules.on_fail in ("skip", "abort"):
            return self.rules.on_fail, f"--on-fail {self.rules.on_fail}"
        return "fail", "the graph"

    def failed(self, t: DagTask) -> None:
        """The last record of t is a failure: retry it, skip it, abort the run, or let it stand."""
        result = self.results[t.id]
        choice, by = self.decide(t)
        if choice == "fail":
            return
        append_jsonl(
            self.journal,
            {"event": "decision", "task": t.id, "time": utc_now_iso(), "choice": choice, "by": by, "attempt": self.attempts[t.id]},
            self.secrets,
        )
        if choice == "retry":
            self.retried[t.id] += 1
            del self.results[t.id]  # pending again: the next pass starts it
        elif choice == "skip":
            why = f"{result['status']} ({result.get('reason') or 'no reason'}); skipped by {by}, its dependents go on"
            self.record(t.id, status="skipped", agent_id=result.get("agent_id"), reason=why, skipped_by=by, attempt=self.attempts[t.id])
        else:
            self.stop["reason"] = f"aborted by {by}: {t.id} {result['status']}"
            for tid, d in list(self.running.items()):
                kill_agent(d, self.secrets)  # a sibling that ended meanwhile keeps its own outcome
                del self.running[tid]
                self.ended(tid, d, read_outcome(d) or {"status": "killed"}, reason=self.stop["reason"], aborted_by=t.id)

    def consider(self, t: DagTask) -> None:
        """One pass's look at a task: skip it, leave it waiting, or start it."""
        results, running, stop = self.results, self.running, self.stop
        if t.id in results or t.id in running:
            return
        if stop:
            self.record(t.id, status="skipped", reason=stop["reason"])
            return
        bad = [b for b in t.blocked_by if b in results and not went_on_without(results[b])]
        if bad:
            self.record(t.id, status="skipped", reason=f"blocked by {bad[0]}, which {results[bad[0]]['status']}")
            return
        if any(b not in results for b in t.blocked_by) or (
            self.rules.max_concurrent is not None and len(running) >= self.rules.max_concurrent
        ):
            return
        if self.rules.go_on is not None and t.blocked_by and not self.rules.go_on(t):
            stop["reason"] = f"declined at the terminal: not going on to {t.id}"
            self.record(t.id, status="skipped", reason=stop["reason"], declined_by="terminal")
            return
        self.attempts[t.id] += 1
        launched = start_dag_task(t, dag_prompt(t, results), self.runner, self.runner_dir, self.environ)
        if "agent_dir" in launched:
            running[t.id] = Path(launched["agent_dir"])
            self.record(t.id, status="started", agent_id=launched["id"], agent_dir=launched["agent_dir"], attempt=self.attempts[t.id])
        else:
            status, agent_id, reason = launched["status"], launched.get("agent_id"), launched["reason"]
            self.record(t.id, status=status, agent_id=agent_id, reason=reason, attempt=self.attempts[t.id])
            self.failed(t)

    def collect(self) -> None:
        """Wait for any running task to end (or for on_idle's period) and record what ended."""
        running = self.running
        waited = wait_for_outcomes(list(running.values()), "any", None if self.rules.on_idle is None else ASK_POLL_S * 5, self.secrets)
        if self.rules.on_idle is not None:
            self.rules.on_idle()
        for tid, d in list(running.items()):
            if tid not in running:
                continue  # ended by an abort earlier in this pass
            outcome = waited.outcomes.get(d) if d in waited.outcomes else None
            if outcome is None and d in waited.stale:
                kill_agent(d, self.secrets)
                outcome = read_outcome(d)
            if outcome is None:
                continue
            del running[tid]
            self.ended(tid, d, outcome)
            if self.results[tid]["status"] != "done":
                self.failed(self.by_id[tid])

    def stopped(self) -> None:
        """The run ends: what still runs is killed, what never started is skipped."""
        for tid, d in self.running.items():
            kill_agent(d, self.secrets)  # a stopped runner leaves no task behind
            outcome = read_outcome(d) or {}
            status = outcome.get("status") or "killed"
            self.record(tid, status=status, agent_id=d.name, reason="the DAG runner was stopped", attempt=self.attempts[tid])
        for t in self.tasks:
            if t.id not in self.results:
                self.record(t.id, status="skipped", reason="the DAG runner was stopped")


def register_dag_runner(
    what: str, topic: str, args: argparse.Namespace, environ: Mapping[str, str], first: AgentMeta | None = None
) -> tuple[Path, Plan]:
    """Register the runner as an agent node: tasks are its children, so kill, status and limits reach them.

    A resume passes the first run's runner (first): its limits are derived
    again as any spawn's are, from the caller, and then narrowed to that
    runner's tools, max depth, rules, deadline span and budget. The resume's
    own flags narrow further; nothing widens them.
    """
    argv = ["--task", what, "--topic", topic, "--tools", ",".join(sorted(KNOWN_TOOLS) if first is None else first.tools)]
    timeout, budget = args.timeout, args.max_budget_usd
    if first is not None:
        argv += ["--max-depth", str(first.max_depth)]
        argv += [x for kind in ("deny", "ask") for rule in first.permissions.get(kind, []) for x in (f"--{kind}", rule)]
        timeout = min_known(timeout, None if first.deadline is None else max(first.deadline - first.create_time, 1.0))
        budget = min_known(budget, first.max_budget_usd)
    for flag, value in (("--timeout", timeout), ("--max-budget-usd", budget), ("--session", args.session)):
        argv += [flag, str(value)] if value is not None else []
    plan = plan_run(build_run_parser().parse_args(argv), environ, ancestry_context())
    plan.meta.agent = "dag"
    if plan.refusal is not None and not plan.new_session and (dropped := drop_refusal(plan)) is not None:
        raise RefusedError(f"refused: {plan.refusal}; {dropped[2]}'s runner records it in {dropped[0]}")
    runner_dir = register(plan, own_identity())
    if plan.refusal is not None:
        record_refusal(runner_dir, plan)
        raise RefusedError(f"refused: {plan.refusal}; recorded in {runner_dir}")
    return runner_dir, plan


def finish_runner(runner_dir: Path, plan: Plan, results: Mapping[str, Mapping[str, Any]], started: float, journal: Path) -> int:
    """Commit the runner's outcome, print the one JSON object, return the exit code."""
    statuses = {r["status"] for r in results.values()}
    # A task killed because another failed (an abort) makes a failed run, not a killed one.
    killed = any(r["status"] == "killed" and not r.get("aborted_by") for r in results.values())
    status = Status.DONE if statuses <= {"done"} else Status.KILLED if killed else Status.FAILED
    report = {"status": status.value, "tasks": {k: dict(v) for k, v in results.items()}}
    failed = sorted(k for k, r in results.items() if r["status"] != "done")
    reason = "every task done" if not failed else f"not done: {', '.join(failed)}"
    outcome = Outcome(
        id=plan.meta.id,
        status=status,
        reason=reason,
        exit_code=EXIT_FOR_STATUS[status],
        ended_at=utc_now_iso(),
        duration_s=round(time.time() - started, 3),
        output=report,
    )
    commit_outcome(runner_dir, outcome, plan.secrets)
    unregister_runner(plan.meta.pid, plan.meta.create_time)
    emit({**report, "runner_id": plan.meta.id, "session": plan.meta.session, "journal": str(journal)})
    return EXIT_FOR_STATUS[status]


def cmd_estimate(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """estimate DAGFILE: what a graph would cost and how long its critical path is, running nothing."""
    tasks = load_dag_file(args.file, args.var or [])
    history: dict[str, list[tuple[float, float]]] = {}
    session = None
    if args.session:
        # A session directory, or a session root whose latest session is meant.
        given = Path(args.session).expanduser().resolve()
        session = given if (given / AGENTS_DIR).is_dir() else latest_session(given)
        if session is None:
            raise UsageError(f"no session under {given}; pass a session directory or drop --session for the defaults")
        history, _ = agent_history(session)
    report = {"file": args.file, "session": str(session) if session else None, **dag_estimate(tasks, history)}
    if not args.text:
        emit(report)
        return ExitCode.OK
    saved = report["cache"]["saved_usd"]
    print(
        f"{report['tasks']} tasks, about ${report['cost_usd']:.4f}"
        + (f" (fan-outs reading their shared head from the cache: -${saved:.4f})" if saved else "")
        + f"; critical path {report['critical_path_s']:.0f} s: "
        + " -> ".join(report["critical_path"])
    )
    return ExitCode.OK


def at_terminal() -> bool:
    """Is a person at stdin to answer questions? Without one nothing may wait for an answer."""
    return sys.stdin is not None and sys.stdin.isatty()


def failure_policy(on_fail: str | None, fail_fast: bool, default: str | None) -> str | None:
    """--on-fail as given (--fail-fast is abort), else default; ask needs a person at a terminal."""
    if fail_fast and on_fail not in (None, "abort"):
        raise UsageError(f"--fail-fast and --on-fail {on_fail} disagree; pass one of them")
    policy = "abort" if fail_fast else on_fail or default
    if policy == "ask" and not at_terminal():
        raise UsageError("--on-fail ask needs a terminal on stdin; in scripts use --on-fail skip|abort and retries (--retries N)")
    return policy


def apply_retries(tasks: Sequence[DagTask], retries: int | None) -> None:
    """--retries N for every task whose file sets no retries:."""
    if retries is not None and retries < 0:
        raise UsageError(f"--retries must be a whole number >= 0, got {retries}")
    for t in tasks:
        t.retries = (retries or 0) if t.retries is None else t.retries


def ask_failure_at_terminal(t: DagTask, result: Mapping[str, Any]) -> str:
    """retry, skip or abort, as the person at the terminal chooses; anything else (or end of input) aborts."""
    reason = str(result.get("reason") or "no reason")[:300]
    print(f"? {t.id} {result['status']}: {reason}. Retry, skip or abort? (r/s/A) ", end="", file=sys.stderr, flush=True)
    reply = sys.stdin.readline().strip().lower()
    return {"r": "retry", "retry": "retry", "s": "skip", "skip": "skip"}.get(reply, "abort")


def go_on_at_terminal(t: DagTask) -> bool:
    """run-all between phases: may the next phase start? Enter is yes; end of input is no."""
    print(f"? {', '.join(t.blocked_by)} done. Go on to {t.id}? (Y/n) ", end="", file=sys.stderr, flush=True)
    reply = sys.stdin.readline()
    return bool(reply) and reply.strip().lower() in ("", "y", "yes")


def cmd_dag(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    if args.action == "resume":
        return resume_dag(args, environ)
    text = read_dag_text(args.file)
    variables = dag_vars(args.var or [])
    tasks = dag_from_text(text, args.file, variables)
    levels = dag_levels(tasks)
    if args.action == "validate":
        emit({"valid": True, "file": args.file, "tasks": len(tasks), "levels": len(levels)})
        return ExitCode.OK
    if args.action == "show" or args.dry_run:
        apply_retries(tasks, args.retries)
        resolved = [
            {"id": t.id, "blockedBy": t.blocked_by, "task": t.task, "retries": t.retries, "argv": dag_argv(t, t.task)} for t in tasks
        ]
        emit({"levels": levels, **({"tasks": resolved} if args.dry_run else {})})
        return ExitCode.OK
    positive("--max-concurrent", args.max_concurrent, integer=True)
    apply_retries(tasks, args.retries)
    on_fail = failure_policy(args.on_fail, args.fail_fast, None)
    started = time.time()
    graph_file = str(Path(args.file).resolve())
    runner_dir, plan = register_dag_runner(f"dag run {graph_file}", f"dag {Path(args.file).stem}", args, environ)
    give_default_tools(tasks, plan)
    journal = journal_path(Path(plan.meta.session), plan.meta.id)
    journal.parent.mkdir(exist_ok=True)
    graph: dict[str, Any] = {"event": "graph", "time": utc_now_iso(), "runner_id": plan.meta.id, "file": graph_file}
    graph.update(sha256=hashlib.sha256(text.encode()).hexdigest(), vars=variables)
    graph.update(max_concurrent=args.max_concurrent, fail_fast=on_fail == "abort", on_fail=on_fail)
    graph["tasks"] = [record_to_json(t) for t in tasks]
    append_jsonl(journal, graph, plan.secrets)
    note(f"dag {plan.meta.id}: {len(tasks)} tasks in {len(levels)} levels; journal {journal}")
    results = run_dag(
        tasks, runner_dir, journal, done_before={}, max_concurrent=args.max_concurrent, on_fail=on_fail, environ=environ,
        choose=ask_failure_at_terminal,
    )  # fmt: skip
    return finish_runner(runner_dir, plan, results, started, journal)


def give_default_tools(tasks: Sequence[DagTask], plan: Plan) -> None:
    """A task with no tools gets what a plain spawn here would, not the runner's wide set."""
    for t in tasks:
        if "tools" not in t.options and "agent" not in t.options:
            t.options["tools"] = list(plan.inherited.tools or DEFAULT_TOOLS)


def first_runner_of(session: Path, journal: Path) -> tuple[AgentMeta, dict[str, Any], list[dict[str, Any]]]:
    """The `dag run` runner that wrote this journal, its graph line, and the journal's lines.

    The runner's own meta.json names the graph file it ran ("dag run FILE");
    the journal's first line must name the same one, with the hash of its
    text. Anything else in the journal is believed only as far as
    done_in_journal checks it. A StateError says why this journal is not one.
    """
    try:
        first = load_meta(session / AGENTS_DIR / journal.stem)
    except (OSError, SpawnError):
        raise StateError(f"{journal.name} is not named after a runner of this session") from None
    ran = Path(first.cwd, first.task.removeprefix("dag run ")).resolve() if first.task.startswith("dag run ") else None
    if first.agent != "dag" or ran is None:
        raise StateError(f"{journal.name}'s runner {first.id} is not a 'dag run' (workflow verbs are run again, not resumed)")
    records = read_journal(journal)
    graph = records[0] if records and records[0].get("event") == "graph" else {}
    if graph.get("runner_id") != first.id or not isinstance(graph.get("file"), str) or Path(graph["file"]) != ran:
        raise StateError(f"{journal.name}'s first line is not the graph line its runner {first.id} wrote for {ran}")
    if not isinstance(graph.get("sha256"), str):
        raise StateError(f"{journal.name} records no hash of {ran} (an older spawn.py wrote it); start it anew: 'spawn.py dag run {ran}'")
    return first, graph, records


def resumable_journal(session: Path) -> tuple[Path, AgentMeta, dict[str, Any], list[dict[str, Any]]]:
    """The newest journal of the session that a `dag run` runner wrote; others are noted and passed over."""
    journals = sorted((session / DAGS_DIR).glob("*.jsonl"), key=lambda p: p.stat().st_mtime, reverse=True)
    for journal in journals:
        try:
            return (journal, *first_runner_of(session, journal))
        except StateError as exc:
            note(f"dag resume: passed over {journal}: {exc.message}")
    raise UsageError(f"no DAG journal of a 'dag run' in {session / DAGS_DIR}; pass the session directory of a 'dag run'")


def done_in_journal(
    session: Path, records: Sequence[Mapping[str, Any]], ids: AbstractSet[str], secrets_: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """Tasks already done, by id: the journal says which agent ran a task; that agent's own records say whether it is done.

    A line naming a task the graph lacks is ignored, and said so. A task
    counts as done only when its agent is in this session, was started for
    that task by a DAG runner, and has a done outcome: a forged "done" with an
    output of its choosing reruns the task instead. An agent of a task
    still running (its runner died) is ended, to be started again.
    """
    done: dict[str, dict[str, Any]] = {}
    for tid, last in journal_state(records).items():
        if tid not in ids:
            note(f"dag resume: journal lines for task {tid[:80]!r} ignored: the graph file has no such task")
            continue
        agent_id = last.get("agent_id")
        if last.get("status") not in ("done", "started") or not isinstance(agent_id, str) or Path(agent_id).name != agent_id:
            continue
        d = session / AGENTS_DIR / agent_id
        try:
            meta = load_meta(d)
            parent = meta.parent_id if meta.parent_id is not None and Path(meta.parent_id).name == meta.parent_id else None
            ours = meta.topic == tid and parent is not None and load_meta(session / AGENTS_DIR / parent).agent == "dag"
            outcome = read_outcome(d) if ours else None
        except (OSError, SpawnError):
            ours, outcome = False, None
        if not ours:
            note(f"dag resume: task {tid!r}: the journal's agent {agent_id[:80]!r} did not run it; it runs again")
        elif outcome is None:
            kill_agent(d, secrets_)  # still running, orphaned: end it before starting it again
        elif outcome.get("status") == Status.DONE:
            out, _ = truncate_for_stdout(outcome.get("output"), d / OUTCOME)
            done[tid] = {"status": "done", "agent_id": d.name, "output": out, "outcome": str(d / OUTCOME)}
    return done


def resume_dag(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """Run the graph file's tasks that are not done, under the first run's limits; the journal says only what is done."""
    session = Path(args.file).expanduser().resolve()
    journal, first, graph, records = resumable_journal(session)
    text = read_dag_text(graph["file"])
    if (now := hashlib.sha256(text.encode()).hexdigest()) != graph["sha256"]:
        raise UsageError(
            f"{graph['file']} changed since the first run (sha256 {graph['sha256'][:12]} then, {now[:12]} now); "
            f"restore it, or start it anew with 'spawn.py dag run {graph['file']}'"
        )
    recorded_vars: dict[str, Any] = graph["vars"] if isinstance(graph.get("vars"), dict) else {}
    tasks = dag_from_text(text, graph["file"], {**{str(k): str(v) for k, v in recorded_vars.items()}, **dag_vars(args.var or [])})
    positive("--max-concurrent", args.max_concurrent, integer=True)
    apply_retries(tasks, args.retries)
    recorded = graph.get("on_fail") if graph.get("on_fail") in ON_FAIL else ("abort" if graph.get("fail_fast") is True else None)
    if recorded == "ask" and not at_terminal():
        recorded = "abort"  # asked at a terminal then, none now: nothing may wait for an answer
    on_fail = failure_policy(args.on_fail, args.fail_fast, recorded)
    first_concurrent = graph.get("max_concurrent")
    max_concurrent = args.max_concurrent or (first_concurrent if type(first_concurrent) is int and first_concurrent > 0 else None)
    done = done_in_journal(session, records, {t.id for t in tasks}, secret_values(environ))
    env = {**environ, ENV_SESSION: str(session), ENV_DEPTH: environ.get(ENV_DEPTH, "-1")}
    if Path(environ.get(ENV_SESSION, "")) != session:
        env[ENV_DEPTH] = "-1"
        env.pop(ENV_AGENT_ID, None)
    args.session = None
    started = time.time()
    runner_dir, plan = register_dag_runner(f"dag resume {graph['file']}", "dag-resume", args, env, first)
    give_default_tools(tasks, plan)
    append_jsonl(journal, {"event": "resume", "time": utc_now_iso(), "runner_id": plan.meta.id}, plan.secrets)
    for tid, r in done.items():
        append_jsonl(journal, {"event": "task", "task": tid, "time": utc_now_iso(), **r}, plan.secrets)
    note(f"dag resume {plan.meta.id}: {len(done)} of {len(tasks)} tasks already done")
    results = run_dag(
        tasks, runner_dir, journal, done_before=done, max_concurrent=max_concurrent, on_fail=on_fail, environ=environ,
        choose=ask_failure_at_terminal,
    )  # fmt: skip
    return finish_runner(runner_dir, plan, results, started, journal)


# Plan, build and explore: phases of one workflow DAG, sharing a state file.
WORKFLOWS_DIR = PROJECT_DIR / "workflows"
DEFAULT_STATE_FILE = ".spawn-state.json"
DEFAULT_ROTATE_MB = 10.0  # a state file past this is rotated to .1, .2, ...
PHASES = ("plan", "build", "explore")
WORKFLOW_FOR = {"plan": "plan-build", "build": "plan-build", "explore": "plan-build-explore"}
WORKFLOW_FOR.update({"run-plan-build": "plan-build", "run-all": "plan-build-explore"})


class DeclinedError(SpawnError):
    """A person (or the ask timeout) declined an action build asked about (exit 4)."""

    exit_code = ExitCode.REFUSED


def state_file_path(value: str) -> Path:
    """--state-file made absolute without resolving its last component, so a link there is seen, not followed."""
    path = Path(value).expanduser()
    return path.parent.resolve() / path.name


def open_state_nofollow(path: Path, flags: int) -> int:
    """os.open of the state file or its lock, refusing a symbolic link in their place.

    Anything that can write the project (an agent, a checkout) can plant
    a link there; followed, `plan` would rewrite, `state show` print and
    `state clear` delete whatever file it points to, outside the project.
    """
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StateError(
                f"state file {path} is a symbolic link, which spawn.py does not follow; remove the link, or pass --state-file PATH"
            ) from None
        raise


@contextlib.contextmanager
def state_lock(path: Path) -> Iterator[None]:
    """Exclusive lock for a read-modify-write of the state file.

    The lock lives on a sidecar that is never renamed: the state file itself
    is replaced on every write, so a lock on it would guard a dead inode.
    """
    import fcntl

    try:
        fd = open_state_nofollow(path.with_name(path.name + ".lock"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    except StateError:
        raise
    except OSError as exc:
        raise StateError(f"can't lock state file {path}: {exc.strerror}; pass --state-file PATH in a writable directory") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def read_state(path: Path) -> dict[str, Any]:
    """The state file's content; {} when absent. Corrupt is a StateError, and the file is left as it is."""
    try:
        # The state file is replaced by rename, never written in place: refusing a link here, and
        # renaming over the name (which replaces a link planted since), never reaches its target.
        with os.fdopen(open_state_nofollow(path, os.O_RDONLY), "rb") as f:
            data = parse_json(f.read(RECORD_MAX_BYTES + 1))
    except FileNotFoundError:
        return {}
    except (ValueError, UnicodeDecodeError) as exc:
        raise StateError(f"state file {path} is corrupt ({exc}); it was not changed: fix it, or move it away") from None
    if not isinstance(data, dict):
        raise StateError(f"state file {path} is corrupt (not a JSON object); it was not changed: fix it, or move it away")
    return data


def rotate_state(path: Path) -> None:
    """path -> path.1, path.1 -> path.2, ...: nothing is lost."""
    n = 1
    while path.with_name(f"{path.name}.{n}").exists():
        n += 1
    for i in range(n, 1, -1):
        os.replace(path.with_name(f"{path.name}.{i - 1}"), path.with_name(f"{path.name}.{i}"))
    os.replace(path, path.with_name(f"{path.name}.1"))


def update_state(path: Path, change: Callable[[dict[str, Any]], None], rotate_mb: float = DEFAULT_ROTATE_MB) -> dict[str, Any]:
    """Read, change and write the state file under its lock: temp file, fsync, rename."""
    with state_lock(path):
        data = read_state(path)
        change(data)
        if path.exists() and path.stat().st_size > rotate_mb * 1024 * 1024:
            rotate_state(path)
            data["history"] = data.get("history", [])[-1:]  # the rest is in .1
        write_file_atomic(path, (json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n").encode())
        fsync_dir(path.parent)
    return data


def plan_markdown(output: Any) -> str:
    """A plan output (schemas/plan.json, or text) as markdown."""
    if not isinstance(output, dict):
        return str(output or "")
    lines = [f"# {output.get('goal', 'Plan')}", ""]
    for n, raw in enumerate(output.get("steps") or [], 1):
        step = raw if isinstance(raw, dict) else {"title": str(raw)}
        files = f" ({', '.join(step['files'])})" if step.get("files") else ""
        lines.append(f"{n}. {step.get('title', '')}{files}")
        if step.get("detail"):
            lines.append(f"   {step['detail']}")
    lines += [f"- risk: {r}" for r in output.get("risks") or []]
    return "\n".join(lines)


def written_files(transcript: Path) -> set[str]:
    """Paths the agent gave to Write (which creates files), as given and as base names."""
    found: set[str] = set()
    with contextlib.suppress(OSError, SpawnError):
        for m in re.finditer(r'"name": ?"Write", ?"input": ?\{"file_path": ?"([^"]+)"', read_text(transcript)):
            found |= {m.group(1), os.path.basename(m.group(1))}
    return found


def phase_results(phase: str, output: Any, written: AbstractSet[str] = frozenset()) -> Any:
    """What a phase's output adds to the state file's results; written: the paths build created."""
    if phase == "plan":
        return plan_markdown(output)
    data = output if isinstance(output, dict) else {"summary": output}
    if phase == "build":
        changed = [str(c) for c in data.get("files_changed") or []]
        created = [c for c in changed if c in written]
        return {"filesCreated": created, "filesModified": [c for c in changed if c not in written]}
    return {"findings": data.get("findings") or [], "recommendations": data.get("open_questions") or data.get("recommendations") or []}


def workflow_file(verb: str) -> tuple[str, str | None]:
    """The verb's workflow: workflows/NAME.yaml beside the script, else the built-in one (name, text)."""
    name = f"{WORKFLOW_FOR[verb]}.yaml"
    path = WORKFLOWS_DIR / name
    builtin = builtin_files("workflows")
    if path.is_file() or name not in builtin:
        return str(path), None
    return builtin_label(f"workflows/{name}"), builtin[name]


def workflow_tasks(verb: str, args: argparse.Namespace, state: Mapping[str, Any]) -> list[DagTask]:
    """The shipped workflow's tasks for a verb: one phase alone, or the whole chain."""
    path, text = workflow_file(verb)
    tasks = load_dag_file(path, [f"task={args.task or state.get('taskDescription', '')}"], text)
    if verb in PHASES:
        (t,) = [t for t in tasks if t.id == verb]
        t.blocked_by = []
        results = state.get("results") or {}
        if verb == "build":
            if not results.get("plan"):
                raise UsageError(f"no plan in {args.state_file}; run 'spawn.py plan TASK' first")
            t.task += f"\n\n## plan\n{results['plan']}"
        if verb == "explore":
            t.task += f"\n\n{args.task}" if args.task else ""
            t.task += "\nDepth: " + (
                "list files and structure only." if args.depth == "shallow" else "full analysis: dependencies, patterns, metrics."
            )
        if verb == "plan" and args.prd:
            t.task += "\nAlso write a short PRD (problem, users, requirements, success criteria) as the plan's first step."
        tasks = [t]
    return tasks


def declined_asks(session: Path, agent_ids: Iterable[str]) -> list[dict[str, Any]]:
    """Asks of these agents that were answered no (by a person, `deny`, or the timeout)."""
    ids, found = set(agent_ids), []
    for answer in sorted(asks_dir(session).glob("q-*.answer.json")):
        with contextlib.suppress(FileNotFoundError, SpawnError):
            ask = read_json(answer.with_name(answer.name.replace(".answer", "")))
            if ask.get("agent_id") in ids and read_json(answer).get("verdict") == "deny":
                found.append(ask)
    return found


def ask_question(tool: str, what: str, cwd: str, rule: str = "") -> str:
    """The question a person at the terminal sees for one of build's asks; paths relative to cwd."""
    what = what[len(cwd) + 1 :] if what.startswith(cwd.rstrip("/") + "/") else what
    if tool in EDIT_TOOLS and (size := re.search(r"\((lines>\d+)\)$", rule)):
        return f"? Refactor {what} (changes {size.group(1).replace('>', ' > ')})? (Y/n) "
    if tool == "Write":
        return f"? Create file {what}? (Y/n) "
    if tool == "Bash":
        return f"? Run '{what}' (deletes or moves files)? (Y/n) "
    return f"? Change {what} (a dependency manifest)? (Y/n) " if tool in EDIT_TOOLS else f"? Allow {tool} {what}? (Y/n) "


def answer_at_terminal(session: Path) -> None:
    """Put each pending ask of the session to the person at the terminal; the first answer wins."""
    for ask in pending_asks(session):
        # The question goes to stderr: stdout carries only the one JSON result.
        question = ask_question(str(ask.get("tool")), str(ask.get("input")), os.getcwd(), str(ask.get("rule") or ""))
        print(question, end="", file=sys.stderr, flush=True)
        reply = sys.stdin.readline().strip().lower() or ("y" if not sys.stdin.closed else "n")
        with contextlib.suppress(StateError):  # its agent stopped waiting meanwhile
            send_answer(session, str(ask["id"]), "approve" if reply in ("", "y", "yes") else "deny", "terminal", None)


def cmd_workflow(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """plan, build, explore, run-plan-build, run-all: run the phases, record them in the state file."""
    state_path = state_file_path(args.state_file)
    verb = args.verb
    state = read_state(state_path)  # a corrupt file stops us before anything starts
    if verb == "build" and args.dry_run:
        plan = (state.get("results") or {}).get("plan")
        if not plan:
            raise UsageError(f"no plan in {state_path}; run 'spawn.py plan TASK' first")
        steps = [line for line in plan.splitlines() if re.match(r"\d+\. ", line)]
        emit({"dry_run": True, "steps": steps, "files": sorted(set(re.findall(r"\(([^)]*)\)$", "\n".join(steps), re.M)))})
        return ExitCode.OK
    tasks = workflow_tasks(verb, args, state)
    apply_retries(tasks, args.retries)
    interactive = at_terminal()
    on_fail = failure_policy(args.on_fail, False, "ask" if interactive else "abort")
    now = utc_now_iso()
    params = {k: v for k, v in vars(args).items() if k not in ("traceback", "verb") and v is not None}

    def begin(data: dict[str, Any]) -> None:
        data["metadata"] = {"agentName": verb, "spawnVersion": __version__, "invocationTimestamp": now, "parameters": params}
        data.update(phase=tasks[0].id, status="running")
        data["taskDescription"] = args.task or data.get("taskDescription") or ""
        data.setdefault("results", {})
        data.setdefault("errors", [])
        data.setdefault("artifacts", {})
        data.setdefault("history", [])

    update_state(state_path, begin, args.rotate_mb)
    args.session = args.timeout = args.max_budget_usd = None
    started = time.time()
    runner_dir, plan = register_dag_runner(f"{verb} {args.task or ''}".strip(), verb, args, environ)
    session = Path(plan.meta.session)
    journal = journal_path(session, plan.meta.id)
    journal.parent.mkdir(exist_ok=True)
    graph: dict[str, Any] = {
        "event": "graph",
        "time": utc_now_iso(),
        "runner_id": plan.meta.id,
        "file": workflow_file(verb)[0],
    }
    graph.update(max_concurrent=1, fail_fast=on_fail == "abort", on_fail=on_fail, tasks=[record_to_json(t) for t in tasks])
    append_jsonl(journal, graph, plan.secrets)
    if args.verbose:
        note(f"{verb}: phases {' -> '.join(t.id for t in tasks)}; session {session}")
    results = run_dag(
        tasks, runner_dir, journal, done_before={}, max_concurrent=1, on_fail=on_fail, environ=environ,
        on_idle=(lambda: answer_at_terminal(session)) if interactive else None,
        choose=ask_failure_at_terminal,
        # run-all at a terminal asks before each phase after the first; nobody to ask otherwise.
        go_on=go_on_at_terminal if interactive and verb == "run-all" else None,
    )  # fmt: skip
    declined = declined_asks(session, [r["agent_id"] for r in results.values() if r.get("agent_id")])
    declined += [{"tool": "go on", "input": f"to {tid} (at the terminal)"} for tid, r in results.items() if r.get("declined_by")]

    def finish(data: dict[str, Any]) -> None:
        for tid, r in results.items():
            data["artifacts"][tid] = {"session": str(session), "agent_id": r.get("agent_id"), "journal": str(journal)}
            if r["status"] == "done":
                key = "exploration" if tid == "explore" else tid
                written = written_files(Path(r["outcome"]).with_name(TRANSCRIPT))
                data["results"][key] = phase_results(tid, read_json(Path(r["outcome"])).get("output"), written)
                data["phase"] = tid
            elif r["status"] != "skipped" or r.get("skipped_by"):
                data["errors"].append({"phase": tid, "time": utc_now_iso(), "message": r.get("reason", "")})
                data["phase"] = tid
            entry = {"phase": tid, "status": r["status"], "time": utc_now_iso()}
            data["history"].append({**entry, "attempt": r["attempt"]} if r.get("attempt") else entry)
        ok = all(r["status"] == "done" for r in results.values())
        data["status"] = "declined" if declined else "success" if ok else "error"

    saved = update_state(state_path, finish, args.rotate_mb)
    code = finish_runner(runner_dir, plan, results, started, journal)
    if args.verbose:
        note(f"{verb}: {saved['status']}; state in {state_path}")
    if declined:
        raise DeclinedError(f"declined: {declined[0]['tool']} {declined[0]['input']}; the state is saved in {state_path}")
    return code


def cmd_state(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    path = state_file_path(args.state_file)
    if args.action == "show":
        emit(read_state(path))
        return ExitCode.OK
    with state_lock(path):
        try:
            os.close(open_state_nofollow(path, os.O_RDONLY | os.O_NONBLOCK))  # refuses a link: never delete its target
            existed = True
        except FileNotFoundError:
            existed = False
        path.unlink(missing_ok=True)
    emit({"cleared": str(path), "existed": existed})
    return ExitCode.OK
# ==================== end src/spawnlib/dag.py ====================

# ==================== begin src/spawnlib/cli.py ====================
























































































# ---------------------------------------------------------------------- CLI --


def build_verb_parser(verb: str) -> Parser:
    p = Parser(prog=f"spawn.py {verb}", epilog=EXIT_TABLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--session", metavar="DIR", help="session directory (default $SPAWN_SESSION, else the latest under the session root)")
    p.add_argument("--traceback", action="store_true", help="on an error, show the Python traceback (for bug reports)")
    if verb == "wait":
        p.description = "Block until the agents have outcomes. Exit 0 if all are done, 1 if one failed, 124 on --timeout."
        p.add_argument("ids", nargs="+", metavar="ID")
        how = p.add_mutually_exclusive_group()
        how.add_argument("--all", dest="mode", action="store_const", const="all", default="all", help="wait for every agent (default)")
        how.add_argument("--any", dest="mode", action="store_const", const="any", help="return when one agent has an outcome")
        p.add_argument("--timeout", type=float, metavar="S", help="give up after S seconds (exit 124)")
    elif verb == "status":
        p.description = "Show the agent tree: depth, state, duration, own cost and subtree cost."
        p.add_argument("target", nargs="?", metavar="SESSION|ID")
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.add_argument(
            "--watch", action="store_true", help="redraw until every agent has an outcome (one line per change when stdout is no terminal)"
        )
    elif verb == "kill":
        p.description = "End an agent and all its descendants (deepest first); record `killed`."
        p.add_argument("ids", nargs="+", metavar="ID")
    elif verb == "reap":
        p.description = "Record a failed outcome for every agent whose process died without one, and end its leftovers."
        p.add_argument("target", nargs="?", metavar="SESSION")
    elif verb in ("approve", "deny"):
        p.description = f"{verb.capitalize()} a tool call an agent asked about (see 'spawn.py status' for pending asks)."
        p.add_argument("ask_id", metavar="ASK_ID")
        p.add_argument(
            "--as",
            dest="as_name",
            metavar="NAME",
            help=f"who answers, recorded as the answer's 'by' (default {verb}), e.g. ci or mcp:CLIENT",
        )
        if verb == "approve":
            p.add_argument("--text", metavar="TEXT", help="the reply to an a2a node's input-required ask, sent to the remote agent")
    elif verb == "agents":
        add_agents_actions(p)
    elif verb == "dag":
        add_dag_actions(p)
    elif verb == "estimate":
        p.description = (
            "Projected cost and critical-path time of a task graph, running nothing. Per task: the median of ended agents "
            "of its model in --session, else a default per tier."
        )
        p.add_argument("file", metavar="DAGFILE")
        p.add_argument("--var", action="append", metavar="KEY=VALUE", help="set {{var.KEY}} (repeatable)")
        p.add_argument("--text", action="store_true", help="one line of text instead of JSON")
    elif verb in WORKFLOW_VERBS:
        add_workflow_options(p, verb)
    elif verb in ("_run", "_guard"):
        p.add_argument("agent_dir")
        if verb == "_guard":  # the runner's exit status, for the guard above a root (GUARD_ABOVE_BOOTSTRAP)
            p.add_argument("--above", type=int, help=argparse.SUPPRESS)
    return p


def add_agents_actions(p: Parser) -> None:
    """`agents list|lint|new|route`."""
    p.description = (
        "Agent definitions: .claude/agents/*.md (project, found upwards from the working directory), ~/.claude/agents,"
        " then the built-in defaults, which a file of the same name overrides."
    )
    sub = p.add_subparsers(dest="action", required=True, parser_class=Parser)
    listing = sub.add_parser("list", help="name, source, tools and description of every definition")
    listing.add_argument("--json", action="store_true")
    lint = sub.add_parser("lint", help="check definitions: fields, tools, schemas, duplicates, YAML (exit 2 on errors)")
    lint.add_argument("paths", nargs="*", metavar="PATH")
    new = sub.add_parser("new", help="write a commented template to .claude/agents/NAME.md")
    new.add_argument("name", metavar="NAME")
    routing = sub.add_parser("route", help="which definition --agent auto would pick for TASK, and why; runs nothing")
    routing.add_argument("task", metavar="TASK")
    routing.add_argument("--json", action="store_true", help="the decision as JSON on stdout")


def add_dag_actions(p: Parser) -> None:
    """`dag run|validate|show|resume FILE` and their options."""
    p.description = "Run a task graph (YAML or JSON): each task starts when its blockedBy are done, as a child of the runner."
    sub = p.add_subparsers(dest="action", required=True, parser_class=Parser)
    for action, what in (
        ("run", "run the graph; stdout is one JSON object with every task's status and output"),
        ("validate", "check the file (cycles, unknown ids and options, undefined vars) without running"),
        ("show", "print the graph's levels"),
        ("resume", "run again what has no .done in a session's DAG journal (FILE is the session directory)"),
    ):
        a = sub.add_parser(action, help=what, description=what, epilog=EXIT_TABLE, formatter_class=argparse.RawDescriptionHelpFormatter)
        a.add_argument("file", metavar="SESSION" if action == "resume" else "FILE")
        a.add_argument("--var", action="append", metavar="KEY=VALUE", help="set {{var.KEY}} (repeatable)")
        a.add_argument("--session", metavar="DIR", help="session root for the runner")
        a.add_argument("--max-concurrent", type=int, metavar="N", help="tasks running at once (default: no limit)")
        a.add_argument("--timeout", type=float, metavar="S", help="deadline for the whole graph")
        a.add_argument("--max-budget-usd", type=float, metavar="X", help="budget for the whole graph")
        a.add_argument(
            "--fail-fast", action="store_true", help="stop everything at the first failure (= --on-fail abort): running tasks are ended"
        )
        a.add_argument(
            "--on-fail",
            choices=ON_FAIL,
            help="a task failed (after its retries): ask at the terminal (retry, skip or abort), skip it and start its dependents "
            "anyway, or abort the run (default: its dependents are skipped, the rest goes on)",
        )
        a.add_argument("--retries", type=int, metavar="N", help="start a failed task again up to N times (for tasks without retries:)")
        a.add_argument("--dry-run", action="store_true", help="print the resolved tasks; start nothing")
        a.add_argument("--traceback", action="store_true", help=argparse.SUPPRESS)


def add_workflow_options(p: Parser, verb: str) -> None:
    """A workflow verb's task, state file and failure options."""
    p.description = {
        "plan": "Plan a change with the plan agent; the plan goes to the state file.",
        "build": "Carry out the state file's plan with the build agent; it asks before creating/deleting files or changing manifests.",
        "explore": "Explore the codebase with the read-only explore agent; findings go to the state file.",
        "run-plan-build": "plan, then build (workflows/plan-build.yaml); build does not start when plan failed.",
        "run-all": "plan, build, explore (workflows/plan-build-explore.yaml); stops at the first failure. At a terminal it asks "
        "before each phase after plan, and whether to retry, skip or abort a failed one.",
        "state": "Show or clear the state file.",
    }[verb]
    if verb == "state":
        p.add_argument("action", choices=["show", "clear"])
    else:
        p.add_argument("task", nargs="?" if verb in ("explore", "build") else None, metavar="TASK")
    p.add_argument("--state-file", default=DEFAULT_STATE_FILE, metavar="PATH", help=f"shared state (default {DEFAULT_STATE_FILE})")
    p.add_argument("--rotate-mb", type=float, default=DEFAULT_ROTATE_MB, metavar="MB", help="rotate the state file to .1, .2... past MB")
    p.add_argument("--verbose", action="store_true", help="report phase transitions on stderr")
    if verb != "state":
        p.add_argument(
            "--on-fail",
            choices=ON_FAIL,
            help="a phase failed (after --retries): ask (the default at a terminal: retry, skip or abort), skip it "
            "and go on, or abort (the default otherwise)",
        )
        p.add_argument("--retries", type=int, metavar="N", help="start a failed phase again up to N times first")
    if verb == "plan":
        p.add_argument("--prd", action="store_true", help="also write a short PRD")
    if verb == "build":
        p.add_argument("--dry-run", action="store_true", help="preview the plan's steps and files; write nothing")
    if verb == "explore":
        p.add_argument("--depth", choices=["shallow", "deep"], default="deep")


def default_session(args: argparse.Namespace, environ: Mapping[str, str]) -> Path | None:
    if getattr(args, "session", None):
        return Path(args.session).expanduser().resolve()
    if environ.get(ENV_SESSION):
        return Path(environ[ENV_SESSION])
    return latest_session(resolve_session_root(None, environ))


def emit_result(args: argparse.Namespace, data: Mapping[str, Any]) -> None:
    """A run's result: the JSON object, or with --print FIELD that one field as plain text."""
    if args.print is None:
        emit(data)
        return
    value = data.get(args.print)
    text = value if isinstance(value, str) else stdout_json_text(value)
    sys.stdout.write(f"{text}\n")
    sys.stdout.flush()


def cmd_run(argv: Sequence[str], environ: Mapping[str, str], entry: Entry) -> int:
    if wants_guard_above(argv, environ):
        fork_below_guard()  # before any thread: from here on this process is the runner
    # The SDK is imported once the agent's CLI has started (SdkLoader).
    # (A background launch and a dry run never need it.)
    # (Nor does a node of another kind that --agent names directly.)
    sdk_loader = SdkLoader(environ) if not {"--dry-run", "--background"} & set(argv) and not names_another_kind(argv) else None
    args = build_run_parser().parse_args(argv)
    original = resolve_resume(args, environ) if args.resume else None
    plan = plan_run(args, environ, ancestry_context())
    if original is not None:
        place_resumed(plan, original)
    if plan.meta.routing is not None:
        note(describe_routing(plan.meta.routing))
    if args.dry_run:
        # The session and id are not known before registration.
        guarded = not plan.meta.background and guard_above_possible()
        plan.meta.containment = choose_containment(plan.meta.parent_id is None, "SESSION", "ID", environ, guarded)
        resolved = record_to_json(plan.meta)
        resolved.update(refusal=plan.refusal, cli=str(plan.cli), session_root=str(plan.session_root))
        resolved["rules"] = describe_rules(plan.rules, plan.meta.tools, plan.meta.disallowed_tools)
        resolved["briefing"] = briefing(plan.meta, spawn_command(), delegates_for(plan.meta, environ))
        resolved["agent_facts"] = agent_facts(plan.meta)
        resolved["prompt_layout"] = prompt_layout(plan.meta)
        emit_result(args, resolved)
        if plan.refusal is not None:
            raise RefusedError(f"refused: {plan.refusal} (dry run; nothing recorded)")
        return ExitCode.OK
    for warning in plan.meta.warnings:
        note(f"warning: {warning}")
    # Placed on Ray, the agent runs on a node: this process launches it and waits, as for --background + wait.
    waits_on_ray = not plan.meta.background and ray_address(plan.meta, environ) is not None
    plan.meta.background = plan.meta.background or waits_on_ray
    if not plan.meta.background or waits_on_ray:
        EarlyStop.arm()  # from the moment it is registered, a stop signal ends in an outcome
    if plan.refusal is not None and not plan.new_session and (dropped := drop_refusal(plan)) is not None:
        agent_dir, outcome, leaf = dropped
        emit_result(args, summary(agent_dir, record_to_json(outcome)))
        raise RefusedError(f"refused: {plan.refusal}; {leaf}'s runner records it in {agent_dir}")
    agent_dir = register(plan, None if plan.meta.background else own_identity())
    if plan.refusal is not None:
        outcome = record_refusal(agent_dir, plan)
        emit_result(args, summary(agent_dir, record_to_json(outcome)))
        raise RefusedError(f"refused: {plan.refusal}; recorded in {agent_dir}")
    if plan.meta.background:
        launched = launch_background(agent_dir, plan)
        if not waits_on_ray:
            emit_result(args, launched)
            return ExitCode.OK
        outcome_data = wait_for_placed(agent_dir, launched["pid"], plan.secrets)
        emit_result(args, summary(agent_dir, outcome_data))
        return int(outcome_data.get("exit_code", ExitCode.AGENT_FAILED))
    note(f"agent {plan.meta.id} started in {agent_dir}")
    if not plan.new_session:
        # Agents that died unseen are settled by the next spawn in their session.
        reap_session(Path(plan.meta.session), "spawn", plan.secrets)
    try:
        # A foreground child blocks its parent's Bash: the parent's slot is lent to it.
        with slot_lent_by_caller(environ):
            outcome = run_agent(agent_dir, plan.cli, plan.secrets, sdk_loader, plan.guard, entry=entry)
    finally:
        unregister_runner(plan.meta.pid, plan.meta.create_time)
    note(f"agent {outcome.id} {outcome.status}: {outcome.reason}")
    emit_result(args, summary(agent_dir, record_to_json(outcome)))
    export_trace(plan.meta, environ)
    return outcome.exit_code


def wait_for_placed(agent_dir: Path, standin: int, secrets_: Sequence[str]) -> dict[str, Any]:
    """A foreground agent placed on Ray: its outcome, waited for here; a stop signal (Ctrl-C) goes to its stand-in.

    The stand-in lives in a session of its own, so a terminal's Ctrl-C reaches
    only this process: passed on, SIGINT ends the agent `interrupted` on its
    node, SIGTERM or SIGHUP `killed`, as they would a local foreground agent.
    """
    passed: int | None = None
    # A stale heartbeat returns early; a placed agent's own deadline (or its node's loss) still ends it.
    while (outcome := wait_for_outcomes([agent_dir], "all", LIVENESS_POLL_S, secrets_).outcomes.get(agent_dir)) is None:
        if EarlyStop.pending is not None and EarlyStop.pending != passed:
            passed = EarlyStop.pending
            Supervised.signal_pid(standin, signal.SIGINT if passed == signal.SIGINT else signal.SIGTERM)
    return outcome


def cmd_background_runner(args: argparse.Namespace, environ: Mapping[str, str], entry: Entry) -> int:
    agent_dir = Path(args.agent_dir)
    EarlyStop.arm()
    guard = start_guard(agent_dir)  # first: a runner killed while starting is still settled
    sdk_loader = SdkLoader(environ)
    limit = time.monotonic() + REGISTER_WAIT_S
    while not (agent_dir / META).exists():  # the launcher writes it right after starting us
        if time.monotonic() > limit:
            raise StateError(f"{agent_dir} was never registered; nothing to run")
        time.sleep(0.01)
    meta = load_meta(agent_dir)
    standin = ray_standin(meta, environ)  # placed on Ray: meta.json names the stand-in on the launcher's host
    if (named := meta.pid) not in (os.getpid(), ForkedFor.pid, standin):
        # meta.json names another runner: the one its launcher started. A
        # second runner (a launcher that took a fork server's late answer for
        # none) runs nothing; its guard has nothing to settle.
        with contextlib.suppress(OSError):
            os.write(guard[1], GUARD_SETTLED)
        raise StateError(f"{agent_dir} is run by process {named} (its meta.json); this runner, {os.getpid()}, ran nothing")
    # `_run DIR` is a verb anyone's Bash can call, on a meta.json anyone can
    # write: the record runs only within what this process's verified parent
    # allows (the admission path), and what runs is the record as checked here.
    ancestry = ForkedFor.ancestry if ForkedFor.ancestry is not None else ancestry_context()
    problem = admission_problem(meta, inherited_context(environ, ancestry))
    if problem is not None:
        commit_outcome(agent_dir, refusal_outcome(meta, f"not admitted: {problem}"), secret_values(environ))
        raise RefusedError(f"{agent_dir} was not admitted: {problem}; start agents with spawn.py --task, never _run")
    pid, create_time, _ = own_identity()
    if ForkedFor.pid is not None or standin is not None:
        register_runner(pid, create_time, agent_dir)  # the launcher registered the stand-in; the agent runs here
    try:
        outcome = run_agent(agent_dir, find_cli(environ), secret_values(environ), sdk_loader, guard, admitted=meta, entry=entry)
    finally:
        unregister_runner(pid, create_time)
    emit(summary(agent_dir, record_to_json(outcome)))
    export_trace(load_meta(agent_dir), environ)
    return outcome.exit_code


def cmd_guard(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """Wait for the agent's spawn.py to exit; settle the agent if it left no outcome."""
    if args.above is not None:  # exec'd by the guard above a root whose runner is gone
        return guard_above_ends_tree(Path(args.agent_dir) if args.agent_dir else None, args.above, secret_values(environ))
    agent_dir = Path(args.agent_dir)
    with contextlib.suppress(OSError):
        sys.stdin.buffer.read()  # at EOF already when started by GUARD_BOOTSTRAP
    limit = time.monotonic() + 2.0
    while not (agent_dir / META).exists():  # a background launcher may still be writing it
        if time.monotonic() > limit:
            return ExitCode.OK  # never registered: not an agent, nothing to settle
        time.sleep(0.02)
    meta = load_meta(agent_dir)
    limit = time.monotonic() + KILL_GRACE_S
    while Supervised.of(meta).alive() and time.monotonic() < limit:
        time.sleep(0.01)  # the pipe closes a moment before the process is gone
    if meta.containment == "guard" and agent_dir in ancestor_agents():
        return ExitCode.OK  # the guard above the runner lives: it ends the tree, then settles it
    try:
        reap_agent(agent_dir, "guard", secret_values(environ))
    finally:
        end_tree(meta, "guard", secret_values(environ))  # what escaped the process tree, the group and the environment
    return ExitCode.OK


def cmd_wait(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    session = default_session(args, environ)
    root = resolve_session_root(None, environ)
    dirs = [find_agent_dir(i, session, root) for i in args.ids]
    with slot_lent_by_caller(environ):
        waited = wait_for_outcomes(dirs, args.mode, args.timeout, secret_values(environ))
    agents = [summary(d, waited.outcomes[d]) for d in dirs if d in waited.outcomes]
    stale = [d.name for d in waited.stale]
    pending = [d.name for d in dirs if d not in waited.outcomes and d not in waited.stale]
    failed = [a["id"] for a in agents if a["status"] != Status.DONE]
    status = "timeout" if not waited.finished else ("failed" if failed or stale else "done")
    emit({"status": status, "agents": agents, "stale": stale, "pending": pending})
    if stale:
        note(f"stale (alive, heartbeat stopped): {', '.join(stale)}; end them with 'spawn.py kill ID'")
    if not waited.finished:
        note(f"wait timed out; still running: {', '.join(pending)}")
        return ExitCode.TIMEOUT
    return ExitCode.AGENT_FAILED if failed or stale else ExitCode.OK


def cmd_status(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    root = resolve_session_root(None, environ)
    session: Path | None
    if args.target and (Path(args.target) / AGENTS_DIR).is_dir():
        session = Path(args.target).resolve()
    elif args.target and ("/" in args.target or args.target.startswith((".", "~"))):
        # An id has no slash: this was meant as a session directory.
        what = "is not a session directory (it has no agents/)" if Path(args.target).exists() else "does not exist"
        raise UsageError(f"{args.target} {what}; pass a session directory (under {root}) or an agent id, or nothing for the latest")
    elif args.target:
        session = Path(load_meta(find_agent_dir(args.target, default_session(args, environ), root)).session)
    else:
        session = default_session(args, environ)
    if session is None or not (session / AGENTS_DIR).is_dir():
        raise UsageError(f"no session found under {root}; pass a session directory or --session DIR")
    if args.watch:
        if args.json:
            raise UsageError("--watch draws for people; drop --json, or poll 'spawn.py status --json' yourself")
        return watch_status(session, sys.stdout)
    rows = tree_rows(session)
    asks = pending_asks(session)
    if args.json:
        emit({"session": str(session), **session_summary(session), "tokens": tree_tokens(rows), "agents": rows, "pending_asks": asks})
    else:
        print(format_tree(session, rows, session_summary(session)))
        for ask in asks:
            what = f"{ask['tool']}: {ask['input']} (rule {ask['rule']})"
            print(f"ask {ask['id']}: agent {ask['agent_id']} wants {what}; spawn.py approve|deny {ask['id']}")
    return ExitCode.OK


def answerer_name(as_name: str | None, verb: str) -> str:
    """The answer's `by`: --as NAME, else the verb; names spawn.py uses itself are reserved."""
    if as_name is None:
        return verb
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.:@\-]{0,63}", as_name) or as_name in ("timeout", "terminal", "rules"):
        raise UsageError(f"--as {as_name!r} is not a usable name; use letters, digits and _.:@- (not timeout, terminal or rules)")
    return as_name


def cmd_answer(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """approve / deny ASK_ID: the first answer wins."""
    root = resolve_session_root(None, environ)
    session = default_session(args, environ)
    candidates = [session] if session is not None and (asks_dir(session) / f"{args.ask_id}.json").exists() else []
    if not candidates and root.is_dir():
        candidates = [p.parent.parent for p in root.glob(f"*/asks/{args.ask_id}.json")]
    if not candidates:
        raise UsageError(f"no pending ask {args.ask_id!r}; run 'spawn.py status' to list asks, or pass --session DIR")
    session = candidates[0]
    verdict = "approve" if args.verb == "approve" else "deny"
    by = answerer_name(args.as_name, args.verb)
    answer_path = asks_dir(session) / f"{args.ask_id}.answer.json"
    if answer_path.exists() and not ask_socket_path(session, args.ask_id).exists():
        earlier = read_json(answer_path)
        raise UsageError(f"ask {args.ask_id} was already answered: {earlier.get('verdict')} (by {earlier.get('by')})")
    # The asking runner decides whether this caller may answer, from its
    # ancestry as the kernel names it; it writes the answer record itself.
    send_answer(session, args.ask_id, verdict, by, getattr(args, "text", None))
    emit({"ask": args.ask_id, "verdict": verdict})
    return ExitCode.OK


def cmd_agents(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    cwd = Path.cwd()
    if args.action == "new":
        if not re.fullmatch(r"[a-z0-9][a-z0-9\-]*", args.name):
            raise UsageError(f"agent name {args.name!r} must be lowercase letters, digits and dashes")
        folder = next((p for p, source in agent_dirs_for(cwd, environ) if source == "project"), cwd / ".claude" / "agents")
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{args.name}.md"
        try:
            write_new_file(path, AGENT_TEMPLATE.format(name=args.name).encode())
        except FileExistsError:
            raise UsageError(f"{path} already exists; edit it or choose another name") from None
        emit({"created": str(path)})
        return ExitCode.OK
    if args.action == "route":
        definitions, _ = load_definitions(cwd, environ)
        decision = route(args.task, definitions)
        if args.json:
            emit(decision)
        else:
            print(decision["chosen"] or "(default agent)")
            note(describe_routing(decision))
        return ExitCode.OK
    if args.action == "lint":
        problems: list[Problem] = []
        if args.paths:
            seen: dict[str, str] = {}
            for name in args.paths:
                path = Path(name)
                try:
                    d, found = parse_definition(path.read_text(), str(path), "project", known_tools(environ))
                except (OSError, UnicodeDecodeError) as exc:
                    raise UsageError(f"can't read {path}: {exc}") from None
                problems += found
                if d is not None and d.name in seen:
                    problems.append(Problem(str(path), 1, f"duplicate agent name {d.name!r} (also {seen[d.name]})"))
                elif d is not None:
                    seen[d.name] = str(path)
        else:
            _, problems = load_definitions(cwd, environ)
        for problem in problems:
            print(problem)
        errors = [p for p in problems if p.severity == "error"]
        if errors:
            raise UsageError(f"{len(errors)} error(s) in agent definitions; fix them (warnings don't stop a run)")
        print("spawn: agent definitions are valid", file=sys.stderr)
        return ExitCode.OK
    definitions, _ = load_definitions(cwd, environ)
    rows = [
        {"name": d.name, "source": d.source, "path": d.path, "tools": d.tools, "description": d.description}
        for d in sorted(definitions.values(), key=lambda d: d.name)
    ]
    if args.json:
        emit({"agents": rows})
    else:
        for row in rows:
            tools = ",".join(row["tools"]) if row["tools"] is not None else "(inherits)"
            print(f"{row['name']:<22} {row['source']:<8} {tools:<40} {row['description']}")
    return ExitCode.OK


def cmd_kill(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    session = default_session(args, environ)
    root = resolve_session_root(None, environ)
    dirs = [find_agent_dir(i, session, root) for i in args.ids]
    caller = kill_caller(environ)
    killed = [k for d in dirs for k in kill_agent(d, secret_values(environ), caller)]
    emit({"killed": killed})
    return ExitCode.OK


def cmd_reap(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    session = Path(args.target).resolve() if args.target else default_session(args, environ)
    if session is None or not (session / AGENTS_DIR).is_dir():
        raise UsageError("no session to reap; pass a session directory")
    reaped = reap_session(session, "reap", secret_values(environ))
    corrupt = corrupt_agents(session)
    for bad in corrupt:
        note(f"warning: agent {bad['id']} skipped: {bad['error']}")
    emit({"session": str(session), "reaped": reaped, "corrupt": corrupt})
    return ExitCode.OK
# ==================== end src/spawnlib/cli.py ====================

# ==================== begin src/spawnlib/steering_verbs.py ====================

















# ----------------------------------------------------------- steering verbs --
# `spawn.py send ID TEXT` and `spawn.py budget SESSION (--raise|--set) USD`:
# each prints one JSON object on stdout, as every verb does; tools/mcp_server.py
# and the Python API run them as they are.

STEERING_VERBS = ("send", "budget")


def add_steering_arguments(verb: str, p: Parser) -> None:
    """The arguments of send and budget on their verb parser (build_verb_parser)."""
    if verb == "send":
        p.description = (
            "Give a running agent a user message: it reads it at its next model request (or a turn reopened for it). "
            "An a2a node sends it on as the next message of its remote task. "
            "Not from the agent itself or its subtree (exit 4); a finished agent: exit 1; a command node: exit 2."
        )
        p.add_argument("id", metavar="ID")
        p.add_argument("text", metavar="TEXT", help="the message; '-' reads it from stdin")
        p.add_argument(
            "--as", dest="as_name", metavar="NAME", help="who sends it, recorded beside the sender's process (e.g. ci, mcp:CLIENT)"
        )
    elif verb == "budget":
        p.description = (
            "Change a tree's budget (its ledger, under the session lock); agents paused at their hold go on once it fits. "
            "Not from inside the tree (exit 4)."
        )
        p.add_argument("target", metavar="SESSION", help="the session directory, or its name under the session root")
        how = p.add_mutually_exclusive_group(required=True)
        how.add_argument("--raise", dest="raise_usd", type=float, metavar="USD", help="add USD to the tree's budget")
        how.add_argument("--set", dest="set_usd", type=float, metavar="USD", help="make the tree's budget USD")
        p.add_argument("--as", dest="as_name", metavar="NAME", help="who changes it, recorded in the ledger (default budget)")


def cmd_send(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    text = sys.stdin.read() if args.text == "-" else args.text
    if not text.strip():
        raise UsageError("the message is empty; give TEXT (or '-' to read it from stdin)")
    by = check_name(args.as_name, "send") if args.as_name is not None else None
    session = default_session(args, environ)
    agent_dir = find_agent_dir(args.id, session, resolve_session_root(None, environ))
    emit({"sent": True, **send_message(agent_dir, text, by)})
    return ExitCode.OK


def budget_session(target: str, environ: Mapping[str, str]) -> Path:
    """A session from a path or a name under the session root."""
    for candidate in (Path(target).expanduser(), resolve_session_root(None, environ) / target):
        if (candidate / AGENTS_DIR).is_dir():
            return candidate.resolve()
    raise UsageError(f"no session {target!r}; give a session directory or its name (see 'spawn.py status')")


def cmd_budget(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    for flag, value in (("--raise", args.raise_usd), ("--set", args.set_usd)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise UsageError(f"{flag} {value:g}: give a non-negative number of USD")
    session = budget_session(args.target, environ)
    by = check_name(args.as_name, "budget")
    secrets_ = secret_values(environ)
    # The caller's own ancestry, as the kernel has it: an agent of the tree
    # (its Bash, anything it started) may not pay itself more.
    refusal = tree_caller_refusal(session, calling_agents())
    if refusal is not None:
        record_budget_refusal(session, by, refusal, secrets_)
        raise RefusedError(f"refused: {refusal}; the attempt is recorded in {session / 'budget.attempts.jsonl'}")
    emit(change_budget(session, args.raise_usd, args.set_usd, by, secrets_))
    return ExitCode.OK
# ==================== end src/spawnlib/steering_verbs.py ====================

# ==================== begin src/spawnlib/main.py ====================































# --------------------------------------------------------------------- main --


def main(argv: Sequence[str] | None = None) -> int:
    """The one place where exceptions become exit codes."""
    argv = list(sys.argv[1:] if argv is None else argv)
    environ = dict(os.environ)
    traceback = "--traceback" in argv
    try:
        # Inside a sandboxed spawner, its runner runs spawns and kills (the broker).
        if (code := brokered(argv, VERBS)) is not None:
            return code
        if argv and argv[0] in VERBS:
            verb = argv[0]
            parser = build_verb_parser(verb)
            if verb in STEERING_VERBS:
                add_steering_arguments(verb, parser)
            args = parser.parse_args(argv[1:])
            args.verb = verb
            handlers: dict[str, Callable[[argparse.Namespace, Mapping[str, str]], int]] = {
                "wait": cmd_wait,
                "status": cmd_status,
                "kill": cmd_kill,
                "reap": cmd_reap,
                "approve": cmd_answer,
                "deny": cmd_answer,
                "send": cmd_send,
                "budget": cmd_budget,
                "agents": cmd_agents,
                "dag": cmd_dag,
                "estimate": cmd_estimate,
                **{v: cmd_workflow for v in WORKFLOW_VERBS},
                "state": cmd_state,
                "_run": functools.partial(cmd_background_runner, entry=main),
                "_guard": cmd_guard,
            }
            handler = handlers[verb]
            return handler(args, environ)
        if argv and not argv[0].startswith("-"):
            # The run path takes flags only: a first word is a mistyped verb or a bare task.
            raise UnknownVerbError(argv[0], [v for v in VERBS if not v.startswith("_")])
        return cmd_run(argv, environ, main)
    except SpawnError as exc:
        if traceback:
            raise
        print(f"spawn: error: {exc.message}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("spawn: error: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except BrokenPipeError:
        # The reader closed our stdout (`status --json | head -c1`): it has
        # what it wanted. Point stdout at /dev/null so the final flush is quiet.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return ExitCode.OK
    except OSError as exc:
        if traceback:
            raise
        print(f"spawn: error: {exc}; check the session directory and permissions", file=sys.stderr)
        return ExitCode.STATE
    except Exception as exc:
        # A bug or a record we did not foresee: one line, not a traceback,
        # and the state exit code, never "agent failed".
        if traceback:
            raise
        first = (str(exc).splitlines() or [""])[0][:300]
        print(f"spawn: error: internal error {type(exc).__name__}: {first}; rerun with --traceback for details", file=sys.stderr)
        return ExitCode.STATE


def use_bytecode_cache(environ: Mapping[str, str]) -> None:
    """Let the SDK's bytecode be written on first import and reused by every level.

    Every nested level imports the SDK again, and bytecode halves that. uv's
    compile-bytecode did it at install, but printed "Bytecode compiled N
    files" on every run. Python writes it itself on first import unless
    PYTHONDONTWRITEBYTECODE is set, or the environment is read-only; then a
    per-user cache directory takes it.
    """
    sys.dont_write_bytecode = False
    # The environment the SDK is installed in, beside psutil: found, not
    # imported (psutil is imported at first use, after the CLI's start).
    spec = importlib.machinery.PathFinder.find_spec("psutil")
    if spec is None or spec.origin is None:
        return
    site = Path(spec.origin).parent.parent
    if os.access(site, os.W_OK):
        return
    with contextlib.suppress(OSError, RuntimeError):
        cache = Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "spawn-py" / "pycache"
        cache.mkdir(parents=True, exist_ok=True)
        sys.pycache_prefix = str(cache)


def console_main() -> NoReturn:
    """The CLI as a program: `python spawn.py ...`, and the `spawn` command of the installed package."""
    use_bytecode_cache(os.environ)
    install_fast_start(os.environ)
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown (tens of ms with the SDK loaded): every record
    # is already durable and every file closed, and a parent waits on us.
    os._exit(code)


if __name__ == "__main__":
    console_main()
# ==================== end src/spawnlib/main.py ====================

# ==================== begin src/spawnlib/api.py ====================





















# --------------------------------------------------------------- python API --
# `import spawn` in a script or a notebook: spawn.run(task, tools=[...]) and
# friends. Every call runs this very file as the CLI, one process per agent
# (`sys.executable spawn.py ...`), so an agent started from Python gets every
# guarantee it gets from Bash: limits, containment, one outcome.
#
# This section comes after main's __main__ block (tools/bundle.py), so a CLI
# run, which every agent at every depth is, never executes it. That is also
# why its records (Result, Agent, Waited, AgentRow, mirroring schemas/) live
# here and not in the records section: a dataclass costs milliseconds to define.
# Flag values go as --flag=VALUE: a task or a topic may begin with a dash.


class RunOptions(TypedDict, total=False):
    """The run flags as keyword arguments: `--max-budget-usd 1` is `max_budget_usd=1.0`.

    Each key is the argparse dest of a flag of build_run_parser
    (test_api checks both ways); API_LEFT_OUT names the flags left out, and why.
    """

    topic: str
    resume: str
    tools: list[str]
    disallowed_tools: list[str]
    allow: list[str]
    deny: list[str]
    ask: list[str]
    model: str
    agent: str
    schema: str | Mapping[str, Any]
    """A schema name, a path, inline JSON text, or the schema itself as a dict."""
    output: str | os.PathLike[str]
    system_prompt: str
    system_prompt_file: str | os.PathLike[str]
    preset: Literal["claude_code"]
    sandbox: Literal["auto", "on", "off"]
    cwd: str | os.PathLike[str]
    max_depth: int
    timeout: float
    idle_timeout: float
    max_turns: int
    max_budget_usd: float
    on_budget: Literal["fail", "pause"]
    placement: str
    """local, inprocess, auto or ray:ADDRESS (docs/inprocess.md)."""
    no_wait: bool
    max_agents: int
    max_concurrent: int
    confirm_over: float
    session: str | os.PathLike[str]
    """The session root, as --session; the session directory is the agent's parent's parent."""
    parent_trace: str
    no_settings: bool


# Run flags with no keyword, and why (test_api checks every flag is in one place or the other).
API_LEFT_OUT = {
    "help": "Python has help(spawn.run)",
    "version": "spawn.__version__",
    "task": "run's and start's first argument",
    "task_file": "read the file and pass its text as the task",
    "background": "start() is the background run, run() the foreground one",
    "print": "the API returns the whole result as a record",
    "dry_run": "its resolved options are no Result; use the CLI's --dry-run",
    "traceback": "errors are exceptions already; the CLI's --traceback shows spawn.py's own",
}
# What a keyword takes at run time, beyond what its flag's argparse type takes.
COMMA_LIST = "A,B"  # the metavar of the flags that take a comma-separated list (--tools)
ENV_KEYWORD = "env"  # every call: the environment of the spawn.py it runs (default os.environ)


@dataclass
class Result:
    """What a foreground run prints: schemas/result.json. Returned by run() and in wait()'s agents."""

    id: str
    status: Status
    """An outcome status: done, failed, refused, timeout, killed or interrupted."""
    exit_code: int
    reason: str
    output: Any
    """The validated structured output, or the final text; cut past 16 KiB (output_truncated)."""
    duration_s: float
    agent_dir: str
    outcome: str
    """Path of outcome.json: read_outcome() loads it, with the output uncut."""
    transcript: str
    output_truncated: bool = False
    validation_errors: list[str] = field(default_factory=list)
    cost_usd: float | None = None
    """Absent (None), not 0, when unknown."""
    worktree: str | None = None

    def __post_init__(self) -> None:
        self.status = Status(self.status)

    @property
    def ok(self) -> bool:
        return self.status is Status.DONE

    def read_outcome(self) -> Outcome:
        """The agent's outcome.json as its record (schemas/outcome.json)."""
        return record_from_json(Outcome, json.loads(Path(self.outcome).read_text()))


@dataclass
class Agent:
    """A background agent, as start() launched it (what `spawn.py --background` prints)."""

    id: str
    status: Status
    """running, when launched."""
    pid: int
    agent_dir: str
    outcome: str
    done_marker: str
    fail_marker: str
    wait: str
    """The shell command that waits for it."""
    env: Mapping[str, str] | None = field(default=None, repr=False, compare=False)
    """The environment it was started with: its own wait(), kill() and send() use it too."""

    def __post_init__(self) -> None:
        self.status = Status(self.status)

    @property
    def session(self) -> Path:
        return session_of(self.agent_dir)

    def result(self, timeout: float | None = None) -> Result:
        """Block until the agent has an outcome (at most timeout seconds, else SpawnError 124)."""
        waited = wait(self, timeout=timeout, env=self.env)
        if not waited.agents:
            raise wait_timed_out(waited)
        return waited.agents[0]

    def kill(self) -> list[str]:
        return kill(self, env=self.env)

    def send(self, text: str, *, as_name: str | None = None) -> dict[str, Any]:
        return send(self, text, as_name=as_name, env=self.env)


@dataclass
class Waited:
    """What `spawn.py wait` prints: the agents with an outcome, and the others."""

    status: Literal["done", "failed", "timeout"]
    """done: every agent is done; failed: one is not (or is stale); timeout: wait's own timeout ran out."""
    agents: list[Result]
    stale: list[str]
    """Alive with a stopped heartbeat: end them with kill()."""
    pending: list[str]
    """Still running when the timeout ran out."""


@dataclass
class AgentRow:
    """One agent of `spawn.py status --json` (schemas/status.json, `agents`)."""

    id: str
    parent_id: str | None
    depth: int
    state: Status
    """An outcome status, or what an agent without one is observed to be (running, queued...)."""
    agent_dir: str
    task: str = ""
    """The task's first line, cut at 60 characters."""
    duration_s: float | None = None
    cost_usd: float | None = None
    """Its own spend; None when unknown or still running."""
    cost_known: bool = False
    subtree_cost_usd: float | None = None
    subtree_cost_known: bool = False
    pid: int = 0
    level: int = 0
    """Indentation in the tree (depth within this session's listing)."""
    containment: str | None = None
    resumed_from: str | None = None
    kind: str | None = None
    """native: one of Claude Code's own subagents, inside its parent's CLI."""
    agent_type: str | None = None
    usage: dict[str, Any] | None = None
    transcript: str | None = None
    error: str | None = None
    """Why its records can't be read (state corrupt)."""
    paused: dict[str, Any] | None = None
    """State paused: its paused.json (spent_usd, needed_usd, hold_usd, reason, since)."""

    def __post_init__(self) -> None:
        self.state = Status(self.state)


AgentRef = Agent | Result | AgentRow | str | os.PathLike[str]
"""An agent: its record, its id, or its directory."""


# ---------------------------------------------------------- python API: argv --


def run_flag_actions() -> dict[str, argparse.Action]:
    """The run parser's flags by keyword (argparse dest): the one list of options."""
    return {a.dest: a for a in build_run_parser()._actions if a.option_strings}


def options_argv(options: Mapping[str, Any]) -> list[str]:
    """The command-line flags for run's keyword arguments; UsageError for a bad one, as the CLI words it."""
    actions = run_flag_actions()
    argv: list[str] = []
    for key, value in options.items():
        action = actions.get(key) if key not in API_LEFT_OUT else None
        if action is None:
            if key in API_LEFT_OUT:
                raise UsageError(f"{key} is no option of the Python API: {API_LEFT_OUT[key]}")
            hint = did_you_mean(key, [*RunOptions.__annotations__, ENV_KEYWORD])
            raise UsageError(f"unknown option {key}={value!r}{hint or '; see help(spawn.run)'}")
        if value is None:
            continue  # None is the flag's default, as if not given
        flag = next(f for f in action.option_strings if f.startswith("--"))
        if isinstance(action, argparse.BooleanOptionalAction | argparse._StoreTrueAction):
            if not isinstance(value, bool):
                raise UsageError(f"{key}={value!r} must be True or False")
            argv += [flag] if value else [] if isinstance(action, argparse._StoreTrueAction) else [f"--no-{flag[2:]}"]
        elif isinstance(action, argparse._AppendAction):
            argv += [f"{flag}={item}" for item in option_list(key, value)]
        elif action.metavar == COMMA_LIST:
            argv.append(f"{flag}={','.join(option_list(key, value))}")
        else:
            argv.append(f"{flag}={option_text(key, value)}")
    return argv


def option_list(key: str, value: Any) -> list[str]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise UsageError(f"{key}={value!r} must be a list of strings, e.g. {key}=['Read']")
    if not all(isinstance(item, str) for item in value):
        raise UsageError(f"{key}={value!r} must hold strings only")
    return list(value)


def option_text(key: str, value: Any) -> str:
    """One keyword's value as its flag's text: a schema dict as JSON."""
    if key == "schema" and isinstance(value, Mapping):
        return json.dumps(value)
    if isinstance(value, os.PathLike):
        return str(os.fspath(value))
    if isinstance(value, bool):  # a bool is an int to Python, never a number of seconds to the CLI
        raise UsageError(f"{key}={value!r} takes a value, not True or False")
    if isinstance(value, str | int | float):
        return str(value)
    raise UsageError(f"{key}={value!r} has the wrong type; see help(spawn.run)")


def agent_arg(agent: AgentRef) -> str:
    """An agent as the verbs take it: its directory when known (any session, any root), else its id."""
    if isinstance(agent, Agent | Result | AgentRow):
        return agent.agent_dir
    return os.fspath(agent)


def agent_args(agents: AgentRef | Sequence[AgentRef]) -> list[str]:
    if isinstance(agents, Agent | Result | AgentRow | str | os.PathLike):
        return [agent_arg(agents)]
    found = [agent_arg(a) for a in agents]
    if not found:
        raise UsageError("no agents given; pass an agent, its id, or a list of them")
    return found


def run_argv(task: str, options: Mapping[str, Any], background: bool) -> list[str]:
    if not isinstance(task, str) or not task.strip():
        raise UsageError("the task is empty; pass the prompt as run's first argument")
    return [f"--task={task}", *options_argv(options), *(["--background"] if background else [])]


def budget_argv(session: AgentRef, raise_usd: float | None, set_usd: float | None, as_name: str | None) -> list[str]:
    if (raise_usd is None) == (set_usd is None):
        raise UsageError("pass raise_usd=USD or set_usd=USD, exactly one")
    flag, usd = ("--raise", raise_usd) if raise_usd is not None else ("--set", set_usd)
    target = str(session_of(session.agent_dir)) if isinstance(session, Agent | Result | AgentRow) else os.fspath(session)
    return ["budget", f"{flag}={option_text(flag[2:], usd)}", *as_argv(as_name), "--", target]


def send_argv(agent: AgentRef, text: str, as_name: str | None) -> list[str]:
    # After `--`, a message that begins with a dash is still the message.
    return ["send", *as_argv(as_name), "--", agent_arg(agent), text]


def as_argv(as_name: str | None) -> list[str]:
    return [f"--as={as_name}"] if as_name is not None else []


def status_argv(session: AgentRef | None) -> list[str]:
    if isinstance(session, Agent | Result | AgentRow):
        return ["status", "--json", str(session_of(session.agent_dir))]
    return ["status", "--json", *([os.fspath(session)] if session is not None else [])]


def session_of(agent_dir: str) -> Path:
    """The session directory holding an agent directory (or a native subagent's place in one)."""
    path = Path(agent_dir)
    return next((p.parent for p in path.parents if p.name == AGENTS_DIR), path.parent.parent)


def wait_argv(agents: AgentRef | Sequence[AgentRef], any_: bool, timeout: float | None) -> list[str]:
    more = ["--timeout", option_text("timeout", timeout)] if timeout is not None else []
    return ["wait", *agent_args(agents), *(["--any"] if any_ else []), *more]


# ------------------------------------------------------- python API: results --


def api_command(argv: Sequence[str]) -> list[str]:
    """This file run as the CLI by this interpreter: the same entry as `python spawn.py` from Bash."""
    return [sys.executable, str(SCRIPT_PATH), *argv]


def api_env(env: Mapping[str, str] | None) -> dict[str, str]:
    return dict(os.environ if env is None else env)


def cli_error_line(stderr: str) -> str | None:
    """The CLI's `spawn: error: ...` message, without its prefix."""
    found = [line for line in stderr.splitlines() if line.startswith("spawn: error: ")]
    return found[-1].removeprefix("spawn: error: ") if found else None


def error_for_exit(code: int, message: str) -> SpawnError:
    """The SpawnError subclass for a CLI exit code, with the CLI's message."""
    exit_code = ExitCode(code) if code in ExitCode._value2member_map_ else None
    error: SpawnError
    if exit_code is ExitCode.USAGE:
        error = UsageError(message)
    elif exit_code is ExitCode.STATE:
        error = StateError(message)
    elif exit_code is ExitCode.REFUSED:
        error = RefusedError(message)
    else:
        error = SpawnError(message)
        error.exit_code = exit_code or ExitCode.STATE
    return error


def cli_data(code: int, stdout: str, stderr: str, *, outcome_ok: bool = False) -> dict[str, Any]:
    """The one JSON object the CLI printed, or the SpawnError its exit code and error line say.

    outcome_ok: a run or a wait whose agents ended otherwise than done exits
    with their status's code but prints their result: that is an answer, not an error.
    """
    if code < 0:  # ended by a signal: the shell's 128+N, as ExitCode counts them
        code = 128 - code
    message = cli_error_line(stderr)
    data: Any = None
    if stdout.strip():
        try:
            data = json.loads(stdout)
        except json.JSONDecodeError:
            data = None
    if isinstance(data, dict) and (code == ExitCode.OK or (message is None and outcome_ok)):
        return data
    if message is None:
        tail = " / ".join(stderr.strip().splitlines()[-3:]) or "nothing on stderr"
        message = f"spawn.py exited with status {code} and no result ({tail})"
    raise error_for_exit(code, message)


def api_call(argv: Sequence[str], env: Mapping[str, str] | None, *, outcome_ok: bool = False) -> dict[str, Any]:
    """Run the CLI to its end. An interrupt (a notebook's, which reaches only this
    process) is passed on: the CLI ends the agent's subtree and records it."""
    with subprocess.Popen(
        api_command(argv), env=api_env(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            stdout, stderr = proc.communicate()
        except BaseException:
            Supervised.signal_pid(proc.pid, signal.SIGINT)  # our own child, not yet reaped
            proc.communicate()
            raise
    return cli_data(proc.returncode, stdout, stderr, outcome_ok=outcome_ok)


async def api_acall(argv: Sequence[str], env: Mapping[str, str] | None, *, outcome_ok: bool = False) -> dict[str, Any]:
    """api_call() for asyncio: a cancelled call interrupts its CLI, which ends the subtree."""
    import asyncio

    proc = await asyncio.create_subprocess_exec(
        *api_command(argv), env=api_env(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        out, err = await proc.communicate()
    except BaseException:
        if proc.returncode is None:
            Supervised.signal_pid(proc.pid, signal.SIGINT)  # our own child, not yet reaped
        await asyncio.shield(proc.wait())
        raise
    assert proc.returncode is not None  # communicate() waited for it
    return cli_data(proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"), outcome_ok=outcome_ok)


def to_waited(data: Mapping[str, Any]) -> Waited:
    agents = [record_from_json(Result, a) for a in data.get("agents", [])]
    return Waited(status=data["status"], agents=agents, stale=list(data.get("stale", [])), pending=list(data.get("pending", [])))


def to_rows(data: Mapping[str, Any]) -> list[AgentRow]:
    return [record_from_json(AgentRow, row) for row in data.get("agents", [])]


def to_agent(data: Mapping[str, Any], env: Mapping[str, str] | None) -> Agent:
    return dataclasses.replace(record_from_json(Agent, data), env=env)


def wait_timed_out(waited: Waited) -> SpawnError:
    error = SpawnError(f"wait timed out; still running: {', '.join(waited.pending)}")
    error.exit_code = ExitCode.TIMEOUT
    return error


# ---------------------------------------------------- python API: functions --


def run(task: str, *, env: Mapping[str, str] | None = None, **options: Unpack[RunOptions]) -> Result:
    """Run an agent in the foreground, as `spawn.py --task TASK ...`, and return its result.

    An agent that ends otherwise than done is a Result too (check .ok or
    .status); bad options, a refusal by a limit, or a broken session raise the
    SpawnError the CLI would report (UsageError, RefusedError, StateError),
    with its message and exit_code.
    """
    return record_from_json(Result, api_call(run_argv(task, options, False), env, outcome_ok=True))


def start(task: str, *, env: Mapping[str, str] | None = None, **options: Unpack[RunOptions]) -> Agent:
    """Start an agent in the background (`spawn.py --background`); wait for it with wait() or agent.result()."""
    return to_agent(api_call(run_argv(task, options, True), env), env)


def wait(
    agents: AgentRef | Sequence[AgentRef],
    *,
    any: bool = False,  # the CLI's --any, by its name
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
) -> Waited:
    """Block until the agents have outcomes (any=True: until one has), at most timeout seconds."""
    return to_waited(api_call(wait_argv(agents, any, timeout), env, outcome_ok=True))


def status(session: AgentRef | None = None, *, env: Mapping[str, str] | None = None) -> list[AgentRow]:
    """A session's agents, parents before children: a session directory, an agent
    (its session), or None for the latest session under the session root."""
    return to_rows(api_call(status_argv(session), env))


def kill(agents: AgentRef | Sequence[AgentRef], *, env: Mapping[str, str] | None = None) -> list[str]:
    """End agents and their subtrees, deepest first (each records killed); the ids ended."""
    return list(api_call(["kill", *agent_args(agents)], env).get("killed", []))


def send(agent: AgentRef, text: str, *, as_name: str | None = None, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Deliver a message to a running agent (`spawn.py send ID TEXT`): it sees it at its next turn.

    as_name: who sends it, recorded with it (`--as NAME`).
    """
    return api_call(send_argv(agent, text, as_name), env)


def budget(
    session: AgentRef,
    *,
    raise_usd: float | None = None,
    set_usd: float | None = None,
    as_name: str | None = None,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Raise or set a tree's budget (`spawn.py budget SESSION --raise|--set USD`); paused agents that now fit go on.

    session: a session directory or its name, or an agent of it; as_name: who changes it (`--as NAME`).
    """
    return api_call(budget_argv(session, raise_usd, set_usd, as_name), env)


async def arun(task: str, *, env: Mapping[str, str] | None = None, **options: Unpack[RunOptions]) -> Result:
    """run() for asyncio: many agents at once with asyncio.gather; cancelling one ends its subtree."""
    return record_from_json(Result, await api_acall(run_argv(task, options, False), env, outcome_ok=True))


async def astart(task: str, *, env: Mapping[str, str] | None = None, **options: Unpack[RunOptions]) -> Agent:
    """start() for asyncio."""
    return to_agent(await api_acall(run_argv(task, options, True), env), env)


async def await_(
    agents: AgentRef | Sequence[AgentRef],
    *,
    any: bool = False,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
) -> Waited:
    """wait() for asyncio (`await` itself is a keyword)."""
    return to_waited(await api_acall(wait_argv(agents, any, timeout), env, outcome_ok=True))


async def astatus(session: AgentRef | None = None, *, env: Mapping[str, str] | None = None) -> list[AgentRow]:
    """status() for asyncio."""
    return to_rows(await api_acall(status_argv(session), env))


async def akill(agents: AgentRef | Sequence[AgentRef], *, env: Mapping[str, str] | None = None) -> list[str]:
    """kill() for asyncio."""
    return list((await api_acall(["kill", *agent_args(agents)], env)).get("killed", []))


async def asend(agent: AgentRef, text: str, *, as_name: str | None = None, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """send() for asyncio."""
    return await api_acall(send_argv(agent, text, as_name), env)


async def abudget(
    session: AgentRef,
    *,
    raise_usd: float | None = None,
    set_usd: float | None = None,
    as_name: str | None = None,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """budget() for asyncio."""
    return await api_acall(budget_argv(session, raise_usd, set_usd, as_name), env)
# ==================== end src/spawnlib/api.py ====================
