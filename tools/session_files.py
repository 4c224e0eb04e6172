"""The session protocol (sessions/README.md) as spawn.py's runtime siblings read it.

mcp_server.py, a2a_server.py, view.py and otel_export.py import this module
from beside them: a script's own folder is on sys.path, whatever the working
directory. It holds what they would otherwise each write again: bounded
record readers, an agent's subtree, pending asks, Claude Code's native
subagents, the model calls the tree's gateway metered (the ledger's spend
lines), running spawn.py's command line, and the two servers' loopback and
bearer-token checks.

Standard library only, so it adds nothing to the siblings' PEP 723 blocks and
locks, and it never imports spawn.py: the siblings work with any copy of it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import hmac
import ipaddress
import itertools
import json
import math
import os
import re
import shlex
import stat
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

# Exactly one of these appears once outcome.json is whole (the commit protocol).
MARKERS = (".done", ".fail")
# The names sessions/README.md gives the records read here (spawn.py's AGENTS_DIR, META,
# OUTCOME, PAUSED and NATIVE_LOG; asks/ is its asks_dir).
AGENTS_DIR = "agents"
META = "meta.json"
OUTCOME = "outcome.json"
PAUSED = "paused.json"
NATIVE_LOG = "native.jsonl"
LEDGER = "ledger.jsonl"
ASKS_DIR = "asks"
# The four token counts of a usage record (spawn.py's USAGE_COUNTS).
USAGE_COUNTS = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}

# spawn.py's bounds on what its record readers parse (RECORD_MAX_BYTES and
# JSON_MAX_DEPTH in src/spawnlib/core/constants.py), copied because a sibling never
# imports spawn.py: tests/test_session_files.py holds these bounds and names
# equal to spawn.py's, and reads fixture sessions with both readers. Anything
# with Bash can write a session file: a huge or deeply nested one must make
# that record unreadable, not exhaust or crash (RecursionError) the sibling
# that reads it.
RECORD_MAX_BYTES = 64 << 20
JSON_MAX_DEPTH = 64
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = re.compile(r"[^\[\]{}]+")


class CliError(RuntimeError):
    """spawn.py refused or failed a verb, or printed no JSON object; the text is one line."""


# ------------------------------------------------------------------ reading --


def parse_json(data: str | bytes) -> Any:
    """json.loads, bounded in size and depth as spawn.py's parse_json: ValueError, never a RecursionError."""
    if len(data) > RECORD_MAX_BYTES:
        raise ValueError(f"larger than {RECORD_MAX_BYTES} bytes")
    text = data.decode() if isinstance(data, bytes) else data  # UnicodeDecodeError is a ValueError
    # Fewer openers can't nest deeper; else count the brackets outside strings.
    if text.count("[") + text.count("{") > JSON_MAX_DEPTH:
        brackets = _NOT_BRACKETS.sub("", _JSON_STRING.sub("", text))
        if max(itertools.accumulate(1 if c in "[{" else -1 for c in brackets)) > JSON_MAX_DEPTH:
            raise ValueError(f"nested deeper than {JSON_MAX_DEPTH} levels")
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deep") from None


def open_regular(path: Path) -> IO[bytes]:
    """path opened to read; OSError unless it is a regular file.

    O_NONBLOCK: a FIFO put where a record belongs must not hang its reader.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    return os.fdopen(fd, "rb")


def read_json(path: Path) -> dict[str, Any] | None:
    """A record, or None when it is absent, not (yet) whole, or past the bounds."""
    try:
        with open_regular(path) as fh:
            data = parse_json(fh.read(RECORD_MAX_BYTES + 1))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def parse_jsonl(lines: Iterable[bytes]) -> list[dict[str, Any]]:
    """The whole JSON objects among lines; a torn, foreign or oversized line is skipped."""
    records = []
    for line in lines:
        try:
            record = parse_json(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def iter_jsonl(path: Path, containing: bytes = b"") -> Iterator[dict[str, Any]]:
    """The JSON objects of a JSONL file, one line at a time; with `containing`, only lines that contain it.

    A line longer than RECORD_MAX_BYTES is skipped whole, without holding it in memory.
    """
    try:
        with open_regular(path) as fh:
            in_long_line = False
            while line := fh.readline(RECORD_MAX_BYTES + 1):
                too_long = in_long_line or len(line) > RECORD_MAX_BYTES
                in_long_line = too_long and not line.endswith(b"\n")
                if not too_long and containing in line:
                    yield from parse_jsonl([line])
    except OSError:
        return


def parse_time(value: Any) -> float | None:
    """A record's ISO 8601 time as Unix seconds, or None."""
    if not isinstance(value, str):
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def clip(text: str, limit: int) -> str:
    """text on one line, at most limit characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ------------------------------------------------------------------ records --


def committed_outcome(agent_dir: Path) -> dict[str, Any] | None:
    """The agent's outcome once its marker says it is committed; None before."""
    if not any((agent_dir / m).exists() for m in MARKERS):
        return None
    return read_json(agent_dir / OUTCOME)


def subtree_ids(session: Path, roots: set[str]) -> set[str]:
    """The agents in `roots` and all their descendants, from meta.json parent_id."""
    parents: dict[str, str | None] = {}
    for meta_path in (session / AGENTS_DIR).glob(f"*/{META}"):
        meta = read_json(meta_path) or {}
        parents[meta_path.parent.name] = meta.get("parent_id")
    found = set(roots)
    changed = True
    while changed:
        changed = False
        for agent, parent in parents.items():
            if agent not in found and parent in found:
                found.add(agent)
                changed = True
    return found & (set(parents) | roots)


def ask_paths(session: Path) -> list[Path]:
    """The session's asks (asks/q-ID.json, not their answers), by name."""
    folder = session / ASKS_DIR
    return [p for p in sorted(folder.glob("q-*.json")) if not p.name.endswith(".answer.json")] if folder.is_dir() else []


def pending_asks(session: Path, agents: set[str] | None = None, *, oldest_first: bool = False) -> list[dict[str, Any]]:
    """Asks without an answer file, raised by one of `agents` (None: anyone); by name, or oldest first."""
    paths = [p for p in ask_paths(session) if not p.with_name(f"{p.stem}.answer.json").exists()]
    if oldest_first:
        paths.sort(key=mtime)
    found = []
    for path in paths:
        ask = read_json(path)
        if ask is not None and (agents is None or ask.get("agent_id") in agents):
            found.append(ask)
    return found


def paused_agents(session: Path, agents: set[str]) -> list[dict[str, Any]]:
    """paused.json of each of `agents` that is paused at its budget now (no outcome yet), by id."""
    found = []
    for agent in sorted(agents):
        agent_dir = session / AGENTS_DIR / agent
        paused = read_json(agent_dir / PAUSED)
        if paused is not None and committed_outcome(agent_dir) is None:
            found.append(paused)
    return found


def mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # gone meanwhile: read_json skips it
        return 0.0


def native_subagents(agent_dir: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """Claude Code's own subagents from native.jsonl: by the CLI's agent id, each event's line (start, stop)."""
    nodes: dict[str, dict[str, dict[str, Any]]] = {}
    for line in iter_jsonl(agent_dir / NATIVE_LOG):
        if "agent_id" in line and "event" in line:
            nodes.setdefault(str(line["agent_id"]), {})[str(line["event"])] = line
    return nodes


def ledger_number(value: Any) -> float | None:
    """A cost or a span of seconds as the ledger may carry it: a finite number >= 0 (not a bool); else None (spawn.py's ledger_usd)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


def token_count(value: Any) -> int:
    """One of a usage record's counts: a positive finite number, else 0 (spawn.py's token_counts)."""
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < math.inf else 0


def model_calls(session: Path) -> dict[str, list[dict[str, Any]]]:
    """Agent id -> its model calls, oldest first, from the ledger's `spend` lines (what the tree's gateway metered).

    Each call as `spawn.py status --json` lists it (schemas/status.json,
    `model_calls`): time (when it ended), model, usage (the four counts),
    cost_usd, status, and duration_s and ttfb_s where known; the same rules as
    spawn.py's model_calls, which tests/test_session_files.py holds it to.
    Unknown fields are ignored; a line that isn't a spend of an agent is skipped.
    """
    calls: dict[str, list[dict[str, Any]]] = {}
    for entry in iter_jsonl(session / LEDGER, b'"spend"'):
        agent, at = entry.get("id"), entry.get("time")
        if entry.get("kind") != "spend" or not isinstance(agent, str) or not isinstance(at, str):
            continue
        usage: dict[str, Any] = found if isinstance(found := entry.get("usage"), dict) else {}
        model, status = entry.get("model"), entry.get("status")
        call: dict[str, Any] = {
            "time": at,
            "model": model if isinstance(model, str) else "",
            "usage": {k: token_count(usage.get(k)) for k in USAGE_COUNTS},
            "cost_usd": ledger_number(entry.get("cost_usd")) or 0.0,
            "status": status if isinstance(status, str) else "",
        }
        for key in ("duration_s", "ttfb_s"):
            if (seconds := ledger_number(entry.get(key))) is not None:
                call[key] = seconds
        calls.setdefault(agent, []).append(call)
    return calls


# ----------------------------------------------------------- spawn.py's CLI --


def spawn_command(spawn: str, python: str | None, environ: Mapping[str, str]) -> list[str]:
    """How a sibling runs spawn.py: --python CMD, else $SPAWN_PYTHON, else uv on its PEP 723 block."""
    if python:
        runner = shlex.split(python)
    elif environ.get("SPAWN_PYTHON"):
        runner = [environ["SPAWN_PYTHON"]]
    else:
        runner = ["uv", "run", "--quiet", "--script"]
    return [*runner, str(Path(spawn).resolve())]


async def run_cli(
    command: Sequence[str], *args: str, env: Mapping[str, str], cwd: Path | str | None = None, stdin: bytes | None = None
) -> tuple[int, str, str]:
    """Run a spawn.py verb: (exit code, stdout, stderr)."""
    import asyncio  # here: view.py and otel_export.py never run spawn.py

    proc = await asyncio.create_subprocess_exec(
        *command,
        *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(env),
        cwd=cwd,
    )
    out, err = await proc.communicate(stdin)
    return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")


def error_line(stderr: str, code: int) -> str:
    """spawn.py's one-line error, or the last line it printed."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("spawn: error:"):
            return line
    return lines[-1] if lines else f"spawn.py exited {code}"


def cli_json(code: int, out: str, err: str, ok: Sequence[int] = (0,)) -> dict[str, Any]:
    """The JSON object a verb printed last on stdout; CliError when it failed or printed none."""
    if code not in ok:
        raise CliError(error_line(err, code))
    try:
        data = parse_json(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise CliError(f"spawn.py printed no JSON (exit {code}): {error_line(err, code)}") from None
    if not isinstance(data, dict):
        raise CliError(f"spawn.py printed {type(data).__name__}, expected an object")
    return data


def min_known(*values: float | None) -> float | None:
    """The smallest of the limits that are set: spawn.py narrows every limit that way."""
    known = [v for v in values if v is not None]
    return min(known) if known else None


# ------------------------------------------------------------------ serving --


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def token_matches(header: bytes, token: str) -> bool:
    """Whether an Authorization header carries the bearer token.

    Bytes: compare_digest refuses a str with non-ASCII characters, so any header is a yes or no, never a 500.
    """
    return hmac.compare_digest(header, f"Bearer {token}".encode())


def read_token_file(path: str) -> str:
    """The bearer token in --token-file; ValueError, one line, when it can't be read or is empty.

    Read as any file (not open_regular): a pipe such as <(pass show token) is a fine place for it.
    """
    try:
        token = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"can't read --token-file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if not token:
        raise ValueError(f"--token-file {path} is empty; put the bearer token in it")
    return token


# Who is calling (the MCP and A2A servers): a loopback caller is identified,
# not trusted by its address: the kernel's
# socket table names the process at the other end of the connection, and its
# ancestry (kept by the kernel; a sandboxed agent's proxy too is its CLI's
# child) tells whether it runs inside an agent this server started. Such a
# caller is refused: with the server's tools it could answer its own asks or
# raise its own tree's budget. Linux (/proc); elsewhere nothing is found.


def socket_inode(ip: str, port: int) -> int | None:
    """The inode of the TCP socket whose local end is ip:port (/proc/net/tcp, tcp6), or None."""
    import socket

    want = ip.removeprefix("::ffff:")
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                address, _, hex_port = fields[1].partition(":")
                if int(hex_port, 16) != port:
                    continue
                raw = bytes.fromhex(address)
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                local = socket.inet_ntop(family, words).removeprefix("::ffff:")
                if local == want:
                    return int(fields[9])
    return None


def socket_owner(inode: int) -> int | None:
    """The pid of a process holding socket inode (its fds, as /proc shows them), or None."""
    target = f"socket:[{inode}]"
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in os.scandir(f"/proc/{entry.name}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(fd.path) == target:
                        return int(entry.name)
    return None


def process_line(pid: int) -> tuple[int, float] | None:
    """(parent pid, start time as seconds since the epoch) of a process, from /proc, or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime"))
    except (OSError, StopIteration, ValueError):
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[1]), boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def served_runners(sessions: set[Path]) -> dict[int, tuple[float, str]]:
    """pid: (start time, agent id) of every agent's runner in the sessions this server serves."""
    runners: dict[int, tuple[float, str]] = {}
    for session in sessions:
        for meta_path in session.glob("agents/*/meta.json"):
            meta = read_json(meta_path) or {}
            if isinstance(meta.get("pid"), int) and isinstance(meta.get("create_time"), (int, float)):
                runners[meta["pid"]] = (float(meta["create_time"]), str(meta.get("id")))
    return runners


def served_agent_calling(client: tuple[str, int] | None, sessions: set[Path]) -> str | None:
    """The id of the agent (of a tree this server serves) that a loopback connection's process runs under, or None."""
    if client is None or not sessions or not is_loopback(client[0]):
        return None
    inode = socket_inode(client[0], client[1])
    pid = socket_owner(inode) if inode else None
    runners = served_runners(sessions)
    for _ in range(256):  # the ancestry, up to pid 1
        if pid is None or pid <= 1:
            return None
        line = process_line(pid)
        if line is None:
            return None
        if pid in runners and abs(runners[pid][0] - line[1]) < 1.0:  # the same process, not a reused pid
            return runners[pid][1]
        pid = line[0]
    return None
