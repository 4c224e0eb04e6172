#!/usr/bin/env -S uv run --script
# /// script
# requires-python = ">=3.11"
# dependencies = []
#
# [tool.uv]
# exclude-newer = "2026-11-20T00:00:00Z"
# ///
"""A timeline of an agent tree: ``uv run tools/view.py SESSION -o timeline.html``.

Reads one session directory (the on-disk protocol, sessions/README.md) and
writes ONE self-contained HTML file that works offline: no script, style or
font is fetched. The page shows

- a Gantt timeline with one row per agent, indented by depth, parents first;
- bars coloured by outcome (running agents end at their last heartbeat);
- denied tool calls (red ticks) and asks (diamonds: pending, approved, denied)
  on the rows, from the transcripts' PermissionDecision lines and ``asks/``;
- messages sent to an agent (``spawn.py send``: circles, with who sent them)
  and its pauses at the budget (squares), from its UserSent, SendRefused,
  BudgetPaused and BudgetResumed lines;
- the model calls the tree's gateway metered (the ledger's spend lines): a
  thin segment per call on its agent's row, light while it waited for the
  first byte, dark while the answer streamed (a call cut or failed is
  yellow), listed in the detail panel with model, tokens, cost, time to
  first byte, duration and status;
- each agent's cost and tokens, and its subtree's totals; the detail panel
  splits tokens into input, output, cache reads and cache writes (reads cost
  a tenth of input, writes a quarter more: a tree whose agents share their
  prompt's head reads it);
- on a click (or ``timeline.html#AGENT_ID``), the agent's meta, outcome and
  last transcript lines.

The page fits its window (the whole time span at zoom 1), zooms in time
(buttons, +/-/0 keys, ctrl+wheel, ``?zoom=N``) and scrolls sideways with the
labels, axis and legend pinned. ``--svg`` writes the same picture as a static
SVG, for CI artifacts and READMEs. The picture is one SVG drawn here, so the
page and the picture agree; the page's script only moves the time-placed
shapes to its width and zoom, and builds the detail panel for the selected
agent alone, so a tree of 1,000 agents stays light.

This is a sibling of spawn.py: it never imports it, and works with any copy
of spawn.py on any machine that sees the session directory.
"""

from __future__ import annotations

import argparse
import datetime as dt
import html
import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from session_files import ask_paths, clip, iter_jsonl, model_calls, native_subagents, open_regular, parse_jsonl, parse_time, read_json

# Colours by outcome status; "running" is an agent without an outcome yet.
STATUS_COLOURS: dict[str, str] = {
    "done": "#2e9e5b",
    "failed": "#d64545",
    "refused": "#8a8f98",
    "timeout": "#e39b1b",
    "killed": "#8e5cc9",
    "interrupted": "#c96b9e",
    "running": "#3b82d6",
}
UNKNOWN_COLOUR = "#444444"
ASK_COLOURS = {"pending": "#f2c230", "approve": "#2e9e5b", "deny": "#d64545"}
DENIED_COLOUR = "#d64545"
MESSAGE_COLOURS = {"sent": "#1f6fd1", "refused": "#d64545"}
PAUSE_COLOURS = {"paused": "#e39b1b", "resumed": "#2e9e5b"}
# The steering lines a transcript may hold (spawn.py send, --on-budget pause), and the mark each makes.
STEERING_MARKS = {"UserSent": ("message", "sent"), "SendRefused": ("message", "refused")}
STEERING_MARKS |= {"BudgetPaused": ("pause", "paused"), "BudgetResumed": ("pause", "resumed")}
# A model call's segment: waiting for its first byte, then streaming the answer; a call that
# ended otherwise than HTTP 200 (cut: its agent left mid-answer) is one colour whole.
CALL_COLOURS = {"waiting": "#aeb8c4", "answering": "#1b1f24", "cut/error": "#f2c230"}

# Geometry of the picture, in pixels. A row is tall enough for 11 px text;
# the label column fits an indented id and the task's first words, and the
# header fits the title, the summary, two rows of legend and the time axis.
ROW_H = 18
HEADER_H = 90
LEGEND_Y = 38
LABEL_W = 360
COST_W = 200
PLOT_X = LABEL_W + COST_W
DEFAULT_WIDTH = 1360  # of the --svg picture; the page lays itself out to its window
MIN_BAR_W = 3  # a refused agent lasts 0 s but must still be seen and clicked
MIN_CALL_W = 1.5  # a call of a few ms in an hour-long tree is still a visible tick
CALL_W = 3  # the calls' stroke, along the bottom of their agent's bar
INDENT_PX = 12
# Seconds between axis ticks: round numbers, fine enough for a zoomed-in page.
TICK_STEPS: tuple[float, ...] = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120)
TICK_STEPS += (300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400)
MAX_ZOOM = 500  # the page's zoom; at 500x a 1 h tree still shows ~20 s per screen

# How much of each transcript the page carries: the tail is what explains an
# outcome, and 1,000 agents x 6 lines keeps the file to a few MB.
TRANSCRIPT_TAIL_BYTES = 64 * 1024
TRANSCRIPT_TAIL_LINES = 6
LINE_CHARS = 400
TASK_CHARS = 600

# Exit codes, as spawn.py's: 2 for bad usage or input.
EXIT_OK = 0
EXIT_USAGE = 2


class ViewError(Exception):
    """Bad input: one line for the user, exit code 2."""


@dataclass
class Mark:
    """Something that happened at a point in an agent's run."""

    kind: str
    """denied (a tool call refused by a rule), ask, message (spawn.py send) or pause (at the budget)."""
    at: float
    """Unix seconds."""
    label: str
    state: str = ""
    """For an ask: pending, approve or deny; a message: sent or refused; a pause: paused or resumed."""


@dataclass
class Call:
    """One model call the tree's gateway metered (a spend line of the ledger)."""

    start: float
    """Unix seconds: its end less its duration."""
    end: float
    ttfb: float | None
    """Seconds to its first byte; None when none came."""
    model: str
    usage: dict[str, int]
    """Tokens by kind (USAGE_KINDS)."""
    cost_usd: float
    status: str
    """The upstream HTTP status ("200"), cut (its agent left mid-answer), deadline or error."""


@dataclass
class Agent:
    """One row of the timeline: what meta.json and outcome.json say."""

    id: str
    parent_id: str | None
    depth: int
    task: str
    start: float
    end: float
    status: str
    meta: dict[str, Any]
    outcome: dict[str, Any] | None
    cost_usd: float | None
    tokens: int
    usage: dict[str, int] = field(default_factory=dict)
    """Own tokens by kind (USAGE_KINDS), from the outcome's usage."""
    tail: list[str] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    """Its model calls, oldest first (the ledger's order)."""
    level: int = 0
    subtree_cost_usd: float = 0.0
    subtree_cost_known: bool = True
    subtree_tokens: int = 0
    subtree_usage: dict[str, int] = field(default_factory=dict)


@dataclass
class Timeline:
    session: Path
    agents: list[Agent]
    """Parents before children, siblings by start time."""
    t0: float
    t1: float


# ------------------------------------------------------------------ reading --


def tail_lines(path: Path) -> list[dict[str, Any]]:
    """The transcript's last lines, reading only its end."""
    try:
        with open_regular(path) as fh:
            size = fh.seek(0, 2)
            fh.seek(max(0, size - TRANSCRIPT_TAIL_BYTES))
            chunk = fh.read()
    except OSError:
        return []
    lines = chunk.splitlines()
    if len(chunk) >= TRANSCRIPT_TAIL_BYTES:
        lines = lines[1:]  # the first line is cut
    return parse_jsonl(lines)


def describe_line(record: Mapping[str, Any]) -> str:
    """One readable line for a transcript record."""
    kind = str(record.get("type", "?"))
    message = record.get("message")
    message = message if isinstance(message, dict) else {}
    when = str(record.get("time", ""))[11:19]
    parts: list[str] = []
    if kind == "PermissionDecision":
        verdict, tool, by, rule = (message.get(k) for k in ("verdict", "tool", "by", "rule"))
        parts.append(f"{verdict} {tool} ({by}: {rule}) {message.get('input', '')}")
    elif kind in ("AssistantMessage", "UserMessage"):
        content = message.get("content")
        blocks = content if isinstance(content, list) else [{"text": content}]
        for block in blocks:
            if not isinstance(block, dict):
                continue
            if "name" in block:
                parts.append(f"{block['name']} {json.dumps(block.get('input'), ensure_ascii=False)}")
            elif "tool_use_id" in block:
                parts.append(f"result: {block.get('content')}")
            elif block.get("text"):
                parts.append(str(block["text"]))
    elif kind == "ResultMessage":
        parts.append(f"{message.get('subtype')}, {message.get('num_turns')} turns, ${message.get('total_cost_usd')}")
    elif kind == "SystemMessage":
        parts.append(str(message.get("subtype", "")))
    elif kind == "UserSent":
        parts.append(f"message {message.get('seq')} from {message.get('from')}: {message.get('text')}")
    elif kind == "SendRefused":
        parts.append(f"message from {message.get('from')} refused: {message.get('refused')}")
    elif kind == "BudgetPaused":
        parts.append(f"paused: spent ${message.get('spent_usd')}, needs ${message.get('needed_usd')} more ({message.get('reason')})")
    elif kind == "BudgetResumed":
        parts.append(f"resumed after {message.get('paused_s')} s, hold ${message.get('hold_usd')}")
    return clip(f"{when} {kind}: {' | '.join(parts)}", LINE_CHARS)


# The kinds of tokens a turn's usage counts, each priced differently, by the name the panel shows.
USAGE_KINDS = {
    "input": "input_tokens",
    "output": "output_tokens",
    "cache read": "cache_read_input_tokens",
    "cache write": "cache_creation_input_tokens",
}


def token_count(usage: Any) -> int:
    return sum(usage_by_kind(usage).values())


def usage_by_kind(usage: Any) -> dict[str, int]:
    """A usage record's tokens by kind (USAGE_KINDS); what isn't a count is 0."""
    found = usage if isinstance(usage, dict) else {}

    def count(value: Any) -> int:
        return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0

    return {kind: count(found.get(key)) for kind, key in USAGE_KINDS.items()}


def add_usage(*parts: Mapping[str, int]) -> dict[str, int]:
    return {kind: sum(p.get(kind, 0) for p in parts) for kind in USAGE_KINDS}


def read_asks(session: Path) -> dict[str, list[Mark]]:
    """Asks by agent id, with their answer (or pending)."""
    found: dict[str, list[Mark]] = {}
    for path in ask_paths(session):
        ask = read_json(path)
        at = parse_time(ask.get("created_at")) if ask else None
        if ask is None or at is None:
            continue
        answer = read_json(path.with_name(f"{path.stem}.answer.json"))
        state = str(answer.get("verdict")) if answer else "pending"
        label = f"ask {ask.get('id')}: {ask.get('tool')} {ask.get('input')} (rule {ask.get('rule')}): {state}"
        found.setdefault(str(ask.get("agent_id")), []).append(Mark("ask", at, clip(label, LINE_CHARS), state))
    return found


def read_agent(agent_dir: Path, now: float, asks: Mapping[str, list[Mark]]) -> Agent | None:
    meta = read_json(agent_dir / "meta.json")
    if meta is None or "id" not in meta:
        return None  # a launch between mkdir and meta.json
    outcome = read_json(agent_dir / "outcome.json")
    start = parse_time(meta.get("started_at")) or now
    if outcome is not None:
        end = parse_time(outcome.get("ended_at")) or start + float(outcome.get("duration_s") or 0)
        status = str(outcome.get("status", "?"))
    else:
        beat = read_json(agent_dir / "heartbeat.json")
        end = max(start, float(beat["updated_at"])) if beat and isinstance(beat.get("updated_at"), int | float) else now
        status = "running"
    cost = outcome.get("cost_usd") if outcome else None
    transcript = agent_dir / "transcript.jsonl"
    marks = list(asks.get(str(meta["id"]), []))
    # Only permission lines are needed from the whole file.
    for record in iter_jsonl(transcript, b'"PermissionDecision"'):
        message = record.get("message") or {}
        at = parse_time(record.get("time"))
        # by "rules": a deny rule; "terminal": the person at the root's terminal
        # answered an ask, which has no asks/ record.
        if at is None or not isinstance(message, dict):
            continue
        if message.get("by") == "terminal":
            marks.append(Mark("ask", at, describe_line(record), "approve" if message.get("verdict") == "allow" else "deny"))
        elif message.get("verdict") == "deny" and message.get("by") == "rules":
            marks.append(Mark("denied", at, describe_line(record)))
    marks += steering_marks(transcript)
    return Agent(
        id=str(meta["id"]),
        parent_id=meta.get("parent_id"),
        depth=int(meta.get("depth", 0)),
        task=str(meta.get("task", "")),
        start=start,
        end=max(start, end),
        status=status,
        meta=meta,
        outcome=outcome,
        cost_usd=float(cost) if isinstance(cost, int | float) else None,
        tokens=token_count(outcome.get("usage") if outcome else None),
        usage=usage_by_kind(outcome.get("usage") if outcome else None),
        tail=[describe_line(r) for r in tail_lines(transcript)[-TRANSCRIPT_TAIL_LINES:]],
        marks=sorted(marks, key=lambda m: m.at),
    )


def steering_marks(transcript: Path) -> list[Mark]:
    """Messages sent to the agent and its pauses at the budget, from their transcript lines."""
    marks = []
    for line_type, (kind, state) in STEERING_MARKS.items():
        for record in iter_jsonl(transcript, f'"{line_type}"'.encode()):
            at = parse_time(record.get("time"))
            if at is not None and record.get("type") == line_type:
                marks.append(Mark(kind, at, describe_line(record), state))
    return marks


def read_natives(agent_dir: Path, parent: Agent, now: float) -> list[Agent]:
    """Claude Code's own subagents (native.jsonl): child rows of kind native.

    Their cost is inside the parent's (the CLI counts it), so they add none.
    """
    found = []
    for native_id, node in native_subagents(agent_dir).items():
        first = node.get("start") or node.get("stop") or {}
        stop = node.get("stop")
        start = parse_time(first.get("time")) or parent.start
        end = (parse_time(stop.get("time")) if stop else None) or (parent.end if parent.outcome else now)
        transcript = Path(stop["transcript_path"]) if stop and stop.get("transcript_path") else None
        records = [r for r in iter_jsonl(transcript) if r.get("type") == "assistant"] if transcript else []
        usage = [r["message"].get("usage") for r in records if isinstance(r.get("message"), dict)]
        agent_type = str(first.get("agent_type", "?"))
        meta = {"kind": "native", "agent_type": agent_type, "transcript_path": str(transcript or "")}
        found.append(
            Agent(
                id=f"n-{native_id}",
                parent_id=parent.id,
                depth=parent.depth + 1,
                task=f"native {agent_type} subagent",
                start=start,
                end=max(start, end),
                status="done" if stop else ("killed" if parent.outcome else "running"),
                meta=meta,
                outcome={"reason": "SubagentStop", "output": stop.get("last_message")} if stop else None,
                cost_usd=0.0,
                tokens=sum(token_count(u) for u in usage),
                usage=add_usage(*(usage_by_kind(u) for u in usage)),
                tail=[clip(str(stop.get("last_message", "")), LINE_CHARS)] if stop else [],
            )
        )
    return found


def read_calls(session: Path) -> dict[str, list[Call]]:
    """Each agent's model calls, from the ledger's spend lines (session_files.model_calls); a call without a time is skipped."""
    found: dict[str, list[Call]] = {}
    for agent_id, calls in model_calls(session).items():
        for call in calls:
            end = parse_time(call["time"])
            if end is None:
                continue
            duration = call.get("duration_s") or 0.0  # unknown: drawn as a tick at its end
            usage = usage_by_kind(call["usage"])
            found.setdefault(agent_id, []).append(
                Call(end - duration, end, call.get("ttfb_s"), call["model"], usage, call["cost_usd"], call["status"])
            )
    return found


def load_timeline(session: Path, now: float | None = None) -> Timeline:
    if not (session / "agents").is_dir():
        raise ViewError(f"{session} is not a session directory (no agents/); pass the directory spawn.py status prints")
    now = time.time() if now is None else now
    asks = read_asks(session)
    calls = read_calls(session)
    agents: dict[str, Agent] = {}
    for agent_dir in sorted((session / "agents").iterdir()):
        agent = read_agent(agent_dir, now, asks) if agent_dir.is_dir() else None
        if agent is not None:
            agent.calls = calls.get(agent.id, [])
            agents[agent.id] = agent
    for agent in list(agents.values()):
        for native in read_natives(session / "agents" / agent.id, agent, now):
            agents[native.id] = native
    if not agents:
        raise ViewError(f"{session} has no agents yet; run spawn.py first, or wait for its root to register")
    # A call charged after its agent's end (a stream its killed agent left) is still on the plot.
    starts = [a.start for a in agents.values()] + [c.start for a in agents.values() for c in a.calls]
    ends = [a.end for a in agents.values()] + [c.end for a in agents.values() for c in a.calls]
    return Timeline(session, order_tree(agents), min(starts), max(ends))


def order_tree(agents: Mapping[str, Agent]) -> list[Agent]:
    """Parents before children, siblings by start; subtree totals filled in."""
    children: dict[str | None, list[Agent]] = {}
    for agent in agents.values():
        parent = agent.parent_id if agent.parent_id in agents else None
        children.setdefault(parent, []).append(agent)
    for group in children.values():
        group.sort(key=lambda a: (a.start, a.id))
    ordered: list[Agent] = []

    def walk(agent: Agent, level: int) -> None:
        # Iterative would not help: depth is bounded by --max-depth.
        agent.level = level
        ordered.append(agent)
        cost, known, tokens = agent.cost_usd or 0.0, agent.cost_usd is not None or agent.status == "refused", agent.tokens
        usage = add_usage(agent.usage)
        for child in children.get(agent.id, []):
            walk(child, level + 1)
            cost, known, tokens = cost + child.subtree_cost_usd, known and child.subtree_cost_known, tokens + child.subtree_tokens
            usage = add_usage(usage, child.subtree_usage)
        agent.subtree_cost_usd, agent.subtree_cost_known, agent.subtree_tokens = round(cost, 6), known, tokens
        agent.subtree_usage = usage

    for root in children.get(None, []):
        walk(root, 0)
    return ordered


# ---------------------------------------------------------------- rendering --


def format_cost(value: float | None, known: bool = True) -> str:
    if value is None:
        return "?"
    return f"${value:.4f}" if known else f">=${value:.4f}"


def format_tokens(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 1000 else str(n)


def format_usage(usage: Mapping[str, int]) -> str:
    """Tokens by kind, as the detail panel shows them: "input 1.2k, output 80, cache read 2.6k, cache write 0"."""
    return ", ".join(f"{kind} {format_tokens(usage.get(kind, 0))}" for kind in USAGE_KINDS)


def tick_step(span: float, width: float) -> float:
    """A round number of seconds between axis ticks, about 80 px apart."""
    target = span / max(1.0, width / 80)
    return float(next((step for step in TICK_STEPS if step >= target), TICK_STEPS[-1]))


def iso_time(unix: float) -> str:
    """The one way the page writes a moment: ISO 8601 in UTC, to the millisecond."""
    return dt.datetime.fromtimestamp(unix, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Plot:
    """Where the picture puts a moment: the time axis's origin, span and width in pixels, and the rows' height."""

    t0: float
    span: float
    width: float
    height: float

    def x_of(self, t: float) -> float:
        return PLOT_X + (t - self.t0) / self.span * self.width

    def ticks(self) -> list[float]:
        """Seconds since t0 of the axis's ticks."""
        step = tick_step(self.span, self.width)
        return [i * step for i in range(int(self.span / step + 1e-9) + 1)]


def render_svg(timeline: Timeline, width: int = DEFAULT_WIDTH, *, page: bool = False) -> str:
    """The whole picture: one rect.bar per agent, with data-i = its row.

    Time-placed shapes carry their seconds since the tree's start (data-t0,
    data-t1, data-t), so the page's script can lay them out again for its
    window and zoom. The groups #fixed (labels and costs), #head (time axis)
    and #corner (title and legend) are the ones the page pins while scrolling.
    """
    agents = timeline.agents
    span = max(timeline.t1 - timeline.t0, 0.001)
    plot = Plot(timeline.t0, span, max(200, width - PLOT_X - 20), HEADER_H + ROW_H * len(agents) + 10)
    out = svg_background(width, plot.height, len(agents))
    out += ['<g id="grid">']
    for tick in plot.ticks():
        x = plot.x_of(timeline.t0 + tick)
        out.append(f'<line x1="{x:.1f}" y1="{HEADER_H - 14}" x2="{x:.1f}" y2="{plot.height - 10}" stroke="#dde2e8"/>')
    out.append("</g>")
    out += svg_bars(plot, agents, page)
    out += svg_columns(agents, plot.height)
    out.append(f'<g id="head"><rect width="100%" height="{HEADER_H}" fill="#ffffff"/>')
    for tick in plot.ticks():
        out.append(f'<text x="{plot.x_of(timeline.t0 + tick) + 2:.1f}" y="{HEADER_H - 4}" fill="#555">{tick:g}s</text>')
    out.append(f'<line x1="0" y1="{HEADER_H - 0.5}" x2="100%" y2="{HEADER_H - 0.5}" stroke="#ccd"/></g>')
    out += svg_corner(timeline.session.name, tree_summary(agents, span))
    out.append("</svg>")
    return "\n".join(out)


def tree_summary(agents: Sequence[Agent], span: float) -> str:
    """The title's second line: how many agents, what they spent, how many of each status, how long."""
    spent = sum(a.cost_usd or 0.0 for a in agents)
    unknown = sum(1 for a in agents if a.cost_usd is None and a.status != "refused")
    counts: dict[str, int] = {}
    for a in agents:
        counts[a.status] = counts.get(a.status, 0) + 1
    summary = f"{len(agents)} agents, spent {format_cost(spent)}" + (f" + {unknown} unknown" if unknown else "")
    if calls := sum(len(a.calls) for a in agents):
        summary += f", {calls:,} model calls"
    return summary + ", " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + f", {span:.1f} s"


def svg_background(width: int, height: float, rows: int) -> list[str]:
    """The svg element, its shared definitions (row stripes, the columns' clip) and the background."""
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" id="timeline" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="DejaVu Sans Mono, Menlo, Consolas, monospace" font-size="11">',
        "<defs>",
        f'<pattern id="stripes" width="10" height="{2 * ROW_H}" patternUnits="userSpaceOnUse" y="{HEADER_H}">'
        f'<rect width="10" height="{ROW_H}" fill="#f3f5f8"/></pattern>',
        # A long id, task or summary stops at the plot instead of running over the bars.
        f'<clipPath id="columns"><rect width="{PLOT_X}" height="{height}"/></clipPath>',
        "</defs>",
        f'<rect width="100%" height="{height}" fill="#ffffff"/>',
        f'<rect y="{HEADER_H}" width="100%" height="{ROW_H * rows}" fill="url(#stripes)"/>',
    ]


def svg_bars(plot: Plot, agents: Sequence[Agent], page: bool = False) -> list[str]:
    """#bars: each agent's bar in its row, its model calls and its marks on it (page: the calls left for its script to draw)."""
    esc = html.escape
    out = ['<g id="bars">']
    for i, a in enumerate(agents):
        y = HEADER_H + i * ROW_H
        colour = STATUS_COLOURS.get(a.status, UNKNOWN_COLOUR)
        own = format_cost(a.cost_usd) if a.status != "refused" else "$0"
        x0, x1 = plot.x_of(a.start), plot.x_of(a.end)
        title = f"{a.id} {a.status} {a.end - a.start:.1f}s {own}: {clip(a.task, 200)}"
        out.append(
            f'<rect class="bar" data-i="{i}" data-id="{esc(a.id)}" data-status="{esc(a.status)}" '
            f'data-t0="{a.start - plot.t0:.3f}" data-t1="{a.end - plot.t0:.3f}" x="{x0:.1f}" y="{y + 3}" '
            f'width="{max(MIN_BAR_W, x1 - x0):.1f}" height="{ROW_H - 6}" rx="2" fill="{colour}"><title>{esc(title)}</title></rect>'
        )
        if a.calls:
            out.append(svg_calls(plot, a, i, y, page))
        out += [svg_mark(plot, mark, y) for mark in a.marks]
    out.append("</g>")
    return out


def call_segments(plot: Plot, calls: Sequence[Call], y: float) -> dict[str, str]:
    """The path data of an agent's calls, by CALL_COLOURS' names: one horizontal stroke per part of a call.

    The page's script (layout) draws the same from the embedded calls at its own width and zoom.
    """
    paths = dict.fromkeys(CALL_COLOURS, "")

    def seg(x0: float, x1: float) -> str:
        return f"M{x0:.1f} {y:g}H{x1:.1f}"

    for call in calls:
        x0 = plot.x_of(call.start)
        x1 = max(plot.x_of(call.end), x0 + MIN_CALL_W)
        if call.status != "200":
            paths["cut/error"] += seg(x0, x1)
        elif call.ttfb is None:
            paths["waiting"] += seg(x0, x1)
        else:
            first = min(x1, plot.x_of(call.start + call.ttfb))
            paths["waiting"] += seg(x0, first)
            paths["answering"] += seg(first, x1)
    return paths


def svg_calls(plot: Plot, a: Agent, i: int, y: int, page: bool = False) -> str:
    """An agent's model calls along the bottom of its bar: one group of three paths, however many calls.

    A path per colour, not an element per call, keeps a tree of long-running
    agents light; each call's figures are in the detail panel, not in a tooltip.
    In the page the paths are left empty: its script draws them from the
    embedded calls at its first layout, and the page carries each call once.
    """
    line_y = y + ROW_H - 3 - CALL_W / 2
    paths = dict.fromkeys(CALL_COLOURS, "") if page else call_segments(plot, a.calls, line_y)
    cost = sum(c.cost_usd for c in a.calls)
    usage = add_usage(*(c.usage for c in a.calls))
    count = f"{len(a.calls)} model call{'' if len(a.calls) == 1 else 's'}"
    title = f"{a.id}: {count}, {format_cost(cost)}, {format_usage(usage)}; click for each"
    out = f'<g class="calls" data-i="{i}" data-y="{line_y:g}" fill="none" stroke-width="{CALL_W}"><title>{html.escape(title)}</title>'
    for name, colour in CALL_COLOURS.items():
        out += f'<path class="call" data-part="{name}" stroke="{colour}" d="{paths[name]}"/>'
    return out + "</g>"


def svg_mark(plot: Plot, mark: Mark, y: int) -> str:
    """One mark in the row at y: an ask's diamond, a message's dot, a pause's square or a denied call's triangle."""
    # Drawn around x=0 and moved by a transform, so the page moves one number.
    place = f'data-t="{mark.at - plot.t0:.3f}" transform="translate({plot.x_of(mark.at):.1f},0)"'
    tip = f"<title>{html.escape(mark.label)}</title>"
    if mark.kind == "ask":
        fill = ASK_COLOURS.get(mark.state, ASK_COLOURS["pending"])
        shape = f"M0,{y + 1} l5,{ROW_H / 2 - 1} l-5,{ROW_H / 2 - 1} l-5,-{ROW_H / 2 - 1} z"
        return f'<path class="mark ask" {place} d="{shape}" fill="{fill}" stroke="#333">{tip}</path>'
    if mark.kind == "message":
        fill = MESSAGE_COLOURS.get(mark.state, MESSAGE_COLOURS["sent"])
        return f'<circle class="mark message" {place} cy="{y + ROW_H / 2}" r="4" fill="{fill}" stroke="#123">{tip}</circle>'
    if mark.kind == "pause":
        fill = PAUSE_COLOURS.get(mark.state, PAUSE_COLOURS["paused"])
        square = f'x="-4" y="{y + 5}" width="8" height="8" fill="{fill}" stroke="#630"'
        return f'<rect class="mark pause" {place} {square}>{tip}</rect>'
    shape = f"M-4,{y + 1} h8 l-4,{ROW_H - 3} z"
    return f'<path class="mark denied" {place} d="{shape}" fill="{DENIED_COLOUR}" stroke="#600">{tip}</path>'


def svg_columns(agents: Sequence[Agent], height: float) -> list[str]:
    """#fixed: each row's id and task, indented by level, and its own and subtree cost and tokens."""
    esc = html.escape
    out = [
        f'<g id="fixed" clip-path="url(#columns)"><rect width="{PLOT_X}" height="{height}" fill="#ffffff"/>'
        f'<rect y="{HEADER_H}" width="{PLOT_X}" height="{ROW_H * len(agents)}" fill="url(#stripes)"/>'
        f'<line x1="{PLOT_X - 0.5}" y1="0" x2="{PLOT_X - 0.5}" y2="{height}" stroke="#ccd"/>'
    ]
    for i, a in enumerate(agents):
        mid = HEADER_H + i * ROW_H + ROW_H / 2
        colour = STATUS_COLOURS.get(a.status, UNKNOWN_COLOUR)
        task = a.task.splitlines()[0] if a.task.strip() else ""
        label_room = max(10, (LABEL_W - 8 - a.level * INDENT_PX) // 7 - len(a.id) - 2)
        out.append(
            f'<text class="label" data-i="{i}" x="{4 + a.level * INDENT_PX}" y="{mid + 4:.1f}">'
            f'<tspan fill="{colour}" font-weight="bold">{esc(a.id)}</tspan> {esc(clip(task, label_room))}</text>'
        )
        own = format_cost(a.cost_usd) if a.status != "refused" else "$0"
        tree = format_cost(a.subtree_cost_usd, a.subtree_cost_known)
        out.append(
            f'<text x="{LABEL_W + 4}" y="{mid + 4:.1f}" fill="#333">{esc(own)} / {esc(tree)} '
            f"{esc(format_tokens(a.tokens))}/{esc(format_tokens(a.subtree_tokens))}</text>"
        )
    out.append("</g>")
    return out


def svg_corner(title: str, summary: str) -> list[str]:
    """#corner: the session's name, the summary and the legend, above the label and cost columns."""
    esc = html.escape
    out = [
        f'<g id="corner" clip-path="url(#columns)"><rect width="{PLOT_X}" height="{HEADER_H}" fill="#ffffff"/>'
        f'<text x="8" y="16" font-size="13" font-weight="bold">{esc(title)}</text>'
        f'<text x="8" y="32">{esc(summary)}</text><g id="legend">'
    ]
    # The legend wraps inside the label and cost columns, which the page
    # never scrolls away, so it is whole at any window width.
    legend_x, legend_y = 8.0, float(LEGEND_Y)
    marks = [("denied call", DENIED_COLOUR), ("ask", ASK_COLOURS["pending"]), ("message", MESSAGE_COLOURS["sent"])]
    marks.append(("paused", PAUSE_COLOURS["paused"]))
    marks += [(f"call {name}", colour) for name, colour in CALL_COLOURS.items()]
    for status, colour in [*STATUS_COLOURS.items(), *marks]:
        item_w = 20 + 7 * len(status)
        if legend_x + item_w > PLOT_X - 8:
            legend_x, legend_y = 8.0, legend_y + 16
        out.append(f'<rect x="{legend_x}" y="{legend_y}" width="10" height="10" fill="{colour}"/>')
        out.append(f'<text x="{legend_x + 13}" y="{legend_y + 9}">{esc(status)}</text>')
        legend_x += item_w
    out.append(
        f'</g><text x="{LABEL_W + 4}" y="{HEADER_H - 4}" fill="#555">own / tree cost, tokens</text>'
        f'<line x1="{PLOT_X - 0.5}" y1="0" x2="{PLOT_X - 0.5}" y2="{HEADER_H}" stroke="#ccd"/></g>'
    )
    return out


def call_row(call: Call, t0: float, models: list[str]) -> list[Any]:
    """A model call as the page carries it, compact (an agent may have hundreds):
    [start, ttfb, duration, model, [input, output, cache read, cache write], cost, status],
    start in seconds since the tree's start (t0), ttfb null when no byte came, and the
    model an index into models (its agent's, named once)."""
    if call.model not in models:
        models.append(call.model)
    ttfb = round(call.ttfb, 3) if call.ttfb is not None else None
    tokens = [call.usage[kind] for kind in USAGE_KINDS]
    start, duration = round(call.start - t0, 3), round(call.end - call.start, 3)
    return [start, ttfb, duration, models.index(call.model), tokens, call.cost_usd, call.status]


def agent_detail(a: Agent, t0: float = 0.0) -> dict[str, Any]:
    """What the detail panel shows for one agent (kept small: 1,000 of these).

    Every moment is ISO 8601 (meta's deadline is Unix seconds on disk); the
    calls' are made by the page's script from t0, the tree's start.
    """
    meta_keys = "parent_id depth max_depth model tools agent cwd max_budget_usd trace_id".split()
    outcome = a.outcome or {}
    output = outcome.get("output")
    deadline = a.meta.get("deadline")
    times = {"start": iso_time(a.start), "end": iso_time(a.end) + (" (last heartbeat)" if a.status == "running" else "")}
    if isinstance(deadline, int | float):
        times["deadline"] = iso_time(deadline)
    times["duration"] = f"{a.end - a.start:.3f} s"
    models: list[str] = []
    calls = [call_row(c, t0, models) for c in a.calls]
    return {
        "id": a.id,
        "status": a.status,
        "task": clip(a.task, TASK_CHARS),
        "times": times,
        "meta": {k: a.meta[k] for k in meta_keys if a.meta.get(k) is not None},
        "outcome": {k: outcome[k] for k in ("reason", "exit_code", "turns", "committed_by") if outcome.get(k) is not None},
        "output": clip(output if isinstance(output, str) else json.dumps(output, ensure_ascii=False), TASK_CHARS)
        if output is not None
        else None,
        "cost": format_cost(a.cost_usd) if a.status != "refused" else "$0",
        "tree_cost": format_cost(a.subtree_cost_usd, a.subtree_cost_known),
        "tokens": a.tokens,
        "tree_tokens": a.subtree_tokens,
        "usage": format_usage(a.usage),
        "tree_usage": format_usage(a.subtree_usage),
        "marks": [m.label for m in a.marks],
        "calls": calls,
        "models": models,
        "tail": a.tail,
    }


PAGE_STYLE = """
body { margin: 0; font: 13px/1.4 system-ui, sans-serif; color: #222; display: flex; height: 100vh; overflow: hidden; }
#main { flex: 1; min-width: 0; position: relative; }
#chart { position: absolute; inset: 0; overflow: auto; }
#chart svg { display: block; }
#chart svg .bar, #chart svg .label { cursor: pointer; }
#zoom { position: absolute; top: 6px; right: 18px; z-index: 1; display: flex; gap: 4px; align-items: center;
  background: #fffe; border: 1px solid #ccd; border-radius: 4px; padding: 2px 4px; font-size: 12px; }
#zoom button { font: inherit; min-width: 26px; padding: 1px 6px; cursor: pointer; }
#detail { width: clamp(260px, 25vw, 420px); flex: none; overflow: auto; border-left: 1px solid #ccd; padding: 10px 14px;
  box-sizing: border-box; background: #fafbfc; }
#detail h2 { font-size: 15px; margin: 4px 0; }
#detail table { border-collapse: collapse; font-size: 12px; }
#detail td:first-child { white-space: nowrap; }
#detail td { padding: 1px 6px 1px 0; vertical-align: top; word-break: break-word; }
#detail .calls-box { overflow-x: auto; }
#detail table.calls { font-size: 11px; }
#detail table.calls th { text-align: left; font-weight: 600; padding-right: 6px; white-space: nowrap; }
#detail table.calls td { white-space: nowrap; word-break: normal; }
#detail pre { white-space: pre-wrap; word-break: break-word; font-size: 11px; background: #fff; border: 1px solid #e3e6ea; padding: 4px; }
.status { display: inline-block; padding: 0 6px; border-radius: 3px; color: #fff; }
"""

# The page's only script. It lays the time axis out to the window's width
# (zoom 1 shows the whole tree), zooms with the buttons, +/- keys or
# ctrl+wheel about the pointer, pins the labels and the axis while scrolling,
# and builds the detail panel for the selected agent (a click or #AGENT_ID)
# from the embedded JSON. After each layout it writes what it drew into
# body data attributes, which the tests read from the DOM.
PAGE_SCRIPT = """
const data = JSON.parse(document.getElementById('agents').textContent);
const colours = JSON.parse(document.getElementById('colours').textContent);
const svg = document.getElementById('timeline');
const chart = document.getElementById('chart');
const detail = document.getElementById('detail');
const NS = 'http://www.w3.org/2000/svg';
const bars = [...svg.querySelectorAll('rect.bar')];
const marks = [...svg.querySelectorAll('.mark')];
const callGroups = [...svg.querySelectorAll('g.calls')];
const grid = document.getElementById('grid'), head = document.getElementById('head');
const fixed = document.getElementById('fixed'), corner = document.getElementById('corner');
const headBottom = head.lastElementChild;
const rowsH = HEADER_H + ROW_H * data.length + 10;
let zoom = Math.min(MAX_ZOOM, Math.max(1, Number(new URLSearchParams(location.search).get('zoom')) || 1));
let plotW = 0;
const highlight = document.createElementNS(NS, 'rect');
highlight.setAttribute('fill', 'none'); highlight.setAttribute('stroke', '#111'); highlight.setAttribute('stroke-width', '1.5');
highlight.setAttribute('x', '1'); highlight.setAttribute('height', String(ROW_H));
highlight.style.display = 'none'; svg.insertBefore(highlight, head);
function svgEl(tag, attrs, text) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = text;
  return e;
}
function xOf(t) { return PLOT_X + t / SPAN * plotW; }
function layout() {
  plotW = Math.max(200, (chart.clientWidth - PLOT_X - 20) * zoom);
  const width = PLOT_X + plotW + 20;
  svg.setAttribute('width', String(width)); svg.setAttribute('viewBox', `0 0 ${width} ${rowsH}`);
  highlight.setAttribute('width', String(width - 2));
  for (const b of bars) {
    const x0 = xOf(Number(b.dataset.t0)), x1 = xOf(Number(b.dataset.t1));
    b.setAttribute('x', x0.toFixed(1)); b.setAttribute('width', Math.max(MIN_BAR_W, x1 - x0).toFixed(1));
  }
  for (const m of marks) m.setAttribute('transform', `translate(${xOf(Number(m.dataset.t)).toFixed(1)},0)`);
  for (const g of callGroups) drawCalls(g);
  const target = SPAN / Math.max(1, plotW / 80);
  const step = TICK_STEPS.find((s) => s >= target) || TICK_STEPS[TICK_STEPS.length - 1];
  grid.replaceChildren(); for (const e of [...head.querySelectorAll('text')]) e.remove();
  for (let i = 0; i * step <= SPAN + 1e-9; i++) {
    const x = xOf(i * step).toFixed(1);
    grid.appendChild(svgEl('line', {x1: x, y1: HEADER_H - 14, x2: x, y2: rowsH - 10, stroke: '#dde2e8'}));
    head.insertBefore(svgEl('text', {x: Number(x) + 2, y: HEADER_H - 4, fill: '#555'}, `${+(i * step).toFixed(3)}s`), headBottom);
  }
  document.getElementById('zoom-level').textContent = `${+zoom.toFixed(2)}x`;
  pin(); report();
}
function drawCalls(g) {
  // As call_segments draws them: waiting for the first byte, then answering; a call not 200 whole.
  const y = g.dataset.y, d = {waiting: '', answering: '', 'cut/error': ''};
  const seg = (x0, x1) => `M${x0.toFixed(1)} ${y}H${x1.toFixed(1)}`;
  for (const [t, ttfb, dur, , , , status] of data[Number(g.dataset.i)].calls) {
    const x0 = xOf(t), x1 = Math.max(xOf(t + dur), x0 + MIN_CALL_W);
    if (status !== '200') d['cut/error'] += seg(x0, x1);
    else if (ttfb === null) d.waiting += seg(x0, x1);
    else { const first = Math.min(x1, xOf(t + ttfb)); d.waiting += seg(x0, first); d.answering += seg(first, x1); }
  }
  for (const p of g.querySelectorAll('path')) p.setAttribute('d', d[p.dataset.part]);
}
function fmtTokens(n) { return n >= 1000 ? `${(n / 1000).toFixed(1)}k` : String(n); }
function callsTable(calls, models) {
  // Built for the selected agent only: one row per call, its end in ISO 8601 as every moment on the page.
  const t = el('table'); t.className = 'calls';
  const head = el('tr');
  for (const h of ['end', 'status', 'ttfb', 'duration', 'cost', 'tokens in/out/cache read/write', 'model']) head.appendChild(el('th', h));
  t.appendChild(head);
  for (const [start, ttfb, dur, model, tokens, cost, status] of calls) {
    const tr = el('tr'); tr.className = 'call';
    const end = new Date(Math.round((T0 + start + dur) * 1000)).toISOString();
    const cells = [end, status, ttfb === null ? '-' : `${ttfb.toFixed(3)} s`, `${dur.toFixed(3)} s`, `$${cost.toFixed(4)}`,
                   tokens.map(fmtTokens).join(' / '), models[model]];
    for (const c of cells) tr.appendChild(el('td', c));
    t.appendChild(tr);
  }
  const box = el('div'); box.className = 'calls-box'; box.appendChild(t);  // wider than the panel: it scrolls sideways
  return box;
}
function pin() {
  fixed.setAttribute('transform', `translate(${chart.scrollLeft},0)`);
  head.setAttribute('transform', `translate(0,${chart.scrollTop})`);
  corner.setAttribute('transform', `translate(${chart.scrollLeft},${chart.scrollTop})`);
}
function zoomTo(next, anchorX) {
  // Keep the moment under anchorX (px from the chart's left edge) in place.
  next = Math.min(MAX_ZOOM, Math.max(1, next));
  const at = (chart.scrollLeft + anchorX - PLOT_X) / plotW;
  zoom = next; layout();
  chart.scrollLeft = PLOT_X + at * plotW - anchorX; pin(); report();
}
function visibleMiddle() { return PLOT_X + (chart.clientWidth - PLOT_X) / 2; }
document.getElementById('zoom-in').addEventListener('click', () => zoomTo(zoom * 2, visibleMiddle()));
document.getElementById('zoom-out').addEventListener('click', () => zoomTo(zoom / 2, visibleMiddle()));
document.getElementById('zoom-fit').addEventListener('click', () => zoomTo(1, visibleMiddle()));
chart.addEventListener('wheel', (e) => {
  if (!e.ctrlKey) return;  // a plain wheel scrolls; ctrl+wheel zooms (and would zoom the whole page)
  e.preventDefault();
  const x = e.clientX - chart.getBoundingClientRect().left;
  zoomTo(zoom * Math.exp(-e.deltaY / 300), Math.max(PLOT_X, x));
}, {passive: false});
document.addEventListener('keydown', (e) => {
  if (e.ctrlKey || e.metaKey || e.altKey) return;
  if (e.key === '+' || e.key === '=') zoomTo(zoom * 2, visibleMiddle());
  else if (e.key === '-') zoomTo(zoom / 2, visibleMiddle());
  else if (e.key === '0') zoomTo(1, visibleMiddle());
});
chart.addEventListener('scroll', pin);
window.addEventListener('resize', layout);
function report() {
  // Where everything landed, in page pixels, for tests and for anyone debugging a layout.
  const box = (r) => [r.left, r.top, r.right, r.bottom].map((v) => Math.round(v));
  document.body.dataset.layout = JSON.stringify({
    window: [innerWidth, innerHeight], zoom,
    chart: {box: box(chart.getBoundingClientRect()), scrollLeft: chart.scrollLeft, scrollTop: chart.scrollTop,
            scrollWidth: chart.scrollWidth, clientWidth: chart.clientWidth,
            scrollHeight: chart.scrollHeight, clientHeight: chart.clientHeight},
    plot: [PLOT_X, plotW],
    legend: box(document.getElementById('legend').getBoundingClientRect()),
    zoomControls: box(document.getElementById('zoom').getBoundingClientRect()),
    bars: bars.map((b) => box(b.getBoundingClientRect())),
  });
}
function el(tag, text) { const e = document.createElement(tag); if (text !== undefined) e.textContent = text; return e; }
function rows(obj) {
  const t = el('table');
  for (const [k, v] of Object.entries(obj)) {
    const tr = el('tr'); tr.appendChild(el('td', k));
    tr.appendChild(el('td', typeof v === 'string' ? v : JSON.stringify(v))); t.appendChild(tr);
  }
  return t;
}
function select(i) {
  const a = data[i]; if (!a) return;
  highlight.setAttribute('y', String(HEADER_H + i * ROW_H)); highlight.style.display = '';
  detail.replaceChildren();
  const h = el('h2', a.id + ' '); const s = el('span', a.status); s.className = 'status';
  s.style.background = colours[a.status] || '#444'; h.appendChild(s); detail.appendChild(h);
  detail.appendChild(el('p', a.task));
  detail.appendChild(rows(a.times));
  detail.appendChild(rows({cost: a.cost, 'subtree cost': a.tree_cost, tokens: a.usage, 'subtree tokens': a.tree_usage}));
  detail.appendChild(el('h3', 'outcome')); detail.appendChild(rows(a.outcome));
  if (a.output !== null) detail.appendChild(el('pre', a.output));
  if (a.calls.length) {
    detail.appendChild(el('h3', `model calls (${a.calls.length})`)); detail.appendChild(callsTable(a.calls, a.models));
  }
  if (a.marks.length) { detail.appendChild(el('h3', 'asks, refusals, messages')); detail.appendChild(el('pre', a.marks.join('\\n'))); }
  detail.appendChild(el('h3', 'meta')); detail.appendChild(rows(a.meta));
  detail.appendChild(el('h3', 'last transcript lines')); detail.appendChild(el('pre', a.tail.join('\\n') || '(none)'));
  detail.dataset.agent = a.id;
  if (location.hash !== '#' + a.id) history.replaceState(null, '', location.search + '#' + a.id);
}
svg.addEventListener('click', (e) => {
  const hit = e.target.closest('[data-i]'); if (hit) select(Number(hit.dataset.i));
});
layout();
const byId = new Map(data.map((a, i) => [a.id, i]));
const wanted = byId.get(decodeURIComponent(location.hash.slice(1)));
if (wanted !== undefined) {
  select(wanted);
  chart.scrollTop = HEADER_H + wanted * ROW_H - chart.clientHeight / 2;  // vertical only: the labels stay in view
  pin(); report();
}
document.body.dataset.bars = String(bars.length);
document.body.dataset.agents = String(data.length);
document.body.dataset.calls = String(data.reduce((n, a) => n + a.calls.length, 0));
"""


def script_json(value: Any) -> str:
    """JSON safe inside <script>: no '</' can end the element early."""
    return json.dumps(value, ensure_ascii=False).replace("</", "<\\/").replace("<!--", "<\\!--")


def render_html(timeline: Timeline, width: int = DEFAULT_WIDTH) -> str:
    """The page: the picture at `width` until its script lays it out to the window."""
    title = f"spawn.py timeline: {timeline.session.name}"
    constants = {
        "HEADER_H": HEADER_H,
        "ROW_H": ROW_H,
        "PLOT_X": PLOT_X,
        "MIN_BAR_W": MIN_BAR_W,
        "MIN_CALL_W": MIN_CALL_W,
        "T0": timeline.t0,
        "MAX_ZOOM": MAX_ZOOM,
        "TICK_STEPS": list(TICK_STEPS),
        "SPAN": max(timeline.t1 - timeline.t0, 0.001),
    }
    script = "".join(f"const {k} = {json.dumps(v)};\n" for k, v in constants.items()) + PAGE_SCRIPT
    zoom = (
        '<div id="zoom" title="zoom in time: +, -, 0 keys or ctrl+wheel; scroll sideways when zoomed">'
        '<button id="zoom-out" type="button" aria-label="zoom out">−</button>'
        '<span id="zoom-level">1x</span>'
        '<button id="zoom-in" type="button" aria-label="zoom in">+</button>'
        '<button id="zoom-fit" type="button" aria-label="show the whole tree">fit</button></div>'
    )
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            # No fetch of any kind: everything the page needs is in this file.
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
            "script-src 'unsafe-inline'; img-src data:\">",
            f"<title>{html.escape(title)}</title><style>{PAGE_STYLE}</style></head>",
            "<body>",
            f'<div id="main">{zoom}<div id="chart">{render_svg(timeline, width, page=True)}</div></div>',
            '<div id="detail"><p>Click a bar or a row to see the agent\'s meta, outcome and last transcript lines.</p></div>',
            f'<script type="application/json" id="agents">{script_json([agent_detail(a, timeline.t0) for a in timeline.agents])}</script>',
            f'<script type="application/json" id="colours">{script_json(STATUS_COLOURS)}</script>',
            f"<script>{script}</script>",
            "</body></html>",
        ]
    )


# ---------------------------------------------------------------------- CLI --


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="view.py", description=__doc__.split("\n\n")[0] if __doc__ else None, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("session", metavar="SESSION", help="a session directory (spawn.py status prints it)")
    p.add_argument("-o", "--output", metavar="FILE", help="default timeline.html (timeline.svg with --svg); - for stdout")
    p.add_argument("--svg", action="store_true", help="write a static SVG picture instead of the HTML page")
    p.add_argument(
        "--width",
        type=int,
        default=DEFAULT_WIDTH,
        help=f"width of the --svg picture in pixels (default {DEFAULT_WIDTH}); the page fits its window",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        timeline = load_timeline(Path(args.session).expanduser().resolve())
        text = render_svg(timeline, args.width) if args.svg else render_html(timeline, args.width)
        target = args.output or ("timeline.svg" if args.svg else "timeline.html")
        if target == "-":
            sys.stdout.write(text + "\n")
        else:
            # Whole or nothing: a reader never sees half a page.
            tmp = Path(target).with_name(f".{Path(target).name}.tmp")
            tmp.write_text(text + "\n", encoding="utf-8")
            tmp.replace(target)
            print(f"view: wrote {target} ({len(timeline.agents)} agents)", file=sys.stderr)
    except ViewError as exc:
        print(f"view: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"view: error: {exc}; check the path and its permissions", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
