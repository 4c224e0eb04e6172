"""Steering a running tree: `send` a message to an agent, `--on-budget pause` and `budget`.

End to end: the real claude CLI through spawn.py against the scripted model.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    ROOT,
    MockModel,
    agent_dirs,
    load,
    mock_task,
    run_python,
    run_spawn,
    spawn_in_bash,
    start_spawn,
    stdout_json,
    validate_records,
    wait_until,
    without_gateway,
)

import spawn

# One model turn the CLI prices at about $0.03 (10k input tokens, medium tier).
TURN = {"input_tokens": 10_000, "output_tokens": 1}


def transcript(agent_dir: Path) -> list[dict[str, Any]]:
    path = agent_dir / "transcript.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def lines_of(agent_dir: Path, kind: str) -> list[dict[str, Any]]:
    return [r["message"] for r in transcript(agent_dir) if r["type"] == kind]


def only_agent(session_root: Path, timeout: float = 60) -> Path:
    assert wait_until(lambda: any((d / "meta.json").exists() for d in agent_dirs(session_root)), timeout), "no agent registered"
    (agent_dir,) = [d for d in agent_dirs(session_root) if (d / "meta.json").exists()]
    return agent_dir


def main_requests(mock_model: MockModel) -> list[dict[str, Any]]:
    return [r for r in mock_model.requests() if r["kind"] == "main"]


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


# -------------------------------------------------------------------- send --


def test_a_message_sent_mid_tool_call_reaches_the_next_request(env: dict[str, str], session_root: Path, mock_model: MockModel) -> None:
    task = mock_task("steered", [{"bash": "sleep 8; echo slept"}, {"text": "steered done"}])
    proc = start_spawn(["--task", task, "--tools", "Bash"], env)
    agent_dir = only_agent(session_root)
    # The PreToolUse hook records the Bash call just before it runs: from there the tool is under way.
    assert wait_until(lambda: bool(lines_of(agent_dir, "PermissionDecision")), 60), "the Bash call never started"
    sent = run_spawn(["send", agent_dir.name, "STEER-7f3a: also check the tests"], env)
    assert sent.returncode == spawn.ExitCode.OK, sent.stderr
    assert stdout_json(sent) == {"sent": True, "id": agent_dir.name, "seq": 1, "delivery": "next request"}
    code, _, err = finish(proc)
    assert code == spawn.ExitCode.OK, err
    requests = main_requests(mock_model)
    assert [r["step_index"] for r in requests] == [0, 1]
    assert not any("STEER-7f3a" in t for t in requests[0]["later_texts"])
    assert any("STEER-7f3a: also check the tests" in t for t in requests[1]["later_texts"])
    (record,) = lines_of(agent_dir, "UserSent")
    assert record["seq"] == 1 and record["text"] == "STEER-7f3a: also check the tests" and record["delivery"] == "next request"
    assert record["from"].startswith("pid ") and not record["from"].startswith("agent ")
    assert not (agent_dir / "inbox.sock").exists()
    validate_records(session_root)
    # Who sent what, in `status --watch` (no terminal: one line per event) and on the timeline.
    watched = run_spawn(["status", "--watch", str(agent_dir.parent.parent)], env)
    assert watched.returncode == spawn.ExitCode.OK, watched.stderr
    assert f"message 1 to {agent_dir.name} from {record['from']}: STEER-7f3a: also check the tests" in watched.stdout
    page = agent_dir.parent.parent / "timeline.svg"
    view = run_python([str(ROOT / "tools" / "view.py"), str(agent_dir.parent.parent), "--svg", "-o", str(page)], env)
    assert view.returncode == 0, view.stderr
    assert f"message 1 from {record['from']}: STEER-7f3a" in page.read_text() and 'class="mark message"' in page.read_text()


def test_a_send_from_the_agent_itself_or_its_subtree_is_refused(env: dict[str, str], session_root: Path) -> None:
    report = "; echo exit=$?"
    parent_of_me = (
        '"$SPAWN_PYTHON" -c "import json,os; '
        "print(json.load(open(os.environ['SPAWN_SESSION']+'/agents/'+os.environ['SPAWN_AGENT_ID']+'/meta.json'))['parent_id'])\""
    )
    child = mock_task("child", [{"bash": f'{spawn_in_bash("send")} "$({parent_of_me})" "child steers its parent"{report}'}, {"text": "c"}])
    root = mock_task(
        "root",
        [
            {"bash": f'{spawn_in_bash("send")} "$SPAWN_AGENT_ID" "root steers itself"{report}'},
            # Unsandboxed, so its send reaches the inbox and the ancestry check is what refuses it
            # (a sandboxed child can't open a socket at all).
            {"bash": spawn_in_bash("--task", child, "--tools", "Bash", "--sandbox", "off")},
            {"text": "root done"},
        ],
    )
    proc = run_spawn(["--task", root, "--tools", "Bash"], env, timeout=180)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    by_depth = {load(d / "meta.json")["depth"]: d for d in agent_dirs(session_root)}
    root_dir, child_dir = by_depth[0], by_depth[1]
    refused = lines_of(root_dir, "SendRefused")
    assert [r["refused"] for r in refused] == [
        f"agent {root_dir.name} can't send a message to itself",
        f"agent {child_dir.name} is in {root_dir.name}'s subtree and can't steer it; its parent, the person or a client outside can",
    ]
    assert not lines_of(root_dir, "UserSent")
    results = [json.dumps(r) for r in transcript(root_dir) if r["type"] == "UserMessage"]
    assert any(f"exit={int(spawn.ExitCode.REFUSED)}" in r for r in results)
    child_results = [json.dumps(r) for r in transcript(child_dir) if r["type"] == "UserMessage"]
    assert any(f"exit={int(spawn.ExitCode.REFUSED)}" in r for r in child_results)
    validate_records(session_root)


def test_a_send_to_a_finished_agent_is_exit_1_with_its_status(env: dict[str, str], session_root: Path) -> None:
    done = run_spawn(["--task", mock_task("quick", [{"text": "quick done"}])], env)
    assert done.returncode == spawn.ExitCode.OK, done.stderr
    agent_id = stdout_json(done)["id"]
    sent = run_spawn(["send", agent_id, "too late"], env)
    assert sent.returncode == spawn.ExitCode.AGENT_FAILED
    assert sent.stdout == ""
    assert f"spawn: error: agent {agent_id} has finished (done: " in sent.stderr
    assert f"--resume {agent_id}" in sent.stderr


def test_a_send_to_a_command_node_is_exit_2(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    exe = tmp_path / "slow-command"
    exe.write_text("#!/bin/sh\nsleep 60\n")
    exe.chmod(0o755)
    started = stdout_json(run_spawn(["--background", "--agent", f"command:{exe}", "--task", "anything"], env))
    try:
        sent = run_spawn(["send", started["id"], "hello"], env)
        assert sent.returncode == spawn.ExitCode.USAGE
        assert "is a command node" in sent.stderr and sent.stdout == ""
    finally:
        run_spawn(["kill", started["id"]], env)


@pytest.mark.parametrize(
    ("args", "error"), [(["send", "a0-000000", "  "], "the message is empty"), (["send", "a0-000000", "hi"], "a0-000000")]
)
def test_send_bad_input_is_one_line(env: dict[str, str], session_root: Path, args: list[str], error: str) -> None:
    proc = run_spawn(args, env)
    assert proc.returncode == spawn.ExitCode.USAGE
    (line,) = proc.stderr.splitlines()
    assert line.startswith("spawn: error:") and error in line


# ------------------------------------------------------------------- pause --


def status_rows(env: dict[str, str]) -> list[dict[str, Any]]:
    rows = stdout_json(run_spawn(["status", "--json"], env))["agents"]
    assert isinstance(rows, list)
    return rows


def test_a_tree_pauses_at_its_budget_and_goes_on_when_it_is_raised(env: dict[str, str], session_root: Path, mock_model: MockModel) -> None:
    # $0.03 a turn on a $0.05 budget: it pauses before the second turn; after a $0.10 raise it
    # draws from the raise a turn at a time (to $0.12 in all) without pausing again. The runner's
    # own pause, as a tree without a gateway has it (the scripted usage is not what was sent).
    env = without_gateway(env)
    steps = [*({"bash": "true", "usage": TURN} for _ in range(3)), {"text": "paid for", "usage": TURN}]
    proc = start_spawn(["--task", mock_task("pauser", steps), "--tools", "Bash", "--max-budget-usd", "0.05", "--on-budget", "pause"], env)
    agent_dir = only_agent(session_root)
    assert wait_until((agent_dir / "paused.json").exists, 60), "it never paused"
    (row,) = status_rows(env)
    assert row["state"] == "paused"
    assert row["paused"]["spent_usd"] == pytest.approx(0.03, abs=0.002) and row["paused"]["needed_usd"] == pytest.approx(0.01, abs=0.002)
    # Paused: no request is made, the heartbeat goes on, the CLI stays alive.
    before = len(main_requests(mock_model))
    beat = load(agent_dir / "heartbeat.json")["updated_at"]
    time.sleep(3)
    assert len(main_requests(mock_model)) == before == 1
    # The heartbeat is rewritten every 5 s: at least once more while it waits.
    assert wait_until(lambda: load(agent_dir / "heartbeat.json")["updated_at"] > beat, 15), "the heartbeat stopped"
    assert len(main_requests(mock_model)) == 1
    assert proc.poll() is None
    raised = run_spawn(["budget", agent_dir.parent.parent.name, "--raise", "0.1"], env)
    assert raised.returncode == spawn.ExitCode.OK, raised.stderr
    change = stdout_json(raised)
    assert change["max_budget_usd"] == pytest.approx(0.15) and change["previous_usd"] == pytest.approx(0.05)
    assert [p["id"] for p in change["paused"]] == [agent_dir.name]
    code, out, err = finish(proc)
    assert code == spawn.ExitCode.OK, err
    assert json.loads(out)["output"] == "paid for"
    assert [r["step_index"] for r in main_requests(mock_model)] == [0, 1, 2, 3]
    assert [m["paused_s"] > 2 for m in lines_of(agent_dir, "BudgetResumed")] == [True]
    ledger = [json.loads(line) for line in (agent_dir.parent.parent / "ledger.jsonl").read_text().splitlines()]
    assert sum(line.get("topped_up_usd", 0) for line in ledger) <= 0.1
    (charge,) = [line for line in ledger if line.get("kind") == "charge"]
    assert charge["cost_usd"] <= 0.15
    assert not (agent_dir / "paused.json").exists()
    validate_records(session_root)


def test_a_paused_agent_past_its_deadline_ends_timeout(env: dict[str, str], session_root: Path, mock_model: MockModel) -> None:
    env = without_gateway(env)  # the runner's own pause (the scripted usage is not what was sent)
    steps = [{"bash": "true", "usage": TURN}, {"text": "never paid for", "usage": TURN}]
    # An idle timeout well shorter than the pause (but long enough for a loaded machine's CLI
    # start): a pause is no stall, so the deadline ends it.
    args = ["--task", mock_task("pauser", steps), "--tools", "Bash", "--max-budget-usd", "0.05", "--on-budget", "pause", "--timeout", "25"]
    args += ["--idle-timeout", "8"]
    started = time.monotonic()
    proc = run_spawn(args, env, timeout=120)
    assert proc.returncode == spawn.ExitCode.TIMEOUT, proc.stderr
    assert time.monotonic() - started < 90
    assert stdout_json(proc)["status"] == "timeout"
    (agent_dir,) = agent_dirs(session_root)
    assert lines_of(agent_dir, "BudgetPaused") and not lines_of(agent_dir, "BudgetResumed")
    assert [r["step_index"] for r in main_requests(mock_model)] == [0]
    validate_records(session_root)


def test_budget_from_inside_the_tree_is_refused(env: dict[str, str], session_root: Path) -> None:
    root = mock_task("root", [{"bash": f'{spawn_in_bash("budget")} "$SPAWN_SESSION" --raise 5; echo exit=$?'}, {"text": "root done"}])
    proc = run_spawn(["--task", root, "--tools", "Bash", "--max-budget-usd", "1"], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    (agent_dir,) = agent_dirs(session_root)
    results = [json.dumps(r) for r in transcript(agent_dir) if r["type"] == "UserMessage"]
    assert any(f"exit={int(spawn.ExitCode.REFUSED)}" in r for r in results)
    session = agent_dir.parent.parent
    assert "budget" not in (session / "ledger.jsonl").read_text()
    (attempt,) = [json.loads(line) for line in (session / "budget.attempts.jsonl").read_text().splitlines()]
    assert attempt["refused"].startswith(f"agent {agent_dir.name} (depth 0) runs in this tree")


def test_budget_bad_input(env: dict[str, str], session_root: Path) -> None:
    done = run_spawn(["--task", mock_task("quick", [{"text": "ok"}])], env)
    session = Path(stdout_json(done)["agent_dir"]).parent.parent
    for args, error in (
        (["budget", str(session), "--raise", "1"], "has no budget"),
        (["budget", "no-such-session", "--raise", "1"], "no session"),
        (["budget", str(session), "--raise", "-1"], "non-negative"),
    ):
        proc = run_spawn(args, env)
        assert proc.returncode == spawn.ExitCode.USAGE, (args, proc.stderr)
        (line,) = proc.stderr.splitlines()
        assert line.startswith("spawn: error:") and error in line


def test_spawns_into_a_paused_tree_wait_for_admission_or_are_refused_with_no_wait(
    env: dict[str, str], session_root: Path, mock_model: MockModel
) -> None:
    steps = [{"bash": "true", "usage": TURN}, {"text": "paid for", "usage": TURN}]
    env = without_gateway(env)
    root = start_spawn(["--task", mock_task("pauser", steps), "--tools", "Bash", "--max-budget-usd", "0.05", "--on-budget", "pause"], env)
    root_dir = only_agent(session_root)
    assert wait_until((root_dir / "paused.json").exists, 60), "the root never paused"
    # Another agent of the same session, as the MCP server adds them.
    session = root_dir.parent.parent
    joined = {**env, "SPAWN_SESSION": str(session), "SPAWN_DEPTH": "-1"}
    refused = run_spawn(["--no-wait", "--task", mock_task("late", [{"text": "late done"}])], joined)
    assert refused.returncode == spawn.ExitCode.REFUSED, refused.stderr
    result = stdout_json(refused)
    assert result["status"] == "refused" and "paused at its budget" in result["reason"] and "--no-wait" in result["reason"]
    waiter = start_spawn(["--task", mock_task("patient", [{"text": "patient done"}])], joined)
    time.sleep(3)
    assert waiter.poll() is None  # waiting for admission: not registered, no request made
    assert len(agent_dirs(session_root)) == 2 and len(main_requests(mock_model)) == 1
    raised = run_spawn(["budget", str(session), "--raise", "0.1"], env)
    assert raised.returncode == spawn.ExitCode.OK, raised.stderr
    code, out, err = finish(waiter)
    assert code == spawn.ExitCode.OK, err
    assert json.loads(out)["output"] == "patient done"
    assert "waiting for admission: budget: the tree is paused at its budget" in err
    code, _, err = finish(root)
    assert code == spawn.ExitCode.OK, err
    validate_records(session_root)


# --------------------------------------------------------------- pure parts --


def test_who_may_send() -> None:
    session = Path("/s")
    chains = {"a2-c": ["a1-b", "a0-a"], "a1-b": ["a0-a"], "a1-x": ["a0-a"], "a0-a": []}

    def refusal(target: str, *callers: str) -> str | None:
        return spawn.send_refusal(target, session, [("/s", c, len(chains[c])) for c in callers], chains.__getitem__)

    assert refusal("a1-b") is None  # a person, a script
    assert refusal("a1-b", "a0-a") is None  # its parent
    assert refusal("a1-b", "a1-x", "a0-a") is None  # a sibling
    assert refusal("a1-b", "a1-b", "a0-a") == "agent a1-b can't send a message to itself"
    assert refusal("a1-b", "a2-c", "a1-b", "a0-a") is not None  # its child, by process ancestry
    assert refusal("a1-b", "a2-c") is not None  # its child, by meta.json alone (escaped the process tree)
    assert spawn.send_refusal("a1-b", session, [("/other", "a2-c", 2)], chains.__getitem__) is None  # another tree


def test_on_budget_only_narrows() -> None:
    assert spawn.narrow_on_budget(None, [None]) == ("fail", None)
    assert spawn.narrow_on_budget("pause", [None]) == ("pause", None)
    assert spawn.narrow_on_budget(None, ["pause"]) == ("pause", None)
    assert spawn.narrow_on_budget("fail", ["pause"]) == ("fail", None)
    mode, warning = spawn.narrow_on_budget("pause", ["pause", "fail"])
    assert mode == "fail" and warning == "--on-budget pause is wider than the parent's fail; using fail"


def test_budget_lines_fold_into_the_raise_pool() -> None:
    lines = [
        {"id": "a0", "time": "t", "kind": "reserve", "amount_usd": 0.05},
        {"time": "t", "kind": "budget", "max_budget_usd": 0.15, "previous_usd": 0.05, "by": "budget"},
        {"id": "a0", "time": "t", "kind": "reserve", "amount_usd": 0.06, "topped_up_usd": 0.01},
        {"time": "t", "kind": "budget", "max_budget_usd": 0.12, "previous_usd": 0.15, "by": "ci"},
        {"time": "t", "kind": "budget", "max_budget_usd": "lots", "previous_usd": 0.12, "by": "forged"},
    ]
    text = [json.dumps(line) for line in lines]
    state = spawn.budget_state(text)
    assert state.budget == 0.12 and state.raised == pytest.approx(0.07) and state.topped_up == pytest.approx(0.01)
    ledger = spawn.ledger_state(text)
    assert ledger.holds["a0"] == (None, 0.06) and not ledger.charges  # a budget line has no id: never a charge


def test_the_inbox_refuses_what_is_not_a_message_and_goes_on(env: dict[str, str], session_root: Path) -> None:
    import socket

    proc = start_spawn(["--task", mock_task("steady", [{"bash": "sleep 4"}, {"text": "steady done"}]), "--tools", "Bash"], env)
    agent_dir = only_agent(session_root)
    assert wait_until((agent_dir / "inbox.sock").exists, 60), "no inbox"

    def ask(data: bytes) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(40)
            address, dir_fd = spawn.unix_address(str(agent_dir / "inbox.sock"))  # tmp paths outgrow sun_path
            try:
                client.connect(address)
            finally:
                if dir_fd is not None:
                    os.close(dir_fd)
            client.sendall(data)
            reply = json.loads(client.makefile("rb").readline())
            assert isinstance(reply, dict)
            return reply

    assert "not a message" in ask(b"garbage\n")["refused"]
    assert "non-empty text" in ask(b'{"text": "  "}\n')["refused"]
    assert "non-empty text" in ask(b'["a list"]\n')["refused"]
    assert "not a message" in ask(b'{"text": "' + b"x" * (300 << 10) + b'"}\n')["refused"]
    code, out, err = finish(proc)
    assert code == spawn.ExitCode.OK, err
    assert json.loads(out)["output"] == "steady done"
    assert not lines_of(agent_dir, "UserSent")


def test_a_message_sent_during_the_last_request_gets_a_turn_of_its_own(
    env: dict[str, str], session_root: Path, mock_model: MockModel
) -> None:
    # The model takes 10 s over what would be the last answer; a message sent meanwhile
    # comes too late for that request, and the CLI runs one more turn for it.
    steps: list[dict[str, Any]] = [{"text": "first answer", "sleep": 10}, {"text": "answer to the message"}]
    proc = start_spawn(["--task", mock_task("finishing", steps)], env)
    agent_dir = only_agent(session_root)
    assert wait_until(lambda: any(r["type"] == "SystemMessage" for r in transcript(agent_dir)), 60), "the CLI never started"
    time.sleep(3)  # the CLI asks at once after its init; the scripted model answers 10 s later
    assert not main_requests(mock_model)  # (it logs a request as it answers)
    sent = run_spawn(["send", agent_dir.name, "STEER-LATE-5c"], env)
    assert sent.returncode == spawn.ExitCode.OK, sent.stderr
    code, out, err = finish(proc)
    assert code == spawn.ExitCode.OK, err
    assert json.loads(out)["output"] == "answer to the message"
    requests = main_requests(mock_model)
    assert [r["step_index"] for r in requests] == [0, 1]
    assert any("STEER-LATE-5c" in t for t in requests[1]["later_texts"])
    outcome = load(agent_dir / "outcome.json")
    assert outcome["turns"] == 2


def test_ledger_lines_are_written_under_the_ledgers_posix_lock(env: dict[str, str], session_root: Path) -> None:
    """The lock that holds across NFS clients (docs/cluster.md): a holder elsewhere makes a ledger write wait for it."""
    import fcntl

    done = run_spawn(["--task", mock_task("quick", [{"text": "ok"}]), "--max-budget-usd", "1"], env)
    assert done.returncode == spawn.ExitCode.OK, done.stderr
    session = Path(stdout_json(done)["agent_dir"]).parent.parent
    ledger = session / "ledger.jsonl"
    before = ledger.read_text()
    with open(ledger, "a") as held:
        fcntl.lockf(held, fcntl.LOCK_EX)  # as another host's writer would hold it
        raising = start_spawn(["budget", str(session), "--raise", "2"], env)
        with pytest.raises(subprocess.TimeoutExpired):
            raising.communicate(timeout=3)
        assert ledger.read_text() == before
        fcntl.lockf(held, fcntl.LOCK_UN)
    _, err = raising.communicate(timeout=60)
    assert raising.returncode == spawn.ExitCode.OK, err
    change = json.loads(ledger.read_text().splitlines()[-1])
    assert change["kind"] == "budget" and change["max_budget_usd"] == 3
