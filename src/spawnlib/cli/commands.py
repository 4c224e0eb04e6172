"""The verbs' parsers and their cmd_* handlers: run, wait, status, kill, reap, answer, agents."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core.constants import (
    ENV_SESSION,
    KILL_GRACE_S,
    LIVENESS_POLL_S,
    META,
    PROGRAM_NAME,
    REGISTER_WAIT_S,
    ROUTE_CHOICES,
)
from ..core.errors import ExitCode, RefusedError, StateError, UsageError
from ..core.output import emit, note, stdout_json_text
from ..core.pure import agent_facts, briefing, prompt_layout, secret_values
from ..core.records import Status, record_to_json
from ..core.settings import settings_of, wait_polls
from ..policy.agents import (
    AGENT_TEMPLATE,
    Problem,
    agent_dirs_for,
    describe_routing,
    describe_rules,
    known_tools,
    load_definitions,
    parse_definition,
)
from ..policy.channel import ask_socket_path, send_answer
from ..run.claude import delegates_for
from ..run.executors import names_another_kind
from ..run.forkserver import Entry
from ..run.resolving import (
    admission_problem,
    find_cli,
    inherited_context,
    place_resumed,
    plan_run,
    register,
    resolve_resume,
    routing_decision,
    wants_guard_above,
)
from ..run.runner import drop_refusal, export_trace, launch_background, record_refusal, refusal_outcome, run_agent, summary
from ..run.running import EarlyStop, SdkLoader, spawn_command
from ..session.protocol import (
    AGENTS_DIR,
    asks_dir,
    find_agent_dir,
    latest_session,
    load_meta,
    pending_asks,
    read_json,
    resolve_session_root,
    write_new_file,
)
from ..supervise.cluster import ray_address, ray_standin
from ..supervise.commit import commit_outcome
from ..supervise.supervisor import (
    GUARD_SETTLED,
    ForkedFor,
    Supervised,
    ancestor_agents,
    ancestry_context,
    choose_containment,
    fork_below_guard,
    guard_above_possible,
    own_identity,
    register_runner,
    start_guard,
    unregister_runner,
)
from .dag import DEFAULT_ROTATE_MB, DEFAULT_STATE_FILE, ON_FAIL
from .options import EXIT_TABLE, WORKFLOW_VERBS, Parser, build_run_parser
from .verbs import (
    add_model_calls,
    corrupt_agents,
    end_tree,
    format_tree,
    guard_above_ends_tree,
    kill_agent,
    kill_caller,
    reap_agent,
    reap_session,
    session_summary,
    slot_lent_by_caller,
    tree_rows,
    tree_tokens,
    wait_for_outcomes,
    watch_status,
)

# ---------------------------------------------------------------------- CLI --


def build_verb_parser(verb: str) -> Parser:
    p = Parser(prog=f"{PROGRAM_NAME} {verb}", epilog=EXIT_TABLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--session", metavar="DIR", help="session directory (default $SPAWN_SESSION, else the latest under the session root)")
    p.add_argument("--traceback", action="store_true", help="on an error, show the Python traceback (for bug reports)")
    if verb == "wait":
        p.description = "Block until the agents have outcomes. Exit 0 if all are done, 1 if one failed, 124 on --timeout."
        p.add_argument("ids", nargs="+", metavar="ID")
        how = p.add_mutually_exclusive_group()
        how.add_argument("--all", dest="mode", action="store_const", const="all", default="all", help="wait for every agent (default)")
        how.add_argument("--any", dest="mode", action="store_const", const="any", help="return when one agent has an outcome")
        p.add_argument("--timeout", type=float, metavar="S", help="give up after S seconds (exit 124)")
    elif verb == "status":
        p.description = "Show the agent tree: depth, state, duration, own cost and subtree cost."
        p.add_argument("target", nargs="?", metavar="SESSION|ID")
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.add_argument(
            "--watch", action="store_true", help="redraw until every agent has an outcome (one line per change when stdout is no terminal)"
        )
    elif verb == "kill":
        p.description = "End an agent and all its descendants (deepest first); record `killed`."
        p.add_argument("ids", nargs="+", metavar="ID")
    elif verb == "reap":
        p.description = "Record a failed outcome for every agent whose process died without one, and end its leftovers."
        p.add_argument("target", nargs="?", metavar="SESSION")
    elif verb in ("approve", "deny"):
        p.description = f"{verb.capitalize()} a tool call an agent asked about (see 'spawn.py status' for pending asks)."
        p.add_argument("ask_id", metavar="ASK_ID")
        p.add_argument(
            "--as",
            dest="as_name",
            metavar="NAME",
            help=f"who answers, recorded as the answer's 'by' (default {verb}), e.g. ci or mcp:CLIENT",
        )
        if verb == "approve":
            p.add_argument("--text", metavar="TEXT", help="the reply to an a2a node's input-required ask, sent to the remote agent")
    elif verb == "agents":
        add_agents_actions(p)
    elif verb == "dag":
        add_dag_actions(p)
    elif verb == "estimate":
        p.description = (
            "Projected cost and critical-path time of a task graph, running nothing. Per task: the median of ended agents "
            "of its model in --session, else a default per tier."
        )
        p.add_argument("file", metavar="DAGFILE")
        p.add_argument("--var", action="append", metavar="KEY=VALUE", help="set {{var.KEY}} (repeatable)")
        p.add_argument("--text", action="store_true", help="one line of text instead of JSON")
    elif verb in WORKFLOW_VERBS:
        add_workflow_options(p, verb)
    elif verb == "_gateway":
        p.add_argument("session")
    elif verb in ("_run", "_guard"):
        p.add_argument("agent_dir")
        if verb == "_guard":  # the runner's exit status, for the guard above a root (GUARD_ABOVE_BOOTSTRAP)
            p.add_argument("--above", type=int, help=argparse.SUPPRESS)
    return p


def add_agents_actions(p: Parser) -> None:
    """`agents list|lint|new|route`."""
    p.description = (
        "Agent definitions: .claude/agents/*.md (project, found upwards from the working directory), ~/.claude/agents,"
        " then the built-in defaults, which a file of the same name overrides."
    )
    # No action is `list`: what a newcomer typing `agents` wants to see.
    sub = p.add_subparsers(dest="action", required=False, parser_class=Parser)
    listing = sub.add_parser("list", help="name, source, tools and description of every definition (the default)")
    listing.add_argument("--json", action="store_true")
    lint = sub.add_parser("lint", help="check definitions: fields, tools, schemas, duplicates, YAML (exit 2 on errors)")
    lint.add_argument("paths", nargs="*", metavar="PATH")
    new = sub.add_parser("new", help="write a commented template to .claude/agents/NAME.md")
    new.add_argument("name", metavar="NAME")
    routing = sub.add_parser("route", help="which definition --agent auto would pick for TASK, and why; runs nothing")
    routing.add_argument("task", metavar="TASK")
    routing.add_argument("--json", action="store_true", help="the decision as JSON on stdout")
    routing.add_argument(
        "--route", choices=ROUTE_CHOICES, default="lexical", help="by words (lexical) or by one low-tier model call (model)"
    )


def add_dag_actions(p: Parser) -> None:
    """`dag run|validate|show|resume FILE` and their options."""
    p.description = "Run a task graph (YAML or JSON): each task starts when its blockedBy are done, as a child of the runner."
    sub = p.add_subparsers(dest="action", required=True, parser_class=Parser)
    for action, what in (
        ("run", "run the graph; stdout is one JSON object with every task's status and output"),
        ("validate", "check the file (cycles, unknown ids and options, undefined vars) without running"),
        ("show", "print the graph's levels"),
        ("resume", "run again what has no .done in a session's DAG journal (FILE is the session directory)"),
    ):
        a = sub.add_parser(action, help=what, description=what, epilog=EXIT_TABLE, formatter_class=argparse.RawDescriptionHelpFormatter)
        a.add_argument("file", metavar="SESSION" if action == "resume" else "FILE")
        a.add_argument("--var", action="append", metavar="KEY=VALUE", help="set {{var.KEY}} (repeatable)")
        a.add_argument("--session", metavar="DIR", help="session root for the runner")
        a.add_argument("--max-concurrent", type=int, metavar="N", help="tasks running at once (default: no limit)")
        a.add_argument("--timeout", type=float, metavar="S", help="deadline for the whole graph")
        a.add_argument("--max-budget-usd", type=float, metavar="X", help="budget for the whole graph")
        a.add_argument(
            "--fail-fast", action="store_true", help="stop everything at the first failure (= --on-fail abort): running tasks are ended"
        )
        a.add_argument(
            "--on-fail",
            choices=ON_FAIL,
            help="a task failed (after its retries): ask at the terminal (retry, skip or abort), skip it and start its dependents "
            "anyway, or abort the run (default: its dependents are skipped, the rest goes on)",
        )
        a.add_argument("--retries", type=int, metavar="N", help="start a failed task again up to N times (for tasks without retries:)")
        a.add_argument("--dry-run", action="store_true", help="print the resolved tasks; start nothing")
        a.add_argument("--traceback", action="store_true", help=argparse.SUPPRESS)


def add_workflow_options(p: Parser, verb: str) -> None:
    """A workflow verb's task, state file and failure options."""
    p.description = {
        "plan": "Plan a change with the plan agent; the plan goes to the state file.",
        "build": "Carry out the state file's plan with the build agent; it asks before creating/deleting files or changing manifests.",
        "explore": "Explore the codebase with the read-only explore agent; findings go to the state file.",
        "run-plan-build": "plan, then build (workflows/plan-build.yaml); build does not start when plan failed.",
        "run-all": "plan, build, explore (workflows/plan-build-explore.yaml); stops at the first failure. At a terminal it asks "
        "before each phase after plan, and whether to retry, skip or abort a failed one.",
        "state": "Show or clear the state file.",
    }[verb]
    if verb == "state":
        p.add_argument("action", choices=["show", "clear"])
    else:
        p.add_argument("task", nargs="?" if verb in ("explore", "build") else None, metavar="TASK")
    p.add_argument("--state-file", default=DEFAULT_STATE_FILE, metavar="PATH", help=f"shared state (default {DEFAULT_STATE_FILE})")
    p.add_argument("--rotate-mb", type=float, default=DEFAULT_ROTATE_MB, metavar="MB", help="rotate the state file to .1, .2... past MB")
    p.add_argument("--verbose", action="store_true", help="report phase transitions on stderr")
    if verb != "state":
        p.add_argument(
            "--on-fail",
            choices=ON_FAIL,
            help="a phase failed (after --retries): ask (the default at a terminal: retry, skip or abort), skip it "
            "and go on, or abort (the default otherwise)",
        )
        p.add_argument("--retries", type=int, metavar="N", help="start a failed phase again up to N times first")
    if verb == "plan":
        p.add_argument("--prd", action="store_true", help="also write a short PRD")
    if verb == "build":
        p.add_argument("--dry-run", action="store_true", help="preview the plan's steps and files; write nothing")
    if verb == "explore":
        p.add_argument("--depth", choices=["shallow", "deep"], default="deep")


def default_session(args: argparse.Namespace, environ: Mapping[str, str]) -> Path | None:
    if getattr(args, "session", None):
        return Path(args.session).expanduser().resolve()
    if environ.get(ENV_SESSION):
        return Path(environ[ENV_SESSION])
    return latest_session(resolve_session_root(None, environ))


def emit_result(args: argparse.Namespace, data: Mapping[str, Any]) -> None:
    """A run's result: the JSON object, or with --print FIELD that one field as plain text."""
    if args.print is None:
        emit(data)
        return
    value = data.get(args.print)
    text = value if isinstance(value, str) else stdout_json_text(value)
    sys.stdout.write(f"{text}\n")
    sys.stdout.flush()


def cmd_run(argv: Sequence[str], environ: Mapping[str, str], entry: Entry) -> int:
    if wants_guard_above(argv, environ):
        fork_below_guard()  # before any thread: from here on this process is the runner
    # The SDK is imported once the agent's CLI has started (SdkLoader).
    # (A background launch and a dry run never need it.)
    # (Nor does a node of another kind that --agent names directly.)
    sdk_loader = SdkLoader(environ) if not {"--dry-run", "--background"} & set(argv) and not names_another_kind(argv) else None
    args = build_run_parser().parse_args(argv)
    original = resolve_resume(args, environ) if args.resume else None
    plan = plan_run(args, environ, ancestry_context())
    if original is not None:
        place_resumed(plan, original)
    if plan.meta.routing is not None:
        note(describe_routing(plan.meta.routing))
    if args.dry_run:
        # The session and id are not known before registration.
        guarded = not plan.meta.background and guard_above_possible()
        plan.meta.containment = choose_containment(plan.meta.parent_id is None, "SESSION", "ID", environ, guarded)
        resolved = record_to_json(plan.meta)
        resolved.update(refusal=plan.refusal, cli=str(plan.cli), session_root=str(plan.session_root))
        resolved["rules"] = describe_rules(plan.rules, plan.meta.tools, plan.meta.disallowed_tools)
        resolved["briefing"] = briefing(plan.meta, spawn_command(), delegates_for(plan.meta, environ))
        resolved["agent_facts"] = agent_facts(plan.meta)
        resolved["prompt_layout"] = prompt_layout(plan.meta)
        emit_result(args, resolved)
        if plan.refusal is not None:
            raise RefusedError(f"refused: {plan.refusal} (dry run; nothing recorded)")
        return ExitCode.OK
    for warning in plan.meta.warnings:
        note(f"warning: {warning}")
    # Placed on Ray, the agent runs on a node: this process launches it and waits, as for --background + wait.
    waits_on_ray = not plan.meta.background and ray_address(plan.meta, environ) is not None
    plan.meta.background = plan.meta.background or waits_on_ray
    if not plan.meta.background or waits_on_ray:
        EarlyStop.arm()  # from the moment it is registered, a stop signal ends in an outcome
    if plan.refusal is not None and not plan.new_session and (dropped := drop_refusal(plan)) is not None:
        agent_dir, outcome, leaf = dropped
        emit_result(args, summary(agent_dir, record_to_json(outcome)))
        raise RefusedError(f"refused: {plan.refusal}; {leaf}'s runner records it in {agent_dir}")
    agent_dir = register(plan, None if plan.meta.background else own_identity(), environ)
    if plan.refusal is not None:
        outcome = record_refusal(agent_dir, plan)
        emit_result(args, summary(agent_dir, record_to_json(outcome)))
        raise RefusedError(f"refused: {plan.refusal}; recorded in {agent_dir}")
    if plan.meta.background:
        launched = launch_background(agent_dir, plan, environ)
        if not waits_on_ray:
            emit_result(args, launched)
            return ExitCode.OK
        outcome_data = wait_for_placed(agent_dir, launched["pid"], plan.secrets, wait_polls(environ))
        emit_result(args, summary(agent_dir, outcome_data))
        return int(outcome_data.get("exit_code", ExitCode.AGENT_FAILED))
    note(f"agent {plan.meta.id} started in {agent_dir}")
    if not plan.new_session:
        # Agents that died unseen are settled by the next spawn in their session.
        reap_session(Path(plan.meta.session), "spawn", plan.secrets)
    try:
        # A foreground child blocks its parent's Bash: the parent's slot is lent to it.
        with slot_lent_by_caller(environ):
            outcome = run_agent(agent_dir, plan.cli, plan.secrets, sdk_loader, plan.guard, entry=entry, settings=settings_of(environ))
    finally:
        unregister_runner(plan.meta.pid, plan.meta.create_time)
    note(f"agent {outcome.id} {outcome.status}: {outcome.reason}")
    emit_result(args, summary(agent_dir, record_to_json(outcome)))
    export_trace(plan.meta, environ)
    return outcome.exit_code


def wait_for_placed(agent_dir: Path, standin: int, secrets_: Sequence[str], polls: bool) -> dict[str, Any]:
    """A foreground agent placed on Ray: its outcome, waited for here; a stop signal (Ctrl-C) goes to its token.

    The token lives in a session of its own, so a terminal's Ctrl-C reaches
    only this process: passed on, SIGINT ends the agent `interrupted` on its
    node, SIGTERM or SIGHUP `killed`, as they would a local foreground agent.
    """
    passed: int | None = None
    # A stale heartbeat returns early; a placed agent's own deadline (or its node's loss) still ends it.
    while (outcome := wait_for_outcomes([agent_dir], "all", LIVENESS_POLL_S, secrets_, polls=polls).outcomes.get(agent_dir)) is None:
        if EarlyStop.pending is not None and EarlyStop.pending != passed:
            passed = EarlyStop.pending
            Supervised.signal_pid(standin, signal.SIGINT if passed == signal.SIGINT else signal.SIGTERM)
    return outcome


def cmd_background_runner(args: argparse.Namespace, environ: Mapping[str, str], entry: Entry) -> int:
    agent_dir = Path(args.agent_dir)
    EarlyStop.arm()
    guard = start_guard(agent_dir)  # first: a runner killed while starting is still settled
    sdk_loader = SdkLoader(environ)
    limit = time.monotonic() + REGISTER_WAIT_S
    while not (agent_dir / META).exists():  # the launcher writes it right after starting us
        if time.monotonic() > limit:
            raise StateError(f"{agent_dir} was never registered; nothing to run")
        time.sleep(0.01)
    meta = load_meta(agent_dir)
    standin = ray_standin(meta, environ)  # placed on Ray: meta.json names the token on the launcher's host
    if (named := meta.pid) not in (os.getpid(), ForkedFor.pid, standin):
        # meta.json names another runner: the one its launcher started. A
        # second runner (a launcher that took a fork server's late answer for
        # none) runs nothing; its guard has nothing to settle.
        with contextlib.suppress(OSError):
            os.write(guard[1], GUARD_SETTLED)
        raise StateError(f"{agent_dir} is run by process {named} (its meta.json); this runner, {os.getpid()}, ran nothing")
    # `_run DIR` is a verb anyone's Bash can call, on a meta.json anyone can
    # write: the record runs only within what this process's verified parent
    # allows (the admission path), and what runs is the record as checked here.
    ancestry = ForkedFor.ancestry if ForkedFor.ancestry is not None else ancestry_context()
    problem = admission_problem(meta, inherited_context(environ, ancestry, background_runner=True))
    if problem is not None:
        commit_outcome(agent_dir, refusal_outcome(meta, f"not admitted: {problem}"), secret_values(environ))
        raise RefusedError(f"{agent_dir} was not admitted: {problem}; start agents with spawn.py --task, never _run")
    pid, create_time, _ = own_identity()
    if ForkedFor.pid is not None or standin is not None:
        register_runner(pid, create_time, agent_dir)  # the launcher registered the stand-in; the agent runs here
    try:
        outcome = run_agent(
            agent_dir,
            find_cli(environ),
            secret_values(environ),
            sdk_loader,
            guard,
            admitted=meta,
            entry=entry,
            settings=settings_of(environ),
        )
    finally:
        unregister_runner(pid, create_time)
    emit(summary(agent_dir, record_to_json(outcome)))
    export_trace(load_meta(agent_dir), environ)
    return outcome.exit_code


def cmd_guard(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """Wait for the agent's spawn.py to exit; settle the agent if it left no outcome."""
    if args.above is not None:  # exec'd by the guard above a root whose runner is gone
        return guard_above_ends_tree(Path(args.agent_dir) if args.agent_dir else None, args.above, secret_values(environ))
    agent_dir = Path(args.agent_dir)
    with contextlib.suppress(OSError):
        sys.stdin.buffer.read()  # at EOF already when started by GUARD_BOOTSTRAP
    limit = time.monotonic() + 2.0
    while not (agent_dir / META).exists():  # a background launcher may still be writing it
        if time.monotonic() > limit:
            return ExitCode.OK  # never registered: not an agent, nothing to settle
        time.sleep(0.02)
    meta = load_meta(agent_dir)
    limit = time.monotonic() + KILL_GRACE_S
    while Supervised.of(meta).alive() and time.monotonic() < limit:
        time.sleep(0.01)  # the pipe closes a moment before the process is gone
    if meta.containment == "guard" and agent_dir in ancestor_agents():
        return ExitCode.OK  # the guard above the runner lives: it ends the tree, then settles it
    try:
        reap_agent(agent_dir, "guard", secret_values(environ))
    finally:
        end_tree(meta, "guard", secret_values(environ))  # what escaped the process tree, the group and the environment
    return ExitCode.OK


def cmd_wait(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    session = default_session(args, environ)
    root = resolve_session_root(None, environ)
    dirs = [find_agent_dir(i, session, root) for i in args.ids]
    with slot_lent_by_caller(environ):
        waited = wait_for_outcomes(dirs, args.mode, args.timeout, secret_values(environ), polls=wait_polls(environ))
    agents = [summary(d, waited.outcomes[d]) for d in dirs if d in waited.outcomes]
    stale = [d.name for d in waited.stale]
    pending = [d.name for d in dirs if d not in waited.outcomes and d not in waited.stale]
    failed = [a["id"] for a in agents if a["status"] != Status.DONE]
    status = "timeout" if not waited.finished else ("failed" if failed or stale else "done")
    emit({"status": status, "agents": agents, "stale": stale, "pending": pending})
    if stale:
        note(f"stale (alive, heartbeat stopped): {', '.join(stale)}; end them with 'spawn.py kill ID'")
    if not waited.finished:
        note(f"wait timed out; still running: {', '.join(pending)}")
        return ExitCode.TIMEOUT
    return ExitCode.AGENT_FAILED if failed or stale else ExitCode.OK


def cmd_status(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    root = resolve_session_root(None, environ)
    session: Path | None
    if args.target and (Path(args.target) / AGENTS_DIR).is_dir():
        session = Path(args.target).resolve()
    elif args.target and ("/" in args.target or args.target.startswith((".", "~"))):
        # An id has no slash: this was meant as a session directory.
        what = "is not a session directory (it has no agents/)" if Path(args.target).exists() else "does not exist"
        raise UsageError(f"{args.target} {what}; pass a session directory (under {root}) or an agent id, or nothing for the latest")
    elif args.target:
        session = Path(load_meta(find_agent_dir(args.target, default_session(args, environ), root)).session)
    else:
        session = default_session(args, environ)
    if session is None or not (session / AGENTS_DIR).is_dir():
        raise UsageError(f"no session found under {root}; pass a session directory or --session DIR")
    if args.watch:
        if args.json:
            raise UsageError("--watch draws for people; drop --json, or poll 'spawn.py status --json' yourself")
        return watch_status(session, sys.stdout)
    rows = tree_rows(session)
    asks = pending_asks(session)
    if args.json:
        add_model_calls(session, rows)  # after tree_rows: the status cache holds no calls
        emit({"session": str(session), **session_summary(session), "tokens": tree_tokens(rows), "agents": rows, "pending_asks": asks})
    else:
        print(format_tree(session, rows, session_summary(session)))
        for ask in asks:
            what = f"{ask['tool']}: {ask['input']} (rule {ask['rule']})"
            print(f"ask {ask['id']}: agent {ask['agent_id']} wants {what}; spawn.py approve|deny {ask['id']}")
    return ExitCode.OK


def answerer_name(as_name: str | None, verb: str) -> str:
    """The answer's `by`: --as NAME, else the verb; names spawn.py uses itself are reserved."""
    if as_name is None:
        return verb
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.:@\-]{0,63}", as_name) or as_name in ("timeout", "terminal", "rules"):
        raise UsageError(f"--as {as_name!r} is not a usable name; use letters, digits and _.:@- (not timeout, terminal or rules)")
    return as_name


def cmd_answer(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """approve / deny ASK_ID: the first answer wins."""
    root = resolve_session_root(None, environ)
    session = default_session(args, environ)
    candidates = [session] if session is not None and (asks_dir(session) / f"{args.ask_id}.json").exists() else []
    if not candidates and root.is_dir():
        candidates = [p.parent.parent for p in root.glob(f"*/asks/{args.ask_id}.json")]
    if not candidates:
        raise UsageError(f"no pending ask {args.ask_id!r}; run 'spawn.py status' to list asks, or pass --session DIR")
    session = candidates[0]
    verdict = "approve" if args.verb == "approve" else "deny"
    by = answerer_name(args.as_name, args.verb)
    answer_path = asks_dir(session) / f"{args.ask_id}.answer.json"
    if answer_path.exists() and not ask_socket_path(session, args.ask_id).exists():
        earlier = read_json(answer_path)
        raise UsageError(f"ask {args.ask_id} was already answered: {earlier.get('verdict')} (by {earlier.get('by')})")
    # The asking runner decides whether this caller may answer, from its
    # ancestry as the kernel names it; it writes the answer record itself.
    send_answer(session, args.ask_id, verdict, by, getattr(args, "text", None))
    emit({"ask": args.ask_id, "verdict": verdict})
    return ExitCode.OK


def cmd_agents(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    cwd = Path.cwd()
    if args.action == "new":
        if not re.fullmatch(r"[a-z0-9][a-z0-9\-]*", args.name):
            raise UsageError(f"agent name {args.name!r} must be lowercase letters, digits and dashes")
        folder = next((p for p, source in agent_dirs_for(cwd, environ) if source == "project"), cwd / ".claude" / "agents")
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{args.name}.md"
        try:
            write_new_file(path, AGENT_TEMPLATE.format(name=args.name).encode())
        except FileExistsError:
            raise UsageError(f"{path} already exists; edit it or choose another name") from None
        emit({"created": str(path)})
        return ExitCode.OK
    if args.action == "route":
        definitions, _ = load_definitions(cwd, environ)
        decision = routing_decision(args.task, definitions, cwd, environ, args.route)
        if args.json:
            emit(decision)
        else:
            print(decision["chosen"] or "(default agent)")
            note(describe_routing(decision))
        return ExitCode.OK
    if args.action == "lint":
        problems: list[Problem] = []
        if args.paths:
            seen: dict[str, str] = {}
            for name in args.paths:
                path = Path(name)
                try:
                    d, found = parse_definition(path.read_text(), str(path), "project", known_tools(environ))
                except (OSError, UnicodeDecodeError) as exc:
                    raise UsageError(f"can't read {path}: {exc}") from None
                problems += found
                if d is not None and d.name in seen:
                    problems.append(Problem(str(path), 1, f"duplicate agent name {d.name!r} (also {seen[d.name]})"))
                elif d is not None:
                    seen[d.name] = str(path)
        else:
            _, problems = load_definitions(cwd, environ)
        for problem in problems:
            print(problem)
        errors = [p for p in problems if p.severity == "error"]
        if errors:
            raise UsageError(f"{len(errors)} error(s) in agent definitions; fix them (warnings don't stop a run)")
        print("spawn: agent definitions are valid", file=sys.stderr)
        return ExitCode.OK
    definitions, _ = load_definitions(cwd, environ)
    rows = [
        {"name": d.name, "source": d.source, "path": d.path, "tools": d.tools, "description": d.description}
        for d in sorted(definitions.values(), key=lambda d: d.name)
    ]
    if getattr(args, "json", False):
        emit({"agents": rows})
    else:
        for row in rows:
            tools = ",".join(row["tools"]) if row["tools"] is not None else "(inherits)"
            print(f"{row['name']:<22} {row['source']:<8} {tools:<40} {row['description']}")
    return ExitCode.OK


def cmd_kill(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    session = default_session(args, environ)
    root = resolve_session_root(None, environ)
    dirs = [find_agent_dir(i, session, root) for i in args.ids]
    caller = kill_caller(environ)
    killed = [k for d in dirs for k in kill_agent(d, secret_values(environ), caller)]
    emit({"killed": killed})
    return ExitCode.OK


def cmd_reap(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    session = Path(args.target).resolve() if args.target else default_session(args, environ)
    if session is None or not (session / AGENTS_DIR).is_dir():
        raise UsageError("no session to reap; pass a session directory")
    reaped = reap_session(session, "reap", secret_values(environ))
    corrupt = corrupt_agents(session)
    for bad in corrupt:
        note(f"warning: agent {bad['id']} skipped: {bad['error']}")
    emit({"session": str(session), "reaped": reaped, "corrupt": corrupt})
    return ExitCode.OK
