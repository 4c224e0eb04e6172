"""tools/mcp_server.py end to end: the mcp package's own client, the server, spawn.py, the real CLI."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    ROOT,
    MockModel,
    load,
    metas,
    mock_task,
    run_spawn,
    stdout_json,
    validate_records,
    wait_for_ask,
    wait_for_path,
    write_agent,
)

mcp = pytest.importorskip("mcp")
from mcp import Client  # noqa: E402
from mcp.client.stdio import StdioServerParameters  # noqa: E402
from mcp.types import CallToolResult, ElicitRequestParams, ElicitResult, TextContent  # noqa: E402

SERVER = ROOT / "tools" / "mcp_server.py"
TOOLS = {"spawn_agent", "agent_wait", "agent_status", "agent_cancel", "agent_answer", "agent_send", "budget", "list_agents"}


def server_params(env: dict[str, str], cwd: Path, *extra: str) -> StdioServerParameters:
    # The test interpreter has both mcp and spawn.py's dependencies.
    return StdioServerParameters(command=sys.executable, args=[str(SERVER), "--python", sys.executable, *extra], env=env, cwd=str(cwd))


def run(coro: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(coro())


def text(result: CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, TextContent))


def structured(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, text(result)
    assert isinstance(result.structured_content, dict)
    return result.structured_content


def project_with_asking_agent(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    write_agent(project, "toucher", 'description: Makes files\ntools: Bash\npermissions:\n  ask: ["Bash(touch:*)"]', "You make files.")
    return project


def test_each_tool_over_stdio(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    project = project_with_asking_agent(tmp_path)
    reported: list[tuple[float, float | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        reported.append((progress, total))

    async def body() -> None:
        async with Client(server_params(env, project)) as client:
            listed = await client.list_tools()
            assert {t.name for t in listed.tools} == TOOLS
            assert all(t.output_schema for t in listed.tools)

            agents = structured(await client.call_tool("list_agents", {}))
            assert [a["name"] for a in agents["agents"] if a["source"] != "built-in"] == ["toucher"]
            assert {a["name"] for a in agents["agents"] if a["source"] == "built-in"} >= {"build", "code-reviewer", "explore", "plan"}

            task = mock_task("say hi", [{"text": "hi from the child"}, {"text": "hi again"}])
            started = structured(await client.call_tool("spawn_agent", {"task": task, "tools": ["Read"]}))
            assert started["status"] == "running"
            assert Path(started["agent_dir"]).name == started["agent_id"]

            # No ids: every agent this connection started.
            waited = await client.call_tool("agent_wait", {"timeout_s": 50}, progress_callback=on_progress)
            data = structured(waited)
            assert data["status"] == "done", data
            assert [a["id"] for a in data["agents"]] == [started["agent_id"]]
            assert data["agents"][0]["output"] == "hi from the child"
            assert data["pending"] == []
            assert "done" in text(waited)

            status = structured(await client.call_tool("agent_status", {"agent_id": started["agent_id"]}))
            assert [a["id"] for a in status["agents"]] == [started["agent_id"]]

            # resume: a new agent that continues the conversation (the script's next step answers).
            again = structured(await client.call_tool("spawn_agent", {"task": "and again?", "resume": started["agent_id"]}))
            assert again["resumed_from"] == started["agent_id"] and again["agent_id"] != started["agent_id"]
            follow = structured(await client.call_tool("agent_wait", {"agent_ids": [again["agent_id"]], "timeout_s": 50}))
            assert follow["agents"][0]["output"] == "hi again", follow

    run(body)
    assert reported and reported[-1] == (1, 1)
    assert [load(p)["status"] for p in session_root.glob("*/agents/*/outcome.json")] == ["done", "done"]
    validate_records(session_root)


def test_bad_argument_is_a_tool_error_with_spawns_line(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    async def body() -> None:
        async with Client(server_params(env, tmp_path)) as client:
            bad = await client.call_tool("spawn_agent", {"task": "x", "cwd": str(tmp_path / "nowhere")})
            assert bad.is_error
            assert text(bad).startswith("spawn: error: --cwd")
            unknown = await client.call_tool("agent_wait", {"agent_ids": ["a0-nosuch"], "timeout_s": 1})
            assert unknown.is_error and "a0-nosuch" in text(unknown)
            # The server is still up (what it lists depends on the directories around the test).
            assert isinstance(structured(await client.call_tool("list_agents", {}))["agents"], list)

    run(body)
    assert not session_root.exists() or not list(session_root.glob("*/agents/*"))


def test_errors_name_the_tools_not_cli_commands(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    """Issue 36 item 4: errors said "run 'spawn.py status'" to a client that has agent_status instead."""
    (session_root / "s" / "agents").mkdir(parents=True)

    async def body() -> None:
        async with Client(server_params(env, tmp_path)) as client:
            result = await client.call_tool("agent_answer", {"ask_id": "q-nosuch", "decision": "allow"})
            assert result.is_error
            assert text(result) == "spawn: error: no pending ask 'q-nosuch'; run the agent_status tool to list asks", text(result)

    run(body)


def test_paths_are_refused_as_agent_ids(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    """Issue 31 item 12: agent_wait took an absolute path as an id and reported the forged outcome it found there."""
    forged = tmp_path / "elsewhere" / "a1-abcdef"
    forged.mkdir(parents=True)
    (forged / "meta.json").write_text(json.dumps({"id": "a1-abcdef"}))
    (forged / "outcome.json").write_text(json.dumps({"id": "a1-abcdef", "status": "done", "output": "forged"}))
    (forged / ".done").write_text("")
    (session_root / "s" / "agents").mkdir(parents=True)

    async def body() -> None:
        async with Client(server_params(env, tmp_path)) as client:
            for bad in (str(forged), "../../elsewhere/a1-abcdef", "a1-abcdef/..", ""):
                for tool, args in (
                    ("agent_wait", {"agent_ids": [bad], "timeout_s": 1}),
                    ("agent_status", {"agent_id": bad}),
                    ("agent_cancel", {"agent_id": bad}),
                ):
                    result = await client.call_tool(tool, args)
                    assert result.is_error, (tool, bad, text(result))
                    assert text(result).startswith("spawn: error: ") and "is not an agent id" in text(result), text(result)

    run(body)


def test_cancel_ends_the_agent(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    async def body() -> None:
        async with Client(server_params(env, tmp_path)) as client:
            task = mock_task("sleep", [{"bash": "echo busy; sleep 60"}, {"text": "never"}])
            started = structured(await client.call_tool("spawn_agent", {"task": task, "tools": ["Bash"]}))
            agent_dir = Path(started["agent_dir"])
            wait_for_path(agent_dir / "heartbeat.json")
            killed = structured(await client.call_tool("agent_cancel", {"agent_id": started["agent_id"]}))
            assert killed["killed"] == [started["agent_id"]]
            waited = structured(await client.call_tool("agent_wait", {"agent_ids": [started["agent_id"]], "timeout_s": 10}))
            assert waited["status"] == "failed"
            assert waited["agents"][0]["status"] == "killed"

    run(body)
    validate_records(session_root)


def test_ask_answered_with_agent_answer(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    project = project_with_asking_agent(tmp_path)
    target = tmp_path / "made-by-agent"
    task = mock_task("make a file", [{"bash": f"touch {target}"}, {"text": "finished"}])

    async def body() -> None:
        # This client declares no elicitation: asks show as pending.
        async with Client(server_params(env, project)) as client:
            await client.call_tool("spawn_agent", {"task": task, "agent": "toucher", "cwd": str(project)})
            ask = await asyncio.to_thread(wait_for_ask, session_root)
            waited = structured(await client.call_tool("agent_wait", {"timeout_s": 1}))
            assert waited["status"] == "timeout"
            assert [a["id"] for a in waited["pending_asks"]] == [ask["id"]]
            answered = structured(await client.call_tool("agent_answer", {"ask_id": ask["id"], "decision": "allow"}))
            assert answered["verdict"] == "approve"
            done = structured(await client.call_tool("agent_wait", {"timeout_s": 50}))
            assert done["status"] == "done", done

    run(body)
    assert target.exists()
    validate_records(session_root)


def test_ask_answered_by_elicitation(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    project = project_with_asking_agent(tmp_path)
    target = tmp_path / "never-made"
    task = mock_task("make a file", [{"bash": f"touch {target}"}, {"text": "finished"}])
    asked: list[str] = []

    async def elicit(context: Any, params: ElicitRequestParams) -> ElicitResult:
        asked.append(params.message)
        return ElicitResult(action="accept", content={"approve": False})

    async def body() -> None:
        async with Client(server_params(env, project), elicitation_callback=elicit) as client:
            await client.call_tool("spawn_agent", {"task": task, "agent": "toucher", "cwd": str(project)})
            done = structured(await client.call_tool("agent_wait", {"timeout_s": 50}))
            assert done["status"] == "done", done

    run(body)
    assert len(asked) == 1 and "touch" in asked[0]
    assert not target.exists()
    answer = load(next(session_root.glob("*/asks/q-*.answer.json")))
    assert answer["verdict"] == "deny"
    assert answer["by"].startswith("mcp:")  # spawn.py approve|deny --as mcp:CLIENT
    validate_records(session_root)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_http_refuses_a_public_address_without_a_token(base_env: dict[str, str]) -> None:
    proc = subprocess.run(
        [sys.executable, str(SERVER), "--http", f"0.0.0.0:{free_port()}"],
        env=base_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "--token-file" in proc.stderr


def test_http_without_the_token_is_401(base_env: dict[str, str], tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token-value\n")
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(SERVER), "--http", str(port), "--token-file", str(token_file)],
        env=base_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}).encode()
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}

    def post(extra: dict[str, str]) -> int:
        request = urllib.request.Request(url, data=body, headers={**headers, **extra}, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return exc.code

    try:
        limit = time.monotonic() + 30
        while True:
            try:
                code = post({})
                break
            except urllib.error.URLError:
                assert server.poll() is None and time.monotonic() < limit, "the server did not start"
                time.sleep(0.1)
        assert code == 401
        assert post({"Authorization": "Bearer wrong"}) == 401
        assert post({"Authorization": "Bearer s3cret-tökén"}) == 401  # sent as latin-1: a 500 from compare_digest before
        assert post({"Authorization": "Bearer s3cret-token-value"}) != 401

        async def body_() -> None:
            async with Client(url) as client:
                await client.list_tools()

        with pytest.raises(BaseException):  # noqa: B017,PT011 - the SDK's error type for 401 varies
            run(body_)
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_claude_code_delegates_through_mcp(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    """The real CLI as the MCP client: a spawn.py root whose definition's mcpServers (passed to the CLI
    as --mcp-config) starts the server. Its spawns are its children, at depth 1, in its session."""
    project = tmp_path / "project"
    write_agent(
        project,
        "delegator",
        "description: Delegates\ntools: mcp__spawn__spawn_agent, mcp__spawn__agent_wait\n"
        f"mcpServers:\n  spawn:\n    command: {sys.executable}\n"
        f"    args: [{json.dumps(str(SERVER))}, --python, {json.dumps(sys.executable)}]",
        "You delegate.",
    )
    child_task = mock_task("child work", [{"text": "child says hi"}])
    steps: list[dict[str, Any]] = [
        {"tool": "mcp__spawn__spawn_agent", "input": {"task": child_task}},
        {"tool": "mcp__spawn__agent_wait", "input": {"timeout_s": 50}},
        {"text": "delegated"},
    ]
    proc = run_spawn(["--agent", "delegator", "--cwd", str(project), "--task", mock_task("delegate", steps)], env, timeout=240, cwd=project)
    out = stdout_json(proc)
    assert out["status"] == "done", proc.stderr
    tree = metas(session_root)
    root = next(m for m in tree.values() if m["depth"] == 0)
    child = next(m for m in tree.values() if m["depth"] == 1)
    assert child["parent_id"] == root["id"]
    assert child["session"] == root["session"]
    assert load(Path(child["session"]) / "agents" / child["id"] / "outcome.json")["output"] == "child says hi"
    transcript = (Path(root["session"]) / "agents" / root["id"] / "transcript.jsonl").read_text()
    assert "child says hi" in transcript  # agent_wait's result reached the root's model
    validate_records(session_root)


def test_server_limits_bound_every_spawn(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    async def body() -> None:
        async with Client(server_params(env, tmp_path, "--max-agents", "1", "--max-depth", "0", "--max-budget-usd", "0.5")) as client:
            task = mock_task("one", [{"text": "only one"}])
            first = structured(await client.call_tool("spawn_agent", {"task": task, "tools": ["Read"], "max_budget_usd": 5}))
            meta = load(Path(first["agent_dir"]) / "meta.json")
            assert meta["max_depth"] == 0  # no argument can raise the server's caps
            assert meta["max_budget_usd"] <= 0.5
            second = await client.call_tool("spawn_agent", {"task": task})
            assert second.is_error
            assert text(second).startswith("spawn: error: refused:") and "--max-agents 1" in text(second)
            structured(await client.call_tool("agent_wait", {"timeout_s": 50}))

    run(body)
    assert len(list(session_root.glob("*/agents/*"))) == 1
    validate_records(session_root)


# One model turn: the CLI prices 5k input tokens at $0.015 (medium tier); TURN_USD leaves room
# for the small side requests the CLI makes (as tests/test_budget.py).
TURN = {"input_tokens": 5_000, "output_tokens": 1}
TURN_USD = 0.02


def test_concurrent_spawns_share_one_agent_count(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    """Issue 31 item 5: with --max-agents 2 --max-concurrent 2, six concurrent spawn_agent calls were all admitted."""

    async def body() -> None:
        async with Client(server_params(env, tmp_path, "--max-agents", "2", "--max-concurrent", "2")) as client:
            task = mock_task("one", [{"text": "done"}])
            calls = [client.call_tool("spawn_agent", {"task": task, "tools": ["Read"]}) for _ in range(6)]
            results = await asyncio.gather(*calls)
            admitted = [structured(r) for r in results if not r.is_error]
            refused = [text(r) for r in results if r.is_error]
            assert [a["status"] for a in admitted] == ["running", "running"], admitted
            assert len(refused) == 4 and all(t.startswith("spawn: error: refused:") and "--max-agents 2" in t for t in refused), refused
            assert structured(await client.call_tool("agent_wait", {"timeout_s": 50}))["status"] == "done"

    run(body)
    ran = [p for p in session_root.glob("*/agents/*/outcome.json") if load(p)["status"] != "refused"]
    assert len(ran) == 2
    assert len(list(session_root.glob("*/limits.json"))) == 1  # one session: spawn.py's admission counts them all
    validate_records(session_root)


def test_concurrent_spawns_share_one_budget(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    """Issue 31 item 5: with --max-budget-usd 0.05 --max-agents 3, three agents were each allowed the whole $0.05."""
    budget = 0.05

    async def body() -> None:
        async with Client(server_params(env, tmp_path, "--max-budget-usd", str(budget), "--max-agents", "3")) as client:
            task = mock_task("spend", [*({"bash": "true", "usage": TURN} for _ in range(6)), {"text": "spent", "usage": TURN}])
            asks = [{"task": task, "tools": ["Bash"], "max_budget_usd": 0.03} for _ in range(2)] + [{"task": task, "tools": ["Bash"]}]
            results = await asyncio.gather(*(client.call_tool("spawn_agent", a) for a in asks))
            admitted = [structured(r) for r in results if not r.is_error]
            assert admitted, [text(r) for r in results]
            for r in results:
                assert not r.is_error or ("--max-budget-usd" in text(r) and text(r).startswith("spawn: error: refused:")), text(r)
            structured(await client.call_tool("agent_wait", {"timeout_s": 50}))

    run(body)
    metas_ = [load(p) for p in session_root.glob("*/agents/*/meta.json")]
    outcomes = [load(p) for p in session_root.glob("*/agents/*/outcome.json")]
    ran = [o for o in outcomes if o["status"] != "refused"]
    held = {m["id"]: m["max_budget_usd"] for m in metas_ if m["id"] in {o["id"] for o in ran}}
    assert len(held) == len(ran) and sum(held.values()) <= budget + 1e-9, held
    assert sum(float(o["cost_usd"]) for o in ran) <= budget + TURN_USD, ran
    (ledger,) = session_root.glob("*/ledger.jsonl")  # one ledger holds them all
    assert {json.loads(line)["id"] for line in ledger.read_text().splitlines()} == set(held)
    validate_records(session_root)


def test_agent_send_and_budget(env: dict[str, str], session_root: Path, tmp_path: Path, mock_model: MockModel) -> None:
    """agent_send reaches a running agent's next request; budget raises the server's session's budget."""

    async def body() -> None:
        async with Client(server_params(env, tmp_path, "--max-budget-usd", "1")) as client:
            task = mock_task("busy", [{"bash": "sleep 6; echo slept"}, {"text": "busy done"}])
            started = structured(await client.call_tool("spawn_agent", {"task": task, "tools": ["Bash"]}))
            agent_dir = Path(started["agent_dir"])
            transcript = agent_dir / "transcript.jsonl"
            limit = time.monotonic() + 60
            while not (transcript.exists() and '"PermissionDecision"' in transcript.read_text()):
                assert time.monotonic() < limit, "the Bash call never started"
                await asyncio.sleep(0.1)
            sent = structured(await client.call_tool("agent_send", {"agent_id": started["agent_id"], "text": "MCP-STEER-91"}))
            assert sent["seq"] == 1 and sent["delivery"] == "next request"
            # Never past the server's own --max-budget-usd (an agent it serves could call it too).
            past = await client.call_tool("budget", {"raise_usd": 0.5})
            assert past.is_error and "refused: a budget of $1.5 is past $1, the most this caller may give the tree" in text(past)
            raised = structured(await client.call_tool("budget", {"raise_usd": 0}))
            assert raised["max_budget_usd"] == 1.0 and raised["previous_usd"] == 1.0
            both = await client.call_tool("budget", {"raise_usd": 0.5, "set_usd": 2})
            assert both.is_error and "exactly one" in text(both)
            waited = structured(await client.call_tool("agent_wait", {"timeout_s": 50}))
            assert waited["status"] == "done", waited
            late = await client.call_tool("agent_send", {"agent_id": started["agent_id"], "text": "too late"})
            assert late.is_error and f"agent {started['agent_id']} has finished (done" in text(late)

    run(body)
    requests = [r for r in mock_model.requests() if r["kind"] == "main"]
    assert any("MCP-STEER-91" in t for t in requests[-1]["later_texts"])
    (transcript,) = session_root.glob("*/agents/*/transcript.jsonl")
    records = [json.loads(line) for line in transcript.read_text().splitlines()]
    (sent,) = [r["message"] for r in records if r["type"] == "UserSent"]
    assert sent["text"] == "MCP-STEER-91" and sent["by"].startswith("mcp:")


def test_an_agent_the_server_started_can_not_call_it_over_loopback(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    """Issue 45: an agent the server started calls the server's loopback address (no token, the default) with curl, as it
    would to answer its own ask or raise its own budget. The server finds the caller's process from the socket and refuses it."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    server = subprocess.Popen(
        [sys.executable, str(SERVER), "--python", sys.executable, "--http", str(port)],
        env=env,
        cwd=str(tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    ping = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"})
    curl = (
        f"curl -s -w ' http=%{{http_code}}' -X POST {url} -H 'Content-Type: application/json' "
        f"-H 'Accept: application/json, text/event-stream' -d '{ping}'"
    )
    task = mock_task("caller", [{"bash": curl}, {"text": "caller done"}])

    waited: dict[str, Any] = {}

    async def body() -> None:
        async with Client(url) as client:
            await client.call_tool("spawn_agent", {"task": task, "tools": ["Bash"]})
            waited.update(structured(await client.call_tool("agent_wait", {"timeout_s": 90})))

    try:
        limit = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(url, timeout=5).close()
            except urllib.error.HTTPError:
                break  # it answers
            except urllib.error.URLError:
                assert server.poll() is None and time.monotonic() < limit, "the server did not start"
                time.sleep(0.2)
        run(body)
    finally:
        server.terminate()
        server.wait(timeout=10)
    assert waited["status"] == "done", waited
    (transcript,) = session_root.glob("*/agents/*/transcript.jsonl")
    text_ = transcript.read_text()
    assert "http=403" in text_ and "runs in a tree this server serves" in text_, text_[-3000:]


def test_agent_status_shows_each_agents_last_model_calls(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    """Under a budget the gateway records each model call; a model reading agent_status gets the last five and the count."""

    async def body() -> None:
        async with Client(server_params(env, tmp_path, "--max-budget-usd", "1")) as client:
            task = mock_task("calls", [*({"bash": "true"} for _ in range(6)), {"text": "calls done"}])
            started = structured(await client.call_tool("spawn_agent", {"task": task, "tools": ["Bash"]}))
            waited = structured(await client.call_tool("agent_wait", {"timeout_s": 100}))
            assert waited["status"] == "done", waited
            status = structured(await client.call_tool("agent_status", {"agent_id": started["agent_id"]}))
            (row,) = [r for r in status["agents"] if r["id"] == started["agent_id"]]
            assert len(row["model_calls"]) == 5 and row["model_calls_total"] >= 7, row
            assert {c["status"] for c in row["model_calls"]} == {"200"}

    run(body)


def test_a_root_that_outlives_the_first_root_of_the_servers_session_keeps_its_gateway(
    env: dict[str, str], session_root: Path, tmp_path: Path
) -> None:
    """Two agents of one server under a budget share the session's gateway: the second still runs when the first has
    ended, and its calls go on; neither holds the server's real credential."""
    secret = "sk-ant-oat01-mcp-server-real-token-0000"
    dump = tmp_path / "env.txt"

    async def body() -> None:
        async with Client(server_params({**env, "ANTHROPIC_AUTH_TOKEN": secret}, tmp_path, "--max-budget-usd", "1")) as client:
            quick = mock_task("first", [{"text": "first done"}])
            first = structured(await client.call_tool("spawn_agent", {"task": quick, "max_budget_usd": 0.4}))
            task = mock_task("second", [{"bash": "sleep 4"}, {"bash": f"env > {dump}"}, {"text": "second done"}])
            second = structured(await client.call_tool("spawn_agent", {"task": task, "tools": ["Bash"], "max_budget_usd": 0.4}))
            done = structured(await client.call_tool("agent_wait", {"agent_id": first["agent_id"], "timeout_s": 60}))
            assert done["status"] == "done", done
            later = structured(await client.call_tool("agent_wait", {"agent_id": second["agent_id"], "timeout_s": 90}))
            assert later["status"] == "done", later

    run(body)
    assert secret not in dump.read_text()
