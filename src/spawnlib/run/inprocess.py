"""In-process children: Claude Code's own subagents, governed as agents of the session.

Under --placement inprocess or auto, an agent's CLI starts its children itself
with the Agent tool, inside its own process, and they nest (the CLI's
CLAUDE_CODE_MAX_SUBAGENT_SPAWN_DEPTH). spawn.py's runner of that agent sees
every one of them through the SDK's hooks and makes each an agent of the
session: its own directory and meta.json, exactly one outcome, a copy of its
transcript. What the hooks carry, measured on CLI 2.1.329:

- PreToolUse/PostToolUse carry `agent_id` for a call a subagent makes (none
  for the main thread's); SubagentStart carries the new subagent's
  `agent_id` and `agent_type` but not who started it, so the Agent call that
  started it is the oldest one not yet matched (`pending`).
- SubagentStop carries `last_assistant_message` and `agent_transcript_path`;
  answering {"decision": "block", "reason": R} gives the subagent the user
  turn "Stop hook feedback:\\nR" and it goes on (stop_hook_active is then true).
- A PreToolUse deny reaches the model as the tool result
  "PreToolUse:TOOL hook error: REASON" (is_error): the call never runs.
  Deny plus {"continue": false} ends the subagent's turn there, and no
  SubagentStop follows: its outcome is committed at that boundary.

Its limits hold at those boundaries only (soft): a model call under way is
never cut short. The runner's own deadline and kill stay hard for the whole CLI.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import SpawnError
from ..core.output import note
from ..core.placement import (
    IN_PROCESS_POLICIES,
    PlacementError,
    decide_placement,
    parse_policy,
    process_needs,
    subagent_depth_limit,
)
from ..core.pure import canonical_tool, estimate_cost, parse_json, validate_output
from ..core.records import AgentMeta, Outcome, Status
from ..core.settings import Settings
from ..policy.agents import BUILTIN_SOURCE, AgentDefinition, agent_dirs_for, decide, load_definitions, summarize_input
from ..policy.channel import open_ask
from ..policy.gateway import gateway_url, name_subagent
from ..session.ledger import read_ledger
from ..session.protocol import (
    kill_request_reason,
    read_outcome,
)
from ..supervise.calls import CallRecord, drop_call_record, end_call_record, new_call_token, with_call_token, write_call_record
from ..supervise.supervisor import agent_context
from .running import child_environment
from .subagents import (
    AGENT_TOOL,
    ChildBook,
    InProcessChild,
    cli_transcript_turns,
)

SUBAGENT_SCHEMA_RETRIES = 2  # answers refused for their schema before the agent fails, as the CLI's StructuredOutput retries
GENERAL_PURPOSE = "general-purpose"
# The CLI's tool result for a call of a tool it doesn't offer (measured on 2.1.329): at the
# depth limit that is an Agent call spawn.py never sees in a hook, only in the stream.
NO_SUCH_TOOL = "No such tool available"


@dataclass
class ChildGate:
    """What an in-process agent may do next: its limits, its rules and asks, and whether its Agent call may start a child."""

    book: ChildBook
    shell_env: Mapping[str, str]
    """What the host's Bash, and its subagents', inherit: the environment rules such as Bash(...) are read in."""
    settings: Settings
    """The environment the host's runner read at its start."""
    schema_problems: Mapping[str, str] = field(default_factory=dict)
    """A definition whose schema doesn't load: only an Agent call of that type is refused, with this."""

    def stop_reason(self, child: InProcessChild) -> tuple[Status, str] | None:
        """Why child may take no further turn: a kill, an ancestor's end, its deadline or budget."""
        if read_outcome(child.agent_dir) is not None:
            return Status.KILLED, kill_request_reason(child.agent_dir) or "its outcome was committed by another (spawn.py kill)"
        ancestor = self.ended_ancestor(child)
        if ancestor is not None:
            return Status.KILLED, f"ended with its ancestor {ancestor}"
        if child.meta.deadline is not None and time.time() >= child.meta.deadline:
            return Status.TIMEOUT, "deadline reached (at a tool-call boundary)"
        spent = self.spend(child) if child.meta.max_budget_usd is not None else 0.0
        if child.meta.max_budget_usd is not None and spent >= child.meta.max_budget_usd:
            return Status.FAILED, f"budget: its own turns (${spent:.4f}) reached its ${child.meta.max_budget_usd:.4f}"
        return None  # the tree's budget is its host's hold, which the host's runner keeps

    def ended_ancestor(self, child: InProcessChild) -> str | None:
        for above in self.ancestors(child):
            if above.ended or read_outcome(above.agent_dir) is not None:
                return above.meta.id
        return None

    def ancestors(self, child: InProcessChild) -> Iterator[InProcessChild]:
        """The in-process agents above child, nearest first (up to its host, which is none of them)."""
        by_id = {c.meta.id: c for c in self.book.children.values()}
        cursor = by_id.get(child.meta.parent_id or "")
        while cursor is not None:
            yield cursor
            cursor = by_id.get(cursor.meta.parent_id or "")

    async def permission(self, child: InProcessChild, tool: str, tool_input: Mapping[str, Any]) -> tuple[str, str, str]:
        """(allow|deny, rule, who decided) under child's own tools and rules."""
        meta = child.meta
        verdict, rule = decide(tool, tool_input, child.rules, meta.tools, cwd=meta.cwd, home=self.settings.home, environ=self.shell_env)
        if verdict == "ask":
            verdict, by = await self.ask(child, tool, tool_input, rule or "")
            return verdict, rule or "", by
        return verdict, rule or "", "rules"

    async def ask(self, child: InProcessChild, tool: str, tool_input: Mapping[str, Any], rule: str) -> tuple[str, str]:
        """(allow|deny, who answered) for a call an ask rule matched: delegated up the tree as the
        child's own ask (`spawn.py approve|deny ID`), as a process child's is; no answer is a no."""
        import asyncio

        timeout = self.settings.ask_timeout_s
        if child.meta.deadline is not None:
            timeout = min(timeout, max(0.0, child.meta.deadline - time.time()))
        channel = open_ask(child.meta, tool, tool_input, rule, timeout=timeout, secrets_=self.book.secrets)
        what = f"{tool} ({summarize_input(tool_input, 80)}; rule {rule})"
        ask = channel.ask_id
        note(f"agent {child.meta.id} asks to use {what}: run 'spawn.py approve {ask}' or 'spawn.py deny {ask}' within {timeout:.0f} s")
        try:
            answer = await asyncio.to_thread(channel.wait, child.meta.id, timeout, self.book.secrets)
        finally:
            channel.close()  # a stop while waiting denies the ask, by timeout
        return ("allow" if answer.get("verdict") == "approve" else "deny"), str(answer.get("by", "?"))

    def agent_call_problem(self, caller: AgentMeta, tool_input: Mapping[str, Any]) -> str | None:
        """Why caller's Agent call can't start an in-process child, or None."""
        if caller.depth + 1 > caller.max_depth:
            return f"max depth {caller.max_depth} reached: agent {caller.id} is at depth {caller.depth}"
        agent_type = str(tool_input.get("subagent_type") or "")
        if agent_type in self.schema_problems:
            return (
                f"definition {agent_type}'s schema can't be used: {self.schema_problems[agent_type]}; fix it (see 'spawn.py agents lint')"
            )
        definition = self.book.definitions.get(agent_type)
        needs = definition_needs(definition) if definition is not None else []
        try:
            decide_placement(self.book.policy, needs, by_agent_tool=True, is_root=False)
        except PlacementError as exc:
            return exc.message
        return None

    def spend(self, child: InProcessChild) -> float:
        """What child and the in-process agents below it spent: as the tree's gateway metered it, else its turns, estimated."""
        session = Path(child.meta.session)
        if gateway_url(session) is not None:
            ledger = read_ledger(session)
            mine = {c.meta.id for c in self.book.children.values() if c is child or any(a is child for a in self.ancestors(c))}
            return sum(ledger.spends.get(i, 0.0) for i in mine)
        return estimate_cost(cli_transcript_turns(child.transcript, child.meta.model)) if child.transcript else 0.0


BASH_TOOL = "Bash"


@dataclass
class CallTokens:
    """The tokens of a host's Bash calls: which agent of its CLI makes each (supervise/calls.py).

    Minted in the PreToolUse hook of a call its agent's rules allowed, ended
    in its PostToolUse (or PostToolUseFailure) hook, dropped when the host ends.
    """

    host_dir: Path
    cli: tuple[int, float] | None = None
    """The host's CLI process (pid, create time), once it has started."""
    live: dict[str, tuple[str, str]] = field(default_factory=dict)
    """By tool_use_id: (the token's digest, its owner's agent id), while its record is on disk."""

    def stamp(self, tool_input: Mapping[str, Any], owner: AgentMeta, owner_dir: Path, tool_use_id: str | None) -> dict[str, Any]:
        """The hook's answer for an allowed Bash call of owner: its command, with a fresh token set first."""
        command = tool_input.get("command")
        if self.cli is None or not isinstance(command, str):
            return {}  # no command to stamp: a spawn.py in it would be refused for want of a token
        token, digest = new_call_token()
        record = CallRecord(agent_context(owner, owner_dir), str(tool_use_id or ""), self.cli, cli_children(self.cli[0]))
        write_call_record(self.host_dir, digest, record)
        self.live[str(tool_use_id or digest)] = (digest, owner.id)
        updated = {**tool_input, "command": with_call_token(command, token)}
        return {"hookSpecificOutput": {"hookEventName": "PreToolUse", "updatedInput": updated}}

    def end(self, tool_use_id: str | None) -> None:
        entry = self.live.pop(str(tool_use_id or ""), None)
        if entry is not None:
            end_call_record(self.host_dir, entry[0], time.time())

    def drop(self) -> None:
        """At the host's end no call of its CLI runs: no token holds. (An agent that ended
        before it is refused by its outcome: call_owner reads it.)"""
        for digest, _ in self.live.values():
            drop_call_record(self.host_dir, digest)
        self.live.clear()


def cli_children(pid: int) -> list[int]:
    """The pids of the CLI's child processes now (none are a Bash call minted from here on)."""
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children()]
    except psutil.Error:
        return []


@dataclass
class InProcessTree:
    """The in-process agents below one runner's agent (its host): the SDK's hooks, dispatched.

    What a hook decides about a child is the gate's (ChildGate); what it
    records, the book's (ChildBook). The tree itself keeps only what matches
    the hooks to each other: Agent calls waiting for their SubagentStart, and
    the calls seen in the host's message stream.
    """

    book: ChildBook
    gate: ChildGate
    pending: collections.deque[tuple[str | None, str, dict[str, Any]]] = field(default_factory=collections.deque)
    """Agent calls let through, not yet matched to a SubagentStart: (caller's native id, tool_use_id, input)."""
    started_by: dict[str, InProcessChild] = field(default_factory=dict)
    """By the tool_use_id of the Agent call that started it: the stream's parent_tool_use_id of its messages."""
    agent_calls: dict[str, tuple[str | None, dict[str, Any]]] = field(default_factory=dict)
    """Agent calls seen in the stream, not yet answered: (the caller's parent_tool_use_id, input), by tool_use_id."""
    calls: CallTokens | None = None
    """The tokens of its agents' Bash calls, set by the host's runner."""

    @property
    def host(self) -> AgentMeta:
        return self.book.host

    @property
    def definitions(self) -> Mapping[str, AgentDefinition]:
        return self.book.definitions

    def host_share(self, outcome: Outcome) -> None:
        self.book.host_share(outcome)

    def running_children(self) -> list[tuple[str, Path]]:
        return self.book.running_children()

    def settle(self, host_status: Status | None, host_reason: str) -> None:
        if self.calls is not None:
            self.calls.drop()  # no Bash call of its CLI runs any more
        self.book.settle(host_status, host_reason)

    # ------------------------------------------------------------ the hooks --

    async def pre_tool_use(self, hook_input: Mapping[str, Any], tool_use_id: str | None) -> dict[str, Any] | None:
        """A verdict for a call an in-process agent makes; None for the host's own calls."""
        self.book.flush()
        native_id = str(hook_input.get("agent_id") or "")
        child = self.book.children.get(native_id)
        if child is None:
            return None
        tool = str(hook_input.get("tool_name", ""))
        tool_input = hook_input.get("tool_input") or {}
        stop = self.gate.stop_reason(child)
        if stop is not None:
            status, reason = stop
            self.book.record_decision(child, tool, tool_input, rule=reason, verdict="deny", by="limits", tool_use_id=tool_use_id)
            self.book.end(child, status, reason)
            return end_turn(f"stopped by spawn.py: {reason}")
        verdict, rule, by = await self.gate.permission(child, tool, tool_input)
        if verdict == "allow" and canonical_tool(tool) == AGENT_TOOL:
            # One audit line per call, saying what happened: a call its rules allowed but
            # its placement refuses is recorded as that refusal, never as allowed.
            refused = self.gate.agent_call_problem(child.meta, tool_input)
            if refused is not None:
                verdict, rule, by = "deny", refused, "placement"
        self.book.record_decision(child, tool, tool_input, rule=rule, verdict=verdict, by=by, tool_use_id=tool_use_id)
        if verdict != "allow":
            return deny_call(f"denied by spawn.py ({by}): {rule}")
        if canonical_tool(tool) == AGENT_TOOL:
            self.pending.append((native_id, str(tool_use_id or ""), dict(tool_input)))
        if canonical_tool(tool) == BASH_TOOL and self.calls is not None:
            return self.calls.stamp(tool_input, child.meta, child.agent_dir, tool_use_id)
        return {}

    def host_bash_call(self, verdict: Any, tool_input: Mapping[str, Any], tool_use_id: str | None) -> Any:
        """The host's own Bash call, as its gate answered: stamped with the host's token when allowed."""
        if verdict or self.calls is None:
            return verdict  # a denial (or any answer of its own) stands as it is
        return self.calls.stamp(tool_input, self.host, self.book.host_dir, tool_use_id)

    def call_ended(self, tool_use_id: str | None) -> None:
        if self.calls is not None:
            self.calls.end(tool_use_id)

    def host_agent_call(self, tool_input: Mapping[str, Any], tool_use_id: str | None) -> str | None:
        """The host's own Agent call, which its rules allowed: why it can't start a child, or None."""
        self.book.flush()
        refused = self.gate.agent_call_problem(self.book.host, tool_input)
        if refused is None:
            self.pending.append((None, str(tool_use_id or ""), dict(tool_input)))
        return refused

    async def subagent_start(self, hook_input: Mapping[str, Any]) -> dict[str, Any]:
        self.book.flush()
        native_id = str(hook_input.get("agent_id") or "")
        if not native_id or native_id in self.book.children:
            return {}
        caller, call_id, tool_input = self.pending.popleft() if self.pending else (None, "", {})
        parent = self.book.children[caller].meta if caller in self.book.children else self.book.host
        agent_type = str(hook_input.get("agent_type") or tool_input.get("subagent_type") or GENERAL_PURPOSE)
        child = self.book.register(parent, native_id, agent_type, tool_input)
        self.book.children[native_id] = child
        if child.ended is False:
            # Before its first model call (the CLI waits for this hook): the gateway charges that call to it.
            name_subagent(Path(self.host.session), self.host.id, native_id, child.meta.id)
        if call_id:
            self.started_by[call_id] = child
        self.book.locate_transcripts(str(hook_input.get("transcript_path") or ""))
        return {}

    async def subagent_stop(self, hook_input: Mapping[str, Any]) -> dict[str, Any]:
        self.book.flush()
        child = self.book.children.get(str(hook_input.get("agent_id") or ""))
        if child is None or child.ended:
            return {}
        child.transcript = Path(str(hook_input.get("agent_transcript_path") or "")) or child.transcript
        text = str(hook_input.get("last_assistant_message") or "")
        stop = self.gate.stop_reason(child)
        if stop is not None:
            child.finished = (stop[0], stop[1], text, [])
            return {}
        if child.meta.schema is None:
            child.finished = (Status.DONE, "completed", text, [])
            return {}
        output, errors = checked_answer(child.meta.schema, text)
        if errors and child.refused_answers < SUBAGENT_SCHEMA_RETRIES:
            child.refused_answers += 1
            reason = "Your answer must be one JSON value matching the schema; it does not: " + "; ".join(errors[:10])
            return {"decision": "block", "reason": reason}
        if errors:
            why = f"structured output does not match the schema ({len(errors)} error(s)) after {child.refused_answers} retries"
            child.finished = (Status.FAILED, why, output if output is not None else text, errors)
        else:
            child.finished = (Status.DONE, "completed", output, [])
        return {}

    def observe(self, kind: str, message: Mapping[str, Any]) -> None:
        """The host's message stream, which carries its subagents' turns too (parent_tool_use_id).

        An Agent call at the depth limit never reaches a hook: the CLI offers
        no Agent tool there and answers the call itself. It is recorded here,
        as a refused child, as a process child's spawn past the limit is.
        """
        blocks = message.get("content")
        if not isinstance(blocks, list):
            return
        above = message.get("parent_tool_use_id")
        for block in blocks:
            if not isinstance(block, dict):
                continue
            if kind == "AssistantMessage" and block.get("name") == AGENT_TOOL and isinstance(block.get("id"), str):
                self.agent_calls[block["id"]] = (above if isinstance(above, str) else None, dict(block.get("input") or {}))
            elif kind == "UserMessage" and isinstance(block.get("tool_use_id"), str):
                call = self.agent_calls.pop(block["tool_use_id"], None)
                if call is not None and block.get("is_error") and NO_SUCH_TOOL in str(block.get("content")):
                    self.record_unoffered(*call)

    def record_unoffered(self, above: str | None, tool_input: Mapping[str, Any]) -> None:
        """An Agent call the CLI answered "no such tool": a refused child when its caller is at the depth limit."""
        self.book.flush()
        caller = self.book.host if above is None else (self.started_by[above].meta if above in self.started_by else None)
        if caller is None or caller.depth < caller.max_depth:
            return  # not for its depth: the caller was never given the Agent tool at all
        refusal = f"depth limit: this agent would be at depth {caller.depth + 1}, the tree's max depth is {caller.max_depth}"
        agent_type = str(tool_input.get("subagent_type") or GENERAL_PURPOSE)
        self.book.register(caller, "", agent_type, tool_input, refusal=refusal)


# ------------------------------------------------------------- the wiring --


def withheld_agent_tool(meta: AgentMeta, tool: str) -> bool:
    """The Agent tool at the depth limit, where in-process children would start (see subagent_depth_limit)."""
    policy = (meta.placement or {}).get("policy")
    return tool == AGENT_TOOL and policy in IN_PROCESS_POLICIES and subagent_depth_limit(meta.depth, meta.max_depth) == 0


Hook = Callable[[Any, "str | None", Any], Awaitable[Any]]


def in_process_hooks(sdk: Any, tree: InProcessTree, gate: Hook, timeout: float) -> dict[str, Any]:
    """The SDK hooks of a host: its in-process agents' calls go to the tree, its own to its gate."""

    async def pre_tool_use(hook_input: Any, tool_use_id: str | None, context: Any) -> Any:
        verdict = await tree.pre_tool_use(hook_input, tool_use_id)
        if verdict is not None:
            return verdict
        verdict = await gate(hook_input, tool_use_id, context)  # its Agent calls: the gate asks host_agent_call
        if canonical_tool(str(hook_input.get("tool_name", ""))) == BASH_TOOL:
            return tree.host_bash_call(verdict, hook_input.get("tool_input") or {}, tool_use_id)
        return verdict

    async def post_tool_use(_hook_input: Any, tool_use_id: str | None, _context: Any) -> Any:
        tree.call_ended(tool_use_id)
        return {}

    async def start(hook_input: Any, _tool_use_id: str | None, _context: Any) -> Any:
        return await tree.subagent_start(hook_input)

    async def stop(hook_input: Any, _tool_use_id: str | None, _context: Any) -> Any:
        return await tree.subagent_stop(hook_input)

    return {
        "PreToolUse": [sdk.HookMatcher(matcher=None, hooks=[pre_tool_use], timeout=timeout)],
        "PostToolUse": [sdk.HookMatcher(matcher=BASH_TOOL, hooks=[post_tool_use])],
        "PostToolUseFailure": [sdk.HookMatcher(matcher=BASH_TOOL, hooks=[post_tool_use])],
        "SubagentStart": [sdk.HookMatcher(matcher=None, hooks=[start])],
        "SubagentStop": [sdk.HookMatcher(matcher=None, hooks=[stop])],
    }


def in_process_tree(
    meta: AgentMeta,
    agent_dir: Path,
    secrets_: Sequence[str],
    load_schema: Callable[[str], tuple[dict[str, Any], str]],
    settings: Settings,
) -> InProcessTree | None:
    """The governor of an agent's in-process children, under --placement inprocess or auto; None otherwise.

    load_schema resolves a definition's schema as --schema does (it lives above this layer).
    """
    policy = (meta.placement or {}).get("policy")
    if policy not in IN_PROCESS_POLICIES:
        return None
    definitions = file_definitions(Path(meta.cwd), settings)
    # Checked before the CLI starts, each on its own: one broken definition
    # refuses the Agent calls that name it, never the host's whole run.
    schemas: dict[str, tuple[dict[str, Any], str]] = {}
    problems: dict[str, str] = {}
    for name, d in definitions.items():
        if d.schema:
            try:
                schemas[name] = load_schema(d.schema)
            except SpawnError as exc:
                problems[name] = exc.message
    for name, problem in problems.items():
        note(f"warning: definition {name} ({definitions[name].path}): {problem}; an Agent call of type {name} is refused")
    shell_env = {**settings, **child_environment(meta, agent_dir, settings)}  # what the host's Bash, and its subagents', inherit
    book = ChildBook(meta, agent_dir, parse_policy(str(policy)), secrets_, definitions, schemas)
    return InProcessTree(book, ChildGate(book, shell_env, settings, schema_problems=problems), calls=CallTokens(agent_dir))


def file_definitions(cwd: Path, environ: Mapping[str, str]) -> dict[str, AgentDefinition]:
    """The project's and the user's agent definitions: the subagent types spawn.py governs.

    Not the built-in ones: those would shadow the CLI's own types of the same
    names (explore, plan), and parsing them is most of the cost, paid before
    the CLI's first request, by a host that may have no definitions at all.
    """
    if not agent_dirs_for(cwd, environ):
        return {}
    definitions, _ = load_definitions(cwd, environ)
    return {name: d for name, d in definitions.items() if d.source != BUILTIN_SOURCE}


def subagent_definitions(sdk: Any, tree: InProcessTree) -> dict[str, Any]:
    """spawn.py's agent definitions, offered to the CLI as subagent types (it reads no settings files here).

    Each within the host's tools; its limits, rules and schema are spawn.py's to keep (InProcessTree).
    """
    offered = {}
    for name, d in tree.definitions.items():
        if d.kind != "claude":
            continue
        tools = [t for t in tree.host.tools if d.tools is None or t in d.tools]
        offered[name] = sdk.AgentDefinition(description=d.description or name, prompt=d.prompt or f"You are the {name} agent.", tools=tools)
    return offered


# ---------------------------------------------------------------- pure parts --


def deny_call(reason: str) -> dict[str, Any]:
    return {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny", "permissionDecisionReason": reason}}


def end_turn(reason: str) -> dict[str, Any]:
    """Deny the call and end the subagent's turn there (no SubagentStop follows)."""
    return {"continue": False, "stopReason": reason, **deny_call(reason)}


def definition_needs(definition: AgentDefinition) -> list[str]:
    """What a definition asks for that only a process gives, under --placement auto."""
    return process_needs(
        own_cwd=definition.isolation == "worktree",
        deadline=definition.timeout is not None,
        budget=definition.max_budget_usd is not None,
        kind=definition.kind,
    )


def checked_answer(schema: Mapping[str, Any], text: str) -> tuple[Any, list[str]]:
    """(the answer as JSON, its schema errors): a subagent answers in text, so its JSON is its last message (pure)."""
    body = text.strip()
    if body.startswith("```"):
        body = body.strip("`").removeprefix("json").strip()
    try:
        output = parse_json(body)
    except (SpawnError, ValueError):
        return None, ["(root): the answer is not JSON"]
    return output, validate_output(schema, output)
