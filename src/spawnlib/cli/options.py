"""The run command's options: the argument parser of `spawn.py [flags] TASK`.

Below dag, whose task graphs' nodes take the same flags, and the CLI.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any, NoReturn

from .. import __version__
from ..core.constants import (
    DEFAULT_MAX_DEPTH,
    DEFAULT_MODEL,
    DEFAULT_ROOT_TIMEOUT_S,
    DEFAULT_TOOLS,
    ENV_MODEL_TIERS,
    ENV_SESSION_ROOT,
    IDLE_TIMEOUT_S,
    PROGRAM_NAME,
    ROUTE_CHOICES,
    SANDBOX_CHOICES,
)
from ..core.errors import UsageError, did_you_mean


class Parser(argparse.ArgumentParser):
    """argparse with spawn's error format and exit code."""

    # One signature for argparse's three overloads: it only notes the words and passes them on.
    def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:  # type: ignore[override]
        self.words = [str(w) for w in (sys.argv[1:] if args is None else args)]  # for error(): what was typed
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        if "required" in message:
            # argparse checks required arguments before it reports unknown ones,
            # so `budget --rasie 1` would say --raise is missing, not misspelt.
            typos = [w for w in getattr(self, "words", []) if w.startswith("--") and w.split("=", 1)[0] not in self.long_flags()]
            if typos and (hint := did_you_mean(typos[0].split("=", 1)[0], self.long_flags())):
                raise UsageError(f"unrecognized arguments: {typos[0]}{hint} see '{self.prog} --help'")
        hint = self.suggestion(message)
        raise UsageError(f"{message}{hint}{' ' if hint else '; '}see '{self.prog} --help'")

    def suggestion(self, message: str) -> str:
        """The close match to a mistyped flag or choice, as did_you_mean words it."""
        if message.startswith("unrecognized arguments: "):
            flags = [a.split("=", 1)[0] for a in message.removeprefix("unrecognized arguments: ").split() if a.startswith("--")]
            return did_you_mean(flags[0], self.long_flags()) if flags else ""
        if m := re.search(r"invalid choice: '(.*?)' \(choose from (.*)\)$", message):
            return did_you_mean(m[1], re.findall(r"'(.*?)'", m[2]))
        return ""

    def long_flags(self) -> list[str]:
        """Every --flag of this parser and of its sub-commands' (argparse reports theirs here)."""
        flags = [f for f in self._option_string_actions if f.startswith("--")]
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                flags += [f for sub in action.choices.values() for f in sub._option_string_actions if f.startswith("--")]
        return flags


EXIT_TABLE = """\
exit codes:
  0    success (every agent waited for is done)
  1    an agent failed (including schema-invalid output)
  2    bad usage or input; nothing was written
  3    session/state error (unwritable root, corrupt record)
  4    refused by a limit (depth, deadline, tools); recorded in the session
  124  timeout; the agent's subtree was ended
  130  interrupted (SIGINT); the subtree was ended
  143  killed (SIGTERM/SIGHUP or 'spawn.py kill'); the subtree was ended"""


def build_run_parser() -> Parser:
    p = Parser(
        prog=PROGRAM_NAME,
        description=(
            "Run a Claude agent that can spawn child agents to any depth. "
            f"Verbs: {', '.join(v for v in VERBS if not v.startswith('_'))} (spawn.py VERB --help)."
        ),
        epilog=EXIT_TABLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"spawn.py {__version__}")
    task = p.add_argument_group("task")
    task.add_argument("--task", metavar="TEXT", help="the prompt")
    task.add_argument("--task-file", metavar="PATH", help="read the prompt from PATH ('-' for stdin)")
    task.add_argument("--topic", metavar="WORDS", help="names the session directory (default: the task's first words)")
    task.add_argument("--resume", metavar="AGENT_ID", help="continue a finished agent's conversation with --task, as a new agent beside it")
    agent = p.add_argument_group("agent")
    agent.add_argument(
        "--tools", metavar="A,B", help=f"tools the agent sees, auto-approved (default {','.join(DEFAULT_TOOLS)}; a child: its parent's)"
    )
    agent.add_argument("--disallowed-tools", metavar="A,B", help="tools removed from the agent, as in Claude Code")
    for kind, what in (
        ("allow", "allow calls matching RULE"),
        ("deny", "deny calls matching RULE"),
        ("ask", "ask before calls matching RULE"),
    ):
        agent.add_argument(f"--{kind}", action="append", metavar="RULE", help=f"{what}, e.g. 'Bash(git diff:*)' (repeatable)")
    agent.add_argument(
        "--model",
        metavar="TIER|ID",
        help=f"high-tier, medium-tier, low-tier or a model id (default {DEFAULT_MODEL}; tiers: ${ENV_MODEL_TIERS})",
    )
    agent.add_argument(
        "--agent", metavar="NAME|auto", help="use .claude/agents/NAME.md (project, then user, then built in); auto routes by description"
    )
    agent.add_argument(
        "--route",
        choices=ROUTE_CHOICES,
        help="how --agent auto picks: by the descriptions' words (lexical, the default), or by one low-tier model call "
        "over the names and descriptions (model; falls back to lexical offline or on error)",
    )
    agent.add_argument(
        "--schema", metavar="NAME|PATH|JSON", help="JSON Schema for the output: schemas/NAME.json (else built in), a file, or inline JSON"
    )
    agent.add_argument("--output", metavar="FILE", help="also write the validated output (or final text) to FILE")
    agent.add_argument("--system-prompt", metavar="TEXT", help="replace the default short system prompt")
    agent.add_argument("--system-prompt-file", metavar="PATH", help="read the system prompt from PATH")
    agent.add_argument("--preset", choices=["claude_code"], help="use Claude Code's full system prompt and settings (costly at depth)")
    agent.add_argument(
        "--sandbox",
        choices=SANDBOX_CHOICES,
        default="auto",
        help="run the agent's Bash in Claude Code's sandbox (auto: for agents below the root that have Bash)",
    )
    agent.add_argument("--cwd", metavar="DIR", help="working directory of the agent")
    agent.add_argument(
        "--placement",
        metavar="local|inprocess|auto|ray:ADDRESS",
        help="where children run: own processes (local), inside the CLI as its subagents (inprocess), spawn.py's choice (auto); "
        "inherited, only narrows (default $SPAWN_PLACEMENT, else local)",
    )
    add_limit_flags(p)
    where = p.add_argument_group("session")
    where.add_argument("--session", metavar="DIR", help=f"session root (default ${ENV_SESSION_ROOT}, else sessions/ beside spawn.py)")
    where.add_argument("--parent-trace", metavar="TRACEPARENT", help="W3C traceparent to join (default $TRACEPARENT)")
    mode = p.add_argument_group("mode")
    mode.add_argument(
        "--background",
        action=argparse.BooleanOptionalAction,
        help="register, start detached, print the id and outcome paths, exit 0 (default: the definition's background)",
    )
    mode.add_argument("--no-settings", action="store_true", help="at the root: ignore the permission rules of Claude Code's settings files")
    mode.add_argument(
        "--print",
        choices=["id", "status", "output", "agent_dir", "outcome"],
        help="print only this field of the result, as plain text (e.g. A=$(spawn.py --background --print id ...))",
    )
    mode.add_argument("--dry-run", action="store_true", help="print the resolved options as JSON; call nothing, write nothing")
    mode.add_argument("--traceback", action="store_true", help="on an error, show the Python traceback (for bug reports)")
    return p


def add_limit_flags(p: Parser) -> None:
    """The limits group: what a child never gets more of than its parent has left."""
    limits = p.add_argument_group("limits (a child never gets more than its parent has left)")
    limits.add_argument(
        "--max-depth", type=int, metavar="N", help=f"deepest depth the tree may reach; root is 0 (default {DEFAULT_MAX_DEPTH})"
    )
    limits.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help=f"deadline for this agent and its subtree (root default {DEFAULT_ROOT_TIMEOUT_S:g}; 0: none)",
    )
    limits.add_argument(
        "--idle-timeout",
        type=float,
        metavar="SECONDS",
        help=f"end the agent as stalled after this long with no transcript event and no CPU use (default {IDLE_TIMEOUT_S:g})",
    )
    limits.add_argument("--max-turns", type=int, metavar="N", help="maximum agent turns")
    limits.add_argument(
        "--max-budget-usd", type=float, metavar="X", help="spending limit in USD; at the root, one budget for the whole tree"
    )
    limits.add_argument(
        "--on-budget",
        choices=["fail", "pause"],
        help="at its hold: fail (default), or pause until 'spawn.py budget SESSION --raise USD' (inherited; only narrows to fail)",
    )
    limits.add_argument("--no-wait", action="store_true", help="in a tree paused at its budget: be refused (exit 4) rather than wait")
    limits.add_argument("--max-agents", type=int, metavar="N", help="root only: agents the whole session may register")
    limits.add_argument("--max-concurrent", type=int, metavar="N", help="root only: agents running at once; more wait for a slot")
    limits.add_argument(
        "--confirm-over",
        type=float,
        metavar="USD",
        help="root only: a spawn that would take the tree's projected spend past USD asks first (spawn.py approve|deny)",
    )


WORKFLOW_VERBS = ("plan", "build", "explore", "run-plan-build", "run-all", "state")


VERBS = (
    *("wait", "status", "kill", "reap", "approve", "deny", "send", "budget", "agents", "dag", "estimate"),
    *WORKFLOW_VERBS,
    *("_run", "_guard", "_gateway"),
)
