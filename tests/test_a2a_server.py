"""tools/a2a_server.py end to end: the a2a-sdk's own client, the server, spawn.py, the real CLI."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
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
    spawn_in_bash,
    start_spawn,
    stdout_json,
    validate_records,
    wait_for_ask,
    wait_for_path,
    wait_until_gone,
    write_agent,
)

a2a = pytest.importorskip("a2a")
import httpx  # noqa: E402
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory  # noqa: E402
from a2a.types import CancelTaskRequest, GetTaskRequest, Message, Part, Role, SendMessageRequest, StreamResponse, TaskState  # noqa: E402
from google.protobuf import json_format  # noqa: E402

SERVER = ROOT / "tools" / "a2a_server.py"
# Generous: only a hang should ever reach these (the machine is shared and loaded).
STREAM_TIMEOUT_S = 180.0
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@dataclass
class Served:
    url: str
    process: subprocess.Popen[bytes]
    stderr: Path
    token_file: Path | None = None
    """The token the server wrote (none with --no-token or --token-file)."""

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token_file.read_text().strip()}"} if self.token_file else {}


@dataclass
class Exchange:
    """Everything one message's stream carried, in order."""

    events: list[StreamResponse] = field(default_factory=list)

    @property
    def task_id(self) -> str:
        for e in self.events:
            if e.HasField("task"):
                return str(e.task.id)
            if e.HasField("status_update"):
                return str(e.status_update.task_id)
        raise AssertionError(f"no task in {self.events}")

    @property
    def context_id(self) -> str:
        for e in self.events:
            if e.HasField("task"):
                return str(e.task.context_id)
            if e.HasField("status_update"):
                return str(e.status_update.context_id)
        raise AssertionError(f"no task in {self.events}")

    def states(self) -> list[str]:
        return [TaskState.Name(e.status_update.status.state) for e in self.events if e.HasField("status_update")]

    def last_status(self) -> tuple[str, str, dict[str, Any]]:
        """(state, text, metadata) of the last status update."""
        update = [e.status_update for e in self.events if e.HasField("status_update")][-1]
        text = " ".join(p.text for p in update.status.message.parts)
        return TaskState.Name(update.status.state), text, json_format.MessageToDict(update.metadata)

    def artifacts(self) -> list[Any]:
        return [e.artifact_update.artifact for e in self.events if e.HasField("artifact_update")]


def project_with_agents(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    write_agent(project, "greeter", "description: Says hello to people\ntools: Read", "You greet.")
    write_agent(project, "toucher", 'description: Makes files\ntools: Bash\npermissions:\n  ask: ["Bash(touch:*)"]', "You make files.")
    write_agent(project, "worker", "description: Runs commands and starts helpers\ntools: Bash", "You work.")
    return project


@pytest.fixture
def serve(env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., Served]]:
    """Start the real server on a free loopback port; stopped (SIGTERM) after the test."""
    started: list[Served] = []

    def start(*extra: str, cwd: Path | None = None) -> Served:
        n = len(started)
        port_file, stderr = tmp_path / f"a2a-{n}.port", tmp_path / f"a2a-{n}.stderr"
        project = cwd or project_with_agents(tmp_path)
        # The test interpreter has both a2a-sdk and spawn.py's dependencies.
        argv = [
            sys.executable,
            str(SERVER),
            "--port",
            "0",
            "--port-file",
            str(port_file),
            "--python",
            sys.executable,
            "--cwd",
            str(project),
        ]
        with open(stderr, "wb") as err:
            proc = subprocess.Popen([*argv, *extra], env=env, stdout=subprocess.DEVNULL, stderr=err)
        served = Served("", proc, stderr)
        started.append(served)
        limit = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text().strip():
            assert proc.poll() is None, f"the server exited: {stderr.read_text()}"
            assert time.monotonic() < limit, "the server did not start"
            time.sleep(0.05)
        served.url = f"http://127.0.0.1:{port_file.read_text().strip()}"
        said = re.search(r"bearer token in (\S+)", stderr.read_text())
        served.token_file = Path(said.group(1)) if said else None
        return served

    yield start
    for served in started:
        if served.process.poll() is None:
            served.process.send_signal(signal.SIGTERM)
            try:
                served.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                served.process.kill()
                served.process.wait()


def run(coro: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(coro())


def user_message(text: str, metadata: dict[str, Any] | None = None, task_id: str = "", context_id: str = "") -> SendMessageRequest:
    message = Message(
        message_id=f"m-{time.monotonic_ns()}", role=Role.ROLE_USER, parts=[Part(text=text)], task_id=task_id, context_id=context_id
    )
    if metadata:
        message.metadata.update(metadata)
    return SendMessageRequest(message=message)


async def send(served: Served, url: str, request: SendMessageRequest, until: Callable[[Exchange], bool] | None = None) -> Exchange:
    """Send one message with the real client and collect its stream (to its end, or until `until`)."""
    exchange = Exchange()
    async with httpx.AsyncClient(timeout=STREAM_TIMEOUT_S, headers=served.headers) as http:
        client = await ClientFactory(ClientConfig(httpx_client=http, streaming=True)).create_from_url(url)
        async with asyncio.timeout(STREAM_TIMEOUT_S):
            async for event in client.send_message(request):
                exchange.events.append(event)
                if until is not None and until(exchange):
                    break
    return exchange


def agent_dir_of(exchange: Exchange, session_root: Path) -> Path:
    for e in exchange.events:
        if e.HasField("status_update"):
            agent_id = json_format.MessageToDict(e.status_update.metadata).get("spawn.agent_id")
            if agent_id:
                return next(session_root.glob(f"*/agents/{agent_id}"))
    raise AssertionError(f"no agent in {exchange.states()}")


def load_server_module() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("a2a_server", SERVER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["a2a_server"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def test_the_smaller_limit_wins_and_bad_metadata_names_its_key() -> None:
    core = load_server_module()
    caller = core.caller_context({"spawn.depth": 2.0, "spawn.max_depth": "4", "spawn.max_budget_usd": 3, "spawn.deadline": 2e9})
    argv, env = core.spawn_arguments(caller, core.ServerLimits(max_depth=3, max_budget_usd=5.0, timeout_s=60.0), "greeter")
    assert argv[argv.index("--max-depth") + 1] == "3"
    assert argv[argv.index("--max-budget-usd") + 1] == "3.0"
    assert argv[argv.index("--timeout") + 1] == "60.0"
    assert argv[argv.index("--agent") + 1] == "greeter"
    assert env == {"SPAWN_DEPTH": "2", "SPAWN_DEADLINE": "2000000000.0"}
    # Nothing from the caller: only the server's own limits, and no inherited depth.
    argv, env = core.spawn_arguments(core.caller_context({}), core.ServerLimits(), "greeter")
    assert env == {} and "--max-depth" not in argv
    for reference in ("command:id", "a2a:http://x", "../x", "auto"):  # never reaches spawn.py's --agent
        with pytest.raises(core.BadMetadata):
            core.spawn_arguments(core.caller_context({}), core.ServerLimits(), reference)
    for bad in (
        {"spawn.depth": True},
        {"spawn.depth": 1.5},
        {"spawn.max_budget_usd": 0},
        {"spawn.deadline": "inf"},
        {"spawn.agent": "../x"},
    ):
        with pytest.raises(core.BadMetadata, match=next(iter(bad))):
            core.caller_context(bad)
    assert core.decision_of("Approved, go ahead", {}) == "allow"
    assert core.decision_of("no thanks", {}) == "deny"
    assert core.decision_of("what is it?", {}) is None
    assert core.decision_of("whatever", {"spawn.decision": "deny"}) == "deny"
    partial = core.outcome_metadata({"status": "done", "cost_usd": 0.5}, Path("/s/agents/a1-x"), [0.5, None, 0.25])
    assert (partial["spawn.cost_usd"], partial["spawn.cost_partial"], partial["spawn.own_cost_usd"]) == (0.75, True, 0.5)
    assert "spawn.cost_usd" not in core.outcome_metadata({"status": "killed"}, Path("/s/agents/a1-x"), [None])


def test_card_lists_the_agent_definitions_as_skills(serve: Callable[..., Served]) -> None:
    served = serve()

    async def body() -> None:
        async with httpx.AsyncClient(timeout=60) as http:
            card = await A2ACardResolver(http, served.url).get_agent_card()
            assert {s.id for s in card.skills} == {"greeter", "toucher", "worker"}
            greeter = next(s for s in card.skills if s.id == "greeter")
            assert greeter.description == "Says hello to people"
            assert card.capabilities.streaming
            assert card.supported_interfaces[0].url == f"{served.url}/"
            # Each skill is an A2A agent of its own, at /agents/NAME.
            one = await A2ACardResolver(http, f"{served.url}/agents/greeter").get_agent_card()
            assert [s.id for s in one.skills] == ["greeter"]
            assert one.supported_interfaces[0].url == f"{served.url}/agents/greeter"
            missing = await http.get(f"{served.url}/agents/nobody/.well-known/agent-card.json")
            assert missing.status_code == 404
            # spawn.py's built-in agents are not served: only the project's files are.
            builtin = await http.get(f"{served.url}/agents/build/.well-known/agent-card.json")
            assert builtin.status_code == 404

    run(body)


def test_a_message_runs_an_agent_to_completed_with_its_output(serve: Callable[..., Served], session_root: Path) -> None:
    served = serve()
    # Two steps: a transcript line (the tool call) streams as `working` before the answer.
    task = mock_task("say hello", [{"bash": "true"}, {"text": "hello from greeter"}])

    async def body() -> None:
        done = await send(served, f"{served.url}/agents/greeter", user_message(task))
        state, _, metadata = done.last_status()
        assert state == "TASK_STATE_COMPLETED", (done.states(), served.stderr.read_text())
        assert done.states()[0] == "TASK_STATE_WORKING"
        [artifact] = done.artifacts()
        assert [p.text for p in artifact.parts] == ["hello from greeter"]
        assert metadata["spawn.status"] == "done"
        agent_dir = agent_dir_of(done, session_root)
        assert metadata["spawn.cost_usd"] == pytest.approx(load(agent_dir / "outcome.json")["cost_usd"])
        assert load(agent_dir / "meta.json")["agent"] == "greeter"
        assert load(agent_dir / "outcome.json")["output"] == "hello from greeter"
        # The root URL takes the skill from the metadata.
        again = await send(served, served.url, user_message(mock_task("again", [{"text": "hi again"}]), {"spawn.agent": "greeter"}))
        assert again.last_status()[0] == "TASK_STATE_COMPLETED"
        assert load(agent_dir_of(again, session_root) / "meta.json")["agent"] == "greeter"

    run(body)
    validate_records(session_root)


def test_cancel_ends_the_subtree(serve: Callable[..., Served], session_root: Path) -> None:
    served = serve()
    child = mock_task("child", [{"bash": "echo busy; sleep 300"}, {"text": "never"}])
    start_child = spawn_in_bash("--background", "--tools", "Bash", "--task", child)
    task = mock_task("parent", [{"bash": start_child}, {"bash": "echo busy; sleep 300"}, {"text": "never"}])

    async def body() -> None:
        async with httpx.AsyncClient(timeout=STREAM_TIMEOUT_S, headers=served.headers) as http:
            client = await ClientFactory(ClientConfig(httpx_client=http, streaming=True)).create_from_url(f"{served.url}/agents/worker")
            exchange = Exchange()

            def two_running() -> bool:
                beats = list(session_root.glob("*/agents/*/heartbeat.json"))
                return len(beats) == 2

            async def consume() -> None:
                async for event in client.send_message(user_message(task)):
                    exchange.events.append(event)

            stream = asyncio.create_task(consume())
            async with asyncio.timeout(STREAM_TIMEOUT_S):
                while not (exchange.events and two_running()):
                    await asyncio.sleep(0.1)
                tree = metas(session_root)
                pids = [m["pid"] for m in tree.values()]
                pids += [load(d / "heartbeat.json")["cli_pid"] for d in session_root.glob("*/agents/*")]
                cancelled = await client.cancel_task(CancelTaskRequest(id=exchange.task_id))
                assert TaskState.Name(cancelled.status.state) == "TASK_STATE_CANCELED"
                await stream
                task_now = await client.get_task(GetTaskRequest(id=exchange.task_id))
                assert TaskState.Name(task_now.status.state) == "TASK_STATE_CANCELED"
        assert wait_until_gone(pids, timeout=60) == []
        assert {load(d / "outcome.json")["status"] for d in session_root.glob("*/agents/*")} == {"killed"}

    run(body)
    validate_records(session_root)


def test_an_ask_is_input_required_and_the_answer_resumes(serve: Callable[..., Served], session_root: Path, tmp_path: Path) -> None:
    served = serve()
    target = tmp_path / "made-by-agent"
    task = mock_task("make a file", [{"bash": f"touch {target}"}, {"text": "made it"}])

    async def body() -> None:
        asked = await send(served, f"{served.url}/agents/toucher", user_message(task))
        state, text, metadata = asked.last_status()
        assert state == "TASK_STATE_INPUT_REQUIRED", (asked.states(), served.stderr.read_text())
        assert "touch" in text and "allow or deny" in text
        ask_id = metadata["spawn.ask"]["id"]
        assert not target.exists()
        # Not an answer: asked again, nothing settled.
        unclear = await send(served, served.url, user_message("maybe later", task_id=asked.task_id, context_id=asked.context_id))
        assert unclear.last_status()[0] == "TASK_STATE_INPUT_REQUIRED"
        done = await send(served, served.url, user_message("allow", task_id=asked.task_id, context_id=asked.context_id))
        assert done.last_status()[0] == "TASK_STATE_COMPLETED", done.states()
        assert [p.text for p in done.artifacts()[0].parts] == ["made it"]
        answer = load(next(session_root.glob(f"*/asks/{ask_id}.answer.json")))
        assert answer["verdict"] == "approve"
        assert answer["by"] == f"a2a:{asked.task_id[:40]}"

    run(body)
    assert target.exists()
    validate_records(session_root)


def test_the_callers_limits_shrink_and_its_trace_is_kept(serve: Callable[..., Served], session_root: Path, tmp_path: Path) -> None:
    served = serve("--max-depth", "5", "--max-budget-usd", "2", "--timeout", "900")
    # This machine's settings bind what it serves, though the agent is not a root here.
    (tmp_path / "project" / ".claude" / "settings.json").write_text('{"permissions": {"deny": ["Bash(rm:*)"]}}')
    deadline = time.time() + 600
    caller = {
        "spawn.depth": 1,
        "spawn.max_depth": 3,
        "spawn.deadline": deadline,
        "spawn.max_budget_usd": 0.5,
        "spawn.traceparent": TRACEPARENT,
    }

    async def body() -> None:
        done = await send(served, f"{served.url}/agents/greeter", user_message(mock_task("limits", [{"text": "ok"}]), caller))
        assert done.last_status()[0] == "TASK_STATE_COMPLETED", (done.states(), served.stderr.read_text())
        meta = load(agent_dir_of(done, session_root) / "meta.json")
        assert meta["depth"] == 2  # one below the calling node
        assert meta["max_depth"] == 3  # the caller's, smaller than the server's 5
        assert meta["deadline"] <= deadline - 5  # the caller's, less a parent's grace; the server's 900 s is later
        assert meta["max_budget_usd"] <= 0.5
        assert load(Path(meta["session"]) / "limits.json")["max_budget_usd"] == 0.5  # the served tree's budget
        assert meta["trace_id"] == TRACEPARENT.split("-")[1]
        assert meta["parent_span_id"] == TRACEPARENT.split("-")[2]
        assert "Bash(rm:*)" in meta["permissions"]["deny"]
        # The server's own limits win when they are the smaller.
        loose = {"spawn.depth": 0, "spawn.max_depth": 9, "spawn.max_budget_usd": 50}
        second = await send(served, f"{served.url}/agents/greeter", user_message(mock_task("loose", [{"text": "ok"}]), loose))
        meta2 = load(agent_dir_of(second, session_root) / "meta.json")
        assert (meta2["depth"], meta2["max_depth"]) == (1, 5)
        assert meta2["max_budget_usd"] <= 2
        assert meta2["deadline"] <= time.time() + 900
        # At the caller's max depth: refused by spawn.py (recorded), rejected over A2A.
        deep = await send(served, f"{served.url}/agents/greeter", user_message("too deep", {"spawn.depth": 3, "spawn.max_depth": 3}))
        assert deep.states() == ["TASK_STATE_REJECTED"]
        assert "depth limit" in deep.last_status()[1]

    run(body)
    refused = [load(p) for p in session_root.glob("*/agents/*/outcome.json") if load(p)["status"] == "refused"]
    assert len(refused) == 1 and "depth limit" in refused[0]["reason"]
    validate_records(session_root)


def test_stopping_the_server_ends_its_agents(serve: Callable[..., Served], session_root: Path) -> None:
    served = serve()
    task = mock_task("long", [{"bash": "echo busy; sleep 300"}, {"text": "never"}])

    async def body() -> None:
        exchange = await send(served, f"{served.url}/agents/worker", user_message(task), until=lambda e: bool(e.states()))
        agent_dir = agent_dir_of(exchange, session_root)
        await asyncio.to_thread(wait_for_path, agent_dir / "heartbeat.json", STREAM_TIMEOUT_S)
        pids = [load(agent_dir / "meta.json")["pid"], load(agent_dir / "heartbeat.json")["cli_pid"]]
        served.process.send_signal(signal.SIGTERM)
        # uvicorn shuts down, then lets the signal it caught end the process as usual.
        assert await asyncio.to_thread(served.process.wait, STREAM_TIMEOUT_S) in (0, -signal.SIGTERM)
        assert load(agent_dir / "outcome.json")["status"] == "killed"
        assert wait_until_gone(pids, timeout=60) == []

    run(body)
    validate_records(session_root)


def test_bad_metadata_is_rejected_and_nothing_is_started(serve: Callable[..., Served], session_root: Path) -> None:
    served = serve()

    async def body() -> None:
        for bad, key in (
            ({"spawn.depth": -1}, "spawn.depth"),
            ({"spawn.traceparent": "nope"}, "spawn.traceparent"),
            ({"spawn.deadline": "soon"}, "spawn.deadline"),
        ):
            exchange = await send(served, served.url, user_message("hello", bad))
            state, text, _ = exchange.last_status()
            assert state == "TASK_STATE_REJECTED"
            assert text.startswith("a2a_server: error: metadata " + key), text
        unknown = await send(served, served.url, user_message("hello", {"spawn.agent": "nobody"}))
        state, text, _ = unknown.last_status()
        assert state == "TASK_STATE_REJECTED" and text.startswith("a2a_server: error: no skill 'nobody'"), text

    run(body)
    assert list(session_root.glob("*/agents/*")) == []


def test_a_public_address_needs_a_token(base_env: dict[str, str], tmp_path: Path) -> None:
    def refused(*flags: str) -> str:
        proc = subprocess.run([sys.executable, str(SERVER), *flags], env=base_env, capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 2, proc.stderr
        [line] = proc.stderr.splitlines()
        assert line.startswith("a2a_server: error:")
        return line

    assert "--no-token" in refused("--host", "0.0.0.0", "--port", "0", "--no-token")
    # spawn.py's default agent, or a node reference, is no skill to serve.
    assert "--agent" in refused("--agent", "none", "--port", "0")
    assert "--agent" in refused("--agent", "command:id", "--port", "0")
    assert "--port" in refused("--port", "70000")
    assert "--max-depth" in refused("--max-depth", "x")
    empty = tmp_path / "empty-token"
    empty.write_text("\n")
    assert "empty" in refused("--host", "0.0.0.0", "--port", "0", "--token-file", str(empty))


def test_with_a_token_the_card_is_public_and_the_rest_needs_it(serve: Callable[..., Served], tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-token-value\n")
    served = serve("--token-file", str(token))
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "nope"}}).encode()

    def post(headers: dict[str, str]) -> int:
        request = urllib.request.Request(
            served.url + "/", data=body, headers={"Content-Type": "application/json", **headers}, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return exc.code

    with urllib.request.urlopen(served.url + "/.well-known/agent-card.json", timeout=30) as response:
        card = json.loads(response.read())
    assert "bearer" in card["securitySchemes"]
    assert post({}) == 401
    assert post({"Authorization": "Bearer wrong"}) == 401
    assert post({"Authorization": "Bearer s3cret-tökén"}) == 401  # sent as latin-1: a 500 from compare_digest before
    assert post({"Authorization": "Bearer s3cret-token-value"}) == 200


def http_status(served: Served, method: str, path: str, body: dict[str, Any] | None = None, **headers: str) -> int:
    """One request with http.client, which sends Host and Origin as given (a browser's, a rebinding page's)."""
    import http.client
    from urllib.parse import urlsplit

    address = urlsplit(served.url)
    connection = http.client.HTTPConnection(address.hostname or "", address.port, timeout=60)
    sent = {"Content-Type": "application/json", "A2A-Version": "1.0", **served.headers, **headers}
    try:
        connection.request(method, path, body=json.dumps(body).encode() if body is not None else None, headers=sent)
        response = connection.getresponse()
        response.read()
        return int(response.status)
    finally:
        connection.close()


def send_message_body(text: str, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"messageId": f"m-{time.monotonic_ns()}", "role": "ROLE_USER", "parts": [{"text": text}]}
    if metadata:
        message["metadata"] = metadata
    return {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message}}


def test_a_node_reference_is_never_served(serve: Callable[..., Served], session_root: Path, tmp_path: Path) -> None:
    """The attack of issue 31: /agents/command:... ran `spawn.py --agent command:...` as the server's user."""
    served = serve()
    project = tmp_path / "project"
    attack = "/agents/command:sh%20-c%20%22id%3Epwned%22"
    assert http_status(served, "POST", attack, send_message_body("hello")) == 404
    assert http_status(served, "POST", "/agents/a2a:http:%2F%2Fevil.example", send_message_body("hello")) == 404
    assert http_status(served, "POST", "/agents/nobody", send_message_body("hello")) == 404

    async def body() -> None:
        # The same reference in the metadata, and a name that is no listed skill: rejected.
        for agent in ('command:sh -c "id>pwned"', "nobody"):
            exchange = await send(served, served.url, user_message("hello", {"spawn.agent": agent}))
            state, text, _ = exchange.last_status()
            assert state == "TASK_STATE_REJECTED", exchange.states()
            assert text.startswith("a2a_server: error:"), text

    run(body)
    time.sleep(1)  # a spawn started anyway would have run its command by now
    assert not (project / "pwned").exists()
    assert list(session_root.glob("*/agents/*")) == []


def test_a_task_no_listed_skill_matches_is_rejected(serve: Callable[..., Served], session_root: Path) -> None:
    """--agent auto routes among the card's skills only: spawn.py's own default agent is not served."""
    served = serve()

    async def body() -> None:
        exchange = await send(served, served.url, user_message(mock_task("zebra quasar", [{"text": "the default agent ran"}])))
        state, text, _ = exchange.last_status()
        assert state == "TASK_STATE_REJECTED", (exchange.states(), text)
        assert "no skill matches" in text

    run(body)
    assert list(session_root.glob("*/agents/*")) == []


def test_a_foreign_host_or_origin_is_refused_on_every_route(serve: Callable[..., Served], session_root: Path) -> None:
    """DNS rebinding: a page on evil.example whose name now points at 127.0.0.1 (421 and 403, as the MCP server)."""
    served = serve()
    card, skill_card = "/.well-known/agent-card.json", "/agents/greeter/.well-known/agent-card.json"
    message = send_message_body(mock_task("hi", [{"text": "hi"}]))
    for path in (card, skill_card):
        assert http_status(served, "GET", path) == 200
        assert http_status(served, "GET", path, Host="rebind.evil.example") == 421
        assert http_status(served, "GET", path, Origin="http://evil.example") == 403
        assert http_status(served, "GET", path, Origin=served.url) == 200
    for path in ("/", "/agents/greeter"):
        assert http_status(served, "POST", path, message, Host="rebind.evil.example", Origin="http://evil.example") == 421
        assert http_status(served, "POST", path, message, Origin="http://evil.example") == 403
        assert http_status(served, "POST", path, message, Origin="null") == 403
    assert list(session_root.glob("*/agents/*")) == []


def test_a_token_is_required_by_default_on_loopback(serve: Callable[..., Served]) -> None:
    served = serve()
    assert served.token_file is not None, served.stderr.read_text()
    assert served.token_file.stat().st_mode & 0o777 == 0o600
    assert served.token_file.read_text().strip() not in served.stderr.read_text()  # the path is printed, not the token
    get_task = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "nope"}}
    assert http_status(served, "POST", "/", get_task) == 200
    assert http_status(served, "POST", "/", get_task, Authorization="") == 401
    assert http_status(served, "POST", "/", get_task, Authorization="Bearer wrong") == 401
    assert http_status(served, "POST", "/", get_task, Authorization="Bearer tökén") == 401  # a 500 from compare_digest before
    assert http_status(served, "GET", "/.well-known/agent-card.json", Authorization="") == 200  # cards stay public
    served.process.send_signal(signal.SIGTERM)
    served.process.wait(timeout=60)
    assert not served.token_file.exists()  # the token ends with the server
    unguarded = serve("--no-token")
    assert unguarded.token_file is None
    assert http_status(unguarded, "POST", "/", get_task) == 200


# ------------------------------------------------- across the hop: spawn.py -> a2a node -> this server --


def a2a_kind_available() -> bool:
    """Whether this spawn.py runs `a2a` nodes (the client side of the hop)."""
    import spawn

    return "a2a" in getattr(spawn, "EXECUTORS", {})


needs_a2a_client = pytest.mark.skipif(not a2a_kind_available(), reason="this spawn.py has no a2a node kind (the A2A client)")


def token_env(env: dict[str, str], served: Served) -> dict[str, str]:
    """The caller's environment with the server's token file: how an a2a node finds its token."""
    assert served.token_file is not None
    return {**env, "SPAWN_A2A_TOKEN_FILE": str(served.token_file)}


def remote_agents(remote_root: Path) -> dict[str, dict[str, Any]]:
    return metas(remote_root)


@needs_a2a_client
def test_one_tree_across_the_hop(serve: Callable[..., Served], env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    """spawn.py -> a2a node -> tools/a2a_server.py -> spawn.py -> real CLI, and its child: depth and trace carry on."""
    remote_root = tmp_path / "remote-sessions"
    served = serve("--session", str(remote_root))
    grandchild = mock_task("check one thing", [{"text": "checked"}])
    steps: list[dict[str, Any]] = [{"bash": spawn_in_bash("--tools", "Bash", "--task", grandchild)}, {"text": "remote done"}]
    proc = run_spawn(
        ["--agent", f"a2a:{served.url}/agents/worker", "--max-depth", "3", "--task", mock_task("work", steps)],
        token_env(env, served),
        timeout=300,
    )
    out = stdout_json(proc)
    assert out["status"] == "done", (proc.stderr, served.stderr.read_text())
    assert out["output"] == "remote done"
    [node] = metas(session_root).values()
    remote = remote_agents(remote_root)
    by_depth = {m["depth"]: m for m in remote.values()}
    assert sorted(by_depth) == [1, 2]  # the a2a node is depth 0 on this side
    assert by_depth[1]["agent"] == "worker" and by_depth[2]["parent_id"] == by_depth[1]["id"]
    assert {m["trace_id"] for m in remote.values()} == {node["trace_id"]}
    assert by_depth[1]["parent_span_id"] == node["span_id"]
    assert all(m["max_depth"] == 3 for m in remote.values())
    # The node is charged what the whole remote subtree spent.
    remote_outcomes = [load(Path(m["session"]) / "agents" / i / "outcome.json") for i, m in remote.items()]
    assert [o["status"] for o in remote_outcomes] == ["done", "done"]
    remote_cost = sum(o["cost_usd"] for o in remote_outcomes)
    assert out["cost_usd"] == pytest.approx(remote_cost)
    validate_records(session_root)
    validate_records(remote_root)


@needs_a2a_client
def test_a_kill_at_the_top_ends_the_remote_subtree(
    serve: Callable[..., Served], env: dict[str, str], session_root: Path, tmp_path: Path
) -> None:
    remote_root = tmp_path / "remote-sessions"
    served = serve("--session", str(remote_root))
    child = mock_task("child", [{"bash": "echo busy; sleep 300"}, {"text": "never"}])
    steps = [
        {"bash": spawn_in_bash("--background", "--tools", "Bash", "--task", child)},
        {"bash": "echo busy; sleep 300"},
        {"text": "never"},
    ]
    top = start_spawn(["--agent", f"a2a:{served.url}/agents/worker", "--task", mock_task("work", steps)], token_env(env, served))
    try:
        limit = time.monotonic() + STREAM_TIMEOUT_S
        while len(list(remote_root.glob("*/agents/*/heartbeat.json"))) < 2:
            assert top.poll() is None and time.monotonic() < limit, (top.stderr.read() if top.stderr else "", served.stderr.read_text())
            time.sleep(0.1)
        remote = remote_agents(remote_root)
        pids = [m["pid"] for m in remote.values()]
        pids += [load(d / "heartbeat.json")["cli_pid"] for d in remote_root.glob("*/agents/*")]
        [node] = metas(session_root).values()
        killed = run_spawn(["kill", node["id"]], env)
        assert killed.returncode == 0, killed.stderr
        top.communicate(timeout=STREAM_TIMEOUT_S)
        assert wait_until_gone(pids, timeout=60) == []
        limit = time.monotonic() + 60
        while len(list(remote_root.glob("*/agents/*/outcome.json"))) < 2:
            assert time.monotonic() < limit, "the remote agents have no outcomes"
            time.sleep(0.1)
        assert {load(d / "outcome.json")["status"] for d in remote_root.glob("*/agents/*")} == {"killed"}
        assert load(Path(node["session"]) / "agents" / node["id"] / "outcome.json")["status"] == "killed"
    finally:
        if top.poll() is None:
            top.kill()
            top.communicate()
    validate_records(remote_root)


@needs_a2a_client
def test_a_remote_ask_is_answered_at_the_top(serve: Callable[..., Served], env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    """The served agent's ask becomes input-required, the a2a node's ask here; approving it here lets the remote agent go on."""
    remote_root = tmp_path / "remote-sessions"
    served = serve("--session", str(remote_root))
    # In the served agent's project: arriving with the caller's depth, it runs sandboxed, writing only there.
    target = tmp_path / "project" / "made-over-there"
    top = start_spawn(
        ["--agent", f"a2a:{served.url}/agents/toucher", "--task", mock_task("make", [{"bash": f"touch {target}"}, {"text": "made"}])],
        token_env(env, served),
    )
    with ended_at_exit(top):
        local_ask = wait_for_ask(session_root, timeout=STREAM_TIMEOUT_S)
        assert "touch" in json.dumps(local_ask["input"])
        answer_ask("approve", local_ask, session_root, env)
        out, err = top.communicate(timeout=STREAM_TIMEOUT_S)
    assert json.loads(out)["status"] == "done", err
    assert target.exists()
    [remote_answer] = [load(p) for p in remote_root.glob("*/asks/q-*.answer.json")]
    assert remote_answer["verdict"] == "approve" and remote_answer["by"].startswith("a2a:")


@needs_a2a_client
def test_a_remote_ask_denied_at_the_top_ends_the_remote_agent(
    serve: Callable[..., Served], env: dict[str, str], session_root: Path, tmp_path: Path
) -> None:
    remote_root = tmp_path / "remote-sessions"
    served = serve("--session", str(remote_root))
    target = tmp_path / "project" / "never-made"  # where it could write (its project), had it been allowed
    top = start_spawn(
        ["--agent", f"a2a:{served.url}/agents/toucher", "--task", mock_task("make", [{"bash": f"touch {target}"}, {"text": "made"}])],
        token_env(env, served),
    )
    with ended_at_exit(top):
        local_ask = wait_for_ask(session_root, timeout=STREAM_TIMEOUT_S)
        answer_ask("deny", local_ask, session_root, env)
        out, err = top.communicate(timeout=STREAM_TIMEOUT_S)
    assert json.loads(out)["status"] == "refused", err
    assert not target.exists()
    [remote_answer] = [load(p) for p in remote_root.glob("*/asks/q-*.answer.json")]
    # Settled, not left pending: the server kills first (so a no can't let the agent take another
    # turn), and the asking runner denies its ask as it stops, unless the caller's no reached it first.
    assert remote_answer["verdict"] == "deny" and (remote_answer["by"] == "timeout" or remote_answer["by"].startswith("a2a:"))
    [remote_outcome] = [load(p) for p in remote_root.glob("*/agents/*/outcome.json")]
    assert remote_outcome["status"] == "killed"
    validate_records(remote_root)


@needs_a2a_client
def test_a_send_to_an_a2a_node_steers_the_remote_agent_and_never_answers_its_ask(
    serve: Callable[..., Served], env: dict[str, str], session_root: Path, tmp_path: Path, mock_model: MockModel
) -> None:
    """spawn.py send ID to an a2a node: the next message of its remote task, which the server hands to the served
    agent's inbox. Sent while the remote asks (input-required), a "yes" is a message for the agent, not the answer."""
    remote_root = tmp_path / "remote-sessions"
    served = serve("--session", str(remote_root))
    target = tmp_path / "project" / "made-after-the-steer"
    steps = [{"bash": f"touch {target}"}, {"text": "made"}]
    top = start_spawn(["--agent", f"a2a:{served.url}/agents/toucher", "--task", mock_task("make", steps)], token_env(env, served))
    with ended_at_exit(top):
        local_ask = wait_for_ask(session_root, timeout=STREAM_TIMEOUT_S)
        [node] = metas(session_root).values()
        sent = run_spawn(["send", node["id"], "yes"], env)
        assert sent.returncode == 0, sent.stderr
        assert stdout_json(sent) == {"sent": True, "id": node["id"], "seq": 1, "delivery": "next message of its remote task"}
        node_dir = Path(node["session"]) / "agents" / node["id"]
        limit = time.monotonic() + STREAM_TIMEOUT_S
        while not [r for r in transcript_lines(node_dir, "A2ASteer") if r.get("sent")]:
            assert time.monotonic() < limit, transcript_lines(node_dir, "A2ASteer")
            time.sleep(0.1)
        [remote] = remote_agents(remote_root).values()
        remote_dir = Path(remote["session"]) / "agents" / remote["id"]
        [received] = transcript_lines(remote_dir, "UserSent")
        assert received["text"] == "yes" and received["by"].startswith("a2a:")
        # The ask is still the caller's: pending here and there, the file not made.
        assert not list(remote_root.glob("*/asks/q-*.answer.json")) and not list(session_root.glob("*/asks/q-*.answer.json"))
        assert not target.exists()
        answer_ask("approve", local_ask, session_root, env)
        out, err = top.communicate(timeout=STREAM_TIMEOUT_S)
    assert json.loads(out)["status"] == "done", err
    assert target.exists()
    # The remote agent's request after its tool call holds the message: it reached the model.
    said = {r["step_index"]: any(re.search(r"\byes\b", t) for t in r["later_texts"]) for r in mock_model.requests() if r["kind"] == "main"}
    assert said == {0: False, 1: True}, said
    [local_sent] = transcript_lines(node_dir, "UserSent")
    assert local_sent["from"].startswith("pid ") and local_sent["delivery"] == "next message of its remote task"
    validate_records(session_root)
    validate_records(remote_root)


@contextlib.contextmanager
def ended_at_exit(proc: subprocess.Popen[str]) -> Iterator[subprocess.Popen[str]]:
    """The test's spawn.py, killed and reaped if the test left it running."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def answer_ask(verb: str, ask: dict[str, Any], session_root: Path, env: dict[str, str]) -> None:
    """approve or deny an ask of the (one) session here, from outside its tree."""
    done = run_spawn([verb, ask["id"], "--session", str(next(session_root.iterdir()))], env)
    assert done.returncode == 0, done.stderr


def transcript_lines(agent_dir: Path, kind: str) -> list[dict[str, Any]]:
    path = agent_dir / "transcript.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return [r["message"] for r in lines if r.get("type") == kind]


def test_a_paused_subtree_is_input_required_until_its_budget_is_raised(
    serve: Callable[..., Served], env: dict[str, str], session_root: Path
) -> None:
    """Every tree the server starts pauses at its budget (SPAWN_ON_BUDGET in its environment): the caller is told why."""
    env["SPAWN_ON_BUDGET"] = "pause"  # the server's environment: the fixture starts it with this very dict
    env["SPAWN_GATEWAY"] = "0"  # the runner's own pause: the scripted usage below is not what the model sent
    served = serve("--max-budget-usd", "0.05")
    turn = {"input_tokens": 10_000, "output_tokens": 1}  # about $0.03 a turn: the second doesn't fit $0.05
    task = mock_task("spend", [{"bash": "true", "usage": turn}, {"text": "paid for", "usage": turn}])

    async def body() -> None:
        paused = await send(served, f"{served.url}/agents/worker", user_message(task))
        state, text, metadata = paused.last_status()
        assert state == "TASK_STATE_INPUT_REQUIRED", (paused.states(), served.stderr.read_text())
        agent_dir = agent_dir_of(paused, session_root)
        assert f"agent {agent_dir.name} is paused at its budget" in text and "spawn.py budget" in text
        assert metadata["spawn.paused"]["id"] == agent_dir.name and metadata["spawn.paused"]["needed_usd"] > 0
        raised = run_spawn(["budget", str(agent_dir.parent.parent), "--raise", "0.1"], env)
        assert raised.returncode == 0, raised.stderr
        done = await send(served, served.url, user_message("go on", task_id=paused.task_id, context_id=paused.context_id))
        assert done.last_status()[0] == "TASK_STATE_COMPLETED", done.states()
        assert [p.text for p in done.artifacts()[0].parts] == ["paid for"]

    run(body)
    validate_records(session_root)


def test_require_claim_refuses_missing_changed_and_replayed_claims(
    serve: Callable[..., Served], session_root: Path, tmp_path: Path
) -> None:
    """--require-claim: only a caller with a fresh claim signed by the tree's key gets an agent, and no more than it holds."""
    spawn_claims = pytest.importorskip("spawn_claims")
    key = spawn_claims.new_tree_key()
    public = tmp_path / "tree.pub"
    public.write_text(spawn_claims.public_key_text(key))
    served = serve("--require-claim", str(public), "--claim-audience", "a2a-test")
    claim = spawn_claims.Claim(
        session="s", parent="a1-000001", child="a2-000002", audience="a2a-test", depth=2, max_depth=4, deadline=None,
        budget_hold_usd=0.5, tools=("Read",), deny=(), ask=(), permission_mode="dontAsk",
    )  # fmt: skip
    text, sig = spawn_claims.sign_claim(claim, key)
    tampered = text.replace('"budget_hold_usd":0.5', '"budget_hold_usd":50.0')

    async def body() -> None:
        for metadata, why in (
            ({}, "no claim"),
            ({"spawn.claim": tampered, "spawn.claim_sig": sig}, "signature"),
        ):
            refused = await send(served, f"{served.url}/agents/greeter", user_message("hello", metadata))
            state, said, _ = refused.last_status()
            assert state == "TASK_STATE_REJECTED" and said.startswith("a2a_server: error: refused:") and why in said, said
        assert list(session_root.glob("*/agents/*")) == []
        good = {"spawn.claim": text, "spawn.claim_sig": sig}
        done = await send(served, f"{served.url}/agents/greeter", user_message(mock_task("claimed", [{"text": "hi"}]), good))
        assert done.last_status()[0] == "TASK_STATE_COMPLETED", (done.states(), served.stderr.read_text())
        limits = load(agent_dir_of(done, session_root) / "meta.json")
        assert (limits["depth"], limits["max_depth"]) == (2, 4)
        replayed = await send(served, f"{served.url}/agents/greeter", user_message("hello", good))
        state, said, _ = replayed.last_status()
        assert state == "TASK_STATE_REJECTED" and "replayed" in said, said

    run(body)


def test_a_served_agent_that_reads_the_token_file_still_can_not_call_the_server(serve: Callable[..., Served], session_root: Path) -> None:
    """Issue 45: an unsandboxed agent the server runs (it runs as the person) reads CACHE/a2a/PORT.token and calls the server
    with it, as it would to answer its own ask. The server finds the caller's process from the socket and refuses it."""
    served = serve()
    assert served.token_file is not None
    body = json.dumps(send_message_body("hi"))
    curl = (
        f'curl -s -w " http=%{{http_code}}" -X POST {served.url}/ -H "Authorization: Bearer $(cat {served.token_file})" '
        f"-H 'Content-Type: application/json' -H 'A2A-Version: 1.0' -d '{body}'"
    )
    task = mock_task("caller", [{"bash": curl}, {"text": "caller done"}])

    async def body_() -> None:
        done = await send(served, f"{served.url}/agents/worker", user_message(task))
        assert done.last_status()[0] == "TASK_STATE_COMPLETED", (done.states(), served.stderr.read_text())
        text = (agent_dir_of(done, session_root) / "transcript.jsonl").read_text()
        assert "http=403" in text and "runs in a tree this server serves" in text, text[-3000:]

    run(body_)
