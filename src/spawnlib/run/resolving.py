"""plan_run: flags, environment and the ancestry of this process make a Plan; then admission and registration."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import os
import re
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.constants import (
    DEFAULT_MAX_DEPTH,
    DEFAULT_MODEL,
    DEFAULT_ROOT_TIMEOUT_S,
    DEFAULT_SYSTEM_PROMPT,
    DEFAULT_TOOLS,
    ENV_AGENT_ID,
    ENV_ASK,
    ENV_BUDGET,
    ENV_CLI,
    ENV_DEADLINE,
    ENV_DENY,
    ENV_DEPTH,
    ENV_IDLE_TIMEOUT,
    ENV_MAX_DEPTH,
    ENV_MODEL,
    ENV_MODEL_TIERS,
    ENV_PERMISSION_MODE,
    ENV_SESSION,
    ENV_TOOLS,
    ENV_TRACEPARENT,
    IDLE_TIMEOUT_S,
    KNOWN_TOOLS,
    LIMITS,
    MAX_COUNT,
    MAX_SECONDS,
    META,
    PERMISSION_KINDS,
    PERMISSION_RANK,
    SCHEMA_DIR,
    SESSION_INFO,
)
from ..core.embedded import builtin_files, builtin_label
from ..core.errors import RefusedError, SpawnError, StateError, UsageError, did_you_mean
from ..core.placement import ENV_PLACEMENT, PlacementDecision, decide_placement, narrow_policy, parse_policy, process_needs
from ..core.prelude import inside_sandbox
from ..core.pure import (
    DEFINITION_NUMBERS,
    RUN_NUMBER_FLAGS,
    check_schema,
    child_deadline,
    claude_config_dir,
    env_number_warnings,
    float_or_none,
    narrow_tools,
    new_trace,
    number_problem,
    parse_model_tiers,
    parse_tools,
    parse_traceparent,
    redact,
    redact_values,
    redacted_json,
    resolve_model,
    sandbox_wanted,
    secret_values,
    slugify,
    utc_now_iso,
)
from ..core.records import AgentMeta, Limits, SessionInfo, record_to_json
from ..policy.admission import admit
from ..policy.agents import (
    AgentDefinition,
    Rule,
    RuleSet,
    UnknownAgentDefinitionError,
    agent_dirs_for,
    known_tools,
    load_definitions,
    load_settings_rules,
    narrow_mode,
    node_of_definition,
    parse_reference,
    parse_rule,
    route,
)
from ..policy.channel import confirm_spawn
from ..policy.model_router import ROUTE_MODEL_TIER, route_by_model
from ..policy.steering import ENV_ON_BUDGET, ON_BUDGET_DEFAULT, ancestry_on_budget, narrow_on_budget, wait_while_paused
from ..policy.writable import cwd_refusal, definition_refusal, sandboxed_ancestors, untrusted_sources
from ..session.ledger import reserve_budget
from ..session.protocol import (
    AGENTS_DIR,
    create_agent_dir,
    create_session_dir,
    find_agent_dir,
    load_input,
    load_meta,
    publish_once,
    read_outcome,
    resolve_session_root,
    session_lock,
    write_json_atomic,
)
from ..supervise.calls import call_owner, hosts_in_process
from ..supervise.cluster import ray_sibling_command
from ..supervise.supervisor import (
    _int_or_none,
    _json_list,
    ancestry_context,
    choose_containment,
    guard_above_possible,
    own_identity,
    register_runner,
    runner_index_dir,
    sandbox_problem,
    stamp_where,
    start_guard,
    unsandboxed_warning,
)
from .executors import executor_for

# ---------------------------------------------------------------- resolving --


@dataclass
class Inherited:
    """What the parent agent passes down: through env, checked against ancestry."""

    parent_id: str | None = None
    session: Path | None = None
    depth: int = -1  # the parent's depth; -1 when this is a root
    max_depth: int | None = None
    deadline: float | None = None
    budget: float | None = None
    tools: list[str] | None = None
    traceparent: str | None = None
    deny: list[str] = field(default_factory=list)
    ask: list[str] = field(default_factory=list)
    permission_mode: str | None = None
    model: str | None = None
    idle_timeout: float | None = None
    sandboxed: bool = False
    """The parent runs sandboxed: its children's requests come through its broker."""


def inherited_context(environ: Mapping[str, str], ancestry: Mapping[str, Any], *, background_runner: bool = False) -> Inherited:
    """What this spawn inherits: the narrowest of its env, its ancestors' envs, and its runner.

    The nearest ancestor agent found by process identity (ancestry["runner"],
    from its meta.json) is the parent whenever there is one: its id and its
    session, whatever the environment claims. Every limit is the smallest
    any source gives, and the tools are those every source allows.

    Below a runner whose CLI hosts in-process agents, the parent is the agent
    whose Bash call started this process, as its call token names it (call_owner;
    without a token that holds: RefusedError): that CLI's process is every one of theirs.
    """
    inh = Inherited()
    runner: Mapping[str, Any] = ancestry.get("runner") or {}
    if runner and hosts_in_process(runner):
        runner = call_owner(environ, runner, ancestry.get("chain") or [], background_runner=background_runner)
    env_depth = _int_or_none(environ.get(ENV_DEPTH))
    anc_depth = ancestry.get("depth")
    if env_depth is not None and (anc_depth is None or env_depth >= anc_depth):
        inh.depth = env_depth
        inh.parent_id = environ.get(ENV_AGENT_ID)
        inh.session = Path(environ[ENV_SESSION]) if environ.get(ENV_SESSION) else None
    elif anc_depth is not None:
        inh.depth = anc_depth
        inh.parent_id = ancestry.get("parent_id")
        inh.session = Path(ancestry["session"]) if ancestry.get("session") else None
    if runner:
        inh.parent_id = runner["parent_id"]
        inh.session = Path(runner["session"])
        inh.depth = max(inh.depth, int(runner["depth"]))
    inh.max_depth = min_known(_int_or_none(environ.get(ENV_MAX_DEPTH)), ancestry.get("max_depth"), runner.get("max_depth"))
    inh.deadline = min_known(float_or_none(environ.get(ENV_DEADLINE)), ancestry.get("deadline"), runner.get("deadline"))
    inh.budget = min_known(float_or_none(environ.get(ENV_BUDGET)), ancestry.get("budget"), runner.get("budget"))
    tool_sets: list[set[str]] = []
    if environ.get(ENV_TOOLS) is not None:
        tool_sets.append(set(environ[ENV_TOOLS].split(",")) - {""})
    for source in (ancestry, runner):
        if source.get("tools") is not None:
            tool_sets.append(set(source["tools"]))
    if tool_sets:
        inh.tools = sorted(set.intersection(*tool_sets))
    inh.traceparent = environ.get(ENV_TRACEPARENT) or environ.get("TRACEPARENT") or runner.get("traceparent")
    # Rules only accumulate: an agent can drop them from its own env, not from its ancestors'.
    for kind, name in (("deny", ENV_DENY), ("ask", ENV_ASK)):
        rules = set(_json_list(environ.get(name))) | set(ancestry.get(kind, [])) | set(runner.get(kind, []))
        setattr(inh, kind, sorted(rules))
    modes = [m for m in (environ.get(ENV_PERMISSION_MODE), ancestry.get("mode"), runner.get("mode")) if m in PERMISSION_RANK]
    inh.permission_mode = min(modes, key=lambda m: PERMISSION_RANK[m]) if modes else None
    inh.model = environ.get(ENV_MODEL) or runner.get("model")
    inh.sandboxed = runner.get("sandbox") in ("on", "inherited")
    idle = float_or_none(environ.get(ENV_IDLE_TIMEOUT))
    inh.idle_timeout = idle if idle is not None and 0 < idle < float("inf") else None
    return inh


# Clocks and float sums differ a little between the admission that wrote a
# record and the check of it; a widening worth refusing is larger than this.
ADMISSION_SLACK_S = 1.0
ADMISSION_SLACK_USD = 1e-6


def canonical_rules(texts: Iterable[str]) -> set[str]:
    """Rule texts as parse_rule spells them, so a record and an environment compare alike."""
    canonical = set()
    for text in texts:
        try:
            canonical.add(parse_rule(text).text)
        except SpawnError:
            canonical.add(text)
    return canonical


def admission_problem(meta: AgentMeta, inh: Inherited) -> str | None:
    """Why a registered agent's record is wider than admission under its verified parent allows; None if it is not.

    inh is what this process's own ancestry gives (inherited_context): the
    nearest registered runner above it, and the environments its ancestors
    were started with. That runner is the agent's parent, or an ancestor of
    it whose own parent ended meanwhile; limits only shrink down a tree, so
    an honest record is within them either way. A record written by anyone
    else (a forged meta.json, one changed after registration) must not
    choose its own limits: with no verified parent, the caller is a person
    or a CI job starting a root, who may choose any.
    """
    if inh.parent_id is None and inh.depth < 0:
        return None
    # With no parent agent on this machine (one served to an A2A caller
    # elsewhere), the caller's depth and limits still bind it.
    if inh.parent_id is not None:
        if inh.session is not None and Path(meta.session) != inh.session:
            return f"its meta.json names session {meta.session}, but its parent runs in {inh.session}"
        if meta.parent_id is None:
            return f"its meta.json names no parent, but it runs under agent {inh.parent_id}"
    if meta.depth < inh.depth + 1:
        return f"its meta.json puts it at depth {meta.depth}, above its parent at depth {inh.depth}"
    wider: list[str] = []
    if inh.max_depth is not None and meta.max_depth > inh.max_depth:
        wider.append(f"max depth {meta.max_depth} > {inh.max_depth}")
    if inh.tools is not None and (extra := sorted(set(meta.tools) - set(inh.tools))):
        wider.append(f"tools {','.join(extra)} its parent lacks")
    if inh.deadline is not None and (meta.deadline is None or meta.deadline > inh.deadline + ADMISSION_SLACK_S):
        wider.append("a later deadline")
    if inh.budget is not None and (meta.max_budget_usd is None or meta.max_budget_usd > inh.budget + ADMISSION_SLACK_USD):
        wider.append(f"a budget of {meta.max_budget_usd} > {inh.budget}")
    for kind, texts in (("deny", inh.deny), ("ask", inh.ask)):
        if missing := sorted(canonical_rules(texts) - canonical_rules(meta.permissions.get(kind, []))):
            wider.append(f"no {kind} rule {missing[0]}")
    mode, parent_mode = meta.permission_mode, inh.permission_mode
    if parent_mode in PERMISSION_RANK and PERMISSION_RANK.get(mode or "", 99) > PERMISSION_RANK[parent_mode]:
        wider.append(f"permission mode {mode} > {parent_mode}")
    return f"its meta.json is wider than its parent allows: {'; '.join(wider)}" if wider else None


def read_task(args: argparse.Namespace) -> str:
    if args.task is not None and args.task_file is not None:
        raise UsageError("give --task or --task-file, not both")
    if args.task_file is not None:
        if args.task_file == "-":
            task = sys.stdin.read()
        else:
            try:
                task = Path(args.task_file).read_text()
            except OSError as exc:
                raise UsageError(f"can't read --task-file {args.task_file}: {exc.strerror}; check the path") from None
            except UnicodeDecodeError:
                raise UsageError(f"--task-file {args.task_file} is not UTF-8 text") from None
    else:
        task = args.task or ""
    if not task.strip():
        raise UsageError("the task is empty; pass --task TEXT or --task-file PATH ('-' for stdin)")
    try:
        task.encode()  # argv bytes that aren't UTF-8 arrive as lone surrogates
    except UnicodeEncodeError:
        raise UsageError("the task is not valid UTF-8 text; fix its encoding or pass it with --task-file") from None
    return task


# Schemas of spawn.py's own records in schemas/: not output schemas for an agent,
# so neither listed as such nor built into spawn.py (tools/bundle.py reads this).
RECORD_SCHEMAS = frozenset(
    {
        "ask", "ask-answer", "ask-attempt", "broker-line", "broker-reply", "broker-request", "dag-journal-line", "forkserver-line",
        "heartbeat", "kill", "ledger-line", "limits", "meta", "native-line", "outcome", "paused", "session", "state", "status",
        "transcript-line",
    }
)  # fmt: skip


def load_schema(value: str) -> tuple[dict[str, Any], str]:
    """A schema from NAME (schemas/NAME.json beside the script, else built in), a path, or inline JSON."""
    text: str
    source: str
    stripped = value.strip()
    if stripped.startswith(("{", "[")):
        text, source = stripped, "inline"
    elif re.fullmatch(r"[A-Za-z0-9_.\-]+", stripped) and not stripped.endswith(".json"):
        path = SCHEMA_DIR / f"{stripped}.json"
        builtin = builtin_files("schemas")
        if path.is_file():
            text, source = path.read_text(), str(path)
        elif f"{stripped}.json" in builtin:
            text, source = builtin[f"{stripped}.json"], builtin_label(f"schemas/{stripped}.json")
        else:
            names = {p.stem for p in SCHEMA_DIR.glob("*.json") if p.stem not in RECORD_SCHEMAS} if SCHEMA_DIR.is_dir() else set()
            names |= {Path(name).stem for name in builtin}
            hint = did_you_mean(stripped, names)
            raise UsageError(
                f"unknown schema {stripped!r}{hint or ';'} use one of {', '.join(sorted(names)) or '(none)'}, a path, or inline JSON"
            )
    else:
        path = Path(stripped).expanduser()
        try:
            text, source = path.read_text(), str(path.resolve())
        except OSError as exc:
            raise UsageError(f"can't read schema {stripped}: {exc.strerror}; give a NAME, a path or inline JSON") from None
    return check_schema(load_input(text, f"schema {source}", "JSON"), source), source


def find_cli(environ: Mapping[str, str]) -> Path:
    """The claude CLI: $SPAWN_CLI, else the one bundled in the SDK wheel.

    Found without importing the SDK (importing it costs about a second).
    """
    if environ.get(ENV_CLI):
        path = Path(environ[ENV_CLI])
    else:
        import importlib.util

        spec = importlib.util.find_spec("claude_agent_sdk")
        if spec is None or spec.origin is None:
            raise UsageError("claude-agent-sdk is not installed; run with 'uv run spawn.py' or pip install claude-agent-sdk")
        path = Path(spec.origin).parent / "_bundled" / ("claude.exe" if os.name == "nt" else "claude")
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise UsageError(f"claude CLI not found at {path}; reinstall claude-agent-sdk or set {ENV_CLI}")
    return path


def check_credentials(environ: Mapping[str, str]) -> None:
    # ANTHROPIC_BASE_URL is not among them: a proxy or the mock model still
    # needs a key, and without one the CLI starts, then fails "Not logged in".
    names = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN",
             "CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX", "CLAUDE_CODE_USE_FOUNDRY")  # fmt: skip
    if any(environ.get(n) for n in names):
        return
    config = claude_config_dir(environ)
    if (config / ".credentials.json").is_file() or sys.platform == "darwin":  # macOS keeps them in the keychain
        return
    with contextlib.suppress(OSError, ValueError, AttributeError):
        if json.loads((config / "settings.json").read_text()).get("apiKeyHelper"):
            return  # the tree's gateway runs it (a tree without one: an agent's CLI that reads user settings)
    raise UsageError(
        "no credentials for the model; set ANTHROPIC_API_KEY, run 'claude login', "
        "or for offline runs set ANTHROPIC_BASE_URL to tools/mock_model.py and any ANTHROPIC_API_KEY"
    )


@dataclass
class Plan:
    """Everything a run needs, resolved before anything is written."""

    meta: AgentMeta
    inherited: Inherited
    refusal: str | None
    session_root: Path
    new_session: bool
    cli: Path
    secrets: list[str]
    limits: Limits = field(default_factory=Limits)
    """Tree-wide caps; written to limits.json when this spawn creates the session."""
    guard: tuple[int, int] | None = None
    """(pid, pipe) of the guard started for an agent this process runs."""
    rules: RuleSet = field(default_factory=RuleSet)
    """The effective rules, each with where it came from (for --dry-run)."""
    no_wait: bool = False
    """--no-wait: refused at once, not queued, when the tree is paused at its budget."""


def positive(name: str, value: float | None, integer: bool = False) -> None:
    """A count (>= 0) or an amount (> 0), checked like every other number."""
    maximum = MAX_COUNT if integer else MAX_SECONDS
    why = None if value is None else number_problem(name, value, maximum=maximum, integer=integer, zero_ok=integer)
    if why is not None:
        raise UsageError(why)


def check_run_input(args: argparse.Namespace, environ: Mapping[str, str]) -> list[str]:
    """Every number, path and trace a run was given, checked before anything starts.

    Bad flags are usage errors (exit 2, nothing written). Malformed SPAWN_*
    and TRACEPARENT variables come back as warnings: their readers ignore
    them, and an ignored limit is still bounded by the ancestry.
    """
    for flag, attr, maximum, integer, zero_ok in RUN_NUMBER_FLAGS:
        value = getattr(args, attr)
        why = None if value is None else number_problem(flag, value, maximum=maximum, integer=integer, zero_ok=zero_ok)
        if why is not None:
            raise UsageError(why)
    if args.parent_trace is not None and parse_traceparent(args.parent_trace) is None:
        raise UsageError(f"--parent-trace {args.parent_trace!r} is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)")
    if args.output:
        check_output_path(args.output)
    warnings = env_number_warnings(environ)
    for name in (ENV_TRACEPARENT, "TRACEPARENT"):
        value = environ.get(name)
        if value and parse_traceparent(value) is None:
            warnings.append(f"{name} {value[:80]!r} is not a W3C traceparent; ignored, a new trace is started")
    return warnings


def check_output_path(value: str) -> None:
    """--output must be a file we can write, known before the model is called and paid."""
    path = Path(value).expanduser()
    try:
        if path.is_dir():
            raise UsageError(f"--output {value} is a directory; give a file path")
        parent = path.resolve().parent
    except (OSError, RuntimeError) as exc:
        raise UsageError(f"--output {value} can't be resolved: {exc}") from None
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"--output {value} is not writable; give another path")
    # Missing directories are created when the output is written: the nearest
    # existing one must let us do that.
    existing = next(p for p in (parent, *parent.parents) if p.exists())
    if not existing.is_dir():
        raise UsageError(f"--output {value}: {existing} is not a directory; give another path")
    if not path.exists() and not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"--output {value}: directory {existing} is not writable; give another path")


def plan_run(args: argparse.Namespace, environ: Mapping[str, str], ancestry: Mapping[str, Any]) -> Plan:
    """Flags, environment and this process's ancestry -> the Plan that register and run_agent follow; nothing is written."""
    task = read_task(args)
    asked = asked_by_flags(args, environ)
    flag_rules = RuleSet(*([parse_rule(r, f"--{kind}") for r in getattr(args, kind) or []] for kind in PERMISSION_KINDS))
    input_warnings = check_run_input(args, environ)
    asked.system_prompt = read_system_prompt(args)
    cwd = Path(args.cwd).expanduser().resolve() if args.cwd else Path.cwd()
    if not cwd.is_dir():
        raise UsageError(f"--cwd {args.cwd} is not a directory")
    cli = find_cli(environ)
    # A reference (a2a:URL, an agent-card URL, command:EXE) names its node
    # directly; a NAME is a definition, which may itself say its kind.
    node = parse_reference(args.agent)

    inh = inherited_context(environ, ancestry)
    warnings: list[str] = input_warnings
    depth = inh.depth + 1
    route_by = getattr(args, "route", None) or "lexical"
    definition, routing, yaml_problems = choose_definition(args.agent, task, cwd, environ, route_by) if node is None else (None, None, [])
    warnings += yaml_problems
    node = node or node_of_definition(definition)
    if not args.dry_run and node.kind == "claude":
        check_credentials(environ)  # only the claude kind calls the model from here
    asked = narrow_by_definition(definition, asked, flag_rules, warnings)
    system_prompt, requested_tools, disallowed = asked.system_prompt, asked.tools, asked.disallowed
    max_depth_arg, timeout, budget_arg = asked.max_depth, asked.timeout, asked.budget
    max_turns, background = asked.max_turns, asked.background
    model = choose_model(args, environ, definition, inh)
    schema_arg = args.schema or (definition.schema if definition else None)
    schema, schema_source = load_schema(schema_arg) if schema_arg else (None, None)
    rules = tree_rules(args, environ, cwd, inh=inh, definition=definition, flag_rules=flag_rules, warnings=warnings)
    mode = tree_mode(definition, inh, warnings)
    max_depth = narrow_to_inherited("--max-depth", max_depth_arg, inh.max_depth, "the tree's", warnings)
    max_depth = DEFAULT_MAX_DEPTH if max_depth is None else max_depth
    tools = tree_tools(requested_tools, definition, inh, warnings)
    budget = narrow_to_inherited("--max-budget-usd", budget_arg, inh.budget, "the parent's", warnings)
    on_budget = choose_on_budget(args, environ, ancestry, warnings)
    now = time.time()
    deadline = child_deadline(own_timeout(args, timeout, inh), inh.deadline, now)
    # A bad reference is exit 2 before anything is written; the check's time
    # (an A2A card's fetch) counts against the deadline.
    executor_for(node.kind).check(node, deadline, environ)
    idle_timeout = min_known(args.idle_timeout if args.idle_timeout is not None else IDLE_TIMEOUT_S, inh.idle_timeout)

    refusal = refusal_for(depth, max_depth, deadline, now, requested_tools=requested_tools, tools=tools)
    sandbox, sandbox_refusal = choose_sandbox(
        args, node.kind, depth, max_depth, tools, is_root=inh.depth < 0, parent_sandboxed=inh.sandboxed, warnings=warnings
    )
    refusal = refusal or sandbox_refusal or below_sandbox_refusal(args, cwd, environ, inh, definition=definition, warnings=warnings)

    session_root, session = choose_session(args, environ, inh, warnings)
    trace = new_trace(args.parent_trace or inh.traceparent)
    topic = args.topic or task
    meta = AgentMeta(
        id="(assigned at registration)",
        parent_id=inh.parent_id,
        depth=depth,
        max_depth=max_depth,
        pid=0,
        create_time=0.0,
        pgid=0,
        trace_id=trace.trace_id,
        span_id=trace.span_id,
        parent_span_id=trace.parent_span_id,
        traceparent=trace.traceparent,
        task=task,
        tools=tools,
        disallowed_tools=disallowed,
        model=model,
        cwd=str(cwd),
        started_at=utc_now_iso(),
        session=str(session) if session else "(created at registration)",
        system_prompt=system_prompt if system_prompt is not None else ("" if args.preset else DEFAULT_SYSTEM_PROMPT),
        preset=args.preset,
        schema=schema,
        schema_source=schema_source,
        deadline=deadline,
        max_turns=max_turns,
        max_budget_usd=budget,
        idle_timeout_s=idle_timeout,
        on_budget=on_budget if on_budget != ON_BUDGET_DEFAULT else None,
        # Redacted before slugify lowercases it out of the secret's shape.
        topic=slugify(redact(topic, secret_values(environ)), 32),
        output_file=str(Path(args.output).expanduser().resolve()) if args.output else None,
        background=bool(background),
        routing=routing,
        permissions=rules.texts(),
        permission_mode=mode,
        sandbox=sandbox,
        warnings=warnings,
        kind=node.kind,
        endpoint=node.endpoint,
    )
    meta.placement = plan_placement(args, environ, ancestry, is_root=inh.depth < 0, kind=node.kind, warnings=warnings).as_record()
    if definition is not None:
        take_definition_settings(meta, definition)
    limits = Limits(budget_arg, args.max_agents, args.max_concurrent, args.confirm_over)
    warn_about_tree_limits(args, session is None, max_depth, warnings)
    return Plan(meta, inh, refusal, session_root, session is None, cli, secret_values(environ), limits, rules=rules, no_wait=args.no_wait)


def read_system_prompt(args: argparse.Namespace) -> str | None:
    """--system-prompt, or --system-prompt-file's text; None for neither."""
    system_prompt: str | None
    if args.system_prompt is not None and args.system_prompt_file is not None:
        raise UsageError("give --system-prompt or --system-prompt-file, not both")
    system_prompt = args.system_prompt
    if args.system_prompt_file is not None:
        try:
            system_prompt = Path(args.system_prompt_file).read_text()
        except OSError as exc:
            raise UsageError(f"can't read --system-prompt-file {args.system_prompt_file}: {exc.strerror}") from None
    return system_prompt


@dataclass
class AskedLimits:
    """What the flags ask for, before the tree narrows it: a definition's settings narrow these first."""

    system_prompt: str | None
    tools: list[str] | None
    disallowed: list[str]
    max_depth: int | None
    timeout: float | None
    budget: float | None
    max_turns: int | None
    background: bool | None


def narrow_by_definition(definition: AgentDefinition | None, asked: AskedLimits, flag_rules: RuleSet, warnings: list[str]) -> AskedLimits:
    """The flags' values as a definition narrows them (it can't be widened by them); flag_rules may lose its allow rules."""
    system_prompt, requested_tools, disallowed = asked.system_prompt, asked.tools, asked.disallowed
    max_depth_arg, timeout, budget_arg, max_turns, background = (
        asked.max_depth,
        asked.timeout,
        asked.budget,
        asked.max_turns,
        asked.background,
    )
    if definition is not None:
        # A definition's settings are defaults the flags override, but the
        # flags can't widen what it allows: tools, depth, time, budget, rules.
        system_prompt = system_prompt if system_prompt is not None else definition.prompt
        if definition.tools is not None:
            if requested_tools is not None:
                dropped = [t for t in requested_tools if t not in definition.tools]
                if dropped:
                    warnings.append(f"tools not in the {definition.name} definition were dropped: {','.join(dropped)}")
                requested_tools = [t for t in requested_tools if t in definition.tools]
            else:
                requested_tools = list(definition.tools)
        disallowed = list(dict.fromkeys([*definition.disallowed_tools, *disallowed]))
        max_depth_arg = min_known(max_depth_arg, definition.max_depth)
        timeout = min_known(timeout, definition.timeout)
        budget_arg = min_known(budget_arg, definition.max_budget_usd)
        max_turns = min_known(max_turns, definition.max_turns)
        if background is None:
            background = definition.background
        if isinstance(definition.effort, int):
            warnings.append(f"numeric effort {definition.effort} is not passed: the SDK takes low, medium, high, xhigh or max")
        if flag_rules.allow and definition.permissions.allow:
            warnings.append(f"--allow can't widen the {definition.name} definition's allow rules; ignored")
            flag_rules.allow = []
    return AskedLimits(system_prompt, requested_tools, disallowed, max_depth_arg, timeout, budget_arg, max_turns, background)


def tree_rules(
    args: argparse.Namespace,
    environ: Mapping[str, str],
    cwd: Path,
    *,
    inh: Inherited,
    definition: AgentDefinition | None,
    flag_rules: RuleSet,
    warnings: list[str],
) -> RuleSet:
    """The agent's permission rules: its definition's, the flags', the user's settings and the tree's inherited ones."""
    own = definition.permissions if definition else RuleSet()
    if definition is not None:
        own = RuleSet(*([dataclasses.replace(r, source=definition.path) for r in getattr(own, k)] for k in PERMISSION_KINDS))
    # A user's settings files bind the whole tree: its first agent on this
    # machine reads them (a root, or one served to a caller elsewhere, which
    # arrives with the caller's depth but no parent here), and their deny and
    # ask rules reach every child as inherited rules.
    first_here = inh.parent_id is None
    user = load_settings_rules(cwd, environ) if first_here and not args.no_settings else RuleSet()
    if args.no_settings and not first_here:
        warnings.append("--no-settings applies at the root only; the tree's rules still hold")
    inherited = [[parse_rule(t, "inherited from the parent") for t in texts] for texts in (inh.deny, inh.ask)]
    rules = RuleSet(
        allow=[*own.allow, *flag_rules.allow, *user.allow],
        deny=unique_rules([*own.deny, *flag_rules.deny, *user.deny, *inherited[0]]),
        ask=unique_rules([*own.ask, *flag_rules.ask, *user.ask, *inherited[1]]),
    )
    return rules


def warn_about_tree_limits(args: argparse.Namespace, is_root: bool, max_depth: int, warnings: list[str]) -> None:
    """The tree-wide limits' warnings: too few slots for the depth, or set below the root where they don't apply."""
    if is_root and args.max_concurrent is not None and args.max_concurrent <= max_depth:
        warnings.append(
            f"--max-concurrent {args.max_concurrent} is fewer than the {max_depth + 1} levels --max-depth {max_depth} allows: "
            "a parent lends its slot only while blocked in a foreground spawn or 'spawn.py wait'"
        )
    if not is_root and (args.max_agents is not None or args.max_concurrent is not None or args.confirm_over is not None):
        warnings.append("--max-agents, --max-concurrent and --confirm-over apply to a whole tree and are set by its root; ignored here")


def plan_placement(
    args: argparse.Namespace, environ: Mapping[str, str], ancestry: Mapping[str, Any], *, is_root: bool, kind: str, warnings: list[str]
) -> PlacementDecision:
    """Where this agent runs: --placement narrowed by what the tree allows, then decided.

    The parent's runner (its meta.json) is the authority, as for the other
    limits: an agent can unset SPAWN_PLACEMENT in its own Bash, not its record.
    """
    requested = parse_policy(args.placement) if args.placement else None
    if requested is None and is_root and environ.get(ENV_PLACEMENT):
        requested = parse_policy(environ[ENV_PLACEMENT], ENV_PLACEMENT)  # a user's default
    sources = [(environ.get(ENV_PLACEMENT), ENV_PLACEMENT), ((ancestry.get("runner") or {}).get("placement"), "the parent's placement")]
    inherited = None
    for text, source in sources:
        if isinstance(text, str) and text and not is_root:
            policy = parse_policy(text, source)
            inherited = policy if inherited is None else narrow_policy(policy, inherited)[0]
    policy, warning = narrow_policy(requested, inherited)
    if warning:
        warnings.append(warning)
    needs = process_needs(
        sandbox=args.sandbox == "on",
        own_cwd=args.cwd is not None,
        deadline=bool(args.timeout),
        budget=args.max_budget_usd is not None,
        kind=kind,
        cluster=policy.name == "ray",
    )
    decision = decide_placement(policy, needs, by_agent_tool=False, is_root=is_root)
    if not args.dry_run and decision.backend == "ray":
        ray_sibling_command(environ)  # a missing Ray sibling is exit 2 before anything is written
    return decision


def choose_on_budget(args: argparse.Namespace, environ: Mapping[str, str], ancestry: Mapping[str, Any], warnings: list[str]) -> str:
    """--on-budget, narrowed by what the tree runs under (pause may become fail, never the other way)."""
    on_budget, on_budget_warning = narrow_on_budget(args.on_budget, [environ.get(ENV_ON_BUDGET), ancestry_on_budget(ancestry)])
    if on_budget_warning:
        warnings.append(on_budget_warning)
    return on_budget


def asked_by_flags(args: argparse.Namespace, environ: Mapping[str, str]) -> AskedLimits:
    """What the flags ask for; args stays as parsed. (The system prompt is read after the other flags' checks.)"""
    requested_tools, disallowed = read_tool_flags(args, environ)
    # --timeout 0: no deadline of its own, explicitly.
    timeout: float | None = args.timeout or None
    return AskedLimits(None, requested_tools, disallowed, args.max_depth, timeout, args.max_budget_usd, args.max_turns, args.background)


def own_timeout(args: argparse.Namespace, timeout: float | None, inh: Inherited) -> float | None:
    """The agent's own timeout: a root given none gets the default; --timeout 0 keeps none."""
    if args.timeout is None and timeout is None and inh.depth < 0:
        return DEFAULT_ROOT_TIMEOUT_S
    return timeout


def choose_session(args: argparse.Namespace, environ: Mapping[str, str], inh: Inherited, warnings: list[str]) -> tuple[Path, Path | None]:
    """(where a new session goes, the tree's session if this agent has one)."""
    session_root = resolve_session_root(args.session, environ)
    # A child stays in its tree's session, whatever --session says: there it
    # shares the tree's limits file and ledger, and `kill` finds it.
    session = inh.session
    if session is not None and args.session:
        warnings.append(f"--session {args.session} ignored: this agent is registered in its tree's session {session}")
    return session_root, session


def read_tool_flags(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[list[str] | None, list[str]]:
    """(--tools, None for not given; --disallowed-tools), checked against the tools known."""
    catalogue = known_tools(environ) if args.tools or args.disallowed_tools else KNOWN_TOOLS  # with what the CLI reported
    requested_tools = parse_tools(args.tools, catalogue) if args.tools is not None else None
    disallowed = parse_tools(args.disallowed_tools, catalogue) if args.disallowed_tools else []
    return requested_tools, disallowed


def choose_model(args: argparse.Namespace, environ: Mapping[str, str], definition: AgentDefinition | None, inh: Inherited) -> str:
    """--model, else the definition's, else the default; "inherit" is the parent's; a tier name resolved."""
    model_name = args.model if args.model is not None else (definition.model if definition and definition.model else DEFAULT_MODEL)
    if model_name == "inherit":
        model_name = inh.model or DEFAULT_MODEL
    model_source = "--model" if args.model is not None else (f"the model of {definition.path}" if definition else "the model")
    model = resolve_model(model_name, parse_model_tiers(environ.get(ENV_MODEL_TIERS)), model_source)
    return model


def tree_tools(requested_tools: list[str] | None, definition: AgentDefinition | None, inh: Inherited, warnings: list[str]) -> list[str]:
    """The agent's tools: those asked for (or the parent's), with its definition's MCP servers, within the parent's."""
    tools = list(requested_tools) if requested_tools is not None else list(inh.tools or DEFAULT_TOOLS)
    if definition is not None:
        # A definition's MCP servers are granted whole unless it names their tools.
        tools += [f"mcp__{s}" for s in definition.mcp_servers if not any(t.startswith(f"mcp__{s}") for t in tools)]
    tools, dropped = narrow_tools(tools, inh.tools)
    if dropped:
        warnings.append(f"tools not held by the parent were dropped: {','.join(dropped)}")
    return tools


def choose_sandbox(
    args: argparse.Namespace,
    kind: str,
    depth: int,
    max_depth: int,
    tools: list[str],
    *,
    is_root: bool,
    parent_sandboxed: bool,
    warnings: list[str],
) -> tuple[str, str | None]:
    """(the sandbox, a refusal or None)."""
    sandbox_refusal = None
    # Inside a parent's sandbox an agent is held by it, whatever it asks.
    sandbox = "inherited" if inside_sandbox() else "off"
    if sandbox == "off" and kind == "claude":
        requested = args.sandbox
        if requested == "off" and parent_sandboxed:
            # A sandboxed parent's children come out of its sandbox only by its runner: never less held than auto.
            requested = "auto"
            warnings.append("--sandbox off raised to auto: the parent runs sandboxed")
        sandbox, sandbox_refusal = sandbox_choice(requested, depth, max_depth, tools, is_root=is_root, warnings=warnings)
    return sandbox, sandbox_refusal


def take_definition_settings(meta: AgentMeta, definition: AgentDefinition) -> None:
    """The settings a definition gives its agent as they are (its limits are narrowed with the flags', in plan_run)."""
    meta.agent = definition.name
    meta.agent_source = definition.path
    meta.mcp_servers = sorted(definition.mcp_servers)
    meta.skills = definition.skills
    meta.effort = definition.effort
    meta.initial_prompt = definition.initial_prompt
    meta.isolation = definition.isolation
    meta.memory = definition.memory
    meta.hooks = sorted(definition.hooks or {})


def tree_mode(definition: AgentDefinition | None, inh: Inherited, warnings: list[str]) -> str:
    """The permission mode: the definition's, within the tree's."""
    mode, mode_warning = narrow_mode(definition.permission_mode if definition else None, inh.permission_mode, is_root=inh.depth < 0)
    if mode_warning:
        warnings.append(mode_warning)
    return mode


def narrow_to_inherited(flag: str, requested: Any, inherited: Any, whose: str, warnings: list[str]) -> Any:
    """A limit: the inherited one when none was asked for, else the smaller, with a warning if lowered."""
    if inherited is None:
        return requested
    if requested is not None and requested > inherited:
        warnings.append(f"{flag} {requested} lowered to {whose} {inherited}")
    return inherited if requested is None else min(requested, inherited)


def sandbox_choice(
    requested: str, depth: int, max_depth: int, tools: Sequence[str], *, is_root: bool, warnings: list[str]
) -> tuple[str, str | None]:
    """The agent's sandbox (on or off) and, for --sandbox on where it can't run, the refusal.

    auto never refuses: where the platform has no working sandbox the agents
    it would sandbox run unsandboxed, each with the warning in its meta.json.
    The root says it once, on the person's stderr, for the tree below it (its
    descendants' stderr goes to their parents' Bash, not to the person).
    """
    if sandbox_wanted(requested, depth, max_depth, tools):
        problem = sandbox_problem()
        if problem is None:
            return "on", None
        if requested == "on":
            return "on", f"sandbox: --sandbox on, but Claude Code's sandbox can't run here: {problem}; or pass --sandbox auto or off"
        warnings.append(unsandboxed_warning(problem))
    elif requested == "auto" and is_root and depth < max_depth and "Bash" in tools and (problem := sandbox_problem()) is not None:
        warnings.append(unsandboxed_warning(problem))
    return "off", None


def below_sandbox_refusal(
    args: argparse.Namespace,
    cwd: Path,
    environ: Mapping[str, str],
    inh: Inherited,
    *,
    definition: AgentDefinition | None,
    warnings: list[str],
) -> str | None:
    """Below a sandboxed agent: why its definition can't run here, or None; and a warning for each setting source left out.

    What the child's CLI runs as the user (a definition's hooks and MCP
    servers, settings' hooks and helpers, skills, plugins) must come from
    where no sandboxed ancestor can write (writable.py).
    """
    writes = sandboxed_ancestors(inh.session, inh.parent_id) if inh.parent_id else []
    if not writes:
        return None
    untrusted = untrusted_sources(str(cwd), environ, writes)
    loads = args.preset or (definition is not None and definition.skills)
    for source in sorted(untrusted) if loads else ():
        warnings.append(f"setting source {source} left out: {untrusted[source]}, and what it runs would run outside that sandbox")
    refusal = cwd_refusal(str(cwd), writes)
    return refusal or (definition_refusal(definition, environ, writes) if definition is not None else None)


def refusal_for(
    depth: int, max_depth: int, deadline: float | None, now: float, *, requested_tools: Sequence[str] | None, tools: Sequence[str]
) -> str | None:
    """Why a resolved spawn may not run, or None."""
    if depth > max_depth:
        return f"depth limit: this agent would be at depth {depth}, the tree's max depth is {max_depth}"
    if deadline is not None and deadline <= now:
        return "deadline: the parent has no time left for a child"
    if requested_tools and not tools:
        return f"tools: none of {','.join(requested_tools)} is held by the parent"
    return None


def min_known(*values: Any) -> Any:
    known = [v for v in values if v is not None]
    return min(known) if known else None


def unique_rules(rules: Iterable[Rule]) -> list[Rule]:
    return list({r.text: r for r in rules}.values())


def routing_decision(
    task: str, definitions: Mapping[str, AgentDefinition], cwd: Path, environ: Mapping[str, str], route_by: str
) -> dict[str, Any]:
    """--agent auto's decision: by words (agents.route), or with --route model by one low-tier model call."""
    if route_by != "model":
        return route(task, definitions)
    model = resolve_model(ROUTE_MODEL_TIER, parse_model_tiers(environ.get(ENV_MODEL_TIERS)), "the router's model")
    return route_by_model(task, definitions, cli=find_cli(environ), model=model, cwd=cwd, environ=environ)


def choose_definition(
    name: str | None, task: str, cwd: Path, environ: Mapping[str, str], route_by: str = "lexical"
) -> tuple[AgentDefinition | None, dict[str, Any] | None, list[str]]:
    """The definition --agent names, or the one routing picks for --agent auto, and
    its YAML's problems (read with the 'key: value' fallback), each as FILE:LINE: text."""
    if name is None:
        return None, None, []
    if not name.strip():
        raise UsageError("--agent is empty; name a definition (see 'spawn.py agents list'), or auto to route by description")
    definitions, problems = load_definitions(cwd, environ)
    routing = None
    if name == "auto":
        routing = routing_decision(task, definitions, cwd, environ, route_by)
        chosen = definitions[routing["chosen"]] if routing["chosen"] else None
    elif name not in definitions:
        # A file of that name that didn't parse: its own error, with its line, says why.
        unreadable = [p for p in problems if p.severity == "error" and Path(p.path).stem == name]
        if unreadable:
            raise UsageError(f"{unreadable[0]}; fix the definition (see 'spawn.py agents lint')")
        raise UnknownAgentDefinitionError(name, [p for p, _ in agent_dirs_for(cwd, environ)], definitions)
    else:
        chosen = definitions[name]
    # A bad limit is left unset by the parser, and an unset limit is no limit:
    # running with it would widen what the definition meant to allow.
    numeric = {key for key, *_ in DEFINITION_NUMBERS}
    bad = [p for p in problems if chosen is not None and p.path == chosen.path and p.message.split(" ", 1)[0] in numeric]
    if bad:
        raise UsageError(f"{bad[0]}; fix the definition (see 'spawn.py agents lint')")
    yaml_problems = [str(p) for p in problems if chosen is not None and p.path == chosen.path and "bad YAML" in p.message]
    return chosen, routing, yaml_problems


def resolve_resume(args: argparse.Namespace, environ: Mapping[str, str]) -> AgentMeta:
    """The agent --resume names, after checking it can be continued; its settings become defaults.

    Tools and model default to the original's and can only narrow; the run
    stays in the original's cwd, where the CLI keeps the conversation.
    """
    caller_session = Path(environ[ENV_SESSION]) if environ.get(ENV_SESSION) else None
    agent_dir = find_agent_dir(args.resume, caller_session, resolve_session_root(args.session, environ))
    original = load_meta(agent_dir)
    outcome = read_outcome(agent_dir)
    if outcome is None:
        raise UsageError(f"agent {original.id} is still running; 'spawn.py wait {original.id}' first, then resume it")
    if not outcome.get("sdk_session_id"):
        raise UsageError(f"agent {original.id} has no SDK session to resume (status {outcome.get('status')}); start a new agent")
    if args.cwd is not None and Path(args.cwd).expanduser().resolve() != Path(original.cwd):
        raise UsageError(f"--resume runs in the original's cwd {original.cwd}; drop --cwd")
    args.cwd = original.cwd
    if args.tools is None:
        args.tools = ",".join(original.tools)  # narrowed to the original's in place_resumed
    args.model = args.model or original.model
    args.agent = args.agent or original.agent
    args.max_depth = min_known(args.max_depth, original.max_depth)
    # Its rules stay: a resumed agent may not do what the original was denied or had to ask.
    args.deny = [*(args.deny or []), *original.permissions.get("deny", [])]
    args.ask = [*(args.ask or []), *original.permissions.get("ask", [])]
    return original


def place_resumed(plan: Plan, original: AgentMeta) -> None:
    """Where a resumed agent is registered: under the calling agent, else a root of the original's session.

    From a shell, the process that resumes it is its runner and nothing else
    supervises it: the original's parent, even when it still runs, did not
    start it, holds no slot or budget for it, and usually ended long ago (it
    would be settled as killed at once). So it is a root of that session,
    with the room below it the original had, drawing on the session's budget
    and its own --timeout.
    """
    meta = plan.meta
    meta.resumed_from = original.id
    dropped = [t for t in meta.tools if t not in original.tools]
    if dropped:
        meta.warnings.append(f"tools the resumed agent didn't have were dropped: {','.join(dropped)}")
        meta.tools = [t for t in meta.tools if t in original.tools]
        if not meta.tools and plan.refusal is None:
            plan.refusal = f"tools: none of {','.join(dropped)} was held by the resumed agent {original.id}"
    if plan.new_session:
        plan.new_session = False
        meta.session, meta.parent_id, meta.depth = original.session, None, 0
        meta.max_depth = min(meta.max_depth, max(original.max_depth - original.depth, 0))


def register(plan: Plan, pid_info: tuple[int, float, int] | None, environ: Mapping[str, str]) -> Path:
    """Create the session (for a root), admit the agent and write its meta.json.

    Admission and the new directory happen under the session lock, so two
    spawns racing for the last agent or the last dollar can't both get it.
    A spawn refused here gets plan.refusal set and its meta written at once.
    """
    meta = plan.meta
    if plan.refusal is None:
        runner_index_dir()  # a broken runner index fails the spawn before anything is written
    if plan.new_session:
        session = create_session_dir(plan.session_root, meta.topic or "agent", dt.datetime.now())
        write_json_atomic(session / LIMITS, record_to_json(plan.limits))
    else:
        session = Path(meta.session)
        if not (session / AGENTS_DIR).is_dir():
            raise StateError(f"session {session} does not exist; unset {ENV_SESSION} or pass --session DIR")
    meta.session = str(session)
    if plan.refusal is not None and not plan.new_session and not os.access(session / AGENTS_DIR, os.W_OK):
        # A sandboxed agent sees agents/ read-only (sandbox_writes); a spawner's spawns go through its runner instead.
        raise RefusedError(f"refused: {plan.refusal}; not recorded: the session directory is read-only here")
    if plan.refusal is None and not plan.new_session:
        plan.refusal = confirm_spawn(meta, session, plan.secrets, environ)
    if plan.refusal is None and not plan.new_session:
        plan.refusal = wait_while_paused(session, meta.deadline, no_wait=plan.no_wait)
    with session_lock(session):
        if plan.refusal is None:
            plan.refusal = admit(meta, session)
        meta.id, agent_dir = create_agent_dir(session, meta.depth)
        if plan.refusal is None:
            reserve_budget(session, meta, plan.secrets)
    meta.containment = choose_containment(meta.parent_id is None, meta.session, meta.id, environ)
    if plan.refusal is not None and pid_info is None:
        pid_info = own_identity()
    if pid_info is not None:
        meta.pid, meta.create_time, meta.pgid = pid_info
        stamp_where(meta)
    if plan.new_session:
        info = SessionInfo(id=session.name, created_at=meta.started_at, topic=meta.topic or "", root_agent=meta.id)
        write_json_atomic(session / SESSION_INFO, redact_values(record_to_json(info), plan.secrets))
    if pid_info is not None:
        if plan.refusal is None:
            # The guard exists before the agent does: a SIGKILL right after
            # meta.json is published still leaves someone to settle it.
            plan.guard = start_guard(agent_dir)
            # Before meta.json: nothing this agent starts can predate its entry.
            register_runner(meta.pid, meta.create_time, agent_dir)
        write_meta(agent_dir, meta, plan.secrets)
    return agent_dir


def write_meta(agent_dir: Path, meta: AgentMeta, secrets_: Sequence[str]) -> None:
    data = redacted_json(record_to_json(meta), secrets_, indent=2)
    if not publish_once(agent_dir / META, data.encode()):
        raise StateError(f"{agent_dir / META} already exists; agent ids must be unique")


def wants_guard_above(argv: Sequence[str], environ: Mapping[str, str]) -> bool:
    """True for a run that will be a tree's root without a cgroup, on Linux.

    Checked first thing, before any thread starts, so it is cheap where it
    says no: a child's environment names its agent, and a cgroup is a quick look.
    """
    if environ.get(ENV_AGENT_ID) or not guard_above_possible():
        return False
    if {"--dry-run", "--background", "-h", "--help", "--version"} & set(argv):
        return False
    if choose_containment(True, "s", "a", environ, guard_above=False) != "subreaper":
        return False
    return inherited_context(environ, ancestry_context()).parent_id is None
