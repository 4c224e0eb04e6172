"""spawn.py copied alone into an empty folder: its built-in schemas, agents and workflows.

Only spawn.py is copied (no schemas/, .claude/, workflows/ beside it or above
the working directory), HOME is private, and the copy runs the real claude
CLI against the scripted model; a file of the project overrides a built-in one.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import test_workflows
from conftest import ROOT, listed_agents, run_python, stdout_json, write_agent
from test_workflows import PLAN, answer_asks, check_state

import spawn

wf_env = test_workflows.wf_env  # the fixture: base_env pointed at the scripted plan/build/explore model

DEFAULT_AGENTS = ["architect", "build", "code-reviewer", "debugger", "documentation-writer", "explore", "plan", "test-engineer"]


@pytest.fixture
def alone() -> Iterator[Path]:
    """An empty folder holding only a copy of spawn.py: the working directory of every run here.

    Outside the checkout: agents are found upward from the working directory, and nox puts
    the tests' tmp_path inside the checkout (its TMPDIR is .nox/tests/tmp), under .claude/.
    """
    with tempfile.TemporaryDirectory(prefix="spawn-alone-", dir="/tmp" if Path("/tmp").is_dir() else None) as base:
        folder = Path(base) / "alone"
        assert not any((p / ".claude").is_dir() for p in folder.parents), folder
        folder.mkdir()
        shutil.copy2(ROOT / "spawn.py", folder)
        yield folder


def run_alone(folder: Path, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_python([str(folder / "spawn.py"), *args], env, cwd=folder)


def start_alone(folder: Path, args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(folder / "spawn.py"), *args],
        env=env, cwd=folder, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_schema_findings_is_built_in(base_env: dict[str, str], alone: Path) -> None:
    proc = run_alone(alone, ["--task", "x", "--schema", "findings", "--dry-run"], base_env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    resolved = stdout_json(proc)
    assert resolved["schema"] == json.loads((ROOT / "schemas" / "findings.json").read_text())
    assert resolved["schema_source"] == "built-in schemas/findings.json"
    unknown = run_alone(alone, ["--task", "x", "--schema", "nope", "--dry-run"], base_env)
    assert unknown.returncode == spawn.ExitCode.USAGE
    # The built-in output schemas; record schemas (state, native-line, ...) are no agent's answer.
    outputs = "build, design, diagnosis, docs, findings, plan, result, review, summary, test-report"
    assert unknown.stderr == f"spawn: error: unknown schema 'nope'; use one of {outputs}, a path, or inline JSON\n"


def test_a_schema_beside_the_script_overrides_the_built_in_one(base_env: dict[str, str], alone: Path) -> None:
    own = {"type": "object", "properties": {"mine": {"type": "string"}}, "required": ["mine"]}
    (alone / "schemas").mkdir()
    (alone / "schemas" / "findings.json").write_text(json.dumps(own))
    resolved = stdout_json(run_alone(alone, ["--task", "x", "--schema", "findings", "--dry-run"], base_env))
    assert resolved["schema"] == own
    assert resolved["schema_source"] == str(alone / "schemas" / "findings.json")


def test_default_agents_are_built_in_and_listed_as_such(base_env: dict[str, str], alone: Path) -> None:
    proc = run_alone(alone, ["--task", "Review the diff", "--agent", "code-reviewer", "--dry-run"], base_env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    resolved = stdout_json(proc)
    assert resolved["agent"] == "code-reviewer"
    assert resolved["agent_source"] == "built-in .claude/agents/code-reviewer.md"
    assert resolved["schema"] == json.loads((ROOT / "schemas" / "review.json").read_text())  # its schema: built in too
    rows = listed_agents(base_env, alone, builtin=True)
    assert [(r["name"], r["source"]) for r in rows] == [(name, "built-in") for name in DEFAULT_AGENTS]
    text = run_alone(alone, ["agents", "list"], base_env)
    assert text.returncode == spawn.ExitCode.OK
    assert [line.split()[:2] for line in text.stdout.splitlines()] == [[name, "built-in"] for name in DEFAULT_AGENTS]
    lint = run_alone(alone, ["agents", "lint"], base_env)
    assert lint.returncode == spawn.ExitCode.OK and lint.stdout == "", lint.stdout
    missing = run_alone(alone, ["--task", "x", "--agent", "nobody", "--dry-run"], base_env)
    assert missing.returncode == spawn.ExitCode.USAGE
    assert missing.stderr.startswith("spawn: error: no agent definition 'nobody' in the built-in agents; run 'spawn.py agents list'")


def test_a_project_agent_overrides_the_built_in_one(base_env: dict[str, str], alone: Path) -> None:
    path = write_agent(alone, "code-reviewer", "description: Our own reviewer\ntools: Read")
    resolved = stdout_json(run_alone(alone, ["--task", "x", "--agent", "code-reviewer", "--dry-run"], base_env))
    assert resolved["agent_source"] == str(path)
    assert resolved["tools"] == ["Read"] and resolved.get("schema") is None
    rows = {r["name"]: r for r in listed_agents(base_env, alone, builtin=True)}
    assert (rows["code-reviewer"]["source"], rows["code-reviewer"]["description"]) == ("project", "Our own reviewer")
    assert sorted(rows) == DEFAULT_AGENTS and rows["plan"]["source"] == "built-in"


def test_plan_then_build_run_the_built_in_workflow(wf_env: dict[str, str], alone: Path, session_root: Path) -> None:
    planned = run_alone(alone, ["plan", "Add x"], wf_env)
    assert planned.returncode == spawn.ExitCode.OK, planned.stderr
    assert check_state(alone / ".spawn-state.json")["results"]["plan"] == spawn.plan_markdown(PLAN)
    proc = start_alone(alone, ["build"], wf_env)
    assert len(answer_asks(proc, session_root, wf_env, "approve")) == 1
    out, err = proc.communicate()
    assert proc.returncode == spawn.ExitCode.OK, err
    assert json.loads(out)["status"] == "done"
    assert check_state(alone / ".spawn-state.json")["results"]["build"] == {"filesCreated": ["src/x.py"], "filesModified": []}
    assert (alone / "src" / "x.py").read_text() == "x = 1\n"
    graphs = [json.loads(line) for path in session_root.glob("*/dags/*.jsonl") for line in path.read_text().splitlines()]
    assert {g["file"] for g in graphs if g["event"] == "graph"} == {"built-in workflows/plan-build.yaml"}


def test_run_all_runs_the_built_in_workflow(wf_env: dict[str, str], alone: Path, session_root: Path) -> None:
    proc = start_alone(alone, ["run-all", "Add x"], wf_env)
    assert len(answer_asks(proc, session_root, wf_env, "approve")) == 1
    out, err = proc.communicate()
    assert proc.returncode == spawn.ExitCode.OK, err
    assert json.loads(out)["status"] == "done"
    data = check_state(alone / ".spawn-state.json")
    assert [h["phase"] for h in data["history"]] == ["plan", "build", "explore"] and data["status"] == "success"


def test_a_workflow_beside_the_script_overrides_the_built_in_one(base_env: dict[str, str], alone: Path) -> None:
    (alone / "workflows").mkdir()
    (alone / "workflows" / "plan-build.yaml").write_text("tasks: not a list\n")
    proc = run_alone(alone, ["plan", "Add x"], base_env)
    assert proc.returncode == spawn.ExitCode.USAGE
    assert proc.stderr.startswith("spawn: error: ") and str(alone / "workflows" / "plan-build.yaml") in proc.stderr
    assert not (alone / ".spawn-state.json").exists()
