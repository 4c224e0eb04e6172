"""Issue #8's leftovers: the scripted model's one launcher, a definition's numbers
checked as the flags are, and a parent's own spend counted against its hold.

The end-to-end tests run the real bundled claude CLI through spawn.py against
tools/mock_model.py.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import mock_model
import pytest
from conftest import MockModel, agent_dirs, mock_task, run_spawn, write_agent

import spawn

# ------------------------------------------------------------ mock_model.serve --


def test_serve_starts_a_scripted_model_and_stops_it(tmp_path: Path) -> None:
    scenario = {"rules": [{"match": "hello", "steps": [{"text": "scripted reply"}]}]}
    body = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hello"}], "tools": [{"name": "Bash"}]}
    with mock_model.serve(tmp_path, scenario) as served, mock_model.serve(tmp_path) as other:
        assert served.url != other.url  # two servers share one workdir
        request = urllib.request.Request(served.url + "/v1/messages", data=json.dumps(body).encode())
        with urllib.request.urlopen(request, timeout=30) as resp:
            assert b"scripted reply" in resp.read()
        assert len(served.new_requests()) == 1
        assert served.new_requests() == []  # only what came since the last call
        assert len(served.requests()) == 1
        assert other.requests() == []
    assert served.process.poll() is not None and other.process.poll() is not None


def test_spawn_in_bash_quotes_each_argument() -> None:
    assert mock_model.spawn_in_bash("--task", "it's a task") == '"$SPAWN_PYTHON" "$SPAWN_PY" --task \'it\'"\'"\'s a task\''


# ------------------------------------------------------- definition numbers --

BAD_DEFINITION_NUMBERS = [
    ("maxTurns: .nan", "maxTurns must be an integer, got nan"),
    ("maxTurns: -3", "maxTurns must be > 0, got -3"),
    ("maxTurns: many", "maxTurns must be an integer, got 'many'"),
    ("maxTurns: 0", "maxTurns must be > 0, got 0"),
    ("maxTurns: 1e99", "maxTurns must be an integer"),
    ("autoCompactWindow: -1", "autoCompactWindow must be > 0, got -1"),
    ("timeout: .inf", "timeout must be a finite number, got inf"),
    ("max_depth: -1", "max_depth must be >= 0, got -1"),
]


@pytest.mark.parametrize(("field", "message"), BAD_DEFINITION_NUMBERS, ids=[f for f, _ in BAD_DEFINITION_NUMBERS])
def test_a_bad_number_in_a_definition_is_exit_2_before_anything_runs(
    env: dict[str, str], session_root: Path, tmp_path: Path, mock_model: MockModel, field: str, message: str
) -> None:
    project = tmp_path / "project"
    write_agent(project, "counter", f"description: Counts\ntools: Read\n{field}")
    proc = run_spawn(["--agent", "counter", "--task", mock_task("count", [{"text": "never"}])], env, cwd=project)
    assert proc.returncode == spawn.ExitCode.USAGE, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("spawn: error: ") and message in lines[0], proc.stderr
    assert "agents lint" in lines[0]  # it says what to do
    assert proc.stdout == ""
    assert agent_dirs(session_root) == []  # nothing registered
    assert mock_model.requests() == []  # no model call
    lint = run_spawn(["agents", "lint"], env, cwd=project)
    assert lint.returncode == spawn.ExitCode.USAGE
    assert f"counter.md:5: error: {message}" in lint.stdout  # the line of the field


def test_good_definition_numbers_are_taken() -> None:
    text = "---\nname: t\ndescription: d\nmaxTurns: 7\nautoCompactWindow: 120000\n---\nBody\n"
    d, problems = spawn.parse_definition(text, "t.md", "project")
    assert problems == [] and d is not None
    assert (d.max_turns, d.auto_compact_window) == (7, 120000)
