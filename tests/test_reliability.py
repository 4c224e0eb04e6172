"""Reliability, end to end: SIGKILLs, orphans, deadlines, stuck agents, model faults.

Every test runs the real bundled claude CLI through spawn.py against the
scripted model, then checks what a user would: exit codes, outcomes on disk,
and which processes are still alive (psutil).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import (
    ROOT,
    agent_dirs,
    alive,
    load,
    metas,
    mock_task,
    plant_agent,
    run_parent_of,
    run_spawn,
    spawn_in_bash,
    start_spawn,
    stdout_json,
    validate_records,
    wait_for_path,
    wait_until_gone,
)

import spawn

GRACE_S = 3.0  # spawn.py's KILL_GRACE_S
# Claude Code refuses a bare `sleep N` in Bash; this is a long command it runs.
LONG_COMMAND = "python3 -c 'import time; time.sleep(60)'"


def tree_pids(session_root: Path) -> set[int]:
    """Every spawn.py, guard and CLI process of every agent, and all their descendants."""
    pids: set[int] = set()
    for d in agent_dirs(session_root):
        roots = []
        if (d / "meta.json").exists():
            roots.append(load(d / "meta.json")["pid"])
        if (d / "heartbeat.json").exists():
            roots.append(load(d / "heartbeat.json")["cli_pid"])
        for pid in roots:
            pids.add(pid)
            with contextlib.suppress(psutil.NoSuchProcess):
                pids.update(p.pid for p in psutil.Process(pid).children(recursive=True))
    return pids


def wait_for_depth(session_root: Path, depth: int, timeout: float = 60) -> Path:
    limit = time.monotonic() + timeout
    while True:
        for d in agent_dirs(session_root):
            if (d / "meta.json").exists() and load(d / "meta.json")["depth"] == depth and (d / "heartbeat.json").exists():
                return d
        assert time.monotonic() < limit, f"no running agent at depth {depth}"
        time.sleep(0.05)


def wait_for_text(path: Path, text: str, timeout: float = 30) -> None:
    limit = time.monotonic() + timeout
    while not (path.exists() and text in path.read_text()):
        assert time.monotonic() < limit, f"{text!r} never appeared in {path}"
        time.sleep(0.05)


def guard_of(pid: int) -> psutil.Process:
    (guard,) = [p for p in psutil.Process(pid).children() if "_guard" in p.cmdline()]
    return guard


def test_sigkilled_root_is_settled_by_its_guard(env: dict[str, str], session_root: Path) -> None:
    proc = start_spawn(
        ["--tools", "Bash", "--task", mock_task("stall", [{"text": "thinking out loud", "bash": LONG_COMMAND}, {"text": "never"}])], env
    )
    agent_dir = wait_for_depth(session_root, 0)
    wait_for_text(agent_dir / "transcript.jsonl", "time.sleep")
    pids = tree_pids(session_root)
    # The process that runs the agent; without a cgroup, the pid started is the guard above it.
    os.kill(load(agent_dir / "meta.json")["pid"], signal.SIGKILL)
    proc.communicate(timeout=10)
    assert wait_until_gone(pids, GRACE_S + 5) == []
    wait_for_path(agent_dir / ".fail", timeout=10)
    outcome = load(agent_dir / "outcome.json")
    assert outcome["status"] == "failed"
    assert outcome["committed_by"] == "guard"
    assert "died without writing an outcome" in outcome["reason"]
    assert outcome["transcript"].endswith("transcript.jsonl")
    assert outcome["text"] == "thinking out loud"
    validate_records(session_root)


def test_sigkilled_middle_of_depth3_tree_leaves_nothing_running(env: dict[str, str], session_root: Path) -> None:
    leaf = mock_task("leaf", [{"sleep": 60, "text": "never"}])
    middle = mock_task("middle", [{"bash": spawn_in_bash("--task", leaf)}, {"text": "never"}])
    root = mock_task("root", [{"bash": spawn_in_bash("--task", middle, "--tools", "Bash")}, {"text": "root saw the failure"}])
    proc = start_spawn(["--task", root, "--tools", "Bash"], env)
    wait_for_depth(session_root, 2)
    middle_dir = wait_for_depth(session_root, 1)
    pids = tree_pids(session_root)
    os.kill(load(middle_dir / "meta.json")["pid"], signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == spawn.ExitCode.OK, err
    assert json.loads(out)["output"] == "root saw the failure"
    assert wait_until_gone(pids, GRACE_S + 5) == []
    statuses = {load(d / "meta.json")["depth"]: load(d / "outcome.json") for d in agent_dirs(session_root)}
    assert statuses[0]["status"] == "done"
    assert statuses[1]["status"] == "failed"
    assert statuses[2]["status"] == "killed", statuses[2]
    validate_records(session_root)


def a_dead_process() -> tuple[int, float]:
    proc = subprocess.Popen(["sleep", "60"])
    create_time = psutil.Process(proc.pid).create_time()
    proc.kill()
    proc.wait()
    return proc.pid, create_time


def test_an_ending_agent_settles_a_dead_grandchild_of_a_dead_child_as_killed_unit(session_root: Path) -> None:
    """The race CI met: the middle's death took the leaf down, and the root ended before the middle's guard settled them."""
    session = session_root / "20260101-0000-settle"
    root = plant_agent(session, "a0-000001", os.getpid())
    for agent_id, parent_id in [("a1-000002", "a0-000001"), ("a2-000003", "a1-000002"), ("a1-000004", "a0-000001")]:
        pid, create_time = a_dead_process()  # a1-000004 died alone: its parent, the root, runs on
        plant_agent(session, agent_id, pid, parent_id=parent_id, create_time=create_time)
    spawn.settle_descendants(spawn.load_meta(root), [], set())
    outcomes = {d.name: load(d / "outcome.json") for d in (session / spawn.AGENTS_DIR).iterdir() if (d / "outcome.json").exists()}
    assert sorted(outcomes) == ["a1-000002", "a1-000004", "a2-000003"]
    assert outcomes["a2-000003"]["status"] == "killed"
    assert "ended with its parent agent a1-000002" in outcomes["a2-000003"]["reason"]
    assert outcomes["a1-000002"]["status"] == "failed"
    assert outcomes["a1-000004"]["status"] == "failed"
    assert "died without writing an outcome" in outcomes["a1-000004"]["reason"]


def test_reap_settles_an_agent_whose_guard_died_too(env: dict[str, str], session_root: Path) -> None:
    launched = stdout_json(run_spawn(["--background", "--task", mock_task("stall", [{"sleep": 60, "text": "never"}])], env))
    agent_dir = Path(launched["agent_dir"])
    wait_for_path(agent_dir / "heartbeat.json")
    cli_pid = load(agent_dir / "heartbeat.json")["cli_pid"]
    # The CLI starts before the runner has sent it the task (the SDK's import
    # runs beside its start-up), and a CLI whose stdin ends with no task exits
    # on its own. Killed once the CLI has its task (its init), it is left
    # waiting on the model, for reap to end.
    limit = time.monotonic() + 60
    while '"subtype": "init"' not in ((agent_dir / "transcript.jsonl").read_text() if (agent_dir / "transcript.jsonl").exists() else ""):
        assert time.monotonic() < limit, "the CLI never started its turn"
        time.sleep(0.05)
    guard_of(launched["pid"]).kill()
    os.kill(launched["pid"], signal.SIGKILL)
    time.sleep(0.3)
    assert alive([cli_pid]) == [cli_pid]  # nobody has cleaned up yet
    listed = run_spawn(["status", "--json"], env)
    assert stdout_json(listed)["agents"][0]["state"] == "lost"
    proc = run_spawn(["reap", str(agent_dir.parent.parent)], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert stdout_json(proc)["reaped"] == [agent_dir.name]
    assert load(agent_dir / "outcome.json")["committed_by"] == "reap"
    assert wait_until_gone([cli_pid], 2) == []
    validate_records(session_root)


def test_next_spawn_in_the_session_settles_dead_agents(env: dict[str, str], session_root: Path) -> None:
    launched = stdout_json(run_spawn(["--background", "--task", mock_task("stall", [{"sleep": 60, "text": "never"}])], env))
    agent_dir = Path(launched["agent_dir"])
    wait_for_path(agent_dir / "heartbeat.json")
    guard_of(launched["pid"]).kill()
    os.kill(launched["pid"], signal.SIGKILL)
    session = agent_dir.parent.parent
    proc = run_spawn(["--task", mock_task("next", [{"text": "hi"}])], {**env, "SPAWN_SESSION": str(session), "SPAWN_DEPTH": "0"})
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    outcome = load(agent_dir / "outcome.json")
    assert (outcome["status"], outcome["committed_by"]) == ("failed", "spawn")
    validate_records(session_root)


def test_sigterm_ends_the_subtree_and_records_killed(env: dict[str, str], session_root: Path) -> None:
    child = mock_task("child", [{"sleep": 60, "text": "never"}])
    proc = start_spawn(
        ["--tools", "Bash", "--task", mock_task("root", [{"text": "partial progress", "bash": spawn_in_bash("--task", child)}])], env
    )
    wait_for_depth(session_root, 1)
    pids = tree_pids(session_root)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == spawn.ExitCode.KILLED
    assert json.loads(out)["status"] == "killed"
    assert wait_until_gone(pids, GRACE_S + 5) == []
    by_depth = {load(d / "meta.json")["depth"]: load(d / "outcome.json") for d in agent_dirs(session_root)}
    assert by_depth[0]["status"] == "killed"
    assert by_depth[0]["text"] == "partial progress"
    assert by_depth[1]["status"] == "killed"
    validate_records(session_root)


def test_deadlines_flow_down_and_end_the_tree(env: dict[str, str], session_root: Path) -> None:
    child = mock_task("child", [{"sleep": 60, "text": "never"}])
    root = mock_task("root", [{"bash": spawn_in_bash("--task", child, "--timeout", "600")}, {"sleep": 60, "text": "never"}])
    started = time.monotonic()
    # 20 s: the child must start before its deadline (the root's less 5 s), and a loaded CI machine has
    # taken 11 s to bring the root's CLI to its first Bash call.
    proc = run_spawn(["--task", root, "--tools", "Bash", "--timeout", "20"], env)
    elapsed = time.monotonic() - started
    assert proc.returncode == spawn.ExitCode.TIMEOUT, proc.stderr
    assert elapsed < 20 + 15
    by_depth = {m["depth"]: m for m in metas(session_root).values()}
    assert by_depth[1]["deadline"] <= by_depth[0]["deadline"] - 5 + 0.01
    outcomes = {load(d / "meta.json")["depth"]: load(d / "outcome.json") for d in agent_dirs(session_root)}
    assert outcomes[1]["status"] == "timeout"  # its own, earlier deadline
    assert outcomes[0]["status"] == "timeout"
    assert wait_until_gone(tree_pids(session_root), GRACE_S + 5) == []
    validate_records(session_root)


def test_child_past_the_parent_deadline_is_refused(env: dict[str, str], session_root: Path, mock_model: object) -> None:
    proc = run_spawn(["--task", "late"], {**env, "SPAWN_DEPTH": "0", "SPAWN_DEADLINE": str(time.time() + 2)})
    assert proc.returncode == spawn.ExitCode.REFUSED
    assert "deadline" in proc.stderr


def test_wait_reports_a_stuck_agent_instead_of_hanging(env: dict[str, str], session_root: Path) -> None:
    fast = {**env, "SPAWN_HEARTBEAT_S": "0.2"}
    launched = stdout_json(run_spawn(["--background", "--task", mock_task("stall", [{"sleep": 60, "text": "never"}])], fast))
    wait_for_path(Path(launched["agent_dir"]) / "heartbeat.json")
    os.kill(launched["pid"], signal.SIGSTOP)
    try:
        proc = run_spawn(["wait", launched["id"]], fast, timeout=30)
        assert proc.returncode == spawn.ExitCode.AGENT_FAILED
        assert stdout_json(proc)["stale"] == [launched["id"]]
        assert "stale" in proc.stderr
    finally:
        os.kill(launched["pid"], signal.SIGCONT)
    run_spawn(["kill", launched["id"]], fast)
    assert load(Path(launched["agent_dir"]) / "outcome.json")["status"] == "killed"


@pytest.mark.parametrize(
    ("step", "expect_status", "expect_in_reason"),
    [
        ({"error": 529}, "failed", "model API overloaded (529) after 2 retries"),
        ({"error": 500, "times": 1, "text": "recovered"}, "done", None),
        ({"error": 429, "times": 1, "text": "recovered"}, "done", None),
    ],
)
def test_model_faults_end_cleanly(
    env: dict[str, str], session_root: Path, step: dict[str, object], expect_status: str, expect_in_reason: str | None
) -> None:
    proc = run_spawn(["--task", mock_task("fault", [step]), "--timeout", "60"], {**env, "CLAUDE_CODE_MAX_RETRIES": "2"})
    result = stdout_json(proc)
    assert result["status"] == expect_status, result
    if expect_in_reason:
        assert expect_in_reason in result["reason"]
        assert proc.returncode == spawn.ExitCode.AGENT_FAILED
    else:
        assert result["output"] == "recovered"
    validate_records(session_root)


# One seed in every run; the others are soak-style and run in `nox -s slow`.
@pytest.mark.parametrize("seed", [11, pytest.param(12, marks=pytest.mark.slow), pytest.param(13, marks=pytest.mark.slow)])
def test_random_sigkills_leave_no_survivor_and_exactly_one_outcome(seed: int, tmp_path: Path) -> None:
    """Fault injection: tools/soak.py's kill trials, a few per seed (`nox -s soak` runs hundreds)."""
    report = tmp_path / "soak.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "soak.py"), "--trials", "3", "--seed", str(seed), "--jobs", "1", "--json", str(report)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    totals = json.loads(report.read_text())["totals"]
    assert totals["trials_run"] == 3
    assert totals["survivors_found"] == 0, proc.stderr
    assert totals["agents_without_outcome"] == 0, proc.stderr
    assert totals["agents_with_two_outcomes"] == 0, proc.stderr
    assert totals["invalid_records"] == 0, proc.stderr
    assert totals["trial_errors"] == 0, proc.stderr
    assert proc.returncode == spawn.ExitCode.OK


def test_finishing_agent_ends_unwaited_background_children(env: dict[str, str], session_root: Path) -> None:
    child = mock_task("forgotten", [{"sleep": 60, "text": "never"}])
    root = mock_task("root", [{"bash": spawn_in_bash("--background", "--task", child)}, {"text": "root done early"}])
    proc = run_spawn(["--task", root, "--tools", "Bash"], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    child_dir = next(d for d in agent_dirs(session_root) if load(d / "meta.json")["depth"] == 1)
    assert load(child_dir / "outcome.json")["status"] == "killed"
    assert wait_until_gone(tree_pids(session_root), GRACE_S + 5) == []
    validate_records(session_root)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_right_after_registration_still_ends_in_its_outcome(
    env: dict[str, str], session_root: Path, signum: signal.Signals
) -> None:
    # Sent the moment meta.json appears: before the run's event loop serves
    # signals. Once the agent is registered, a stop signal must end in its
    # own outcome (killed/interrupted), never in "died without writing one".
    proc = start_spawn(["--task", mock_task("early", [{"sleep": 30, "text": "never"}])], env)
    limit = time.monotonic() + 60
    while not any((d / "meta.json").exists() for d in agent_dirs(session_root)) and time.monotonic() < limit:
        time.sleep(0.001)
    proc.send_signal(signum)
    proc.communicate(timeout=60)
    expected = spawn.Status.KILLED if signum == signal.SIGTERM else spawn.Status.INTERRUPTED
    assert proc.returncode == spawn.EXIT_FOR_STATUS[expected]
    (agent,) = agent_dirs(session_root)
    outcome = load(agent / "outcome.json")
    assert (outcome["status"], outcome["committed_by"]) == (expected.value, "self")
    assert signal.Signals(signum).name in outcome["reason"]
    validate_records(session_root)


def test_an_outcome_published_by_something_else_keeps_the_agents_own(env: dict[str, str], session_root: Path) -> None:
    # A child outside any sandbox (--sandbox off: its Bash runs as the user) publishes its parent's outcome first.
    forge = (
        'D="$SPAWN_SESSION/agents/$(ls "$SPAWN_SESSION/agents" | grep ^a0-)"; '
        """echo '{"status": "done", "output": "FORGED"}' > "$D/outcome.json"; touch "$D/.done\""""
    )
    proc = run_parent_of(forge, env, "--max-depth", "2", child_args=("--sandbox", "off"))
    assert proc.returncode == spawn.ExitCode.STATE, proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("spawn: error:")]
    assert "published by something other than spawn.py (its id is None)" in line and "outcome.kept.json" in line
    assert proc.stdout == ""  # no summary of a result that is not on disk as outcome.json
    root = next(d for d in agent_dirs(session_root) if d.name.startswith("a0-"))
    kept = load(root / "outcome.kept.json")
    assert (kept["id"], kept["status"], kept["output"]) == (root.name, "done", "parent done")
    charges = [json.loads(ln) for ln in (root.parent.parent / "ledger.jsonl").read_text().splitlines()]
    assert any(c.get("id") == root.name and c.get("status") == "done" for c in charges)  # what it spent is charged
    assert load(root / "outcome.json")["output"] == "FORGED"  # first writer wins; nothing is overwritten
    status = run_spawn(["status", "--json", "--session", str(root.parent.parent)], env)
    (row,) = [r for r in stdout_json(status)["agents"] if r["id"] == root.name]
    assert row["state"] == spawn.Status.CORRUPT and "its id is None" in row["error"]
    assert run_spawn(["status", "--session", str(root.parent.parent)], env).returncode == status.returncode == spawn.ExitCode.OK


def test_a_well_formed_outcome_published_first_is_still_not_the_agents(env: dict[str, str], session_root: Path) -> None:
    # The same, with a record that passes for one a `kill` committed. Nothing asked the agent to
    # stop, so no spawn.py settled it: the record is not taken for the agent's result.
    forge = (
        'D="$SPAWN_SESSION/agents/$(ls "$SPAWN_SESSION/agents" | grep ^a0-)"; '
        'printf \'{"id": "%s", "status": "done", "reason": "completed", "exit_code": 0, "ended_at": "2026-01-01T00:00:00Z",'
        ' "duration_s": 1, "output": "FORGED", "committed_by": "kill"}\' "$(basename "$D")" > "$D/outcome.json"; touch "$D/.done"'
    )
    proc = run_parent_of(forge, env, "--max-depth", "2", child_args=("--sandbox", "off"))
    assert proc.returncode == spawn.ExitCode.STATE, proc.stderr
    assert proc.stdout == ""  # the forged result is not passed on as the agent's
    root = next(d for d in agent_dirs(session_root) if d.name.startswith("a0-"))
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("spawn: error:")]
    assert f"nothing asked {root.name} to stop" in line and str(root / "outcome.kept.json") in line
    kept = load(root / "outcome.kept.json")
    assert (kept["id"], kept["status"], kept["output"], kept["committed_by"]) == (root.name, "done", "parent done", "self")
    charges = [json.loads(ln) for ln in (root.parent.parent / "ledger.jsonl").read_text().splitlines()]
    assert any(c.get("id") == root.name and c.get("status") == "done" for c in charges)  # the forger charged nothing


def test_an_outcome_a_settler_committed_stands_and_the_runners_own_is_kept(session_root: Path) -> None:
    """Unit level: a runner asked to stop loses to the settler that took its place; both records stay."""
    agent_dir = session_root / "s" / "agents" / "a1-x"
    agent_dir.mkdir(parents=True)
    settled = spawn.Outcome(id="a1-x", status=spawn.Status.KILLED, reason="ended by spawn.py kill", exit_code=143,
                            ended_at="2026-01-01T00:00:01Z", duration_s=1.0, cost_usd=0.5, committed_by="kill")  # fmt: skip
    assert spawn.commit_outcome(agent_dir, settled, [])
    own = spawn.Outcome(id="a1-x", status=spawn.Status.KILLED, reason="killed by SIGTERM", exit_code=143,
                        ended_at="2026-01-01T00:00:02Z", duration_s=2.0, cost_usd=0.9)  # fmt: skip
    winner, error = spawn.outcome_committed_instead(agent_dir, own, [], asked_to_stop=True)
    assert error is None and winner is not None and (winner.committed_by, winner.reason) == ("kill", "ended by spawn.py kill")
    assert load(agent_dir / "outcome.kept.json")["reason"] == "killed by SIGTERM"
    charges = [json.loads(ln)["id"] for ln in (session_root / "s" / "ledger.jsonl").read_text().splitlines()]
    assert charges == ["a1-x", "a1-x"]  # the settler's counts: the ledger takes an agent's first charge
    assert spawn.ledger_state((session_root / "s" / "ledger.jsonl").read_text().splitlines()).charges == {"a1-x": 0.5}


def test_a_second_runner_for_a_background_agent_runs_nothing(env: dict[str, str]) -> None:
    # As a launcher would start if it took the fork server's late answer for none: meta.json names the other.
    launched = stdout_json(run_spawn(["--background", "--task", mock_task("once", [{"sleep": 2, "text": "ran once"}])], env))
    agent_dir = Path(launched["agent_dir"])
    second = run_spawn(["_run", str(agent_dir)], env)
    assert second.returncode == spawn.ExitCode.STATE, second.stderr
    (line,) = [ln for ln in second.stderr.splitlines() if ln.startswith("spawn: error:")]
    assert f"is run by process {launched['pid']} (its meta.json)" in line and "ran nothing" in line
    done = run_spawn(["wait", launched["id"], "--session", str(agent_dir.parent.parent)], env)
    assert done.returncode == spawn.ExitCode.OK, done.stderr
    assert load(agent_dir / "outcome.json")["output"] == "ran once"
    inits = [ln for ln in (agent_dir / "transcript.jsonl").read_text().splitlines() if '"subtype": "init"' in ln]
    assert len(inits) == 1 and not (agent_dir / "outcome.kept.json").exists()


def test_outcome_problem_names_what_makes_a_record_no_outcome_of_the_agent() -> None:
    good = {"id": "a0-1", "status": "killed", "reason": "r", "exit_code": 143, "ended_at": "t", "duration_s": 1}
    assert spawn.outcome_problem(good, "a0-1") is None
    assert spawn.outcome_problem(good, "a1-2") == "its id is 'a0-1'"
    assert spawn.outcome_problem({**good, "status": "running"}, "a0-1") == "its status is 'running'"
    assert spawn.outcome_problem({**good, "exit_code": True}, "a0-1") == "no exit_code or duration_s"
    assert spawn.outcome_problem({**good, "reason": None}, "a0-1") == "no reason"
    assert spawn.outcome_problem({**good, "duration_s": float("nan")}, "a0-1") == "no exit_code or duration_s"
    assert spawn.outcome_problem({**good, "cost_usd": 0.25}, "a0-1") is None
    assert spawn.outcome_problem({**good, "cost_usd": None}, "a0-1") is None
    assert spawn.outcome_problem({**good, "cost_usd": "lots"}, "a0-1") == "its cost_usd is 'lots'"
    assert spawn.outcome_problem({**good, "cost_usd": float("inf")}, "a0-1") == "its cost_usd is inf"
    assert spawn.outcome_problem({**good, "cost_usd": True}, "a0-1") == "its cost_usd is True"


def test_own_create_time_is_psutils() -> None:
    assert spawn.own_create_time() == psutil.Process().create_time()


def test_a_killed_agents_reason_names_the_kill_and_who_asked(env: dict[str, str], session_root: Path) -> None:
    """Issue 36 item 4: a `spawn.py kill` left the reason `received SIGTERM`, saying neither kill nor who."""
    child = mock_task("stall", [{"bash": "echo busy; sleep 60"}, {"text": "never"}])
    launched = stdout_json(run_spawn(["--background", "--task", child, "--tools", "Bash"], env))
    wait_for_path(Path(launched["agent_dir"]) / "heartbeat.json")
    proc = run_spawn(["kill", launched["id"]], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    outcome = load(Path(launched["agent_dir"]) / "outcome.json")
    assert (outcome["status"], outcome["committed_by"]) == ("killed", "self")  # the runner's own outcome, with the kill's reason
    # At a developer's terminal the caller is "a terminal, pid N (...)".
    # The caller's name is its command's first words ("python pytest" under nox, "python3.11" here).
    assert re.fullmatch(rf"killed by spawn\.py kill \(from (a terminal, )?pid {os.getpid()} \(python[^)]*\)\)", outcome["reason"]), outcome


def test_an_agent_killing_its_child_is_named_in_the_childs_reason(env: dict[str, str], session_root: Path) -> None:
    child = mock_task("stall", [{"bash": "echo busy; sleep 60"}, {"text": "never"}])
    launch = spawn_in_bash("--task", child, "--tools", "Bash", "--background", "--print", "id")
    kill = f'ID=$({launch}) && until [ -e "$SPAWN_SESSION/agents/$ID/heartbeat.json" ]; do sleep 0.1; done && {spawn_in_bash("kill")} "$ID"'
    parent = mock_task("parent", [{"bash": kill}, {"text": "parent done"}])
    proc = run_spawn(["--task", parent, "--tools", "Bash"], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    root = stdout_json(proc)["id"]
    (child_dir,) = [d for d in session_root.glob("*/agents/*") if d.name != root]
    outcome = load(child_dir / "outcome.json")
    assert (outcome["status"], outcome["reason"]) == ("killed", f"killed by spawn.py kill (from agent {root})"), outcome
    validate_records(session_root)  # kill.json among them
