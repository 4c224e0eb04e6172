"""Agent definitions, routing and permission rules.

The end-to-end tests run the real bundled claude CLI through spawn.py against
the scripted model; the others test the pure parsing, matching and routing.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    ROOT,
    MockModel,
    agent_dirs,
    listed_agents,
    load,
    mock_task,
    run_spawn,
    spawn_in_bash,
    start_spawn,
    stdout_json,
    validate_records,
    wait_for_ask,
    write_agent,
)

import spawn

ECHO_SERVER = ROOT / "tests" / "fixtures" / "echo_mcp_server.py"


def decisions(agent_dir: Path) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in (agent_dir / "transcript.jsonl").read_text().splitlines()]
    return [line["message"] for line in lines if line["type"] == "PermissionDecision"]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    (path / "src").mkdir(parents=True)
    return path


# ----------------------------------------------------------------- end to end --


def test_definition_tools_prompt_and_schema_take_effect(env: dict[str, str], session_root: Path, project: Path) -> None:
    write_agent(project, "scout", "description: Scout things.\ntools: Read\nschema: summary\nmax_depth: 1", body="You are SCOUT-PROMPT.")
    task = mock_task("look", [{"bash": "echo should-not-run"}, {"structured": {"summary": "scouted"}}])
    proc = run_spawn(["--agent", "scout", "--task", task, "--tools", "Read,Bash", "--cwd", str(project)], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert stdout_json(proc)["output"] == {"summary": "scouted"}
    (agent_dir,) = agent_dirs(session_root)
    meta = load(agent_dir / "meta.json")
    assert meta["agent"] == "scout"
    assert meta["tools"] == ["Read"]  # --tools can't widen the definition
    assert meta["max_depth"] == 1
    assert meta["schema"]["title"] == "A short answer"
    assert meta["system_prompt"] == "You are SCOUT-PROMPT."
    assert any("dropped: Bash" in w for w in meta["warnings"])
    assert "No such tool available: Bash" in (agent_dir / "transcript.jsonl").read_text()
    validate_records(session_root)


def test_denied_bash_command_is_refused_and_audited(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    task = mock_task("clean up", [{"bash": f"echo tidy && rm -f {victim}"}, {"bash": "echo allowed-run"}, {"text": "done"}])
    proc = run_spawn(["--task", task, "--tools", "Bash", "--deny", "Bash(rm:*)"], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert victim.read_text() == "keep me"
    (agent_dir,) = agent_dirs(session_root)
    audit = decisions(agent_dir)
    assert audit[0]["verdict"] == "deny"
    assert audit[0]["rule"] == "Bash(rm:*)"
    assert audit[1]["verdict"] == "allow"
    assert "denied by spawn.py" in (agent_dir / "transcript.jsonl").read_text()
    validate_records(session_root)


@pytest.mark.parametrize(("answer", "created"), [("approve", True), ("deny", False)])
def test_ask_goes_up_the_tree_and_is_answered(env: dict[str, str], session_root: Path, tmp_path: Path, answer: str, created: bool) -> None:
    target = tmp_path / "made-by-agent"
    task = mock_task("make a file", [{"bash": f"touch {target}"}, {"text": "finished"}])
    proc = start_spawn(["--task", task, "--tools", "Bash", "--ask", "Bash(touch:*)"], env)
    ask = wait_for_ask(session_root)
    assert ask["tool"] == "Bash"
    assert ask["rule"] == "Bash(touch:*)"
    listed = stdout_json(run_spawn(["status", "--json"], env))
    assert [a["id"] for a in listed["pending_asks"]] == [ask["id"]]
    answered = run_spawn([answer, str(ask["id"])], env)
    assert answered.returncode == spawn.ExitCode.OK, answered.stderr
    again = run_spawn([answer, str(ask["id"])], env)
    assert again.returncode == spawn.ExitCode.USAGE
    assert "already answered" in again.stderr
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == spawn.ExitCode.OK, err
    assert target.exists() is created
    (agent_dir,) = agent_dirs(session_root)
    (decision,) = decisions(agent_dir)
    assert decision["verdict"] == ("allow" if created else "deny")
    assert decision["by"] == answer
    validate_records(session_root)


def test_unanswered_ask_is_denied_after_the_timeout(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    target = tmp_path / "never"
    task = mock_task("make a file", [{"bash": f"touch {target}"}, {"text": "finished"}])
    proc = run_spawn(["--task", task, "--tools", "Bash", "--ask", "Bash(touch:*)"], {**env, "SPAWN_ASK_TIMEOUT_S": "1"})
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert not target.exists()
    (agent_dir,) = agent_dirs(session_root)
    assert decisions(agent_dir)[0]["by"] == "timeout"


def test_denied_ask_that_ends_the_run_is_refused(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    # The Bash call is the agent's only step: told no, it ends without the result it owed.
    target = tmp_path / "never"
    task = mock_task("make a file", [{"bash": f"touch {target}"}])
    proc = start_spawn(["--task", task, "--tools", "Bash", "--ask", "Bash(touch:*)", "--schema", "summary"], env)
    ask = wait_for_ask(session_root)
    assert run_spawn(["deny", str(ask["id"])], env).returncode == spawn.ExitCode.OK
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == spawn.ExitCode.REFUSED, err
    result = json.loads(out)
    assert result["status"] == "refused"
    assert f"ask {ask['id']} (rule Bash(touch:*)) denied by deny" in result["reason"]
    assert not target.exists()
    (agent_dir,) = agent_dirs(session_root)
    assert load(agent_dir / "outcome.json")["exit_code"] == spawn.ExitCode.REFUSED
    # It ran and spent: the ledger charges it like any agent that ran.
    ledger = [json.loads(line) for line in (agent_dir.parent.parent / spawn.LEDGER).read_text().splitlines()]
    assert [e["status"] for e in ledger if e["id"] == result["id"]] == ["refused"]
    validate_records(session_root)


def test_child_keeps_parent_deny_rules_even_with_its_env_cleared(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    child = mock_task("child", [{"bash": f"rm -f {victim}"}, {"text": "child done"}])
    tamper = "unset SPAWN_DENY SPAWN_ASK SPAWN_PERMISSION_MODE; "
    root = mock_task("root", [{"bash": tamper + spawn_in_bash("--task", child, "--tools", "Bash")}, {"text": "root done"}])
    proc = run_spawn(["--task", root, "--tools", "Bash", "--deny", "Bash(rm:*)"], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert victim.read_text() == "keep me"
    child_dir = next(d for d in agent_dirs(session_root) if load(d / "meta.json")["depth"] == 1)
    assert "Bash(rm:*)" in load(child_dir / "meta.json")["permissions"]["deny"]
    assert decisions(child_dir)[0]["verdict"] == "deny"
    validate_records(session_root)


@pytest.mark.parametrize("where", ["user", "parent"])
def test_minimal_mode_asked_for_can_not_switch_the_permission_gate_off(
    env: dict[str, str], session_root: Path, tmp_path: Path, where: str
) -> None:
    # Claude Code's minimal mode (CLAUDE_CODE_SIMPLE=1) runs no hooks: set by
    # the user, or by a parent's Bash for its child, it would have let the
    # child run an ask-ruled command unasked, with nothing in its audit.
    made = tmp_path / "made-unasked"
    child = mock_task("child", [{"bash": f"touch {made}"}, {"text": "child done"}])
    minimal = "export CLAUDE_CODE_SIMPLE=1; " if where == "parent" else ""
    root = mock_task("root", [{"bash": minimal + spawn_in_bash("--task", child, "--tools", "Bash")}, {"text": "root done"}])
    run_env = {**env, "SPAWN_ASK_TIMEOUT_S": "2", **({"CLAUDE_CODE_SIMPLE": "1"} if where == "user" else {})}
    proc = run_spawn(["--task", root, "--tools", "Bash", "--ask", "Bash(touch:*)"], run_env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert not made.exists()  # asked, nobody answered, denied at the timeout
    child_dir = next(d for d in agent_dirs(session_root) if load(d / "meta.json")["depth"] == 1)
    assert [(d["rule"], d["verdict"]) for d in decisions(child_dir)] == [("Bash(touch:*)", "deny")]
    validate_records(session_root)


def test_definition_with_mcp_servers_makes_their_tools_available(env: dict[str, str], session_root: Path, project: Path) -> None:
    servers = f"mcpServers:\n  echo:\n    command: {json.dumps(sys.executable)}\n    args: [{json.dumps(str(ECHO_SERVER))}]"
    write_agent(project, "echoer", f"description: Echo through MCP.\ntools: Read\n{servers}")
    task = mock_task("echo it", [{"tool": "mcp__echo__echo", "input": {"text": "hello"}}, {"text": "echoed"}])
    proc = run_spawn(["--agent", "echoer", "--task", task, "--cwd", str(project)], env, timeout=180)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    (agent_dir,) = agent_dirs(session_root)
    assert load(agent_dir / "meta.json")["mcp_servers"] == ["echo"]
    transcript = (agent_dir / "transcript.jsonl").read_text()
    assert "echo-server says: hello" in transcript
    assert '"status": "connected"' in transcript
    validate_records(session_root)


# ------------------------------------------------------ widening, via dry run --


def dry_run(env: dict[str, str], args: list[str], cwd: Path | None = None) -> dict[str, Any]:
    proc = run_spawn(["--dry-run", "--task", "t", *args], env, cwd=cwd)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    data = json.loads(proc.stdout)
    assert isinstance(data, dict)
    return data


def test_widening_attempts_are_narrowed(base_env: dict[str, str], project: Path) -> None:
    child_env = {
        **base_env,
        "SPAWN_DEPTH": "0",
        "SPAWN_MAX_DEPTH": "2",
        "SPAWN_TOOLS": "Read,Bash",
        "SPAWN_DENY": json.dumps(["Read(**/.env*)"]),
        "SPAWN_PERMISSION_MODE": "dontAsk",
        "SPAWN_DEADLINE": str(time.time() + 100),
        "SPAWN_MAX_BUDGET_USD": "0.5",
    }
    write_agent(project, "wild", "description: Wants everything.\ntools: Read, Bash, Write\npermissionMode: bypassPermissions")
    got = dry_run(child_env, ["--agent", "wild", "--max-depth", "9", "--timeout", "1000", "--max-budget-usd", "9"], cwd=project)
    assert got["tools"] == ["Read", "Bash"]
    assert got["permission_mode"] == "dontAsk"
    assert got["max_depth"] == 2
    assert got["max_budget_usd"] == 0.5
    assert got["deadline"] <= time.time() + 100 - spawn.PARENT_GRACE_S
    assert got["permissions"]["deny"] == ["Read(**/.env*)"]
    warnings = " ".join(got["warnings"])
    for fragment in ("dropped: Write", "lowered to the parent's dontAsk", "--max-depth 9 lowered", "--max-budget-usd 9"):
        assert fragment in warnings


def test_allow_flag_cannot_widen_a_definition(base_env: dict[str, str], project: Path) -> None:
    write_agent(project, "narrow", "description: Narrow.\ntools: Bash\npermissions:\n  allow: ['Bash(git diff:*)']")
    got = dry_run(base_env, ["--agent", "narrow", "--allow", "Bash(rm:*)", "--deny", "Bash(git push:*)"], cwd=project)
    assert got["permissions"] == {"allow": ["Bash(git diff:*)"], "deny": ["Bash(git push:*)"], "ask": []}
    assert any("--allow can't widen" in w for w in got["warnings"])


def test_request_with_no_tools_left_is_refused(env: dict[str, str], session_root: Path) -> None:
    proc = run_spawn(["--task", "t", "--tools", "Write"], {**env, "SPAWN_DEPTH": "0", "SPAWN_TOOLS": "Read"})
    assert proc.returncode == spawn.ExitCode.REFUSED
    assert "tools: none of Write" in proc.stderr


def test_briefing_lists_delegates_and_rights(base_env: dict[str, str]) -> None:
    got = dry_run(base_env, ["--tools", "Bash,Read", "--deny", "Bash(rm:*)"], cwd=ROOT)
    briefing = str(got["briefing"])
    assert "explore: Read-only exploration" in briefing
    assert "deny Bash(rm:*)" in briefing
    assert "permission mode dontAsk" in briefing


def test_auto_routing_is_recorded_and_explained(base_env: dict[str, str]) -> None:
    proc = run_spawn(
        ["--dry-run", "--agent", "auto", "--task", "Find where the session directory is created and explain it"], base_env, cwd=ROOT
    )
    got = json.loads(proc.stdout)
    assert got["agent"] == "explore"
    assert got["routing"]["chosen"] == "explore"
    assert got["routing"]["candidates"][0]["matched"]
    assert "routed to explore" in proc.stderr


# ------------------------------------------------------------ agents verbs --


def test_agents_list_new_and_lint(base_env: dict[str, str], project: Path) -> None:
    # The nearest .claude/agents upwards is the project's: without this one, a
    # tmp_path inside a checkout (nox puts TMPDIR there) would find the repo's.
    (project / ".claude" / "agents").mkdir(parents=True)
    created = run_spawn(["agents", "new", "helper"], base_env, cwd=project)
    assert created.returncode == spawn.ExitCode.OK, created.stderr
    path = project / ".claude" / "agents" / "helper.md"
    assert path.exists()
    assert run_spawn(["agents", "new", "helper"], base_env, cwd=project).returncode == spawn.ExitCode.USAGE
    assert run_spawn(["agents", "lint"], base_env, cwd=project).returncode == spawn.ExitCode.OK
    assert [a["name"] for a in listed_agents(base_env, project)] == ["helper"]
    write_agent(project, "broken", "description: x\ntools: Read, Teleport\nschema: nope\ncolour: red")
    (project / ".claude" / "agents" / "badyaml.md").write_text("---\nname: badyaml\ndescription: [unclosed\n---\nbody\n")
    lint = run_spawn(["agents", "lint"], base_env, cwd=project)
    assert lint.returncode == spawn.ExitCode.USAGE
    # Only the unresolved schema is an error; Claude Code loads the rest.
    assert "broken.md:4: warning: unknown tool Teleport" in lint.stdout
    assert "broken.md:5: error: schema 'nope'" in lint.stdout
    assert "broken.md:6: warning: unknown field 'colour'" in lint.stdout
    assert "badyaml.md:3: warning: bad YAML" in lint.stdout
    assert lint.stderr.startswith("spawn: error: ")


def test_lint_refuses_frontmatter_nested_past_the_bound_in_one_short_line(base_env: dict[str, str], project: Path) -> None:
    """100,000 levels of YAML are no hand-written definition for Claude Code's fallback to read: exit 2, one short error."""
    deep = "[" * 100_000 + "]" * 100_000
    (project / ".claude" / "agents").mkdir(parents=True)
    (project / ".claude" / "agents" / "deep.md").write_text(f"---\nname: deep\ndescription: deep\nx: {deep}\n---\nbody\n")
    lint = run_spawn(["agents", "lint"], base_env, cwd=project)
    assert lint.returncode == spawn.ExitCode.USAGE, lint.stdout
    assert lint.stdout.strip().endswith("deep.md:4: error: bad YAML: nested deeper than 64 levels"), lint.stdout[:2000]
    assert len(lint.stdout) + len(lint.stderr) < 1000 and "valid" not in lint.stdout


def test_shipped_agents_lint_clean(base_env: dict[str, str]) -> None:
    proc = run_spawn(["agents", "lint"], base_env, cwd=ROOT)
    assert proc.returncode == spawn.ExitCode.OK, proc.stdout
    names = [a["name"] for a in stdout_json(run_spawn(["agents", "list", "--json"], base_env, cwd=ROOT))["agents"]]
    expected = ["architect", "build", "code-reviewer", "debugger", "documentation-writer", "explore", "plan", "test-engineer"]
    assert names == expected


def test_project_definition_wins_over_user(base_env: dict[str, str], project: Path) -> None:
    home = Path(base_env["HOME"])
    write_agent(home, "twin", "description: from the user")
    write_agent(project, "twin", "description: from the project")
    rows = listed_agents(base_env, project / "src")
    assert [(r["name"], r["source"], r["description"]) for r in rows] == [("twin", "project", "from the project")]


# ---------------------------------------------------------------- pure core --


@pytest.mark.parametrize(
    ("rule", "tool", "tool_input", "expected"),
    [
        ("Bash(git diff:*)", "Bash", {"command": "git diff HEAD"}, True),
        ("Bash(git diff:*)", "Bash", {"command": "git diff"}, True),
        ("Bash(git diff:*)", "Bash", {"command": "git diffx"}, False),
        ("Bash(git diff:*)", "Bash", {"command": "git diff && rm -rf /"}, False),
        ("Bash(npm run test)", "Bash", {"command": "npm run test"}, True),
        ("Bash", "Bash", {"command": "anything"}, True),
        ("Read(./src/**)", "Read", {"file_path": "/p/src/a/b.py"}, True),
        ("Read(./src/**)", "Read", {"file_path": "/p/docs/a.md"}, False),
        ("Read(./src/**)", "Grep", {"pattern": "x", "path": "/p/src"}, True),
        ("Read(**/.env*)", "Read", {"file_path": "/p/deep/.env.local"}, True),
        ("Read(**/.env*)", "Read", {"file_path": "/p/environment.py"}, False),
        ("Edit(**/*.test.*)", "Write", {"file_path": "/p/src/x.test.ts"}, True),
        ("Edit(**/*.test.*)", "Edit", {"file_path": "/p/src/x.ts"}, False),
        ("Read(//etc/**)", "Read", {"file_path": "/etc/passwd"}, True),
        ("Read(~/secrets/**)", "Read", {"file_path": "/home/u/secrets/k"}, True),
        ("WebFetch(domain:example.com)", "WebFetch", {"url": "https://docs.example.com/x"}, True),
        ("WebFetch(domain:example.com)", "WebFetch", {"url": "https://example.org/x"}, False),
        ("mcp__docs", "mcp__docs__search", {}, True),
        ("mcp__docs", "mcp__other__search", {}, False),
    ],
)
def test_rule_matching(rule: str, tool: str, tool_input: dict[str, object], expected: bool) -> None:
    parsed = spawn.parse_rule(rule)
    assert spawn.rule_matches(parsed, tool, tool_input, "/p", "/home/u", all_parts=True) is expected


def test_decide_precedence_deny_then_ask_then_allow() -> None:
    rules = spawn.RuleSet(
        allow=[spawn.parse_rule("Bash(git:*)")],
        deny=[spawn.parse_rule("Bash(git push:*)")],
        ask=[spawn.parse_rule("Bash(git commit:*)")],
    )

    def verdict(command: str) -> str:
        return spawn.decide("Bash", {"command": command}, rules, ["Bash", "Read"], cwd="/p", home="/h")[0]

    assert verdict("git push origin") == "deny"
    assert verdict("git commit -m x") == "ask"
    assert verdict("git status") == "allow"
    assert verdict("ls") == "deny"  # Bash has allow rules: only matching calls pass
    assert spawn.decide("Read", {"file_path": "/p/a"}, rules, ["Bash", "Read"], cwd="/p", home="/h")[0] == "allow"
    assert spawn.decide("Write", {"file_path": "/p/a"}, rules, ["Bash", "Read"], cwd="/p", home="/h")[0] == "deny"
    assert spawn.decide("StructuredOutput", {}, rules, [], cwd="/p", home="/h")[0] == "allow"


@pytest.mark.parametrize("bad", ["", "Bash(", "Teleport(x)", "not a rule"])
def test_bad_rules_are_usage_errors(bad: str) -> None:
    with pytest.raises(spawn.UsageError):
        spawn.parse_rule(bad)


def test_narrow_mode() -> None:
    assert spawn.narrow_mode(None, None, is_root=True) == ("dontAsk", None)
    assert spawn.narrow_mode("bypassPermissions", None, is_root=True) == ("bypassPermissions", None)
    assert spawn.narrow_mode("acceptEdits", "dontAsk", is_root=False)[0] == "dontAsk"
    assert spawn.narrow_mode("plan", "default", is_root=False) == ("plan", None)
    assert spawn.narrow_mode(None, "plan", is_root=False) == ("plan", None)


def test_frontmatter_parsing_reports_problems_with_lines() -> None:
    text = (
        "---\nname: a\ndescription: d\ntools: Read, Nope\nmodel: inherit\nmax_depth: two\n"
        "permissions:\n  deny: ['Bash(rm:*)', 'Bad(']\n---\nbody\n"
    )
    d, problems = spawn.parse_definition(text, "a.md", "project")
    assert d is not None
    assert d.tools == ["Read", "Nope"]  # kept with a warning: the CLI that runs may know it
    assert d.model == "inherit"
    assert d.prompt == "body"
    assert [r.text for r in d.permissions.deny] == ["Bash(rm:*)"]
    assert [(p.line, p.severity, p.message.split(" ")[0]) for p in problems] == [
        (4, "warning", "unknown"),
        (6, "error", "max_depth"),
        (8, "error", "bad"),
    ]
    assert spawn.parse_definition("no frontmatter", "b.md", "user")[1][0].line == 1


ROUTING_TABLE = [
    ("Find where the retry logic lives and explain how it works", "explore"),
    ("Review this pull request diff for security problems", "code-reviewer"),
    ("Diagnose the crash: stack trace shows a KeyError in the parser", "debugger"),
    ("Write unit tests for the tokenizer and run the test suite", "test-engineer"),
    ("Implement a --verbose flag and refactor the option parsing", "build"),
    ("Design the module boundaries and interfaces for a plugin system", "architect"),
    ("Update the README and the usage examples for the new flag", "documentation-writer"),
    ("Draft a step-by-step plan to migrate the database, with risks", "plan"),
    ("What is the weather like today", None),
]


@pytest.mark.parametrize(("task", "expected"), ROUTING_TABLE)
def test_routing_table(task: str, expected: str | None) -> None:
    definitions, problems = spawn.load_definitions(ROOT, {"HOME": "/nonexistent"})
    assert problems == []
    decision = spawn.route(task, definitions)
    assert decision["chosen"] == expected, decision["candidates"]


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
