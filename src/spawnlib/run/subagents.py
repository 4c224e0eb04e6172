"""The records of in-process agents: each one's directory, audit lines, one outcome, and its transcript.

InProcessTree (inprocess.py) dispatches the SDK's hooks; what they decide
about a child is written here. A child's spend and its last words come from
the CLI's own transcript of it, which is copied beside its records at its end.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.constants import META, TRANSCRIPT
from ..core.errors import SpawnError
from ..core.placement import PlacementDecision, PlacementPolicy, decide_placement
from ..core.pure import estimate_cost, new_trace, redacted_json, round_usd, utc_now_iso
from ..core.records import EXIT_FOR_STATUS, AgentMeta, Outcome, Status, record_to_json
from ..policy.admission import counted_agents
from ..policy.agents import AgentDefinition, RuleSet, parse_rule, summarize_input
from ..policy.gateway import gateway_url
from ..session.ledger import read_ledger
from ..session.protocol import append_transcript, create_agent_dir, publish_once, read_limits, read_outcome, session_lock
from ..supervise.commit import commit_outcome

AGENT_TOOL = "Agent"
SUBAGENT_TRANSCRIPT = "subagent.jsonl"  # the CLI's own transcript of an in-process agent, copied at its end


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
class ChildBook:
    """The in-process agents of one host, as records: registration, the audit, outcomes, settling."""

    host: AgentMeta
    host_dir: Path
    policy: PlacementPolicy
    secrets: Sequence[str]
    definitions: Mapping[str, AgentDefinition]
    schemas: Mapping[str, tuple[dict[str, Any], str]]
    """Each definition's schema, resolved (NAME, path or inline) by the host's runner."""
    children: dict[str, InProcessChild] = field(default_factory=dict)
    """By the CLI's agent_id."""

    def register(
        self, parent: AgentMeta, native_id: str, agent_type: str, tool_input: Mapping[str, Any], refusal: str | None = None
    ) -> InProcessChild:
        """Make a started subagent an agent of the session: its directory and meta.json (refused: with its outcome too)."""
        definition = self.definitions.get(agent_type)
        meta = child_meta(parent, self.host, definition, tool_input, now=time.time(), schema_of=self.schemas.get(agent_type))
        decision = decide_placement(self.policy, [], by_agent_tool=True, is_root=False)
        started = f"Claude Code agent {native_id}" if native_id else "never started by Claude Code"
        meta.placement = PlacementDecision(decision.backend, f"{decision.reason} ({started}, {agent_type})", decision.policy).as_record()
        session = Path(meta.session)
        # No admission to the tree's budget and no hold of its own: what it
        # spends is spent by its host's CLI, inside the host's hold (and that
        # CLI's own cap). Its own budget, if its definition sets one, is kept
        # at its tool calls (stop_reason). The session's agent cap counts it.
        with session_lock(session):
            cap = read_limits(session).max_agents
            if refusal is None and cap is not None and counted_agents(session) >= cap:
                refusal = f"agents: the session already has {cap} agents (--max-agents {cap})"
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
        metered = read_ledger(Path(child.meta.session)).spends.get(child.meta.id) if gateway_url(Path(child.meta.session)) else None
        if metered is not None:  # the tree's gateway charged its calls to it: that figure, the estimate beside it
            outcome.cli_cost_usd, outcome.cost_usd, outcome.cost_estimated = outcome.cost_usd, round_usd(metered), None
        commit_outcome(child.agent_dir, outcome, self.secrets)

    def host_share(self, outcome: Outcome) -> None:
        """The host's outcome keeps its own cost only: the CLI's total counts its subagents' turns,
        which their own outcomes (and ledger charges) already hold, so a tree's sum counts each once."""
        spent = sum(c for child in self.children.values() if (c := committed_cost(child.agent_dir)) is not None)
        if outcome.cost_usd is not None and spent:
            outcome.cost_usd = round(max(0.0, outcome.cost_usd - spent), 6)

    def running_children(self) -> list[tuple[str, Path]]:
        """(id, directory) of each in-process agent with no outcome yet."""
        return [(c.meta.id, c.agent_dir) for c in self.children.values() if not c.ended and c.finished is None]

    def flush(self) -> None:
        """Commit the outcomes SubagentStop decided, now that the CLI has written their transcripts."""
        for child in self.children.values():
            if child.finished is not None and not child.ended:
                status, reason, output, errors = child.finished
                self.end(child, status, reason, output, errors)

    def settle(self, host_status: Status | None, host_reason: str) -> None:
        """At the host's end: every in-process agent has its one outcome, deepest first."""
        self.flush()
        session = Path(self.host.session)
        # A call the tree's gateway refused ends a subagent's turn with no SubagentStop: that refusal is why it ended.
        refusals = read_ledger(session).refusals if gateway_url(session) else {}
        for child in sorted(self.children.values(), key=lambda c: -c.meta.depth):
            if child.ended:
                continue
            if child.meta.id in refusals:
                self.end(child, Status.FAILED, refusals[child.meta.id])
            elif host_status is not None and host_status != Status.DONE:
                self.end(child, Status.KILLED, f"ended with its ancestor {self.host.id} ({host_reason})")
            else:
                self.end(child, Status.FAILED, f"its host {self.host.id}'s CLI ended before it finished")
        for child in self.children.values():
            copy_cli_transcript(child)  # again, whole: one stopped at a boundary was copied before the CLI's last lines


# ---------------------------------------------------------------- pure parts --


def committed_cost(agent_dir: Path) -> float | None:
    with contextlib.suppress(OSError, SpawnError):
        cost = (read_outcome(agent_dir) or {}).get("cost_usd")
        return float(cost) if isinstance(cost, int | float) else None
    return None


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
