"""A running agent's state (RunState), the SDK's loading, the child environment, and stop signals."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.machinery
import json
import os
import shlex
import signal
import sys
import threading
import time
import types
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import importlib.abc
from ..core.constants import (
    BASH_TIMEOUT_MS,
    DEFAULT_API_HOST,
    ENV_AGENT_ID,
    ENV_ASK,
    ENV_BUDGET,
    ENV_DEADLINE,
    ENV_DENY,
    ENV_DEPTH,
    ENV_FULL_SDK_IMPORT,
    ENV_IDLE_TIMEOUT,
    ENV_MAX_DEPTH,
    ENV_MODEL,
    ENV_PERMISSION_MODE,
    ENV_PYTHON,
    ENV_SCRIPT,
    ENV_SESSION,
    ENV_TOOLS,
    ENV_TRACEPARENT,
    PROGRAM_NAME,
    SCRIPT_PATH,
)
from ..core.forkstate import on_fork
from ..core.placement import ENV_PLACEMENT, ENV_SUBAGENT_DEPTH, IN_PROCESS_POLICIES, subagent_depth_limit
from ..core.prelude import import_at_first_use
from ..core.pure import utc_now_iso
from ..core.records import AgentMeta, Status
from ..core.settings import Settings
from ..policy.agents import NodeResult
from ..policy.gateway import gateway_environment
from ..policy.steering import ENV_ON_BUDGET
from ..session.protocol import kill_request_reason
from ..supervise.fast_start import compiled_script

# ------------------------------------------------------------------ running --


def spawn_command() -> str:
    """How an agent's Bash should call spawn.py: the interpreter already resolved.

    Skipping `uv run` below the root saves its resolution step at every level,
    and the compiled script its compilation.
    """
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(compiled_script()))}"


def user_command(environ: Mapping[str, str], cwd: Path) -> str:
    """How a person at a shell in cwd calls this spawn.py: `spawn` (the installed command),
    `uv run spawn.py` (under uv run), else this interpreter on the script. Never the
    compiled copy an agent's Bash gets (spawn_command): that is a cache's path."""
    if PROGRAM_NAME == "spawn":
        return "spawn"
    script = os.path.relpath(SCRIPT_PATH, cwd) if SCRIPT_PATH.is_relative_to(cwd) else str(SCRIPT_PATH)
    if environ.get("UV_RUN_RECURSION_DEPTH"):  # set by `uv run` for what it runs
        return f"uv run {shlex.quote(script)}"
    return f"{shlex.quote(sys.executable)} {shlex.quote(script)}"


def api_host(environ: Mapping[str, str]) -> str:
    """The host the CLI sends model requests to."""
    from urllib.parse import urlsplit

    return urlsplit(environ.get("ANTHROPIC_BASE_URL", "")).hostname or DEFAULT_API_HOST


def proxied_loopback(environ: Mapping[str, str]) -> dict[str, str]:
    """Inside a sandbox, NO_PROXY without loopback: the sandbox has its own
    empty loopback, so a model on the host's (the scripted one, a local
    gateway) is only reachable through the sandbox's proxy, which lets
    through only the hosts the sandbox settings allow."""
    loopback = {"localhost", "127.0.0.1", "::1"}
    env = {}
    for name in ("NO_PROXY", "no_proxy"):
        if name in environ:
            env[name] = ",".join(h for h in environ[name].split(",") if h.strip() not in loopback)
    return env


def child_environment(meta: AgentMeta, agent_dir: Path, environ: Mapping[str, str]) -> dict[str, str]:
    env = {
        ENV_SESSION: meta.session,
        ENV_AGENT_ID: meta.id,
        ENV_DEPTH: str(meta.depth),
        ENV_MAX_DEPTH: str(meta.max_depth),
        ENV_TOOLS: ",".join(meta.tools),
        ENV_TRACEPARENT: meta.traceparent,
        "TRACEPARENT": meta.traceparent,
        ENV_PYTHON: sys.executable,
        ENV_SCRIPT: str(compiled_script()),
        "BASH_DEFAULT_TIMEOUT_MS": environ.get("BASH_DEFAULT_TIMEOUT_MS", BASH_TIMEOUT_MS),
        "BASH_MAX_TIMEOUT_MS": environ.get("BASH_MAX_TIMEOUT_MS", BASH_TIMEOUT_MS),
    }
    env[ENV_DENY] = json.dumps(meta.permissions.get("deny", []))
    env[ENV_ASK] = json.dumps(meta.permissions.get("ask", []))
    env[ENV_PERMISSION_MODE] = meta.permission_mode
    env[ENV_MODEL] = meta.model
    if meta.deadline is not None:
        env[ENV_DEADLINE] = f"{meta.deadline:.3f}"
    if meta.max_budget_usd is not None:
        env[ENV_BUDGET] = str(meta.max_budget_usd)
    if meta.idle_timeout_s is not None:
        env[ENV_IDLE_TIMEOUT] = f"{meta.idle_timeout_s:g}"
    if meta.on_budget is not None:
        env[ENV_ON_BUDGET] = meta.on_budget
    if meta.sandbox == "inherited":
        env.update(proxied_loopback(environ))
    env.update(placement_environment(meta))
    env.update(quiet_cli_environment(environ))
    # Claude Code's minimal mode (CLAUDE_CODE_SIMPLE=1, what `claude --bare`
    # sets) runs no hooks, not even the SDK's: PermissionGate would never see a
    # tool call, so ask rules and the audit trail would be skipped without a
    # word. Anything that can run Bash could set it for a child; it is off for
    # every agent, whatever was inherited.
    env["CLAUDE_CODE_SIMPLE"] = "0"
    if meta.kind == "claude":
        env.update(agent_gateway_environment(Path(meta.session), meta.id))
    return env


# One credential per agent run (child_environment is asked for it more than once).
AGENT_CREDENTIALS: dict[tuple[str, str], dict[str, str]] = {}
on_fork("AGENT_CREDENTIALS", AGENT_CREDENTIALS.clear)


def agent_gateway_environment(session: Path, agent_id: str) -> dict[str, str]:
    key = (str(session), agent_id)
    if key not in AGENT_CREDENTIALS:
        found = gateway_environment(session, agent_id)
        if not found:
            return found  # asked before the root's gateway started (an in-process host's Bash): ask again later
        AGENT_CREDENTIALS[key] = found
    return AGENT_CREDENTIALS[key]


def placement_environment(meta: AgentMeta) -> dict[str, str]:
    """The policy the agent's children inherit and, where its CLI starts them
    in-process, how deep its subagents may nest (what --max-depth leaves)."""
    policy = (meta.placement or {}).get("policy")
    if not isinstance(policy, str):
        return {}
    env = {ENV_PLACEMENT: policy}
    levels = subagent_depth_limit(meta.depth, meta.max_depth)
    if policy in IN_PROCESS_POLICIES and levels > 0:
        env[ENV_SUBAGENT_DEPTH] = str(levels)
    return env


# Set for every agent's CLI unless the user set it (or the wider
# CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC) either way: the CLI's telemetry is
# ~0.2 s of CPU at every start (0.82 s against 1.08 s for a `claude -p`, 8
# interleaved runs), paid by every agent of a tree on a machine the tree
# shares. It changes nothing an agent does. DISABLE_AUTOUPDATER and
# DISABLE_ERROR_REPORTING were measured too and saved nothing: not set.
QUIET_CLI_ENV = {"DISABLE_TELEMETRY": "1"}


def quiet_cli_environment(environ: Mapping[str, str]) -> dict[str, str]:
    if "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC" in environ:
        return {}
    return {k: v for k, v in QUIET_CLI_ENV.items() if k not in environ}


STOP_SIGNALS = {signal.SIGTERM: Status.KILLED, signal.SIGHUP: Status.KILLED, signal.SIGINT: Status.INTERRUPTED}


def stopped_by(signum: int, agent_dir: Path) -> tuple[Status, str]:
    """The outcome a stop signal ends an agent with: its status and reason,
    which names who asked when `spawn.py kill` sent it (its KILL_REQUEST)."""
    status = STOP_SIGNALS[signal.Signals(signum)]
    asked = kill_request_reason(agent_dir) if status == Status.KILLED else None
    return status, asked or f"received {signal.Signals(signum).name}"


class EarlyStop:
    """A stop signal that came after registration but before run_agent's loop could serve it.

    Without this, a runner ended in that window (a parent finishing while
    its background child was still starting) died by the default action,
    and its guard could only record "died without writing an outcome".
    """

    pending: int | None = None
    """The first stop signal held, served (stopped_by) once the agent's loop runs."""

    @classmethod
    def arm(cls) -> None:
        def hold(signum: int, _frame: Any) -> None:
            if cls.pending is None:
                cls.pending = signum

        for signum in STOP_SIGNALS:
            signal.signal(signum, hold)

    @classmethod
    def forget(cls) -> None:
        """A stop the process forked from got is that process's, not its fork's."""
        cls.pending = None


on_fork("EarlyStop", EarlyStop.forget)


class RunState:
    """What a running agent has seen so far; survives cancellation."""

    def __init__(self, settings: Settings, in_process: Any = None) -> None:
        self.settings = settings
        """The environment the runner's edge read once: what this run and its children start from."""
        self.last_text: str | None = None
        self.last_structured_attempt: Any = None
        self.result: Any = None  # the SDK's ResultMessage
        self.cli_pid: int | None = None
        self.cli_pgid: int | None = None
        self.cli_started: Any = None
        """An asyncio.Event that started_cli sets, made by whoever waits for the CLI (asyncio is imported late)."""
        self.stop_reason: Status | None = None
        self.stop_detail: str = ""
        self.running_below: set[str] = set()
        """Descendant agents running when the agent was stopped: it ended them."""
        self.cli_killed = False
        """The CLI was ended by a signal from outside: the agent was killed, it didn't fail."""
        self.last_activity = time.time()
        """Last transcript event or CPU use of the CLI (or the start, or a live child)."""
        self.api_retries = 0
        self.api_error_status: int | None = None
        """The last API error the CLI retried (its api_retry messages): why a run stalled."""
        self.mcp_failed: list[str] = []
        """MCP servers the CLI's init message reports as not connected."""
        self.denied_asks: list[str] = []
        """This agent's asks that were answered no, as 'ask ID (rule R) denied by WHO': a failed run ended on one."""
        self.turns: dict[str, tuple[str, dict[str, Any]]] = {}
        """(model, usage) of each of its model turns so far, by message id: its own running spend."""
        self.request_stop: Callable[[Status, str], None] | None = None
        """run_agent's stop path, for run_sdk to end the agent between turns."""
        self.in_process: Any = in_process
        """The InProcessTree of its in-process children, under --placement inprocess or auto."""
        self.node_result: NodeResult | None = None
        """What a node of another kind than claude returned (see the executors section)."""
        self.stop_hooks: list[Callable[[], Awaitable[None]]] = []
        """Run by the stop path before the node's process group is ended: an a2a node cancels its remote task."""
        self.inbox: Any = None
        """steering.Inbox: the messages `spawn.py send` gives it (None: it takes none)."""
        self.pause: Any = None
        """steering.BudgetPause, under --on-budget pause."""
        self.refusals_recorded = 0
        """A sandboxed leaf's refused spawns its runner recorded from the drop box (record_dropped_refusals)."""

    def started_cli(self, pid: int) -> None:
        """The CLI (or a node's command) runs as pid, the leader of a group of its own."""
        self.cli_pid = self.cli_pgid = pid
        if self.cli_started is not None:
            self.cli_started.set()


def message_record(message: Any) -> dict[str, Any]:
    data = dataclasses.asdict(message) if dataclasses.is_dataclass(message) and not isinstance(message, type) else {"repr": repr(message)}
    return {"time": utc_now_iso(), "type": type(message).__name__, "message": data}


class _AbsentModule(types.ModuleType):
    """Stands in for a module of the mcp package: every name is an inert class."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        stand_in = type(name, (), {"__init__": _ignore, "__init_subclass__": classmethod(_ignore), "__class_getitem__": classmethod(_same)})
        setattr(self, name, stand_in)
        return stand_in


def _ignore(*_args: Any, **_kwargs: Any) -> None:
    return None


def _same(cls: Any, _item: Any) -> Any:
    return cls


class _AbsentMcpFinder:
    """Serves _AbsentModule for mcp and mcp_types, which the SDK imports eagerly.

    A meta path finder and loader by protocol; importlib.abc costs start-up.
    """

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] in ("mcp", "mcp_types"):
            return importlib.machinery.ModuleSpec(fullname, cast("importlib.abc.Loader", self), is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _AbsentModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []


def imported_modules(*packages: str) -> list[str]:
    """The names in sys.modules of these top-level packages and their modules.

    import_sdk runs on the SDK-import thread while the runner's own thread
    may import too (psutil at its first use), so sys.modules is copied by
    list(), one C call under the GIL, never iterated while it can change
    size ("dictionary changed size during iteration" failed a root).
    """
    return [name for name in list(sys.modules) if name.partition(".")[0] in packages]


def import_sdk(environ: Mapping[str, str]) -> types.ModuleType:
    """Import claude_agent_sdk, skipping the mcp package it loads at import time.

    The SDK imports mcp (with pydantic models and an HTTP server stack) only
    to host in-process MCP servers, which spawn.py never creates; external
    MCP servers are plain config for the CLI. That import is about 80% of a
    nested level's start-up, paid again at every depth, so stand-ins serve
    the mcp modules instead. If the SDK can't be imported that way, or
    SPAWN_FULL_SDK_IMPORT=1, it is imported normally.
    """
    if "claude_agent_sdk" in sys.modules:
        return sys.modules["claude_agent_sdk"]
    # The SDK imports jsonschema at import time only to validate the input of
    # in-process MCP tools, which spawn.py never creates: a large part of the
    # SDK's import, paid at every depth.
    import_at_first_use("jsonschema")
    # Imported by the SDK for the app name it derives, which spawn.py gives
    # it (run_sdk): about 15 ms of reading email and zip modules.
    import_at_first_use("importlib.metadata")
    # Imported by connect(), when installed, only to pass on an in-process
    # span: spawn.py has none, and gives the CLI its TRACEPARENT itself
    # (child_environment). Absent, it is the ImportError the SDK expects
    # without the package: about 8 ms of every agent's start, before its CLI.
    sys.modules.setdefault("opentelemetry.propagate", None)  # type: ignore[arg-type]
    if environ.get(ENV_FULL_SDK_IMPORT) != "1" and not imported_modules("mcp"):
        finder = _AbsentMcpFinder()
        sys.meta_path.insert(0, finder)
        try:
            import claude_agent_sdk

            return claude_agent_sdk
        except Exception:
            sys.meta_path.remove(finder)
            for name in imported_modules("mcp", "mcp_types", "claude_agent_sdk"):
                del sys.modules[name]
    import claude_agent_sdk

    return claude_agent_sdk


class SdkLoader:
    """Imports the SDK on a thread, once the agent's CLI has started (run_agent).

    Not sooner: the import holds the GIL for most of its ~100 ms of CPU, so
    started beside registration it only slowed that down, and the CLI,
    which doesn't need it, started no earlier. After the CLI's start it runs
    beside the CLI's own start-up, on another CPU.
    """

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._module: types.ModuleType | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._load, args=(dict(environ),), name="sdk-import", daemon=True)

    def start(self) -> None:
        if self._thread.ident is None:
            self._thread.start()

    def _load(self, environ: Mapping[str, str]) -> None:
        try:
            self._module = import_sdk(environ)
        except BaseException as exc:  # re-raised in the caller's thread by result()
            self._error = exc

    def result(self) -> types.ModuleType:
        self.start()
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._module is not None
        return self._module
