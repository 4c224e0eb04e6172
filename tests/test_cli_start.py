"""spawn.py starts the agent's CLI itself, with the SDK's command line and environment.

Unit tests against the pinned SDK: what cli_argv and cli_environment build
must be what the SDK's own SubprocessCLITransport would have started, for
every option spawn.py sets. (The e2e tests run every agent through it.)
And what spawn.py adds to that environment to make agents cheaper, where
the user has not chosen otherwise.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import claude_agent_sdk
import pytest
from claude_agent_sdk._internal.transport.subprocess_cli import SubprocessCLITransport

import spawn

CLI = "/opt/claude"
SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
OPTIONS: list[dict[str, Any]] = [
    {},
    {"system_prompt": "be brief", "tools": ["Read"], "allowed_tools": ["Read"], "setting_sources": []},
    {"system_prompt": {"type": "preset", "preset": "claude_code", "append": "brief"}, "tools": [], "setting_sources": None},
    {"tools": ["Bash", "Read"], "allowed_tools": ["Bash(ls:*)", "Read"], "disallowed_tools": ["Bash(rm:*)", "WebFetch"]},
    {"max_turns": 7, "max_budget_usd": 0.25, "model": "claude-haiku-4-5", "permission_mode": "dontAsk", "effort": "low"},
    {"max_turns": None, "max_budget_usd": None, "model": None, "permission_mode": None, "effort": None, "resume": None},
    {"resume": "-d0c1a2b3-aaaa-bbbb-cccc-000000000000", "settings": '{"sandbox": {"enabled": true}}'},
    {"mcp_servers": {"docs": {"command": "srv", "args": ["--x"], "env": {"T": "1"}}}, "strict_mcp_config": True},
    {"mcp_servers": {}, "strict_mcp_config": False},
    {"skills": ["review", "plugin:lint"], "allowed_tools": ["Read", "Skill(review)"], "setting_sources": []},
    {"skills": ["review"], "setting_sources": None},
    {"skills": "all", "allowed_tools": ["Read"]},
    {"output_format": {"type": "json_schema", "schema": SCHEMA}},
    {"output_format": None, "settings": None},
]


def sdk_command(options: dict[str, Any]) -> list[str]:
    transport = SubprocessCLITransport(prompt="", options=claude_agent_sdk.ClaudeAgentOptions(**{"cli_path": CLI, **options}))
    return transport._build_command()


@pytest.mark.parametrize("options", OPTIONS, ids=[",".join(o) or "none" for o in OPTIONS])
def test_cli_argv_is_the_sdks_command_line(options: dict[str, Any]) -> None:
    assert spawn.cli_argv(CLI, options) == sdk_command(options)


def meta_for(tmp_path: Path, **fields: Any) -> spawn.AgentMeta:
    values: dict[str, Any] = dict(
        id="a1-abc", parent_id="a0-x", depth=1, max_depth=2, pid=1, create_time=0, pgid=1, trace_id="0" * 32,
        span_id="1" * 16, traceparent="", task="t", tools=["Bash", "Read"], disallowed_tools=[], model="m",
        cwd=str(tmp_path), started_at="", session=str(tmp_path), system_prompt="be brief", deadline=None,
    )  # fmt: skip
    return spawn.AgentMeta(**{**values, **fields})


METAS: list[dict[str, Any]] = [
    {},
    {"preset": "claude_code", "max_turns": 3, "max_budget_usd": 0.5},
    {"schema": SCHEMA, "effort": "high", "permission_mode": "acceptEdits"},
    {"tools": ["Read", "mcp__docs__search"], "disallowed_tools": ["Bash"], "depth": 2},
    {"permissions": {"allow": ["Bash(git log:*)"], "deny": ["Read(./.env)"], "ask": []}},
    {"skills": ["review"]},
]


@pytest.mark.parametrize("fields", METAS, ids=[",".join(f) or "defaults" for f in METAS])
def test_an_agents_cli_starts_with_the_sdks_command_line(tmp_path: Path, fields: dict[str, Any]) -> None:
    meta = meta_for(tmp_path, **fields)
    plan = spawn.cli_start(meta, tmp_path, Path(CLI), spawn.RunState(spawn.Settings.read()), [])
    assert plan.argv == sdk_command(plan.options)
    # The first message is the task, then the facts that differ between siblings (outside the cached head).
    # (Its time left is read from the clock: compared up to the id.)
    facts = f"{spawn.AGENT_FACTS_HEADER}\nYou are agent {meta.id}."
    assert plan.options["cwd"] == meta.cwd and plan.prompt.startswith(f"{meta.task}\n\n{facts}")


def sdk_environment(options: dict[str, Any]) -> dict[str, str]:
    """The environment the SDK's transport starts the CLI with."""
    seen: dict[str, Any] = {}

    async def open_process(*args: Any, **kwargs: Any) -> Any:
        seen.update(kwargs)
        raise OSError("not started: the test only looks")

    transport = SubprocessCLITransport(prompt="", options=claude_agent_sdk.ClaudeAgentOptions(**{"cli_path": CLI, **options}))
    original, anyio.open_process = anyio.open_process, open_process
    try:
        with pytest.raises(claude_agent_sdk.CLIConnectionError):
            anyio.run(transport.connect)
    finally:
        anyio.open_process = original
    env: dict[str, str] = seen["env"]
    return env


@pytest.mark.parametrize(
    ("environ", "options"),
    [
        ({"CLAUDECODE": "1", "HOME": "/h", "CLAUDE_AGENT_SDK_DERIVED_CLIENT_APP": "outer"}, {"client_app": "spawn.py/1"}),
        ({"CLAUDE_AGENT_SDK_CLIENT_APP": "theirs"}, {"client_app": None, "env": {"SPAWN_DEPTH": "1"}}),
        ({"claude_code_sdk_reads_session_state": "0"}, {"client_app": "x", "cwd": "/tmp", "env": {"CLAUDE_CODE_ENTRYPOINT": "cli"}}),
    ],
)
def test_the_cli_environment_is_the_sdks(environ: dict[str, str], options: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        monkeypatch.delenv(name)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    mine = spawn.cli_environment(
        os.environ, options.get("env", {}), options.get("cwd"), options.get("client_app"), spawn.sdk_version(os.environ)
    )
    assert mine == sdk_environment(options)


def test_the_sdk_version_is_read_without_importing_it() -> None:
    assert spawn.sdk_version(os.environ) == claude_agent_sdk.__version__


def test_telemetry_is_off_for_agents_unless_the_user_chose() -> None:
    assert spawn.quiet_cli_environment({}) == {"DISABLE_TELEMETRY": "1"}
    # The user's own choice, either way, is left as it is.
    assert spawn.quiet_cli_environment({"DISABLE_TELEMETRY": "0"}) == {}
    assert spawn.quiet_cli_environment({"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "0"}) == {}
