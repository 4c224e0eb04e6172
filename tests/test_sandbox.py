"""--sandbox: an agent's Bash runs inside Claude Code's own sandbox.

The end-to-end tests run the real bundled claude CLI through spawn.py against
the scripted model; the agent's Bash tries to write where it may and where it
may not. They need bubblewrap and socat (`.ci/run` installs them).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import agent_dirs, load, metas, mock_task, run_spawn, spawn_in_bash, stdout_json, validate_records

import spawn

needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None or shutil.which("socat") is None, reason=f"Claude Code's sandbox needs them: {spawn.SANDBOX_INSTALL}"
)


def transcript_text(agent_dir: Path) -> str:
    return (agent_dir / "transcript.jsonl").read_text()


def test_auto_sandboxes_agents_below_the_root_that_have_bash() -> None:
    assert spawn.sandbox_wanted("auto", 1, 1, ["Bash", "Read"])
    assert not spawn.sandbox_wanted("auto", 0, 0, ["Bash"])  # the root: the user's call
    assert not spawn.sandbox_wanted("auto", 2, 2, ["Read"])  # nothing to contain
    assert not spawn.sandbox_wanted("auto", 1, 3, ["Bash"])  # may still spawn: its children need ancestry
    assert spawn.sandbox_wanted("on", 0, 3, ["Bash"])
    assert not spawn.sandbox_wanted("off", 3, 3, ["Bash"])


def test_settings_merge_hooks_and_sandbox_into_one_object() -> None:
    sandbox = spawn.sandbox_settings(["/s/agents/x", "/s"], "127.0.0.1", ["example.com"])
    merged = json.loads(spawn.cli_settings(hooks={"Stop": []}, sandbox=sandbox, permissions=None) or "{}")
    assert merged == {"hooks": {"Stop": []}, "sandbox": sandbox}
    assert sandbox["failIfUnavailable"] is True and sandbox["allowUnsandboxedCommands"] is False
    assert sandbox["network"]["allowedDomains"] == ["127.0.0.1", "example.com"]
    assert spawn.cli_settings(hooks=None, sandbox=None) is None


@needs_bwrap
def test_sandboxed_bash_writes_in_cwd_but_not_outside(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    work, outside = tmp_path / "work", tmp_path / "outside.txt"
    work.mkdir()
    command = f"echo in > {work / 'inside.txt'}; echo out > {outside}"
    task = mock_task("write", [{"bash": command}, {"text": "tried both"}])
    proc = run_spawn(["--task", task, "--tools", "Bash", "--sandbox", "on", "--cwd", str(work)], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    (agent_dir,) = agent_dirs(session_root)
    assert (work / "inside.txt").read_text() == "in\n"
    assert not outside.exists()
    assert "Read-only file system" in transcript_text(agent_dir)
    assert load(agent_dir / "meta.json")["sandbox"] == "on"
    assert load(agent_dir / "outcome.json")["status"] == "done"
    validate_records(session_root)


@needs_bwrap
def test_preset_claude_code_keeps_the_sandbox(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    task = mock_task("write", [{"bash": f"echo out > {outside}"}, {"text": "tried"}])
    proc = run_spawn(["--task", task, "--tools", "Bash", "--sandbox", "on", "--preset", "claude_code"], env, cwd=tmp_path / "home")
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    (agent_dir,) = agent_dirs(session_root)
    assert not outside.exists()
    assert "Read-only file system" in transcript_text(agent_dir)


@needs_bwrap
def test_nested_spawn_works_inside_the_sandbox_and_stays_contained(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    work, outside = tmp_path / "work", tmp_path / "child-outside.txt"
    work.mkdir()
    child_task = mock_task("child", [{"bash": f"echo child > child.txt; echo out > {outside}"}, {"text": "child done"}])
    parent_task = mock_task("parent", [{"bash": spawn_in_bash("--task", child_task, "--tools", "Bash")}, {"text": "parent done"}])
    proc = run_spawn(["--task", parent_task, "--tools", "Bash", "--sandbox", "on", "--cwd", str(work)], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    by_depth = {m["depth"]: m for m in metas(session_root).values()}
    assert by_depth[0]["sandbox"] == "on" and by_depth[1]["sandbox"] == "inherited"
    child_dir = Path(by_depth[1]["session"]) / "agents" / by_depth[1]["id"]
    assert load(child_dir / "outcome.json")["status"] == "done", load(child_dir / "outcome.json")
    assert (work / "child.txt").read_text() == "child\n"
    assert not outside.exists()
    assert "Read-only file system" in transcript_text(child_dir)
    validate_records(session_root)


def test_sandbox_without_bwrap_is_refused_with_the_install_command(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    no_bwrap = {**env, "PATH": str(empty)}
    dry = run_spawn(["--task", "x", "--tools", "Bash", "--sandbox", "on", "--dry-run"], no_bwrap)
    assert dry.returncode == spawn.ExitCode.REFUSED, dry.stderr  # a dry run says what a real one would do
    assert stdout_json(dry)["sandbox"] == "on"
    assert "apt-get install -y bubblewrap socat" in stdout_json(dry)["refusal"]

    proc = run_spawn(["--task", "x", "--tools", "Bash", "--sandbox", "on"], no_bwrap)
    assert proc.returncode == spawn.ExitCode.REFUSED, proc.stderr
    assert "bubblewrap" in proc.stderr
    (agent_dir,) = agent_dirs(session_root)
    outcome = load(agent_dir / "outcome.json")
    assert outcome["status"] == "refused" and "bwrap" in outcome["reason"]
    assert not (agent_dir / "transcript.jsonl").exists()  # never ran unsandboxed
    validate_records(session_root)


def test_dry_run_shows_the_root_unsandboxed_by_default(env: dict[str, str]) -> None:
    proc = run_spawn(["--task", "x", "--tools", "Bash", "--dry-run"], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert stdout_json(proc)["sandbox"] == "off"
