"""Bad input: a one-line `spawn: error:` message, a documented exit code, nothing written."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import FAKE_API_KEY, run_spawn

OK_ENV = {"ANTHROPIC_API_KEY": FAKE_API_KEY, "ANTHROPIC_BASE_URL": "http://127.0.0.1:9"}


def assert_clean_error(proc: subprocess.CompletedProcess[str], code: int, session_root: Path, fragment: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("spawn: error: "), lines[0]
    assert fragment in lines[0]
    assert proc.stdout == ""
    assert not session_root.exists() or not any(session_root.rglob("*")), list(session_root.rglob("*"))


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--task", ""], "task is empty"),
        (["--task", "   \n"], "task is empty"),
        ([], "task is empty"),
        (["--task-file", "/nonexistent/task.txt"], "can't read --task-file"),
        (["--task", "x", "--task-file", "/etc/hostname"], "not both"),
        (["--task", "x", "--tools", "Read,Teleport"], "unknown tool Teleport"),
        (["--task", "x", "--disallowed-tools", "Nope"], "unknown tool Nope"),
        (["--task", "x", "--schema", "{not json"], "not valid JSON"),
        (["--task", "x", "--schema", '{"type": 12}'], "not a valid JSON Schema"),
        (["--task", "x", "--schema", "[1, 2]"], "is not a JSON object"),
        (["--task", "x", "--schema", "no-such-schema"], "unknown schema 'no-such-schema'"),
        (["--task", "x", "--schema", "/nonexistent/schema.json"], "can't read schema"),
        (["--task", "x", "--timeout", "soon"], "invalid float value"),
        (["--task", "x", "--timeout", "-5"], "--timeout must be > 0"),
        (["--task", "x", "--max-depth", "deep"], "invalid int value"),
        (["--task", "x", "--max-depth", "-1"], "--max-depth must be >= 0"),
        (["--task", "x", "--max-turns", "many"], "invalid int value"),
        (["--task", "x", "--max-budget-usd", "lots"], "invalid float value"),
        (["--task", "x", "--max-budget-usd", "0"], "--max-budget-usd must be > 0"),
        (["--task", "x", "--model", ""], "--model is empty"),
        (["--task", "x", "--cwd", "/nonexistent/dir"], "is not a directory"),
        (["--task", "x", "--no-such-flag"], "unrecognized arguments"),
    ],
)
def test_bad_run_input_exits_2(base_env: dict[str, str], session_root: Path, args: list[str], fragment: str) -> None:
    proc = run_spawn(args, {**base_env, **OK_ENV})
    assert_clean_error(proc, 2, session_root, fragment)


def test_unwritable_session_root_exits_3(base_env: dict[str, str], tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    root = blocker / "sessions"
    proc = run_spawn(["--task", "x", "--session", str(root)], {**base_env, **OK_ENV})
    assert_clean_error(proc, 3, root, "can't create session root")
    proc = run_spawn(["--task", "x"], {**base_env, **OK_ENV, "SPAWN_SESSION_ROOT": str(root)})
    assert_clean_error(proc, 3, root, "pass --session DIR")


def test_missing_credentials_exit_2_and_say_how(base_env: dict[str, str], session_root: Path) -> None:
    proc = run_spawn(["--task", "x"], base_env)
    assert_clean_error(proc, 2, session_root, "set ANTHROPIC_API_KEY")
    assert "ANTHROPIC_BASE_URL" in proc.stderr


def test_missing_cli_exits_2(base_env: dict[str, str], session_root: Path) -> None:
    proc = run_spawn(["--task", "x"], {**base_env, **OK_ENV, "SPAWN_CLI": "/nonexistent/claude"})
    assert_clean_error(proc, 2, session_root, "claude CLI not found")


def test_malformed_model_tiers_exit_2(base_env: dict[str, str], session_root: Path) -> None:
    proc = run_spawn(["--task", "x"], {**base_env, **OK_ENV, "SPAWN_MODEL_TIERS": "high-tier"})
    assert_clean_error(proc, 2, session_root, "SPAWN_MODEL_TIERS")


@pytest.mark.parametrize("verb", [["wait", "a1-000000"], ["kill", "a1-000000"], ["status", "a1-000000"]])
def test_verbs_on_unknown_agent_exit_2(base_env: dict[str, str], session_root: Path, verb: list[str]) -> None:
    proc = run_spawn(verb, base_env)
    assert_clean_error(proc, 2, session_root, "no agent 'a1-000000'")


def test_status_without_sessions_exits_2(base_env: dict[str, str], session_root: Path) -> None:
    proc = run_spawn(["status"], base_env)
    assert_clean_error(proc, 2, session_root, "no session found")


def test_corrupt_record_exits_3(base_env: dict[str, str], session_root: Path) -> None:
    agent = session_root / "20260101-0000-x" / "agents" / "a0-abcdef"
    agent.mkdir(parents=True)
    (agent / "meta.json").write_text("{ torn")
    proc = run_spawn(["wait", "a0-abcdef"], base_env)
    assert proc.returncode == 3
    assert proc.stderr.startswith("spawn: error: corrupt record")


def test_dry_run_resolves_everything_and_writes_nothing(base_env: dict[str, str], session_root: Path) -> None:
    import json

    proc = run_spawn(["--task", "plan it", "--model", "high-tier", "--schema", "plan", "--tools", "Read,Bash", "--dry-run"], base_env)
    assert proc.returncode == 0, proc.stderr
    resolved = json.loads(proc.stdout)
    assert resolved["model"] == "opus"
    assert resolved["tools"] == ["Read", "Bash"]
    assert resolved["schema"]["title"] == "An implementation plan"
    assert resolved["max_depth"] == 3
    assert "spawn.py" in resolved["briefing"]
    assert not session_root.exists()
    tiers = run_spawn(["--task", "x", "--model", "low-tier", "--dry-run"], {**base_env, "SPAWN_MODEL_TIERS": "low-tier=claude-haiku-9"})
    assert json.loads(tiers.stdout)["model"] == "claude-haiku-9"
