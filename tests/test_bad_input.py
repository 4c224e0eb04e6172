"""Bad input: a one-line `spawn: error:` message, a documented exit code, nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest
from conftest import (
    FAKE_API_KEY,
    READ_ID,
    ROOT,
    SPAWN,
    MockModel,
    mock_task,
    patch_name,
    run_spawn,
    spawn_in_bash,
    stdout_json,
)
from conftest import (
    write_agent as write_definition,
)

import spawn

OK_ENV = {"ANTHROPIC_API_KEY": FAKE_API_KEY, "ANTHROPIC_BASE_URL": "http://127.0.0.1:9"}


def assert_clean_error(proc: subprocess.CompletedProcess[str], code: int, session_root: Path, fragment: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("spawn: error: "), lines[0]
    assert fragment in lines[0]
    assert proc.stdout == ""
    assert not session_root.exists() or not any(session_root.rglob("*")), list(session_root.rglob("*"))


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--task", ""], "task is empty"),
        (["--task", "   \n"], "task is empty"),
        ([], "task is empty"),
        (["--task-file", "/nonexistent/task.txt"], "can't read --task-file"),
        (["--task", "x", "--task-file", "/etc/hostname"], "not both"),
        (["--task", "x", "--tools", "Read,Teleport"], "unknown tool Teleport"),
        (["--task", "x", "--disallowed-tools", "Nope"], "unknown tool Nope"),
        (["--task", "x", "--schema", "{not json"], "not valid JSON"),
        (["--task", "x", "--schema", '{"type": 12}'], "not a valid JSON Schema"),
        (["--task", "x", "--schema", "[1, 2]"], "is not a JSON object"),
        (["--task", "x", "--schema", "no-such-schema"], "unknown schema 'no-such-schema'"),
        (["--task", "x", "--schema", "/nonexistent/schema.json"], "can't read schema"),
        (["--task", "x", "--timeout", "soon"], "invalid float value"),
        (["--task", "x", "--timeout", "-5"], "--timeout must be >= 0"),
        (["--task", "x", "--max-depth", "deep"], "invalid int value"),
        (["--task", "x", "--max-depth", "-1"], "--max-depth must be >= 0"),
        (["--task", "x", "--max-turns", "many"], "invalid int value"),
        (["--task", "x", "--max-budget-usd", "lots"], "invalid float value"),
        (["--task", "x", "--max-budget-usd", "0"], "--max-budget-usd must be > 0"),
        (["--task", "x", "--model", ""], "--model is empty"),
        (["--task", "x", "--cwd", "/nonexistent/dir"], "is not a directory"),
        (["--task", "x", "--no-such-flag"], "unrecognized arguments"),
    ],
)
def test_bad_run_input_exits_2(base_env: dict[str, str], session_root: Path, args: list[str], fragment: str) -> None:
    proc = run_spawn(args, {**base_env, **OK_ENV})
    assert_clean_error(proc, spawn.ExitCode.USAGE, session_root, fragment)


def test_unwritable_session_root_exits_3(base_env: dict[str, str], tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    root = blocker / "sessions"
    proc = run_spawn(["--task", "x", "--session", str(root)], {**base_env, **OK_ENV})
    assert_clean_error(proc, spawn.ExitCode.STATE, root, "can't create session root")
    proc = run_spawn(["--task", "x"], {**base_env, **OK_ENV, "SPAWN_SESSION_ROOT": str(root)})
    assert_clean_error(proc, spawn.ExitCode.STATE, root, "pass --session DIR")


def test_missing_credentials_exit_2_and_say_how(base_env: dict[str, str], session_root: Path) -> None:
    proc = run_spawn(["--task", "x"], base_env)
    assert_clean_error(proc, spawn.ExitCode.USAGE, session_root, "set ANTHROPIC_API_KEY")
    assert "ANTHROPIC_BASE_URL" in proc.stderr


def test_missing_cli_exits_2(base_env: dict[str, str], session_root: Path) -> None:
    proc = run_spawn(["--task", "x"], {**base_env, **OK_ENV, "SPAWN_CLI": "/nonexistent/claude"})
    assert_clean_error(proc, spawn.ExitCode.USAGE, session_root, "claude CLI not found")


def test_malformed_model_tiers_exit_2(base_env: dict[str, str], session_root: Path) -> None:
    proc = run_spawn(["--task", "x"], {**base_env, **OK_ENV, "SPAWN_MODEL_TIERS": "high-tier"})
    assert_clean_error(proc, spawn.ExitCode.USAGE, session_root, "SPAWN_MODEL_TIERS")


@pytest.mark.parametrize("verb", [["wait", "a1-000000"], ["kill", "a1-000000"], ["status", "a1-000000"]])
def test_verbs_on_unknown_agent_exit_2(base_env: dict[str, str], session_root: Path, verb: list[str]) -> None:
    proc = run_spawn(verb, base_env)
    assert_clean_error(proc, spawn.ExitCode.USAGE, session_root, "no agent 'a1-000000'")


def test_status_without_sessions_exits_2(base_env: dict[str, str], session_root: Path) -> None:
    proc = run_spawn(["status"], base_env)
    assert_clean_error(proc, spawn.ExitCode.USAGE, session_root, "no session found")


def test_corrupt_record_exits_3(base_env: dict[str, str], session_root: Path) -> None:
    agent = session_root / "20260101-0000-x" / "agents" / "a0-abcdef"
    agent.mkdir(parents=True)
    (agent / "meta.json").write_text("{ torn")
    proc = run_spawn(["wait", "a0-abcdef"], base_env)
    assert proc.returncode == spawn.ExitCode.STATE
    assert proc.stderr.startswith("spawn: error: corrupt record")


def test_dry_run_resolves_everything_and_writes_nothing(base_env: dict[str, str], session_root: Path) -> None:
    proc = run_spawn(["--task", "plan it", "--model", "high-tier", "--schema", "plan", "--tools", "Read,Bash", "--dry-run"], base_env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    resolved = json.loads(proc.stdout)
    assert resolved["model"] == "opus"
    assert resolved["tools"] == ["Read", "Bash"]
    assert resolved["schema"]["title"] == "An implementation plan"
    assert resolved["max_depth"] == 3
    assert "spawn.py" in resolved["briefing"]
    assert not session_root.exists()
    tiers = run_spawn(["--task", "x", "--model", "low-tier", "--dry-run"], {**base_env, "SPAWN_MODEL_TIERS": "low-tier=claude-haiku-9"})
    assert json.loads(tiers.stdout)["model"] == "claude-haiku-9"


# ---- numbers: one check for flags, definitions and the environment ----


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--timeout", "nan"], "--timeout must be a finite number"),
        (["--timeout", "inf"], "--timeout must be a finite number"),
        (["--timeout", "1e99"], "--timeout must be at most"),
        (["--max-budget-usd", "nan"], "--max-budget-usd must be a finite number"),
        (["--max-budget-usd", "1e300"], "--max-budget-usd must be at most"),
        (["--max-depth", "99999999"], "--max-depth must be at most"),
        (["--parent-trace", "garbage"], "--parent-trace 'garbage' is not a W3C traceparent"),
    ],
)
def test_bad_numbers_and_traces_exit_2_even_in_a_dry_run(
    base_env: dict[str, str], session_root: Path, args: list[str], fragment: str
) -> None:
    for dry in ([], ["--dry-run"]):
        proc = run_spawn(["--task", "x", *args, *dry], {**base_env, **OK_ENV})
        assert_clean_error(proc, spawn.ExitCode.USAGE, session_root, fragment)


def test_nan_deadline_in_the_environment_warns_and_never_widens(base_env: dict[str, str]) -> None:
    env = {**base_env, **OK_ENV, "SPAWN_DEADLINE": "nan", "SPAWN_MAX_BUDGET_USD": "inf", "SPAWN_HEARTBEAT_S": "-1"}
    proc = run_spawn(["--task", "x", "--timeout", "30", "--dry-run"], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    resolved = json.loads(proc.stdout)
    assert isinstance(resolved["deadline"], float) and resolved["deadline"] <= time.time() + 31
    assert resolved.get("max_budget_usd") is None
    warnings = resolved["warnings"]
    assert any("SPAWN_DEADLINE must be a finite number" in w for w in warnings), warnings
    assert any("SPAWN_MAX_BUDGET_USD must be a finite number" in w for w in warnings), warnings
    assert any("SPAWN_HEARTBEAT_S must be > 0" in w for w in warnings), warnings


def test_env_numbers_are_ignored_when_malformed() -> None:
    assert spawn.child_deadline(30.0, spawn.float_or_none("nan"), 1000.0) == 1030.0
    inh = spawn.inherited_context({"SPAWN_DEADLINE": "nan", "SPAWN_MAX_BUDGET_USD": "nan"}, {"deadline": 2000.0})
    assert inh.deadline == 2000.0
    assert inh.budget is None


def test_definition_with_nan_budget_is_refused(base_env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    agents = tmp_path / "proj" / ".claude" / "agents"
    agents.mkdir(parents=True)
    (agents / "spender.md").write_text("---\nname: spender\ndescription: spends\nmax_budget_usd: .nan\n---\nSpend.\n")
    proc = run_spawn(["--task", "x", "--agent", "spender"], {**base_env, **OK_ENV}, cwd=tmp_path / "proj")
    assert_clean_error(proc, spawn.ExitCode.USAGE, session_root, "max_budget_usd must be a finite number")
    lint = run_spawn(["agents", "lint"], base_env, cwd=tmp_path / "proj")
    assert lint.returncode == spawn.ExitCode.USAGE
    assert "max_budget_usd must be a finite number" in lint.stdout


# ---- other input that crashed ----


def test_invalid_utf8_task_on_argv_exits_2_and_writes_nothing(base_env: dict[str, str], session_root: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(SPAWN), "--task", b"caf\xe9 task".decode("utf-8", "surrogateescape")],
        env={**base_env, **OK_ENV},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert_clean_error(proc, spawn.ExitCode.USAGE, session_root, "not valid UTF-8")


def test_session_symlink_loop_is_one_line(base_env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    proc = run_spawn(["--task", "x", "--session", str(loop / "sessions")], {**base_env, **OK_ENV})
    assert proc.returncode in (spawn.ExitCode.USAGE, spawn.ExitCode.STATE), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("spawn: error: "), proc.stderr


@pytest.mark.parametrize("kind", ["directory", "unwritable", "under-a-file"])
def test_bad_output_path_exits_2_before_the_model_is_called(
    env: dict[str, str], session_root: Path, mock_model: MockModel, tmp_path: Path, kind: str
) -> None:
    target = {"directory": tmp_path, "unwritable": tmp_path / "ro" / "out.json", "under-a-file": tmp_path / "a-file" / "out.json"}[kind]
    (tmp_path / "a-file").write_text("not a directory")
    if kind == "unwritable":
        target.parent.mkdir()
        target.parent.chmod(0o500)
    if os.geteuid() == 0 and kind == "unwritable":
        pytest.skip("root can write anywhere")
    proc = run_spawn(["--task", mock_task("x", [{"text": "hi"}]), "--output", str(target)], env)
    assert_clean_error(proc, spawn.ExitCode.USAGE, session_root, "--output")
    assert mock_model.requests() == []


def test_unexpected_exception_is_exit_3_naming_traceback(base_env: dict[str, str], session_root: Path) -> None:
    code = "import spawn, sys\ndef boom(*a, **k):\n    raise KeyError('surprise')\n"
    code += "spawn.cmd_status = boom\nsys.exit(spawn.main(sys.argv[1:]))\n"
    proc = subprocess.run(
        [sys.executable, "-c", code, "status"], env=base_env, capture_output=True, text=True, timeout=60, cwd=ROOT, check=False
    )
    assert proc.returncode == spawn.ExitCode.STATE, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("spawn: error: internal error KeyError") and "--traceback" in lines[0], lines


# ---- one corrupt record does not hide a session ----


def make_session(session_root: Path) -> Path:
    session = session_root / "20260101-0000-x"
    (session / "agents").mkdir(parents=True)
    return session


def write_agent(session: Path, agent_id: str, parent: str | None, *, pid: int = 999_999_999, **extra: object) -> Path:
    d = session / "agents" / agent_id
    d.mkdir()
    meta = {
        "id": agent_id, "parent_id": parent, "depth": int(agent_id[1]), "max_depth": 3, "pid": pid, "create_time": 1.0, "pgid": pid,
        "trace_id": "1" * 32, "span_id": "2" * 16, "traceparent": f"00-{'1' * 32}-{'2' * 16}-01", "task": "t", "tools": ["Read"],
        "model": "sonnet", "cwd": "/", "started_at": "2026-01-01T00:00:00.000Z", "session": str(session), "system_prompt": "",
        "topic": "x", "background": False, **extra,
    }  # fmt: skip
    (d / "meta.json").write_text(json.dumps(meta))
    return d


def test_corrupt_started_at_is_listed_not_fatal(base_env: dict[str, str], session_root: Path) -> None:
    session = make_session(session_root)
    write_agent(session, "a0-aaaaaa", None, started_at="yesterday-ish")
    proc = run_spawn(["status", "--json", str(session)], base_env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    rows = json.loads(proc.stdout)["agents"]
    assert [(r["id"], r["state"]) for r in rows] == [("a0-aaaaaa", spawn.Status.CORRUPT)]
    assert "meta.json" in rows[0]["error"]


@pytest.mark.parametrize(("field", "value"), [("task", 5), ("depth", "1"), ("depth", True), ("tools", "Read"), ("pid", None)])
def test_a_meta_with_a_wrong_type_is_listed_corrupt_and_hides_nothing(
    base_env: dict[str, str], session_root: Path, field: str, value: object
) -> None:
    session = make_session(session_root)
    write_agent(session, "a0-000000", None)
    write_agent(session, "a1-111111", "a0-000000")
    path = session / "agents" / "a1-111111" / "meta.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), field: value}))
    proc = run_spawn(["status", "--json", str(session)], base_env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    rows = {r["id"]: r for r in json.loads(proc.stdout)["agents"]}
    assert {i: r["state"] for i, r in rows.items()} == {"a0-000000": "lost", "a1-111111": "corrupt"}
    assert field in rows["a1-111111"]["error"]
    reap = run_spawn(["reap", str(session)], base_env)
    assert reap.returncode == spawn.ExitCode.OK, reap.stderr
    assert [c["id"] for c in json.loads(reap.stdout)["corrupt"]] == ["a1-111111"]


@pytest.mark.parametrize("cost", ["lots", [1], {"usd": 1}])
def test_an_outcome_with_a_cost_that_is_no_number_is_listed_corrupt_and_hides_nothing(
    base_env: dict[str, str], session_root: Path, cost: object
) -> None:
    session = make_session(session_root)
    write_agent(session, "a0-000000", None)
    child = write_agent(session, "a1-111111", "a0-000000")
    outcome = {"id": "a1-111111", "status": "done", "reason": "", "exit_code": 0, "ended_at": "t", "duration_s": 1.0, "cost_usd": cost}
    (child / "outcome.json").write_text(json.dumps(outcome))
    proc = run_spawn(["status", "--json", str(session)], base_env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    rows = {r["id"]: r for r in json.loads(proc.stdout)["agents"]}
    assert {i: r["state"] for i, r in rows.items()} == {"a0-000000": "lost", "a1-111111": "corrupt"}
    assert "cost_usd" in rows["a1-111111"]["error"]
    assert run_spawn(["status", str(session)], base_env).returncode == spawn.ExitCode.OK


def test_truncated_sibling_does_not_hide_the_session(base_env: dict[str, str], session_root: Path) -> None:
    session = make_session(session_root)
    write_agent(session, "a0-000000", None)
    (session / "agents" / "a1-111111").mkdir()
    (session / "agents" / "a1-111111" / "meta.json").write_text('{"id": "a1-1')
    write_agent(session, "a1-222222", "a0-999999")  # sorted after the corrupt one; its parent is elsewhere
    proc = run_spawn(["status", "--json", str(session)], base_env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    states = {r["id"]: r["state"] for r in json.loads(proc.stdout)["agents"]}
    assert states == {"a0-000000": "lost", "a1-111111": "corrupt", "a1-222222": "lost"}
    reap = run_spawn(["reap", str(session)], base_env)
    assert reap.returncode == spawn.ExitCode.OK, reap.stderr
    reaped = json.loads(reap.stdout)
    assert sorted(reaped["reaped"]) == ["a0-000000", "a1-222222"]  # went on past the corrupt one
    assert [c["id"] for c in reaped["corrupt"]] == ["a1-111111"]
    waited = run_spawn(["wait", "--session", str(session), "a1-222222"], base_env)
    assert waited.returncode == spawn.ExitCode.AGENT_FAILED, waited.stderr
    killed = run_spawn(["kill", "--session", str(session), "a0-000000"], base_env)
    assert killed.returncode == spawn.ExitCode.OK, killed.stderr


def test_later_spawn_in_a_session_with_a_corrupt_sibling_runs(env: dict[str, str], session_root: Path) -> None:
    session = make_session(session_root)
    (session / "agents" / "a1-111111").mkdir()
    (session / "agents" / "a1-111111" / "meta.json").write_text("{ torn")
    write_agent(session, "a0-000000", None, pid=os.getpid(), create_time=spawn.own_identity()[1])
    child_env = {**env, "SPAWN_SESSION": str(session), "SPAWN_DEPTH": "0", "SPAWN_AGENT_ID": "a0-000000", "SPAWN_TOOLS": "Read"}
    proc = run_spawn(["--task", mock_task("x", [{"text": "fine"}])], child_env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert json.loads(proc.stdout)["output"] == "fine"


def test_stray_done_marker_is_tolerated_and_repaired(base_env: dict[str, str], session_root: Path) -> None:
    session = make_session(session_root)
    d = write_agent(session, "a0-000000", None)
    (d / ".done").write_text("done\n")
    status = run_spawn(["status", "--json", str(session)], base_env)
    assert status.returncode == spawn.ExitCode.OK, status.stderr
    assert json.loads(status.stdout)["agents"][0]["state"] == "lost"
    reap = run_spawn(["reap", str(session)], base_env)
    assert json.loads(reap.stdout)["reaped"] == ["a0-000000"], reap.stderr
    assert json.loads((d / "outcome.json").read_text())["status"] == "failed"
    assert (d / ".fail").exists() and not (d / ".done").exists()


# ---- refusals and credentials ----


def test_dry_run_of_a_refused_spawn_exits_4(base_env: dict[str, str], session_root: Path) -> None:
    env = {**base_env, "SPAWN_DEPTH": "3", "SPAWN_MAX_DEPTH": "3", "SPAWN_AGENT_ID": "a3-000000"}
    proc = run_spawn(["--task", "x", "--dry-run"], env)
    assert proc.returncode == spawn.ExitCode.REFUSED, proc.stderr
    assert json.loads(proc.stdout)["refusal"].startswith("depth limit")
    assert "refused: depth limit" in proc.stderr
    assert not session_root.exists()


def test_base_url_alone_is_not_credentials(base_env: dict[str, str], session_root: Path) -> None:
    proc = run_spawn(["--task", "x"], {**base_env, "ANTHROPIC_BASE_URL": "http://127.0.0.1:9"})
    assert_clean_error(proc, spawn.ExitCode.USAGE, session_root, "no credentials")


# ---- traces ----


def test_trace_keeps_the_sampled_flag_and_warns_on_a_bad_env(base_env: dict[str, str]) -> None:
    unsampled = "00-" + "a" * 32 + "-" + "b" * 16 + "-00"
    proc = run_spawn(["--task", "x", "--dry-run", "--parent-trace", unsampled], {**base_env, **OK_ENV})
    resolved = json.loads(proc.stdout)
    assert resolved["traceparent"].endswith("-00") and resolved["trace_id"] == "a" * 32
    proc = run_spawn(["--task", "x", "--dry-run"], {**base_env, **OK_ENV, "TRACEPARENT": "not-a-trace"})
    assert proc.returncode == spawn.ExitCode.OK
    assert any("TRACEPARENT 'not-a-trace' is not a W3C traceparent" in w for w in json.loads(proc.stdout)["warnings"])


def test_briefing_example_uses_the_agents_own_tools(base_env: dict[str, str]) -> None:
    proc = run_spawn(["--task", "x", "--dry-run", "--tools", "Bash,Edit"], {**base_env, **OK_ENV})
    text = json.loads(proc.stdout)["briefing"]
    assert "--tools Bash,Edit" in text and "--tools Read,Grep" not in text


# ---- closed stdout ----


def test_closed_stdout_ends_a_verb_quietly(base_env: dict[str, str], session_root: Path) -> None:
    session = make_session(session_root)
    write_agent(session, "a0-000000", None)
    proc = subprocess.Popen(
        [sys.executable, str(SPAWN), "status", "--json", str(session)],
        env=base_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    proc.stdout.close()  # the reader is gone before spawn.py writes a byte (`| head -c0`)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == spawn.ExitCode.OK
    assert err == ""


def test_every_state_is_in_status_and_in_the_status_schema(base_env: dict[str, str], session_root: Path) -> None:
    schema = json.loads((ROOT / "schemas" / "status.json").read_text())
    states = schema["properties"]["agents"]["items"]["properties"]["state"]["enum"]
    assert sorted(states) == sorted(s.value for s in spawn.Status)
    session = make_session(session_root)
    write_agent(session, "a0-000000", None)
    (session / "agents" / "a0-111111").mkdir()
    (session / "agents" / "a0-111111" / "meta.json").write_text("[")
    proc = run_spawn(["status", "--json", str(session)], base_env)
    jsonschema.Draft202012Validator(schema).validate(json.loads(proc.stdout))


def test_unknown_schema_name_offers_only_output_schemas(base_env: dict[str, str]) -> None:
    proc = run_spawn(["--task", "x", "--schema", "nope", "--dry-run"], base_env)
    assert proc.returncode == spawn.ExitCode.USAGE
    offered = proc.stderr.split("use one of ", 1)[1].split(", a path")[0].split(", ")
    assert "findings" in offered
    assert not set(offered) & {"meta", "outcome", "ledger-line", "heartbeat", "session", "limits", "kill"}


@pytest.mark.parametrize(
    ("server", "fragment"),
    [
        ("{type: http}", "a http server needs a url"),
        ("{type: sse}", "a sse server needs a url"),
        ("{type: websocket, url: 'ws://x'}", "unknown type 'websocket'"),
    ],
)
def test_lint_rejects_malformed_mcp_servers(server: str, fragment: str) -> None:
    text = f"---\nname: m\ndescription: d\nmcpServers:\n  docs: {server}\n---\nBody.\n"
    _, problems = spawn.parse_definition(text, "m.md", "project")
    assert any(fragment in p.message for p in problems), problems


def test_an_mcp_server_that_fails_to_start_is_reported(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / ".claude" / "agents").mkdir(parents=True)
    (project / ".claude" / "agents" / "broken.md").write_text(
        "---\nname: broken\ndescription: Has a broken MCP server.\ntools: Read\n"
        "mcpServers:\n  ghost:\n    command: /nonexistent/mcp-server\n---\nYou are a test agent.\n"
    )
    proc = run_spawn(["--agent", "broken", "--task", mock_task("x", [{"text": "fine"}]), "--cwd", str(project)], env, timeout=180)
    assert "MCP server ghost (failed) did not start" in proc.stderr, proc.stderr
    (agent_dir,) = sorted(session_root.glob("*/agents/*"))
    outcome = json.loads((agent_dir / "outcome.json").read_text())
    assert "MCP server ghost (failed) did not start" in outcome["warnings"]


def test_a_fifo_planted_as_the_ledger_hangs_no_one_and_loses_no_outcome(env: dict[str, str], session_root: Path) -> None:
    # An agent's Bash can replace the session's ledger with a FIFO. Every commit
    # appends to the ledger, under the session lock, and every spawn reads it:
    # opening a FIFO that nothing reads used to block them all, for good.
    plant = 'rm -f "$SPAWN_SESSION/ledger.jsonl" && mkfifo "$SPAWN_SESSION/ledger.jsonl" && echo planted'
    proc = run_spawn(["--task", mock_task("x", [{"bash": plant}, {"text": "finished"}]), "--tools", "Bash"], env, timeout=120)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    result = json.loads(proc.stdout)
    assert (result["status"], result["output"]) == ("done", "finished")
    assert "ledger.jsonl: not a regular file" in proc.stderr  # a warning: the charge is not in the ledger
    (agent,) = session_root.glob("*/agents/*")
    assert json.loads((agent / "outcome.json").read_text())["status"] == "done"
    assert (agent / ".done").exists()
    status = run_spawn(["status", str(agent.parent.parent)], env, timeout=60)
    assert status.returncode == spawn.ExitCode.STATE
    assert status.stderr.startswith("spawn: error: corrupt record") and "ledger.jsonl: not a regular file" in status.stderr


def test_descendants_are_read_only_below_the_agents_depth(session_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every agent looks for its descendants as it ends; in a fan-out that read
    # every record of the session once per leaf. Ids carry their depth.
    session = make_session(session_root)
    write_agent(session, "a0-000000", None)
    write_agent(session, "a1-111111", "a0-000000")
    write_agent(session, "a1-222222", "a0-000000")
    write_agent(session, "a2-333333", "a1-111111")
    write_agent(session, "a2-555555", "a1-222222")
    write_agent(session, "a3-444444", "a2-333333")
    write_agent(session, "x9-handmade", "a2-333333", depth=3)  # not an id spawn.py makes: read for what it claims
    read: list[str] = []
    load_meta = spawn.load_meta

    def counting(agent_dir: Path) -> spawn.AgentMeta:
        read.append(agent_dir.name)
        return load_meta(agent_dir)

    patch_name(monkeypatch, "load_meta", counting)
    assert [d.name for d in spawn.descendants_of(session, "a1-111111")] == ["a3-444444", "x9-handmade", "a2-333333"]
    assert read == ["a2-333333", "a2-555555", "a3-444444", "x9-handmade"]
    read.clear()
    assert spawn.descendants_of(session, "a3-444444") == []
    assert read == ["x9-handmade"]
    assert len(spawn.descendants_of(session, "a0-000000")) == 6


def test_a_fifo_planted_in_the_runner_index_hangs_no_spawn(env: dict[str, str], session_root: Path) -> None:
    # Every spawn reads the per-user runner index to find its parent agent, and
    # agents may write there (they register in it). A FIFO there hung them all.
    planted = spawn.runner_index_dir() / f"planted-{os.getpid()}.json"
    os.mkfifo(planted)
    try:
        child = spawn_in_bash("--task", mock_task("child", [{"text": "child-done"}]), "--tools", "Read")
        proc = run_spawn(["--task", mock_task("root", [{"bash": child}, {"text": "root-done"}]), "--tools", "Bash,Read"], env, timeout=120)
    finally:
        planted.unlink()
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert json.loads(proc.stdout)["output"] == "root-done"
    assert sorted(json.loads(d.read_text())["status"] for d in session_root.glob("*/agents/*/outcome.json")) == ["done", "done"]


# ---- a record nested too deep is corrupt, never fatal (issue 31, item 2) ----


def test_a_deep_sibling_meta_written_mid_run_leaves_every_outcome_and_verb_working(
    env: dict[str, str], session_root: Path, tmp_path: Path
) -> None:
    # The attack as found: an agent's Bash writes '[' * 200000 + ']' * 200000 as a
    # sibling's meta.json while its background child runs, then waits for that child.
    deep = (
        "import os,pathlib; d=pathlib.Path(os.environ['SPAWN_SESSION'],'agents','a1-x'); d.mkdir(); "
        "(d/'meta.json').write_text('['*200000+']'*200000)"
    )
    child = mock_task("child", [{"sleep": 2, "text": "child done"}])
    script = f'{spawn_in_bash("--background", "--task", child)} | {READ_ID} > kid; "$SPAWN_PYTHON" -c "{deep}"'
    root = mock_task("root", [{"bash": script}, {"bash": f"{spawn_in_bash('wait')} $(cat kid)"}, {"text": "root done"}])
    proc = run_spawn(["--task", root, "--tools", "Bash"], env, cwd=tmp_path)  # its Bash writes ./kid
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert stdout_json(proc)["output"] == "root done"
    session = next(session_root.iterdir())
    ids = sorted(d.name for d in session.glob("agents/a*") if d.name != "a1-x")
    assert len(ids) == 2, ids  # the root and its background child
    waited = run_spawn(["wait", "--session", str(session), *ids, "--all"], env)
    assert waited.returncode == spawn.ExitCode.OK, waited.stderr
    status = run_spawn(["status", "--json", str(session)], env)
    assert status.returncode == spawn.ExitCode.OK, status.stderr
    rows = {r["id"]: r for r in json.loads(status.stdout)["agents"]}
    assert rows.pop("a1-x")["state"] == spawn.Status.CORRUPT
    assert sorted(r["state"] for r in rows.values()) == ["done", "done"], rows
    for agent_id in ids:
        assert json.loads((session / "agents" / agent_id / "outcome.json").read_text())["status"] == "done"
    reap = run_spawn(["reap", str(session)], env)
    assert reap.returncode == spawn.ExitCode.OK, reap.stderr
    assert [c["id"] for c in json.loads(reap.stdout)["corrupt"]] == ["a1-x"]


def test_parse_json_bounds_depth_and_size_unit() -> None:
    # Unit test of the one bounded JSON parser every record reader uses.
    deep = "[" * 200_000 + "]" * 200_000
    with pytest.raises(ValueError, match="nested deeper than 64"):
        spawn.parse_json(deep)
    with pytest.raises(ValueError, match="nested deeper than 64") as exc:
        spawn.parse_json('{"a": "[[[[",\n "b": ' + "[" * 65 + "]" * 65 + "}")
    assert isinstance(exc.value, json.JSONDecodeError) and exc.value.lineno == 2
    assert spawn.parse_json("[" * 64 + "]" * 64) is not None  # the limit itself is fine
    assert spawn.parse_json('{"s": "' + "[{" * 1000 + '"}') == {"s": "[{" * 1000}  # brackets in strings don't nest
    assert spawn.parse_json(b'{"s": "\\"[[["}') == {"s": '"[[['}
    with pytest.raises(ValueError, match="larger than 10 bytes"):
        spawn.parse_json('{"a": "01234567"}', max_bytes=10)
    with pytest.raises(UnicodeDecodeError):
        spawn.parse_json(b"\xff\xfe")


def test_read_json_of_a_deep_or_oversize_record_is_corrupt_unit(tmp_path: Path) -> None:
    record = tmp_path / "meta.json"
    record.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(spawn.CorruptRecordError, match="nested deeper than 64"):
        spawn.read_json(record)
    with record.open("w") as fh:
        fh.truncate(spawn.RECORD_MAX_BYTES + 1)  # sparse: refused from its size, never read
    with pytest.raises(spawn.CorruptRecordError, match="larger than"):
        spawn.read_json(record)


# ---- user YAML and JSON: bounded in size, depth and alias expansion (issue 31, item 9) ----

BILLION_LAUGHS = (
    "vars:\n  a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
    + "".join(f"  {chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8))
    + "tasks:\n  - id: t\n    task: x\n"
)


def run_guarded(args: list[str], env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """spawn.py with 1 GiB of address space at most and 60 s: a blow-up fails the test, not the machine."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    return subprocess.run(
        [sys.executable, str(SPAWN), *args], env=env, capture_output=True, text=True, timeout=60, preexec_fn=limit, check=False, cwd=cwd
    )


@pytest.mark.parametrize(
    ("name", "content", "fragment"),
    [
        ("laughs.yaml", BILLION_LAUGHS, "laughs.yaml:8: not valid YAML: its aliases expand it past 1000000 nodes"),
        ("deep.yaml", "tasks: " + "[" * 100_000 + "]" * 100_000 + "\n", "deep.yaml:1: not valid YAML: nested deeper than 64 levels"),
        ("deep.json", '{"tasks":\n' + "[" * 200_000 + "]" * 200_000 + "}", "deep.json:2: not valid JSON: nested deeper than 64 levels"),
        ("loop.yaml", "vars: &v\n  a: *v\ntasks: []\n", "loop.yaml:2: not valid YAML: alias *v is inside the node it names"),
    ],
)
def test_a_dag_file_that_would_blow_up_is_exit_2_fast(
    base_env: dict[str, str], session_root: Path, tmp_path: Path, *, name: str, content: str, fragment: str
) -> None:
    path = tmp_path / name
    path.write_text(content)
    started = time.monotonic()
    proc = run_guarded(["dag", "validate", str(path)], base_env)
    assert time.monotonic() - started < 30
    assert_clean_error(proc, spawn.ExitCode.USAGE, session_root, fragment)


def test_an_oversize_dag_file_is_refused_unread(base_env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    with path.open("w") as fh:
        fh.truncate(2 << 30)  # sparse: only what spawn.py reads is ever made
    proc = run_guarded(["dag", "validate", str(path)], base_env)
    assert_clean_error(proc, spawn.ExitCode.USAGE, session_root, f"huge.yaml: larger than {spawn.INPUT_MAX_BYTES} bytes")


@pytest.mark.parametrize("where", ["inline", "file"])
def test_a_deep_schema_is_exit_2(base_env: dict[str, str], session_root: Path, tmp_path: Path, where: str) -> None:
    depth = 100_000 if where == "file" else 5_000  # inline: within what one argument may hold
    schema = '{"type": "object", "x": ' + "[" * depth + "]" * depth + "}"
    if where == "file":
        (tmp_path / "deep.json").write_text(schema)
        schema = str(tmp_path / "deep.json")
    proc = run_guarded(["--task", "x", "--schema", schema], {**base_env, **OK_ENV})
    assert_clean_error(proc, spawn.ExitCode.USAGE, session_root, "not valid JSON: nested deeper than 64 levels")


def test_an_agent_file_with_deep_frontmatter_is_bad_yaml_not_a_crash(base_env: dict[str, str], tmp_path: Path) -> None:
    # YAML nested past the bound is no definition to read with the 'key: value'
    # fallback: an error at its line and exit 2 (test_agents.py), never exit 3.
    project = tmp_path / "project"
    (project / ".claude" / "agents").mkdir(parents=True)
    deep = "[" * 100_000 + "]" * 100_000
    (project / ".claude" / "agents" / "deep.md").write_text(f"---\nname: deep\ndescription: d\nmodel: {deep}\n---\nbody\n")
    lint = run_guarded(["agents", "lint"], base_env, project)
    assert lint.returncode == spawn.ExitCode.USAGE, lint.stderr
    assert "deep.md:4: error: bad YAML: nested deeper than 64 levels" in lint.stdout


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["waitt", "a1-000000"], "spawn: error: unknown verb 'waitt'; did you mean 'wait'?"),
        (["statsu"], "spawn: error: unknown verb 'statsu'; did you mean 'status'?"),
        (
            ["--task", "x", "--tols", "Read"],
            "spawn: error: unrecognized arguments: --tols Read; did you mean '--tools'? see 'spawn.py --help'",
        ),
        (["status", "--jsno"], "did you mean '--json'? see 'spawn.py status --help'"),
        (["agents", "lsit"], "did you mean 'list'? see 'spawn.py agents --help'"),
        (["--task", "x", "--print", "idd"], "did you mean 'id'?"),
        (["--task", "x", "--tools", "Reed"], "spawn: error: unknown tool Reed; did you mean 'Read'? use names like"),
    ],
)
def test_a_mistyped_verb_flag_or_choice_suggests_the_close_match(
    base_env: dict[str, str], session_root: Path, args: list[str], line: str
) -> None:
    """Issue 36 item 4: Python 3.11's argparse suggests nothing; `waitt` was 'unrecognized arguments'."""
    proc = run_spawn(args, {**base_env, **OK_ENV})
    assert_clean_error(proc, spawn.ExitCode.USAGE, session_root, line)


def test_a_bare_word_that_is_no_verb_says_where_a_task_goes(base_env: dict[str, str], session_root: Path) -> None:
    proc = run_spawn(["fix the login bug"], {**base_env, **OK_ENV})
    assert_clean_error(proc, spawn.ExitCode.USAGE, session_root, "unknown verb 'fix the login bug'; verbs are wait, status")
    assert "a task goes in --task TEXT" in proc.stderr


def test_a_mistyped_agent_name_suggests_the_definition_first(base_env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    project = tmp_path / "project"
    write_definition(project, "code-reviewer", "description: Reviews code")
    proc = run_spawn(["--task", "x", "--agent", "code-reviwer"], {**base_env, **OK_ENV}, cwd=project)
    assert_clean_error(proc, spawn.ExitCode.USAGE, session_root, "no agent definition 'code-reviwer'; did you mean 'code-reviewer'?")
    assert proc.stderr.index("'code-reviewer'") < proc.stderr.index("agents new code-reviwer")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--model", "opsu"], "--model 'opsu' is no known model; did you mean 'opus'? use a tier: high-tier (opus)"),
        (["--model", "gpt-4o"], "fable, best, sonnet[1m], opus[1m], fable[1m], opusplan, or a model id like claude-sonnet-4-5"),
        (["--agent", ""], "--agent is empty; name a definition"),
        (["--agent", " "], "--agent is empty"),
    ],
)
def test_bad_model_or_agent_values_exit_2_before_any_model_call(
    env: dict[str, str], session_root: Path, mock_model: MockModel, args: list[str], fragment: str
) -> None:
    """Issue 36 item 4: `--model opsu` and `--agent ""` were accepted and ran."""
    proc = run_spawn(["--task", "x", *args], env)
    assert_clean_error(proc, spawn.ExitCode.USAGE, session_root, fragment)
    assert mock_model.requests() == []


@pytest.mark.parametrize("model", ["claude-opus-4-1", "claude-sonnet-4-5-20250929", "sonnet[1m]", "opus", "low-tier", "custom-gw"])
def test_tiers_aliases_and_well_formed_ids_are_accepted(base_env: dict[str, str], model: str) -> None:
    proc = run_spawn(["--task", "x", "--model", model, "--dry-run"], {**base_env, "SPAWN_MODEL_TIERS": "low-tier=custom-gw"})
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr


def test_a_definitions_bad_model_names_its_file(base_env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    project = tmp_path / "project"
    path = write_definition(project, "typo", "description: d\nmodel: sonet")
    proc = run_spawn(["--task", "x", "--agent", "typo"], {**base_env, **OK_ENV}, cwd=project)
    assert_clean_error(proc, spawn.ExitCode.USAGE, session_root, f"the model of {path} 'sonet' is no known model; did you mean 'sonnet'?")


def test_an_agent_file_that_is_not_yaml_names_its_line_at_run(base_env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    """Issue 36 item 4: the run said only "no agent definition 'broken'"; the file's line says why."""
    project = tmp_path / "project"
    path = project / ".claude" / "agents" / "broken.md"
    path.parent.mkdir(parents=True)
    path.write_text("---\n[name: broken\n---\nbody\n")
    proc = run_spawn(["--task", "x", "--agent", "broken"], {**base_env, **OK_ENV}, cwd=project)
    assert_clean_error(proc, spawn.ExitCode.USAGE, session_root, f"{path}:2: error: bad YAML: while parsing a flow sequence")


def test_an_agent_file_read_by_the_fallback_warns_with_its_line_at_run(base_env: dict[str, str], tmp_path: Path) -> None:
    project = tmp_path / "project"
    path = write_definition(project, "loose", "description: d\ntools: [Read")
    proc = run_spawn(["--task", "x", "--agent", "loose", "--dry-run"], {**base_env, **OK_ENV}, cwd=project)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert any(w.startswith(f"{path}:4: warning: bad YAML") for w in stdout_json(proc)["warnings"])


@pytest.mark.parametrize("verb", [["dag", "validate"], ["dag", "run"], ["estimate"]])
def test_a_dag_file_that_is_not_yaml_names_its_line(base_env: dict[str, str], session_root: Path, tmp_path: Path, verb: list[str]) -> None:
    dag = tmp_path / "graph.yaml"
    dag.write_text("tasks:\n  - id: a\n    task: x\n  - id: b\n   task: y: z\n")
    proc = run_spawn([*verb, str(dag)], {**base_env, **OK_ENV})
    assert_clean_error(proc, spawn.ExitCode.USAGE, session_root, f"spawn: error: {dag}:5: not valid YAML: ")


@pytest.mark.parametrize(("target", "fragment"), [("/nonexistent", "/nonexistent does not exist"), ("/", "/ is not a session directory")])
def test_status_of_a_path_that_is_no_session_says_so(base_env: dict[str, str], session_root: Path, target: str, fragment: str) -> None:
    """Issue 36 item 4: it said "no agent '/nonexistent' under <latest session>"."""
    proc = run_spawn(["status", target], base_env)
    assert_clean_error(proc, spawn.ExitCode.USAGE, session_root, fragment)
    assert "pass a session directory" in proc.stderr
