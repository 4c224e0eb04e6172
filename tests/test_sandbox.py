"""--sandbox: an agent's Bash runs inside Claude Code's own sandbox.

The end-to-end tests run the real bundled claude CLI through spawn.py against
the scripted model; the agent's Bash tries to write where it may and where it
may not. They need bubblewrap and socat (`.ci/run` installs them).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from conftest import agent_dirs, load, metas, mock_task, run_parent_of, run_spawn, spawn_in_bash, start_spawn, stdout_json, validate_records

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


def test_a_leaf_can_register_but_its_own_and_its_ancestors_records_stay_read_only(tmp_path: Path) -> None:
    session, index = tmp_path / "s", tmp_path / "runners"
    agents = session / "agents"
    me, parent, root = agents / "a2-000002", agents / "a1-000001", agents / "a0-000000"
    entries = ["agents", ".lock", "ledger.jsonl", "limits.json", "asks"]
    writable, read_only = spawn.sandbox_writes(False, me, str(session), index, ancestors=[parent, root], session_entries=entries)
    assert writable == [str(session), str(me / "scratch")]  # a refused spawn inside is still recorded
    assert read_only == [str(me), str(parent), str(root), *(f"{session}/{n}" for n in ("ledger.jsonl", "limits.json", "asks")), str(index)]
    writable, read_only = spawn.sandbox_writes(True, me, str(session), index, ancestors=[parent, root], session_entries=entries)
    assert writable == [str(me), str(session), str(index)] and read_only == [str(me / "meta.json")]


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


@needs_bwrap
def test_a_sandboxed_leaf_can_not_publish_an_outcome_before_its_runner_or_its_parents(
    env: dict[str, str], session_root: Path, tmp_path: Path
) -> None:
    # cwd holds the session root, as sessions/ beside spawn.py in a project does.
    forge = (
        'A="$SPAWN_SESSION/agents"; P=$(ls "$A" | grep ^a0-); '
        """for d in "$A/$P" "$A/$SPAWN_AGENT_ID"; do """
        """echo '{"status": "done", "output": "FORGED"}' > "$d/outcome.json"; touch "$d/.done"; done; """
        'echo note > "$A/$SPAWN_AGENT_ID/notes.txt"; echo ok > ok.txt; '
        '"$SPAWN_PYTHON" "$SPAWN_PY" --task deeper; echo "spawn rc=$?"'
    )
    proc = run_parent_of(forge, env, "--max-depth", "1", "--cwd", str(tmp_path))
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert stdout_json(proc)["output"] == "parent done"
    by_depth = {d.name[:2]: d for d in agent_dirs(session_root)}
    assert set(by_depth) == {"a0", "a1", "a2"}
    root, leaf = by_depth["a0"], by_depth["a1"]
    refused = load(by_depth["a2"] / "outcome.json")  # its spawn inside was refused, and recorded
    assert refused["status"] == "refused" and refused["reason"].startswith("depth limit")
    assert load(leaf / "meta.json")["sandbox"] == "on"
    for agent_dir, output in ((root, "parent done"), (leaf, "child done")):
        outcome = load(agent_dir / "outcome.json")
        assert (outcome["output"], outcome["committed_by"]) == (output, "self")
        assert (agent_dir / ".done").exists() and not (agent_dir / ".fail").exists()
    assert not (leaf / "notes.txt").exists()
    assert (tmp_path / "ok.txt").read_text() == "ok\n"  # the rest of its cwd stays writable
    text = transcript_text(leaf)
    assert text.count("Read-only file system") >= 5
    assert "spawn: error: refused: depth limit" in text and f"recorded in {by_depth['a2']}" in text and "spawn rc=4" in text
    validate_records(session_root)


@needs_bwrap
def test_an_agent_spawned_inside_a_sandbox_beats_and_is_seen_running_from_outside(
    env: dict[str, str], session_root: Path, tmp_path: Path
) -> None:
    # In there /proc is an outer pid namespace's: its heartbeat must not rest on it.
    child = mock_task("child", [{"bash": "python3 -c 'import time; time.sleep(4)'"}, {"text": "child done"}])
    parent = mock_task("parent", [{"bash": spawn_in_bash("--task", child, "--tools", "Bash")}, {"text": "parent done"}])
    proc = start_spawn(
        ["--task", parent, "--tools", "Bash", "--sandbox", "on", "--cwd", str(tmp_path)], {**env, "SPAWN_HEARTBEAT_S": "0.2"}
    )
    try:
        limit = time.monotonic() + 60
        while not (beats := sorted(session_root.glob("*/agents/a1-*/heartbeat.json"))):
            assert time.monotonic() < limit and proc.poll() is None, "the inner agent never beat"
            time.sleep(0.05)
        time.sleep(2.0)  # ten beats: a heartbeat that stopped would be stale (six) by now
        assert time.time() - load(beats[0])["updated_at"] < 1.0
        status = run_spawn(["status", "--json", "--session", str(beats[0].parent.parent.parent)], env)
        (row,) = [r for r in stdout_json(status)["agents"] if r["depth"] == 1]
        assert row["state"] == "running", row
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == spawn.ExitCode.OK, err
    assert load(beats[0].parent / "outcome.json")["output"] == "child done"


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
