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
import contextlib
import json
import os
import shutil
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.constants import META, TRANSCRIPT
from ..core.errors import SpawnError
from ..core.output import note
from ..core.placement import (
    IN_PROCESS_POLICIES,
    PlacementDecision,
    PlacementError,
    PlacementPolicy,
    decide_placement,
    parse_policy,
    process_needs,
    subagent_depth_limit,
)
from ..core.pure import canonical_tool, estimate_cost, new_trace, parse_json, redacted_json, utc_now_iso, validate_output
from ..core.records import EXIT_FOR_STATUS, AgentMeta, Outcome, Status, record_to_json
from ..policy.admission import counted_agents
from ..policy.agents import BUILTIN_SOURCE, AgentDefinition, RuleSet, agent_dirs_for, decide, load_definitions, parse_rule, summarize_input
from ..policy.channel import ask_timeout, open_ask
from ..session.protocol import (
    append_transcript,
    create_agent_dir,
    kill_request_reason,
    publish_once,
    read_limits,
    read_outcome,
    session_lock,
)
from ..supervise.commit import commit_outcome
from .running import child_environment

AGENT_TOOL = "Agent"
SUBAGENT_TRANSCRIPT = "subagent.jsonl"  # the CLI's own transcript of an in-process agent, copied at its end
SUBAGENT_SCHEMA_RETRIES = 2  # answers refused for their schema before the agent fails, as the CLI's StructuredOutput retries
GENERAL_PURPOSE = "general-purpose"


@dataclass
class InProcessChild:
    """One in-process agent, as its host runner knows it."""

    meta: AgentMeta
    agent_dir: Path
    native_id: str
    rules: RuleSet
    started: float
    transcript: Path | None = None
    """The CLI's transcript of it (known from its first hook on)."""
    refused_answers: int = 0
    ended: bool = False
    """Its outcome is committed: no further turn of it is let through."""
    finished: tuple[Status, str, Any, list[str]] | None = None
    """What its SubagentStop decided, committed at the next hook (the CLI writes its last lines after the hook)."""


@dataclass
class InProcessTree:
    """The in-process agents below one runner's agent (its host)."""

    host: AgentMeta
    host_dir: Path
    policy: PlacementPolicy
    secrets: Sequence[str]
    definitions: Mapping[str, AgentDefinition]
    schemas: Mapping[str, tuple[dict[str, Any], str]]
    """Each definition's schema, resolved (NAME, path or inline) by the host's runner."""
    shell_env: Mapping[str, str]
    home: str = field(default_factory=lambda: os.environ.get("HOME") or str(Path.home()))
    pending: collections.deque[tuple[str | None, str, dict[str, Any]]] = field(default_factory=collections.deque)
    """Agent calls let through, not yet matched to a SubagentStart: (caller's native id, tool_use_id, input)."""
    children: dict[str, InProcessChild] = field(default_factory=dict)
    """By the CLI's agent_id."""

    # ------------------------------------------------------------ the hooks --

    async def pre_tool_use(self, hook_input: Mapping[str, Any], tool_use_id: str | None) -> dict[str, Any] | None:
        """A verdict for a call an in-process agent makes; None for the host's own calls."""
        self.flush()
        native_id = str(hook_input.get("agent_id") or "")
        child = self.children.get(native_id)
        if child is None:
            return None
        tool = str(hook_input.get("tool_name", ""))
        tool_input = hook_input.get("tool_input") or {}
        stop = self.stop_reason(child)
        if stop is not None:
            status, reason = stop
            self.record_decision(child, tool, tool_input, rule=reason, verdict="deny", by="limits", tool_use_id=tool_use_id)
            self.end(child, status, reason)
            return end_turn(f"stopped by spawn.py: {reason}")
        verdict, rule, by = await self.permission(child, tool, tool_input)
        self.record_decision(child, tool, tool_input, rule=rule, verdict=verdict, by=by, tool_use_id=tool_use_id)
        if verdict != "allow":
            return deny_call(f"denied by spawn.py ({by}): {rule}")
        if canonical_tool(tool) == AGENT_TOOL:
            refused = self.agent_call_problem(child.meta, tool_input)
            if refused is not None:
                self.record_decision(child, tool, tool_input, rule=refused, verdict="deny", by="placement", tool_use_id=tool_use_id)
                return deny_call(f"denied by spawn.py (placement): {refused}")
            self.pending.append((native_id, str(tool_use_id or ""), dict(tool_input)))
        return {}

    def host_agent_call(self, tool_input: Mapping[str, Any], tool_use_id: str | None) -> str | None:
        """The host's own Agent call, which its rules allowed: why it can't start a child, or None."""
        self.flush()
        refused = self.agent_call_problem(self.host, tool_input)
        if refused is None:
            self.pending.append((None, str(tool_use_id or ""), dict(tool_input)))
        return refused

    async def subagent_start(self, hook_input: Mapping[str, Any]) -> dict[str, Any]:
        self.flush()
        native_id = str(hook_input.get("agent_id") or "")
        if not native_id or native_id in self.children:
            return {}
        caller, _, tool_input = self.pending.popleft() if self.pending else (None, "", {})
        parent = self.children[caller].meta if caller in self.children else self.host
        agent_type = str(hook_input.get("agent_type") or tool_input.get("subagent_type") or GENERAL_PURPOSE)
        child = self.register(parent, native_id, agent_type, tool_input)
        self.children[native_id] = child
        self.locate_transcripts(str(hook_input.get("transcript_path") or ""))
        return {}

    async def subagent_stop(self, hook_input: Mapping[str, Any]) -> dict[str, Any]:
        self.flush()
        child = self.children.get(str(hook_input.get("agent_id") or ""))
        if child is None or child.ended:
            return {}
        child.transcript = Path(str(hook_input.get("agent_transcript_path") or "")) or child.transcript
        text = str(hook_input.get("last_assistant_message") or "")
        stop = self.stop_reason(child)
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

    # ------------------------------------------------------------ the limits --

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
            return Status.FAILED, f"budget: its own turns (${spent:.4f}, estimated) reached its ${child.meta.max_budget_usd:.4f}"
        return None  # the tree's budget is its host's hold, which the host's runner keeps

    def ended_ancestor(self, child: InProcessChild) -> str | None:
        by_id = {c.meta.id: c for c in self.children.values()}
        cursor = by_id.get(child.meta.parent_id or "")
        while cursor is not None:
            if cursor.ended or read_outcome(cursor.agent_dir) is not None:
                return cursor.meta.id
            cursor = by_id.get(cursor.meta.parent_id or "")
        return None

    async def permission(self, child: InProcessChild, tool: str, tool_input: Mapping[str, Any]) -> tuple[str, str, str]:
        """(allow|deny, rule, who decided) under child's own tools and rules."""
        meta = child.meta
        verdict, rule = decide(tool, tool_input, child.rules, meta.tools, cwd=meta.cwd, home=self.home, environ=self.shell_env)
        if verdict == "ask":
            verdict, by = await self.ask(child, tool, tool_input, rule or "")
            return verdict, rule or "", by
        return verdict, rule or "", "rules"

    async def ask(self, child: InProcessChild, tool: str, tool_input: Mapping[str, Any], rule: str) -> tuple[str, str]:
        """(allow|deny, who answered) for a call an ask rule matched: delegated up the tree as the
        child's own ask (`spawn.py approve|deny ID`), as a process child's is; no answer is a no."""
        import asyncio

        timeout = ask_timeout(os.environ)
        if child.meta.deadline is not None:
            timeout = min(timeout, max(0.0, child.meta.deadline - time.time()))
        channel = open_ask(child.meta, tool, tool_input, rule, timeout=timeout, secrets_=self.secrets)
        what = f"{tool} ({summarize_input(tool_input, 80)}; rule {rule})"
        ask = channel.ask_id
        note(f"agent {child.meta.id} asks to use {what}: run 'spawn.py approve {ask}' or 'spawn.py deny {ask}' within {timeout:.0f} s")
        try:
            answer = await asyncio.to_thread(channel.wait, child.meta.id, timeout, self.secrets)
        finally:
            channel.close()  # a stop while waiting denies the ask, by timeout
        return ("allow" if answer.get("verdict") == "approve" else "deny"), str(answer.get("by", "?"))

    def agent_call_problem(self, caller: AgentMeta, tool_input: Mapping[str, Any]) -> str | None:
        """Why caller's Agent call can't start an in-process child, or None."""
        if caller.depth + 1 > caller.max_depth:
            return f"max depth {caller.max_depth} reached: agent {caller.id} is at depth {caller.depth}"
        definition = self.definitions.get(str(tool_input.get("subagent_type") or ""))
        needs = definition_needs(definition) if definition is not None else []
        try:
            decide_placement(self.policy, needs, by_agent_tool=True, is_root=False)
        except PlacementError as exc:
            return exc.message
        return None

    def spend(self, child: InProcessChild) -> float:
        return estimate_cost(cli_transcript_turns(child.transcript, child.meta.model)) if child.transcript else 0.0

    # ------------------------------------------------------------ records --

    def register(self, parent: AgentMeta, native_id: str, agent_type: str, tool_input: Mapping[str, Any]) -> InProcessChild:
        """Make a started subagent an agent of the session: its directory and meta.json."""
        definition = self.definitions.get(agent_type)
        meta = child_meta(parent, self.host, definition, tool_input, now=time.time(), schema_of=self.schemas.get(agent_type))
        decision = decide_placement(self.policy, [], by_agent_tool=True, is_root=False)
        meta.placement = PlacementDecision(
            decision.backend, f"{decision.reason} (Claude Code agent {native_id}, {agent_type})", decision.policy
        ).as_record()
        session = Path(meta.session)
        # No admission to the tree's budget and no hold of its own: what it
        # spends is spent by its host's CLI, inside the host's hold (and that
        # CLI's own cap). Its own budget, if its definition sets one, is kept
        # at its tool calls (stop_reason). The session's agent cap counts it.
        with session_lock(session):
            cap = read_limits(session).max_agents
            refusal = (
                f"agents: the session already has {cap} agents (--max-agents {cap})"
                if cap is not None and counted_agents(session) >= cap
                else None
            )
            meta.id, agent_dir = create_agent_dir(session, meta.depth)
        publish_once(agent_dir / META, redacted_json(record_to_json(meta), self.secrets, indent=2).encode())  # a fresh directory: first
        rules = RuleSet(*([parse_rule(t) for t in meta.permissions.get(kind, [])] for kind in ("allow", "deny", "ask")))
        child = InProcessChild(meta=meta, agent_dir=agent_dir, native_id=native_id, rules=rules, started=time.time())
        if refusal is not None:
            self.end(child, Status.REFUSED, f"refused: {refusal}")
        return child

    def locate_transcripts(self, session_transcript: str) -> None:
        """The CLI keeps a subagent's transcript beside its session's: SESSION/subagents/agent-ID.jsonl."""
        if not session_transcript:
            return
        folder = Path(session_transcript).with_suffix("") / "subagents"
        for child in self.children.values():
            if child.transcript is None:
                child.transcript = folder / f"agent-{child.native_id}.jsonl"

    def record_decision(
        self,
        child: InProcessChild,
        tool: str,
        tool_input: Mapping[str, Any],
        *,
        rule: str | None,
        verdict: str,
        by: str,
        tool_use_id: str | None,
    ) -> None:
        record = {
            "tool": tool,
            "input": summarize_input(tool_input),
            "rule": rule,
            "verdict": verdict,
            "by": by,
            "tool_use_id": tool_use_id,
        }
        append_transcript(
            child.agent_dir / TRANSCRIPT, {"time": utc_now_iso(), "type": "PermissionDecision", "message": record}, self.secrets
        )

    def end(self, child: InProcessChild, status: Status, reason: str, output: Any = None, errors: Sequence[str] = ()) -> None:
        """Commit child's one outcome (another writer's, such as a kill's, stands)."""
        if child.ended:
            return
        child.ended = True
        usage = cli_transcript_usage(child.transcript) if child.transcript else {}
        turns = cli_transcript_turns(child.transcript, child.meta.model) if child.transcript else []
        copied = copy_cli_transcript(child)
        outcome = Outcome(
            id=child.meta.id,
            status=status,
            reason=reason[:2000],
            exit_code=EXIT_FOR_STATUS[status],
            ended_at=utc_now_iso(),
            duration_s=round(time.time() - child.started, 3),
            output=output if status == Status.DONE or errors else None,
            text=cli_last_text(child.transcript) if child.transcript else None,
            validation_errors=list(errors),
            cost_usd=estimate_cost(turns) if turns else None,
            cost_estimated=True if turns else None,
            usage=usage or None,
            turns=len(turns) or None,
            transcript=str(copied or child.agent_dir / TRANSCRIPT),
        )
        commit_outcome(child.agent_dir, outcome, self.secrets)

    def host_share(self, outcome: Outcome) -> None:
        """The host's outcome keeps its own cost only: the CLI's total counts its subagents' turns,
        which their own outcomes (and ledger charges) already hold, so a tree's sum counts each once."""
        spent = sum(c for child in self.children.values() if (c := committed_cost(child.agent_dir)) is not None)
        if outcome.cost_usd is not None and spent:
            outcome.cost_usd = round(max(0.0, outcome.cost_usd - spent), 6)

    def flush(self) -> None:
        """Commit the outcomes SubagentStop decided, now that the CLI has written their transcripts."""
        for child in self.children.values():
            if child.finished is not None and not child.ended:
                status, reason, output, errors = child.finished
                self.end(child, status, reason, output, errors)

    def settle(self, host_status: Status | None, host_reason: str) -> None:
        """At the host's end: every in-process agent has its one outcome, deepest first."""
        self.flush()
        for child in sorted(self.children.values(), key=lambda c: -c.meta.depth):
            if child.ended:
                continue
            if host_status is not None and host_status != Status.DONE:
                self.end(child, Status.KILLED, f"ended with its ancestor {self.host.id} ({host_reason})")
            else:
                self.end(child, Status.FAILED, f"its host {self.host.id}'s CLI ended before it finished")
        for child in self.children.values():
            copy_cli_transcript(child)  # again, whole: one stopped at a boundary was copied before the CLI's last lines


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
        verdict = await gate(hook_input, tool_use_id, context)
        if not verdict and hook_input.get("tool_name") == AGENT_TOOL:
            refused = tree.host_agent_call(hook_input.get("tool_input") or {}, tool_use_id)
            if refused is not None:
                return deny_call(f"denied by spawn.py (placement): {refused}")
        return verdict

    async def start(hook_input: Any, _tool_use_id: str | None, _context: Any) -> Any:
        return await tree.subagent_start(hook_input)

    async def stop(hook_input: Any, _tool_use_id: str | None, _context: Any) -> Any:
        return await tree.subagent_stop(hook_input)

    return {
        "PreToolUse": [sdk.HookMatcher(matcher=None, hooks=[pre_tool_use], timeout=timeout)],
        "SubagentStart": [sdk.HookMatcher(matcher=None, hooks=[start])],
        "SubagentStop": [sdk.HookMatcher(matcher=None, hooks=[stop])],
    }


def in_process_tree(
    meta: AgentMeta, agent_dir: Path, secrets_: Sequence[str], load_schema: Callable[[str], tuple[dict[str, Any], str]]
) -> InProcessTree | None:
    """The governor of an agent's in-process children, under --placement inprocess or auto; None otherwise.

    load_schema resolves a definition's schema as --schema does (it lives above this layer).
    """
    policy = (meta.placement or {}).get("policy")
    if policy not in IN_PROCESS_POLICIES:
        return None
    definitions = file_definitions(Path(meta.cwd), os.environ)
    schemas = {name: load_schema(d.schema) for name, d in definitions.items() if d.schema}
    shell_env = {**os.environ, **child_environment(meta, agent_dir)}  # what the host's Bash, and its subagents', inherit
    return InProcessTree(meta, agent_dir, parse_policy(str(policy)), secrets_, definitions, schemas, shell_env)


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


def committed_cost(agent_dir: Path) -> float | None:
    with contextlib.suppress(OSError, SpawnError):
        cost = (read_outcome(agent_dir) or {}).get("cost_usd")
        return float(cost) if isinstance(cost, int | float) else None
    return None


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


def narrowed_tools(parent: Sequence[str], requested: Sequence[str] | None, depth: int, max_depth: int) -> list[str]:
    """A child's tools: its definition's within its parent's, and no Agent tool at the depth limit (pure)."""
    tools = [t for t in parent if requested is None or t in requested]
    return [t for t in tools if t != AGENT_TOOL or depth < max_depth]


def child_meta(
    parent: AgentMeta,
    host: AgentMeta,
    definition: AgentDefinition | None,
    tool_input: Mapping[str, Any],
    *,
    now: float,
    schema_of: tuple[dict[str, Any], str] | None = None,
) -> AgentMeta:
    """The meta.json of an in-process child of parent, run by host's runner (pure but for the clock)."""
    depth = parent.depth + 1
    max_depth = (
        parent.max_depth if definition is None or definition.max_depth is None else min(parent.max_depth, depth + definition.max_depth)
    )
    trace = new_trace(parent.traceparent)
    permissions = {kind: list(parent.permissions.get(kind, [])) for kind in ("allow", "deny", "ask")}
    deadline, budget, schema, schema_source = parent.deadline, None, None, None
    if definition is not None:
        permissions["deny"] += [r.text for r in definition.permissions.deny if r.text not in permissions["deny"]]
        permissions["ask"] += [r.text for r in definition.permissions.ask if r.text not in permissions["ask"]]
        if definition.permissions.allow:
            permissions["allow"] = [r.text for r in definition.permissions.allow]
        if definition.timeout is not None:
            deadline = min(d for d in (parent.deadline, now + definition.timeout) if d is not None)
        budget = definition.max_budget_usd
        if schema_of is not None:
            schema, schema_source = schema_of
    return AgentMeta(
        id="",
        parent_id=parent.id,
        depth=depth,
        max_depth=max_depth,
        pid=host.pid,
        create_time=host.create_time,
        pgid=host.pgid,
        pid_namespace=host.pid_namespace,
        trace_id=trace.trace_id,
        span_id=trace.span_id,
        parent_span_id=trace.parent_span_id,
        traceparent=trace.traceparent,
        task=str(tool_input.get("prompt") or tool_input.get("description") or ""),
        tools=narrowed_tools(parent.tools, definition.tools if definition else None, depth, max_depth),
        disallowed_tools=list(parent.disallowed_tools),
        model=(definition.model if definition and definition.model else parent.model),
        cwd=parent.cwd,
        started_at=utc_now_iso(),
        session=parent.session,
        system_prompt=definition.prompt if definition else "",
        schema=schema,
        schema_source=schema_source,
        deadline=deadline,
        max_budget_usd=budget,
        topic=str(tool_input.get("description") or "") or None,
        agent=definition.name if definition else None,
        agent_source=definition.path if definition else None,
        permissions=permissions,
        permission_mode=parent.permission_mode,
        sandbox="inherited" if parent.sandbox != "off" else "off",
        containment=host.containment,
        kind="claude",
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


def cli_transcript_messages(path: Path) -> list[dict[str, Any]]:
    """The assistant messages of a CLI transcript, one per message id (the CLI writes a line per block)."""
    seen: dict[str, dict[str, Any]] = {}
    with contextlib.suppress(OSError):
        for raw in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError, AttributeError, TypeError, SpawnError):
                line = json.loads(raw)
                message = line.get("message") or {}
                if line.get("type") == "assistant" and isinstance(message, dict):
                    key = str(message.get("id") or len(seen))
                    merged = seen.setdefault(key, {**message, "content": []})
                    merged["content"] = [*merged["content"], *(message.get("content") or [])]
                    merged["usage"] = message.get("usage") or merged.get("usage")
    return list(seen.values())


def cli_transcript_turns(path: Path | None, model: str) -> list[tuple[str, dict[str, Any]]]:
    if path is None:
        return []
    return [(str(m.get("model") or model), m["usage"]) for m in cli_transcript_messages(path) if isinstance(m.get("usage"), dict)]


def cli_transcript_usage(path: Path) -> dict[str, int]:
    totals: dict[str, int] = {}
    for _, usage in cli_transcript_turns(path, ""):
        for key in ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
            if isinstance(usage.get(key), int):
                totals[key] = totals.get(key, 0) + usage[key]
    return totals


def cli_last_text(path: Path) -> str | None:
    for message in reversed(cli_transcript_messages(path)):
        texts = [b.get("text", "") for b in message.get("content") or [] if isinstance(b, dict) and b.get("type") == "text"]
        if any(t.strip() for t in texts):
            return "\n".join(texts)
    return None


def copy_cli_transcript(child: InProcessChild) -> Path | None:
    """The CLI's transcript of child, copied beside its records: the CLI's config dir may go."""
    if child.transcript is None or not child.transcript.is_file():
        return None
    target = child.agent_dir / SUBAGENT_TRANSCRIPT
    with contextlib.suppress(OSError):
        shutil.copyfile(child.transcript, target)
        return target
    return None
