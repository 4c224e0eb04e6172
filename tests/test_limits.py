"""Tree-wide limits, end to end: one budget, an agent cap, a concurrency cap."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import (
    READ_ID,
    MockModel,
    agent_dirs,
    load,
    mock_task,
    run_spawn,
    spawn_in_bash,
    stdout_json,
    validate_records,
    without_gateway,
)

import spawn

# The scripted model reports this usage; the CLI prices it at well over $1.
EXPENSIVE = {"input_tokens": 1_000_000, "output_tokens": 10}


def outcomes_by_task(session_root: Path) -> dict[str, dict[str, object]]:
    found = {}
    for d in agent_dirs(session_root):
        task = load(d / "meta.json")["task"].split(" MOCK")[0]
        found[task] = load(d / "outcome.json")
    return found


def test_tree_budget_is_shared_and_refuses_once_spent(env: dict[str, str], session_root: Path, mock_model: MockModel) -> None:
    spender = mock_task("spender", [{"text": "spent it", "usage": EXPENSIVE}])
    late = mock_task("latecomer", [{"text": "must never run"}])
    root = mock_task(
        "root",
        [{"bash": spawn_in_bash("--task", spender) + "; " + spawn_in_bash("--task", late) + "; echo exit=$?"}, {"text": "root done"}],
    )
    proc = run_spawn(["--task", root, "--tools", "Bash", "--max-budget-usd", "1.5"], without_gateway(env))
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    found = outcomes_by_task(session_root)
    assert isinstance(found["spender"]["cost_usd"], float)
    assert found["latecomer"]["status"] == "refused"
    assert "budget: the tree has spent" in str(found["latecomer"]["reason"])
    assert not any("latecomer" in json.dumps(r) for r in mock_model.requests())
    # Each agent's SDK budget was what the tree had left when it started.
    spender_meta = next(load(d / "meta.json") for d in agent_dirs(session_root) if "spender" in load(d / "meta.json")["task"])
    assert 0 < spender_meta["max_budget_usd"] <= 1.5
    status = stdout_json(run_spawn(["status", "--json"], env))
    assert status["max_budget_usd"] == 1.5
    assert status["spent_usd"] >= found["spender"]["cost_usd"]
    validate_records(session_root)


def test_max_agents_caps_the_session(env: dict[str, str], session_root: Path) -> None:
    kids = [mock_task(f"kid{i}", [{"text": f"kid{i} done"}]) for i in (1, 2)]
    root = mock_task("root", [{"bash": " ; ".join(spawn_in_bash("--task", k) for k in kids)}, {"text": "root done"}])
    proc = run_spawn(["--task", root, "--tools", "Bash", "--max-agents", "2"], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    found = outcomes_by_task(session_root)
    assert found["kid1"]["status"] == "done"
    assert found["kid2"]["status"] == "refused"
    assert "--max-agents 2" in str(found["kid2"]["reason"])
    validate_records(session_root)


def test_max_concurrent_queues_instead_of_dropping(env: dict[str, str], session_root: Path, mock_model: MockModel) -> None:
    kids = [mock_task(f"kid{i}", [{"sleep": 1.5, "text": f"kid{i} done"}]) for i in (1, 2)]
    launch = " ; ".join(f'ids="$ids $({spawn_in_bash("--background", "--task", k)} | {READ_ID})"' for k in kids)
    root = mock_task("root", [{"bash": f'ids=""; {launch}; {spawn_in_bash("wait")} $ids --all'}, {"text": "root done"}])
    # One slot: the root lends it while it waits, so the kids must run one after the other.
    proc = run_spawn(["--task", root, "--tools", "Bash", "--max-concurrent", "1", "--timeout", "120"], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    found = outcomes_by_task(session_root)
    assert found["kid1"]["status"] == found["kid2"]["status"] == "done"
    spans: dict[str, Any] = {}
    for r in mock_model.requests():
        if r["kind"] == "main":
            spans.setdefault(r["task_digest"], []).append(r["time"])
    kid_spans = sorted((min(t), max(t)) for t in spans.values() if len(spans) == 3 and len(t) == 1)
    assert len(kid_spans) == 2, spans
    (first_start, _), (second_start, _) = kid_spans
    assert second_start - first_start >= 1.4, "the second kid started before the first one's slot was free"
    validate_records(session_root)


def test_limits_on_a_child_are_ignored_with_a_warning(env: dict[str, str], session_root: Path) -> None:
    child = mock_task("child", [{"text": "ok"}])
    root = mock_task("root", [{"bash": spawn_in_bash("--task", child, "--max-agents", "99")}, {"text": "root done"}])
    assert run_spawn(["--task", root, "--tools", "Bash"], env).returncode == spawn.ExitCode.OK
    child_meta = next(load(d / "meta.json") for d in agent_dirs(session_root) if load(d / "meta.json")["depth"] == 1)
    assert any("set by its root" in w for w in child_meta["warnings"])
