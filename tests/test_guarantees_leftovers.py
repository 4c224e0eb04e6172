"""Issue #8's leftovers: the scripted model's one launcher, a definition's numbers
checked as the flags are, and a parent's own spend counted against its hold.

The end-to-end tests run the real bundled claude CLI through spawn.py against
tools/mock_model.py.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from conftest import MockModel, agent_dirs, load, mock_task, run_spawn, spawn_in_bash, stdout_json, validate_records, write_agent
from mock_model import serve

import spawn

# ------------------------------------------------------------ mock_model.serve --


def test_serve_starts_a_scripted_model_and_stops_it(tmp_path: Path) -> None:
    scenario = {"rules": [{"match": "hello", "steps": [{"text": "scripted reply"}]}]}
    body = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hello"}], "tools": [{"name": "Bash"}]}
    with serve(tmp_path, scenario) as served, serve(tmp_path) as other:
        assert served.url != other.url  # two servers share one workdir
        request = urllib.request.Request(served.url + "/v1/messages", data=json.dumps(body).encode())
        with urllib.request.urlopen(request, timeout=30) as resp:
            assert b"scripted reply" in resp.read()
        assert len(served.new_requests()) == 1
        assert served.new_requests() == []  # only what came since the last call
        assert len(served.requests()) == 1
        assert other.requests() == []
    assert served.process.poll() is not None and other.process.poll() is not None


def test_spawn_in_bash_quotes_each_argument() -> None:
    assert spawn_in_bash("--task", "it's a task") == '"$SPAWN_PYTHON" "$SPAWN_PY" --task \'it\'"\'"\'s a task\''


# ------------------------------------------------------- definition numbers --

BAD_DEFINITION_NUMBERS = [
    ("maxTurns: .nan", "maxTurns must be an integer, got nan"),
    ("maxTurns: -3", "maxTurns must be > 0, got -3"),
    ("maxTurns: many", "maxTurns must be an integer, got 'many'"),
    ("maxTurns: 0", "maxTurns must be > 0, got 0"),
    ("maxTurns: 1e99", "maxTurns must be an integer"),
    ("autoCompactWindow: -1", "autoCompactWindow must be > 0, got -1"),
    ("timeout: .inf", "timeout must be a finite number, got inf"),
    ("max_depth: -1", "max_depth must be >= 0, got -1"),
]


@pytest.mark.parametrize("case", BAD_DEFINITION_NUMBERS, ids=[f for f, _ in BAD_DEFINITION_NUMBERS])
def test_a_bad_number_in_a_definition_is_exit_2_before_anything_runs(
    env: dict[str, str], session_root: Path, tmp_path: Path, mock_model: MockModel, case: tuple[str, str]
) -> None:
    field, message = case
    project = tmp_path / "project"
    write_agent(project, "counter", f"description: Counts\ntools: Read\n{field}")
    proc = run_spawn(["--agent", "counter", "--task", mock_task("count", [{"text": "never"}])], env, cwd=project)
    assert proc.returncode == spawn.ExitCode.USAGE, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("spawn: error: ") and message in lines[0], proc.stderr
    assert "agents lint" in lines[0]  # it says what to do
    assert proc.stdout == ""
    assert agent_dirs(session_root) == []  # nothing registered
    assert mock_model.requests() == []  # no model call
    lint = run_spawn(["agents", "lint"], env, cwd=project)
    assert lint.returncode == spawn.ExitCode.USAGE
    assert f"counter.md:5: error: {message}" in lint.stdout  # the line of the field


def test_good_definition_numbers_are_taken() -> None:
    text = "---\nname: t\ndescription: d\nmaxTurns: 7\nautoCompactWindow: 120000\n---\nBody\n"
    d, problems = spawn.parse_definition(text, "t.md", "project")
    assert problems == [] and d is not None
    assert (d.max_turns, d.auto_compact_window) == (7, 120000)


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
    proc = run_spawn(["--task", mock_task("parent", steps), "--tools", "Bash", "--max-budget-usd", "0.2"], env, timeout=300)
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
    proc = run_spawn(["--task", mock_task("parent", steps), "--tools", "Bash", "--max-budget-usd", "0.2"], env, timeout=300)
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
