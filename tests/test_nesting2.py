"""The fork server runs `wait` too, and a stand-in ends as its agent did.

End to end with the real CLI and the scripted model, as tests/test_forkserver.py.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

from conftest import mock_task, run_spawn, spawn_in_bash, stdout_json
from test_forkserver import WAIT_FOR_SOCKET, forks

import spawn

FORKED_WAIT = 'until grep -qs \'"verb": "wait"\' "$SPAWN_SESSION/forkserver.jsonl"; do sleep 0.05; done'


def test_wait_runs_forked_with_the_same_output_and_exit_code(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    child = mock_task("background child", [{"text": "child-result"}])
    launch = spawn_in_bash("--task", child, "--tools", "Read", "--background", "--print", "id")
    waited, code = tmp_path / "wait.json", tmp_path / "wait.rc"
    root = mock_task(
        "root",
        [{"bash": f"{WAIT_FOR_SOCKET}; id=$({launch}); {spawn_in_bash('wait')} $id > {waited}; echo $? > {code}"}, {"text": "root-done"}],
    )
    proc = run_spawn(["--task", root, "--tools", "Bash,Read", "--max-depth", "2"], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert stdout_json(proc)["output"] == "root-done"
    assert int(code.read_text()) == spawn.ExitCode.OK
    result = json.loads(waited.read_text().splitlines()[-1])
    assert result["status"] == "done" and [a["output"] for a in result["agents"]] == ["child-result"]
    assert [line["verb"] for line in forks(session_root)].count("wait") == 1


def test_a_forked_wait_sigtermed_through_its_stand_in_dies_of_sigterm(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    """As a `wait` that runs in its own process would: the shell sees 128 + SIGTERM."""
    child = mock_task("slow background child", [{"text": "never", "sleep": 300}])
    launch = spawn_in_bash("--task", child, "--tools", "Read", "--background", "--print", "id")
    code = tmp_path / "wait.rc"
    script = (
        f"{WAIT_FOR_SOCKET}; id=$({launch}); {spawn_in_bash('wait')} $id > /dev/null & w=$!; "
        f"{FORKED_WAIT}; kill -TERM $w; wait $w; echo $? > {code}"
    )
    root = mock_task("root", [{"bash": script}, {"text": "root-done"}])
    proc = run_spawn(["--task", root, "--tools", "Bash,Read", "--max-depth", "2"], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert int(code.read_text()) == 128 + signal.SIGTERM
