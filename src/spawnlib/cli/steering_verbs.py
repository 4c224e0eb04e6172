"""The steering verbs: send (a message to a running agent) and budget (raise or set a tree's budget)."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Mapping
from pathlib import Path

from ..core.errors import ExitCode, RefusedError, UsageError
from ..core.output import emit
from ..core.pure import secret_values
from ..policy.steering import change_budget, check_name, send_message
from ..session.ledger import record_budget_refusal, tree_caller_refusal
from ..session.protocol import AGENTS_DIR, find_agent_dir, resolve_session_root
from ..supervise.supervisor import calling_agents
from .commands import default_session
from .options import Parser

# ----------------------------------------------------------- steering verbs --
# `spawn.py send ID TEXT` and `spawn.py budget SESSION (--raise|--set) USD`:
# each prints one JSON object on stdout, as every verb does; tools/mcp_server.py
# and the Python API run them as they are.

STEERING_VERBS = ("send", "budget")


def add_steering_arguments(verb: str, p: Parser) -> None:
    """The arguments of send and budget on their verb parser (build_verb_parser)."""
    if verb == "send":
        p.description = (
            "Give a running agent a user message: it reads it at its next model request (or a turn reopened for it). "
            "An a2a node sends it on as the next message of its remote task. "
            "Not from the agent itself or its subtree (exit 4); a finished agent: exit 1; a command node or an in-process child: exit 2."
        )
        p.add_argument("id", metavar="ID")
        p.add_argument("text", metavar="TEXT", help="the message; '-' reads it from stdin")
        p.add_argument(
            "--as", dest="as_name", metavar="NAME", help="who sends it, recorded beside the sender's process (e.g. ci, mcp:CLIENT)"
        )
    elif verb == "budget":
        p.description = (
            "Change a tree's budget (its ledger, under the session lock); agents paused at their hold go on once it fits. "
            "Not from inside the tree (exit 4)."
        )
        p.add_argument("target", metavar="SESSION", help="the session directory, or its name under the session root")
        how = p.add_mutually_exclusive_group(required=True)
        how.add_argument("--raise", dest="raise_usd", type=float, metavar="USD", help="add USD to the tree's budget")
        how.add_argument("--set", dest="set_usd", type=float, metavar="USD", help="make the tree's budget USD")
        p.add_argument("--as", dest="as_name", metavar="NAME", help="who changes it, recorded in the ledger (default budget)")
        p.add_argument(
            "--at-most",
            dest="at_most_usd",
            type=float,
            metavar="USD",
            help="refuse a new budget past USD (a server's own --max-budget-usd)",
        )


def cmd_send(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    text = sys.stdin.read() if args.text == "-" else args.text
    if not text.strip():
        raise UsageError("the message is empty; give TEXT (or '-' to read it from stdin)")
    by = check_name(args.as_name, "send") if args.as_name is not None else None
    session = default_session(args, environ)
    agent_dir = find_agent_dir(args.id, session, resolve_session_root(None, environ))
    emit({"sent": True, **send_message(agent_dir, text, by)})
    return ExitCode.OK


def budget_session(target: str, environ: Mapping[str, str]) -> Path:
    """A session from a path or a name under the session root."""
    for candidate in (Path(target).expanduser(), resolve_session_root(None, environ) / target):
        if (candidate / AGENTS_DIR).is_dir():
            return candidate.resolve()
    raise UsageError(f"no session {target!r}; give a session directory or its name (see 'spawn.py status')")


def cmd_budget(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    for flag, value in (("--raise", args.raise_usd), ("--set", args.set_usd)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise UsageError(f"{flag} {value:g}: give a non-negative number of USD")
    session = budget_session(args.target, environ)
    by = check_name(args.as_name, "budget")
    secrets_ = secret_values(environ)
    # The caller's own ancestry, as the kernel has it: an agent of the tree
    # (its Bash, anything it started) may not pay itself more.
    refusal = tree_caller_refusal(session, calling_agents())
    if refusal is not None:
        record_budget_refusal(session, by, refusal, secrets_)
        raise RefusedError(f"refused: {refusal}; the attempt is recorded in {session / 'budget.attempts.jsonl'}")
    emit(change_budget(session, args.raise_usd, args.set_usd, by, secrets_, at_most=args.at_most_usd))
    return ExitCode.OK
