"""`--route model`: one cheap-tier model call picks the definition for `--agent auto`.

Claude Code picks its subagents with the model, from their names and
descriptions. This does the same in one call: the bundled CLI, run once with
no tools and a short system prompt, at the low tier, is shown every
definition's name and description and the task, and answers with one JSON
object, the agent and its reason. The CLI (not a raw HTTP call) makes it, so
every way a user authenticates it, and its model aliases, work as for an
agent. Anything short of a usable answer (no key, offline, a timeout, an
answer that is no JSON or names no definition) falls back to the lexical
router (agents.route), and the decision says why.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..supervise.supervisor import Supervised
from .agents import AgentDefinition, route, routed_text

ROUTE_MODEL_TIER = "low-tier"  # the cheapest tier: picking a name from a list needs no more
# The CLI's start plus one short request; a model that takes longer is treated as absent.
ROUTE_MODEL_TIMEOUT_S = 60.0
ROUTE_DESCRIPTION_CHARS = 600  # of each description: its scope and "use when", not every <example>
ROUTE_REASON_CHARS = 300
ROUTE_SYSTEM_PROMPT = (
    "You route a task to one of a project's agents, as Claude Code picks a subagent. Read each agent's description, "
    "including when it says to use it (and not to), and pick the one whose work the task is. Answer with one JSON "
    'object and nothing else: {"agent": "NAME", "reason": "one sentence"}, or {"agent": null, "reason": "..."} when no '
    "agent fits the task better than a general-purpose one."
)


def routing_prompt(task: str, definitions: Mapping[str, AgentDefinition]) -> str:
    """The one user message of the routing call (pure)."""
    lines = ["Agents:"]
    for name, d in sorted(definitions.items()):
        description = " ".join((d.description or "").split())
        lines.append(f"- {name}: {description[:ROUTE_DESCRIPTION_CHARS]}")
    return "\n".join([*lines, "", "Task:", routed_text(task)])


def parse_model_choice(text: str, names: set[str]) -> tuple[str | None, str]:
    """(agent or None, reason) from the model's answer; ValueError says why it can't be used (pure)."""
    body = text.strip()
    if body.startswith("```"):
        body = body.strip("`").removeprefix("json").strip()
    found = re.search(r"\{.*\}", body, re.DOTALL)
    try:
        answer = json.loads(found.group(0) if found else body)
    except ValueError:
        raise ValueError(f"the answer is not JSON: {body[:120]!r}") from None
    if not isinstance(answer, dict) or "agent" not in answer:
        raise ValueError(f"the answer has no 'agent': {body[:120]!r}")
    agent, reason = answer.get("agent"), str(answer.get("reason") or "")[:ROUTE_REASON_CHARS]
    if agent is not None and (not isinstance(agent, str) or agent not in names):
        raise ValueError(f"the answer names no definition: {str(agent)[:80]!r}")
    return agent, reason


def ask_model(cli: Path, model: str, prompt: str, cwd: Path, environ: Mapping[str, str]) -> tuple[str, float | None]:
    """The CLI's one answer to prompt, and its cost; ValueError or OSError when there is none."""
    argv = [str(cli), "-p", "--model", model, "--output-format", "json", "--tools", "", "--system-prompt", ROUTE_SYSTEM_PROMPT]
    argv += ["--setting-sources", "", "--strict-mcp-config", "--no-session-persistence", "--max-turns", "1"]
    # One retry at most: offline, the CLI's own backoff would take minutes before the fallback.
    env = {**environ, "CLAUDE_CODE_MAX_RETRIES": "1"}
    proc = subprocess.Popen(
        argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(prompt, timeout=ROUTE_MODEL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        Supervised.signal_group(proc.pid, signal.SIGKILL)  # its own session: the CLI and what it started
        proc.communicate()
        raise ValueError(f"no answer within {ROUTE_MODEL_TIMEOUT_S:.0f} s") from None
    try:
        result = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    except ValueError:
        result = {}
    if proc.returncode != 0 or not isinstance(result, dict) or result.get("is_error") or not isinstance(result.get("result"), str):
        why = (result.get("result") if isinstance(result, dict) else None) or err.strip() or out.strip()
        raise ValueError(f"the CLI exited {proc.returncode}: {' '.join(str(why).split())[:200]}")
    cost = result.get("total_cost_usd")
    return result["result"], (float(cost) if isinstance(cost, int | float) else None)


def route_by_model(
    task: str, definitions: Mapping[str, AgentDefinition], *, cli: Path, model: str, cwd: Path, environ: Mapping[str, str]
) -> dict[str, Any]:
    """The model's pick, as route()'s decision plus by, model, reason and cost_usd; else route()'s, with fallback."""
    lexical = route(task, definitions)
    if not definitions:
        return {**lexical, "by": "lexical", "fallback": "no definitions to choose from"}
    try:
        text, cost = ask_model(cli, model, routing_prompt(task, definitions), cwd, environ)
        chosen, reason = parse_model_choice(text, set(definitions))
    except (ValueError, OSError) as exc:
        return {**lexical, "by": "lexical", "fallback": f"the model router failed ({exc}); routed by words"}
    decision: dict[str, Any] = {**lexical, "chosen": chosen, "by": "model", "model": model, "reason": reason}
    if cost is not None:
        decision["cost_usd"] = round(cost, 6)
    return decision
