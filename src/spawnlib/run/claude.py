"""The claude executor's engine: the bundled claude CLI started for an agent, its permission
gate, the SDK conversation with it, and the outcome that conversation makes.

Below the executors (ClaudeExecutor runs through it) and the runner (run_agent),
above the running state it fills in.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import __version__
from ..core.constants import (
    LEDGER,
    MEMORY_HEAD_LINES,
    NATIVE_LOG,
    PERMISSION_KINDS,
    REFUSED_DIR,
    REQUESTS_DIR,
    SCRATCH_DIR,
    STDERR_LOG,
    TRANSCRIPT,
)
from ..core.errors import ExitCode, SpawnError
from ..core.output import note
from ..core.pure import (
    briefing,
    canonical_tool,
    claude_config_dir,
    cli_settings,
    estimate_cost,
    first_message,
    redact,
    round_usd,
    sandbox_settings,
    sandbox_writes,
    schema_for_cli,
    utc_now_iso,
    validate_output,
)
from ..core.records import EXIT_FOR_STATUS, AgentMeta, Outcome, Status
from ..core.settings import Settings
from ..policy.admission import (
    START_SLOT_HOLD_S,
    START_SLOT_QUIET_LOOKS,
    START_SLOT_QUIET_S,
    START_SLOT_QUIET_SHARE,
    cpu_demand_ns,
    readable,
    start_slot_count,
    take_start_slot,
)
from ..policy.agents import (
    RuleSet,
    cli_permissions,
    decide,
    kept_by_spawn_py,
    parse_definition,
    parse_rule,
    project_of,
    remember_cli_tools,
    resolve_mcp_refs,
    skill_file,
    summarize_input,
)
from ..policy.channel import open_ask, prompt_person
from ..policy.delegates import delegates_in
from ..policy.steering import cli_budget_cap, pause_hooks
from ..policy.writable import (
    SandboxWrites,
    code_folders,
    definition_refusal,
    fd_path,
    open_real_folder,
    sandbox_uv_cache,
    sandboxed_ancestors,
    server_secrets,
    trusted_sources,
    untrusted_sources,
    writer_of,
)
from ..session.ledger import over_hold
from ..session.protocol import (
    AGENTS_DIR,
    STATUS_CACHE,
    STATUS_INDEX,
    append_jsonl,
    append_log_line,
    append_transcript,
    asks_dir,
    cache_dir,
    open_regular,
    read_text,
    resumed_sdk_session,
)
from ..supervise.fast_start import uv_shim_folder
from ..supervise.supervisor import ProcfsProcess, Supervised, child_running, procfs_is_ours, procfs_readable, runner_index_dir
from .inprocess import in_process_hooks, subagent_definitions, withheld_agent_tool
from .running import RunState, SdkLoader, api_host, child_environment, import_sdk, message_record, spawn_command
from .subagents import AGENT_TOOL

# spawn.py starts the agent's CLI itself, and hands the SDK its pipes as a
# transport (CliPipes). The SDK's own transport would start it only once the
# SDK and asyncio are imported, about 100 ms of CPU at every agent that isn't
# forked (a root above all), and the CLI's own start-up (~0.4 s) can't begin
# before. So the command line and environment are built here exactly as the
# SDK's SubprocessCLITransport builds them, for the options spawn.py sets
# (test_cli_start checks both against the SDK's), and the CLI starts before
# the SDK is imported when it can (run_agent), else as the run begins.
SDK_CLIENT_APP_ENV = "CLAUDE_AGENT_SDK_CLIENT_APP"  # the caller names its app (the SDK's EXPLICIT_CLIENT_APP_ENV)


SDK_DERIVED_CLIENT_APP_ENV = "CLAUDE_AGENT_SDK_DERIVED_CLIENT_APP"


SDK_READS_SESSION_STATE_ENV = "CLAUDE_CODE_SDK_READS_SESSION_STATE"


SDK_MAX_MESSAGE = 1 << 20  # the SDK's limit on one message from the CLI (_DEFAULT_MAX_BUFFER_SIZE)


CLI_CLOSE_WAIT_S = 5.0  # as the SDK's close(): after stdin's end, then after SIGTERM


def cli_argv(cli: str, options: Mapping[str, Any]) -> list[str]:
    """The CLI's command line for these ClaudeAgentOptions fields, as the SDK's transport builds it (pure)."""
    argv = [cli, "--output-format", "stream-json", "--verbose"]
    prompt = options.get("system_prompt")
    if prompt is None:
        argv += ["--system-prompt", ""]
    elif isinstance(prompt, str):
        argv += ["--system-prompt", prompt]
    elif prompt.get("type") == "preset" and "append" in prompt:
        argv += ["--append-system-prompt", prompt["append"]]
    tools = options.get("tools")
    if tools is not None:
        argv += ["--tools", ",".join(tools)]
    allowed = list(options.get("allowed_tools") or [])
    sources = options.get("setting_sources")
    skills = options.get("skills")
    if skills is not None:
        # Skill names were checked as a definition was read (parse_agent_fields).
        allowed += [rule for rule in (["Skill"] if skills == "all" else [f"Skill({name})" for name in skills]) if rule not in allowed]
        sources = ["user", "project"] if sources is None else sources
    if allowed:
        argv += ["--allowedTools", ",".join(allowed)]
    if options.get("max_turns"):
        argv += ["--max-turns", str(options["max_turns"])]
    if options.get("max_budget_usd") is not None:
        argv += ["--max-budget-usd", str(options["max_budget_usd"])]
    if options.get("disallowed_tools"):
        argv += ["--disallowedTools", ",".join(options["disallowed_tools"])]
    if options.get("model"):
        argv += ["--model", options["model"]]
    if options.get("permission_mode"):
        argv += ["--permission-mode", options["permission_mode"]]
    if options.get("resume"):
        argv.append(f"--resume={options['resume']}")  # one token: a value never reads as a flag
    if options.get("settings"):
        argv += ["--settings", options["settings"]]
    servers = options.get("mcp_servers")
    if servers:
        argv += ["--mcp-config", json.dumps({"mcpServers": dict(servers)})]
    if options.get("strict_mcp_config"):
        argv.append("--strict-mcp-config")
    if sources is not None:
        argv.append(f"--setting-sources={','.join(sources)}")
    if options.get("effort") is not None:
        argv += ["--effort", options["effort"]]
    output_format = options.get("output_format")
    if isinstance(output_format, dict) and output_format.get("type") == "json_schema" and output_format.get("schema") is not None:
        argv += ["--json-schema", json.dumps(output_format["schema"])]
    return [*argv, "--input-format", "stream-json"]


def cli_environment(
    environ: Mapping[str, str], env: Mapping[str, str], cwd: str | None, client_app: str | None, version: str
) -> dict[str, str]:
    """The CLI's environment, as the SDK's transport makes it (pure)."""
    out = {k: v for k, v in environ.items() if k != "CLAUDECODE"}  # the CLI must not think it runs inside Claude Code
    out["CLAUDE_CODE_ENTRYPOINT"] = "sdk-py"
    out.update(env)
    out["CLAUDE_AGENT_SDK_VERSION"] = version
    out.pop(SDK_DERIVED_CLIENT_APP_ENV, None)
    if client_app is not None:
        out[SDK_CLIENT_APP_ENV] = client_app
    # The query waits for the CLI's "idle" before it closes stdin; the CLI sends it only if asked.
    if not any(k.upper() == SDK_READS_SESSION_STATE_ENV for k in out):
        out[SDK_READS_SESSION_STATE_ENV] = "1"
    if cwd:
        out["PWD"] = cwd
    return out


def sdk_version(environ: Mapping[str, str]) -> str:
    """claude-agent-sdk's version, read from its _version.py without importing the package (about 1 s)."""
    return sdk_version_file() or str(import_sdk(environ).__version__)


@functools.cache
def sdk_version_file() -> str | None:
    """The version its _version.py states, or None."""
    import importlib.util

    spec = importlib.util.find_spec("claude_agent_sdk")
    with contextlib.suppress(OSError, TypeError):
        text = (Path(str(spec.origin)).parent / "_version.py").read_text() if spec else ""
        if m := re.search(r"""^__version__\s*=\s*["']([^"']+)["']""", text, re.M):
            return m.group(1)
    return None


class StartedCli:
    """An agent's CLI, started by spawn.py (start_cli), and the start slot it holds until its first message."""

    def __init__(self, plan: CliStart, process: subprocess.Popen[bytes], slot: int | None) -> None:
        self.plan = plan
        self.process = process
        self.slot = slot
        self.returncode: int | None = None
        self.waiter: Any = None  # the task that reaps it

    def free_slot(self) -> None:
        if self.slot is not None:
            os.close(self.slot)
            self.slot = None

    async def wait(self) -> int:
        """Its exit status, as asyncio gives it (-N: signal N); one waiter however many ask."""
        import asyncio

        if self.waiter is None:
            self.waiter = asyncio.ensure_future(self._wait())
        return await asyncio.shield(self.waiter)

    async def _wait(self) -> int:
        import asyncio

        pid = self.process.pid
        pidfd = None
        with contextlib.suppress(AttributeError, OSError):
            pidfd = os.pidfd_open(pid)
        if pidfd is not None:
            # Readable when it exits: no thread, no poll.
            try:
                while child_running(pid):
                    await readable(pidfd, 1.0)
            finally:
                os.close(pidfd)
        else:
            pause = 0.005
            while child_running(pid):
                await asyncio.sleep(pause)
                pause = min(pause * 2, 0.1)
        try:
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        except ChildProcessError:
            self.returncode = 255  # reaped by someone else: asyncio's answer for it
        self.process.returncode = self.returncode  # so Popen doesn't reap or warn again
        return self.returncode


def start_cli(plan: CliStart, state: RunState, slot: int | None) -> StartedCli:
    """Start the agent's CLI, in a session and process group of its own.

    Ending an agent must reach everything its CLI started (Bash commands,
    their children) without signalling spawn.py itself. On failure the slot
    is let go and the SDK's error is raised.
    """
    # Below a sandboxed agent, the cwd (a real path at admission) may have
    # been swapped since for a link out of what that agent may write: opened
    # following no link, it is the same folder, or the CLI doesn't start.
    folder = None
    try:
        folder = open_real_folder(plan.options["cwd"]) if plan.pin_cwd else None
        process = subprocess.Popen(
            plan.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=plan.options["cwd"] if folder is None else fd_path(folder),
            env=plan.env,
            start_new_session=True,
        )
    except BaseException:
        if slot is not None:
            os.close(slot)
        raise
    finally:
        if folder is not None:
            os.close(folder)
    state.started_cli(process.pid)
    return StartedCli(plan, process, slot)


class CliPipes:
    """The SDK's transport to a CLI that spawn.py started: its stdin, stdout and stderr pipes.

    It behaves as the SDK's SubprocessCLITransport once that has started the
    CLI: the same messages, the same errors (the SDK's own classes) and the
    same end: stdin closed, then SIGTERM after 5 s, SIGKILL after 5 more.
    """

    def __init__(self, sdk: Any, cli: StartedCli, on_stderr: Callable[[str], None]) -> None:
        self.sdk = sdk
        self.cli = cli
        self.on_stderr = on_stderr
        self.ready = False
        self.stdout: Any = None
        self.stdin: Any = None
        self.relay: Any = None  # the task that copies stderr to on_stderr
        self.pipes: list[Any] = []

    async def connect(self) -> None:
        import asyncio

        loop = asyncio.get_running_loop()
        process = self.cli.process
        self.stdout = asyncio.StreamReader(limit=SDK_MAX_MESSAGE + 1)
        out, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(self.stdout), process.stdout)
        stderr = asyncio.StreamReader()
        err, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stderr), process.stderr)
        # A StreamReaderProtocol gives the writer its flow control (drain), as asyncio's subprocesses have.
        pipe, protocol = await loop.connect_write_pipe(lambda: asyncio.StreamReaderProtocol(asyncio.StreamReader()), process.stdin)
        self.stdin = asyncio.StreamWriter(pipe, protocol, None, loop)
        self.pipes = [out, err]
        self.relay = asyncio.ensure_future(self._relay_stderr(stderr))
        self.ready = True

    async def _relay_stderr(self, stderr: Any) -> None:
        while line := await stderr.readline():
            text = line.decode(errors="replace").rstrip()
            if text:
                with contextlib.suppress(Exception):
                    self.on_stderr(text)

    def is_ready(self) -> bool:
        return self.ready

    async def write(self, data: str) -> None:
        if not self.ready or self.stdin is None:
            raise self.sdk.CLIConnectionError("ProcessTransport is not ready for writing")
        if self.cli.returncode is not None:
            raise self.sdk.CLIConnectionError(f"Cannot write to terminated process (exit code: {self.cli.returncode})")
        try:
            self.stdin.write(data.encode())
            await self.stdin.drain()
        except Exception as exc:
            self.ready = False
            raise self.sdk.CLIConnectionError(f"Failed to write to process stdin: {exc}") from exc

    async def end_input(self) -> None:
        if self.stdin is not None:
            with contextlib.suppress(Exception):
                self.stdin.close()
            self.stdin = None

    def read_messages(self) -> AsyncIterator[dict[str, Any]]:
        return self._read_messages()

    async def _read_messages(self) -> AsyncIterator[dict[str, Any]]:
        pending = b""
        while chunk := await self.stdout.read(1 << 16):
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                if (message := self._message(line)) is not None:
                    yield message
            if len(pending) > SDK_MAX_MESSAGE:
                raise self.sdk.CLIJSONDecodeError(
                    pending[:100].decode(errors="replace"), ValueError(f"message over {SDK_MAX_MESSAGE} bytes")
                )
        # The CLI ends every message with a newline: a tail without one was cut off.
        tail = None
        with contextlib.suppress(Exception):
            tail = self._message(pending)
        if tail is not None:
            yield tail
        code = await self.cli.wait()
        if code != 0:
            await self._drain_stderr()  # what it said last is the reason's second half (describe_sdk_error)
            raise self.sdk.ProcessError(f"Command failed with exit code {code}", exit_code=code, stderr="Check stderr output for details")

    def _message(self, line: bytes) -> dict[str, Any] | None:
        text = line.decode(errors="replace").strip()
        if not text.startswith("{"):
            return None  # a blank line, or a CLI's debug line on stdout
        try:
            message = json.loads(text)
        except ValueError as exc:
            raise self.sdk.CLIJSONDecodeError(text[:100], exc) from exc
        return message if isinstance(message, dict) else None

    async def _drain_stderr(self, timeout: float = 1.0) -> None:
        """Let the relay reach stderr's end (the CLI's last words), unless something the CLI started holds it open."""
        import asyncio

        if self.relay is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait([self.relay], timeout=timeout)

    async def close(self) -> None:
        import asyncio

        self.ready = False
        await self.end_input()
        try:
            for sig in (None, signal.SIGTERM, signal.SIGKILL):
                if sig is not None and self.cli.returncode is None:
                    # By pid, not Popen's send_signal: that would reap it, and the status would be lost to wait().
                    Supervised.signal_pid(self.cli.process.pid, sig)
                try:
                    await asyncio.wait_for(asyncio.shield(self.cli.wait()), CLI_CLOSE_WAIT_S)
                    break
                except TimeoutError:
                    continue
            await self._drain_stderr(0.2)
        finally:
            if self.relay is not None:
                self.relay.cancel()
            for pipe in self.pipes:
                pipe.close()


def cli_identity(pid: int) -> tuple[int, float] | None:
    """(pid, create time) of the CLI, as the ancestry walk of a spawn below it reads them; None if it is gone."""
    import psutil

    with contextlib.suppress(OSError, psutil.Error):
        return pid, (ProcfsProcess(pid) if procfs_readable() else psutil.Process(pid)).create_time()
    return None


def delegates_for(meta: AgentMeta, environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """The definitions an agent that may spawn can delegate to: (name, description)."""
    if meta.depth >= meta.max_depth or "Bash" not in meta.tools or any(r.startswith("Bash(") for r in meta.permissions.get("allow", [])):
        return []
    return delegates_in(Path(meta.cwd), environ)  # without YAML where it can (delegates)


class PermissionGate:
    """spawn.py's own enforcement of permission rules, and their audit trail.

    A PreToolUse hook sees every tool call, including those the CLI would
    approve by itself. Deny and ask rules are decided here; allowed calls are
    left to the CLI (so its permission mode still applies). Every decision is
    appended to the transcript.
    """

    def __init__(
        self, meta: AgentMeta, agent_dir: Path, secrets_: Sequence[str], settings: Settings, denied_asks: list[str] | None = None
    ) -> None:
        self.meta = meta
        self.settings = settings
        self.agent_dir = agent_dir
        self.secrets = secrets_
        self.denied_asks = denied_asks if denied_asks is not None else []
        """Appended to on every ask answered no (the run's RunState.denied_asks)."""
        self.rules = RuleSet(*([parse_rule(t) for t in meta.permissions.get(kind, [])] for kind in PERMISSION_KINDS))
        self.home = settings.home
        # Both spellings of each: tool_paths gives a path as written and as resolved.
        folders = (meta.session, str(cache_dir(settings)))
        self.kept = list(dict.fromkeys([*folders, *map(os.path.realpath, folders)]))
        own = (str(agent_dir / SCRATCH_DIR), str(agent_dir / "worktree"))
        self.own = list(dict.fromkeys([*own, *map(os.path.realpath, own)]))
        # What the agent's Bash inherits: the CLI gets the runner's environment plus this.
        self.shell_env = {**settings, **child_environment(meta, agent_dir, settings)}
        self.agent_call_check: Callable[[Mapping[str, Any], str | None], str | None] | None = None
        """With in-process children: why an Agent call its rules allow can't start one (InProcessTree.host_agent_call)."""

    async def pre_tool_use(self, hook_input: Any, tool_use_id: str | None, context: Any) -> Any:
        tool = str(hook_input.get("tool_name", ""))
        tool_input = hook_input.get("tool_input") or {}
        kept = kept_by_spawn_py(tool, tool_input, self.meta.cwd, self.kept, self.own)
        rule: str | None
        if kept is not None:
            verdict, rule = "deny", f"only spawn.py writes {kept}"
        else:
            verdict, rule = decide(tool, tool_input, self.rules, self.meta.tools, cwd=self.meta.cwd, home=self.home, environ=self.shell_env)
        decided_by = "rules"
        if verdict == "ask":
            verdict, decided_by = await self.escalate(tool, tool_input, rule or "")
        if verdict == "allow" and self.agent_call_check is not None and canonical_tool(tool) == AGENT_TOOL:
            refused = self.agent_call_check(tool_input, tool_use_id)  # recorded as the refusal it is, not as allowed
            if refused is not None:
                verdict, rule, decided_by = "deny", refused, "placement"
        record = {
            "tool": tool,
            "input": summarize_input(tool_input),
            "rule": rule,
            "verdict": verdict,
            "by": decided_by,
            "tool_use_id": tool_use_id,
        }
        decision = {"time": utc_now_iso(), "type": "PermissionDecision", "message": record}
        append_transcript(self.agent_dir / TRANSCRIPT, decision, self.secrets)
        if verdict == "allow":
            return {}
        reason = f"denied by spawn.py ({decided_by}): {rule}"
        return {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny", "permissionDecisionReason": reason}}

    async def escalate(self, tool: str, tool_input: Mapping[str, Any], rule: str) -> tuple[str, str]:
        """(allow|deny, who decided) for a call an ask rule matched."""
        import asyncio

        timeout = self.settings.ask_timeout_s
        if self.meta.deadline is not None:
            timeout = min(timeout, max(0.0, self.meta.deadline - time.time()))
        if self.meta.depth == 0 and sys.stdin is not None and sys.stdin.isatty():
            verdict, by = await asyncio.to_thread(prompt_person, self.meta, tool, tool_input, rule, timeout)
            if verdict == "deny":
                self.denied_asks.append(f"ask at the terminal (rule {rule}) denied by {by}")
            return verdict, by
        channel = open_ask(self.meta, tool, tool_input, rule, timeout=timeout, secrets_=self.secrets)
        ask = channel.ask_id
        what = f"{tool} ({summarize_input(tool_input, 80)}; rule {rule})"
        note(f"agent {self.meta.id} asks to use {what}: run 'spawn.py approve {ask}' or 'spawn.py deny {ask}' within {timeout:.0f} s")
        try:
            answer = await asyncio.to_thread(channel.wait, self.meta.id, timeout, self.secrets)
        finally:
            channel.close()  # a stop while waiting denies the ask, by timeout
        verdict, by = ("allow" if answer.get("verdict") == "approve" else "deny"), str(answer.get("by", "?"))
        if verdict == "deny":
            self.denied_asks.append(f"ask {ask} (rule {rule}) denied by {by}")
        return verdict, by


def native_subagent_hooks(sdk: Any, agent_dir: Path, secrets_: Sequence[str]) -> dict[str, list[Any]]:
    """Record Claude Code's own subagents (the Agent tool) in NATIVE_LOG: one line at start, one at stop."""

    async def record(hook_input: Any, _tool_use_id: str | None, _context: Any) -> Any:
        event = str(hook_input.get("hook_event_name", ""))
        line: dict[str, Any] = {
            "time": utc_now_iso(),
            "event": "start" if event == "SubagentStart" else "stop",
            "agent_id": str(hook_input.get("agent_id", "")),
            "agent_type": str(hook_input.get("agent_type", "")),
        }
        if event == "SubagentStop":
            line["transcript_path"] = str(hook_input.get("agent_transcript_path", ""))
            line["last_message"] = str(hook_input.get("last_assistant_message") or "")[:2000]
        append_jsonl(agent_dir / NATIVE_LOG, line, secrets_)
        return {}

    return {name: [sdk.HookMatcher(matcher=None, hooks=[record])] for name in ("SubagentStart", "SubagentStop")}


def memory_dir(meta: AgentMeta, definition_path: Path, environ: Mapping[str, str]) -> Path:
    """Claude Code's agent memory directories: user, project, or local (not committed)."""
    name = meta.agent or definition_path.stem
    if meta.memory == "user":
        return Path(environ.get("HOME") or Path.home()).expanduser() / ".claude" / "agent-memory" / name
    return project_of(str(definition_path)) / ".claude" / ("agent-memory-local" if meta.memory == "local" else "agent-memory") / name


def memory_section(meta: AgentMeta, definition_path: Path, environ: Mapping[str, str]) -> str:
    """What Claude Code tells an agent with `memory:`: where its memory lives and
    the head of its MEMORY.md, so what it learnt last time is in front of it."""
    folder = memory_dir(meta, definition_path, environ)
    with contextlib.suppress(OSError):
        folder.mkdir(parents=True, exist_ok=True)
    try:
        head = "\n".join((folder / "MEMORY.md").read_text().splitlines()[:MEMORY_HEAD_LINES])
    except (OSError, UnicodeDecodeError):
        head = "(empty)"
    return (
        f"# Agent memory\nYour persistent memory directory is {folder}. Keep notes worth keeping across runs "
        f"in {folder / 'MEMORY.md'} (only its first {MEMORY_HEAD_LINES} lines are shown here).\n"
        f"MEMORY.md now:\n{head}"
    )


def skill_sections(meta: AgentMeta, environ: Mapping[str, str]) -> list[str]:
    """A definition's skills, preloaded whole into the system prompt, as Claude
    Code does for a subagent's `skills:` (no settings files need loading)."""
    project = project_of(meta.agent_source) if meta.agent_source else Path(meta.cwd)
    sections = []
    for name in meta.skills or []:
        path = skill_file(name, project, environ)
        with contextlib.suppress(OSError, UnicodeDecodeError):
            if path is not None:
                sections.append(f"# Skill: {name}\n{path.read_text().strip()}")
    return sections


@dataclass
class CliStart:
    """What an agent's CLI is started with, worked out without the SDK (cli_start)."""

    options: dict[str, Any]
    """ClaudeAgentOptions' fields, but hooks and stderr (they need the SDK)."""
    gate: PermissionGate
    prompt: str
    argv: list[str]
    env: dict[str, str]
    pin_cwd: bool = False
    """Start the CLI in the folder its cwd's real path names now, by descriptor, or not at all (below a sandboxed agent, on Linux)."""


def project_claude_dir(cwd: str) -> str:
    """The working directory's .claude/, made if absent: held read-only in a sandbox as one existing folder.

    Claude Code's sandbox protects files there (settings, agents, commands,
    launch.json, ...); for each one that doesn't exist it makes an empty
    placeholder on the host while a Bash runs, and removes it after. Two
    sandboxed agents in one folder then race for the same placeholders
    ("bwrap: Can't bind mount .../.claude/launch.json"). The folder held
    read-only whole needs none. (The CLI makes .claude/ itself, for its own
    .cc-writes, so making it adds nothing to the project.)
    """
    folder = os.path.join(os.path.realpath(cwd), ".claude")
    with contextlib.suppress(OSError):
        os.mkdir(folder)
    return folder


def uv_shim_path(environ: Mapping[str, str]) -> dict[str, str]:
    """An agent's PATH, the `uv` shim first: `uv run spawn.py` in its Bash runs the tree's spawn.py without
    uv's resolution, the same environment again (programs/uv_shim.py says when); {} where it can't be written."""
    shim = uv_shim_folder(environ)
    return {"PATH": os.pathsep.join([str(shim), environ.get("PATH", os.defpath)])} if shim is not None else {}


def definition_commands(
    meta: AgentMeta, writes: Sequence[SandboxWrites], environ: Mapping[str, str]
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The MCP servers and hooks of the agent's definition that its CLI runs: none from where a sandboxed ancestor writes.

    The servers' config (which may hold tokens) and the hooks' commands are
    read from the definition, never copied into meta.json; by its real path,
    resolved once: no part of a path no such agent can write can be swapped by one.
    """
    source = os.path.realpath(meta.agent_source) if meta.agent_source else None
    if not source or not (meta.mcp_servers or meta.hooks) or writer_of(source, writes) is not None:
        return {}, None
    definition, _ = parse_definition(Path(source).read_text(), meta.agent_source or source, "project")
    if definition is None:
        return {}, None
    resolve_mcp_refs(definition, environ)
    if definition_refusal(definition, environ, writes) is not None:
        return {}, None
    # Claude Code's hooks format is a settings key: the CLI runs them.
    return (definition.mcp_servers if meta.mcp_servers else {}), (definition.hooks if definition.hooks and meta.hooks else None)


def cli_start(meta: AgentMeta, agent_dir: Path, cli: Path, state: RunState, secrets_: Sequence[str]) -> CliStart:
    """The CLI's options, command line and environment for this agent."""
    system_prompt: Any
    environ = state.settings
    brief = briefing(meta, spawn_command(), delegates_for(meta, environ))
    if meta.preset == "claude_code":
        system_prompt = {"type": "preset", "preset": "claude_code", "append": (meta.system_prompt + "\n\n" + brief).strip()}
    else:
        system_prompt = f"{meta.system_prompt}\n\n{brief}".strip()
    builtin = [t for t in meta.tools if not t.startswith("mcp__") and not withheld_agent_tool(meta, t)]
    # Below a sandboxed agent: nothing that runs code from where it can write (writable.py; admission refused such a definition).
    writes = sandboxed_ancestors(meta.session, meta.parent_id) if meta.parent_id else []
    mcp_servers, hooks = definition_commands(meta, writes, environ)
    sandbox = None
    if meta.sandbox == "on":
        with contextlib.suppress(FileExistsError):
            (agent_dir / SCRATCH_DIR).mkdir()  # bwrap binds only what exists
        # The CLI holds its config dir's projects/ read-only in the sandbox,
        # binding /dev/null there while it is absent; the CLI's own first
        # transcript write makes it a directory, and a Bash whose bwrap line
        # was built just before then fails ("Can't create file at
        # .../projects: Is a directory"). Made now, it is a directory throughout.
        with contextlib.suppress(OSError):
            (claude_config_dir(environ) / "projects").mkdir(mode=0o700, parents=True, exist_ok=True)
        session = Path(meta.session)
        # Made now if absent, so the sandbox can hold them read-only (sandbox_writes).
        with contextlib.suppress(OSError):
            asks_dir(session).mkdir(exist_ok=True)
            # (An empty status cache is one status ignores, and replaces whole.)
            for name in (LEDGER, STATUS_INDEX, STATUS_CACHE):
                os.close(open_regular(session / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW)[0])
        # Its drop box: made now, since bwrap binds only what exists (sandbox_writes).
        (session / (REFUSED_DIR if meta.depth >= meta.max_depth else REQUESTS_DIR) / meta.id).mkdir(parents=True, exist_ok=True)
        boxes = [f"{f}/{n}" for f in (REFUSED_DIR, REQUESTS_DIR) if (session / f).is_dir() for n in os.listdir(session / f)]
        writable, read_only = sandbox_writes(
            meta.depth < meta.max_depth,
            agent_dir,
            meta.session,
            runner_index_dir(),
            session_entries=os.listdir(session),
            drop_boxes=boxes,
        )
        # The compiled copies every tree runs, never the sandbox's to write, even inside its cwd; its project's .claude/.
        read_only += [os.path.realpath(cache_dir(environ)), project_claude_dir(meta.cwd), *code_folders(environ, meta.cwd)]
        read_only = [p for p in read_only if os.path.lexists(p)]  # never a placeholder (sandbox_writes)
        domains = [m.group(1) for r in meta.permissions.get("allow", []) if (m := re.fullmatch(r"WebFetch\(domain:(.+)\)", r))]
        sandbox = sandbox_settings(writable, api_host(environ), domains, read_only, server_secrets(environ))
    settings = cli_settings(hooks=hooks, sandbox=sandbox)
    sections = [memory_section(meta, Path(meta.agent_source), environ)] if meta.agent_source and meta.memory else []
    sections += skill_sections(meta, environ)
    if sections:
        if isinstance(system_prompt, dict):
            system_prompt["append"] += "\n\n" + "\n\n".join(sections)
        else:
            system_prompt += "\n\n" + "\n\n".join(sections)
    gate = PermissionGate(meta, agent_dir, secrets_, environ, state.denied_asks)
    allowed, disallowed = cli_permissions(meta.tools, meta.disallowed_tools, gate.rules)
    options: dict[str, Any] = dict(
        tools=builtin,
        allowed_tools=allowed,
        mcp_servers=mcp_servers,
        strict_mcp_config=True,
        skills=meta.skills,
        disallowed_tools=disallowed,
        system_prompt=system_prompt,
        model=meta.model,
        max_turns=meta.max_turns,
        max_budget_usd=cli_budget_cap(meta),
        effort=meta.effort if isinstance(meta.effort, str) else None,
        settings=settings,
        cwd=meta.cwd,
        cli_path=str(cli),
        env=child_environment(meta, agent_dir, environ),
        # dontAsk by default: nobody answers the CLI's prompts in a nested
        # agent, so what the tool list doesn't grant is denied, not awaited.
        permission_mode=meta.permission_mode,
        # Without the preset, skip settings files: they add prompt bytes and
        # project hooks at every depth. The preset keeps Claude Code's defaults.
        setting_sources=trusted_sources(None if meta.preset == "claude_code" else [], untrusted_sources(meta.cwd, environ, writes)),
        output_format={"type": "json_schema", "schema": schema_for_cli(meta.schema)} if meta.schema else None,
        resume=resumed_sdk_session(meta),
        # The app in the CLI's User-Agent, unless the caller named theirs.
        client_app=None if environ.get(SDK_CLIENT_APP_ENV) else f"spawn.py/{__version__}",
    )
    # initialPrompt comes first, in the same user turn, so the task's own text
    # (and any scripted MOCK[...]) stays part of the first message; the agent's
    # own facts follow it, after the head siblings share in the prompt cache.
    prompt = first_message(meta)
    options["env"].update(uv_shim_path(environ))
    if sandbox is not None:
        options["env"].update(sandbox_uv_cache(meta.id, environ))
    argv = cli_argv(str(cli), options)
    env = cli_environment(environ, options["env"], meta.cwd, options["client_app"], sdk_version(environ))
    return CliStart(options, gate, prompt, argv, env, pin_cwd=bool(writes) and sys.platform == "linux")


async def run_sdk(
    meta: AgentMeta,
    agent_dir: Path,
    cli: Path,
    state: RunState,
    secrets_: Sequence[str],
    *,
    sdk_loader: SdkLoader | None,
    started: StartedCli | None = None,
) -> None:
    """Run the agent's CLI through the SDK: the one started early (start_cli), else one started now."""
    import asyncio

    not_started: OSError | None = None
    try:
        if started is None:
            plan = cli_start(meta, agent_dir, cli, state, secrets_)
            slot = await take_start_slot(Path(meta.session), start_slot_count(state.settings))
            try:
                started = start_cli(plan, state, slot)
            except OSError as exc:
                not_started = exc
        sdk = sdk_loader.result() if sdk_loader is not None else import_sdk(state.settings)
    except BaseException:
        if started is not None:
            started.free_slot()
        raise
    if started is None:
        # The SDK's own words for it, as when its transport started the CLI.
        if not Path(meta.cwd).is_dir():
            raise sdk.CLIConnectionError(f"Working directory does not exist: {meta.cwd}") from not_started
        if isinstance(not_started, FileNotFoundError):
            raise sdk.CLINotFoundError(f"Claude Code not found at: {cli}") from not_started
        raise sdk.CLIConnectionError(f"Failed to start Claude Code: {not_started}") from not_started
    stderr_path = agent_dir / STDERR_LOG

    def on_stderr(line: str) -> None:
        append_log_line(stderr_path, redact(line, secrets_))

    plan = started.plan
    # The same options as for the SDK's own transport: the query still reads
    # its hooks, skills and env from them (the flags are already the CLI's).
    timeout = state.settings.ask_timeout_s + 60
    if state.in_process is None:
        hooks = {
            "PreToolUse": [sdk.HookMatcher(matcher=None, hooks=[plan.gate.pre_tool_use], timeout=timeout)],
            **native_subagent_hooks(sdk, agent_dir, secrets_),
        }
    else:  # its subagents are its in-process children: governed, not only recorded
        plan.gate.agent_call_check = state.in_process.host_agent_call
        if state.in_process.calls is not None:  # its Bash calls' processes are below this process (supervise/calls.py)
            state.in_process.calls.cli = cli_identity(started.process.pid)
        hooks = in_process_hooks(sdk, state.in_process, plan.gate.pre_tool_use, timeout)
    # --on-budget pause waits in a PreToolUse matcher of its own (its own timeout: a pause outlasts an ask).
    hooks["PreToolUse"] = [*hooks.get("PreToolUse", []), *pause_hooks(sdk, state.pause)]
    options = sdk.ClaudeAgentOptions(**plan.options, hooks=hooks, stderr=on_stderr)
    if state.in_process is not None:
        options.agents = subagent_definitions(sdk, state.in_process)
    # Freed once the CLI goes quiet (or, where its CPU can't be read, at its
    # first message), after START_SLOT_HOLD_S, or by whatever ends the run.
    cpu_readable = procfs_is_ours()
    release = asyncio.create_task(free_slot_when_quiet(started, START_SLOT_HOLD_S))
    try:
        await consume_sdk(
            sdk,
            # Streaming input while the agent takes messages (spawn.py send): its stdin stays open for them.
            sdk.query(
                prompt=state.inbox.prompts(plan.prompt) if state.inbox is not None else plan.prompt,
                options=options,
                transport=CliPipes(sdk, started, on_stderr),
            ),
            meta=meta,
            transcript=agent_dir / TRANSCRIPT,
            state=state,
            secrets_=secrets_,
            first=(lambda: None) if cpu_readable else started.free_slot,
        )
    finally:
        release.cancel()
        started.free_slot()


async def consume_sdk(
    sdk: Any,
    messages: AsyncIterator[Any],
    *,
    meta: AgentMeta,
    transcript: Path,
    state: RunState,
    secrets_: Sequence[str],
    first: Callable[[], None],
) -> None:
    """Record the CLI's messages as they come; `first` is called at each (it frees the start slot)."""
    AssistantMessage, ResultMessage, TextBlock, ToolUseBlock = sdk.AssistantMessage, sdk.ResultMessage, sdk.TextBlock, sdk.ToolUseBlock
    async for message in messages:
        first()
        state.last_activity = time.time()
        # Past the cap a claude agent goes on unrecorded: its outcome says so.
        record = message_record(message)
        append_transcript(transcript, record, secrets_)
        if state.in_process is not None:
            state.in_process.observe(record["type"], record["message"])
        if isinstance(message, sdk.SystemMessage) and message.subtype == "init":
            remember_cli_tools(message.data, state.settings)
        if isinstance(message, AssistantMessage):
            texts = [b.text for b in message.content if isinstance(b, TextBlock) and b.text.strip()]
            if texts:
                state.last_text = "\n".join(texts)
            for block in message.content:
                if isinstance(block, ToolUseBlock) and block.name == "StructuredOutput":
                    state.last_structured_attempt = block.input
            if isinstance(message.usage, dict):
                state.turns[message.message_id or f"turn{len(state.turns)}"] = (message.model or meta.model, message.usage)
            # A tool call means another turn follows; a final answer is let through.
            calls = [b.id for b in message.content if isinstance(b, ToolUseBlock) and b.name != "StructuredOutput"]
            if calls and state.pause is not None:
                state.pause.check_turn(calls, state.turns.values())  # under --on-budget pause: wait, not fail
            elif calls and state.request_stop:
                last = list(state.turns.values())[-1:]
                why = over_hold(Path(meta.session), meta.id, estimate_cost(state.turns.values()), estimate_cost(last))
                if why is not None:
                    state.request_stop(Status.FAILED, why)
        elif isinstance(message, ResultMessage):
            if state.result is not None and isinstance(message.num_turns, int):
                message.num_turns += state.result.num_turns or 0  # a reopened run's result counts its own turns only
            state.result = message
            if state.inbox is not None:
                state.inbox.result_seen()
        else:
            observe_system_message(state, getattr(message, "subtype", None), getattr(message, "data", None))


def observe_system_message(state: RunState, subtype: Any, data: Any) -> None:
    """Keep what the CLI's system messages say about API retries and MCP servers."""
    if not isinstance(data, dict):
        return
    if subtype == "api_retry":
        state.api_retries = max(state.api_retries, int(data.get("attempt") or 0))
        status = data.get("error_status")
        state.api_error_status = status if isinstance(status, int) else state.api_error_status
    elif subtype == "init":
        servers = data.get("mcp_servers") or []
        failed = [
            f"{s.get('name')} ({s.get('status')})" for s in servers if isinstance(s, dict) and s.get("status") not in ("connected", None)
        ]
        for server in failed:
            if server not in state.mcp_failed:
                state.mcp_failed.append(server)
                print(f"spawn: warning: MCP server {server} did not start", file=sys.stderr, flush=True)


API_ERRORS = {
    401: "rejected the credentials",
    403: "refused access",
    429: "rate limit reached",
    500: "internal error",
    529: "overloaded",
}


def describe_api_error(status: int, retries: int) -> str:
    """`model API overloaded (529) after 3 retries`: what the user must know first."""
    what = API_ERRORS.get(status, "error")
    return f"model API {what} ({status})" + (f" after {retries} retries" if retries else "")


def describe_sdk_error(exc: Exception, stderr_log: Path) -> str:
    """One readable reason: the SDK's message plus what the CLI said on stderr."""
    message = str(exc).split("\n")[0].strip()
    try:
        tail = [line.strip() for line in read_text(stderr_log).splitlines() if line.strip()][-3:]
    except (OSError, SpawnError):
        tail = []
    reason = f"{type(exc).__name__}: {message}"
    if tail:
        reason += "; CLI stderr: " + " | ".join(tail)
    return reason[:2000]


def outcome_from_run(meta: AgentMeta, state: RunState, started: float, error: str | None) -> Outcome:
    """Turn what the run saw into the outcome record (pure).

    A run that would end `failed` after one of its own asks was answered no
    ended on that answer: it is `refused` (exit 4), naming the ask. A failure
    that isn't the agent's own (API error, CLI crash, no result) stays `failed`.
    """
    outcome = _outcome_from_run(meta, state, started, error)
    api_failed = outcome.api_error_status is not None or state.api_error_status is not None
    if outcome.status == Status.FAILED and state.denied_asks and state.result is not None and error is None and not api_failed:
        outcome.status, outcome.exit_code = Status.REFUSED, ExitCode.REFUSED
        outcome.reason = f"{state.denied_asks[-1]}, and the agent ended without a result ({outcome.reason})"[:2000]
    return outcome


def _outcome_from_run(meta: AgentMeta, state: RunState, started: float, error: str | None) -> Outcome:
    result = state.result
    duration = round(time.time() - started, 3)
    base: dict[str, Any] = {
        "id": meta.id,
        "ended_at": utc_now_iso(),
        "duration_s": duration,
        "text": state.last_text,
        "transcript": str(Path(meta.session) / AGENTS_DIR / meta.id / TRANSCRIPT),
    }
    if result is not None:
        base.update(
            cost_usd=round_usd(result.total_cost_usd),
            usage=result.usage,
            turns=result.num_turns,
            sdk_session_id=result.session_id,
            api_error_status=getattr(result, "api_error_status", None),
        )
        if result.result and not state.last_text:
            base["text"] = result.result
    if state.mcp_failed:
        base["warnings"] = [f"MCP server {server} did not start" for server in state.mcp_failed]
    if state.stop_reason is not None:
        status = state.stop_reason
        reason = state.stop_detail
        if state.api_error_status is not None and (result is None or result.is_error):
            # A deadline that lands while the CLI retries a failing API: say so.
            reason += f"; the {describe_api_error(state.api_error_status, state.api_retries)}"
        return Outcome(status=status, reason=reason, exit_code=EXIT_FOR_STATUS[status], **base)
    if result is not None and result.is_error:
        # The CLI's own account (subtype, API status, errors) beats the SDK's
        # exception, which only says that the CLI exited non-zero.
        detail = "; ".join(getattr(result, "errors", None) or []) or (result.result or "")
        api = getattr(result, "api_error_status", None)
        if api:
            reason = describe_api_error(api, state.api_retries)
        else:
            # "success" is the subtype of every run that ended with a turn; it says nothing.
            reason = "agent failed" + (f" ({result.subtype})" if result.subtype and result.subtype != "success" else "")
        reason += f": {detail}" if detail else ""
        return Outcome(status=Status.FAILED, reason=reason[:2000], exit_code=ExitCode.AGENT_FAILED, **base)
    if error is not None and state.cli_killed:
        return Outcome(status=Status.KILLED, reason=f"the claude CLI was ended by a signal: {error}", exit_code=ExitCode.KILLED, **base)
    if error is not None:
        return Outcome(status=Status.FAILED, reason=error, exit_code=ExitCode.AGENT_FAILED, **base)
    if result is None:
        return Outcome(status=Status.FAILED, reason="the CLI ended without a result", exit_code=ExitCode.AGENT_FAILED, **base)
    if meta.schema is not None:
        output = result.structured_output
        if output is None:
            output = state.last_structured_attempt
        if output is None:
            return Outcome(
                status=Status.FAILED,
                reason="no structured output: the agent never called StructuredOutput",
                exit_code=ExitCode.AGENT_FAILED,
                validation_errors=["(root): no structured output was produced"],
                **base,
            )
        errors = validate_output(meta.schema, output)
        if errors:
            return Outcome(
                status=Status.FAILED,
                reason=f"structured output does not match the schema ({len(errors)} error(s))",
                exit_code=ExitCode.AGENT_FAILED,
                output=output,
                validation_errors=errors,
                **base,
            )
        return Outcome(status=Status.DONE, reason="completed", exit_code=ExitCode.OK, output=output, **base)
    return Outcome(status=Status.DONE, reason="completed", exit_code=ExitCode.OK, output=result.result or state.last_text or "", **base)


async def free_slot_when_quiet(started: StartedCli, hold_s: float) -> None:
    """Let go of the CLI's start slot once it goes quiet, and after hold_s at the latest.

    Quiet: under START_SLOT_QUIET_SHARE of a core over START_SLOT_QUIET_S, START_SLOT_QUIET_LOOKS times in a row,
    as when it waits for the model. A start-up that lets go earlier, at its
    first message, leaves a fifth of its CPU to compete with the next one's.
    """
    import asyncio

    pid = started.process.pid
    quiet_ns = START_SLOT_QUIET_SHARE * START_SLOT_QUIET_S * 1e9
    limit = time.monotonic() + hold_s
    if not procfs_is_ours():  # its CPU can't be read: its first message frees it (consume_sdk), else the limit
        await asyncio.sleep(hold_s)
    last = cpu_demand_ns(pid)  # None: it is gone already
    quiet_looks = 0
    while started.slot is not None and last is not None and time.monotonic() < limit:
        await asyncio.sleep(min(START_SLOT_QUIET_S, max(0.0, limit - time.monotonic())))
        demand = cpu_demand_ns(pid)
        if demand is None:
            break
        # Quiet at START_SLOT_QUIET_LOOKS looks in a row: a look alone can fall
        # in a stretch where the whole machine was held back (a CPU quota's
        # throttling, a hypervisor's steal), which the run queue doesn't count.
        quiet_looks = quiet_looks + 1 if demand - last < quiet_ns else 0
        if quiet_looks >= START_SLOT_QUIET_LOOKS:
            break
        last = demand
    started.free_slot()
