"""The a2a kind: spawn.py as an A2A client, against a small scripted A2A server.

The server below speaks A2A 1.0's JSON-RPC binding on loopback (agent card,
SendMessage, SendStreamingMessage over SSE, GetTask, CancelTask) with the
standard library only, so each test scripts exactly which task states the
remote goes through. spawn.py's side is the real a2a-sdk client.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    agent_dirs,
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
    write_agent,
)

import spawn

# What the remote does, by the first word of the first message's text.
# Each list is the states the task goes through after `submitted`; "ask" and
# "auth" stop at input-required/auth-required and finish on the next message.
SCRIPTS: dict[str, list[str]] = {
    "complete": ["working", "artifact:the answer", "completed"],
    "data": ["working", 'data:{"summary": "ok", "count": 2}', "completed"],
    "fail": ["working", "failed:remote broke"],
    "reject": ["rejected:not my kind of task"],
    "cancel": ["working", "canceled:operator stopped it"],
    "weird": ["working", "state:42"],
    "ask": ["working", "input-required:which color?"],
    "auth": ["auth-required:log in at https://auth.example first"],
    "hang": ["working"],
    "costly": ["working", "artifact:paid", "completed:cost=0.125"],
    "bogus": ["working", "state:bogus"],  # a state name A2A doesn't have: the client reads it as unspecified
    "flood": ["flood"],  # endless 100 KB status updates, streamed (a hostile peer)
}
FLOOD_TEXT = "x" * 100_000
# "reply" is answered with a message, no task.


@dataclass
class RemoteTask:
    id: str
    context_id: str
    steps: list[str]
    state: str = "submitted"
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    message: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    canceled: threading.Event = field(default_factory=threading.Event)


def status_json(task: RemoteTask) -> dict[str, Any]:
    state = task.state if task.state.isdigit() else "TASK_STATE_" + task.state.upper().replace("-", "_")
    status: dict[str, Any] = {"state": int(state) if state.isdigit() else state}
    if task.message:
        status["message"] = {"messageId": uuid.uuid4().hex, "role": "ROLE_AGENT", "parts": [{"text": task.message}]}
    return status


def task_json(task: RemoteTask) -> dict[str, Any]:
    out: dict[str, Any] = {"id": task.id, "contextId": task.context_id, "status": status_json(task), "artifacts": task.artifacts}
    if task.metadata:
        out["metadata"] = task.metadata
    return out


class ScriptedA2A:
    """The scripted remote: its card, its tasks, and what it was sent."""

    def __init__(self, *, streaming: bool, card: dict[str, Any] | None = None) -> None:
        self.streaming = streaming
        self.tasks: dict[str, RemoteTask] = {}
        self.messages: list[dict[str, Any]] = []
        self.cancels: list[str] = []
        self.polls = 0
        self.authorizations: list[str | None] = []
        """The Authorization header of each request (None: none sent)."""
        self.trickle = False
        """Serve the card one byte a second (a hostile peer)."""
        self.stop = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self.handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.card = card if card is not None else self.default_card()
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def default_card(self) -> dict[str, Any]:
        return {
            "name": "scripted",
            "description": "a scripted A2A agent for tests",
            "version": "1.0.0",
            "supportedInterfaces": [{"url": self.url + "/rpc", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}],
            "capabilities": {"streaming": self.streaming},
            "defaultInputModes": ["text/plain"],
            "defaultOutputModes": ["text/plain"],
            "skills": [{"id": "any", "name": "any", "description": "anything", "tags": ["test"]}],
        }

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()

    # -- the script --

    def advance(self, task: RemoteTask) -> list[dict[str, Any]]:
        """Take the task's next step; the stream events it makes."""
        if task.canceled.is_set() or not task.steps:
            return []
        step = task.steps.pop(0)
        kind, _, arg = step.partition(":")
        if kind in {"artifact", "data"}:
            part: dict[str, Any] = {"text": arg} if kind == "artifact" else {"data": json.loads(arg)}
            artifact = {"artifactId": f"art-{len(task.artifacts)}", "parts": [part]}
            task.artifacts.append(artifact)
            return [{"artifactUpdate": {"taskId": task.id, "contextId": task.context_id, "artifact": artifact}}]
        if kind == "state":
            task.state, task.message = arg, ""
        elif kind == "completed" and arg.startswith("cost="):
            task.state, task.message = "completed", ""
            task.metadata["spawn.cost_usd"] = float(arg.removeprefix("cost="))
        else:
            task.state, task.message = kind, arg
        update: dict[str, Any] = {"taskId": task.id, "contextId": task.context_id, "status": status_json(task)}
        if task.metadata:
            update["metadata"] = task.metadata
        return [{"statusUpdate": update}]

    def receive(self, params: dict[str, Any]) -> RemoteTask:
        message = params["message"]
        self.messages.append(message)
        text = " ".join(p.get("text", "") for p in message.get("parts", []))
        if message.get("taskId") in self.tasks:  # the answer to input-required / auth-required
            task = self.tasks[message["taskId"]]
            task.steps = ["working", f"artifact:you said: {text}", "completed"]
            task.state, task.message = "working", ""
            return task
        task = RemoteTask(uuid.uuid4().hex, uuid.uuid4().hex, list(SCRIPTS.get(text.split(" ")[0], ["completed"])))
        self.tasks[task.id] = task
        return task

    def handler(self) -> type[BaseHTTPRequestHandler]:
        remote = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # a stream ends when the connection closes

            def log_message(self, *_args: Any) -> None:
                return

            def reply(self, code: int, body: Any, content_type: str = "application/json") -> None:
                data = json.dumps(body).encode() if not isinstance(body, bytes) else body
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                remote.authorizations.append(self.headers.get("Authorization"))
                if self.path == "/.well-known/agent-card.json" and remote.trickle:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    for byte in json.dumps(remote.card).encode() * 1000:
                        if remote.stop.wait(1):
                            return
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                elif self.path == "/.well-known/agent-card.json":
                    self.reply(200, remote.card)
                elif self.path == "/html/.well-known/agent-card.json":
                    self.reply(200, b"<html>not a card</html>", "text/html")
                else:
                    self.reply(404, {"error": "not found"})

            def do_POST(self) -> None:
                remote.authorizations.append(self.headers.get("Authorization"))
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                method, params, rid = request["method"], request.get("params") or {}, request.get("id")
                if method.startswith("Send") and params["message"]["parts"][0].get("text", "").startswith("reply"):
                    remote.messages.append(params["message"])
                    message = {"messageId": uuid.uuid4().hex, "role": "ROLE_AGENT", "parts": [{"text": "a direct reply"}]}
                    self.reply(200, {"jsonrpc": "2.0", "id": rid, "result": {"message": message}})
                    return
                if method == "SendStreamingMessage":
                    self.stream(remote.receive(params), rid)
                    return
                if method == "SendMessage":
                    result: Any = {"task": task_json(remote.receive(params))}
                elif method == "GetTask":
                    remote.polls += 1
                    task = remote.tasks[params["id"]]
                    remote.advance(task)
                    result = task_json(task)
                elif method == "CancelTask":
                    task = remote.tasks[params["id"]]
                    remote.cancels.append(task.id)
                    task.canceled.set()
                    task.state, task.message = "canceled", "canceled by the client"
                    result = task_json(task)
                else:
                    self.reply(200, {"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "method not found"}})
                    return
                self.reply(200, {"jsonrpc": "2.0", "id": rid, "result": result})

            def stream(self, task: RemoteTask, rid: Any) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()

                def send(event: dict[str, Any]) -> None:
                    self.wfile.write(f"data: {json.dumps({'jsonrpc': '2.0', 'id': rid, 'result': event})}\n\n".encode())
                    self.wfile.flush()

                send({"task": task_json(task)})
                if task.steps == ["flood"]:
                    task.state, task.message = "working", FLOOD_TEXT
                    update = {"statusUpdate": {"taskId": task.id, "contextId": task.context_id, "status": status_json(task)}}
                    try:
                        while not task.canceled.is_set() and not remote.stop.is_set():
                            send(update)
                    except OSError:  # the client hung up
                        return
                while task.steps and not task.canceled.is_set():
                    for event in remote.advance(task):
                        send(event)
                # A task left working hangs until it is canceled (or the test ends).
                while task.state in ("submitted", "working") and not remote.stop.is_set():
                    if task.canceled.wait(0.05):
                        send({"statusUpdate": {"taskId": task.id, "contextId": task.context_id, "status": status_json(task)}})
                        break

        return Handler


@pytest.fixture(params=[True, False], ids=["streaming", "polling"])
def remote(request: pytest.FixtureRequest) -> Iterator[ScriptedA2A]:
    server = ScriptedA2A(streaming=bool(request.param))
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def streaming_remote() -> Iterator[ScriptedA2A]:
    server = ScriptedA2A(streaming=True)
    try:
        yield server
    finally:
        server.close()


def a2a(server: ScriptedA2A) -> str:
    return f"a2a:{server.url}"


def only_agent(session_root: Path) -> Path:
    dirs = agent_dirs(session_root)
    assert len(dirs) == 1, dirs
    return dirs[0]


def transcript(agent_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (agent_dir / "transcript.jsonl").read_text().splitlines()]


def wait_until(condition: Any, what: str, timeout: float = 60) -> None:
    limit = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < limit, f"{what} never happened"
        time.sleep(0.05)


# ---- state mappings ----


def test_completed_is_done_with_the_artifacts_text(remote: ScriptedA2A, base_env: dict[str, str], session_root: Path) -> None:
    proc = run_spawn(["--agent", a2a(remote), "--task", "complete the job"], base_env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    out = stdout_json(proc)
    assert (out["status"], out["output"]) == ("done", "the answer")
    assert "cost_usd" not in out  # not reported: unknown, never 0
    agent_dir = only_agent(session_root)
    meta = load(agent_dir / "meta.json")
    assert meta["kind"] == "a2a" and meta["endpoint"] == remote.url + "/.well-known/agent-card.json"
    types = [line["type"] for line in transcript(agent_dir)]
    assert types[:2] == ["A2ACard", "A2ASend"]
    assert ("A2AEvent" in types) if remote.streaming else ("A2ATask" in types and remote.polls > 0)
    validate_records(session_root)


def test_data_artifacts_are_structured_output_checked_by_the_schema(
    remote: ScriptedA2A, base_env: dict[str, str], session_root: Path
) -> None:
    schema = '{"type": "object", "required": ["summary", "count"], "properties": {"count": {"type": "integer"}}}'
    proc = run_spawn(["--agent", a2a(remote), "--task", "data please", "--schema", schema], base_env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert stdout_json(proc)["output"] == {"summary": "ok", "count": 2}
    bad = run_spawn(["--agent", a2a(remote), "--task", "data please", "--schema", '{"type": "string"}'], base_env)
    assert bad.returncode == spawn.ExitCode.AGENT_FAILED
    assert "does not match the schema" in stdout_json(bad)["reason"]


@pytest.mark.parametrize(
    ("task", "expected"),
    [
        ("fail now", (spawn.ExitCode.AGENT_FAILED, "failed", "failed: remote broke")),
        ("reject this", (spawn.ExitCode.AGENT_FAILED, "failed", "rejected: not my kind of task")),
        ("cancel it", (spawn.ExitCode.KILLED, "killed", "canceled the task: operator stopped it")),
        ("weird state", (spawn.ExitCode.AGENT_FAILED, "failed", "doesn't know: '42'")),
        ("bogus state", (spawn.ExitCode.AGENT_FAILED, "failed", "doesn't know: 'unspecified'")),
        ("reply directly", (spawn.ExitCode.OK, "done", "completed")),
    ],
)
def test_remote_states_map_to_outcomes(
    task: str, expected: tuple[int, str, str], remote: ScriptedA2A, base_env: dict[str, str], session_root: Path
) -> None:
    code, status, fragment = expected
    proc = run_spawn(["--agent", a2a(remote), "--task", task], base_env)
    assert proc.returncode == code, proc.stderr
    out = stdout_json(proc)
    assert out["status"] == status and fragment in out["reason"], out
    assert (only_agent(session_root) / (".done" if status == "done" else ".fail")).exists()
    validate_records(session_root)


def test_reported_cost_is_recorded(streaming_remote: ScriptedA2A, base_env: dict[str, str], session_root: Path) -> None:
    proc = run_spawn(["--agent", a2a(streaming_remote), "--task", "costly work"], base_env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert stdout_json(proc)["cost_usd"] == 0.125


@pytest.mark.parametrize(("task", "reply"), [("ask me", "blue"), ("auth me", None)])
def test_input_required_is_an_ask_whose_answer_is_the_next_message(
    task: str, reply: str | None, remote: ScriptedA2A, base_env: dict[str, str], session_root: Path
) -> None:
    proc = start_spawn(["--agent", a2a(remote), "--task", task], base_env)
    try:
        ask = wait_for_ask(session_root)
        assert ask["tool"].startswith("A2A:") and ask["agent_id"] == only_agent(session_root).name
        answer = run_spawn(["approve", ask["id"], *(["--text", reply] if reply else [])], base_env)
        assert answer.returncode == spawn.ExitCode.OK, answer.stderr
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == spawn.ExitCode.OK, err
    assert json.loads(out)["output"] == f"you said: {reply or 'approved'}"
    second = remote.messages[-1]
    assert second["taskId"] == next(iter(remote.tasks)) and second["parts"] == [{"text": reply or "approved"}]
    types = [line["type"] for line in transcript(only_agent(session_root))]
    assert "A2AAsk" in types and "A2AAnswer" in types and types.count("A2ASend") == 2
    validate_records(session_root)


def test_a_denied_ask_cancels_the_remote_task_and_refuses(
    streaming_remote: ScriptedA2A, base_env: dict[str, str], session_root: Path
) -> None:
    proc = start_spawn(["--agent", a2a(streaming_remote), "--task", "ask me"], base_env)
    try:
        ask = wait_for_ask(session_root)
        assert run_spawn(["deny", ask["id"]], base_env).returncode == spawn.ExitCode.OK
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == spawn.ExitCode.REFUSED, err
    assert ask["id"] in json.loads(out)["reason"]
    assert streaming_remote.cancels == list(streaming_remote.tasks)


def test_an_unanswered_ask_at_the_deadline_cancels_the_remote_task(
    streaming_remote: ScriptedA2A, base_env: dict[str, str], session_root: Path
) -> None:
    # 10 s: the remote's ask must come before the deadline even on a loaded machine.
    proc = run_spawn(["--agent", a2a(streaming_remote), "--task", "ask me", "--timeout", "10"], base_env)
    assert proc.returncode == spawn.ExitCode.TIMEOUT, proc.stderr
    assert streaming_remote.cancels == list(streaming_remote.tasks)
    answers = list(session_root.glob("*/asks/q-*.answer.json"))
    assert [load(a)["by"] for a in answers] == ["timeout"]  # never left pending


# ---- cancel on kill and timeout ----


def test_kill_cancels_the_remote_task(remote: ScriptedA2A, base_env: dict[str, str], session_root: Path) -> None:
    launched = run_spawn(["--agent", a2a(remote), "--task", "hang around", "--background"], base_env)
    assert launched.returncode == spawn.ExitCode.OK, launched.stderr
    info = stdout_json(launched)
    wait_until(lambda: bool(remote.tasks), "the remote task")
    status = run_spawn(["status", "--json"], base_env)
    assert status.returncode == spawn.ExitCode.OK and info["id"] in status.stdout
    assert run_spawn(["kill", info["id"]], base_env).returncode == spawn.ExitCode.OK
    waited = run_spawn(["wait", info["id"]], base_env)
    assert [a["status"] for a in stdout_json(waited)["agents"]] == ["killed"]
    assert remote.cancels == list(remote.tasks)
    cancel = [line["message"] for line in transcript(Path(info["agent_dir"])) if line["type"] == "A2ACancel"]
    assert cancel and cancel[0]["sent"] is True and cancel[0]["state"] == "canceled"
    validate_records(session_root)


def test_the_deadline_cancels_the_remote_task(streaming_remote: ScriptedA2A, base_env: dict[str, str], session_root: Path) -> None:
    proc = run_spawn(["--agent", a2a(streaming_remote), "--task", "hang around", "--timeout", "3"], base_env)
    assert proc.returncode == spawn.ExitCode.TIMEOUT, proc.stderr
    assert stdout_json(proc)["status"] == "timeout"
    assert streaming_remote.cancels == list(streaming_remote.tasks)


# ---- a hostile peer ----


def test_a_card_trickled_one_byte_a_second_ends_at_the_deadline(
    streaming_remote: ScriptedA2A, base_env: dict[str, str], session_root: Path
) -> None:
    """Issue 31: a card served at 1 byte/s held a spawn with --timeout 20 past 120 s."""
    streaming_remote.trickle = True
    started = time.monotonic()
    proc = run_spawn(["--agent", a2a(streaming_remote), "--task", "complete the job", "--timeout", "3"], base_env)
    assert time.monotonic() - started < 30  # the 3 s deadline, its grace and start-up; never the card's length
    assert proc.returncode == spawn.ExitCode.TIMEOUT, proc.stderr
    assert stdout_json(proc)["status"] == "timeout"
    assert load(only_agent(session_root) / "outcome.json")["status"] == "timeout"
    validate_records(session_root)


def test_a_flood_of_status_updates_stops_at_the_transcript_cap(
    streaming_remote: ScriptedA2A, base_env: dict[str, str], session_root: Path
) -> None:
    """Issue 31: endless 100 KB status updates wrote a 379 MB transcript in 20 s."""
    cap = 1_000_000
    env = {**base_env, "SPAWN_TRANSCRIPT_MAX_BYTES": str(cap)}
    proc = run_spawn(["--agent", a2a(streaming_remote), "--task", "flood the client", "--timeout", "60"], env)
    assert proc.returncode == spawn.ExitCode.AGENT_FAILED, proc.stderr
    outcome = load(only_agent(session_root) / "outcome.json")
    assert outcome["status"] == "failed" and "SPAWN_TRANSCRIPT_MAX_BYTES" in outcome["reason"], outcome
    assert outcome["truncated"] == ["transcript.jsonl"]
    path = only_agent(session_root) / "transcript.jsonl"
    lines = transcript(only_agent(session_root))
    assert lines[-1]["type"] == "TranscriptTruncated" and lines[-1]["message"]["max_bytes"] == cap
    assert path.stat().st_size <= cap + len(path.read_bytes().splitlines()[-1]) + 1  # the cap, plus its one last line
    wait_until(lambda: streaming_remote.cancels == list(streaming_remote.tasks), "the remote task's cancel")
    validate_records(session_root)


def test_the_token_file_is_sent_and_kept_out_of_records(
    streaming_remote: ScriptedA2A, base_env: dict[str, str], session_root: Path
) -> None:
    token = "tok-" + uuid.uuid4().hex
    token_file = session_root.parent / "a2a.token"
    token_file.write_text(token + "\n")
    env = {**base_env, "SPAWN_A2A_TOKEN_FILE": str(token_file)}
    proc = run_spawn(["--agent", a2a(streaming_remote), "--task", "complete the job"], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    # The run's card fetch and message (the resolve-time check reads the public card without it).
    assert streaming_remote.authorizations[-2:] == [f"Bearer {token}"] * 2
    assert token not in proc.stdout + proc.stderr
    for record in only_agent(session_root).iterdir():
        assert token not in record.read_text(errors="replace"), record
    missing = run_spawn(["--agent", a2a(streaming_remote), "--task", "x"], {**env, "SPAWN_A2A_TOKEN_FILE": str(token_file) + ".nope"})
    assert missing.returncode == spawn.ExitCode.USAGE and "SPAWN_A2A_TOKEN_FILE" in missing.stderr


# ---- what crosses the hop ----


def test_depth_deadline_budget_and_trace_travel_in_metadata(streaming_remote: ScriptedA2A, env: dict[str, str], session_root: Path) -> None:
    child = spawn_in_bash("--agent", a2a(streaming_remote), "--task", "complete the job")
    proc = run_spawn(
        ["--task", mock_task("delegate", [{"bash": child}, {"text": "delegated"}]), "--tools", "Bash", "--max-budget-usd", "2"], env
    )
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    by_depth = {m["depth"]: m for m in metas(session_root).values()}
    node = by_depth[1]
    assert (node["kind"], node["parent_id"]) == ("a2a", by_depth[0]["id"])
    metadata = streaming_remote.messages[0]["metadata"]
    assert metadata["spawn.depth"] == 1 and metadata["spawn.max_depth"] == node["max_depth"]
    assert metadata["spawn.traceparent"] == node["traceparent"]
    assert metadata["spawn.traceparent"].split("-")[1] == by_depth[0]["trace_id"]
    assert metadata["spawn.deadline"] == pytest.approx(node["deadline"]) and metadata["spawn.deadline"] <= by_depth[0]["deadline"]
    assert 0 < metadata["spawn.max_budget_usd"] <= 2
    validate_records(session_root)


# ---- bad input ----


def assert_usage_error(proc: Any, session_root: Path, fragment: str) -> None:
    assert proc.returncode == spawn.ExitCode.USAGE, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("spawn: error: ") and fragment in lines[0], lines
    assert proc.stdout == "" and not (session_root.exists() and any(session_root.rglob("*")))


def test_unreachable_host_is_exit_2_with_nothing_written(base_env: dict[str, str], session_root: Path) -> None:
    closed = ScriptedA2A(streaming=True)
    closed.close()  # a port nobody listens on
    assert_usage_error(run_spawn(["--agent", a2a(closed), "--task", "x"], base_env), session_root, "can't reach the A2A agent")


def test_non_a2a_urls_and_invalid_cards_are_exit_2(streaming_remote: ScriptedA2A, base_env: dict[str, str], session_root: Path) -> None:
    assert_usage_error(run_spawn(["--agent", f"a2a:{streaming_remote.url}/elsewhere", "--task", "x"], base_env), session_root, "HTTP 404")
    assert_usage_error(run_spawn(["--agent", f"a2a:{streaming_remote.url}/html", "--task", "x"], base_env), session_root, "not JSON")
    streaming_remote.card = {"name": "no interfaces"}
    assert_usage_error(run_spawn(["--agent", a2a(streaming_remote), "--task", "x"], base_env), session_root, "lists no interface")
    streaming_remote.card = {"name": "grpc only", "supportedInterfaces": [{"url": "x:1", "protocolBinding": "GRPC"}]}
    assert_usage_error(run_spawn(["--agent", a2a(streaming_remote), "--task", "x"], base_env), session_root, "speaks JSONRPC")


def test_a_remote_that_goes_away_is_a_fail_at_run_time(streaming_remote: ScriptedA2A, base_env: dict[str, str], session_root: Path) -> None:
    # The card is served, but the interface it names is a closed port.
    closed = ScriptedA2A(streaming=True)
    closed.close()
    streaming_remote.card["supportedInterfaces"][0]["url"] = closed.url + "/rpc"
    proc = run_spawn(["--agent", a2a(streaming_remote), "--task", "complete"], base_env)
    assert proc.returncode == spawn.ExitCode.AGENT_FAILED, proc.stderr
    out = stdout_json(proc)
    assert out["status"] == "failed" and out["reason"].startswith("A2A: ")
    validate_records(session_root)


def test_dry_run_resolves_the_card_and_shows_the_kind(streaming_remote: ScriptedA2A, base_env: dict[str, str], session_root: Path) -> None:
    proc = run_spawn(["--agent", a2a(streaming_remote), "--task", "x", "--dry-run"], base_env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert stdout_json(proc)["kind"] == "a2a" and not session_root.exists()


def test_a_definition_can_name_a_remote_agent(
    streaming_remote: ScriptedA2A, base_env: dict[str, str], session_root: Path, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    write_agent(project, "far", f"description: a remote agent\nkind: a2a\nurl: {streaming_remote.url}")
    proc = run_spawn(["--agent", "far", "--task", "complete it"], base_env, cwd=project)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert load(only_agent(session_root) / "meta.json")["agent"] == "far"
    wait_for_path(only_agent(session_root) / ".done")


def test_killing_a_claude_root_cancels_its_a2a_childs_remote_task(
    streaming_remote: ScriptedA2A, env: dict[str, str], session_root: Path
) -> None:
    child = spawn_in_bash("--agent", a2a(streaming_remote), "--task", "hang around")
    root = start_spawn(["--task", mock_task("delegate", [{"bash": child}, {"text": "never"}]), "--tools", "Bash"], env)
    try:
        wait_until(lambda: bool(streaming_remote.tasks), "the remote task", timeout=120)
        root_id = next(m["id"] for m in metas(session_root).values() if m["depth"] == 0)
        assert run_spawn(["kill", root_id], env).returncode == spawn.ExitCode.OK
        root.communicate(timeout=120)
    finally:
        root.kill()
    assert root.returncode == spawn.ExitCode.KILLED
    assert streaming_remote.cancels == list(streaming_remote.tasks)
    statuses = {m["kind"]: load(Path(m["session"]) / "agents" / m["id"] / "outcome.json")["status"] for m in metas(session_root).values()}
    assert statuses == {"claude": "killed", "a2a": "killed"}
    validate_records(session_root)
