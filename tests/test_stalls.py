"""Stuck agents are found and ended: a stalled model stream, a stopped CLI."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from conftest import agent_dirs, load, mock_task, run_spawn, start_spawn, stdout_json, validate_records

import spawn


def test_a_model_that_never_answers_is_ended_as_stalled(env: dict[str, str], session_root: Path) -> None:
    task = mock_task("hung stream", [{"sleep": 120, "text": "too late"}])
    proc = run_spawn(["--task", task, "--idle-timeout", "4"], env)
    assert proc.returncode == spawn.ExitCode.AGENT_FAILED, proc.stderr
    summary = stdout_json(proc)
    assert summary["status"] == "failed" and summary["reason"] == "stalled: no activity for 4 s"
    (d,) = agent_dirs(session_root)
    assert load(d / "meta.json")["idle_timeout_s"] == 4
    validate_records(session_root)


def test_a_stopped_cli_shows_stalled_then_is_ended(env: dict[str, str], session_root: Path) -> None:
    # Busy until stopped: a model turn every second keeps the transcript moving.
    task = mock_task("busy", [{"sleep": 1, "bash": "true"} for _ in range(60)])
    proc = start_spawn(["--task", task, "--tools", "Bash", "--idle-timeout", "6"], {**env, "SPAWN_HEARTBEAT_S": "0.5"})
    try:
        limit = time.monotonic() + 60
        while not list(session_root.glob("*/agents/*/heartbeat.json")):
            assert time.monotonic() < limit, "the CLI never started"
            time.sleep(0.05)
        (d,) = agent_dirs(session_root)
        os.kill(load(d / "heartbeat.json")["cli_pid"], signal.SIGSTOP)
        seen = set()
        while proc.poll() is None and time.monotonic() < limit + 60:
            rows = stdout_json(run_spawn(["status", "--json"], env))["agents"]
            seen.add(rows[0]["state"])
            time.sleep(0.2)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == spawn.ExitCode.AGENT_FAILED, err
    assert "stalled?" in seen
    outcome = load(d / "outcome.json")
    assert outcome["reason"] == "stalled: no activity for 6 s"
    cli_pid = load(d / "heartbeat.json")["cli_pid"]
    assert not spawn.Supervised(cli_pid, load(d / "heartbeat.json")["cli_create_time"]).alive()
    validate_records(session_root)


def test_idle_timeout_and_default_deadline_reach_a_child(env: dict[str, str]) -> None:
    root = run_spawn(["--task", "x", "--dry-run"], env)
    assert root.returncode == spawn.ExitCode.OK
    resolved = stdout_json(root)
    assert resolved["idle_timeout_s"] == spawn.IDLE_TIMEOUT_S
    assert resolved["deadline"] - time.time() > spawn.DEFAULT_ROOT_TIMEOUT_S - 60
    assert "deadline" not in stdout_json(run_spawn(["--task", "x", "--dry-run", "--timeout", "0"], env))
    # A child may shorten its idle timeout, never lengthen it.
    child_env = {**env, "SPAWN_IDLE_TIMEOUT_S": "30", "SPAWN_DEPTH": "0", "SPAWN_MAX_DEPTH": "3"}
    assert stdout_json(run_spawn(["--task", "x", "--dry-run", "--idle-timeout", "99"], child_env))["idle_timeout_s"] == 30
    assert stdout_json(run_spawn(["--task", "x", "--dry-run", "--idle-timeout", "9"], child_env))["idle_timeout_s"] == 9
    bad = run_spawn(["--task", "x", "--dry-run", "--idle-timeout", "0"], env)
    assert bad.returncode == spawn.ExitCode.USAGE and "--idle-timeout" in bad.stderr
