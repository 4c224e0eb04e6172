"""Records: dataclasses that mirror schemas/, and their JSON form."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .. import __version__
from .constants import DEFAULT_PERMISSION_MODE, PERMISSION_KINDS, PROTOCOL_VERSION
from .errors import ExitCode

# ------------------------------------------------------------------ records --


class Status(enum.StrEnum):
    """Lifecycle of an agent. Only DONE to INTERRUPTED are outcomes (final).

    The others are what `status` and `wait` observe of an agent with no
    outcome yet; they are never written to outcome.json.
    """

    RUNNING = "running"
    STALE = "stale"  # no outcome, process alive, heartbeat old
    QUEUED = "queued"  # no outcome, alive, waiting for a --max-concurrent slot
    LOST = "lost"  # no outcome, process gone; `reap` or `wait` records it
    STALLED = "stalled?"  # no outcome, idle over half its idle timeout; ended as stalled at the full one
    WAITING = "waiting"  # no outcome, blocked on its children, its --max-concurrent slot lent to them
    PAUSED = "paused"  # no outcome, alive, waiting at its budget for a raise (--on-budget pause)
    CORRUPT = "corrupt"  # its meta.json can't be read; inspect or remove it
    DONE = "done"
    FAILED = "failed"
    REFUSED = "refused"
    TIMEOUT = "timeout"
    KILLED = "killed"
    INTERRUPTED = "interrupted"


EXIT_FOR_STATUS: dict[Status, ExitCode] = {
    Status.DONE: ExitCode.OK,
    Status.FAILED: ExitCode.AGENT_FAILED,
    Status.REFUSED: ExitCode.REFUSED,
    Status.TIMEOUT: ExitCode.TIMEOUT,
    Status.KILLED: ExitCode.KILLED,
    Status.INTERRUPTED: ExitCode.INTERRUPTED,
}


@dataclass(frozen=True)
class Trace:
    """W3C trace context: one trace id per tree, one span id per agent."""

    trace_id: str
    span_id: str
    parent_span_id: str | None = None
    flags: str = "01"
    """trace-flags, kept from the parent: an unsampled trace stays unsampled."""

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{self.flags}"


@dataclass
class AgentMeta:
    """Who an agent is and what it was asked: meta.json (schemas/meta.json).

    Written once, before the model is called, and never changed.
    """

    id: str
    """Agent id, unique within its session."""
    parent_id: str | None
    """Id of the agent whose Bash started this one; None for the root."""
    depth: int
    """0 for the root, parent's depth + 1 below."""
    max_depth: int
    """Deepest depth this agent's subtree may reach."""
    pid: int
    """Process running this agent (spawn.py itself)."""
    create_time: float
    """That process's start time; with pid it identifies the process."""
    pgid: int
    """Process group of that process."""
    trace_id: str
    span_id: str
    traceparent: str
    task: str
    tools: list[str]
    disallowed_tools: list[str]
    model: str
    """Resolved model id or CLI alias."""
    cwd: str
    started_at: str
    """ISO 8601 UTC."""
    session: str
    """Session directory."""
    system_prompt: str
    preset: str | None = None
    schema: dict[str, Any] | None = None
    schema_source: str | None = None
    deadline: float | None = None
    """Absolute deadline, Unix seconds."""
    max_turns: int | None = None
    max_budget_usd: float | None = None
    idle_timeout_s: float | None = None
    """Seconds without a transcript event or CPU use before the agent counts as stalled."""
    on_budget: str | None = None
    """pause: wait at its budget for a raise (docs/steering.md); None or fail: fail there."""
    topic: str | None = None
    output_file: str | None = None
    background: bool = False
    parent_span_id: str | None = None
    agent: str | None = None
    """Name of the agent definition used, if any."""
    agent_source: str | None = None
    """Path of that definition file."""
    routing: dict[str, Any] | None = None
    """With --agent auto: the choice, the candidates and their scores."""
    permissions: dict[str, list[str]] = field(default_factory=lambda: {k: [] for k in PERMISSION_KINDS})
    """Effective rules (allow, deny, ask) in Claude Code's syntax."""
    permission_mode: str = DEFAULT_PERMISSION_MODE
    mcp_servers: list[str] = field(default_factory=list)
    """Names of the definition's MCP servers (their config stays in the definition file)."""
    skills: list[str] | None = None
    effort: str | int | None = None
    """The definition's effort (low ... max), passed to the CLI."""
    initial_prompt: str | None = None
    """The definition's initialPrompt, sent before the task."""
    isolation: str | None = None
    """worktree: the agent runs in a fresh git worktree of cwd."""
    memory: str | None = None
    """The definition's memory scope (user, project, local)."""
    hooks: list[str] = field(default_factory=list)
    """Events of the definition's hooks (their commands stay in the definition file)."""
    resumed_from: str | None = None
    """With --resume: the agent whose conversation this one continues."""
    pid_namespace: str | None = None
    """The pid namespace pid is valid in (readlink /proc/self/ns/pid). An
    agent started inside a parent's sandbox has a pid only that sandbox knows."""
    host: str | None = None
    """The host name pid runs on (os.uname().nodename)."""
    boot_id: str | None = None
    """That host's boot (/proc/sys/kernel/random/boot_id). With host, it says
    whether pid can be looked up here at all: pid namespaces have the same
    inode on every host, so only these tell another machine's pid apart."""
    sandbox: str = "off"
    """on: the agent's Bash runs inside Claude Code's sandbox (writes only in
    cwd, the agent and session directories; network only to allowed hosts).
    inherited: it runs inside its parent's sandbox already. off: no sandbox."""
    warnings: list[str] = field(default_factory=list)
    containment: str | None = None
    """What keeps the tree's processes from outliving it: "cgroup PATH" (a root
    creates PATH, children run inside it), "subreaper", or "none"."""
    kind: str = "claude"
    """What runs the node: claude (the local CLI), a2a (a remote A2A agent) or command (an executable)."""
    endpoint: str | None = None
    """a2a: the agent card's URL; command: the command line. Absent for claude."""
    placement: dict[str, Any] | None = None
    """Where it runs and why (placement.PlacementDecision): backend local, inprocess
    (a Claude Code subagent inside its parent's CLI) or ray; reason; policy (what
    its children inherit); on Ray also node_id, host and boot_id of the node its
    runner runs on (pid, host and boot_id above are the stand-in's, on the
    launcher's host). Absent in records written before placements."""
    spawn_version: str = __version__
    protocol: int = PROTOCOL_VERSION


@dataclass
class Outcome:
    """What happened: outcome.json (schemas/outcome.json). Written once."""

    id: str
    status: str
    reason: str
    exit_code: int
    ended_at: str
    duration_s: float
    output: Any = None
    """Validated structured output, or the final text when no schema."""
    text: str | None = None
    """The agent's last assistant text (kept even when it failed)."""
    validation_errors: list[str] = field(default_factory=list)
    cost_usd: float | None = None
    """Absent, not 0, when unknown."""
    cost_estimated: bool | None = None
    """True when cost_usd was priced from the transcript (no result from the CLI)."""
    cli_cost_usd: float | None = None
    """The CLI's own figure, kept beside cost_usd when the tree's gateway metered the agent's calls."""
    usage: dict[str, Any] | None = None
    turns: int | None = None
    sdk_session_id: str | None = None
    api_error_status: int | None = None
    transcript: str | None = None
    """Path of transcript.jsonl: what the agent did, kept whatever the status."""
    warnings: list[str] = field(default_factory=list)
    committed_by: str = "self"
    """self, or who committed it on the agent's behalf: guard, parent, wait, reap, kill, spawn."""
    worktree: str | None = None
    """With `isolation: worktree`: the worktree the agent changed, kept (branch spawn/ID)."""
    truncated: list[str] | None = None
    """The logs (transcript.jsonl, stderr.log) that reached SPAWN_TRANSCRIPT_MAX_BYTES and stopped growing."""
    protocol: int = PROTOCOL_VERSION


@dataclass
class Heartbeat:
    """heartbeat.json: the live CLI process, rewritten while it runs."""

    cli_pid: int
    cli_create_time: float
    cli_pgid: int
    updated_at: float
    interval_s: float
    """Readers call the agent stale after HEARTBEAT_STALE_BEATS missed beats."""
    last_activity_at: float | None = None
    """Unix seconds of the CLI's last transcript event or CPU use."""
    idle_timeout_s: float | None = None
    """The agent is ended as stalled once idle this long; `status` shows `stalled?` at half."""


@dataclass
class Limits:
    """limits.json: caps for the whole tree, set by the root, read by every spawn."""

    max_budget_usd: float | None = None
    """One budget shared by every agent of the session."""
    max_agents: int | None = None
    """Agents the session may register (refusals don't count)."""
    max_concurrent: int | None = None
    """Agents that may run at once; a spawn over it waits for a slot."""
    confirm_over_usd: float | None = None
    """A spawn that would take the tree's projected spend past this asks the root first."""
    protocol: int = PROTOCOL_VERSION


@dataclass
class LedgerEntry:
    """One line of ledger.jsonl: a budget hold taken, or what an ended agent spent.

    With a tree budget, an admitted agent first holds its cap (`reserve`);
    the outcome's commit, whoever makes it, charges what it spent (`charge`),
    which releases the hold. Lines without `kind` are charges (older ledgers).
    """

    id: str
    time: str
    kind: str = "charge"
    """reserve or charge."""
    status: str | None = None
    """charge: the committed status."""
    cost_usd: float | None = None
    """charge: absent when unknown, the tree's spend is then a lower bound."""
    cost_estimated: bool | None = None
    """charge: True when cost_usd was priced from the transcript's usage."""
    amount_usd: float | None = None
    """reserve: the agent's cap, held until its charge."""
    drawn_from: str | None = None
    """reserve: id of the ancestor whose hold pays for it; absent: the tree's remainder."""
    usage: dict[str, int] | None = None
    """charge: its token counts (USAGE_COUNTS), cache reads and writes beside input and output."""
    cli_cost_usd: float | None = None
    """charge: the CLI's own figure, where the gateway's is cost_usd."""


@dataclass
class ModelCall:
    """One model call the tree's gateway metered (a `spend` line of ledger.jsonl), as `status --json`
    lists it under its agent (schemas/status.json, `model_calls`): the agent is the row's."""

    time: str
    """When it ended (ISO 8601 UTC); it began duration_s before."""
    model: str
    usage: dict[str, int]
    """Its four token counts (USAGE_COUNTS): input, output, cache reads, cache writes."""
    cost_usd: float
    """At the gateway's price table; an agent's calls sum to its spend."""
    status: str
    """The upstream HTTP status ("200"), or cut (the caller left), deadline, error."""
    duration_s: float | None = None
    ttfb_s: float | None = None
    """Seconds to the answer's first byte; absent when none came."""


@dataclass
class AskRecord:
    """asks/ID.json: a tool call waiting for a person's or an ancestor's answer."""

    id: str
    agent_id: str
    tool: str
    input: str
    """A summary of the call's input (a command, a path)."""
    rule: str
    created_at: str
    expires_at: float
    """Unix seconds; unanswered by then, the call is denied."""
    protocol: int = PROTOCOL_VERSION


@dataclass
class AskAnswer:
    """asks/ID.answer.json: the first answer wins."""

    id: str
    verdict: str
    """approve or deny"""
    by: str
    """Who answered: approve or deny (the verbs, unnamed), the NAME of `--as NAME`
    (a root process, an MCP client), timeout, or terminal (the person at the root)."""
    at: str
    text: str | None = None
    """`approve --text TEXT`: the reply an a2a node sends its remote agent (input-required)."""
    protocol: int = PROTOCOL_VERSION


@dataclass
class AskAttempt:
    """One line of asks/ID.attempts.jsonl: an answer that was refused.

    An agent, or a process it started, tried to answer an ask of its own tree.
    """

    ask: str
    verdict: str
    """approve or deny: what the attempt asked for."""
    by: str
    """The name it gave (approve, deny, or --as NAME)."""
    at: str
    pid: int
    """The process that tried."""
    refused: str
    """Why it was refused."""
    protocol: int = PROTOCOL_VERSION


@dataclass
class SessionInfo:
    """session.json: written by the root agent when it creates the session."""

    id: str
    created_at: str
    topic: str
    root_agent: str
    protocol: int = PROTOCOL_VERSION


R = TypeVar("R")


def record_to_json(record: Any) -> dict[str, Any]:
    """A record as JSON, leaving out unknown (None) values."""
    return {k: v for k, v in dataclasses.asdict(record).items() if v is not None}


def record_from_json(cls: type[R], data: Mapping[str, Any]) -> R:
    """The inverse of record_to_json: absent values are None, unknown keys ignored."""
    names, required = _record_fields(cls)
    if data.keys() <= names and data.keys() >= required:  # the usual record: no key to drop or fill in
        return cls(**data)
    return cls(**{name: data.get(name) for name in names if name in data or name in required})


_FIELDS: dict[type, tuple[frozenset[str], frozenset[str]]] = {}


def _record_fields(cls: type) -> tuple[frozenset[str], frozenset[str]]:
    """A record's field names and those without a default, looked up once:
    `status` reads 10,000 records and dataclasses.fields() is slow."""
    if cls not in _FIELDS:
        fields = dataclasses.fields(cls)
        required = {f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
        _FIELDS[cls] = (frozenset(f.name for f in fields), frozenset(required))
    return _FIELDS[cls]
