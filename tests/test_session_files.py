"""tools/session_files.py, the session protocol as the runtime siblings read it.

The siblings never import spawn.py, so session_files copies what spawn.py's own
readers do. The conformance tests here keep the copy honest: they read the
fixture sessions (tests/fixtures/sessions: a finished tree, a running agent,
corrupt records) with both session_files and spawn.py's readers, compare what
each finds, and compare session_files' bounds and record names with spawn.py's
constants. The unit tests after them pin the behaviour only session_files has;
the siblings' own test files drive them end to end over the same functions.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import session_files  # from tools/, which conftest.py (loaded first) puts on sys.path
from conftest import ROOT

import spawn

FIXTURES = ROOT / "tests" / "fixtures" / "sessions"
SESSIONS = ("finished", "running", "corrupt")


@pytest.fixture
def sessions(tmp_path: Path) -> Path:
    """A copy of the fixture sessions: spawn.py's outcome reader may complete a commit it finds torn."""
    shutil.copytree(FIXTURES, tmp_path / "sessions")
    return tmp_path / "sessions"


def agent_dirs(root: Path) -> Iterator[Path]:
    for name in SESSIONS:
        yield from sorted((root / name / spawn.AGENTS_DIR).iterdir())


def or_none(read: Callable[[Path], Any], path: Path) -> Any:
    """What spawn.py's reader found at path, None where it raised for a record that is absent or unreadable."""
    try:
        return read(path)
    except (OSError, spawn.SpawnError):
        return None


def test_bounds_and_record_names_are_spawn_pys() -> None:
    assert session_files.RECORD_MAX_BYTES == spawn.RECORD_MAX_BYTES
    assert session_files.JSON_MAX_DEPTH == spawn.JSON_MAX_DEPTH
    assert session_files.MARKERS == (spawn.DONE_MARKER, spawn.FAIL_MARKER)
    names = ("AGENTS_DIR", "META", "OUTCOME", "PAUSED", "NATIVE_LOG", "LEDGER", "USAGE_COUNTS")
    assert {n: getattr(session_files, n) for n in names} == {n: getattr(spawn, n) for n in names}
    assert spawn.asks_dir(Path("session")).name == session_files.ASKS_DIR


def test_fixtures_hold_what_the_comparisons_need(sessions: Path) -> None:
    """Every case below is there: a test that compares nothing would pass whatever the readers did."""
    outcomes = {d.name: session_files.committed_outcome(d) for d in agent_dirs(sessions)}
    assert [a for a, o in outcomes.items() if o is not None] == ["a0-65cdde", "a1-840a7f", "a2-0d80e2", "a1-bbbbbb", "a2-ffffff"]
    assert not (sessions / "running" / "agents" / "a0-17c099" / spawn.OUTCOME).exists()
    assert len(session_files.pending_asks(sessions / "finished")) == 2 and len(session_files.pending_asks(sessions / "corrupt")) == 1
    assert set(session_files.native_subagents(sessions / "finished" / "agents" / "a1-840a7f")) == {"n-explore-1", "n-general-2"}


def json_texts(root: Path) -> list[str | bytes]:
    """Every record and JSONL line of the fixtures, and texts at the bounds."""
    texts: list[str | bytes] = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        texts += data.splitlines() if path.suffix == ".jsonl" else [data]
    deepest = "[" * spawn.JSON_MAX_DEPTH + "]" * spawn.JSON_MAX_DEPTH
    texts += [deepest, f"[{deepest}]", "[" * 100_000, json.dumps({"text": "[" * 1000}), b"\xff\xfe{}", "", "{", "[1]"]
    texts.append(" " * spawn.RECORD_MAX_BYTES + "{}")
    return texts


def parsed(parse: Callable[[str | bytes], Any], text: str | bytes) -> tuple[str, Any]:
    """What a parser made of text: its value, or that it refused it (a ValueError, never a RecursionError)."""
    try:
        return "value", parse(text)
    except ValueError:
        return "refused", None


def test_parse_json_agrees_with_spawn_pys(sessions: Path) -> None:
    for text in json_texts(sessions):
        assert parsed(session_files.parse_json, text) == parsed(spawn.parse_json, text), text[:200]


def test_read_json_reads_every_record_as_spawn_py_does(sessions: Path) -> None:
    records = sorted(p for p in sessions.rglob("*.json"))
    assert len(records) > 30
    for path in [*records, sessions / "finished" / "missing.json", sessions / "finished" / "agents"]:
        assert session_files.read_json(path) == or_none(spawn.read_json, path), path
    fifo = sessions / "corrupt" / "agents" / "a1-dddddd" / spawn.OUTCOME
    os.mkfifo(fifo)  # neither may block on it
    assert session_files.read_json(fifo) is None and or_none(spawn.read_json, fifo) is None


def test_an_outcome_is_committed_for_both_readers_alike(sessions: Path) -> None:
    for agent_dir in agent_dirs(sessions):
        assert session_files.committed_outcome(agent_dir) == or_none(spawn.read_outcome, agent_dir), agent_dir.name


def test_a_torn_commit_a_sibling_waits_for_spawn_py_completes(sessions: Path) -> None:
    """outcome.json published, its marker not yet (the committer died between): spawn.py's reader writes
    the marker, which is the commit's last step; a sibling waits for it, then reads the same outcome."""
    agent_dir = sessions / "finished" / "agents" / "a2-0d80e2"
    (agent_dir / spawn.DONE_MARKER).unlink()
    assert session_files.committed_outcome(agent_dir) is None
    outcome = spawn.read_outcome(agent_dir)
    assert outcome is not None and (agent_dir / spawn.DONE_MARKER).exists()
    assert session_files.committed_outcome(agent_dir) == outcome


def test_a_subtree_is_the_agent_and_spawn_pys_descendants(sessions: Path) -> None:
    for agent_dir in agent_dirs(sessions):
        session, agent = agent_dir.parent.parent, agent_dir.name
        below = {d.name for d in spawn.descendants_of(session, agent)}
        assert session_files.subtree_ids(session, {agent}) == {agent} | below, agent
    assert session_files.subtree_ids(sessions / "finished", {"a1-840a7f"}) == {"a1-840a7f", "a2-0d80e2"}


def test_pending_asks_are_spawn_pys(sessions: Path) -> None:
    for name in SESSIONS:
        assert session_files.pending_asks(sessions / name) == spawn.pending_asks(sessions / name), name


def test_native_subagents_are_spawn_pys_native_rows(sessions: Path) -> None:
    """The same subagents, and the same ones stopped (spawn.py: state done)."""
    for agent_dir in agent_dirs(sessions):
        meta = or_none(spawn.load_meta, agent_dir)
        if meta is None:
            continue
        rows = spawn.native_rows(agent_dir, meta, parent_ended=True)
        nodes = session_files.native_subagents(agent_dir)
        assert {f"n-{i}" for i in nodes} == {r["id"] for r in rows}, agent_dir.name
        stopped = {f"n-{i}" for i, events in nodes.items() if "stop" in events}
        assert stopped == {r["id"] for r in rows if r["state"] == spawn.Status.DONE.value}, agent_dir.name


def test_model_calls_are_spawn_pys_and_sum_to_each_agents_spend(sessions: Path) -> None:
    """The ledger's spend lines as both readers list them (status --json's model_calls), junk and all."""
    for name in SESSIONS:
        ours = {agent: [spawn.record_to_json(c) for c in calls] for agent, calls in spawn.read_model_calls(sessions / name).items()}
        assert session_files.model_calls(sessions / name) == ours, name
    calls = session_files.model_calls(sessions / "finished")
    assert {agent: len(c) for agent, c in calls.items()} == {"a0-65cdde": 2, "a1-840a7f": 2, "a2-0d80e2": 1}
    state = spawn.read_ledger(sessions / "finished")
    for agent, found in calls.items():
        assert sum(c["cost_usd"] for c in found) == pytest.approx(state.spends[agent]), agent
    cut = calls["a1-840a7f"][1]
    assert cut["status"] == "cut" and "ttfb_s" not in cut and cut["duration_s"] == 0.4
    junk = calls["a0-65cdde"][1]  # a count that is a string, a duration of Infinity: read as 0 and unknown
    assert junk["usage"]["cache_creation_input_tokens"] == 0 and "duration_s" not in junk and junk["ttfb_s"] == 0.12
    assert "mac" not in calls["a2-0d80e2"][0] and calls["a2-0d80e2"][0]["usage"]["cache_creation_input_tokens"] == 1016


def test_times_and_limits_read_as_spawn_py_reads_them(sessions: Path) -> None:
    values: list[Any] = [None, 3, "", "yesterday", "2026-11-29T07:31:13.700Z", "2026-11-29T07:31:13+02:00"]
    for path in sessions.rglob("*.json"):
        record = session_files.read_json(path) or {}
        values += [v for k, v in record.items() if k.endswith("_at") or k in ("since", "time")]
    for value in values:
        assert session_files.parse_time(value) == spawn.parse_iso(value), value
    for limits in [(), (None,), (3.0, None, 1.5), (None, 2.0)]:
        assert session_files.min_known(*limits) == spawn.min_known(*limits)


def test_read_json_is_none_for_whatever_is_no_whole_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record = tmp_path / "meta.json"
    record.write_text('{"id": "a0-000000"}')
    assert session_files.read_json(record) == {"id": "a0-000000"}
    (tmp_path / "list.json").write_text("[1]")
    (tmp_path / "torn.json").write_text('{"id": ')
    os.mkfifo(tmp_path / "fifo.json")  # a plain open would block until a writer came
    for junk in ("list.json", "torn.json", "fifo.json", "missing.json", "."):
        assert session_files.read_json(tmp_path / junk) is None, junk
    monkeypatch.setattr(session_files, "RECORD_MAX_BYTES", 10)
    assert session_files.read_json(record) is None


def test_iter_jsonl_skips_a_line_past_the_cap_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session_files, "RECORD_MAX_BYTES", 32)
    path = tmp_path / "transcript.jsonl"
    # The long line's tail is a whole JSON object by itself: read in pieces, it must not pass for a line.
    path.write_bytes(b"x" * 40 + b'{"tail": 1}\n{"type": "PermissionDecision"}\n[2]\n{"type": "other"}\n{"torn": ')
    assert list(session_files.iter_jsonl(path)) == [{"type": "PermissionDecision"}, {"type": "other"}]
    assert list(session_files.iter_jsonl(path, b"PermissionDecision")) == [{"type": "PermissionDecision"}]
    assert list(session_files.iter_jsonl(tmp_path / "missing.jsonl")) == []


def test_subtree_asks_and_native_subagents(tmp_path: Path) -> None:
    session = tmp_path / "session"
    tree = {"a0-000001": None, "a1-000002": "a0-000001", "a2-000003": "a1-000002", "a1-000004": "a0-000001", "a0-000005": None}
    for agent, parent in tree.items():
        (session / "agents" / agent).mkdir(parents=True)
        (session / "agents" / agent / "meta.json").write_text(json.dumps({"id": agent, "parent_id": parent}))
    assert session_files.subtree_ids(session, {"a1-000002"}) == {"a1-000002", "a2-000003"}
    assert session_files.subtree_ids(session, {"a0-000001", "a0-000005"}) == set(tree)
    asks = session / "asks"
    asks.mkdir()
    for name, agent, age in (("q-bbbbbb", "a2-000003", 30), ("q-aaaaaa", "a1-000004", 20), ("q-cccccc", "a0-000005", 10)):
        (asks / f"{name}.json").write_text(json.dumps({"id": name, "agent_id": agent}))
        os.utime(asks / f"{name}.json", (time.time() - age, time.time() - age))
    (asks / "q-cccccc.answer.json").write_text(json.dumps({"verdict": "allow"}))
    assert [a["id"] for a in session_files.pending_asks(session)] == ["q-aaaaaa", "q-bbbbbb"]
    assert [a["id"] for a in session_files.pending_asks(session, oldest_first=True)] == ["q-bbbbbb", "q-aaaaaa"]
    assert [a["id"] for a in session_files.pending_asks(session, session_files.subtree_ids(session, {"a1-000002"}))] == ["q-bbbbbb"]
    native = session / "agents" / "a0-000001" / "native.jsonl"
    lines = [{"agent_id": "n1", "event": "start"}, {"agent_id": "n1", "event": "stop"}, {"event": "start"}, ["n2"]]
    native.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    assert session_files.native_subagents(native.parent) == {"n1": {"start": lines[0], "stop": lines[1]}}


def test_cli_json_says_spawn_pys_error_line() -> None:
    assert session_files.cli_json(0, 'progress\n{"id": "a0-000001"}\n', "") == {"id": "a0-000001"}
    assert session_files.cli_json(4, '{"status": "refused"}\n', "", ok=(0, 4)) == {"status": "refused"}
    with pytest.raises(session_files.CliError, match=r"^spawn: error: no agent"):
        session_files.cli_json(2, "", "warning: x\nspawn: error: no agent 'a0-ffffff'\n")
    with pytest.raises(session_files.CliError, match="printed no JSON"):
        session_files.cli_json(0, "", "")


def test_the_shared_module_needs_only_the_standard_library() -> None:
    """The siblings' PEP 723 blocks and locks don't list it: it must import nothing they would have to."""
    tree = ast.parse((ROOT / "tools" / "session_files.py").read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported - set(sys.stdlib_module_names)
