"""Pure functions every layer shares: ids, tools and models, limits, prices and estimates, schemas,
redaction, the briefing and prompt layout, the sandbox settings. No I/O but the clock.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import json
import math
import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .constants import (
    AGENT_FACTS_HEADER,
    ALIAS_PRICE_FAMILY,
    CACHE_READ_FACTOR,
    CACHE_WRITE_1H_FACTOR,
    CACHE_WRITE_FACTOR,
    CLI_MODEL_ALIASES,
    DEFAULT_AGENT_COST_USD,
    DEFAULT_AGENT_SECONDS,
    DEFAULT_MODEL_TIERS,
    ENV_MODEL_TIERS,
    FALLBACK_PRICE_FAMILY,
    JSON_MAX_DEPTH,
    KNOWN_TOOLS,
    MAX_BUDGET_USD,
    MAX_CONCURRENT,
    MAX_COUNT,
    MAX_DEPTH_LIMIT,
    MAX_SECONDS,
    MAX_TOKENS,
    MODEL_FAMILIES,
    MODEL_ID_PATTERN,
    MODEL_PRICES_USD_PER_MTOK,
    PARENT_GRACE_S,
    RECORD_MAX_BYTES,
    REDACTED,
    REFUSED_DIR,
    REQUESTS_DIR,
    SCRATCH_DIR,
    SECRET_MIN_LEN,
    SECRET_NAME,
    SECRET_PATTERN,
    SESSION_LOCK,
    STDOUT_OUTPUT_LIMIT,
    TOOL_ALIASES,
    USAGE_COUNTS,
)
from .errors import UnknownToolError, UsageError, close_match, did_you_mean
from .records import EXIT_FOR_STATUS, AgentMeta, Trace
from .schemafast import output_surely_valid, schema_surely_valid

# ---------------------------------------------------------------- pure core --


def utc_now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def started_timestamp(meta: AgentMeta) -> float:
    """meta.started_at (ISO 8601 UTC) as Unix seconds."""
    return dt.datetime.fromisoformat(meta.started_at.replace("Z", "+00:00")).timestamp()


def is_finite(value: float) -> bool:
    # False for NaN too: every comparison with NaN is false. (Not math.isfinite:
    # one more import at every level of nesting.)
    return -float("inf") < value < float("inf")


def number_problem(name: str, value: object, *, maximum: float, integer: bool = False, zero_ok: bool = False) -> str | None:
    """What is wrong with a number from a flag, the environment or a definition, or None.

    NaN is the case that matters: it compares false, so a NaN limit would
    silently disable every check that uses it.
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or (integer and not isinstance(value, int)):
        return f"{name} must be {'an integer' if integer else 'a number'}, got {value!r}"
    if not is_finite(value):
        return f"{name} must be a finite number, got {value}"
    if value < 0 or (value == 0 and not zero_ok):
        return f"{name} must be {'>= 0' if zero_ok else '> 0'}, got {value}"
    if value > maximum:
        return f"{name} must be at most {maximum:g}, got {value:g}"
    return None


# (flag, attribute, maximum, integer, zero_ok) of every numeric flag of a run.
RUN_NUMBER_FLAGS: tuple[tuple[str, str, float, bool, bool], ...] = (
    ("--timeout", "timeout", MAX_SECONDS, False, True),  # 0: no deadline of its own
    ("--idle-timeout", "idle_timeout", MAX_SECONDS, False, False),
    ("--max-budget-usd", "max_budget_usd", MAX_BUDGET_USD, False, False),
    ("--max-turns", "max_turns", MAX_COUNT, True, False),
    ("--max-depth", "max_depth", MAX_DEPTH_LIMIT, True, True),
    ("--max-agents", "max_agents", MAX_COUNT, True, False),
    ("--max-concurrent", "max_concurrent", MAX_CONCURRENT, True, False),
    ("--confirm-over", "confirm_over", MAX_BUDGET_USD, False, False),
)

# (variable, maximum, integer, zero_ok) of every numeric environment variable.
ENV_NUMBERS: tuple[tuple[str, float, bool, bool], ...] = (
    ("SPAWN_DEADLINE", float("9e12"), False, False),  # Unix seconds; past year 2255 is a typo
    ("SPAWN_MAX_BUDGET_USD", MAX_BUDGET_USD, False, False),
    ("SPAWN_HEARTBEAT_S", 3600.0, False, False),
    ("SPAWN_ASK_TIMEOUT_S", MAX_SECONDS, False, False),
    ("SPAWN_IDLE_TIMEOUT_S", MAX_SECONDS, False, False),
    ("SPAWN_DEPTH", MAX_DEPTH_LIMIT, True, True),
    ("SPAWN_MAX_DEPTH", MAX_DEPTH_LIMIT, True, True),
)


# MCP server kinds Claude Code accepts in mcpServers (stdio when no type is given).
MCP_SERVER_TYPES = ("stdio", "http", "sse")

# (field, attribute, maximum, integer, zero_ok) of every numeric field of an
# agent definition. A bad one is an error, as the matching flag is: unset, a
# limit such as maxTurns would be no limit at all.
DEFINITION_NUMBERS: tuple[tuple[str, str, float, bool, bool], ...] = (
    ("max_depth", "max_depth", MAX_DEPTH_LIMIT, True, True),
    ("timeout", "timeout", MAX_SECONDS, False, False),
    ("max_budget_usd", "max_budget_usd", MAX_BUDGET_USD, False, False),
    ("maxTurns", "max_turns", MAX_COUNT, True, False),
    ("autoCompactWindow", "auto_compact_window", MAX_TOKENS, True, False),
)


def env_number_warnings(environ: Mapping[str, str]) -> list[str]:
    """A warning for each malformed numeric SPAWN_* variable; readers ignore those values.

    An agent's own environment is not trusted (its Bash can rewrite it), so a
    bad value is not fatal: it is ignored, and the ancestry's value applies.
    """
    warnings = []
    for name, maximum, integer, zero_ok in ENV_NUMBERS:
        raw = environ.get(name)
        if raw in (None, ""):
            continue
        try:
            value: object = int(raw) if integer else float(raw)
        except ValueError:
            value = raw
        why = number_problem(name, value, maximum=maximum, integer=integer, zero_ok=zero_ok)
        if why is not None:
            warnings.append(f"{why}; ignored")
    return warnings


def slugify(text: str, max_len: int = 40) -> str:
    words = re.findall(r"[a-z0-9]+", text.lower())
    slug = ""
    for word in words:
        candidate = f"{slug}-{word}" if slug else word
        if len(candidate) > max_len:
            break
        slug = candidate
    return slug or "agent"


def token_hex(nbytes: int) -> str:
    """secrets.token_hex without importing secrets (hmac, hashlib, random: ~5 ms of every start)."""
    return os.urandom(nbytes).hex()


def new_agent_id(depth: int) -> str:
    # Depth in the id makes `status` and logs readable at a glance.
    return f"a{depth}-{token_hex(3)}"


AGENT_ID = re.compile(r"a(\d{1,4})-[0-9a-f]{6}")


def id_depth(agent_id: str) -> int | None:
    """The depth an id made by new_agent_id carries; None for any other name."""
    m = AGENT_ID.fullmatch(agent_id)
    return int(m.group(1)) if m else None


def parse_traceparent(value: str) -> tuple[str, str] | None:
    """(trace_id, parent span id) from a W3C traceparent, or None if malformed."""
    m = re.fullmatch(r"[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}", value.strip())
    if not m or set(m.group(1)) == {"0"} or set(m.group(2)) == {"0"}:
        return None
    return m.group(1), m.group(2)


def new_trace(parent: str | None) -> Trace:
    span = token_hex(8)
    if parent:
        parsed = parse_traceparent(parent)
        if parsed:
            return Trace(parsed[0], span, parsed[1], parent.strip()[-2:])
    return Trace(token_hex(16), span)


def canonical_tool(name: str) -> str:
    """A tool's current name: legacy aliases (Task, KillShell) map to today's."""
    return TOOL_ALIASES.get(name, name)


def parse_tools(value: str, known: frozenset[str] = KNOWN_TOOLS) -> list[str]:
    tools = [canonical_tool(t.strip()) for t in value.split(",") if t.strip()]
    unknown = [t for t in tools if t not in known and not t.startswith("mcp__")]
    if unknown:
        raise UnknownToolError(unknown)
    return list(dict.fromkeys(tools))


def parse_model_tiers(value: str | None) -> dict[str, str]:
    tiers = dict(DEFAULT_MODEL_TIERS)
    if not value:
        return tiers
    for item in value.split(","):
        name, sep, model = item.partition("=")
        if not sep or not name.strip() or not model.strip():
            raise UsageError(f"{ENV_MODEL_TIERS}={value!r} is malformed; use 'high-tier=MODEL,medium-tier=MODEL,low-tier=MODEL'")
        tiers[name.strip()] = model.strip()
    return tiers


def misspelt_model_id(model: str) -> str | None:
    """The id spelled right when a word of it is a typo of a model family (claude-sonet-4), else None (pure)."""
    words = model.split("-")
    for i, word in enumerate(words):
        if word.isalpha() and word not in MODEL_FAMILIES:
            family = close_match(word, MODEL_FAMILIES, cutoff=0.75)
            if family is not None:
                return "-".join([*words[:i], family, *words[i + 1 :]])
    return None


def resolve_model(name: str, tiers: Mapping[str, str], source: str = "--model") -> str:
    """The model id or CLI alias a tier, alias or id names; a name none of them matches is a UsageError."""
    if not name.strip():
        raise UsageError(f"{source} is empty; use high-tier, medium-tier, low-tier or a model id")
    model = tiers.get(name, name)
    if name in tiers or model in tiers.values() or model in CLI_MODEL_ALIASES:
        return model
    fixed = misspelt_model_id(model) if re.fullmatch(MODEL_ID_PATTERN, model) else None
    if re.fullmatch(MODEL_ID_PATTERN, model) and fixed is None:
        return model
    listed = ", ".join(f"{tier} ({target})" for tier, target in tiers.items())
    hint = f"; did you mean {fixed!r}?" if fixed else did_you_mean(name, [*tiers, *CLI_MODEL_ALIASES])
    raise UsageError(
        f"{source} {name!r} is no known model{hint or ';'} use a tier: {listed}, an alias: {', '.join(CLI_MODEL_ALIASES)}, "
        f"or a model id like claude-sonnet-4-5"
    )


def narrow_tools(requested: Sequence[str], allowed: Sequence[str] | None) -> tuple[list[str], list[str]]:
    """(tools kept, tools dropped): a child never gets a tool its parent lacks."""
    if allowed is None:
        return list(requested), []
    allowed_set = set(allowed)
    kept = [t for t in requested if t in allowed_set]
    return kept, [t for t in requested if t not in allowed_set]


def child_deadline(own_timeout: float | None, parent_deadline: float | None, now: float) -> float | None:
    """A child's deadline: its own, capped by the parent's minus a grace."""
    candidates = []
    if own_timeout is not None:
        candidates.append(now + own_timeout)
    if parent_deadline is not None:
        candidates.append(parent_deadline - PARENT_GRACE_S)
    return min(candidates) if candidates else None


def price_family(model: str) -> str:
    """opus, sonnet or haiku for a model id or alias (medium-tier's for one the table doesn't name)."""
    name = DEFAULT_MODEL_TIERS.get(model, model).lower()  # recorded models, checked when they were chosen
    if name in ALIAS_PRICE_FAMILY:
        return ALIAS_PRICE_FAMILY[name]
    return next((f for f in MODEL_PRICES_USD_PER_MTOK if f in name), FALLBACK_PRICE_FAMILY)


def price_per_mtok(model: str) -> tuple[float, float]:
    """(input, output) USD per million tokens for a model id or alias."""
    return MODEL_PRICES_USD_PER_MTOK[price_family(model)]


def estimate_agent(model: str, history: Mapping[str, Sequence[tuple[float, float]]]) -> tuple[float, float, str]:
    """(USD, seconds, basis) one agent of this model is expected to take.

    history maps a price family to (cost, duration) of its ended agents; the
    median of those resists the one runaway agent, else the tier default.
    """
    import statistics  # stdlib, but every level pays for module-top imports

    family = price_family(model)
    seen = history.get(family) or []
    if not seen:
        return DEFAULT_AGENT_COST_USD[family], DEFAULT_AGENT_SECONDS, f"default for {family}"
    cost = statistics.median(c for c, _ in seen)
    seconds = statistics.median(d for _, d in seen)
    return cost, seconds, f"median of {len(seen)} ended {family} agent(s)"


def estimate_cost(turns: Iterable[tuple[str, Mapping[str, Any]]]) -> float:
    """USD for (model, usage) per turn, priced from MODEL_PRICES_USD_PER_MTOK."""

    def tokens(usage: Mapping[str, Any], key: str) -> float:
        value = usage.get(key)
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else 0.0

    total = 0.0
    for model, usage in turns:
        price_in, price_out = price_per_mtok(model)
        read_in = tokens(usage, "input_tokens") + CACHE_READ_FACTOR * tokens(usage, "cache_read_input_tokens")
        written, split = tokens(usage, "cache_creation_input_tokens"), usage.get("cache_creation")
        # Of the writes, those kept for an hour cost more (the CLI says which in cache_creation).
        one_hour = min(tokens(split, "ephemeral_1h_input_tokens"), written) if isinstance(split, Mapping) else 0.0
        read_in += CACHE_WRITE_FACTOR * (written - one_hour) + CACHE_WRITE_1H_FACTOR * one_hour
        total += (read_in * price_in + tokens(usage, "output_tokens") * price_out) / 1e6
    return round(total, 6)


def truncate_for_stdout(output: Any, full_path: Path) -> tuple[Any, bool]:
    """Output bounded for a parent's context; the full text stays on disk."""
    text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
    if len(text.encode()) <= STDOUT_OUTPUT_LIMIT:
        return output, False
    cut = text.encode()[:STDOUT_OUTPUT_LIMIT].decode(errors="ignore")
    return f"{cut}\n...[truncated: {len(text.encode())} bytes in all; full output in {full_path}]", True


def validate_output(schema: Mapping[str, Any], output: Any) -> list[str]:
    if output_surely_valid(schema, output):
        return []  # no jsonschema to import (schemafast); any error is its to word
    import jsonschema

    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = sorted(validator.iter_errors(output), key=lambda e: list(e.absolute_path))
    return [f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in errors]


def check_schema(schema: Any, source: str) -> dict[str, Any]:
    if not isinstance(schema, dict):
        raise UsageError(f"schema {source} is not a JSON object; give a JSON Schema object")
    if schema_surely_valid(schema):
        return schema  # before the root's CLI starts: jsonschema's import would delay it (schemafast)
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        # The usual slip is a type's name ("objekt"): its message names no fix.
        types = ("array", "boolean", "integer", "null", "number", "object", "string")
        hint = did_you_mean(exc.instance, types) if isinstance(exc.instance, str) else ""
        raise UsageError(f"schema {source} is not a valid JSON Schema: {exc.message}{hint}") from None
    return schema


def schema_for_cli(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The schema as the CLI accepts it.

    The CLI's validator rejects a draft 2020-12 "$schema" URI it has no copy
    of; spawn.py validates the output itself with the full schema afterwards.
    """
    return {k: v for k, v in schema.items() if k not in ("$schema", "$id")}


def secret_values(environ: Mapping[str, str]) -> list[str]:
    values = {v for k, v in environ.items() if SECRET_NAME.search(k) and len(v) >= SECRET_MIN_LEN}
    return sorted(values, key=len, reverse=True)


def redact(text: str, secrets_: Sequence[str]) -> str:
    for value in secrets_:
        text = text.replace(value, REDACTED)
    return SECRET_PATTERN.sub(REDACTED, text)


def self_answer_refusal(ask_agent: str, session: Path, callers: Iterable[tuple[str, str, int]]) -> str | None:
    """Why an answer must be refused, given the agents the answering process runs under.

    callers are (session, agent id, depth) of those agents. An agent can't
    answer its own ask, and no agent of the tree below the root answers any:
    they run code a model wrote. The person, the root's own process and
    clients outside the tree can.
    """
    for caller_session, agent_id, depth in callers:
        if Path(caller_session).resolve() != session.resolve():
            continue
        if agent_id == ask_agent:
            return f"agent {agent_id} can't answer its own ask"
        if depth > 0:
            return f"agent {agent_id} (depth {depth}) of the same tree can't answer asks; the person or the root does"
    return None


def redact_values(value: Any, secrets_: Sequence[str]) -> Any:
    """value with every string in it redacted, before it is serialised.

    Redacting JSON text instead would miss a secret holding `"` or `\\`,
    which the encoder escapes into a different string.
    """
    if isinstance(value, str):
        return redact(value, secrets_)
    if isinstance(value, Mapping):
        return {redact_values(k, secrets_) if isinstance(k, str) else k: redact_values(v, secrets_) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_values(v, secrets_) for v in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    return redact(str(value), secrets_)  # what json.dumps(default=str) would write


def redacted_json(value: Any, secrets_: Sequence[str], **dumps: Any) -> str:
    return json.dumps(redact_values(value, secrets_), ensure_ascii=False, **dumps)


def briefing(meta: AgentMeta, spawn_cmd: str, delegates: Sequence[tuple[str, str]] = ()) -> str:
    """What every agent is told at start, whatever its system prompt: the part of it
    (after that prompt) that is the same for agents of the same tools, definition and
    depth, so siblings share it in the prompt cache. Its own facts are agent_facts."""
    remaining = meta.max_depth - meta.depth
    lines = [
        "## spawn.py briefing",
        f"You are an agent at depth {meta.depth} (max depth {meta.max_depth}); your id and limits follow your task.",
        f"Your tools: {', '.join(meta.tools) or 'none'}.",
    ]
    policy = (meta.placement or {}).get("policy")
    if remaining <= 0:
        lines.append("You cannot start child agents: the depth limit is reached.")
    elif policy in ("inprocess", "auto") and "Agent" in meta.tools:
        # Its children are the CLI's own subagents, which spawn.py records and governs.
        lines += [
            f"You may start child agents {remaining} level(s) deep with the Agent tool; spawn.py records and limits each.",
            "Pass run_in_background: false unless you have other work meanwhile.",
        ]
        if policy == "auto" and "Bash" in meta.tools:
            lines.append(
                f"Only a child that needs its own sandbox, directory, deadline or budget: from Bash, {spawn_cmd} --task 'SUBTASK' ..."
            )
    elif "Bash" not in meta.tools:
        lines.append("You cannot start child agents: you have no Bash tool.")
    elif any(rule.startswith("Bash(") for rule in meta.permissions.get("allow", [])):
        lines.append("You cannot start child agents: your Bash is limited by allow rules that don't include spawn.py.")
    else:
        lines += [
            f"You may start child agents {remaining} level(s) deep. From Bash, run:",
            f"  {spawn_cmd} --task 'SUBTASK' --tools {','.join(meta.tools)} [--schema NAME] [--timeout S]",
            "It prints one JSON object: id, status, output, cost. Children get at most your tools; list fewer to narrow them.",
            "For parallel work add --background (prints the id at once), then wait for all:",
            f"  {spawn_cmd} wait ID1 ID2 --all",
        ]
        if delegates:
            lines.append("Agents you may delegate to (add --agent NAME, or --agent auto to pick by task):")
            lines += [f"  {name}: {description}" for name, description in delegates]
    rules = [f"{kind} {', '.join(texts)}" for kind, texts in meta.permissions.items() if texts]
    lines.append(f"Your rights: permission mode {meta.permission_mode}" + (f"; rules: {'; '.join(rules)}" if rules else "") + ".")
    lines.append("A denied tool call is final: do not retry it another way.")
    return "\n".join(lines)


def agent_facts(meta: AgentMeta, now: float | None = None) -> str:
    """What differs between an agent and its siblings: it follows the task in its first
    message (a resumed agent's, in its new one), outside the cached head (pure but for the clock)."""
    lines = [AGENT_FACTS_HEADER, f"You are agent {meta.id}."]
    if meta.deadline is not None:
        left = max(0, int(meta.deadline - (time.time() if now is None else now)))
        deadline_iso = dt.datetime.fromtimestamp(meta.deadline, dt.UTC).isoformat(timespec="seconds")
        lines.append(f"Deadline: {deadline_iso} ({left} s from now); finish before it.")
    if meta.max_budget_usd is not None:
        lines.append(f"Budget: ${meta.max_budget_usd:.4f} for you and any children.")
    return "\n".join(lines)


def first_message(meta: AgentMeta, now: float | None = None) -> str:
    """The agent's first user message: its definition's initialPrompt, its task, then its facts."""
    parts = [meta.initial_prompt, meta.task, agent_facts(meta, now)]
    return "\n\n".join(p for p in parts if p)


def prompt_layout(meta: AgentMeta) -> dict[str, list[str]]:
    """Where each part of what the agent is told goes (cli_start), as --dry-run shows it (pure)."""
    system = ["claude_code preset"] if meta.preset == "claude_code" else []
    system += ["system_prompt", "briefing"]
    system += ["memory"] if meta.agent_source and meta.memory else []
    system += ["skills"] if meta.skills else []
    first = ["initial_prompt"] if meta.initial_prompt else []
    return {"system": system, "first_message": [*first, "task", "agent_facts"]}


def token_counts(usage: Any) -> dict[str, int]:
    """The four token counts of a usage record (USAGE_COUNTS), 0 for what is missing (pure)."""
    found = usage if isinstance(usage, Mapping) else {}
    return {
        # value < inf: JSON's Infinity parses, and int() of it would raise.
        key: int(value) if isinstance(value := found.get(key), int | float) and not isinstance(value, bool) and 0 < value < math.inf else 0
        for key in USAGE_COUNTS
    }


def round_usd(value: float | None) -> float | None:
    """Money as records and stdout carry it: to the micro-dollar, below any price, so
    float sums' noise (0.013656000000000001) stays out (pure)."""
    return None if value is None else round(value, 6)


def claude_config_dir(environ: Mapping[str, str]) -> Path:
    """Claude Code's config directory, as the CLI finds it (pure)."""
    return Path(environ.get("CLAUDE_CONFIG_DIR") or Path(environ.get("HOME", "~")) / ".claude").expanduser()


def sandbox_wanted(requested: str, depth: int, max_depth: int, tools: Sequence[str]) -> bool:
    """Whether --sandbox (on, off, auto) puts this agent's Bash in the sandbox.

    auto: every agent below the root that has Bash, spawners too. A
    sandboxed spawner's spawns go through its runner (the broker), outside
    the sandbox, whose process identity vouches for them.
    """
    if requested == "auto":
        return depth >= 1 and "Bash" in tools
    return requested == "on"


def sandbox_writes(
    may_spawn: bool, agent_dir: Path, session: str, runner_index: Path, *, session_entries: Sequence[str], drop_boxes: Sequence[str]
) -> tuple[list[str], list[str]]:
    """Where a sandboxed agent's Bash may write beyond its cwd, and what stays read-only in there (pure).

    It may write only its drop box and its scratch/. A spawner's drop box is
    requests/<its id>/, where the spawn.py in its Bash leaves its spawns and
    kills for its runner to run outside the sandbox (the broker); a leaf's
    is refused/<its id>/, where its refused spawns wait for its runner to
    record them (record_dropped_refusals). drop_boxes: the boxes there are,
    each as folder/name.

    Every other entry of the session (all of agents/, so its own, its
    ancestors' and its siblings' records, even those made after it started;
    the ledger, limits, asks, the fork server's socket, the other agents'
    drop boxes) is read-only, as is the runner index, even where they lie
    inside its cwd (sessions/ beside spawn.py, in a project). So a hostile
    agent can't publish an outcome before the runner that owns it, nor
    register a child of its own choosing. Its scratch/ also names the agent
    on bwrap's command line (sandbox_owner); inside its read-only agent
    directory it stays writable.
    The caller keeps only paths that exist: for a file not there yet the CLI
    would hold an empty placeholder at its path on the host while each
    command runs, and an empty .done is an outcome to every reader.
    """
    own_box = f"{REQUESTS_DIR if may_spawn else REFUSED_DIR}/{agent_dir.name}"
    others = [f"{session}/{name}" for name in session_entries if name not in (REFUSED_DIR, REQUESTS_DIR, SESSION_LOCK)]
    boxes = [f"{session}/{box}" for box in drop_boxes if box != own_box]
    writable = [f"{session}/{own_box}", str(agent_dir / SCRATCH_DIR)]
    return writable, [str(agent_dir), *others, *boxes, str(runner_index)]


def sandbox_settings(
    write_dirs: Sequence[str], api_host: str, web_domains: Sequence[str], deny_write: Sequence[str] = (), deny_read: Sequence[str] = ()
) -> dict[str, Any]:
    """Claude Code's `sandbox` settings for an agent (pure).

    failIfUnavailable and no unsandboxed fallback: a sandbox that can't start
    must stop the agent, never let its Bash run bare. Bash stays subject to
    our tool list and rules (no auto-allow). The API host is allowed so a
    nested spawn in Bash reaches the model through the sandbox's proxy.
    """
    return {
        "enabled": True,
        "failIfUnavailable": True,
        "autoAllowBashIfSandboxed": False,
        "allowUnsandboxedCommands": False,
        "filesystem": {"allowWrite": sorted(set(write_dirs)), "denyWrite": sorted(deny_write), "denyRead": sorted(deny_read)},
        "network": {"allowedDomains": sorted({api_host, *web_domains})},
    }


def cli_settings(**parts: Any) -> str | None:
    """The CLI's --settings JSON: one object with every key spawn.py sets
    (hooks, sandbox, permissions...). Empty parts are left out; None when
    there is nothing to set, so the CLI reads no settings flag at all."""
    settings = {key: value for key, value in parts.items() if value}
    return json.dumps(settings) if settings else None


_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')


_NOT_BRACKETS = re.compile(r"[^\[\]{}]+")


def parse_json(data: str | bytes, max_bytes: int = RECORD_MAX_BYTES) -> Any:
    """json.loads, bounded in size and depth: ValueError (a JSONDecodeError, with
    its line, where there is one) for whatever can't be parsed, never a RecursionError.

    Every record reader parses through here: a record anything with Bash can
    write must make that one record corrupt, not end its reader.
    """
    if len(data) > max_bytes:
        raise json.JSONDecodeError(f"larger than {max_bytes} bytes", "", 0)
    text = data.decode() if isinstance(data, bytes) else data  # UnicodeDecodeError is a ValueError
    # Fewer openers can't nest deeper: no scan. Else the strings' text is cut
    # out, then all but the brackets, in C: status parses 10,000s of lines.
    if text.count("[") + text.count("{") > JSON_MAX_DEPTH:
        brackets = _NOT_BRACKETS.sub("", _JSON_STRING.sub("", text))
        if max(itertools.accumulate(1 if c in "[{" else -1 for c in brackets)) > JSON_MAX_DEPTH:
            raise json.JSONDecodeError(f"nested deeper than {JSON_MAX_DEPTH} levels", text, too_deep_at(text))
    try:
        return json.loads(text)
    except RecursionError:  # not expected past the scan; a deep stack of the caller's own
        raise json.JSONDecodeError("nested too deep", text, 0) from None


def too_deep_at(text: str) -> int:
    """Where in JSON text a level past JSON_MAX_DEPTH opens (its index; 0 if none)."""
    depth = 0
    for match in re.finditer(rf"{_JSON_STRING.pattern}|[\[\]{{}}]", text):
        if match.group() in ("[", "{"):
            depth += 1
            if depth > JSON_MAX_DEPTH:
                return match.start()
        elif match.group() in ("]", "}"):
            depth -= 1
    return 0


def float_or_none(value: str | None) -> float | None:
    # NaN and infinity are ignored like any malformed value: min() with a NaN
    # first returns NaN, which would widen a deadline (env_number_warnings says so).
    try:
        number = float(value) if value not in (None, "") else None
    except ValueError:
        return None
    return number if number is not None and is_finite(number) else None


def native_usage(transcript: Path) -> dict[str, int]:
    """Token totals of a native subagent, from the CLI's own transcript of it.

    Read when asked, not at SubagentStop: the CLI writes the last lines after the hook.
    """
    totals: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for raw in transcript.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError, AttributeError):  # a line that isn't a message
                usage = (parse_json(raw).get("message") or {}).get("usage") or {}
                for key in ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
                    if isinstance(usage.get(key), int):
                        totals[key] = totals.get(key, 0) + usage[key]
    return totals


def outcome_problem(data: Mapping[str, Any], agent_id: str) -> str | None:
    """Why a published outcome.json is not an outcome of agent_id, or None (pure)."""
    if data.get("id") != agent_id:
        return f"its id is {data.get('id')!r}"
    if data.get("status") not in EXIT_FOR_STATUS:
        return f"its status is {data.get('status')!r}"
    for name in ("reason", "ended_at"):
        if not isinstance(data.get(name), str):
            return f"no {name}"
    duration: Any = data.get("duration_s")
    if type(data.get("exit_code")) is not int or type(duration) not in (int, float) or not is_finite(duration):
        return "no exit_code or duration_s"
    # Summed over the tree by status and the ledger: a string or NaN here would
    # stop, or silently poison, every total above it.
    if (cost := data.get("cost_usd")) is not None and (type(cost) not in (int, float) or not is_finite(cost)):
        return f"its cost_usd is {cost!r}"
    return None
