"""The on-disk session protocol: atomic writes, records' readers and writers, markers, the ledger file."""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import functools
import json
import os
import stat
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from ..core.constants import (
    DEFAULT_SESSION_ROOT,
    ENV_LOG_MAX,
    ENV_SESSION_ROOT,
    INPUT_MAX_BYTES,
    JSON_MAX_DEPTH,
    KILL_REQUEST,
    LIMITS,
    META,
    OUTCOME,
    RECORD_MAX_BYTES,
    SESSION_LOCK,
    TRANSCRIPT,
    TRUNCATED_LINE,
    YAML_MAX_NODES,
)
from ..core.errors import CorruptRecordError, InputError, SpawnError, StateError, UnknownAgentError, UsageError
from ..core.forkstate import on_fork
from ..core.pure import (
    estimate_cost,
    new_agent_id,
    parse_json,
    price_family,
    redacted_json,
    slugify,
    started_timestamp,
    token_hex,
    utc_now_iso,
)
from ..core.records import AgentMeta, Limits, Outcome, Status, record_from_json
from ..core.settings import log_max_bytes
from ..programs.fast_start_hook import cache_folder

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


# The agent logs this process stopped writing at the cap: each gets its one
# truncation line, and the outcome names them (only an agent's runner writes its logs).
LOGS_TRUNCATED: set[Path] = set()
on_fork("LOGS_TRUNCATED", LOGS_TRUNCATED.clear)  # which logs this process capped


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
def flocked(path: Path) -> Iterator[None]:
    """An exclusive flock of path (made 0600 if missing), held for the block: a crashed holder never leaves it stale."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


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

    IN_MODIFY = 0x02  # a file written to (a brokered spawn's output, as it comes)
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
