"""A user's first week (issue 46): resume, in-process agents, routing and the flaky paths it found."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import MockModel, load, metas, mock_task, run_spawn, spawn_in_bash, stdout_json, validate_records

import spawn

# ------------------------------------------------------------------ resume --


def finished_depth_two_tree(env: dict[str, str], session_root: Path) -> dict[str, Any]:
    """A root, its child and a grandchild that all ended done; the grandchild's meta."""
    grandchild = mock_task("grandchild", [{"text": "first answer"}, {"text": "second answer"}])
    child = mock_task("child", [{"bash": spawn_in_bash("--task", grandchild)}, {"text": "child done"}])
    root = mock_task("root", [{"bash": spawn_in_bash("--task", child, "--tools", "Bash")}, {"text": "root done"}])
    ran = run_spawn(["--task", root, "--tools", "Bash"], env)
    assert stdout_json(ran)["status"] == "done", ran.stderr
    (deepest,) = [m for m in metas(session_root).values() if m["depth"] == 2]
    assert load(Path(deepest["session"]) / "agents" / deepest["id"] / "outcome.json")["status"] == "done"
    return deepest


def test_a_depth_two_agent_resumed_from_the_shell_runs_to_done_as_a_root_of_its_session(
    env: dict[str, str], session_root: Path, mock_model: MockModel
) -> None:
    original = finished_depth_two_tree(env, session_root)
    resumed = run_spawn(["--resume", original["id"], "--task", "and now?"], env)
    out = stdout_json(resumed)
    assert resumed.returncode == spawn.ExitCode.OK, resumed.stderr
    assert out["status"] == "done", resumed.stderr
    assert out["output"] == "second answer"  # the original's conversation, continued

    # Where docs/cli.md says: a root of the original's session, with the room below it the original had.
    meta = metas(session_root)[out["id"]]
    assert meta["session"] == original["session"]
    assert "parent_id" not in meta
    assert meta["depth"] == 0
    assert meta["max_depth"] == original["max_depth"] - original["depth"]
    assert meta["resumed_from"] == original["id"]
    validate_records(session_root)


def test_an_agent_resumes_a_finished_depth_two_agent_from_its_bash_as_its_own_child(
    env: dict[str, str], session_root: Path, mock_model: MockModel
) -> None:
    original = finished_depth_two_tree(env, session_root)
    caller_task = mock_task("caller", [{"bash": spawn_in_bash("--resume", original["id"], "--task", "and now?")}, {"text": "caller done"}])
    ran = run_spawn(["--task", caller_task, "--tools", "Bash"], env)
    caller = stdout_json(ran)
    assert caller["status"] == "done", ran.stderr
    (resumed,) = [m for m in metas(session_root).values() if m.get("resumed_from") == original["id"]]
    assert resumed["parent_id"] == caller["id"]
    assert resumed["depth"] == 1
    assert load(Path(resumed["session"]) / "agents" / resumed["id"] / "outcome.json")["status"] == "done"
    validate_records(session_root)


def test_a_sandboxed_agent_resumes_its_finished_grandchild_through_its_runner(
    env: dict[str, str], session_root: Path, mock_model: MockModel
) -> None:
    # The second child (depth 1, Bash: sandboxed under --sandbox auto) resumes the first child's
    # child, whose parent has ended; its --resume goes through its runner (the broker), and the
    # `--print id` of docs/cli.md's parallel example passes there too.
    grandchild = mock_task("grandchild", [{"text": "first answer"}, {"text": "second answer"}])
    first = mock_task("first child", [{"bash": spawn_in_bash("--task", grandchild, "--print", "id")}, {"text": "first done"}])
    resume = spawn_in_bash("--resume", "GC", "--task", "and now?", "--print", "output").replace("GC", '"$(ls "$SPAWN_SESSION/agents" | grep ^a2-)"')
    second = mock_task("second child", [{"bash": resume}, {"text": "second done"}])
    both = f"{spawn_in_bash('--task', first, '--tools', 'Bash')} >/dev/null; {spawn_in_bash('--task', second, '--tools', 'Bash')}"
    ran = run_spawn(["--task", mock_task("root", [{"bash": both}, {"text": "root done"}]), "--tools", "Bash"], env)
    assert stdout_json(ran)["status"] == "done", ran.stderr

    tree = metas(session_root)
    (original,) = [m for m in tree.values() if m["depth"] == 2 and "resumed_from" not in m]
    (resumed,) = [m for m in tree.values() if m.get("resumed_from") == original["id"]]
    caller = tree[resumed["parent_id"]]
    assert caller["task"].startswith("second child") and caller["sandbox"] == "on"
    assert resumed["depth"] == 2
    outcome = load(Path(resumed["session"]) / "agents" / resumed["id"] / "outcome.json")
    assert outcome["status"] == "done" and outcome["output"] == "second answer"
    validate_records(session_root)
