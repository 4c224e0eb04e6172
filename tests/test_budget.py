"""The tree budget: holds for running agents, charges for ended ones, estimates for the killed."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from conftest import (
    READ_ID,
    MockModel,
    agent_dirs,
    load,
    mock_task,
    run_spawn,
    spawn_in_bash,
    start_spawn,
    stdout_json,
    validate_records,
    without_gateway,
)

import spawn

# One model turn of a child: the CLI prices 10k input tokens at $0.03 (medium
# tier); TURN_USD leaves room for the small side requests the CLI makes.
TURN = {"input_tokens": 10_000, "output_tokens": 1}
TURN_USD = 0.035


def ledger(session_root: Path) -> list[dict[str, object]]:
    (path,) = session_root.glob("*/ledger.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_ledger_state_holds_then_charges() -> None:
    lines = [
        {"id": "a0", "time": "t", "kind": "reserve", "amount_usd": 1.0},
        {"id": "a1-x", "time": "t", "kind": "reserve", "amount_usd": 0.3, "drawn_from": "a0"},
        {"id": "a1-y", "time": "t", "kind": "reserve", "amount_usd": 0.2, "drawn_from": "a0"},
        {"id": "a1-x", "time": "t", "kind": "charge", "status": "done", "cost_usd": 0.1},
        {"id": "old", "time": "t", "status": "failed"},  # a line from before `kind`: a charge, cost unknown
    ]
    state = spawn.ledger_state([json.dumps(line) for line in lines] + ["{truncated"])
    # The root's hold pays for its children: what is free there is its hold
    # less its own spend, a live child's whole hold and an ended child's charge.
    assert abs(state.free("a0", budget=1.0, own_spend=0.05) - (1.0 - 0.05 - 0.2 - 0.1)) < 1e-9
    assert state.free(None, budget=1.5) == 0.5
    assert abs(state.reserved - (1.0 - 0.2 - 0.1 + 0.2)) < 1e-9
    assert state.spent == 0.1 and state.unknown == 1


# A ledger reader on another host, as seen from here: a process that holds the
# ledger's shared POSIX lock (fcntl locks are per process, so not this one).
LOCK_HOLDER = """
import fcntl, sys
with open(sys.argv[1]) as held:
    fcntl.lockf(held, fcntl.LOCK_SH)
    print("held", flush=True)
    sys.stdin.read()
"""


def test_a_ledger_line_waits_for_the_ledgers_posix_lock(tmp_path: Path) -> None:
    """The writer's own lock, not only its callers' read of the ledger: even a reader
    elsewhere (a shared holder) makes append_ledger wait, and its line lands after."""
    import subprocess
    import sys
    import threading

    ledger_path = tmp_path / "ledger.jsonl"
    ledger_path.write_text("")
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER, str(ledger_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        writer = threading.Thread(target=spawn.append_ledger, args=(tmp_path, {"id": "a0", "kind": "charge", "cost_usd": 0.1}, []))
        writer.start()
        writer.join(0.5)
        assert writer.is_alive() and ledger_path.read_text() == ""  # waits for the holder
    finally:
        holder.communicate("", timeout=10)  # lets go
    writer.join(10)
    assert not writer.is_alive()
    assert [json.loads(line)["id"] for line in ledger_path.read_text().splitlines()] == ["a0"]


def test_a_charge_is_written_for_every_outcome_but_one_refused_before_it_ran(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """charge: refused before it ran, it held nothing; any other outcome releases its hold,
    transcript or not. A ledger replaced by a FIFO loses the line, not the commit."""
    session = tmp_path / "s"

    def outcome(agent_id: str, status: str) -> spawn.Outcome:
        (session / "agents" / agent_id).mkdir(parents=True)
        return spawn.Outcome(id=agent_id, status=status, reason="r", exit_code=1, ended_at=spawn.utc_now_iso(), duration_s=0.0)

    spawn.charge(session / "agents" / "a1-000001", outcome("a1-000001", "refused"), [])
    spawn.charge(session / "agents" / "a1-000002", outcome("a1-000002", "failed"), [])
    assert [json.loads(line)["id"] for line in (session / "ledger.jsonl").read_text().splitlines()] == ["a1-000002"]
    (session / "ledger.jsonl").unlink()
    os.mkfifo(session / "ledger.jsonl")  # that nothing reads: opened to write, it is refused, never waited on
    assert spawn.commit_outcome(session / "agents" / "a1-000003", outcome("a1-000003", "done"), [])
    assert (session / "agents" / "a1-000003" / ".done").exists()
    assert "a1-000003's charge is not in the ledger" in capsys.readouterr().err


def test_estimate_prices_each_turn_by_family() -> None:
    turns = [("claude-haiku-5-5", {"input_tokens": 1_000_000, "output_tokens": 0}), ("opus", {"output_tokens": 1_000_000})]
    assert spawn.estimate_cost(turns) == 1.0 + 25.0
    # A model the table doesn't know is priced as medium-tier; cache reads at a tenth.
    assert spawn.estimate_cost([("some-new-model", {"cache_read_input_tokens": 1_000_000})]) == 0.3
    # Cache writes at 1.25 times the input price, those kept for an hour at twice it (the CLI splits them).
    written = {"cache_creation_input_tokens": 2_000_000, "cache_creation": {"ephemeral_1h_input_tokens": 1_000_000}}
    assert spawn.estimate_cost([("sonnet", written)]) == 3.0 * 1.25 + 3.0 * 2


def test_concurrent_children_cannot_overspend_the_tree(env: dict[str, str], session_root: Path, mock_model: MockModel) -> None:
    budget, kids, cap = 0.5, 20, 0.1
    kid = mock_task("kid", [*({"bash": "true", "usage": TURN} for _ in range(5)), {"text": "kid done", "usage": TURN}])
    launch = spawn_in_bash("--background", "--max-budget-usd", str(cap), "--task", kid)
    ids = "\"$SPAWN_PYTHON\" -c \"import json,sys; print(*(json.loads(l)['id'] for l in sys.stdin if 'running' in l))\""
    script = (
        f'd=$(mktemp -d); for i in $(seq {kids}); do {launch} > "$d/$i" 2>/dev/null & done; wait; '
        f'{spawn_in_bash("wait")} $(cat "$d"/* | {ids}) > /dev/null; echo launched'
    )
    root = mock_task("root", [{"bash": script}, {"text": "root done"}])
    proc = run_spawn(["--task", root, "--tools", "Bash", "--max-budget-usd", str(budget), "--timeout", "240"], env, timeout=300)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    outcomes = [load(d / "outcome.json") for d in agent_dirs(session_root)]
    refused = [o for o in outcomes if o["status"] == "refused"]
    ran = [o for o in outcomes if o["status"] != "refused"]
    assert len(outcomes) == kids + 1
    assert refused and all("budget: the tree has spent" in str(o["reason"]) for o in refused)
    assert all(o["exit_code"] == spawn.ExitCode.REFUSED for o in refused)
    lines = ledger(session_root)
    holds = {str(line["id"]): float(line["amount_usd"]) for line in lines if line.get("kind") == "reserve"}  # type: ignore[arg-type]
    charges = {str(line["id"]): float(line["cost_usd"]) for line in lines if line.get("kind") == "charge"}  # type: ignore[arg-type]
    # Every agent that ran held a cap, and was charged when it ended.
    assert set(holds) == set(charges) == {str(o["id"]) for o in ran}
    root_id = next(str(o["id"]) for o in ran if load(Path(str(o["transcript"])).parent / "meta.json")["depth"] == 0)
    assert sum(a for i, a in holds.items() if i != root_id) <= holds[root_id] <= budget
    # An agent that can't afford a turn like its last is stopped before it:
    # none overruns what it held by more than a turn, and the tree as a whole
    # stays within its budget plus at most one agent's last turn.
    assert all(charges[i] <= holds[i] + TURN_USD for i in charges)
    assert sum(charges.values()) <= budget + TURN_USD
    status = stdout_json(run_spawn(["status", "--json"], env))
    assert status["reserved_usd"] == 0 and abs(status["spent_usd"] - sum(charges.values())) < 1e-4
    validate_records(session_root)


# A turn the estimate can't miss: a million input tokens at medium-tier list price.
BIG_TURN = {"input_tokens": 1_000_000, "output_tokens": 1}


def test_a_timed_out_agent_is_charged_an_estimate(env: dict[str, str], session_root: Path) -> None:
    task = mock_task("slow", [{"bash": "true", "usage": BIG_TURN}, {"sleep": 120, "text": "never"}])
    proc = run_spawn(["--task", task, "--tools", "Bash", "--timeout", "15"], env)
    assert proc.returncode == spawn.ExitCode.TIMEOUT, proc.stderr
    summary = stdout_json(proc)
    (d,) = agent_dirs(session_root)
    outcome = load(d / "outcome.json")
    assert outcome["cost_estimated"] is True and outcome["cost_usd"] >= 3.0
    assert summary["cost_usd"] == outcome["cost_usd"]
    (charge,) = ledger(session_root)
    assert charge["cost_estimated"] is True and charge["cost_usd"] == outcome["cost_usd"]
    status = run_spawn(["status"], env)
    assert "1 estimated" in status.stdout and "unknown" not in status.stdout
    validate_records(session_root)


def test_a_sigkilled_agent_is_charged_an_estimate_by_its_guard(env: dict[str, str], session_root: Path) -> None:
    task = mock_task("killed", [{"bash": "true", "usage": BIG_TURN}, {"sleep": 120, "text": "never"}])
    proc = start_spawn(["--task", task, "--tools", "Bash"], env)
    try:
        limit = time.monotonic() + 60
        while not any("1000000" in p.read_text() for p in session_root.glob("*/agents/*/transcript.jsonl")):
            assert time.monotonic() < limit, "the first turn never reached the transcript"
            time.sleep(0.05)
        (d,) = agent_dirs(session_root)
        # The process that runs the agent; without a cgroup, the pid started is the guard above it.
        os.kill(load(d / "meta.json")["pid"], signal.SIGKILL)
        proc.wait(timeout=30)
        limit = time.monotonic() + 60
        while not (d / ".fail").exists():
            assert time.monotonic() < limit, "the guard never settled the agent"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    outcome = load(d / "outcome.json")
    assert outcome["committed_by"] == "guard"
    assert outcome["cost_estimated"] is True and outcome["cost_usd"] >= 3.0
    (charge,) = ledger(session_root)
    assert charge["cost_estimated"] is True and charge["cost_usd"] == outcome["cost_usd"]
    validate_records(session_root)


def test_a_tree_deeper_than_max_concurrent_completes(env: dict[str, str], session_root: Path) -> None:
    """Depth 4 under --max-concurrent 2: each parent lends its slot while it waits."""

    def waits_for(child: str, name: str) -> str:
        # Background launch, then `spawn.py wait`: the slot is lent by the wait verb.
        launch = spawn_in_bash("--background", "--task", child)
        return mock_task(name, [{"bash": f"{spawn_in_bash('wait')} $({launch} | {READ_ID})"}, {"text": f"{name} done"}])

    def runs(child: str, name: str) -> str:
        # Foreground spawn: the child's spawn.py lends its parent's slot.
        return mock_task(name, [{"bash": spawn_in_bash("--task", child)}, {"text": f"{name} done"}])

    leaf = mock_task("level4", [{"text": "level4 done"}])
    root = runs(waits_for(runs(waits_for(leaf, "level3"), "level2"), "level1"), "level0")
    args = ["--task", root, "--tools", "Bash", "--max-depth", "4", "--max-concurrent", "2", "--timeout", "120"]
    proc = run_spawn(args, env, timeout=300)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert "fewer than the 5 levels" in proc.stderr  # warned at the root
    outcomes = {load(d / "meta.json")["depth"]: load(d / "outcome.json") for d in agent_dirs(session_root)}
    assert sorted(outcomes) == [0, 1, 2, 3, 4]
    assert all(o["status"] == "done" for o in outcomes.values()), outcomes
    assert not list(session_root.glob("*/agents/*/.slot-lent"))
    validate_records(session_root)


# ----------------------------------------------------- a parent's own spend --

# Input tokens the scripted model reports for a turn, priced by spawn.py at
# the medium tier's $3 per million: exact figures the estimate can't miss.
USD_PER_INPUT_TOKEN = 3.0 / 1_000_000


def turn(usd: float) -> dict[str, int]:
    return {"input_tokens": round(usd / USD_PER_INPUT_TOKEN), "output_tokens": 1}


def test_a_parent_that_spent_its_hold_cannot_start_a_child(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    rc_file = tmp_path / "child-rc"
    child = mock_task("late child", [{"text": "must never run"}])
    # Each turn costs about half what is left, so the parent can always afford
    # one more like its last (it is never stopped), until 0.192 of its 0.2 is
    # spent: less than a child's smallest hold is left.
    steps = [
        *({"bash": "true", "usage": turn(usd)} for usd in (0.099, 0.0495, 0.025, 0.0125)),
        {"bash": spawn_in_bash("--task", child) + f"; echo $? > {rc_file}", "usage": turn(0.006)},
        {"text": "parent done", "usage": turn(0.0)},
    ]
    args = ["--task", mock_task("parent", steps), "--tools", "Bash", "--max-budget-usd", "0.2"]
    proc = run_spawn(args, without_gateway(env), timeout=300)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert rc_file.read_text().strip() == str(int(spawn.ExitCode.REFUSED))
    outcomes = {load(d / "meta.json")["depth"]: load(d / "outcome.json") for d in agent_dirs(session_root)}
    assert outcomes[1]["status"] == "refused"
    assert "nothing is left in its parent" in str(outcomes[1]["reason"])
    assert outcomes[0]["status"] == "done"
    validate_records(session_root)


def test_a_parent_whose_children_hold_the_rest_is_stopped_before_another_turn(
    env: dict[str, str], session_root: Path, mock_model: MockModel
) -> None:
    child = mock_task("background child", [{"sleep": 120, "text": "child done"}])
    steps = [
        {"bash": spawn_in_bash("--background", "--max-budget-usd", "0.1", "--task", child), "usage": turn(0.015)},
        {"bash": "true", "usage": turn(0.03)},
        # 0.105 of its own and the child's 0.1 reach its 0.2: this tool call is
        # its last; the slow command leaves no doubt the next turn isn't asked for.
        {"bash": "sleep 20", "usage": turn(0.06)},
        {"text": "must never be asked for", "usage": turn(0.0)},
    ]
    args = ["--task", mock_task("parent", steps), "--tools", "Bash", "--max-budget-usd", "0.2"]
    proc = run_spawn(args, without_gateway(env), timeout=300)
    assert proc.returncode == spawn.ExitCode.AGENT_FAILED, proc.stderr
    summary = stdout_json(proc)
    assert summary["status"] == "failed"
    assert str(summary["reason"]).startswith("budget: its own turns ($0.1050, estimated) and its children ($0.1000 held or spent)")
    assert not [r for r in mock_model.requests() if r["kind"] == "main" and r["step_index"] == 3]
    outcomes = {load(d / "meta.json")["depth"]: load(d / "outcome.json") for d in agent_dirs(session_root)}
    assert outcomes[1]["status"] == "killed"  # its subtree ends with it
    # The tree spent no more than the parent's hold.
    (ledger,) = session_root.glob("*/ledger.jsonl")
    charged = [json.loads(line) for line in ledger.read_text().splitlines() if '"charge"' in line]
    assert len(charged) == 2 and sum(float(line["cost_usd"]) for line in charged) <= 0.2 + 1e-6
    validate_records(session_root)


def test_an_agent_that_cannot_afford_a_turn_like_its_last_is_stopped_before_it(
    env: dict[str, str], session_root: Path, mock_model: MockModel
) -> None:
    # Without the look-ahead the CLI stops it only after the turn that passes
    # its cap: 0.12 of a 0.1 budget. With it, 0.09 is spent and 0.01 is left,
    # less than the last turn's 0.03, so the fourth turn is never asked for.
    steps: list[dict[str, object]] = [{"bash": "sleep 2" if i == 2 else "true", "usage": turn(0.03)} for i in range(3)]
    steps.append({"text": "over", "usage": turn(0.03)})
    proc = run_spawn(["--task", mock_task("spender", steps), "--tools", "Bash", "--max-budget-usd", "0.1"], env, timeout=300)
    assert proc.returncode == spawn.ExitCode.AGENT_FAILED, proc.stderr
    reason = str(stdout_json(proc)["reason"])
    assert reason.startswith("budget: its own turns ($0.0900, estimated)") and "less than its last turn cost ($0.0300)" in reason
    assert not [r for r in mock_model.requests() if r["kind"] == "main" and r["step_index"] == 3]
    (ledger,) = session_root.glob("*/ledger.jsonl")
    charged = [json.loads(line) for line in ledger.read_text().splitlines() if '"charge"' in line]
    assert sum(float(line["cost_usd"]) for line in charged) <= 0.1
    validate_records(session_root)
