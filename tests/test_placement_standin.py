"""tools/ray_place.py's own decisions, without Ray: what Ray is imported with, what it is asked, what a failure says.

The cluster runs them for real in `uvx nox -s ray` (tests/test_ray_cluster.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import ray_place
from conftest import ROOT

import spawn


def test_rays_runtime_env_rewriters_are_off_before_ray_is_imported() -> None:
    """Under `uv run`, Ray's uv integration would make every worker run `uv run` in an upload of the launcher's folder."""
    environ = {
        "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "1",
        "RAY_RUNTIME_ENV_HOOK": "somewhere.hook",
        "RAY_JOB_CONFIG_JSON_ENV_VAR": '{"runtime_env": {"working_dir": "."}}',
        "RAY_OVERRIDE_JOB_RUNTIME_ENV": "1",
        "PATH": "/usr/bin",
        "SPAWN_AGENT_ID": "a1-000001",
    }
    env = ray_place.ray_environment(environ)
    assert env["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] == "0" and env["RAY_task_oom_retries"] == "0"
    assert not {"RAY_RUNTIME_ENV_HOOK", "RAY_JOB_CONFIG_JSON_ENV_VAR", "RAY_OVERRIDE_JOB_RUNTIME_ENV"} & set(env)
    assert env["PATH"] == "/usr/bin" and env["SPAWN_AGENT_ID"] == "a1-000001"


def test_the_runtime_env_is_env_vars_only() -> None:
    """No py_executable (workers run their node's Python), no working_dir or py_modules (nothing is uploaded)."""
    assert ray_place.runtime_env() == {"env_vars": {"PYTHONPATH": str(ROOT / "tools")}}


def test_a_placement_timeout_names_the_state_and_where_to_look() -> None:
    reason = ray_place.not_placed_reason("host-a0-1", "PENDING_CREATION", "f" * 56, 67.4, 256 * 2**20)
    assert reason.startswith("actor host-a0-1 still PENDING_CREATION after 67 s: "), reason
    assert "raylet*.err" in reason and "256 MiB" in reason and "ray status" in reason
    assert "on node" not in reason  # a pending actor's lease names no node worth blaming
    assert "on node n1" in ray_place.not_placed_reason("host-a0-1", "DEAD", "n1", 3.0, 1)


@pytest.mark.parametrize(
    ("text", "expected"), [("", ray_place.AGENT_MEMORY_BYTES), ("2147483648", 2**31), ("lots", ray_place.AGENT_MEMORY_BYTES)]
)
def test_the_memory_asked_per_agent(text: str, expected: int) -> None:
    assert ray_place.agent_memory({ray_place.ENV_AGENT_MEMORY: text} if text else {}) == expected


def test_the_last_word_is_one_json_record(tmp_path: Path) -> None:
    ray_place.last_word(tmp_path, 1, "the Ray node n1 (host h) running it was lost: gone")
    word = json.loads((tmp_path / ray_place.STANDIN_EXIT).read_text())
    assert word["exit_code"] == 1 and word["reason"].startswith("the Ray node n1") and isinstance(word["pid"], int)
    assert [p.name for p in tmp_path.iterdir()] == [ray_place.STANDIN_EXIT]  # no temporary left
    assert ray_place.STANDIN_EXIT == spawn.RAY_STANDIN_EXIT  # where spawn.py's reaper reads it
