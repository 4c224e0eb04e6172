"""The ledger's one home (src/spawnlib/ledger.py): one number rule, and the two locks every decision is made under."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import run_spawn, start_spawn

import spawn

LINES = [
    {"id": "a0", "time": "t", "kind": "reserve", "amount_usd": 1.0},
    {"id": "a1", "time": "t", "kind": "reserve", "amount_usd": True},  # a bool is no amount
    {"id": "a2", "time": "t", "kind": "reserve", "amount_usd": -5},  # nor is a negative one
    {"id": "a3", "time": "t", "kind": "charge", "cost_usd": float("inf")},  # json.dumps writes Infinity
    {"id": "a4", "time": "t", "kind": "charge", "cost_usd": -0.5},
    {"id": "a5", "time": "t", "kind": "charge", "cost_usd": 0.25},
    {"time": "t", "kind": "budget", "max_budget_usd": True, "previous_usd": 0},
    {"time": "t", "kind": "budget", "max_budget_usd": 3, "previous_usd": -7},
    {"time": "t", "kind": "budget", "max_budget_usd": 2, "previous_usd": 1.5},
    {"id": "a0", "time": "t", "kind": "reserve", "amount_usd": 1.1, "topped_up_usd": -1},
]


def test_one_number_rule_for_holds_charges_and_budget_lines() -> None:
    text = [json.dumps(line) for line in LINES]
    ledger, budget = spawn.ledger_state(text), spawn.budget_state(text)
    assert ledger.holds == {"a0": (None, 1.1)}
    assert ledger.charges == {"a3": None, "a4": None, "a5": 0.25} and ledger.unknown == 2 and ledger.spent == 0.25
    assert budget.budget == 2 and budget.raised == 0.5 and budget.topped_up == 0.0


def fake_session(session_root: Path, budget: float) -> Path:
    """A session as a root with a budget leaves it before its first spawn: limits.json, agents/, a reserve line."""
    session = session_root / "s"
    (session / "agents").mkdir(parents=True)
    (session / "limits.json").write_text(json.dumps({"max_budget_usd": budget, "protocol": spawn.PROTOCOL_VERSION}))
    (session / "ledger.jsonl").write_text(json.dumps({"id": "a0", "time": "t", "kind": "reserve", "amount_usd": budget}) + "\n")
    return session


def assert_waits(raising: subprocess.Popen[str], read: Callable[[], bytes]) -> None:
    before = read()
    with pytest.raises(subprocess.TimeoutExpired):
        raising.communicate(timeout=3)
    assert read() == before, "the raise was appended while the lock was held"


def test_a_ledger_line_waits_for_a_reader_elsewhere(base_env: dict[str, str], session_root: Path) -> None:
    """A reader on another host holds the ledger's shared POSIX lock: a reader here reads on, a writer waits.

    Without the writer's exclusive lock (append_jsonl(..., locked=False)), an
    NFS client would append at the size it has cached, over another host's line.
    """
    session = fake_session(session_root, 1.0)
    ledger = session / "ledger.jsonl"
    fd = os.open(ledger, os.O_RDONLY)
    try:
        fcntl.lockf(fd, fcntl.LOCK_SH)  # another process's reader: compatible with readers, not with writers
        raising = start_spawn(["budget", str(session), "--raise", "2"], base_env)
        # Read through the locked fd: closing any other fd of the file would drop this process's POSIX locks.
        assert_waits(raising, lambda: os.pread(fd, 1 << 16, 0))
    finally:
        os.close(fd)  # releases the lock
    _, err = raising.communicate(timeout=60)
    assert raising.returncode == spawn.ExitCode.OK, err
    change = json.loads(ledger.read_text().splitlines()[-1])
    assert change["kind"] == "budget" and change["max_budget_usd"] == 3


def test_a_budget_change_waits_for_the_session_lock(base_env: dict[str, str], session_root: Path) -> None:
    """A spawn's admission holds the session lock from its read of the ledger to its reserve line: a raise waits for it."""
    session = fake_session(session_root, 1.0)
    fd = os.open(session / spawn.SESSION_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as a spawn being admitted holds it
        raising = start_spawn(["budget", str(session), "--raise", "0.5"], base_env)
        assert_waits(raising, (session / "ledger.jsonl").read_bytes)
    finally:
        os.close(fd)
    _, err = raising.communicate(timeout=60)
    assert raising.returncode == spawn.ExitCode.OK, err
    assert json.loads((session / "limits.json").read_text())["max_budget_usd"] == 1.5


def test_a_raise_is_refused_without_a_budget(base_env: dict[str, str], session_root: Path) -> None:
    session = fake_session(session_root, 1.0)
    (session / "limits.json").write_text(json.dumps({"protocol": spawn.PROTOCOL_VERSION}))
    done = run_spawn(["budget", str(session), "--raise", "1"], base_env)
    assert done.returncode == spawn.ExitCode.USAGE and "has no budget" in done.stderr
    assert len((session / "ledger.jsonl").read_text().splitlines()) == 1  # nothing half-written


def test_over_hold_counts_own_turns_children_and_the_next_turn_unit(session_root: Path) -> None:
    """An agent's own spend plus what its children hold reaching its hold stops it, and so does a next turn
    that would pass it; anything short of both lets it go on (mutants: over_hold)."""
    session = fake_session(session_root, 1.0)
    assert spawn.over_hold(session, "a0", 0.5) is None
    reached = spawn.over_hold(session, "a0", 1.0)
    assert reached is not None and "reached its hold of $1.0000" in reached
    with (session / "ledger.jsonl").open("a") as ledger:
        ledger.write(json.dumps({"id": "a1", "time": "t", "kind": "reserve", "amount_usd": 0.3, "drawn_from": "a0"}) + "\n")
    assert spawn.over_hold(session, "a0", 0.6) is None
    assert spawn.over_hold(session, "a0", 0.6, last_turn=0.05) is None
    short = spawn.over_hold(session, "a0", 0.6, last_turn=0.2)
    assert short is not None and "leave $0.1000 of its hold" in short and "children ($0.3000" in short
    both = spawn.over_hold(session, "a0", 0.7)
    assert both is not None and "reached its hold" in both
    assert spawn.over_hold(session, "a9", 5.0) is None  # no hold of its own: nothing to stop it at


def test_reserve_budget_holds_an_admitted_agents_cap_and_nothing_without_one_unit(session_root: Path) -> None:
    session = fake_session(session_root, 1.0)
    meta = spawn.AgentMeta(
        id="a1-000001", parent_id="a0", depth=1, max_depth=2, pid=1, create_time=0.0, pgid=1, trace_id="t", span_id="s",
        traceparent="p", task="x", tools=[], disallowed_tools=[], model="m", cwd="/", started_at="", session=str(session),
        system_prompt="", max_budget_usd=0.25,
    )  # fmt: skip
    spawn.reserve_budget(session, meta, [])
    assert spawn.read_ledger(session).holds["a1-000001"][1] == 0.25
    spawn.reserve_budget(session, dataclasses.replace(meta, id="a1-000002", max_budget_usd=None), [])
    assert "a1-000002" not in spawn.read_ledger(session).holds


def test_a_ledger_tail_reads_only_what_was_appended_and_folds_as_a_whole_read_does(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    lines = [
        {"id": "a0", "time": "t", "kind": "reserve", "amount_usd": 1.0},
        {"id": "a1", "time": "t", "kind": "reserve", "amount_usd": 0.5, "drawn_from": "a0"},
        {"id": "a2", "time": "t", "kind": "spend", "cost_usd": 0.25, "host": "a1"},
        {"id": "a1", "time": "t", "kind": "spend", "cost_usd": 0.125},
        {"id": "a1", "time": "t", "kind": "charge", "cost_usd": 0.2},
    ]
    tail = spawn.LedgerTail(tmp_path)
    assert tail.read() == spawn.LedgerState()  # no ledger yet
    text = "".join(json.dumps(line) + "\n" for line in lines)
    cut = text.index("\n", text.index('"a2"')) - 5  # inside the third line
    ledger.write_text(text[:cut])
    first = tail.read()
    assert "a2" not in first.spends and first.holds["a1"] == ("a0", 0.5)  # a line cut short waits for its end
    with ledger.open("a") as f:
        f.write(text[cut:])
    assert tail.read() == spawn.ledger_state(text.splitlines())
    assert tail.state.hosted == {"a2": "a1"} and tail.state.spend_of("a1") == pytest.approx(0.375)
    # The hosted agent's spend is its host's: counted once, in what a1's hold used (its metered
    # spend, not its charge's figure).
    assert tail.state.used_by("a1") == pytest.approx(0.125 + 0.25)
    assert tail.state.free(None, 2.0) == pytest.approx(2.0 - 1.0)  # a0 still live: its whole hold
    # Replaced (a new file): read anew, not from the old offset.
    ledger.unlink()
    ledger.write_text(json.dumps(lines[0]) + "\n")
    assert tail.read() == spawn.ledger_state([json.dumps(lines[0])])
