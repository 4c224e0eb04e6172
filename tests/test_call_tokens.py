"""An in-process child's Bash acts as that child: the call tokens of a host of in-process agents.

A spawn.py started from an in-process agent's Bash is that agent's child, with its
narrower limits, or refused; never the host's. The end-to-end tests run the real
bundled CLI through spawn.py against the scripted model; the rest check the
token's rules (supervise/calls.py) one by one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import READ_ID, load, metas, mock_task, run_spawn, spawn_in_bash, write_agent

import spawn

AUTO = ["--placement", "auto"]
SPAWN_IN_BASH = spawn_in_bash()  # the command alone
NARROW = "description: may not touch\ntools: Bash, Read\npermissions:\n  deny: ['Bash(touch:*)']"


def call(prompt: str, subagent_type: str = "narrow") -> dict[str, Any]:
    """An Agent call the host makes, in the foreground."""
    return {
        "tool": "Agent",
        "input": {"description": "delegate", "prompt": prompt, "subagent_type": subagent_type, "run_in_background": False},
    }


def captured(tmp_path: Path, name: str, command: str) -> str:
    """command, its stdout, stderr and exit code kept in tmp_path/NAME.{out,err,code}."""
    base = tmp_path / name
    return f"{command} > {base}.out 2> {base}.err; echo $? > {base}.code"


def result(tmp_path: Path, name: str) -> tuple[int, str, str]:
    base = tmp_path / name
    return int(Path(f"{base}.code").read_text()), Path(f"{base}.out").read_text(), Path(f"{base}.err").read_text()


def by_task(session_root: Path) -> dict[str, dict[str, Any]]:
    return {m["task"].split(" MOCK")[0]: m for m in metas(session_root).values()}


def test_a_spawn_from_an_in_process_childs_bash_is_its_child_with_its_rules(
    env: dict[str, str], session_root: Path, tmp_path: Path
) -> None:
    write_agent(tmp_path, "narrow", NARROW)
    touched = tmp_path / "touched"
    grandchild = mock_task("grandchild", [{"bash": f"touch {touched}"}, {"text": "gc-result"}])
    background = mock_task("background", [{"text": "bg-result"}])
    launch = f"id=$({spawn_in_bash('--background', '--task', background, '--tools', 'Read')} | {READ_ID}) && {SPAWN_IN_BASH} wait $id"
    child = mock_task(
        "child",
        [
            {"bash": captured(tmp_path, "fg", spawn_in_bash("--task", grandchild, "--tools", "Bash"))},
            {"bash": captured(tmp_path, "bg", launch)},
            {"text": "child-result"},
        ],
    )
    proc = run_spawn(
        ["--task", mock_task("root", [call(child), {"text": "root-result"}]), "--tools", "Agent,Bash,Read", *AUTO], env, cwd=tmp_path
    )
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    code, out, err = result(tmp_path, "fg")
    assert code == spawn.ExitCode.OK, err
    agents = by_task(session_root)
    host, inside, grand = agents["root"], agents["child"], agents["grandchild"]
    assert inside["placement"]["backend"] == "inprocess" and inside["parent_id"] == host["id"]
    # The child's child, at its depth, with its rules: never the host's.
    assert grand["parent_id"] == inside["id"] and grand["depth"] == inside["depth"] + 1 == 2
    assert "Bash(touch:*)" in grand["permissions"]["deny"] and grand["placement"]["backend"] == "local"
    assert not touched.exists(), "the grandchild's touch is denied by the child's rule"
    assert json.loads(out)["output"] == "gc-result"
    # A background spawn's runner (`_run`) is admitted as the child's child too.
    code, out, err = result(tmp_path, "bg")
    assert code == spawn.ExitCode.OK, err
    assert agents["background"]["parent_id"] == inside["id"]
    assert load(Path(host["session"]) / "agents" / agents["background"]["id"] / "outcome.json")["status"] == "done"


def test_unset_token_is_refused_saying_what_to_do(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    write_agent(tmp_path, "narrow", NARROW)
    grandchild = mock_task("grandchild", [{"text": "gc-result"}])
    spawn_cmd = spawn_in_bash("--task", grandchild, "--tools", "Read")
    child = mock_task(
        "child",
        [
            {"bash": captured(tmp_path, "unset", f"unset SPAWN_CALL; {spawn_cmd}")},
            {"bash": captured(tmp_path, "envi", f"env -u SPAWN_CALL {spawn_cmd}")},
            {"text": "child-result"},
        ],
    )
    host_steps = [{"bash": captured(tmp_path, "host", f"unset SPAWN_CALL; {spawn_cmd}")}, call(child), {"text": "root-result"}]
    proc = run_spawn(["--task", mock_task("root", host_steps), "--tools", "Agent,Bash,Read", *AUTO], env, cwd=tmp_path)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    for name in ("unset", "envi", "host"):  # the host's own Bash too: its calls have tokens of their own
        code, out, err = result(tmp_path, name)
        assert code == spawn.ExitCode.REFUSED, (name, err)
        assert err.startswith("spawn: error: no SPAWN_CALL token:") and err.count("\n") == 1, err
        assert "start it straight from an agent's Bash command" in err and out == ""
    assert "grandchild" not in by_task(session_root)


def test_a_copied_token_of_another_call_is_refused(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    write_agent(tmp_path, "narrow", NARROW)
    grandchild = mock_task("grandchild", [{"text": "gc-result"}])
    spawn_cmd = spawn_in_bash("--task", grandchild, "--tools", "Read")
    host_token, sibling_token = tmp_path / "host.token", tmp_path / "sibling.token"
    sibling = mock_task("sibling", [{"bash": f"echo $SPAWN_CALL > {sibling_token}"}, {"text": "sibling-result"}])
    # Each copy used from the child's own later call: a token names one call, which has ended.
    child = mock_task(
        "child",
        [
            {"bash": captured(tmp_path, "host-copy", f"export SPAWN_CALL=$(cat {host_token}); {spawn_cmd}")},
            {"bash": captured(tmp_path, "sibling-copy", f"SPAWN_CALL=$(cat {sibling_token}) {spawn_cmd}")},
            {"text": "child-result"},
        ],
    )
    host_steps = [{"bash": f"echo $SPAWN_CALL > {host_token}"}, call(sibling), call(child), {"text": "root-result"}]
    proc = run_spawn(["--task", mock_task("root", host_steps), "--tools", "Agent,Bash,Read", *AUTO], env, cwd=tmp_path)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert len(host_token.read_text().strip()) == 48 and len(sibling_token.read_text().strip()) == 48
    for name in ("host-copy", "sibling-copy"):
        code, _, err = result(tmp_path, name)
        assert code == spawn.ExitCode.REFUSED, (name, err)
        assert err.startswith("spawn: error: SPAWN_CALL token refused: its Bash call has ended;") and err.count("\n") == 1, err
    assert "grandchild" not in by_task(session_root)


# ------------------------------------------------------------ the token's rules --

CLI = (100, 1000.0)


def record(**changes: Any) -> spawn.CallRecord:
    return spawn.CallRecord(owner={"parent_id": "a1-x", "agent_dir": "/x"}, tool_use_id="t", cli=CLI, before=[7], **changes)


def test_a_token_holds_only_below_a_shell_its_call_started() -> None:
    shell, poller = (200, 1001.0), (7, 999.0)
    assert spawn.call_problem(record(), [(300, 1002.0), shell, CLI], background_runner=False, now=1003.0) is None
    # A process another call left running before this token was minted.
    assert "was there before" in str(spawn.call_problem(record(), [(300, 1002.0), poller, CLI], background_runner=False, now=1003.0))
    # One that left the CLI's tree (double-forked, reparented to the runner).
    assert "not below the CLI" in str(spawn.call_problem(record(), [(300, 1002.0), (50, 10.0)], background_runner=False, now=1003.0))
    # The same pid, but another process than the CLI.
    assert "not below the CLI" in str(spawn.call_problem(record(), [shell, (100, 1500.0)], background_runner=False, now=1003.0))
    ended = record(ended=1002.0)
    assert "has ended" in str(spawn.call_problem(ended, [shell, CLI], background_runner=False, now=1003.0))
    # A background runner its call launched: the record alone, for a grace after the call.
    assert spawn.call_problem(ended, [(400, 1002.5)], background_runner=True, now=1002.0 + spawn.CALL_GRACE_S - 1) is None
    assert "has ended" in str(spawn.call_problem(ended, [(400, 1002.5)], background_runner=True, now=1002.0 + spawn.CALL_GRACE_S + 1))


def test_a_token_is_bound_to_the_first_shell_that_uses_it(tmp_path: Path) -> None:
    (tmp_path / spawn.CALLS_DIR).mkdir()
    assert spawn.claim_call(tmp_path, "d", (200, 1001.0)) is None
    assert spawn.claim_call(tmp_path, "d", (200, 1001.01)) is None  # the same shell again: a second spawn of its call
    assert "another process" in str(spawn.claim_call(tmp_path, "d", (201, 1001.0)))
    assert spawn.with_call_token("ls\nunset SPAWN_CALL", "T").startswith("export SPAWN_CALL=T\nls")


def test_a_sandboxed_host_under_auto_spawns_through_its_broker_as_itself(env: dict[str, str], session_root: Path) -> None:
    """Its Bash is sandboxed, so its runner's broker starts the spawn: the request carries the call's token, and
    the broker's spawn.py (the runner's own child, which no agent's process is) runs as that call's agent."""
    leaf = mock_task("leaf", [{"text": "leaf done"}])
    mid = mock_task("mid", [{"bash": spawn_in_bash("--task", leaf, "--tools", "Read")}, {"text": "mid done"}])
    root = mock_task("root", [{"bash": spawn_in_bash("--task", mid, "--tools", "Bash,Read")}, {"text": "root done"}])
    done = run_spawn(["--task", root, "--tools", "Bash,Read", *AUTO], env)
    assert done.returncode == spawn.ExitCode.OK, done.stderr[-2000:]
    found = by_task(session_root)
    assert found["mid"]["sandbox"] == "on" and found["mid"]["placement"]["policy"] == "auto"
    assert found["leaf"]["parent_id"] == found["mid"]["id"] and found["leaf"]["depth"] == 2
    outcomes = {name: load(Path(m["session"]) / "agents" / m["id"] / "outcome.json")["status"] for name, m in found.items()}
    assert outcomes == {"root": "done", "mid": "done", "leaf": "done"}, outcomes
