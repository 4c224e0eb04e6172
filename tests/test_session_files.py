"""tools/session_files.py, the session protocol as the runtime siblings read it: unit tests of its pure readers.

The siblings' own test files drive them end to end over the same functions.
"""

from __future__ import annotations

import ast
import json
import os
import sys
import time
from pathlib import Path

import pytest
import session_files  # from tools/, which conftest.py (loaded first) puts on sys.path
from conftest import ROOT


def test_parse_json_keeps_spawn_pys_bounds() -> None:
    assert session_files.JSON_MAX_DEPTH == 64 and session_files.RECORD_MAX_BYTES == 64 << 20  # as src/spawnlib/protocol.py
    deepest = "[" * 64 + "]" * 64
    assert session_files.parse_json(deepest) == json.loads(deepest)
    with pytest.raises(ValueError, match="nested deeper than 64"):
        session_files.parse_json("[" * 65 + "]" * 65)
    with pytest.raises(ValueError, match="nested deeper than 64"):
        session_files.parse_json("[" * 100_000)  # json.loads: RecursionError
    brackets_in_a_string = json.dumps({"text": "[" * 1000})
    assert session_files.parse_json(brackets_in_a_string) == {"text": "[" * 1000}


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
