"""The Python API (`import spawn`): run, start, wait, status, kill, send, budget and their async twins.

Bundled after main's `__main__` block, so a CLI run never executes these
definitions (docs/python-api.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypedDict, Unpack

from ..core.constants import SCRIPT_PATH
from ..core.errors import ExitCode, RefusedError, SpawnError, StateError, UsageError, did_you_mean
from ..core.records import Outcome, Status, record_from_json
from ..session.protocol import AGENTS_DIR
from ..supervise.supervisor import Supervised
from .options import build_run_parser

# --------------------------------------------------------------- python API --
# `import spawn` in a script or a notebook: spawn.run(task, tools=[...]) and
# friends. Every call runs this very file as the CLI, one process per agent
# (`sys.executable spawn.py ...`), so an agent started from Python gets every
# guarantee it gets from Bash: limits, containment, one outcome.
#
# This section comes after main's __main__ block (tools/bundle.py), so a CLI
# run, which every agent at every depth is, never executes it. That is also
# why its records (Result, Agent, Waited, AgentRow, mirroring schemas/) live
# here and not in the records section: a dataclass costs milliseconds to define.
# Flag values go as --flag=VALUE: a task or a topic may begin with a dash.


class RunOptions(TypedDict, total=False):
    """The run flags as keyword arguments: `--max-budget-usd 1` is `max_budget_usd=1.0`.

    Each key is the argparse dest of a flag of build_run_parser
    (test_api checks both ways); API_LEFT_OUT names the flags left out, and why.
    """

    topic: str
    resume: str
    tools: list[str]
    disallowed_tools: list[str]
    allow: list[str]
    deny: list[str]
    ask: list[str]
    model: str
    agent: str
    schema: str | Mapping[str, Any]
    """A schema name, a path, inline JSON text, or the schema itself as a dict."""
    output: str | os.PathLike[str]
    system_prompt: str
    system_prompt_file: str | os.PathLike[str]
    preset: Literal["claude_code"]
    sandbox: Literal["auto", "on", "off"]
    cwd: str | os.PathLike[str]
    max_depth: int
    timeout: float
    idle_timeout: float
    max_turns: int
    max_budget_usd: float
    on_budget: Literal["fail", "pause"]
    placement: str
    """local, inprocess, auto or ray:ADDRESS (docs/inprocess.md)."""
    no_wait: bool
    max_agents: int
    max_concurrent: int
    confirm_over: float
    session: str | os.PathLike[str]
    """The session root, as --session; the session directory is the agent's parent's parent."""
    parent_trace: str
    no_settings: bool


# Run flags with no keyword, and why (test_api checks every flag is in one place or the other).
API_LEFT_OUT = {
    "help": "Python has help(spawn.run)",
    "route": "how --agent auto picks a definition; from Python, pick the agent by name, or run `spawn.py agents route`",
    "version": "spawn.__version__",
    "task": "run's and start's first argument",
    "task_file": "read the file and pass its text as the task",
    "background": "start() is the background run, run() the foreground one",
    "print": "the API returns the whole result as a record",
    "dry_run": "its resolved options are no Result; use the CLI's --dry-run",
    "traceback": "errors are exceptions already; the CLI's --traceback shows spawn.py's own",
}
# What a keyword takes at run time, beyond what its flag's argparse type takes.
COMMA_LIST = "A,B"  # the metavar of the flags that take a comma-separated list (--tools)
ENV_KEYWORD = "env"  # every call: the environment of the spawn.py it runs (default os.environ)


@dataclass
class Result:
    """What a foreground run prints: schemas/result.json. Returned by run() and in wait()'s agents."""

    id: str
    status: Status
    """An outcome status: done, failed, refused, timeout, killed or interrupted."""
    exit_code: int
    reason: str
    output: Any
    """The validated structured output, or the final text; cut past 16 KiB (output_truncated)."""
    duration_s: float
    agent_dir: str
    outcome: str
    """Path of outcome.json: read_outcome() loads it, with the output uncut."""
    transcript: str
    output_truncated: bool = False
    validation_errors: list[str] = field(default_factory=list)
    cost_usd: float | None = None
    """Absent (None), not 0, when unknown."""
    worktree: str | None = None

    def __post_init__(self) -> None:
        self.status = Status(self.status)

    @property
    def ok(self) -> bool:
        return self.status is Status.DONE

    def read_outcome(self) -> Outcome:
        """The agent's outcome.json as its record (schemas/outcome.json)."""
        return record_from_json(Outcome, json.loads(Path(self.outcome).read_text()))


@dataclass
class Agent:
    """A background agent, as start() launched it (what `spawn.py --background` prints)."""

    id: str
    status: Status
    """running, when launched."""
    pid: int
    agent_dir: str
    outcome: str
    done_marker: str
    fail_marker: str
    wait: str
    """The shell command that waits for it."""
    env: Mapping[str, str] | None = field(default=None, repr=False, compare=False)
    """The environment it was started with: its own wait(), kill() and send() use it too."""

    def __post_init__(self) -> None:
        self.status = Status(self.status)

    @property
    def session(self) -> Path:
        return session_of(self.agent_dir)

    def result(self, timeout: float | None = None) -> Result:
        """Block until the agent has an outcome (at most timeout seconds, else SpawnError 124)."""
        waited = wait(self, timeout=timeout, env=self.env)
        if not waited.agents:
            raise wait_timed_out(waited)
        return waited.agents[0]

    def kill(self) -> list[str]:
        return kill(self, env=self.env)

    def send(self, text: str, *, as_name: str | None = None) -> dict[str, Any]:
        return send(self, text, as_name=as_name, env=self.env)


@dataclass
class Waited:
    """What `spawn.py wait` prints: the agents with an outcome, and the others."""

    status: Literal["done", "failed", "timeout"]
    """done: every agent is done; failed: one is not (or is stale); timeout: wait's own timeout ran out."""
    agents: list[Result]
    stale: list[str]
    """Alive with a stopped heartbeat: end them with kill()."""
    pending: list[str]
    """Still running when the timeout ran out."""


@dataclass
class AgentRow:
    """One agent of `spawn.py status --json` (schemas/status.json, `agents`)."""

    id: str
    parent_id: str | None
    depth: int
    state: Status
    """An outcome status, or what an agent without one is observed to be (running, queued...)."""
    agent_dir: str
    task: str = ""
    """The task's first line, cut at 60 characters."""
    duration_s: float | None = None
    cost_usd: float | None = None
    """Its own spend; None when unknown or still running."""
    cost_known: bool = False
    subtree_cost_usd: float | None = None
    subtree_cost_known: bool = False
    pid: int = 0
    level: int = 0
    """Indentation in the tree (depth within this session's listing)."""
    containment: str | None = None
    resumed_from: str | None = None
    kind: str | None = None
    """native: one of Claude Code's own subagents, inside its parent's CLI."""
    agent_type: str | None = None
    usage: dict[str, Any] | None = None
    transcript: str | None = None
    error: str | None = None
    """Why its records can't be read (state corrupt)."""
    paused: dict[str, Any] | None = None
    """State paused: its paused.json (spent_usd, needed_usd, hold_usd, reason, since)."""
    model_calls: list[dict[str, Any]] | None = None
    """Every model call the tree's gateway metered for it, oldest first (ModelCall's fields); None: none metered."""

    def __post_init__(self) -> None:
        self.state = Status(self.state)


AgentRef = Agent | Result | AgentRow | str | os.PathLike[str]
"""An agent: its record, its id, or its directory."""


# ---------------------------------------------------------- python API: argv --


def run_flag_actions() -> dict[str, argparse.Action]:
    """The run parser's flags by keyword (argparse dest): the one list of options."""
    return {a.dest: a for a in build_run_parser()._actions if a.option_strings}


def options_argv(options: Mapping[str, Any]) -> list[str]:
    """The command-line flags for run's keyword arguments; UsageError for a bad one, as the CLI words it."""
    actions = run_flag_actions()
    argv: list[str] = []
    for key, value in options.items():
        action = actions.get(key) if key not in API_LEFT_OUT else None
        if action is None:
            if key in API_LEFT_OUT:
                raise UsageError(f"{key} is no option of the Python API: {API_LEFT_OUT[key]}")
            hint = did_you_mean(key, [*RunOptions.__annotations__, ENV_KEYWORD])
            raise UsageError(f"unknown option {key}={value!r}{hint or '; see help(spawn.run)'}")
        if value is None:
            continue  # None is the flag's default, as if not given
        flag = next(f for f in action.option_strings if f.startswith("--"))
        if isinstance(action, argparse.BooleanOptionalAction | argparse._StoreTrueAction):
            if not isinstance(value, bool):
                raise UsageError(f"{key}={value!r} must be True or False")
            argv += [flag] if value else [] if isinstance(action, argparse._StoreTrueAction) else [f"--no-{flag[2:]}"]
        elif isinstance(action, argparse._AppendAction):
            argv += [f"{flag}={item}" for item in option_list(key, value)]
        elif action.metavar == COMMA_LIST:
            argv.append(f"{flag}={','.join(option_list(key, value))}")
        else:
            argv.append(f"{flag}={option_text(key, value)}")
        check_option_type(key, value)  # after the conversions above, whose words for their cases stand
    return argv


def type_fits(value: Any, hint: Any) -> bool:
    """Does value have the type RunOptions gives its keyword? A number is no str, a bool no number."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return value in args
    if origin in (typing.Union, types.UnionType):
        return any(type_fits(value, h) for h in args)
    if origin is list:  # a tuple is a sequence as good as a list
        return isinstance(value, list | tuple) and all(type_fits(v, args[0]) for v in value)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, origin or hint)


def type_words(hint: Any) -> str:
    """A keyword's type as the error says it: 'a number', 'a list of strings', "'on' or 'off'"."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return " or ".join(map(repr, args))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_words(h) for h in args)
    if origin is list:
        return "a list of strings"
    named = {float: "a number", int: "a whole number", str: "a string", bool: "True or False", Mapping: "a dict", os.PathLike: "a path"}
    return named.get(origin or hint, getattr(hint, "__name__", str(hint)))


def check_option_type(key: str, value: Any) -> None:
    """UsageError, before anything starts, for a keyword whose value has the wrong type (timeout="30")."""
    hint = typing.get_type_hints(RunOptions).get(key)
    if hint is not None and not type_fits(value, hint):
        raise UsageError(f"{key}={value!r} must be {type_words(hint)}, not {type(value).__name__}")


def option_list(key: str, value: Any) -> list[str]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise UsageError(f"{key}={value!r} must be a list of strings, e.g. {key}=['Read']")
    if not all(isinstance(item, str) for item in value):
        raise UsageError(f"{key}={value!r} must hold strings only")
    return list(value)


def option_text(key: str, value: Any) -> str:
    """One keyword's value as its flag's text: a schema dict as JSON."""
    if key == "schema" and isinstance(value, Mapping):
        return json.dumps(value)
    if isinstance(value, os.PathLike):
        return str(os.fspath(value))
    if isinstance(value, bool):  # a bool is an int to Python, never a number of seconds to the CLI
        raise UsageError(f"{key}={value!r} takes a value, not True or False")
    if isinstance(value, str | int | float):
        return str(value)
    raise UsageError(f"{key}={value!r} has the wrong type; see help(spawn.run)")


def agent_arg(agent: AgentRef) -> str:
    """An agent as the verbs take it: its directory when known (any session, any root), else its id."""
    if isinstance(agent, Agent | Result | AgentRow):
        return agent.agent_dir
    return os.fspath(agent)


def agent_args(agents: AgentRef | Sequence[AgentRef]) -> list[str]:
    if isinstance(agents, Agent | Result | AgentRow | str | os.PathLike):
        return [agent_arg(agents)]
    found = [agent_arg(a) for a in agents]
    if not found:
        raise UsageError("no agents given; pass an agent, its id, or a list of them")
    return found


def run_argv(task: str, options: Mapping[str, Any], background: bool) -> list[str]:
    if not isinstance(task, str) or not task.strip():
        raise UsageError("the task is empty; pass the prompt as run's first argument")
    return [f"--task={task}", *options_argv(options), *(["--background"] if background else [])]


def budget_argv(session: AgentRef, raise_usd: float | None, set_usd: float | None, as_name: str | None) -> list[str]:
    if (raise_usd is None) == (set_usd is None):
        raise UsageError("pass raise_usd=USD or set_usd=USD, exactly one")
    flag, usd = ("--raise", raise_usd) if raise_usd is not None else ("--set", set_usd)
    target = str(session_of(session.agent_dir)) if isinstance(session, Agent | Result | AgentRow) else os.fspath(session)
    return ["budget", f"{flag}={option_text(flag[2:], usd)}", *as_argv(as_name), "--", target]


def send_argv(agent: AgentRef, text: str, as_name: str | None) -> list[str]:
    # After `--`, a message that begins with a dash is still the message.
    return ["send", *as_argv(as_name), "--", agent_arg(agent), text]


def as_argv(as_name: str | None) -> list[str]:
    return [f"--as={as_name}"] if as_name is not None else []


def status_argv(session: AgentRef | None) -> list[str]:
    if isinstance(session, Agent | Result | AgentRow):
        return ["status", "--json", str(session_of(session.agent_dir))]
    return ["status", "--json", *([os.fspath(session)] if session is not None else [])]


def session_of(agent_dir: str) -> Path:
    """The session directory holding an agent directory (or a native subagent's place in one)."""
    path = Path(agent_dir)
    return next((p.parent for p in path.parents if p.name == AGENTS_DIR), path.parent.parent)


def wait_argv(agents: AgentRef | Sequence[AgentRef], any_: bool, timeout: float | None) -> list[str]:
    more = ["--timeout", option_text("timeout", timeout)] if timeout is not None else []
    return ["wait", *agent_args(agents), *(["--any"] if any_ else []), *more]


# ------------------------------------------------------- python API: results --


def api_command(argv: Sequence[str]) -> list[str]:
    """This file run as the CLI by this interpreter: the same entry as `python spawn.py` from Bash."""
    return [sys.executable, str(SCRIPT_PATH), *argv]


def api_env(env: Mapping[str, str] | None) -> dict[str, str]:
    return dict(os.environ if env is None else env)


def cli_error_line(stderr: str) -> str | None:
    """The CLI's `spawn: error: ...` message, without its prefix."""
    found = [line for line in stderr.splitlines() if line.startswith("spawn: error: ")]
    return found[-1].removeprefix("spawn: error: ") if found else None


def error_for_exit(code: int, message: str) -> SpawnError:
    """The SpawnError subclass for a CLI exit code, with the CLI's message."""
    exit_code = ExitCode(code) if code in ExitCode._value2member_map_ else None
    error: SpawnError
    if exit_code is ExitCode.USAGE:
        error = UsageError(message)
    elif exit_code is ExitCode.STATE:
        error = StateError(message)
    elif exit_code is ExitCode.REFUSED:
        error = RefusedError(message)
    else:
        error = SpawnError(message)
        error.exit_code = exit_code or ExitCode.STATE
    return error


def cli_data(code: int, stdout: str, stderr: str, *, outcome_ok: bool = False) -> dict[str, Any]:
    """The one JSON object the CLI printed, or the SpawnError its exit code and error line say.

    outcome_ok: a run or a wait whose agents ended otherwise than done exits
    with their status's code but prints their result: that is an answer, not an error.
    """
    if code < 0:  # ended by a signal: the shell's 128+N, as ExitCode counts them
        code = 128 - code
    message = cli_error_line(stderr)
    data: Any = None
    if stdout.strip():
        try:
            data = json.loads(stdout)
        except json.JSONDecodeError:
            data = None
    if isinstance(data, dict) and (code == ExitCode.OK or (message is None and outcome_ok)):
        return data
    if message is None:
        tail = " / ".join(stderr.strip().splitlines()[-3:]) or "nothing on stderr"
        message = f"spawn.py exited with status {code} and no result ({tail})"
    raise error_for_exit(code, message)


def api_call(argv: Sequence[str], env: Mapping[str, str] | None, *, outcome_ok: bool = False) -> dict[str, Any]:
    """Run the CLI to its end. An interrupt (a notebook's, which reaches only this
    process) is passed on: the CLI ends the agent's subtree and records it."""
    with subprocess.Popen(
        api_command(argv), env=api_env(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            stdout, stderr = proc.communicate()
        except BaseException:
            Supervised.signal_pid(proc.pid, signal.SIGINT)  # our own child, not yet reaped
            proc.communicate()
            raise
    return cli_data(proc.returncode, stdout, stderr, outcome_ok=outcome_ok)


async def api_acall(argv: Sequence[str], env: Mapping[str, str] | None, *, outcome_ok: bool = False) -> dict[str, Any]:
    """api_call() for asyncio: a cancelled call interrupts its CLI, which ends the subtree."""
    import asyncio

    proc = await asyncio.create_subprocess_exec(
        *api_command(argv), env=api_env(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        out, err = await proc.communicate()
    except BaseException:
        if proc.returncode is None:
            Supervised.signal_pid(proc.pid, signal.SIGINT)  # our own child, not yet reaped
        await asyncio.shield(proc.wait())
        raise
    assert proc.returncode is not None  # communicate() waited for it
    return cli_data(proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"), outcome_ok=outcome_ok)


def to_waited(data: Mapping[str, Any]) -> Waited:
    agents = [record_from_json(Result, a) for a in data.get("agents", [])]
    return Waited(status=data["status"], agents=agents, stale=list(data.get("stale", [])), pending=list(data.get("pending", [])))


def to_rows(data: Mapping[str, Any]) -> list[AgentRow]:
    return [record_from_json(AgentRow, row) for row in data.get("agents", [])]


def to_agent(data: Mapping[str, Any], env: Mapping[str, str] | None) -> Agent:
    return dataclasses.replace(record_from_json(Agent, data), env=env)


def wait_timed_out(waited: Waited) -> SpawnError:
    error = SpawnError(f"wait timed out; still running: {', '.join(waited.pending)}")
    error.exit_code = ExitCode.TIMEOUT
    return error


# ---------------------------------------------------- python API: functions --


def run(task: str, *, env: Mapping[str, str] | None = None, **options: Unpack[RunOptions]) -> Result:
    """Run an agent in the foreground, as `spawn.py --task TASK ...`, and return its result.

    An agent that ends otherwise than done is a Result too (check .ok or
    .status); bad options, a refusal by a limit, or a broken session raise the
    SpawnError the CLI would report (UsageError, RefusedError, StateError),
    with its message and exit_code.
    """
    return record_from_json(Result, api_call(run_argv(task, options, False), env, outcome_ok=True))


def start(task: str, *, env: Mapping[str, str] | None = None, **options: Unpack[RunOptions]) -> Agent:
    """Start an agent in the background (`spawn.py --background`); wait for it with wait() or agent.result()."""
    return to_agent(api_call(run_argv(task, options, True), env), env)


def wait(
    agents: AgentRef | Sequence[AgentRef],
    *,
    any: bool = False,  # the CLI's --any, by its name
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
) -> Waited:
    """Block until the agents have outcomes (any=True: until one has), at most timeout seconds."""
    return to_waited(api_call(wait_argv(agents, any, timeout), env, outcome_ok=True))


def status(session: AgentRef | None = None, *, env: Mapping[str, str] | None = None) -> list[AgentRow]:
    """A session's agents, parents before children: a session directory, an agent
    (its session), or None for the latest session under the session root."""
    return to_rows(api_call(status_argv(session), env))


def kill(agents: AgentRef | Sequence[AgentRef], *, env: Mapping[str, str] | None = None) -> list[str]:
    """End agents and their subtrees, deepest first (each records killed); the ids ended."""
    return list(api_call(["kill", *agent_args(agents)], env).get("killed", []))


def send(agent: AgentRef, text: str, *, as_name: str | None = None, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Deliver a message to a running agent (`spawn.py send ID TEXT`): it sees it at its next turn.

    as_name: who sends it, recorded with it (`--as NAME`).
    """
    return api_call(send_argv(agent, text, as_name), env)


def budget(
    session: AgentRef,
    *,
    raise_usd: float | None = None,
    set_usd: float | None = None,
    as_name: str | None = None,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Raise or set a tree's budget (`spawn.py budget SESSION --raise|--set USD`); paused agents that now fit go on.

    session: a session directory or its name, or an agent of it; as_name: who changes it (`--as NAME`).
    """
    return api_call(budget_argv(session, raise_usd, set_usd, as_name), env)


async def arun(task: str, *, env: Mapping[str, str] | None = None, **options: Unpack[RunOptions]) -> Result:
    """run() for asyncio: many agents at once with asyncio.gather; cancelling one ends its subtree."""
    return record_from_json(Result, await api_acall(run_argv(task, options, False), env, outcome_ok=True))


async def astart(task: str, *, env: Mapping[str, str] | None = None, **options: Unpack[RunOptions]) -> Agent:
    """start() for asyncio."""
    return to_agent(await api_acall(run_argv(task, options, True), env), env)


async def await_(
    agents: AgentRef | Sequence[AgentRef],
    *,
    any: bool = False,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
) -> Waited:
    """wait() for asyncio (`await` itself is a keyword)."""
    return to_waited(await api_acall(wait_argv(agents, any, timeout), env, outcome_ok=True))


async def astatus(session: AgentRef | None = None, *, env: Mapping[str, str] | None = None) -> list[AgentRow]:
    """status() for asyncio."""
    return to_rows(await api_acall(status_argv(session), env))


async def akill(agents: AgentRef | Sequence[AgentRef], *, env: Mapping[str, str] | None = None) -> list[str]:
    """kill() for asyncio."""
    return list((await api_acall(["kill", *agent_args(agents)], env)).get("killed", []))


async def asend(agent: AgentRef, text: str, *, as_name: str | None = None, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """send() for asyncio."""
    return await api_acall(send_argv(agent, text, as_name), env)


async def abudget(
    session: AgentRef,
    *,
    raise_usd: float | None = None,
    set_usd: float | None = None,
    as_name: str | None = None,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """budget() for asyncio."""
    return await api_acall(budget_argv(session, raise_usd, set_usd, as_name), env)
