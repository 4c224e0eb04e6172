#!/usr/bin/env -S uv run --script
# /// script
# requires-python = ">=3.11"
# dependencies = ["mcp>=2.3,<3"]
#
# [tool.uv]
# exclude-newer = "2026-11-20T00:00:00Z"
# ///
"""spawn.py as an MCP server: any MCP client can start and steer a depth-N agent tree.

Run::

    uv run tools/mcp_server.py                         # stdio (what Claude Code / Desktop start)
    uv run tools/mcp_server.py --http 8765             # streamable HTTP on 127.0.0.1:8765/mcp
    uv run tools/mcp_server.py --http 0.0.0.0:8765 --token-file token.txt

It drives spawn.py only through its command line and the session directory
(never by import), so it works with any copy of spawn.py (``--spawn PATH``) and
any session root. Tools: spawn_agent, agent_wait, agent_status, agent_cancel,
agent_answer, agent_send, budget, list_agents. The server's --max-depth, --max-budget-usd,
--max-agents and --max-concurrent bound everything started through it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import ctypes.util
import functools
import json
import os
import re
import struct
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import session_files
from mcp.server.elicitation import render_elicitation_schema
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import NoBackChannelError
from mcp.types import CallToolResult, ElicitRequest, ElicitRequestFormParams, InputRequest, InputRequiredResult, TextContent
from pydantic import BaseModel, ConfigDict, Field

__version__ = "0.1.0"

# ---------------------------------------------------------------- constants --

DEFAULT_SPAWN = Path(__file__).resolve().parent.parent / "spawn.py"
# Below the 60 s request timeout most MCP clients use, so no client gives up on a wait first.
WAIT_CAP_S = 50.0
# How often a wait re-checks what inotify can't tell it: asks, dead agents, progress.
WAIT_TICK_S = 0.25
# spawn.py's agent ids (AGENT_ID there): a{depth}-{6 hex}. An id becomes a path under the
# session's agents/, so anything else (a path, "..") would let a client name any directory.
AGENT_ID = re.compile(r"a\d{1,4}-[0-9a-f]{6}")
# spawn.py's smallest budget hold (MIN_HOLD_USD there): less left than this, and it refuses the spawn.
MIN_HOLD_USD = 0.01
# inotify(7) flags: a marker is created with O_CREAT|O_EXCL (IN_CREATE); answers and
# outcomes are link()ed or renamed into place (IN_CREATE / IN_MOVED_TO).
IN_CREATE = 0x100
IN_MOVED_TO = 0x80
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000


# ------------------------------------------------------------------ records --


class Result(BaseModel):
    """Base of every structured result: unknown fields from spawn.py pass through."""

    model_config = ConfigDict(extra="allow")


class SpawnResult(Result):
    agent_id: str = Field(description="the new agent's id")
    status: str = Field(description="running, or refused when a limit refused it (recorded in the session)")
    agent_dir: str = Field(description="the agent's directory in the session")
    resumed_from: str | None = None


class WaitResult(Result):
    status: Literal["done", "failed", "timeout"] = Field(description="done: all waited agents done; failed: one failed")
    agents: list[dict[str, Any]] = Field(description="one summary per finished agent, as spawn.py prints it")
    pending: list[str] = Field(description="ids still without an outcome")
    pending_asks: list[dict[str, Any]] = Field(description="tool calls waiting for agent_answer")


STATUS_CALLS_SHOWN = 5  # agent_status: each agent's last model calls (model_calls_total counts them all)


class StatusResult(Result):
    session: str
    agents: list[dict[str, Any]]
    pending_asks: list[dict[str, Any]] = []


class CancelResult(Result):
    killed: list[str] = Field(description="ids of the agents ended (the agent and its descendants)")


class AnswerResult(Result):
    ask: str
    verdict: Literal["approve", "deny"]


class SendResult(Result):
    id: str = Field(description="the agent the message went to")
    seq: int | None = Field(default=None, description="the message's number among those the agent was sent")
    delivery: str | None = Field(default=None, description="next request, or reopens the run (its turn had ended)")


class BudgetResult(Result):
    session: str
    max_budget_usd: float = Field(description="the tree's budget now")
    previous_usd: float
    paused: list[dict[str, Any]] = Field(description="agents paused at their hold when it changed (they go on once it fits)")


class AgentsResult(Result):
    agents: list[dict[str, Any]] = Field(description="name, source, path, tools, description of each definition")


class AskDecision(BaseModel):
    """What the client's user is asked when an agent wants a tool call approved."""

    approve: bool = Field(description="allow this tool call")


# ---------------------------------------------------------------- pure core --


def parse_http_address(value: str) -> tuple[str, int]:
    """'[HOST:]PORT' -> (host, port); loopback unless a host is given."""
    host, sep, port = value.rpartition(":")
    if not sep:
        host = "127.0.0.1"
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or int(port) > 65535:
        raise ValueError(f"--http {value!r}: expected [HOST:]PORT")
    return host, int(port)


# spawn.py's hints name its commands; a client calls this server's tools instead.
CLI_HINTS_AS_TOOLS = (
    (r"'spawn\.py status(?: --json)?'", "the agent_status tool"),
    (r"'spawn\.py wait [^']*'", "the agent_wait tool"),
    (r"'spawn\.py kill(?: [^']*)?'", "the agent_cancel tool"),
    (r"'?spawn\.py (?:approve|deny|approve\|deny) [^';]*'?", "the agent_answer tool"),
    (r"'spawn\.py agents list'", "the list_agents tool"),
    (r",? or pass --session DIR", ""),  # no tool takes it
)


def as_tools(line: str) -> str:
    """spawn.py's one-line error with its hints naming this server's tools."""
    for pattern, tool in CLI_HINTS_AS_TOOLS:
        line = re.sub(pattern, tool, line)
    return line


def check_agent_id(agent_id: str) -> None:
    if not AGENT_ID.fullmatch(agent_id):
        raise ToolError(f"spawn: error: {agent_id!r} is not an agent id (a<depth>-<6 hex digits>); use an id that spawn_agent returned")


def wait_summary(finished: Mapping[str, Mapping[str, Any]], ids: Sequence[str], mode: str, timed_out: bool) -> str:
    pending = [i for i in ids if i not in finished]
    failed = [i for i, o in finished.items() if o.get("status") != "done"]
    head = "timeout" if timed_out else ("failed" if failed else "done")
    parts = [f"{i} {o.get('status')}" for i, o in finished.items()]
    text = f"{head}: " + (", ".join(parts) if parts else "no agent finished")
    return text + (f"; still running: {', '.join(pending)}" if pending else "")


# ------------------------------------------------------- on-disk protocol --


def outcome_summary(agent_dir: Path) -> dict[str, Any] | None:
    """What spawn.py's stdout would say about a finished agent (bounded: no transcript)."""
    outcome = session_files.committed_outcome(agent_dir)
    if outcome is None:
        return None
    keys = ("status", "exit_code", "reason", "output", "validation_errors", "cost_usd", "duration_s", "sdk_session_id")
    data = {"id": outcome.get("id") or agent_dir.name, **{k: outcome[k] for k in keys if k in outcome}}
    data["agent_dir"] = str(agent_dir)
    return data


@dataclass(eq=False)
class Waiter:
    """One agent_wait call: woken when a file appears in a directory it watches."""

    event: asyncio.Event = field(default_factory=asyncio.Event)
    changed: set[str] = field(default_factory=set)
    """Watched directories that had an event since the waiter last looked."""


class Inotify:
    """One inotify instance for the server's life (Linux); elsewhere every wait polls at WAIT_TICK_S.

    Kept open between calls: closing an instance that holds watches makes
    the kernel wait out an RCU grace period (6-12 ms measured), which would
    sit between an outcome and agent_wait's answer. A watch no waiter needs
    any more is removed, which costs nothing noticeable.
    """

    def __init__(self) -> None:
        self.fd = -1
        self.loop: asyncio.AbstractEventLoop | None = None
        self.wds: dict[str, int] = {}
        self.refs: dict[str, int] = {}
        self.names: dict[int, str] = {}
        self.waiters: dict[Waiter, set[str]] = {}
        name = ctypes.util.find_library("c")
        if sys.platform != "linux" or name is None:
            return
        self.libc = ctypes.CDLL(name, use_errno=True)
        self.fd = self.libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)

    @contextlib.contextmanager
    def waiter(self) -> Iterator[Waiter]:
        loop = asyncio.get_running_loop()
        if self.fd >= 0 and self.loop is not loop:  # a new event loop (tests run several)
            loop.add_reader(self.fd, self._readable)
            self.loop = loop
        waiter = Waiter()
        self.waiters[waiter] = set()
        try:
            yield waiter
        finally:
            for directory in self.waiters.pop(waiter):
                self._unwatch(directory)

    def watch(self, waiter: Waiter, directory: Path) -> None:
        key = str(directory)
        if self.fd < 0 or key in self.waiters[waiter]:
            return
        if key not in self.wds:
            wd = self.libc.inotify_add_watch(self.fd, os.fsencode(directory), IN_CREATE | IN_MOVED_TO)
            if wd < 0:
                return
            self.wds[key], self.names[wd] = wd, key
        self.refs[key] = self.refs.get(key, 0) + 1
        self.waiters[waiter].add(key)

    def _unwatch(self, key: str) -> None:
        self.refs[key] -= 1
        if self.refs[key] == 0:
            del self.refs[key]
            wd = self.wds.pop(key)
            self.names.pop(wd, None)
            self.libc.inotify_rm_watch(self.fd, wd)

    def _readable(self) -> None:
        changed: set[str] = set()
        with contextlib.suppress(BlockingIOError, OSError):
            while data := os.read(self.fd, 65536):
                offset = 0
                while offset + 16 <= len(data):
                    wd, _, _, length = struct.unpack_from("iIII", data, offset)
                    offset += 16 + length
                    if wd in self.names:
                        changed.add(self.names[wd])
        for waiter, watched in self.waiters.items():
            if hit := changed & watched:
                waiter.changed |= hit
                waiter.event.set()


# ---------------------------------------------------------------- processes --


@dataclass
class Config:
    spawn: list[str]
    """The command that runs spawn.py, e.g. [python, /path/spawn.py]."""
    session_root: str | None
    max_depth: int | None
    max_budget_usd: float | None
    max_agents: int | None
    max_concurrent: int | None
    environ: dict[str, str] = field(default_factory=lambda: dict(os.environ))


@dataclass
class Started:
    agent_id: str
    agent_dir: Path
    connection: str
    hold: float | None = None
    """The budget spawn.py admitted it with (meta.json's max_budget_usd): its subtree spends no more."""


class Spawner:
    """Everything the tools do, through spawn.py's command line and the session files."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.inotify = Inotify()
        self.started: dict[str, Started] = {}
        self.elicited: set[str] = set()
        self._answer_as: bool | None = None
        self.admission = asyncio.Lock()
        """Held from a spawn's checks until spawn.py has registered it: concurrent calls can't all pass."""
        self.session: Path | None = None
        """The one session every agent started here registers in (outside a tree), once the first made it."""

    async def run(
        self, *args: str, cwd: str | None = None, extra_env: Mapping[str, str] | None = None, stdin: str | None = None
    ) -> tuple[int, str, str]:
        env = {**self.config.environ, **(extra_env or {})}
        if self.config.session_root is not None:
            env["SPAWN_SESSION_ROOT"] = self.config.session_root
        data = stdin.encode() if stdin is not None else None
        return await session_files.run_cli(self.config.spawn, *args, env=env, cwd=cwd, stdin=data)

    async def run_json(
        self,
        *args: str,
        ok: Sequence[int] = (0,),
        cwd: str | None = None,
        extra_env: Mapping[str, str] | None = None,
        stdin: str | None = None,
    ) -> dict[str, Any]:
        code, out, err = await self.run(*args, cwd=cwd, extra_env=extra_env, stdin=stdin)
        try:
            return session_files.cli_json(code, out, err, ok)
        except session_files.CliError as exc:
            raise ToolError(as_tools(str(exc))) from None

    # Limits: the server's caps bound everything started through it, whatever the tool arguments say.
    #
    # Outside a tree, every agent the server starts registers in ONE session, whose limits.json holds
    # the server's caps: spawn.py's own admission (under the session lock, with the ledger's holds)
    # then bounds all of them and their descendants together, as it does one tree's agents. The
    # first spawn creates that session as a root with the caps as its tree limits; the rest join it
    # at depth 0 without a parent, as resumed roots do. The checks below, made under one lock held
    # until spawn.py has registered the agent, turn what spawn.py would refuse into a tool error.

    def committed(self) -> tuple[float, int, int]:
        """(USD held or spent, agents registered, agents running) over every subtree this server started.

        A running subtree counts its root's hold, which pays for its descendants, or what it has
        spent if more; an ended one what it spent.
        """
        committed, count, running = 0.0, 0, 0
        for s in self.started.values():
            session = s.agent_dir.parent.parent
            spent, live = 0.0, False
            for agent in session_files.subtree_ids(session, {s.agent_id}):
                outcome = session_files.read_json(session / "agents" / agent / "outcome.json")
                if outcome is not None and outcome.get("status") == "refused":
                    continue
                count += 1
                if outcome is None:
                    live = True
                    running += agent == s.agent_id
                elif isinstance(outcome.get("cost_usd"), int | float):
                    spent += float(outcome["cost_usd"])
            committed += max(spent, s.hold or 0.0) if live else spent
        return committed, count, running

    async def spawn_agent(self, args: Mapping[str, Any], connection: str) -> dict[str, Any]:
        if args.get("resume") is not None:
            check_agent_id(str(args["resume"]))
        async with self.admission:
            return await self.admit_and_spawn(args, connection)

    async def admit_and_spawn(self, args: Mapping[str, Any], connection: str) -> dict[str, Any]:
        c = self.config
        committed, count, running = self.committed()
        if c.max_agents is not None and count >= c.max_agents:
            raise ToolError(f"spawn: error: refused: this server's --max-agents {c.max_agents} is used up")
        if c.max_concurrent is not None and running >= c.max_concurrent:
            raise ToolError(
                f"spawn: error: refused: {running} agents are running, this server's --max-concurrent is "
                f"{c.max_concurrent}; agent_wait for one first"
            )
        left = None if c.max_budget_usd is None else c.max_budget_usd - committed
        if left is not None and left < MIN_HOLD_USD:
            raise ToolError(
                f"spawn: error: refused: this server's --max-budget-usd {c.max_budget_usd} is held or spent by the agents "
                "it started; agent_wait for one to end (each takes what is left unless spawn_agent's max_budget_usd asks less)"
            )
        argv = ["--background"]
        if args.get("resume"):
            argv += ["--resume", str(args["resume"])]
        if args.get("task") is not None:
            argv += ["--task", str(args["task"])]
        for key, flag in (("agent", "--agent"), ("model", "--model"), ("cwd", "--cwd"), ("timeout_s", "--timeout")):
            if args.get(key) is not None:
                argv += [flag, str(args[key])]
        if args.get("tools") is not None:
            argv += ["--tools", ",".join(args["tools"])]
        if args.get("schema") is not None:
            schema = args["schema"]
            argv += ["--schema", schema if isinstance(schema, str) else json.dumps(schema)]
        if c.max_depth is not None:
            argv += ["--max-depth", str(c.max_depth)]
        budget = session_files.min_known(args.get("max_budget_usd"), left)
        env: dict[str, str] = {}
        # Under a spawn.py agent, every spawn is that agent's child: its tree's limits and ledger hold it.
        in_tree = "SPAWN_SESSION" in c.environ
        root = not in_tree and self.session is None
        if root:
            # The tree's limits are the server's caps; the agent's own hold is what it asked for,
            # passed the way a parent passes its budget down (it can only lower --max-budget-usd).
            if c.max_budget_usd is not None:
                argv += ["--max-budget-usd", repr(c.max_budget_usd)]
                if budget is not None and budget < c.max_budget_usd:
                    env["SPAWN_MAX_BUDGET_USD"] = repr(float(budget))
                budget = None
            if c.max_agents is not None:
                argv += ["--max-agents", str(c.max_agents)]
            if c.max_concurrent is not None:
                argv += ["--max-concurrent", str(c.max_concurrent)]
        elif not in_tree:
            # Depth -1: the caller of a root; the agent registers in the server's session at depth 0.
            env.update(SPAWN_SESSION=str(self.session), SPAWN_DEPTH="-1")
        if budget is not None:
            argv += ["--max-budget-usd", repr(float(budget))]
        data = await self.run_json(*argv, ok=(0, 4), extra_env=env)
        agent_id = str(data["id"])
        agent_dir = Path(str(data["agent_dir"]))
        meta = session_files.read_json(agent_dir / "meta.json") or {}
        hold = meta.get("max_budget_usd")
        self.started[agent_id] = Started(agent_id, agent_dir, connection, float(hold) if isinstance(hold, int | float) else None)
        session_info = session_files.read_json(agent_dir.parent.parent / "session.json") or {}
        if root and session_info.get("root_agent") == agent_id:  # not a resume placed in its original's session
            self.session = agent_dir.parent.parent
        result = {"agent_id": agent_id, "status": data.get("status", "running"), "agent_dir": str(agent_dir)}
        if data.get("status") == "refused":
            result["reason"] = data.get("reason")
        if args.get("resume"):
            result["resumed_from"] = str(args["resume"])
        return result

    def served_sessions(self) -> set[Path]:
        """The sessions of the trees this server started: their agents may not call it."""
        found = {s.agent_dir.parent.parent for s in self.started.values()}
        return found | ({self.session} if self.session is not None else set())

    def find_dir(self, agent_id: str) -> Path:
        check_agent_id(agent_id)
        if agent_id in self.started:
            return self.started[agent_id].agent_dir
        root = Path(self.config.session_root or self.config.environ.get("SPAWN_SESSION_ROOT") or DEFAULT_SPAWN.parent / "sessions")
        sessions = [Path(self.config.environ["SPAWN_SESSION"])] if self.config.environ.get("SPAWN_SESSION") else []
        for session in [*sessions, *sorted(root.glob("*"), reverse=True)]:
            if (session / "agents" / agent_id / "meta.json").exists():
                return session / "agents" / agent_id
        raise ToolError(f"spawn: error: no agent {agent_id!r} under {root}; use an id that spawn_agent returned")

    def as_client(self, client: str) -> list[str]:
        """`--as mcp:CLIENT`: the record names the client; spawn.py accepts only these characters."""
        return ["--as", "mcp:" + (re.sub(r"[^A-Za-z0-9_.:@\-]", "-", client)[:59] or "client")]

    async def answer(self, ask_id: str, decision: str, client: str) -> dict[str, Any]:
        if self._answer_as is None:
            _, out, _ = await self.run("approve", "--help")
            self._answer_as = "--as" in out
        argv = ["approve" if decision == "allow" else "deny", ask_id]
        if self._answer_as:
            argv += self.as_client(client)
        return await self.run_json(*argv)


# ---------------------------------------------------------------------- MCP --


def connection_of(ctx: Context) -> str:
    """Agents 'started through this connection': per MCP session over HTTP, the process over stdio."""
    with contextlib.suppress(Exception):
        headers = ctx.headers or {}
        if headers.get("mcp-session-id"):
            return str(headers["mcp-session-id"])
    return "stdio"


def client_name(ctx: Context) -> str:
    with contextlib.suppress(Exception):
        info = ctx.session.client_params.client_info
        return str(info.name)
    return "client"


def can_elicit(ctx: Context) -> bool:
    with contextlib.suppress(Exception):
        caps = ctx.client_capabilities
        return caps is not None and caps.elicitation is not None
    return False


async def report_progress(ctx: Context, done: int, total: int) -> None:
    with contextlib.suppress(Exception):  # a client that gave no progress token gets none
        await ctx.report_progress(done, total, f"{done}/{total} agents done")


def tool_result(text: str, data: Mapping[str, Any]) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=dict(data))


def spawn_errors_as_results(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """A refused or bad call is a tool error whose text is spawn.py's own line, never a crash."""

    @functools.wraps(fn)
    async def tool(*args: Any, **kwargs: Any) -> Any:
        try:
            return await fn(*args, **kwargs)
        except ToolError as exc:
            return CallToolResult(content=[TextContent(type="text", text=str(exc))], is_error=True)

    return tool


def build_server(spawner: Spawner) -> MCPServer:
    """The MCP server and its tools, in the order tools/list gives them."""
    server: MCPServer = MCPServer(
        "spawn",
        instructions="Start Claude agents that can start their own children to any depth, wait for them, answer their asks.",
    )
    add_spawn_tool(server, spawner)
    add_wait_tool(server, spawner)
    add_tree_tools(server, spawner)
    add_steering_tools(server, spawner)
    add_catalogue_tool(server, spawner)
    return server


def add_spawn_tool(server: MCPServer, spawner: Spawner) -> None:
    """spawn_agent: start an agent in the background."""

    @server.tool()
    @spawn_errors_as_results
    async def spawn_agent(  # the tool's arguments are fixed: clients script against them
        *,
        task: str | None = None,
        agent: str | None = None,
        tools: list[str] | None = None,
        model: str | None = None,
        schema: str | dict[str, Any] | None = None,
        timeout_s: float | None = None,
        max_budget_usd: float | None = None,
        cwd: str | None = None,
        resume: str | None = None,
        ctx: Context | None = None,
    ) -> Annotated[CallToolResult, SpawnResult]:
        """Start an agent in the background and return at once with its id; then agent_wait for it.

        task: the prompt. agent: a .claude/agents definition name, or "auto". tools: the tools it may use
        (default Read,Grep,Glob; add Bash so it can start children). model: high-tier, medium-tier,
        low-tier or a model id. schema: a JSON Schema (object, or a schemas/ name) its output must match.
        resume: the id of a finished agent whose conversation to continue with this task.
        """
        args = {k: v for k, v in locals().items() if k not in ("ctx", "server", "spawner")}
        if task is None and resume is None:
            raise ToolError("spawn: error: give task (the prompt)")
        data = await spawner.spawn_agent(args, connection_of(ctx) if ctx else "stdio")
        return tool_result(f"agent {data['agent_id']} {data['status']} in {data['agent_dir']}", data)


def add_wait_tool(server: MCPServer, spawner: Spawner) -> None:
    """agent_wait: block until agents have outcomes, answering their asks by elicitation on the way."""

    @server.tool()
    @spawn_errors_as_results
    async def agent_wait(
        agent_ids: list[str] | None = None,
        mode: Literal["all", "any"] = "all",
        timeout_s: float = 30,
        ctx: Context | None = None,
    ) -> Annotated[CallToolResult, WaitResult] | InputRequiredResult:
        """Block until the agents have outcomes (mode all) or one has (mode any), for at most timeout_s (capped at 50).

        Without agent_ids, waits for every agent started through this connection. Call again while
        'pending' is not empty. Pending permission asks are listed; answer them with agent_answer.
        """
        connection = connection_of(ctx) if ctx else "stdio"
        ids = list(agent_ids) if agent_ids else [s.agent_id for s in spawner.started.values() if s.connection == connection]
        dirs = {i: spawner.find_dir(i) for i in ids}
        limit = time.monotonic() + max(0.0, min(float(timeout_s), WAIT_CAP_S))
        finished: dict[str, dict[str, Any]] = {}
        asks: list[dict[str, Any]] = []
        for ask_id, reply in (ctx.input_responses or {}).items() if ctx is not None else ():
            await settle(spawner, ask_id, decision_of(reply), client_name(ctx) if ctx else "client")
        sessions = {d.parent.parent for d in dirs.values()}
        asks_dirs = {str(session / "asks") for session in sessions}
        with spawner.inotify.waiter() as waiter:
            for d in dirs.values():
                spawner.inotify.watch(waiter, d)
            reported = -1
            # Each wake looks only at what changed: an outcome reaches the client as soon as its marker
            # lands, not after a scan of the session. Everything is looked at again every WAIT_TICK_S.
            next_tick = 0.0
            while True:
                waiter.event.clear()
                changed, waiter.changed = waiter.changed, set()
                tick = time.monotonic() >= next_tick
                for agent_id, d in dirs.items():
                    if agent_id not in finished and (tick or str(d) in changed) and (summary := outcome_summary(d)) is not None:
                        finished[agent_id] = summary
                left = limit - time.monotonic()
                if len(finished) == len(ids) or (mode == "any" and finished) or left <= 0:
                    break  # first: an outcome reaches the client before any bookkeeping
                if tick or changed & asks_dirs:
                    asks = [
                        a for session in sessions for a in session_files.pending_asks(session, session_files.subtree_ids(session, set(ids)))
                    ]
                    if ctx is not None and asks:
                        try:
                            asks = await elicit_asks(spawner, ctx, asks)
                        except NeedsInput as needs:
                            return needs.result
                if ctx is not None and len(finished) != reported:
                    reported = len(finished)
                    await report_progress(ctx, len(finished), len(ids))
                if tick:
                    next_tick = time.monotonic() + WAIT_TICK_S
                    for session in sessions:  # an asks/ directory may appear while we wait
                        if (session / "asks").is_dir():
                            spawner.inotify.watch(waiter, session / "asks")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(waiter.event.wait(), max(0.0, min(left, next_tick - time.monotonic())))
        if ctx is not None and len(finished) != reported:
            await report_progress(ctx, len(finished), len(ids))
        if len(finished) < len(ids):  # what still waits on someone, as of now
            sessions = {d.parent.parent for d in dirs.values()}
            asks = [a for s in sessions for a in session_files.pending_asks(s, session_files.subtree_ids(s, set(ids)))]
        timed_out = len(finished) < (1 if mode == "any" and ids else len(ids))
        failed = any(o.get("status") != "done" for o in finished.values())
        data = {
            "status": "timeout" if timed_out else ("failed" if failed else "done"),
            "agents": list(finished.values()),
            "pending": [i for i in ids if i not in finished],
            "pending_asks": asks,
        }
        text = wait_summary(finished, ids, mode, timed_out)
        if asks:
            text += "; asks pending: " + ", ".join(f"{a['id']} ({a['agent_id']} wants {a['tool']})" for a in asks)
        return tool_result(text, data)


def add_tree_tools(server: MCPServer, spawner: Spawner) -> None:
    """agent_status, agent_cancel and agent_answer: looking at a tree, ending part of it, answering its asks."""

    @server.tool()
    @spawn_errors_as_results
    async def agent_status(agent_id: str | None = None, session: str | None = None) -> Annotated[CallToolResult, StatusResult]:
        """The agent tree (depth, state, duration, own and subtree cost) and pending asks, as `spawn.py status --json`."""
        if agent_id is not None:
            argv = ["status", agent_id, "--json", "--session", str(spawner.find_dir(agent_id).parent.parent)]
        elif session is not None:
            argv = ["status", session, "--json"]
        elif spawner.started:
            argv = ["status", str(list(spawner.started.values())[-1].agent_dir.parent.parent), "--json"]
        else:
            argv = ["status", "--json"]
        data = await spawner.run_json(*argv)
        rows = data.get("agents", [])
        for row in rows:
            # A model reads this: an agent's last calls and how many, not every call of a long run.
            calls = row.get("model_calls")
            if isinstance(calls, list) and len(calls) > STATUS_CALLS_SHOWN:
                row["model_calls"], row["model_calls_total"] = calls[-STATUS_CALLS_SHOWN:], len(calls)
        text = f"session {data.get('session')}: " + ", ".join(f"{r.get('id')} {r.get('state', r.get('status'))}" for r in rows)
        if data.get("pending_asks"):
            text += "; asks pending: " + ", ".join(a["id"] for a in data["pending_asks"])
        return tool_result(text, data)

    @server.tool()
    @spawn_errors_as_results
    async def agent_cancel(agent_id: str) -> Annotated[CallToolResult, CancelResult]:
        """End an agent and all its descendants (deepest first); they are recorded as killed."""
        session = spawner.find_dir(agent_id).parent.parent
        data = await spawner.run_json("kill", agent_id, "--session", str(session))
        return tool_result(f"killed: {', '.join(data.get('killed', [])) or 'nothing (already finished)'}", data)

    @server.tool()
    @spawn_errors_as_results
    async def agent_answer(
        ask_id: str, decision: Literal["allow", "deny"] = "allow", ctx: Context | None = None
    ) -> Annotated[CallToolResult, AnswerResult]:
        """Answer a permission ask that agent_wait or agent_status listed: allow or deny the tool call."""
        data = await spawner.answer(ask_id, decision, client_name(ctx) if ctx else "client")
        return tool_result(f"ask {ask_id}: {data.get('verdict')}", data)


def add_steering_tools(server: MCPServer, spawner: Spawner) -> None:
    """agent_send and budget: steering a running tree (docs/steering.md)."""

    @server.tool()
    @spawn_errors_as_results
    async def agent_send(agent_id: str, text: str, ctx: Context | None = None) -> Annotated[CallToolResult, SendResult]:
        """Give a running agent a user message: it reads it at its next model request. An agent that has
        finished can't take one (its outcome is the error); a command node never can."""
        session = spawner.find_dir(agent_id).parent.parent
        client = client_name(ctx) if ctx else "client"
        data = await spawner.run_json("send", agent_id, "-", "--session", str(session), *spawner.as_client(client), stdin=text)
        return tool_result(f"message {data.get('seq')} to {agent_id}: {data.get('delivery')}", data)

    @server.tool()
    @spawn_errors_as_results
    async def budget(
        session: str | None = None, raise_usd: float | None = None, set_usd: float | None = None, ctx: Context | None = None
    ) -> Annotated[CallToolResult, BudgetResult]:
        """Raise (raise_usd) or set (set_usd) a tree's budget; agents paused at their hold go on once it fits.
        session: the session directory (default: the one this server's agents run in)."""
        if (raise_usd is None) == (set_usd is None):
            raise ToolError("spawn: error: give exactly one of raise_usd and set_usd")
        target = session or (str(spawner.session) if spawner.session else None)
        if target is None and spawner.started:
            target = str(list(spawner.started.values())[-1].agent_dir.parent.parent)
        if target is None:
            raise ToolError("spawn: error: no session yet; give session, or start an agent with spawn_agent first")
        how = ["--raise", repr(float(raise_usd))] if raise_usd is not None else ["--set", repr(float(set_usd or 0.0))]
        client = client_name(ctx) if ctx else "client"
        # Never past this server's own --max-budget-usd: what it was given for everything started here.
        cap = ["--at-most", repr(spawner.config.max_budget_usd)] if spawner.config.max_budget_usd is not None else []
        data = await spawner.run_json("budget", target, *how, *cap, *spawner.as_client(client))
        paused = data.get("paused") or []
        text = f"budget of {data.get('session')}: ${data.get('max_budget_usd')} (was ${data.get('previous_usd')})"
        return tool_result(text + (f"; {len(paused)} agent(s) paused" if paused else ""), data)


def add_catalogue_tool(server: MCPServer, spawner: Spawner) -> None:
    """list_agents: what spawn_agent's `agent` can name."""

    @server.tool()
    @spawn_errors_as_results
    async def list_agents() -> Annotated[CallToolResult, AgentsResult]:
        """The agent definitions (.claude/agents/*.md, then spawn.py's built-in ones) spawn_agent's `agent` can name."""
        data = await spawner.run_json("agents", "list", "--json")
        names = ", ".join(a.get("name", "?") for a in data.get("agents", []))
        return tool_result(f"{len(data.get('agents', []))} agent definitions: {names or 'none'}", data)


class NeedsInput(Exception):
    """The connection has no back-channel: ask the client through an InputRequiredResult round instead."""

    def __init__(self, result: InputRequiredResult) -> None:
        super().__init__("input required")
        self.result = result


def ask_message(ask: Mapping[str, Any]) -> str:
    return f"Agent {ask.get('agent_id')} wants to run {ask.get('tool')}: {ask.get('input')} (rule {ask.get('rule')}). Allow it?"


def decision_of(reply: Any) -> str | None:
    """allow / deny from an elicitation reply; None when the user dismissed it (the ask stays pending)."""
    action = getattr(reply, "action", None)
    if action == "cancel" or action is None:
        return None
    content = getattr(reply, "content", None)
    data = getattr(reply, "data", None)
    approve = data.approve if isinstance(data, AskDecision) else bool((content or {}).get("approve"))
    return "allow" if action == "accept" and approve else "deny"


async def settle(spawner: Spawner, ask_id: str, decision: str | None, client: str) -> None:
    if decision is None:
        return
    with contextlib.suppress(ToolError):  # someone else answered first: the first answer wins
        await spawner.answer(ask_id, decision, client)


async def elicit_asks(spawner: Spawner, ctx: Context, asks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ask the client's user about each new ask; return those still pending."""
    if not can_elicit(ctx):
        return asks
    still: list[dict[str, Any]] = []
    rounds: dict[str, InputRequest] = {}
    for ask in asks:
        if ask["id"] in spawner.elicited:
            still.append(ask)
            continue
        spawner.elicited.add(ask["id"])  # once: a dismissed form is not asked again
        try:
            reply = await ctx.elicit(ask_message(ask), AskDecision)
        except NoBackChannelError:
            # 2026-07-28 connections: the question rides on the result, and the client retries the call.
            params = ElicitRequestFormParams(message=ask_message(ask), requested_schema=render_elicitation_schema(AskDecision))
            rounds[ask["id"]] = ElicitRequest(params=params)
            continue
        except Exception as exc:
            print(f"mcp_server: can't elicit ask {ask['id']}: {exc!r}", file=sys.stderr)
            still.append(ask)
            continue
        decision = decision_of(reply)
        await settle(spawner, ask["id"], decision, client_name(ctx))
        if decision is None:
            still.append(ask)
    if rounds:
        raise NeedsInput(InputRequiredResult(input_requests=rounds, request_state="asks"))
    return still


# -------------------------------------------------------------------- HTTP --


def run_http(server: MCPServer, host: str, port: int, token: str | None, sessions: Callable[[], set[Path]] = set) -> None:
    import uvicorn
    from starlette.types import ASGIApp, Receive, Scope, Send

    inner: ASGIApp = server.streamable_http_app(host=host)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and token is not None:
            headers = dict(scope.get("headers") or [])
            if not session_files.token_matches(headers.get(b"authorization", b""), token):
                await send({"type": "http.response.start", "status": 401, "headers": [(b"www-authenticate", b"Bearer")]})
                await send({"type": "http.response.body", "body": b"missing or wrong bearer token\n"})
                return
        if scope["type"] == "http" and (agent := session_files.served_agent_calling(scope.get("client"), sessions())) is not None:
            why = f"agent {agent} runs in a tree this server serves: it may not call the server (its own asks, its own budget)\n"
            await send({"type": "http.response.start", "status": 403, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": why.encode()})
            return
        await inner(scope, receive, send)

    uvicorn.run(app, host=host, port=port, log_level="warning")


# ---------------------------------------------------------------------- CLI --


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mcp_server.py", description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--spawn", metavar="PATH", default=str(DEFAULT_SPAWN), help="spawn.py to run (default: beside tools/)")
    p.add_argument(
        "--python",
        metavar="CMD",
        help="how to run spawn.py (default $SPAWN_PYTHON, else 'uv run --script'); e.g. a venv's python with the SDK",
    )
    p.add_argument("--session", metavar="DIR", help="session root (default $SPAWN_SESSION_ROOT, as spawn.py)")
    p.add_argument("--http", metavar="[HOST:]PORT", help="serve streamable HTTP at /mcp instead of stdio (loopback by default)")
    p.add_argument("--token-file", metavar="PATH", help="bearer token HTTP clients must send; required off loopback")
    p.add_argument("--max-depth", type=int, metavar="N", help="deepest depth anything started here may reach")
    p.add_argument("--max-budget-usd", type=float, metavar="X", help="USD for everything started here, together")
    p.add_argument("--max-agents", type=int, metavar="N", help="agents everything started here may register, together")
    p.add_argument("--max-concurrent", type=int, metavar="N", help="agents started here that may run at once")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    environ = dict(os.environ)
    if not Path(args.spawn).is_file():
        print(f"mcp_server: error: --spawn {args.spawn} is not a file; point it at spawn.py", file=sys.stderr)
        return 2
    config = Config(
        spawn=session_files.spawn_command(args.spawn, args.python, environ),
        session_root=str(Path(args.session).expanduser().resolve()) if args.session else None,
        max_depth=args.max_depth,
        max_budget_usd=args.max_budget_usd,
        max_agents=args.max_agents,
        max_concurrent=args.max_concurrent,
        environ=environ,
    )
    spawner = Spawner(config)
    server = build_server(spawner)
    if args.http is None:
        server.run()
        return 0
    try:
        host, port = parse_http_address(args.http)
    except ValueError as exc:
        print(f"mcp_server: error: {exc}", file=sys.stderr)
        return 2
    token = None
    if args.token_file:
        try:
            token = session_files.read_token_file(args.token_file)
        except ValueError as exc:
            print(f"mcp_server: error: {exc}", file=sys.stderr)
            return 2
    if not session_files.is_loopback(host) and token is None:
        print(
            f"mcp_server: error: refusing to serve {host} without a bearer token; pass --token-file PATH or bind 127.0.0.1",
            file=sys.stderr,
        )
        return 2
    print(f"mcp_server: serving http://{host}:{port}/mcp", file=sys.stderr, flush=True)
    run_http(server, host, port, token, spawner.served_sessions)
    return 0


if __name__ == "__main__":
    sys.exit(main())
