"""The one commit point of an agent's outcome, and the status row it leaves in the session's index.

Above supervision: a status row says whether an unfinished agent still
lives, which only its process identity tells.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core.constants import HEARTBEAT, NATIVE_LOG, OUTCOME, PAUSED, SLOT_LENT, SLOT_MARKER
from ..core.errors import CorruptRecordError, SpawnError
from ..core.pure import native_usage, outcome_problem, parse_json, redacted_json, started_timestamp, token_counts
from ..core.records import AgentMeta, Outcome, Status, record_to_json
from ..session.protocol import (
    STATUS_INDEX,
    charge,
    ensure_marker,
    load_meta_keyed,
    open_regular,
    publish_once,
    read_json,
    read_outcome_keyed,
    read_regular_file,
)
from .supervisor import Supervised, heartbeat_age, stale_in


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
