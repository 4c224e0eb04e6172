"""Cost before fan-out: --confirm-over asks before an expensive spawn, `estimate` projects a graph.

The end-to-end tests run the real bundled claude CLI through spawn.py against
the scripted model; the estimate tests check the pure median-or-default rule
and the `estimate` verb on a small graph.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import agent_dirs, load, mock_task, run_spawn, spawn_in_bash, start_spawn, stdout_json, validate_records, wait_for_ask

import spawn


def root_spawning_one_child(rc_file: Path) -> str:
    """A root whose Bash starts one child and records the child's exit code."""
    child = mock_task("child", [{"text": "child done"}])
    command = spawn_in_bash("--task", child) + f"; echo $? > {rc_file}"
    return mock_task("root", [{"bash": command}, {"text": "root done"}])


def child_outcome(session_root: Path) -> dict[str, Any]:
    (child,) = [d for d in agent_dirs(session_root) if load(d / "meta.json")["depth"] == 1]
    return load(child / "outcome.json")


@pytest.mark.parametrize(("answer", "child_status"), [("deny", "refused"), ("approve", "done")])
def test_spawn_over_confirm_threshold_asks_the_root(
    env: dict[str, str], session_root: Path, tmp_path: Path, answer: str, child_status: str
) -> None:
    rc_file = tmp_path / "child.rc"
    root = start_spawn(["--task", root_spawning_one_child(rc_file), "--tools", "Bash", "--confirm-over", "0.000001"], env)
    ask = wait_for_ask(session_root)
    assert ask["tool"] == "Spawn"
    assert ask["rule"] == "--confirm-over 1e-06"
    assert "estimated $0.1000 (default for sonnet)" in ask["input"]
    root_id = next(d.name for d in agent_dirs(session_root) if load(d / "meta.json")["depth"] == 0)
    assert ask["agent_id"] == root_id  # the spawner asks
    assert [a["id"] for a in stdout_json(run_spawn(["status", "--json"], env))["pending_asks"]] == [ask["id"]]
    answered = run_spawn([answer, str(ask["id"])], env)
    assert answered.returncode == spawn.ExitCode.OK, answered.stderr
    _, err = root.communicate(timeout=120)
    assert root.returncode == spawn.ExitCode.OK, err
    child_exit = spawn.ExitCode.REFUSED if answer == "deny" else spawn.ExitCode.OK
    assert rc_file.read_text().strip() == str(int(child_exit))
    outcome = child_outcome(session_root)
    assert outcome["status"] == child_status
    if answer == "deny":
        assert outcome["exit_code"] == spawn.ExitCode.REFUSED
        assert f"ask {ask['id']} was denied" in outcome["reason"]
    else:
        assert outcome["output"] == "child done"
    assert load(next(session_root.glob("*/limits.json")))["confirm_over_usd"] == 0.000001
    validate_records(session_root)


def test_unanswered_spawn_ask_refuses_the_spawn(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    rc_file = tmp_path / "child.rc"
    args = ["--task", root_spawning_one_child(rc_file), "--tools", "Bash", "--confirm-over", "0.000001"]
    proc = run_spawn(args, {**env, "SPAWN_ASK_TIMEOUT_S": "1"})
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert rc_file.read_text().strip() == str(int(spawn.ExitCode.REFUSED))
    outcome = child_outcome(session_root)
    assert outcome["status"] == "refused"
    (answer,) = session_root.glob("*/asks/q-*.answer.json")
    assert load(answer)["by"] == "timeout"
    assert f"ask {answer.name.split('.')[0]} timed out unanswered" in outcome["reason"]
    validate_records(session_root)


def test_spawn_under_confirm_threshold_does_not_ask(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    rc_file = tmp_path / "child.rc"
    proc = run_spawn(["--task", root_spawning_one_child(rc_file), "--tools", "Bash", "--confirm-over", "5"], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert rc_file.read_text().strip() == "0"
    assert child_outcome(session_root)["status"] == "done"
    assert not list(session_root.glob("*/asks/*"))


def test_estimate_is_the_median_of_the_same_family_else_the_tier_default() -> None:
    history = {"sonnet": [(0.1, 10.0), (5.0, 500.0), (0.3, 30.0)], "opus": [(2.0, 90.0)]}
    assert spawn.estimate_agent("medium-tier", history)[:2] == (0.3, 30.0)
    assert spawn.estimate_agent("claude-sonnet-4-5", history)[:2] == (0.3, 30.0)
    assert spawn.estimate_agent("low-tier", history) == (0.02, spawn.DEFAULT_AGENT_SECONDS, "default for haiku")
    assert spawn.estimate_agent("medium-tier", {})[0] == spawn.DEFAULT_AGENT_COST_USD["sonnet"]
    assert spawn.estimate_agent("high-tier", {})[0] == spawn.DEFAULT_AGENT_COST_USD["opus"]


DIAMOND = {
    "tasks": [
        {"id": "survey", "task": "look around"},
        {"id": "deep", "task": "dig", "blockedBy": ["survey"], "model": "high-tier"},
        {"id": "quick", "task": "skim", "blockedBy": ["survey"], "model": "low-tier"},
        {"id": "report", "task": "write it up", "blockedBy": ["quick", "deep"]},
    ]
}


def test_estimate_of_a_diamond_sums_costs_and_follows_the_longest_path() -> None:
    tasks = spawn.parse_dag(DIAMOND, {}, "diamond")
    slow = {"opus": [(1.0, 300.0)], "haiku": [(0.01, 5.0)], "sonnet": [(0.2, 20.0)]}
    report = spawn.dag_estimate(tasks, slow)
    assert report["cost_usd"] == pytest.approx(0.2 + 1.0 + 0.01 + 0.2)
    assert report["critical_path_s"] == pytest.approx(20 + 300 + 20)
    assert report["critical_path"] == ["survey", "deep", "report"]
    fast_deep = {"opus": [(1.0, 1.0)], "haiku": [(0.01, 50.0)], "sonnet": [(0.2, 20.0)]}
    assert spawn.dag_estimate(tasks, fast_deep)["critical_path"] == ["survey", "quick", "report"]


def test_estimate_prices_a_fan_out_with_the_prompt_cache() -> None:
    """Tasks of one level with the same model and tools send the same head: the first writes it, the others read it."""
    fan = {"tasks": [{"id": f"leaf{i}", "task": f"part {i}", "tools": "Read", "timeout": 60 + i} for i in range(4)]}
    fan["tasks"].append({"id": "other", "task": "odd one", "tools": "Read,Grep"})
    report = spawn.dag_estimate(spawn.parse_dag(fan, {}, "fan"), {})
    default = spawn.DEFAULT_AGENT_COST_USD["sonnet"]
    each = spawn.FANOUT_HEAD_TOKENS * (spawn.CACHE_WRITE_FACTOR - spawn.CACHE_READ_FACTOR) * spawn.price_per_mtok("sonnet")[0] / 1e6
    assert (
        report["per_task"]["leaf0"]["cost_usd"] == default and report["per_task"]["leaf0"]["cache"] == "writes the head its siblings read"
    )
    assert report["per_task"]["leaf3"]["cost_usd"] == pytest.approx(default - each)
    assert report["per_task"]["leaf3"]["cache"] == "reads the head leaf0 writes"
    assert "cache" not in report["per_task"]["other"]  # other tools: another head
    assert report["cache"] == {"shared_heads": 1, "head_tokens": spawn.FANOUT_HEAD_TOKENS, "saved_usd": pytest.approx(3 * each)}
    assert report["cost_usd"] == pytest.approx(5 * default - 3 * each)
    # A median of ended agents already holds what their cache reads saved.
    seen = spawn.dag_estimate(spawn.parse_dag(fan, {}, "fan"), {"sonnet": [(0.05, 10.0)]})
    assert seen["cost_usd"] == pytest.approx(5 * 0.05) and seen["cache"]["saved_usd"] == 0


def test_estimate_verb_prints_one_json_object_and_refuses_a_bad_file(base_env: dict[str, str], tmp_path: Path) -> None:
    graph = tmp_path / "diamond.json"
    graph.write_text(json.dumps(DIAMOND))
    report = stdout_json(run_spawn(["estimate", str(graph)], base_env))
    defaults = spawn.DEFAULT_AGENT_COST_USD
    assert report["cost_usd"] == pytest.approx(2 * defaults["sonnet"] + defaults["opus"] + defaults["haiku"])
    assert report["critical_path_s"] == pytest.approx(3 * spawn.DEFAULT_AGENT_SECONDS)
    assert report["critical_path"][0] == "survey" and report["critical_path"][-1] == "report"
    assert report["per_task"]["deep"]["basis"] == "default for opus"
    text = run_spawn(["estimate", str(graph), "--text"], base_env)
    assert text.returncode == spawn.ExitCode.OK, text.stderr
    assert "4 tasks" in text.stdout and "survey -> " in text.stdout
    cyclic = tmp_path / "cycle.json"
    cyclic.write_text(json.dumps({"tasks": [{"id": "a", "task": "x", "blockedBy": ["b"]}, {"id": "b", "task": "y", "blockedBy": ["a"]}]}))
    bad = run_spawn(["estimate", str(cyclic)], base_env)
    assert bad.returncode == spawn.ExitCode.USAGE
    assert bad.stderr.startswith("spawn: error:") and "cycle" in bad.stderr
    assert bad.stdout == ""
