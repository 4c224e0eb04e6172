"""The node-kind seam and the command kind: an executable reading one JSON task on stdin.

Every test drives the real spawn.py; where a claude node is involved, it is the
real CLI against tools/mock_model.py. The command is a real program
(tests/fixtures/command_node.py), nothing is stubbed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import (
    ROOT,
    agent_dirs,
    alive,
    load,
    metas,
    mock_task,
    run_spawn,
    spawn_in_bash,
    stdout_json,
    validate_records,
    wait_for_path,
    wait_until_gone,
    write_agent,
)

import spawn

COMMAND = ROOT / "tests" / "fixtures" / "command_node.py"
NODE = f"command:{COMMAND}"


def only_agent(session_root: Path) -> Path:
    dirs = agent_dirs(session_root)
    assert len(dirs) == 1, dirs
    return dirs[0]


def transcript_types(agent_dir: Path) -> list[str]:
    return [json.loads(line)["type"] for line in (agent_dir / "transcript.jsonl").read_text().splitlines()]


# ---- resolving references (pure) ----


@pytest.mark.parametrize(
    ("value", "kind", "endpoint"),
    [
        (None, None, None),
        ("reviewer", None, None),
        ("command:/bin/echo hi", "command", "/bin/echo hi"),
        ("a2a:https://host.example/agents/x", "a2a", "https://host.example/agents/x/.well-known/agent-card.json"),
        ("a2a:http://127.0.0.1:8000/", "a2a", "http://127.0.0.1:8000/.well-known/agent-card.json"),
        ("https://host.example/.well-known/agent-card.json", "a2a", "https://host.example/.well-known/agent-card.json"),
        ("a2a:https://host.example/card.json", "a2a", "https://host.example/card.json"),
    ],
)
def test_references_resolve_to_a_kind(value: str | None, kind: str | None, endpoint: str | None) -> None:
    node = spawn.parse_reference(value)
    assert (node.kind, node.endpoint) == (kind, endpoint) if node else kind is None


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("https://host.example/agents/x", "must be an A2A agent card"),
        ("a2a:ftp://host.example/x", "http(s) URL"),
        ("a2a:nohost", "http(s) URL"),
        ("command:", "give the executable"),
        ("command:'unclosed", "quoting"),
    ],
)
def test_bad_references_are_usage_errors(value: str, fragment: str) -> None:
    with pytest.raises(spawn.UsageError) as caught:
        spawn.parse_reference(value)
    assert fragment in caught.value.message


def test_definition_kinds_are_parsed_and_linted() -> None:
    text = "---\nname: far\ndescription: a remote agent\nkind: a2a\nurl: http://127.0.0.1:9/\n---\n"
    d, problems = spawn.parse_definition(text, "/x/far.md", "project")
    assert d is not None and not [p for p in problems if p.severity == "error"]
    assert spawn.node_of_definition(d) == spawn.Node("a2a", "http://127.0.0.1:9/.well-known/agent-card.json")
    d, problems = spawn.parse_definition("---\nname: cmd\ndescription: d\nkind: command\n---\n", "/x/cmd.md", "project")
    assert d is not None and any("needs command" in p.message for p in problems)
    with pytest.raises(spawn.UsageError, match="no url/command"):
        spawn.node_of_definition(d)
    d, problems = spawn.parse_definition("---\nname: w\ndescription: d\nkind: grpc\n---\n", "/x/w.md", "project")
    assert d is not None and any("kind must be one of" in p.message for p in problems)
    d, _ = spawn.parse_definition("---\nname: plain\ndescription: d\n---\n", "/x/plain.md", "project")
    assert spawn.node_of_definition(d) == spawn.Node("claude")


@pytest.mark.parametrize(
    ("out", "code", "status", "fragment"),
    [
        (b'{"output": "hi", "cost_usd": 0.5}', 0, "done", "completed"),
        (b'{"output": null}', 0, "done", "completed"),
        (b'{"error": "broken"}', 0, "failed", "broken"),
        (b'{"error": "broken"}', 3, "failed", "exited 3: broken"),
        (b"", 1, "failed", "exited 1"),
        (b"not json", 0, "failed", "no JSON result"),
        (b'["a list"]', 0, "failed", "no JSON result"),
        (b"", -9, "killed", "SIGKILL"),
    ],
)
def test_command_results_map_to_statuses(out: bytes, code: int, status: str, fragment: str) -> None:
    result = spawn.command_result(out, code, [])
    assert result.status == status and fragment in result.reason


# ---- the command kind, end to end ----


def test_command_node_done_records_kind_output_and_cost(base_env: dict[str, str], session_root: Path) -> None:
    # No model credentials: a command node needs none.
    proc = run_spawn(["--agent", NODE, "--task", "done the answer"], base_env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    out = stdout_json(proc)
    assert out["status"] == "done" and out["output"] == "the answer" and out["cost_usd"] == 0.25
    agent_dir = only_agent(session_root)
    meta = load(agent_dir / "meta.json")
    assert meta["kind"] == "command" and meta["endpoint"] == str(COMMAND)
    assert transcript_types(agent_dir) == ["CommandStart", "CommandResult"]
    assert "command_node: done" in (agent_dir / "stderr.log").read_text()
    assert (agent_dir / ".done").exists()
    ledger = [json.loads(line) for line in next(session_root.glob("*/ledger.jsonl")).read_text().splitlines()]
    assert [line["cost_usd"] for line in ledger if line.get("kind", "charge") == "charge"] == [0.25]
    validate_records(session_root)


def test_command_node_gets_the_documented_task(base_env: dict[str, str], session_root: Path) -> None:
    proc = run_spawn(["--agent", NODE, "--task", "echo me", "--schema", '{"type": "object"}', "--timeout", "600"], base_env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    task = load(only_agent(session_root) / "outcome.json")["output"]
    meta = load(only_agent(session_root) / "meta.json")
    assert task["task"] == "echo me" and task["schema"] == {"type": "object"}
    assert (task["depth"], task["max_depth"], task["agent_id"], task["parent_id"]) == (0, meta["max_depth"], meta["id"], None)
    assert task["deadline"] == meta["deadline"] and task["traceparent"] == meta["traceparent"]
    assert task["session"] == meta["session"] and task["protocol"] == 1


@pytest.mark.parametrize(
    ("task", "fragment"),
    [
        ("fail", "exited 3: the widget is broken"),
        ("error", "the command failed: nothing to do"),
        ("badjson", "no JSON result"),
    ],
)
def test_command_node_failures_are_fail_with_a_reason(task: str, fragment: str, base_env: dict[str, str], session_root: Path) -> None:
    proc = run_spawn(["--agent", NODE, "--task", task], base_env)
    assert proc.returncode == spawn.ExitCode.AGENT_FAILED, proc.stderr
    out = stdout_json(proc)
    assert out["status"] == "failed" and fragment in out["reason"]
    assert (only_agent(session_root) / ".fail").exists()
    validate_records(session_root)


def test_command_node_output_is_checked_against_the_schema(base_env: dict[str, str], session_root: Path) -> None:
    schema = '{"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}'
    ok = run_spawn(["--agent", NODE, "--task", 'json {"n": 3}', "--schema", schema], base_env)
    assert ok.returncode == spawn.ExitCode.OK, ok.stderr
    assert stdout_json(ok)["output"] == {"n": 3}
    bad = run_spawn(["--agent", NODE, "--task", 'json {"n": "three"}', "--schema", schema], base_env)
    assert bad.returncode == spawn.ExitCode.AGENT_FAILED
    out = stdout_json(bad)
    assert "does not match the schema" in out["reason"] and out["validation_errors"]


def test_command_node_timeout_ends_the_command(base_env: dict[str, str], session_root: Path) -> None:
    proc = run_spawn(["--agent", NODE, "--task", "sleep", "--timeout", "3"], base_env)
    assert proc.returncode == spawn.ExitCode.TIMEOUT, proc.stderr
    agent_dir = only_agent(session_root)
    assert stdout_json(proc)["status"] == "timeout"
    pid = int((agent_dir / "command.pid").read_text())
    assert wait_until_gone([pid], timeout=30) == []


def test_command_node_kill_ends_the_command_and_wait_status_work(base_env: dict[str, str], session_root: Path) -> None:
    launched = run_spawn(["--agent", NODE, "--task", "sleep", "--background"], base_env)
    assert launched.returncode == spawn.ExitCode.OK, launched.stderr
    info = stdout_json(launched)
    agent_dir = Path(info["agent_dir"])
    wait_for_path(agent_dir / "command.pid")
    pid = int((agent_dir / "command.pid").read_text())
    status = run_spawn(["status", "--json"], base_env)
    assert status.returncode == spawn.ExitCode.OK, status.stderr
    assert info["id"] in status.stdout and "running" in status.stdout
    killed = run_spawn(["kill", info["id"]], base_env)
    assert killed.returncode == spawn.ExitCode.OK, killed.stderr
    waited = run_spawn(["wait", info["id"]], base_env)
    assert waited.returncode == spawn.ExitCode.AGENT_FAILED, waited.stderr  # wait: any agent not done
    assert [a["status"] for a in stdout_json(waited)["agents"]] == ["killed"]
    assert load(agent_dir / "outcome.json")["status"] == "killed"
    assert wait_until_gone([pid], timeout=30) == [] and not alive([pid])
    validate_records(session_root)


@pytest.mark.parametrize(
    ("agent", "fragment"),
    [
        ("command:/nonexistent/exe", "not an executable file"),
        (f"command:{ROOT / 'README.md'}", "not an executable file"),
        ("command:", "give the executable"),
        ("https://127.0.0.1:9/not-a-card", "must be an A2A agent card"),
    ],
)
def test_bad_command_references_exit_2_with_nothing_written(
    agent: str, fragment: str, base_env: dict[str, str], session_root: Path
) -> None:
    proc = run_spawn(["--agent", agent, "--task", "done x"], base_env)
    assert proc.returncode == spawn.ExitCode.USAGE, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("spawn: error: ") and fragment in lines[0], lines
    assert proc.stdout == "" and not (session_root.exists() and any(session_root.rglob("*")))


def test_dry_run_shows_the_kind(base_env: dict[str, str], session_root: Path) -> None:
    proc = run_spawn(["--agent", NODE, "--task", "done x", "--dry-run"], base_env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    resolved = stdout_json(proc)
    assert resolved["kind"] == "command" and resolved["endpoint"] == str(COMMAND)
    plain = run_spawn(["--task", "x", "--dry-run"], base_env)
    assert stdout_json(plain)["kind"] == "claude" and "endpoint" not in stdout_json(plain)
    assert not session_root.exists()


def test_a_definition_can_name_a_command(base_env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    project = tmp_path / "project"
    write_agent(project, "tool", f"description: an in-house tool\nkind: command\ncommand: {COMMAND}")
    proc = run_spawn(["--agent", "tool", "--task", "done via definition"], base_env, cwd=project)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    meta = load(only_agent(session_root) / "meta.json")
    assert (meta["kind"], meta["agent"], stdout_json(proc)["output"]) == ("command", "tool", "via definition")


def test_the_claude_path_never_imports_the_a2a_client(base_env: dict[str, str]) -> None:
    code = (
        "import sys, spawn\n"
        "spawn.main(['--task', 'x', '--dry-run'])\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('a2a', 'httpx', 'google')], 'a2a client imported'\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env={**base_env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr


def test_a_claude_agent_starts_a_command_child(env: dict[str, str], session_root: Path) -> None:
    child = spawn_in_bash("--agent", NODE, "--task", "echo from the root")
    proc = run_spawn(["--task", mock_task("delegate", [{"bash": child}, {"text": "delegated"}]), "--tools", "Bash"], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    by_id = metas(session_root)
    root = next(m for m in by_id.values() if m["depth"] == 0)
    node = next(m for m in by_id.values() if m["depth"] == 1)
    assert (root["kind"], node["kind"], node["parent_id"]) == ("claude", "command", root["id"])
    task = load(Path(node["session"]) / "agents" / node["id"] / "outcome.json")["output"]
    assert task["depth"] == 1 and task["traceparent"].split("-")[1] == root["trace_id"]
    validate_records(session_root)


def test_a_task_graph_mixes_claude_and_command_nodes(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    graph = tmp_path / "mixed.json"
    graph.write_text(
        json.dumps(
            {
                "tasks": [
                    {"id": "a", "task": mock_task("A", [{"text": "out-A"}])},
                    {"id": "b", "task": "done from b", "agent": NODE},
                    {"id": "c", "task": "echo c", "agent": NODE, "blockedBy": ["a", "b"]},
                ]
            }
        )
    )
    proc = run_spawn(["dag", "run", str(graph)], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    tasks = stdout_json(proc)["tasks"]
    assert (tasks["a"]["output"], tasks["b"]["output"]) == ("out-A", "from b")
    assert "## a\nout-A" in tasks["c"]["output"]["task"] and "## b\nfrom b" in tasks["c"]["output"]["task"]
    kinds = {m["topic"]: m["kind"] for m in metas(session_root).values() if m.get("agent") != "dag"}
    assert kinds == {"a": "claude", "b": "command", "c": "command"}
    validate_records(session_root)
