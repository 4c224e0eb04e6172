"""tools/ray_place.py's own decisions, without Ray: what Ray is imported with, what it is asked, what a failure says.

The cluster runs them for real in `uvx nox -s ray` (tests/test_ray_cluster.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import psutil
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
    reason = ray_place.not_placed_reason("PENDING", 67.4, 256 * 2**20)
    assert reason.startswith("its placement group still PENDING after 67 s: "), reason
    assert "raylet*.err" in reason and "256 MiB" in reason and "ray status" in reason


def test_a_token_turns_signals_into_lines_and_outlives_them_until_its_agent_has_ended() -> None:
    """The pid meta.json names on the launcher's host: `kill` and Ctrl-C reach the service, and the token stays
    until the service ends it (so the caller's `kill` sees the runner's own outcome), or the service dies.

    Made with SIGINT ignored, as a service started from a background job or under nohup has it: a shell
    can't trap a signal ignored when it started, so the token starts with the defaults."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        token = ray_place.Token()
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        assert wait_for(lambda: len(psutil.Process(token.pid).children()) == 1)  # its `cat` is up: the traps are set
        assert os.getpgid(token.pid) == token.pid  # a group of its own: `spawn.py kill` signals it as a runner's
        for sig, word in ((signal.SIGTERM, "TERM"), (signal.SIGINT, "INT"), (signal.SIGHUP, "HUP")):
            os.killpg(token.pid, sig)
            heard = said_within(token)
            assert heard == word, (word, heard)
            assert token.proc.poll() is None, word
        assert token.said() is None  # nothing more to say
        kids = psutil.Process(token.pid).children()
        token.end()
        assert token.proc.returncode == 0
        assert wait_for(lambda: not any(k.is_running() and k.status() != psutil.STATUS_ZOMBIE for k in kids))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(token.pid, signal.SIGKILL)


def test_a_token_killed_says_gone() -> None:
    token = ray_place.Token()
    try:
        os.killpg(token.pid, signal.SIGKILL)
        assert wait_for(lambda: token.said() == "GONE")
    finally:
        token.end()


def said_within(token: ray_place.Token, limit: float = 5.0) -> str | None:
    """What the token says next, waited for up to limit seconds."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if (said := token.said()) is not None:
            return said
        time.sleep(0.02)
    return None


def wait_for(check: Callable[[], bool], limit: float = 5.0) -> bool:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.02)
    return check()


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


def test_a_new_placer_sweeps_the_folders_of_placers_nobody_serves_unit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit: Ray ends a host actor without cleanup, so its socket's folder stays; the next placer on the host removes
    this user's folders whose socket refuses a connection, and leaves a served one, a fresh one with no socket yet,
    and anything that is not a folder of ours."""
    import shutil
    import socket
    import tempfile

    tmp_path = Path(tempfile.mkdtemp(prefix="sweep-", dir="/tmp"))  # short: a socket path holds ~107 bytes
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    prefix = ray_place.PLACER_FOLDER_PREFIX

    def folder(name: str) -> Path:
        path = tmp_path / f"{prefix}{name}"
        path.mkdir(mode=0o700)
        return path

    dead, served, stale = folder("dead"), folder("served"), folder("stale")
    folder("fresh")  # made now: its placer may still be binding its socket
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as gone:
        gone.bind(str(dead / ray_place.PLACER_SOCKET))  # bound, then closed: connect is refused
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(served / ray_place.PLACER_SOCKET))
    listener.listen(1)
    old = time.time() - ray_place.PLACER_FOLDER_GRACE_S - 5
    os.utime(stale, (old, old))
    (tmp_path / f"{prefix}file").write_text("not a folder")
    (tmp_path / f"{prefix}link").symlink_to(dead)
    try:
        ray_place.sweep_placer_folders()
        left = sorted(p.name.removeprefix(prefix) for p in tmp_path.iterdir())
        assert left == ["file", "fresh", "link", "served"]
    finally:
        listener.close()
        shutil.rmtree(tmp_path)


def test_a_probe_of_the_socket_is_no_request_and_keeps_the_idle_clock_unit(tmp_path: Path) -> None:
    """Unit: a new placer's sweep connects to every live placer's socket; only a placement request counts as use,
    so a live placer still leaves IDLE_EXIT_S after its last request, however many placers start beside it."""
    import socket

    placer = ray_place.Placer(None, "test", lambda node: None, lambda peer, asked: "placed by no one here")
    try:
        before = placer.idle_since
        time.sleep(0.05)
        ray_place.sweep_placer_folders()  # connects to placer's socket, says nothing
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(str(placer.path))
            conn.sendall(b'{"agent_dir": 7}\n')
            assert json.loads(conn.makefile("rb").readline()) == {"error": "not a placement request"}
        deadline = time.monotonic() + 5
        while placer.asking and time.monotonic() < deadline:
            time.sleep(0.01)
        assert placer.asking == 0
        assert placer.idle_since == before
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:  # a request: refused, but used
            conn.connect(str(placer.path))
            conn.sendall(json.dumps({"agent_dir": str(tmp_path / "a1-000001")}).encode() + b"\n")
            lines = conn.makefile("rb")
            assert json.loads(lines.readline()) == {"taken": True}
            assert json.loads(lines.readline()) == {"error": "placed by no one here"}
        while placer.asking and time.monotonic() < deadline:
            time.sleep(0.01)
        assert placer.idle_since > before
    finally:
        placer.close()
