"""The node-kind seam: Executor, one class per kind of agent (claude, a2a, command)."""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import json
import os
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from .. import __version__
from ..core.constants import ENV_LOG_MAX, KILL_GRACE_S, PROTOCOL_VERSION, STDERR_LOG, TRANSCRIPT
from ..core.errors import ExitCode, UsageError
from ..core.output import note
from ..core.pure import is_finite, parse_json, redact, utc_now_iso, validate_output
from ..core.records import EXIT_FOR_STATUS, AgentMeta, Outcome, Status
from ..policy.admission import start_slot_count, start_slot_now
from ..policy.agents import Node, NodeReferenceError, NodeResult, command_argv, parse_reference
from ..policy.channel import open_ask
from ..policy.steering import close_steering, open_steering
from ..session.protocol import AGENTS_DIR, append_log_line, append_transcript, read_limits, with_estimated_cost
from ..supervise.supervisor import Supervised
from .claude import StartedCli, cli_start, describe_sdk_error, outcome_from_run, run_sdk, start_cli
from .running import EarlyStop, RunState, SdkLoader, child_environment

if TYPE_CHECKING:
    import asyncio  # annotations only
    import socket


# ---------------------------------------------------------------- executors --
# The seam between a node of the tree and what runs it. A reference (an
# --agent value, or a definition's `kind:`) resolves to a Node; the Executor
# of its kind checks it at resolve time and runs it. Everything else about a
# node (meta, admission, deadline, signals, kill, guard, cgroup, the one
# outcome) is run_agent's and the same for every kind. A new kind is one
# Executor subclass in this section and its name in EXECUTORS. The kinds'
# constants live here too, so that adding one touches this section only.

# A card that takes longer than this to fetch counts as unreachable; a live
# agent serves it in milliseconds, and a dead host should fail the spawn fast.
A2A_CARD_TIMEOUT_S = 15.0
# The bearer token a2a nodes send to the agent they call (tools/a2a_server.py
# requires one): the path of a file holding it, so the token itself stays out
# of argv, meta.json and the transcript.
ENV_A2A_TOKEN_FILE = "SPAWN_A2A_TOKEN_FILE"
# Without streaming, the remote task is polled this often: a short remote
# task waits little, and the remote sees at most two requests a second.
A2A_POLL_S = 0.5
# The A2A transports this client speaks (gRPC would need a2a-sdk's grpc extra).
A2A_BINDINGS = ("JSONRPC", "HTTP+JSON")
# Message metadata that carries a tree's limits and trace across an A2A hop
# (sessions/README.md, "Node kinds"); tools/a2a_server.py reads the same keys.
A2A_META_DEPTH = "spawn.depth"
A2A_META_MAX_DEPTH = "spawn.max_depth"
A2A_META_DEADLINE = "spawn.deadline"
A2A_META_BUDGET = "spawn.max_budget_usd"
A2A_META_TRACEPARENT = "spawn.traceparent"
A2A_META_COST = "spawn.cost_usd"
# A message `spawn.py send` gave an a2a node, sent on to its remote task: a steer,
# never an answer (tools/a2a_server.py hands it to the served agent's inbox).
A2A_META_STEER = "spawn.steer"
A2A_META_SENT_BY = "spawn.sent_by"
# Remote task states (A2A's TaskState without its TASK_STATE_ prefix) and what
# they end as; input-required and auth-required become asks; submitted and
# working mean "not yet"; anything else is unknown and fails the node.
A2A_FINAL_STATES: dict[str, Status] = {
    "completed": Status.DONE,
    "failed": Status.FAILED,
    "rejected": Status.FAILED,
    "canceled": Status.KILLED,
}
A2A_ASK_STATES = ("input-required", "auth-required")
A2A_RUNNING_STATES = ("submitted", "working")
# A command's stdout is one JSON result: bounded, so a runaway command can't
# fill spawn.py's memory. 16 MiB is far above any result a parent reads.
COMMAND_RESULT_LIMIT = 16 * 1024 * 1024


class Executor:
    """Runs one kind of node inside run_agent's supervision."""

    kind = ""

    def check(self, node: Node, deadline: float | None, environ: Mapping[str, str]) -> None:
        """At resolve time: UsageError (exit 2, nothing written) when the node can't be run.

        It returns by the spawn's deadline (Unix seconds) whatever a remote does:
        a check that runs out of time leaves the rest to the run, which records the timeout.
        """

    def start(self, meta: AgentMeta, agent_dir: Path, cli: Path, state: RunState, secrets_: Sequence[str]) -> None:
        """Before run's event loop (and the SDK's import): start what may start at once. Best effort: run starts the rest."""

    async def run(
        self, meta: AgentMeta, agent_dir: Path, cli: Path, state: RunState, secrets_: Sequence[str], *, sdk_loader: SdkLoader | None
    ) -> None:
        """Run the task; leave what came back in state (a claude run: state.result; others: state.node_result)."""
        raise NotImplementedError

    def describe_error(self, exc: Exception, agent_dir: Path) -> str:
        """The reason of a failed outcome for an exception run raised."""
        return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"[:2000]

    def outcome(self, meta: AgentMeta, agent_dir: Path, state: RunState, started: float, error: str | None) -> Outcome:
        return node_outcome(meta, state, started, error)


class ClaudeExecutor(Executor):
    """Today's path: the claude CLI through the SDK (run_sdk)."""

    kind = "claude"

    def __init__(self) -> None:
        self.started: StartedCli | None = None

    def start(self, meta: AgentMeta, agent_dir: Path, cli: Path, state: RunState, secrets_: Sequence[str]) -> None:
        """Start the CLI while the SDK is still being imported, if nothing makes it wait.

        A --max-concurrent slot or a start slot to wait for, or a stop
        already asked for, leave it to run_sdk, whose loop can serve a stop
        meanwhile; so does anything that fails here, which run_sdk then
        meets again and reports.
        """
        if EarlyStop.pending is not None or read_limits(Path(meta.session)).max_concurrent is not None:
            return
        try:
            plan = cli_start(meta, agent_dir, cli, state, secrets_)
        except Exception:
            return
        free, slot = start_slot_now(Path(meta.session), start_slot_count(state.settings))
        if free:
            with contextlib.suppress(OSError):
                self.started = start_cli(plan, state, slot)

    async def run(
        self, meta: AgentMeta, agent_dir: Path, cli: Path, state: RunState, secrets_: Sequence[str], *, sdk_loader: SdkLoader | None
    ) -> None:
        await open_steering(meta, agent_dir, state, secrets_)  # spawn.py send's inbox; --on-budget pause
        try:
            await run_sdk(meta, agent_dir, cli, state, secrets_, sdk_loader=sdk_loader, started=self.started)
        finally:
            close_steering(state)

    def describe_error(self, exc: Exception, agent_dir: Path) -> str:
        return describe_sdk_error(exc, agent_dir / STDERR_LOG)

    def outcome(self, meta: AgentMeta, agent_dir: Path, state: RunState, started: float, error: str | None) -> Outcome:
        # The CLI's usage prices a run it gave no total for; other kinds have no turns to price.
        outcome = with_estimated_cost(outcome_from_run(meta, state, started, error), agent_dir, meta.model)
        if state.in_process is not None:
            state.in_process.host_share(outcome)  # its CLI's total holds its in-process children's turns too
        return outcome


def node_outcome(meta: AgentMeta, state: RunState, started: float, error: str | None) -> Outcome:
    """The outcome of a node of another kind than claude (pure).

    As for a claude agent: a stop (kill, deadline, signal) wins; a failure
    after one of the node's own asks was answered no is `refused`; the output
    is validated against the schema (a JSON text is parsed first).
    """
    result = state.node_result
    base: dict[str, Any] = {
        "id": meta.id,
        "ended_at": utc_now_iso(),
        "duration_s": round(time.time() - started, 3),
        "text": result.text if result else None,
        "cost_usd": result.cost_usd if result else None,
        "transcript": str(Path(meta.session) / AGENTS_DIR / meta.id / TRANSCRIPT),
    }
    if state.stop_reason is not None:
        return Outcome(status=state.stop_reason, reason=state.stop_detail, exit_code=EXIT_FOR_STATUS[state.stop_reason], **base)
    if error is None and result is None:
        error = f"the {meta.kind} node ended without a result"
    if error is not None or (result is not None and result.status != Status.DONE):
        status, reason = (Status.FAILED, error or "") if error is not None or result is None else (result.status, result.reason)
        if status == Status.FAILED and state.denied_asks:
            status, reason = Status.REFUSED, f"{state.denied_asks[-1]}, and the node ended without a result ({reason})"
        return Outcome(status=status, reason=reason[:2000], exit_code=EXIT_FOR_STATUS[status], **base)
    assert result is not None
    output = result.output
    if meta.schema is not None:
        if isinstance(output, str):
            with contextlib.suppress(ValueError):
                output = parse_json(output)
        errors = validate_output(meta.schema, output)
        if errors:
            reason = f"output does not match the schema ({len(errors)} error(s))"
            return Outcome(
                status=Status.FAILED, reason=reason, exit_code=ExitCode.AGENT_FAILED, output=output, validation_errors=errors, **base
            )
    return Outcome(status=Status.DONE, reason=result.reason or "completed", exit_code=ExitCode.OK, output=output, **base)


def node_line(agent_dir: Path, kind: str, message: Mapping[str, Any], secrets_: Sequence[str]) -> bool:
    """One transcript line of a node of another kind: {time, type, message}; False once the transcript is truncated."""
    return append_transcript(agent_dir / TRANSCRIPT, {"time": utc_now_iso(), "type": kind, "message": dict(message)}, secrets_)


class CommandExecutor(Executor):
    """An executable: one JSON task on stdin, one JSON result on stdout (sessions/README.md)."""

    kind = "command"

    def check(self, node: Node, deadline: float | None, environ: Mapping[str, str]) -> None:
        import shutil

        argv = command_argv(node.endpoint or "", f"command:{node.endpoint}")
        found = argv[0] if "/" in argv[0] else shutil.which(argv[0])
        if found is None or not Path(found).is_file() or not os.access(found, os.X_OK):
            raise NodeReferenceError(
                f"command:{node.endpoint}", f"{argv[0]} is not an executable file; give its path, e.g. command:/path/to/exe"
            )

    async def run(
        self, meta: AgentMeta, agent_dir: Path, cli: Path, state: RunState, secrets_: Sequence[str], *, sdk_loader: SdkLoader | None
    ) -> None:
        import asyncio

        argv = command_argv(meta.endpoint or "", f"command:{meta.endpoint}")
        # Its own session and group: the stop path ends the group, never spawn.py.
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=meta.cwd,
            env={**state.settings, **child_environment(meta, agent_dir, state.settings)},
            start_new_session=True,
            limit=COMMAND_RESULT_LIMIT,
        )
        state.started_cli(proc.pid)
        node_line(agent_dir, "CommandStart", {"argv": argv, "pid": proc.pid}, secrets_)
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        stderr_tail: list[str] = []

        async def pump_stderr(stream: asyncio.StreamReader) -> None:
            async for raw in stream:
                line = redact(raw.decode(errors="replace").rstrip("\n"), secrets_)
                if line.strip():
                    del stderr_tail[:-2]
                    stderr_tail.append(line)
                state.last_activity = time.time()
                append_log_line(agent_dir / STDERR_LOG, line)

        async def feed(stdin: asyncio.StreamWriter) -> None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # a command may not read its task
                stdin.write(json.dumps(command_task(meta, agent_dir)).encode() + b"\n")
                await stdin.drain()
            stdin.close()

        _, out, _ = await asyncio.gather(feed(proc.stdin), proc.stdout.read(COMMAND_RESULT_LIMIT + 1), pump_stderr(proc.stderr))
        if len(out) > COMMAND_RESULT_LIMIT:
            Supervised.signal_group(proc.pid, signal.SIGKILL)  # it would block on a pipe nobody reads
        code = await proc.wait()
        result = command_result(out, code, stderr_tail)
        node_line(agent_dir, "CommandResult", {"exit_code": code, "status": result.status.value, "reason": result.reason}, secrets_)
        state.node_result = result


def command_task(meta: AgentMeta, agent_dir: Path) -> dict[str, Any]:
    """The JSON a command node reads on stdin (sessions/README.md, "Node kinds")."""
    task: dict[str, Any] = {
        "task": meta.task,
        "schema": meta.schema,
        "depth": meta.depth,
        "max_depth": meta.max_depth,
        "deadline": meta.deadline,
        "max_budget_usd": meta.max_budget_usd,
        "session": meta.session,
        "agent_id": meta.id,
        "parent_id": meta.parent_id,
        "agent_dir": str(agent_dir),
        "cwd": meta.cwd,
        "traceparent": meta.traceparent,
        "protocol": PROTOCOL_VERSION,
    }
    return task


def command_result(out: bytes, code: int, stderr_tail: Sequence[str]) -> NodeResult:
    """What a command's exit status and stdout say (pure)."""
    said = f"; stderr: {' | '.join(stderr_tail)}" if stderr_tail else ""
    if len(out) > COMMAND_RESULT_LIMIT:  # checked first: spawn.py ended such a command itself
        return NodeResult(Status.FAILED, f"the command's result is over {COMMAND_RESULT_LIMIT} bytes")
    if code < 0:
        name = next((sig.name for sig in signal.Signals if sig == -code), f"signal {-code}")
        return NodeResult(Status.KILLED, f"the command was ended by {name}")
    try:
        result = parse_json(out)
    except ValueError:
        result = None
    error = result.get("error") if isinstance(result, dict) else None
    cost = result.get("cost_usd") if isinstance(result, dict) else None
    cost = float(cost) if isinstance(cost, int | float) and not isinstance(cost, bool) and is_finite(cost) and cost >= 0 else None
    if code != 0:
        return NodeResult(Status.FAILED, f"the command exited {code}" + (f": {error}" if error else said), cost_usd=cost)
    if not isinstance(result, dict) or ("output" not in result and not error):
        head = out[:200].decode(errors="replace").strip()
        return NodeResult(
            Status.FAILED, f'the command wrote no JSON result on stdout ({{"output": ...}}); it wrote {head!r}{said}', cost_usd=cost
        )
    if error:
        return NodeResult(Status.FAILED, f"the command failed: {error}", output=result.get("output"), cost_usd=cost)
    output = result["output"]
    return NodeResult(Status.DONE, "completed", output=output, text=output if isinstance(output, str) else None, cost_usd=cost)


def a2a_token(environ: Mapping[str, str]) -> str | None:
    """The bearer token in $SPAWN_A2A_TOKEN_FILE, or None when it is unset."""
    path = environ.get(ENV_A2A_TOKEN_FILE)
    if not path:
        return None
    try:
        token = Path(path).expanduser().read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise UsageError(f"can't read {ENV_A2A_TOKEN_FILE} {path}: {why}; point it at the token file") from None
    if not token or not token.isprintable() or not token.isascii():
        raise UsageError(f"{ENV_A2A_TOKEN_FILE} {path} holds no token (one line of ASCII); point it at the server's token file")
    return token


def read_url_by(url: str, until: float) -> bytes:
    """GET url's body (at most COMMAND_RESULT_LIMIT bytes), all of it read by `until`
    (Unix seconds), else TimeoutError.

    urllib's own timeout bounds each socket call, so a peer that sends one byte
    a second never trips it: here each read gets only the time left.
    """
    import http.client
    import io
    import urllib.request

    class Reads(io.RawIOBase):
        def __init__(self, sock: socket.socket) -> None:
            self.sock = sock

        def readable(self) -> bool:
            return True

        def readinto(self, buffer: Any) -> int:
            left = until - time.time()
            if left <= 0:
                raise TimeoutError("out of time")
            self.sock.settimeout(left)
            return self.sock.recv_into(buffer)

        def close(self) -> None:
            super().close()
            self.sock.close()

    class Bounded:
        """The connection's socket as http.client uses it, every read bounded.

        urllib closes the connection once the headers are read, leaving the
        response's reader to close the socket: the reader owns it from then.
        """

        def __init__(self, sock: socket.socket) -> None:
            self.sock = sock
            self.reader: io.BufferedReader | None = None

        def makefile(self, mode: str, *args: Any, **kwargs: Any) -> io.BufferedReader:
            self.reader = io.BufferedReader(Reads(self.sock))
            return self.reader

        def close(self) -> None:
            if self.reader is None:
                self.sock.close()

        def __getattr__(self, name: str) -> Any:
            return getattr(self.sock, name)

    class HTTPConnection(http.client.HTTPConnection):
        def connect(self) -> None:
            super().connect()
            self.sock = cast("socket.socket", Bounded(self.sock))

    class HTTPSConnection(http.client.HTTPSConnection):
        def connect(self) -> None:
            super().connect()  # the TLS handshake too, within the connect timeout
            self.sock = cast("socket.socket", Bounded(self.sock))

    class HTTP(urllib.request.HTTPHandler):
        def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
            return self.do_open(HTTPConnection, req)

    class HTTPS(urllib.request.HTTPSHandler):
        def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
            return self.do_open(HTTPSConnection, req)

    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    with urllib.request.build_opener(HTTP, HTTPS).open(request, timeout=max(0.001, until - time.time())) as response:
        return cast("bytes", response.read(COMMAND_RESULT_LIMIT))


def fetch_agent_card(url: str, deadline: float | None = None) -> dict[str, Any] | None:
    """The agent card at url, checked enough to be worth a client (resolve time; no SDK import).

    It is read within A2A_CARD_TIMEOUT_S and by the deadline: None when the
    deadline came first, so that the run records the timeout.
    """
    import urllib.error

    until = time.time() + A2A_CARD_TIMEOUT_S
    by_deadline = deadline is not None and deadline < until
    try:
        body = read_url_by(url, min(until, deadline) if deadline is not None else until)
    except urllib.error.HTTPError as exc:
        raise UsageError(f"no A2A agent card at {url} (HTTP {exc.code}); check the URL (is it an A2A agent?)") from None
    except (urllib.error.URLError, OSError) as exc:
        why = getattr(exc, "reason", exc)
        if isinstance(why, TimeoutError):
            if by_deadline:
                return None
            raise UsageError(f"the A2A agent at {url} sent no card within {A2A_CARD_TIMEOUT_S:.0f} s; check the host and port") from None
        raise UsageError(f"can't reach the A2A agent at {url}: {why}; check the host and port") from None
    try:
        card = parse_json(body)
    except ValueError:
        raise UsageError(f"{url} is not an A2A agent card (not JSON); check the URL") from None
    problem = a2a_card_problem(card)
    if problem is not None:
        raise UsageError(f"{url} is not a valid A2A agent card: {problem}")
    return cast("dict[str, Any]", card)


def a2a_card_problem(card: Any) -> str | None:
    """What keeps this client from using a card, or None (pure)."""
    if not isinstance(card, dict):
        return "it is not a JSON object"
    if not isinstance(card.get("name"), str) or not card.get("name"):
        return "it has no name"
    interfaces = card.get("supportedInterfaces")
    if interfaces is None and isinstance(card.get("url"), str):  # a 0.3 card
        interfaces = [{"url": card["url"], "protocolBinding": card.get("preferredTransport", "JSONRPC")}]
        interfaces += [
            {"url": i.get("url"), "protocolBinding": i.get("transport")}
            for i in card.get("additionalInterfaces") or []
            if isinstance(i, dict)
        ]
    if not isinstance(interfaces, list) or not interfaces:
        return "it lists no interface (supportedInterfaces)"
    usable = [i for i in interfaces if isinstance(i, dict) and i.get("protocolBinding") in A2A_BINDINGS and isinstance(i.get("url"), str)]
    if not usable:
        return f"none of its interfaces speaks {' or '.join(A2A_BINDINGS)}"
    return None


def a2a_metadata(meta: AgentMeta) -> dict[str, Any]:
    """Message metadata: the node's depth, limits and trace, for the remote to narrow to."""
    data: dict[str, Any] = {A2A_META_DEPTH: meta.depth, A2A_META_MAX_DEPTH: meta.max_depth, A2A_META_TRACEPARENT: meta.traceparent}
    if meta.deadline is not None:
        data[A2A_META_DEADLINE] = meta.deadline
    if meta.max_budget_usd is not None:
        data[A2A_META_BUDGET] = meta.max_budget_usd
    return data


def a2a_state_name(value: int, names: Mapping[int, str]) -> str:
    """completed, input-required, ...: A2A's TaskState without its prefix; an unknown value as its number (pure)."""
    name = names.get(value)
    return name.removeprefix("TASK_STATE_").lower().replace("_", "-") if name else str(value)


def whole_numbers(value: Any) -> Any:
    """JSON from protobuf's Struct, whose numbers are all doubles: 3.0 back to 3 (pure)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [whole_numbers(v) for v in value]
    if isinstance(value, dict):
        return {k: whole_numbers(v) for k, v in value.items()}
    return value


def parts_output(parts: Sequence[Mapping[str, Any]]) -> tuple[Any, str | None]:
    """(output, text) of A2A parts as JSON (pure).

    One data part alone is the output (so --schema can check it); text parts
    are joined; both together are {"text", "data": [...]}. A file part counts
    as data: {url or filename, media_type}.
    """
    texts = [str(p["text"]) for p in parts if "text" in p]
    data = [whole_numbers(p["data"]) for p in parts if "data" in p]
    data += [{k: p[k] for k in ("url", "filename", "mediaType") if k in p} for p in parts if "url" in p or "raw" in p]
    text = "\n".join(texts) if texts else None
    if not data:
        return text, text
    if text is None:
        return (data[0] if len(data) == 1 else data), None
    return {"text": text, "data": data}, text


class A2ATask:
    """What the client has seen of its remote task, from events or polls (JSON, as ProtoJSON)."""

    def __init__(self, state_names: Mapping[int, str]) -> None:
        self.names = state_names
        self.task_id: str | None = None
        self.context_id: str | None = None
        self.state: str | None = None
        self.status_parts: list[dict[str, Any]] = []
        self.artifacts: dict[str, list[dict[str, Any]]] = {}
        self.reply: list[dict[str, Any]] | None = None
        """The parts of a direct Message reply: the remote answered without a task."""
        self.cost_usd: float | None = None

    def observe(self, event: Mapping[str, Any], raw_state: int | None) -> None:
        """Take in one StreamResponse (or a polled Task as {"task": ...}); raw_state is its numeric state."""
        if "message" in event:
            self.reply = list(event["message"].get("parts") or [])
            self.state = "completed"
            return
        body = event.get("task") or event.get("statusUpdate") or event.get("artifactUpdate") or {}
        self.task_id = body.get("id") or body.get("taskId") or self.task_id
        self.context_id = body.get("contextId") or self.context_id
        self._cost(body.get("metadata"))
        if "task" in event:
            for artifact in body.get("artifacts") or []:
                self.artifacts[str(artifact.get("artifactId"))] = list(artifact.get("parts") or [])
        if "artifactUpdate" in event:
            artifact = body.get("artifact") or {}
            key = str(artifact.get("artifactId"))
            parts = list(artifact.get("parts") or [])
            self.artifacts[key] = [*self.artifacts.get(key, []), *parts] if body.get("append") else parts
        if "task" in event or "statusUpdate" in event:
            status = body.get("status") or {}
            self.state = a2a_state_name(raw_state or 0, self.names)
            message = status.get("message") or {}
            self.status_parts = list(message.get("parts") or [])
            self._cost(message.get("metadata"))

    def _cost(self, metadata: Any) -> None:
        cost = metadata.get(A2A_META_COST) if isinstance(metadata, dict) else None
        if isinstance(cost, int | float) and not isinstance(cost, bool) and is_finite(cost) and cost >= 0:
            self.cost_usd = float(cost)

    def settled(self) -> bool:
        """Past working: final, waiting for an answer, or in a state this client doesn't know."""
        return self.state is not None and self.state not in A2A_RUNNING_STATES

    def status_text(self) -> str:
        return parts_output(self.status_parts)[1] or ""

    def result(self) -> NodeResult:
        state = self.state or "unknown"
        status = A2A_FINAL_STATES.get(state)
        said = self.status_text()
        if status == Status.DONE:
            parts = self.reply if self.reply is not None else [p for ps in self.artifacts.values() for p in ps]
            output, text = parts_output(parts or self.status_parts)
            return NodeResult(Status.DONE, "completed", output=output, text=text or said or None, cost_usd=self.cost_usd)
        if status == Status.KILLED:
            return NodeResult(
                Status.KILLED,
                "the remote agent canceled the task" + (f": {said}" if said else ""),
                text=said or None,
                cost_usd=self.cost_usd,
            )
        if status == Status.FAILED:
            return NodeResult(
                Status.FAILED, f"the remote agent's task {state}" + (f": {said}" if said else ""), text=said or None, cost_usd=self.cost_usd
            )
        return NodeResult(
            Status.FAILED, f"the remote task is in a state this client doesn't know: {state!r}", text=said or None, cost_usd=self.cost_usd
        )


class A2AExecutor(Executor):
    """A remote agent over A2A (a2a-sdk, imported only when an a2a node runs)."""

    kind = "a2a"

    def check(self, node: Node, deadline: float | None, environ: Mapping[str, str]) -> None:
        a2a_token(environ)  # an unreadable token file is exit 2, before anything is written
        fetch_agent_card(node.endpoint or "", deadline)

    def describe_error(self, exc: Exception, agent_dir: Path) -> str:
        return f"A2A: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"[:2000]

    async def run(
        self, meta: AgentMeta, agent_dir: Path, cli: Path, state: RunState, secrets_: Sequence[str], *, sdk_loader: SdkLoader | None
    ) -> None:
        import asyncio
        from urllib.parse import urlsplit

        import httpx
        from a2a.client import A2ACardResolver, ClientConfig, ClientFactory

        url = meta.endpoint or ""
        parts = urlsplit(url)
        # No timeout of its own on a stream's reads: the deadline (run_agent's
        # stop, which cancels this task) bounds the card, the send, the stream and every poll.
        async with httpx.AsyncClient(
            timeout=httpx.Timeout(A2A_CARD_TIMEOUT_S, read=None), auth=a2a_bearer(url, a2a_token(state.settings))
        ) as http:
            card = await A2ACardResolver(http, f"{parts.scheme}://{parts.netloc}", parts.path).get_agent_card()
            streaming = bool(card.capabilities.streaming)
            conversation = A2AConversation(meta, agent_dir, state, secrets_)
            conversation.line("A2ACard", {"url": url, "name": card.name, "version": card.version, "streaming": streaming})
            config = ClientConfig(
                streaming=streaming, polling=not streaming, httpx_client=http, supported_protocol_bindings=list(A2A_BINDINGS)
            )
            conversation.client = ClientFactory(config).create(card)
            task = conversation.task
            state.stop_hooks.append(conversation.cancel)
            await open_steering(meta, agent_dir, state, secrets_)  # spawn.py send's inbox
            forwarding = asyncio.ensure_future(conversation.forward(state.inbox)) if state.inbox is not None else None
            try:
                state.node_result = await conversation.converse(remote=card.name)
            except A2AFlooded as exc:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(conversation.cancel(), KILL_GRACE_S)
                state.node_result = NodeResult(Status.FAILED, str(exc), cost_usd=task.cost_usd)
            finally:
                close_steering(state)
                if forwarding is not None:  # what was accepted before the close is sent, or recorded as not sent
                    await asyncio.wait([forwarding], timeout=KILL_GRACE_S)
                    forwarding.cancel()
                # A remote that reports itself canceled ends the stream while the
                # stop path's cancel still waits on this client for its reply:
                # closing the client now would cut that reply (and its record) off.
                if conversation.cancels:
                    await asyncio.wait(conversation.cancels, timeout=KILL_GRACE_S)


def a2a_bearer(url: str, token: str | None) -> Any:
    """An httpx.Auth that sends the token to the card's own origin only: a card may name interfaces anywhere."""
    from collections.abc import Generator

    import httpx

    card_origin = httpx.URL(url)

    class Bearer(httpx.Auth):
        def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
            there = request.url
            if token is not None and (there.scheme, there.host, there.port) == (card_origin.scheme, card_origin.host, card_origin.port):
                request.headers["Authorization"] = f"Bearer {token}"
            yield request

    return Bearer()


class A2AFlooded(Exception):
    """The remote sent more than the transcript holds: a peer that floods is ended, not followed."""


class A2AConversation:
    """One a2a node's exchange with its remote: send, follow the task to a settled state, answer its asks, cancel."""

    def __init__(self, meta: AgentMeta, agent_dir: Path, state: RunState, secrets_: Sequence[str]) -> None:
        from a2a.types import TaskState

        self.meta, self.agent_dir, self.state, self.secrets = meta, agent_dir, state, secrets_
        # protobuf ships no type hints: its JSON codec is used untyped.
        self.json_format: Any = importlib.import_module("google.protobuf.json_format")
        self.names = {int(v): n for n, v in TaskState.items()}
        self.task = A2ATask(self.names)
        self.client: Any = None
        self.cancels: list[asyncio.Future[None]] = []

    def line(self, kind: str, message: Mapping[str, Any]) -> bool:
        self.state.last_activity = time.time()
        return node_line(self.agent_dir, kind, message, self.secrets)

    async def cancel(self) -> None:
        import asyncio

        from a2a.types import CancelTaskRequest

        task, cancels, line = self.task, self.cancels, self.line
        if task.task_id is None or task.state in A2A_FINAL_STATES:
            line(
                "A2ACancel",
                {"task_id": task.task_id, "sent": False, "why": "no remote task yet" if task.task_id is None else task.state},
            )
            return
        if cancels:  # the run's own cancel (an ask denied) and the stop path's can meet: one is sent
            await asyncio.wait(cancels, timeout=KILL_GRACE_S)
            return
        done = asyncio.get_running_loop().create_future()
        cancels.append(done)
        try:
            answer = await self.client.cancel_task(CancelTaskRequest(id=task.task_id))
        except asyncio.CancelledError:
            # The stop path's grace ran out first: sent, and maybe acted on, but not answered.
            line("A2ACancel", {"task_id": task.task_id, "sent": True, "error": "no answer before the runner's stop ended"})
            raise
        except Exception as exc:
            line("A2ACancel", {"task_id": task.task_id, "sent": True, "error": f"{type(exc).__name__}: {exc}"[:500]})
            raise
        finally:
            done.set_result(None)
        line("A2ACancel", {"task_id": task.task_id, "sent": True, "state": a2a_state_name(answer.status.state, self.names)})

    async def forward(self, inbox: Any) -> None:
        """Each message the inbox accepted, in order, as the next message of the remote task (an A2ASteer line each)."""
        import asyncio
        import uuid

        from a2a.types import Message, Part, Role, SendMessageConfiguration, SendMessageRequest

        task, seq = self.task, 0
        while await inbox.wait_for_message():
            text, seq = inbox.queue.popleft(), seq + 1
            while task.task_id is None and task.state not in A2A_FINAL_STATES:
                await asyncio.sleep(0.1)  # the remote has not named its task yet
            if task.state in A2A_FINAL_STATES:
                self.line("A2ASteer", {"seq": seq, "sent": False, "why": f"the remote task is {task.state}"})
                continue
            metadata = {**a2a_metadata(self.meta), A2A_META_STEER: True, A2A_META_SENT_BY: f"spawn:{self.meta.id}"}
            message = Message(
                message_id=uuid.uuid4().hex, role=Role.ROLE_USER, parts=[Part(text=text)], metadata=metadata,
                task_id=task.task_id or "", context_id=task.context_id or "",
            )  # fmt: skip
            request = SendMessageRequest(message=message, configuration=SendMessageConfiguration(return_immediately=True))
            try:
                events = self.client.send_message(request)
                async for event in events:  # the first event says it was taken; the task's progress is follow()'s
                    said = event.task.status if event.HasField("task") else event.status_update.status
                    state = a2a_state_name(said.state, self.names)
                    self.line("A2ASteer", {"seq": seq, "sent": True, "task_id": task.task_id, "state": state})
                    break
                close = getattr(events, "aclose", None)
                if close is not None:
                    await close()
            except Exception as exc:  # a remote that refuses it: recorded, and the node goes on
                self.line("A2ASteer", {"seq": seq, "sent": False, "error": f"{type(exc).__name__}: {exc}"[:500]})

    async def converse(self, *, remote: str) -> NodeResult:
        """Send the task, then each answer to the remote's asks, until the task settles; its result."""
        import uuid

        from a2a.types import Message, Part, Role

        meta, task = self.meta, self.task
        text = meta.task
        while True:
            message = Message(
                message_id=uuid.uuid4().hex,
                role=Role.ROLE_USER,
                parts=[Part(text=text)],
                metadata=a2a_metadata(meta),
                task_id=task.task_id or "",
                context_id=task.context_id or "",
            )
            await self.follow(message)
            if task.state not in A2A_ASK_STATES:
                break
            reply = await a2a_ask(meta, self.agent_dir, self.state, task, remote=remote, secrets_=self.secrets)
            if reply is None:
                await self.cancel()
                return NodeResult(Status.FAILED, f"the remote agent's {task.state} was answered no", cost_usd=task.cost_usd)
            text = reply
        return task.result()

    async def follow(self, message: Any) -> None:
        """Send one message; follow its stream, then poll, until the task settles."""
        import asyncio

        from a2a.types import GetTaskRequest, SendMessageRequest

        task, line, json_format = self.task, self.line, self.json_format
        line("A2ASend", json_format.MessageToDict(message))
        events = self.client.send_message(SendMessageRequest(message=message))
        try:
            async for event in events:
                raw = event.task.status.state if event.HasField("task") else event.status_update.status.state
                event_json = json_format.MessageToDict(event)
                if not line("A2AEvent", event_json):
                    cap = self.state.settings.log_max_bytes
                    raise A2AFlooded(f"the remote agent sent over {cap} bytes of events ({ENV_LOG_MAX}); its task was canceled")
                task.observe(event_json, raw)
                if task.settled():
                    break
        finally:
            close = getattr(events, "aclose", None)  # the stream's connection, now, not at collection
            if close is not None:
                await close()
        seen = task.state
        while not task.settled():
            if task.task_id is None:
                raise RuntimeError("the remote agent answered with neither a task nor a message")
            await asyncio.sleep(A2A_POLL_S)
            polled = await self.client.get_task(GetTaskRequest(id=task.task_id))
            task.observe({"task": json_format.MessageToDict(polled)}, polled.status.state)
            if task.state != seen:  # a poll that saw nothing new is no event
                line("A2ATask", json_format.MessageToDict(polled))
                seen = task.state


async def a2a_ask(meta: AgentMeta, agent_dir: Path, state: RunState, task: A2ATask, *, remote: str, secrets_: Sequence[str]) -> str | None:
    """Raise the remote's input-required/auth-required as an ask; the reply to send, or None when denied."""
    import asyncio

    timeout = state.settings.ask_timeout_s
    if meta.deadline is not None:
        timeout = min(timeout, max(0.0, meta.deadline - time.time()))
    question = task.status_text() or f"the remote agent {remote} needs {task.state}"
    rule = f"A2A {task.state} from {remote}"
    channel = open_ask(meta, f"A2A:{task.state}", {"command": question}, rule, timeout=timeout, secrets_=secrets_)
    ask = channel.ask_id
    node_line(agent_dir, "A2AAsk", {"ask": ask, "state": task.state, "question": question}, secrets_)
    how = f"run 'spawn.py approve {ask} --text REPLY' or 'spawn.py deny {ask}' within {timeout:.0f} s"
    note(f"agent {meta.id}: {remote} asks: {question[:200]}; {how}")
    try:
        answer = await asyncio.to_thread(channel.wait, meta.id, timeout, secrets_)
    finally:
        channel.close()  # never left pending by a stop: denied, by timeout
    verdict, by = str(answer.get("verdict")), str(answer.get("by", "?"))
    node_line(agent_dir, "A2AAnswer", {"ask": ask, "verdict": verdict, "by": by}, secrets_)
    if verdict != "approve":
        state.denied_asks.append(f"ask {ask} ({rule}) denied by {by}")
        return None
    return str(answer.get("text") or "approved")


def names_another_kind(argv: Sequence[str]) -> bool:
    """Whether argv's --agent is an a2a or command reference: a run with nothing of the claude SDK to import."""
    values = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--agent"]
    values += [arg.removeprefix("--agent=") for arg in argv if arg.startswith("--agent=")]
    try:
        return any(node is not None and node.kind != "claude" for node in map(parse_reference, values))
    except UsageError:
        return False  # reported by the run's own resolution


# One class per agents.NODE_KINDS, in its order (definitions check a kind against
# that list, below this module).
EXECUTORS: dict[str, type[Executor]] = {"claude": ClaudeExecutor, "a2a": A2AExecutor, "command": CommandExecutor}


def executor_for(kind: str) -> Executor:
    if kind not in EXECUTORS:
        raise UsageError(f"unknown node kind {kind!r}; use one of {', '.join(EXECUTORS)} (this spawn.py is {__version__})")
    return EXECUTORS[kind]()
