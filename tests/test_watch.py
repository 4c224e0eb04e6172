"""`spawn.py status --watch`: in a real terminal (tmux), and as lines when stdout is no terminal."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import SPAWN, mock_task, run_spawn, start_spawn


class Tmux:
    """A private tmux server (its own socket): nothing shared with anyone else's."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket

    def run(self, *args: str) -> str:
        proc = subprocess.run(["tmux", "-S", str(self.socket), *args], capture_output=True, text=True, timeout=30, check=False)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    def start(self, name: str, command: str) -> None:
        self.run("new-session", "-d", "-s", name, "-x", "160", "-y", "40", command)

    def screen(self, name: str) -> str:
        return self.run("capture-pane", "-p", "-t", name)


@pytest.fixture
def tmux() -> Iterator[Tmux]:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (apt-get install -y tmux)")
    # Not in tmp_path: a unix socket's path holds ~107 bytes, and tmux refuses a
    # longer one (CI's tmp paths can be). A short private directory of our own instead.
    home = Path(tempfile.mkdtemp(prefix="spawn-tmux-", dir="/tmp"))
    server = Tmux(home / "tmux.sock")
    try:
        yield server
    finally:
        subprocess.run(["tmux", "-S", str(server.socket), "kill-server"], capture_output=True, timeout=30, check=False)
        shutil.rmtree(home, ignore_errors=True)


def wait_until(what: str, check: Callable[[], bool], timeout: float = 60) -> None:
    limit = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < limit, f"timed out waiting for {what}"
        time.sleep(0.1)


def watch_command(session: Path, rc_file: Path) -> str:
    """Run the watch in the pane, then keep the pane (and its last frame) open."""
    watch = f"{shlex.quote(sys.executable)} {shlex.quote(str(SPAWN))} status --watch {shlex.quote(str(session))}"
    return f"{watch}; echo $? > {shlex.quote(str(rc_file))}; sleep 600"


def test_watch_redraws_in_a_terminal_and_ctrl_c_leaves_agents_running(
    env: dict[str, str], session_root: Path, tmp_path: Path, tmux: Tmux
) -> None:
    # The agent asks before its first command and nobody answers: it keeps running until the test says.
    task = mock_task("Push when allowed", [{"bash": "git push origin nowhere || true"}, {"text": "all finished"}])
    root = start_spawn(["--task", task, "--tools", "Bash", "--ask", "Bash(git push:*)"], env)
    try:
        wait_for_asks(session_root)
        (session,) = session_root.iterdir()

        first_rc = tmp_path / "first.rc"
        tmux.start("first", watch_command(session, first_rc))
        wait_until("a live frame", lambda: "running" in tmux.screen("first") and "ask q-" in tmux.screen("first"))
        screen = tmux.screen("first")
        assert "d0  running" in screen and "watching; Ctrl-C" in screen
        # Redrawn in place: once the clock has moved on, the tree is still on screen once.
        clock = footer_clock(screen)
        wait_until("a later frame", lambda: footer_clock(tmux.screen("first")) != clock)
        assert tmux.screen("first").count("session ") == 1

        tmux.run("send-keys", "-t", "first", "C-c")
        wait_until("the watch to stop", first_rc.exists)
        assert first_rc.read_text().strip() == "0"
        assert root.poll() is None, "Ctrl-C in the watch must leave the agents running"

        second_rc = tmp_path / "second.rc"
        tmux.start("second", watch_command(session, second_rc))
        lines_file = tmp_path / "lines.txt"
        with open(lines_file, "w") as out_fh:
            lines = subprocess.Popen([sys.executable, str(SPAWN), "status", "--watch", str(session)], stdout=out_fh, stderr=subprocess.PIPE)
        wait_until("the second frame", lambda: "ask q-" in tmux.screen("second"))
        wait_until("the pending ask's line", lambda: " pending: " in lines_file.read_text())
        (ask,) = wait_for_asks(session_root)
        denied = run_spawn(["deny", ask.stem], env)
        assert denied.returncode == 0, denied.stderr

        # Every agent has an outcome: both watches end by themselves.
        wait_until("the terminal watch to end", second_rc.exists)
        assert second_rc.read_text().strip() == "0"
        assert "d0  done" in tmux.screen("second")
        assert lines.wait(timeout=60) == 0
        assert root.wait(timeout=60) == 0
    finally:
        if root.poll() is None:
            root.kill()
    # No terminal: one line per change, no escape codes.
    out = lines_file.read_text()
    assert "\x1b" not in out
    printed = [line.split(" ", 1)[1] for line in out.splitlines()]
    root_lines = [line for line in printed if line.startswith("a0-")]
    assert [line.split()[2] for line in root_lines] == ["running", "done"]
    assert f"ask {ask.stem} answered" in printed
    assert any(line.startswith(f"ask {ask.stem} pending:") for line in printed)


def footer_clock(screen: str) -> str:
    return next(line.split()[0] for line in screen.splitlines() if "watching; Ctrl-C" in line)


def wait_for_asks(session_root: Path) -> list[Path]:
    found: list[Path] = []

    def asked() -> bool:
        found[:] = [p for p in session_root.glob("*/asks/q-*.json") if not p.name.endswith(".answer.json")]
        return bool(found)

    wait_until("the agent's ask", asked)
    return found
