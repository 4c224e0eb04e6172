"""Unit tests of Settings: the environment read once at an edge, frozen, and what the runner takes instead of os.environ."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
from test_cli_start import CLI, meta_for

import spawn


def test_a_snapshot_is_frozen_and_does_not_follow_later_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPAWN_ASK_TIMEOUT_S", "7")
    settings = spawn.Settings.read()
    monkeypatch.setenv("SPAWN_ASK_TIMEOUT_S", "9")
    monkeypatch.setenv("SPAWN_LATER", "1")
    assert settings.ask_timeout_s == 7.0 and "SPAWN_LATER" not in settings
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.ask_timeout_s = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        settings.environ["SPAWN_LATER"] = "1"  # type: ignore[index]


@pytest.mark.parametrize(
    ("name", "text", "field", "value"),
    [
        ("SPAWN_ASK_TIMEOUT_S", "12.5", "ask_timeout_s", 12.5),
        ("SPAWN_ASK_TIMEOUT_S", "-3", "ask_timeout_s", spawn.ASK_TIMEOUT_S),
        ("SPAWN_ASK_TIMEOUT_S", "nan", "ask_timeout_s", spawn.ASK_TIMEOUT_S),
        ("SPAWN_HEARTBEAT_S", "0.5", "heartbeat_s", 0.5),
        ("SPAWN_HEARTBEAT_S", "soon", "heartbeat_s", spawn.HEARTBEAT_S),
        ("SPAWN_TRANSCRIPT_MAX_BYTES", "1000", "log_max_bytes", 1000),
        ("SPAWN_TRANSCRIPT_MAX_BYTES", str(10 * spawn.LOG_MAX_BYTES), "log_max_bytes", spawn.LOG_MAX_BYTES),
        ("SPAWN_WAIT_POLL", "1", "wait_polls", True),
        ("SPAWN_WAIT_POLL", "0", "wait_polls", False),
        ("HOME", "/home/someone", "home", "/home/someone"),
    ],
)
def test_each_value_is_typed_once_with_the_documented_fallback(name: str, text: str, field: str, value: object) -> None:
    assert getattr(spawn.Settings.read({name: text}), field) == value


def test_settings_are_the_environment_as_a_mapping() -> None:
    settings = spawn.Settings.read({"A": "1", "B": "2"})
    assert dict(settings) == {"A": "1", "B": "2"} and len(settings) == 2 and settings.get("C") is None
    assert spawn.settings_of(settings) is settings and spawn.settings_of({"A": "1"}).get("A") == "1"


def test_the_cli_of_an_agent_gets_the_environment_its_runner_read_not_os_environ(tmp_path: Path) -> None:
    assert "SPAWN_TEST_HANDED" not in os.environ
    settings = spawn.Settings.read({**os.environ, "SPAWN_TEST_HANDED": "yes", "BASH_MAX_TIMEOUT_MS": "1234"})
    plan = spawn.cli_start(meta_for(tmp_path), tmp_path, Path(CLI), spawn.RunState(settings), [])
    assert plan.env["SPAWN_TEST_HANDED"] == "yes"
    assert plan.options["env"]["BASH_MAX_TIMEOUT_MS"] == "1234"  # child_environment reads the settings too
    assert plan.gate.shell_env["SPAWN_TEST_HANDED"] == "yes"  # and so do the rules a Bash command is checked in
