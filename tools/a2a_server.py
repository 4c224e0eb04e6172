#!/usr/bin/env -S uv run --script
# /// script
# requires-python = ">=3.11"
# dependencies = ["a2a-sdk[http-server]>=1.3,<2", "uvicorn>=0.30,<1", "cryptography>=44"]
#
# [tool.uv]
# exclude-newer = "2026-11-20T00:00:00Z"
# ///
"""spawn.py's agents as an A2A server: other machines' trees call this machine's agents.

Run::

    uv run tools/a2a_server.py --port 9999                  # 127.0.0.1:9999, a new token (path on stderr)
    uv run tools/a2a_server.py --host 0.0.0.0 --port 9999 --token-file token.txt

The agent card (/.well-known/agent-card.json) lists the project's agent
definitions (.claude/agents) as skills, and only those skills are served: a
message naming anything else (another name, a node reference such as
command:EXE) is refused before anything starts. Every request but the cards
needs the bearer token, and a foreign Host or Origin is refused (DNS rebinding).
A message starts
``spawn.py --agent SKILL --background`` with the message's text as the task, and
the task's status follows the agent's session directory: working (transcript
lines), input-required (an ask in its subtree; the caller's next message answers
it; or an agent of the subtree paused at its budget, until someone runs
``spawn.py budget SESSION --raise USD`` here: any message then follows it on),
then completed with the output as an artifact, or failed, rejected or canceled.
Cancelling the task ends the agent's subtree (``spawn.py kill``).

The caller's depth, max depth, deadline, budget and traceparent ride in the
message metadata (``spawn.depth``, ``spawn.max_depth``, ``spawn.deadline``,
``spawn.max_budget_usd``, ``spawn.traceparent``); the agent gets the smallest of
those and this server's own --max-depth, --max-budget-usd and --timeout, so a
tree that crosses machines keeps shrinking and keeps one trace id.

It drives spawn.py only through its command line and the session files (never
by import), so it works with any copy of spawn.py (``--spawn PATH``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import shlex
import socket
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import session_files
import uvicorn
from a2a.helpers.proto_helpers import new_data_part, new_task_from_user_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events import Event, EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes import DefaultServerCallContextBuilder, create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    GetTaskRequest,
    HTTPAuthSecurityScheme,
    Message,
    SecurityRequirement,
    SecurityScheme,
    SendMessageRequest,
    Task,
    TaskState,
)
from a2a.utils.errors import InvalidParamsError
from google.protobuf import json_format
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

__version__ = "0.1.0"

# ---------------------------------------------------------------- constants --

DEFAULT_SPAWN = Path(__file__).resolve().parent.parent / "spawn.py"
DEFAULT_PORT = 9999  # the port the A2A samples use, so examples line up
# A served agent gets this much time unless the caller's deadline or --timeout is
# sooner: the same default a spawn.py root gets, since it is the root of this machine's part.
DEFAULT_TIMEOUT_S = 3600.0
# How often a task re-reads its agent's directory (transcript, asks, markers).
FOLLOW_TICK_S = 0.2
# After the caller's next message on a task paused at its budget, the same
# pause is not reported again for this long: the runner looks for a raise
# every half second (PAUSE_POLL_S in spawn.py), so a message sent right after
# `budget --raise` would otherwise meet the paused.json it is about to remove.
RESUME_GRACE_S = 3.0
# After the liveness watcher (spawn.py wait) ends without an outcome (a stale
# agent), wait this long before asking again.
WATCH_RETRY_S = 5.0
# A cancel waits this long for the killed agent's outcome before reporting canceled anyway.
KILL_SETTLE_S = 30.0
# One transcript line becomes at most this much status text: a progress line, not a log.
STATUS_TEXT_CHARS = 400
# Addresses that mean "every interface": no Host header names them.
WILDCARD_HOSTS = {"0.0.0.0", "::", ""}
# A generated bearer token: 32 random bytes, as URL-safe text.
TOKEN_BYTES = 32
# What --agent auto routes among, and what never names a skill: a node
# reference (a2a:URL, command:EXE, a URL, a path) that spawn.py's --agent would
# run as a node of another kind.
AUTO = "auto"
SKILL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}")
# The limits (spawn.py's own bounds) a caller's metadata may carry.
MAX_DEPTH_LIMIT = 100
MAX_BUDGET_USD = 1e6
MAX_DEADLINE = 9e12  # Unix seconds; past year 2255 is a typo
# Message metadata keys: the caller's tree context crossing the hop (sessions/README.md).
META_AGENT = "spawn.agent"
META_DEPTH = "spawn.depth"
META_MAX_DEPTH = "spawn.max_depth"
META_DEADLINE = "spawn.deadline"
META_BUDGET = "spawn.max_budget_usd"
META_TRACEPARENT = "spawn.traceparent"
META_DECISION = "spawn.decision"
# A steer: a message for the served agent's inbox (`spawn.py send`), never an answer to an ask.
META_STEER = "spawn.steer"
# A signed claim of the caller's limits (tools/spawn_claims.py), and its signature.
META_CLAIM = "spawn.claim"
META_CLAIM_SIG = "spawn.claim_sig"
ALLOW_WORDS = {"allow", "approve", "approved", "yes", "y", "ok"}
DENY_WORDS = {"deny", "denied", "reject", "no", "n"}


# ------------------------------------------------------------------- errors --


class ServerError(Exception):
    """A problem a caller or the person starting the server can fix; its text is one line."""


class BadFlag(ServerError, ValueError):
    """A server flag is wrong: exit 2 before anything is served."""


class BadMetadata(ServerError, ValueError):
    """A message's spawn.* metadata is malformed: the task is rejected, nothing is started."""


# ------------------------------------------------------------------ records --


@dataclass
class CallerContext:
    """What the calling tree passes across the hop, from the message metadata."""

    agent: str | None = None
    """The skill the message asks for (the URL's /agents/NAME wins)."""
    depth: int | None = None
    """The calling node's depth: the served agent runs one below it."""
    max_depth: int | None = None
    deadline: float | None = None
    """Absolute, Unix seconds."""
    max_budget_usd: float | None = None
    traceparent: str | None = None


@dataclass
class ClaimCheck:
    """--require-claim: the tree's public key, this server's audience name, the nonces seen."""

    public_key: Any
    """An Ed25519PublicKey (cryptography is imported only when claims are required)."""
    audience: str
    replay: Any
    """spawn_claims.ReplayCache."""

    @classmethod
    def load(cls, key_file: str, audience: str) -> ClaimCheck:
        import spawn_claims

        try:
            return cls(spawn_claims.load_public_key(key_file), audience, spawn_claims.ReplayCache())
        except (OSError, ValueError) as exc:
            raise BadFlag(f"--require-claim {key_file}: {exc}; give the tree's Ed25519 public key (PEM)") from None

    def narrow(self, metadata: Mapping[str, Any], caller: CallerContext) -> None:
        """Check the message's claim and narrow caller to it; BadMetadata says why a claim is refused."""
        import spawn_claims

        text, sig = metadata.get(META_CLAIM), metadata.get(META_CLAIM_SIG)
        try:
            claim = spawn_claims.verify_claim(
                text if isinstance(text, str) else None,
                sig if isinstance(sig, str) else None,
                self.public_key,
                audience=self.audience,
                replay=self.replay,
            )
        except spawn_claims.ClaimError as exc:
            raise BadMetadata(f"refused: {exc} (metadata {META_CLAIM} and {META_CLAIM_SIG})") from None
        caller.depth = max(caller.depth or 0, claim.depth - 1)  # the served agent runs at the claim's depth
        caller.max_depth = int(session_files.min_known(caller.max_depth, claim.max_depth) or 0)
        caller.deadline = session_files.min_known(caller.deadline, claim.deadline)
        caller.max_budget_usd = session_files.min_known(caller.max_budget_usd, claim.budget_hold_usd)


@dataclass
class ServerLimits:
    max_depth: int | None = None
    max_budget_usd: float | None = None
    timeout_s: float | None = DEFAULT_TIMEOUT_S


@dataclass
class Run:
    """One A2A task's agent, as this server follows it."""

    task_id: str
    agent_id: str
    agent_dir: Path
    transcript_offset: int = 0
    asking: str | None = None
    """The ask id the task's input-required is about."""
    final: bool = False
    """A terminal status was published: nothing more is sent for this task."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    watcher: asyncio.subprocess.Process | None = None
    watcher_ended_at: float | None = None
    pause_reported: tuple[str, str] | None = None
    """The paused agent (id, since) the task's input-required is about."""
    resumed_at: float | None = None
    """When the caller's last message on a paused task came (time.monotonic())."""

    @property
    def session(self) -> Path:
        return self.agent_dir.parent.parent

    @property
    def caller(self) -> str:
        """Who answers and steers for the task, as spawn.py's --as records it."""
        return f"a2a:{self.task_id[:40]}"


# ---------------------------------------------------------------- pure core --


def is_skill_name(name: str) -> bool:
    """A plain definition name: never a node reference (a2a:, command:, a URL, a path) nor `auto`."""
    return SKILL_NAME.fullmatch(name) is not None and name != AUTO


def host_name(value: str) -> str | None:
    """The host of a Host header or URL netloc, without port or brackets, lower case; None if malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        rest = value[end + 1 :]
        if end < 0 or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
        return value[1:end] or None
    name, _, port = value.partition(":")
    if port and not port.isdigit():
        return None
    return name or None


def our_hosts(bind_host: str, base_url: str) -> set[str]:
    """The names a request to this server may carry in Host and Origin (as the MCP server's):
    the loopback names, the bound --host and the advertised URL's host. Anything else is a
    page on another site reaching this server through DNS rebinding, or a proxy's mistake."""
    from urllib.parse import urlsplit

    hosts = set(session_files.LOOPBACK_NAMES)
    if bind_host not in WILDCARD_HOSTS:
        hosts.add(bind_host.lower())
    advertised = urlsplit(base_url).hostname
    if advertised:
        hosts.add(advertised.lower())
    return hosts


def foreign_origin(origin: str, hosts: set[str]) -> bool:
    """Whether an Origin header names another site (a browser page that is not ours)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(origin.strip())
        name = parts.hostname
    except ValueError:
        return True
    return parts.scheme not in ("http", "https") or name is None or name.lower() not in hosts


def valid_traceparent(value: str) -> bool:
    """A W3C traceparent spawn.py accepts (same rule as its --parent-trace)."""
    m = re.fullmatch(r"[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}", value.strip())
    return m is not None and set(m.group(1)) != {"0"} and set(m.group(2)) != {"0"}


def metadata_number(metadata: Mapping[str, Any], key: str, *, integer: bool, maximum: float, zero_ok: bool) -> float | None:
    """A spawn.* number from metadata (JSON numbers arrive as doubles over protobuf), or None."""
    raw = metadata.get(key)
    if raw is None:
        return None
    value: float
    if isinstance(raw, bool):
        value = math.nan
    elif isinstance(raw, int | float):
        value = float(raw)
    elif isinstance(raw, str):
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
    else:
        value = math.nan
    kind = "a whole number" if integer else "a number"
    low = ">= 0" if zero_ok else "> 0"
    if not math.isfinite(value) or (integer and not value.is_integer()) or value < 0 or (value == 0 and not zero_ok) or value > maximum:
        raise BadMetadata(f"metadata {key} {raw!r} must be {kind} {low} and <= {maximum:g}")
    return value


def caller_context(metadata: Mapping[str, Any]) -> CallerContext:
    """The caller's tree context from a message's metadata; BadMetadata names the bad key."""
    ctx = CallerContext()
    agent = metadata.get(META_AGENT)
    if agent is not None:
        if not isinstance(agent, str) or not is_skill_name(agent):
            raise BadMetadata(f"metadata {META_AGENT} {agent!r} must be a skill id from the agent card")
        ctx.agent = agent
    depth = metadata_number(metadata, META_DEPTH, integer=True, maximum=MAX_DEPTH_LIMIT, zero_ok=True)
    max_depth = metadata_number(metadata, META_MAX_DEPTH, integer=True, maximum=MAX_DEPTH_LIMIT, zero_ok=True)
    ctx.depth = None if depth is None else int(depth)
    ctx.max_depth = None if max_depth is None else int(max_depth)
    ctx.deadline = metadata_number(metadata, META_DEADLINE, integer=False, maximum=MAX_DEADLINE, zero_ok=False)
    ctx.max_budget_usd = metadata_number(metadata, META_BUDGET, integer=False, maximum=MAX_BUDGET_USD, zero_ok=False)
    trace = metadata.get(META_TRACEPARENT)
    if trace is not None:
        if not isinstance(trace, str) or not valid_traceparent(trace):
            raise BadMetadata(f"metadata {META_TRACEPARENT} {str(trace)[:80]!r} is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)")
        ctx.traceparent = trace.strip()
    return ctx


def spawn_arguments(caller: CallerContext, limits: ServerLimits, skill: str) -> tuple[list[str], dict[str, str]]:
    """spawn.py's flags and environment for one served agent: the smaller of each limit.

    The caller's depth and deadline go through the variables spawn.py reads from a
    parent (SPAWN_DEPTH, SPAWN_DEADLINE), so the agent is counted one level below
    the calling node and keeps the parent's grace before its deadline. The rest
    are flags, which spawn.py narrows against whatever it inherits.
    """
    if not is_skill_name(skill):  # served_skill checked it; a reference must never reach --agent
        raise BadMetadata(f"{skill[:100]!r} is not a skill name")
    argv = ["--background", "--task-file", "-", "--agent", skill]
    env: dict[str, str] = {}
    max_depth = session_files.min_known(caller.max_depth, limits.max_depth)
    if max_depth is not None:
        argv += ["--max-depth", str(int(max_depth))]
    budget = session_files.min_known(caller.max_budget_usd, limits.max_budget_usd)
    if budget is not None:
        argv += ["--max-budget-usd", repr(float(budget))]
    if limits.timeout_s is not None:
        argv += ["--timeout", repr(float(limits.timeout_s))]
    if caller.traceparent is not None:
        argv += ["--parent-trace", caller.traceparent]
    if caller.depth is not None:
        env["SPAWN_DEPTH"] = str(caller.depth)
    if caller.deadline is not None:
        env["SPAWN_DEADLINE"] = repr(float(caller.deadline))
    return argv, env


def decision_of(text: str, metadata: Mapping[str, Any]) -> str | None:
    """allow / deny from an answer message (metadata spawn.decision, else its words), or None."""
    raw = metadata.get(META_DECISION)
    words = [str(raw)] if raw is not None else re.findall(r"[a-z]+", text.lower())[:3]
    for word in words:
        if word.lower() in ALLOW_WORDS:
            return "allow"
        if word.lower() in DENY_WORDS:
            return "deny"
    return None


def describe_transcript_line(record: Mapping[str, Any]) -> str | None:
    """The progress an A2A caller sees for one transcript line: the agent's text and tool calls."""
    if record.get("type") != "AssistantMessage":
        return None
    message = record.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    blocks = content if isinstance(content, list) else [{"text": content}] if isinstance(content, str) else []
    parts = []
    for block in blocks:
        if not isinstance(block, dict):
            continue
        if "name" in block and "input" in block:
            parts.append(f"{block['name']} {json.dumps(block.get('input'), ensure_ascii=False)}")
        elif block.get("text"):
            parts.append(str(block["text"]))
    return session_files.clip(" | ".join(parts), STATUS_TEXT_CHARS) if parts else None


def paused_text(paused: Mapping[str, Any], session: Path) -> str:
    return (
        f"agent {paused.get('id')} is paused at its budget: spent ${paused.get('spent_usd')}, its next turn needs "
        f"${paused.get('needed_usd')} more ({paused.get('reason')}); on this server run "
        f"'spawn.py budget {session} --raise USD', then reply to go on"
    )


def ask_text(ask: Mapping[str, Any]) -> str:
    call = session_files.clip(json.dumps(ask.get("input"), ensure_ascii=False), 200)
    return f"agent {ask.get('agent_id')} asks to run {ask.get('tool')}: {call} (rule {ask.get('rule')}); reply allow or deny"


def outcome_metadata(outcome: Mapping[str, Any], agent_dir: Path, subtree_costs: Sequence[float | None]) -> dict[str, Any]:
    """What the final status carries: the outcome's bounded fields and what the subtree spent.

    spawn.cost_usd is the whole served subtree's, so the caller charges its node for
    everything the hop caused; spawn.cost_partial marks a sum missing an unknown cost.
    """
    keys = ("status", "reason", "exit_code", "duration_s")
    data: dict[str, Any] = {f"spawn.{k}": outcome[k] for k in keys if outcome.get(k) is not None}
    if outcome.get("cost_usd") is not None:
        data["spawn.own_cost_usd"] = outcome["cost_usd"]
    known = [c for c in subtree_costs if c is not None]
    if known:
        data["spawn.cost_usd"] = sum(known)
        if len(known) < len(subtree_costs):
            data["spawn.cost_partial"] = True
    data["spawn.agent_id"] = agent_dir.name
    data["spawn.agent_dir"] = str(agent_dir)
    return data


# ------------------------------------------------------- on-disk protocol --


def subtree_costs(session: Path, root: str) -> list[float | None]:
    """Each agent's cost in the subtree (None when unknown); agents refused before they ran cost nothing."""
    costs: list[float | None] = []
    for agent in sorted(session_files.subtree_ids(session, {root})):
        outcome = session_files.read_json(session / "agents" / agent / "outcome.json") or {}
        cost = outcome.get("cost_usd")
        if isinstance(cost, int | float) and not isinstance(cost, bool):
            costs.append(float(cost))
        elif not (outcome.get("status") == "refused" and not outcome.get("transcript")):
            costs.append(None)
    return costs


def new_transcript_lines(run: Run) -> list[dict[str, Any]]:
    """Whole lines appended since the last read (lines are appended with O_APPEND, so whole)."""
    path = run.agent_dir / "transcript.jsonl"
    try:
        with open(path, "rb") as fh:
            fh.seek(run.transcript_offset)
            data = fh.read()
    except OSError:
        return []
    end = data.rfind(b"\n") + 1
    run.transcript_offset += end
    return session_files.parse_jsonl(data[:end].splitlines())


# ---------------------------------------------------------------- processes --


@dataclass
class Config:
    spawn: list[str]
    """The command that runs spawn.py, e.g. [python, /path/spawn.py]."""
    cwd: Path
    """The project whose .claude/agents are served and where agents run."""
    session_root: str | None
    limits: ServerLimits
    default_agent: str
    """--agent: a skill name, or auto."""
    environ: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    claims: ClaimCheck | None = None
    """--require-claim: callers without a valid claim are refused."""


class Spawner:
    """spawn.py's verbs, run as subprocesses in the served project."""

    def __init__(self, config: Config) -> None:
        self.config = config

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(self.config.environ)
        if self.config.session_root is not None:
            env["SPAWN_SESSION_ROOT"] = self.config.session_root
        env.update(extra or {})
        return env

    async def run(self, *args: str, stdin: bytes | None = None, env: Mapping[str, str] | None = None) -> tuple[int, str, str]:
        return await session_files.run_cli(self.config.spawn, *args, env=self.env(env), cwd=self.config.cwd, stdin=stdin)

    async def run_json(
        self, *args: str, ok: Sequence[int] = (0,), stdin: bytes | None = None, env: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        return session_files.cli_json(*await self.run(*args, stdin=stdin, env=env), ok)

    async def agents(self) -> list[dict[str, Any]]:
        """The skills served: the definition files `agents list` shows, under a plain name each.

        Not spawn.py's built-in agents: a project serves what its own files
        (or its user's) define, and a remote caller gets nothing more.
        """
        data = await self.run_json("agents", "list", "--json")
        return [
            a
            for a in data.get("agents", [])
            if isinstance(a, dict) and isinstance(a.get("name"), str) and is_skill_name(a["name"]) and a.get("source") != "built-in"
        ]

    async def served_skill(self, requested: str, task: str) -> str:
        """The listed skill a message runs; BadMetadata, with nothing started, for anything else.

        The card's skills are the allow-list: spawn.py's --agent would also run a
        node reference (command:EXE runs a program) or its own default agent.
        """
        names = [str(a["name"]) for a in await self.agents()]
        listed = f"the skills are {', '.join(names) or 'none'} (see the agent card)"
        if requested == AUTO:
            chosen = await self.route(task)
            if chosen not in names:
                raise BadMetadata(f"no skill matches the task; name one (/agents/NAME or metadata {META_AGENT}): {listed}")
            return str(chosen)
        if requested not in names:
            raise BadMetadata(f"no skill {requested[:100]!r} is served here; {listed}")
        return requested

    async def route(self, task: str) -> str | None:
        """The definition spawn.py's --agent auto picks for task (a dry run: nothing is written)."""
        data = await self.run_json("--agent", AUTO, "--task-file", "-", "--dry-run", ok=(0, 4), stdin=task.encode())
        chosen = data.get("agent")
        return chosen if isinstance(chosen, str) else None

    async def start(self, task: str, caller: CallerContext, skill: str) -> dict[str, Any]:
        # This machine's settings files still bind what it serves: spawn.py
        # reads them for an agent that has no parent here, whatever its depth.
        argv, env = spawn_arguments(caller, self.config.limits, skill)
        # The task goes on stdin: no argv size limit, and it stays out of `ps`.
        return await self.run_json(*argv, ok=(0, 4), stdin=task.encode(), env=env)

    async def kill(self, run: Run) -> None:
        with contextlib.suppress(session_files.CliError):  # already ended: nothing to kill
            await self.run_json("kill", run.agent_id, "--session", str(run.session))

    async def send(self, run: Run, text: str) -> None:
        """A caller's steer, to the served agent's inbox: `spawn.py send`, from here, outside its tree."""
        await self.run_json("send", run.agent_id, "-", "--session", str(run.session), "--as", run.caller, stdin=text.encode())

    async def answer(self, run: Run, ask_id: str, decision: str) -> None:
        verb = "approve" if decision == "allow" else "deny"
        await self.run_json(verb, ask_id, "--session", str(run.session), "--as", run.caller)

    async def watch(self, run: Run) -> None:
        """Keep a `spawn.py wait` on the agent: it is what notices an agent that died without an outcome."""
        if run.watcher is not None and run.watcher.returncode is None:
            return
        if run.watcher is not None and run.watcher_ended_at is None:
            run.watcher_ended_at = time.monotonic()
        if run.watcher_ended_at is not None and time.monotonic() - run.watcher_ended_at < WATCH_RETRY_S:
            return
        run.watcher_ended_at = None
        run.watcher = await asyncio.create_subprocess_exec(
            *self.config.spawn,
            "wait",
            run.agent_id,
            "--session",
            str(run.session),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            env=self.env(),
            cwd=self.config.cwd,
        )

    @staticmethod
    async def unwatch(run: Run) -> None:
        proc = run.watcher
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            await proc.wait()


# --------------------------------------------------------------------- A2A --


# outcome.json status -> the A2A state a caller sees.
TERMINAL_STATES: dict[str, TaskState] = {
    "done": TaskState.TASK_STATE_COMPLETED,
    "failed": TaskState.TASK_STATE_FAILED,
    "timeout": TaskState.TASK_STATE_FAILED,
    "refused": TaskState.TASK_STATE_REJECTED,
    "killed": TaskState.TASK_STATE_CANCELED,
    "interrupted": TaskState.TASK_STATE_CANCELED,
}


def message_metadata(context: RequestContext) -> dict[str, Any]:
    """The request's metadata overlaid with the message's own (the message wins)."""
    data = dict(context.metadata)
    if context.message is not None and context.message.HasField("metadata"):
        data.update(json_format.MessageToDict(context.message.metadata))
    return data


def message_text(message: Message | None) -> str:
    """The message's text parts, and its data parts as JSON, in order."""
    if message is None:
        return ""
    chunks = []
    for part in message.parts:
        if part.HasField("text"):
            chunks.append(part.text)
        elif part.HasField("data"):
            chunks.append(json.dumps(json_format.MessageToDict(part.data), ensure_ascii=False))
    return "\n".join(chunks)


class SkillContextBuilder(DefaultServerCallContextBuilder):
    """Carries the /agents/NAME path segment to the executor: the skill that URL serves."""

    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        skill = request.path_params.get("skill")
        if skill:
            context.state["skill"] = str(skill)
        return context


class SpawnExecutor(AgentExecutor):
    """Each A2A task is one spawn.py agent, followed through its session directory."""

    def __init__(self, spawner: Spawner) -> None:
        self.spawner = spawner
        self.runs: dict[str, Run] = {}

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id, context_id = str(context.task_id), str(context.context_id)
        updater = TaskUpdater(event_queue, task_id, context_id)
        run = self.runs.get(task_id)
        if context.current_task is None:
            if context.message is not None:
                await event_queue.enqueue_event(new_task_from_user_message(context.message))
            run = await self.start(context, updater)
            if run is None:
                return
        elif run is None:
            await updater.failed(self.say(updater, "this server no longer follows that task (it was restarted); send a new message"))
            return
        elif (
            context.current_task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
            and run.asking is not None
            and not await self.answer(run, context, updater)
        ):
            return
        elif context.current_task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED:
            run.resumed_at = time.monotonic()  # the caller says go on: a pause it has seen gets a moment to lift
        await self.follow(run, updater)

    async def start(self, context: RequestContext, updater: TaskUpdater) -> Run | None:
        """Start the agent; publish `rejected` (and return None) when the message or a limit refuses it."""
        text = message_text(context.message)
        try:
            metadata = message_metadata(context)
            caller = caller_context(metadata)
            if self.spawner.config.claims is not None:
                self.spawner.config.claims.narrow(metadata, caller)
            if not text.strip():
                raise BadMetadata("the message has no text: send the task as a text part")
            requested = context.call_context.state.get("skill") or caller.agent or self.spawner.config.default_agent
            skill = await self.spawner.served_skill(str(requested), text)
        except BadMetadata as exc:
            await updater.reject(self.say(updater, f"a2a_server: error: {exc}"))
            return None
        except session_files.CliError as exc:
            await updater.reject(self.say(updater, str(exc)))
            return None
        try:
            data = await self.spawner.start(text, caller, skill)
        except (session_files.CliError, BadMetadata) as exc:
            await updater.reject(self.say(updater, str(exc)))
            return None
        agent_dir = Path(str(data["agent_dir"]))
        run = Run(str(context.task_id), str(data["id"]), agent_dir)
        self.runs[run.task_id] = run
        if data.get("status") != "refused":  # a refusal is already its outcome: follow() reports it
            await self.publish(run, updater, TaskState.TASK_STATE_WORKING, f"agent {run.agent_id} started", self.identity(run))
        return run

    async def answer(self, run: Run, context: RequestContext, updater: TaskUpdater) -> bool:
        """Settle the ask the task is waiting on from the caller's reply; False if the reply was no answer."""
        ask_id = run.asking
        assert ask_id is not None
        decision = decision_of(message_text(context.message), message_metadata(context))
        if decision is None:
            ask = session_files.read_json(run.session / "asks" / f"{ask_id}.json") or {"id": ask_id}
            await self.publish(run, updater, TaskState.TASK_STATE_INPUT_REQUIRED, ask_text(ask), {"spawn.ask": ask})
            return False
        try:
            await self.spawner.answer(run, ask_id, decision)
        except session_files.CliError as exc:  # answered meanwhile (first answer wins) or expired: the agent goes on
            print(f"a2a_server: ask {ask_id}: {exc}", file=sys.stderr)
        run.asking = None
        await self.publish(run, updater, TaskState.TASK_STATE_WORKING, f"ask {ask_id}: {decision}", self.identity(run))
        return True

    async def follow(self, run: Run, updater: TaskUpdater) -> None:
        """Publish the agent's progress until it ends, or until an ask needs the caller (input-required)."""
        try:
            while not run.final:
                for record in new_transcript_lines(run):
                    line = describe_transcript_line(record)
                    if line:
                        await self.publish(run, updater, TaskState.TASK_STATE_WORKING, line, self.identity(run))
                outcome = session_files.committed_outcome(run.agent_dir)
                if outcome is not None:
                    await self.finish(run, updater, outcome)
                    return
                subtree = session_files.subtree_ids(run.session, {run.agent_id})
                asks = session_files.pending_asks(run.session, subtree, oldest_first=True)
                if asks:
                    run.asking = str(asks[0]["id"])
                    await self.publish(run, updater, TaskState.TASK_STATE_INPUT_REQUIRED, ask_text(asks[0]), {"spawn.ask": asks[0]})
                    return
                # A paused subtree waits for a person here: the caller is told why, and its next message follows on.
                paused = session_files.paused_agents(run.session, subtree)
                if paused and not self.lifting(run, paused[0]):
                    run.pause_reported = (str(paused[0].get("id")), str(paused[0].get("since")))
                    text = paused_text(paused[0], run.session)
                    await self.publish(run, updater, TaskState.TASK_STATE_INPUT_REQUIRED, text, {"spawn.paused": paused[0]})
                    return
                await self.spawner.watch(run)
                await asyncio.sleep(FOLLOW_TICK_S)
        finally:
            if run.final:
                await self.spawner.unwatch(run)

    @staticmethod
    def lifting(run: Run, paused: Mapping[str, Any]) -> bool:
        """The pause the caller was told of, just after its next message: its runner may not have seen the raise yet."""
        seen = run.pause_reported == (str(paused.get("id")), str(paused.get("since")))
        return seen and run.resumed_at is not None and time.monotonic() - run.resumed_at < RESUME_GRACE_S

    async def finish(self, run: Run, updater: TaskUpdater, outcome: Mapping[str, Any]) -> None:
        status = str(outcome.get("status"))
        state = TERMINAL_STATES.get(status, TaskState.TASK_STATE_FAILED)
        async with run.lock:
            if run.final:
                return
            if status == "done" and outcome.get("output") is not None:
                output = outcome["output"]
                part = new_text_part(output) if isinstance(output, str) else new_data_part(output)
                await updater.add_artifact([part], name="output", metadata={"spawn.agent_id": run.agent_id})
            run.final = True
            reason = str(outcome.get("reason") or status)
            await updater.update_status(state, message=self.say(updater, reason), metadata=self.final_metadata(run, outcome))

    async def publish(self, run: Run, updater: TaskUpdater, state: TaskState, text: str, metadata: dict[str, Any]) -> None:
        async with run.lock:
            if not run.final:
                await updater.update_status(state, message=self.say(updater, text), metadata=metadata)

    @staticmethod
    def final_metadata(run: Run, outcome: Mapping[str, Any]) -> dict[str, Any]:
        return outcome_metadata(outcome, run.agent_dir, subtree_costs(run.session, run.agent_id))

    @staticmethod
    def say(updater: TaskUpdater, text: str) -> Message:
        return updater.new_agent_message([new_text_part(text)])

    @staticmethod
    def identity(run: Run) -> dict[str, Any]:
        meta = session_files.read_json(run.agent_dir / "meta.json") or {}
        data = {"spawn.agent_id": run.agent_id, "spawn.session": str(run.session)}
        for key in ("depth", "trace_id"):
            if meta.get(key) is not None:
                data[f"spawn.{key}"] = meta[key]
        return data

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id = str(context.task_id)
        updater = TaskUpdater(event_queue, task_id, str(context.context_id))
        run = self.runs.get(task_id)
        if run is None:
            await updater.cancel()
            return
        await self.spawner.kill(run)
        if run.asking is not None:
            # Killed first, so a no can't let the agent take another turn; then the ask
            # is settled as the caller's no rather than left pending for an ended agent.
            with contextlib.suppress(session_files.CliError):
                await self.spawner.answer(run, run.asking, "deny")
        limit = time.monotonic() + KILL_SETTLE_S
        while (outcome := session_files.committed_outcome(run.agent_dir)) is None and time.monotonic() < limit:
            await asyncio.sleep(FOLLOW_TICK_S)
        async with run.lock:
            if not run.final:
                run.final = True
                metadata = self.final_metadata(run, outcome or {"status": "killed"})
                await updater.update_status(TaskState.TASK_STATE_CANCELED, message=self.say(updater, "killed by cancel"), metadata=metadata)
        await self.spawner.unwatch(run)

    async def shutdown(self) -> None:
        """End what is still running: once the server stops, no caller can see or cancel it."""
        live = [run for run in self.runs.values() if session_files.committed_outcome(run.agent_dir) is None]
        await asyncio.gather(*(self.spawner.kill(run) for run in live))
        await asyncio.gather(*(self.spawner.unwatch(run) for run in self.runs.values()))


def build_card(base_url: str, skills: list[dict[str, Any]], token: bool, name: str, description: str) -> AgentCard:
    card = AgentCard(
        name=name,
        description=description,
        version=__version__,
        supported_interfaces=[AgentInterface(url=base_url, protocol_binding="JSONRPC", protocol_version="1.0")],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain", "application/json"],
        default_output_modes=["text/plain", "application/json"],
        skills=[
            AgentSkill(
                id=str(s["name"]),
                name=str(s["name"]),
                description=str(s.get("description") or s["name"]),
                tags=[str(s.get("source") or "project"), *(str(t) for t in s.get("tools") or [])],
            )
            for s in skills
        ],
    )
    if token:
        card.security_schemes["bearer"].CopyFrom(SecurityScheme(http_auth_security_scheme=HTTPAuthSecurityScheme(scheme="Bearer")))
        requirement = SecurityRequirement()
        requirement.schemes["bearer"].SetInParent()
        card.security_requirements.append(requirement)
    return card


class SteeringHandler(DefaultRequestHandler):
    """a2a-sdk's handler, except that a steer (message metadata spawn.steer) goes straight to the agent's inbox.

    a2a-sdk runs a task's messages one after another: a message to a working task
    waits until execute() returns, at an ask or at the end, and a message that
    meets an ask is taken as its answer. A steer must do neither, so it never
    reaches execute(): it is handed to `spawn.py send` at once, and the task as
    it stands is the reply. Any other message, and a steer to a task this server
    doesn't follow (or has ended), takes a2a-sdk's own path.
    """

    def __init__(self, executor: SpawnExecutor, **kwargs: Any) -> None:
        super().__init__(agent_executor=executor, **kwargs)
        self.spawn_executor = executor

    async def on_message_send(self, params: SendMessageRequest, context: ServerCallContext) -> Message | Task:
        steered = await self.steered(params, context)
        return steered if steered is not None else await super().on_message_send(params, context)

    async def on_message_send_stream(self, params: SendMessageRequest, context: ServerCallContext) -> AsyncGenerator[Event, None]:
        steered = await self.steered(params, context)
        if steered is not None:
            yield steered
            return
        async for event in super().on_message_send_stream(params, context):
            yield event

    async def steered(self, params: SendMessageRequest, context: ServerCallContext) -> Task | None:
        message = params.message
        metadata = json_format.MessageToDict(message.metadata) if message.HasField("metadata") else {}
        run = self.spawn_executor.runs.get(message.task_id) if metadata.get(META_STEER) is True else None
        if run is None or run.final:
            return None
        text = message_text(message)
        if not text.strip():
            raise InvalidParamsError(message="a steer needs text: send it as a text part")
        try:
            await self.spawn_executor.spawner.send(run, text)
        except session_files.CliError as exc:  # it has ended meanwhile, or refused the sender
            raise InvalidParamsError(message=str(exc)[:500]) from None
        task: Task | None = await self.on_get_task(GetTaskRequest(id=message.task_id), context)
        return task


def build_app(executor: SpawnExecutor, base_url: str, token: str | None, skills: list[dict[str, Any]], hosts: set[str]) -> ASGIApp:
    spawner = executor.spawner
    root_card = build_card(f"{base_url}/", skills, token is not None, "spawn", "spawn.py agents on this machine")
    handler = SteeringHandler(executor, task_store=InMemoryTaskStore(), agent_card=root_card)
    context_builder = SkillContextBuilder()

    async def current_card(card: AgentCard) -> AgentCard:
        # Definitions are read on each fetch: a new .claude/agents file is a new skill without a restart.
        fresh = AgentCard()
        fresh.CopyFrom(card)
        del fresh.skills[:]
        fresh.skills.extend(build_card(base_url, await spawner.agents(), False, "", "").skills)
        return fresh

    async def skill_card(request: Request) -> Response:
        skill = str(request.path_params["skill"])
        agents = [a for a in await spawner.agents() if a["name"] == skill]
        if not agents:
            return JSONResponse({"error": f"no skill {skill!r}; the skills are in {base_url}/.well-known/agent-card.json"}, status_code=404)
        description = str(agents[0].get("description") or skill)
        card = build_card(f"{base_url}/agents/{skill}", agents, token is not None, skill, description)
        return JSONResponse(agent_card_to_dict(card))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await handler.aclose()

    routes = [
        *create_agent_card_routes(root_card, card_modifier=current_card),
        Route("/agents/{skill}/.well-known/agent-card.json", skill_card, methods=["GET"]),
        *create_jsonrpc_routes(handler, "/", context_builder=context_builder),
        *create_jsonrpc_routes(handler, "/agents/{skill}", context_builder=context_builder),
    ]
    inner = Starlette(routes=routes, lifespan=lifespan)

    async def refuse(send: Send, status: int, text: str, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"text/plain"), *(headers or [])]})
        await send({"type": "http.response.body", "body": text.encode() + b"\n"})

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await inner(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        # As the MCP server: a Host or Origin that isn't this server's is a page
        # elsewhere reaching it through DNS rebinding (421, 403), on every route.
        host = host_name(headers.get(b"host", b"").decode("latin-1"))
        if host is None or host not in hosts:
            await refuse(send, 421, "Invalid Host header")
            return
        origin = headers.get(b"origin")
        if origin is not None and foreign_origin(origin.decode("latin-1"), hosts):
            await refuse(send, 403, "Invalid Origin header")
            return
        # The cards stay public, as A2A clients fetch them before they authenticate;
        # they name the bearer scheme. Everything else needs the token.
        path = str(scope.get("path", ""))
        public = scope.get("method") == "GET" and path.endswith("/agent-card.json")
        if token is not None and not public and not session_files.token_matches(headers.get(b"authorization", b""), token):
            await refuse(send, 401, "missing or wrong bearer token", [(b"www-authenticate", b"Bearer")])
            return
        # A caller inside a tree this server serves is refused, token or not: an
        # unsandboxed agent runs as the person and can read the token file, and
        # with it answer its own ask (session_files.served_agent_calling).
        served = {run.session for run in list(executor.runs.values())}
        if not public and (agent := session_files.served_agent_calling(scope.get("client"), served)) is not None:
            await refuse(send, 403, f"agent {agent} runs in a tree this server serves: it may not call the server")
            return
        # /agents/NAME serves a listed skill only: anything else (command:EXE, a
        # path) is not found here, before a task exists.
        skill = re.match(r"/agents/([^/]*)", path)
        if skill and not public and skill.group(1) not in {str(a["name"]) for a in await spawner.agents()}:
            await refuse(send, 404, f"no skill {skill.group(1)[:100]!r}; the skills are in {base_url}/.well-known/agent-card.json")
            return
        await inner(scope, receive, send)

    return app


# ---------------------------------------------------------------------- CLI --


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line that says what to do."""

    def error(self, message: str) -> NoReturn:
        print(f"a2a_server: error: {message}; see --help", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="a2a_server.py", description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1); off loopback needs --token-file")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to bind (default {DEFAULT_PORT}; 0 picks a free one)")
    p.add_argument("--port-file", metavar="PATH", help="write the bound port here once serving (for --port 0)")
    p.add_argument("--url", metavar="URL", help="the base URL the card advertises (default http://HOST:PORT)")
    p.add_argument(
        "--token-file",
        metavar="PATH",
        help="the bearer token callers must send (default: a new one, written to a 0600 file whose path is printed)",
    )
    p.add_argument("--no-token", action="store_true", help="serve without a bearer token (loopback --host only)")
    p.add_argument("--spawn", metavar="PATH", default=str(DEFAULT_SPAWN), help="spawn.py to run (default: beside tools/)")
    p.add_argument("--python", metavar="CMD", help="how to run spawn.py (default $SPAWN_PYTHON, else 'uv run --script')")
    p.add_argument("--session", metavar="DIR", help="session root (default $SPAWN_SESSION_ROOT, as spawn.py)")
    p.add_argument("--cwd", metavar="DIR", help="the project whose .claude/agents are served and where agents run (default: here)")
    p.add_argument(
        "--agent",
        metavar="NAME",
        default="auto",
        help="skill for a message that names none (default auto: routed by its text among the listed skills)",
    )
    p.add_argument("--max-depth", type=int, metavar="N", help="deepest depth a served agent's tree may reach")
    p.add_argument("--max-budget-usd", type=float, metavar="X", help="USD cap of each served agent's tree")
    p.add_argument(
        "--timeout",
        type=float,
        metavar="S",
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds each served agent may take (default {DEFAULT_TIMEOUT_S:g}); 0: none of its own",
    )
    p.add_argument(
        "--require-claim",
        metavar="PUBKEY",
        help="refuse callers without a claim (metadata spawn.claim, spawn.claim_sig) signed by this Ed25519 public key (PEM file)",
    )
    p.add_argument("--claim-audience", metavar="NAME", help="the audience claims must name (default: the card's base URL)")
    return p


def check_flags(args: argparse.Namespace) -> None:
    if not 0 <= args.port <= 65535:
        raise BadFlag(f"--port {args.port} is not a port; use 0-65535")
    if args.max_depth is not None and not 0 <= args.max_depth <= MAX_DEPTH_LIMIT:
        raise BadFlag(f"--max-depth {args.max_depth} must be 0-{MAX_DEPTH_LIMIT}")
    if args.max_budget_usd is not None and not (math.isfinite(args.max_budget_usd) and 0 < args.max_budget_usd <= MAX_BUDGET_USD):
        raise BadFlag(f"--max-budget-usd {args.max_budget_usd} must be a positive amount up to {MAX_BUDGET_USD:g}")
    if not (math.isfinite(args.timeout) and args.timeout >= 0):
        raise BadFlag(f"--timeout {args.timeout} must be seconds >= 0 (0: no timeout of its own)")
    if not Path(args.spawn).is_file():
        raise BadFlag(f"--spawn {args.spawn} is not a file; point it at spawn.py")
    if args.cwd is not None and not Path(args.cwd).is_dir():
        raise BadFlag(f"--cwd {args.cwd} is not a directory")
    if args.url is not None and not re.fullmatch(r"https?://[^\s/]+(/\S*)?", args.url):
        raise BadFlag(f"--url {args.url!r} must be an http(s) URL, e.g. https://agents.example.com")
    if args.agent != AUTO and not is_skill_name(args.agent):
        raise BadFlag(f"--agent {args.agent!r} must be the name of a listed skill (a definition in .claude/agents) or auto")
    if args.no_token and args.token_file:
        raise BadFlag("give --token-file or --no-token, not both")
    if args.no_token and not session_files.is_loopback(args.host):
        raise BadFlag(f"--no-token serves loopback only; {args.host} needs a bearer token (drop --no-token)")


def read_token(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        return session_files.read_token_file(path)
    except ValueError as exc:
        raise BadFlag(str(exc)) from None


def cache_dir(environ: Mapping[str, str]) -> Path:
    """spawn.py's per-user cache: $SPAWN_CACHE_DIR, else $XDG_CACHE_HOME/spawn, else ~/.cache/spawn."""
    if environ.get("SPAWN_CACHE_DIR"):
        return Path(environ["SPAWN_CACHE_DIR"]).expanduser()
    base = environ.get("XDG_CACHE_HOME") or str(Path(environ.get("HOME") or Path.home()) / ".cache")
    return Path(base).expanduser() / "spawn"


def new_token_file(environ: Mapping[str, str], port: int) -> tuple[str, Path]:
    """A fresh token, written to CACHE/a2a/PORT.token readable by this user only.

    The port names it, so a caller finds the token of the server it calls; one
    left by an earlier server on that port is replaced. O_EXCL with mode 0600:
    the file is never, even for a moment, readable by anybody else or a link
    someone else planted.
    """
    import secrets

    folder = cache_dir(environ) / "a2a"
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = folder / f"{port}.token"
        path.unlink(missing_ok=True)
        token = secrets.token_urlsafe(TOKEN_BYTES)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(token + "\n")
    except OSError as exc:
        raise BadFlag(f"can't write a token file in {folder}: {exc.strerror or exc}; pass --token-file PATH") from None
    return token, path


def bind(host: str, port: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        # Listening now, so a caller that reads --port-file is queued until uvicorn accepts.
        sock.listen(128)
    except OSError as exc:
        raise BadFlag(f"can't serve on {host}:{port}: {exc.strerror or exc}; pick another --host or --port") from None
    return sock


def base_url_for(host: str, port: int) -> str:
    if host in ("0.0.0.0", "::", ""):
        host = socket.getfqdn()
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class Server(uvicorn.Server):
    """uvicorn, ending the served agents first when it stops (Ctrl-C, SIGTERM).

    Once the server is gone no caller can see or cancel them; killing them first
    also ends the open streams with `canceled` instead of a cut connection.
    """

    def __init__(self, config: uvicorn.Config, executor: SpawnExecutor, token_path: Path | None) -> None:
        super().__init__(config)
        self.executor = executor
        self.token_path = token_path

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # Here, not after serve(): uvicorn ends the process with the signal it caught.
        if self.token_path is not None:
            self.token_path.unlink(missing_ok=True)  # the token dies with the server
        await self.executor.shutdown()
        await super().shutdown(sockets)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    environ = dict(os.environ)
    try:
        check_flags(args)
        token = read_token(args.token_file)
        sock = bind(args.host, args.port)
    except BadFlag as exc:
        print(f"a2a_server: error: {exc}", file=sys.stderr)
        return 2
    port = int(sock.getsockname()[1])
    token_path: Path | None = None
    if token is None and not args.no_token:
        try:
            token, token_path = new_token_file(environ, port)
        except BadFlag as exc:
            sock.close()
            print(f"a2a_server: error: {exc}", file=sys.stderr)
            return 2
    base_url = (args.url or base_url_for(args.host, port)).rstrip("/")
    config = Config(
        spawn=session_files.spawn_command(args.spawn, args.python, environ),
        cwd=Path(args.cwd).resolve() if args.cwd else Path.cwd(),
        session_root=str(Path(args.session).expanduser().resolve()) if args.session else None,
        limits=ServerLimits(args.max_depth, args.max_budget_usd, args.timeout or None),
        default_agent=args.agent,
        environ=environ,
    )
    if args.require_claim:
        try:
            config.claims = ClaimCheck.load(args.require_claim, args.claim_audience or base_url)
        except BadFlag as exc:
            sock.close()
            print(f"a2a_server: error: {exc}", file=sys.stderr)
            return 2
    executor = SpawnExecutor(Spawner(config))
    try:
        # Once before serving: a spawn.py that can't run here is a startup error, not a failed task.
        skills = asyncio.run(executor.spawner.agents())
    except (session_files.CliError, OSError) as exc:
        sock.close()
        print(f"a2a_server: error: can't run {shlex.join(config.spawn)} agents list: {exc}; check --spawn and --python", file=sys.stderr)
        return 2
    if args.agent != AUTO and args.agent not in {str(a["name"]) for a in skills}:
        sock.close()
        print(f"a2a_server: error: --agent {args.agent} is no listed skill (a .claude/agents definition); use one or auto", file=sys.stderr)
        return 2
    app = build_app(executor, base_url, token, skills, our_hosts(args.host, base_url))
    names = ", ".join(str(a["name"]) for a in skills) or "none; add definitions to .claude/agents"
    print(f"a2a_server: serving {base_url}/ (card {base_url}/.well-known/agent-card.json); skills: {names}", file=sys.stderr)
    if token_path is not None:
        print(f"a2a_server: bearer token in {token_path} (callers: SPAWN_A2A_TOKEN_FILE={token_path})", file=sys.stderr)
    elif token is None:
        print("a2a_server: warning: --no-token: any local process may run the listed skills", file=sys.stderr)
    sys.stderr.flush()
    if args.port_file:
        Path(args.port_file).write_text(f"{port}\n")
    # A stream still open once the agents are ended gets this long before it is cut.
    server = Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5), executor, token_path)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(server.serve(sockets=[sock]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
